/* Event Hubs Capture files (capfile.h) written by Apache Avro's Python library
 * (tests/fixtures/capture/make-fixtures.py): records in order across blocks and codecs, and a
 * clear reason for everything that is not a whole Capture file. */
#include "test_util.h"

#include "format/avro.h"
#include "format/capfile.h"

static ces_capfile_schemas_t *schemas;
static const ces_capfile_limits_t limits = {.max_block_bytes = 1u << 20, .max_map_items = 64};

typedef struct {
    int64_t seq[16];
    size_t len[16];
    bool null[16];
    char first[16];
    size_t n;
    ces_capfile_status_t end; /* what ended the reading */
    char why[512];
    char codec[16];
} read_t;

/* Reads a fixture to its end or first error. */
static void read_fixture(const char *name, const ces_capfile_limits_t *l, read_t *out) {
    char path[512];
    snprintf(path, sizeof(path), "%s/capture/%s", CES_FIXTURES, name);
    memset(out, 0, sizeof(*out));
    ces_capfile_t *f = ces_capfile_open(schemas, path, l, &out->end, out->why, sizeof(out->why));
    if (f == NULL)
        return;
    snprintf(out->codec, sizeof(out->codec), "%s", ces_capfile_codec(f));
    ces_capfile_record_t r;
    while ((out->end = ces_capfile_next(f, &r, out->why, sizeof(out->why))) ==
           CES_CAPFILE_RECORD) {
        assert_true(out->n < 16);
        out->seq[out->n] = r.sequence;
        out->len[out->n] = r.body_len;
        out->null[out->n] = r.body_null;
        out->first[out->n] = r.body_len > 0 ? (char)r.body[0] : 0;
        out->n++;
        free(r.body);
    }
    ces_capfile_close(f);
}

static void null_codec(void **state) {
    const char *name = *state != NULL ? *state : "null.avro";
    size_t swept = ces_avro_swept_blocks();
    read_t r;
    read_fixture(name, &limits, &r);
    assert_int_equal(r.end, CES_CAPFILE_END);
    assert_string_equal(r.codec, "null");
    assert_int_equal(r.n, 3);
    assert_int_equal(r.seq[0], 10);
    assert_int_equal(r.seq[2], 12);
    assert_int_equal(r.len[0], 3);
    assert_int_equal(r.first[1], 't');
    assert_false(r.null[1]);
    assert_true(r.null[2]);
    assert_int_equal(r.len[2], 0);
    /* avro-c leaked nothing (a header longer than the first read is read twice, and avro-c's
     * error path of the first attempt leaks what the guard then frees). */
    if (strcmp(name, "null.avro") == 0)
        assert_int_equal(ces_avro_swept_blocks(), swept);
}

static void deflate_codec_two_blocks(void **state) {
    (void)state;
    read_t r;
    read_fixture("deflate.avro", &limits, &r);
    assert_int_equal(r.end, CES_CAPFILE_END);
    assert_string_equal(r.codec, "deflate");
    assert_int_equal(r.n, 5);
    for (size_t i = 0; i < 5; i++)
        assert_int_equal(r.seq[i], 20 + (int64_t)i);
    assert_int_equal(r.len[0], 100);
    assert_int_equal(r.len[3], 3000);
    assert_int_equal(r.first[3], 'd');
}

static void empty_window(void **state) {
    (void)state;
    read_t r;
    read_fixture("empty.avro", &limits, &r);
    assert_int_equal(r.end, CES_CAPFILE_END);
    assert_int_equal(r.n, 0);
}

/* The records before a broken block are handed over; the reason names the file and the place. */
static void broken_after_good_records(void **state) {
    (void)state;
    static const struct {
        const char *name, *why;
    } cases[] = {
        {"truncated.avro", "truncated: the file ends inside the block at byte"},
        {"badsync.avro", "does not end with the header's sync marker"},
    };
    for (size_t i = 0; i < 2; i++) {
        read_t r;
        read_fixture(cases[i].name, &limits, &r);
        assert_int_equal(r.end, CES_CAPFILE_INVALID);
        assert_int_equal(r.n, 3);
        if (strstr(r.why, cases[i].why) == NULL || strstr(r.why, cases[i].name) == NULL)
            fail_msg("%s: reason '%s'", cases[i].name, r.why);
    }
}

static void refused_files(void **state) {
    (void)state;
    static const struct {
        const char *name, *why;
        ces_capfile_status_t st;
    } cases[] = {
        {"bzip2.avro", "codec 'bzip2' is not supported", CES_CAPFILE_INVALID},
        {"other.avro", "not an Event Hubs Capture file: its records are not EventData", CES_CAPFILE_INVALID},
        {"notavro.txt", "not an Avro object container file", CES_CAPFILE_INVALID},
        {"no-such-file.avro", "No such file or directory", CES_CAPFILE_IO},
        {"trailing.avro", "has bytes after its 1 records", CES_CAPFILE_INVALID},
        {"bomb.avro", "inflates to more than 1048576 bytes", CES_CAPFILE_INVALID},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        read_t r;
        read_fixture(cases[i].name, &limits, &r);
        assert_int_equal(r.n, 0);
        if (r.end != cases[i].st || strstr(r.why, cases[i].why) == NULL)
            fail_msg("%s: status %d, reason '%s'", cases[i].name, r.end, r.why);
    }
}

/* Every prefix of a good file: records, then the end exactly at a block boundary, else a reason;
 * never more records than the file holds, never a crash (the sanitizer build runs this). */
static void every_truncation(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/capture/deflate.avro", CES_FIXTURES);
    size_t len;
    char *bytes = test_read_file(path, &len);
    size_t ends = 0;
    for (size_t cut = 0; cut < len; cut++) {
        FILE *s = fmemopen(bytes, cut > 0 ? cut : 1, "rb");
        assert_non_null(s);
        if (cut == 0)
            fgetc(s); /* fmemopen refuses a size of 0: an empty stream instead */
        ces_capfile_status_t st;
        char why[512] = "";
        ces_capfile_t *f = ces_capfile_open_stream(schemas, s, "cut", &limits, &st, why, sizeof(why));
        size_t n = 0;
        ces_capfile_record_t r;
        while (f != NULL && (st = ces_capfile_next(f, &r, why, sizeof(why))) == CES_CAPFILE_RECORD) {
            free(r.body);
            n++;
        }
        ces_capfile_close(f);
        assert_true(n <= 5);
        if (st == CES_CAPFILE_END)
            ends++;
        else if (st != CES_CAPFILE_INVALID || why[0] == '\0')
            fail_msg("cut at %zu: status %d, reason '%s'", cut, st, why);
    }
    /* Only right after the header (an empty window) and after the first block. */
    assert_int_equal(ends, 2);
    free(bytes);
}

static int setup(void **state) {
    (void)state;
    schemas = ces_capfile_schemas_new();
    return schemas == NULL ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    ces_capfile_schemas_destroy(schemas);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_codec),
        cmocka_unit_test_prestate(null_codec, "bigheader.avro"),
        cmocka_unit_test(deflate_codec_two_blocks),
        cmocka_unit_test(empty_window),
        cmocka_unit_test(broken_after_good_records),
        cmocka_unit_test(refused_files),
        cmocka_unit_test(every_truncation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
