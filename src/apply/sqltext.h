/*
 * sqltext: the text of the statements that apply row changes.
 *
 * From a table description and the two names the version guard needs, it writes an upsert, a
 * plain insert or a delete by primary key, for one row ($1, $2 ... one parameter per value) or for
 * many (bulk: one text[] parameter per value, read with unnest(); see bulk.h). With the version
 * guard (the version-guard semantics are in docs/semantics.md) a change takes effect only
 * when its event is newer than the row, an insert is skipped when a newer delete left a tombstone
 * for its key, and a delete raises its key's tombstone. The value after the row's values is the
 * event's version.
 *
 * No libpq and no I/O: plain text, so that golden files pin every statement shape
 * (tests/fixtures/sql/).
 */
#ifndef CES_SQLTEXT_H
#define CES_SQLTEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "apply/catalog.h"
#include "util/strbuf.h"

/* The names a guarded statement needs besides the table's, quoted for SQL. References. */
typedef struct {
    const char *tombstones; /* the tombstones table (ces_metadata_tombstones) */
    const char *version;    /* the version column (ces_metadata_version_quoted) */
} ces_sqltext_names_t;

/* INSERT ... ON CONFLICT (pk) DO UPDATE of the columns cols[0..n) (indices into t->cols, the key
 * columns among them), appended to sql. */
void ces_sqltext_upsert(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                        const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk);

/* The same INSERT without ON CONFLICT: a taken key fails it with ERRCODE_UNIQUE_VIOLATION. */
void ces_sqltext_insert(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                        const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk);

/* DELETE by primary key; its values are the key columns, in key order. */
void ces_sqltext_delete(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                        const ces_catalog_desc_t *t, bool bulk);

/* Changes appended to the history table t: values 1..5 are a change's version, operation, commit
 * LSN, sequence number and commit time (CES_CATALOG_HISTORY_META), then the values of the columns
 * cols[0..n), a row image; one change in parameters, or (bulk) many in one text[] per value. A
 * version there already (a redelivery) inserts nothing: each change once. */
void ces_sqltext_history(ces_strbuf_t *sql, const ces_catalog_desc_t *t, const long *cols,
                         size_t n, bool bulk);

/* The number of parameters of a statement on t with nvalues values: one more, the version, when
 * the table is guarded. */
int ces_sqltext_nparams(const ces_catalog_desc_t *t, size_t nvalues);

#endif
