#include "apply/shapes.h"

#include <stdlib.h>
#include <string.h>

#include "util/array.h"

/* An event shape, as ces_shapes_remember writes it; len 0: none. */
typedef struct {
    char *bytes;
    size_t len, cap;
} shape_t;

struct ces_shapes_s {
    shape_t kept[CES_SHAPES_KEPT];
    unsigned next;    /* the slot the next shape replaces: the oldest */
    unsigned matched; /* the slot that matched last: the next event most likely matches it */
};

ces_shapes_t *ces_shapes_new(void) { return calloc(1, sizeof(ces_shapes_t)); }

void ces_shapes_destroy(ces_shapes_t *s) {
    if (s == NULL)
        return;
    for (size_t i = 0; i < CES_SHAPES_KEPT; i++)
        free(s->kept[i].bytes);
    free(s);
}

void ces_shapes_clear(ces_shapes_t *s) {
    for (size_t i = 0; i < CES_SHAPES_KEPT; i++)
        s->kept[i].len = 0;
}

static bool shape_text_matches(const char **cursor, const char *end, const char *s) {
    const char *c = *cursor;
    for (;; c++, s++) {
        if (c == end || *c != *s)
            return false;
        if (*s == '\0')
            break;
    }
    *cursor = c + 1;
    return true;
}

static bool shape_fields_match(const char **cursor, const char *end, const ces_field_t *f,
                               size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!shape_text_matches(cursor, end, f[i].name))
            return false;
    }
    return true;
}

static bool shape_matches(const shape_t *shape, const ces_event_t *ev) {
    const size_t counts[4] = {ev->ncols, ev->npkkey, ev->ncurrent, ev->nold};
    if (shape->len < sizeof(counts))
        return false;
    /* Compared as four words, not with memcmp: a table's INS, UPD and DEL shapes differ in their
     * counts, so where they interleave, most shapes tried differ there. */
    size_t known[4];
    memcpy(known, shape->bytes, sizeof(known));
    if (known[0] != counts[0] || known[1] != counts[1] || known[2] != counts[2] ||
        known[3] != counts[3])
        return false;
    if (ev->shape != NULL) /* a compact copy holds its shape's names as written here */
        return shape->len - sizeof(counts) == ev->shape_len &&
               memcmp(shape->bytes + sizeof(counts), ev->shape, ev->shape_len) == 0;
    const char *cursor = shape->bytes + sizeof(counts), *end = shape->bytes + shape->len;
    for (size_t i = 0; i < ev->ncols; i++) {
        if (!shape_text_matches(&cursor, end, ev->cols[i].name) ||
            !shape_text_matches(&cursor, end, ev->cols[i].type))
            return false;
    }
    return shape_fields_match(&cursor, end, ev->pkkey, ev->npkkey) &&
           shape_fields_match(&cursor, end, ev->current, ev->ncurrent) &&
           shape_fields_match(&cursor, end, ev->old, ev->nold) && cursor == end;
}

bool ces_shapes_known(ces_shapes_t *s, const ces_event_t *ev) {
    for (unsigned i = 0; i < CES_SHAPES_KEPT; i++) {
        unsigned slot = (s->matched + i) % CES_SHAPES_KEPT;
        if (shape_matches(&s->kept[slot], ev)) {
            s->matched = slot;
            return true;
        }
    }
    return false;
}

/* Appends n bytes to the shape being written; false when out of memory. */
static bool shape_put(shape_t *shape, const void *bytes, size_t n) {
    char *bigger = CES_ARRAY_RESERVE(shape->bytes, shape->cap, shape->len + n, 256);
    if (bigger == NULL)
        return false;
    shape->bytes = bigger;
    memcpy(shape->bytes + shape->len, bytes, n);
    shape->len += n;
    return true;
}

static bool shape_put_text(shape_t *shape, const char *s) {
    return shape_put(shape, s, strlen(s) + 1);
}

static bool shape_put_fields(shape_t *shape, const ces_field_t *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!shape_put_text(shape, f[i].name))
            return false;
    }
    return true;
}

void ces_shapes_remember(ces_shapes_t *s, const ces_event_t *ev) {
    shape_t *shape = &s->kept[s->next];
    s->next = (s->next + 1) % CES_SHAPES_KEPT;
    const size_t counts[4] = {ev->ncols, ev->npkkey, ev->ncurrent, ev->nold};
    shape->len = 0;
    bool ok = shape_put(shape, counts, sizeof(counts));
    if (ev->shape != NULL) {
        if (!ok || !shape_put(shape, ev->shape, ev->shape_len))
            shape->len = 0;
        return;
    }
    for (size_t i = 0; ok && i < ev->ncols; i++)
        ok = shape_put_text(shape, ev->cols[i].name) && shape_put_text(shape, ev->cols[i].type);
    ok = ok && shape_put_fields(shape, ev->pkkey, ev->npkkey) &&
         shape_put_fields(shape, ev->current, ev->ncurrent) &&
         shape_put_fields(shape, ev->old, ev->nold);
    if (!ok)
        shape->len = 0;
}
