/* The SQL Server -> PostgreSQL type map (docs/semantics.md, "Schema"), and value conversions. */
#include "test_util.h"

#include "format/types.h"

static void maps_every_documented_type(void **state) {
    (void)state;
    static const char *cases[][2] = {
        {"bit", "boolean"},
        {"tinyint", "smallint"},
        {"smallint", "smallint"},
        {"int", "integer"},
        {"bigint", "bigint"},
        {"decimal(10,2)", "numeric(10,2)"},
        {"numeric(38, 10)", "numeric(38,10)"},
        {"decimal", "numeric(18,0)"},
        {"money", "numeric(19,4)"},
        {"smallmoney", "numeric(10,4)"},
        {"real", "real"},
        {"float(24)", "real"},
        {"float(53)", "double precision"},
        {"float", "double precision"},
        {"date", "date"},
        {"time(7)", "time(6)"},
        {"time(3)", "time(3)"},
        {"datetime", "timestamp(3)"},
        {"smalldatetime", "timestamp(0)"},
        {"datetime2(7)", "timestamp(6)"},
        {"datetime2(2)", "timestamp(2)"},
        {"datetimeoffset(7)", "timestamptz(6)"},
        {"char(10)", "char(10)"},
        {"nchar(3)", "char(3)"},
        {"varchar(100)", "varchar(100)"},
        {"nvarchar(50)", "varchar(50)"},
        {"nvarchar(max)", "text"},
        {"varchar(MAX)", "text"},
        {"binary(16)", "bytea"},
        {"varbinary(max)", "bytea"},
        {"uniqueidentifier", "uuid"},
        {"INT", "integer"},
        {"NVarChar(20)", "varchar(20)"},
    };
    char buf[64];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool known = ces_types_map(cases[i][0], buf, sizeof(buf));
        if (!known || strcmp(buf, cases[i][1]) != 0)
            fail_msg("%s mapped to %s (known=%d), expected %s", cases[i][0], buf, known,
                     cases[i][1]);
    }
}

static void unknown_types_become_text(void **state) {
    (void)state;
    static const char *unknown[] = {"sql_variant", "xml", "geography", "decimal(10", "int)",
                                    "decimal(5,9)", "", "nvarchar(abc)"};
    char buf[64];
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_false(ces_types_map(unknown[i], buf, sizeof(buf)));
        assert_string_equal(buf, "text");
    }
}

static void bytea_hex(void **state) {
    (void)state;
    ces_arena_t *arena = ces_arena_new();
    size_t len;
    assert_int_equal(ces_types_conversion("bytea"), CES_CONV_BYTEA);
    assert_int_equal(ces_types_conversion("integer"), CES_CONV_NONE);
    const char *v = ces_types_convert(CES_CONV_BYTEA, "0xDEADBEEF", 10, arena, &len);
    assert_string_equal(v, "\\xDEADBEEF");
    assert_int_equal(len, 10);
    v = ces_types_convert(CES_CONV_NONE, "42", 2, arena, &len);
    assert_string_equal(v, "42");
    ces_arena_destroy(arena);
}

static void bytea_base64_is_tolerated(void **state) {
    (void)state;
    ces_arena_t *arena = ces_arena_new();
    size_t len;
    const char *v = ces_types_convert(CES_CONV_BYTEA, "3q2+7w==", 8, arena, &len);
    assert_string_equal(v, "\\xdeadbeef");
    assert_int_equal(len, 10);
    /* Neither hex nor base64: passed through for PostgreSQL to judge. */
    v = ces_types_convert(CES_CONV_BYTEA, "not*b64", 7, arena, &len);
    assert_string_equal(v, "not*b64");
    ces_arena_destroy(arena);
}

/* Encoding is decoding's inverse, for every length modulo 3 and every byte value. */
static void base64_round_trip(void **state) {
    (void)state;
    unsigned char data[259], back[259];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (unsigned char)(i * 7 + 3);
    for (size_t len = 0; len <= sizeof(data); len++) {
        char *text = ces_base64_encode(data, len);
        assert_non_null(text);
        assert_int_equal(strlen(text), (len + 2) / 3 * 4);
        assert_int_equal(ces_base64_decode(text, strlen(text), back), (long)len);
        assert_memory_equal(back, data, len);
        free(text);
    }
    char *text = ces_base64_encode("\x00\xff\n", 3);
    assert_string_equal(text, "AP8K");
    free(text);
    text = ces_base64_encode("ab", 2);
    assert_string_equal(text, "YWI=");
    free(text);
}

static void type_conflicts(void **state) {
    (void)state;
    assert_true(ces_types_compatible("int4", "bigint"));
    assert_true(ces_types_compatible("numeric", "integer"));
    assert_true(ces_types_compatible("text", "integer"));       /* text holds anything */
    assert_true(ces_types_compatible("varchar", "uuid"));
    assert_true(ces_types_compatible("timestamptz", "timestamp(6)"));
    assert_true(ces_types_compatible("my_domain", "integer"));  /* the user's choice */
    assert_false(ces_types_compatible("int4", "varchar(50)"));
    assert_false(ces_types_compatible("bool", "integer"));
    assert_false(ces_types_compatible("uuid", "text"));
    assert_false(ces_types_compatible("date", "timestamp(3)"));
    assert_false(ces_types_compatible("bytea", "varchar(10)"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(maps_every_documented_type),
        cmocka_unit_test(unknown_types_become_text),
        cmocka_unit_test(bytea_hex),
        cmocka_unit_test(bytea_base64_is_tolerated),
        cmocka_unit_test(base64_round_trip),
        cmocka_unit_test(type_conflicts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
