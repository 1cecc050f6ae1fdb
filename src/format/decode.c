#include "format/decode.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/avro.h"
#include "format/json.h"
#include "util/array.h"

#define CES_EVENT_TYPE "com.microsoft.SQL.CES.DML.V1"
#define ENVELOPE_IN_PLACE_MAX 16384

struct ces_decoder_s {
    ces_decode_limits_t limits;
    ces_json_limits_t json_limits;
    ces_json_limits_t inner_limits; /* the same, for text this decoder produced (valid UTF-8) */
    ces_json_parser_t *parser;
    ces_avro_t *avro;
    uint32_t *dup_table; /* scratch of check_unique_keys */
    size_t dup_capacity;
};

int ces_decode_format_parse(const char *text, ces_decode_format_t *format) {
    if (strcmp(text, "auto") == 0)
        *format = CES_FORMAT_AUTO;
    else if (strcmp(text, "json") == 0)
        *format = CES_FORMAT_JSON;
    else if (strcmp(text, "avro") == 0)
        *format = CES_FORMAT_AVRO;
    else
        return -1;
    return 0;
}

void ces_decode_limits_default(ces_decode_limits_t *limits) {
    limits->format = CES_FORMAT_AUTO;
    limits->max_record_bytes = 2u << 20;
    limits->max_event_bytes = 64u << 20;
    limits->max_depth = 16;
    limits->max_columns = 4096;
    limits->max_value_bytes = 2u << 20;
}

ces_decoder_t *ces_decoder_new(const ces_decode_limits_t *limits) {
    ces_decoder_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->limits = *limits;
    d->json_limits.max_depth = limits->max_depth;
    /* Containers other than column lists (the envelope has 11 attributes) get some headroom; the
     * column lists are checked against max_columns exactly. */
    d->json_limits.max_container = limits->max_columns + 64;
    d->inner_limits = d->json_limits;
    d->inner_limits.valid_utf8 = true;
    d->parser = ces_json_parser_new();
    char err[256];
    d->avro = ces_avro_new(&d->json_limits, err, sizeof(err));
    if (d->parser == NULL || d->avro == NULL) {
        ces_decoder_destroy(d);
        return NULL;
    }
    return d;
}

const ces_decode_limits_t *ces_decoder_limits(const ces_decoder_t *decoder) {
    return &decoder->limits;
}

void ces_decoder_destroy(ces_decoder_t *decoder) {
    if (decoder == NULL)
        return;
    ces_json_parser_destroy(decoder->parser);
    ces_avro_destroy(decoder->avro);
    free(decoder->dup_table);
    free(decoder);
}

#define REJECT(...)                                                                                \
    do {                                                                                           \
        snprintf(errstr, errstr_size, __VA_ARGS__);                                                \
        return CES_DECODE_REJECTED;                                                                \
    } while (0)

static bool has_nul(const ces_json_t *v) {
    return v->may_hold_nul && memchr(v->text, '\0', v->text_len) != NULL;
}

/* Why an attribute get_string, get_int or get_bool wanted is not there or not of its type. Out of
 * line: the three are inlined at every use (about forty a record), so that ces_json_get sees the
 * literal key, its length is a constant and the names compare without a call to memcmp. */
static __attribute__((noinline, cold)) ces_decode_status_t
attribute_rejected(const ces_json_t *v, const char *where, const char *key, ces_json_type_t wanted,
                   char *errstr, size_t errstr_size) {
    if (v == NULL)
        REJECT("%s: missing required attribute '%s'", where, key);
    if (v->type == wanted && wanted == CES_JSON_STRING)
        REJECT("%s: attribute '%s' contains a NUL byte", where, key);
    if (v->type == wanted && wanted == CES_JSON_NUMBER)
        REJECT("%s: attribute '%s' is not an integer: %.40s", where, key, v->text);
    REJECT("%s: attribute '%s' must be %s, not %s", where, key,
           wanted == CES_JSON_STRING   ? "a string"
           : wanted == CES_JSON_NUMBER ? "an integer"
                                       : "a boolean",
           ces_json_type_name(v->type));
}

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* A string attribute: absent is allowed when !required; any other type is rejected. */
static ALWAYS_INLINE ces_decode_status_t get_string_n(const ces_json_t *obj, const char *where,
                                                      const char *key, bool required,
                                                      const char **out, size_t *out_len,
                                                      char *errstr, size_t errstr_size) {
    const ces_json_t *v = ces_json_get(obj, key);
    *out = NULL;
    *out_len = 0;
    if (v != NULL && v->type == CES_JSON_STRING && !has_nul(v)) {
        *out = v->text;
        *out_len = v->text_len;
        return CES_DECODE_OK;
    }
    if ((v == NULL || v->type == CES_JSON_NULL) && !required)
        return CES_DECODE_OK;
    return attribute_rejected(v, where, key, CES_JSON_STRING, errstr, errstr_size);
}

static ALWAYS_INLINE ces_decode_status_t get_string(const ces_json_t *obj, const char *where,
                                                    const char *key, bool required,
                                                    const char **out, char *errstr,
                                                    size_t errstr_size) {
    size_t len;
    return get_string_n(obj, where, key, required, out, &len, errstr, errstr_size);
}

static ALWAYS_INLINE ces_decode_status_t get_int(const ces_json_t *obj, const char *where,
                                                 const char *key, int64_t *out, char *errstr,
                                                 size_t errstr_size) {
    const ces_json_t *v = ces_json_get(obj, key);
    *out = 0;
    if (v != NULL && v->type == CES_JSON_NUMBER) {
        char *end;
        errno = 0;
        long long n = strtoll(v->text, &end, 10);
        if (errno == 0 && *end == '\0') {
            *out = n;
            return CES_DECODE_OK;
        }
    }
    return attribute_rejected(v, where, key, CES_JSON_NUMBER, errstr, errstr_size);
}

static ALWAYS_INLINE ces_decode_status_t get_bool(const ces_json_t *obj, const char *where,
                                                  const char *key, bool *out, char *errstr,
                                                  size_t errstr_size) {
    const ces_json_t *v = ces_json_get(obj, key);
    *out = false;
    if (v != NULL && v->type == CES_JSON_BOOL) {
        *out = v->boolean;
        return CES_DECODE_OK;
    }
    return attribute_rejected(v, where, key, CES_JSON_BOOL, errstr, errstr_size);
}

static bool same_key(const ces_json_member_t *a, const ces_json_member_t *b) {
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

/* Rejects objects that name one attribute twice: which of the two CES meant is unknowable. Small
 * objects are compared pairwise; a row image of thousands of columns goes through a hash table
 * (open addressing in the decoder's scratch), so the check stays linear. */
static ces_decode_status_t check_unique_keys(ces_decoder_t *d, const ces_json_t *obj,
                                             const char *where, char *errstr, size_t errstr_size) {
    const ces_json_member_t *m = obj->members;
    if (obj->count <= 16) {
        for (size_t i = 1; i < obj->count; i++) {
            for (size_t j = 0; j < i; j++) {
                if (same_key(&m[i], &m[j]))
                    REJECT("%s: attribute '%.60s' appears twice", where, m[i].key);
            }
        }
        return CES_DECODE_OK;
    }
    size_t cap = 64;
    while (cap < obj->count * 2)
        cap *= 2;
    uint32_t *grown = CES_ARRAY_RESERVE(d->dup_table, d->dup_capacity, cap, 64);
    if (grown == NULL)
        return CES_DECODE_NOMEM;
    d->dup_table = grown;
    uint32_t *table = d->dup_table; /* member index + 1; 0 = empty */
    memset(table, 0, cap * sizeof(*table));
    for (size_t i = 0; i < obj->count; i++) {
        uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
        for (size_t k = 0; k < m[i].key_len; k++)
            h = (h ^ (unsigned char)m[i].key[k]) * UINT64_C(1099511628211);
        size_t slot = (size_t)h & (cap - 1);
        while (table[slot] != 0) {
            if (same_key(&m[i], &m[table[slot] - 1]))
                REJECT("%s: attribute '%.60s' appears twice", where, m[i].key);
            slot = (slot + 1) & (cap - 1);
        }
        table[slot] = (uint32_t)(i + 1);
    }
    return CES_DECODE_OK;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        ces_decode_status_t try_status_ = (expr);                                                  \
        if (try_status_ != CES_DECODE_OK)                                                          \
            return try_status_;                                                                    \
    } while (0)

/* A JSON CloudEvent starts with '{', possibly after blanks; an Avro ChangeEvent starts with the
 * length of its specversion string (0x06 for "1.0") and a container with "Obj" 0x01. */
static bool looks_like_json(const unsigned char *bytes, size_t len) {
    size_t i = 0;
    while (i < len && (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\r' || bytes[i] == '\t'))
        i++;
    return i < len && bytes[i] == '{';
}

static ces_decode_status_t avro_status(ces_avro_status_t st) {
    return st == CES_AVRO_OK ? CES_DECODE_OK
                             : st == CES_AVRO_NOMEM ? CES_DECODE_NOMEM : CES_DECODE_REJECTED;
}

/* Parses a JSON CloudEvent: a small record in place from the arena's copy, since its twenty-odd
 * names and values then need no copies of their own, which cost more than the one copy; a large
 * record (its size is its data) from the caller's bytes, since a copy would save nothing and only
 * double the decoding arena's memory. */
static ces_decode_status_t parse_json_envelope(ces_decoder_t *decoder, ces_arena_t *arena,
                                               const void *record, size_t len,
                                               const ces_json_t **root, char *errstr,
                                               size_t errstr_size) {
    char jerr[256];
    if (len <= ENVELOPE_IN_PLACE_MAX) {
        char *text = ces_arena_alloc(arena, len);
        if (text == NULL)
            return CES_DECODE_NOMEM;
        memcpy(text, record, len);
        *root = ces_json_parse_in_place(decoder->parser, arena, text, len, &decoder->json_limits,
                                        jerr, sizeof(jerr));
    } else {
        *root = ces_json_parse(decoder->parser, arena, record, len, &decoder->json_limits, jerr,
                               sizeof(jerr));
    }
    if (*root == NULL) {
        if (strcmp(jerr, "out of memory") == 0)
            return CES_DECODE_NOMEM;
        REJECT("envelope: %s", jerr);
    }
    if ((*root)->type != CES_JSON_OBJECT)
        REJECT("envelope: a CloudEvent must be a JSON object, not %s",
               ces_json_type_name((*root)->type));
    return check_unique_keys(decoder, *root, "envelope", errstr, errstr_size);
}

/* The envelope's tree, from JSON or Avro as kafka.format and the record's first bytes say. */
static ces_decode_status_t read_envelope(ces_decoder_t *decoder, ces_arena_t *arena,
                                         const void *record, size_t len, ces_envelope_t *envelope,
                                         const ces_json_t **root, char *errstr,
                                         size_t errstr_size) {
    if (len == 0)
        REJECT("empty record");
    if (len > decoder->limits.max_record_bytes)
        REJECT("record of %zu bytes exceeds the limit of %zu bytes (decode.max_record_bytes)", len,
               decoder->limits.max_record_bytes);
    bool json = looks_like_json(record, len);
    if (decoder->limits.format == CES_FORMAT_JSON && !json)
        REJECT("record does not start with '{': not a JSON CloudEvent (kafka.format is \"json\")");
    if (decoder->limits.format != CES_FORMAT_AVRO && json)
        return parse_json_envelope(decoder, arena, record, len, root, errstr, errstr_size);
    char aerr[400];
    ces_avro_status_t st =
        ces_avro_read_envelope(decoder->avro, arena, record, len, root, aerr, sizeof(aerr));
    if (st == CES_AVRO_INVALID) {
        if (decoder->limits.format == CES_FORMAT_AUTO && !ces_avro_is_container(record, len))
            REJECT("record is not JSON (no '{'), and as Avro: %s", aerr);
        REJECT("%s", aerr);
    }
    if (st != CES_AVRO_OK)
        return avro_status(st);
    envelope->avro = true;
    return CES_DECODE_OK;
}

/* Which segment of its event the record is: segmentindex and finalsegment, or the legacy
 * splitindex and splittotalcnt. */
static ces_decode_status_t decode_segment(const ces_json_t *root, ces_envelope_t *envelope,
                                          char *errstr, size_t errstr_size) {
    if (ces_json_get(root, "segmentindex") != NULL || ces_json_get(root, "finalsegment") != NULL) {
        TRY(get_int(root, "envelope", "segmentindex", &envelope->index, errstr, errstr_size));
        TRY(get_bool(root, "envelope", "finalsegment", &envelope->final_segment, errstr,
                     errstr_size));
        if (envelope->index < 0)
            REJECT("envelope: negative segmentindex %lld", (long long)envelope->index);
        envelope->split_total = -1;
        return CES_DECODE_OK;
    }
    if (ces_json_get(root, "splitindex") == NULL && ces_json_get(root, "splittotalcnt") == NULL)
        REJECT("envelope: missing required attribute 'segmentindex' (or legacy 'splitindex')");
    envelope->legacy = true;
    TRY(get_int(root, "envelope", "splitindex", &envelope->index, errstr, errstr_size));
    TRY(get_int(root, "envelope", "splittotalcnt", &envelope->split_total, errstr, errstr_size));
    if (envelope->index < 0 || envelope->split_total < 0 ||
        (envelope->split_total > 0 && envelope->index >= envelope->split_total) ||
        (envelope->split_total == 0 && envelope->index != 0))
        REJECT("envelope: inconsistent splitindex %lld / splittotalcnt %lld",
               (long long)envelope->index, (long long)envelope->split_total);
    envelope->final_segment =
        envelope->split_total == 0 || envelope->index == envelope->split_total - 1;
    return CES_DECODE_OK;
}

ces_decode_status_t ces_decode_envelope(ces_decoder_t *decoder, ces_arena_t *arena,
                                        const void *record, size_t len, ces_envelope_t *envelope,
                                        char *errstr, size_t errstr_size) {
    memset(envelope, 0, sizeof(*envelope));
    const ces_json_t *root;
    TRY(read_envelope(decoder, arena, record, len, envelope, &root, errstr, errstr_size));

    const char *specversion, *type, *operation;
    TRY(get_string(root, "envelope", "specversion", true, &specversion, errstr, errstr_size));
    if (strcmp(specversion, "1.0") != 0)
        REJECT("envelope: unsupported CloudEvents specversion '%.40s'", specversion);
    TRY(get_string(root, "envelope", "type", true, &type, errstr, errstr_size));
    if (strcmp(type, CES_EVENT_TYPE) != 0)
        REJECT("unsupported event type '%.100s' (expected " CES_EVENT_TYPE ")", type);
    TRY(get_string(root, "envelope", "id", true, &envelope->id, errstr, errstr_size));
    TRY(get_string(root, "envelope", "logicalid", true, &envelope->logicalid, errstr, errstr_size));
    TRY(get_string(root, "envelope", "time", false, &envelope->time, errstr, errstr_size));
    TRY(get_string(root, "envelope", "operation", true, &operation, errstr, errstr_size));
    if (strcmp(operation, "INS") == 0)
        envelope->op = CES_OP_INSERT;
    else if (strcmp(operation, "UPD") == 0)
        envelope->op = CES_OP_UPDATE;
    else if (strcmp(operation, "DEL") == 0)
        envelope->op = CES_OP_DELETE;
    else
        REJECT("envelope: unknown operation '%.40s' (expected INS, UPD or DEL)", operation);
    TRY(decode_segment(root, envelope, errstr, errstr_size));

    const ces_json_t *data = ces_json_get(root, "data");
    if (data == NULL)
        REJECT("envelope: missing required attribute 'data'");
    if (data->type == CES_JSON_STRING) {
        envelope->data = data->text;
        envelope->data_len = data->text_len;
    } else if (data->type == CES_JSON_OBJECT) {
        envelope->data_tree = data;
    } else {
        REJECT("envelope: attribute 'data' must be a string, not %s", ces_json_type_name(data->type));
    }
    return CES_DECODE_OK;
}

static ces_decode_status_t check_name(const char *where, const char *what, const char *name,
                                      size_t len, char *errstr, size_t errstr_size) {
    if (len == 0)
        REJECT("%s: empty %s", where, what);
    if (len > CES_DECODE_MAX_NAME_BYTES)
        REJECT("%s: %s longer than %d bytes", where, what, CES_DECODE_MAX_NAME_BYTES);
    if (memchr(name, '\0', len) != NULL)
        REJECT("%s: %s contains a NUL byte", where, what);
    return CES_DECODE_OK;
}

/* A column value: strings as they are, JSON null as SQL NULL, numbers and booleans as their text. */
static ces_decode_status_t take_value(ces_decoder_t *decoder, const char *where, const char *column,
                                      const ces_json_t *v, ces_field_t *field, char *errstr,
                                      size_t errstr_size) {
    switch (v->type) {
    case CES_JSON_NULL:
        field->is_null = true;
        field->value = NULL;
        field->value_len = 0;
        return CES_DECODE_OK;
    case CES_JSON_BOOL:
        field->value = v->boolean ? "true" : "false";
        field->value_len = strlen(field->value);
        return CES_DECODE_OK;
    case CES_JSON_STRING:
        if (has_nul(v))
            REJECT("%s: value of column '%.128s' contains a NUL byte", where, column);
        /* fall through */
    case CES_JSON_NUMBER:
        if (v->text_len > decoder->limits.max_value_bytes)
            REJECT("%s: value of column '%.128s' is %zu bytes, over the limit of %zu "
                   "(decode.max_value_bytes)",
                   where, column, v->text_len, decoder->limits.max_value_bytes);
        field->value = v->text;
        field->value_len = v->text_len;
        return CES_DECODE_OK;
    default:
        REJECT("%s: value of column '%.128s' is a JSON %s; expected a string, number, boolean or "
               "null",
               where, column, ces_json_type_name(v->type));
    }
}

/* old/current: a JSON object serialized into a string (or, tolerated, inline). where names it
 * in messages: "eventrow." and then its member name. */
static ces_decode_status_t decode_image(ces_decoder_t *decoder, ces_arena_t *arena,
                                        const ces_json_t *row, const char *where, bool in_place,
                                        ces_field_t **fields, size_t *count, char *errstr,
                                        size_t errstr_size) {
    const char *name = where + strlen("eventrow.");
    *fields = NULL;
    *count = 0;
    const ces_json_t *v = ces_json_get(row, name);
    if (v == NULL || v->type == CES_JSON_NULL)
        return CES_DECODE_OK;
    const ces_json_t *obj = v;
    /* An insert's old image is "{}": an empty object, without a parser of its own. */
    if (v->type == CES_JSON_STRING && v->text_len == 2 && memcmp(v->text, "{}", 2) == 0)
        return CES_DECODE_OK;
    if (v->type == CES_JSON_STRING) {
        char jerr[256];
        /* Given up with the data, the image's text (the tree's, in arena memory, and read only
         * here) is parsed in place: its names and values are not copied again. */
        obj = in_place ? ces_json_parse_in_place(decoder->parser, arena, (char *)v->text,
                                                 v->text_len, &decoder->inner_limits, jerr,
                                                 sizeof(jerr))
                       : ces_json_parse(decoder->parser, arena, v->text, v->text_len,
                                        &decoder->inner_limits, jerr, sizeof(jerr));
        if (obj == NULL) {
            if (strcmp(jerr, "out of memory") == 0)
                return CES_DECODE_NOMEM;
            REJECT("%s: %s", where, jerr);
        }
    }
    if (obj->type != CES_JSON_OBJECT)
        REJECT("%s must hold a JSON object, not %s", where, ces_json_type_name(obj->type));
    TRY(check_unique_keys(decoder, obj, where, errstr, errstr_size));
    if (obj->count == 0)
        return CES_DECODE_OK;
    if (obj->count > decoder->limits.max_columns)
        REJECT("%s has %zu columns, over the limit of %zu (decode.max_columns)", where, obj->count,
               decoder->limits.max_columns);
    ces_field_t *out = ces_arena_alloc(arena, obj->count * sizeof(*out));
    if (out == NULL)
        return CES_DECODE_NOMEM;
    for (size_t i = 0; i < obj->count; i++) {
        const ces_json_member_t *m = &obj->members[i];
        TRY(check_name(where, "column name", m->key, m->key_len, errstr, errstr_size));
        out[i].name = m->key;
        out[i].name_len = (uint32_t)m->key_len; /* at most CES_DECODE_MAX_NAME_BYTES: checked */
        out[i].is_null = false;
        TRY(take_value(decoder, where, m->key, &m->value, &out[i], errstr, errstr_size));
    }
    *fields = out;
    *count = obj->count;
    return CES_DECODE_OK;
}

static ces_decode_status_t decode_cols(ces_decoder_t *decoder, ces_arena_t *arena,
                                       const ces_json_t *source, ces_event_t *event, char *errstr,
                                       size_t errstr_size) {
    const ces_json_t *cols = ces_json_get(source, "cols");
    if (cols == NULL || cols->type == CES_JSON_NULL)
        return CES_DECODE_OK;
    if (cols->type != CES_JSON_ARRAY)
        REJECT("eventsource.cols must be an array, not %s", ces_json_type_name(cols->type));
    if (cols->count == 0)
        return CES_DECODE_OK;
    if (cols->count > decoder->limits.max_columns)
        REJECT("eventsource.cols has %zu columns, over the limit of %zu (decode.max_columns)",
               cols->count, decoder->limits.max_columns);
    event->cols = ces_arena_alloc(arena, cols->count * sizeof(ces_column_t));
    if (event->cols == NULL)
        return CES_DECODE_NOMEM;
    for (size_t i = 0; i < cols->count; i++) {
        const ces_json_t *c = &cols->items[i];
        if (c->type != CES_JSON_OBJECT)
            REJECT("eventsource.cols[%zu] must be an object", i);
        ces_column_t *col = &event->cols[i];
        size_t name_len, type_len;
        TRY(get_string_n(c, "eventsource.cols", "name", true, &col->name, &name_len, errstr,
                         errstr_size));
        TRY(check_name("eventsource.cols", "column name", col->name, name_len, errstr,
                       errstr_size));
        TRY(get_string_n(c, "eventsource.cols", "type", true, &col->type, &type_len, errstr,
                         errstr_size));
        /* SQL Server's longest type names are a schema-qualified user type: 2 x 128 characters. */
        if (type_len > CES_DECODE_MAX_NAME_BYTES)
            REJECT("eventsource.cols: type of column '%.128s' longer than %d bytes", col->name,
                   CES_DECODE_MAX_NAME_BYTES);
        col->name_len = (uint32_t)name_len;
        col->type_len = (uint32_t)type_len;
    }
    event->ncols = cols->count;
    return CES_DECODE_OK;
}

static ces_decode_status_t decode_pkkey(ces_decoder_t *decoder, ces_arena_t *arena,
                                        const ces_json_t *source, ces_event_t *event, char *errstr,
                                        size_t errstr_size) {
    const ces_json_t *pk = ces_json_get(source, "pkkey");
    if (pk == NULL || pk->type == CES_JSON_NULL)
        return CES_DECODE_OK;
    if (pk->type != CES_JSON_ARRAY)
        REJECT("eventsource.pkkey must be an array, not %s", ces_json_type_name(pk->type));
    if (pk->count == 0)
        return CES_DECODE_OK;
    if (pk->count > decoder->limits.max_columns)
        REJECT("eventsource.pkkey has %zu columns, over the limit of %zu (decode.max_columns)",
               pk->count, decoder->limits.max_columns);
    event->pkkey = ces_arena_alloc(arena, pk->count * sizeof(ces_field_t));
    if (event->pkkey == NULL)
        return CES_DECODE_NOMEM;
    for (size_t i = 0; i < pk->count; i++) {
        const ces_json_t *k = &pk->items[i];
        if (k->type != CES_JSON_OBJECT)
            REJECT("eventsource.pkkey[%zu] must be an object", i);
        ces_field_t *f = &event->pkkey[i];
        size_t name_len;
        TRY(get_string_n(k, "eventsource.pkkey", "columnname", true, &f->name, &name_len, errstr,
                         errstr_size));
        TRY(check_name("eventsource.pkkey", "column name", f->name, name_len, errstr,
                       errstr_size));
        f->name_len = (uint32_t)name_len;
        const ces_json_t *v = ces_json_get(k, "value");
        if (v == NULL)
            REJECT("eventsource.pkkey: missing required attribute 'value'");
        f->is_null = false;
        TRY(take_value(decoder, "eventsource.pkkey", f->name, v, f, errstr, errstr_size));
    }
    event->npkkey = pk->count;
    return CES_DECODE_OK;
}

/* The logicalid "<uuid>:<commitlsn, 20 hex digits>:<sequence, 20 decimal digits>": the only source
 * of the order for early preview events, which have no transaction object. */
static int parse_logicalid(const char *logicalid, ces_version_t *position) {
    const char *seq = strrchr(logicalid, ':');
    if (seq == NULL || seq == logicalid)
        return -1;
    const char *lsn = seq - 1;
    while (lsn > logicalid && *lsn != ':')
        lsn--;
    if (*lsn != ':')
        return -1;
    lsn++;
    if (ces_lsn_parse_compact(lsn, (size_t)(seq - lsn), &position->commit_lsn) != 0)
        return -1;
    seq++;
    if (*seq == '\0' || strlen(seq) > 20)
        return -1;
    uint64_t n = 0;
    for (const char *p = seq; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        uint64_t next = n * 10 + (uint64_t)(*p - '0');
        if (next / 10 != n)
            return -1;
        n = next;
    }
    position->sequence = n;
    return 0;
}

static ces_decode_status_t decode_position(const ces_json_t *source, const ces_envelope_t *envelope,
                                           ces_event_t *event, char *errstr, size_t errstr_size) {
    const ces_json_t *txn = ces_json_get(source, "transaction");
    if (txn == NULL || txn->type == CES_JSON_NULL) {
        if (parse_logicalid(envelope->logicalid, &event->version) != 0)
            REJECT("no transaction object and no commit LSN in logicalid '%.100s'",
                   envelope->logicalid);
        return CES_DECODE_OK;
    }
    if (txn->type != CES_JSON_OBJECT)
        REJECT("eventsource.transaction must be an object, not %s", ces_json_type_name(txn->type));
    const char *commitlsn;
    TRY(get_string(txn, "eventsource.transaction", "commitlsn", true, &commitlsn, errstr,
                   errstr_size));
    if (ces_lsn_parse(commitlsn, strlen(commitlsn), &event->version.commit_lsn) != 0)
        REJECT("eventsource.transaction: unparsable commitlsn '%.40s' (expected VLF:block:slot in "
               "hex)",
               commitlsn);
    int64_t seq;
    TRY(get_int(txn, "eventsource.transaction", "sequencenumber", &seq, errstr, errstr_size));
    if (seq < 0)
        REJECT("eventsource.transaction: negative sequencenumber %lld", (long long)seq);
    event->version.sequence = (uint64_t)seq;
    return CES_DECODE_OK;
}

static ces_decode_status_t decode_event(ces_decoder_t *decoder, ces_arena_t *arena,
                                        const ces_envelope_t *envelope, const char *data,
                                        size_t len, bool in_place, ces_event_t *event,
                                        char *errstr, size_t errstr_size);

ces_decode_status_t ces_decode_event(ces_decoder_t *decoder, ces_arena_t *arena,
                                     const ces_envelope_t *envelope, const char *data, size_t len,
                                     ces_event_t *event, char *errstr, size_t errstr_size) {
    return decode_event(decoder, arena, envelope, data, len, false, event, errstr, errstr_size);
}

ces_decode_status_t ces_decode_event_in_place(ces_decoder_t *decoder, ces_arena_t *arena,
                                              const ces_envelope_t *envelope, char *data,
                                              size_t len, ces_event_t *event, char *errstr,
                                              size_t errstr_size) {
    return decode_event(decoder, arena, envelope, data, len, true, event, errstr, errstr_size);
}

static ces_decode_status_t decode_event(ces_decoder_t *decoder, ces_arena_t *arena,
                                        const ces_envelope_t *envelope, const char *data,
                                        size_t len, bool in_place, ces_event_t *event,
                                        char *errstr, size_t errstr_size) {
    memset(event, 0, sizeof(*event));
    const ces_json_t *root = envelope->data_tree;
    if (data != NULL) {
        if (len > decoder->limits.max_event_bytes)
            REJECT("event data of %zu bytes exceeds the limit of %zu bytes "
                   "(decode.max_event_bytes)",
                   len, decoder->limits.max_event_bytes);
        if (envelope->avro) {
            char aerr[400];
            ces_avro_status_t st =
                ces_avro_read_data(decoder->avro, arena, data, len, &root, aerr, sizeof(aerr));
            if (st == CES_AVRO_INVALID)
                REJECT("data: %s", aerr);
            if (st != CES_AVRO_OK)
                return avro_status(st);
        } else {
            char jerr[256];
            /* The envelopes' data strings were checked when they were read; joined, they are
             * still valid UTF-8. */
            root = in_place ? ces_json_parse_in_place(decoder->parser, arena, (char *)data, len,
                                                      &decoder->inner_limits, jerr, sizeof(jerr))
                            : ces_json_parse(decoder->parser, arena, data, len,
                                             &decoder->inner_limits, jerr, sizeof(jerr));
            if (root == NULL) {
                if (strcmp(jerr, "out of memory") == 0)
                    return CES_DECODE_NOMEM;
                REJECT("data: %s", jerr);
            }
        }
    }
    if (root == NULL || root->type != CES_JSON_OBJECT)
        REJECT("data must hold a JSON object");
    TRY(check_unique_keys(decoder, root, "data", errstr, errstr_size));
    const ces_json_t *source = ces_json_get(root, "eventsource");
    if (source == NULL || source->type != CES_JSON_OBJECT)
        REJECT("data: missing required object 'eventsource'");
    TRY(check_unique_keys(decoder, source, "eventsource", errstr, errstr_size));
    size_t db_len, schema_len, table_len;
    TRY(get_string_n(source, "eventsource", "db", true, &event->db, &db_len, errstr,
                     errstr_size));
    TRY(get_string_n(source, "eventsource", "schema", true, &event->schema, &schema_len, errstr,
                     errstr_size));
    TRY(get_string_n(source, "eventsource", "tbl", true, &event->table, &table_len, errstr,
                     errstr_size));
    TRY(check_name("eventsource", "db", event->db, db_len, errstr, errstr_size));
    TRY(check_name("eventsource", "schema", event->schema, schema_len, errstr, errstr_size));
    TRY(check_name("eventsource", "tbl", event->table, table_len, errstr, errstr_size));
    TRY(decode_cols(decoder, arena, source, event, errstr, errstr_size));
    TRY(decode_pkkey(decoder, arena, source, event, errstr, errstr_size));
    TRY(decode_position(source, envelope, event, errstr, errstr_size));

    const ces_json_t *row = ces_json_get(root, "eventrow");
    if (row == NULL)
        row = ces_json_get(root, "eventdata"); /* alias used by one page of the docs */
    if (row == NULL || row->type != CES_JSON_OBJECT)
        REJECT("data: missing required object 'eventrow'");
    TRY(check_unique_keys(decoder, row, "eventrow", errstr, errstr_size));
    TRY(decode_image(decoder, arena, row, "eventrow.old", in_place, &event->old, &event->nold,
                     errstr, errstr_size));
    TRY(decode_image(decoder, arena, row, "eventrow.current", in_place, &event->current,
                     &event->ncurrent, errstr, errstr_size));

    event->op = envelope->op;
    event->id = envelope->id;
    event->logicalid = envelope->logicalid;
    event->time = envelope->time;
    switch (event->op) {
    case CES_OP_INSERT:
    case CES_OP_UPDATE:
        if (event->ncurrent == 0)
            REJECT("%s event with an empty current row image", ces_op_name(event->op));
        break;
    case CES_OP_DELETE:
        if (event->npkkey == 0 && event->nold == 0)
            REJECT("DEL event with neither pkkey nor old row image");
        break;
    }
    return CES_DECODE_OK;
}

ces_decode_status_t ces_decode_dump_record(ces_decoder_t *decoder, const void *record, size_t len,
                                           FILE *out) {
    ces_arena_t *arena = ces_arena_new();
    if (arena == NULL)
        return CES_DECODE_NOMEM;
    char reason[512];
    ces_envelope_t env;
    ces_event_t event;
    ces_decode_status_t st =
        ces_decode_envelope(decoder, arena, record, len, &env, reason, sizeof(reason));
    if (st == CES_DECODE_OK) {
        fprintf(out, "segment: %s index %lld%s\n",
                env.avro ? "avro" : env.legacy ? "legacy" : "current",
                (long long)env.index, env.final_segment ? " final" : "");
        st = ces_decode_event_in_place(decoder, arena, &env, (char *)env.data, env.data_len,
                                       &event, reason, sizeof(reason));
    }
    if (st == CES_DECODE_OK)
        ces_event_dump(&event, out);
    else if (st == CES_DECODE_REJECTED)
        fprintf(out, "rejected: %s\n", reason);
    else
        fprintf(out, "out of memory\n");
    ces_arena_destroy(arena);
    return st;
}
