/*
 * positions: the bookkeeping of what each partition may store (positions.h). The rules under test
 * are the delivery guarantees: a stored position never passes a record not yet applied, the update
 * is fenced on what PostgreSQL held, and going back never skips a record read but not committed.
 */
#include "test_util.h"

#include "apply/positions.h"

#define NONE INT64_MAX /* nothing held back */

static void read_records(ces_partition_position_t *pos, int64_t from, int64_t to) {
    for (int64_t o = from; o < to; o++)
        ces_positions_on_read(pos, o);
}

static void fresh_partition_stores_after_what_it_read(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_position_update_t u;
    ces_positions_on_assign(&pos, "t", 3, -1);
    assert_false(ces_positions_to_store(&pos, "t", 3, NONE, &u)); /* nothing read yet */
    assert_int_equal(ces_positions_next_to_apply(&pos), -1);
    read_records(&pos, 100, 110);
    assert_true(ces_positions_to_store(&pos, "t", 3, NONE, &u));
    assert_string_equal(u.topic, "t");
    assert_int_equal(u.partition, 3);
    assert_false(u.has_expected); /* PostgreSQL has no row: the fence is "none" */
    assert_int_equal(u.next, 110);
    assert_int_equal(ces_positions_next_to_apply(&pos), 110);
}

static void held_records_hold_the_position_back(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_position_update_t u;
    ces_positions_on_assign(&pos, "t", 0, 50);
    read_records(&pos, 50, 60);
    /* Offset 53 is a segment (or a held event) not yet applied: 53 is the most that may go. */
    assert_true(ces_positions_to_store(&pos, "t", 0, 53, &u));
    assert_true(u.has_expected);
    assert_int_equal(u.expected, 50);
    assert_int_equal(u.next, 53);
    ces_positions_on_commit(&pos, 53);
    assert_true(pos.dirty); /* 53..59 were read and not stored */
    assert_int_equal(ces_positions_next_to_apply(&pos), 53);
    /* Still held: nothing new to store, and never a position at or before the stored one. */
    assert_false(ces_positions_to_store(&pos, "t", 0, 53, &u));
    assert_false(ces_positions_to_store(&pos, "t", 0, 40, &u));
    assert_true(ces_positions_to_store(&pos, "t", 0, NONE, &u));
    assert_int_equal(u.expected, 53); /* fenced on what was committed last */
    assert_int_equal(u.next, 60);
    ces_positions_on_commit(&pos, 60);
    assert_false(pos.dirty);
    assert_false(ces_positions_to_store(&pos, "t", 0, NONE, &u));
}

static void rewind_goes_back_to_the_stored_position(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_positions_on_assign(&pos, "t", 0, 10);
    read_records(&pos, 10, 30);
    ces_positions_on_commit(&pos, 20);
    read_records(&pos, 30, 35);
    /* Another instance moved the position to 25 meanwhile (the fence refused ours). */
    assert_int_equal(ces_positions_on_rewind(&pos, 25), 25);
    assert_int_equal(pos.stored, 25);
    assert_false(pos.dirty);
    ces_position_update_t u;
    assert_false(ces_positions_to_store(&pos, "t", 0, NONE, &u));
    ces_positions_on_read(&pos, 25);
    assert_true(ces_positions_to_store(&pos, "t", 0, NONE, &u));
    assert_int_equal(u.expected, 25);
    assert_int_equal(u.next, 26);
}

/* Nothing of the assignment was committed and PostgreSQL holds no position: the records read
 * since the assignment are read again, from the first one; a later store cannot pass them. */
static void rewind_without_stored_position_restarts_at_the_first_record_read(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_positions_on_assign(&pos, "t", 1, -1);
    assert_int_equal(ces_positions_on_rewind(&pos, -1), -1); /* nothing read: nothing to redo */
    read_records(&pos, 700, 720);
    assert_int_equal(ces_positions_on_rewind(&pos, -1), 700);
    assert_int_equal(pos.next, 700);
    ces_position_update_t u;
    assert_false(ces_positions_to_store(&pos, "t", 1, NONE, &u));
    read_records(&pos, 700, 705);
    assert_true(ces_positions_to_store(&pos, "t", 1, NONE, &u));
    assert_int_equal(u.next, 705);
    assert_false(u.has_expected);
    /* A second rewind still knows where the assignment's reading began. */
    assert_int_equal(ces_positions_on_rewind(&pos, -1), 700);
}

static void revoke_forgets_everything(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_position_update_t u;
    ces_positions_on_assign(&pos, "t", 2, 5);
    read_records(&pos, 5, 9);
    ces_positions_on_revoke(&pos);
    assert_false(ces_positions_to_store(&pos, "t", 2, NONE, &u));
    assert_int_equal(ces_positions_next_to_apply(&pos), -1);
    assert_int_equal(ces_positions_on_rewind(&pos, 7), -1);
}

/* Where reading resumes after an assignment is checked once, against the stored position. */
static void resume_is_checked_against_the_stored_position(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_source_gap_t gap;
    ces_positions_on_assign(&pos, "t", 0, 100);
    /* The end of the partition at the stored position: nothing read yet, still to check. */
    assert_false(ces_positions_check_resume(&pos, "t", 0, 100, true, &gap));
    assert_false(ces_positions_check_resume(&pos, "t", 0, 100, false, &gap));
    /* Checked: later records are not looked at. */
    assert_false(ces_positions_check_resume(&pos, "t", 0, 5000, false, &gap));

    ces_positions_on_assign(&pos, "t", 0, 100);
    assert_true(ces_positions_check_resume(&pos, "t", 0, 150, false, &gap));
    assert_int_equal(gap.stored, 100);
    assert_int_equal(gap.resumed, 150);
    assert_int_equal(gap.skipped, 50);
    ces_positions_on_assign(&pos, "t", 0, 100);
    assert_true(ces_positions_check_resume(&pos, "t", 0, 7, false, &gap)); /* past the end */
    assert_int_equal(gap.skipped, -1);
    ces_positions_on_assign(&pos, "t", 0, 100);
    assert_true(ces_positions_check_resume(&pos, "t", 0, 120, true, &gap)); /* reset to latest */
    assert_int_equal(gap.skipped, 20);
    /* A first start has nothing to check. */
    ces_positions_on_assign(&pos, "t", 0, -1);
    assert_false(ces_positions_check_resume(&pos, "t", 0, 9999, false, &gap));
}

/* An accepted gap goes with the first batch that stores a position past it, once, and is done
 * when that batch commits; a rewind checks again. */
static void accepted_gap_goes_with_the_position_past_it(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_source_gap_t gap;
    ces_position_update_t u;
    ces_positions_on_assign(&pos, "t", 0, 100);
    assert_true(ces_positions_check_resume(&pos, "t", 0, 150, false, &gap));
    ces_positions_resume_checked(&pos, &gap);
    read_records(&pos, 150, 160);
    assert_true(ces_positions_to_store(&pos, "t", 0, NONE, &u));
    assert_int_equal(u.expected, 100);
    assert_int_equal(u.next, 160);
    const ces_source_gap_t *g = ces_positions_gap_to_store(&pos);
    assert_non_null(g);
    assert_int_equal(g->resumed, 150);
    assert_null(ces_positions_gap_to_store(&pos)); /* in a batch already */
    ces_positions_on_commit(&pos, 160);
    assert_false(pos.gap_pending);
    /* The fence refused a batch and reading goes back: checked again from the stored position. */
    read_records(&pos, 160, 170);
    assert_int_equal(ces_positions_on_rewind(&pos, 160), 160);
    assert_true(ces_positions_check_resume(&pos, "t", 0, 165, false, &gap));
    assert_int_equal(gap.stored, 160);
    /* Judged no gap (the offsets between hold no records): nothing to record. */
    ces_positions_resume_checked(&pos, NULL);
    assert_null(ces_positions_gap_to_store(&pos));
}

/* A stored position past the partition's end (the topic was recreated), accepted: the positions
 * read from the new start are stored (the old one as the fence) and the gap goes with them. */
static void accepted_gap_behind_the_stored_position_is_stored(void **state) {
    (void)state;
    ces_partition_position_t pos;
    ces_source_gap_t gap;
    ces_position_update_t u;
    ces_positions_on_assign(&pos, "t", 0, 100000);
    assert_true(ces_positions_check_resume(&pos, "t", 0, 0, false, &gap));
    ces_positions_resume_checked(&pos, &gap);
    read_records(&pos, 0, 50);
    assert_true(ces_positions_to_store(&pos, "t", 0, NONE, &u));
    assert_int_equal(u.expected, 100000);
    assert_int_equal(u.next, 50);
    const ces_source_gap_t *g = ces_positions_gap_to_store(&pos);
    assert_non_null(g);
    assert_int_equal(g->stored, 100000);
    assert_int_equal(g->resumed, 0);
    ces_positions_on_commit(&pos, 50);
    assert_false(pos.gap_pending);
    read_records(&pos, 50, 60);
    assert_true(ces_positions_to_store(&pos, "t", 0, NONE, &u));
    assert_int_equal(u.expected, 50);
    assert_int_equal(u.next, 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fresh_partition_stores_after_what_it_read),
        cmocka_unit_test(held_records_hold_the_position_back),
        cmocka_unit_test(rewind_goes_back_to_the_stored_position),
        cmocka_unit_test(rewind_without_stored_position_restarts_at_the_first_record_read),
        cmocka_unit_test(revoke_forgets_everything),
        cmocka_unit_test(resume_is_checked_against_the_stored_position),
        cmocka_unit_test(accepted_gap_goes_with_the_position_past_it),
        cmocka_unit_test(accepted_gap_behind_the_stored_position_is_stored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
