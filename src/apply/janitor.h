/*
 * janitor: periodic maintenance between batches (pgbouncer's janitor, in spirit).
 *
 * Today it purges tombstones older than apply.tombstone_retention, a bounded number at a time, so
 * that it never holds locks that applying waits for for long. It runs at most once a minute (or
 * once per retention period when that is shorter). Failures are only logged: the next round tries
 * again.
 */
#ifndef CES_JANITOR_H
#define CES_JANITOR_H

#include <stdbool.h>
#include <stdint.h>

#include "apply/session.h"

/* Tombstones deleted by one purge at the most. */
#define CES_JANITOR_PURGE_ROWS 10000
/* The longest time between two purges. */
#define CES_JANITOR_PURGE_INTERVAL_MS 60000

typedef struct ces_janitor_s ces_janitor_t;

/* lsn_guard false: there are no tombstones, and the janitor does nothing. Returns NULL when out of
 * memory. Owned by the caller. */
ces_janitor_t *ces_janitor_new(bool lsn_guard, int64_t tombstone_retention_s)
    __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_janitor_destroy(ces_janitor_t *janitor);

/* Does what is due, on session's connection (outside any transaction). tombstones is the quoted
 * tombstones table (ces_metadata_tombstones; NULL: not known yet, nothing is done). */
void ces_janitor_run(ces_janitor_t *janitor, ces_session_t *session, const char *tombstones);

#endif
