/*
 * The JSON reader (yajl underneath): what it accepts and rejects and why, strict UTF-8,
 * string escapes, numbers, limits. Every text it accepts here, yajl accepts too, with the
 * same values (the fuzz harness checks the same on random input).
 */
#include "test_util.h"

#include <yajl/yajl_parse.h>

#include "format/json.h"

static const ces_json_limits_t limits = {.max_depth = 16, .max_container = 100};

/* A flat rendering of a value: the same for our tree and for yajl's callbacks. */
static void flatten(const ces_json_t *v, FILE *out) {
    switch (v->type) {
    case CES_JSON_NULL: fputs("null ", out); break;
    case CES_JSON_BOOL: fputs(v->boolean ? "true " : "false ", out); break;
    case CES_JSON_NUMBER: fprintf(out, "num(%s) ", v->text); break;
    case CES_JSON_STRING:
        fprintf(out, "str%zu(", v->text_len);
        fwrite(v->text, 1, v->text_len, out);
        fputs(") ", out);
        break;
    case CES_JSON_ARRAY:
        fputs("[ ", out);
        for (size_t i = 0; i < v->count; i++)
            flatten(&v->items[i], out);
        fputs("] ", out);
        break;
    case CES_JSON_OBJECT:
        fputs("{ ", out);
        for (size_t i = 0; i < v->count; i++) {
            fprintf(out, "key%zu(", v->members[i].key_len);
            fwrite(v->members[i].key, 1, v->members[i].key_len, out);
            fputs(") ", out);
            flatten(&v->members[i].value, out);
        }
        fputs("} ", out);
        break;
    }
}

static int y_null(void *c) { fputs("null ", c); return 1; }
static int y_bool(void *c, int b) { fputs(b ? "true " : "false ", c); return 1; }
static int y_num(void *c, const char *s, size_t l) { fprintf(c, "num(%.*s) ", (int)l, s); return 1; }
static int y_str(void *c, const unsigned char *s, size_t l) {
    fprintf(c, "str%zu(", l);
    fwrite(s, 1, l, c);
    fputs(") ", c);
    return 1;
}
static int y_key(void *c, const unsigned char *s, size_t l) {
    fprintf(c, "key%zu(", l);
    fwrite(s, 1, l, c);
    fputs(") ", c);
    return 1;
}
static int y_sm(void *c) { fputs("{ ", c); return 1; }
static int y_em(void *c) { fputs("} ", c); return 1; }
static int y_sa(void *c) { fputs("[ ", c); return 1; }
static int y_ea(void *c) { fputs("] ", c); return 1; }
static const yajl_callbacks ycb = {y_null, y_bool, NULL, NULL, y_num, y_str,
                                   y_sm,   y_key,  y_em, y_sa, y_ea};

/* yajl's rendering of text, or NULL when yajl rejects it. */
static char *yajl_flat(const char *text, size_t len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&buf, &n);
    yajl_handle h = yajl_alloc(&ycb, NULL, out);
    yajl_status st = yajl_parse(h, (const unsigned char *)text, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    yajl_free(h);
    fclose(out);
    if (st != yajl_status_ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Parses text (in place, or not) and returns its flat rendering (malloc'd), or NULL with the error
 * in err. */
static char *parse_flat_mode(const char *text, size_t len, bool in_place, char *err,
                             size_t err_size) {
    ces_json_parser_t *p = ces_json_parser_new();
    ces_arena_t *a = ces_arena_new();
    char *copy = malloc(len ? len : 1); /* exact size: ASan sees any read past the end */
    memcpy(copy, text, len);
    const ces_json_t *v = in_place ? ces_json_parse_in_place(p, a, copy, len, &limits, err, err_size)
                                   : ces_json_parse(p, a, copy, len, &limits, err, err_size);
    char *buf = NULL;
    if (v != NULL) {
        size_t n = 0;
        FILE *out = open_memstream(&buf, &n);
        flatten(v, out);
        fclose(out);
    }
    free(copy);
    ces_arena_destroy(a);
    ces_json_parser_destroy(p);
    return buf;
}

/* Both ways, which must agree. */
static char *parse_flat(const char *text, size_t len, char *err, size_t err_size) {
    char *got = parse_flat_mode(text, len, false, err, err_size);
    char in_place_err[256] = "";
    char *in_place = parse_flat_mode(text, len, true, in_place_err, sizeof(in_place_err));
    if ((got == NULL) != (in_place == NULL) || (got != NULL && strcmp(got, in_place) != 0) ||
        (got == NULL && strcmp(err, in_place_err) != 0))
        fail_msg("%.*s: '%s' (%s), but in place '%s' (%s)", (int)len, text, got ? got : "", err,
                 in_place ? in_place : "", in_place_err);
    free(in_place);
    return got;
}

static void accepts(const char *text, size_t len, const char *want) {
    char err[256] = "";
    char *got = parse_flat(text, len, err, sizeof(err));
    if (got == NULL)
        fail_msg("rejected %.*s: %s", (int)len, text, err);
    if (strcmp(got, want) != 0)
        fail_msg("%.*s: got '%s', want '%s'", (int)len, text, got, want);
    char *y = yajl_flat(text, len);
    if (y == NULL || strcmp(y, got) != 0)
        fail_msg("%.*s: yajl says '%s', we say '%s'", (int)len, text, y ? y : "(rejected)", got);
    free(y);
    free(got);
}

static void rejects(const char *text, size_t len, const char *needle) {
    char err[256] = "";
    char *got = parse_flat(text, len, err, sizeof(err));
    if (got != NULL)
        fail_msg("accepted %.*s as %s", (int)len, text, got);
    if (strstr(err, needle) == NULL)
        fail_msg("%.*s: error '%s' does not mention '%s'", (int)len, text, err, needle);
}

#define ACCEPTS(text, want) accepts(text, sizeof(text) - 1, want)
#define REJECTS(text, needle) rejects(text, sizeof(text) - 1, needle)

static void grammar(void **state) {
    (void)state;
    ACCEPTS("{}", "{ } ");
    ACCEPTS(" \t\r\n[ ] \n", "[ ] ");
    ACCEPTS("{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"e\"}}",
            "{ key1(a) num(1) key1(b) [ true false null ] key1(c) { key1(d) str1(e) } } ");
    ACCEPTS("[0,-0,12,-3.25,1e5,1E+5,2.5e-3,-0.0e0]",
            "[ num(0) num(-0) num(12) num(-3.25) num(1e5) num(1E+5) num(2.5e-3) num(-0.0e0) ] ");
    ACCEPTS("\"top\"", "str3(top) ");
    ACCEPTS("42", "num(42) ");
    ACCEPTS("null", "null ");
    ACCEPTS("{\"a\":1,\"a\":2}", "{ key1(a) num(1) key1(a) num(2) } "); /* decode.c rejects */

    REJECTS("", "malformed JSON");
    REJECTS("   ", "malformed JSON");
    REJECTS("{", "malformed JSON");
    REJECTS("[1", "malformed JSON");
    REJECTS("{\"a\"}", "malformed JSON");
    REJECTS("{\"a\":}", "malformed JSON");
    REJECTS("{\"a\":1,}", "malformed JSON");
    REJECTS("[1,]", "malformed JSON");
    REJECTS("[,1]", "malformed JSON");
    REJECTS("{1:2}", "malformed JSON");
    REJECTS("[1 2]", "malformed JSON");
    REJECTS("{\"a\":1 \"b\":2}", "malformed JSON");
    REJECTS("[1}", "malformed JSON");
    REJECTS("{} {}", "malformed JSON");
    REJECTS("[1] x", "malformed JSON");
    REJECTS("01", "malformed JSON");
    REJECTS("1.", "malformed JSON");
    REJECTS(".5", "malformed JSON");
    REJECTS("1e", "malformed JSON");
    REJECTS("1e+", "malformed JSON");
    REJECTS("+1", "malformed JSON");
    REJECTS("--1", "malformed JSON");
    REJECTS("-", "malformed JSON");
    REJECTS("tru", "malformed JSON");
    REJECTS("nul", "malformed JSON");
    REJECTS("True", "malformed JSON");
    REJECTS("[1]\0", "malformed JSON");
    REJECTS("\xef\xbb\xbf{}", "malformed JSON"); /* no byte order mark */
}

static void strings(void **state) {
    (void)state;
    ACCEPTS("\"a\\\"b\\\\c\\/d\\be\\ff\\ng\\rh\\ti\"", "str17(a\"b\\c/d\be\ff\ng\rh\ti) ");
    ACCEPTS("\"\\u00e9\\u20AC\\ud83d\\ude00\"", "str9(é€😀) ");
    ACCEPTS("\"é€😀 Nikolić 東京\"", "str25(é€😀 Nikolić 東京) ");
    accepts("\"a\\u0000b\"", 10, "str3(a\0b) "); /* NUL by escape: kept, with the length */
    ACCEPTS("\"0123456789abcdef0123456789\\\"x\"", "str28(0123456789abcdef0123456789\"x) ");

    REJECTS("\"abc", "malformed JSON");
    REJECTS("\"abc\\", "malformed JSON");
    REJECTS("\"abc\\\"", "malformed JSON");
    REJECTS("\"\\x\"", "malformed JSON");
    REJECTS("\"\\u12\"", "malformed JSON");
    REJECTS("\"\\u12G4\"", "malformed JSON");
    /* Escaped lone surrogates: yajl writes a high one as '?', and a low one as bytes that are not
     * UTF-8, which the validator refuses. Either way nothing invalid gets through. */
    ACCEPTS("\"\\ud800\"", "str1(?) ");
    REJECTS("\"\\udc00x\"", "UTF");
    REJECTS("\"a\tb\"", "malformed JSON");
    REJECTS("\"a\nb\"", "malformed JSON");
    rejects("\"a\0b\"", 5, "malformed JSON");
    REJECTS("\"\xff\"", "UTF");
    REJECTS("\"\xc0\xaf\"", "UTF");           /* overlong '/' */
    REJECTS("\"\xe0\x80\xaf\"", "UTF");       /* overlong, three bytes */
    REJECTS("\"\xed\xa0\x80\"", "UTF");       /* surrogate */
    REJECTS("\"\xf4\x90\x80\x80\"", "UTF");   /* over U+10FFFF */
    REJECTS("\"\xc3\"", "UTF");               /* cut sequence */
    REJECTS("\"\xe2\x82\"", "UTF");
    REJECTS("{\"\xff\":1}", "UTF");           /* keys too */
    /* Escapes and multi-byte characters at every position of the eight-byte words, in long
     * strings (the word-at-a-time paths), compared with yajl. */
    const char *pieces[] = {"\\\"", "\\u00e9", "\xc3\xa9", "\\\\", "\\ud83d\\ude00", "\xf0\x9f\x98\x80"};
    for (size_t k = 0; k < sizeof(pieces) / sizeof(pieces[0]); k++) {
        for (size_t pos = 0; pos < 20; pos++) {
            char text[128];
            size_t n = 0;
            text[n++] = '"';
            for (size_t i = 0; i < 40; i++) {
                if (i == pos || i == pos + 9) {
                    memcpy(text + n, pieces[k], strlen(pieces[k]));
                    n += strlen(pieces[k]);
                } else {
                    text[n++] = (char)('a' + i % 26);
                }
            }
            text[n++] = '"';
            char err[256];
            char *got = parse_flat(text, n, err, sizeof(err));
            char *y = yajl_flat(text, n);
            if (got == NULL || y == NULL || strcmp(got, y) != 0)
                fail_msg("%.*s: we say '%s' (%s), yajl says '%s'", (int)n, text, got ? got : "-",
                         err, y ? y : "-");
            free(got);
            free(y);
        }
    }
    /* Long runs with a special byte at every position of the eight-byte words. */
    for (size_t pos = 0; pos < 24; pos++) {
        char text[64], want[96];
        memset(text, 'x', sizeof(text));
        text[0] = '"';
        text[1 + pos] = '\t'; /* control character */
        text[40] = '"';
        rejects(text, 41, "malformed JSON");
        text[1 + pos] = '"'; /* the end */
        snprintf(want, sizeof(want), "str%zu(%.*s) ", pos, (int)pos, text + 1);
        char err[256];
        char *got = parse_flat(text, 2 + pos, err, sizeof(err));
        assert_non_null(got);
        assert_string_equal(got, want);
        free(got);
    }
}

static void bounds(void **state) {
    (void)state;
    char deep[64];
    memset(deep, '[', 16);
    memset(deep + 16, ']', 16);
    accepts(deep, 32, "[ [ [ [ [ [ [ [ [ [ [ [ [ [ [ [ ] ] ] ] ] ] ] ] ] ] ] ] ] ] ] ] ");
    memset(deep, '[', 17);
    memset(deep + 17, ']', 17);
    rejects(deep, 34, "nested too deeply");

    char many[1024] = "[";
    for (int i = 0; i < 101; i++)
        strcat(many, i ? ",1" : "1");
    strcat(many, "]");
    rejects(many, strlen(many), "too many members");

    char num[128];
    memset(num, '9', 100);
    num[100] = '\0';
    char err[256];
    char *got = parse_flat(num, 100, err, sizeof(err));
    assert_non_null(got);
    free(got);
    memset(num, '9', 101);
    rejects(num, 101, "longer than 100");
}

/* Text already known to be valid UTF-8 is not checked again, and parses the same. */
static void trusted_utf8(void **state) {
    (void)state;
    ces_json_limits_t trusted = limits;
    trusted.valid_utf8 = true;
    const char text[] = "{\"k\xc3\xa9\":\"\xf0\x9f\x98\x80 a\\\"b \xe6\x9d\xb1\"}";
    ces_json_parser_t *p = ces_json_parser_new();
    ces_arena_t *a = ces_arena_new();
    char err[256];
    const ces_json_t *v = ces_json_parse(p, a, text, sizeof(text) - 1, &trusted, err, sizeof(err));
    assert_non_null(v);
    assert_int_equal(v->count, 1);
    assert_string_equal(v->members[0].key, "k\xc3\xa9");
    assert_string_equal(v->members[0].value.text, "\xf0\x9f\x98\x80 a\"b \xe6\x9d\xb1");
    ces_arena_destroy(a);
    ces_json_parser_destroy(p);
}

/* The definition the validator must match, in the Unicode standard's own terms (table 3-7, the
 * well-formed byte sequences), where the validator decodes code points: the two must agree. Returns
 * the sequence's length at s (1..4), or 0. */
static size_t oracle_sequence(const unsigned char *s, size_t avail) {
    static const struct {
        unsigned char first_lo, first_hi, second_lo, second_hi;
        size_t len;
    } table[] = {
        {0x00, 0x7F, 0, 0, 1},       {0xC2, 0xDF, 0x80, 0xBF, 2}, {0xE0, 0xE0, 0xA0, 0xBF, 3},
        {0xE1, 0xEC, 0x80, 0xBF, 3}, {0xED, 0xED, 0x80, 0x9F, 3}, {0xEE, 0xEF, 0x80, 0xBF, 3},
        {0xF0, 0xF0, 0x90, 0xBF, 4}, {0xF1, 0xF3, 0x80, 0xBF, 4}, {0xF4, 0xF4, 0x80, 0x8F, 4},
    };
    for (size_t r = 0; r < sizeof(table) / sizeof(table[0]); r++) {
        if (s[0] < table[r].first_lo || s[0] > table[r].first_hi)
            continue;
        size_t n = table[r].len;
        if (avail < n)
            return 0;
        if (n > 1 && (s[1] < table[r].second_lo || s[1] > table[r].second_hi))
            return 0;
        for (size_t k = 2; k < n; k++) {
            if (s[k] < 0x80 || s[k] > 0xBF)
                return 0;
        }
        return n;
    }
    return 0;
}

static size_t oracle_check(const unsigned char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        size_t n = oracle_sequence(s + i, len - i);
        if (n == 0)
            return i;
        i += n;
    }
    return len;
}

/* buf[0..len) after an ASCII prefix of pre bytes, so that the sequence is seen by the
 * byte-by-byte path, at every place in an eight-byte word and in a 32-byte block, and across
 * the vector check's 16-byte blocks, at the end of one, and before blocks of ASCII that it skips;
 * each check against the definition. */
static void compare_with_oracle(const unsigned char *seq, size_t len) {
    static const size_t after[] = {0, 9, 41}; /* 41: a pair of ASCII blocks follows */
    unsigned char buf[128];
    for (size_t pre = 0; pre < 41; pre++) {
        memset(buf, 'a', pre);
        memcpy(buf + pre, seq, len);
        memset(buf + pre + len, 'z', 41);
        for (size_t k = 0; k < sizeof(after) / sizeof(after[0]); k++) {
            /* The ASCII pair matters after a sequence that ends the first pair of blocks. */
            if (after[k] == 41 && (pre < 26 || pre > 31))
                continue;
            size_t total = pre + len + after[k];
            size_t want = oracle_check(buf, total);
            size_t got = ces_utf8_check((const char *)buf, total);
            size_t scalar = ces_utf8_check_scalar((const char *)buf, total);
            int vector = ces_utf8_check_vector((const char *)buf, total);
            if (got != want || scalar != want || (vector >= 0 && vector != (want == total)))
                fail_msg("%02x %02x %02x %02x (%zu bytes after %zu): %zu (scalar %zu, vector %d), "
                         "not %zu",
                         seq[0], len > 1 ? seq[1] : 0, len > 2 ? seq[2] : 0,
                         len > 3 ? seq[3] : 0, len, pre, got, scalar, vector, want);
        }
    }
}

static void utf8_validator(void **state) {
    (void)state;
    assert_true(ces_utf8_valid("", 0));
    assert_true(ces_utf8_valid("plain ascii text, long enough", 29));
    assert_true(ces_utf8_valid("\xf4\x8f\xbf\xbf", 4)); /* U+10FFFF */
    assert_false(ces_utf8_valid("abcdefgh\x80", 9));
    assert_false(ces_utf8_valid("\xf8\x88\x80\x80\x80", 5));
    assert_false(ces_utf8_valid("\xed\xa0\x80", 3)); /* a surrogate */
    assert_false(ces_utf8_valid("\xe0\x9f\xbf", 3)); /* overlong */
    assert_false(ces_utf8_valid("\xf4\x90\x80\x80", 4)); /* past U+10FFFF */
    /* Every sequence of one or two bytes; of three and four bytes, every lead and second byte,
     * with the later bytes at both ends of every high nibble (the vector check classifies a byte
     * by its nibbles; the scalar one by the continuation range, whose edges these include). */
    static const unsigned char later[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F,
                                          0xA0, 0xAF, 0xB0, 0xBF, 0xC0, 0xFF};
    unsigned char seq[4];
    for (unsigned a = 0; a < 256; a++) {
        seq[0] = (unsigned char)a;
        compare_with_oracle(seq, 1);
        for (unsigned b = 0; b < 256; b++) {
            seq[1] = (unsigned char)b;
            compare_with_oracle(seq, 2);
            if (a < 0xE0 || a > 0xF7)
                continue;
            for (size_t c = 0; c < sizeof(later); c++) {
                seq[2] = later[c];
                if (a < 0xF0) {
                    compare_with_oracle(seq, 3);
                    continue;
                }
                for (size_t d = 0; d < sizeof(later); d++) {
                    seq[3] = later[d];
                    compare_with_oracle(seq, 4);
                }
            }
        }
    }
    /* Long mixed text, valid and then spoiled at every position. */
    unsigned char text[200];
    size_t n = 0;
    const char *pieces[] = {"abc ", "\xc3\xa9", "\xe6\x9d\xb1", "\xf0\x9f\x98\x80", "0123456789"};
    for (size_t k = 0; n + 10 < sizeof(text); k = (k * 7 + 3) % 5) {
        size_t plen = strlen(pieces[k]);
        memcpy(text + n, pieces[k], plen);
        n += plen;
    }
    assert_int_equal(ces_utf8_check((const char *)text, n), n);
    for (size_t at = 0; at < n; at++) {
        unsigned char saved = text[at];
        text[at] = 0xFF;
        assert_int_equal(ces_utf8_check((const char *)text, n), oracle_check(text, n));
        assert_int_equal(ces_utf8_check_scalar((const char *)text, n), oracle_check(text, n));
        text[at] = 0x80;
        assert_int_equal(ces_utf8_check((const char *)text, n), oracle_check(text, n));
        assert_int_equal(ces_utf8_check_scalar((const char *)text, n), oracle_check(text, n));
        text[at] = saved;
    }
    /* Whether the vector check runs here at all: the test means less where it does not. */
    print_message("vector UTF-8 check: %s\n",
                  ces_utf8_check_vector("", 0) < 0 ? "not on this processor" : "tested");
}

/* In place, strings without escapes are the text's own bytes, ended where their quote was;
 * escaped ones are copies. */
static void in_place_strings_point_into_the_text(void **state) {
    (void)state;
    ces_json_parser_t *p = ces_json_parser_new();
    ces_arena_t *a = ces_arena_new();
    char text[] = "{\"k\":\"plain\",\"e\":\"a\\\"b\",\"\":\"\",\"n\":12}";
    size_t len = sizeof(text) - 1;
    char err[256];
    const ces_json_t *v = ces_json_parse_in_place(p, a, text, len, &limits, err, sizeof(err));
    assert_non_null(v);
    assert_int_equal(v->count, 4);
    const ces_json_member_t *m = v->members;
    assert_ptr_equal(m[0].key, text + 2);
    assert_string_equal(m[0].key, "k");
    assert_ptr_equal(m[0].value.text, text + 6);
    assert_string_equal(m[0].value.text, "plain");
    assert_int_equal(m[0].value.text_len, 5);
    assert_ptr_equal(m[1].key, text + 14);
    /* An escaped string is decoded by yajl elsewhere: a copy, the text keeps its bytes. */
    assert_true(m[1].value.text < text || m[1].value.text >= text + len);
    assert_memory_equal(m[1].value.text, "a\"b", 4);
    assert_memory_equal(text + 18, "a\\\"b\"", 5);
    /* Only a copy (from escapes) may hold a NUL: one in place cannot, so no one looks. */
    assert_false(m[0].value.may_hold_nul);
    assert_true(m[1].value.may_hold_nul);
    assert_false(m[2].value.may_hold_nul);
    /* Empty names and values, and numbers (yajl reads past them and looks again). */
    assert_string_equal(m[2].key, "");
    assert_string_equal(m[2].value.text, "");
    assert_string_equal(m[3].value.text, "12");
    assert_true(m[3].value.text < text || m[3].value.text >= text + len);
    ces_arena_destroy(a);
    ces_json_parser_destroy(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grammar),   cmocka_unit_test(strings),        cmocka_unit_test(bounds),
        cmocka_unit_test(trusted_utf8), cmocka_unit_test(utf8_validator),
        cmocka_unit_test(in_place_strings_point_into_the_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
