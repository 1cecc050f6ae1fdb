#include "util/clock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t ces_clock_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ces_clock_parse_duration(const char *text, int64_t *seconds) {
    static const struct {
        const char *unit;
        int64_t factor;
    } units[] = {{"s", 1},         {"sec", 1},     {"second", 1},  {"seconds", 1},
                 {"min", 60},      {"minute", 60}, {"minutes", 60}, {"h", 3600},
                 {"hour", 3600},   {"hours", 3600}, {"d", 86400},   {"day", 86400},
                 {"days", 86400}};
    char *end;
    long long n = strtoll(text, &end, 10);
    if (end == text || n < 0 || n > 100000000)
        return -1;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].unit) == 0) {
            *seconds = (int64_t)n * units[i].factor;
            return 0;
        }
    }
    return -1;
}
