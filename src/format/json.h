/*
 * json: a bounded JSON reader that builds a small tree in an arena.
 *
 * Built on yajl's callback parser (its tree parser leaks on some malformed input). Limits are
 * checked while parsing, so hostile input cannot make the tree deeper or larger than allowed. The
 * text and every decoded string must be valid UTF-8 (ces_utf8_valid); strings keep their length
 * because JSON may escape NUL (\u0000).
 */
#ifndef CES_JSON_H
#define CES_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "util/arena.h"
#include "format/utf8.h"

typedef enum {
    CES_JSON_NULL,
    CES_JSON_BOOL,
    CES_JSON_NUMBER, /* kept as its text */
    CES_JSON_STRING,
    CES_JSON_ARRAY,
    CES_JSON_OBJECT,
} ces_json_type_t;

typedef struct ces_json_member_s ces_json_member_t;
typedef struct ces_json_s ces_json_t;

/* 24 bytes: a parse copies every node twice (into its container's scratch, then into the arena),
 * so the fields that no type uses together share their place. Read a field only for its type. */
struct ces_json_s {
    ces_json_type_t type;
    bool boolean;
    /* STRING: false when the text cannot hold a NUL (it had no escapes, and JSON allows no raw
     * control characters), so callers that refuse NULs need not look for one. */
    bool may_hold_nul;
    union {
        const char *text; /* STRING and NUMBER: NUL-terminated; may contain NULs, see text_len */
        ces_json_t *items;          /* ARRAY */
        ces_json_member_t *members; /* OBJECT, in input order */
    };
    union {
        size_t text_len;
        size_t count; /* ARRAY items or OBJECT members */
    };
};

struct ces_json_member_s {
    const char *key;
    size_t key_len;
    ces_json_t value;
};

/* Longer numbers are rejected: no SQL Server value needs more (decimal(38,s) has 38 digits, a float
 * 17 significant digits and an exponent), and a number is kept as its text. */
#define CES_JSON_MAX_NUMBER 100

typedef struct {
    size_t max_depth;     /* containers nested deeper than this are rejected */
    size_t max_container; /* members of one object / items of one array */
    bool valid_utf8;      /* the text is known to be valid UTF-8 (a string that this reader or the
                           * Avro reader produced): its strings are not checked again */
} ces_json_limits_t;

typedef struct ces_json_parser_s ces_json_parser_t;

/* A parser keeps scratch buffers between parses. Owned by the caller; NULL when out of memory. */
ces_json_parser_t *ces_json_parser_new(void);
void ces_json_parser_destroy(ces_json_parser_t *parser);

/*
 * Parses text[0..len) into a tree whose every node and string is allocated from arena (owned by
 * the arena). Returns the root, or NULL with a sentence in errstr (malformed JSON, limits).
 */
const ces_json_t *ces_json_parse(ces_json_parser_t *parser, ces_arena_t *arena, const char *text,
                                 size_t len, const ces_json_limits_t *limits, char *errstr,
                                 size_t errstr_size);

/*
 * The same, for a text the caller gives up: strings that need no unescaping are not copied but
 * ended in place, their closing quote overwritten with NUL, and the tree points into text (which
 * must then outlive it, and is no longer the JSON it was). A record's JSON layers are parsed once
 * each, so their names and values need not be copied out of them.
 */
const ces_json_t *ces_json_parse_in_place(ces_json_parser_t *parser, ces_arena_t *arena,
                                          char *text, size_t len, const ces_json_limits_t *limits,
                                          char *errstr, size_t errstr_size);

/* Whether text[0..len) is one JSON value, as yajl reads it (valid UTF-8 in its strings), building
 * nothing: what a column made jsonb must hold. */
bool ces_json_valid(const char *text, size_t len);

/* Returns the first member named key (key_len bytes) of an OBJECT node, or NULL. Always inline,
 * like ces_json_get, so that a literal key's length is known when compiling and the comparison of
 * names is a few instructions instead of a call: a CES record takes about forty lookups (plain
 * inline was not enough in the Release build, which called memcmp for each). */
static inline __attribute__((always_inline)) const ces_json_t *
ces_json_get_n(const ces_json_t *object, const char *key, size_t key_len) {
    if (object == NULL || object->type != CES_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < object->count; i++) {
        const ces_json_member_t *m = &object->members[i];
        if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0)
            return &m->value;
    }
    return NULL;
}

/* The same for a NUL-terminated key. */
static inline __attribute__((always_inline)) const ces_json_t *
ces_json_get(const ces_json_t *object, const char *key) {
    return ces_json_get_n(object, key, strlen(key));
}

const char *ces_json_type_name(ces_json_type_t type);

#endif
