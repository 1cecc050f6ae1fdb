/*
 * bench/json-floor.h: the JSON floor, shared by bench/kafka-drain.c (--parse-json, bench/run's
 * JSON floor) and bench/decode.c (the "yajl alone" figure of bench/run-decode). Header only, all
 * static, so that each benchmark compiles it in without a build change.
 *
 * The least JSON work any CES decoder built on yajl must do, done to one record. Each record is
 * three JSON layers (docs/ces-format.md): the envelope, the `data` string it carries, and the row
 * images `old` and `current` inside that. Each layer is read once with yajl's callback parser,
 * strings unchecked (yajl_dont_validate_strings) and numbers left as text, building nothing and
 * copying nothing: the inner layers are parsed from inside the callback that hands their string
 * over. A segment's `data` is a slice that does not parse by itself; its parse stops at the first
 * error, which is never more work than the joined event's parse would be. So the CPU time of this
 * is a floor under the CPU any JSON-reading ces2pg needs for the same records.
 *
 *   json_floor_t f;
 *   if (json_floor_init(&f) != 0) ...;           out of memory
 *   json_floor_record(&f, text, len);             per record; f.layers and f.broken count up
 *   json_floor_free(&f);
 */
#ifndef CES2PG_BENCH_JSON_FLOOR_H
#define CES2PG_BENCH_JSON_FLOOR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

#define JSON_FLOOR_ARENA (64u << 20) /* three layers of a 1 MB record, with yajl's doubling buffers */

typedef struct {
    unsigned char *base;
    size_t used;
} json_floor_arena_t;

typedef struct json_floor_layer {
    yajl_alloc_funcs *alloc;
    int key; /* the key just read names the next layer */
    unsigned long long layers, broken;
} json_floor_layer_t;

typedef struct {
    json_floor_arena_t arena;
    yajl_alloc_funcs alloc;
    unsigned long long layers; /* JSON texts parsed */
    unsigned long long broken; /* of those, the ones that did not parse whole */
} json_floor_t;

/* yajl's allocations for one record are carved from one block, all dropped at the next record,
 * so that malloc does not count in the floor (ces2pg pools them too). */
static inline void *json_floor_malloc(void *ctx, size_t size) {
    json_floor_arena_t *a = ctx;
    size_t need = ((size + 15) & ~(size_t)15) + 16;
    if (need > JSON_FLOOR_ARENA - a->used) {
        fprintf(stderr, "json floor: a record needs more than %u bytes of yajl buffers\n",
                JSON_FLOOR_ARENA);
        exit(1);
    }
    unsigned char *p = a->base + a->used;
    memcpy(p, &size, sizeof(size));
    a->used += need;
    return p + 16;
}

static inline void *json_floor_realloc(void *ctx, void *ptr, size_t size) {
    if (ptr == NULL)
        return json_floor_malloc(ctx, size);
    size_t old;
    memcpy(&old, (unsigned char *)ptr - 16, sizeof(old));
    if (size <= old)
        return ptr;
    void *grown = json_floor_malloc(ctx, size);
    memcpy(grown, ptr, old);
    return grown;
}

static inline void json_floor_free_one(void *ctx, void *ptr) {
    (void)ctx;
    (void)ptr;
}

static inline int json_floor_ignore_string(void *ctx, const unsigned char *s, size_t len) {
    (void)ctx;
    (void)s;
    (void)len;
    return 1;
}

static inline int json_floor_ignore_number(void *ctx, const char *s, size_t len) {
    (void)ctx;
    (void)s;
    (void)len;
    return 1;
}

static inline void json_floor_parse(json_floor_layer_t *f, const yajl_callbacks *cb,
                                    const unsigned char *text, size_t len);

static inline int json_floor_key(void *ctx, const unsigned char *key, size_t len, const char *a,
                                 const char *b) {
    json_floor_layer_t *f = ctx;
    f->key = (len == strlen(a) && memcmp(key, a, len) == 0) ||
             (b != NULL && len == strlen(b) && memcmp(key, b, len) == 0);
    return 1;
}

static inline int json_floor_image_key(void *ctx, const unsigned char *key, size_t len) {
    return json_floor_key(ctx, key, len, "old", "current");
}

static inline int json_floor_envelope_key(void *ctx, const unsigned char *key, size_t len) {
    return json_floor_key(ctx, key, len, "data", NULL);
}

static const yajl_callbacks json_floor_image_callbacks = {
    .yajl_string = json_floor_ignore_string,
    .yajl_number = json_floor_ignore_number,
};

/* The string just read, when its key named the next layer, is parsed as that layer. */
static inline int json_floor_inner_layer(void *ctx, const yajl_callbacks *cb,
                                         const unsigned char *s, size_t len) {
    json_floor_layer_t *f = ctx;
    if (f->key && len > 0) {
        json_floor_layer_t inner = {.alloc = f->alloc};
        json_floor_parse(&inner, cb, s, len);
        f->layers += inner.layers;
        f->broken += inner.broken;
    }
    f->key = 0;
    return 1;
}

static inline int json_floor_data_string(void *ctx, const unsigned char *s, size_t len) {
    return json_floor_inner_layer(ctx, &json_floor_image_callbacks, s, len);
}

static const yajl_callbacks json_floor_data_callbacks = {
    .yajl_string = json_floor_data_string,
    .yajl_number = json_floor_ignore_number,
    .yajl_map_key = json_floor_image_key,
};

static inline int json_floor_envelope_string(void *ctx, const unsigned char *s, size_t len) {
    return json_floor_inner_layer(ctx, &json_floor_data_callbacks, s, len);
}

static const yajl_callbacks json_floor_envelope_callbacks = {
    .yajl_string = json_floor_envelope_string,
    .yajl_number = json_floor_ignore_number,
    .yajl_map_key = json_floor_envelope_key,
};

static inline void json_floor_parse(json_floor_layer_t *f, const yajl_callbacks *cb,
                                    const unsigned char *text, size_t len) {
    yajl_handle h = yajl_alloc(cb, f->alloc, f);
    if (h == NULL) {
        fprintf(stderr, "json floor: out of memory\n");
        exit(1);
    }
    yajl_config(h, yajl_dont_validate_strings, 1);
    f->layers++;
    if (yajl_parse(h, text, len) != yajl_status_ok || yajl_complete_parse(h) != yajl_status_ok)
        f->broken++;
    yajl_free(h);
}

/* 0, or -1 when the arena cannot be had. */
static inline int json_floor_init(json_floor_t *f) {
    memset(f, 0, sizeof(*f));
    f->alloc.malloc = json_floor_malloc;
    f->alloc.realloc = json_floor_realloc;
    f->alloc.free = json_floor_free_one;
    f->alloc.ctx = &f->arena;
    f->arena.base = malloc(JSON_FLOOR_ARENA);
    return f->arena.base == NULL ? -1 : 0;
}

/* Reads one record's three layers; counts them in f->layers (and f->broken). */
static inline void json_floor_record(json_floor_t *f, const void *text, size_t len) {
    json_floor_layer_t envelope = {.alloc = &f->alloc};
    f->arena.used = 0;
    json_floor_parse(&envelope, &json_floor_envelope_callbacks, text, len);
    f->layers += envelope.layers;
    f->broken += envelope.broken;
}

static inline void json_floor_free(json_floor_t *f) {
    free(f->arena.base);
    f->arena.base = NULL;
}

#endif
