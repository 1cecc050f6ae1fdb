/*
 * rules: per-table rules, the configuration's schema.tables.
 *
 * schema.tables is a list of groups tried in order: the first whose `match` fits a source table's
 * "schema.table" (exactly, or as a glob with *, ? and [...]; ASCII letters in either case, as
 * schema.include matches) is that table's rule, and a table no rule matches gets the defaults
 * (schema.target, hard deletes, every column). A rule says where the table goes (`target`, "SCHEMA.TABLE" with
 * {db}, {schema} and {table}, like schema.target) and what a delete does (`deletes`: "hard"
 * removes the row; "soft" keeps it and sets `deleted_column` to the source commit time, which a
 * later insert or update of the key clears), and whether every change is also appended to a history
 * table (`history`: "off", "also" beside the mirror, "only" instead of it; `history_table`, a
 * template like target's, default "{schema}.{table}_history"), and which columns go under which
 * names (`columns = { include = [...]; exclude = [...]; rename = ( ["Source", "target"] );
 * types = ( ["Payload", "jsonb"], ["Created", "timestamptz", "Europe/Berlin"] );
 * mask = ( ["Email", "hash"], ["Notes", "null"] ); }`).
 * Every key a rule may hold is known here: anything else is an error, never ignored. docs/semantics.md ("Per-table rules") states the guarantees.
 */
#ifndef CES_RULES_H
#define CES_RULES_H

#include <libconfig.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define CES_RULES_DELETED_COLUMN_DEFAULT "_ces_deleted_at"
#define CES_RULES_HISTORY_TABLE_DEFAULT "{schema}.{table}_history"

typedef enum {
    CES_RULE_DELETES_HARD = 0, /* a delete removes the row (a tombstone remembers it) */
    CES_RULE_DELETES_SOFT,     /* a delete keeps the row and marks it (deleted_column) */
} ces_rule_deletes_t;

typedef enum {
    CES_RULE_HISTORY_OFF = 0, /* no history */
    CES_RULE_HISTORY_ALSO,    /* the mirror, and every change appended to the history table */
    CES_RULE_HISTORY_ONLY,    /* the history table alone (append only), no mirror */
} ces_rule_history_t;

/* Source column names of a rule (`columns`), as configured. */
typedef struct {
    char **items; /* owned */
    size_t count;
} ces_rule_names_t;

typedef struct {
    char *match;   /* "dbo.Orders", "sales.*" */
    bool pattern;  /* match holds glob characters */
    char *target;  /* "SCHEMA.TABLE" with placeholders; NULL: schema.target */
    ces_rule_deletes_t deletes;
    char *deleted_column; /* the target column a soft delete sets; NULL with hard deletes */
    ces_rule_history_t history;
    char *history_table; /* "SCHEMA.TABLE" with placeholders; NULL when history is off */
    /* columns: which source columns go (include, or all but exclude; ASCII case aside) and the
     * new names of some (rename_from[i] becomes rename_to[i]). */
    ces_rule_names_t include, exclude, rename_from, rename_to;
    /* columns.types: source columns given another PostgreSQL type (jsonb, json, timestamptz) and,
     * for timestamptz, the zone their local times are in ("" for the others). */
    ces_rule_names_t type_columns, types, type_zones;
    /* columns.mask: source columns whose values are masked, and how: "hash" (HMAC-SHA256 under
     * schema.mask_key_file, as text) or "null". */
    ces_rule_names_t mask_columns, masks;
    int line;             /* of the rule in the configuration file */
} ces_rule_t;

typedef struct {
    ces_rule_t *items; /* owned */
    size_t count;
} ces_rules_t;

/* Reads the list setting (schema.tables) of the file path into *rules, which must be empty.
 * Returns 0, or -1 with errstr naming the file, the line and what is wrong (*rules then holds what
 * was read, for ces_rules_free). */
int ces_rules_read(ces_rules_t *rules, config_setting_t *list, const char *path, char *errstr,
                   size_t errstr_size) __attribute__((warn_unused_result));

/* Checks what depends on other keys: a deleted_column may not be the version column
 * (version_column; NULL without the version guard). Returns 0, or -1 with errstr set. */
int ces_rules_check(const ces_rules_t *rules, const char *version_column, const char *path,
                    char *errstr, size_t errstr_size) __attribute__((warn_unused_result));

void ces_rules_free(ces_rules_t *rules); /* accepts NULL; leaves *rules empty */

/* Whether a rule masks a column by keyed hash (which needs schema.mask_key_file). */
bool ces_rules_hash_masks(const ces_rules_t *rules);

/* The rule of the source table schema.table, or NULL when none matches (the defaults). The rule
 * is rules'. */
const ces_rule_t *ces_rules_match(const ces_rules_t *rules, const char *schema, const char *table);

/* NULL when target is a valid "SCHEMA.TABLE" template (each part text and {db}, {schema},
 * {table}); else why not, written into why. */
const char *ces_rules_target_problem(const char *target, char *why, size_t why_size);

/* For --check-config: a line per rule, "tables: ", what it matches (a table exactly, or a
 * pattern), its target and its deletes, then what the tables no rule matches get (default_target:
 * schema.target). */
void ces_rules_describe(FILE *out, const ces_rules_t *rules, const char *default_target);

#endif
