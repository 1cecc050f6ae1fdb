/*
 * The reorder window's rule (window.h), on a fake clock: it grows to cover the lateness of a late
 * event with a margin, never past its maximum, and after a quiet period shrinks back to its start,
 * halving its excess at every step.
 */
#include "test_util.h"

#include "order/window.h"

static void grows_to_cover_lateness_with_a_margin(void **state) {
    (void)state;
    ces_window_t w;
    ces_window_init(&w, 200, 5000, true);
    assert_int_equal(ces_window_ms(&w), 200);
    /* 300 ms late: 200 + 300 would have held it; a quarter more for margin. */
    assert_true(ces_window_late(&w, 300, 200, 1000));
    assert_int_equal(ces_window_ms(&w), 625);
    /* More late events of the same episode (released under the old window, as late): no change.
     * Less late than the window now covers: no change either. */
    assert_false(ces_window_late(&w, 300, 200, 1500));
    assert_false(ces_window_late(&w, 100, 200, 2000));
    /* ... or a little later than the first (650 asked for): the window moves by 50 ms or more. */
    assert_false(ces_window_late(&w, 320, 200, 2100));
    assert_int_equal(ces_window_ms(&w), 625);
    /* Released under the grown window and still late: it grows again. */
    assert_true(ces_window_late(&w, 100, 625, 2500));
    assert_int_equal(ces_window_ms(&w), 906);
    /* A small lateness on a small window still gets the minimum margin of 50 ms. */
    ces_window_init(&w, 10, 5000, true);
    assert_true(ces_window_late(&w, 20, 10, 1000));
    assert_int_equal(ces_window_ms(&w), 80);
}

static void never_past_the_maximum(void **state) {
    (void)state;
    ces_window_t w;
    ces_window_init(&w, 200, 1000, true);
    assert_true(ces_window_late(&w, 5000, 200, 1000));
    assert_int_equal(ces_window_ms(&w), 1000);
    assert_false(ces_window_late(&w, 5000, 1000, 1100));
    assert_int_equal(ces_window_ms(&w), 1000);
    /* A maximum below the start is the start. */
    ces_window_init(&w, 300, 100, true);
    assert_false(ces_window_late(&w, 1000, 300, 1000));
    assert_int_equal(ces_window_ms(&w), 300);
}

static void not_adaptive_stays_put(void **state) {
    (void)state;
    ces_window_t w;
    ces_window_init(&w, 200, 5000, false);
    assert_false(ces_window_late(&w, 1000, 200, 1000));
    assert_int_equal(ces_window_ms(&w), 200);
    assert_false(ces_window_tick(&w, 1000 + 10 * CES_WINDOW_QUIET_MS));
    assert_int_equal(ces_window_ms(&w), 200);
}

static void shrinks_back_after_a_quiet_period(void **state) {
    (void)state;
    ces_window_t w;
    ces_window_init(&w, 200, 5000, true);
    assert_true(ces_window_late(&w, 3000, 200, 1000)); /* 200 + 3000 + 800 = 4000 */
    assert_int_equal(ces_window_ms(&w), 4000);
    /* Not before the quiet period has passed. */
    assert_false(ces_window_tick(&w, 1000 + CES_WINDOW_QUIET_MS - 1));
    int64_t t = 1000 + CES_WINDOW_QUIET_MS;
    assert_true(ces_window_tick(&w, t));
    assert_int_equal(ces_window_ms(&w), 200 + 1900); /* the excess halves */
    assert_false(ces_window_tick(&w, t + CES_WINDOW_SHRINK_STEP_MS - 1));
    t += CES_WINDOW_SHRINK_STEP_MS;
    assert_true(ces_window_tick(&w, t));
    assert_int_equal(ces_window_ms(&w), 200 + 950);
    /* A late event in between starts the quiet period again. */
    assert_false(ces_window_late(&w, 10, 200, t + 1));
    t += CES_WINDOW_SHRINK_STEP_MS;
    assert_false(ces_window_tick(&w, t));
    assert_int_equal(ces_window_ms(&w), 200 + 950);
    t = t + CES_WINDOW_QUIET_MS;
    int steps = 0;
    while (ces_window_ms(&w) > 200 && steps < 100) {
        assert_true(ces_window_tick(&w, t));
        t += CES_WINDOW_SHRINK_STEP_MS;
        steps++;
    }
    assert_int_equal(ces_window_ms(&w), 200); /* back at the start, in a few steps */
    assert_true(steps <= 8);
    assert_false(ces_window_tick(&w, t + CES_WINDOW_QUIET_MS));
}

static void inherits_a_stored_window_clamped(void **state) {
    (void)state;
    ces_window_t w;
    ces_window_init(&w, 200, 5000, true);
    assert_true(ces_window_inherit(&w, 900, 1000));
    assert_int_equal(ces_window_ms(&w), 900);
    /* It holds for a quiet period, as a late event's window would. */
    assert_false(ces_window_tick(&w, 1000 + CES_WINDOW_QUIET_MS - 1));
    assert_true(ces_window_tick(&w, 1000 + CES_WINDOW_QUIET_MS));
    assert_int_equal(ces_window_ms(&w), 200 + 350);
    /* Clamped to [start, max]: a configuration changed since it was stored. */
    assert_true(ces_window_inherit(&w, 9000, 2000));
    assert_int_equal(ces_window_ms(&w), 5000);
    assert_true(ces_window_inherit(&w, 50, 3000));
    assert_int_equal(ces_window_ms(&w), 200);
    assert_false(ces_window_inherit(&w, 100, 4000));
    /* Not adaptive: the configured window stays. */
    ces_window_init(&w, 200, 5000, false);
    assert_false(ces_window_inherit(&w, 900, 1000));
    assert_int_equal(ces_window_ms(&w), 200);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grows_to_cover_lateness_with_a_margin),
        cmocka_unit_test(never_past_the_maximum),
        cmocka_unit_test(not_adaptive_stays_put),
        cmocka_unit_test(shrinks_back_after_a_quiet_period),
        cmocka_unit_test(inherits_a_stored_window_clamped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
