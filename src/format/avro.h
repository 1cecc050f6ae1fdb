/*
 * avro: CES records in the Avro binary encoding (docs/ces-format.md, "Avro binary encoding"), read with avro-c.
 *
 * A record value is an Avro ChangeEvent, either a bare datum or an object container file (magic
 * "Obj" 0x01, writer schema in the header, one record). Its data bytes hold an Avro Data record.
 * Both are turned into the same ces_json_t tree the JSON reader builds (records become objects with
 * their fields in schema order, int becomes a number, bytes a string with its length), so decode.c
 * applies one set of CES checks to both encodings.
 *
 * Memory: avro-c allocates whatever a length prefix claims, and some of its error paths leak. ces2pg
 * therefore owns avro-c's allocator (avro_set_allocator): while a record is read, each allocation
 * and their sum are capped relative to the size of the input (and json_limits->max_container for
 * arrays), and whatever avro-c still holds after the read (leaked by an error path) is freed when it
 * ends. A hostile record cannot make ces2pg allocate more than a
 * small multiple of its own size, and malformed input leaks nothing. The container header is read
 * with the Avro schema the specification gives for it; its writer schema is checked as JSON text by
 * the bounded JSON reader, never handed to avro-c's schema parser.
 */
#ifndef CES_AVRO_H
#define CES_AVRO_H

#include <avro/io.h>
#include <avro/value.h>
#include <stdbool.h>
#include <stddef.h>

#include "util/arena.h"
#include "format/json.h"

typedef struct ces_avro_s ces_avro_t;

typedef enum {
    CES_AVRO_OK = 0,
    CES_AVRO_INVALID, /* not a valid CES Avro record; errstr says why */
    CES_AVRO_NOMEM,
} ces_avro_status_t;

/*
 * Returns a reader, or NULL with a sentence in errstr. json_limits bound the writer schema of a
 * container (it is JSON text). Installs ces2pg's allocator into avro-c on first use: no other code
 * in the process may use avro-c. Owned by the caller.
 */
ces_avro_t *ces_avro_new(const ces_json_limits_t *json_limits, char *errstr, size_t errstr_size);
void ces_avro_destroy(ces_avro_t *avro);

/* True when record[0..len) starts with the magic bytes of an Avro object container file. */
bool ces_avro_is_container(const void *record, size_t len);

/*
 * Reads an Avro ChangeEvent (bare datum or object container file) from record[0..len) into an
 * OBJECT tree allocated from arena: the eleven attributes in schema order, data as a STRING node
 * holding the raw Data bytes (data_len may contain NULs).
 */
ces_avro_status_t ces_avro_read_envelope(ces_avro_t *avro, ces_arena_t *arena, const void *record,
                                         size_t len, const ces_json_t **root, char *errstr,
                                         size_t errstr_size);

/* Reads an Avro Data record (bare datum) from data[0..len) into an OBJECT tree in arena. */
ces_avro_status_t ces_avro_read_data(ces_avro_t *avro, ces_arena_t *arena, const void *data,
                                     size_t len, const ces_json_t **root, char *errstr,
                                     size_t errstr_size);

/* Installs ces2pg's allocator into avro-c, once: before anything else in the process uses
 * avro-c (what avro-c allocated with its own would be freed with ces2pg's). ces_avro_new does it. */
void ces_avro_install_allocator(void);

/*
 * For other readers of untrusted Avro (capfile.c, Event Hubs Capture files): runs fn(arg) with
 * avro-c to itself (the lock that serialises it: Debian builds it without THREADSAFE) and its
 * allocations capped as for reading input_len bytes whose arrays and maps hold at most max_items
 * items; whatever avro-c still holds when fn returns is freed. So everything fn gets from avro-c
 * inside must be released before fn returns, and nothing made outside may be reallocated inside.
 * Returns what fn returns.
 */
int ces_avro_guarded(size_t input_len, size_t max_items, int (*fn)(void *arg), void *arg);

/*
 * Inside ces_avro_guarded: reads one value of class iface from reader into *value, which the
 * caller releases (avro_value_decref) when value->iface is set, even after a failure. what names
 * the value and schema_name its schema in errstr, which tells a length prefix that claims more
 * than input_len bytes can hold, or what avro-c found malformed; CES_AVRO_NOMEM is malloc failing.
 */
ces_avro_status_t ces_avro_read_value(avro_reader_t reader, avro_value_iface_t *iface,
                                      avro_value_t *value, const char *what,
                                      const char *schema_name, size_t input_len, char *errstr,
                                      size_t errstr_size);

/* Blocks that avro-c still held after a read and that ces2pg freed (leaked by avro-c's error
 * paths). Diagnostic, for the tests: zero after every successful read. */
size_t ces_avro_swept_blocks(void);

/* The two Avro schemas ces2pg reads, as JSON text (documentation, tests, tools). */
extern const char ces_avro_change_event_schema[];
extern const char ces_avro_data_schema[];
/* The object container file's header, as the Avro specification defines it (JSON text). */
extern const char ces_avro_container_header_schema[];

/* Compiles the schema json (len bytes) and its generic class, both the caller's to release
 * (avro_schema_decref, avro_value_iface_decref). Returns 0, or -1 (avro_strerror says why). */
int ces_avro_make_class(const char *json, size_t len, avro_schema_t *schema,
                        avro_value_iface_t **iface);

#endif
