#include "apply/adopt.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/metadata.h"
#include "apply/pgerr.h"
#include "apply/session.h"
#include "util/strbuf.h"

#define TRIGGER_NAME "ces2pg_adopted"
#define TRIGGER_FUNCTION "skip_insert_older_than_adoption"

struct ces_adopt_s {
    ces_session_t *session;
    ces_metadata_t *metadata;
    char *schema;  /* the metadata schema, unquoted */
    char *version; /* the version column, unquoted */
};

/* Runs sql with text parameters; a result of tuples or a command is returned (the caller's to
 * PQclear), anything else is NULL with PostgreSQL's message in errstr. */
static PGresult *run(ces_adopt_t *a, const char *sql, int nparams, const char *const *params,
                     char *errstr, size_t errstr_size) {
    ces_pgerr_t e = CES_PGERR_INIT;
    PGresult *r = ces_session_query(a->session, sql, nparams, params, &e);
    if (r == NULL)
        snprintf(errstr, errstr_size, "%s", e.message);
    return r;
}

/* The trigger's function: it returns NULL, so the insert it fires for does not happen. */
static int make_function(ces_adopt_t *a, char *errstr, size_t errstr_size) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "CREATE OR REPLACE FUNCTION ");
    ces_strbuf_add(&sql, ces_metadata_schema_quoted(a->metadata));
    ces_strbuf_add(&sql, "." TRIGGER_FUNCTION "() RETURNS trigger LANGUAGE plpgsql AS "
                         "$f$BEGIN RETURN NULL; END$f$");
    ces_pgerr_t e = CES_PGERR_INIT;
    int rc = sql.failed ? -1 : ces_session_exec_ddl(a->session, sql.buf, &e);
    snprintf(errstr, errstr_size, "%s", sql.failed ? "out of memory" : e.message);
    ces_strbuf_free(&sql);
    return rc;
}

ces_adopt_t *ces_adopt_open(const ces_adopt_options_t *o, char *errstr, size_t errstr_size) {
    ces_adopt_t *a = calloc(1, sizeof(*a));
    if (a == NULL || (a->metadata = ces_metadata_new(o->metadata_schema, o->version_column)) ==
                         NULL || (a->schema = strdup(o->metadata_schema)) == NULL ||
        (a->version = strdup(o->version_column)) == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        goto fail;
    }
    if ((a->session = ces_metadata_connect(a->metadata, o->conninfo, o->password, &o->password_token, errstr,
                                           errstr_size)) == NULL)
        goto fail;
    if (make_function(a, errstr, errstr_size) != 0)
        goto fail;
    return a;
fail:
    ces_adopt_close(a);
    return NULL;
}

void ces_adopt_close(ces_adopt_t *a) {
    if (a == NULL)
        return;
    ces_session_destroy(a->session);
    ces_metadata_destroy(a->metadata);
    free(a->schema);
    free(a->version);
    free(a);
}

long ces_adopt_each_table(ces_adopt_t *a, const char *schema,
                          void (*fn)(void *arg, const ces_adopt_table_t *table), void *arg,
                          char *errstr, size_t errstr_size) {
    static const char sql[] =
        "SELECT n.nspname, c.relname"
        "  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
        "   AND n.nspname <> ALL (ARRAY['information_schema', $2])"
        "   AND n.nspname NOT LIKE 'pg\\_%'"
        "   AND ($1::text IS NULL OR n.nspname = $1)"
        " ORDER BY 1, 2";
    const char *params[2] = {schema, a->schema};
    PGresult *r = run(a, sql, 2, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    long n = PQntuples(r);
    for (long i = 0; i < n; i++) {
        ces_adopt_table_t t = {PQgetvalue(r, (int)i, 0), PQgetvalue(r, (int)i, 1)};
        fn(arg, &t);
    }
    PQclear(r);
    return n;
}

/* One adoption: the table's names quoted and what it is marked with. */
typedef struct {
    const char *qualified; /* "schema"."table" */
    const char *name;      /* schema.table, for the record */
    char oid[16];
    bool has_version;
    char ceiling[64]; /* the version ceiling of the LSN (digits) */
    char lsn[23];
    char floor[64]; /* the trigger's: the higher of ceiling and an earlier adoption's (digits) */
} adoption_t;

/* Runs the statement in sql (then emptied); the result is the caller's when keep is given. */
static int step(ces_adopt_t *a, ces_strbuf_t *sql, int nparams, const char *const *params,
                PGresult **keep, char *errstr, size_t errstr_size) {
    if (sql->failed) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    PGresult *r = run(a, sql->buf, nparams, params, errstr, errstr_size);
    ces_strbuf_reset(sql);
    if (r == NULL)
        return -1;
    if (keep != NULL)
        *keep = r;
    else
        PQclear(r);
    return 0;
}

/* The trigger's floor: the ceiling, or an earlier adoption's version when that is higher (its
 * row stays locked until the transaction ends). */
static int choose_floor(ces_adopt_t *a, ces_strbuf_t *sql, adoption_t *ad, bool *kept_higher,
                        char *errstr, size_t errstr_size) {
    ces_strbuf_add(sql, "SELECT greatest($1::numeric, max(version))::text, "
                        "coalesce(max(version) > $1::numeric, false) FROM ");
    ces_strbuf_add(sql, ces_metadata_schema_quoted(a->metadata));
    ces_strbuf_add(sql, ".adoptions WHERE relid = $2::oid");
    const char *params[2] = {ad->ceiling, ad->oid};
    PGresult *r = NULL;
    if (step(a, sql, 2, params, &r, errstr, errstr_size) != 0)
        return -1;
    const char *floor = PQgetvalue(r, 0, 0);
    int rc = strlen(floor) < sizeof(ad->floor) && strspn(floor, "0123456789") == strlen(floor) ? 0
                                                                                               : -1;
    if (rc == 0) {
        snprintf(ad->floor, sizeof(ad->floor), "%s", floor);
        *kept_higher = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
    } else {
        snprintf(errstr, errstr_size, "unexpected version '%.40s' in the adoptions table", floor);
    }
    PQclear(r);
    return rc;
}

/* Appends the strings of a NULL-terminated list: names may be long, ces_strbuf_addf is not. */
static void add_all(ces_strbuf_t *sql, const char *const *parts) {
    for (; *parts != NULL; parts++)
        ces_strbuf_add(sql, *parts);
}

/* The statements of one adoption, inside its transaction. */
static int adopt_steps(ces_adopt_t *a, adoption_t *ad, long long *marked, bool *kept_higher,
                       char *errstr, size_t errstr_size) {
    const char *v = ces_metadata_version_quoted(a->metadata);
    const char *meta = ces_metadata_schema_quoted(a->metadata), *t = ad->qualified;
    ces_strbuf_t sql = {0};
    PGresult *r = NULL;
    int rc = -1;
    /* One adoption of a table at a time, and no insert between the marking and the trigger. */
    add_all(&sql, (const char *[]){"LOCK TABLE ", t, " IN SHARE ROW EXCLUSIVE MODE", NULL});
    if (step(a, &sql, 0, NULL, NULL, errstr, errstr_size) != 0)
        goto done;
    if (!ad->has_version) {
        add_all(&sql, (const char *[]){"ALTER TABLE ", t, " ADD COLUMN IF NOT EXISTS ", v,
                                       " numeric", NULL});
        if (step(a, &sql, 0, NULL, NULL, errstr, errstr_size) != 0)
            goto done;
    }
    if (choose_floor(a, &sql, ad, kept_higher, errstr, errstr_size) != 0)
        goto done;
    add_all(&sql, (const char *[]){"UPDATE ", t, " SET ", v, " = $1::numeric WHERE ", v,
                                   " IS NULL OR ", v, " < $1::numeric", NULL});
    const char *ceiling[1] = {ad->ceiling};
    if (step(a, &sql, 1, ceiling, &r, errstr, errstr_size) != 0)
        goto done;
    *marked = strtoll(PQcmdTuples(r), NULL, 10);
    /* ad->floor is digits only (choose_floor): a literal, as a trigger's WHEN needs. */
    add_all(&sql, (const char *[]){"DROP TRIGGER IF EXISTS " TRIGGER_NAME " ON ", t, NULL});
    if (step(a, &sql, 0, NULL, NULL, errstr, errstr_size) != 0)
        goto done;
    add_all(&sql, (const char *[]){"CREATE TRIGGER " TRIGGER_NAME " BEFORE INSERT ON ", t,
                                   " FOR EACH ROW WHEN (NEW.", v, " <= ", ad->floor,
                                   ") EXECUTE FUNCTION ", meta, "." TRIGGER_FUNCTION "()", NULL});
    if (step(a, &sql, 0, NULL, NULL, errstr, errstr_size) != 0)
        goto done;
    add_all(&sql, (const char *[]){"INSERT INTO ", meta, ".adoptions AS d (relid, table_name, lsn,"
                                   " version) VALUES ($1::oid, $2, $3, $4::numeric) ON CONFLICT "
                                   "(relid) DO UPDATE SET table_name = EXCLUDED.table_name, lsn ="
                                   " EXCLUDED.lsn, version = EXCLUDED.version, adopted_at = now()"
                                   " WHERE d.version < EXCLUDED.version", NULL});
    const char *record[4] = {ad->oid, ad->name, ad->lsn, ad->ceiling};
    rc = step(a, &sql, 4, record, NULL, errstr, errstr_size);
done:
    PQclear(r);
    ces_strbuf_free(&sql);
    return rc;
}

/* The table's oid, primary key and version column, from the catalog. */
static ces_adopt_status_t table_info(ces_adopt_t *a, const char *schema, const char *table,
                                     adoption_t *ad, bool *has_pk, char *errstr,
                                     size_t errstr_size) {
    static const char sql[] =
        "SELECT c.oid, EXISTS (SELECT 1 FROM pg_catalog.pg_index i"
        "                      WHERE i.indrelid = c.oid AND i.indisprimary),"
        "       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute t WHERE t.attrelid = c.oid"
        "                  AND t.attname = $3 AND t.attnum > 0 AND NOT t.attisdropped)"
        "  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')";
    const char *params[3] = {schema, table, a->version};
    PGresult *r = run(a, sql, 3, params, errstr, errstr_size);
    if (r == NULL)
        return CES_ADOPT_FAILED;
    ces_adopt_status_t st = PQntuples(r) == 1 ? CES_ADOPT_OK : CES_ADOPT_NO_TABLE;
    if (st == CES_ADOPT_OK) {
        snprintf(ad->oid, sizeof(ad->oid), "%s", PQgetvalue(r, 0, 0));
        *has_pk = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
        ad->has_version = strcmp(PQgetvalue(r, 0, 2), "t") == 0;
    }
    PQclear(r);
    return st;
}

/* "schema"."table", quoted for the session; NULL when out of memory. */
static char *qualified_name(const ces_adopt_t *a, const char *schema, const char *table) {
    char *qs = ces_session_quote(a->session, schema), *qt = ces_session_quote(a->session, table);
    char *q = NULL;
    if (qs != NULL && qt != NULL && asprintf(&q, "%s.%s", qs, qt) < 0)
        q = NULL;
    free(qs);
    free(qt);
    return q;
}

ces_adopt_status_t ces_adopt_table(ces_adopt_t *a, const char *schema, const char *table,
                                   ces_lsn_t lsn, long long *marked, bool *kept_higher,
                                   char *errstr, size_t errstr_size) {
    adoption_t ad = {0};
    bool has_pk = false;
    char *name = NULL;
    *marked = 0;
    *kept_higher = false;
    ces_adopt_status_t st = table_info(a, schema, table, &ad, &has_pk, errstr, errstr_size);
    if (st == CES_ADOPT_OK && !has_pk)
        st = CES_ADOPT_NO_PRIMARY_KEY;
    if (st != CES_ADOPT_OK)
        return st;
    char *qualified = qualified_name(a, schema, table);
    if (qualified == NULL || asprintf(&name, "%s.%s", schema, table) < 0) {
        name = NULL;
        snprintf(errstr, errstr_size, "out of memory");
        st = CES_ADOPT_FAILED;
        goto done;
    }
    ad.qualified = qualified;
    ad.name = name;
    ces_version_ceiling(lsn, ad.ceiling, sizeof(ad.ceiling));
    ces_lsn_format(lsn, ad.lsn);
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_session_exec(a->session, "BEGIN", &e) != 0) {
        snprintf(errstr, errstr_size, "%s", e.message);
        st = CES_ADOPT_FAILED;
    } else if (adopt_steps(a, &ad, marked, kept_higher, errstr, errstr_size) != 0) {
        if (ces_session_exec(a->session, "ROLLBACK", &e) != 0)
            ces_session_disconnect(a->session); /* whatever it held is rolled back with it */
        *marked = 0;
        st = CES_ADOPT_FAILED;
    } else if (ces_session_exec(a->session, "COMMIT", &e) != 0) {
        snprintf(errstr, errstr_size, "%s", e.message);
        *marked = 0;
        st = CES_ADOPT_FAILED;
    }
done:
    free(qualified);
    free(name);
    return st;
}
