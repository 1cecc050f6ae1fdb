/*
 * pgcatalog: a target table as pg_catalog describes it, and the DDL that makes or extends it.
 *
 * Reads a table's columns and primary key into its description (ces_catalog_desc_t), creates a
 * missing table from an event's columns with its key, adds the columns a later event carries
 * (never drops or retypes), and adds the version column to a table made before ces2pg. All of it
 * runs on the session's connection outside any transaction (DDL commits on its own); a DDL that
 * races with another session's same DDL counts as done (ces_session_exec_ddl). Names are mapped
 * as tableplan.h says. A table ces2pg creates carries its source's name in its comment
 * (CES_PGCATALOG_MARK), so that a second source whose name maps to the same table is recognised
 * after a restart too. The catalog (catalog.h) decides when each is needed.
 *
 * Every function that returns int returns 0 (or as stated), or -1 with the error in e.
 */
#ifndef CES_PGCATALOG_H
#define CES_PGCATALOG_H

#include <stdbool.h>
#include <stddef.h>

#include "apply/catalog.h"
#include "apply/pgerr.h"
#include "apply/session.h"
#include "format/event.h"

/* What the comment of a table ces2pg made starts with; the source's name follows. */
#define CES_PGCATALOG_MARK "ces2pg source: "

/* How source column names become PostgreSQL names (ces_tableplan_column_name). */
typedef struct {
    bool preserve_case;
    const char *version_column; /* its name (reserved for ces2pg) */
    const char *version_quoted; /* quoted, for CREATE TABLE; NULL: tables get no version column */
    bool history; /* a history table: CES_CATALOG_HISTORY_META first, keyed on the version */
    const char *deleted_quoted; /* soft deletes: the column, made with the table; NULL: none */
} ces_pgcatalog_names_t;

/*
 * Reads the columns and primary key of schema.table (PostgreSQL names) into desc, in place of
 * those it held: cols, ncols (cols has room for *capacity), pk, npk, oid, and version_col, the
 * column named version_column (NULL: none is looked for, version_col stays -1). *source_mark
 * (unless source_mark is NULL) is replaced by the source name of the table's comment when it
 * starts with CES_PGCATALOG_MARK, else NULL (malloc'd, owned by the caller). Returns 1 when the
 * table exists, 0 when it does not, -1 on error (in e; desc then holds what was read so far).
 * What desc holds is freed by ces_pgcatalog_desc_free.
 */
int ces_pgcatalog_read(ces_session_t *session, const char *schema, const char *table,
                       const char *version_column, const char *deleted_column,
                       ces_catalog_desc_t *desc, size_t *capacity, char **source_mark,
                       ces_pgerr_t *e) __attribute__((warn_unused_result));

/* Frees the columns and key ces_pgcatalog_read put in desc (not desc, not its qualified name). */
void ces_pgcatalog_desc_free(ces_catalog_desc_t *desc);

/* Creates schema (a PostgreSQL name) and the table qualified (quoted "schema"."table") with a
 * column for every column ev names (two source names that map alike make one column, the first
 * wins; the catalog refuses such events before), the version column names->version_quoted (NULL:
 * none), ev's pkkey as the primary key, and the comment CES_PGCATALOG_MARK followed by source. A
 * renamed column (a reserved name) is logged. */
int ces_pgcatalog_create(ces_session_t *session, const char *schema, const char *qualified,
                         const ces_pgcatalog_names_t *names, const char *source,
                         const ces_event_t *ev, ces_pgerr_t *e) __attribute__((warn_unused_result));

/* Adds to the table qualified a column for each of the source names missing[0..nmissing), typed
 * from ev (ces_tableplan_new_column_type). A renamed column (a reserved name) is logged. */
int ces_pgcatalog_evolve(ces_session_t *session, const char *qualified,
                         const ces_pgcatalog_names_t *names, const ces_event_t *ev,
                         const char **missing, size_t nmissing, ces_pgerr_t *e)
    __attribute__((warn_unused_result));

/* Adopts the table qualified, made before ces2pg (a backfill): adds the version column
 * version_quoted, where NULL is older than any event. */
int ces_pgcatalog_adopt(ces_session_t *session, const char *qualified, const char *version_quoted,
                        ces_pgerr_t *e) __attribute__((warn_unused_result));

/* Adds to the table qualified the column deleted_quoted (timestamptz) that soft deletes set (a
 * rule's deleted_column), NULL in the rows there are. */
int ces_pgcatalog_add_deleted_column(ces_session_t *session, const char *qualified,
                                     const char *deleted_quoted, ces_pgerr_t *e)
    __attribute__((warn_unused_result));

#endif
