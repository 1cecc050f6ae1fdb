/*
 * loop: when an open batch is applied (it settles, or is due).
 */
#include "test_pipeline.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_batch_settles_after_5_ms),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
