/*
 * adopt: tables loaded by another tool (bcp, pgloader, Azure Data Factory, COPY) marked with the
 * version of the source snapshot they were copied from (`ces2pg adopt`).
 *
 * CES has no initial snapshot: a replica starts as a copy of the source, taken after an LSN was
 * noted, and the stream from the topic's start is applied over it. Adopting a table at that LSN
 * gives every row whose version is NULL or lower the version ceiling of the LSN
 * (ces_version_ceiling: the LSN followed by twenty nines), so the version guard skips every change
 * committed at or before it (the copy holds them already: a change AT the LSN is one of them) and
 * applies every later one. The version column is added when the table lacks it; a version is
 * never lowered.
 *
 * Rows the copy does not hold need more than a version: a key inserted and deleted before the
 * snapshot has no row to carry one, and its insert would briefly bring the row back. So the table
 * also gets a trigger, ces2pg_adopted, BEFORE INSERT FOR EACH ROW WHEN (the new row's version is at
 * or below the ceiling), whose function (in the metadata schema) returns NULL: the insert is
 * skipped, whoever makes it. It costs one comparison per inserted row; once ces2pg has applied past
 * the LSN it never fires again, and it may be dropped. Adopting again at a later LSN raises it.
 * Each adoption is recorded in the metadata schema's adoptions table (relid, table, LSN, version).
 *
 * Each table is adopted in one transaction of its own. Part of the apply room: it talks to
 * PostgreSQL through a session of its own, for the operator command only.
 */
#ifndef CES_ADOPT_H
#define CES_ADOPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/event.h"
#include "util/token.h"

typedef struct ces_adopt_s ces_adopt_t;

typedef struct {
    const char *conninfo;
    const char *password; /* may be NULL (a secret) */
    const char *metadata_schema;
    const char *version_column;
    ces_token_source_t password_token; /* instead of password when its fetch is set (session.h) */
} ces_adopt_options_t;

/* Connects (no retry), sets the metadata schema up and makes the trigger's function. Returns the
 * adopter, or NULL with errstr set. Owned by the caller. */
ces_adopt_t *ces_adopt_open(const ces_adopt_options_t *options, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_adopt_close(ces_adopt_t *adopt);

/* A table of the database, as --all finds it. Strings are the adopter's, valid during the call. */
typedef struct {
    const char *schema;
    const char *table;
} ces_adopt_table_t;

/* Calls fn for every ordinary or partitioned table (not a partition) of schema, or when schema is
 * NULL of every schema but PostgreSQL's own and the metadata schema, by schema and name. Returns
 * the number of tables, or -1 with errstr set. */
long ces_adopt_each_table(ces_adopt_t *adopt, const char *schema,
                          void (*fn)(void *arg, const ces_adopt_table_t *table), void *arg,
                          char *errstr, size_t errstr_size);

typedef enum {
    CES_ADOPT_OK = 0,
    CES_ADOPT_NO_TABLE,       /* no such table */
    CES_ADOPT_NO_PRIMARY_KEY, /* ces2pg applies nothing to it: not adopted */
    CES_ADOPT_FAILED,         /* PostgreSQL refused (errstr); the table's transaction rolled back */
} ces_adopt_status_t;

/*
 * Adopts schema.table (PostgreSQL's names, as they are) at lsn, in one transaction: the version
 * column added if missing, rows with a NULL or lower version marked with the LSN's ceiling, the
 * trigger at the higher of that ceiling and the table's earlier adoption, the adoption recorded.
 * *marked gets the number of rows marked; *kept_higher is set when an earlier adoption was at a
 * later LSN (its ceiling stays the trigger's).
 */
ces_adopt_status_t ces_adopt_table(ces_adopt_t *adopt, const char *schema, const char *table,
                                   ces_lsn_t lsn, long long *marked, bool *kept_higher,
                                   char *errstr, size_t errstr_size);

#endif
