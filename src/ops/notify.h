/*
 * notify: telling systemd (Type=notify) how the daemon is doing, through sd_notify(3).
 *
 * READY=1 once PostgreSQL is connected and the consumer holds its first assignment, STATUS= with
 * the progress line, WATCHDOG=1 from the main loop (WatchdogSec=), RELOADING=1 and READY=1 around a
 * SIGHUP reload, STOPPING=1 on shutdown. Outside systemd ($NOTIFY_SOCKET unset) every call does
 * nothing; built without libsystemd (CES2PG_SYSTEMD=OFF) they compile to nothing.
 */
#ifndef CES_NOTIFY_H
#define CES_NOTIFY_H

#include <stdint.h>

#ifdef CES2PG_HAVE_SYSTEMD

/* Sends a notification ("READY=1", "STOPPING=1", ...). */
void ces_notify(const char *state);
/* Sends "STATUS=<text>". */
void ces_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Milliseconds between watchdog pings that systemd asks for (half of WatchdogSec), or 0. */
int64_t ces_notify_watchdog_interval_ms(void);

#else

static inline void ces_notify(const char *state) { (void)state; }
static inline void ces_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void ces_notify_status(const char *fmt, ...) { (void)fmt; }
static inline int64_t ces_notify_watchdog_interval_ms(void) { return 0; }

#endif

#endif
