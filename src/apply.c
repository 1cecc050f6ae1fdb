#include "apply.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "janitor.h"
#include "log.h"
#include "map.h"
#include "metadata.h"
#include "pgerr.h"
#include "positions.h"
#include "session.h"
#include "strbuf.h"
#include "types.h"

/* Statements sent between two pipeline syncs. Their results (a few dozen bytes each) must fit in
 * the socket buffers, because nothing reads them until the sync: 256 keeps that far below 64 KB. */
#define PIPELINE_CHUNK 256
#define PG_NAME_MAX 63 /* NAMEDATALEN - 1: PostgreSQL truncates longer identifiers */

typedef struct {
    char *name;
    uint64_t epoch; /* the session epoch it was prepared in; 0: not prepared (its Parse failed) */
} stmt_t;

/* A column of a target table, as the catalog describes it. */
typedef struct {
    char *name;   /* PostgreSQL name */
    char *type;   /* format_type() with the modifier, e.g. character varying(50) */
    char *cast;   /* the type without modifier, schema-qualified: what a parameter is cast to */
    char *quoted; /* name quoted for SQL */
    ces_conv_t conv;
} column_t;

static void column_free(column_t *c) {
    free(c->name);
    free(c->type);
    free(c->cast);
    free(c->quoted);
}

/* The tag lets an error record (pgerr.h) refer to the table whose plain INSERT found its key taken. */
typedef struct ces_catalog_table_s {
    unsigned id;
    char *qualified; /* quoted "schema"."table" */
    char *pg_schema;
    char *pg_table;
    size_t ncols;
    size_t capacity;
    column_t *cols; /* in attnum order */
    ces_map_t *by_source; /* source column name -> index + 1 */
    size_t npk;
    size_t *pk; /* column indices of the primary key, in key order */
    bool loaded; /* columns read from the catalog */
    bool preserve_case;
    bool warned_no_old_image;
    ces_map_t *type_checks; /* "column\x1ftype" -> 1 compatible, 2 conflict */
    char reject_reason[300];
    unsigned oid;      /* of the table: tombstones name it */
    long version_col;  /* index of the version column, -1 when absent */
    bool warned_no_pk;
    /* Inserts of new keys go as plain INSERTs (see the bulk path) from attempt number
     * upsert_until on; insert_conflicts counts the times one found its key taken. */
    uint64_t upsert_until;
    unsigned insert_conflicts;
} table_t;

struct ces_apply_s {
    ces_session_t *session;
    ces_metadata_t *metadata;
    ces_positions_t *positions;
    ces_janitor_t *janitor;
    bool auto_create;
    bool auto_evolve;
    ces_map_t *tables; /* "db\x1fschema\x1ftable" -> table_t */
    ces_map_t *stmts;  /* signature -> stmt_t */
    unsigned next_table_id;
    unsigned next_stmt_id;
    uint64_t stream_epoch; /* the session epoch a streamed transaction began in; 0: none */
    bool lsn_guard;
    bool preserve_case;
    char *target_schema; /* schema.target before its dot, e.g. "{schema}" */
    char *target_table;  /* ... and after it, e.g. "{table}" */
    char *version_column;
    struct async_s *async; /* a batch sent by ces_apply_send, not finished yet */
    uint64_t attempts;     /* attempts begun: the clock of table_t.upsert_until */
};

static void async_free(struct async_s *as);

/* ---------------------------------------------------------------------------------------------- */

/* Lower-cases ASCII letters (as PostgreSQL does for unquoted names) and clips to 63 bytes without
 * splitting a UTF-8 character. Returns a malloc'd string. */
static char *fold_name(const char *name, bool preserve_case) {
    size_t len = strlen(name);
    if (len > PG_NAME_MAX) {
        len = PG_NAME_MAX;
        while (len > 0 && ((unsigned char)name[len] & 0xC0) == 0x80)
            len--;
    }
    char *out = malloc(len + 1);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i++)
        out[i] = (!preserve_case && name[i] >= 'A' && name[i] <= 'Z') ? (char)(name[i] + 32)
                                                                      : name[i];
    out[len] = '\0';
    return out;
}

/* Returns a malloc'd copy of s where every byte that is not part of valid UTF-8 is '?', so that
 * messages built from untrusted names can be stored as text. */
static char *utf8_sanitize(const char *s) {
    size_t len = strlen(s);
    char *out = malloc(len + 1);
    if (out == NULL)
        return NULL;
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++)
            ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok) {
            memcpy(out + i, s + i, n);
            i += n;
        } else {
            out[i++] = '?';
        }
    }
    out[len] = '\0';
    return out;
}

/* ---------------------------------------------------------------------------------------------- */

static void table_free(void *value, void *arg) {
    (void)arg;
    table_t *t = value;
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->ncols; i++)
        column_free(&t->cols[i]);
    free(t->cols);
    free(t->pk);
    ces_map_destroy(t->by_source);
    ces_map_destroy(t->type_checks);
    free(t->qualified);
    free(t->pg_schema);
    free(t->pg_table);
    free(t);
}

static void stmt_free(void *value, void *arg) {
    (void)arg;
    stmt_t *s = value;
    free(s->name);
    free(s);
}

/* A streamed transaction is open while the connection it began on is. */
static bool stream_open(const ces_apply_t *a) {
    return a->stream_epoch != 0 && a->stream_epoch == ces_session_epoch(a->session);
}

static ces_apply_status_t ensure_connected(ces_apply_t *a, char *errstr, size_t errstr_size) {
    switch (ces_session_ensure_connected(a->session, errstr, errstr_size)) {
    case CES_SESSION_OK:
        return CES_APPLY_OK;
    case CES_SESSION_INTERRUPTED:
        return CES_APPLY_INTERRUPTED;
    case CES_SESSION_FATAL:
        break;
    }
    return CES_APPLY_FATAL;
}

/* Every new connection: the metadata schema, and the statements that name it. */
static int on_connect(void *opaque, ces_session_t *session, ces_pgerr_t *e) {
    ces_apply_t *a = opaque;
    if (ces_metadata_setup(a->metadata, session, e) != 0)
        return -1;
    if (ces_positions_set_schema(a->positions, ces_metadata_schema_quoted(a->metadata)) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    return 0;
}

ces_apply_t *ces_apply_new(const ces_apply_options_t *o) {
    ces_apply_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    ces_session_options_t session = {.conninfo = o->conninfo,
                                     .password = o->password,
                                     .retry_max_ms = o->retry_max_ms,
                                     .stop_now = o->stop_now,
                                     .heartbeat = o->heartbeat,
                                     .heartbeat_opaque = o->heartbeat_opaque,
                                     .on_connect = on_connect,
                                     .on_connect_opaque = a};
    a->session = ces_session_new(&session);
    a->metadata = ces_metadata_new(o->metadata_schema,
                                   o->version_column ? o->version_column : "_ces_lsn");
    a->positions = ces_positions_new(o->group_id ? o->group_id : "");
    a->janitor = ces_janitor_new(o->lsn_guard, o->tombstone_retention_s);
    a->auto_create = o->auto_create;
    a->auto_evolve = o->auto_evolve;
    a->lsn_guard = o->lsn_guard;
    a->preserve_case = o->preserve_case;
    const char *target = o->target ? o->target : "{schema}.{table}";
    const char *dot = strchr(target, '.');
    a->target_schema = dot ? strndup(target, (size_t)(dot - target)) : strdup("public");
    a->target_table = strdup(dot ? dot + 1 : target);
    a->version_column = strdup(o->version_column ? o->version_column : "_ces_lsn");
    a->tables = ces_map_new();
    a->stmts = ces_map_new();
    if (!a->session || !a->metadata || !a->positions || !a->janitor || !a->tables || !a->stmts ||
        !a->version_column || !a->target_schema || !a->target_table) {
        ces_apply_destroy(a);
        return NULL;
    }
    return a;
}

void ces_apply_destroy(ces_apply_t *a) {
    if (a == NULL)
        return;
    async_free(a->async);
    ces_session_destroy(a->session);
    if (a->tables != NULL)
        ces_map_clear(a->tables, table_free, NULL);
    if (a->stmts != NULL)
        ces_map_clear(a->stmts, stmt_free, NULL);
    ces_map_destroy(a->tables);
    ces_map_destroy(a->stmts);
    ces_metadata_destroy(a->metadata);
    ces_positions_destroy(a->positions);
    ces_janitor_destroy(a->janitor);
    free(a->version_column);
    free(a->target_schema);
    free(a->target_table);
    free(a);
}

bool ces_apply_connected(const ces_apply_t *a) { return ces_session_connected(a->session); }

bool ces_apply_check(ces_apply_t *a) {
    if (a->async != NULL)
        return ces_apply_connected(a);
    return ces_session_check(a->session, stream_open(a));
}

ces_apply_status_t ces_apply_start(ces_apply_t *a, char *errstr, size_t errstr_size) {
    return ensure_connected(a, errstr, errstr_size);
}

ces_apply_status_t ces_apply_read_offsets(ces_apply_t *a, const char *topic,
                                          const int32_t *partitions, size_t n, int64_t *offsets,
                                          char *errstr, size_t errstr_size) {
    for (size_t i = 0; i < n; i++)
        offsets[i] = -1;
    for (;;) {
        ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
        if (st != CES_APPLY_OK)
            return st;
        ces_pgerr_t e = CES_PGERR_INIT;
        if (ces_positions_read(a->positions, a->session, topic, partitions, n, offsets, &e) == 0)
            return CES_APPLY_OK;
        if (e.cls != CES_PGERR_RETRY) {
            snprintf(errstr, errstr_size, "reading stored offsets: %s", e.message);
            return CES_APPLY_FATAL;
        }
        ces_log_warning("reading stored offsets: %s (retrying)", e.message);
        ces_session_disconnect(a->session);
        if (ces_session_backoff_sleep(a->session, ces_session_backoff_next(a->session)) != 0) {
            snprintf(errstr, errstr_size, "stopped while waiting for PostgreSQL");
            return CES_APPLY_INTERRUPTED;
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Target tables                                                                                  */

static int table_add_column(table_t *t, const char *name, const char *type, const char *cast,
                            const ces_session_t *session) {
    if (t->ncols == t->capacity) {
        size_t cap = t->capacity ? t->capacity * 2 : 16;
        column_t *cols = realloc(t->cols, cap * sizeof(*cols));
        if (cols == NULL)
            return -1;
        t->cols = cols;
        t->capacity = cap;
    }
    column_t *c = &t->cols[t->ncols++];
    c->name = strdup(name);
    c->type = strdup(type);
    c->cast = strdup(cast);
    c->quoted = ces_session_quote(session, name);
    c->conv = ces_types_conversion(type);
    return c->name && c->type && c->cast && c->quoted ? 0 : -1;
}

static long table_column_index(const table_t *t, const char *pg_name) {
    for (size_t i = 0; i < t->ncols; i++) {
        if (strcmp(t->cols[i].name, pg_name) == 0)
            return (long)i;
    }
    return -1;
}

/* Reads the table's columns and primary key from the catalog. Returns 1 when the table exists, 0
 * when it does not, -1 on error (in e). */
static int table_load(ces_apply_t *a, table_t *t, ces_pgerr_t *e) {
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
    const char *params[2] = {t->pg_schema, t->pg_table};
    PGresult *r = PQexecParams(ces_session_conn(a->session), sql, 2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        ces_pgerr_from_result(e, ces_session_conn(a->session), r, -1);
        PQclear(r);
        return -1;
    }
    for (size_t i = 0; i < t->ncols; i++)
        column_free(&t->cols[i]);
    t->ncols = 0;
    t->npk = 0;
    t->version_col = -1;
    ces_map_clear(t->by_source, NULL, NULL);
    ces_map_clear(t->type_checks, NULL, NULL);
    int rows = PQntuples(r);
    free(t->pk);
    t->pk = calloc((size_t)rows + 1, sizeof(size_t));
    if (t->pk == NULL)
        goto nomem;
    for (int row = 0; row < rows; row++) {
        if (table_add_column(t, PQgetvalue(r, row, 0), PQgetvalue(r, row, 1),
                             PQgetvalue(r, row, 3), a->session) != 0)
            goto nomem;
        if (a->lsn_guard && strcmp(PQgetvalue(r, row, 0), a->version_column) == 0)
            t->version_col = row;
        t->oid = (unsigned)strtoul(PQgetvalue(r, row, 4), NULL, 10);
    }
    /* Primary key columns in key order (array_position is the 1-based place in the index). */
    for (int pos = 1; pos <= rows; pos++) {
        for (int row = 0; row < rows; row++) {
            if (!PQgetisnull(r, row, 2) && atoi(PQgetvalue(r, row, 2)) == pos)
                t->pk[t->npk++] = (size_t)row;
        }
    }
    PQclear(r);
    return rows > 0 ? 1 : 0;
nomem:
    PQclear(r);
    ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return -1;
}

/* The SQL Server type announced for a source column, or NULL. */
static const char *source_type(const ces_event_t *ev, const char *name) {
    for (size_t i = 0; i < ev->ncols; i++) {
        if (strcmp(ev->cols[i].name, name) == 0)
            return ev->cols[i].type;
    }
    return NULL;
}

static void pg_type_for(const ces_event_t *ev, const char *source_name, char *buf, size_t size,
                        const char *table_name) {
    const char *type = source_type(ev, source_name);
    if (type == NULL) {
        snprintf(buf, size, "text");
        return;
    }
    if (!ces_types_map(type, buf, size))
        ces_log_warning("table %s: column '%s' has SQL Server type '%s' with no mapping; stored "
                        "as text",
                        table_name, source_name, type);
}

/* Source names of every column the event mentions: cols, pkkey, current, old. */
typedef struct {
    const char **names;
    size_t count;
} namelist_t;

static int namelist_add(namelist_t *l, const char *name) {
    for (size_t i = 0; i < l->count; i++) {
        if (strcmp(l->names[i], name) == 0)
            return 0;
    }
    const char **n = realloc(l->names, (l->count + 1) * sizeof(char *));
    if (n == NULL)
        return -1;
    l->names = n;
    l->names[l->count++] = name;
    return 0;
}

static int event_column_names(const ces_event_t *ev, namelist_t *l) {
    for (size_t i = 0; i < ev->ncols; i++)
        if (namelist_add(l, ev->cols[i].name) != 0)
            return -1;
    for (size_t i = 0; i < ev->npkkey; i++)
        if (namelist_add(l, ev->pkkey[i].name) != 0)
            return -1;
    for (size_t i = 0; i < ev->ncurrent; i++)
        if (namelist_add(l, ev->current[i].name) != 0)
            return -1;
    for (size_t i = 0; i < ev->nold; i++)
        if (namelist_add(l, ev->old[i].name) != 0)
            return -1;
    return 0;
}

/* CREATE TABLE from the event's columns, with its pkkey as the primary key. */
static int table_create(ces_apply_t *a, table_t *t, const ces_event_t *ev, ces_pgerr_t *e) {
    namelist_t names = {0};
    ces_strbuf_t sql = {0};
    char **folded = NULL;
    int rc = -1;
    char *schema = ces_session_quote(a->session, t->pg_schema);
    if (schema == NULL || event_column_names(ev, &names) != 0)
        goto nomem;
    folded = calloc(names.count + 1, sizeof(char *));
    if (folded == NULL)
        goto nomem;
    ces_strbuf_add(&sql, "CREATE SCHEMA IF NOT EXISTS ");
    ces_strbuf_add(&sql, schema);
    ces_strbuf_add(&sql, ";\nCREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(&sql, t->qualified);
    ces_strbuf_add(&sql, " (");
    size_t ncols = 0;
    for (size_t i = 0; i < names.count; i++) {
        folded[i] = fold_name(names.names[i], a->preserve_case);
        if (folded[i] == NULL)
            goto nomem;
        bool dup = false;
        for (size_t j = 0; j < i; j++)
            dup = dup || strcmp(folded[j], folded[i]) == 0;
        if (dup)
            continue; /* two source names that fold alike: the first one wins */
        char type[64];
        pg_type_for(ev, names.names[i], type, sizeof(type), t->qualified);
        char *q = ces_session_quote(a->session, folded[i]);
        if (q == NULL)
            goto nomem;
        ces_strbuf_add(&sql, ncols++ ? ", " : "");
        ces_strbuf_add(&sql, q);
        ces_strbuf_add(&sql, " ");
        ces_strbuf_add(&sql, type);
        free(q);
    }
    if (a->lsn_guard) {
        ces_strbuf_add(&sql, ", ");
        ces_strbuf_add(&sql, ces_metadata_version_quoted(a->metadata));
        ces_strbuf_add(&sql, " numeric");
    }
    ces_strbuf_add(&sql, ", PRIMARY KEY (");
    for (size_t i = 0; i < ev->npkkey; i++) {
        char *f = fold_name(ev->pkkey[i].name, a->preserve_case);
        char *q = f ? ces_session_quote(a->session, f) : NULL;
        free(f);
        if (q == NULL)
            goto nomem;
        ces_strbuf_add(&sql, i ? ", " : "");
        ces_strbuf_add(&sql, q);
        free(q);
    }
    ces_strbuf_add(&sql, "))");
    if (sql.failed)
        goto nomem;
    ces_log_info("creating table %s", t->qualified);
    if (ces_session_exec_ddl(a->session, sql.buf, e) != 0)
        goto done;
    rc = 0;
    goto done;
nomem:
    ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
done:
    if (folded != NULL) {
        for (size_t i = 0; i < names.count; i++)
            free(folded[i]);
    }
    free(folded);
    free(names.names);
    free(sql.buf);
    free(schema);
    return rc;
}

/* Adds the event's columns that the table lacks (never drops or retypes). */
static int table_evolve(ces_apply_t *a, table_t *t, const ces_event_t *ev, const char **missing,
                        size_t nmissing, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, t->qualified);
    for (size_t i = 0; i < nmissing; i++) {
        char type[64];
        pg_type_for(ev, missing[i], type, sizeof(type), t->qualified);
        char *f = fold_name(missing[i], a->preserve_case);
        char *q = f ? ces_session_quote(a->session, f) : NULL;
        free(f);
        if (q == NULL) {
            free(sql.buf);
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
        ces_strbuf_add(&sql, i ? ", ADD COLUMN IF NOT EXISTS " : " ADD COLUMN IF NOT EXISTS ");
        ces_strbuf_add(&sql, q);
        ces_strbuf_add(&sql, " ");
        ces_strbuf_add(&sql, type);
        free(q);
        ces_log_info("table %s: adding column for '%s' (%s)", t->qualified, missing[i], type);
    }
    int rc = sql.failed ? -1 : ces_session_exec_ddl(a->session, sql.buf, e);
    if (sql.failed)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    free(sql.buf);
    return rc;
}

/* Maps a source column name to the table's column index, remembering the answer. -1: none. */
static long resolve_column(table_t *t, const char *source_name) {
    uintptr_t v = (uintptr_t)ces_map_get(t->by_source, source_name, strlen(source_name));
    if (v != 0)
        return (long)v - 1;
    char *f = fold_name(source_name, t->preserve_case);
    if (f == NULL)
        return -1;
    long idx = table_column_index(t, f);
    free(f);
    if (idx >= 0)
        ces_map_put(t->by_source, source_name, strlen(source_name), (void *)(uintptr_t)(idx + 1));
    return idx;
}

/* Replaces {db}, {schema} and {table} in one part of schema.target with the event's source names.
 * Returns a malloc'd string. */
static char *expand_target(const char *pattern, const ces_event_t *ev) {
    ces_strbuf_t out = {0};
    for (const char *p = pattern; *p;) {
        if (strncmp(p, "{db}", 4) == 0) {
            ces_strbuf_add(&out, ev->db);
            p += 4;
        } else if (strncmp(p, "{schema}", 8) == 0) {
            ces_strbuf_add(&out, ev->schema);
            p += 8;
        } else if (strncmp(p, "{table}", 7) == 0) {
            ces_strbuf_add(&out, ev->table);
            p += 7;
        } else {
            char c[2] = {*p++, '\0'};
            ces_strbuf_add(&out, c);
        }
    }
    if (out.buf == NULL && !out.failed)
        return strdup("");
    if (out.failed) {
        free(out.buf);
        return NULL;
    }
    return out.buf;
}

/*
 * A source column whose type no longer fits its target column (say int became nvarchar) is a type
 * conflict: columns are never retyped, so the event is dead-lettered. Verdicts are cached per
 * (column, type); each conflict is logged once.
 */
static bool type_conflict(table_t *t, const ces_event_t *ev, const char **reject) {
    /* Events of a table mostly repeat the same column list: judge each distinct list once. */
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < ev->ncols; i++) {
        for (const char *p = ev->cols[i].name; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        h = (h ^ 0x1f) * 1099511628211ULL;
        for (const char *p = ev->cols[i].type; *p; p++)
            h = (h ^ (unsigned char)*p) * 1099511628211ULL;
        h = (h ^ 0x1e) * 1099511628211ULL;
    }
    char list_key[1 + sizeof(h)] = {'L'};
    memcpy(list_key + 1, &h, sizeof(h));
    if (ces_map_get(t->type_checks, list_key, sizeof(list_key)) != NULL)
        return false;
    for (size_t i = 0; i < ev->ncols; i++) {
        const ces_column_t *c = &ev->cols[i];
        char key[1100];
        int klen = snprintf(key, sizeof(key), "%s\x1f%s", c->name, c->type);
        if (klen < 0 || (size_t)klen >= sizeof(key))
            continue;
        uintptr_t verdict = (uintptr_t)ces_map_get(t->type_checks, key, (size_t)klen);
        if (verdict == 0) {
            long col = resolve_column(t, c->name);
            char mapped[64];
            ces_types_map(c->type, mapped, sizeof(mapped));
            const char *cast = col >= 0 ? t->cols[col].cast : "";
            const char *typname = strrchr(cast, '.') ? strrchr(cast, '.') + 1 : cast;
            verdict = col < 0 || ces_types_compatible(typname, mapped) ? 1 : 2;
            if (verdict == 2)
                ces_log_warning("table %s: type conflict: column %s is %s in PostgreSQL, but the "
                                "source now sends %s; its events go to the dead-letter table",
                                t->qualified, t->cols[col].name, t->cols[col].type, c->type);
            if (ces_map_put(t->type_checks, key, (size_t)klen, (void *)verdict) != 0)
                return false; /* out of memory: check again next time */
        }
        if (verdict == 2) {
            snprintf(t->reject_reason, sizeof(t->reject_reason),
                     "type conflict: source column '%.128s' is %.40s, which its target column "
                     "cannot hold (columns are never retyped)",
                     c->name, c->type);
            *reject = t->reject_reason;
            return true;
        }
    }
    ces_map_put(t->type_checks, list_key, sizeof(list_key), (void *)1); /* no memory: ask again */
    return false;
}

static bool fields_known(table_t *t, const ces_field_t *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (resolve_column(t, fields[i].name) < 0)
            return false;
    }
    return true;
}

static bool all_columns_known(table_t *t, const ces_event_t *ev) {
    for (size_t i = 0; i < ev->ncols; i++) {
        if (resolve_column(t, ev->cols[i].name) < 0)
            return false;
    }
    return fields_known(t, ev->pkkey, ev->npkkey) && fields_known(t, ev->current, ev->ncurrent) &&
           fields_known(t, ev->old, ev->nold);
}

static table_t *table_new(ces_apply_t *a, const ces_event_t *ev) {
    table_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->id = ++a->next_table_id;
    t->by_source = ces_map_new();
    t->type_checks = ces_map_new();
    t->preserve_case = a->preserve_case;
    char *schema = expand_target(a->target_schema, ev);
    char *table = expand_target(a->target_table, ev);
    t->pg_schema = schema ? fold_name(schema, a->preserve_case) : NULL;
    t->pg_table = table ? fold_name(table, a->preserve_case) : NULL;
    free(schema);
    free(table);
    char *qs = t->pg_schema ? ces_session_quote(a->session, t->pg_schema) : NULL;
    char *qt = t->pg_table ? ces_session_quote(a->session, t->pg_table) : NULL;
    if (qs && qt && t->by_source && t->type_checks) {
        t->qualified = malloc(strlen(qs) + strlen(qt) + 2);
        if (t->qualified)
            sprintf(t->qualified, "%s.%s", qs, qt);
    }
    free(qs);
    free(qt);
    if (t->qualified == NULL) {
        table_free(t, NULL);
        return NULL;
    }
    return t;
}

/*
 * Finds or makes the target table of ev with every column the event needs. Returns the table, or
 * NULL with either e set (database error) or *reject set to a reason the event is dead-lettered.
 */
static table_t *ensure_table(ces_apply_t *a, const ces_event_t *ev, const char **reject,
                             ces_pgerr_t *e) {
    /* Names are bounded by the decoder, so the key is never cut. */
    char key[3 * (CES_DECODE_MAX_NAME_BYTES + 1)];
    const char *parts[] = {ev->db, ev->schema, ev->table};
    size_t klen = ces_map_key(key, sizeof(key), '\x1f', parts, 3);
    table_t *t = ces_map_get(a->tables, key, klen);
    bool fresh = false;
    if (t == NULL) {
        t = table_new(a, ev);
        if (t == NULL || ces_map_put(a->tables, key, klen, t) != 0) {
            table_free(t, NULL);
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return NULL;
        }
    }
    if (!t->loaded) {
        int exists = table_load(a, t, e);
        if (exists < 0)
            return NULL;
        if (exists == 0) {
            if (ev->npkkey == 0)
                goto no_pk;
            if (!a->auto_create) {
                *reject = "target table does not exist and schema.auto_create is off";
                return NULL;
            }
            if (table_create(a, t, ev, e) != 0)
                return NULL;
            int created = table_load(a, t, e);
            if (created == 0)
                ces_pgerr_set(e, CES_PGERR_STALE, -1, NULL, "table %s vanished after it was created",
                          t->qualified);
            if (created <= 0)
                return NULL;
        }
        if (a->lsn_guard && t->version_col < 0) {
            /* A table made before ces2pg (a backfill) is adopted: NULL is older than any event. */
            ces_strbuf_t sql = {0};
            ces_strbuf_add(&sql, "ALTER TABLE ");
            ces_strbuf_add(&sql, t->qualified);
            ces_strbuf_add(&sql, " ADD COLUMN IF NOT EXISTS ");
            ces_strbuf_add(&sql, ces_metadata_version_quoted(a->metadata));
            ces_strbuf_add(&sql, " numeric");
            ces_log_info("table %s: adding the version column %s", t->qualified, ces_metadata_version_quoted(a->metadata));
            int rc = sql.failed ? -1 : ces_session_exec_ddl(a->session, sql.buf, e);
            free(sql.buf);
            if (rc != 0 || table_load(a, t, e) < 0)
                return NULL;
        }
        t->loaded = true;
        fresh = true;
    }
    if (t->npk == 0)
        goto no_pk;

    /* The common case, cheaply: every column the event names is known (hash lookups only). */
    if (all_columns_known(t, ev))
        return type_conflict(t, ev, reject) ? NULL : t;

    /* Columns this event needs that the table does not have yet. */
    namelist_t names = {0};
    const char **missing = NULL;
    size_t nmissing = 0;
    if (event_column_names(ev, &names) != 0)
        goto nomem;
    missing = calloc(names.count + 1, sizeof(char *));
    if (missing == NULL) {
        free(names.names);
        goto nomem;
    }
    for (size_t i = 0; i < names.count; i++) {
        if (resolve_column(t, names.names[i]) < 0)
            missing[nmissing++] = names.names[i];
    }
    free(names.names);
    if (nmissing > 0) {
        if (!a->auto_evolve) {
            free(missing);
            *reject = "the event has columns the target table lacks and schema.auto_evolve is off";
            return NULL;
        }
        int rc = fresh ? 0 : table_load(a, t, e); /* someone else may have added them */
        if (rc >= 0) {
            size_t still = 0;
            for (size_t i = 0; i < nmissing; i++) {
                if (resolve_column(t, missing[i]) < 0)
                    missing[still++] = missing[i];
            }
            nmissing = still;
            if (nmissing > 0 && (table_evolve(a, t, ev, missing, nmissing, e) != 0 ||
                                 table_load(a, t, e) < 0))
                rc = -1;
        }
        for (size_t i = 0; rc >= 0 && i < nmissing; i++) {
            if (resolve_column(t, missing[i]) < 0)
                *reject = "a column of the event could not be added to the target table";
        }
        free(missing);
        if (rc < 0 || *reject != NULL)
            return NULL;
    } else {
        free(missing);
    }
    if (!type_conflict(t, ev, reject))
        return t;
    return NULL;
no_pk:
    if (!t->warned_no_pk) {
        ces_log_warning("table %s.%s.%s has no primary key: its events go to the dead-letter table",
                        ev->db, ev->schema, ev->table);
        t->warned_no_pk = true;
    }
    *reject = "table has no primary key (ces2pg applies changes by primary key)";
    return NULL;
nomem:
    ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* Sending a batch through the pipeline                                                           */

typedef enum {
    PEND_OTHER,
    PEND_PREPARE,
    PEND_ROW,
    PEND_BULK,
    PEND_DEAD_LETTER,
    PEND_OFFSET,
    PEND_COMMIT
} pend_kind_t;

typedef struct {
    pend_kind_t kind;
    long item; /* batch index, or offset index for PEND_OFFSET */
    stmt_t *stmt;
    table_t *inserted; /* a bulk plain INSERT: its table */
} pending_t;

/*
 * The bulk path. Row changes of one table with the same shape (upserts of one column list, or
 * deletes) are gathered and sent as one statement whose parameters are arrays, one per column,
 * read with unnest(): PostgreSQL plans and executes once for up to BULK_MAX_ROWS rows instead of
 * once per row, which is most of its cost for small rows.
 *
 * Only the order of changes to one key matters (different keys, or tables, commute inside one
 * transaction). So the n-th change of a key in a batch goes to a group of generation n, and groups
 * are sent generation after generation: the changes of every key keep their order, however the
 * groups are cut. After BULK_MAX_GENERATIONS changes of one key everything waiting is sent. A bulk
 * statement that PostgreSQL rejects as bad data cannot say which row was bad: the batch is then
 * retried row by row, where the row is found and dead-lettered.
 *
 * An INS whose key has no earlier change waiting goes as a plain INSERT, without ON CONFLICT: its
 * key is almost always new, and PostgreSQL's speculative insertion (ON CONFLICT) costs about two
 * thirds more than inserting. When the key is taken after all (a resent event, rows loaded before
 * ces2pg, a replay), the INSERT fails with ERRCODE_UNIQUE_VIOLATION and the batch is retried with upserts,
 * which do what they always did; so a plain INSERT never decides an outcome, it only saves work
 * when it succeeds. The table then sends upserts only, for 64 attempts after its first taken key,
 * doubling with each one up to 4,096, so that a table whose keys keep being taken costs little.
 */
#define BULK_MAX_ROWS 1000
#define BULK_MAX_BYTES (4u << 20)
#define BULK_MAX_GENERATIONS 8

typedef struct {
    table_t *t;
    char kind; /* 'u' upsert, 'i' plain insert, 'd' delete (the per-row statements: 'U', 'D') */
    uintptr_t generation;
    char *sig;
    size_t sig_len;
    long *cols; /* upserts: target columns of the values, sorted */
    size_t ncols;
    size_t nvalues;      /* per row: ncols (or the key columns), and the version when guarded */
    const char **values; /* nrows * nvalues, row after row; NULL is SQL NULL */
    int *lengths;
    size_t nrows;
    size_t rows_capacity;
    size_t bytes; /* value bytes gathered */
} group_t;

typedef struct {
    ces_apply_t *a;
    ces_batch_t *batch;
    bool bulk; /* gather row changes into bulk statements (off when retrying row by row) */
    bool plain_inserts; /* send INS of new keys as plain INSERTs (off when one found its key) */
    group_t *groups;
    size_t ngroups;
    size_t groups_capacity;
    ces_map_t *bulk_keys; /* table id and key of every row waiting -> its last generation + 1 */
    uintptr_t generations; /* in use: 0..generations-1 */
    char *key;            /* scratch: the key being looked up */
    size_t key_capacity;
    pending_t *pending;
    size_t npending;
    size_t capacity;
    ces_pgerr_t *e;
    bool fenced;
    bool nonblocking; /* sending without waiting for the socket (ces_apply_send) */
    /* An incremental drain (drain_some without waiting): results read, whether the NULL after
     * the last one is still due, and, once it reached the Sync (drain_done), its outcome. */
    size_t drained;
    bool between;
    bool drain_done;
    int drain_rc;
    bool sent_all; /* attempt_send went through to its last Sync */
    /* scratch for one statement's parameters */
    const char **values;
    int *lengths;
    long *cols;
    const ces_field_t **fields;
    size_t scratch_capacity;
    unsigned *marks; /* per target column: == epoch when the statement being built has it */
    size_t marks_capacity;
    unsigned epoch;
    char *sig; /* the statement signature being built */
    size_t sig_capacity;
    char version[64];
} sender_t;

static int push_pending(sender_t *s, pend_kind_t kind, long item, stmt_t *stmt) {
    if (s->npending == s->capacity) {
        size_t cap = s->capacity ? s->capacity * 2 : PIPELINE_CHUNK * 2;
        pending_t *p = realloc(s->pending, cap * sizeof(*p));
        if (p == NULL) {
            ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
        s->pending = p;
        s->capacity = cap;
    }
    s->pending[s->npending++] = (pending_t){kind, item, stmt, NULL};
    return 0;
}

/* Records the result of a PQsend* call: on success its result is expected (kind, item); on
 * failure the connection is in trouble and the attempt stops. */
static int sent(sender_t *s, int ok, pend_kind_t kind, long item, stmt_t *stmt) {
    if (ok != 1) {
        ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "sending to PostgreSQL: %s",
                  PQerrorMessage(ces_session_conn(s->a->session)));
        return -1;
    }
    return push_pending(s, kind, item, stmt);
}

/* Ends what was sent with a Sync (its results can be read then). Returns -1 on a broken
 * connection. */
static int send_sync(sender_t *s) {
    if (PQpipelineSync(ces_session_conn(s->a->session)) != 1) {
        ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "sending to PostgreSQL: %s",
                  PQerrorMessage(ces_session_conn(s->a->session)));
        return -1;
    }
    return 0;
}

/* Forgets where an incremental drain stopped (the pending results are dropped or read anew). */
static void drain_reset(sender_t *s) {
    s->drained = 0;
    s->between = false;
    s->drain_rc = 0;
    s->drain_done = false;
}

/* Reads the pending results up to the Sync. With wait false it stops where libpq would block and
 * returns 1; called again, it goes on from there (ces_apply_ready). Returns 0 at the Sync, -1 on a
 * broken connection. */
static int drain_some(sender_t *s, bool wait) {
    PGconn *conn = ces_session_conn(s->a->session);
    while (s->drained < s->npending || s->between) {
        if (!wait && PQisBusy(conn))
            return 1;
        PGresult *r = PQgetResult(conn);
        if (s->between) {
            /* The NULL that ends each statement's results. */
            s->between = false;
            if (r != NULL) {
                PQclear(r);
                ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "unexpected extra result from PostgreSQL");
                s->drain_rc = -1;
            }
            continue;
        }
        pending_t *p = &s->pending[s->drained++];
        if (r == NULL) {
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL connection lost: %s",
                      PQerrorMessage(conn));
            drain_reset(s);
            return -1;
        }
        ExecStatusType st = PQresultStatus(r);
        if (p->kind == PEND_PREPARE && st != PGRES_COMMAND_OK)
            p->stmt->epoch = 0; /* aborted or failed: Parse it again next time */
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
            /* A COMMIT answered ROLLBACK undid the batch (it cannot happen inside a pipeline,
             * which skips everything after an error, but nothing else would notice). */
            if (p->kind == PEND_COMMIT && strcmp(PQcmdStatus(r), "COMMIT") != 0)
                ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL rolled the batch back (%s)",
                          PQcmdStatus(r));
        } else if (p->kind == PEND_OFFSET && ces_positions_fence_raised(r)) {
            s->fenced = true; /* and the rest of the pipeline, COMMIT included, is skipped */
        } else if (st != PGRES_PIPELINE_ABORTED) {
            long item = (p->kind == PEND_ROW || p->kind == PEND_PREPARE) ? p->item : -1;
            bool first = s->e->cls == CES_PGERR_NONE;
            ces_pgerr_from_result(s->e, conn, r, item);
            /* Bad data, or one key twice in a statement (two texts of one value, like "1" and
             * "01"): only row by row can tell which change it was. */
            if (first && p->inserted != NULL && strcmp(s->e->sqlstate, ERRCODE_UNIQUE_VIOLATION) == 0) {
                s->e->cls = CES_PGERR_INSERT_TAKEN;
                s->e->taken = p->inserted;
            } else if (first && p->kind == PEND_BULK &&
                       (s->e->cls == CES_PGERR_DATA || strcmp(s->e->sqlstate, ERRCODE_CARDINALITY_VIOLATION) == 0)) {
                s->e->cls = CES_PGERR_BULK;
            }
            if (PQstatus(conn) != CONNECTION_OK) {
                PQclear(r);
                drain_reset(s);
                return -1;
            }
        }
        PQclear(r);
        s->between = true;
    }
    if (!wait && PQisBusy(conn))
        return 1;
    int rc = s->drain_rc;
    s->npending = 0;
    drain_reset(s);
    PGresult *r = PQgetResult(conn);
    if (r == NULL || PQresultStatus(r) != PGRES_PIPELINE_SYNC) {
        if (r != NULL)
            ces_pgerr_from_result(s->e, conn, r, -1);
        else
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL connection lost: %s",
                      PQerrorMessage(conn));
        rc = -1;
    }
    PQclear(r);
    return rc;
}

/* Reads every pending result up to the Sync (or returns what ces_apply_ready's drain found).
 * Returns -1 on a broken connection. */
static int drain(sender_t *s) {
    if (s->drain_done) {
        int rc = s->drain_rc;
        drain_reset(s);
        return rc;
    }
    return drain_some(s, true);
}

/* Sends a Sync and reads every pending result. Returns -1 on a broken connection. */
static int sync_and_drain(sender_t *s) { return send_sync(s) != 0 ? -1 : drain(s); }

static int maybe_sync(sender_t *s) {
    if (s->npending < PIPELINE_CHUNK)
        return 0;
    return sync_and_drain(s);
}

static int send_simple(sender_t *s, const char *sql) {
    return sent(s, PQsendQueryParams(ces_session_conn(s->a->session), sql, 0, NULL, NULL, NULL, NULL, 0), PEND_OTHER,
                -1, NULL);
}

static int reserve_scratch(sender_t *s, size_t n) {
    if (n <= s->scratch_capacity)
        return 0;
    size_t cap = n * 2;
    const char **v = realloc(s->values, cap * sizeof(*v));
    if (v)
        s->values = v;
    int *l = realloc(s->lengths, cap * sizeof(*l));
    if (l)
        s->lengths = l;
    long *c = realloc(s->cols, cap * sizeof(*c));
    if (c)
        s->cols = c;
    const ces_field_t **f = realloc(s->fields, cap * sizeof(*f));
    if (f)
        s->fields = f;
    if (!v || !l || !c || !f) {
        ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    s->scratch_capacity = cap;
    return 0;
}

/* Finds or makes the prepared statement for a signature; sends its Parse when the connection has
 * not seen it yet. build writes its SQL. */
static stmt_t *get_statement(sender_t *s, const char *sig, size_t sig_len, long item,
                             void (*build)(ces_strbuf_t *, const ces_apply_t *, const table_t *,
                                           const long *, size_t),
                             const table_t *t, const long *cols, size_t ncols) {
    ces_apply_t *a = s->a;
    stmt_t *st = ces_map_get(a->stmts, sig, sig_len);
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        char name[32];
        snprintf(name, sizeof(name), "ces_%u", ++a->next_stmt_id);
        if (st == NULL || (st->name = strdup(name)) == NULL ||
            ces_map_put(a->stmts, sig, sig_len, st) != 0) {
            if (st)
                free(st->name);
            free(st);
            ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return NULL;
        }
    }
    if (st->epoch != ces_session_epoch(a->session)) {
        ces_strbuf_t sql = {0};
        build(&sql, a, t, cols, ncols);
        if (sql.failed) {
            free(sql.buf);
            ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return NULL;
        }
        int nparams = (int)ncols + (a->lsn_guard && t->version_col >= 0 ? 1 : 0);
        int ok = PQsendPrepare(ces_session_conn(a->session), st->name, sql.buf, nparams, NULL);
        free(sql.buf);
        if (ok != 1) {
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "sending to PostgreSQL: %s",
                      PQerrorMessage(ces_session_conn(a->session)));
            return NULL;
        }
        if (push_pending(s, PEND_PREPARE, item, st) != 0)
            return NULL;
        /* Later statements of this pipeline may use it at once: the server parses in order. */
        st->epoch = ces_session_epoch(a->session);
    }
    return st;
}

/* How a statement refers to its value number i (1-based): a parameter "$i" for one row, or column
 * "s.ci" of the unnest() of one array parameter per value, for many rows (see the bulk path). */
static void add_ref(ces_strbuf_t *sql, bool bulk, size_t i) { ces_strbuf_addf(sql, bulk ? "s.c%zu" : "$%zu", i); }

/* unnest($1::text[], ..., $n::text[]) AS s(c1, ..., cn): the rows of a bulk statement. */
static void add_unnest(ces_strbuf_t *sql, size_t n) {
    ces_strbuf_add(sql, "unnest(");
    for (size_t i = 1; i <= n; i++)
        ces_strbuf_addf(sql, "%s$%zu::text[]", i > 1 ? ", " : "", i);
    ces_strbuf_add(sql, ") AS s(");
    for (size_t i = 1; i <= n; i++)
        ces_strbuf_addf(sql, "%sc%zu", i > 1 ? ", " : "", i);
    ces_strbuf_add(sql, ")");
}

/* ARRAY[v1::type::text, ...]: the primary key in the canonical text of its column types, as the
 * tombstones store it. refs[k] is the value number of key column k. */
static void add_key_array(ces_strbuf_t *sql, const table_t *t, bool bulk, const size_t *refs) {
    ces_strbuf_add(sql, "ARRAY[");
    for (size_t k = 0; k < t->npk; k++) {
        ces_strbuf_add(sql, k ? ", " : "");
        add_ref(sql, bulk, refs[k]);
        ces_strbuf_add(sql, "::");
        ces_strbuf_add(sql, t->cols[t->pk[k]].type);
        ces_strbuf_add(sql, "::text");
    }
    ces_strbuf_add(sql, "]");
}

/*
 * INSERT ... ON CONFLICT (pk) DO UPDATE with the columns present, for one row or (bulk) for the
 * rows of arrays. With the version guard, the row changes only when the event is newer than the
 * row, and a row is not inserted when a newer delete left a tombstone for its key. Without
 * upsert, the same INSERT without ON CONFLICT: a taken key fails it.
 */
static void build_upsert_sql(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, const long *cols,
                             size_t n, bool bulk, bool upsert) {
    bool guard = a->lsn_guard && t->version_col >= 0;
    size_t version_ref = n + 1;
    size_t key_refs[t->npk + 1];
    ces_strbuf_add(sql, "INSERT INTO ");
    ces_strbuf_add(sql, t->qualified);
    ces_strbuf_add(sql, " AS t (");
    for (size_t i = 0; i < n; i++) {
        ces_strbuf_add(sql, i ? ", " : "");
        ces_strbuf_add(sql, t->cols[cols[i]].quoted);
        for (size_t k = 0; k < t->npk; k++) {
            if ((size_t)cols[i] == t->pk[k])
                key_refs[k] = i + 1;
        }
    }
    if (guard) {
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
    }
    if (guard || bulk) {
        /* Typed values: in INSERT ... SELECT they take no type from the target columns. The
         * casts drop the type modifier, so the assignment still checks length and precision. */
        ces_strbuf_add(sql, ") SELECT ");
        for (size_t i = 0; i < n; i++) {
            ces_strbuf_add(sql, i ? ", " : "");
            add_ref(sql, bulk, i + 1);
            ces_strbuf_add(sql, "::");
            ces_strbuf_add(sql, t->cols[cols[i]].cast);
        }
        if (guard) {
            ces_strbuf_add(sql, ", ");
            add_ref(sql, bulk, version_ref);
            ces_strbuf_add(sql, "::numeric");
        }
        if (bulk) {
            ces_strbuf_add(sql, " FROM ");
            add_unnest(sql, n + (guard ? 1 : 0));
        }
        if (guard) {
            /* Not NOT EXISTS: the planner turns that into a join, which may read every tombstone
             * of the table; a scalar subquery is one index lookup of the key per row. */
            ces_strbuf_add(sql, " WHERE NOT coalesce((SELECT ts.version > ");
            add_ref(sql, bulk, version_ref);
            ces_strbuf_add(sql, "::numeric FROM ");
            ces_strbuf_add(sql, ces_metadata_tombstones(a->metadata));
            ces_strbuf_addf(sql, " ts WHERE ts.relid = %u AND ts.key = ", t->oid);
            add_key_array(sql, t, bulk, key_refs);
            ces_strbuf_add(sql, "), false)");
        }
    } else {
        ces_strbuf_add(sql, ") VALUES (");
        for (size_t i = 0; i < n; i++)
            ces_strbuf_addf(sql, "%s$%zu", i ? ", " : "", i + 1);
        ces_strbuf_add(sql, ")");
    }
    if (!upsert)
        return;
    ces_strbuf_add(sql, " ON CONFLICT (");
    for (size_t k = 0; k < t->npk; k++) {
        ces_strbuf_add(sql, k ? ", " : "");
        ces_strbuf_add(sql, t->cols[t->pk[k]].quoted);
    }
    ces_strbuf_add(sql, ") DO ");
    size_t updates = 0;
    for (size_t i = 0; i < n; i++) {
        bool is_pk = false;
        for (size_t k = 0; k < t->npk; k++)
            is_pk = is_pk || (size_t)cols[i] == t->pk[k];
        if (is_pk)
            continue;
        ces_strbuf_add(sql, updates++ ? ", " : "UPDATE SET ");
        ces_strbuf_add(sql, t->cols[cols[i]].quoted);
        ces_strbuf_add(sql, " = EXCLUDED.");
        ces_strbuf_add(sql, t->cols[cols[i]].quoted);
    }
    if (guard) {
        ces_strbuf_add(sql, updates++ ? ", " : "UPDATE SET ");
        ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
        ces_strbuf_add(sql, " = EXCLUDED.");
        ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
        ces_strbuf_add(sql, " WHERE t.");
        ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
        ces_strbuf_add(sql, " IS NULL OR t.");
        ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
        ces_strbuf_add(sql, " < EXCLUDED.");
        ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
    }
    if (updates == 0)
        ces_strbuf_add(sql, "NOTHING");
}

/* DELETE by primary key, for one row or (bulk) for the rows of arrays. With the version guard,
 * only a row older than the event goes, and the key's tombstone is raised to the event's version
 * either way. */
static void build_delete_sql(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, bool bulk) {
    bool guard = a->lsn_guard && t->version_col >= 0;
    size_t n = t->npk, version_ref = n + 1;
    size_t key_refs[t->npk + 1];
    if (guard && bulk) {
        ces_strbuf_add(sql, "WITH s AS (SELECT * FROM ");
        add_unnest(sql, n + 1);
        ces_strbuf_add(sql, "), deleted AS (");
    } else if (guard) {
        ces_strbuf_add(sql, "WITH deleted AS (");
    }
    ces_strbuf_add(sql, "DELETE FROM ");
    ces_strbuf_add(sql, t->qualified);
    ces_strbuf_add(sql, " AS t ");
    if (bulk && guard) {
        ces_strbuf_add(sql, "USING s ");
    } else if (bulk) {
        ces_strbuf_add(sql, "USING ");
        add_unnest(sql, n);
        ces_strbuf_add(sql, " ");
    }
    ces_strbuf_add(sql, "WHERE ");
    for (size_t k = 0; k < n; k++) {
        key_refs[k] = k + 1;
        ces_strbuf_add(sql, k ? " AND " : "");
        ces_strbuf_add(sql, "t.");
        ces_strbuf_add(sql, t->cols[t->pk[k]].quoted);
        ces_strbuf_add(sql, " = ");
        add_ref(sql, bulk, k + 1);
        ces_strbuf_add(sql, "::");
        ces_strbuf_add(sql, t->cols[t->pk[k]].cast);
    }
    if (!guard)
        return;
    ces_strbuf_add(sql, " AND (t.");
    ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
    ces_strbuf_add(sql, " IS NULL OR t.");
    ces_strbuf_add(sql, ces_metadata_version_quoted(a->metadata));
    ces_strbuf_add(sql, " < ");
    add_ref(sql, bulk, version_ref);
    ces_strbuf_add(sql, "::numeric) RETURNING 1) INSERT INTO ");
    ces_strbuf_add(sql, ces_metadata_tombstones(a->metadata));
    ces_strbuf_addf(sql, " AS ts (relid, key, version) %s%u, ", bulk ? "SELECT " : "VALUES (", t->oid);
    add_key_array(sql, t, bulk, key_refs);
    ces_strbuf_add(sql, ", ");
    add_ref(sql, bulk, version_ref);
    ces_strbuf_add(sql, bulk ? "::numeric FROM s" : "::numeric)");
    ces_strbuf_add(sql, " ON CONFLICT (relid, key) DO UPDATE SET version = EXCLUDED.version, deleted_at = "
                "now() WHERE ts.version < EXCLUDED.version");
}

static void build_upsert(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, const long *cols,
                         size_t n) {
    build_upsert_sql(sql, a, t, cols, n, false, true);
}

static void build_bulk_upsert(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, const long *cols,
                              size_t n) {
    build_upsert_sql(sql, a, t, cols, n, true, true);
}

static void build_bulk_insert(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, const long *cols,
                              size_t n) {
    build_upsert_sql(sql, a, t, cols, n, true, false);
}

static void build_delete(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, const long *cols,
                         size_t n) {
    (void)cols;
    (void)n;
    build_delete_sql(sql, a, t, false);
}

static void build_bulk_delete(ces_strbuf_t *sql, const ces_apply_t *a, const table_t *t, const long *cols,
                              size_t n) {
    (void)cols;
    (void)n;
    build_delete_sql(sql, a, t, true);
}

/* Appends ",<v>" in decimal (formatted by hand: this runs for every column of every change). */
static size_t put_number(char *buf, unsigned long v) {
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    buf[0] = ',';
    for (size_t i = 0; i < n; i++)
        buf[1 + i] = digits[n - 1 - i];
    return n + 1;
}

/* The signature names a statement: its kind, table and column list. size must allow 16 + 12 per
 * column (a column index is at most 10 digits). */
static size_t signature(char *buf, size_t size, char kind, const table_t *t, const long *cols,
                        size_t n) {
    buf[0] = kind;
    size_t len = 1 + put_number(buf + 1, t->id);
    for (size_t i = 0; i < n && len + 12 < size; i++)
        len += put_number(buf + len, (unsigned long)cols[i]);
    return len;
}

/* Converts a value for its column; NULL values stay NULL. Returns -1 when out of memory. */
static int param_value(sender_t *s, ces_item_t *item, const table_t *t, long col,
                       const ces_field_t *f, size_t slot) {
    if (f->is_null) {
        s->values[slot] = NULL;
        s->lengths[slot] = 0;
        return 0;
    }
    size_t len;
    const char *v = ces_types_convert(t->cols[col].conv, f->value, f->value_len, item->arena, &len);
    if (v == NULL) {
        ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    s->values[slot] = v;
    s->lengths[slot] = (int)len;
    return 0;
}

/* Key value of pk column k: from the image (if given), else from pkkey. */
static const ces_field_t *key_field(table_t *t, size_t k, const ces_field_t *image, size_t nimage,
                                    const ces_event_t *ev) {
    for (size_t i = 0; i < nimage; i++) {
        if (resolve_column(t, image[i].name) == (long)t->pk[k])
            return &image[i];
    }
    for (size_t i = 0; i < ev->npkkey; i++) {
        if (resolve_column(t, ev->pkkey[i].name) == (long)t->pk[k])
            return &ev->pkkey[i];
    }
    return NULL;
}

/* Adds the event's version as parameter slot (when the table is guarded). Returns the number of
 * parameters. */
static int add_version_param(sender_t *s, const table_t *t, const ces_event_t *ev, size_t slot) {
    if (!s->a->lsn_guard || t->version_col < 0)
        return (int)slot;
    ces_version_format(&ev->position, s->version, sizeof(s->version));
    s->values[slot] = s->version;
    s->lengths[slot] = 0;
    return (int)slot + 1;
}


static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Sends the rows of group g as one statement and empties it. Each parameter is a text[] in
 * PostgreSQL's binary array format (dimensions, then each element's length and bytes, -1 for
 * NULL), so no value needs quoting or escaping. */
static int bulk_send_group(sender_t *s, group_t *g) {
    if (g->nrows == 0)
        return 0;
    int rc = -1;
    size_t nv = g->nvalues;
    size_t total = nv * 20 + g->nrows * nv * 4 + g->bytes;
    unsigned char *buf = malloc(total);
    const char **params = malloc(nv * sizeof(*params));
    int *plens = malloc(nv * sizeof(*plens));
    int *formats = malloc(nv * sizeof(*formats));
    if (buf == NULL || params == NULL || plens == NULL || formats == NULL) {
        ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        goto done;
    }
    unsigned char *p = buf;
    for (size_t j = 0; j < nv; j++) {
        unsigned char *start = p;
        bool has_null = false;
        for (size_t r = 0; r < g->nrows && !has_null; r++)
            has_null = g->values[r * nv + j] == NULL;
        put_be32(p, 1);                  /* dimensions */
        put_be32(p + 4, has_null);       /* flags */
        put_be32(p + 8, 25);             /* element type: text */
        put_be32(p + 12, (uint32_t)g->nrows);
        put_be32(p + 16, 1);             /* lower bound */
        p += 20;
        for (size_t r = 0; r < g->nrows; r++) {
            const char *v = g->values[r * nv + j];
            uint32_t len = (uint32_t)g->lengths[r * nv + j];
            put_be32(p, v == NULL ? UINT32_MAX : len);
            p += 4;
            if (v != NULL) {
                memcpy(p, v, len);
                p += len;
            }
        }
        params[j] = (const char *)start;
        plens[j] = (int)(p - start);
        formats[j] = 1;
    }
    stmt_t *st = get_statement(s, g->sig, g->sig_len, -1,
                               g->kind == 'u'   ? build_bulk_upsert
                               : g->kind == 'i' ? build_bulk_insert
                                                : build_bulk_delete,
                               g->t, g->cols, g->ncols);
    if (st == NULL)
        goto done;
    rc = sent(s, PQsendQueryPrepared(ces_session_conn(s->a->session), st->name, (int)nv, params, plens, formats, 0),
              PEND_BULK, -1, NULL);
    if (rc == 0 && g->kind == 'i')
        s->pending[s->npending - 1].inserted = g->t;
    g->nrows = 0;
    g->bytes = 0;
done:
    free(buf);
    free(params);
    free(plens);
    free(formats);
    return rc;
}

/* Sends every group, generation after generation: before a change that must follow their rows,
 * when one is full, and at the batch's end. */
static int bulk_send_all(sender_t *s) {
    for (uintptr_t gen = 0; gen < s->generations; gen++) {
        for (size_t i = 0; i < s->ngroups; i++) {
            if (s->groups[i].generation == gen && bulk_send_group(s, &s->groups[i]) != 0)
                return -1;
        }
    }
    s->generations = 0;
    if (s->bulk_keys != NULL)
        ces_map_clear(s->bulk_keys, NULL, NULL);
    return 0;
}

/* The group of kind and signature sig (made when new); NULL when out of memory. */
static group_t *bulk_group(sender_t *s, char kind, uintptr_t generation, table_t *t,
                           const char *sig, size_t sig_len, const long *cols, size_t ncols,
                           size_t nvalues) {
    for (size_t i = 0; i < s->ngroups; i++) {
        group_t *g = &s->groups[i];
        if (g->generation == generation && g->kind == kind && g->sig_len == sig_len &&
            memcmp(g->sig, sig, sig_len) == 0)
            return g;
    }
    if (s->ngroups == s->groups_capacity) {
        size_t cap = s->groups_capacity ? s->groups_capacity * 2 : 8;
        group_t *groups = realloc(s->groups, cap * sizeof(*groups));
        if (groups == NULL)
            return NULL;
        s->groups = groups;
        s->groups_capacity = cap;
    }
    group_t *g = &s->groups[s->ngroups];
    *g = (group_t){.t = t,
                   .kind = kind,
                   .generation = generation,
                   .sig_len = sig_len,
                   .ncols = ncols,
                   .nvalues = nvalues};
    g->sig = malloc(sig_len);
    g->cols = malloc((ncols + 1) * sizeof(*g->cols));
    if (g->sig == NULL || g->cols == NULL) {
        free(g->sig);
        free(g->cols);
        return NULL;
    }
    memcpy(g->sig, sig, sig_len);
    if (cols != NULL)
        memcpy(g->cols, cols, ncols * sizeof(*cols));
    s->ngroups++;
    return g;
}

static void bulk_free(sender_t *s) {
    for (size_t i = 0; i < s->ngroups; i++) {
        free(s->groups[i].sig);
        free(s->groups[i].cols);
        free(s->groups[i].values);
        free(s->groups[i].lengths);
    }
    free(s->groups);
    free(s->key);
    ces_map_destroy(s->bulk_keys);
}

/*
 * Adds the change whose values stand in s->values[0..n) (n = ncols, or the key columns for a
 * delete) to its group: of its kind and shape, and of the generation after the key's last change
 * in the batch. key_slots[k] is the value slot of key column k.
 */
static int bulk_add(sender_t *s, char kind, ces_item_t *item, table_t *t, const long *cols,
                    size_t n, const size_t *key_slots) {
    bool guard = s->a->lsn_guard && t->version_col >= 0;
    size_t need = sizeof(t->id);
    for (size_t k = 0; k < t->npk; k++)
        need += sizeof(uint32_t) + (size_t)s->lengths[key_slots[k]];
    if (need > s->key_capacity) {
        char *key = realloc(s->key, need * 2);
        if (key == NULL)
            goto nomem;
        s->key = key;
        s->key_capacity = need * 2;
    }
    memcpy(s->key, &t->id, sizeof(t->id));
    size_t kl = sizeof(t->id);
    for (size_t k = 0; k < t->npk; k++) {
        uint32_t len = (uint32_t)s->lengths[key_slots[k]];
        memcpy(s->key + kl, &len, sizeof(len));
        if (len > 0)
            memcpy(s->key + kl + sizeof(len), s->values[key_slots[k]], len);
        kl += sizeof(len) + len;
    }
    if (s->bulk_keys == NULL && (s->bulk_keys = ces_map_new()) == NULL)
        goto nomem;
    uintptr_t generation = (uintptr_t)ces_map_get(s->bulk_keys, s->key, kl);
    if (generation >= BULK_MAX_GENERATIONS) {
        if (bulk_send_all(s) != 0)
            return -1;
        generation = 0;
    }
    if (ces_map_put(s->bulk_keys, s->key, kl, (void *)(generation + 1)) != 0)
        goto nomem;
    if (generation >= s->generations)
        s->generations = generation + 1;
    if (kind == 'u' && generation == 0 && item->event.op == CES_OP_INSERT && s->plain_inserts &&
        s->a->attempts >= t->upsert_until)
        kind = 'i';

    size_t sig_size = 16 + n * 12;
    if (sig_size > s->sig_capacity) {
        char *sig = realloc(s->sig, sig_size * 2);
        if (sig == NULL)
            goto nomem;
        s->sig = sig;
        s->sig_capacity = sig_size * 2;
    }
    size_t sl = signature(s->sig, s->sig_capacity, kind, t, cols, cols ? n : 0);
    size_t nv = n + (guard ? 1 : 0);
    group_t *g = bulk_group(s, kind, generation, t, s->sig, sl, cols, n, nv);
    if (g == NULL)
        goto nomem;
    if (g->nrows == g->rows_capacity) {
        size_t cap = g->rows_capacity ? g->rows_capacity * 2 : 64;
        const char **values = realloc(g->values, cap * nv * sizeof(*values));
        if (values != NULL)
            g->values = values;
        int *lengths = realloc(g->lengths, cap * nv * sizeof(*lengths));
        if (lengths != NULL)
            g->lengths = lengths;
        if (values == NULL || lengths == NULL)
            goto nomem;
        g->rows_capacity = cap;
    }
    const char **row = g->values + g->nrows * nv;
    int *row_lengths = g->lengths + g->nrows * nv;
    for (size_t j = 0; j < n; j++) {
        row[j] = s->values[j];
        row_lengths[j] = row[j] ? s->lengths[j] : 0;
        g->bytes += (size_t)row_lengths[j];
    }
    if (guard) {
        char version[64];
        ces_version_format(&item->event.position, version, sizeof(version));
        size_t len = strlen(version);
        if ((row[n] = ces_arena_strndup(item->arena, version, len)) == NULL)
            goto nomem;
        row_lengths[n] = (int)len;
        g->bytes += len;
    }
    g->nrows++;
    if (g->nrows >= BULK_MAX_ROWS || g->bytes >= BULK_MAX_BYTES)
        return bulk_send_all(s);
    return 0;
nomem:
    ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return -1;
}

static int send_delete(sender_t *s, long idx, ces_item_t *item, table_t *t,
                       const ces_field_t *image, size_t nimage, bool bulk, const char **reject) {
    if (reserve_scratch(s, t->npk + 1) != 0)
        return -1;
    for (size_t k = 0; k < t->npk; k++) {
        const ces_field_t *f = key_field(t, k, image, nimage, &item->event);
        if (f == NULL || f->is_null) {
            *reject = "the event lacks a value for a primary key column of the target table";
            return 0;
        }
        if (param_value(s, item, t, (long)t->pk[k], f, k) != 0)
            return -1;
    }
    if (bulk) {
        size_t key_slots[t->npk + 1];
        for (size_t k = 0; k < t->npk; k++)
            key_slots[k] = k;
        return bulk_add(s, 'd', item, t, NULL, t->npk, key_slots);
    }
    char sig[64];
    size_t sl = signature(sig, sizeof(sig), 'D', t, NULL, 0);
    stmt_t *st = get_statement(s, sig, sl, idx, build_delete, t, NULL, t->npk);
    if (st == NULL)
        return -1;
    int nparams = add_version_param(s, t, &item->event, t->npk);
    return sent(s,
                PQsendQueryPrepared(ces_session_conn(s->a->session), st->name, nparams, s->values, s->lengths, NULL, 0),
                PEND_ROW, idx, NULL);
}

/* Starts a new set of column marks for table t (a column is in the set when marks[col] == epoch). */
static int new_marks(sender_t *s, const table_t *t) {
    if (t->ncols > s->marks_capacity) {
        unsigned *m = realloc(s->marks, t->ncols * 2 * sizeof(*m));
        if (m == NULL) {
            ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
        memset(m + s->marks_capacity, 0, (t->ncols * 2 - s->marks_capacity) * sizeof(*m));
        s->marks = m;
        s->marks_capacity = t->ncols * 2;
    }
    if (++s->epoch == 0) { /* wrapped: old marks could look current */
        memset(s->marks, 0, s->marks_capacity * sizeof(*s->marks));
        s->epoch = 1;
    }
    return 0;
}

static int send_upsert(sender_t *s, long idx, ces_item_t *item, table_t *t, bool bulk,
                       const char **reject) {
    const ces_event_t *ev = &item->event;
    const ces_field_t **fields;
    size_t n = 0;
    if (reserve_scratch(s, ev->ncurrent + t->npk + 1) != 0 || new_marks(s, t) != 0)
        return -1;
    fields = s->fields;
    for (size_t i = 0; i < ev->ncurrent; i++) {
        long col = resolve_column(t, ev->current[i].name);
        if (col < 0 || s->marks[col] == s->epoch)
            continue; /* a duplicate after case folding: the first wins */
        s->marks[col] = s->epoch;
        s->cols[n] = col;
        fields[n++] = &ev->current[i];
    }
    for (size_t k = 0; k < t->npk; k++) {
        if (s->marks[t->pk[k]] == s->epoch)
            continue;
        const ces_field_t *f = key_field(t, k, NULL, 0, ev);
        if (f == NULL) {
            *reject = "the event lacks a value for a primary key column of the target table";
            return 0;
        }
        s->cols[n] = (long)t->pk[k];
        fields[n++] = f;
    }
    /* Column order decides the statement: sort by column index so equal shapes share one (events
     * list their columns in table order, so this is mostly one pass). */
    for (size_t i = 1; i < n; i++) {
        long c = s->cols[i];
        const ces_field_t *f = fields[i];
        size_t j = i;
        for (; j > 0 && s->cols[j - 1] > c; j--) {
            s->cols[j] = s->cols[j - 1];
            fields[j] = fields[j - 1];
        }
        s->cols[j] = c;
        fields[j] = f;
    }
    for (size_t i = 0; i < n; i++) {
        if (param_value(s, item, t, s->cols[i], fields[i], i) != 0)
            return -1;
    }
    if (bulk) {
        size_t key_slots[t->npk + 1];
        for (size_t i = 0; i < n; i++) {
            for (size_t k = 0; k < t->npk; k++) {
                if ((size_t)s->cols[i] == t->pk[k])
                    key_slots[k] = i;
            }
        }
        return bulk_add(s, 'u', item, t, s->cols, n, key_slots);
    }
    size_t sig_size = 16 + n * 12;
    if (sig_size > s->sig_capacity) {
        char *sig = realloc(s->sig, sig_size * 2);
        if (sig == NULL) {
            ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
        s->sig = sig;
        s->sig_capacity = sig_size * 2;
    }
    size_t sl = signature(s->sig, s->sig_capacity, 'U', t, s->cols, n);
    stmt_t *st = get_statement(s, s->sig, sl, idx, build_upsert, t, s->cols, n);
    if (st == NULL)
        return -1;
    int nparams = add_version_param(s, t, ev, n);
    return sent(s, PQsendQueryPrepared(ces_session_conn(s->a->session), st->name, nparams, s->values, s->lengths, NULL, 0),
                PEND_ROW, idx, NULL);
}

/* True when an UPD moves the row: its old image holds a different primary key than the new one. */
static bool key_changed(table_t *t, const ces_event_t *ev) {
    if (ev->op != CES_OP_UPDATE || ev->nold == 0)
        return false;
    for (size_t k = 0; k < t->npk; k++) {
        const ces_field_t *o = NULL;
        for (size_t i = 0; i < ev->nold && o == NULL; i++) {
            if (resolve_column(t, ev->old[i].name) == (long)t->pk[k])
                o = &ev->old[i];
        }
        const ces_field_t *n = key_field(t, k, ev->current, ev->ncurrent, ev);
        if (o == NULL || n == NULL || o->is_null || n->is_null)
            return false;
        if (o->value_len != n->value_len || memcmp(o->value, n->value, o->value_len) != 0)
            return true;
    }
    return false;
}

static int send_event(sender_t *s, long idx, ces_item_t *item, table_t *t, const char **reject) {
    const ces_event_t *ev = &item->event;
    if (ev->op == CES_OP_DELETE)
        return send_delete(s, idx, item, t, ev->old, ev->nold, s->bulk, reject);
    if (ev->op == CES_OP_UPDATE && ev->nold == 0 && !t->warned_no_old_image) {
        /* include_old_values = 0 at the source: a changed key cannot be told from the new row. */
        ces_log_warning("table %s: UPD events carry no old row image (include_old_values = 0): "
                        "if a primary key is changed at the source, the row is upserted under "
                        "its new key and the row under the old key stays",
                        t->qualified);
        t->warned_no_old_image = true;
    }
    if (key_changed(t, ev)) {
        /* A move touches two keys: it goes row by row, after whatever waits for either. */
        if (bulk_send_all(s) != 0)
            return -1;
        if (send_delete(s, idx, item, t, ev->old, ev->nold, false, reject) != 0 || *reject != NULL)
            return *reject != NULL ? 0 : -1;
        return send_upsert(s, idx, item, t, false, reject);
    }
    return send_upsert(s, idx, item, t, s->bulk, reject);
}

static int send_dead_letter(sender_t *s, long idx, ces_item_t *item) {
    char partition[16], offset[24];
    snprintf(partition, sizeof(partition), "%d", (int)item->source.partition);
    snprintf(offset, sizeof(offset), "%lld", (long long)item->source.offset);
    char *reason = utf8_sanitize(item->reason ? item->reason : "unknown");
    char *topic = utf8_sanitize(item->source.topic ? item->source.topic : "");
    char *logicalid = item->logicalid ? utf8_sanitize(item->logicalid) : NULL;
    int rc = -1;
    if (reason == NULL || topic == NULL || (item->logicalid && logicalid == NULL)) {
        ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        goto done;
    }
    const char *values[6] = {topic, partition, offset, reason, logicalid, item->raw};
    int lengths[6] = {0, 0, 0, 0, 0, (int)item->raw_len};
    int formats[6] = {0, 0, 0, 0, 0, 1};
    if (item->raw == NULL)
        values[5] = NULL;
    rc = sent(s,
              PQsendQueryParams(ces_session_conn(s->a->session), ces_metadata_dead_letter_sql(s->a->metadata), 6, NULL, values, lengths,
                                formats, 0),
              PEND_DEAD_LETTER, idx, NULL);
done:
    free(reason);
    free(topic);
    free(logicalid);
    return rc;
}

static int send_offsets(sender_t *s) {
    for (size_t i = 0; i < s->batch->noffsets; i++) {
        ces_positions_params_t params;
        ces_positions_update_params(s->a->positions, &s->batch->offsets[i], &params);
        if (sent(s,
                 PQsendQueryParams(ces_session_conn(s->a->session),
                                   ces_positions_update_sql(s->a->positions),
                                   CES_POSITIONS_UPDATE_NPARAMS, NULL, params.values, NULL, NULL,
                                   0),
                 PEND_OFFSET, (long)i, NULL) != 0)
            return -1;
    }
    return 0;
}

/* Resolves every event's table before the transaction starts (DDL commits on its own). Events that
 * cannot be applied become dead letters here. */
static int prepare_tables(ces_apply_t *a, ces_batch_t *batch, table_t **tables,
                          ces_pgerr_t *e) {
    for (size_t i = 0; i < batch->count; i++) {
        ces_item_t *item = &batch->items[i];
        tables[i] = NULL;
        if (item->kind != CES_ITEM_EVENT)
            continue;
        const char *reject = NULL;
        tables[i] = ensure_table(a, &item->event, &reject, e);
        if (tables[i] != NULL)
            continue;
        if (e->cls == CES_PGERR_DATA && e->failed_item < 0) {
            /* DDL refused because of what this event holds (e.g. an over-long name). */
            char reason[600];
            snprintf(reason, sizeof(reason), "creating or extending the target table failed: %s",
                     e->message);
            ces_pgerr_clear(e);
            if (ces_batch_item_reject(item, reason) != 0) {
                ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
                return -1;
            }
            continue;
        }
        if (e->cls != CES_PGERR_NONE)
            return -1;
        if (ces_batch_item_reject(item, reject ? reject : "the target table is unusable") != 0) {
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* After the rollback of a failed attempt. Results that nobody read would be taken for the answers
 * to the next attempt's statements: a session that cannot leave pipeline mode is closed instead
 * (which rolls back whatever it had open). */
static void leave_pipeline_or_disconnect(ces_apply_t *a) {
    if (PQexitPipelineMode(ces_session_conn(a->session)) == 1)
        return;
    ces_log_warning("PostgreSQL: leaving pipeline mode after a failed batch: %s; reconnecting",
                    PQerrorMessage(ces_session_conn(a->session)));
    ces_session_disconnect(a->session);
}

/* What one attempt sends: a whole transaction, or a part of a streamed one (see apply.h). */
typedef enum {
    STEP_WHOLE, /* BEGIN ... COMMIT */
    STEP_CHUNK, /* inside the open transaction, under a savepoint; no COMMIT */
    STEP_LAST,  /* the last part, the positions, COMMIT */
} step_t;

/* Sends one attempt's statements up to the Sync that ends them; nothing is read yet (unless more
 * than PIPELINE_CHUNK results wait). With s->nonblocking libpq only buffers what the socket does
 * not take: ces_apply_progress and attempt_finish send the rest. Returns 0, or -1 with s->e set. */
static int attempt_send(ces_apply_t *a, ces_batch_t *batch, step_t step, sender_t *s,
                        table_t **tables) {
    ces_pgerr_t *e = s->e;
    a->attempts++;
    if (prepare_tables(a, batch, tables, e) != 0)
        return -1;
    if (PQenterPipelineMode(ces_session_conn(a->session)) != 1) {
        ces_pgerr_set(e, CES_PGERR_RETRY, -1, NULL, "entering pipeline mode: %s", PQerrorMessage(ces_session_conn(a->session)));
        return -1;
    }
    if (s->nonblocking && PQsetnonblocking(ces_session_conn(a->session), 1) != 0) {
        s->nonblocking = false;
        ces_pgerr_set(e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL: %s", PQerrorMessage(ces_session_conn(a->session)));
        return -1;
    }
    if (send_simple(s, step == STEP_WHOLE ? "BEGIN" : "SAVEPOINT ces_step") != 0)
        return -1;
    for (size_t i = 0; i < batch->count; i++) {
        ces_item_t *item = &batch->items[i];
        if (item->kind == CES_ITEM_EVENT) {
            const char *reject = NULL;
            if (send_event(s, (long)i, item, tables[i], &reject) != 0)
                return -1;
            if (reject != NULL && ces_batch_item_reject(item, reject) != 0) {
                ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
                return -1;
            }
        }
        if (item->kind == CES_ITEM_DEAD_LETTER && send_dead_letter(s, (long)i, item) != 0)
            return -1;
        if (maybe_sync(s) != 0 || e->cls != CES_PGERR_NONE)
            return -1;
    }
    if (bulk_send_all(s) != 0 || (step != STEP_CHUNK && send_offsets(s) != 0))
        return -1;
    /* A whole transaction commits in the same pipeline: the fence aborts it before COMMIT, and
     * ces2pg need not wait for one more round trip. */
    if (step == STEP_WHOLE &&
        sent(s, PQsendQueryParams(ces_session_conn(a->session), "COMMIT", 0, NULL, NULL, NULL, NULL, 0), PEND_COMMIT,
             -1, NULL) != 0)
        return -1;
    if (send_sync(s) != 0)
        return -1;
    s->sent_all = true;
    return e->cls != CES_PGERR_NONE ? -1 : 0;
}

/* Back to blocking mode once libpq has sent all it buffered (reading results meanwhile, so that
 * the server never waits on a full socket). Returns 0, or -1 with s->e set. */
static int leave_nonblocking(sender_t *s) {
    PGconn *conn = ces_session_conn(s->a->session);
    if (!s->nonblocking)
        return 0;
    s->nonblocking = false;
    int flushed;
    while ((flushed = PQflush(conn)) == 1) {
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLOUT | POLLIN};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "waiting for PostgreSQL: %s", strerror(errno));
            return -1;
        }
        if ((pfd.revents & (POLLIN | POLLERR | POLLHUP)) && PQconsumeInput(conn) != 1)
            break; /* PQflush reports it */
    }
    if (flushed != 0 || PQsetnonblocking(conn, 0) != 0) {
        ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "sending to PostgreSQL: %s", PQerrorMessage(conn));
        return -1;
    }
    return 0;
}

/* Reads what attempt_send sent, checks the fence and commits (or releases the step's savepoint).
 * Returns 0, or -1 with s->e set (then the attempt must be abandoned). */
static int attempt_finish(ces_apply_t *a, step_t step, sender_t *s) {
    ces_pgerr_t *e = s->e;
    if (leave_nonblocking(s) != 0 || drain(s) != 0 || e->cls != CES_PGERR_NONE) {
        /* The connection broke with COMMIT sent (attempt_send got that far, or finish would not
         * be called): it may have committed, and apply_step asks. */
        if (step == STEP_WHOLE && !ces_session_connected(a->session))
            e->in_commit = true;
        return -1;
    }
    if (s->fenced) {
        ces_pgerr_set(e, CES_PGERR_FENCED, -1, NULL,
                  "the stored consumer position moved: another instance took over a partition");
        return -1;
    }
    /* A whole transaction's COMMIT was in the pipeline, and every result was fine. */
    if (step != STEP_WHOLE &&
        (send_simple(s, step == STEP_CHUNK ? "RELEASE SAVEPOINT ces_step" : "COMMIT") != 0 ||
         sync_and_drain(s) != 0 || e->cls != CES_PGERR_NONE)) {
        e->in_commit = step != STEP_CHUNK;
        return -1;
    }
    if (PQexitPipelineMode(ces_session_conn(a->session)) != 1)
        ces_pgerr_set(e, CES_PGERR_RETRY, -1, NULL, "leaving pipeline mode: %s", PQerrorMessage(ces_session_conn(a->session)));
    return 0;
}

/* Ends a failed attempt's pipeline, if the connection still works: reads what was sent to its
 * last Sync (an error may have been read before the rest of the results, even while libpq was
 * still sending), then rolls back the transaction, or in a stream only the step. */
static void roll_back(sender_t *s, bool whole) {
    PGconn *conn = ces_session_conn(s->a->session);
    if (PQstatus(conn) != CONNECTION_OK || PQpipelineStatus(conn) == PQ_PIPELINE_OFF)
        return;
    ces_pgerr_t ignored = CES_PGERR_INIT;
    ces_pgerr_t *saved = s->e;
    s->e = &ignored;
    if (s->sent_all && (s->npending > 0 || s->between) && leave_nonblocking(s) == 0)
        drain(s);
    s->npending = 0;
    drain_reset(s);
    if (send_simple(s, whole ? "ROLLBACK" : "ROLLBACK TO SAVEPOINT ces_step") == 0)
        sync_and_drain(s);
    s->e = saved;
    leave_pipeline_or_disconnect(s->a);
}

/* After a failed attempt: rolls back what it did, and leaves the connection in blocking mode (or
 * closes it). */
static void attempt_abandon(sender_t *s, step_t step) {
    ces_apply_t *a = s->a;
    /* A data error undoes only a stream's step; anything else loses the whole transaction. */
    roll_back(s, step == STEP_WHOLE || !ces_pgerr_undoes_only_the_step(s->e->cls) || s->e->in_commit);
    if (ces_session_conn(a->session) != NULL && PQisnonblocking(ces_session_conn(a->session)) && PQsetnonblocking(ces_session_conn(a->session), 0) != 0)
        ces_session_disconnect(a->session);
}

static void sender_free(sender_t *s) {
    bulk_free(s);
    free(s->pending);
    free(s->values);
    free(s->lengths);
    free(s->cols);
    free(s->fields);
    free(s->marks);
    free(s->sig);
}

static void attempt(ces_apply_t *a, ces_batch_t *batch, step_t step, bool bulk,
                    bool plain_inserts, ces_pgerr_t *e) {
    table_t **tables = calloc(batch->count + 1, sizeof(table_t *));
    sender_t s = {.a = a, .batch = batch, .e = e, .bulk = bulk, .plain_inserts = plain_inserts};
    if (tables == NULL) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return;
    }
    if (attempt_send(a, batch, step, &s, tables) != 0 || attempt_finish(a, step, &s) != 0)
        attempt_abandon(&s, step);
    sender_free(&s);
    free(tables);
}

/* The first attempt of a batch, sent by ces_apply_send and finished by ces_apply_finish. */
typedef struct async_s {
    sender_t s;
    table_t **tables;
    ces_pgerr_t e;
    ces_batch_t *batch;
    step_t step; /* a whole transaction, or a part of the streamed one */
} async_t;

static void async_free(async_t *as) {
    if (as == NULL)
        return;
    sender_free(&as->s);
    free(as->tables);
    free(as);
}

static int read_one_position(void *opaque, const char *topic, int32_t partition,
                             int64_t *stored) {
    char err[256];
    return ces_apply_read_offsets(opaque, topic, &partition, 1, stored, err, sizeof(err)) ==
                   CES_APPLY_OK
               ? 0
               : -1;
}

static void count_committed(const ces_batch_t *batch, ces_apply_stats_t *stats) {
    if (stats == NULL)
        return;
    for (size_t i = 0; i < batch->count; i++) {
        if (batch->items[i].kind == CES_ITEM_EVENT)
            stats->events_applied++;
        else
            stats->dead_letters++;
    }
}

/* Applies batch as step, retrying as its failures require. first (may be NULL) is the outcome of
 * a first attempt already made (ces_apply_send): the loop starts by handling it. */
static ces_apply_status_t apply_step(ces_apply_t *a, ces_batch_t *batch, step_t step,
                                     const ces_pgerr_t *first, ces_apply_stats_t *stats,
                                     char *errstr, size_t errstr_size) {
    bool commit_unknown = false;
    bool bulk = true, plain_inserts = true;
    for (;;) {
        ces_pgerr_t e = CES_PGERR_INIT;
        if (first != NULL) {
            e = *first;
            first = NULL;
            goto outcome;
        }
        if (step != STEP_WHOLE && !ces_apply_connected(a)) {
            snprintf(errstr, errstr_size, "the connection of the open transaction was lost");
            return CES_APPLY_LOST;
        }
        ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
        if (st != CES_APPLY_OK)
            return st;
        if (commit_unknown && ces_positions_committed(batch, read_one_position, a)) {
            ces_log_info("the batch had been committed before the connection was lost");
            break;
        }
        if (commit_unknown) {
            snprintf(errstr, errstr_size, "the streamed transaction was lost with the connection");
            return CES_APPLY_LOST;
        }
        attempt(a, batch, step, bulk, plain_inserts, &e);
    outcome:
        if (e.cls == CES_PGERR_NONE)
            break;
        if (step != STEP_WHOLE && !ces_pgerr_undoes_only_the_step(e.cls) && e.cls != CES_PGERR_FENCED &&
            e.cls != CES_PGERR_FATAL &&
            !(e.cls == CES_PGERR_RETRY && e.in_commit)) {
            /* The open transaction is gone: what was streamed must be read again. */
            snprintf(errstr, errstr_size, "%s", e.message);
            if (!ces_session_connected(a->session) || e.cls == CES_PGERR_STALE)
                ces_session_disconnect(a->session);
            if (e.cls == CES_PGERR_STALE)
                ces_map_clear(a->tables, table_free, NULL);
            a->stream_epoch = 0;
            return CES_APPLY_LOST;
        }
        switch (e.cls) {
        case CES_PGERR_BULK:
            ces_log_debug("a bulk statement was rejected (%s, SQLSTATE %s): applying the batch "
                          "row by row",
                          e.message, e.sqlstate);
            bulk = false;
            continue;
        case CES_PGERR_INSERT_TAKEN: {
            /* Not a failure: see the bulk path. The table sends upserts for a while. */
            unsigned shift = e.taken->insert_conflicts < 6 ? e.taken->insert_conflicts : 6;
            e.taken->insert_conflicts++;
            e.taken->upsert_until = a->attempts + (64u << shift);
            ces_log_debug("a plain INSERT found a key taken (%s): applying the batch again with "
                          "upserts",
                          e.message);
            plain_inserts = false;
            continue;
        }
        case CES_PGERR_DATA:
            if (e.failed_item >= 0 && (size_t)e.failed_item < batch->count &&
                batch->items[e.failed_item].kind == CES_ITEM_EVENT) {
                ces_item_t *item = &batch->items[e.failed_item];
                char reason[700];
                snprintf(reason, sizeof(reason), "PostgreSQL rejected the change: %s (SQLSTATE %s)",
                         e.message, e.sqlstate);
                ces_log_warning("%s.%s.%s %s at %s[%d]@%lld: %s", item->event.db,
                                item->event.schema, item->event.table,
                                ces_op_name(item->event.op), item->source.topic,
                                (int)item->source.partition, (long long)item->source.offset,
                                reason);
                if (ces_batch_item_reject(item, reason) != 0) {
                    snprintf(errstr, errstr_size, "out of memory");
                    return CES_APPLY_FATAL;
                }
                continue;
            }
            snprintf(errstr, errstr_size, "PostgreSQL rejected ces2pg's own bookkeeping: %s "
                     "(SQLSTATE %s)", e.message, e.sqlstate);
            return CES_APPLY_FATAL;
        case CES_PGERR_STALE:
            ces_log_warning("a target table changed underneath ces2pg (%s); reloading it",
                            e.message);
            ces_map_clear(a->tables, table_free, NULL);
            /* Statements of the old shape may still exist on the server: start a new session
             * (whose epoch makes every statement prepared again). */
            ces_session_disconnect(a->session);
            if (stats)
                stats->retries++;
            continue;
        case CES_PGERR_FENCED:
            snprintf(errstr, errstr_size, "%s", e.message);
            a->stream_epoch = 0;
            return CES_APPLY_FENCED;
        case CES_PGERR_RETRY: {
            if (stats)
                stats->retries++;
            commit_unknown = e.in_commit;
            int64_t ms = ces_session_backoff_next(a->session);
            ces_log_warning("PostgreSQL: %s%s%s; rolling back and retrying the batch in %lld ms",
                            e.message, e.sqlstate[0] ? " SQLSTATE " : "", e.sqlstate,
                            (long long)ms);
            if (!ces_session_connected(a->session))
                ces_session_disconnect(a->session);
            if (ces_session_backoff_sleep(a->session, ms) != 0) {
                snprintf(errstr, errstr_size, "stopped while retrying a batch");
                return CES_APPLY_INTERRUPTED;
            }
            continue;
        }
        default:
            snprintf(errstr, errstr_size, "PostgreSQL: %s%s%s", e.message,
                     e.sqlstate[0] ? " SQLSTATE " : "", e.sqlstate);
            return CES_APPLY_FATAL;
        }
    }
    ces_session_backoff_reset(a->session);
    if (step == STEP_LAST)
        a->stream_epoch = 0;
    count_committed(batch, stats);
    return CES_APPLY_OK;
}

static void between_batches(ces_apply_t *a) {
    ces_janitor_run(a->janitor, a->session, ces_metadata_tombstones(a->metadata));
}

ces_apply_status_t ces_apply_batch(ces_apply_t *a, ces_batch_t *batch, ces_apply_stats_t *stats,
                                   char *errstr, size_t errstr_size) {
    bool whole = !stream_open(a);
    ces_apply_status_t st = apply_step(a, batch, whole ? STEP_WHOLE : STEP_CHUNK, NULL, stats,
                                       errstr, errstr_size);
    if (st == CES_APPLY_OK && whole)
        between_batches(a);
    return st;
}

ces_apply_status_t ces_apply_stream_begin(ces_apply_t *a, char *errstr, size_t errstr_size) {
    ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
    if (st != CES_APPLY_OK)
        return st;
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_session_exec(a->session, "BEGIN", &e) != 0) {
        snprintf(errstr, errstr_size, "%s", e.message);
        if (!ces_session_connected(a->session))
            ces_session_disconnect(a->session);
        return e.cls == CES_PGERR_FATAL ? CES_APPLY_FATAL : CES_APPLY_LOST;
    }
    a->stream_epoch = ces_session_epoch(a->session);
    return CES_APPLY_OK;
}

ces_apply_status_t ces_apply_stream_commit(ces_apply_t *a, ces_batch_t *batch,
                                           ces_apply_stats_t *stats, char *errstr,
                                           size_t errstr_size) {
    return apply_step(a, batch, STEP_LAST, NULL, stats, errstr, errstr_size);
}

ces_apply_status_t ces_apply_send(ces_apply_t *a, ces_batch_t *batch, char *errstr,
                                  size_t errstr_size) {
    if (a->async != NULL) {
        snprintf(errstr, errstr_size, "a batch was sent while another one is open");
        return CES_APPLY_FATAL;
    }
    step_t step = stream_open(a) ? STEP_CHUNK : STEP_WHOLE;
    if (step == STEP_CHUNK && !ces_apply_connected(a)) {
        snprintf(errstr, errstr_size, "the connection of the open transaction was lost");
        a->stream_epoch = 0;
        return CES_APPLY_LOST;
    }
    if (step == STEP_WHOLE) {
        ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
        if (st != CES_APPLY_OK)
            return st;
    }
    async_t *as = calloc(1, sizeof(*as));
    table_t **tables = calloc(batch->count + 1, sizeof(table_t *));
    if (as == NULL || tables == NULL) {
        free(as);
        free(tables);
        snprintf(errstr, errstr_size, "out of memory");
        return CES_APPLY_FATAL;
    }
    as->e = (ces_pgerr_t){.failed_item = -1};
    as->s = (sender_t){.a = a,
                       .batch = batch,
                       .e = &as->e,
                       .bulk = true,
                       .plain_inserts = true,
                       .nonblocking = true};
    as->tables = tables;
    as->batch = batch;
    as->step = step;
    a->async = as;
    /* A failure here is handled by ces_apply_finish like any failed attempt. */
    attempt_send(a, batch, step, &as->s, tables);
    return CES_APPLY_OK;
}

void ces_apply_progress(ces_apply_t *a) {
    async_t *as = a->async;
    if (as == NULL || !as->s.nonblocking || as->e.cls != CES_PGERR_NONE || ces_session_conn(a->session) == NULL)
        return;
    /* Errors show when the batch is finished. */
    if (PQflush(ces_session_conn(a->session)) >= 0)
        PQconsumeInput(ces_session_conn(a->session));
}

bool ces_apply_ready(ces_apply_t *a) {
    async_t *as = a->async;
    if (as == NULL || as->e.cls != CES_PGERR_NONE || ces_session_conn(a->session) == NULL || as->s.drain_done)
        return true;
    /* Trouble of any kind shows when the batch is finished: report ready. */
    if (as->s.nonblocking) {
        int flushed = PQflush(ces_session_conn(a->session));
        if (flushed < 0)
            return true;
        if (flushed == 1) {
            PQconsumeInput(ces_session_conn(a->session)); /* the server may wait for us to read before it reads on */
            return false;
        }
    }
    if (PQconsumeInput(ces_session_conn(a->session)) != 1)
        return true;
    int rc = drain_some(&as->s, false);
    if (rc == 1)
        return false;
    as->s.drain_done = true;
    as->s.drain_rc = rc;
    return true;
}

ces_apply_status_t ces_apply_finish(ces_apply_t *a, ces_apply_stats_t *stats, char *errstr,
                                    size_t errstr_size) {
    async_t *as = a->async;
    if (as == NULL)
        return CES_APPLY_OK;
    a->async = NULL;
    step_t step = as->step;
    if (as->e.cls != CES_PGERR_NONE || attempt_finish(a, step, &as->s) != 0)
        attempt_abandon(&as->s, step);
    ces_batch_t *batch = as->batch;
    ces_pgerr_t e = as->e;
    async_free(as);
    ces_apply_status_t st = apply_step(a, batch, step, &e, stats, errstr, errstr_size);
    if (st == CES_APPLY_OK && step == STEP_WHOLE)
        between_batches(a);
    return st;
}

void ces_apply_stream_abort(ces_apply_t *a) {
    if (!stream_open(a))
        return;
    a->stream_epoch = 0;
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_apply_connected(a) && ces_session_exec(a->session, "ROLLBACK", &e) != 0)
        ces_session_disconnect(a->session);
}

bool ces_apply_streaming(const ces_apply_t *a) { return stream_open(a); }
