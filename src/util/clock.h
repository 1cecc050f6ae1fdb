/*
 * clock: the one monotonic clock of ces2pg, in milliseconds.
 *
 * Every timeout, window and interval (batch age, reorder window, backoff, purge interval, liveness)
 * is measured on it, so that a change of the wall clock never moves any of them.
 */
#ifndef CES_CLOCK_H
#define CES_CLOCK_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC. Any thread. */
int64_t ces_clock_now_ms(void);

/* A duration written for people ("8 days", "12 h", "90 minutes", "30 s") in seconds, in *seconds.
 * Returns 0, or -1 when malformed. */
int ces_clock_parse_duration(const char *text, int64_t *seconds);

#endif
