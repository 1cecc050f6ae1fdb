/*
 * Decoding, against golden files (wal2json style: tests/fixtures/decode/NAME.in holds records, one per
 * line, NAME.out the expected dump) and against hostile input. Run with CES_UPDATE_GOLDEN=1 to
 * rewrite the .out files after a deliberate change; review the diff before committing it.
 */
#include "test_util.h"

#include "decode.h"

static ces_decoder_t *new_decoder(void) {
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    ces_decoder_t *d = ces_decoder_new(&limits);
    assert_non_null(d);
    return d;
}

/* Compares text with the golden file at path (or rewrites it). */
static void check_golden(const char *path, const char *text) {
    if (getenv("CES_UPDATE_GOLDEN") != NULL) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        return;
    }
    char *want = test_read_file(path, NULL);
    if (strcmp(want, text) != 0) {
        fprintf(stderr, "--- expected %s\n%s\n--- got\n%s\n", path, want, text);
        free(want);
        fail_msg("decoded form differs from %s", path);
    }
    free(want);
}

static void golden(const char *name) {
    char in[512], out[512];
    snprintf(in, sizeof(in), "%s/decode/%s.in", CES_FIXTURES, name);
    snprintf(out, sizeof(out), "%s/decode/%s.out", CES_FIXTURES, name);
    char *input = test_read_file(in, NULL);
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    ces_decoder_t *d = new_decoder();
    int line = 0;
    for (char *p = input; *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(mem, "== line %d\n", ++line);
        ces_decode_dump_record(d, p, len, mem);
        p += len + (nl ? 1 : 0);
    }
    fclose(mem);
    check_golden(out, text);
    ces_decoder_destroy(d);
    free(text);
    free(input);
}

static void golden_valid(void **state) {
    (void)state;
    golden("valid");
}

static void golden_malformed(void **state) {
    (void)state;
    golden("malformed");
}

/* The six records from Microsoft's documentation, pretty-printed over several lines as published. */
static void shared_examples(void **state) {
    (void)state;
    static const char *names[] = {"current-insert", "current-update", "current-delete",
                                  "legacy-insert",  "legacy-update",  "legacy-delete"};
    ces_decoder_t *d = new_decoder();
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char in[512], out[512];
        snprintf(in, sizeof(in), "%s/%s.json", CES_EXAMPLES, names[i]);
        snprintf(out, sizeof(out), "%s/decode/examples/%s.out", CES_FIXTURES, names[i]);
        size_t len;
        char *record = test_read_file(in, &len);
        char *text = NULL;
        size_t text_len = 0;
        FILE *mem = open_memstream(&text, &text_len);
        assert_int_equal(ces_decode_dump_record(d, record, len, mem), CES_DECODE_OK);
        fclose(mem);
        check_golden(out, text);
        free(text);
        free(record);
    }
    ces_decoder_destroy(d);
}

static ces_decode_status_t decode_whole(ces_decoder_t *d, const char *rec, size_t len,
                                        char *reason, size_t reason_size) {
    ces_arena_t *arena = ces_arena_new();
    ces_envelope_t env;
    ces_event_t ev;
    ces_decode_status_t st = ces_decode_envelope(d, arena, rec, len, &env, reason, reason_size);
    if (st == CES_DECODE_OK)
        st = ces_decode_event(d, arena, &env, env.data, env.data_len, &ev, reason, reason_size);
    ces_arena_destroy(arena);
    return st;
}

/* Every truncation of a valid record is rejected with a reason, without a crash or a leak. */
static void every_prefix_is_rejected(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/current-update.json", CES_EXAMPLES);
    size_t len;
    char *record = test_read_file(path, &len);
    while (len > 0 && (record[len - 1] == '\n' || record[len - 1] == ' '))
        len--;
    ces_decoder_t *d = new_decoder();
    char reason[512];
    for (size_t n = 0; n < len; n++) {
        char *copy = malloc(n + 1); /* exact size, so ASan sees any read past the end */
        memcpy(copy, record, n);
        reason[0] = '\0';
        if (decode_whole(d, copy, n, reason, sizeof(reason)) != CES_DECODE_REJECTED)
            fail_msg("prefix of %zu bytes was accepted", n);
        assert_true(reason[0] != '\0');
        free(copy);
    }
    assert_int_equal(decode_whole(d, record, len, reason, sizeof(reason)), CES_DECODE_OK);
    ces_decoder_destroy(d);
    free(record);
}

static void expect_rejected(ces_decoder_t *d, const char *rec, size_t len, const char *needle) {
    char reason[512] = "";
    if (decode_whole(d, rec, len, reason, sizeof(reason)) != CES_DECODE_REJECTED)
        fail_msg("accepted input expected to fail with '%s'", needle);
    if (strstr(reason, needle) == NULL)
        fail_msg("reason '%s' does not mention '%s'", reason, needle);
}

static void bounds(void **state) {
    (void)state;
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    limits.max_record_bytes = 4096;
    limits.max_depth = 8;
    limits.max_columns = 4;
    limits.max_value_bytes = 16;
    ces_decoder_t *d = ces_decoder_new(&limits);

    /* Deep nesting: rejected at the limit, long before the stack or memory matters. */
    char deep[3000];
    memcpy(deep, "{\"x\":", 5);
    memset(deep + 5, '[', 2000);
    deep[2005] = '\0';
    expect_rejected(d, deep, 2005, "nested too deeply");
    char obj[200];
    strcpy(obj, "{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":1}}}}}}}}}");
    expect_rejected(d, obj, strlen(obj), "nested too deeply");

    char *big = malloc(5000);
    memset(big, ' ', 5000);
    big[0] = '{';
    expect_rejected(d, big, 5000, "exceeds the limit");
    free(big);

    const char *many_cols =
        "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"x\","
        "\"logicalid\":\"u:0000000100000002000A:00000000000000000001\",\"operation\":\"INS\","
        "\"segmentindex\":1,\"finalsegment\":true,\"data\":\"{\\\"eventsource\\\":{\\\"db\\\":"
        "\\\"d\\\",\\\"schema\\\":\\\"s\\\",\\\"tbl\\\":\\\"t\\\"},\\\"eventrow\\\":{\\\"old\\\":"
        "\\\"{}\\\",\\\"current\\\":\\\"{\\\\\\\"a\\\\\\\":1,\\\\\\\"b\\\\\\\":2,\\\\\\\"c\\\\\\\":3,"
        "\\\\\\\"d\\\\\\\":4,\\\\\\\"e\\\\\\\":5}\\\"}}\"}";
    expect_rejected(d, many_cols, strlen(many_cols), "over the limit of 4");

    const char *long_value =
        "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"x\","
        "\"logicalid\":\"u:0000000100000002000A:00000000000000000001\",\"operation\":\"INS\","
        "\"segmentindex\":1,\"finalsegment\":true,\"data\":\"{\\\"eventsource\\\":{\\\"db\\\":"
        "\\\"d\\\",\\\"schema\\\":\\\"s\\\",\\\"tbl\\\":\\\"t\\\"},\\\"eventrow\\\":{\\\"old\\\":"
        "\\\"{}\\\",\\\"current\\\":\\\"{\\\\\\\"a\\\\\\\":\\\\\\\"01234567890123456789\\\\\\\"}\\\"}}\"}";
    expect_rejected(d, long_value, strlen(long_value), "over the limit");
    ces_decoder_destroy(d);
}

static void invalid_utf8_is_rejected(void **state) {
    (void)state;
    ces_decoder_t *d = new_decoder();
    const char rec[] = "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"\xff\xfe\"}";
    expect_rejected(d, rec, sizeof(rec) - 1, "malformed JSON");
    const char nul[] = "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"a\0b\"}";
    expect_rejected(d, nul, sizeof(nul) - 1, "malformed JSON");
    ces_decoder_destroy(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_valid),
        cmocka_unit_test(golden_malformed),
        cmocka_unit_test(shared_examples),
        cmocka_unit_test(every_prefix_is_rejected),
        cmocka_unit_test(bounds),
        cmocka_unit_test(invalid_utf8_is_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
