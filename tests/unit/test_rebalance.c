/*
 * rebalance: a revocation drops only the revoked partitions' work; a source gap found while taking
 * in the records staged before a rebalance ends the loop as a gap.
 */
#include "test_pipeline.h"

#include <signal.h>

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
    ces_partition_t *part = ces_partitions_get(p->partitions, "ces", 0, false);
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

/* Revoking partition 1 drops only what it holds: transaction 10 keeps its event of partition 0,
 * which goes once partition 0 allows it (partition 1 is not ours to wait for any more), and
 * partition 0 is not sent back anywhere. */
static void revocation_drops_only_the_revoked_partitions_work(void **state) {
    (void)state;
    ces_pipeline_options_t o = {
        .batch_max_events = 1000,
        .batch_max_ms = 100,
        .store_positions = false, /* no PostgreSQL here: nothing to commit at the revocation */
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
        cmocka_unit_test(revocation_drops_only_the_revoked_partitions_work),
        cmocka_unit_test(source_gap_found_in_a_rebalance_ends_as_a_gap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
