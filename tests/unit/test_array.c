#include "test_util.h"

#include "util/array.h"

/* Growth starts at first, doubles, keeps the contents, and returns the same array with room. */
static void reserve_doubles_and_keeps_contents(void **state) {
    (void)state;
    int *items = NULL;
    size_t cap = 0;
    items = CES_ARRAY_RESERVE(items, cap, 1, 8);
    assert_non_null(items);
    assert_int_equal(cap, 8);
    for (int i = 0; i < 8; i++)
        items[i] = i;
    int *same = CES_ARRAY_RESERVE(items, cap, 8, 8);
    assert_ptr_equal(same, items);
    assert_int_equal(cap, 8);
    items = CES_ARRAY_RESERVE(items, cap, 9, 8);
    assert_non_null(items);
    assert_int_equal(cap, 16);
    for (int i = 0; i < 8; i++)
        assert_int_equal(items[i], i);
    /* A need far past the capacity goes to the first doubling that holds it. */
    items = CES_ARRAY_RESERVE(items, cap, 100, 8);
    assert_non_null(items);
    assert_int_equal(cap, 128);
    free(items);
}

/* A first of 0 starts at one element. */
static void reserve_from_nothing(void **state) {
    (void)state;
    double *d = NULL;
    size_t cap = 0;
    d = CES_ARRAY_RESERVE(d, cap, 3, 0);
    assert_non_null(d);
    assert_int_equal(cap, 4);
    free(d);
}

/* A size that overflows fails and leaves the array and its capacity as they were. */
static void reserve_overflow_leaves_array_untouched(void **state) {
    (void)state;
    long *items = NULL;
    size_t cap = 0;
    items = CES_ARRAY_RESERVE(items, cap, 4, 4);
    assert_non_null(items);
    items[3] = 42;
    long *failed = CES_ARRAY_RESERVE(items, cap, SIZE_MAX / 4, 4);
    assert_null(failed);
    assert_int_equal(cap, 4);
    assert_int_equal(items[3], 42);
    failed = ces_array_reserve(items, &cap, SIZE_MAX, 1, 4);
    assert_null(failed);
    assert_int_equal(cap, 4);
    free(items);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reserve_doubles_and_keeps_contents),
        cmocka_unit_test(reserve_from_nothing),
        cmocka_unit_test(reserve_overflow_leaves_array_untouched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
