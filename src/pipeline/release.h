/*
 * release: when held source transactions go into the batch (transaction mode), when one too large
 * for a batch is to be streamed, and which partitions stop fetching while too much is held (a stage
 * of the loop; docs/semantics.md, "Ordering and atomicity").
 *
 * The rule: the oldest held transaction goes when every owned partition has either delivered a
 * later commit (its frontier: CES keeps commit order within a partition for every partition scheme
 * but None) or is caught up with the broker and has been quiet for apply.reorder_window_ms.
 */
#ifndef CES_RELEASE_H
#define CES_RELEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "format/event.h"
#include "pipeline/pipeline.h"

/* The partition reached the end of what the broker holds (it is caught up), at eof_offset. */
void ces_release_partition_eof(ces_pipeline_t *p, const char *topic, int32_t partition,
                               int64_t eof_offset);

/* Releases the complete source transactions, oldest first, into the batch while it has room (every
 * held one, complete now, when drain: the input ended). Returns 0, or -1 when out of memory. */
int ces_release_transactions(ces_pipeline_t *p, int64_t now_ms, bool drain);

/* What to do about a source transaction too large for a batch (ces_release_stream_next). */
typedef enum {
    CES_RELEASE_STREAM_NONE,  /* nothing (none is too large, or it cannot go yet) */
    CES_RELEASE_STREAM_START, /* the oldest outgrew a batch and nothing older can come: open a
                               * PostgreSQL transaction for it, then release its next part */
    CES_RELEASE_STREAM_PART,  /* it is streamed already: release its next part */
} ces_release_stream_t;
/* Whether the oldest held transaction is to be streamed now, and its LSN in *lsn. */
ces_release_stream_t ces_release_stream_next(ces_pipeline_t *p, int64_t now_ms, ces_lsn_t *lsn);
/* Releases the part of the streamed transaction at lsn held now into the batch, which is to be sent
 * at once. Returns 0, or -1 when out of memory. */
int ces_release_stream_part(ces_pipeline_t *p, ces_lsn_t lsn, int64_t now_ms);

/* Keeps memory bounded: while too many events, or too many bytes of them, wait for ordering,
 * partitions that are not holding back the oldest transaction stop fetching; they resume once the
 * backlog has halved. */
void ces_release_bound_memory(ces_pipeline_t *p);

#endif
