#include "test_util.h"

#include "util/arena.h"

/* Fills an arena with n strings of len bytes; each must read back intact. */
static void fill(ces_arena_t *a, size_t n, size_t len) {
    char text[512];
    assert_true(len < sizeof(text));
    for (size_t i = 0; i < n; i++) {
        memset(text, 'a' + (int)(i % 26), len);
        char *s = ces_arena_strndup(a, text, len);
        assert_non_null(s);
        assert_int_equal(strlen(s), len);
        assert_memory_equal(s, text, len);
    }
}

static void reset_keeps_a_single_block(void **state) {
    (void)state;
    ces_arena_t *a = ces_arena_new_sized(4096);
    assert_non_null(a);
    void *first = ces_arena_alloc(a, 100);
    fill(a, 10, 100);
    size_t footprint = ces_arena_footprint(a);
    assert_true(footprint > 4096 && footprint < 8192);
    ces_arena_reset(a);
    /* The same block, from its start. */
    assert_ptr_equal(ces_arena_alloc(a, 100), first);
    assert_int_equal(ces_arena_footprint(a), footprint);
    ces_arena_destroy(a);
}

static void reset_merges_blocks_into_one(void **state) {
    (void)state;
    ces_arena_t *a = ces_arena_new_sized(1024);
    fill(a, 100, 200); /* about 21 KB: many 1 KB blocks */
    size_t grown = ces_arena_footprint(a);
    assert_true(grown > 20000);
    ces_arena_reset(a);
    assert_int_equal(ces_arena_footprint(a), 0);
    /* The same use again takes one block of what the blocks held, and nothing more. */
    fill(a, 100, 200);
    size_t once = ces_arena_footprint(a);
    assert_true(once <= grown);
    ces_arena_reset(a);
    fill(a, 100, 200);
    assert_int_equal(ces_arena_footprint(a), once);
    ces_arena_destroy(a);
}

static void reset_does_not_keep_a_huge_block(void **state) {
    (void)state;
    ces_arena_t *a = ces_arena_new_sized(1024);
    assert_non_null(ces_arena_alloc(a, 1u << 20));
    assert_true(ces_arena_footprint(a) > (1u << 20));
    ces_arena_reset(a);
    assert_int_equal(ces_arena_footprint(a), 0);
    fill(a, 4, 100);
    assert_true(ces_arena_footprint(a) < 4096);
    ces_arena_destroy(a);
    ces_arena_destroy(NULL);
}

/* A whole arena's first block comes with it: what fits takes no other allocation, what does not
 * gets blocks of its own (freed by a reset, which keeps the first), and destroy frees all (the
 * sanitizer build checks that nothing leaks). */
static void whole_arena_keeps_its_block(void **state) {
    (void)state;
    ces_arena_t *a = ces_arena_new_whole(1000);
    assert_non_null(a);
    size_t whole = ces_arena_footprint(a);
    assert_true(whole >= 1008 && whole < 1008 + 128);
    char *record = ces_arena_alloc(a, 700);
    char *event = ces_arena_alloc(a, 300);
    assert_non_null(record);
    assert_non_null(event);
    assert_int_equal(ces_arena_footprint(a), whole);
    memset(record, 'r', 700);
    memset(event, 'e', 300);
    fill(a, 30, 100);
    assert_true(ces_arena_footprint(a) > whole);
    ces_arena_reset(a);
    assert_int_equal(ces_arena_footprint(a), whole);
    assert_ptr_equal(ces_arena_alloc(a, 700), record);
    fill(a, 30, 100);
    ces_arena_destroy(a);
    assert_null(ces_arena_new_whole((size_t)-8));
    /* A large whole arena that turns out too small grows by blocks of the usual size, not of its
     * own. */
    a = ces_arena_new_whole(1u << 20);
    assert_non_null(ces_arena_alloc(a, 1u << 20));
    whole = ces_arena_footprint(a);
    assert_non_null(ces_arena_alloc(a, 100));
    assert_true(ces_arena_footprint(a) - whole <= 65536 + 128);
    ces_arena_destroy(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reset_keeps_a_single_block),
        cmocka_unit_test(reset_merges_blocks_into_one),
        cmocka_unit_test(reset_does_not_keep_a_huge_block),
        cmocka_unit_test(whole_arena_keeps_its_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
