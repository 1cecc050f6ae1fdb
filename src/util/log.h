/*
 * log: one logger for ces2pg and the libraries it drives.
 *
 * Lines go to stderr as "LEVEL message" (log.format = "text", journald-friendly: systemd adds the
 * time) or as one JSON object per line with time, level and message ("json"). The level
 * test happens in the macro, before any argument is evaluated, so debug logging costs one compare
 * when it is off.
 */
#ifndef CES_LOG_H
#define CES_LOG_H

#include <stdarg.h>

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
