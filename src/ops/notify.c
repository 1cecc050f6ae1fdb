#include "ops/notify.h"

#ifdef CES2PG_HAVE_SYSTEMD

#include <stdarg.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>

#include "util/log.h"

void ces_notify(const char *state) {
    int rc = sd_notify(0, state);
    if (rc < 0)
        ces_log_debug("sd_notify(%s) failed: error %d", state, -rc);
}

void ces_notify_status(const char *fmt, ...) {
    char status[1024];
    int n = snprintf(status, sizeof(status), "STATUS=");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(status + n, sizeof(status) - (size_t)n, fmt, ap);
    va_end(ap);
    (void)sd_notify(0, status);
}

int64_t ces_notify_watchdog_interval_ms(void) {
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return 0;
    return (int64_t)(usec / 2000); /* ping twice per period */
}

#else
/* Without libsystemd everything is in notify.h: keep this translation unit non-empty. */
typedef int ces_notify_unused_t;
#endif
