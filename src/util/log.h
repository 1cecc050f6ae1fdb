/*
 * log: one logger for ces2pg and the libraries it drives.
 *
 * Lines go to stderr as "LEVEL message" (log.format = "text", journald-friendly: systemd adds the
 * time) or as one JSON object per line with time, level and message ("json"). The level
 * test happens in the macro, before any argument is evaluated, so debug logging costs one compare
 * when it is off.
 *
 * Text meant for a terminal or a log quotes names and messages that come from events, libpq and
 * librdkafka, so it is escaped (ces_log_escape) before it is written: a text-mode line, whatever
 * its source, and the operator commands' text output. Nothing an event carries can then clear a
 * terminal or forge a line. JSON lines need none of it: yajl's generator escapes them.
 */
#ifndef CES_LOG_H
#define CES_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    CES_LOG_ERROR = 0,
    CES_LOG_WARNING = 1,
    CES_LOG_INFO = 2,
    CES_LOG_DEBUG = 3,
} ces_log_level_t;

typedef enum {
    CES_LOG_TEXT = 0,
    CES_LOG_JSON = 1,
} ces_log_format_t;

extern ces_log_level_t ces_log_current_level;

/* Parses "error", "warning", "info" or "debug". Returns 0 and sets *level, or -1. */
int ces_log_level_parse(const char *name, ces_log_level_t *level);
const char *ces_log_level_name(ces_log_level_t level);
void ces_log_set_level(ces_log_level_t level);
/* Parses "text" or "json". Returns 0 and sets *format, or -1. */
int ces_log_format_parse(const char *name, ces_log_format_t *format);
void ces_log_set_format(ces_log_format_t format);
/* The format in effect (async-signal-safe: one read). */
ces_log_format_t ces_log_get_format(void);

void ces_log_write(ces_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ces_log_writev(ces_log_level_t level, const char *fmt, va_list ap);

/*
 * The escape. Valid UTF-8 is kept as it is, but for the control characters: a backslash becomes
 * \\, newline, carriage return and tab become \n, \r and \t, every other C0 byte and DEL
 * become \xHH (two lowercase hex digits: ESC is \x1b), a C1 character (U+0080..U+009F) becomes
 * the \xHH of each of its two bytes (U+009B is \xc2\x9b), and so does every byte that is not
 * part of valid UTF-8 (overlong forms, surrogates and code points above U+10FFFF included). So
 * the result is printable UTF-8 on one line, and \xHH always stands for exactly one byte: the
 * original bytes can be read back unambiguously.
 */

/* The room escaping len bytes can need, with the NUL: a byte becomes at most four characters. */
#define CES_LOG_ESCAPED_SIZE(len) (4 * (len) + 1)

/* Writes text[0..len) escaped to dst (dst_size bytes, NUL-terminated when dst_size > 0). When dst
 * is too small, stops before the first character or escape that does not fit whole. Returns how
 * many bytes of text it escaped: len when all of them fitted. */
size_t ces_log_escape(char *dst, size_t dst_size, const char *text, size_t len);

/* Writes text (NUL-terminated) escaped to out, however long. */
void ces_log_escape_put(FILE *out, const char *text);

/* True when ces_log_escape would change nothing in text[0..len) but its backslashes: valid UTF-8
 * without control characters, safe to print as it is. */
bool ces_log_is_plain(const char *text, size_t len);

#define ces_log(level, ...)                                                                        \
    do {                                                                                           \
        if ((level) <= ces_log_current_level)                                                      \
            ces_log_write((level), __VA_ARGS__);                                                   \
    } while (0)

#define ces_log_error(...) ces_log(CES_LOG_ERROR, __VA_ARGS__)
#define ces_log_warning(...) ces_log(CES_LOG_WARNING, __VA_ARGS__)
#define ces_log_info(...) ces_log(CES_LOG_INFO, __VA_ARGS__)
#define ces_log_debug(...) ces_log(CES_LOG_DEBUG, __VA_ARGS__)

#endif
