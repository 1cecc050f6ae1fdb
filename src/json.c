#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

/* One open container while parsing: its children collect in a scratch vector that is copied into
 * the arena when the container closes (sizes are unknown until then). */
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

static int add_text(ces_json_parser_t *p, ces_json_type_t type, const unsigned char *s, size_t len) {
    ces_json_t v = {.type = type};
    v.text = ces_arena_strndup(p->arena, (const char *)s, len);
    if (v.text == NULL)
        return fail(p, "out of memory");
    v.text_len = len;
    return add_value(p, &v);
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
    return add_text(ctx, CES_JSON_NUMBER, (const unsigned char *)s, len);
}

static int on_string(void *ctx, const unsigned char *s, size_t len) {
    return add_text(ctx, CES_JSON_STRING, s, len);
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
    f->pending_key = ces_arena_strndup(p->arena, (const char *)key, len);
    if (f->pending_key == NULL)
        return fail(p, "out of memory");
    f->pending_key_len = len;
    return 1;
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
