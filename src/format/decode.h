/*
 * decode: untrusted Kafka record bytes to CES envelopes and events (docs/ces-format.md).
 *
 * Decoding has two steps because a large event arrives as several segments: the envelope of each
 * record is decoded on its own, segments are joined by the reassembler, and only the whole Data
 * text is decoded into an event. Anything that is not exactly what CES sends is rejected with a
 * sentence that says what is wrong, for the dead-letter table.
 */
#ifndef CES_DECODE_H
#define CES_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/arena.h"
#include "format/event.h"

/* The longest name (db, schema, table, column) an event may carry: SQL Server's sysname is 128
 * characters, at most 4 bytes each in UTF-8. Longer names are rejected, so buffers sized from this
 * never cut one. */
#define CES_DECODE_MAX_NAME_BYTES 512

/* How record values are encoded (kafka.format). */
typedef enum {
    CES_FORMAT_AUTO = 0, /* per record: JSON when it starts with '{' (or blanks), else Avro */
    CES_FORMAT_JSON,
    CES_FORMAT_AVRO, /* bare datum or object container file, whatever the first bytes */
} ces_decode_format_t;

/* Parses "auto", "json" or "avro". Returns 0, or -1 for anything else. */
int ces_decode_format_parse(const char *text, ces_decode_format_t *format);

typedef struct {
    ces_decode_format_t format;
    size_t max_record_bytes; /* one Kafka record */
    size_t max_event_bytes;  /* the Data of one event, after joining its segments */
    size_t max_depth;        /* JSON nesting */
    size_t max_columns;      /* columns in cols, pkkey, old, current */
    size_t max_value_bytes;  /* one column value */
} ces_decode_limits_t;

/* Safe defaults: CES events are at most 1 MB per segment and values are truncated at 1 MB. */
void ces_decode_limits_default(ces_decode_limits_t *limits);

typedef enum {
    CES_DECODE_OK = 0,
    CES_DECODE_REJECTED, /* the input is not a valid CES record; errstr says why */
    CES_DECODE_NOMEM,
} ces_decode_status_t;

/* The envelope of one record: attributes and this record's slice of the Data. */
typedef struct {
    const char *id;
    const char *logicalid;
    const char *time;
    ces_op_t op;
    bool legacy;         /* early preview generation: splitindex/splittotalcnt */
    int64_t index;       /* segmentindex, or splitindex for legacy */
    bool final_segment;  /* finalsegment; legacy: not split, or splitindex == splittotalcnt - 1 */
    int64_t split_total; /* legacy splittotalcnt (0 = not split); -1 for the current generation */
    bool avro;           /* an Avro record: data holds Avro bytes, not JSON text */
    const char *data;    /* JSON text (or Avro bytes) of the Data record or of a slice of it */
    size_t data_len;
    const void *data_tree; /* set instead of data when the envelope carried Data as a JSON object */
} ces_envelope_t;

typedef struct ces_decoder_s ces_decoder_t;

/* Returns a decoder that applies a copy of limits, or NULL when out of memory. Owned by the caller.
 * A decoder serves one thread at a time: each decoding thread has its own. */
ces_decoder_t *ces_decoder_new(const ces_decode_limits_t *limits);
/* The limits it was made with (owned by the decoder). */
const ces_decode_limits_t *ces_decoder_limits(const ces_decoder_t *decoder);
void ces_decoder_destroy(ces_decoder_t *decoder);

/*
 * Decodes the envelope of record[0..len): a JSON CloudEvent or an Avro ChangeEvent (bare datum or
 * object container file), as limits->format says. Strings in *envelope are allocated from arena.
 */
ces_decode_status_t ces_decode_envelope(ces_decoder_t *decoder, ces_arena_t *arena,
                                        const void *record, size_t len, ces_envelope_t *envelope,
                                        char *errstr, size_t errstr_size);

/*
 * Decodes the whole Data of an event (data[0..len): JSON text, or Avro bytes when envelope->avro;
 * envelope->data_tree when data is NULL) together with its envelope into *event. data must be the
 * data of envelopes this decoder returned (one, or the segments' joined in order): its UTF-8 was
 * checked then. Everything *event points to is allocated from arena.
 */
ces_decode_status_t ces_decode_event(ces_decoder_t *decoder, ces_arena_t *arena,
                                     const ces_envelope_t *envelope, const char *data, size_t len,
                                     ces_event_t *event, char *errstr, size_t errstr_size);
/* The same for data the caller gives up (ces_json_parse_in_place): *event then points into data
 * too, which is no longer the JSON it was, whatever the outcome; so are the row images' strings
 * of envelope->data_tree. */
ces_decode_status_t ces_decode_event_in_place(ces_decoder_t *decoder, ces_arena_t *arena,
                                              const ces_envelope_t *envelope, char *data,
                                              size_t len, ces_event_t *event, char *errstr,
                                              size_t errstr_size);

/*
 * Decodes one unsplit record and writes the event's dump (ces_event_dump), or "rejected: REASON",
 * to out. Used for golden files. Returns the decode status.
 */
ces_decode_status_t ces_decode_dump_record(ces_decoder_t *decoder, const void *record, size_t len,
                                           FILE *out);

#endif
