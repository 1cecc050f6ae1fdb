/*
 * state: the pipeline room's shared state, struct ces_pipeline_s (made and freed by pipeline.c).
 * Private to the room's files and their unit tests; nothing outside src/pipeline includes it.
 *
 * It is touched by the thread that runs the loop only, except a stage's records while the decoding
 * team works on them (staging.h). Each part belongs to the module named beside it: the others read
 * it, and change it through that module.
 */
#ifndef CES_PIPELINE_STATE_H
#define CES_PIPELINE_STATE_H

#include "apply/apply.h"
#include "order/order.h"
#include "order/reasm.h"
#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/pipeline.h"
#include "pipeline/staging.h"
#include "pipeline/stream.h"
#include "util/team.h"

struct ces_pipeline_s {
    ces_pipeline_options_t options;
    ces_decoder_t *decoder;
    ces_apply_t *apply;
    ces_feed_t feed; /* all NULL until ces_pipeline_set_feed */
    ces_reasm_t *reasm;
    ces_order_t *order;          /* transaction mode only */
    ces_partitions_t *partitions; /* partitions.h */
    ces_batch_t batch;
    int64_t batch_started_ms;
    /* The batch PostgreSQL is applying while the next one is read (flight.c). */
    ces_batch_t in_flight;
    bool flying;
    int64_t in_flight_started_ms;
    bool in_flight_commits; /* false: a part of the streamed transaction */
    unsigned adds; /* records taken in: every few, libpq is given the chance to send more */
    /* Stages used in turn (staging.h): stages[fill_index] takes ces_intake_stage's records, and the
     * ndecoding before it (oldest first) are handed to the team and not taken in yet. */
    stage_t stages[STAGE_DEPTH];
    size_t fill_index;
    size_t ndecoding;
    /* Arenas whole events were decoded in, emptied: the next records are decoded in them (a
     * record's JSON trees need several blocks, which would be malloc'ed and freed each time). */
    ces_arena_t *spares[STAGE_DEPTH * STAGE_RECORDS];
    size_t nspares;
    size_t spare_bytes; /* their footprints, at most SPARE_BYTES */
    /* Decoding threads besides the loop's, each with a decoder of its own. */
    ces_team_t *team;
    ces_decoder_t **helper_decoders;
    size_t nhelpers;
    ces_pipeline_stats_t stats;
    ces_stream_t stream; /* a source transaction too large for memory (stream.h) */
    ces_lateness_t late; /* transaction mode (lateness.h) */
    /* A rebalance callback could not take in the records staged before it (a source gap among
     * them, with kafka.on_source_gap = "stop", or a failure): the consumer then stops with a
     * generic error, and the loop ends with this status and message instead (rebalance.c). */
    ces_pipeline_status_t rebalance_status;
    char rebalance_error[1024];
};

/* ---- pipeline.c, besides the door (pipeline.h) ---- */

/* events and bytes (of arenas) reach a batch's limits (apply.batch_max_events or _bytes). */
bool ces_pipeline_exceeds_batch(const ces_pipeline_t *p, size_t events, size_t bytes);
/* The batch being built: what the next flush would apply (unit tests and diagnostics). */
size_t ces_pipeline_batch_events(const ces_pipeline_t *p);
const ces_item_t *ces_pipeline_batch_item(const ces_pipeline_t *p, size_t i);

/* Gives a record's handle back to the feed. */
static inline void ces_staging_give_back(ces_pipeline_t *p, void *handle) {
    if (handle != NULL && p->feed.give_back != NULL)
        p->feed.give_back(p->feed.opaque, handle);
}

#endif
