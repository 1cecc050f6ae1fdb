/*
 * The statements that apply row changes, against golden files (tests/fixtures/sql/, a .sql file per
 * statement shape; CES_UPDATE_GOLDEN=1 rewrites them: review the diff).
 *
 * Names are quoted the way the daemon quotes them, by libpq's PQescapeIdentifier, which needs a
 * PGconn but not a server: a connection aimed at a socket directory that does not exist fails at
 * once, without touching the network, and still escapes.
 */
#include "test_util.h"

#include <libpq-fe.h>

#include "apply/catalog.h"
#include "apply/tableplan.h"
#include "apply/sqltext.h"

static PGconn *conn;

typedef struct {
    const char *name;
    const char *type; /* format_type() */
    const char *cast; /* schema-qualified type without modifier */
} column_spec_t;

/* A table description as the catalog would read it from pg_catalog, with names quoted by libpq. */
typedef struct {
    ces_catalog_desc_t desc;
    ces_catalog_column_t cols[16];
    size_t pk[16];
} table_fixture_t;

static char *quote(const char *name) {
    char *q = PQescapeIdentifier(conn, name, strlen(name));
    assert_non_null(q);
    char *copy = strdup(q);
    PQfreemem(q);
    return copy;
}

static void make_table(table_fixture_t *f, const char *schema, const char *table,
                       const column_spec_t *cols, size_t ncols, const size_t *pk, size_t npk,
                       long version_col) {
    assert_true(ncols <= 16 && npk <= 16);
    memset(f, 0, sizeof(*f));
    char *qs = quote(schema), *qt = quote(table);
    f->desc.qualified = malloc(strlen(qs) + strlen(qt) + 2);
    sprintf(f->desc.qualified, "%s.%s", qs, qt);
    free(qs);
    free(qt);
    for (size_t i = 0; i < ncols; i++) {
        f->cols[i] = (ces_catalog_column_t){.name = (char *)cols[i].name,
                                            .type = (char *)cols[i].type,
                                            .cast = (char *)cols[i].cast,
                                            .quoted = quote(cols[i].name)};
    }
    memcpy(f->pk, pk, npk * sizeof(*pk));
    f->desc.id = 1;
    f->desc.cols = f->cols;
    f->desc.ncols = ncols;
    f->desc.pk = f->pk;
    f->desc.npk = npk;
    f->desc.oid = 16384;
    f->desc.version_col = version_col;
    f->desc.deleted_col = -1;
}

static void free_table(table_fixture_t *f) {
    free(f->desc.qualified);
    for (size_t i = 0; i < f->desc.ncols; i++)
        free(f->cols[i].quoted);
}

/* "Sales"."Orders" (id integer PRIMARY KEY, name varchar(50), amount numeric(10,2), created
 * timestamp(6), _ces_lsn numeric). */
static const column_spec_t orders_cols[] = {
    {"id", "integer", "pg_catalog.int4"},
    {"name", "character varying(50)", "pg_catalog.\"varchar\""},
    {"amount", "numeric(10,2)", "pg_catalog.\"numeric\""},
    {"created", "timestamp(6) without time zone", "pg_catalog.\"timestamp\""},
    {"_ces_lsn", "numeric", "pg_catalog.\"numeric\""},
};
static const size_t orders_pk[] = {0};

static void orders(table_fixture_t *f, bool guarded) {
    make_table(f, "Sales", "Orders", orders_cols, guarded ? 5 : 4, orders_pk, 1, guarded ? 4 : -1);
}

/* "Sales"."Lines" (order_id, line_no, sku, qty, _ces_lsn), keyed (order_id, line_no) with the key
 * columns not first, in key order unlike table order. */
static const column_spec_t lines_cols[] = {
    {"sku", "text", "pg_catalog.text"},
    {"line_no", "smallint", "pg_catalog.int2"},
    {"order_id", "bigint", "pg_catalog.int8"},
    {"qty", "integer", "pg_catalog.int4"},
    {"_ces_lsn", "numeric", "pg_catalog.\"numeric\""},
};
static const size_t lines_pk[] = {2, 1};

static ces_sqltext_names_t names(void) {
    static char *tombstones, *version;
    if (tombstones == NULL) {
        char *schema = quote("ces2pg");
        tombstones = malloc(strlen(schema) + sizeof(".tombstones"));
        sprintf(tombstones, "%s.tombstones", schema);
        free(schema);
        version = quote("_ces_lsn");
    }
    return (ces_sqltext_names_t){.tombstones = tombstones, .version = version};
}

static void check_golden(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof(path), "%s/sql/%s", CES_FIXTURES, name);
    test_check_golden(path, text, "statement");
}

typedef enum { UPSERT, INSERT, DELETE } shape_t;

/* Appends "-- comment\n<statement>\n" to out, with the names nm. */
static void add_statement_named(ces_strbuf_t *out, const ces_sqltext_names_t *nm,
                                const char *comment, shape_t shape, const ces_catalog_desc_t *t,
                                const long *cols, size_t n, bool bulk) {
    ces_strbuf_t sql = {0};
    switch (shape) {
    case UPSERT:
        ces_sqltext_upsert(&sql, nm, t, cols, n, bulk);
        break;
    case INSERT:
        ces_sqltext_insert(&sql, nm, t, cols, n, bulk);
        break;
    case DELETE:
        ces_sqltext_delete(&sql, nm, t, bulk);
        break;
    }
    assert_false(sql.failed);
    ces_strbuf_add(out, "-- ");
    ces_strbuf_add(out, comment);
    ces_strbuf_add(out, "\n");
    ces_strbuf_add(out, sql.buf);
    ces_strbuf_add(out, "\n");
    ces_strbuf_free(&sql);
}

/* The same with the usual names ("ces2pg".tombstones, "_ces_lsn"). */
static void add_statement(ces_strbuf_t *out, const char *comment, shape_t shape,
                          const ces_catalog_desc_t *t, const long *cols, size_t n, bool bulk) {
    ces_sqltext_names_t nm = names();
    add_statement_named(out, &nm, comment, shape, t, cols, n, bulk);
}

/* One statement on "Sales"."Orders", each shape in its file. */
typedef struct {
    const char *file;
    const char *comment;
    shape_t shape;
    bool guarded;
    bool bulk;
} single_case_t;

static const single_case_t single_cases[] = {
    {"upsert.sql", "one row, every column", UPSERT, false, false},
    {"upsert_guarded.sql", "one row, version guard and tombstone lookup", UPSERT, true, false},
    {"upsert_bulk.sql", "many rows from unnest()", UPSERT, false, true},
    {"upsert_bulk_guarded.sql", "many rows, version guard", UPSERT, true, true},
    {"insert.sql", "one row, no ON CONFLICT", INSERT, false, false},
    {"insert_guarded.sql", "one row, tombstone lookup, no ON CONFLICT", INSERT, true, false},
    {"insert_bulk.sql", "many rows, no ON CONFLICT (the plain INSERT of new keys)", INSERT, false,
     true},
    {"insert_bulk_guarded.sql", "many rows, tombstone lookup, no ON CONFLICT", INSERT, true, true},
    {"delete.sql", "one row by key", DELETE, false, false},
    {"delete_guarded.sql", "one row, only when older; raises the key's tombstone", DELETE, true,
     false},
    {"delete_bulk.sql", "many rows USING unnest()", DELETE, false, true},
    {"delete_bulk_guarded.sql", "many rows, only older ones; tombstones raised", DELETE, true,
     true},
};

static void single_shapes(void **state) {
    (void)state;
    static const long all_columns[] = {0, 1, 2, 3};
    for (size_t i = 0; i < sizeof(single_cases) / sizeof(single_cases[0]); i++) {
        const single_case_t *c = &single_cases[i];
        table_fixture_t f;
        orders(&f, c->guarded);
        ces_strbuf_t out = {0};
        add_statement(&out, c->comment, c->shape, &f.desc, all_columns, 4, c->bulk);
        assert_false(out.failed);
        check_golden(c->file, out.buf);
        ces_strbuf_free(&out);
        free_table(&f);
    }
}

static void upsert_partial_columns(void **state) {
    (void)state;
    static const long some[] = {0, 2};
    table_fixture_t f;
    orders(&f, false);
    ces_strbuf_t out = {0};
    add_statement(&out, "an UPD carrying id and amount only: other columns stay", UPSERT, &f.desc,
                  some, 2, false);
    free_table(&f);
    orders(&f, true);
    add_statement(&out, "the same, guarded and bulk", UPSERT, &f.desc, some, 2, true);
    static const long key_only[] = {0};
    add_statement(&out, "the key alone, guarded: only the version changes", UPSERT, &f.desc,
                  key_only, 1, false);
    free_table(&f);
    orders(&f, false);
    add_statement(&out, "the key alone, unguarded: DO NOTHING", UPSERT, &f.desc, key_only, 1,
                  false);
    free_table(&f);
    assert_false(out.failed);
    check_golden("upsert_partial_columns.sql", out.buf);
    ces_strbuf_free(&out);
}

/* A table with soft deletes (a rule): an insert or update clears the deleted column, a delete sets
 * it (one row or many), and leaves a tombstone only for a key with no row. */
static void soft_deletes(void **state) {
    (void)state;
    static const column_spec_t cols[] = {
        {"id", "integer", "pg_catalog.int4"},
        {"name", "character varying(50)", "pg_catalog.\"varchar\""},
        {"_ces_lsn", "numeric", "pg_catalog.\"numeric\""},
        {"_ces_deleted_at", "timestamp with time zone", "pg_catalog.timestamptz"},
    };
    static const size_t pk[] = {0};
    static const long both[] = {0, 1}, key_only[] = {0};
    table_fixture_t f;
    make_table(&f, "Sales", "Orders", cols, 4, pk, 1, 2);
    f.desc.deleted_col = 3;
    ces_strbuf_t out = {0};
    add_statement(&out, "upsert, guarded: a newer change undoes a soft delete", UPSERT, &f.desc,
                  both, 2, false);
    add_statement(&out, "bulk upsert, guarded", UPSERT, &f.desc, both, 2, true);
    add_statement(&out, "the key alone, guarded", UPSERT, &f.desc, key_only, 1, false);
    add_statement(&out, "soft delete, guarded: $2 the version, $3 the commit time", DELETE,
                  &f.desc, NULL, 0, false);
    add_statement(&out, "bulk soft delete, guarded: arrays of keys, versions and commit times",
                  DELETE, &f.desc, NULL, 0, true);
    f.desc.version_col = -1;
    add_statement(&out, "upsert, unguarded", UPSERT, &f.desc, both, 2, false);
    add_statement(&out, "soft delete, unguarded: $2 the commit time", DELETE, &f.desc, NULL, 0,
                  false);
    add_statement(&out, "bulk soft delete, unguarded", DELETE, &f.desc, NULL, 0, true);
    assert_false(out.failed);
    check_golden("soft_deletes.sql", out.buf);
    ces_strbuf_free(&out);
    free_table(&f);
}

/* A history table: its own columns, then the image's, one change or many; a redelivered change
 * inserts nothing. */
static void history(void **state) {
    (void)state;
    static const column_spec_t cols[] = {
        {"_ces_version", "numeric", "pg_catalog.\"numeric\""},
        {"_ces_operation", "text", "pg_catalog.text"},
        {"_ces_commit_lsn", "text", "pg_catalog.text"},
        {"_ces_sequence", "bigint", "pg_catalog.int8"},
        {"_ces_commit_time", "timestamp with time zone", "pg_catalog.timestamptz"},
        {"_ces_applied_at", "timestamp with time zone", "pg_catalog.timestamptz"},
        {"id", "integer", "pg_catalog.int4"},
        {"name", "character varying(50)", "pg_catalog.\"varchar\""},
    };
    static const size_t pk[] = {0};
    static const long both[] = {6, 7}, key_only[] = {6};
    table_fixture_t f;
    make_table(&f, "Sales", "Orders_history", cols, 8, pk, 1, -1);
    ces_strbuf_t out = {0};
    ces_strbuf_add(&out, "-- a change with its row image\n");
    ces_sqltext_history(&out, &f.desc, both, 2, false);
    ces_strbuf_add(&out, "\n-- a delete that carried its key alone\n");
    ces_sqltext_history(&out, &f.desc, key_only, 1, false);
    ces_strbuf_add(&out, "\n-- many changes, each value an array\n");
    ces_sqltext_history(&out, &f.desc, both, 2, true);
    ces_strbuf_add(&out, "\n");
    assert_false(out.failed);
    check_golden("history.sql", out.buf);
    ces_strbuf_free(&out);
    free_table(&f);
}

/* A two-column key listed in key order, which is not table order. */
static void composite_key(void **state) {
    (void)state;
    table_fixture_t f;
    make_table(&f, "Sales", "Lines", lines_cols, 5, lines_pk, 2, 4);
    static const long cols[] = {0, 1, 2, 3};
    ces_strbuf_t out = {0};
    add_statement(&out, "upsert, guarded", UPSERT, &f.desc, cols, 4, false);
    add_statement(&out, "bulk upsert, guarded", UPSERT, &f.desc, cols, 4, true);
    add_statement(&out, "delete, guarded", DELETE, &f.desc, NULL, 0, false);
    add_statement(&out, "bulk delete, guarded", DELETE, &f.desc, NULL, 0, true);
    assert_false(out.failed);
    check_golden("composite_key.sql", out.buf);
    ces_strbuf_free(&out);
    free_table(&f);
}

/* Names that would break or change a statement if they were not quoted: quotes, spaces, dots,
 * parameter markers, semicolons and comments, backslashes, non-ASCII letters, and a name folded to
 * PostgreSQL's 63 bytes; in the metadata schema and the version column too. */
static void hostile_identifiers(void **state) {
    (void)state;
    char *long_name = ces_tableplan_fold_name(
        "A_very_long_column_name_that_PostgreSQL_would_truncate_at_sixty_three_bytes_ünï", false);
    assert_int_equal(strlen(long_name), 63);
    const char *version = "_ces \"lsn\"";
    const column_spec_t cols[] = {
        {"we\"ird", "integer", "pg_catalog.int4"},
        {"has space", "text", "pg_catalog.text"},
        {"dot.ted", "text", "pg_catalog.text"},
        {"$1", "text", "pg_catalog.text"},
        {"semi;colon); DROP TABLE x; --", "text", "pg_catalog.text"},
        {"back\\slash", "text", "pg_catalog.text"},
        {"ünïcödé 名前", "text", "pg_catalog.text"},
        {long_name, "text", "pg_catalog.text"},
        {version, "numeric", "pg_catalog.\"numeric\""},
    };
    static const size_t pk[] = {0, 6};
    table_fixture_t f;
    make_table(&f, "my \"schema\".x", "ta.ble; --", cols, 9, pk, 2, 8);
    char *schema = quote("ces 2pg\";");
    char *tombstones = malloc(strlen(schema) + sizeof(".tombstones"));
    sprintf(tombstones, "%s.tombstones", schema);
    ces_sqltext_names_t nm = {.tombstones = tombstones, .version = f.cols[8].quoted};
    static const long all[] = {0, 1, 2, 3, 4, 5, 6, 7};
    ces_strbuf_t out = {0};
    add_statement_named(&out, &nm, "upsert, guarded", UPSERT, &f.desc, all, 8, false);
    add_statement_named(&out, &nm, "bulk upsert, guarded", UPSERT, &f.desc, all, 8, true);
    add_statement_named(&out, &nm, "bulk insert, guarded", INSERT, &f.desc, all, 8, true);
    add_statement_named(&out, &nm, "delete, guarded", DELETE, &f.desc, NULL, 0, false);
    add_statement_named(&out, &nm, "bulk delete, guarded", DELETE, &f.desc, NULL, 0, true);
    assert_false(out.failed);
    check_golden("hostile_identifiers.sql", out.buf);
    ces_strbuf_free(&out);
    free_table(&f);
    free(schema);
    free(tombstones);
    free(long_name);
}

/* The version is the parameter after the values, when the table is guarded. */
static void parameter_counts(void **state) {
    (void)state;
    table_fixture_t f;
    orders(&f, false);
    assert_int_equal(ces_sqltext_nparams(&f.desc, 4), 4);
    free_table(&f);
    orders(&f, true);
    assert_int_equal(ces_sqltext_nparams(&f.desc, 4), 5);
    assert_int_equal(ces_sqltext_nparams(&f.desc, 1), 2);
    free_table(&f);
}

static int setup(void **state) {
    (void)state;
    conn = PQconnectdb("host=/nonexistent/ces2pg-test-socket-dir port=1 dbname=none");
    if (conn == NULL || PQstatus(conn) == CONNECTION_OK)
        return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    PQfinish(conn);
    ces_sqltext_names_t nm = names();
    free((char *)nm.tombstones);
    free((char *)nm.version);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(single_shapes),       cmocka_unit_test(upsert_partial_columns),
        cmocka_unit_test(composite_key),       cmocka_unit_test(hostile_identifiers),
        cmocka_unit_test(parameter_counts),    cmocka_unit_test(soft_deletes),
        cmocka_unit_test(history),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
