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
    assert_int_equal(ces_tableplan_missing_columns(t, preserve_case, ev, &missing, &n), 0);
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
    /* Exactly 63 bytes stay; 64 are clipped to 63. */
    memset(name, 'A', 63);
    name[63] = '\0';
    memset(want, 'a', 63);
    want[63] = '\0';
    check_fold(name, false, want);
    name[63] = 'B';
    name[64] = '\0';
    check_fold(name, false, want);
    /* A two-byte character across the 63rd byte goes whole: 62 bytes remain. */
    memset(name, 'x', 62);
    memcpy(name + 62, "é", 2);
    strcpy(name + 64, "tail");
    memset(want, 'x', 62);
    want[62] = '\0';
    check_fold(name, false, want);
    /* A four-byte character ending at byte 63 stays. */
    memset(name, 'x', 59);
    memcpy(name + 59, "😀", 4);
    strcpy(name + 63, "tail");
    memcpy(want, name, 63);
    want[63] = '\0';
    check_fold(name, true, want);
    /* ... and one that would end at byte 64 goes. */
    memset(name, 'x', 60);
    memcpy(name + 60, "😀", 4);
    name[64] = '\0';
    memset(want, 'x', 60);
    want[60] = '\0';
    check_fold(name, true, want);
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
                                       cmocka_unit_test(target_templates),
                                       cmocka_unit_test(upsert_attempts_after_taken_keys)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
