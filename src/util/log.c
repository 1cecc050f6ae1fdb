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
    fprintf(stderr, "%s %s\n", level_tags[level], line);
}

void ces_log_write(ces_log_level_t level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ces_log_writev(level, fmt, ap);
    va_end(ap);
}
