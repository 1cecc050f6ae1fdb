#include "util/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <yajl/yajl_gen.h>

ces_log_level_t ces_log_current_level = CES_LOG_INFO;
static volatile ces_log_format_t current_format = CES_LOG_TEXT;

static const char *const level_names[] = {"error", "warning", "info", "debug"};
static const char *const level_tags[] = {"ERROR", "WARNING", "INFO", "DEBUG"};

int ces_log_level_parse(const char *name, ces_log_level_t *level) {
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *level = (ces_log_level_t)i;
            return 0;
        }
    }
    return -1;
}

const char *ces_log_level_name(ces_log_level_t level) { return level_names[level]; }

void ces_log_set_level(ces_log_level_t level) { ces_log_current_level = level; }

int ces_log_format_parse(const char *name, ces_log_format_t *format) {
    if (strcmp(name, "text") == 0)
        *format = CES_LOG_TEXT;
    else if (strcmp(name, "json") == 0)
        *format = CES_LOG_JSON;
    else
        return -1;
    return 0;
}

void ces_log_set_format(ces_log_format_t format) { current_format = format; }

ces_log_format_t ces_log_get_format(void) { return current_format; }

/* ---------------------------------------------------------------------------------------------- */
/* Escaping                                                                                       */

/* The length of the valid UTF-8 character of two or more bytes at p[0..len), or 0 when p does
 * not start one (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_char(const unsigned char *p, size_t len) {
    unsigned char b = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (b >= 0xC2 && b <= 0xDF)
        n = 2;
    else if (b >= 0xE0 && b <= 0xEF)
        n = 3;
    else if (b >= 0xF0 && b <= 0xF4)
        n = 4;
    else
        return 0;
    if (b == 0xE0)
        lo = 0xA0;
    else if (b == 0xED)
        hi = 0x9F;
    else if (b == 0xF0)
        lo = 0x90;
    else if (b == 0xF4)
        hi = 0x8F;
    if (len < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

/* The characters that reorder or break what a terminal or a log viewer shows without being seen
 * themselves: the bidirectional marks, embeddings, overrides and isolates (U+200E, U+200F,
 * U+202A-U+202E, U+2066-U+2069: "Trojan Source") and the line and paragraph separators (U+2028,
 * U+2029). p[0..n) is one UTF-8 character. */
static bool is_invisible_format(const unsigned char *p, size_t n) {
    if (n != 3 || p[0] != 0xE2)
        return false;
    if (p[1] == 0x80)
        return p[2] == 0x8E || p[2] == 0x8F || (p[2] >= 0xA8 && p[2] <= 0xAE);
    return p[1] == 0x81 && p[2] >= 0xA6 && p[2] <= 0xA9;
}

/* One unit of the escape: the character or byte at p[0..len) (len > 0) as it is written, in
 * out (at most 8 characters, not NUL-terminated). Returns how many bytes of p it stands for, and
 * sets *out_len. */
static size_t escape_unit(const unsigned char *p, size_t len, char out[8], size_t *out_len) {
    static const char hex[] = "0123456789abcdef";
    size_t n = p[0] < 0x80 ? 1 : utf8_char(p, len);
    /* A C1 character is escaped byte by byte, like a byte that is not UTF-8 (n == 0). */
    size_t escaped = n == 0 ? 1 : n == 2 && p[0] == 0xC2 && p[1] <= 0x9F ? 2 : 0;
    if (escaped == 0 && n == 1) {
        const char *named = p[0] == '\\' ? "\\\\" : p[0] == '\n' ? "\\n" : p[0] == '\r' ? "\\r"
                          : p[0] == '\t' ? "\\t" : NULL;
        if (named != NULL) {
            memcpy(out, named, 2);
            *out_len = 2;
            return 1;
        }
        if (p[0] < 0x20 || p[0] == 0x7F)
            escaped = 1;
    }
    if (escaped == 0 && is_invisible_format(p, n)) {
        unsigned cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
        snprintf(out, 8, "\\u%04x", cp);
        *out_len = 6;
        return n;
    }
    if (escaped == 0) {
        memcpy(out, p, n);
        *out_len = n;
        return n;
    }
    for (size_t i = 0; i < escaped; i++) {
        out[4 * i] = '\\';
        out[4 * i + 1] = 'x';
        out[4 * i + 2] = hex[p[i] >> 4];
        out[4 * i + 3] = hex[p[i] & 0xF];
    }
    *out_len = 4 * escaped;
    return escaped;
}

size_t ces_log_escape(char *dst, size_t dst_size, const char *text, size_t len) {
    const unsigned char *p = (const unsigned char *)text;
    size_t in = 0, out = 0;
    if (dst_size == 0)
        return 0;
    while (in < len) {
        char unit[8];
        size_t unit_len, took = escape_unit(p + in, len - in, unit, &unit_len);
        if (unit_len >= dst_size - out)
            break; /* and keep the room for the NUL */
        memcpy(dst + out, unit, unit_len);
        out += unit_len;
        in += took;
    }
    dst[out] = '\0';
    return in;
}

void ces_log_escape_put(FILE *out, const char *text) {
    size_t len = strlen(text);
    char chunk[1024];
    while (len > 0) {
        size_t took = ces_log_escape(chunk, sizeof(chunk), text, len);
        fputs(chunk, out);
        text += took;
        len -= took;
    }
}

bool ces_log_is_plain(const char *text, size_t len) {
    const unsigned char *p = (const unsigned char *)text;
    for (size_t in = 0; in < len;) {
        char unit[8];
        size_t unit_len, took = escape_unit(p + in, len - in, unit, &unit_len);
        if (unit_len != took && p[in] != '\\')
            return false;
        in += took;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* Writing lines                                                                                  */

/* One JSON object per line: {"time":"2024-05-01T12:00:00.123Z","level":"info","message":"..."}.
 * yajl does the escaping; a message that is not valid UTF-8 is written as text instead. */
static int write_json(ces_log_level_t level, const char *message) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof(when) - n, ".%03ldZ", (long)(tv.tv_usec / 1000));
    yajl_gen g = yajl_gen_alloc(NULL);
    if (g == NULL)
        return -1;
    yajl_gen_config(g, yajl_gen_validate_utf8, 1);
    const unsigned char *buf;
    size_t len;
    int rc = -1;
#define STR(s) yajl_gen_string(g, (const unsigned char *)(s), strlen(s))
    if (yajl_gen_map_open(g) == yajl_gen_status_ok && STR("time") == yajl_gen_status_ok &&
        STR(when) == yajl_gen_status_ok && STR("level") == yajl_gen_status_ok &&
        STR(level_names[level]) == yajl_gen_status_ok && STR("message") == yajl_gen_status_ok &&
        STR(message) == yajl_gen_status_ok && yajl_gen_map_close(g) == yajl_gen_status_ok &&
        yajl_gen_get_buf(g, &buf, &len) == yajl_gen_status_ok) {
        /* One fprintf per line keeps lines from different threads whole. */
        fprintf(stderr, "%.*s\n", (int)len, (const char *)buf);
        rc = 0;
    }
#undef STR
    yajl_gen_free(g);
    return rc;
}

void ces_log_writev(ces_log_level_t level, const char *fmt, va_list ap) {
    /* One fprintf per line keeps lines from different threads (librdkafka's, the HTTP server's)
     * whole. */
    char line[4096];
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    if (n < 0)
        return;
    size_t len = strlen(line);
    while (len > 0 && line[len - 1] == '\n')
        line[--len] = '\0';
    if (current_format == CES_LOG_JSON && write_json(level, line) == 0)
        return;
    /* A libpq message's DETAIL and HINT lines, and whatever an event put in a name, stay on this
     * one line, escaped. */
    char safe[CES_LOG_ESCAPED_SIZE(sizeof(line))];
    ces_log_escape(safe, sizeof(safe), line, len);
    fprintf(stderr, "%s %s\n", level_tags[level], safe);
}

void ces_log_write(ces_log_level_t level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ces_log_writev(level, fmt, ap);
    va_end(ap);
}
