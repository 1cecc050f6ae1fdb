/*
 * Decoding, against golden files (wal2json style: tests/fixtures/decode/NAME.in holds records, one per
 * line, NAME.out the expected dump; tests/fixtures/avro/ the same for Avro records, written by
 * make-fixtures.py with Apache Avro's Python library) and against hostile input. A line that does not
 * start with '{' is the base64 of a binary record, as in the replay format. Run with
 * CES_UPDATE_GOLDEN=1 to rewrite the .out files after a deliberate change; review the diff before
 * committing it.
 */
#include "test_util.h"

#include <avro/schema.h>
#include <dirent.h>

#include "format/avro.h"
#include "format/decode.h"
#include "format/types.h" /* ces_base64_decode */

static ces_decoder_t *new_decoder(void) {
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    ces_decoder_t *d = ces_decoder_new(&limits);
    assert_non_null(d);
    return d;
}

static void check_golden(const char *path, const char *text) {
    test_check_golden(path, text, "decoded form");
}

/* The records of a fixture file: base64 lines decoded, others as they are. Each record is
 * a malloc'd buffer of exactly its size (so that ASan sees any read past its end). */
typedef struct {
    unsigned char **records;
    size_t *lens;
    size_t count;
} fixture_t;

static fixture_t read_fixture(const char *path) {
    fixture_t fx = {0};
    char *input = test_read_file(path, NULL);
    for (char *p = input; *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        fx.records = realloc(fx.records, (fx.count + 1) * sizeof(*fx.records));
        fx.lens = realloc(fx.lens, (fx.count + 1) * sizeof(*fx.lens));
        assert_non_null(fx.records);
        assert_non_null(fx.lens);
        unsigned char *rec;
        size_t n;
        unsigned char *tmp = malloc(len * 3 / 4 + 3);
        long got = len > 0 && p[0] != '{' ? ces_base64_decode(p, len, tmp) : -1;
        if (got >= 0) {
            n = (size_t)got;
            rec = malloc(n ? n : 1);
            memcpy(rec, tmp, n);
            free(tmp);
        } else { /* JSON, or not base64 either: the line as it is (as replay does) */
            free(tmp);
            n = len;
            rec = malloc(n ? n : 1);
            memcpy(rec, p, n);
        }
        fx.records[fx.count] = rec;
        fx.lens[fx.count++] = n;
        p += len + (nl ? 1 : 0);
    }
    free(input);
    return fx;
}

static void free_fixture(fixture_t *fx) {
    for (size_t i = 0; i < fx->count; i++)
        free(fx->records[i]);
    free(fx->records);
    free(fx->lens);
}

/* name: "decode/valid", "avro/malformed", ... under tests/fixtures. */
static void golden(const char *name) {
    char in[512], out[512];
    snprintf(in, sizeof(in), "%s/%s.in", CES_FIXTURES, name);
    snprintf(out, sizeof(out), "%s/%s.out", CES_FIXTURES, name);
    fixture_t fx = read_fixture(in);
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    ces_decoder_t *d = new_decoder();
    for (size_t i = 0; i < fx.count; i++) {
        fprintf(mem, "== line %zu\n", i + 1);
        ces_decode_dump_record(d, fx.records[i], fx.lens[i], mem);
    }
    fclose(mem);
    check_golden(out, text);
    ces_decoder_destroy(d);
    free(text);
    free_fixture(&fx);
}

static void golden_valid(void **state) {
    (void)state;
    golden("decode/valid");
}

static void golden_malformed(void **state) {
    (void)state;
    golden("decode/malformed");
}

/* Avro records decode like their JSON twins, and avro-c leaks nothing ces2pg has to sweep up. */
static void golden_avro_valid(void **state) {
    (void)state;
    size_t swept = ces_avro_swept_blocks();
    golden("avro/valid");
    assert_int_equal(ces_avro_swept_blocks(), swept);
}

static void golden_avro_malformed(void **state) {
    (void)state;
    golden("avro/malformed");
}

/* The six example records (tests/fixtures/examples, ces2pg's own, pretty-printed over several lines
 * like documentation examples) against their decoded form in tests/fixtures/decode/examples. */
static void example_records(void **state) {
    (void)state;
    static const char *names[] = {"current-insert", "current-update", "current-delete",
                                  "legacy-insert",  "legacy-update",  "legacy-delete"};
    ces_decoder_t *d = new_decoder();
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char in[512], out[512];
        snprintf(in, sizeof(in), "%s/examples/%s.json", CES_FIXTURES, names[i]);
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

/* Segments of Avro events: each a full ChangeEvent whose data is a slice of the Data record; joined
 * in index order (as the reassembler does), they decode into one event. */
static void golden_avro_segmented(void **state) {
    (void)state;
    char in[512], out[512];
    snprintf(in, sizeof(in), "%s/avro/segmented.in", CES_FIXTURES);
    snprintf(out, sizeof(out), "%s/avro/segmented.out", CES_FIXTURES);
    fixture_t fx = read_fixture(in);
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    ces_decoder_t *d = new_decoder();
    ces_arena_t *arena = ces_arena_new();
    char *joined = NULL;
    size_t joined_len = 0, events = 0;
    ces_envelope_t first;
    char reason[512];
    for (size_t i = 0; i < fx.count; i++) {
        ces_envelope_t env;
        assert_int_equal(ces_decode_envelope(d, arena, fx.records[i], fx.lens[i], &env, reason,
                                             sizeof(reason)),
                         CES_DECODE_OK);
        assert_true(env.avro);
        fprintf(mem, "== line %zu: segment index %lld%s, %zu data bytes\n", i + 1,
                (long long)env.index, env.final_segment ? " final" : "", env.data_len);
        /* A slice alone is not a Data record. */
        if (!env.final_segment || joined_len > 0) {
            ces_event_t ev;
            assert_int_equal(ces_decode_event(d, arena, &env, env.data, env.data_len, &ev, reason,
                                              sizeof(reason)),
                             CES_DECODE_REJECTED);
        }
        if (joined_len == 0)
            first = env;
        joined = realloc(joined, joined_len + env.data_len);
        memcpy(joined + joined_len, env.data, env.data_len);
        joined_len += env.data_len;
        if (env.final_segment) {
            ces_event_t ev;
            fprintf(mem, "== event %zu (%zu data bytes)\n", ++events, joined_len);
            assert_int_equal(
                ces_decode_event(d, arena, &first, joined, joined_len, &ev, reason, sizeof(reason)),
                CES_DECODE_OK);
            ces_event_dump(&ev, mem);
            joined_len = 0;
        }
    }
    assert_int_equal(events, 2);
    fclose(mem);
    check_golden(out, text);
    free(joined);
    ces_arena_destroy(arena);
    ces_decoder_destroy(d);
    free(text);
    free_fixture(&fx);
}

/* The schemas ces2pg reads with are the ones the fixtures were written with (schemas/ *.avsc, from
 * make-fixtures.py), as avro-c compares them. */
static void avro_schemas_match_fixtures(void **state) {
    (void)state;
    ces_decoder_t *d = new_decoder(); /* installs ces2pg's allocator into avro-c first */
    const char *files[] = {"ChangeEvent.avsc", "Data.avsc"};
    const char *ours[] = {ces_avro_change_event_schema, ces_avro_data_schema};
    for (size_t i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/avro/schemas/%s", CES_FIXTURES, files[i]);
        size_t len;
        char *text = test_read_file(path, &len);
        avro_schema_t theirs = NULL, mine = NULL;
        assert_int_equal(avro_schema_from_json_length(text, len, &theirs), 0);
        assert_int_equal(avro_schema_from_json_length(ours[i], strlen(ours[i]), &mine), 0);
        if (!avro_schema_equal(theirs, mine))
            fail_msg("%s differs from the schema in src/format/avro.c", path);
        avro_schema_decref(theirs);
        avro_schema_decref(mine);
        free(text);
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
    snprintf(path, sizeof(path), "%s/examples/current-update.json", CES_FIXTURES);
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
    expect_rejected(d, rec, sizeof(rec) - 1, "UTF");
    const char nul[] = "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"a\0b\"}";
    expect_rejected(d, nul, sizeof(nul) - 1, "malformed JSON");
    ces_decoder_destroy(d);
}

/* JSON string literal contents for s[0..len) (quotes not included); malloc'd. */
static char *json_escape(const char *s, size_t len) {
    char *out = malloc(len * 6 + 1), *o = out;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            o += sprintf(o, "\\u%04x", c);
        } else {
            *o++ = (char)c;
        }
    }
    *o = '\0';
    return out;
}

/* before, inner[0..inner_len) as JSON string contents, then after; malloc'd, its length in *len. */
static char *with_escaped(const char *before, const char *inner, size_t inner_len,
                          const char *after, size_t *len) {
    char *escaped = json_escape(inner, inner_len);
    size_t b = strlen(before), e = strlen(escaped), a = strlen(after);
    char *out = malloc(b + e + a + 1);
    memcpy(out, before, b);
    memcpy(out + b, escaped, e);
    memcpy(out + b + e, after, a + 1);
    free(escaped);
    *len = b + e + a;
    return out;
}

/* A current-generation INS record, whole, whose Data is data[0..data_len) (freed here). */
static char *record_with_data(char *data, size_t data_len, size_t *len) {
    char *rec = with_escaped("{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\","
                             "\"id\":\"x\",\"logicalid\":"
                             "\"u:0000000A000000FF0003:00000000000000000001\","
                             "\"operation\":\"INS\",\"segmentindex\":1,\"finalsegment\":true,"
                             "\"data\":\"",
                             data, data_len, "\"}", len);
    free(data);
    return rec;
}

/* A current-generation INS record whose current image is row (JSON text, row_len bytes). */
static char *record_with_row(const char *row, size_t row_len, size_t *len) {
    size_t data_len;
    char *data = with_escaped("{\"eventsource\":{\"db\":\"d\",\"schema\":\"s\",\"tbl\":\"t\","
                              "\"pkkey\":[{\"columnname\":\"Id\",\"value\":\"1\"}],"
                              "\"transaction\":{\"commitlsn\":\"0000000A:000000FF:0003\","
                              "\"sequencenumber\":1}},\"eventrow\":{\"old\":\"{}\","
                              "\"current\":\"",
                              row, row_len, "\"}}", &data_len);
    return record_with_data(data, data_len, len);
}

/* A record whose event names its db, one column (in cols, pkkey and the current image) and that
 * column's type as given (letters and digits: the image escapes the column once, not twice). */
static char *record_with_names(const char *db, const char *column, const char *type,
                               size_t *len) {
    size_t dcap = strlen(db) + 4 * strlen(column) + strlen(type) + 512;
    char *data = malloc(dcap);
    char *ecol = json_escape(column, strlen(column));
    int dn = snprintf(data, dcap,
                      "{\"eventsource\":{\"db\":\"%s\",\"schema\":\"s\",\"tbl\":\"t\",\"cols\":"
                      "[{\"name\":\"%s\",\"type\":\"%s\"}],\"pkkey\":[{\"columnname\":\"%s\","
                      "\"value\":\"1\"}],\"transaction\":{\"commitlsn\":\"0000000A:000000FF:0003\","
                      "\"sequencenumber\":1}},\"eventrow\":{\"old\":\"{}\",\"current\":"
                      "\"{\\\"%s\\\":1}\"}}",
                      db, ecol, type, ecol, ecol);
    free(ecol);
    return record_with_data(data, (size_t)dn, len);
}

/* Names and types are at most CES_DECODE_MAX_NAME_BYTES long (events keep their lengths in 32
 * bits); at the bound they are whole, with their lengths, in the event. */
static void names_and_types_are_bounded(void **state) {
    (void)state;
    ces_decoder_t *d = new_decoder();
    char at_bound[CES_DECODE_MAX_NAME_BYTES + 2], over[CES_DECODE_MAX_NAME_BYTES + 2];
    memset(at_bound, 'n', CES_DECODE_MAX_NAME_BYTES);
    at_bound[CES_DECODE_MAX_NAME_BYTES] = '\0';
    memset(over, 'n', CES_DECODE_MAX_NAME_BYTES + 1);
    over[CES_DECODE_MAX_NAME_BYTES + 1] = '\0';
    size_t len;
    char *rec = record_with_names(at_bound, at_bound, at_bound, &len);
    ces_arena_t *arena = ces_arena_new();
    ces_envelope_t env;
    ces_event_t ev;
    char reason[512] = "";
    assert_int_equal(ces_decode_envelope(d, arena, rec, len, &env, reason, sizeof(reason)),
                     CES_DECODE_OK);
    assert_int_equal(ces_decode_event(d, arena, &env, env.data, env.data_len, &ev, reason,
                                      sizeof(reason)),
                     CES_DECODE_OK);
    assert_int_equal(ev.ncols, 1);
    assert_int_equal(ev.cols[0].name_len, CES_DECODE_MAX_NAME_BYTES);
    assert_int_equal(ev.cols[0].type_len, CES_DECODE_MAX_NAME_BYTES);
    assert_string_equal(ev.cols[0].type, at_bound);
    assert_int_equal(ev.npkkey, 1);
    assert_int_equal(ev.pkkey[0].name_len, CES_DECODE_MAX_NAME_BYTES);
    assert_int_equal(ev.ncurrent, 1);
    assert_int_equal(ev.current[0].name_len, CES_DECODE_MAX_NAME_BYTES);
    assert_string_equal(ev.current[0].name, at_bound);
    ces_arena_destroy(arena);
    free(rec);

    static const struct {
        int over; /* 0: db, 1: column, 2: type */
        const char *reason;
    } cases[] = {{0, "eventsource: db longer than 512 bytes"},
                 {1, "eventsource.cols: column name longer than 512 bytes"},
                 {2, "eventsource.cols: type of column 'c' longer than 512 bytes"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        rec = record_with_names(cases[i].over == 0 ? over : "d", cases[i].over == 1 ? over : "c",
                                cases[i].over == 2 ? over : "int", &len);
        expect_rejected(d, rec, len, cases[i].reason);
        free(rec);
    }
    ces_decoder_destroy(d);
}

/* Hostile JSON built here rather than stored (some of it is megabytes): huge numbers, deep
 * nesting, invalid UTF-8, NULs, duplicated keys. The reasons are pinned in decode/hostile.out. */
static void golden_hostile_json(void **state) {
    (void)state;
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    ces_decoder_t *d = new_decoder();
    int n = 0;
#define HOSTILE(what, rec, len)                                                                    \
    do {                                                                                           \
        fprintf(mem, "== %d: %s\n", ++n, what);                                                    \
        ces_decode_dump_record(d, rec, len, mem);                                                  \
    } while (0)

    size_t big = 1000000, len;
    char *digits = malloc(big + 16);
    memcpy(digits, "{\"Id\":", 6);
    memset(digits + 6, '7', big);
    memcpy(digits + 6 + big, "}", 2);
    char *rec = record_with_row(digits, big + 7, &len);
    HOSTILE("a column value that is a number of 10^6 digits", rec, len);
    free(rec);

    char *env = malloc(big + 200);
    int k = snprintf(env, 200, "{\"specversion\":\"1.0\",\"segmentindex\":");
    memset(env + k, '1', big);
    strcpy(env + k + big, "}");
    HOSTILE("a segmentindex of 10^6 digits", env, strlen(env));

    k = snprintf(env, 200, "{\"specversion\":");
    memset(env + k, '[', big);
    strcpy(env + k + big, "]}");
    HOSTILE("an envelope attribute nested 10^6 levels deep", env, strlen(env));
    free(env);

    char *deep = malloc(200001);
    memcpy(deep, "{\"Id\":", 6);
    memset(deep + 6, '[', 100000 - 6);
    deep[100000] = '\0';
    rec = record_with_row(deep, 100000, &len);
    HOSTILE("a row image nested 10^5 levels deep", rec, len);
    free(rec);
    free(deep);

    const char bad_utf8[] = "{\"Id\":\"1\",\"Name\":\"\xc0\xaf\"}";
    rec = record_with_row(bad_utf8, sizeof(bad_utf8) - 1, &len);
    HOSTILE("an overlong UTF-8 sequence in a row image value", rec, len);
    free(rec);
    const char surrogate[] = "{\"Id\":\"1\",\"Name\":\"\xed\xa0\x80\"}";
    rec = record_with_row(surrogate, sizeof(surrogate) - 1, &len);
    HOSTILE("a UTF-16 surrogate encoded in UTF-8 in a row image value", rec, len);
    free(rec);
    const char escaped_surrogate[] = "{\"Id\":\"1\",\"Name\":\"a\\udc00b\"}";
    rec = record_with_row(escaped_surrogate, sizeof(escaped_surrogate) - 1, &len);
    HOSTILE("an escaped lone low surrogate in a row image value", rec, len);
    free(rec);
    const char envelope_surrogate[] =
        "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"\\udfff\"}";
    HOSTILE("an escaped lone low surrogate in an envelope attribute", envelope_surrogate,
            sizeof(envelope_surrogate) - 1);

    const char escaped_nul[] = "{\"Id\":\"1\",\"Name\":\"a\\u0000b\"}";
    rec = record_with_row(escaped_nul, sizeof(escaped_nul) - 1, &len);
    HOSTILE("an escaped NUL in a row image value", rec, len);
    free(rec);
    const char nul_key[] = "{\"Id\":\"1\",\"Na\\u0000me\":\"x\"}";
    rec = record_with_row(nul_key, sizeof(nul_key) - 1, &len);
    HOSTILE("an escaped NUL in a column name", rec, len);
    free(rec);
    const char raw_nul[] = "{\"specversion\":\"1.0\",\0\"type\":\"x\"}";
    HOSTILE("a raw NUL between envelope attributes", raw_nul, sizeof(raw_nul) - 1);

    const char dup_row[] = "{\"Id\":\"1\",\"Name\":\"x\",\"Name\":\"y\"}";
    rec = record_with_row(dup_row, sizeof(dup_row) - 1, &len);
    HOSTILE("a row image naming a column twice", rec, len);
    free(rec);
    char wide_dup[4096];
    size_t wn = (size_t)sprintf(wide_dup, "{\"Id\":\"1\"");
    for (int i = 0; i < 200; i++)
        wn += (size_t)sprintf(wide_dup + wn, ",\"C%d\":\"%d\"", i, i);
    wn += (size_t)sprintf(wide_dup + wn, ",\"C117\":\"x\"}");
    rec = record_with_row(wide_dup, wn, &len);
    HOSTILE("a row image of 202 columns naming one twice", rec, len);
    free(rec);
    rec = record_with_row("{\"Id\":\"1\"}", 10, &len);
    char *dup_env = malloc(len + 40);
    memcpy(dup_env, rec, len - 1);
    strcpy(dup_env + len - 1, ",\"operation\":\"DEL\"}");
    HOSTILE("an envelope naming operation twice", dup_env, strlen(dup_env));
    free(dup_env);
    free(rec);

    char *huge = malloc(3u << 20);
    memset(huge, ' ', 3u << 20);
    huge[0] = '{';
    HOSTILE("a record of 3 MiB, over decode.max_record_bytes", huge, 3u << 20);
    free(huge);
    HOSTILE("an empty record", "", 0);
    HOSTILE("blanks only", "  \n ", 4);
#undef HOSTILE
    fclose(mem);
    char out[512];
    snprintf(out, sizeof(out), "%s/decode/hostile.out", CES_FIXTURES);
    check_golden(out, text);
    ces_decoder_destroy(d);
    free(digits);
    free(text);
}

/* Every truncation of Avro records, bare and in a container, is rejected without a crash or a
 * leak; avro-c's leaks on those error paths are swept up. */
static void every_avro_prefix_is_rejected(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/avro/valid.in", CES_FIXTURES);
    fixture_t fx = read_fixture(path);
    ces_decoder_t *d = new_decoder();
    char reason[512];
    size_t picks[] = {0, 9}; /* a bare datum and a container */
    for (size_t p = 0; p < 2; p++) {
        const unsigned char *record = fx.records[picks[p]];
        size_t len = fx.lens[picks[p]];
        assert_int_equal(decode_whole(d, (const char *)record, len, reason, sizeof(reason)),
                         CES_DECODE_OK);
        for (size_t n = 0; n < len; n++) {
            char *copy = malloc(n + 1);
            memcpy(copy, record, n);
            reason[0] = '\0';
            if (decode_whole(d, copy, n, reason, sizeof(reason)) != CES_DECODE_REJECTED)
                fail_msg("Avro record %zu: prefix of %zu bytes was accepted", picks[p], n);
            assert_true(reason[0] != '\0');
            free(copy);
        }
    }
    ces_decoder_destroy(d);
    free_fixture(&fx);
}

/* Every input that once broke the decoder under the fuzzer (tests/fuzz/corpus/) is handled: decoded
 * or rejected with a reason, never "out of memory", under the sanitizers in the asan build. */
static void fuzz_corpus_is_handled(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/../fuzz/corpus", CES_FIXTURES);
    DIR *d = opendir(dir);
    assert_non_null(d);
    ces_decoder_t *dec = new_decoder();
    struct dirent *e;
    size_t n = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t len;
        char *rec = test_read_file(path, &len);
        char *exact = malloc(len ? len : 1);
        memcpy(exact, rec, len);
        char reason[512] = "";
        ces_decode_status_t st = decode_whole(dec, exact, len, reason, sizeof(reason));
        if (st == CES_DECODE_NOMEM || (st == CES_DECODE_REJECTED && reason[0] == '\0'))
            fail_msg("%s: status %d, reason '%s'", path, (int)st, reason);
        free(exact);
        free(rec);
        n++;
    }
    closedir(d);
    assert_true(n > 0);
    ces_decoder_destroy(dec);
}

/* kafka.format forces one encoding. */
static void forced_format(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/avro/valid.in", CES_FIXTURES);
    fixture_t fx = read_fixture(path);
    snprintf(path, sizeof(path), "%s/examples/current-insert.json", CES_FIXTURES);
    size_t json_len;
    char *json = test_read_file(path, &json_len);
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    char reason[512];

    limits.format = CES_FORMAT_JSON;
    ces_decoder_t *d = ces_decoder_new(&limits);
    assert_int_equal(decode_whole(d, json, json_len, reason, sizeof(reason)), CES_DECODE_OK);
    expect_rejected(d, (const char *)fx.records[0], fx.lens[0], "kafka.format is \"json\"");
    ces_decoder_destroy(d);

    limits.format = CES_FORMAT_AVRO;
    d = ces_decoder_new(&limits);
    assert_int_equal(decode_whole(d, (const char *)fx.records[0], fx.lens[0], reason,
                                  sizeof(reason)),
                     CES_DECODE_OK);
    assert_int_equal(decode_whole(d, (const char *)fx.records[9], fx.lens[9], reason,
                                  sizeof(reason)),
                     CES_DECODE_OK);
    expect_rejected(d, json, json_len, "Avro ChangeEvent");
    ces_decoder_destroy(d);

    ces_decode_format_t f;
    assert_int_equal(ces_decode_format_parse("auto", &f), 0);
    assert_int_equal(f, CES_FORMAT_AUTO);
    assert_int_equal(ces_decode_format_parse("avro", &f), 0);
    assert_int_equal(f, CES_FORMAT_AVRO);
    assert_int_equal(ces_decode_format_parse("AVRO", &f), -1);
    free(json);
    free_fixture(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_valid),
        cmocka_unit_test(golden_malformed),
        cmocka_unit_test(names_and_types_are_bounded),
        cmocka_unit_test(example_records),
        cmocka_unit_test(every_prefix_is_rejected),
        cmocka_unit_test(bounds),
        cmocka_unit_test(invalid_utf8_is_rejected),
        cmocka_unit_test(golden_hostile_json),
        cmocka_unit_test(golden_avro_valid),
        cmocka_unit_test(golden_avro_malformed),
        cmocka_unit_test(golden_avro_segmented),
        cmocka_unit_test(avro_schemas_match_fixtures),
        cmocka_unit_test(every_avro_prefix_is_rejected),
        cmocka_unit_test(forced_format),
        cmocka_unit_test(fuzz_corpus_is_handled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
