/*
 * intake: records taken in as events, joined segments and dead letters (an event group that never
 * completes, a segment that looks whole), decoded alike on one thread or several, staged within the
 * batch's room.
 */
#include "test_pipeline.h"

#include <sys/mman.h>

static void group_that_never_completes(void **state) {
    (void)state;
    ces_pipeline_t *p = new_pipeline();
    const char *seg = "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\","
                      "\"id\":\"i\",\"logicalid\":\"u:0000000100000001000A:00000000000000000001\","
                      "\"operation\":\"INS\",\"segmentindex\":0,\"finalsegment\":false,"
                      "\"data\":\"{\\\"eventsource\\\"\"}";
    ces_record_t r = {.topic = "ces", .partition = 1, .offset = 7, .value = seg,
                      .len = strlen(seg)};
    char err[256];
    assert_int_equal(ces_intake_add(p, &r, 0, err, sizeof(err)), CES_PIPELINE_OK);
    tick(p, 4999);
    assert_int_equal(ces_pipeline_batch_events(p), 0);
    tick(p, 5000); /* reassembly timeout: a dead letter, nothing blocks */
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    const ces_item_t *item = ces_pipeline_batch_item(p, 0);
    assert_int_equal(item->kind, CES_ITEM_DEAD_LETTER);
    assert_int_equal(item->source.offset, 7);
    assert_non_null(strstr(item->reason, "incomplete"));
    ces_pipeline_destroy(p);
}

/* JSON-escapes s into out (for the data string of an envelope). */
static void escape_json(const char *s, char *out, size_t size) {
    size_t n = 0;
    for (; *s != '\0' && n + 3 < size; s++) {
        if (*s == '"' || *s == '\\')
            out[n++] = '\\';
        out[n++] = *s;
    }
    out[n] = '\0';
}

/* One segment of the event below, at index with finalsegment as given, on partition index. */
static void feed_segment(ces_pipeline_t *p, int64_t offset, int index, bool final,
                         const char *data_part) {
    char escaped[2048], rec[4096];
    escape_json(data_part, escaped, sizeof(escaped));
    snprintf(rec, sizeof(rec),
             "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"i\","
             "\"logicalid\":\"u:000000010000002A0001:00000000000000000001\","
             "\"operation\":\"INS\",\"segmentindex\":%d,\"finalsegment\":%s,"
             "\"data\":\"%s\"}",
             index, final ? "true" : "false", escaped);
    ces_record_t r = {.topic = "ces", .partition = index, .offset = offset, .value = rec,
                      .len = strlen(rec)};
    char err[256];
    assert_int_equal(ces_intake_add(p, &r, 0, err, sizeof(err)), CES_PIPELINE_OK);
}

/*
 * Two 0-based segments: the last one (index 1, finalsegment) looks like a whole 1-based record,
 * and decoding it as one fails only after its data was partly parsed in place. It must still
 * join its first segment intact, whichever comes first. The split puts a string at the start of
 * the second part, so that the failed decoding does change its text.
 */
static void last_of_two_zero_based_segments(void **state) {
    (void)state;
    static const char data[] =
        "{\"eventsource\":{\"db\":\"d\",\"schema\":\"s\",\"tbl\":\"T\",\"cols\":[{\"name\":"
        "\"k\",\"type\":\"int\",\"index\":0}],\"pkkey\":[{\"columnname\":\"k\",\"value\":"
        "\"42\"}],\"transaction\":{\"commitlsn\":\"00000001:0000002A:0001\","
        "\"sequencenumber\":1}},\"eventrow\":{\"old\":\"{}\",\"current\":"
        "\"{\\\"k\\\":\\\"42\\\"}\"}}";
    const char *split = strstr(data, "\"schema\"");
    assert_non_null(split);
    char first[512];
    snprintf(first, sizeof(first), "%.*s", (int)(split - data), data);
    for (int second_first = 0; second_first < 2; second_first++) {
        ces_pipeline_t *p = new_pipeline();
        if (second_first) {
            feed_segment(p, 0, 1, true, split);
            feed_segment(p, 0, 0, false, first);
        } else {
            feed_segment(p, 0, 0, false, first);
            feed_segment(p, 0, 1, true, split);
        }
        ces_release_partition_eof(p, "ces", 0, 1);
        ces_release_partition_eof(p, "ces", 1, 1);
        tick(p, WINDOW);
        assert_int_equal(ces_pipeline_batch_events(p), 1);
        const ces_item_t *item = ces_pipeline_batch_item(p, 0);
        assert_int_equal(item->kind, CES_ITEM_EVENT);
        assert_string_equal(item->event.table, "T");
        assert_int_equal(item->event.ncurrent, 1);
        assert_string_equal(item->event.current[0].value, "42");
        assert_int_equal(item->nmore_sources, 1);
        ces_pipeline_destroy(p);
    }
}

/* The i-th record of a stream that mixes whole events with records to dead-letter (not JSON, an
 * unknown event type) and the two 0-based segments of one event, the second of which looks whole. */
static size_t mixed_record(size_t i, char *rec, size_t size) {
    static const char data[] =
        "{\"eventsource\":{\"db\":\"d\",\"schema\":\"s\",\"tbl\":\"T\",\"cols\":[{\"name\":"
        "\"k\",\"type\":\"int\",\"index\":0}],\"pkkey\":[{\"columnname\":\"k\",\"value\":"
        "\"4242\"}],\"transaction\":{\"commitlsn\":\"00000002:0000002A:0001\","
        "\"sequencenumber\":1}},\"eventrow\":{\"old\":\"{}\",\"current\":"
        "\"{\\\"k\\\":\\\"4242\\\"}\"}}";
    if (i == 50 || i == 51) {
        const char *split = strstr(data, "\"schema\"");
        char part[512], escaped[1024];
        snprintf(part, sizeof(part), "%.*s", i == 50 ? (int)(split - data) : (int)strlen(split),
                 i == 50 ? data : split);
        escape_json(part, escaped, sizeof(escaped));
        snprintf(rec, size,
                 "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\","
                 "\"id\":\"i\",\"logicalid\":\"u:000000020000002A0001:00000000000000000001\","
                 "\"operation\":\"INS\",\"segmentindex\":%d,\"finalsegment\":%s,"
                 "\"data\":\"%s\"}",
                 (int)(i - 50), i == 51 ? "true" : "false", escaped);
    } else if (i % 10 == 3) {
        snprintf(rec, size, "not JSON, record %zu", i);
    } else if (i % 10 == 7) {
        make_record(rec, size, (unsigned)i + 1, 1, (int)i);
        char *v1 = strstr(rec, "DML.V1");
        assert_non_null(v1);
        v1[5] = '9';
    } else {
        make_record(rec, size, (unsigned)i + 1, 1, (int)i);
    }
    return strlen(rec);
}

/* A record's item holds its own copy of the feed's bytes (they go back when it is taken in). */
static void assert_raw_copied(const ces_item_t *item, const char *rec, size_t len) {
    assert_int_equal(item->raw_len, len);
    assert_ptr_not_equal(item->raw, rec);
    assert_memory_equal(item->raw, rec, len);
}

/*
 * Records staged and decoded by several threads at once end up as the same items, in the same
 * order, as the same records added one by one on one thread.
 */
static void staged_records_decode_alike(void **state) {
    (void)state;
    enum { N = 100 };
    /* The feed's bytes are read-only: decoding from them must never write to them. */
    char(*recs)[2048] = mmap(NULL, N * sizeof(*recs), PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(recs != MAP_FAILED);
    size_t lens[N];
    for (size_t i = 0; i < N; i++)
        lens[i] = mixed_record(i, recs[i], sizeof(recs[i]));
    assert_int_equal(mprotect(recs, N * sizeof(*recs), PROT_READ), 0);
    ces_pipeline_t *one = new_pipeline_with(0, CES_ORDER_BY_PARTITION, 1);
    ces_pipeline_t *many = new_pipeline_with(0, CES_ORDER_BY_PARTITION, 4);
    char err[256];
    size_t staged = 0;
    for (size_t i = 0; i < N; i++) {
        ces_record_t r = {.topic = "ces", .partition = (int32_t)(i % 2), .offset = (int64_t)i,
                          .value = recs[i], .len = lens[i]};
        assert_int_equal(ces_intake_add(one, &r, 0, err, sizeof(err)), CES_PIPELINE_OK);
        staged++;
        if (ces_intake_stage(many, &r)) {
            assert_int_equal(staged, 32); /* short records: the stage fills by count */
            assert_int_equal(ces_intake_take(many, 0, true, err, sizeof(err)),
                             CES_PIPELINE_OK);
            staged = 0;
        }
    }
    assert_int_equal(ces_intake_take(many, 0, false, err, sizeof(err)), CES_PIPELINE_OK);
    tick(one, 0);
    tick(many, 0);
    /* 78 whole events, 10 + 10 dead letters, one event of two segments. */
    assert_int_equal(ces_pipeline_batch_events(one), 78 + 20 + 1);
    assert_int_equal(ces_pipeline_batch_events(many), ces_pipeline_batch_events(one));
    size_t dead = 0, joined = 0;
    for (size_t i = 0; i < ces_pipeline_batch_events(one); i++) {
        const ces_item_t *a = ces_pipeline_batch_item(one, i), *b = ces_pipeline_batch_item(many, i);
        assert_int_equal(a->kind, b->kind);
        assert_int_equal(a->source.partition, b->source.partition);
        assert_int_equal(a->source.offset, b->source.offset);
        assert_int_equal(a->nmore_sources, b->nmore_sources);
        if (a->nmore_sources == 0) { /* a joined event holds its joined data instead */
            assert_raw_copied(a, recs[a->source.offset], lens[a->source.offset]);
            assert_raw_copied(b, recs[b->source.offset], lens[b->source.offset]);
        }
        if (a->kind == CES_ITEM_DEAD_LETTER) {
            dead++;
            assert_string_equal(a->reason, b->reason);
            continue;
        }
        joined += a->nmore_sources;
        assert_string_equal(a->event.table, b->event.table);
        assert_true(ces_version_compare(&a->event.version, &b->event.version) == 0);
        assert_int_equal(a->event.ncurrent, 1);
        assert_string_equal(a->event.current[0].value, b->event.current[0].value);
    }
    assert_int_equal(dead, 20);
    assert_int_equal(joined, 1);
    ces_pipeline_destroy(one);
    ces_pipeline_destroy(many);
    munmap(recs, N * sizeof(*recs));
}

/* In partition mode no more records are staged than the batch being read has room for. */
static void stage_room_follows_the_batch(void **state) {
    (void)state;
    ces_pipeline_options_t o = {
        .batch_max_events = 10,
        .batch_max_ms = 100,
        .store_positions = true,
        .reasm = {1 << 20, 100, 5000},
        .ordering = CES_ORDER_BY_PARTITION,
        .dedup_window = 100,
        .decode_threads = 2,
    };
    ces_pipeline_t *p = ces_pipeline_new(&o, decoder, NULL);
    assert_non_null(p);
    int32_t parts[1] = {0};
    int64_t offsets[1];
    assert_int_equal(ces_pipeline_on_assigned(p, "ces", parts, 1, offsets), 0);
    assert_int_equal(ces_intake_room(p), 10);
    static char recs[10][2048];
    char err[256];
    for (int i = 0; i < 4; i++) {
        ces_record_t r = {.topic = "ces", .partition = 0, .offset = i, .value = recs[i]};
        make_record(recs[i], sizeof(recs[i]), (unsigned)i + 1, 1, i);
        r.len = strlen(recs[i]);
        assert_false(ces_intake_stage(p, &r));
    }
    assert_int_equal(ces_intake_room(p), 6);
    /* Decoded ahead: taken in when the helper has finished them, else not yet (it may be quick
     * or not), and they count either way. */
    assert_int_equal(ces_intake_take(p, 0, true, err, sizeof(err)), CES_PIPELINE_OK);
    size_t taken = ces_pipeline_batch_events(p);
    if (taken == 0)
        assert_true(ces_intake_busy(p));
    else
        assert_true(taken == 4 && !ces_intake_busy(p));
    assert_int_equal(ces_intake_room(p), 6);
    for (int i = 4; i < 10; i++) {
        ces_record_t r = {.topic = "ces", .partition = 0, .offset = i, .value = recs[i]};
        make_record(recs[i], sizeof(recs[i]), (unsigned)i + 1, 1, i);
        r.len = strlen(recs[i]);
        ces_intake_stage(p, &r);
    }
    assert_int_equal(ces_intake_room(p), 0);
    assert_int_equal(ces_intake_take(p, 0, false, err, sizeof(err)), CES_PIPELINE_OK);
    assert_false(ces_intake_busy(p));
    assert_int_equal(ces_pipeline_batch_events(p), 10);
    assert_int_equal(ces_intake_room(p), 0);
    assert_true(ces_loop_due(p, 0));
    ces_pipeline_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(group_that_never_completes),
        cmocka_unit_test(last_of_two_zero_based_segments),
        cmocka_unit_test(staged_records_decode_alike),
        cmocka_unit_test(stage_room_follows_the_batch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
