/*
 * The release rules of transaction mode, without PostgreSQL: what the next batch would hold after
 * adversarial arrival sequences (interleaved transactions across partitions, a lagging partition, a
 * quiet one, duplicates, an event group that never completes).
 */
#include "test_util.h"

#include <signal.h>
#include <sys/mman.h>

#include "pipeline/pipeline_int.h"

#define WINDOW 200

static ces_decoder_t *decoder;

static int setup(void **state) {
    (void)state;
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    decoder = ces_decoder_new(&limits);
    return decoder ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ces_decoder_destroy(decoder);
    return 0;
}

static ces_pipeline_options_t options_with(size_t batch_max_bytes, ces_ordering_t ordering,
                                           size_t decode_threads) {
    return (ces_pipeline_options_t){
        .batch_max_events = 1000,
        .batch_max_bytes = batch_max_bytes,
        .batch_max_ms = 100,
        .store_offsets = true,
        .reasm = {1 << 20, 100, 5000},
        .ordering = ordering,
        .reorder_window_ms = WINDOW,
        .dedup_window = 100,
        .max_pending_events = 0,
        .decode_threads = decode_threads,
    };
}

/* A pipeline with partitions 0 and 1 of topic "ces" assigned, no positions stored. */
static ces_pipeline_t *new_pipeline_from(const ces_pipeline_options_t *o) {
    ces_pipeline_t *p = ces_pipeline_new(o, decoder, NULL);
    assert_non_null(p);
    int32_t parts[2] = {0, 1};
    int64_t offsets[2];
    assert_int_equal(ces_pipeline_on_assigned(p, "ces", parts, 2, offsets), 0);
    return p;
}

static ces_pipeline_t *new_pipeline_with(size_t batch_max_bytes, ces_ordering_t ordering,
                                         size_t decode_threads) {
    ces_pipeline_options_t o = options_with(batch_max_bytes, ordering, decode_threads);
    return new_pipeline_from(&o);
}

static ces_pipeline_t *new_pipeline_sized(size_t batch_max_bytes) {
    return new_pipeline_with(batch_max_bytes, CES_ORDER_BY_TRANSACTION, 1);
}

static ces_pipeline_t *new_pipeline(void) { return new_pipeline_sized(0); }

/* The record of one INS of table T, key key, at commit LSN 1:block:1 with sequence seq. */
static void make_record(char *rec, size_t size, unsigned block, unsigned seq, int key) {
    char data[512];
    snprintf(data, sizeof(data),
             "{\\\"eventsource\\\":{\\\"db\\\":\\\"d\\\",\\\"schema\\\":\\\"s\\\",\\\"tbl\\\":"
             "\\\"T\\\",\\\"cols\\\":[{\\\"name\\\":\\\"k\\\",\\\"type\\\":\\\"int\\\","
             "\\\"index\\\":0}],\\\"pkkey\\\":[{\\\"columnname\\\":\\\"k\\\",\\\"value\\\":"
             "\\\"%d\\\"}],\\\"transaction\\\":{\\\"commitlsn\\\":\\\"00000001:%08X:0001\\\","
             "\\\"sequencenumber\\\":%u}},\\\"eventrow\\\":{\\\"old\\\":\\\"{}\\\","
             "\\\"current\\\":\\\"{\\\\\\\"k\\\\\\\":\\\\\\\"%d\\\\\\\"}\\\"}}",
             key, block, seq, key);
    snprintf(rec, size,
             "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"i\","
             "\"logicalid\":\"u:00000001%08X0001:%020u\",\"operation\":\"INS\","
             "\"segmentindex\":1,\"finalsegment\":true,\"data\":\"%s\"}",
             block, seq, data);
}

/* Feeds one INS of table T, key key, at commit LSN 1:block:1 with sequence seq. */
static void feed(ces_pipeline_t *p, int32_t partition, int64_t offset, unsigned block,
                 unsigned seq, int key, int64_t now) {
    char rec[2048];
    make_record(rec, sizeof(rec), block, seq, key);
    ces_record_t r = {.topic = "ces", .partition = partition, .offset = offset, .value = rec,
                      .len = strlen(rec)};
    char err[256];
    assert_int_equal(ces_intake_add(p, &r, now, err, sizeof(err)), CES_PIPELINE_OK);
}

static void tick(ces_pipeline_t *p, int64_t now) {
    char err[256];
    assert_int_equal(ces_release_tick(p, now, err, sizeof(err)), CES_PIPELINE_OK);
}

static unsigned seq_at(ces_pipeline_t *p, size_t i) {
    return (unsigned)ces_pipeline_batch_item(p, i)->event.position.sequence;
}

static void interleaved_across_partitions(void **state) {
    (void)state;
    ces_pipeline_t *p = new_pipeline();
    /* T1 (block 10) spans both partitions; T2 (block 20) only partition 0. */
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 0, 1, 20, 1, 2, 0);
    tick(p, 0);
    assert_int_equal(ces_pipeline_batch_events(p), 0); /* partition 1 said nothing yet */
    feed(p, 1, 0, 10, 2, 3, 1);
    tick(p, 1);
    assert_int_equal(ces_pipeline_batch_events(p), 0); /* partition 1 may have more of T1 */
    ces_release_partition_eof(p, "ces", 1, 1);
    tick(p, 1 + WINDOW - 1);
    assert_int_equal(ces_pipeline_batch_events(p), 0); /* caught up, but not quiet long enough */
    tick(p, 1 + WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2); /* T1 whole, in sequence order */
    assert_int_equal(seq_at(p, 0), 1);
    assert_int_equal(seq_at(p, 1), 2);
    /* T2: partition 0 has not passed it and is not caught up. */
    tick(p, 10000);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    feed(p, 0, 2, 30, 1, 4, 10000);
    tick(p, 10000);
    assert_int_equal(ces_pipeline_batch_events(p), 3); /* partition 0 passed T2 */
    ces_pipeline_destroy(p);
}

static void lagging_partition_holds_everything(void **state) {
    (void)state;
    ces_pipeline_t *p = new_pipeline();
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 0, 1, 11, 1, 2, 0);
    ces_release_partition_eof(p, "ces", 0, 2);
    /* Partition 1 delivered an older commit and is still reading (no EOF): it may still deliver
     * more of 5, or events of 10 or 11, however long it takes. */
    feed(p, 1, 0, 5, 1, 3, 0);
    tick(p, 100000);
    assert_int_equal(ces_pipeline_batch_events(p), 0);
    feed(p, 1, 1, 10, 2, 4, 100000);
    feed(p, 1, 2, 12, 1, 5, 100000);
    tick(p, 100000);
    /* T5, T10 (2 events, one from each partition) and T11 (partition 0 is quiet) are complete
     * now; T12 is not. */
    assert_int_equal(ces_pipeline_batch_events(p), 4);
    assert_int_equal(seq_at(p, 1), 1);
    assert_int_equal(seq_at(p, 2), 2);
    ces_pipeline_destroy(p);
}

static void duplicates_and_quiet_partition(void **state) {
    (void)state;
    ces_pipeline_t *p = new_pipeline();
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 1, 0, 10, 1, 1, 0); /* the same event resent through another partition */
    ces_release_partition_eof(p, "ces", 0, 0);
    ces_release_partition_eof(p, "ces", 1, 0);
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    ces_pipeline_stats_t st;
    ces_pipeline_get_stats(p, &st);
    assert_int_equal(st.duplicates, 1);
    ces_pipeline_destroy(p);
}

/* Four events in three complete transactions (10: two events, 11, 12). */
static void feed_three_transactions(ces_pipeline_t *p) {
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 0, 1, 10, 2, 2, 0);
    feed(p, 0, 2, 11, 1, 3, 0);
    feed(p, 1, 0, 12, 1, 4, 0);
    ces_release_partition_eof(p, "ces", 0, 3);
    ces_release_partition_eof(p, "ces", 1, 1);
}

/* A batch that does not fill is applied at the first pause in arrivals once it is 5 ms old (the
 * latency of a trickle), and at batch_max_ms (100) in any case. */
static void open_batch_settles_after_5_ms(void **state) {
    (void)state;
    ces_pipeline_t *p = new_pipeline();
    feed_three_transactions(p);
    tick(p, 1000); /* released at 1000: the batch opens then */
    assert_int_equal(ces_pipeline_batch_events(p), 4);
    assert_false(ces_loop_settled(p, 1004));
    assert_true(ces_loop_settled(p, 1005));
    assert_int_equal(ces_loop_wait_ms(p, 1001, 50), 4);
    assert_false(ces_loop_due(p, 1099));
    assert_true(ces_loop_due(p, 1100));
    ces_pipeline_destroy(p);
}

/* apply.batch_max_bytes: a batch is full at its bytes long before its events, and takes whole
 * transactions only. */
static void batch_full_by_bytes(void **state) {
    (void)state;
    /* Without the byte limit: one batch of four. */
    ces_pipeline_t *p = new_pipeline();
    feed_three_transactions(p);
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 4);
    assert_false(ces_loop_due(p, WINDOW));
    size_t first = ces_item_bytes(ces_pipeline_batch_item(p, 0)) +
                   ces_item_bytes(ces_pipeline_batch_item(p, 1));
    ces_pipeline_destroy(p);

    /* Limited to the bytes of transaction 10: the batch stops after it. (Transaction 11 alone is
     * smaller, so it is not streamed either.) */
    p = new_pipeline_sized(first);
    feed_three_transactions(p);
    assert_false(ces_loop_due(p, 0));
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    assert_int_equal(seq_at(p, 1), 2);
    assert_true(ces_loop_due(p, WINDOW));
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2); /* full: nothing more is added */
    ces_pipeline_destroy(p);

    /* One byte more: transactions 10 and 11 fit below the limit (whole, past it). */
    p = new_pipeline_sized(first + 1);
    feed_three_transactions(p);
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 3);
    assert_true(ces_loop_due(p, WINDOW));
    ces_pipeline_destroy(p);
}

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

/*
 * Records staged and decoded by several threads at once end up as the same items, in the same
 * order, as the same records added one by one on one thread.
 */
static ces_poll_status_t feed_fails(void *opaque, int timeout_ms, ces_record_t *record,
                                    char *errstr, size_t errstr_size) {
    (void)opaque, (void)timeout_ms, (void)record;
    snprintf(errstr, errstr_size, "could not read stored positions");
    return CES_POLL_FATAL;
}

/*
 * A record staged before a rebalance resumes partition 0 past its stored position (a source gap)
 * with kafka.on_source_gap = "stop". The rebalance callback fails (the consumer then stops with a
 * generic error), and the loop ends with the gap's status and message, not a generic failure: the
 * daemon exits with the gap's exit status.
 */
static void source_gap_found_in_a_rebalance_ends_as_a_gap(void **state) {
    (void)state;
    ces_pipeline_options_t o = options_with(0, CES_ORDER_BY_TRANSACTION, 1);
    o.stop_on_source_gap = true;
    ces_pipeline_t *p = new_pipeline_from(&o);
    partition_t *part = ces_pipeline_partition(p, "ces", 0, false);
    ces_positions_on_assign(&part->pos, "ces", 0, 100); /* PostgreSQL's position: 100 */
    char rec[2048];
    make_record(rec, sizeof(rec), 10, 1, 1);
    ces_intake_stage(p, &(ces_record_t){.topic = "ces", .partition = 0, .offset = 250,
                                       .value = rec, .len = strlen(rec)});
    int32_t more[1] = {2};
    int64_t offsets[1];
    assert_int_equal(ces_pipeline_on_assigned(p, "ces", more, 1, offsets), -1);
    ces_feed_t feed = {.poll = feed_fails};
    ces_pipeline_set_feed(p, &feed);
    volatile sig_atomic_t stop = 0;
    char err[1024];
    assert_int_equal(ces_pipeline_run(p, NULL, &stop, err, sizeof(err)), CES_PIPELINE_SOURCE_GAP);
    assert_non_null(strstr(err, "stopped at a source gap on ces[0]"));
    ces_pipeline_stats_t st;
    ces_pipeline_get_stats(p, &st);
    assert_int_equal(st.source_gaps, 1);
    assert_int_equal(ces_pipeline_batch_events(p), 0); /* nothing past the gap */
    ces_pipeline_destroy(p);
}

/* The record of one INS of table T at LSN 1:block:1, key key, with a value of pad 'x's. */
static size_t padded_record(char *rec, size_t size, unsigned block, int key, size_t pad) {
    char *value = malloc(pad + 1);
    assert_non_null(value);
    memset(value, 'x', pad);
    value[pad] = '\0';
    int n = snprintf(
        rec, size,
        "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"i\","
        "\"logicalid\":\"u:00000001%08X0001:%020u\",\"operation\":\"INS\","
        "\"segmentindex\":1,\"finalsegment\":true,\"data\":\"{\\\"eventsource\\\":{\\\"db\\\":"
        "\\\"d\\\",\\\"schema\\\":\\\"s\\\",\\\"tbl\\\":\\\"T\\\",\\\"cols\\\":[{\\\"name\\\":"
        "\\\"k\\\",\\\"type\\\":\\\"int\\\",\\\"index\\\":0},{\\\"name\\\":\\\"v\\\",\\\"type\\\":"
        "\\\"varchar\\\",\\\"index\\\":1}],\\\"pkkey\\\":[{\\\"columnname\\\":\\\"k\\\","
        "\\\"value\\\":\\\"%d\\\"}],\\\"transaction\\\":{\\\"commitlsn\\\":"
        "\\\"00000001:%08X:0001\\\",\\\"sequencenumber\\\":1}},\\\"eventrow\\\":{\\\"old\\\":"
        "\\\"{}\\\",\\\"current\\\":\\\"{\\\\\\\"k\\\\\\\":\\\\\\\"%d\\\\\\\",\\\\\\\"v\\\\\\\":"
        "\\\\\\\"%s\\\\\\\"}\\\"}}\"}",
        block, (unsigned)key, key, block, key, value);
    free(value);
    assert_true(n > 0 && (size_t)n < size);
    return (size_t)n;
}

/* Records of PADDED_BYTES 'x's each, large enough that a decoding arena outgrows its first block. */
enum { PADDED_RECORDS = 24, PADDED_BYTES = 40000, PADDED_SIZE = PADDED_BYTES + 2048 };

/* Stages the first n padded records, at offsets from first on. */
static void stage_padded(ces_pipeline_t *p, char (*recs)[PADDED_SIZE], size_t n, int64_t first) {
    for (size_t i = 0; i < n; i++)
        ces_intake_stage(p, &(ces_record_t){.topic = "ces", .partition = 0,
                                           .offset = first + (int64_t)i,
                                           .value = recs[i], .len = strlen(recs[i])});
}

static void take_staged(ces_pipeline_t *p) {
    char err[256];
    assert_int_equal(ces_intake_take(p, 0, false, err, sizeof(err)), CES_PIPELINE_OK);
}

/* The emptied decoding arenas kept for later records stay within SPARE_BYTES however large the
 * records were, and account for exactly what they keep. With helpers, each staged record is given
 * an arena; alone, every record is decoded in the one the record before it left. */
static void spare_arenas_stay_bounded(void **state) {
    (void)state;
    enum { N = PADDED_RECORDS, PAD = PADDED_BYTES };
    static char recs[N][PADDED_SIZE];
    for (size_t i = 0; i < N; i++)
        padded_record(recs[i], sizeof(recs[i]), 10 + (unsigned)i, (int)i, PAD);
    for (size_t threads = 1; threads <= 2; threads++) {
        ces_pipeline_t *p = new_pipeline_with(0, CES_ORDER_BY_PARTITION, threads);
        /* Twice: a fresh arena outgrows its first block and keeps nothing when emptied; used
         * again, it is made of one block as large as the record needed, which it keeps. */
        for (int round = 0; round < 2; round++) {
            stage_padded(p, recs, N, round * N);
            take_staged(p);
        }
        assert_int_equal(ces_pipeline_batch_events(p), 2 * N);
        assert_int_equal(ces_pipeline_batch_item(p, 0)->kind, CES_ITEM_EVENT);
        assert_int_equal(strlen(ces_pipeline_batch_item(p, N - 1)->event.current[1].value), PAD);
        assert_true(p->spare_bytes <= SPARE_BYTES);
        size_t kept = 0;
        for (size_t i = 0; i < p->nspares; i++)
            kept += ces_arena_footprint(p->spares[i]);
        assert_int_equal(kept, p->spare_bytes);
        stage_padded(p, recs, 3, 2 * N);
        if (threads == 1) {
            /* One arena went round: it holds one record's worth, and decodes the next ones. */
            assert_int_equal(p->nspares, 1);
            assert_true(kept > PAD && kept < 4 * PAD);
            ces_arena_t *spare = p->spares[0];
            take_staged(p);
            assert_int_equal(p->nspares, 1);
            assert_ptr_equal(p->spares[0], spare);
            assert_int_equal(p->spare_bytes, ces_arena_footprint(spare));
        } else {
            /* Each arena keeps about two records' worth: not all of them fit. The next records
             * took the spares when staged, and their bytes left the count. */
            assert_true(p->nspares > 0 && p->nspares < N);
            assert_true(kept > SPARE_BYTES / 2);
            size_t taken = 0;
            for (size_t i = 0; i < 3; i++)
                taken += ces_arena_footprint(p->stages[p->fill_index].items[i].arena);
            assert_int_equal(p->spare_bytes, kept - taken);
            take_staged(p);
            assert_true(p->spare_bytes <= SPARE_BYTES);
        }
        ces_pipeline_destroy(p);
    }
}

/* A record's item holds its own copy of the feed's bytes (they go back when it is taken in). */
static void assert_raw_copied(const ces_item_t *item, const char *rec, size_t len) {
    assert_int_equal(item->raw_len, len);
    assert_ptr_not_equal(item->raw, rec);
    assert_memory_equal(item->raw, rec, len);
}

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
        assert_true(ces_position_compare(&a->event.position, &b->event.position) == 0);
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
        .store_offsets = true,
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

/* What a flush does to the batch being built, without PostgreSQL: it is sent at now and commits. */
static void commit_batch(ces_pipeline_t *p, int64_t now) {
    ces_release_sent(p, now);
    ces_order_committed(p->order, &p->batch);
    ces_batch_clear(&p->batch);
}

static ces_pipeline_t *new_adaptive_pipeline(bool adaptive) {
    ces_pipeline_options_t o = options_with(0, CES_ORDER_BY_TRANSACTION, 1);
    o.reorder_window_max_ms = 5000;
    o.reorder_window_adaptive = adaptive;
    return new_pipeline_from(&o);
}

/* Partition 1 delivers one event (transaction block1, sequence seq1) and partition 0 one (block0,
 * seq0), and both go quiet: after the window both are released into the batch. */
static void release_one_each(ces_pipeline_t *p, unsigned block1, unsigned seq1, unsigned block0,
                             unsigned seq0) {
    feed(p, 1, 0, block1, seq1, 1, 0);
    feed(p, 0, 0, block0, seq0, 2, 0);
    ces_release_partition_eof(p, "ces", 0, 1);
    ces_release_partition_eof(p, "ces", 1, 1);
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
}

/* Partition 1 delivered transaction 5, partition 0 transaction 10's first event. */
static void release_5_and_10(ces_pipeline_t *p) { release_one_each(p, 5, 1, 10, 1); }

static int64_t window_now(const ces_pipeline_t *p) {
    ces_pipeline_stats_t st;
    ces_pipeline_get_stats(p, &st);
    return st.reorder_window_ms;
}

/*
 * Transaction 10 has an event on each partition; partition 1's comes 300 ms after the transaction
 * went to PostgreSQL without it. That event is late (the transaction was torn), is applied, and
 * the window grows to cover it; a second late event of the same transaction is late but does not
 * tear it again; a resend of an applied position is a duplicate, not late.
 */
static void late_event_tears_its_transaction_once(void **state) {
    (void)state;
    ces_pipeline_t *p = new_adaptive_pipeline(true);
    release_5_and_10(p);
    for (size_t i = 0; i < 2; i++)
        assert_false(ces_pipeline_batch_item(p, i)->late);
    commit_batch(p, WINDOW);
    assert_int_equal(window_now(p), WINDOW);

    /* 300 ms after: transaction 10's event on partition 1. */
    feed(p, 1, 1, 10, 2, 3, WINDOW + 300);
    assert_int_equal(window_now(p), WINDOW + 300 + (WINDOW + 300) / 4); /* 625 */
    ces_release_partition_eof(p, "ces", 1, 2);
    tick(p, WINDOW + 300 + 625);
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    const ces_item_t *item = ces_pipeline_batch_item(p, 0);
    assert_int_equal(item->event.position.sequence, 2);
    assert_true(item->late);
    assert_true(item->torn);
    assert_int_equal(item->source.partition, 1);
    commit_batch(p, WINDOW + 300 + 625);

    /* Another late event of transaction 10, 1,800 ms after it went: late, but the transaction was
     * torn already. The window grows to cover this lateness too (200 + 1800, and a quarter). */
    feed(p, 1, 2, 10, 3, 4, 2000);
    assert_int_equal(window_now(p), 2500);
    ces_release_partition_eof(p, "ces", 1, 3);
    tick(p, 2000 + 2500);
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    assert_true(ces_pipeline_batch_item(p, 0)->late);
    assert_false(ces_pipeline_batch_item(p, 0)->torn);
    commit_batch(p, 4500);

    /* A resend of an applied position: a duplicate, never late. */
    ces_pipeline_stats_t before;
    ces_pipeline_get_stats(p, &before);
    feed(p, 0, 1, 10, 1, 2, 4500);
    tick(p, 8000);
    assert_int_equal(ces_pipeline_batch_events(p), 0);
    ces_pipeline_stats_t after;
    ces_pipeline_get_stats(p, &after);
    assert_int_equal(after.duplicates, before.duplicates + 1);
    /* Events of a newer transaction are on time. */
    feed(p, 0, 2, 11, 1, 5, 8000);
    feed(p, 1, 3, 11, 2, 6, 8000);
    ces_release_partition_eof(p, "ces", 0, 3);
    ces_release_partition_eof(p, "ces", 1, 4);
    tick(p, 8000 + 2500);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    assert_false(ces_pipeline_batch_item(p, 0)->late);
    assert_false(ces_pipeline_batch_item(p, 1)->late);
    commit_batch(p, 10500);
    /* A minute without late events, then the window shrinks back step by step. */
    tick(p, 2000 + CES_WINDOW_QUIET_MS);
    assert_int_equal(window_now(p), WINDOW + (2500 - WINDOW) / 2);
    for (int64_t t = 2000 + CES_WINDOW_QUIET_MS; window_now(p) > WINDOW && t < 1000000;
         t += CES_WINDOW_SHRINK_STEP_MS)
        tick(p, t);
    assert_int_equal(window_now(p), WINDOW);
    ces_pipeline_destroy(p);
}

/*
 * Transaction 10 is released into the batch being built; partition 1's event of it comes before
 * that batch goes to PostgreSQL. It cannot join the batch (the transaction was released), so when
 * the batch goes first the transaction is torn, and counted so, though the event was not late when
 * it came. The window grows at once, and once only for the episode. Had the batch not gone, the
 * event joins it: nothing torn.
 */
static void event_after_release_tears_when_the_batch_goes_first(void **state) {
    (void)state;
    ces_pipeline_t *p = new_adaptive_pipeline(true);
    release_5_and_10(p); /* not sent yet */
    feed(p, 1, 1, 10, 2, 3, WINDOW + 1);
    feed(p, 1, 2, 10, 3, 4, WINDOW + 2);
    assert_int_equal(ces_pipeline_batch_events(p), 2); /* held, not in the batch */
    assert_int_equal(window_now(p), WINDOW + WINDOW / 4); /* grown once, by its margin */
    commit_batch(p, WINDOW + 3);
    ces_release_partition_eof(p, "ces", 1, 3);
    tick(p, 3 * WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    assert_true(ces_pipeline_batch_item(p, 0)->late);
    assert_true(ces_pipeline_batch_item(p, 0)->torn);
    assert_true(ces_pipeline_batch_item(p, 1)->late);
    assert_false(ces_pipeline_batch_item(p, 1)->torn); /* torn once */
    commit_batch(p, 3 * WINDOW);

    /* Transaction 20 released; its second event comes before the batch goes, and partition 1 then
     * passes 20: the event is released into the same batch, on time. */
    feed(p, 0, 1, 20, 1, 5, 4 * WINDOW);
    ces_release_partition_eof(p, "ces", 0, 2);
    tick(p, 6 * WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    feed(p, 1, 3, 20, 2, 6, 6 * WINDOW + 1);
    feed(p, 1, 4, 30, 1, 7, 6 * WINDOW + 1);
    tick(p, 6 * WINDOW + 2);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    for (size_t i = 0; i < 2; i++)
        assert_false(ces_pipeline_batch_item(p, i)->late);
    ces_pipeline_destroy(p);
}

/* A partition assigned after transactions went to PostgreSQL (a rebalance) brings its events of
 * them now: they were its previous owner's, not late events of ours, and the window stays. */
static void newly_assigned_partition_is_not_late(void **state) {
    (void)state;
    ces_pipeline_t *p = new_adaptive_pipeline(true);
    release_one_each(p, 10, 2, 10, 1); /* transaction 10, one event on each partition */
    commit_batch(p, WINDOW);
    int32_t more[1] = {2};
    int64_t offsets[1];
    assert_int_equal(ces_pipeline_on_assigned(p, "ces", more, 1, offsets), 0);
    feed(p, 2, 0, 5, 1, 3, WINDOW + 10);  /* older than what was sent */
    feed(p, 2, 1, 10, 3, 4, WINDOW + 10); /* of the transaction sent */
    ces_release_partition_eof(p, "ces", 2, 2);
    tick(p, 3 * WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    assert_false(ces_pipeline_batch_item(p, 0)->late);
    assert_false(ces_pipeline_batch_item(p, 1)->late);
    assert_int_equal(window_now(p), WINDOW);
    ces_pipeline_destroy(p);
}

/* With apply.reorder_window_adaptive = false, late events are flagged and the window stays. */
static void fixed_window_flags_late_events(void **state) {
    (void)state;
    ces_pipeline_t *p = new_adaptive_pipeline(false);
    release_5_and_10(p);
    commit_batch(p, WINDOW);
    feed(p, 1, 1, 10, 2, 3, WINDOW + 400);
    ces_release_partition_eof(p, "ces", 1, 2);
    tick(p, 2 * WINDOW + 400);
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    assert_true(ces_pipeline_batch_item(p, 0)->late);
    assert_true(ces_pipeline_batch_item(p, 0)->torn);
    assert_int_equal(window_now(p), WINDOW);
    ces_pipeline_destroy(p);
}

/* A partition that delivers a commit older than one it delivered before (no commit order: the None
 * partition scheme) tears transactions that no window would hold: the window does not grow. */
static void out_of_order_partition_does_not_grow_the_window(void **state) {
    (void)state;
    ces_pipeline_t *p = new_adaptive_pipeline(true);
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 1, 0, 20, 1, 2, 0); /* partition 1 passed 10 */
    ces_release_partition_eof(p, "ces", 0, 1);
    ces_release_partition_eof(p, "ces", 1, 1);
    tick(p, WINDOW);
    assert_int_equal(ces_pipeline_batch_events(p), 2);
    commit_batch(p, WINDOW);
    feed(p, 1, 1, 10, 2, 3, WINDOW + 300); /* an event of 10 after one of 20 */
    assert_int_equal(window_now(p), WINDOW);
    tick(p, 2 * WINDOW + 300);
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    assert_true(ces_pipeline_batch_item(p, 0)->torn);
    ces_pipeline_destroy(p);
}

/* Revoking partition 1 drops only what it holds: transaction 10 keeps its event of partition 0,
 * which goes once partition 0 allows it (partition 1 is not ours to wait for any more), and
 * partition 0 is not sent back anywhere. */
static void revocation_drops_only_the_revoked_partitions_work(void **state) {
    (void)state;
    ces_pipeline_options_t o = {
        .batch_max_events = 1000,
        .batch_max_ms = 100,
        .store_offsets = false, /* no PostgreSQL here: nothing to commit at the revocation */
        .reasm = {1 << 20, 100, 5000},
        .ordering = CES_ORDER_BY_TRANSACTION,
        .reorder_window_ms = WINDOW,
        .dedup_window = 100,
        .decode_threads = 1,
    };
    ces_pipeline_t *p = ces_pipeline_new(&o, decoder, NULL);
    assert_non_null(p);
    int32_t parts[2] = {0, 1};
    int64_t offsets[2];
    assert_int_equal(ces_pipeline_on_assigned(p, "ces", parts, 2, offsets), 0);
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 1, 0, 10, 2, 2, 0);
    feed(p, 0, 1, 30, 1, 4, 0);
    tick(p, 0);
    assert_int_equal(ces_pipeline_batch_events(p), 0); /* partition 1 may still add to 10 */
    ces_pipeline_stats_t st;
    ces_pipeline_get_stats(p, &st);
    assert_int_equal(st.pending_events, 3);
    int32_t revoked[1] = {1};
    assert_int_equal(ces_pipeline_on_revoked(p, "ces", revoked, 1), 0);
    ces_pipeline_get_stats(p, &st);
    assert_int_equal(st.pending_events, 2); /* partition 0's events of 10 and 30 */
    assert_int_equal(st.pending_transactions, 2);
    tick(p, 0);
    /* 10 goes (partition 0 passed it); 30 waits for partition 0 to pass it or be quiet. */
    assert_int_equal(ces_pipeline_batch_events(p), 1);
    assert_int_equal(ces_pipeline_batch_item(p, 0)->source.partition, 0);
    assert_int_equal(seq_at(p, 0), 1);
    ces_pipeline_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(late_event_tears_its_transaction_once),
        cmocka_unit_test(event_after_release_tears_when_the_batch_goes_first),
        cmocka_unit_test(revocation_drops_only_the_revoked_partitions_work),
        cmocka_unit_test(fixed_window_flags_late_events),
        cmocka_unit_test(newly_assigned_partition_is_not_late),
        cmocka_unit_test(out_of_order_partition_does_not_grow_the_window),
        cmocka_unit_test(interleaved_across_partitions),
        cmocka_unit_test(lagging_partition_holds_everything),
        cmocka_unit_test(duplicates_and_quiet_partition),
        cmocka_unit_test(group_that_never_completes),
        cmocka_unit_test(open_batch_settles_after_5_ms),
        cmocka_unit_test(batch_full_by_bytes),
        cmocka_unit_test(last_of_two_zero_based_segments),
        cmocka_unit_test(staged_records_decode_alike),
        cmocka_unit_test(spare_arenas_stay_bounded),
        cmocka_unit_test(source_gap_found_in_a_rebalance_ends_as_a_gap),
        cmocka_unit_test(stage_room_follows_the_batch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
