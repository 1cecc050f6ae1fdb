/* Joining segments: any order, duplicates, both index bases, legacy, the bounds (memory counted as
 * the segments' arenas stand, open groups, logicalid length), and many groups at once. */
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
    /* Sized for its data, as intake holds a segment: what it costs is then about its data. */
    s.arena = ces_arena_new_whole(strlen(data) + 1);
    assert_non_null(s.arena);
    s.data = ces_arena_strndup(s.arena, data, strlen(data));
    s.data_len = strlen(data);
    s.raw = s.data;
    s.raw_len = s.data_len;
    return s;
}

static ces_reasm_t *new_reasm(size_t max_bytes, size_t max_segments, int64_t timeout_ms) {
    ces_reasm_limits_t l = {max_bytes, max_segments, timeout_ms, 0, 0};
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
    ces_segment_t c = seg(2, 10, 2, false, "CC"), a = seg(0, 5, 0, false, "AA");
    size_t held = ces_reasm_segment_bytes(&c) + ces_reasm_segment_bytes(&a);
    assert_int_equal(add(r, "L", c, 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "L", a, 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "L", seg(2, 11, 2, false, "CC"), 0, &g), CES_REASM_HELD); /* dup */
    /* The duplicate was freed, not held: the two segments and the group's own few bytes. */
    assert_true(ces_reasm_pending_bytes(r) >= held);
    assert_true(ces_reasm_pending_bytes(r) < held + 512);
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
    ces_segment_t probe = seg(0, 0, 0, false, "a");
    size_t one = ces_reasm_segment_bytes(&probe); /* a one-byte segment as held */
    ces_arena_destroy(probe.arena);
    ces_reasm_t *r = new_reasm(4 * one, 3, 1000);
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
    assert_int_equal(ces_reasm_pending_bytes(r), 0);
    /* Too many bytes held. */
    char big[4096];
    memset(big, '7', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_true(sizeof(big) > 4 * one);
    assert_int_equal(add(r, "B", seg(0, 5, 0, false, "123456"), 0, &g), CES_REASM_HELD);
    s = seg(0, 6, 1, false, big);
    assert_int_equal(ces_reasm_add(r, "B", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_non_null(strstr(reason, "max_bytes"));
    assert_int_equal(g->count, 2);
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

/* A segment whose data is one byte but whose envelope's other attributes are large (its arena
 * holds them) costs what its arena holds: it counts toward max_bytes as such. */
static void envelope_cost_counts(void **state) {
    (void)state;
    ces_reasm_t *r = new_reasm(1 << 20, 100, 1000);
    ces_reasm_group_t *g = NULL;
    char reason[256];
    ces_segment_t s = seg(0, 1, 0, false, "{");
    assert_non_null(ces_arena_alloc(s.arena, 2 << 20)); /* a 2 MB attribute besides data */
    assert_true(ces_reasm_segment_bytes(&s) >= (2u << 20));
    assert_int_equal(ces_reasm_add(r, "E", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_non_null(strstr(reason, "max_bytes"));
    assert_int_equal(g->count, 1);
    assert_string_equal(g->logicalid, "E");
    ces_reasm_group_free(g);
    assert_int_equal(ces_reasm_pending_groups(r), 0);
    assert_int_equal(ces_reasm_pending_bytes(r), 0);
    /* Within the bound, it is held and counted whole. */
    s = seg(0, 2, 0, false, "{");
    assert_non_null(ces_arena_alloc(s.arena, 512 << 10));
    size_t cost = ces_reasm_segment_bytes(&s);
    assert_int_equal(ces_reasm_add(r, "F", &s, 0, &g, reason, sizeof(reason)), CES_REASM_HELD);
    assert_true(ces_reasm_pending_bytes(r) >= cost);
    assert_true(cost > (512u << 10));
    /* A second one like it breaks the bound: its group is given up, the first one stays. */
    s = seg(0, 3, 0, false, "{");
    assert_non_null(ces_arena_alloc(s.arena, 600 << 10));
    assert_int_equal(ces_reasm_add(r, "G", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_string_equal(g->logicalid, "G");
    ces_reasm_group_free(g);
    assert_int_equal(ces_reasm_pending_groups(r), 1);
    assert_int_equal(add(r, "F", seg(0, 4, 1, true, "}"), 0, &g), CES_REASM_COMPLETE);
    assert_memory_equal(g->data, "{}", 2);
    ces_reasm_group_free(g);
    assert_int_equal(ces_reasm_pending_bytes(r), 0);
    ces_reasm_destroy(r);
}

/* Open groups and logicalid length are capped: a segment over a cap comes back alone, and what is
 * held already is untouched. */
static void caps_on_groups_and_logicalid(void **state) {
    (void)state;
    ces_reasm_limits_t l = {1 << 20, 100, 1000, 3, 16};
    ces_reasm_t *r = ces_reasm_new(&l);
    assert_non_null(r);
    ces_reasm_group_t *g = NULL;
    char reason[256];
    /* 16 bytes is the longest accepted; 17 is refused, and no group is made for it. */
    assert_int_equal(add(r, "0123456789abcdef", seg(0, 1, 0, false, "a"), 0, &g), CES_REASM_HELD);
    ces_segment_t s = seg(0, 2, 0, false, "a");
    assert_int_equal(ces_reasm_add(r, "0123456789abcdefX", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_non_null(strstr(reason, "logicalid is longer than 16 bytes"));
    assert_int_equal(g->count, 1);
    assert_null(g->logicalid);
    assert_int_equal(g->segments[0].source.offset, 2);
    ces_reasm_group_free(g);
    assert_int_equal(ces_reasm_pending_groups(r), 1);
    /* Three groups open: a fourth is refused, while the open ones still take segments. */
    assert_int_equal(add(r, "B", seg(0, 3, 0, false, "b"), 0, &g), CES_REASM_HELD);
    assert_int_equal(add(r, "C", seg(0, 4, 0, false, "c"), 0, &g), CES_REASM_HELD);
    s = seg(0, 5, 0, false, "d");
    assert_int_equal(ces_reasm_add(r, "D", &s, 0, &g, reason, sizeof(reason)),
                     CES_REASM_GIVEN_UP);
    assert_non_null(strstr(reason, "3 incomplete segment groups"));
    assert_string_equal(g->logicalid, "D");
    assert_int_equal(g->count, 1);
    ces_reasm_group_free(g);
    assert_int_equal(ces_reasm_pending_groups(r), 3);
    assert_int_equal(add(r, "B", seg(0, 6, 1, true, "B"), 0, &g), CES_REASM_COMPLETE);
    assert_memory_equal(g->data, "bB", 2);
    ces_reasm_group_free(g);
    /* Room again. */
    assert_int_equal(add(r, "D", seg(0, 7, 0, false, "d"), 0, &g), CES_REASM_HELD);
    assert_int_equal(ces_reasm_pending_groups(r), 3);
    ces_reasm_destroy(r);
    /* Limits of 0 are the defaults. */
    r = new_reasm(1 << 20, 100, 1000);
    char id[CES_REASM_DEFAULT_MAX_LOGICALID + 2];
    memset(id, 'L', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    s = seg(0, 8, 0, false, "e");
    assert_int_equal(ces_reasm_add(r, id, &s, 0, &g, reason, sizeof(reason)), CES_REASM_GIVEN_UP);
    assert_null(g->logicalid);
    ces_reasm_group_free(g);
    id[CES_REASM_DEFAULT_MAX_LOGICALID] = '\0';
    assert_int_equal(add(r, id, seg(0, 9, 0, false, "e"), 0, &g), CES_REASM_HELD);
    ces_reasm_destroy(r);
}

/* Many groups open at once: each segment finds its own group, groups complete in any order, and
 * expire oldest first. */
static void many_open_groups(void **state) {
    (void)state;
    enum { N = 20000 };
    ces_reasm_t *r = new_reasm(SIZE_MAX, 100, 1000000);
    ces_reasm_group_t *g = NULL;
    char id[32], data[32];
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof(id), "group-%d", i);
        snprintf(data, sizeof(data), "<%d|", i);
        assert_int_equal(add(r, id, seg(i % 4, i, 0, false, data), i, &g), CES_REASM_HELD);
    }
    assert_int_equal(ces_reasm_pending_groups(r), N);
    /* Every odd group completes, last first. */
    for (int i = N - 1; i >= 0; i--) {
        if (i % 2 == 0)
            continue;
        snprintf(id, sizeof(id), "group-%d", i);
        snprintf(data, sizeof(data), "%d>", i);
        assert_int_equal(add(r, id, seg(0, N + i, 1, true, data), N, &g), CES_REASM_COMPLETE);
        char want[64];
        int n = snprintf(want, sizeof(want), "<%d|%d>", i, i);
        assert_int_equal(g->data_len, n);
        assert_memory_equal(g->data, want, (size_t)n);
        assert_string_equal(g->logicalid, id);
        ces_reasm_group_free(g);
    }
    assert_int_equal(ces_reasm_pending_groups(r), N / 2);
    /* The even ones expire in the order they began: group-0 (first_ms 0) first. */
    assert_null(ces_reasm_expire(r, 999999));
    for (int i = 0; i < N; i += 2) {
        g = ces_reasm_expire(r, 1000000 + i);
        assert_non_null(g);
        snprintf(id, sizeof(id), "group-%d", i);
        assert_string_equal(g->logicalid, id);
        ces_reasm_group_free(g);
        if (i + 2 < N)
            assert_null(ces_reasm_expire(r, 1000000 + i)); /* the next began later */
    }
    assert_int_equal(ces_reasm_pending_groups(r), 0);
    assert_int_equal(ces_reasm_pending_bytes(r), 0);
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
    ces_segment_t cc = seg(0, 9, 0, false, "CC");
    size_t kept = ces_reasm_segment_bytes(&cc);
    assert_int_equal(add(r, "B", cc, 0, &g), CES_REASM_HELD);
    assert_int_equal(ces_reasm_drop_sources(r, partition_one, NULL), 1);
    assert_int_equal(ces_reasm_pending_groups(r), 1);
    /* Group B alone: its segment and its own few bytes. */
    assert_true(ces_reasm_pending_bytes(r) >= kept);
    assert_true(ces_reasm_pending_bytes(r) < kept + 512);
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
        cmocka_unit_test(envelope_cost_counts),
        cmocka_unit_test(caps_on_groups_and_logicalid),
        cmocka_unit_test(many_open_groups),
        cmocka_unit_test(late_duplicate_of_a_completed_group),
        cmocka_unit_test(drops_groups_of_revoked_partitions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
