/*
 * catalog: the target tables, as ces2pg finds, creates, extends and describes them.
 *
 * Each source table (db, schema, table) maps to one target table named by schema.target. The
 * catalog reads its columns and primary key from pg_catalog, creates it when it does not exist
 * (schema.auto_create), adds the columns a later event carries (schema.auto_evolve; never drops or
 * retypes), adopts a table made before ces2pg by adding the version column, and refuses events
 * whose table has no primary key or whose column types no longer fit (type conflicts). Names from
 * events are untrusted: before any DDL or DML it refuses events whose target is reserved (the
 * metadata schema, a system schema: reserved_target) and events whose source name maps to a
 * target table or column that another source name already has (name_collision; a table it makes
 * names its source in its comment, so that this holds across restarts). The type map and what is
 * guaranteed about target tables are in docs/semantics.md.
 *
 * What statements need of a table is its description (ces_catalog_desc_t), read-only outside the
 * catalog. The catalog keeps the tables and decides when each is read, created or extended; the
 * reading and the DDL are pgcatalog.h's, the decisions that need no server (names, types, missing
 * columns, conflicts) tableplan.h's, and the event shapes a table has passed shapes.h's.
 */
#ifndef CES_CATALOG_H
#define CES_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apply/columns.h"
#include "format/event.h"
#include "format/types.h"
#include "order/batch.h"

/* Declared in session.h and pgerr.h; not included, so that readers of a table description
 * (sqltext) do not see libpq. */
typedef struct ces_session_s ces_session_t;
typedef struct ces_pgerr_s ces_pgerr_t;

/* NAMEDATALEN - 1: PostgreSQL truncates longer identifiers. */
#define CES_CATALOG_NAME_MAX 63

/* A column of a target table. */
typedef struct {
    char *name;   /* PostgreSQL name */
    char *type;   /* format_type() with the modifier, e.g. character varying(50) */
    char *cast;   /* the type without modifier, schema-qualified: what a parameter is cast to */
    char *quoted; /* name quoted for SQL */
    ces_conv_t conv;
} ces_catalog_column_t;

/* A target table as statements see it. Owned by the catalog; valid until ces_catalog_forget or
 * ces_catalog_destroy. */
typedef struct {
    unsigned id;                /* names the table in statement signatures; never reused */
    char *qualified;            /* quoted "schema"."table" */
    ces_catalog_column_t *cols; /* in attnum order */
    size_t ncols;
    size_t *pk; /* column indices of the primary key, in key order */
    size_t npk;
    unsigned oid;     /* of the table: tombstones name it */
    long version_col; /* index of the version column; -1 when absent or apply.lsn_guard is off */
    long deleted_col; /* soft deletes (a rule): index of the column a delete sets; -1: hard */
} ces_catalog_desc_t;

/* Whether statements on the table carry the version guard (apply.lsn_guard, and the column). */
static inline bool ces_catalog_guarded(const ces_catalog_desc_t *t) { return t->version_col >= 0; }

/* Whether a delete keeps the row and marks it (a rule's deletes = "soft"). */
static inline bool ces_catalog_soft_deletes(const ces_catalog_desc_t *t) {
    return t->deleted_col >= 0;
}

typedef struct ces_catalog_s ces_catalog_t;
typedef struct ces_catalog_table_s ces_catalog_table_t;

/* What a per-table rule (the configuration's schema.tables) says of one source table. */
typedef struct {
    const char *target;         /* "SCHEMA.TABLE" with {db}, {schema}, {table}; NULL: options' */
    const char *deleted_column; /* soft deletes: the column a delete sets; NULL: hard deletes */
    const char *history_table;  /* every change also appended there (a template); NULL: none */
    bool history_only;          /* the history table alone: no mirror table */
    ces_columns_rule_t columns; /* which columns go, under which names (hasher: the catalog's) */
    const char *mask_key;       /* the key of hash masks (schema.mask_key_file's); NULL: none */
    int line;                   /* of the rule in the configuration, for messages */
} ces_catalog_rule_t;

/* The columns a history table has before the source's, in this order: the change's version
 * (its primary key: each change once), operation (INS, UPD, DEL), commit LSN ("VLF:block:slot"),
 * sequence number, commit time (the envelope's; NULL when it has none) and when it was applied. */
#define CES_CATALOG_HISTORY_VERSION "_ces_version"
#define CES_CATALOG_HISTORY_META                                                                   \
    {CES_CATALOG_HISTORY_VERSION, "_ces_operation", "_ces_commit_lsn", "_ces_sequence",            \
     "_ces_commit_time", "_ces_applied_at"}
#define CES_CATALOG_HISTORY_NMETA 6
/* Of those, the ones each change gives a value (the last has a default). */
#define CES_CATALOG_HISTORY_NVALUES 5

/* The rule of the source table schema.table: fills *rule and returns true, or returns false for
 * the defaults. Called once per source table; the strings must outlive the catalog. */
typedef bool (*ces_catalog_rule_fn)(void *opaque, const char *schema, const char *table,
                                    ces_catalog_rule_t *rule);

typedef struct {
    const char *target;         /* "{schema}.{table}": target table from source names */
    ces_catalog_rule_fn rule_of; /* NULL: no per-table rules */
    void *rule_opaque;
    bool preserve_case;         /* false: ASCII letters of names are lower-cased */
    bool auto_create;           /* create missing tables */
    bool auto_evolve;           /* add missing columns */
    bool lsn_guard;             /* tables carry the version column */
    const char *version_column; /* its name */
    const char *metadata_schema; /* no event may reach it (NULL: "ces2pg") */
} ces_catalog_options_t;

/* Copies the options. Returns NULL when out of memory. Owned by the caller. */
ces_catalog_t *ces_catalog_new(const ces_catalog_options_t *options)
    __attribute__((warn_unused_result));
/* Frees the catalog and every table. Accepts NULL. */
void ces_catalog_destroy(ces_catalog_t *catalog);

/* Forgets every table (they changed underneath): each is read from pg_catalog again when next
 * needed. Tables and descriptions obtained before must not be used afterwards. */
void ces_catalog_forget(ces_catalog_t *catalog);

/*
 * Finds or makes the target table of ev with every column the event needs, running DDL on
 * session's connection when needed (outside any transaction; version_quoted names the version
 * column, ces_metadata_version_quoted). Returns the table (owned by the catalog), or NULL with
 * either e set (database error) or *reject set to the reason the event is dead-lettered (a string
 * that lives until the next call). attempt numbers the batch attempt the event is prepared for
 * (increasing): a table that does not exist and cannot be created is looked for in pg_catalog once
 * per attempt, not once per event, so a table created meanwhile is found by the next attempt.
 * The table's rule chooses ev's columns first (columns.h): ev is changed in place, once (values
 * it converts are allocated from arena, ev's).
 */
ces_catalog_table_t *ces_catalog_ensure(ces_catalog_t *catalog, ces_session_t *session,
                                        const char *version_quoted, ces_event_t *ev,
                                        ces_arena_t *arena,
                                        uint64_t attempt, ces_reject_t *reject, ces_pgerr_t *e)
    __attribute__((warn_unused_result));

/* The table's description (a reference into table). */
const ces_catalog_desc_t *ces_catalog_desc(const ces_catalog_table_t *table);

/* Whether the table's changes go to its target table (false with history = "only"). */
bool ces_catalog_mirrored(const ces_catalog_table_t *table);

/* The table's history table (a rule's history), ready for ev like the table itself; NULL when it
 * keeps none. Owned by the catalog, like the table. */
ces_catalog_table_t *ces_catalog_history(ces_catalog_table_t *table);

/* The index of the table's column for a source column name, or -1. Answers are remembered, so that
 * this costs one hash lookup per column of an event. */
long ces_catalog_resolve_column(ces_catalog_table_t *table, const char *source_name);

/* True the first time an UPD without an old row image is seen for table: the caller warns once. */
bool ces_catalog_note_no_old_image(ces_catalog_table_t *table);

/* The plain-INSERT policy (see the bulk path in bulk.h). Inserts of new keys may go as plain
 * INSERTs in attempt number attempt unless a recent one found its key taken. */
bool ces_catalog_plain_inserts(const ces_catalog_table_t *table, uint64_t attempt);
/* A plain INSERT of table found its key taken in attempt: upserts only, for the next
 * ces_tableplan_upsert_attempts() attempts. */
void ces_catalog_insert_taken(ces_catalog_table_t *table, uint64_t attempt);

#endif
