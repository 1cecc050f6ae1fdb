#include "apply/catalog.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/decode.h"
#include "util/log.h"
#include "util/map.h"
#include "apply/pgerr.h"
#include "apply/session.h"
#include "util/strbuf.h"

/* Verdicts of type_checks. */
#define TYPE_FITS ((uintptr_t)1)
#define TYPE_CONFLICT ((uintptr_t)2)

/* An event shape, as shape_remember writes it; len 0: none. */
typedef struct {
    char *bytes;
    size_t len, cap;
} shape_t;

/* Shapes remembered per table: an INS, an UPD and a DEL of one table differ in their images. */
#define CATALOG_SHAPES 4

struct ces_catalog_table_s {
    ces_catalog_desc_t desc;
    size_t capacity; /* of desc.cols */
    char *pg_schema;
    char *pg_table;
    ces_map_t *by_source; /* source column name -> index + 1 */
    bool loaded;          /* columns read from the catalog */
    /* The attempt (ces_catalog_ensure) that found it missing and could not create it; 0: none. */
    uint64_t absent_attempt;
    bool preserve_case;
    bool warned_no_old_image;
    bool warned_no_pk;
    ces_map_t *type_checks; /* "column\x1ftype" -> verdict */
    /* The last event shapes that passed every check against this description (see
     * shape_matches), the oldest replaced first; emptied whenever the description is read again. */
    shape_t shapes[CATALOG_SHAPES];
    unsigned next_shape;
    unsigned matched_shape; /* the slot that matched last: the next event most likely matches it */
    char reject_reason[300];
    /* Inserts of new keys go as plain INSERTs from attempt number upsert_until on;
     * insert_conflicts counts the times one found its key taken. */
    uint64_t upsert_until;
    unsigned insert_conflicts;
};

struct ces_catalog_s {
    bool preserve_case;
    bool auto_create;
    bool auto_evolve;
    bool lsn_guard;
    char *target_schema; /* schema.target before its dot, e.g. "{schema}" */
    char *target_table;  /* ... and after it, e.g. "{table}" */
    char *version_column;
    ces_map_t *tables; /* "db\x1fschema\x1ftable" -> ces_catalog_table_t */
    unsigned next_table_id;
    ces_strbuf_t check_key; /* scratch: a type_checks key, grown to the longest seen */
    /* The table the last event resolved to, under its key (also where a key is built): events
     * come in runs of one table, and comparing the names beats building the key and hashing it.
     * Cleared with the tables. */
    ces_catalog_table_t *last;
    size_t last_klen;
    char last_key[3 * (CES_DECODE_MAX_NAME_BYTES + 1)];
};

/* ---------------------------------------------------------------------------------------------- */
/* Pure decisions                                                                                 */

char *ces_catalog_fold_name(const char *name, bool preserve_case) {
    size_t len = strlen(name);
    if (len > CES_CATALOG_NAME_MAX) {
        len = CES_CATALOG_NAME_MAX;
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

char *ces_catalog_expand_target(const char *pattern, const ces_event_t *ev) {
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
    if (out.failed) {
        ces_strbuf_free(&out);
        return NULL;
    }
    return out.buf != NULL ? out.buf : strdup("");
}

const char *ces_catalog_new_column_type(const ces_event_t *ev, const char *source_name, char *buf,
                                        size_t size) {
    const char *type = NULL;
    for (size_t i = 0; i < ev->ncols && type == NULL; i++) {
        if (strcmp(ev->cols[i].name, source_name) == 0)
            type = ev->cols[i].type;
    }
    if (type == NULL) {
        snprintf(buf, size, "text");
        return NULL;
    }
    return ces_types_map(type, buf, size) ? NULL : type;
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

static int namelist_add_fields(namelist_t *l, const ces_field_t *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (namelist_add(l, fields[i].name) != 0)
            return -1;
    }
    return 0;
}

static int event_column_names(const ces_event_t *ev, namelist_t *l) {
    for (size_t i = 0; i < ev->ncols; i++) {
        if (namelist_add(l, ev->cols[i].name) != 0)
            return -1;
    }
    if (namelist_add_fields(l, ev->pkkey, ev->npkkey) != 0 ||
        namelist_add_fields(l, ev->current, ev->ncurrent) != 0 ||
        namelist_add_fields(l, ev->old, ev->nold) != 0)
        return -1;
    return 0;
}

static long column_index(const ces_catalog_desc_t *t, const char *pg_name) {
    for (size_t i = 0; i < t->ncols; i++) {
        if (strcmp(t->cols[i].name, pg_name) == 0)
            return (long)i;
    }
    return -1;
}

int ces_catalog_missing_columns(const ces_catalog_desc_t *t, bool preserve_case,
                                const ces_event_t *ev, const char ***missing, size_t *nmissing) {
    namelist_t names = {0};
    int rc = -1;
    *missing = NULL;
    *nmissing = 0;
    if (event_column_names(ev, &names) != 0 ||
        (*missing = calloc(names.count + 1, sizeof(char *))) == NULL)
        goto done;
    for (size_t i = 0; i < names.count; i++) {
        char *folded = ces_catalog_fold_name(names.names[i], preserve_case);
        if (folded == NULL)
            goto done;
        if (column_index(t, folded) < 0)
            (*missing)[(*nmissing)++] = names.names[i];
        free(folded);
    }
    rc = 0;
done:
    if (rc != 0) {
        free(*missing);
        *missing = NULL;
        *nmissing = 0;
    }
    free(names.names);
    return rc;
}

bool ces_catalog_type_conflicts(const char *target_cast, const char *source_type) {
    char mapped[64];
    ces_types_map(source_type, mapped, sizeof(mapped));
    const char *dot = strrchr(target_cast, '.');
    const char *typname = dot ? dot + 1 : target_cast;
    /* format('%I') quotes type names that are keywords: pg_catalog."numeric", "varchar", "time",
     * "timestamp". A quoted name with a quote inside is no built-in type: it stays as it is. */
    char unquoted[64];
    size_t len = strlen(typname);
    if (len >= 2 && len < sizeof(unquoted) && typname[0] == '"' && typname[len - 1] == '"' &&
        memchr(typname + 1, '"', len - 2) == NULL) {
        memcpy(unquoted, typname + 1, len - 2);
        unquoted[len - 2] = '\0';
        typname = unquoted;
    }
    return !ces_types_compatible(typname, mapped);
}

uint64_t ces_catalog_upsert_attempts(unsigned taken_before) {
    unsigned doublings = taken_before < CES_CATALOG_UPSERT_MAX_DOUBLINGS
                             ? taken_before
                             : CES_CATALOG_UPSERT_MAX_DOUBLINGS;
    return (uint64_t)CES_CATALOG_UPSERT_ATTEMPTS << doublings;
}

/* ---------------------------------------------------------------------------------------------- */
/* Tables                                                                                         */

static void column_free(ces_catalog_column_t *c) {
    free(c->name);
    free(c->type);
    free(c->cast);
    free(c->quoted);
}

static void table_free(void *value, void *arg) {
    (void)arg;
    ces_catalog_table_t *t = value;
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->desc.ncols; i++)
        column_free(&t->desc.cols[i]);
    free(t->desc.cols);
    free(t->desc.pk);
    free(t->desc.qualified);
    ces_map_destroy(t->by_source);
    ces_map_destroy(t->type_checks);
    for (size_t i = 0; i < CATALOG_SHAPES; i++)
        free(t->shapes[i].bytes);
    free(t->pg_schema);
    free(t->pg_table);
    free(t);
}

ces_catalog_t *ces_catalog_new(const ces_catalog_options_t *o) {
    ces_catalog_t *cat = calloc(1, sizeof(*cat));
    if (cat == NULL)
        return NULL;
    cat->preserve_case = o->preserve_case;
    cat->auto_create = o->auto_create;
    cat->auto_evolve = o->auto_evolve;
    cat->lsn_guard = o->lsn_guard;
    const char *target = o->target ? o->target : "{schema}.{table}";
    const char *dot = strchr(target, '.');
    cat->target_schema = dot ? strndup(target, (size_t)(dot - target)) : strdup("public");
    cat->target_table = strdup(dot ? dot + 1 : target);
    cat->version_column = strdup(o->version_column ? o->version_column : "_ces_lsn");
    cat->tables = ces_map_new();
    if (!cat->target_schema || !cat->target_table || !cat->version_column || !cat->tables) {
        ces_catalog_destroy(cat);
        return NULL;
    }
    return cat;
}

void ces_catalog_destroy(ces_catalog_t *cat) {
    if (cat == NULL)
        return;
    if (cat->tables != NULL)
        ces_map_clear(cat->tables, table_free, NULL);
    ces_map_destroy(cat->tables);
    free(cat->target_schema);
    free(cat->target_table);
    free(cat->version_column);
    ces_strbuf_free(&cat->check_key);
    free(cat);
}

void ces_catalog_forget(ces_catalog_t *cat) {
    cat->last = NULL;
    ces_map_clear(cat->tables, table_free, NULL);
}

const ces_catalog_desc_t *ces_catalog_desc(const ces_catalog_table_t *t) { return &t->desc; }

bool ces_catalog_note_no_old_image(ces_catalog_table_t *t) {
    if (t->warned_no_old_image)
        return false;
    t->warned_no_old_image = true;
    return true;
}

bool ces_catalog_plain_inserts(const ces_catalog_table_t *t, uint64_t attempt) {
    return attempt >= t->upsert_until;
}

void ces_catalog_insert_taken(ces_catalog_table_t *t, uint64_t attempt) {
    t->upsert_until = attempt + ces_catalog_upsert_attempts(t->insert_conflicts);
    t->insert_conflicts++;
}

long ces_catalog_resolve_column(ces_catalog_table_t *t, const char *source_name) {
    uintptr_t v = (uintptr_t)ces_map_get(t->by_source, source_name, strlen(source_name));
    if (v != 0)
        return (long)v - 1;
    char *f = ces_catalog_fold_name(source_name, t->preserve_case);
    if (f == NULL)
        return -1;
    long idx = column_index(&t->desc, f);
    free(f);
    if (idx >= 0)
        ces_map_put(t->by_source, source_name, strlen(source_name), (void *)(uintptr_t)(idx + 1));
    return idx;
}

static int table_add_column(ces_catalog_table_t *t, const char *name, const char *type,
                            const char *cast, const ces_session_t *session) {
    ces_catalog_desc_t *d = &t->desc;
    if (d->ncols == t->capacity) {
        size_t cap = t->capacity ? t->capacity * 2 : 16;
        ces_catalog_column_t *cols = realloc(d->cols, cap * sizeof(*cols));
        if (cols == NULL)
            return -1;
        d->cols = cols;
        t->capacity = cap;
    }
    ces_catalog_column_t *c = &d->cols[d->ncols++];
    c->name = strdup(name);
    c->type = strdup(type);
    c->cast = strdup(cast);
    c->quoted = ces_session_quote(session, name);
    c->conv = ces_types_conversion(type);
    return c->name && c->type && c->cast && c->quoted ? 0 : -1;
}

/* Reads the table's columns and primary key from the catalog. Returns 1 when the table exists, 0
 * when it does not, -1 on error (in e). */
static int table_load(const ces_catalog_t *cat, ces_session_t *session, ces_catalog_table_t *t,
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
    ces_catalog_desc_t *d = &t->desc;
    PGconn *conn = ces_session_conn(session);
    const char *params[2] = {t->pg_schema, t->pg_table};
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
    ces_map_clear(t->by_source, NULL, NULL);
    ces_map_clear(t->type_checks, NULL, NULL);
    for (size_t i = 0; i < CATALOG_SHAPES; i++)
        t->shapes[i].len = 0;
    int rows = PQntuples(r);
    free(d->pk);
    d->pk = calloc((size_t)rows + 1, sizeof(size_t));
    if (d->pk == NULL)
        goto nomem;
    for (int row = 0; row < rows; row++) {
        if (table_add_column(t, PQgetvalue(r, row, 0), PQgetvalue(r, row, 1),
                             PQgetvalue(r, row, 3), session) != 0)
            goto nomem;
        if (cat->lsn_guard && strcmp(PQgetvalue(r, row, 0), cat->version_column) == 0)
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

/* The type of a new column (ces_catalog_new_column_type), warning about an unmapped one. */
static void new_column_type(const ces_event_t *ev, const char *source_name, char *buf, size_t size,
                            const char *table_name) {
    const char *unmapped = ces_catalog_new_column_type(ev, source_name, buf, size);
    if (unmapped != NULL)
        ces_log_warning("table %s: column '%s' has SQL Server type '%s' with no mapping; stored "
                        "as text",
                        table_name, source_name, unmapped);
}

/* Appends the quoted, folded source name; -1 when out of memory. */
static int add_folded_name(ces_strbuf_t *sql, const ces_session_t *session, const char *name,
                           bool preserve_case) {
    char *f = ces_catalog_fold_name(name, preserve_case);
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
static int add_new_columns(ces_strbuf_t *sql, const ces_catalog_t *cat,
                           const ces_session_t *session, const ces_catalog_table_t *t,
                           const ces_event_t *ev) {
    namelist_t names = {0};
    char **folded = NULL;
    int rc = -1;
    if (event_column_names(ev, &names) != 0 ||
        (folded = calloc(names.count + 1, sizeof(char *))) == NULL)
        goto done;
    size_t ncols = 0;
    for (size_t i = 0; i < names.count; i++) {
        folded[i] = ces_catalog_fold_name(names.names[i], cat->preserve_case);
        if (folded[i] == NULL)
            goto done;
        bool dup = false;
        for (size_t j = 0; j < i; j++)
            dup = dup || strcmp(folded[j], folded[i]) == 0;
        if (dup)
            continue;
        char type[64];
        new_column_type(ev, names.names[i], type, sizeof(type), t->desc.qualified);
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
        for (size_t i = 0; i < names.count; i++)
            free(folded[i]);
    }
    free(folded);
    free(names.names);
    return rc;
}

/* CREATE SCHEMA and CREATE TABLE from the event's columns, with its pkkey as the primary key.
 * Returns -1 when out of memory. */
static int create_table_sql(ces_strbuf_t *sql, const ces_catalog_t *cat,
                            const ces_session_t *session, const char *version_quoted,
                            const ces_catalog_table_t *t, const ces_event_t *ev) {
    char *schema = ces_session_quote(session, t->pg_schema);
    if (schema == NULL)
        return -1;
    ces_strbuf_add(sql, "CREATE SCHEMA IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    free(schema);
    ces_strbuf_add(sql, ";\nCREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, t->desc.qualified);
    ces_strbuf_add(sql, " (");
    if (add_new_columns(sql, cat, session, t, ev) != 0)
        return -1;
    if (cat->lsn_guard) {
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, version_quoted);
        ces_strbuf_add(sql, " numeric");
    }
    ces_strbuf_add(sql, ", PRIMARY KEY (");
    for (size_t i = 0; i < ev->npkkey; i++) {
        ces_strbuf_add(sql, i ? ", " : "");
        if (add_folded_name(sql, session, ev->pkkey[i].name, cat->preserve_case) != 0)
            return -1;
    }
    ces_strbuf_add(sql, "))");
    return sql->failed ? -1 : 0;
}

static int table_create(const ces_catalog_t *cat, ces_session_t *session,
                        const char *version_quoted, const ces_catalog_table_t *t,
                        const ces_event_t *ev, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    int rc = -1;
    if (create_table_sql(&sql, cat, session, version_quoted, t, ev) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    } else {
        ces_log_info("creating table %s", t->desc.qualified);
        rc = ces_session_exec_ddl(session, sql.buf, e);
    }
    ces_strbuf_free(&sql);
    return rc;
}

/* Adds the event's columns that the table lacks (never drops or retypes). */
static int table_evolve(const ces_catalog_t *cat, ces_session_t *session,
                        const ces_catalog_table_t *t, const ces_event_t *ev, const char **missing,
                        size_t nmissing, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, t->desc.qualified);
    for (size_t i = 0; i < nmissing; i++) {
        char type[64];
        new_column_type(ev, missing[i], type, sizeof(type), t->desc.qualified);
        ces_strbuf_add(&sql, i ? ", ADD COLUMN IF NOT EXISTS " : " ADD COLUMN IF NOT EXISTS ");
        if (add_folded_name(&sql, session, missing[i], cat->preserve_case) != 0) {
            ces_strbuf_free(&sql);
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
        ces_strbuf_add(&sql, " ");
        ces_strbuf_add(&sql, type);
        ces_log_info("table %s: adding column for '%s' (%s)", t->desc.qualified, missing[i], type);
    }
    int rc = sql.failed ? -1 : ces_session_exec_ddl(session, sql.buf, e);
    if (sql.failed)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    ces_strbuf_free(&sql);
    return rc;
}

/* A table made before ces2pg (a backfill) is adopted: NULL is older than any event. */
static int table_adopt(ces_session_t *session, const char *version_quoted,
                       const ces_catalog_table_t *t, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "ALTER TABLE ");
    ces_strbuf_add(&sql, t->desc.qualified);
    ces_strbuf_add(&sql, " ADD COLUMN IF NOT EXISTS ");
    ces_strbuf_add(&sql, version_quoted);
    ces_strbuf_add(&sql, " numeric");
    ces_log_info("table %s: adding the version column %s", t->desc.qualified, version_quoted);
    int rc = -1;
    if (sql.failed)
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    else
        rc = ces_session_exec_ddl(session, sql.buf, e);
    ces_strbuf_free(&sql);
    return rc;
}

/* The verdict on one (column, type), cached in t->type_checks; 0 when out of memory. Each
 * conflict is logged once. */
static uintptr_t column_verdict(ces_catalog_t *cat, ces_catalog_table_t *t, const ces_column_t *c) {
    /* The key is as long as the name and type are, never cut: a cut key could give one column's
     * verdict to another. */
    ces_strbuf_t *key = &cat->check_key;
    ces_strbuf_reset(key);
    ces_strbuf_add(key, c->name);
    ces_strbuf_add(key, "\x1f");
    ces_strbuf_add(key, c->type);
    if (key->failed)
        return 0;
    uintptr_t verdict = (uintptr_t)ces_map_get(t->type_checks, key->buf, key->len);
    if (verdict != 0)
        return verdict;
    long col = ces_catalog_resolve_column(t, c->name);
    const ces_catalog_column_t *target = col >= 0 ? &t->desc.cols[col] : NULL;
    verdict = target == NULL || !ces_catalog_type_conflicts(target->cast, c->type) ? TYPE_FITS
                                                                                   : TYPE_CONFLICT;
    if (verdict == TYPE_CONFLICT)
        ces_log_warning("table %s: type conflict: column %s is %s in PostgreSQL, but the "
                        "source now sends %s; its events go to the dead-letter table",
                        t->desc.qualified, target->name, target->type, c->type);
    if (ces_map_put(t->type_checks, key->buf, key->len, (void *)verdict) != 0)
        return 0;
    return verdict;
}

/*
 * A source column whose type no longer fits its target column (say int became nvarchar) is a type
 * conflict: columns are never retyped, so the event is dead-lettered. Verdicts are cached per
 * (column, type); an event of a shape that passed skips this (shape_known). *unchecked: memory
 * ran out before every column was judged.
 */
static bool type_conflict(ces_catalog_t *cat, ces_catalog_table_t *t, const ces_event_t *ev,
                          ces_reject_t *reject, bool *unchecked) {
    *unchecked = false;
    for (size_t i = 0; i < ev->ncols; i++) {
        const ces_column_t *c = &ev->cols[i];
        uintptr_t verdict = column_verdict(cat, t, c);
        if (verdict == 0) {
            *unchecked = true; /* out of memory: check again next time */
            return false;
        }
        if (verdict == TYPE_CONFLICT) {
            snprintf(t->reject_reason, sizeof(t->reject_reason),
                     "type conflict: source column '%.128s' is %.40s, which its target column "
                     "cannot hold (columns are never retyped)",
                     c->name, c->type);
            *reject = (ces_reject_t){CES_DL_TYPE_CONFLICT, t->reject_reason};
            return true;
        }
    }
    return false;
}

static bool fields_known(ces_catalog_table_t *t, const ces_field_t *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (ces_catalog_resolve_column(t, fields[i].name) < 0)
            return false;
    }
    return true;
}

static bool all_columns_known(ces_catalog_table_t *t, const ces_event_t *ev) {
    for (size_t i = 0; i < ev->ncols; i++) {
        if (ces_catalog_resolve_column(t, ev->cols[i].name) < 0)
            return false;
    }
    return fields_known(t, ev->pkkey, ev->npkkey) && fields_known(t, ev->current, ev->ncurrent) &&
           fields_known(t, ev->old, ev->nold);
}

static ces_catalog_table_t *table_new(ces_catalog_t *cat, const ces_session_t *session,
                                      const ces_event_t *ev) {
    ces_catalog_table_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->desc.id = ++cat->next_table_id;
    t->desc.version_col = -1;
    t->by_source = ces_map_new();
    t->type_checks = ces_map_new();
    t->preserve_case = cat->preserve_case;
    char *schema = ces_catalog_expand_target(cat->target_schema, ev);
    char *table = ces_catalog_expand_target(cat->target_table, ev);
    t->pg_schema = schema ? ces_catalog_fold_name(schema, cat->preserve_case) : NULL;
    t->pg_table = table ? ces_catalog_fold_name(table, cat->preserve_case) : NULL;
    free(schema);
    free(table);
    char *qs = t->pg_schema ? ces_session_quote(session, t->pg_schema) : NULL;
    char *qt = t->pg_table ? ces_session_quote(session, t->pg_table) : NULL;
    if (qs && qt && t->by_source && t->type_checks) {
        t->desc.qualified = malloc(strlen(qs) + strlen(qt) + 2);
        if (t->desc.qualified)
            sprintf(t->desc.qualified, "%s.%s", qs, qt);
    }
    free(qs);
    free(qt);
    if (t->desc.qualified == NULL) {
        table_free(t, NULL);
        return NULL;
    }
    return t;
}

/* The event is refused: its table has no primary key (warned once per table). */
static void reject_no_pk(ces_catalog_table_t *t, const ces_event_t *ev, ces_reject_t *reject) {
    if (!t->warned_no_pk) {
        ces_log_warning("table %s.%s.%s has no primary key: its events go to the dead-letter table",
                        ev->db, ev->schema, ev->table);
        t->warned_no_pk = true;
    }
    *reject = (ces_reject_t){CES_DL_NO_PRIMARY_KEY,
                             "table has no primary key (ces2pg applies changes by primary key)"};
}

/* Whether ev is refused because its table does not exist and cannot be created for it (sets
 * *reject). */
static bool refuse_missing(const ces_catalog_t *cat, ces_catalog_table_t *t, const ces_event_t *ev,
                           ces_reject_t *reject) {
    if (ev->npkkey == 0) {
        reject_no_pk(t, ev, reject);
        return true;
    }
    if (!cat->auto_create) {
        *reject = (ces_reject_t){CES_DL_SCHEMA,
                                 "target table does not exist and schema.auto_create is off"};
        return true;
    }
    return false;
}

/* Reads t from pg_catalog the first time it is needed, creating it when it does not exist and
 * adopting it when it lacks the version column. Returns 0, or -1 with e or *reject set. */
static int table_first_load(ces_catalog_t *cat, ces_session_t *session, const char *version_quoted,
                            ces_catalog_table_t *t, const ces_event_t *ev, uint64_t attempt,
                            ces_reject_t *reject, ces_pgerr_t *e) {
    int exists = table_load(cat, session, t, e);
    if (exists < 0)
        return -1;
    if (exists == 0) {
        if (refuse_missing(cat, t, ev, reject)) {
            t->absent_attempt = attempt;
            return -1;
        }
        if (table_create(cat, session, version_quoted, t, ev, e) != 0)
            return -1;
        int created = table_load(cat, session, t, e);
        if (created == 0)
            ces_pgerr_set(e, CES_PGERR_STALE, -1, NULL, "table %s vanished after it was created",
                          t->desc.qualified);
        if (created <= 0)
            return -1;
    }
    if (cat->lsn_guard && t->desc.version_col < 0 &&
        (table_adopt(session, version_quoted, t, e) != 0 || table_load(cat, session, t, e) < 0))
        return -1;
    t->loaded = true;
    return 0;
}

/* Adds the columns this event needs that the table does not have yet (fresh: t was just read).
 * Returns 0, or -1 with e or *reject set. */
static int table_add_missing(const ces_catalog_t *cat, ces_session_t *session,
                             ces_catalog_table_t *t, const ces_event_t *ev, bool fresh,
                             ces_reject_t *reject, ces_pgerr_t *e) {
    const char **missing;
    size_t nmissing;
    if (ces_catalog_missing_columns(&t->desc, cat->preserve_case, ev, &missing, &nmissing) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    if (nmissing > 0 && !cat->auto_evolve) {
        free(missing);
        *reject = (ces_reject_t){CES_DL_SCHEMA, "the event has columns the target table lacks "
                                                "and schema.auto_evolve is off"};
        return -1;
    }
    int rc = nmissing == 0 || fresh ? 0 : table_load(cat, session, t, e); /* someone else may
                                                                           * have added them */
    if (rc >= 0 && nmissing > 0) {
        size_t still = 0;
        for (size_t i = 0; i < nmissing; i++) {
            if (ces_catalog_resolve_column(t, missing[i]) < 0)
                missing[still++] = missing[i];
        }
        nmissing = still;
        if (nmissing > 0 && (table_evolve(cat, session, t, ev, missing, nmissing, e) != 0 ||
                             table_load(cat, session, t, e) < 0))
            rc = -1;
    }
    for (size_t i = 0; rc >= 0 && i < nmissing; i++) {
        if (ces_catalog_resolve_column(t, missing[i]) < 0)
            *reject = (ces_reject_t){CES_DL_SCHEMA,
                                     "a column of the event could not be added to the target table"};
    }
    free(missing);
    return rc < 0 || reject->reason != NULL ? -1 : 0;
}

/*
 * An event's shape: the counts of its column list and images, then every column name and type and
 * every field name of pkkey, current and old, each with its NUL (what a compact copy holds in one
 * run, ces_event_t's shape, compared with one memcmp). Events of a table nearly always repeat a
 * few shapes, so the table keeps the last shapes that passed every check, and an event of exactly
 * such a shape (a byte-for-byte comparison, so no collision can let an unchecked shape through)
 * needs no name lookups and no type checks: they would give the same answers against the same
 * description.
 */
static bool shape_text_matches(const char **cursor, const char *end, const char *s) {
    const char *c = *cursor;
    for (;; c++, s++) {
        if (c == end || *c != *s)
            return false;
        if (*s == '\0')
            break;
    }
    *cursor = c + 1;
    return true;
}

static bool shape_fields_match(const char **cursor, const char *end, const ces_field_t *f,
                               size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!shape_text_matches(cursor, end, f[i].name))
            return false;
    }
    return true;
}

static bool shape_matches(const shape_t *shape, const ces_event_t *ev) {
    const size_t counts[4] = {ev->ncols, ev->npkkey, ev->ncurrent, ev->nold};
    if (shape->len < sizeof(counts))
        return false;
    /* Compared as four words, not with memcmp: a table's INS, UPD and DEL shapes differ in their
     * counts, and on `mixed` (INS, UPD and DEL interleaved) most shapes tried differ there. */
    size_t known[4];
    memcpy(known, shape->bytes, sizeof(known));
    if (known[0] != counts[0] || known[1] != counts[1] || known[2] != counts[2] ||
        known[3] != counts[3])
        return false;
    if (ev->shape != NULL) /* a compact copy holds its shape's names as written here */
        return shape->len - sizeof(counts) == ev->shape_len &&
               memcmp(shape->bytes + sizeof(counts), ev->shape, ev->shape_len) == 0;
    const char *cursor = shape->bytes + sizeof(counts), *end = shape->bytes + shape->len;
    for (size_t i = 0; i < ev->ncols; i++) {
        if (!shape_text_matches(&cursor, end, ev->cols[i].name) ||
            !shape_text_matches(&cursor, end, ev->cols[i].type))
            return false;
    }
    return shape_fields_match(&cursor, end, ev->pkkey, ev->npkkey) &&
           shape_fields_match(&cursor, end, ev->current, ev->ncurrent) &&
           shape_fields_match(&cursor, end, ev->old, ev->nold) && cursor == end;
}

static bool shape_known(ces_catalog_table_t *t, const ces_event_t *ev) {
    for (unsigned i = 0; i < CATALOG_SHAPES; i++) {
        unsigned slot = (t->matched_shape + i) % CATALOG_SHAPES;
        if (shape_matches(&t->shapes[slot], ev)) {
            t->matched_shape = slot;
            return true;
        }
    }
    return false;
}

/* Appends n bytes to the shape being written; false when out of memory. */
static bool shape_put(shape_t *shape, const void *bytes, size_t n) {
    if (shape->cap - shape->len < n) {
        size_t cap = shape->cap ? shape->cap : 256;
        while (cap - shape->len < n)
            cap *= 2;
        char *bigger = realloc(shape->bytes, cap);
        if (bigger == NULL)
            return false;
        shape->bytes = bigger;
        shape->cap = cap;
    }
    memcpy(shape->bytes + shape->len, bytes, n);
    shape->len += n;
    return true;
}

static bool shape_put_text(shape_t *shape, const char *s) {
    return shape_put(shape, s, strlen(s) + 1);
}

static bool shape_put_fields(shape_t *shape, const ces_field_t *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!shape_put_text(shape, f[i].name))
            return false;
    }
    return true;
}

/* Keeps ev's shape as one that passed, in place of the oldest (out of memory: that slot keeps
 * none, which only costs time). */
static void shape_remember(ces_catalog_table_t *t, const ces_event_t *ev) {
    shape_t *shape = &t->shapes[t->next_shape];
    t->next_shape = (t->next_shape + 1) % CATALOG_SHAPES;
    const size_t counts[4] = {ev->ncols, ev->npkkey, ev->ncurrent, ev->nold};
    shape->len = 0;
    bool ok = shape_put(shape, counts, sizeof(counts));
    if (ev->shape != NULL) {
        if (!ok || !shape_put(shape, ev->shape, ev->shape_len))
            shape->len = 0;
        return;
    }
    for (size_t i = 0; ok && i < ev->ncols; i++)
        ok = shape_put_text(shape, ev->cols[i].name) && shape_put_text(shape, ev->cols[i].type);
    ok = ok && shape_put_fields(shape, ev->pkkey, ev->npkkey) &&
         shape_put_fields(shape, ev->current, ev->ncurrent) &&
         shape_put_fields(shape, ev->old, ev->nold);
    if (!ok)
        shape->len = 0;
}

ces_catalog_table_t *ces_catalog_ensure(ces_catalog_t *cat, ces_session_t *session,
                                        const char *version_quoted, const ces_event_t *ev,
                                        uint64_t attempt, ces_reject_t *reject, ces_pgerr_t *e) {
    const char *parts[] = {ev->db, ev->schema, ev->table};
    ces_catalog_table_t *t = cat->last;
    if (t == NULL || !ces_map_key_is(cat->last_key, cat->last_klen, '\x1f', parts, 3)) {
        /* Names are bounded by the decoder, so the key is never cut. */
        size_t klen = ces_map_key(cat->last_key, sizeof(cat->last_key), '\x1f', parts, 3);
        cat->last = NULL;
        t = ces_map_get(cat->tables, cat->last_key, klen);
        if (t == NULL) {
            t = table_new(cat, session, ev);
            if (t == NULL || ces_map_put(cat->tables, cat->last_key, klen, t) != 0) {
                table_free(t, NULL);
                ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
                return NULL;
            }
        }
        cat->last = t;
        cat->last_klen = klen;
    }
    if (t->loaded && shape_known(t, ev))
        return t;
    bool fresh = false;
    if (!t->loaded) {
        /* Found missing earlier in this attempt: asking the server again for each of its events
         * would be a round trip each (a stream of a table left out of a replica is dead-lettered
         * at the rate of those). A table created meanwhile is found by the next attempt. */
        if (t->absent_attempt == attempt && refuse_missing(cat, t, ev, reject))
            return NULL;
        if (table_first_load(cat, session, version_quoted, t, ev, attempt, reject, e) != 0)
            return NULL;
        fresh = true;
    }
    if (t->desc.npk == 0) {
        reject_no_pk(t, ev, reject);
        return NULL;
    }
    /* The common case, cheaply: every column the event names is known (hash lookups only). */
    if (!all_columns_known(t, ev) &&
        table_add_missing(cat, session, t, ev, fresh, reject, e) != 0)
        return NULL;
    bool unchecked;
    if (type_conflict(cat, t, ev, reject, &unchecked))
        return NULL;
    if (!unchecked)
        shape_remember(t, ev);
    return t;
}
