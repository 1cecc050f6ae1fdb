#include "format/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

#include "util/array.h"

/*
 * The tree is built from yajl's callback parser (its own tree parser leaks on some malformed
 * input). Every limit is checked in the callbacks, so a hostile text is refused as soon as it
 * breaks one.
 *
 * UTF-8 is checked once over the whole untrusted text (ces_utf8_valid: shortest forms, no
 * surrogates, at most U+10FFFF), which is faster than yajl's check of each string and stricter;
 * yajl is then told not to check. After that, the only invalid UTF-8 a decoded string can hold is
 * a lone surrogate that a \u escape produced (yajl encodes it as is): such sequences start with
 * byte 0xED, so only strings holding that byte are checked again, at every layer. Text this
 * decoder produced itself (the data string, the row images) is known valid and skips the check of
 * the whole text.
 *
 * Each parse needs a yajl handle, and yajl allocates it and its buffers afresh (it has no reset).
 * Those allocations come from a small pool kept by the parser, which makes a handle cost almost
 * nothing: a CES record takes three parses, and malloc must not be part of each.
 */

/* The pool: small yajl allocations are carved from one reused block and freed all at once after
 * the parse; larger ones (a long string's decode buffer) go to malloc. Each allocation carries a
 * header with its size, so realloc knows what to copy. */
#define POOL_BLOCK 16384
#define POOL_SMALL 4096

typedef struct {
    size_t size;  /* usable bytes */
    size_t heap;  /* 1: from malloc, 0: from the block */
} pool_header_t;

typedef struct {
    unsigned char *block;
    size_t used;
    pool_header_t *last; /* the block's last allocation: it may grow in place */
} pool_t;

#define POOL_ALIGN(n) (((n) + 15) & ~(size_t)15)
#define POOL_HEADER POOL_ALIGN(sizeof(pool_header_t))

static void *pool_malloc(void *ctx, size_t size) {
    pool_t *pool = ctx;
    size_t need = POOL_HEADER + POOL_ALIGN(size);
    pool_header_t *h;
    if (size <= POOL_SMALL && pool->block != NULL && pool->used + need <= POOL_BLOCK) {
        h = (pool_header_t *)(pool->block + pool->used);
        pool->used += need;
        h->heap = 0;
        pool->last = h;
    } else {
        if (size > SIZE_MAX - POOL_HEADER)
            return NULL;
        h = malloc(POOL_HEADER + size);
        if (h == NULL)
            return NULL;
        h->heap = 1;
    }
    h->size = size;
    return (unsigned char *)h + POOL_HEADER;
}

static void pool_free(void *ctx, void *ptr) {
    (void)ctx;
    if (ptr == NULL)
        return;
    pool_header_t *h = (pool_header_t *)((unsigned char *)ptr - POOL_HEADER);
    if (h->heap)
        free(h);
    /* Block memory is released when the parse ends. */
}

static void *pool_realloc(void *ctx, void *ptr, size_t size) {
    pool_t *pool = ctx;
    if (ptr == NULL)
        return pool_malloc(ctx, size);
    pool_header_t *h = (pool_header_t *)((unsigned char *)ptr - POOL_HEADER);
    if (h->heap) {
        if (size > SIZE_MAX - POOL_HEADER)
            return NULL;
        pool_header_t *grown = realloc(h, POOL_HEADER + size);
        if (grown == NULL)
            return NULL;
        grown->size = size;
        return (unsigned char *)grown + POOL_HEADER;
    }
    if (size <= h->size)
        return ptr;
    if (h == pool->last && size <= POOL_SMALL) {
        size_t start = (size_t)((unsigned char *)h - pool->block);
        size_t need = POOL_HEADER + POOL_ALIGN(size);
        if (start + need <= POOL_BLOCK) {
            pool->used = start + need;
            h->size = size;
            return ptr;
        }
    }
    void *moved = pool_malloc(ctx, size);
    if (moved != NULL)
        memcpy(moved, ptr, h->size);
    return moved;
}

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
    /* ces_json_parse_in_place: the text, whose unescaped strings end where their quotes were */
    uintptr_t text_begin, text_end;
    pool_t pool;
    yajl_alloc_funcs alloc_funcs;
};

ces_json_parser_t *ces_json_parser_new(void) {
    ces_json_parser_t *p = calloc(1, sizeof(ces_json_parser_t));
    if (p == NULL)
        return NULL;
    p->pool.block = malloc(POOL_BLOCK);
    if (p->pool.block == NULL) {
        free(p);
        return NULL;
    }
    p->alloc_funcs.malloc = pool_malloc;
    p->alloc_funcs.realloc = pool_realloc;
    p->alloc_funcs.free = pool_free;
    p->alloc_funcs.ctx = &p->pool;
    return p;
}

void ces_json_parser_destroy(ces_json_parser_t *parser) {
    if (parser == NULL)
        return;
    for (size_t i = 0; i < parser->frame_capacity; i++)
        free(parser->frames[i].members);
    free(parser->frames);
    free(parser->pool.block);
    free(parser);
}

static int fail(ces_json_parser_t *p, const char *msg) {
    if (p->error[0] == '\0')
        snprintf(p->error, sizeof(p->error), "%s", msg);
    return 0;
}

/* The slow half of next_value: the open container's scratch is full, or at its limit. */
static __attribute__((noinline)) ces_json_t *grow_container(ces_json_parser_t *p, frame_t *f) {
    if (f->count >= p->limits->max_container) {
        fail(p, "too many members in one JSON object or array");
        return NULL;
    }
    ces_json_member_t *m = CES_ARRAY_RESERVE(f->members, f->capacity, f->count + 1, 16);
    if (m == NULL) {
        fail(p, "out of memory");
        return NULL;
    }
    f->members = m;
    m = &f->members[f->count++];
    m->key = f->pending_key;
    m->key_len = f->pending_key_len;
    return &m->value;
}

/* The place of the next value: a new member (with the key just read) or item of the open
 * container, or the root. The caller fills every field of it. NULL when a limit is broken or
 * memory is out. Inline, with its rare half apart: it runs for every value of every layer. */
static inline ces_json_t *next_value(ces_json_parser_t *p) {
    if (p->depth == 0) {
        p->have_root = true;
        return &p->root;
    }
    frame_t *f = &p->frames[p->depth - 1];
    if (__builtin_expect(f->count >= f->capacity || f->count >= p->limits->max_container, 0))
        return grow_container(p, f);
    ces_json_member_t *m = &f->members[f->count++];
    m->key = f->pending_key;
    m->key_len = f->pending_key_len;
    return &m->value;
}

/* The slow half of copy_text: a string yajl decoded from escapes into its own buffer, or any
 * string of a text not parsed in place. */
static __attribute__((noinline)) const char *copy_text_out(ces_json_parser_t *p,
                                                           const unsigned char *s, size_t len) {
    /* At every layer: an escape may decode to a lone surrogate, even in text known valid. */
    if (memchr(s, 0xED, len) != NULL && !ces_utf8_valid((const char *)s, len)) {
        fail(p, "malformed JSON: a string escapes a lone UTF-16 surrogate (not valid UTF-8)");
        return NULL;
    }
    const char *copy = ces_arena_strndup(p->arena, (const char *)s, len);
    if (copy == NULL)
        fail(p, "out of memory");
    return copy;
}

static inline const char *copy_text(ces_json_parser_t *p, const unsigned char *s, size_t len) {
    /* yajl hands over a string without escapes as a pointer into the text (unless the token was
     * split across input chunks, which one whole text never is), just before its closing quote;
     * it has read past that quote for good. The text was checked as a whole: no check again. */
    uintptr_t at = (uintptr_t)s;
    if (at >= p->text_begin && at < p->text_end && len < p->text_end - at && s[len] == '"') {
        ((unsigned char *)s)[len] = '\0';
        return (const char *)s;
    }
    return copy_text_out(p, s, len);
}

static int on_null(void *ctx) {
    ces_json_t *v = next_value(ctx);
    if (v == NULL)
        return 0;
    *v = (ces_json_t){.type = CES_JSON_NULL};
    return 1;
}

static int on_boolean(void *ctx, int b) {
    ces_json_t *v = next_value(ctx);
    if (v == NULL)
        return 0;
    *v = (ces_json_t){.type = CES_JSON_BOOL, .boolean = b != 0};
    return 1;
}

static int on_number(void *ctx, const char *s, size_t len) {
    ces_json_parser_t *p = ctx;
    if (len > CES_JSON_MAX_NUMBER)
        return fail(p, "malformed JSON: a number longer than 100 characters");
    const char *text = ces_arena_strndup(p->arena, s, len);
    if (text == NULL)
        return fail(p, "out of memory");
    ces_json_t *v = next_value(p);
    if (v == NULL)
        return 0;
    *v = (ces_json_t){.type = CES_JSON_NUMBER, .text = text, .text_len = len};
    return 1;
}

static int on_string(void *ctx, const unsigned char *s, size_t len) {
    ces_json_parser_t *p = ctx;
    const char *text = copy_text(p, s, len);
    if (text == NULL)
        return 0;
    ces_json_t *v = next_value(p);
    if (v == NULL)
        return 0;
    /* A copy was decoded from escapes (or comes from a text not parsed in place): only it may
     * hold a NUL. */
    *v = (ces_json_t){.type = CES_JSON_STRING,
                      .may_hold_nul = text != (const char *)s,
                      .text = text,
                      .text_len = len};
    return 1;
}

static int open_container(ces_json_parser_t *p, ces_json_type_t type) {
    if (p->depth >= p->limits->max_depth)
        return fail(p, "JSON nested too deeply");
    if (p->depth == p->frame_capacity) {
        size_t old = p->frame_capacity;
        frame_t *frames = CES_ARRAY_RESERVE(p->frames, p->frame_capacity, p->depth + 1, 8);
        if (frames == NULL)
            return fail(p, "out of memory");
        /* ces_json_parser_destroy frees every frame's members, used or not. */
        memset(frames + old, 0, (p->frame_capacity - old) * sizeof(*frames));
        p->frames = frames;
    }
    frame_t *f = &p->frames[p->depth++];
    f->type = type;
    f->count = 0;
    f->pending_key = NULL;
    return 1;
}

static int close_container(ces_json_parser_t *p) {
    frame_t *f = &p->frames[p->depth - 1];
    ces_json_type_t type = f->type;
    size_t count = f->count;
    void *children = NULL;
    if (count > 0) {
        if (type == CES_JSON_OBJECT) {
            ces_json_member_t *members = ces_arena_alloc(p->arena, count * sizeof(*members));
            if (members == NULL)
                return fail(p, "out of memory");
            memcpy(members, f->members, count * sizeof(*members));
            children = members;
        } else {
            ces_json_t *items = ces_arena_alloc(p->arena, count * sizeof(*items));
            if (items == NULL)
                return fail(p, "out of memory");
            for (size_t i = 0; i < count; i++)
                items[i] = f->members[i].value;
            children = items;
        }
    }
    p->depth--;
    ces_json_t *v = next_value(p);
    if (v == NULL)
        return 0;
    /* Field by field: a node built on the stack and copied whole was read back before its
     * narrower stores had landed (a store-forwarding stall, most of this function's time). */
    v->type = type;
    v->boolean = false;
    v->may_hold_nul = false;
    if (type == CES_JSON_OBJECT)
        v->members = children;
    else
        v->items = children;
    v->count = count;
    return 1;
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

static const ces_json_t *parse(ces_json_parser_t *parser, ces_arena_t *arena, const char *text,
                               size_t len, const ces_json_limits_t *limits, char *errstr,
                               size_t errstr_size);

const ces_json_t *ces_json_parse(ces_json_parser_t *parser, ces_arena_t *arena, const char *text,
                                 size_t len, const ces_json_limits_t *limits, char *errstr,
                                 size_t errstr_size) {
    parser->text_begin = parser->text_end = 0;
    return parse(parser, arena, text, len, limits, errstr, errstr_size);
}

const ces_json_t *ces_json_parse_in_place(ces_json_parser_t *parser, ces_arena_t *arena,
                                          char *text, size_t len, const ces_json_limits_t *limits,
                                          char *errstr, size_t errstr_size) {
    parser->text_begin = (uintptr_t)text;
    parser->text_end = (uintptr_t)text + len;
    const ces_json_t *root = parse(parser, arena, text, len, limits, errstr, errstr_size);
    parser->text_begin = parser->text_end = 0;
    return root;
}

static const ces_json_t *parse(ces_json_parser_t *parser, ces_arena_t *arena, const char *text,
                               size_t len, const ces_json_limits_t *limits, char *errstr,
                               size_t errstr_size) {
    const ces_json_t *result = NULL;
    parser->depth = 0;
    parser->arena = arena;
    parser->limits = limits;
    parser->have_root = false;
    parser->error[0] = '\0';

    if (!limits->valid_utf8) {
        size_t bad = ces_utf8_check(text, len);
        if (bad < len) {
            snprintf(errstr, errstr_size, "malformed JSON: not valid UTF-8 at byte %zu", bad);
            return NULL;
        }
    }
    parser->pool.used = 0;
    parser->pool.last = NULL;
    yajl_handle h = yajl_alloc(&callbacks, &parser->alloc_funcs, parser);
    if (h == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
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

bool ces_json_valid(const char *text, size_t len) {
    yajl_handle h = yajl_alloc(NULL, NULL, NULL);
    if (h == NULL)
        return false;
    bool ok = yajl_parse(h, (const unsigned char *)text, len) == yajl_status_ok &&
              yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    return ok;
}
