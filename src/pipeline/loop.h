/*
 * loop: when to read, decode, release, send and complete (docs/architecture.md, "The loop"). The
 * loop calls the stages in turn: intake (records in), release (held transactions into the batch),
 * flight (the batch to PostgreSQL); ces_pipeline_run (pipeline.h) is its door.
 */
#ifndef CES_LOOP_H
#define CES_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/pipeline.h"

/* True when the batch is full or batch_max_ms old. */
bool ces_loop_due(const ces_pipeline_t *p, int64_t now_ms);
/* True when an open batch has waited long enough that a pause in arrivals should apply it. */
bool ces_loop_settled(const ces_pipeline_t *p, int64_t now_ms);
/* How long to wait for the next record, at most max_ms. */
int ces_loop_wait_ms(const ces_pipeline_t *p, int64_t now_ms, int max_ms);
/* What the clock does at the start of a turn: gives up segment groups that timed out, releases the
 * source transactions that are complete into the batch, streams one too large for a batch, pauses
 * or resumes partitions to keep memory bounded, and lets the reorder window shrink back. */
ces_pipeline_status_t ces_loop_tick(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                    size_t errstr_size);

#endif
