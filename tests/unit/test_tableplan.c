/* The catalog's decisions, without a server: names, types of new columns, missing columns, type
 * conflicts, target-name templates. */
#include "test_util.h"

#include "apply/catalog.h"
#include "apply/tableplan.h"

static ces_event_t sample_event(void) {
    static ces_column_t cols[] = {TEST_COLUMN("ID", "int"),
                                  TEST_COLUMN("Name", "nvarchar(50)"),
                                  TEST_COLUMN("Shape", "geography"),
                                  TEST_COLUMN("Price", "decimal(10,2)")};
    static ces_field_t pkkey[] = {TEST_FIELD("ID", "1", 1, false)};
    static ces_field_t current[] = {TEST_FIELD("ID", "1", 1, false),
                                    TEST_FIELD("Name", "a", 1, false),
                                    TEST_FIELD("Extra", "x", 1, false),
                                    TEST_FIELD("Price", NULL, 0, true)};
    static ces_field_t old[] = {TEST_FIELD("ID", "1", 1, false), TEST_FIELD("Gone", "y", 1, false)};
    return (ces_event_t){.op = CES_OP_UPDATE,
                         .db = "Sales",
                         .schema = "dbo",
                         .table = "Orders",
                         .cols = cols,
                         .ncols = 4,
                         .pkkey = pkkey,
                         .npkkey = 1,
                         .current = current,
                         .ncurrent = 4,
                         .old = old,
                         .nold = 2};
}

static void new_column_types(void **state) {
    (void)state;
    ces_event_t ev = sample_event();
    char type[64];
    assert_null(ces_tableplan_new_column_type(&ev, "ID", type, sizeof(type)));
    assert_string_equal(type, "integer");
    assert_null(ces_tableplan_new_column_type(&ev, "Name", type, sizeof(type)));
    assert_string_equal(type, "varchar(50)");
    assert_null(ces_tableplan_new_column_type(&ev, "Price", type, sizeof(type)));
    assert_string_equal(type, "numeric(10,2)");
    /* An unmapped type is stored as text, and named for the caller's warning. */
    assert_string_equal(ces_tableplan_new_column_type(&ev, "Shape", type, sizeof(type)),
                        "geography");
    assert_string_equal(type, "text");
    /* A column the event does not announce in cols (only in an image) is text, silently. */
    assert_null(ces_tableplan_new_column_type(&ev, "Extra", type, sizeof(type)));
    assert_string_equal(type, "text");
    /* Names are matched exactly: announcing "ID" says nothing about "id". */
    assert_null(ces_tableplan_new_column_type(&ev, "id", type, sizeof(type)));
    assert_string_equal(type, "text");
}

static void check_missing(const ces_catalog_desc_t *t, bool preserve_case, const ces_event_t *ev,
                          const char *const *want, size_t nwant) {
    const char **missing = NULL;
    size_t n = 99;
    assert_int_equal(ces_tableplan_missing_columns(t, preserve_case, "_ces_lsn", ev, &missing, &n),
                     0);
    assert_non_null(missing);
    assert_int_equal(n, nwant);
    for (size_t i = 0; i < nwant; i++)
        assert_string_equal(missing[i], want[i]);
    free(missing);
}

static void missing_columns(void **state) {
    (void)state;
    ces_event_t ev = sample_event();
    ces_catalog_column_t cols[] = {{.name = "id"}, {.name = "name"}, {.name = "Shape"}};
    ces_catalog_desc_t t = {.cols = cols, .ncols = 3, .version_col = -1};
    /* Lower-cased: "Shape" folds to "shape", which the table lacks; each name is listed once, in
     * the order cols, pkkey, current, old. */
    static const char *const lower[] = {"Shape", "Price", "Extra", "Gone"};
    check_missing(&t, false, &ev, lower, 4);
    /* Preserved: "ID" and "Name" are not "id" and "name". */
    static const char *const preserved[] = {"ID", "Name", "Price", "Extra", "Gone"};
    check_missing(&t, true, &ev, preserved, 5);
    /* A table with every column lacks none. */
    ces_catalog_column_t all[] = {{.name = "id"},    {.name = "name"},  {.name = "shape"},
                                  {.name = "price"}, {.name = "extra"}, {.name = "gone"}};
    ces_catalog_desc_t full = {.cols = all, .ncols = 6, .version_col = -1};
    check_missing(&full, false, &ev, NULL, 0);
}

static void type_conflicts(void **state) {
    (void)state;
    /* int became nvarchar: the integer column cannot hold it. */
    assert_true(ces_tableplan_type_conflicts("pg_catalog.int4", "nvarchar(50)"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.int4", "datetime2(7)"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.bool", "int"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.uuid", "nvarchar(36)"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.timestamptz", "date"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.bytea", "int"));
    /* Type names that are keywords come quoted from format('%I.%I'). */
    assert_true(ces_tableplan_type_conflicts("pg_catalog.\"numeric\"", "nvarchar(20)"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.\"timestamp\"", "int"));
    assert_true(ces_tableplan_type_conflicts("pg_catalog.\"time\"", "bit"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.\"varchar\"", "int"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.\"numeric\"", "decimal(12,2)"));
    /* Text holds anything. */
    assert_false(ces_tableplan_type_conflicts("pg_catalog.text", "int"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.bpchar", "datetime2(7)"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.text", "uniqueidentifier"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.text", "geography"));
    /* Within a family, a change fits (columns are never retyped, and PostgreSQL checks values). */
    assert_false(ces_tableplan_type_conflicts("pg_catalog.int4", "int"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.int4", "bigint"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.int8", "money"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.int8", "decimal(20,0)"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.timestamptz", "datetimeoffset(7)"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.bool", "bit"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.uuid", "uniqueidentifier"));
    assert_false(ces_tableplan_type_conflicts("pg_catalog.bytea", "varbinary(max)"));
    /* The cast's schema does not matter; an unqualified one works too. */
    assert_true(ces_tableplan_type_conflicts("int4", "nvarchar(50)"));
}

static void check_fold(const char *name, bool preserve_case, const char *want) {
    char *got = ces_tableplan_fold_name(name, preserve_case);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void name_folding(void **state) {
    (void)state;
    check_fold("MyTable", false, "mytable");
    check_fold("MyTable", true, "MyTable");
    check_fold("Ünïcode_ÀB", false, "Ünïcode_Àb"); /* ASCII letters only */
    check_fold("", false, "");
    char name[200], want[200];
    /* Exactly 63 bytes stay. */
    memset(name, 'A', 63);
    name[63] = '\0';
    memset(want, 'a', 63);
    want[63] = '\0';
    check_fold(name, false, want);
}

/* 8 hex digits of FNV-1a (32 bits) of s, as a name's suffix spells it. */
static void fnv_hex(const char *s, char out[9]) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 16777619u;
    snprintf(out, 9, "%08x", (unsigned)h);
}

/* Longer than 63 bytes: 54 bytes (whole characters), "_" and a hash of the whole source name, so
 * that names differing only past the limit or in case stay apart, the same on every run. */
static void long_names(void **state) {
    (void)state;
    char name[200], want[200], hex[9];
    memset(name, 'A', 64);
    name[64] = '\0';
    fnv_hex(name, hex);
    memset(want, 'a', 54);
    sprintf(want + 54, "_%s", hex);
    check_fold(name, false, want);
    assert_string_equal(hex, "89417985");
    char *a = ces_tableplan_fold_name(name, false);
    name[63] = 'B'; /* differs only in the 64th byte */
    char *b = ces_tableplan_fold_name(name, false);
    name[63] = 'a'; /* ... or only in case there */
    char *c = ces_tableplan_fold_name(name, false);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(strlen(a), 63);
    assert_int_equal(strlen(b), 63);
    assert_string_not_equal(a, b);
    assert_string_not_equal(a, c);
    assert_string_not_equal(b, c);
    free(a);
    free(b);
    free(c);
    /* A two-byte character across the 54th byte goes whole: 53 bytes remain. */
    memset(name, 'x', 53);
    memcpy(name + 53, "é", 2);
    memset(name + 55, 'y', 20);
    name[75] = '\0';
    fnv_hex(name, hex);
    memset(want, 'x', 53);
    sprintf(want + 53, "_%s", hex);
    check_fold(name, true, want);
    /* A four-byte character ending at byte 54 stays. */
    memset(name, 'x', 50);
    memcpy(name + 50, "😀", 4);
    memset(name + 54, 'y', 20);
    name[74] = '\0';
    fnv_hex(name, hex);
    memcpy(want, name, 54);
    sprintf(want + 54, "_%s", hex);
    check_fold(name, true, want);
}

static void check_column(const char *name, bool preserve_case, const char *want, bool renamed) {
    bool got_renamed = !renamed;
    char *got = ces_tableplan_column_name(name, preserve_case, "_ces_lsn", &got_renamed);
    assert_non_null(got);
    assert_string_equal(got, want);
    assert_int_equal(got_renamed, renamed);
    free(got);
}

/* System columns' names, the version column's and the empty name are applied under "_src_". */
static void reserved_columns(void **state) {
    (void)state;
    static const char *const system[] = {"xmin", "xmax", "cmin", "cmax", "ctid", "tableoid"};
    for (size_t i = 0; i < sizeof(system) / sizeof(system[0]); i++) {
        char want[32];
        snprintf(want, sizeof(want), "_src_%s", system[i]);
        check_column(system[i], false, want, true);
        assert_true(ces_tableplan_reserved_column(system[i], NULL));
    }
    check_column("XMIN", false, "_src_xmin", true); /* folded first */
    check_column("XMIN", true, "XMIN", false);      /* a name PostgreSQL does not reserve */
    check_column("_ces_lsn", false, "_src__ces_lsn", true);
    check_column("_CES_LSN", false, "_src__ces_lsn", true);
    check_column("", false, "_src_", true);
    check_column("oid", false, "oid", false); /* no system column since PostgreSQL 12 */
    check_column("Xmin_", false, "xmin_", false);
    check_column("Name", false, "name", false);
    assert_false(ces_tableplan_reserved_column("_ces_lsn", NULL));
    assert_true(ces_tableplan_reserved_column("my_version", "my_version"));
    /* The prefix never pushes a name over 63 bytes: a long version column is clipped and hashed. */
    char version[64], hex[9], want[64];
    memset(version, 'v', 63);
    version[63] = '\0';
    char *got = ces_tableplan_column_name(version, false, version, NULL);
    assert_non_null(got);
    fnv_hex(version, hex);
    snprintf(want, sizeof(want), "_src_%.49s_%s", version, hex);
    assert_string_equal(got, want);
    free(got);
}

static void check_target(const char *schema, const char *table, const char *want_reason_part) {
    const char *reason = ces_tableplan_reserved_target(schema, table, "ces2pg");
    if (want_reason_part == NULL) {
        assert_null(reason);
    } else {
        assert_non_null(reason);
        assert_non_null(strstr(reason, want_reason_part));
    }
}

/* No event reaches the metadata schema, the system catalogs or any pg_* schema. */
static void reserved_targets(void **state) {
    (void)state;
    check_target("ces2pg", "dead_letters", "metadata");
    check_target("ces2pg", "offsets", "metadata");
    check_target("ces2pg", "anything", "metadata");
    check_target("pg_catalog", "pg_description", "system");
    check_target("pg_toast", "t", "system");
    check_target("pg_temp_3", "t", "system");
    check_target("pg_sales", "orders", "system");
    check_target("information_schema", "tables", "system");
    check_target("", "t", "empty");
    check_target("dbo", "", "empty");
    check_target("dbo", "orders", NULL);
    check_target("ces2pg_x", "t", NULL);
    /* Only with identifier_case = preserve: another schema. */
    check_target("CES2PG", "t", NULL);
    /* PostgreSQL reserves pg_ in lower case only. */
    check_target("PG_Sales", "t", NULL);
    /* A table's name is free in an ordinary schema. */
    check_target("public", "pg_class", NULL);
    /* A metadata schema of another name. */
    assert_non_null(ces_tableplan_reserved_target("meta", "offsets", "meta"));
    assert_null(ces_tableplan_reserved_target("ces2pg", "offsets", "meta"));
}

static void check_collision(ces_column_t *cols, size_t ncols, bool preserve_case, const char *a,
                            const char *b) {
    ces_field_t pkkey[] = {TEST_FIELD("id", "1", 1, false)};
    ces_event_t ev = {.op = CES_OP_INSERT, .db = "d", .schema = "s", .table = "t", .cols = cols,
                      .ncols = ncols, .pkkey = pkkey, .npkkey = 1};
    const char *first = "x", *second = "x";
    int rc = ces_tableplan_column_collision(&ev, preserve_case, "_ces_lsn", &first, &second);
    if (a == NULL) {
        assert_int_equal(rc, 0);
        assert_null(first);
        assert_null(second);
    } else {
        assert_int_equal(rc, 1);
        assert_string_equal(first, a);
        assert_string_equal(second, b);
    }
}

/* Two source columns that map to one target column are a collision, never one column. */
static void column_collisions(void **state) {
    (void)state;
    ces_column_t cased[] = {TEST_COLUMN("id", "int"), TEST_COLUMN("Name", "int"),
                            TEST_COLUMN("NAME", "int")};
    check_collision(cased, 3, false, "Name", "NAME");
    check_collision(cased, 3, true, NULL, NULL);
    ces_column_t renamed[] = {TEST_COLUMN("id", "int"), TEST_COLUMN("xmin", "int"),
                              TEST_COLUMN("_src_xmin", "int")};
    check_collision(renamed, 3, false, "xmin", "_src_xmin");
    ces_column_t gis[] = {TEST_COLUMN("id", "int"), TEST_COLUMN("xmin", "float"),
                          TEST_COLUMN("xmax", "float"), TEST_COLUMN("ymin", "float")};
    check_collision(gis, 4, false, NULL, NULL);
    static char long_a[80], long_b[80];
    memset(long_a, 'c', 70);
    memcpy(long_b, long_a, 70);
    long_b[69] = 'd';
    ces_column_t longs[] = {
        TEST_COLUMN("id", "int"), {long_a, "int", 70, 3}, {long_b, "int", 70, 3}};
    check_collision(longs, 3, false, NULL, NULL); /* apart thanks to the hash */
}

static void check_expand(const char *pattern, const char *want) {
    ces_event_t ev = sample_event();
    char *got = ces_tableplan_expand_target(pattern, &ev);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void target_templates(void **state) {
    (void)state;
    check_expand("{schema}", "dbo");
    check_expand("{table}", "Orders");
    check_expand("{db}", "Sales");
    check_expand("{db}_{schema}", "Sales_dbo");
    check_expand("raw_{table}_{table}", "raw_Orders_Orders");
    check_expand("public", "public");
    check_expand("{unknown}{table", "{unknown}{table"); /* not a placeholder: kept as it is */
    check_expand("", "");
}

/* After a plain INSERT found its key taken, a table sends upserts for 64 attempts, doubling with
 * each taken key up to 4,096. */
static void upsert_attempts_after_taken_keys(void **state) {
    (void)state;
    assert_int_equal(ces_tableplan_upsert_attempts(0), 64);
    assert_int_equal(ces_tableplan_upsert_attempts(1), 128);
    assert_int_equal(ces_tableplan_upsert_attempts(2), 256);
    assert_int_equal(ces_tableplan_upsert_attempts(5), 2048);
    assert_int_equal(ces_tableplan_upsert_attempts(6), 4096);
    assert_int_equal(ces_tableplan_upsert_attempts(7), 4096);
    assert_int_equal(ces_tableplan_upsert_attempts(UINT32_MAX), 4096);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(new_column_types),
                                       cmocka_unit_test(missing_columns),
                                       cmocka_unit_test(type_conflicts),
                                       cmocka_unit_test(name_folding),
                                       cmocka_unit_test(long_names),
                                       cmocka_unit_test(reserved_columns),
                                       cmocka_unit_test(reserved_targets),
                                       cmocka_unit_test(column_collisions),
                                       cmocka_unit_test(target_templates),
                                       cmocka_unit_test(upsert_attempts_after_taken_keys)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
