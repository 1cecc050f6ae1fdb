#include "format/capfile.h"

#include <avro/errors.h>
#include <avro/generic.h>
#include <avro/io.h>
#include <avro/schema.h>
#include <avro/value.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "util/arena.h"
#include "format/avro.h"
#include "format/json.h"

#define MAGIC "Obj\x01"
#define SYNC_SIZE 16
/* A block starts with two longs: at most ten bytes each in Avro's varint encoding. */
#define BLOCK_HEAD_MAX 20
/* The buffer of a file's bytes starts this large and grows to a block's size when one needs it. */
#define FIRST_BUFFER (64u << 10)

/* A block's two counts, as the Avro specification defines them (the header: avro.h). */
static const char block_head_schema_json[] =
    "{\"type\":\"record\",\"name\":\"BlockHead\",\"namespace\":\"org.apache.avro.file\","
    "\"fields\":[{\"name\":\"count\",\"type\":\"long\"},{\"name\":\"size\",\"type\":\"long\"}]}";

/* EventData (capfile.h); the two maps' unions come with or without a last "null" branch, which
 * changes nothing of how the other branches are encoded. %s: the two unions. */
static const char event_schema_format[] =
    "{\"type\":\"record\",\"name\":\"EventData\",\"namespace\":\"Microsoft.ServiceBus.Messaging\","
    "\"fields\":[{\"name\":\"SequenceNumber\",\"type\":\"long\"},"
    "{\"name\":\"Offset\",\"type\":\"string\"},"
    "{\"name\":\"EnqueuedTimeUtc\",\"type\":\"string\"},"
    "{\"name\":\"SystemProperties\",\"type\":{\"type\":\"map\",\"values\":[%s]}},"
    "{\"name\":\"Properties\",\"type\":{\"type\":\"map\",\"values\":[%s]}},"
    "{\"name\":\"Body\",\"type\":[\"null\",\"bytes\"]}]}";
static const char *const union_branches[] = {"long", "double", "string", "bytes", "null"};
#define UNION_PLAIN 4 /* branches without "null" */

/* Fields of EventData by index, in schema order. */
enum { F_SEQUENCE = 0, F_BODY = 5 };

/* Classes: the header, a block head, then EventData with (bit 0) SystemProperties' and (bit 1)
 * Properties' union ending in "null". */
enum { C_HEADER = 0, C_BLOCK_HEAD, C_EVENT, NCLASSES = C_EVENT + 4 };

struct ces_capfile_schemas_s {
    avro_schema_t schema[NCLASSES];
    avro_value_iface_t *iface[NCLASSES];
};

struct ces_capfile_s {
    const ces_capfile_schemas_t *schemas;
    ces_capfile_limits_t limits;
    FILE *stream;
    char *name;
    char codec[16];
    bool deflate;
    avro_value_iface_t *event_class; /* the schemas' class for this file's writer schema */
    char sync[SYNC_SIZE];
    /* The file's bytes read and not consumed: buf[start..end), the first at file offset pos. */
    unsigned char *buf;
    size_t cap, start, end;
    uint64_t pos;
    bool eof; /* the stream has nothing beyond buf */
    /* The block being read: its data (in buf for "null", in inflated for "deflate"). */
    uint64_t block_pos;
    int64_t block_count, block_done;
    unsigned char *inflated;
    size_t inflated_cap;
    const unsigned char *data;
    size_t data_len;
    avro_reader_t data_reader; /* over data; made outside any guard window, so it stays */
    bool done;                 /* END or an error was returned: nothing more */
};

/* ---------------------------------------------------------------------------------------------
 * Schemas.
 */

static int make_class(const char *json, avro_schema_t *schema, avro_value_iface_t **iface) {
    return ces_avro_make_class(json, strlen(json), schema, iface);
}

/* The union's branches as JSON, with or without "null". */
static void union_text(bool with_null, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < UNION_PLAIN + (with_null ? 1 : 0); i++)
        n += (size_t)snprintf(buf + n, size - n, "%s\"%s\"", i ? "," : "", union_branches[i]);
}

ces_capfile_schemas_t *ces_capfile_schemas_new(void) {
    ces_avro_install_allocator();
    ces_capfile_schemas_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    int rc = make_class(ces_avro_container_header_schema, &s->schema[C_HEADER],
                        &s->iface[C_HEADER]) |
             make_class(block_head_schema_json, &s->schema[C_BLOCK_HEAD], &s->iface[C_BLOCK_HEAD]);
    for (int v = 0; v < 4 && rc == 0; v++) {
        char sys[64], props[64], json[sizeof(event_schema_format) + 128];
        union_text(v & 1, sys, sizeof(sys));
        union_text(v & 2, props, sizeof(props));
        snprintf(json, sizeof(json), event_schema_format, sys, props);
        rc = make_class(json, &s->schema[C_EVENT + v], &s->iface[C_EVENT + v]);
    }
    if (rc != 0) {
        ces_capfile_schemas_destroy(s);
        return NULL;
    }
    return s;
}

void ces_capfile_schemas_destroy(ces_capfile_schemas_t *s) {
    if (s == NULL)
        return;
    for (int i = 0; i < NCLASSES; i++) {
        if (s->iface[i] != NULL)
            avro_value_iface_decref(s->iface[i]);
        if (s->schema[i] != NULL)
            avro_schema_decref(s->schema[i]);
    }
    free(s);
}

/* A schema type that must be the primitive name: "long" or {"type": "long"}. */
static bool is_type(const ces_json_t *t, const char *name) {
    if (t != NULL && t->type == CES_JSON_OBJECT)
        t = ces_json_get(t, "type");
    return t != NULL && t->type == CES_JSON_STRING && strcmp(t->text, name) == 0;
}

/* A map whose values are the Capture union; *with_null says whether it ends in "null". */
static bool is_property_map(const ces_json_t *t, bool *with_null) {
    const ces_json_t *values = t != NULL && t->type == CES_JSON_OBJECT && is_type(t, "map")
                                   ? ces_json_get(t, "values")
                                   : NULL;
    if (values == NULL || values->type != CES_JSON_ARRAY ||
        (values->count != UNION_PLAIN && values->count != UNION_PLAIN + 1))
        return false;
    for (size_t i = 0; i < values->count; i++) {
        if (!is_type(&values->items[i], union_branches[i]))
            return false;
    }
    *with_null = values->count > UNION_PLAIN;
    return true;
}

/* Checks the writer schema's fields against EventData's. Returns the class variant, or -1 with
 * a sentence in errstr. */
static int event_variant(const ces_json_t *root, char *errstr, size_t errstr_size) {
    static const char *const names[] = {"SequenceNumber", "Offset", "EnqueuedTimeUtc",
                                        "SystemProperties", "Properties", "Body"};
    static const char *const types[] = {"long", "string", "string"};
    const ces_json_t *fields = root->type == CES_JSON_OBJECT ? ces_json_get(root, "fields") : NULL;
    if (!is_type(root, "record") || fields == NULL || fields->type != CES_JSON_ARRAY ||
        fields->count != 6) {
        snprintf(errstr, errstr_size, "its records are not EventData records of six fields");
        return -1;
    }
    bool nulls[2] = {false, false};
    for (size_t i = 0; i < 6; i++) {
        const ces_json_t *f = &fields->items[i];
        const ces_json_t *name = ces_json_get(f, "name"), *type = ces_json_get(f, "type");
        bool ok = name != NULL && name->type == CES_JSON_STRING && strcmp(name->text, names[i]) == 0;
        if (ok && i < 3)
            ok = is_type(type, types[i]);
        else if (ok && i < 5)
            ok = is_property_map(type, &nulls[i - 3]);
        else if (ok)
            ok = type != NULL && type->type == CES_JSON_ARRAY && type->count == 2 &&
                 is_type(&type->items[0], "null") && is_type(&type->items[1], "bytes");
        if (!ok) {
            snprintf(errstr, errstr_size, "its records are not EventData: field %zu is not %s as "
                                          "Capture writes it", i + 1, names[i]);
            return -1;
        }
    }
    return (nulls[0] ? 1 : 0) | (nulls[1] ? 2 : 0);
}

/* ---------------------------------------------------------------------------------------------
 * The file's bytes.
 */

/* Makes at least need bytes available from the current position unless the file ends first
 * (then fewer). Returns 0, or -1 with errno (a read error, or ENOMEM). */
static int fill(ces_capfile_t *f, size_t need) {
    if (f->end - f->start >= need || f->eof)
        return 0;
    if (f->start > 0) {
        memmove(f->buf, f->buf + f->start, f->end - f->start);
        f->end -= f->start;
        f->start = 0;
    }
    if (need > f->cap) {
        /* Doubling, but never past the most a block or the header may need: a block at the
         * limit would otherwise take twice the limit. */
        size_t most = f->limits.max_block_bytes + BLOCK_HEAD_MAX + SYNC_SIZE;
        if (most < CES_CAPFILE_MAX_HEADER_BYTES)
            most = CES_CAPFILE_MAX_HEADER_BYTES;
        size_t cap = f->cap ? f->cap : FIRST_BUFFER;
        while (cap < need)
            cap *= 2;
        if (cap > most)
            cap = need > most ? need : most;
        unsigned char *bigger = realloc(f->buf, cap);
        if (bigger == NULL) {
            errno = ENOMEM;
            return -1;
        }
        f->buf = bigger;
        f->cap = cap;
    }
    while (f->end < need && !f->eof) {
        size_t n = fread(f->buf + f->end, 1, f->cap - f->end, f->stream);
        f->end += n;
        if (n == 0) {
            if (ferror(f->stream))
                return -1;
            f->eof = true;
        }
    }
    return 0;
}

static void consume(ces_capfile_t *f, size_t n) {
    f->start += n;
    f->pos += n;
}

static ces_capfile_status_t io_failed(ces_capfile_t *f, char *errstr, size_t errstr_size) {
    if (errno == ENOMEM)
        return CES_CAPFILE_NOMEM;
    snprintf(errstr, errstr_size, "%s: %s", f->name, strerror(errno));
    return CES_CAPFILE_IO;
}

#define INVALID(...)                                                                               \
    do {                                                                                           \
        snprintf(errstr, errstr_size, __VA_ARGS__);                                                \
        return CES_CAPFILE_INVALID;                                                                \
    } while (0)

static ces_capfile_status_t from_avro(ces_avro_status_t st) {
    return st == CES_AVRO_OK      ? CES_CAPFILE_RECORD
           : st == CES_AVRO_NOMEM ? CES_CAPFILE_NOMEM
                                  : CES_CAPFILE_INVALID;
}

/* ---------------------------------------------------------------------------------------------
 * The header.
 */

typedef struct {
    ces_capfile_t *f;
    const unsigned char *bytes;
    size_t len;
    size_t header_len; /* out */
    int variant;       /* out */
    char *errstr;
    size_t errstr_size;
} header_read_t;

/* The writer schema (JSON text in the header) must be EventData's: sets h->variant. */
static ces_capfile_status_t check_writer_schema(header_read_t *h, const void *text, size_t len) {
    ces_arena_t *arena = ces_arena_new();
    ces_json_parser_t *parser = ces_json_parser_new();
    ces_capfile_status_t st = CES_CAPFILE_NOMEM;
    if (arena != NULL && parser != NULL) {
        ces_json_limits_t limits = {.max_depth = 16, .max_container = 64, .valid_utf8 = false};
        char jerr[200];
        const ces_json_t *root = ces_json_parse(parser, arena, text, len, &limits, jerr, sizeof(jerr));
        if (root == NULL && strcmp(jerr, "out of memory") != 0)
            snprintf(h->errstr, h->errstr_size, "%s: not an Event Hubs Capture file: its writer "
                     "schema is not valid JSON: %s", h->f->name, jerr);
        st = root == NULL ? (strcmp(jerr, "out of memory") == 0 ? CES_CAPFILE_NOMEM
                                                                 : CES_CAPFILE_INVALID)
                          : CES_CAPFILE_RECORD;
        char why[200];
        if (root != NULL && (h->variant = event_variant(root, why, sizeof(why))) < 0) {
            snprintf(h->errstr, h->errstr_size, "%s: not an Event Hubs Capture file: %s",
                     h->f->name, why);
            st = CES_CAPFILE_INVALID;
        }
    }
    ces_json_parser_destroy(parser);
    ces_arena_destroy(arena);
    return st;
}

/* The codec named in the metadata (absent: "null"); only "null" and "deflate" are read. */
static ces_capfile_status_t take_codec(header_read_t *h, avro_value_t *meta) {
    ces_capfile_t *f = h->f;
    avro_value_t entry;
    const void *p = "null";
    size_t size = 4;
    if (avro_value_get_by_name(meta, "avro.codec", &entry, NULL) == 0 && entry.iface != NULL &&
        avro_value_get_bytes(&entry, &p, &size) != 0)
        return CES_CAPFILE_NOMEM;
    bool null = size == 4 && memcmp(p, "null", 4) == 0;
    bool deflate = size == 7 && memcmp(p, "deflate", 7) == 0;
    if (!null && !deflate) {
        snprintf(h->errstr, h->errstr_size, "%s: codec '%.*s' is not supported (Capture writes "
                 "'deflate' or 'null', the only two ces2pg reads)", f->name,
                 (int)(size > 40 ? 40 : size), (const char *)p);
        return CES_CAPFILE_INVALID;
    }
    snprintf(f->codec, sizeof(f->codec), "%s", null ? "null" : "deflate");
    f->deflate = deflate;
    return CES_CAPFILE_RECORD;
}

/* The metadata's codec and writer schema, and the sync marker, of a header read. */
static ces_capfile_status_t take_header(header_read_t *h, avro_value_t *header) {
    avro_value_t meta, entry;
    const void *p;
    size_t size;
    if (avro_value_get_by_name(header, "meta", &meta, NULL) != 0)
        return CES_CAPFILE_NOMEM;
    ces_capfile_status_t st = take_codec(h, &meta);
    if (st != CES_CAPFILE_RECORD)
        return st;
    if (avro_value_get_by_name(&meta, "avro.schema", &entry, NULL) != 0 || entry.iface == NULL) {
        snprintf(h->errstr, h->errstr_size, "%s: the header has no avro.schema", h->f->name);
        return CES_CAPFILE_INVALID;
    }
    if (avro_value_get_bytes(&entry, &p, &size) != 0)
        return CES_CAPFILE_NOMEM;
    if ((st = check_writer_schema(h, p, size)) != CES_CAPFILE_RECORD)
        return st;
    if (avro_value_get_by_name(header, "sync", &entry, NULL) != 0 ||
        avro_value_get_fixed(&entry, &p, &size) != 0 || size != SYNC_SIZE ||
        avro_value_sizeof(header, &h->header_len) != 0)
        return CES_CAPFILE_NOMEM;
    memcpy(h->f->sync, p, SYNC_SIZE);
    return CES_CAPFILE_RECORD;
}

/* Reads the header from h->bytes with avro-c (inside ces_avro_guarded). */
static ces_capfile_status_t read_header(header_read_t *h) {
    avro_reader_t reader = avro_reader_memory((const char *)h->bytes, (int64_t)h->len);
    if (reader == NULL)
        return CES_CAPFILE_NOMEM;
    avro_value_t header = {0};
    char what[300];
    snprintf(what, sizeof(what), "%s: the Avro container header", h->f->name);
    ces_capfile_status_t st = from_avro(ces_avro_read_value(
        reader, h->f->schemas->iface[C_HEADER], &header, what, "Avro object container header",
        h->len, h->errstr, h->errstr_size));
    if (st == CES_CAPFILE_RECORD)
        st = take_header(h, &header);
    if (header.iface != NULL)
        avro_value_decref(&header);
    avro_reader_free(reader);
    return st;
}

static int guarded_header(void *arg) { return (int)read_header(arg); }

/* Reads the header from what the buffer holds; a header longer than that is read again with up to
 * CES_CAPFILE_MAX_HEADER_BYTES (Capture's take well under the first buffer). */
static ces_capfile_status_t open_header(ces_capfile_t *f, char *errstr, size_t errstr_size) {
    ces_capfile_status_t st = CES_CAPFILE_INVALID;
    for (size_t want = FIRST_BUFFER; st == CES_CAPFILE_INVALID; want = CES_CAPFILE_MAX_HEADER_BYTES) {
        if (fill(f, want) != 0)
            return io_failed(f, errstr, errstr_size);
        size_t avail = f->end - f->start;
        if (avail < 4 || memcmp(f->buf + f->start, MAGIC, 4) != 0)
            INVALID("%s: not an Avro object container file (it does not start with 'Obj' 0x01)",
                    f->name);
        header_read_t h = {f, f->buf + f->start, avail, 0, -1, errstr, errstr_size};
        st = (ces_capfile_status_t)ces_avro_guarded(avail, 64, guarded_header, &h);
        /* avro-c says what the header's value takes in Avro's canonical encoding, not how many
         * bytes it read: only if they are the same does the sync marker end there. */
        if (st == CES_CAPFILE_RECORD &&
            (h.header_len > avail || h.header_len < SYNC_SIZE ||
             memcmp(f->buf + f->start + h.header_len - SYNC_SIZE, f->sync, SYNC_SIZE) != 0))
            INVALID("%s: the Avro container header is not in Avro's canonical encoding", f->name);
        if (st == CES_CAPFILE_RECORD) {
            f->event_class = f->schemas->iface[C_EVENT + h.variant];
            consume(f, h.header_len);
        }
        if (f->eof || want == CES_CAPFILE_MAX_HEADER_BYTES)
            break;
    }
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Blocks.
 */

typedef struct {
    const ces_capfile_t *f;
    const unsigned char *bytes;
    size_t len;
    int64_t count, size; /* out */
    size_t head_len;     /* out: bytes the two longs took */
    char *errstr;
    size_t errstr_size;
} block_head_t;

static ces_capfile_status_t read_block_head(block_head_t *b) {
    avro_reader_t reader = avro_reader_memory((const char *)b->bytes, (int64_t)b->len);
    if (reader == NULL)
        return CES_CAPFILE_NOMEM;
    avro_value_t head = {0}, field;
    char what[300];
    snprintf(what, sizeof(what), "%s: the block at byte %" PRIu64, b->f->name, b->f->pos);
    ces_capfile_status_t st = from_avro(ces_avro_read_value(
        reader, b->f->schemas->iface[C_BLOCK_HEAD], &head, what, "Avro object container block",
        b->len, b->errstr, b->errstr_size));
    if (st == CES_CAPFILE_RECORD &&
        (avro_value_get_by_index(&head, 0, &field, NULL) != 0 ||
         avro_value_get_long(&field, &b->count) != 0 ||
         avro_value_get_by_index(&head, 1, &field, NULL) != 0 ||
         avro_value_get_long(&field, &b->size) != 0 || avro_value_sizeof(&head, &b->head_len) != 0))
        st = CES_CAPFILE_NOMEM;
    if (head.iface != NULL)
        avro_value_decref(&head);
    avro_reader_free(reader);
    return st;
}

static int guarded_block_head(void *arg) { return (int)read_block_head(arg); }

/* Inflates the block's deflate data (raw RFC 1951, as the Avro specification says) into
 * f->inflated, at most limits.max_block_bytes. */
static ces_capfile_status_t inflate_block(ces_capfile_t *f, const unsigned char *in, size_t len,
                                          char *errstr, size_t errstr_size) {
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, -15) != Z_OK)
        return CES_CAPFILE_NOMEM;
    z.next_in = (unsigned char *)in;
    z.avail_in = (uInt)len;
    size_t out = 0;
    int rc = Z_OK;
    while (rc == Z_OK) {
        if (out == f->inflated_cap) {
            size_t cap = f->inflated_cap ? f->inflated_cap * 2 : FIRST_BUFFER;
            if (cap > f->limits.max_block_bytes)
                cap = f->limits.max_block_bytes;
            unsigned char *bigger = cap > out ? realloc(f->inflated, cap) : NULL;
            if (bigger == NULL)
                break;
            f->inflated = bigger;
            f->inflated_cap = cap;
        }
        z.next_out = f->inflated + out;
        z.avail_out = (uInt)(f->inflated_cap - out);
        rc = inflate(&z, Z_NO_FLUSH);
        out = f->inflated_cap - z.avail_out;
    }
    /* Bytes after the end of the deflate data are ignored, as Java's and Python's readers do:
     * Python's writer leaves three bytes of zlib's checksum there. */
    bool whole = rc == Z_STREAM_END;
    const char *msg = z.msg ? z.msg : "";
    inflateEnd(&z);
    f->data = f->inflated;
    f->data_len = out;
    if (whole)
        return CES_CAPFILE_RECORD;
    if (rc == Z_OK && out == f->limits.max_block_bytes)
        INVALID("%s: the block at byte %" PRIu64 " inflates to more than %zu bytes", f->name,
                f->block_pos, f->limits.max_block_bytes);
    if (rc == Z_OK)
        return CES_CAPFILE_NOMEM;
    INVALID("%s: the block at byte %" PRIu64 " is not whole deflate data (%s)", f->name,
            f->block_pos, rc == Z_BUF_ERROR ? "it ends early" : msg);
}

/* Checks a block head's counts against the limits. */
static ces_capfile_status_t check_block_head(const ces_capfile_t *f, const block_head_t *b,
                                             char *errstr, size_t errstr_size) {
    if (b->count < 0 || b->size < 0)
        INVALID("%s: the block at byte %" PRIu64 " has a negative %s", f->name, f->pos,
                b->count < 0 ? "record count" : "size");
    if ((uint64_t)b->size > f->limits.max_block_bytes)
        INVALID("%s: the block at byte %" PRIu64 " holds %" PRId64 " bytes, more than the %zu "
                "allowed", f->name, f->pos, b->size, f->limits.max_block_bytes);
    return CES_CAPFILE_RECORD;
}

/* Reads the next block's head, data and sync marker; END at the end of the file. */
static ces_capfile_status_t next_block(ces_capfile_t *f, char *errstr, size_t errstr_size) {
    if (fill(f, BLOCK_HEAD_MAX) != 0)
        return io_failed(f, errstr, errstr_size);
    size_t avail = f->end - f->start;
    if (avail == 0)
        return CES_CAPFILE_END;
    block_head_t b = {f, f->buf + f->start, avail < BLOCK_HEAD_MAX ? avail : BLOCK_HEAD_MAX,
                      0, 0, 0, errstr, errstr_size};
    ces_capfile_status_t st =
        (ces_capfile_status_t)ces_avro_guarded(b.len, 0, guarded_block_head, &b);
    if (st != CES_CAPFILE_RECORD || (st = check_block_head(f, &b, errstr, errstr_size)) != 0)
        return st;
    size_t need = b.head_len + (size_t)b.size + SYNC_SIZE;
    if (fill(f, need) != 0)
        return io_failed(f, errstr, errstr_size);
    if (f->end - f->start < need)
        INVALID("%s: truncated: the file ends inside the block at byte %" PRIu64 " (%zu bytes of "
                "its %zu)", f->name, f->pos, f->end - f->start, need);
    const unsigned char *data = f->buf + f->start + b.head_len;
    if (memcmp(data + b.size, f->sync, SYNC_SIZE) != 0)
        INVALID("%s: the block at byte %" PRIu64 " does not end with the header's sync marker "
                "(a corrupt file)", f->name, f->pos);
    f->block_pos = f->pos;
    /* "null" data stays in buf, which nothing refills before the block's records are read. */
    f->data = data;
    f->data_len = (size_t)b.size;
    consume(f, need);
    if (f->deflate && b.size > 0 && (st = inflate_block(f, data, (size_t)b.size, errstr, errstr_size)) != 0)
        return st;
    if ((uint64_t)b.count > f->data_len || (b.count == 0) != (f->data_len == 0))
        INVALID("%s: the block at byte %" PRIu64 " claims %" PRId64 " records in %zu bytes",
                f->name, f->block_pos, b.count, f->data_len);
    f->block_count = b.count;
    f->block_done = 0;
    avro_reader_memory_set_source(f->data_reader, (const char *)f->data, (int64_t)f->data_len);
    return CES_CAPFILE_RECORD;
}

/* ---------------------------------------------------------------------------------------------
 * Records.
 */

typedef struct {
    ces_capfile_t *f;
    ces_capfile_record_t *record;
    char *errstr;
    size_t errstr_size;
} record_read_t;

/* The fields ces2pg uses, out of a record read: the body copied (with malloc, not avro-c's
 * allocator, so that it outlives the guard window). */
static ces_capfile_status_t take_record(avro_value_t *event, ces_capfile_record_t *record) {
    avro_value_t field, branch;
    const void *body = NULL;
    size_t size = 0;
    if (avro_value_get_by_index(event, F_SEQUENCE, &field, NULL) != 0 ||
        avro_value_get_long(&field, &record->sequence) != 0 ||
        avro_value_get_by_index(event, F_BODY, &field, NULL) != 0 ||
        avro_value_get_current_branch(&field, &branch) != 0)
        return CES_CAPFILE_NOMEM;
    record->body_null = avro_value_get_type(&branch) == AVRO_NULL;
    if (!record->body_null && avro_value_get_bytes(&branch, &body, &size) != 0)
        return CES_CAPFILE_NOMEM;
    record->body_len = record->body_null ? 0 : size;
    record->body = malloc(record->body_len + 1);
    if (record->body == NULL)
        return CES_CAPFILE_NOMEM;
    if (record->body_len > 0)
        memcpy(record->body, body, record->body_len);
    return CES_CAPFILE_RECORD;
}

/* Reads the block's next record (inside ces_avro_guarded); after its last, nothing may be left. */
static ces_capfile_status_t read_record(record_read_t *r) {
    ces_capfile_t *f = r->f;
    avro_value_t event = {0};
    char what[300];
    snprintf(what, sizeof(what), "%s: record %" PRId64 " of the block at byte %" PRIu64, f->name,
             f->block_done + 1, f->block_pos);
    ces_capfile_status_t st = from_avro(ces_avro_read_value(
        f->data_reader, f->event_class, &event, what, "Event Hubs Capture EventData", f->data_len,
        r->errstr, r->errstr_size));
    if (st == CES_CAPFILE_RECORD)
        st = take_record(&event, r->record);
    if (event.iface != NULL)
        avro_value_decref(&event);
    char c;
    if (st == CES_CAPFILE_RECORD && f->block_done + 1 == f->block_count &&
        avro_read(f->data_reader, &c, 1) == 0) {
        snprintf(r->errstr, r->errstr_size, "%s: the block at byte %" PRIu64 " has bytes after "
                 "its %" PRId64 " records", f->name, f->block_pos, f->block_count);
        st = CES_CAPFILE_INVALID;
    }
    if (st != CES_CAPFILE_RECORD) {
        free(r->record->body);
        r->record->body = NULL;
    }
    return st;
}

static int guarded_record(void *arg) { return (int)read_record(arg); }

ces_capfile_status_t ces_capfile_next(ces_capfile_t *f, ces_capfile_record_t *record, char *errstr,
                                      size_t errstr_size) {
    memset(record, 0, sizeof(*record));
    if (f->done) {
        snprintf(errstr, errstr_size, "%s: read past its end", f->name);
        return CES_CAPFILE_END;
    }
    ces_capfile_status_t st = CES_CAPFILE_RECORD;
    while (st == CES_CAPFILE_RECORD && f->block_done == f->block_count)
        st = next_block(f, errstr, errstr_size);
    if (st == CES_CAPFILE_RECORD) {
        record_read_t r = {f, record, errstr, errstr_size};
        st = (ces_capfile_status_t)ces_avro_guarded(f->data_len, f->limits.max_map_items,
                                                    guarded_record, &r);
        f->block_done++;
    }
    f->done = st != CES_CAPFILE_RECORD;
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Opening and closing.
 */

ces_capfile_t *ces_capfile_open_stream(const ces_capfile_schemas_t *schemas, FILE *stream,
                                       const char *name, const ces_capfile_limits_t *limits,
                                       ces_capfile_status_t *st, char *errstr,
                                       size_t errstr_size) {
    ces_capfile_t *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        fclose(stream);
        *st = CES_CAPFILE_NOMEM;
        goto fail;
    }
    f->schemas = schemas;
    f->limits = *limits;
    f->stream = stream;
    *st = CES_CAPFILE_NOMEM;
    if ((f->name = strdup(name)) == NULL || (f->data_reader = avro_reader_memory(NULL, 0)) == NULL ||
        (*st = open_header(f, errstr, errstr_size)) != CES_CAPFILE_RECORD)
        goto fail;
    return f;
fail:
    if (*st == CES_CAPFILE_NOMEM)
        snprintf(errstr, errstr_size, "out of memory");
    ces_capfile_close(f);
    return NULL;
}

ces_capfile_t *ces_capfile_open(const ces_capfile_schemas_t *schemas, const char *path,
                                const ces_capfile_limits_t *limits, ces_capfile_status_t *st,
                                char *errstr, size_t errstr_size) {
    FILE *stream = fopen(path, "rb");
    if (stream == NULL) {
        *st = CES_CAPFILE_IO;
        snprintf(errstr, errstr_size, "%s: %s", path, strerror(errno));
        return NULL;
    }
    return ces_capfile_open_stream(schemas, stream, path, limits, st, errstr, errstr_size);
}

void ces_capfile_close(ces_capfile_t *f) {
    if (f == NULL)
        return;
    if (f->stream != NULL)
        fclose(f->stream);
    if (f->data_reader != NULL)
        avro_reader_free(f->data_reader);
    free(f->buf);
    free(f->inflated);
    free(f->name);
    free(f);
}

uint64_t ces_capfile_bytes_read(const ces_capfile_t *f) { return f->pos; }

const char *ces_capfile_codec(const ces_capfile_t *f) { return f->codec; }
