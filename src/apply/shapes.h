/*
 * shapes: the event shapes a target table has seen pass every check.
 *
 * An event's shape: the counts of its column list and images, then every column name and type and
 * every field name of pkkey, current and old, each with its NUL (what a compact copy holds in one
 * run, ces_event_t's shape, compared with one memcmp). Events of a table nearly always repeat a
 * few shapes, so the table keeps the last shapes that passed every check, and an event of exactly
 * such a shape (a byte-for-byte comparison, so no collision can let an unchecked shape through)
 * needs no name lookups and no type checks: they would give the same answers against the same
 * description. The catalog (catalog.h) keeps one set per table and empties it whenever the
 * table's description is read again.
 */
#ifndef CES_SHAPES_H
#define CES_SHAPES_H

#include <stdbool.h>

#include "format/event.h"

/* Shapes kept per table: an INS, an UPD and a DEL of one table differ in their images. */
#define CES_SHAPES_KEPT 4

typedef struct ces_shapes_s ces_shapes_t;

/* Returns an empty set, or NULL when out of memory. Owned by the caller. */
ces_shapes_t *ces_shapes_new(void) __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_shapes_destroy(ces_shapes_t *shapes);

/* Forgets every shape (the description they passed against changed). */
void ces_shapes_clear(ces_shapes_t *shapes);

/* True when ev has one of the shapes kept. */
bool ces_shapes_known(ces_shapes_t *shapes, const ces_event_t *ev);

/* Keeps ev's shape as one that passed, in place of the oldest (out of memory: that slot keeps
 * none, which only costs time). */
void ces_shapes_remember(ces_shapes_t *shapes, const ces_event_t *ev);

#endif
