/*
 * map: a string-keyed hash table (open addressing, linear probing).
 *
 * Used for caches and small indexes.
 */
#ifndef CES_MAP_H
#define CES_MAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ces_map_s ces_map_t;

/* Returns an empty map, or NULL when out of memory. Owned by the caller. */
ces_map_t *ces_map_new(void);
/* The same, for a map emptied often (a batch's keys): its key copies are carved from an arena that
 * ces_map_clear empties, instead of a malloc and a free each; a removed key's bytes stay until the
 * next clear. */
ces_map_t *ces_map_new_scratch(void);
/* Frees the map and its key copies; values are the caller's (free them first with ces_map_each). */
void ces_map_destroy(ces_map_t *map);

/* Returns the value stored under key[0..len), or NULL. */
void *ces_map_get(const ces_map_t *map, const char *key, size_t len);
/* Stores value under a copy of key[0..len), replacing any previous value. Returns 0, or -1 when out
 * of memory. */
int ces_map_put(ces_map_t *map, const char *key, size_t len, void *value);
/* Removes key[0..len) and returns its value, or NULL when it was not there. */
void *ces_map_remove(ces_map_t *map, const char *key, size_t len);
size_t ces_map_count(const ces_map_t *map);
/* Calls fn on every value. */
void ces_map_each(ces_map_t *map, void (*fn)(void *value, void *arg), void *arg);

/* Where a walk over a map stands: start it zeroed (ces_map_iter_t it = {0}). */
typedef struct {
    size_t next_slot;
} ces_map_iter_t;
/* Returns the next value of the walk and steps past it, or NULL at the end (so values must not be
 * NULL). The key, when key and len are given, is the map's own copy, valid until the entry goes.
 * Every entry comes once; the map must not change during the walk (a remove shifts entries back
 * into the hole it leaves, so a walk would miss or repeat one). */
void *ces_map_next(const ces_map_t *map, ces_map_iter_t *it, const char **key, size_t *len);
/* Removes every entry (fn, if given, is called on each value first). */
void ces_map_clear(ces_map_t *map, void (*fn)(void *value, void *arg), void *arg);

/* Writes parts[0..n) (NULL counts as "") joined by sep into buf, NUL-terminated, and returns the
 * key's length; a key that does not fit is cut at size - 1 bytes. Keys are built for every event,
 * and snprintf's "%s" machinery was a visible part of applying one. */
size_t ces_map_key(char *buf, size_t size, char sep, const char *const *parts, size_t n);
/* True when key[0..len) is what ces_map_key makes of parts[0..n) and sep, without making it: a
 * caller that remembers the key of its last lookup checks the next names against it first (inline:
 * the catalog and the metrics do it for every applied event). A key that was cut to fit is never
 * what its parts make. */
static inline bool ces_map_key_is(const char *key, size_t len, char sep,
                                  const char *const *parts, size_t n) {
    const char *k = key, *end = key + len;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && (k == end || *k++ != sep))
            return false;
        for (const char *s = parts[i] != NULL ? parts[i] : ""; *s != '\0'; s++, k++) {
            if (k == end || *k != *s)
                return false;
        }
    }
    return k == end;
}

#endif
