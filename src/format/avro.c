#include "format/avro.h"

#include <avro/allocation.h>
#include <avro/errors.h>
#include <avro/generic.h>
#include <avro/io.h>
#include <avro/schema.h>
#include <avro/value.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Schemas. docs/ces-format.md ("Avro binary encoding") gives the fields and their order; the record names are ours (a container's
 * writer schema is compared by structure, not by name).
 */

const char ces_avro_change_event_schema[] =
    "{\"type\":\"record\",\"name\":\"ChangeEvent\",\"fields\":["
    "{\"name\":\"specversion\",\"type\":\"string\"},"
    "{\"name\":\"type\",\"type\":\"string\"},"
    "{\"name\":\"source\",\"type\":\"string\"},"
    "{\"name\":\"id\",\"type\":\"string\"},"
    "{\"name\":\"logicalid\",\"type\":\"string\"},"
    "{\"name\":\"time\",\"type\":\"string\"},"
    "{\"name\":\"datacontenttype\",\"type\":\"string\"},"
    "{\"name\":\"operation\",\"type\":\"string\"},"
    "{\"name\":\"segmentindex\",\"type\":\"int\"},"
    "{\"name\":\"finalsegment\",\"type\":\"boolean\"},"
    "{\"name\":\"data\",\"type\":\"bytes\"}]}";

const char ces_avro_data_schema[] =
    "{\"type\":\"record\",\"name\":\"Data\",\"fields\":["
    "{\"name\":\"eventsource\",\"type\":{\"type\":\"record\",\"name\":\"EventSource\",\"fields\":["
    "{\"name\":\"db\",\"type\":\"string\"},"
    "{\"name\":\"schema\",\"type\":\"string\"},"
    "{\"name\":\"tbl\",\"type\":\"string\"},"
    "{\"name\":\"cols\",\"type\":{\"type\":\"array\",\"items\":{\"type\":\"record\","
    "\"name\":\"Column\",\"fields\":["
    "{\"name\":\"name\",\"type\":\"string\"},"
    "{\"name\":\"type\",\"type\":\"string\"},"
    "{\"name\":\"index\",\"type\":\"int\"}]}}},"
    "{\"name\":\"pkkey\",\"type\":{\"type\":\"array\",\"items\":{\"type\":\"record\","
    "\"name\":\"PkKey\",\"fields\":["
    "{\"name\":\"columnname\",\"type\":\"string\"},"
    "{\"name\":\"value\",\"type\":\"string\"}]}}},"
    "{\"name\":\"transaction\",\"type\":{\"type\":\"record\",\"name\":\"Transaction\",\"fields\":["
    "{\"name\":\"commitlsn\",\"type\":\"string\"},"
    "{\"name\":\"beginlsn\",\"type\":\"string\"},"
    "{\"name\":\"sequencenumber\",\"type\":\"int\"},"
    "{\"name\":\"committime\",\"type\":\"string\"}]}}]}},"
    "{\"name\":\"eventrow\",\"type\":{\"type\":\"record\",\"name\":\"EventRow\",\"fields\":["
    "{\"name\":\"old\",\"type\":\"string\"},"
    "{\"name\":\"current\",\"type\":\"string\"}]}}]}";

/* The object container header and data block, as the Avro specification defines them. A block is
 * "long count, long size, size bytes, 16-byte sync": exactly a record {long, bytes, fixed(16)}. */
const char ces_avro_container_header_schema[] =
    "{\"type\":\"record\",\"name\":\"Header\",\"namespace\":\"org.apache.avro.file\",\"fields\":["
    "{\"name\":\"magic\",\"type\":{\"type\":\"fixed\",\"name\":\"Magic\",\"size\":4}},"
    "{\"name\":\"meta\",\"type\":{\"type\":\"map\",\"values\":\"bytes\"}},"
    "{\"name\":\"sync\",\"type\":{\"type\":\"fixed\",\"name\":\"Sync\",\"size\":16}}]}";
static const char block_schema_json[] =
    "{\"type\":\"record\",\"name\":\"Block\",\"namespace\":\"org.apache.avro.file\",\"fields\":["
    "{\"name\":\"count\",\"type\":\"long\"},"
    "{\"name\":\"data\",\"type\":\"bytes\"},"
    "{\"name\":\"sync\",\"type\":{\"type\":\"fixed\",\"name\":\"Sync\",\"size\":16}}]}";

#define CONTAINER_MAGIC "Obj\x01"
#define SYNC_SIZE 16

/* ---------------------------------------------------------------------------------------------
 * The guarded allocator. Every block carries a header with its size (avro-c's osize arguments are
 * not relied on). Blocks allocated while a read is in progress (the "window") are linked into a list
 * and counted; requests beyond the window's caps fail; what is still linked when the window closes
 * was leaked by avro-c and is freed.
 */

typedef struct guard_block_s {
    struct guard_block_s *prev, *next;
    size_t size;
    bool tracked;
} guard_block_t;

#define GUARD_HEADER ((sizeof(guard_block_t) + alignof(max_align_t) - 1) & ~(alignof(max_align_t) - 1))

static _Thread_local struct {
    bool active;
    guard_block_t list; /* sentinel of the window's blocks */
    size_t live;        /* bytes in tracked blocks */
    size_t max_live;
    size_t max_single;
    size_t refused; /* size of the first refused request in this window, or 0 */
    bool oom;       /* malloc itself failed in this window */
    size_t swept;   /* blocks freed at the end of windows, ever (diagnostic) */
} guard;

static void guard_unlink(guard_block_t *b) {
    b->prev->next = b->next;
    b->next->prev = b->prev;
    guard.live -= b->size;
}

static void guard_link(guard_block_t *b) {
    b->next = guard.list.next;
    b->prev = &guard.list;
    guard.list.next->prev = b;
    guard.list.next = b;
    guard.live += b->size;
}

static void *guard_alloc(void *user_data, void *ptr, size_t osize, size_t nsize) {
    (void)user_data;
    (void)osize;
    guard_block_t *b = ptr ? (guard_block_t *)(void *)((char *)ptr - GUARD_HEADER) : NULL;
    if (nsize == 0) {
        if (b != NULL) {
            if (b->tracked)
                guard_unlink(b);
            free(b);
        } else if (guard.active && guard.refused == 0) {
            guard.refused = SIZE_MAX; /* malloc(0): avro-c read a length of -1 */
        }
        return NULL;
    }
    bool tracked = guard.active || (b != NULL && b->tracked);
    if (guard.active) {
        size_t old = (b != NULL && b->tracked) ? b->size : 0;
        if (nsize > guard.max_single || nsize > guard.max_live ||
            guard.live - old > guard.max_live - nsize) {
            if (guard.refused == 0)
                guard.refused = nsize;
            return NULL;
        }
    }
    if (nsize > SIZE_MAX - GUARD_HEADER)
        return NULL;
    if (b != NULL && b->tracked)
        guard_unlink(b);
    guard_block_t *nb = realloc(b, GUARD_HEADER + nsize);
    if (nb == NULL) {
        if (b != NULL && b->tracked)
            guard_link(b);
        guard.oom = true;
        return NULL;
    }
    nb->size = nsize;
    nb->tracked = tracked;
    if (tracked)
        guard_link(nb);
    return (char *)nb + GUARD_HEADER;
}

/* Bytes avro-c needs per array element at most (a generic record of the CES schemas: measured
 * about 160), and for everything else but strings, bytes and arrays. */
#define ITEM_BYTES 256
#define FIXED_BYTES (1u << 20)

/* Opens a window for reading input_len bytes whose arrays may have at most max_items items (more
 * are rejected by decode.c anyway). Strings and bytes are at most input_len long, so one allocation
 * never needs more than input_len plus an array's storage, and all of them together a few times
 * the input. A length prefix that claims more is refused before anything is allocated. */
static void window_begin(size_t input_len, size_t max_items) {
    guard.list.next = guard.list.prev = &guard.list;
    guard.live = 0;
    guard.refused = 0;
    guard.oom = false;
    size_t arrays = max_items > SIZE_MAX / 4 / ITEM_BYTES ? SIZE_MAX / 4 : max_items * ITEM_BYTES;
    if (input_len > SIZE_MAX / 16 || arrays > SIZE_MAX / 16) {
        guard.max_single = guard.max_live = SIZE_MAX / 2;
    } else {
        guard.max_single = input_len + 64 + arrays + FIXED_BYTES / 16;
        guard.max_live = 4 * input_len + 2 * arrays + FIXED_BYTES;
    }
    guard.active = true;
}

static void window_end(void) {
    guard.active = false;
    while (guard.list.next != &guard.list) {
        guard_block_t *b = guard.list.next;
        guard_unlink(b);
        free(b);
        guard.swept++;
    }
    guard.live = 0;
}

size_t ces_avro_swept_blocks(void) { return guard.swept; }

void ces_avro_install_allocator(void) {
    static bool installed = false;
    if (!installed) {
        avro_set_allocator(guard_alloc, NULL);
        installed = true;
    }
}

/* ---------------------------------------------------------------------------------------------
 * The reader object.
 */

struct ces_avro_s {
    avro_schema_t event_schema, data_schema, header_schema, block_schema;
    avro_value_iface_t *event_class, *data_class, *header_class, *block_class;
    ces_json_parser_t *json;
    ces_json_limits_t json_limits;
};

int ces_avro_make_class(const char *json, size_t len, avro_schema_t *schema,
                        avro_value_iface_t **iface) {
    if (avro_schema_from_json_length(json, len, schema) != 0)
        return -1;
    *iface = avro_generic_class_from_schema(*schema);
    return *iface == NULL ? -1 : 0;
}

ces_avro_t *ces_avro_new(const ces_json_limits_t *json_limits, char *errstr, size_t errstr_size) {
    ces_avro_install_allocator();
    ces_avro_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    a->json_limits = *json_limits;
    a->json = ces_json_parser_new();
    if (a->json == NULL ||
        ces_avro_make_class(ces_avro_change_event_schema,
                            sizeof(ces_avro_change_event_schema) - 1, &a->event_schema,
                            &a->event_class) != 0 ||
        ces_avro_make_class(ces_avro_data_schema, sizeof(ces_avro_data_schema) - 1,
                            &a->data_schema, &a->data_class) != 0 ||
        ces_avro_make_class(ces_avro_container_header_schema,
                            sizeof(ces_avro_container_header_schema) - 1, &a->header_schema,
                            &a->header_class) != 0 ||
        ces_avro_make_class(block_schema_json, sizeof(block_schema_json) - 1, &a->block_schema,
                            &a->block_class) != 0) {
        snprintf(errstr, errstr_size, "cannot set up the Avro schemas: %s",
                 a->json == NULL ? "out of memory" : avro_strerror());
        ces_avro_destroy(a);
        return NULL;
    }
    return a;
}

void ces_avro_destroy(ces_avro_t *a) {
    if (a == NULL)
        return;
    avro_value_iface_t *classes[] = {a->event_class, a->data_class, a->header_class,
                                     a->block_class};
    avro_schema_t schemas[] = {a->event_schema, a->data_schema, a->header_schema, a->block_schema};
    for (size_t i = 0; i < 4; i++) {
        if (classes[i] != NULL)
            avro_value_iface_decref(classes[i]);
        if (schemas[i] != NULL)
            avro_schema_decref(schemas[i]);
    }
    ces_json_parser_destroy(a->json);
    free(a);
}

bool ces_avro_is_container(const void *record, size_t len) {
    return len >= 4 && memcmp(record, CONTAINER_MAGIC, 4) == 0;
}

/* ---------------------------------------------------------------------------------------------
 * Reading.
 */

#define INVALID(...)                                                                               \
    do {                                                                                           \
        snprintf(errstr, errstr_size, __VA_ARGS__);                                                \
        return CES_AVRO_INVALID;                                                                   \
    } while (0)

/* The reason for a failed avro_value_read of a value of the schema called schema_name. */
static ces_avro_status_t read_failed(const char *what, const char *schema_name, size_t input_len,
                                     char *errstr, size_t errstr_size) {
    if (guard.refused != 0) {
        if (guard.refused > SIZE_MAX / 2)
            INVALID("%s: a negative length prefix", what);
        INVALID("%s: a length or count prefix claims more than the %zu bytes of input can hold "
                "(allocation of %zu bytes refused)",
                what, input_len, guard.refused);
    }
    /* Only a failure of malloc itself is out of memory: avro-c also says ENOMEM for allocations the
     * guard refused and for its own reasons, and those are the record's fault. */
    if (guard.oom)
        return CES_AVRO_NOMEM;
    const char *msg = avro_strerror();
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' ' || msg[n - 1] == ':'))
        n--;
    INVALID("%s: malformed Avro (truncated, or not the %s schema): %.*s", what, schema_name,
            (int)n, msg);
}

/* Reads one value of class iface from reader into *value (which the caller decrefs when
 * value->iface is set). */
static ces_avro_status_t read_schema_value(avro_reader_t reader, avro_value_iface_t *iface,
                                           avro_value_t *value, const char *what,
                                           const char *schema_name, size_t input_len,
                                           char *errstr, size_t errstr_size) {
    value->iface = NULL;
    /* avro-c prefixes some messages to whatever its error buffer holds: start from empty. */
    avro_set_error("%s", "");
    if (avro_generic_value_new(iface, value) != 0) {
        value->iface = NULL;
        return read_failed(what, schema_name, input_len, errstr, errstr_size);
    }
    if (avro_value_read(reader, value) != 0)
        return read_failed(what, schema_name, input_len, errstr, errstr_size);
    return CES_AVRO_OK;
}

static ces_avro_status_t read_value(avro_reader_t reader, avro_value_iface_t *iface,
                                    avro_value_t *value, const char *what, size_t input_len,
                                    char *errstr, size_t errstr_size) {
    return read_schema_value(reader, iface, value, what, "CES", input_len, errstr, errstr_size);
}

ces_avro_status_t ces_avro_read_value(avro_reader_t reader, avro_value_iface_t *iface,
                                      avro_value_t *value, const char *what,
                                      const char *schema_name, size_t input_len, char *errstr,
                                      size_t errstr_size) {
    return read_schema_value(reader, iface, value, what, schema_name, input_len, errstr,
                             errstr_size);
}

static bool at_end(avro_reader_t reader) {
    char c;
    return avro_read(reader, &c, 1) != 0;
}

#define MAX_PATH 16 /* the CES schemas nest four levels */

typedef struct {
    ces_arena_t *arena;
    struct {
        const char *name; /* record field, or NULL for an array item */
        size_t index;
    } path[MAX_PATH];
    size_t depth;
    char *errstr;
    size_t errstr_size;
} walk_t;

/* "eventsource.cols[3].name": where the walk is, for messages. */
static const char *path_text(const walk_t *w, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < w->depth && len < size; i++) {
        int n = w->path[i].name ? snprintf(buf + len, size - len, "%s%s", len ? "." : "",
                                           w->path[i].name)
                                : snprintf(buf + len, size - len, "[%zu]", w->path[i].index);
        if (n < 0)
            break;
        len += (size_t)n;
    }
    return buf;
}

#define WALK_INVALID(w, fmt)                                                                       \
    do {                                                                                           \
        char path_[160];                                                                           \
        snprintf((w)->errstr, (w)->errstr_size, fmt, path_text(w, path_, sizeof(path_)));          \
        return CES_AVRO_INVALID;                                                                   \
    } while (0)

static ces_avro_status_t text_node(walk_t *w, ces_json_type_t type, const void *p, size_t len,
                                   ces_json_t *out) {
    out->type = type;
    out->may_hold_nul = type == CES_JSON_STRING;
    out->text = ces_arena_strndup(w->arena, p, len);
    if (out->text == NULL)
        return CES_AVRO_NOMEM;
    out->text_len = len;
    return CES_AVRO_OK;
}

/* Turns an avro-c generic value into a ces_json_t node allocated from the arena. */
static ces_avro_status_t to_tree(walk_t *w, avro_value_t *v, ces_json_t *out) {
    memset(out, 0, sizeof(*out));
    switch (avro_value_get_type(v)) {
    case AVRO_STRING: {
        const char *s;
        size_t size;
        if (avro_value_get_string(v, &s, &size) != 0)
            return CES_AVRO_NOMEM;
        size_t len = size > 0 ? size - 1 : 0; /* avro-c counts the terminating NUL */
        if (!ces_utf8_valid(s, len))
            WALK_INVALID(w, "Avro string %s is not valid UTF-8");
        return text_node(w, CES_JSON_STRING, s, len, out);
    }
    case AVRO_BYTES: {
        const void *p;
        size_t size;
        if (avro_value_get_bytes(v, &p, &size) != 0)
            return CES_AVRO_NOMEM;
        return text_node(w, CES_JSON_STRING, p, size, out);
    }
    case AVRO_INT32: {
        int32_t n;
        char buf[16], *e = buf + sizeof(buf), *q = e;
        if (avro_value_get_int(v, &n) != 0)
            return CES_AVRO_NOMEM;
        uint32_t u = n < 0 ? 0u - (uint32_t)n : (uint32_t)n;
        do
            *--q = (char)('0' + u % 10);
        while ((u /= 10) != 0);
        if (n < 0)
            *--q = '-';
        return text_node(w, CES_JSON_NUMBER, q, (size_t)(e - q), out);
    }
    case AVRO_BOOLEAN: {
        int b;
        if (avro_value_get_boolean(v, &b) != 0)
            return CES_AVRO_NOMEM;
        out->type = CES_JSON_BOOL;
        out->boolean = b != 0;
        return CES_AVRO_OK;
    }
    case AVRO_RECORD:
    case AVRO_ARRAY: {
        bool record = avro_value_get_type(v) == AVRO_RECORD;
        size_t count;
        if (avro_value_get_size(v, &count) != 0)
            return CES_AVRO_NOMEM;
        out->type = record ? CES_JSON_OBJECT : CES_JSON_ARRAY;
        out->count = count;
        if (count == 0)
            return CES_AVRO_OK;
        if (record) {
            out->members = ces_arena_alloc(w->arena, count * sizeof(ces_json_member_t));
            if (out->members == NULL)
                return CES_AVRO_NOMEM;
        } else {
            if (count > SIZE_MAX / sizeof(ces_json_t))
                return CES_AVRO_NOMEM;
            out->items = ces_arena_alloc(w->arena, count * sizeof(ces_json_t));
            if (out->items == NULL)
                return CES_AVRO_NOMEM;
        }
        if (w->depth == MAX_PATH)
            WALK_INVALID(w, "Avro value nested too deeply at %s");
        w->depth++;
        for (size_t i = 0; i < count; i++) {
            avro_value_t child;
            const char *name = NULL;
            if (avro_value_get_by_index(v, i, &child, &name) != 0)
                return CES_AVRO_NOMEM;
            w->path[w->depth - 1].name = record ? name : NULL;
            w->path[w->depth - 1].index = i;
            ces_json_t *node = record ? &out->members[i].value : &out->items[i];
            if (record) {
                out->members[i].key = name;
                out->members[i].key_len = strlen(name);
            }
            ces_avro_status_t st = to_tree(w, &child, node);
            if (st != CES_AVRO_OK)
                return st;
        }
        w->depth--;
        return CES_AVRO_OK;
    }
    default:
        /* Not in the CES schemas: reading with them cannot produce other types. */
        WALK_INVALID(w, "Avro value of an unexpected type at %s");
    }
}

/* Record field names point into avro-c's schema, which lives as long as the reader: copy them so
 * the tree depends on the arena only. */
static ces_avro_status_t own_names(ces_arena_t *arena, ces_json_t *node) {
    if (node->type == CES_JSON_OBJECT) {
        for (size_t i = 0; i < node->count; i++) {
            ces_json_member_t *m = &node->members[i];
            m->key = ces_arena_strndup(arena, m->key, m->key_len);
            if (m->key == NULL)
                return CES_AVRO_NOMEM;
            ces_avro_status_t st = own_names(arena, &m->value);
            if (st != CES_AVRO_OK)
                return st;
        }
    } else if (node->type == CES_JSON_ARRAY) {
        for (size_t i = 0; i < node->count; i++) {
            ces_avro_status_t st = own_names(arena, &node->items[i]);
            if (st != CES_AVRO_OK)
                return st;
        }
    }
    return CES_AVRO_OK;
}

static ces_avro_status_t value_to_root(ces_arena_t *arena, avro_value_t *value,
                                       const ces_json_t **root, char *errstr, size_t errstr_size) {
    walk_t w = {.arena = arena, .errstr = errstr, .errstr_size = errstr_size};
    ces_json_t *node = ces_arena_alloc(arena, sizeof(*node));
    if (node == NULL)
        return CES_AVRO_NOMEM;
    ces_avro_status_t st = to_tree(&w, value, node);
    if (st == CES_AVRO_OK)
        st = own_names(arena, node);
    if (st == CES_AVRO_OK)
        *root = node;
    return st;
}

/* Reads a bare datum of class iface that must fill buf[0..len) exactly, into a tree. */
static ces_avro_status_t read_bare(ces_arena_t *arena, avro_value_iface_t *iface, const char *what,
                                   const void *buf, size_t len, const ces_json_t **root,
                                   char *errstr, size_t errstr_size) {
    if (len == 0)
        INVALID("%s: empty Avro record", what);
    if (len > INT64_MAX)
        INVALID("%s: too large", what);
    avro_reader_t reader = avro_reader_memory(buf, (int64_t)len);
    if (reader == NULL)
        return CES_AVRO_NOMEM;
    avro_value_t value;
    ces_avro_status_t st = read_value(reader, iface, &value, what, len, errstr, errstr_size);
    if (st == CES_AVRO_OK && !at_end(reader)) {
        snprintf(errstr, errstr_size, "%s: unexpected bytes after the end of the Avro record", what);
        st = CES_AVRO_INVALID;
    }
    if (st == CES_AVRO_OK)
        st = value_to_root(arena, &value, root, errstr, errstr_size);
    if (value.iface != NULL)
        avro_value_decref(&value);
    avro_reader_free(reader);
    return st;
}

/* A type in a writer schema: "string" or {"type": "string"}. */
static const char *schema_type_name(const ces_json_t *t) {
    if (t != NULL && t->type == CES_JSON_STRING)
        return t->text;
    if (t != NULL && t->type == CES_JSON_OBJECT) {
        const ces_json_t *inner = ces_json_get(t, "type");
        if (inner != NULL && inner->type == CES_JSON_STRING)
            return inner->text;
    }
    return NULL;
}

/* The container's writer schema must be the ChangeEvent schema of docs/ces-format.md, field for field. */
static ces_avro_status_t check_writer_schema(ces_avro_t *a, ces_arena_t *arena, const char *text,
                                             size_t len, char *errstr, size_t errstr_size) {
    static const struct {
        const char *name, *type;
    } fields[] = {
        {"specversion", "string"}, {"type", "string"},       {"source", "string"},
        {"id", "string"},          {"logicalid", "string"},  {"time", "string"},
        {"datacontenttype", "string"}, {"operation", "string"}, {"segmentindex", "int"},
        {"finalsegment", "boolean"},   {"data", "bytes"},
    };
    const size_t nfields = sizeof(fields) / sizeof(fields[0]);
    char jerr[200];
    const ces_json_t *root =
        ces_json_parse(a->json, arena, text, len, &a->json_limits, jerr, sizeof(jerr));
    if (root == NULL) {
        if (strcmp(jerr, "out of memory") == 0)
            return CES_AVRO_NOMEM;
        INVALID("Avro container: writer schema is not valid JSON: %s", jerr);
    }
    const char *type = schema_type_name(root);
    const ces_json_t *list = ces_json_get(root, "fields");
    if (root->type != CES_JSON_OBJECT || type == NULL || strcmp(type, "record") != 0 ||
        list == NULL || list->type != CES_JSON_ARRAY)
        INVALID("Avro container: writer schema is not a record schema; expected the CES "
                "ChangeEvent record");
    if (list->count != nfields)
        INVALID("Avro container: writer schema has %zu fields; the CES ChangeEvent record has %zu",
                list->count, nfields);
    for (size_t i = 0; i < nfields; i++) {
        const ces_json_t *f = &list->items[i];
        const ces_json_t *name = ces_json_get(f, "name");
        if (name == NULL || name->type != CES_JSON_STRING || strcmp(name->text, fields[i].name) != 0)
            INVALID("Avro container: writer schema field %zu is '%.60s'; the CES ChangeEvent has "
                    "'%s' there",
                    i + 1, name && name->type == CES_JSON_STRING ? name->text : "?", fields[i].name);
        const char *ftype = schema_type_name(ces_json_get(f, "type"));
        if (ftype == NULL || strcmp(ftype, fields[i].type) != 0)
            INVALID("Avro container: writer schema field '%s' has type %.60s; expected %s",
                    fields[i].name, ftype ? ftype : "(not a primitive type)", fields[i].type);
    }
    return CES_AVRO_OK;
}

static ces_avro_status_t read_container(ces_avro_t *a, ces_arena_t *arena, const void *record,
                                        size_t len, const ces_json_t **root, char *errstr,
                                        size_t errstr_size) {
    if (len > INT64_MAX)
        INVALID("Avro container: too large");
    avro_reader_t reader = avro_reader_memory(record, (int64_t)len);
    if (reader == NULL)
        return CES_AVRO_NOMEM;
    avro_value_t header = {0}, block = {0}, field, entry;
    const void *p;
    size_t size;
    char sync[SYNC_SIZE];
    ces_avro_status_t st =
        read_value(reader, a->header_class, &header, "Avro container header", len, errstr,
                   errstr_size);
    if (st != CES_AVRO_OK)
        goto done;
    if (avro_value_get_by_name(&header, "meta", &field, NULL) != 0)
        goto nomem;
    if (avro_value_get_by_name(&field, "avro.codec", &entry, NULL) == 0 && entry.iface != NULL) {
        if (avro_value_get_bytes(&entry, &p, &size) != 0)
            goto nomem;
        if (!(size == 4 && memcmp(p, "null", 4) == 0)) {
            snprintf(errstr, errstr_size,
                     "Avro container: codec '%.*s' is not supported (only uncompressed, 'null')",
                     (int)(size > 40 ? 40 : size), (const char *)p);
            st = CES_AVRO_INVALID;
            goto done;
        }
    }
    if (avro_value_get_by_name(&field, "avro.schema", &entry, NULL) != 0 || entry.iface == NULL) {
        snprintf(errstr, errstr_size, "Avro container: the header has no avro.schema");
        st = CES_AVRO_INVALID;
        goto done;
    }
    if (avro_value_get_bytes(&entry, &p, &size) != 0)
        goto nomem;
    st = check_writer_schema(a, arena, p, size, errstr, errstr_size);
    if (st != CES_AVRO_OK)
        goto done;
    if (avro_value_get_by_name(&header, "sync", &field, NULL) != 0 ||
        avro_value_get_fixed(&field, &p, &size) != 0 || size != SYNC_SIZE)
        goto nomem;
    memcpy(sync, p, SYNC_SIZE);

    st = read_value(reader, a->block_class, &block, "Avro container block", len, errstr,
                    errstr_size);
    if (st != CES_AVRO_OK)
        goto done;
    int64_t count;
    if (avro_value_get_by_name(&block, "count", &field, NULL) != 0 ||
        avro_value_get_long(&field, &count) != 0)
        goto nomem;
    if (count != 1) {
        snprintf(errstr, errstr_size,
                 "Avro container: its block holds %" PRId64 " records; a CES record value holds "
                 "exactly one",
                 count);
        st = CES_AVRO_INVALID;
        goto done;
    }
    if (avro_value_get_by_name(&block, "sync", &field, NULL) != 0 ||
        avro_value_get_fixed(&field, &p, &size) != 0 || size != SYNC_SIZE)
        goto nomem;
    if (memcmp(p, sync, SYNC_SIZE) != 0) {
        snprintf(errstr, errstr_size, "Avro container: the block's sync marker differs from the "
                                      "header's (corrupt container)");
        st = CES_AVRO_INVALID;
        goto done;
    }
    if (!at_end(reader)) {
        snprintf(errstr, errstr_size, "Avro container: unexpected bytes after its first block (a "
                                      "CES record value holds exactly one record)");
        st = CES_AVRO_INVALID;
        goto done;
    }
    if (avro_value_get_by_name(&block, "data", &field, NULL) != 0 ||
        avro_value_get_bytes(&field, &p, &size) != 0)
        goto nomem;
    st = read_bare(arena, a->event_class, "Avro ChangeEvent in the container", p, size, root,
                   errstr, errstr_size);
    goto done;
nomem:
    st = CES_AVRO_NOMEM;
done:
    if (block.iface != NULL)
        avro_value_decref(&block);
    if (header.iface != NULL)
        avro_value_decref(&header);
    avro_reader_free(reader);
    return st;
}

/*
 * Debian's avro-c is built without THREADSAFE: the message avro_strerror() returns is one static
 * buffer for the whole process. Records are decoded by several threads (decode.threads), each
 * with a reader of its own, but one's failure could then be told with another's words: reading
 * Avro is one thread at a time. (JSON, the default encoding, is not held up by this.)
 */
static pthread_mutex_t avro_lock = PTHREAD_MUTEX_INITIALIZER;

ces_avro_status_t ces_avro_read_envelope(ces_avro_t *a, ces_arena_t *arena, const void *record,
                                         size_t len, const ces_json_t **root, char *errstr,
                                         size_t errstr_size) {
    *root = NULL;
    pthread_mutex_lock(&avro_lock);
    window_begin(len, a->json_limits.max_container);
    ces_avro_status_t st =
        ces_avro_is_container(record, len)
            ? read_container(a, arena, record, len, root, errstr, errstr_size)
            : read_bare(arena, a->event_class, "Avro ChangeEvent", record, len, root, errstr,
                        errstr_size);
    window_end();
    pthread_mutex_unlock(&avro_lock);
    return st;
}

int ces_avro_guarded(size_t input_len, size_t max_items, int (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&avro_lock);
    window_begin(input_len, max_items);
    int rc = fn(arg);
    window_end();
    pthread_mutex_unlock(&avro_lock);
    return rc;
}

ces_avro_status_t ces_avro_read_data(ces_avro_t *a, ces_arena_t *arena, const void *data,
                                     size_t len, const ces_json_t **root, char *errstr,
                                     size_t errstr_size) {
    *root = NULL;
    pthread_mutex_lock(&avro_lock);
    window_begin(len, a->json_limits.max_container);
    ces_avro_status_t st =
        read_bare(arena, a->data_class, "Avro Data record", data, len, root, errstr, errstr_size);
    window_end();
    pthread_mutex_unlock(&avro_lock);
    return st;
}
