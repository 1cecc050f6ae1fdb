#include "log.h"

#include <stdio.h>
#include <string.h>

ces_log_level_t ces_log_current_level = CES_LOG_INFO;

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

void ces_log_writev(ces_log_level_t level, const char *fmt, va_list ap) {
    /* One fprintf per line keeps lines from different threads (librdkafka's) whole. */
    char line[4096];
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    if (n < 0)
        return;
    size_t len = strlen(line);
    while (len > 0 && line[len - 1] == '\n')
        line[--len] = '\0';
    fprintf(stderr, "%s %s\n", level_tags[level], line);
}

void ces_log_write(ces_log_level_t level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ces_log_writev(level, fmt, ap);
    va_end(ap);
}
