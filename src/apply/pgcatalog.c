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
                       const char *version_column, const char *deleted_column,
                       ces_catalog_desc_t *d, size_t *capacity, char **source_mark,
                       ces_pgerr_t *e) {
    static const char *sql =
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod),"
        "       array_position(i.indkey::int2[], a.attnum) - array_lower(i.indkey::int2[], 1) + 1,"
        "       format('%I.%I', tn.nspname, ty.typname), c.oid,"
        "       pg_catalog.obj_description(c.oid, 'pg_class')"
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
    d->deleted_col = -1;
    int rows = PQntuples(r);
    if (source_mark != NULL) {
        free(*source_mark);
        *source_mark = NULL;
        const char *comment = rows > 0 && !PQgetisnull(r, 0, 5) ? PQgetvalue(r, 0, 5) : "";
        size_t plen = strlen(CES_PGCATALOG_MARK);
        if (strncmp(comment, CES_PGCATALOG_MARK, plen) == 0 &&
            (*source_mark = strdup(comment + plen)) == NULL)
            goto nomem;
    }
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
        if (deleted_column != NULL && strcmp(PQgetvalue(r, row, 0), deleted_column) == 0)
            d->deleted_col = row;
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

/* Appends the quoted PostgreSQL name of the source column name (ces_tableplan_column_name),
 * saying so when it is renamed and log_rename; -1 when out of memory. */
static int add_column_name(ces_strbuf_t *sql, const ces_session_t *session, const char *qualified,
                           const char *name, const ces_pgcatalog_names_t *names, bool log_rename) {
    bool renamed;
    char *f = ces_tableplan_column_name(name, names->preserve_case, names->version_column,
                                        &renamed);
    if (f != NULL && renamed && log_rename)
        ces_log_warning("table %s: source column '%s' has a name PostgreSQL or ces2pg reserves; "
                        "it is applied as column %s",
                        qualified, name, f);
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
                           const ces_pgcatalog_names_t *cnames, const ces_event_t *ev) {
    const char **names = NULL;
    size_t count = 0;
    char **folded = NULL;
    int rc = -1;
    if (ces_tableplan_event_columns(ev, &names, &count) != 0 ||
        (folded = calloc(count + 1, sizeof(char *))) == NULL)
        goto done;
    size_t ncols = 0;
    for (size_t i = 0; i < count; i++) {
        folded[i] = ces_tableplan_column_name(names[i], cnames->preserve_case,
                                              cnames->version_column, NULL);
        if (folded[i] == NULL)
            goto done;
        bool dup = false;
        for (size_t j = 0; j < i; j++)
            dup = dup || strcmp(folded[j], folded[i]) == 0;
        if (dup)
            continue;
        char type[64];
        new_column_type(ev, names[i], type, sizeof(type), qualified);
        ces_strbuf_add(sql, ncols++ ? ", " : "");
        if (add_column_name(sql, session, qualified, names[i], cnames, true) != 0)
            goto done;
        ces_strbuf_add(sql, " ");
        ces_strbuf_add(sql, type);
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
                            const char *qualified, const ces_pgcatalog_names_t *names,
                            const ces_event_t *ev) {
    const char *version_quoted = names->version_quoted;
    char *quoted = ces_session_quote(session, schema);
    if (quoted == NULL)
        return -1;
    ces_strbuf_add(sql, "CREATE SCHEMA IF NOT EXISTS ");
    ces_strbuf_add(sql, quoted);
    free(quoted);
    /* Not IF NOT EXISTS: when another session made the table meanwhile, the whole statement
     * fails (a DDL race, which counts as done), so that its comment is never overwritten. */
    ces_strbuf_add(sql, ";\nCREATE TABLE ");
    ces_strbuf_add(sql, qualified);
    ces_strbuf_add(sql, " (");
    if (names->history) {
        /* Fixed names, quoted as they are: no event chooses them. */
        ces_strbuf_add(sql, "\"" CES_CATALOG_HISTORY_VERSION "\" numeric PRIMARY KEY, "
                            "\"_ces_operation\" text NOT NULL, \"_ces_commit_lsn\" text NOT NULL, "
                            "\"_ces_sequence\" bigint NOT NULL, \"_ces_commit_time\" timestamptz, "
                            "\"_ces_applied_at\" timestamptz NOT NULL DEFAULT now(), ");
    }
    if (add_new_columns(sql, session, qualified, names, ev) != 0)
        return -1;
    if (names->history) { /* the source's key is no key here: a row per change */
        ces_strbuf_add(sql, ")");
        return sql->failed ? -1 : 0;
    }
    if (version_quoted != NULL) {
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, version_quoted);
        ces_strbuf_add(sql, " numeric");
    }
    if (names->deleted_quoted != NULL) { /* with the table: no reader sees it without */
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, names->deleted_quoted);
        ces_strbuf_add(sql, " timestamptz");
    }
    ces_strbuf_add(sql, ", PRIMARY KEY (");
    for (size_t i = 0; i < ev->npkkey; i++) {
        ces_strbuf_add(sql, i ? ", " : "");
        if (add_column_name(sql, session, qualified, ev->pkkey[i].name, names, false) != 0)
            return -1;
    }
    ces_strbuf_add(sql, "))");
    return sql->failed ? -1 : 0;
}

/* COMMENT ON TABLE with the source mark; -1 when out of memory. */
static int add_mark(ces_strbuf_t *sql, ces_session_t *session, const char *qualified,
                    const char *source) {
    ces_strbuf_t text = {0};
    ces_strbuf_add(&text, CES_PGCATALOG_MARK);
    ces_strbuf_add(&text, source);
    char *literal = text.failed ? NULL
                                : PQescapeLiteral(ces_session_conn(session), text.buf, text.len);
    ces_strbuf_free(&text);
    if (literal == NULL)
        return -1;
    ces_strbuf_add(sql, ";\nCOMMENT ON TABLE ");
    ces_strbuf_add(sql, qualified);
    ces_strbuf_add(sql, " IS ");
    ces_strbuf_add(sql, literal);
    PQfreemem(literal);
    return sql->failed ? -1 : 0;
}

int ces_pgcatalog_create(ces_session_t *session, const char *schema, const char *qualified,
                         const ces_pgcatalog_names_t *names, const char *source,
                         const ces_event_t *ev, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    int rc = -1;
    if (create_table_sql(&sql, session, schema, qualified, names, ev) != 0 ||
        add_mark(&sql, session, qualified, source) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    } else {
        ces_log_info("creating table %s", qualified);
        rc = ces_session_exec_ddl(session, sql.buf, e);
    }
    ces_strbuf_free(&sql);
    return rc;
}

int ces_pgcatalog_evolve(ces_session_t *session, const char *qualified,
                         const ces_pgcatalog_names_t *names, const ces_event_t *ev,
                         const char **missing, size_t nmissing, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, qualified);
    for (size_t i = 0; i < nmissing; i++) {
        char type[64];
        new_column_type(ev, missing[i], type, sizeof(type), qualified);
        ces_strbuf_add(&sql, i ? ", ADD COLUMN IF NOT EXISTS " : " ADD COLUMN IF NOT EXISTS ");
        if (add_column_name(&sql, session, qualified, missing[i], names, true) != 0) {
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

/* ALTER TABLE qualified ADD COLUMN IF NOT EXISTS quoted type, logged as what. */
static int add_own_column(ces_session_t *session, const char *qualified, const char *quoted,
                          const char *type, const char *what, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, qualified);
    ces_strbuf_add(&sql, " ADD COLUMN IF NOT EXISTS ");
    ces_strbuf_add(&sql, quoted);
    ces_strbuf_add(&sql, " ");
    ces_strbuf_add(&sql, type);
    ces_log_info("table %s: adding the %s %s", qualified, what, quoted);
    int rc = -1;
    if (sql.failed)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    else
        rc = ces_session_exec_ddl(session, sql.buf, e);
    ces_strbuf_free(&sql);
    return rc;
}

int ces_pgcatalog_adopt(ces_session_t *session, const char *qualified, const char *version_quoted,
                        ces_pgerr_t *e) {
    return add_own_column(session, qualified, version_quoted, "numeric", "version column", e);
}

int ces_pgcatalog_add_deleted_column(ces_session_t *session, const char *qualified,
                                     const char *deleted_quoted, ces_pgerr_t *e) {
    return add_own_column(session, qualified, deleted_quoted, "timestamptz",
                          "soft-delete column", e);
}
