#include "util/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK_SIZE 8192
#define ARENA_ALIGN 16
#define ARENA_MAX_REUSED (256u << 10)

typedef struct arena_block_s {
    struct arena_block_s *next;
    size_t size; /* usable bytes after the header */
    size_t used;
    _Alignas(ARENA_ALIGN) unsigned char data[];
} arena_block_t;

struct ces_arena_s {
    arena_block_t *head; /* current block; older blocks follow */
    size_t footprint;
    size_t block_size;
    size_t first_block_size; /* as created: what a reset after a huge use goes back to */
    arena_block_t *whole;    /* ces_arena_new_whole: the first block, part of this allocation */
};

/* Where a whole arena's first block starts in its allocation. */
#define WHOLE_OFFSET                                                                               \
    ((sizeof(ces_arena_t) + _Alignof(arena_block_t) - 1) & ~(_Alignof(arena_block_t) - 1))

/* The size of an arena's blocks for a first block of about want bytes, within the usual bounds. */
static size_t bounded_block_size(size_t want) {
    return want < 256 ? 256 : want > ARENA_BLOCK_SIZE * 8 ? ARENA_BLOCK_SIZE * 8 : want;
}

ces_arena_t *ces_arena_new_sized(size_t first_block) {
    ces_arena_t *a = calloc(1, sizeof(ces_arena_t));
    if (a == NULL)
        return NULL;
    a->block_size = a->first_block_size = bounded_block_size(first_block);
    return a;
}

void ces_arena_reset(ces_arena_t *arena) {
    arena_block_t *b = arena->head;
    if (b == NULL)
        return;
    if (b->next == NULL && b->size <= ARENA_MAX_REUSED) {
        b->used = 0;
        return;
    }
    size_t total = 0;
    while (b != NULL) {
        arena_block_t *next = b->next;
        total += b->size;
        if (b != arena->whole)
            free(b);
        b = next;
    }
    arena->head = NULL;
    arena->footprint = 0;
    arena->block_size = total > ARENA_MAX_REUSED ? arena->first_block_size : total;
    if (arena->whole != NULL) {
        /* It goes with the arena: it stays, and the next use starts in it. */
        arena->head = arena->whole;
        arena->whole->next = NULL;
        arena->whole->used = 0;
        arena->footprint = WHOLE_OFFSET + sizeof(arena_block_t) + arena->whole->size;
    }
}

ces_arena_t *ces_arena_new(void) { return ces_arena_new_sized(ARENA_BLOCK_SIZE); }

ces_arena_t *ces_arena_new_whole(size_t first_block) {
    size_t size = (first_block + (ARENA_ALIGN - 1)) & ~(size_t)(ARENA_ALIGN - 1);
    if (size < first_block || size > SIZE_MAX - WHOLE_OFFSET - sizeof(arena_block_t))
        return NULL;
    ces_arena_t *a = malloc(WHOLE_OFFSET + sizeof(arena_block_t) + size);
    if (a == NULL)
        return NULL;
    arena_block_t *b = (arena_block_t *)((unsigned char *)a + WHOLE_OFFSET);
    b->next = NULL;
    b->size = size;
    b->used = 0;
    a->head = a->whole = b;
    a->footprint = WHOLE_OFFSET + sizeof(arena_block_t) + size;
    /* Should more be needed after all, it comes in blocks of the usual bounds. */
    a->block_size = a->first_block_size = bounded_block_size(size);
    return a;
}

void ces_arena_destroy(ces_arena_t *arena) {
    if (arena == NULL)
        return;
    arena_block_t *b = arena->head;
    while (b != NULL) {
        arena_block_t *next = b->next;
        if (b != arena->whole)
            free(b);
        b = next;
    }
    free(arena);
}

void *ces_arena_alloc(ces_arena_t *arena, size_t size) {
    size_t rounded = (size + (ARENA_ALIGN - 1)) & ~(size_t)(ARENA_ALIGN - 1);
    if (rounded < size)
        return NULL;
    arena_block_t *b = arena->head;
    if (b == NULL || b->size - b->used < rounded) {
        /* A large request gets a block of its own, placed behind the current one so the current
         * block's free space is not wasted. */
        size_t want = rounded > arena->block_size / 2 ? rounded : arena->block_size;
        if (want > SIZE_MAX - sizeof(arena_block_t))
            return NULL;
        arena_block_t *nb = malloc(sizeof(arena_block_t) + want);
        if (nb == NULL)
            return NULL;
        nb->size = want;
        nb->used = 0;
        arena->footprint += sizeof(arena_block_t) + want;
        if (want != arena->block_size && b != NULL) {
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            arena->head = nb;
        }
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += rounded;
    return p;
}

char *ces_arena_strndup(ces_arena_t *arena, const char *s, size_t len) {
    if (len == SIZE_MAX)
        return NULL;
    char *p = ces_arena_alloc(arena, len + 1);
    if (p == NULL)
        return NULL;
    if (len > 0)
        memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

size_t ces_arena_footprint(const ces_arena_t *arena) { return arena->footprint; }
