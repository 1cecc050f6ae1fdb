/*
 * release: what the next batch would hold after adversarial arrival sequences in transaction mode
 * (interleaved transactions across partitions, a lagging partition, a quiet one, duplicates), and
 * whole transactions only within the batch's limits.
 */
#include "test_pipeline.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(interleaved_across_partitions),
        cmocka_unit_test(lagging_partition_holds_everything),
        cmocka_unit_test(duplicates_and_quiet_partition),
        cmocka_unit_test(batch_full_by_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
