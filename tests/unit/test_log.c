#include "test_util.h"

#include <unistd.h>

#include "util/log.h"

/* text[0..len) escaped whole, in a buffer of the test's. */
static const char *escaped(const char *text, size_t len) {
    static char out[CES_LOG_ESCAPED_SIZE(4096)];
    assert_true(len <= 4096);
    assert_int_equal(ces_log_escape(out, sizeof(out), text, len), len);
    return out;
}

#define ESC(literal) escaped(literal, sizeof(literal) - 1)

/* Reads an escaped text back: the bytes it stands for, in out; returns their count. Fails the
 * test on anything the escape never writes. */
static size_t unescape(const char *text, unsigned char *out) {
    size_t n = 0;
    for (const char *p = text; *p != '\0'; p++) {
        if (*p != '\\') {
            out[n++] = (unsigned char)*p;
            continue;
        }
        p++;
        if (*p == '\\' || *p == 'n' || *p == 'r' || *p == 't') {
            out[n++] = *p == 'n' ? '\n' : *p == 'r' ? '\r' : *p == 't' ? '\t' : '\\';
        } else if (*p == 'u') {
            unsigned int cp;
            char hex[5] = {p[1], p[2], p[3], p[4], '\0'};
            assert_true(strspn(hex, "0123456789abcdef") == 4);
            sscanf(hex, "%x", &cp);
            assert_true(cp >= 0x800);
            out[n++] = (unsigned char)(0xE0 | (cp >> 12));
            out[n++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            out[n++] = (unsigned char)(0x80 | (cp & 0x3F));
            p += 4;
        } else {
            assert_int_equal(*p, 'x');
            unsigned int b;
            char hex[3] = {p[1], p[2], '\0'};
            assert_true(strspn(hex, "0123456789abcdef") == 2);
            sscanf(hex, "%x", &b);
            out[n++] = (unsigned char)b;
            p += 2;
        }
    }
    return n;
}

/* Whether the escaped text holds a control character or a byte that is not printable UTF-8 as
 * the escape leaves it: any byte below 0x20, DEL, or a C1 character's lead bytes. */
static bool has_raw_control(const char *text) {
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++)
        if (*p < 0x20 || *p == 0x7F || (p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F))
            return true;
    return false;
}

static void every_byte_alone(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        char in[1] = {(char)b}, want[8];
        if (b == '\\')
            strcpy(want, "\\\\");
        else if (b == '\n')
            strcpy(want, "\\n");
        else if (b == '\r')
            strcpy(want, "\\r");
        else if (b == '\t')
            strcpy(want, "\\t");
        else if (b < 0x20 || b >= 0x7F) /* C0, DEL, and 0x80..0xFF: never UTF-8 alone */
            snprintf(want, sizeof(want), "\\x%02x", b);
        else
            snprintf(want, sizeof(want), "%c", b);
        assert_string_equal(escaped(in, 1), want);
        assert_int_equal(ces_log_is_plain(in, 1), b == '\\' || (b >= 0x20 && b < 0x7F));
    }
    assert_string_equal(ESC("\x1b[2J\x07"), "\\x1b[2J\\x07");
    assert_string_equal(ESC("a\0b"), "a\\x00b");
    assert_string_equal(ESC("C:\\new"), "C:\\\\new");
    assert_string_equal(ESC(""), "");
}

static void utf8_multibyte_kept(void **state) {
    (void)state;
    static const char *const kept[] = {
        "\xc2\xa0",         /* U+00A0, the first character after C1 */
        "caf\xc3\xa9",      /* é */
        "\xdf\xbf",         /* U+07FF */
        "\xe0\xa0\x80",     /* U+0800 */
        "\xe2\x82\xac",     /* € */
        "\xed\x9f\xbf",     /* U+D7FF, just below the surrogates */
        "\xef\xbf\xbd",     /* U+FFFD */
        "\xf0\x90\x80\x80", /* U+10000 */
        "\xf0\x9f\x98\x80", /* an emoji */
        "\xf4\x8f\xbf\xbf", /* U+10FFFF */
        "Stra\xc3\x9f" "e_\xe6\x97\xa5\xe6\x9c\xac",
    };
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
        assert_string_equal(escaped(kept[i], strlen(kept[i])), kept[i]);
        assert_true(ces_log_is_plain(kept[i], strlen(kept[i])));
    }
}

static void c1_escaped(void **state) {
    (void)state;
    for (unsigned int cp = 0x80; cp <= 0x9F; cp++) {
        char in[2] = {(char)0xC2, (char)cp}, want[16];
        snprintf(want, sizeof(want), "\\xc2\\x%02x", cp);
        assert_string_equal(escaped(in, 2), want);
        assert_false(ces_log_is_plain(in, 2));
    }
    /* CSI (U+009B) starts a terminal sequence like ESC [ does. */
    assert_string_equal(ESC("x\xc2\x9b" "2Jy"), "x\\xc2\\x9b2Jy");
}

/* Characters that reorder or break what is shown without being seen ("Trojan Source"): a
 * right-to-left override in a table name must not make a log line read otherwise. */
static void invisible_format_characters_escaped(void **state) {
    (void)state;
    static const unsigned int escaped_cps[] = {0x200E, 0x200F, 0x2028, 0x2029, 0x202A, 0x202B,
                                               0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068,
                                               0x2069};
    for (size_t i = 0; i < sizeof(escaped_cps) / sizeof(escaped_cps[0]); i++) {
        unsigned int cp = escaped_cps[i];
        char in[3] = {(char)(0xE0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3F)),
                      (char)(0x80 | (cp & 0x3F))};
        char want[8];
        snprintf(want, sizeof(want), "\\u%04x", cp);
        assert_string_equal(escaped(in, 3), want);
        assert_false(ces_log_is_plain(in, 3));
        unsigned char back[8];
        assert_int_equal(unescape(want, back), 3);
        assert_memory_equal(back, in, 3);
    }
    assert_string_equal(ESC("users\xe2\x80\xae" "txt.exe"), "users\\u202etxt.exe");
    /* Their neighbours stay as they are. */
    assert_string_equal(ESC("\xe2\x80\x8d\xe2\x80\xaf\xe2\x81\xa5"), "\xe2\x80\x8d\xe2\x80\xaf\xe2\x81\xa5");
}

static void invalid_utf8_escaped(void **state) {
    (void)state;
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"\xc0\x80", "\\xc0\\x80"},                         /* overlong NUL */
        {"\xc1\xbf", "\\xc1\\xbf"},                         /* overlong */
        {"\xe0\x80\x80", "\\xe0\\x80\\x80"},                /* overlong */
        {"\xed\xa0\x80", "\\xed\\xa0\\x80"},                /* a surrogate */
        {"\xf0\x80\x80\x80", "\\xf0\\x80\\x80\\x80"},       /* overlong */
        {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},       /* above U+10FFFF */
        {"\xf5\x80\x80\x80", "\\xf5\\x80\\x80\\x80"},
        {"\x80", "\\x80"},                                  /* a lone continuation */
        {"\xc3" "A", "\\xc3A"},                             /* é cut short */
        {"a\xe2\x82", "a\\xe2\\x82"},                       /* € cut by the end */
        {"\xe2\x82\xe2\x82\xac", "\\xe2\\x82\xe2\x82\xac"}, /* then a whole € */
        {"\xff\xfe", "\\xff\\xfe"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_string_equal(escaped(cases[i].in, strlen(cases[i].in)), cases[i].want);
        assert_false(ces_log_is_plain(cases[i].in, strlen(cases[i].in)));
    }
}

/* Any bytes at all: the escape is one line of printable text that reads back to them. */
static void escape_reads_back(void **state) {
    (void)state;
    uint32_t seed = 42;
    unsigned char in[64], back[64 * 4];
    for (int round = 0; round < 20000; round++) {
        size_t len = (size_t)(round % 64);
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            /* Mostly bytes near the interesting ranges. */
            unsigned int r = (seed >> 16) & 0xFF;
            in[i] = (unsigned char)(round % 3 == 0   ? r
                                    : round % 3 == 1 ? (r & 0x3F) | 0x80
                                                     : r & 0x9F);
            if (round % 5 == 0 && i % 3 == 0)
                in[i] = (unsigned char)(0xC2 + (r & 0x1F));
        }
        const char *e = escaped((const char *)in, len);
        assert_false(has_raw_control(e));
        assert_int_equal(unescape(e, back), len);
        assert_memory_equal(back, in, len);
    }
}

static void cut_to_fit_whole_units(void **state) {
    (void)state;
    char out[8];
    /* "ab" fits; the four characters of \x1b do not fit after it with the NUL. */
    assert_int_equal(ces_log_escape(out, 6, "ab\x1b" "c", 4), 2);
    assert_string_equal(out, "ab");
    assert_int_equal(ces_log_escape(out, 7, "ab\x1b" "c", 4), 3);
    assert_string_equal(out, "ab\\x1b");
    /* A character of several bytes is not cut either. */
    assert_int_equal(ces_log_escape(out, 4, "a\xe2\x82\xac", 4), 1);
    assert_string_equal(out, "a");
    assert_int_equal(ces_log_escape(out, 1, "abc", 3), 0);
    assert_string_equal(out, "");
    assert_int_equal(ces_log_escape(out, 0, "abc", 3), 0);
}

/* Runs fn with stderr (or out) going to a file; returns what was written, malloc'd. */
static char *captured(FILE *target, void (*fn)(FILE *)) {
    char path[] = "/tmp/test_log.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(target);
    int saved = dup(fileno(target));
    assert_true(dup2(fd, fileno(target)) >= 0);
    fn(target);
    fflush(target);
    dup2(saved, fileno(target));
    close(saved);
    close(fd);
    size_t len;
    char *text = test_read_file(path, &len);
    unlink(path);
    return text;
}

static char long_text[5000];

static void put_long(FILE *out) { ces_log_escape_put(out, long_text); }

static void put_escapes_however_long(void **state) {
    (void)state;
    for (size_t i = 0; i + 1 < sizeof(long_text); i++)
        long_text[i] = i % 7 == 0 ? '\x1b' : i % 11 == 0 ? '\n' : (char)('a' + i % 26);
    char *text = captured(stdout, put_long);
    unsigned char back[sizeof(long_text)];
    assert_false(has_raw_control(text));
    assert_int_equal(unescape(text, back), strlen(long_text));
    assert_memory_equal(back, long_text, strlen(long_text));
    free(text);
}

static void write_forged_lines(FILE *out) {
    (void)out;
    ces_log_write(CES_LOG_ERROR, "table %s: %s", "a\x1b[2Jb", "ERROR:  bad\nDETAIL:  why\n");
    ces_log_write(CES_LOG_WARNING, "name \"x\nINFO forged\"");
}

static void text_lines_are_escaped(void **state) {
    (void)state;
    ces_log_set_format(CES_LOG_TEXT);
    char *text = captured(stderr, write_forged_lines);
    assert_string_equal(text, "ERROR table a\\x1b[2Jb: ERROR:  bad\\nDETAIL:  why\n"
                              "WARNING name \"x\\nINFO forged\"\n");
    free(text);
}

static void json_lines_keep_the_text(void **state) {
    (void)state;
    ces_log_set_format(CES_LOG_JSON);
    char *text = captured(stderr, write_forged_lines);
    ces_log_set_format(CES_LOG_TEXT);
    /* yajl's own escapes, the text unchanged. */
    assert_non_null(
        strstr(text, "\"message\":\"table a\\u001B[2Jb: ERROR:  bad\\nDETAIL:  why\"}\n"));
    assert_non_null(strstr(text, "\"message\":\"name \\\"x\\nINFO forged\\\"\"}\n"));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_byte_alone),
        cmocka_unit_test(utf8_multibyte_kept),
        cmocka_unit_test(c1_escaped),
        cmocka_unit_test(invisible_format_characters_escaped),
        cmocka_unit_test(invalid_utf8_escaped),
        cmocka_unit_test(escape_reads_back),
        cmocka_unit_test(cut_to_fit_whole_units),
        cmocka_unit_test(put_escapes_however_long),
        cmocka_unit_test(text_lines_are_escaped),
        cmocka_unit_test(json_lines_keep_the_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
