/*
 * tableplan: the decisions about target tables that need no server.
 *
 * How a source name becomes a PostgreSQL name (folded, clipped with a hash, reserved columns
 * renamed), which targets no event may reach, when two source column names collide, which target
 * table an event goes to, what type a new column gets, which columns an event needs that a table
 * lacks, when a column's type no longer fits, and how long a table sends upserts only after a
 * plain INSERT found its key taken. Pure functions, testable without a server; the catalog
 * (catalog.h) acts on them. The names, the type map and what is guaranteed about target tables
 * are in docs/semantics.md.
 */
#ifndef CES_TABLEPLAN_H
#define CES_TABLEPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "apply/catalog.h"
#include "format/event.h"

#define CES_TABLEPLAN_UPSERT_ATTEMPTS 64u
#define CES_TABLEPLAN_UPSERT_MAX_DOUBLINGS 6u

/* What a name longer than CES_CATALOG_NAME_MAX bytes ends with in place of its tail: "_" and 8
 * hex digits. */
#define CES_TABLEPLAN_HASH_SUFFIX 9
/* What a source column whose name PostgreSQL or ces2pg reserves is applied under: this, then the
 * name ("xmin" is "_src_xmin"). */
#define CES_TABLEPLAN_RESERVED_PREFIX "_src_"

/* The PostgreSQL name of a source name (schema, table; columns go through column_name): lower-cased
 * in its ASCII letters (as PostgreSQL does for unquoted names) unless preserve_case. A result
 * longer than CES_CATALOG_NAME_MAX bytes, which PostgreSQL would truncate so that names differing
 * only past it would meet, is clipped to 54 bytes (never splitting a UTF-8 character) followed by
 * "_" and 8 hex digits of a hash (FNV-1a) of the whole source name: stable across restarts and
 * builds, and distinct for distinct names but for a 1 in 2^32 chance. Returns a malloc'd string
 * owned by the caller, or NULL when out of memory. */
char *ces_tableplan_fold_name(const char *name, bool preserve_case)
    __attribute__((warn_unused_result));

/* True when a column named pg_name (a PostgreSQL name) cannot be made: a system column's name
 * (xmin, xmax, cmin, cmax, ctid, tableoid), ces2pg's version column (version_column; NULL: none),
 * or the empty name. */
bool ces_tableplan_reserved_column(const char *pg_name, const char *version_column);

/* What --check-config can tell of the names rules above without an event: the reserved columns
 * (version_column: NULL without the version guard) and their new names, the cut of long names,
 * the reserved targets. Lines starting "names: ". */
void ces_tableplan_describe_names(FILE *out, const char *version_column,
                                  const char *metadata_schema);

/* The PostgreSQL name of the source column name: ces_tableplan_fold_name's, or, when that is
 * reserved (ces_tableplan_reserved_column), CES_TABLEPLAN_RESERVED_PREFIX followed by it (and
 * *renamed set, when not NULL). Everything that maps a source column to a target column (creating
 * and evolving tables, resolving an event's columns, keys and old images) goes through this.
 * Returns a malloc'd string owned by the caller, or NULL when out of memory. */
char *ces_tableplan_column_name(const char *name, bool preserve_case, const char *version_column,
                                bool *renamed) __attribute__((warn_unused_result));

/* Why no event may be applied to pg_schema.pg_table (PostgreSQL names, as folded), or NULL when
 * it may: the target is in ces2pg's metadata schema (metadata_schema, which holds every relation
 * ces2pg owns), in pg_catalog, information_schema or any pg_* schema (pg_toast, pg_temp_...), or a
 * name is empty. A static string. */
const char *ces_tableplan_reserved_target(const char *pg_schema, const char *pg_table,
                                          const char *metadata_schema);

/* Whether two of the source column names ev mentions (ces_tableplan_event_columns) map to one
 * PostgreSQL name (ces_tableplan_column_name): names that differ only in case when lower-casing,
 * or a source column that is named like another's renamed form. Returns 1 with *first and
 * *second set to the two (ev's strings), 0 when none do, -1 when out of memory. */
int ces_tableplan_column_collision(const ces_event_t *ev, bool preserve_case,
                                   const char *version_column, const char **first,
                                   const char **second) __attribute__((warn_unused_result));

/* pattern (one part of schema.target) with {db}, {schema} and {table} replaced by ev's source
 * names. Returns a malloc'd string owned by the caller, or NULL when out of memory. */
char *ces_tableplan_expand_target(const char *pattern, const ces_event_t *ev)
    __attribute__((warn_unused_result));

/* Writes into buf the PostgreSQL type a new column for source_name gets: its SQL Server type
 * mapped (ces_types_map), or text when the event announces no type. Returns the SQL Server type
 * when it has no mapping (the column is text, and the caller warns), else NULL. */
const char *ces_tableplan_new_column_type(const ces_event_t *ev, const char *source_name,
                                           char *buf, size_t size);

/* The source names of every column ev mentions (cols, pkkey, current, old; each once), in that
 * order. *names is a malloc'd array owned by the caller (its strings are ev's). Returns 0, or -1
 * when out of memory. */
int ces_tableplan_event_columns(const ces_event_t *ev, const char ***names, size_t *count)
    __attribute__((warn_unused_result));

/* The index of table's column named pg_name (a PostgreSQL name), or -1. */
long ces_tableplan_column_index(const ces_catalog_desc_t *table, const char *pg_name);

/* The source names of the columns ev mentions (ces_tableplan_event_columns) that table has no
 * column for (named by ces_tableplan_column_name), in that order. *missing is a malloc'd array
 * owned by the caller (its strings are ev's). Returns 0, or -1 when out of memory. */
int ces_tableplan_missing_columns(const ces_catalog_desc_t *table, bool preserve_case,
                                   const char *version_column, const ces_event_t *ev,
                                   const char ***missing, size_t *nmissing)
    __attribute__((warn_unused_result));

/* How many attempts a table sends upserts only after a plain INSERT found its key taken, when
 * that happened taken_before times before: CES_TABLEPLAN_UPSERT_ATTEMPTS, doubling with each
 * taken key at most CES_TABLEPLAN_UPSERT_MAX_DOUBLINGS times (64 up to 4,096), so that a table
 * whose keys keep being taken costs little. */
uint64_t ces_tableplan_upsert_attempts(unsigned taken_before);

/* True when a target column cast to target_cast (ces_catalog_column_t.cast, e.g.
 * "pg_catalog.int4") cannot hold values of SQL Server type source_type: a type conflict. */
bool ces_tableplan_type_conflicts(const char *target_cast, const char *source_type);

#endif
