/* Commit LSNs and the (commitlsn, sequencenumber) order (docs/ces-format.md). */
#include "test_util.h"

#include "format/event.h"

static ces_lsn_t lsn(const char *s) {
    ces_lsn_t l;
    assert_int_equal(ces_lsn_parse(s, strlen(s), &l), 0);
    return l;
}

static void parse_and_format(void **state) {
    (void)state;
    char buf[23];
    ces_lsn_t l = lsn("000000B1:000008A8:0007");
    assert_int_equal(l.high, 0xB1);
    assert_true(l.low == ((0x8A8ULL << 16) | 7));
    ces_lsn_format(l, buf);
    assert_string_equal(buf, "000000B1:000008A8:0007");
    /* Shorter fields are the same numbers, not different strings. */
    ces_lsn_t s = lsn("b1:8a8:7");
    assert_int_equal(ces_lsn_compare(l, s), 0);
}

static void rejects_malformed(void **state) {
    (void)state;
    static const char *bad[] = {
        "",           "000000B1:000008A8",     "000000B1:000008A8:0007:1", "000000B1:000008A8:00007",
        "1000000B1:000008A8:0007", "000000B1::0007", "0000000G:000008A8:0007", " 000000B1:000008A8:0007",
        "000000B1:000008A8:0007 ", ":000008A8:0007",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ces_lsn_t l;
        if (ces_lsn_parse(bad[i], strlen(bad[i]), &l) == 0)
            fail_msg("accepted malformed LSN '%s'", bad[i]);
    }
}

static void compares_numerically_across_all_80_bits(void **state) {
    (void)state;
    /* String order and numeric order disagree when widths differ: numbers win. */
    assert_true(ces_lsn_compare(lsn("9:0:0"), lsn("A:0:0")) < 0);
    assert_true(ces_lsn_compare(lsn("1:FFFFFFFF:FFFF"), lsn("2:0:0")) < 0);
    assert_true(ces_lsn_compare(lsn("FFFFFFFF:0:0"), lsn("FFFFFFFE:FFFFFFFF:FFFF")) > 0);
    assert_true(ces_lsn_compare(lsn("1:2:3"), lsn("1:2:4")) < 0);
    assert_true(ces_lsn_compare(lsn("1:3:0"), lsn("1:2:FFFF")) > 0);
}

static void compact_form_of_logicalid(void **state) {
    (void)state;
    ces_lsn_t a, b = lsn("0000002C:00000300:017C");
    assert_int_equal(ces_lsn_parse_compact("0000002C00000300017C", 20, &a), 0);
    assert_int_equal(ces_lsn_compare(a, b), 0);
    assert_int_not_equal(ces_lsn_parse_compact("0000002C00000300017", 19, &a), 0);
    assert_int_not_equal(ces_lsn_parse_compact("0000002C0000030001ZC", 20, &a), 0);
}

static void position_order(void **state) {
    (void)state;
    ces_version_t a = {lsn("1:2:3"), 5}, b = {lsn("1:2:3"), 6}, c = {lsn("1:2:4"), 1};
    assert_true(ces_version_compare(&a, &b) < 0);
    assert_true(ces_version_compare(&b, &c) < 0);
    assert_true(ces_version_compare(&c, &a) > 0);
    assert_int_equal(ces_version_compare(&a, &a), 0);
}

static void version_is_one_ordered_number(void **state) {
    (void)state;
    char buf[64];
    ces_version_t zero = {{0, 0}, 0};
    ces_version_format(&zero, buf, sizeof(buf));
    assert_string_equal(buf, "000000000000000000000");
    ces_version_t top = {{0xFFFFFFFFu, 0xFFFFFFFFFFFFULL}, UINT64_MAX};
    ces_version_format(&top, buf, sizeof(buf));
    assert_string_equal(buf, "1208925819614629174706175" "18446744073709551615");
    ces_version_t some = {lsn("27:1A8:3"), 12};
    ces_version_format(&some, buf, sizeof(buf));
    assert_string_equal(buf, "10977524119502851" "00000000000000000012");
    /* Around 10^19, where the LSN is split into two 64-bit halves. */
    ces_version_t split = {{0x8AC7u, 0x230489E80000ULL}, 7}; /* exactly 10^19 */
    ces_version_format(&split, buf, sizeof(buf));
    assert_string_equal(buf, "10000000000000000000" "00000000000000000007");
    split.commit_lsn.low -= 1;
    ces_version_format(&split, buf, sizeof(buf));
    assert_string_equal(buf, "9999999999999999999" "00000000000000000007");
    split.commit_lsn.low += 6;
    ces_version_format(&split, buf, sizeof(buf));
    assert_string_equal(buf, "10000000000000000005" "00000000000000000007");
    /* Against the plain 128-bit digit loop, over LSNs of every size. */
    __extension__ typedef unsigned __int128 u128;
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ces_version_t p = {{(uint32_t)(x >> 32) >> (i % 33 == 32 ? 0 : i % 33),
                             (x * 2654435761u) & 0xFFFFFFFFFFFFULL >> (i % 48)},
                            x >> (i % 64)};
        u128 v = ((u128)p.commit_lsn.high << 48) | p.commit_lsn.low;
        char want[64], rev[64];
        size_t n = 0;
        do {
            rev[n++] = (char)('0' + (int)(v % 10));
            v /= 10;
        } while (v != 0);
        for (size_t k = 0; k < n; k++)
            want[k] = rev[n - 1 - k];
        snprintf(want + n, sizeof(want) - n, "%020llu", (unsigned long long)p.sequence);
        ces_version_format(&p, buf, sizeof(buf));
        assert_string_equal(buf, want);
    }
    /* Like snprintf, a short buffer gets what fits and a NUL. */
    ces_version_format(&some, buf, 6);
    assert_string_equal(buf, "10977");
    buf[0] = 'x';
    ces_version_format(&some, buf, 0);
    assert_int_equal(buf[0], 'x');
}

static void operator_lsn_forms(void **state) {
    (void)state;
    ces_lsn_t a, b = lsn("0000002A:000001F0:0003");
    assert_int_equal(ces_lsn_parse_operator("0x0000002A000001F00003", &a), 0);
    assert_int_equal(ces_lsn_compare(a, b), 0);
    assert_int_equal(ces_lsn_parse_operator("0X0000002a000001f00003", &a), 0);
    assert_int_equal(ces_lsn_compare(a, b), 0);
    assert_int_equal(ces_lsn_parse_operator("0000002A:000001F0:0003", &a), 0);
    assert_int_equal(ces_lsn_compare(a, b), 0);
    static const char *bad[] = {
        "",  "0x", "0x0000002A000001F0000", "0x0000002A000001F000033", "0000002A000001F00003",
        "0x0000002A:000001F0:0003", " 0x0000002A000001F00003", "0x0000002A000001F0000G",
        "x0000002A000001F00003", "0000002A:000001F0:0003\n", "42",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (ces_lsn_parse_operator(bad[i], &a) == 0)
            fail_msg("accepted malformed LSN '%s'", bad[i]);
    }
}

/* Numeric order of two versions (decimal digits, no leading zeros beyond the sequence's). */
static int version_cmp(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la != lb)
        return la < lb ? -1 : 1;
    return strcmp(a, b);
}

static void ceiling_splits_at_the_lsn(void **state) {
    (void)state;
    char ceiling[64], v[64];
    ces_lsn_t at = lsn("27:1A8:3");
    ces_version_ceiling(at, ceiling, sizeof(ceiling));
    assert_string_equal(ceiling, "10977524119502851" "99999999999999999999");
    ces_version_t last_at = {at, UINT64_MAX}, first_after = {lsn("27:1A8:4"), 0},
                   before = {lsn("27:1A8:2"), UINT64_MAX};
    ces_version_format(&last_at, v, sizeof(v));
    assert_true(version_cmp(v, ceiling) < 0);
    ces_version_format(&before, v, sizeof(v));
    assert_true(version_cmp(v, ceiling) < 0);
    ces_version_format(&first_after, v, sizeof(v));
    assert_true(version_cmp(v, ceiling) > 0);
    /* The 80-bit top and zero. */
    ces_version_ceiling((ces_lsn_t){0, 0}, ceiling, sizeof(ceiling));
    assert_string_equal(ceiling, "0" "99999999999999999999");
    ces_version_ceiling((ces_lsn_t){0xFFFFFFFFu, 0xFFFFFFFFFFFFULL}, ceiling, sizeof(ceiling));
    assert_string_equal(ceiling, "1208925819614629174706175" "99999999999999999999");
}

static void assert_field_copied(const ces_field_t *copy, const ces_field_t *original) {
    assert_string_equal(copy->name, original->name);
    assert_ptr_not_equal(copy->name, original->name);
    assert_int_equal(copy->is_null, original->is_null);
    assert_int_equal(copy->value_len, original->value_len);
    if (original->value == NULL) {
        assert_null(copy->value);
        return;
    }
    assert_ptr_not_equal(copy->value, original->value);
    assert_memory_equal(copy->value, original->value, original->value_len);
    assert_int_equal(copy->value[copy->value_len], '\0');
}

/* A held event is one allocation with room for its record: nothing it points to is left in the
 * decoding arena, and the record fits beside it without another block. */
static void compact_copy_is_one_allocation(void **state) {
    (void)state;
    char name[] = "Id", value[] = "42\0tail", db[] = "db", schema[] = "dbo", table[] = "T";
    ces_column_t cols[] = {TEST_COLUMN("Id", "int"), TEST_COLUMN("Name", "nvarchar(50)")};
    ces_field_t key[] = {TEST_FIELD(name, value, 2, false)};
    ces_field_t current[] = {TEST_FIELD("Id", value, sizeof(value) - 1, false),
                             TEST_FIELD("Name", NULL, 0, true)};
    ces_event_t ev = {.op = CES_OP_UPDATE, .id = "e1", .logicalid = NULL, .time = NULL,
                      .db = db, .schema = schema, .table = table,
                      .version = {lsn("1:2:3"), 7}, .cols = cols, .ncols = 2,
                      .pkkey = key, .npkkey = 1, .current = current, .ncurrent = 2};
    ces_event_t copy;
    const size_t record = 300;
    ces_arena_t *arena = ces_event_copy_new(&ev, record + 16, &copy);
    assert_non_null(arena);
    size_t footprint = ces_arena_footprint(arena);
    assert_non_null(ces_arena_alloc(arena, record));
    assert_int_equal(ces_arena_footprint(arena), footprint);
    memset(name, 'x', 2); /* the original's bytes change: the copy's do not */
    assert_int_equal(copy.op, CES_OP_UPDATE);
    assert_string_equal(copy.id, "e1");
    assert_null(copy.logicalid);
    assert_null(copy.time);
    assert_string_equal(copy.db, "db");
    assert_string_equal(copy.schema, "dbo");
    assert_string_equal(copy.table, "T");
    assert_int_equal(ces_version_compare(&copy.version, &ev.version), 0);
    assert_int_equal(copy.ncols, 2);
    assert_string_equal(copy.cols[1].name, "Name");
    assert_string_equal(copy.cols[1].type, "nvarchar(50)");
    assert_int_equal(copy.npkkey, 1);
    assert_string_equal(copy.pkkey[0].name, "Id");
    assert_memory_equal(copy.pkkey[0].value, "42", 3);
    assert_null(copy.old);
    assert_int_equal(copy.nold, 0);
    for (size_t i = 0; i < 2; i++)
        assert_field_copied(&copy.current[i], &current[i]);
    /* The shape's names in one run, in the catalog's order: cols, then pkkey, current, old. */
    static const char shape[] = "Id\0int\0Name\0nvarchar(50)\0Id\0Id\0Name";
    assert_int_equal(copy.shape_len, sizeof(shape));
    assert_memory_equal(copy.shape, shape, sizeof(shape));
    assert_ptr_equal(copy.cols[0].name, copy.shape);
    assert_ptr_equal(copy.current[1].name, copy.shape + sizeof(shape) - sizeof("Name"));
    assert_true((uintptr_t)copy.cols % _Alignof(ces_column_t) == 0);
    assert_true((uintptr_t)copy.current % _Alignof(ces_field_t) == 0);
    ces_arena_destroy(arena);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_and_format),
        cmocka_unit_test(rejects_malformed),
        cmocka_unit_test(compares_numerically_across_all_80_bits),
        cmocka_unit_test(compact_form_of_logicalid),
        cmocka_unit_test(position_order),
        cmocka_unit_test(version_is_one_ordered_number),
        cmocka_unit_test(operator_lsn_forms),
        cmocka_unit_test(ceiling_splits_at_the_lsn),
        cmocka_unit_test(compact_copy_is_one_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
