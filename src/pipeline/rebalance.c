/*
 * rebalance: the consumer's rebalance callbacks (pipeline.h), beside the loop: the consumer calls
 * them from inside the loop's poll of the feed, between two turns. They take in what was staged
 * under the old assignment, commit what is complete, and then take the partitions on or drop what
 * is held for them, calling the stages in turn as the loop does.
 */
#include "pipeline/pipeline.h"

#include <stdio.h>
#include <string.h>

#include "pipeline/flight.h"
#include "pipeline/intake.h"
#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/state.h"
#include "pipeline/stream.h"
#include "util/clock.h"
#include "util/log.h"

/* Records staged before a rebalance were read while the assignment was the old one: they are taken
 * in under it, as if each had been added when it was read. */
static int take_staged_before_rebalance(ces_pipeline_t *p) {
    if (!ces_intake_busy(p))
        return 0;
    ces_pipeline_status_t st = ces_intake_take(p, ces_clock_now_ms(), false, p->rebalance_error,
                                               sizeof(p->rebalance_error));
    if (st == CES_PIPELINE_OK)
        return 0;
    p->rebalance_status = st;
    ces_log_error("taking in the records read before a rebalance: %s", p->rebalance_error);
    return -1;
}

int ces_pipeline_on_assigned(void *opaque, const char *topic, const int32_t *partitions, size_t n,
                             int64_t *offsets) {
    ces_pipeline_t *p = opaque;
    char err[512];
    for (size_t i = 0; i < n; i++)
        offsets[i] = -1;
    if (take_staged_before_rebalance(p) != 0)
        return -1;
    /* The connection is needed below: finish the batch in flight first. */
    if (ces_flight_complete(p, err, sizeof(err)) == CES_PIPELINE_FATAL) {
        ces_log_error("committing before an assignment: %s", err);
        return -1;
    }
    if (p->apply != NULL && /* NULL only in unit tests of the ordering rules */
        ces_apply_read_positions(p->apply, topic, partitions, n, offsets, err, sizeof(err)) !=
            CES_APPLY_OK) {
        ces_log_error("reading stored positions of topic %s: %s", topic, err);
        return -1;
    }
    int64_t now = ces_clock_now_ms();
    for (size_t i = 0; i < n; i++) {
        ces_partition_t *part = ces_partitions_get(p->partitions, topic, partitions[i], true);
        if (part == NULL)
            return -1;
        ces_positions_on_assign(&part->pos, topic, partitions[i], offsets[i]);
        ces_lateness_assigned(&p->late, part);
        part->assigned = true;
        part->has_frontier = false;
        part->at_eof = false;
        part->paused = false;
        part->last_record_ms = now;
        offsets[i] = offsets[i] >= 0 ? offsets[i] : CES_OFFSET_UNSET;
    }
    return 0;
}

/* The partitions of one revocation: a source predicate. */
typedef struct {
    const char *topic;
    const int32_t *partitions;
    size_t n;
} revoked_t;

static bool is_revoked(void *arg, const ces_source_t *source) {
    const revoked_t *r = arg;
    for (size_t i = 0; i < r->n; i++) {
        if (r->partitions[i] == source->partition && strcmp(r->topic, source->topic) == 0)
            return true;
    }
    return false;
}

/* The partitions kept go back to their stored positions. Returns 0, or -1 when they could not
 * (the consumer then stops: a restart reads from the stored positions). */
static int rewind_before_revocation(ces_pipeline_t *p) {
    char err[512];
    if (ces_flight_rewind(p, err, sizeof(err)) == CES_PIPELINE_OK)
        return 0;
    ces_log_error("going back to the stored positions at a revocation: %s", err);
    return -1;
}

int ces_pipeline_on_revoked(void *opaque, const char *topic, const int32_t *partitions, size_t n) {
    ces_pipeline_t *p = opaque;
    char err[512];
    if (take_staged_before_rebalance(p) != 0)
        return -1;
    /* A source transaction streamed in part cannot be committed, and its other part may be read
     * by the partitions' next owner: it is rolled back (below). */
    bool abandon_stream = p->stream.open && !p->stream.complete;
    /* Commit what is complete while the partitions are still ours (the fence refuses it if they
     * are not), then forget them. */
    if (!abandon_stream && ces_flight_flush(p, err, sizeof(err)) == CES_PIPELINE_FATAL) {
        ces_log_error("committing before revocation: %s", err);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        ces_partition_t *part = ces_partitions_get(p->partitions, topic, partitions[i], false);
        if (part != NULL)
            ces_partitions_give_up(part);
    }
    /* What is held for the revoked partitions goes (their positions never passed it: the next
     * owner reads it again); what is held for the partitions we keep stays, and they read on. An
     * event joined from segments of a revoked partition and a kept one cannot be split: then
     * every partition goes back to its stored position. */
    if (abandon_stream) {
        char lsn[23];
        ces_lsn_format(p->stream.lsn, lsn);
        ces_log_info("partitions revoked while source transaction %s was streamed in part: "
                     "rolling it back, the partitions kept go back to their stored positions",
                     lsn);
        return rewind_before_revocation(p);
    }
    revoked_t r = {topic, partitions, n};
    long segments = ces_reasm_drop_sources(p->reasm, is_revoked, &r);
    long events = 0;
    if (segments >= 0 && p->order != NULL)
        events = ces_order_drop_sources(p->order, is_revoked, &r);
    if (segments < 0 || events < 0) {
        ces_log_info("a held event joins segments of a revoked partition and of one kept: going "
                     "back to the stored positions");
        return rewind_before_revocation(p);
    } else if (segments > 0 || events > 0) {
        ces_log_debug("revoked %zu partition(s) of %s: dropped %ld held event(s) and %ld segment "
                      "group(s) of theirs",
                      n, topic, events, segments);
    }
    return 0;
}

/* A consumer that goes without revoking (rebalance callbacks are not called for it): the same
 * forgetting a revocation of everything would do, without committing (pipeline.h). */
void ces_pipeline_forget(ces_pipeline_t *p) { ces_flight_forget(p); }
