/* Commit LSNs and the (commitlsn, sequencenumber) order (docs/ces-format.md). */
#include "test_util.h"

#include "event.h"

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
    ces_position_t a = {lsn("1:2:3"), 5}, b = {lsn("1:2:3"), 6}, c = {lsn("1:2:4"), 1};
    assert_true(ces_position_compare(&a, &b) < 0);
    assert_true(ces_position_compare(&b, &c) < 0);
    assert_true(ces_position_compare(&c, &a) > 0);
    assert_int_equal(ces_position_compare(&a, &a), 0);
}

static void version_is_one_ordered_number(void **state) {
    (void)state;
    char buf[64];
    ces_position_t zero = {{0, 0}, 0};
    ces_version_format(&zero, buf, sizeof(buf));
    assert_string_equal(buf, "000000000000000000000");
    ces_position_t top = {{0xFFFFFFFFu, 0xFFFFFFFFFFFFULL}, UINT64_MAX};
    ces_version_format(&top, buf, sizeof(buf));
    assert_string_equal(buf, "1208925819614629174706175" "18446744073709551615");
    ces_position_t some = {lsn("27:1A8:3"), 12};
    ces_version_format(&some, buf, sizeof(buf));
    assert_string_equal(buf, "10977524119502851" "00000000000000000012");
    /* Like snprintf, a short buffer gets what fits and a NUL. */
    ces_version_format(&some, buf, 6);
    assert_string_equal(buf, "10977");
    buf[0] = 'x';
    ces_version_format(&some, buf, 0);
    assert_int_equal(buf[0], 'x');
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_and_format),
        cmocka_unit_test(rejects_malformed),
        cmocka_unit_test(compares_numerically_across_all_80_bits),
        cmocka_unit_test(compact_form_of_logicalid),
        cmocka_unit_test(position_order),
        cmocka_unit_test(version_is_one_ordered_number),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
