#include "test_util.h"

#include "util/map.h"

/* The tests of put, get, grow and remove run on both kinds of map (state: its constructor). */
typedef ces_map_t *(*map_maker_t)(void);
static map_maker_t plain = ces_map_new, scratch = ces_map_new_scratch;

static ces_map_t *make(void **state) { return (*(map_maker_t *)*state)(); }

static void put_get_grow(void **state) {
    ces_map_t *m = make(state);
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
    ces_map_t *m = make(state);
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

/* A scratch map is emptied and filled again many times (its key arena reset each time): every
 * round finds its own keys and none of the last round's. */
static void scratch_map_is_refilled(void **state) {
    (void)state;
    ces_map_t *m = ces_map_new_scratch();
    assert_non_null(m);
    char key[32];
    for (uintptr_t round = 0; round < 20; round++) {
        for (uintptr_t i = 0; i < 500; i++) {
            int n = snprintf(key, sizeof(key), "r%lu-k%lu", (unsigned long)round, (unsigned long)i);
            assert_int_equal(ces_map_put(m, key, (size_t)n, (void *)(round * 1000 + i + 1)), 0);
        }
        int n = snprintf(key, sizeof(key), "r%lu-k7", (unsigned long)round);
        assert_true((uintptr_t)ces_map_remove(m, key, (size_t)n) == round * 1000 + 8);
        assert_int_equal(ces_map_count(m), 499);
        for (uintptr_t i = 0; i < 500; i++) {
            n = snprintf(key, sizeof(key), "r%lu-k%lu", (unsigned long)round, (unsigned long)i);
            void *v = ces_map_get(m, key, (size_t)n);
            if (i == 7)
                assert_null(v);
            else
                assert_true((uintptr_t)v == round * 1000 + i + 1);
        }
        if (round > 0) {
            n = snprintf(key, sizeof(key), "r%lu-k1", (unsigned long)(round - 1));
            assert_null(ces_map_get(m, key, (size_t)n));
        }
        ces_map_clear(m, NULL, NULL);
        assert_int_equal(ces_map_count(m), 0);
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

/* ces_map_key_is says yes to exactly the key ces_map_key makes of the same parts. */
static void key_is_the_key_of_its_parts(void **state) {
    (void)state;
    char buf[64];
    const char *parts[][3] = {{"db", NULL, "Employees"}, {"db", "", "Employees"},
                              {"db", "x", "Employees"},  {"db.x", NULL, "Employees"},
                              {"db", "Employees", NULL}, {"d", "b", "Employees"},
                              {"db", NULL, "Employee"},  {"db", NULL, "Employeess"},
                              {NULL, NULL, NULL},        {"", "", ""}};
    enum { N = sizeof(parts) / sizeof(parts[0]) };
    for (size_t i = 0; i < N; i++) {
        size_t len = ces_map_key(buf, sizeof(buf), '.', parts[i], 3);
        for (size_t j = 0; j < N; j++) {
            char other[64];
            size_t olen = ces_map_key(other, sizeof(other), '.', parts[j], 3);
            bool same = olen == len && memcmp(other, buf, len) == 0;
            if (ces_map_key_is(buf, len, '.', parts[j], 3) != same)
                fail_msg("key %zu against parts %zu: expected %d", i, j, same);
        }
        assert_false(ces_map_key_is(buf, len, '|', parts[i], 3) && strchr(buf, '.') != NULL);
    }
    /* A key cut to fit is not the key of the parts it was cut from. */
    const char *wide[] = {"0123456789", "abcdefghij"};
    size_t cut = ces_map_key(buf, 16, '|', wide, 2);
    assert_int_equal(cut, 15);
    assert_false(ces_map_key_is(buf, cut, '|', wide, 2));
    assert_true(ces_map_key_is(buf, cut, '|', (const char *[]){"0123456789", "abcd"}, 2));
}

/* A walk meets every entry once, with its key, whatever the map's size and however it grew. */
static void next_walks_every_entry_once(void **state) {
    ces_map_t *m = make(state);
    ces_map_iter_t it = {0};
    assert_null(ces_map_next(m, &it, NULL, NULL));
    enum { N = 1000 };
    static unsigned char seen[N + 1];
    memset(seen, 0, sizeof(seen));
    char key[32];
    for (uintptr_t i = 1; i <= N; i++) {
        int n = snprintf(key, sizeof(key), "p-%lu", (unsigned long)i);
        assert_int_equal(ces_map_put(m, key, (size_t)n, (void *)i), 0);
    }
    it = (ces_map_iter_t){0};
    size_t walked = 0;
    const char *k;
    size_t len;
    for (void *v; (v = ces_map_next(m, &it, &k, &len)) != NULL; walked++) {
        uintptr_t i = (uintptr_t)v;
        assert_true(i >= 1 && i <= N);
        assert_int_equal(seen[i], 0);
        seen[i] = 1;
        int n = snprintf(key, sizeof(key), "p-%lu", (unsigned long)i);
        assert_int_equal(len, (size_t)n);
        assert_memory_equal(k, key, len);
    }
    assert_int_equal(walked, N);
    /* The end stays the end. */
    assert_null(ces_map_next(m, &it, NULL, NULL));
    ces_map_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(put_get_grow, &plain),
        cmocka_unit_test_prestate(put_get_grow, &scratch),
        cmocka_unit_test_prestate(remove_keeps_others_findable, &plain),
        cmocka_unit_test_prestate(remove_keeps_others_findable, &scratch),
        cmocka_unit_test_prestate(next_walks_every_entry_once, &plain),
        cmocka_unit_test_prestate(next_walks_every_entry_once, &scratch),
        cmocka_unit_test(scratch_map_is_refilled),
        cmocka_unit_test(key_joins_parts_and_is_cut_to_fit),
        cmocka_unit_test(key_is_the_key_of_its_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
