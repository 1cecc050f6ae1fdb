#include "json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

/*
 * The tree is built from yajl's callback parser (its own tree parser leaks on some malformed
 * input). Every limit is checked in the callbacks, so a hostile text is refused as soon as it
 * breaks one. yajl checks the shape of UTF-8 sequences; ces_utf8_valid then refuses what yajl lets
 * through (overlong forms, surrogates, code points past U+10FFFF). Text this decoder produced itself
 * (the data string, the row images) is known valid and skips both checks.
 */

/* One open container: its children collect in a scratch vector that is copied into the arena when
 * the container closes (sizes are unknown until then). */
typedef struct {
    ces_json_type_t type;
    ces_json_member_t *members; /* scratch; reused across parses */
    size_t count;
    size_t capacity;
    const char *pending_key; /* OBJECT: key waiting for its value */
    size_t pending_key_len;
} frame_t;

struct ces_json_parser_s {
    frame_t *frames;
    size_t frame_capacity;
    size_t depth;
    ces_arena_t *arena;
    const ces_json_limits_t *limits;
    ces_json_t root;
    bool have_root;
    char error[200];
};

ces_json_parser_t *ces_json_parser_new(void) { return calloc(1, sizeof(ces_json_parser_t)); }

void ces_json_parser_destroy(ces_json_parser_t *parser) {
    if (parser == NULL)
        return;
    for (size_t i = 0; i < parser->frame_capacity; i++)
        free(parser->frames[i].members);
    free(parser->frames);
    free(parser);
}

static int fail(ces_json_parser_t *p, const char *msg) {
    if (p->error[0] == '\0')
        snprintf(p->error, sizeof(p->error), "%s", msg);
    return 0;
}

/* Attaches a finished value to the open container, or makes it the root. */
static int add_value(ces_json_parser_t *p, const ces_json_t *value) {
    if (p->depth == 0) {
        p->root = *value;
        p->have_root = true;
        return 1;
    }
    frame_t *f = &p->frames[p->depth - 1];
    if (f->count >= p->limits->max_container)
        return fail(p, "too many members in one JSON object or array");
    if (f->count == f->capacity) {
        size_t cap = f->capacity ? f->capacity * 2 : 16;
        ces_json_member_t *m = realloc(f->members, cap * sizeof(*m));
        if (m == NULL)
            return fail(p, "out of memory");
        f->members = m;
        f->capacity = cap;
    }
    ces_json_member_t *m = &f->members[f->count++];
    m->key = f->pending_key;
    m->key_len = f->pending_key_len;
    m->value = *value;
    f->pending_key = NULL;
    return 1;
}

static const char *copy_text(ces_json_parser_t *p, const unsigned char *s, size_t len) {
    if (!p->limits->valid_utf8 && !ces_utf8_valid((const char *)s, len)) {
        fail(p, "malformed JSON: a string is not valid UTF-8");
        return NULL;
    }
    const char *copy = ces_arena_strndup(p->arena, (const char *)s, len);
    if (copy == NULL)
        fail(p, "out of memory");
    return copy;
}

static int on_null(void *ctx) {
    ces_json_t v = {.type = CES_JSON_NULL};
    return add_value(ctx, &v);
}

static int on_boolean(void *ctx, int b) {
    ces_json_t v = {.type = CES_JSON_BOOL, .boolean = b != 0};
    return add_value(ctx, &v);
}

static int on_number(void *ctx, const char *s, size_t len) {
    ces_json_parser_t *p = ctx;
    if (len > CES_JSON_MAX_NUMBER)
        return fail(p, "malformed JSON: a number longer than 100 characters");
    ces_json_t v = {.type = CES_JSON_NUMBER, .text_len = len};
    v.text = ces_arena_strndup(p->arena, s, len);
    if (v.text == NULL)
        return fail(p, "out of memory");
    return add_value(p, &v);
}

static int on_string(void *ctx, const unsigned char *s, size_t len) {
    ces_json_parser_t *p = ctx;
    ces_json_t v = {.type = CES_JSON_STRING, .text_len = len};
    v.text = copy_text(p, s, len);
    return v.text != NULL && add_value(p, &v);
}

static int open_container(ces_json_parser_t *p, ces_json_type_t type) {
    if (p->depth >= p->limits->max_depth)
        return fail(p, "JSON nested too deeply");
    if (p->depth == p->frame_capacity) {
        size_t cap = p->frame_capacity ? p->frame_capacity * 2 : 8;
        frame_t *frames = realloc(p->frames, cap * sizeof(*frames));
        if (frames == NULL)
            return fail(p, "out of memory");
        memset(frames + p->frame_capacity, 0, (cap - p->frame_capacity) * sizeof(*frames));
        p->frames = frames;
        p->frame_capacity = cap;
    }
    frame_t *f = &p->frames[p->depth++];
    f->type = type;
    f->count = 0;
    f->pending_key = NULL;
    return 1;
}

static int close_container(ces_json_parser_t *p) {
    frame_t *f = &p->frames[p->depth - 1];
    ces_json_t v = {.type = f->type, .count = f->count};
    if (f->count > 0) {
        if (f->type == CES_JSON_OBJECT) {
            v.members = ces_arena_alloc(p->arena, f->count * sizeof(ces_json_member_t));
            if (v.members == NULL)
                return fail(p, "out of memory");
            memcpy(v.members, f->members, f->count * sizeof(ces_json_member_t));
        } else {
            v.items = ces_arena_alloc(p->arena, f->count * sizeof(ces_json_t));
            if (v.items == NULL)
                return fail(p, "out of memory");
            for (size_t i = 0; i < f->count; i++)
                v.items[i] = f->members[i].value;
        }
    }
    p->depth--;
    return add_value(p, &v);
}

static int on_start_map(void *ctx) { return open_container(ctx, CES_JSON_OBJECT); }
static int on_start_array(void *ctx) { return open_container(ctx, CES_JSON_ARRAY); }
static int on_end(void *ctx) { return close_container(ctx); }

static int on_map_key(void *ctx, const unsigned char *key, size_t len) {
    ces_json_parser_t *p = ctx;
    frame_t *f = &p->frames[p->depth - 1];
    f->pending_key = copy_text(p, key, len);
    f->pending_key_len = len;
    return f->pending_key != NULL;
}

static const yajl_callbacks callbacks = {
    .yajl_null = on_null,
    .yajl_boolean = on_boolean,
    .yajl_number = on_number,
    .yajl_string = on_string,
    .yajl_start_map = on_start_map,
    .yajl_map_key = on_map_key,
    .yajl_end_map = on_end,
    .yajl_start_array = on_start_array,
    .yajl_end_array = on_end,
};

const ces_json_t *ces_json_parse(ces_json_parser_t *parser, ces_arena_t *arena, const char *text,
                                 size_t len, const ces_json_limits_t *limits, char *errstr,
                                 size_t errstr_size) {
    const ces_json_t *result = NULL;
    parser->depth = 0;
    parser->arena = arena;
    parser->limits = limits;
    parser->have_root = false;
    parser->error[0] = '\0';

    yajl_handle h = yajl_alloc(&callbacks, NULL, parser);
    if (h == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    if (limits->valid_utf8)
        yajl_config(h, yajl_dont_validate_strings, 1);
    yajl_status st = yajl_parse(h, (const unsigned char *)text, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    if (st != yajl_status_ok) {
        if (parser->error[0] != '\0') {
            snprintf(errstr, errstr_size, "%s", parser->error);
        } else {
            unsigned char *msg = yajl_get_error(h, 0, (const unsigned char *)text, len);
            size_t n = msg ? strlen((char *)msg) : 0;
            while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
                n--;
            snprintf(errstr, errstr_size, "malformed JSON: %.*s", (int)n, msg ? (char *)msg : "");
            if (msg)
                yajl_free_error(h, msg);
        }
        goto done;
    }
    if (!parser->have_root) {
        snprintf(errstr, errstr_size, "malformed JSON: empty input");
        goto done;
    }
    ces_json_t *root = ces_arena_alloc(arena, sizeof(*root));
    if (root == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        goto done;
    }
    *root = parser->root;
    result = root;
done:
    yajl_free(h);
    return result;
}

const ces_json_t *ces_json_get(const ces_json_t *object, const char *key) {
    if (object == NULL || object->type != CES_JSON_OBJECT)
        return NULL;
    size_t key_len = strlen(key);
    for (size_t i = 0; i < object->count; i++) {
        const ces_json_member_t *m = &object->members[i];
        if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0)
            return &m->value;
    }
    return NULL;
}

/* Length of the UTF-8 sequence at s (1..4), or 0 when it is not UTF-8 in its shortest form, is a
 * surrogate, goes past U+10FFFF, or runs past avail bytes. */
static size_t utf8_sequence(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (avail - 1 < n)
        return 0;
    for (size_t k = 1; k <= n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n + 1;
}

bool ces_utf8_valid(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        /* ASCII, the common case, eight bytes at a time. */
        while (len - i >= 8) {
            uint64_t word;
            memcpy(&word, s + i, 8);
            if (word & 0x8080808080808080ULL)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t n = utf8_sequence(s + i, len - i);
        if (n == 0)
            return false;
        i += n;
    }
    return true;
}

const char *ces_json_type_name(ces_json_type_t type) {
    switch (type) {
    case CES_JSON_NULL: return "null";
    case CES_JSON_BOOL: return "boolean";
    case CES_JSON_NUMBER: return "number";
    case CES_JSON_STRING: return "string";
    case CES_JSON_ARRAY: return "array";
    case CES_JSON_OBJECT: return "object";
    }
    return "unknown";
}
