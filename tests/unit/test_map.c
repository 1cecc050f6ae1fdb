#include "test_util.h"

#include "map.h"

static void put_get_grow(void **state) {
    (void)state;
    ces_map_t *m = ces_map_new();
    assert_non_null(m);
    char key[32];
    for (uintptr_t i = 1; i <= 5000; i++) {
        int n = snprintf(key, sizeof(key), "key-%lu", (unsigned long)i);
        assert_int_equal(ces_map_put(m, key, (size_t)n, (void *)i), 0);
    }
    assert_int_equal(ces_map_count(m), 5000);
    for (uintptr_t i = 1; i <= 5000; i++) {
        int n = snprintf(key, sizeof(key), "key-%lu", (unsigned long)i);
        assert_true((uintptr_t)ces_map_get(m, key, (size_t)n) == i);
    }
    assert_null(ces_map_get(m, "key-0", 5));
    /* Keys are bytes with a length: a prefix is another key. */
    assert_null(ces_map_get(m, "key-1", 4));
    assert_int_equal(ces_map_put(m, "key-1", 5, (void *)7), 0);
    assert_true((uintptr_t)ces_map_get(m, "key-1", 5) == 7);
    assert_int_equal(ces_map_count(m), 5000);
    ces_map_destroy(m);
    ces_map_destroy(NULL);
}

static void remove_keeps_others_findable(void **state) {
    (void)state;
    ces_map_t *m = ces_map_new();
    char key[32];
    for (uintptr_t i = 1; i <= 3000; i++) {
        int n = snprintf(key, sizeof(key), "k%lu", (unsigned long)i);
        assert_int_equal(ces_map_put(m, key, (size_t)n, (void *)i), 0);
    }
    for (uintptr_t i = 1; i <= 3000; i += 3) {
        int n = snprintf(key, sizeof(key), "k%lu", (unsigned long)i);
        assert_true((uintptr_t)ces_map_remove(m, key, (size_t)n) == i);
        assert_null(ces_map_remove(m, key, (size_t)n));
    }
    assert_int_equal(ces_map_count(m), 2000);
    for (uintptr_t i = 1; i <= 3000; i++) {
        int n = snprintf(key, sizeof(key), "k%lu", (unsigned long)i);
        void *v = ces_map_get(m, key, (size_t)n);
        if (i % 3 == 1)
            assert_null(v);
        else
            assert_true((uintptr_t)v == i);
    }
    ces_map_destroy(m);
}

static void key_joins_parts_and_is_cut_to_fit(void **state) {
    (void)state;
    char buf[16];
    const char *three[] = {"db", NULL, "Employees"};
    assert_int_equal(ces_map_key(buf, sizeof(buf), '.', three, 3), 13);
    assert_string_equal(buf, "db..Employees");
    const char *two[] = {"dbo", "Orders"};
    assert_int_equal(ces_map_key(buf, sizeof(buf), '\x1f', two, 2), 10);
    assert_memory_equal(buf, "dbo\x1fOrders", 11);
    /* Cut at size - 1 bytes, NUL-terminated, never past the buffer. */
    const char *wide[] = {"0123456789", "abcdefghij"};
    assert_int_equal(ces_map_key(buf, sizeof(buf), '|', wide, 2), 15);
    assert_string_equal(buf, "0123456789|abcd");
    const char *long_first[] = {"0123456789abcdefXYZ", "tail"};
    assert_int_equal(ces_map_key(buf, sizeof(buf), '|', long_first, 2), 15);
    assert_string_equal(buf, "0123456789abcde");
    assert_int_equal(ces_map_key(buf, sizeof(buf), '|', wide, 0), 0);
    assert_string_equal(buf, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(put_get_grow),
                                       cmocka_unit_test(remove_keeps_others_findable),
                                       cmocka_unit_test(key_joins_parts_and_is_cut_to_fit)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
