/*
 * array: growing a plain C array by doubling.
 *
 * Arrays stay typed fields of their owners (items, count, capacity); this is the one place that
 * decides how they grow, checks the multiplication for overflow, and leaves the array untouched
 * when memory runs out, so that the owner's count and contents stay true on failure.
 */
#ifndef CES_ARRAY_H
#define CES_ARRAY_H

#include <stddef.h>

/*
 * Returns items (an array of *capacity elements of size bytes, NULL when *capacity is 0) with room
 * for at least need elements (need > 0): items itself when it has the room, else a reallocation to
 * the first power-of-two multiple of first (or of *capacity) that holds need, and *capacity set to
 * it. Returns NULL when memory runs out or the size overflows; then items is unchanged, still the
 * caller's, and so is *capacity. Elements past the old capacity are uninitialised.
 */
static inline void *ces_array_reserve(void *items, size_t *capacity, size_t need, size_t size,
                                      size_t first);
/* The reallocation behind ces_array_reserve, out of line: the check for room stays in the caller's
 * hot loop. */
void *ces_array_grow(void *items, size_t *capacity, size_t need, size_t size, size_t first);

static inline void *ces_array_reserve(void *items, size_t *capacity, size_t need, size_t size,
                                      size_t first) {
    if (need <= *capacity && items != NULL)
        return items;
    return ces_array_grow(items, capacity, need, size, first);
}

/* ces_array_reserve for a typed array: CES_ARRAY_RESERVE(t->cols, t->cols_capacity, n + 1, 8). */
#define CES_ARRAY_RESERVE(items, capacity, need, first)                                          \
    ces_array_reserve((items), &(capacity), (need), sizeof(*(items)), (first))

#endif
