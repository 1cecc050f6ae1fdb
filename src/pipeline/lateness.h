/*
 * lateness: how the bet of the reorder window is doing in transaction mode (docs/semantics.md,
 * "Transaction mode"), kept below the stages that feed it: intake asks whether an event comes too
 * late, release says which transactions went into the batch, flight says when the batch went to
 * PostgreSQL, the loop lets time pass.
 *
 * A transaction counts as sent once the batch it was released into went to PostgreSQL; an event of
 * a transaction at or before the newest one sent arrived too late to join it (the transaction was
 * torn). A late event makes the window grow (order/window.h). A plain value: no I/O but the log.
 */
#ifndef CES_LATENESS_H
#define CES_LATENESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "order/batch.h"
#include "order/window.h"
#include "pipeline/partitions.h"

#define CES_LATENESS_SENT_HISTORY 1024 /* transactions whose sending time is remembered */
#define CES_LATENESS_TORN_HISTORY 64   /* torn transactions remembered, so each is counted once */

typedef struct {
    ces_lsn_t lsn;
    int64_t sent_ms;   /* 0: released into the batch being built, not sent yet */
    int64_t window_ms; /* the reorder window in force when it was released */
} ces_lateness_sent_t;

/* The fields are lateness.c's; the others read the window through ces_lateness_window_ms. */
typedef struct {
    ces_window_t window; /* the effective reorder window */
    bool has_released;
    ces_lsn_t released_max; /* the newest transaction released into a batch */
    bool has_sent;
    ces_lsn_t sent_max; /* the newest transaction sent to PostgreSQL */
    /* A ring, in LSN order: newest at sent_next - 1; the newest `unstamped` are not sent yet. */
    ces_lateness_sent_t sent[CES_LATENESS_SENT_HISTORY];
    size_t sent_count, sent_next, unstamped;
    ces_lsn_t torn[CES_LATENESS_TORN_HISTORY]; /* a ring of the last torn transactions */
    size_t torn_count, torn_next;
    int64_t last_warning_ms; /* the warnings about late events are rate-limited */
    uint64_t unreported;     /* late events since the last warning */
} ces_lateness_t;

/* Nothing sent yet, the window at start_ms (order/window.h for the rest). */
void ces_lateness_init(ces_lateness_t *late, int64_t start_ms, int64_t max_ms, bool adaptive);

/* The effective reorder window. */
int64_t ces_lateness_window_ms(const ces_lateness_t *late);

/* A transaction at or before lsn went to PostgreSQL already (one comparison). */
bool ces_lateness_sent_by(const ces_lateness_t *late, ces_lsn_t lsn);

/*
 * Is an event of commit LSN lsn, from source, too late to join its transaction (one at or before it
 * went to PostgreSQL already, while its partition was ours)? Returns false, or true with *torn_first
 * set when no late event of lsn was seen before. Cheap: one comparison for an event on time.
 */
bool ces_lateness_is_late(const ces_lateness_t *late, ces_partitions_t *partitions,
                          const ces_source_t *source, ces_lsn_t lsn, bool *torn_first);
/* A late event was taken in at now_ms (not a duplicate): remembers its transaction as torn, warns
 * (rate-limited) and adapts the window. */
void ces_lateness_late(ces_lateness_t *late, ces_partitions_t *partitions,
                       const ces_source_t *source, ces_lsn_t lsn, bool torn_first, int64_t now_ms);
/* Did an event of commit LSN lsn, not late, come after its transaction (or a later one) was released
 * into the batch being built? Then it cannot join that batch; if the batch goes to PostgreSQL before
 * the event is released, its transaction is torn, which the release decides (the item's
 * after_release). One comparison for an event on time. */
bool ces_lateness_after_release(const ces_lateness_t *late, ces_lsn_t lsn);
/* Such an event was taken in at now_ms: the window's bet was lost, and it grows as for a late
 * event that came at once. */
void ces_lateness_came_after_release(ces_lateness_t *late, ces_partitions_t *partitions,
                                     const ces_source_t *source, ces_lsn_t lsn, int64_t now_ms);
/* The transaction at lsn is torn, found so at now_ms as its events that came after its release go
 * into a batch after it was sent (torn_first: the first late event of it): remembered, and warned
 * about (rate-limited). */
void ces_lateness_torn(ces_lateness_t *late, const ces_source_t *source, ces_lsn_t lsn,
                       bool torn_first, int64_t now_ms);

/* The transaction at lsn went into the batch being built. */
void ces_lateness_released(ces_lateness_t *late, ces_lsn_t lsn);
/* The batch being built goes to PostgreSQL now: the transactions released into it are sent. */
void ces_lateness_sent(ces_lateness_t *late, int64_t now_ms);
/* Forgets what was sent (after going back to the stored positions, records are read again). */
void ces_lateness_forget(ces_lateness_t *late);
/* part was assigned to us now: what was sent before is no business of its events. */
void ces_lateness_assigned(const ces_lateness_t *late, ces_partition_t *part);
/* The passing of time: the window may shrink back (logged). */
/* The window an earlier writer of the stream last stored (ces_window_inherit); logs it when it
 * changes the window. */
void ces_lateness_inherit(ces_lateness_t *late, int64_t window_ms, int64_t now_ms);

void ces_lateness_tick(ces_lateness_t *late, int64_t now_ms);

#endif
