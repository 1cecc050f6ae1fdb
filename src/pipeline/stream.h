/*
 * stream: a source transaction too large for memory, streamed into one open PostgreSQL transaction
 * (docs/semantics.md), below the stages that share it: flight opens it (after committing what is
 * complete), sends its parts and commits or abandons it; release lets its parts go into the batch
 * and says when its last part is there; the rebalance callbacks roll it back.
 *
 * At most one is streamed at a time. Its parts are applied in the open transaction and count as
 * applied only once it commits. Touched by the loop's thread only.
 */
#ifndef CES_STREAM_H
#define CES_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "apply/apply.h"
#include "format/event.h"

typedef struct {
    bool open;                /* a source transaction is being streamed */
    bool complete;            /* its last events are in the batch: the next flush commits */
    ces_lsn_t lsn;            /* its commit LSN */
    ces_apply_stats_t stats;  /* what the open transaction holds, counted once committed */
} ces_stream_t;

/* Opens the PostgreSQL transaction for the source transaction at lsn (apply_stream_begin), which
 * outgrew a batch of max_events or max_bytes. Returns what apply said; on CES_APPLY_OK the stream
 * is open. */
ces_apply_status_t ces_stream_begin(ces_stream_t *stream, ces_apply_t *apply, ces_lsn_t lsn,
                                    size_t max_events, size_t max_bytes, char *errstr,
                                    size_t errstr_size);
/* A part that PostgreSQL accepted in the open transaction (not committed yet). */
void ces_stream_part_applied(ces_stream_t *stream, const ces_apply_stats_t *st);
/* A batch committed (last: what it applied itself): an open stream committed with it (logged),
 * and is closed. */
void ces_stream_committed(ces_stream_t *stream, const ces_apply_stats_t *last);
/* Rolls back any open transaction of the stream (ces_apply_stream_abort) and closes it. */
void ces_stream_abort(ces_stream_t *stream, ces_apply_t *apply);

#endif
