/*
 * arena: a bump allocator that frees everything at once.
 *
 * A decoded event lives in one arena: every string and array of it is carved from a few large blocks
 * and released by one ces_arena_destroy(), so the hot path does no per-field malloc/free.
 */
#ifndef CES_ARENA_H
#define CES_ARENA_H

#include <stddef.h>

typedef struct ces_arena_s ces_arena_t;

/* Returns a new empty arena, or NULL when out of memory. Owned by the caller. */
ces_arena_t *ces_arena_new(void);
/* The same, with blocks of about first_block bytes: an event's arena is sized to its record so that
 * thousands of held events do not each pin a mostly empty default block. */
ces_arena_t *ces_arena_new_sized(size_t first_block);
/* The same, with its first block of first_block bytes made at once, in the arena's own allocation:
 * for an arena sized for exactly what it will hold (a held event and its record), which then costs
 * one malloc. */
ces_arena_t *ces_arena_new_whole(size_t first_block);
/* Frees the arena and everything allocated from it. Accepts NULL. */
void ces_arena_destroy(ces_arena_t *arena);

/* Frees everything allocated from the arena, which stays usable. A reused arena needs no malloc
 * for what fits where its last use fitted: if that took several blocks, they are replaced by one
 * block of their size for the next use. After a use of more than 256 KB the arena starts again
 * as it was created. */
void ces_arena_reset(ces_arena_t *arena);

/* Returns size bytes aligned for any type, owned by the arena; NULL when out of memory. */
void *ces_arena_alloc(ces_arena_t *arena, size_t size);
/* Copies len bytes and appends a NUL; the copy is owned by the arena. NULL when out of memory. */
char *ces_arena_strndup(ces_arena_t *arena, const char *s, size_t len);

/* Bytes obtained from malloc by this arena (for memory accounting). */
size_t ces_arena_footprint(const ces_arena_t *arena);

#endif
