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

#include "format/event.h"

/* What a rule says of a table's columns; the strings are the configuration's. */
typedef struct {
    const char *const *include; /* NULL or empty: every column not excluded */
    size_t ninclude;
    const char *const *exclude;
    size_t nexclude;
    const char *const *rename_from; /* source names ... */
    const char *const *rename_to;   /* ... and their new names, pairwise */
    size_t nrename;
} ces_columns_rule_t;

/* Whether the rule chooses or renames any column. */
bool ces_columns_any(const ces_columns_rule_t *rule);

/* Applies rule to ev in place (its arrays are compacted, renamed names point at the rule's
 * strings). With keys_needed (a mirror applies changes by key), returns 1 when a key column (one
 * of pkkey) is left out, with *key_column set to its source name (ev unchanged); else 0. */
int ces_columns_apply(const ces_columns_rule_t *rule, ces_event_t *ev, bool keys_needed,
                      const char **key_column);

#endif
