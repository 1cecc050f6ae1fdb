#include "apply/pgcatalog.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/tableplan.h"
#include "format/types.h"
#include "util/array.h"
#include "util/log.h"
#include "util/strbuf.h"

static void column_free(ces_catalog_column_t *c) {
    free(c->name);
    free(c->type);
    free(c->cast);
    free(c->quoted);
}

void ces_pgcatalog_desc_free(ces_catalog_desc_t *d) {
    for (size_t i = 0; i < d->ncols; i++)
        column_free(&d->cols[i]);
    free(d->cols);
    free(d->pk);
}

static int add_column(ces_catalog_desc_t *d, size_t *capacity, const char *name, const char *type,
                      const char *cast, const ces_session_t *session) {
    ces_catalog_column_t *cols = CES_ARRAY_RESERVE(d->cols, *capacity, d->ncols + 1, 16);
    if (cols == NULL)
        return -1;
    d->cols = cols;
    ces_catalog_column_t *c = &d->cols[d->ncols++];
    c->name = strdup(name);
    c->type = strdup(type);
    c->cast = strdup(cast);
    c->quoted = ces_session_quote(session, name);
    c->conv = ces_types_conversion(type);
    return c->name && c->type && c->cast && c->quoted ? 0 : -1;
}

int ces_pgcatalog_read(ces_session_t *session, const char *schema, const char *table,
                       const char *version_column, ces_catalog_desc_t *d, size_t *capacity,
                       ces_pgerr_t *e) {
    static const char *sql =
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod),"
        "       array_position(i.indkey::int2[], a.attnum) - array_lower(i.indkey::int2[], 1) + 1,"
        "       format('%I.%I', tn.nspname, ty.typname), c.oid"
        "  FROM pg_catalog.pg_attribute a"
        "  JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
        "  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        "  JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid"
        "  JOIN pg_catalog.pg_namespace tn ON tn.oid = ty.typnamespace"
        "  LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indisprimary"
        " WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')"
        "   AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum";
    PGconn *conn = ces_session_conn(session);
    const char *params[2] = {schema, table};
    PGresult *r = PQexecParams(conn, sql, 2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        ces_pgerr_from_result(e, conn, r, -1);
        PQclear(r);
        return -1;
    }
    for (size_t i = 0; i < d->ncols; i++)
        column_free(&d->cols[i]);
    d->ncols = 0;
    d->npk = 0;
    d->version_col = -1;
    int rows = PQntuples(r);
    free(d->pk);
    d->pk = calloc((size_t)rows + 1, sizeof(size_t));
    if (d->pk == NULL)
        goto nomem;
    for (int row = 0; row < rows; row++) {
        if (add_column(d, capacity, PQgetvalue(r, row, 0), PQgetvalue(r, row, 1),
                       PQgetvalue(r, row, 3), session) != 0)
            goto nomem;
        if (version_column != NULL && strcmp(PQgetvalue(r, row, 0), version_column) == 0)
            d->version_col = row;
        d->oid = (unsigned)strtoul(PQgetvalue(r, row, 4), NULL, 10);
    }
    /* Primary key columns in key order (array_position is the 1-based place in the index). */
    for (int pos = 1; pos <= rows; pos++) {
        for (int row = 0; row < rows; row++) {
            if (!PQgetisnull(r, row, 2) && atoi(PQgetvalue(r, row, 2)) == pos)
                d->pk[d->npk++] = (size_t)row;
        }
    }
    PQclear(r);
    return rows > 0 ? 1 : 0;
nomem:
    PQclear(r);
    ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return -1;
}

/* The type of a new column (ces_tableplan_new_column_type), warning about an unmapped one. */
static void new_column_type(const ces_event_t *ev, const char *source_name, char *buf, size_t size,
                            const char *table_name) {
    const char *unmapped = ces_tableplan_new_column_type(ev, source_name, buf, size);
    if (unmapped != NULL)
        ces_log_warning("table %s: column '%s' has SQL Server type '%s' with no mapping; stored "
                        "as text",
                        table_name, source_name, unmapped);
}

/* Appends the quoted, folded source name; -1 when out of memory. */
static int add_folded_name(ces_strbuf_t *sql, const ces_session_t *session, const char *name,
                           bool preserve_case) {
    char *f = ces_tableplan_fold_name(name, preserve_case);
    char *q = f ? ces_session_quote(session, f) : NULL;
    free(f);
    if (q == NULL)
        return -1;
    ces_strbuf_add(sql, q);
    free(q);
    return 0;
}

/* The column list of CREATE TABLE: every column the event names, two source names that fold
 * alike making one column (the first wins). Returns -1 when out of memory. */
static int add_new_columns(ces_strbuf_t *sql, const ces_session_t *session, const char *qualified,
                           bool preserve_case, const ces_event_t *ev) {
    const char **names = NULL;
    size_t count = 0;
    char **folded = NULL;
    int rc = -1;
    if (ces_tableplan_event_columns(ev, &names, &count) != 0 ||
        (folded = calloc(count + 1, sizeof(char *))) == NULL)
        goto done;
    size_t ncols = 0;
    for (size_t i = 0; i < count; i++) {
        folded[i] = ces_tableplan_fold_name(names[i], preserve_case);
        if (folded[i] == NULL)
            goto done;
        bool dup = false;
        for (size_t j = 0; j < i; j++)
            dup = dup || strcmp(folded[j], folded[i]) == 0;
        if (dup)
            continue;
        char type[64];
        new_column_type(ev, names[i], type, sizeof(type), qualified);
        char *q = ces_session_quote(session, folded[i]);
        if (q == NULL)
            goto done;
        ces_strbuf_add(sql, ncols++ ? ", " : "");
        ces_strbuf_add(sql, q);
        ces_strbuf_add(sql, " ");
        ces_strbuf_add(sql, type);
        free(q);
    }
    rc = 0;
done:
    if (folded != NULL) {
        for (size_t i = 0; i < count; i++)
            free(folded[i]);
    }
    free(folded);
    free(names);
    return rc;
}

/* CREATE SCHEMA and CREATE TABLE from the event's columns, with its pkkey as the primary key.
 * Returns -1 when out of memory. */
static int create_table_sql(ces_strbuf_t *sql, const ces_session_t *session, const char *schema,
                            const char *qualified, const char *version_quoted, bool preserve_case,
                            const ces_event_t *ev) {
    char *quoted = ces_session_quote(session, schema);
    if (quoted == NULL)
        return -1;
    ces_strbuf_add(sql, "CREATE SCHEMA IF NOT EXISTS ");
    ces_strbuf_add(sql, quoted);
    free(quoted);
    ces_strbuf_add(sql, ";\nCREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, qualified);
    ces_strbuf_add(sql, " (");
    if (add_new_columns(sql, session, qualified, preserve_case, ev) != 0)
        return -1;
    if (version_quoted != NULL) {
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, version_quoted);
        ces_strbuf_add(sql, " numeric");
    }
    ces_strbuf_add(sql, ", PRIMARY KEY (");
    for (size_t i = 0; i < ev->npkkey; i++) {
        ces_strbuf_add(sql, i ? ", " : "");
        if (add_folded_name(sql, session, ev->pkkey[i].name, preserve_case) != 0)
            return -1;
    }
    ces_strbuf_add(sql, "))");
    return sql->failed ? -1 : 0;
}

int ces_pgcatalog_create(ces_session_t *session, const char *schema, const char *qualified,
                         const char *version_quoted, bool preserve_case, const ces_event_t *ev,
                         ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    int rc = -1;
    if (create_table_sql(&sql, session, schema, qualified, version_quoted, preserve_case, ev) !=
        0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    } else {
        ces_log_info("creating table %s", qualified);
        rc = ces_session_exec_ddl(session, sql.buf, e);
    }
    ces_strbuf_free(&sql);
    return rc;
}

int ces_pgcatalog_evolve(ces_session_t *session, const char *qualified, bool preserve_case,
                         const ces_event_t *ev, const char **missing, size_t nmissing,
                         ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, qualified);
    for (size_t i = 0; i < nmissing; i++) {
        char type[64];
        new_column_type(ev, missing[i], type, sizeof(type), qualified);
        ces_strbuf_add(&sql, i ? ", ADD COLUMN IF NOT EXISTS " : " ADD COLUMN IF NOT EXISTS ");
        if (add_folded_name(&sql, session, missing[i], preserve_case) != 0) {
            ces_strbuf_free(&sql);
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
        ces_strbuf_add(&sql, " ");
        ces_strbuf_add(&sql, type);
        ces_log_info("table %s: adding column for '%s' (%s)", qualified, missing[i], type);
    }
    int rc = sql.failed ? -1 : ces_session_exec_ddl(session, sql.buf, e);
    if (sql.failed)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    ces_strbuf_free(&sql);
    return rc;
}

int ces_pgcatalog_adopt(ces_session_t *session, const char *qualified, const char *version_quoted,
                        ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, qualified);
    ces_strbuf_add(&sql, " ADD COLUMN IF NOT EXISTS ");
    ces_strbuf_add(&sql, version_quoted);
    ces_strbuf_add(&sql, " numeric");
    ces_log_info("table %s: adding the version column %s", qualified, version_quoted);
    int rc = -1;
    if (sql.failed)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    else
        rc = ces_session_exec_ddl(session, sql.buf, e);
    ces_strbuf_free(&sql);
    return rc;
}
