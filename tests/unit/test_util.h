/* Small helpers shared by the unit tests. */
#ifndef CES_TEST_UTIL_H
#define CES_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads a whole file into a NUL-terminated malloc'd buffer; fails the test if it cannot. */
static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* Compares text with the golden file at path, or rewrites the file when CES_UPDATE_GOLDEN is set
 * (after a deliberate change; review the diff). A difference fails the test, naming what differs
 * (e.g. "decoded form"). */
static inline void test_check_golden(const char *path, const char *text, const char *what) {
    if (getenv("CES_UPDATE_GOLDEN") != NULL) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
        return;
    }
    char *want = test_read_file(path, NULL);
    if (strcmp(want, text) != 0) {
        fprintf(stderr, "--- expected %s\n%s\n--- got\n%s\n", path, want, text);
        free(want);
        fail_msg("%s differs from %s", what, path);
    }
    free(want);
}

/* A column or a field of a hand-made event, with the lengths the decoder gives (name and type are
 * string literals or arrays, whose sizes count their NUL). */
#define TEST_COLUMN(name, type) {(name), (type), sizeof(name) - 1, sizeof(type) - 1}
#define TEST_FIELD(name, value, value_len, is_null)                                                \
    {(name), (value), (value_len), sizeof(name) - 1, (is_null)}

#endif
