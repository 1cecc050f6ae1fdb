/*
 * columns: a table rule's choice of columns (the configuration's schema.tables, `columns`), made
 * on the event itself before anything else sees it.
 *
 * An event of a table whose rule lists columns loses the columns the rule leaves out (not in
 * `include` when it has one, or in `exclude`) from its column list, pkkey and row images, and its
 * renamed columns (`rename`) take their new names there. Everything downstream (creating and
 * evolving the target and history tables, the statements, soft deletes) then sees the event as if
 * the source had sent it so, which is how a new source column follows the lists too. A key column
 * cannot be left out: the mirror applies changes by key. Source names compare ASCII
 * case-insensitively, as the rules' table names do.
 */
#ifndef CES_COLUMNS_H
#define CES_COLUMNS_H

#include <stdbool.h>
#include <stddef.h>

#include "apply/mask.h"
#include "format/event.h"
#include "util/arena.h"

/* What a rule says of a table's columns; the strings are the configuration's. */
typedef struct {
    const char *const *include; /* NULL or empty: every column not excluded */
    size_t ninclude;
    const char *const *exclude;
    size_t nexclude;
    const char *const *rename_from; /* source names ... */
    const char *const *rename_to;   /* ... and their new names, pairwise */
    size_t nrename;
    /* Columns given another PostgreSQL type: source names, the type ("jsonb", "json",
     * "timestamptz") and, for timestamptz, the zone the source's local times are in ("" else). */
    const char *const *type_columns;
    const char *const *types;
    const char *const *type_zones;
    size_t ntypes;
    /* Masked columns: source names and how ("hash": the keyed hash of mask.h, as text; "null"),
     * and the hasher the rule's owner made with schema.mask_key_file's key (NULL without one). */
    const char *const *mask_columns;
    const char *const *masks;
    size_t nmasks;
    ces_mask_t *hasher;
} ces_columns_rule_t;

typedef enum {
    CES_COLUMNS_OK = 0,
    CES_COLUMNS_KEY_LEFT_OUT, /* a key column is left out (a mirror needs it) */
    CES_COLUMNS_KEY_MASKED,   /* a key column is masked (a mirror needs its values) */
    CES_COLUMNS_NO_CONVERSION /* a value does not convert to its column's chosen type */
} ces_columns_status_t;

/* Whether the rule chooses, renames, types or masks any column. */
bool ces_columns_any(const ces_columns_rule_t *rule);

/* Whether the rule masks a column by keyed hash (and so needs a hasher). */
bool ces_columns_hash_masks(const ces_columns_rule_t *rule);

/* Applies rule to ev in place: its arrays are compacted, renamed names point at the rule's
 * strings, a column given another type carries it (CES_TYPES_OVERRIDE_PREFIX) and its values the
 * form PostgreSQL reads for it (a local time with its zone appended, from arena); a column masked
 * by hash becomes text and its values their masks (from arena), one masked as null NULL. Returns
 * CES_COLUMNS_KEY_LEFT_OUT when keys_needed (a mirror applies changes by key) and a key column
 * (one of pkkey) is left out, CES_COLUMNS_KEY_MASKED when one is masked,
 * CES_COLUMNS_NO_CONVERSION when a value is not JSON for a json or
 * jsonb column or not a plain date and time for a timestamptz one, with *column set to the source
 * name (ev is then to be dead-lettered, not used); else CES_COLUMNS_OK. -1 when out of memory. */
int ces_columns_apply(const ces_columns_rule_t *rule, ces_event_t *ev, bool keys_needed,
                      ces_arena_t *arena, const char **column);

#endif
