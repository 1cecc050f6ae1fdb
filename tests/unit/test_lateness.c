/*
 * lateness: late events and torn transactions in transaction mode, and how the reorder window
 * adapts to them.
 */
#include "test_pipeline.h"

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
    assert_int_equal(item->event.version.sequence, 2);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(late_event_tears_its_transaction_once),
        cmocka_unit_test(event_after_release_tears_when_the_batch_goes_first),
        cmocka_unit_test(fixed_window_flags_late_events),
        cmocka_unit_test(newly_assigned_partition_is_not_late),
        cmocka_unit_test(out_of_order_partition_does_not_grow_the_window),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
