/* Joining segments: any order, duplicates, both index bases, legacy, and the bounds. */
#include "test_util.h"

#include "order/reasm.h"

static ces_segment_t seg(int32_t partition, int64_t offset, int64_t index, bool final,
                         const char *data) {
    ces_segment_t s = {0};
    s.source.topic = "ces";
    s.source.partition = partition;
    s.source.offset = offset;
    s.index = index;
    s.final_segment = final;
    s.split_total = -1;
    s.arena = ces_arena_new();
    s.data = ces_arena_strndup(s.arena, data, strlen(data));
    s.data_len = strlen(data);
    s.raw = s.data;
    s.raw_len = s.data_len;
    return s;
}

static ces_reasm_t *new_reasm(size_t max_bytes, size_t max_segments, int64_t timeout_ms) {
    ces_reasm_limits_t l = {max_bytes, max_segments, timeout_ms};
    ces_reasm_t *r = ces_reasm_new(&l);
    assert_non_null(r);
    return r;
}

static ces_reasm_status_t add(ces_reasm_t *r, const char *id, ces_segment_t s, int64_t now,
                              ces_reasm_group_t **g) {
    char reason[256];
    return ces_reasm_add(r, id, &s, now, g, reason, sizeof(reason));
}

static void shuffled_with_duplicates_zero_based(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(1 << 20, 100, 1000);
    ces_reasm_group_t *g = NULL;
    assert_int_equal(add(r, "L", seg(2, 10, 2, false, "CC"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "L", seg(0, 5, 0, false, "AA"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "L", seg(2, 11, 2, false, "CC"), 0, &g), CES_REASM_HELD); /* dup */
    assert_int_equal(ces_reasm_pending_bytes(r), 4); /* the duplicate was freed, not held */
    int64_t off;
    assert_true(ces_reasm_min_offset(r, "ces", 2, &off));
    assert_int_equal(off, 10);
    assert_true(ces_reasm_min_offset(r, "ces", 0, &off));
    assert_int_equal(off, 5);
    assert_false(ces_reasm_min_offset(r, "ces", 1, &off));
    assert_int_equal(add(r, "L", seg(1, 7, 3, true, "DD"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "L", seg(3, 1, 1, false, "BB"), 0, &g), CES_REASM_COMPLETE);
    assert_non_null(g);
    assert_false(g->candidate_base1);
    assert_int_equal(g->data_len, 8);
    assert_memory_equal(g->data, "AABBCCDD", 8);
    assert_int_equal(g->count, 4);
    assert_int_equal(ces_reasm_pending_groups(r), 0);
    assert_int_equal(ces_reasm_pending_bytes(r), 0);
    assert_false(ces_reasm_min_offset(r, "ces", 2, &off));
    ces_reasm_group_free(g);
    ces_reasm_destroy(r);
}

static void one_based_candidate_and_put_back(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(1 << 20, 100, 1000);
    ces_reasm_group_t *g = NULL;
    /* 1-based: 1, 2(final) is complete as a candidate. */
    assert_int_equal(add(r, "M", seg(0, 1, 2, true, "YY"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "M", seg(0, 2, 1, false, "XX"), 0, &g), CES_REASM_COMPLETE);
    assert_true(g->candidate_base1);
    assert_memory_equal(g->data, "XXYY", 4);
    /* Suppose it did not decode: the base was 0, segment 0 is still to come. */
    assert_int_equal(ces_reasm_put_back(r, g), CES_REASM_HELD);
    assert_int_equal(ces_reasm_pending_groups(r), 1);
    assert_int_equal(add(r, "M", seg(1, 9, 0, false, "WW"), 0, &g), CES_REASM_COMPLETE);
    assert_false(g->candidate_base1);
    assert_memory_equal(g->data, "WWXXYY", 6);
    ces_reasm_group_free(g);
    ces_reasm_destroy(r);
}

static void legacy_split_total(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(1 << 20, 100, 1000);
    ces_reasm_group_t *g = NULL;
    ces_segment_t s = seg(0, 1, 2, true, "c");
    s.split_total = 3;
    assert_int_equal(add(r, "N", s, 0, &g), CES_REASM_HELD);
    s = seg(0, 2, 0, false, "a");
    s.split_total = 3;
    assert_int_equal(add(r, "N", s, 0, &g), CES_REASM_HELD);
    s = seg(0, 3, 1, false, "b");
    s.split_total = 3;
    assert_int_equal(add(r, "N", s, 0, &g), CES_REASM_COMPLETE);
    assert_memory_equal(g->data, "abc", 3);
    ces_reasm_group_free(g);
    ces_reasm_destroy(r);
}

static void bounds_and_timeout(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(10, 3, 1000);
    ces_reasm_group_t *g = NULL;
    char reason[256];
    /* Too many segments in one group. */
    assert_int_equal(add(r, "A", seg(0, 1, 0, false, "a"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "A", seg(0, 2, 1, false, "b"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "A", seg(0, 3, 2, false, "c"), 0, &g), CES_REASM_HELD);
    ces_segment_t s = seg(0, 4, 3, false, "d");
    assert_int_equal(ces_reasm_add(r, "A", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_non_null(strstr(reason, "max_segments"));
    assert_int_equal(g->count, 4); /* every segment comes back, for dead letters */
    assert_null(g->data);
    ces_reasm_group_free(g);
    /* Too many bytes held. */
    assert_int_equal(add(r, "B", seg(0, 5, 0, false, "123456"), 0, &g), CES_REASM_HELD);
    s = seg(0, 6, 1, false, "789012");
    assert_int_equal(ces_reasm_add(r, "B", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_non_null(strstr(reason, "max_bytes"));
    ces_reasm_group_free(g);
    /* A group that never completes is handed back after the timeout, not before. */
    assert_int_equal(add(r, "C", seg(1, 7, 0, false, "x"), 100, &g), CES_REASM_HELD);
    assert_null(ces_reasm_expire(r, 1099));
    g = ces_reasm_expire(r, 1100);
    assert_non_null(g);
    assert_string_equal(g->logicalid, "C");
    assert_int_equal(g->count, 1);
    ces_reasm_group_free(g);
    assert_int_equal(ces_reasm_pending_groups(r), 0);
    ces_reasm_destroy(r);
}

static void late_duplicate_of_a_completed_group(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(1 << 20, 100, 1000);
    ces_reasm_group_t *g = NULL;
    assert_int_equal(add(r, "Z", seg(0, 1, 0, false, "a"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "Z", seg(1, 1, 1, true, "b"), 0, &g), CES_REASM_COMPLETE);
    ces_reasm_group_free(g);
    /* Resent after the event was joined: recognised, not a group that never completes. */
    assert_int_equal(add(r, "Z", seg(2, 9, 1, true, "b"), 10, &g), CES_REASM_DUPLICATE);
    assert_int_equal(ces_reasm_pending_groups(r), 0);
    assert_int_equal(ces_reasm_pending_bytes(r), 0);
    /* After going back to stored positions the segments are read again: not duplicates then. */
    ces_reasm_forget_completed(r);
    assert_int_equal(add(r, "Z", seg(0, 1, 0, false, "a"), 20, &g), CES_REASM_HELD);
    ces_reasm_destroy(r);
}

static bool partition_one(void *arg, const ces_source_t *source) {
    (void)arg;
    return source->partition == 1;
}

/* A revocation drops the groups wholly of the revoked partition; a group with segments of a kept
 * partition too makes it drop nothing (-1). */
static void drops_groups_of_revoked_partitions(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(1 << 20, 100, 1000);
    ces_reasm_group_t *g = NULL;
    assert_int_equal(add(r, "A", seg(1, 3, 0, false, "AA"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "A", seg(1, 4, 1, false, "BB"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "B", seg(0, 9, 0, false, "CC"), 0, &g), CES_REASM_HELD);
    assert_int_equal(ces_reasm_drop_sources(r, partition_one, NULL), 1);
    assert_int_equal(ces_reasm_pending_groups(r), 1);
    assert_int_equal(ces_reasm_pending_bytes(r), 2);
    int64_t off;
    assert_false(ces_reasm_min_offset(r, "ces", 1, &off));
    assert_true(ces_reasm_min_offset(r, "ces", 0, &off));
    /* Group B gets a segment from partition 1: it spans both. */
    assert_int_equal(add(r, "B", seg(1, 5, 1, false, "DD"), 0, &g), CES_REASM_HELD);
    assert_int_equal(ces_reasm_drop_sources(r, partition_one, NULL), -1);
    assert_int_equal(ces_reasm_pending_groups(r), 1);
    ces_reasm_destroy(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shuffled_with_duplicates_zero_based),
        cmocka_unit_test(one_based_candidate_and_put_back),
        cmocka_unit_test(legacy_split_total),
        cmocka_unit_test(bounds_and_timeout),
        cmocka_unit_test(late_duplicate_of_a_completed_group),
        cmocka_unit_test(drops_groups_of_revoked_partitions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
