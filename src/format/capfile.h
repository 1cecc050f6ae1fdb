/*
 * capfile: one Event Hubs Capture file, record by record.
 *
 * Event Hubs Capture archives each partition of a hub, one file per time window, as an Avro
 * object container file of EventData records. Microsoft documents their schema in "Explore
 * captured Avro files in Azure Event Hubs" (learn.microsoft.com/azure/event-hubs/
 * explore-captured-avro-files): record EventData, namespace Microsoft.ServiceBus.Messaging,
 * fields SequenceNumber long, Offset string, EnqueuedTimeUtc string, SystemProperties
 * map<["long","double","string","bytes"]>, Properties map of the same union (files also carry
 * "null" among its branches), Body ["null","bytes"]. A file's writer schema is checked against
 * that, field by field, as JSON text by the bounded JSON reader; it is never handed to avro-c's
 * schema parser.
 *
 * Every byte of a file is untrusted. The container's framing (a header, then blocks of "count,
 * size, data, sync marker") is read with avro-c through the schemas the Avro specification gives
 * it, as avro.c reads CES containers, not with avro-c's own file reader: that one allocates
 * whatever a block's size prefix claims and takes a file truncated inside a block for its end.
 * Here a block holds at most limits.max_block_bytes, compressed and inflated; its sync marker must
 * be the header's; a file that ends inside a block or record is truncated; every avro-c call runs
 * under ces_avro_guarded. Codecs: "null" and "deflate" (RFC 1951, inflated with zlib), what Capture
 * writes; any other is an error that names it.
 */
#ifndef CES_CAPFILE_H
#define CES_CAPFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The header (magic, metadata, sync marker) may take at most this much of a file. */
#define CES_CAPFILE_MAX_HEADER_BYTES (1u << 20)

/* What one file is allowed to make ces2pg hold. */
typedef struct {
    size_t max_block_bytes; /* a block's data, compressed or inflated */
    size_t max_map_items;   /* entries of SystemProperties and Properties */
} ces_capfile_limits_t;

/* The Avro classes every file is read with. Made once, before threads that decode Avro start
 * (avro-c's schema functions are not serialised otherwise); shared read-only by the files. */
typedef struct ces_capfile_schemas_s ces_capfile_schemas_t;

/* NULL when out of memory. Owned by the caller; it must outlive every file opened with it. */
ces_capfile_schemas_t *ces_capfile_schemas_new(void);
/* Accepts NULL. */
void ces_capfile_schemas_destroy(ces_capfile_schemas_t *schemas);

typedef struct ces_capfile_s ces_capfile_t;

typedef enum {
    CES_CAPFILE_RECORD = 0,
    CES_CAPFILE_END,     /* the file ended after its last block */
    CES_CAPFILE_INVALID, /* not a Capture file, truncated or corrupt from here on; errstr says why */
    CES_CAPFILE_IO,      /* the file could not be read; errstr says why */
    CES_CAPFILE_NOMEM,
} ces_capfile_status_t;

/* One EventData record. */
typedef struct {
    int64_t sequence;   /* SequenceNumber */
    bool body_null;     /* Body was null (then body_len is 0) */
    unsigned char *body; /* a malloc'd copy of Body (at least one byte allocated): the caller's */
    size_t body_len;
} ces_capfile_record_t;

/*
 * Opens the file at path and reads its header: the magic, the codec, the writer schema and the
 * sync marker. Returns the file, or NULL with *st (CES_CAPFILE_INVALID, _IO or _NOMEM) and a
 * sentence in errstr. schemas and limits (copied) are references that must outlive the file. The
 * file is owned by the caller (ces_capfile_close).
 */
ces_capfile_t *ces_capfile_open(const ces_capfile_schemas_t *schemas, const char *path,
                                const ces_capfile_limits_t *limits, ces_capfile_status_t *st,
                                char *errstr, size_t errstr_size);
/* The same over a stream already open (fmemopen for the fuzzer), read from its current position
 * and closed by ces_capfile_close. name is copied, for messages. */
ces_capfile_t *ces_capfile_open_stream(const ces_capfile_schemas_t *schemas, FILE *stream,
                                       const char *name, const ces_capfile_limits_t *limits,
                                       ces_capfile_status_t *st, char *errstr,
                                       size_t errstr_size);
/* Closes the stream and frees the file. Accepts NULL. */
void ces_capfile_close(ces_capfile_t *file);

/*
 * Reads the next record into *record (its body then belongs to the caller). After anything but
 * CES_CAPFILE_RECORD the file has nothing more to give: the records handed over before an error
 * are good, what follows it is lost. errstr names the byte offset of the block and the record.
 */
ces_capfile_status_t ces_capfile_next(ces_capfile_t *file, ces_capfile_record_t *record,
                                      char *errstr, size_t errstr_size);

/* Bytes of the file read so far (for progress). */
uint64_t ces_capfile_bytes_read(const ces_capfile_t *file);
/* The codec named in the header ("null" or "deflate"). */
const char *ces_capfile_codec(const ces_capfile_t *file);

#endif
