#include "apply/sqltext.h"

/* How a statement refers to its value number i (1-based): a parameter "$i" for one row, or column
 * "s.ci" of the unnest() of one array parameter per value, for many rows (see the bulk path). */
static void add_ref(ces_strbuf_t *sql, bool bulk, size_t i) {
    ces_strbuf_addf(sql, bulk ? "s.c%zu" : "$%zu", i);
}

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
static void add_key_array(ces_strbuf_t *sql, const ces_catalog_desc_t *t, bool bulk,
                          const size_t *refs) {
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

static bool is_key_column(const ces_catalog_desc_t *t, long col) {
    for (size_t k = 0; k < t->npk; k++) {
        if ((size_t)col == t->pk[k])
            return true;
    }
    return false;
}

/* The values as a SELECT list (typed: in INSERT ... SELECT they take no type from the target
 * columns; the casts drop the type modifier, so the assignment still checks length and precision),
 * FROM the unnest() of a bulk statement, and, guarded, the tombstone check. */
static void add_insert_select(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                              const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk,
                              const size_t *key_refs) {
    bool guard = ces_catalog_guarded(t);
    size_t version_ref = n + 1;
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
         * of the table; a scalar subquery is one index lookup of the key per row. It comes
         * behind an uncorrelated EXISTS, which PostgreSQL runs once per statement (an InitPlan)
         * and which skips the per-row lookup, and building its key, for a table without
         * tombstones: about a fifth of what PostgreSQL spends inserting such rows. */
        ces_strbuf_add(sql, " WHERE NOT (EXISTS (SELECT FROM ");
        ces_strbuf_add(sql, names->tombstones);
        ces_strbuf_addf(sql, " WHERE relid = %u) AND coalesce((SELECT ts.version > ", t->oid);
        add_ref(sql, bulk, version_ref);
        ces_strbuf_add(sql, "::numeric FROM ");
        ces_strbuf_add(sql, names->tombstones);
        ces_strbuf_addf(sql, " ts WHERE ts.relid = %u AND ts.key = ", t->oid);
        add_key_array(sql, t, bulk, key_refs);
        ces_strbuf_add(sql, "), false))");
    }
}

/* ON CONFLICT (pk) DO UPDATE SET of the columns other than the key; guarded, only when the row is
 * older than the event. */
static void add_on_conflict(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                            const ces_catalog_desc_t *t, const long *cols, size_t n) {
    ces_strbuf_add(sql, " ON CONFLICT (");
    for (size_t k = 0; k < t->npk; k++) {
        ces_strbuf_add(sql, k ? ", " : "");
        ces_strbuf_add(sql, t->cols[t->pk[k]].quoted);
    }
    ces_strbuf_add(sql, ") DO ");
    size_t updates = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_key_column(t, cols[i]))
            continue;
        ces_strbuf_add(sql, updates++ ? ", " : "UPDATE SET ");
        ces_strbuf_add(sql, t->cols[cols[i]].quoted);
        ces_strbuf_add(sql, " = EXCLUDED.");
        ces_strbuf_add(sql, t->cols[cols[i]].quoted);
    }
    if (ces_catalog_soft_deletes(t)) { /* an insert or update of the key undoes a soft delete */
        ces_strbuf_add(sql, updates++ ? ", " : "UPDATE SET ");
        ces_strbuf_add(sql, t->cols[t->deleted_col].quoted);
        ces_strbuf_add(sql, " = NULL");
    }
    if (ces_catalog_guarded(t)) {
        ces_strbuf_add(sql, updates++ ? ", " : "UPDATE SET ");
        ces_strbuf_add(sql, names->version);
        ces_strbuf_add(sql, " = EXCLUDED.");
        ces_strbuf_add(sql, names->version);
        ces_strbuf_add(sql, " WHERE t.");
        ces_strbuf_add(sql, names->version);
        ces_strbuf_add(sql, " IS NULL OR t.");
        ces_strbuf_add(sql, names->version);
        ces_strbuf_add(sql, " < EXCLUDED.");
        ces_strbuf_add(sql, names->version);
    }
    if (updates == 0)
        ces_strbuf_add(sql, "NOTHING");
}

/*
 * INSERT with the columns present, for one row or (bulk) for the rows of arrays. With the version
 * guard, a row is not inserted when a newer delete left a tombstone for its key. With upsert, ON
 * CONFLICT (pk) DO UPDATE; without, a taken key fails it.
 */
static void add_insert(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                       const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk,
                       bool upsert) {
    bool guard = ces_catalog_guarded(t);
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
        ces_strbuf_add(sql, names->version);
    }
    if (guard || bulk) {
        add_insert_select(sql, names, t, cols, n, bulk, key_refs);
    } else {
        ces_strbuf_add(sql, ") VALUES (");
        for (size_t i = 0; i < n; i++)
            ces_strbuf_addf(sql, "%s$%zu", i ? ", " : "", i + 1);
        ces_strbuf_add(sql, ")");
    }
    if (upsert)
        add_on_conflict(sql, names, t, cols, n);
}

void ces_sqltext_upsert(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                        const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk) {
    add_insert(sql, names, t, cols, n, bulk, true);
}

void ces_sqltext_insert(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                        const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk) {
    add_insert(sql, names, t, cols, n, bulk, false);
}

/* " AND (the row's version is NULL or older than the event's, value version_ref)": a guarded
 * delete's condition. */
static void add_row_older(ces_strbuf_t *sql, const ces_sqltext_names_t *names, bool bulk,
                          size_t version_ref) {
    ces_strbuf_add(sql, " AND (t.");
    ces_strbuf_add(sql, names->version);
    ces_strbuf_add(sql, " IS NULL OR t.");
    ces_strbuf_add(sql, names->version);
    ces_strbuf_add(sql, " < ");
    add_ref(sql, bulk, version_ref);
    ces_strbuf_add(sql, "::numeric)");
}

/* The key: t.k1 = $1::cast AND ... (s.c1 for many rows). */
static void add_key_match(ces_strbuf_t *sql, const ces_catalog_desc_t *t, bool bulk) {
    for (size_t k = 0; k < t->npk; k++) {
        ces_strbuf_add(sql, k ? " AND " : "");
        ces_strbuf_add(sql, "t.");
        ces_strbuf_add(sql, t->cols[t->pk[k]].quoted);
        ces_strbuf_add(sql, " = ");
        add_ref(sql, bulk, k + 1);
        ces_strbuf_add(sql, "::");
        ces_strbuf_add(sql, t->cols[t->pk[k]].cast);
    }
}

/*
 * A soft delete: the row stays, its deleted column is set to the commit time (the value after the
 * key and the version; now() when the event has none) and, guarded, its version raised, when the
 * row is older than the event. The row itself then remembers the delete: an older change resent
 * later finds a newer version and changes nothing. Only a key with no row gets a tombstone, so
 * that an older insert cannot create the row the delete found absent.
 */
static void add_soft_delete(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                            const ces_catalog_desc_t *t, bool bulk) {
    bool guard = ces_catalog_guarded(t);
    size_t n = t->npk, version_ref = n + 1, time_ref = guard ? n + 2 : n + 1;
    size_t key_refs[t->npk + 1];
    for (size_t k = 0; k < n; k++)
        key_refs[k] = k + 1;
    if (bulk) {
        ces_strbuf_add(sql, "WITH s AS (SELECT * FROM ");
        add_unnest(sql, time_ref);
        ces_strbuf_add(sql, guard ? "), marked AS (UPDATE " : ") UPDATE ");
    } else {
        ces_strbuf_add(sql, guard ? "WITH marked AS (UPDATE " : "UPDATE ");
    }
    ces_strbuf_add(sql, t->qualified);
    ces_strbuf_add(sql, " AS t SET ");
    ces_strbuf_add(sql, t->cols[t->deleted_col].quoted);
    ces_strbuf_add(sql, " = coalesce(");
    add_ref(sql, bulk, time_ref);
    ces_strbuf_add(sql, "::timestamptz, now())");
    if (guard) {
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, names->version);
        ces_strbuf_add(sql, " = ");
        add_ref(sql, bulk, version_ref);
        ces_strbuf_add(sql, "::numeric");
    }
    ces_strbuf_add(sql, bulk ? " FROM s WHERE " : " WHERE ");
    add_key_match(sql, t, bulk);
    if (!guard)
        return;
    add_row_older(sql, names, bulk, version_ref);
    ces_strbuf_add(sql, " RETURNING 1) INSERT INTO ");
    ces_strbuf_add(sql, names->tombstones);
    ces_strbuf_addf(sql, " AS ts (relid, key, version) SELECT %u, ", t->oid);
    add_key_array(sql, t, bulk, key_refs);
    ces_strbuf_add(sql, ", ");
    add_ref(sql, bulk, version_ref);
    ces_strbuf_add(sql, bulk ? "::numeric FROM s WHERE NOT EXISTS (SELECT FROM "
                             : "::numeric WHERE NOT EXISTS (SELECT FROM ");
    ces_strbuf_add(sql, t->qualified);
    ces_strbuf_add(sql, " AS t WHERE ");
    add_key_match(sql, t, bulk);
    ces_strbuf_add(sql, ") ON CONFLICT (relid, key) DO UPDATE SET version = EXCLUDED.version, "
                        "deleted_at = now() WHERE ts.version < EXCLUDED.version");
}

/* With the version guard, only a row older than the event goes, and the key's tombstone is raised
 * to the event's version either way. A table with soft deletes marks the row instead. */
void ces_sqltext_delete(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                        const ces_catalog_desc_t *t, bool bulk) {
    if (ces_catalog_soft_deletes(t)) {
        add_soft_delete(sql, names, t, bulk);
        return;
    }
    bool guard = ces_catalog_guarded(t);
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
    add_key_match(sql, t, bulk);
    for (size_t k = 0; k < n; k++)
        key_refs[k] = k + 1;
    if (!guard)
        return;
    add_row_older(sql, names, bulk, version_ref);
    ces_strbuf_add(sql, " RETURNING 1) INSERT INTO ");
    ces_strbuf_add(sql, names->tombstones);
    ces_strbuf_addf(sql, " AS ts (relid, key, version) %s%u, ", bulk ? "SELECT " : "VALUES (",
                    t->oid);
    add_key_array(sql, t, bulk, key_refs);
    ces_strbuf_add(sql, ", ");
    add_ref(sql, bulk, version_ref);
    ces_strbuf_add(sql, bulk ? "::numeric FROM s" : "::numeric)");
    ces_strbuf_add(sql, " ON CONFLICT (relid, key) DO UPDATE SET version = EXCLUDED.version, "
                        "deleted_at = now() WHERE ts.version < EXCLUDED.version");
}

void ces_sqltext_history(ces_strbuf_t *sql, const ces_catalog_desc_t *t, const long *cols,
                         size_t n, bool bulk) {
    static const char *const meta_casts[] = {"::numeric", "", "", "::bigint", "::timestamptz"};
    static const char *const meta[] = CES_CATALOG_HISTORY_META;
    ces_strbuf_add(sql, "INSERT INTO ");
    ces_strbuf_add(sql, t->qualified);
    ces_strbuf_add(sql, " (");
    for (size_t i = 0; i < CES_CATALOG_HISTORY_NVALUES; i++)
        ces_strbuf_addf(sql, "%s\"%s\"", i ? ", " : "", meta[i]); /* fixed, safe names */
    for (size_t i = 0; i < n; i++) {
        ces_strbuf_add(sql, ", ");
        ces_strbuf_add(sql, t->cols[cols[i]].quoted);
    }
    /* One row: the columns type their parameters. Many: unnest() gives text, cast as an insert's
     * SELECT list is (add_insert_select). */
    ces_strbuf_add(sql, bulk ? ") SELECT " : ") VALUES (");
    for (size_t i = 0; i < CES_CATALOG_HISTORY_NVALUES; i++) {
        ces_strbuf_add(sql, i ? ", " : "");
        add_ref(sql, bulk, i + 1);
        ces_strbuf_add(sql, meta_casts[i]);
    }
    for (size_t i = 0; i < n; i++) {
        ces_strbuf_add(sql, ", ");
        add_ref(sql, bulk, CES_CATALOG_HISTORY_NVALUES + i + 1);
        if (bulk) {
            ces_strbuf_add(sql, "::");
            ces_strbuf_add(sql, t->cols[cols[i]].cast);
        }
    }
    if (bulk) {
        ces_strbuf_add(sql, " FROM ");
        add_unnest(sql, CES_CATALOG_HISTORY_NVALUES + n);
    }
    ces_strbuf_add(sql, bulk ? "" : ")");
    ces_strbuf_add(sql, " ON CONFLICT (\"" CES_CATALOG_HISTORY_VERSION "\") DO NOTHING");
}

int ces_sqltext_nparams(const ces_catalog_desc_t *t, size_t nvalues) {
    return (int)nvalues + (ces_catalog_guarded(t) ? 1 : 0);
}
