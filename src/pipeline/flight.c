/*
 * flight: the batch in flight, commits and rewinds (flight.h).
 */
#include "pipeline/flight.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/staging.h"
#include "pipeline/state.h"
#include "pipeline/stream.h"
#include "util/clock.h"
#include "util/log.h"

/* Adds the partition's position, held back by what is not yet applied, to the batch. Returns 0,
 * or -1 when out of memory. */
static int collect_position(ces_pipeline_t *p, ces_partition_t *part) {
    int64_t held = INT64_MAX, offset;
    if (ces_reasm_min_offset(p->reasm, part->topic, part->partition, &offset) && offset < held)
        held = offset;
    if (p->order != NULL && ces_order_min_offset(p->order, part->topic, part->partition, &offset) &&
        offset < held)
        held = offset;
    ces_position_update_t update;
    if (!ces_positions_to_store(&part->pos, part->topic, part->partition, held, &update))
        return 0;
    const ces_source_gap_t *gap = ces_positions_gap_to_store(&part->pos);
    if (ces_batch_set_position(&p->batch, &update) != 0 ||
        (gap != NULL && ces_batch_add_gap(&p->batch, gap) != 0))
        return -1;
    return 0;
}

/* What follows a batch that PostgreSQL accepted: committed, or (!commit) one part of a streamed
 * transaction. Clears batch. */
static void batch_applied(ces_pipeline_t *p, ces_batch_t *batch, const ces_apply_stats_t *st,
                          bool commit, int64_t started_ms) {
    if (p->options.on_applied != NULL)
        p->options.on_applied(p->options.on_applied_opaque, batch,
                              (double)(ces_clock_now_ms() - started_ms) / 1000.0);
    if (!commit) {
        ces_stream_part_applied(&p->stream, st);
        ces_batch_clear(batch);
        return;
    }
    p->stats.events_applied += st->events_applied + p->stream.stats.events_applied;
    p->stats.dead_letters += st->dead_letters + p->stream.stats.dead_letters;
    p->stats.batches++;
    ces_stream_committed(&p->stream, st);
    if (p->order != NULL)
        ces_order_committed(p->order, batch);
    for (size_t i = 0; i < batch->npositions; i++) {
        const ces_position_update_t *o = &batch->positions[i];
        ces_partition_t *part = ces_partitions_get(p->partitions, o->topic, o->partition, false);
        if (part != NULL)
            ces_positions_on_commit(&part->pos, o->next);
        if (p->feed.store_position != NULL)
            p->feed.store_position(p->feed.opaque, o->topic, o->partition, o->next);
    }
    ces_batch_clear(batch);
}

/* A batch PostgreSQL did not accept: FENCED and LOST go back to the stored positions. */
static ces_pipeline_status_t apply_failed(ces_pipeline_t *p, ces_apply_status_t rc, char *errstr,
                                          size_t errstr_size) {
    switch (rc) {
    case CES_APPLY_FENCED:
    case CES_APPLY_LOST:
        ces_log_warning("%s: going back to the positions stored in PostgreSQL", errstr);
        return ces_flight_rewind(p, errstr, errstr_size);
    case CES_APPLY_INTERRUPTED:
        return CES_PIPELINE_INTERRUPTED;
    default:
        return CES_PIPELINE_FATAL;
    }
}

/* Waits for the batch in flight. Committed, it is accounted for like any applied batch; rolled
 * back, it is dropped (its records are read again, after a rewind or a restart). */
static ces_apply_status_t land_in_flight(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    p->flying = false;
    ces_apply_stats_t st = {0};
    ces_apply_status_t rc = ces_apply_finish(p->apply, &st, errstr, errstr_size);
    if (p->order != NULL)
        ces_order_clear_in_flight(p->order);
    p->stats.retries += st.retries;
    if (rc == CES_APPLY_OK)
        batch_applied(p, &p->in_flight, &st, p->in_flight_commits, p->in_flight_started_ms);
    else
        ces_batch_clear(&p->in_flight);
    return rc;
}

ces_pipeline_status_t ces_flight_complete(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    if (!p->flying)
        return CES_PIPELINE_OK;
    ces_apply_status_t rc = land_in_flight(p, errstr, errstr_size);
    return rc == CES_APPLY_OK ? CES_PIPELINE_OK : apply_failed(p, rc, errstr, errstr_size);
}

bool ces_flight_ready(ces_pipeline_t *p) {
    if (!p->flying)
        return true;
    /* Memory stays bounded: a batch that has grown to twice its limits (in partition mode events
     * go straight into it) waits for PostgreSQL rather than grow on. */
    if (ces_pipeline_exceeds_batch(p, p->batch.count / 2, p->batch.bytes / 2))
        return true;
    return ces_apply_ready(p->apply);
}

/* The batch in flight becomes in_flight, where ces_apply_send keeps pointing until it is finished;
 * the emptied in_flight, with its arrays, becomes the next batch. */
static ces_pipeline_status_t send_in_flight(ces_pipeline_t *p, bool commit, int64_t started_ms,
                                            char *errstr, size_t errstr_size) {
    ces_batch_t next = p->in_flight;
    p->in_flight = p->batch;
    p->batch = next;
    ces_apply_status_t rc = ces_apply_send(p->apply, &p->in_flight, errstr, errstr_size);
    if (rc != CES_APPLY_OK) {
        if (p->order != NULL)
            ces_order_clear_in_flight(p->order);
        ces_batch_clear(&p->in_flight);
        return apply_failed(p, rc, errstr, errstr_size);
    }
    p->flying = true;
    p->in_flight_started_ms = started_ms;
    p->in_flight_commits = commit;
    return CES_PIPELINE_OK;
}

/* Sends the batch (with the positions it covers) to PostgreSQL; with async, returns while
 * PostgreSQL executes it, to be completed by the next flush, send or complete. */
static ces_pipeline_status_t flush(ces_pipeline_t *p, bool async, char *errstr,
                                   size_t errstr_size) {
    ces_pipeline_status_t pst = ces_flight_complete(p, errstr, errstr_size);
    if (pst != CES_PIPELINE_OK)
        return pst;
    /* Inside a streamed transaction nothing is committed, so no position is stored, until its end. */
    bool commit = !p->stream.open || p->stream.complete;
    if (p->options.store_positions && commit) {
        int failed = 0;
        ces_partitions_iter_t it = {0};
        ces_partition_t *part;
        while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
            if (collect_position(p, part) != 0)
                failed = 1;
        }
        if (failed) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_PIPELINE_FATAL;
        }
    }
    if (p->batch.count == 0 && p->batch.npositions == 0 && !(p->stream.open && commit))
        return CES_PIPELINE_OK;
    int64_t started_ms = ces_clock_now_ms();
    ces_lateness_sent(&p->late, started_ms);
    p->batch.retrying = p->options.retry_dead_letters;
    p->batch.reorder_window_ms = p->order != NULL ? ces_lateness_window_ms(&p->late) : -1;
    /* The last part of a streamed transaction commits it: that one waits. */
    if (async && !(p->stream.open && commit) &&
        (p->order == NULL || ces_order_set_in_flight(p->order, &p->batch) == 0))
        return send_in_flight(p, commit, started_ms, errstr, errstr_size);
    ces_apply_stats_t st = {0};
    ces_apply_status_t rc =
        p->stream.open && commit
            ? ces_apply_stream_commit(p->apply, &p->batch, &st, errstr, errstr_size)
            : ces_apply_batch(p->apply, &p->batch, &st, errstr, errstr_size);
    p->stats.retries += st.retries;
    if (rc != CES_APPLY_OK)
        return apply_failed(p, rc, errstr, errstr_size);
    batch_applied(p, &p->batch, &st, commit, started_ms);
    return CES_PIPELINE_OK;
}

ces_pipeline_status_t ces_flight_flush(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    return flush(p, false, errstr, errstr_size);
}

ces_pipeline_status_t ces_flight_send(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    return flush(p, p->apply != NULL, errstr, errstr_size);
}

ces_pipeline_status_t ces_flight_begin_stream(ces_pipeline_t *p, ces_lsn_t lsn, char *errstr,
                                              size_t errstr_size) {
    /* Commit what is complete before the long transaction opens. */
    ces_pipeline_status_t st = ces_flight_flush(p, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    switch (ces_stream_begin(&p->stream, p->apply, lsn, p->options.batch_max_events,
                             p->options.batch_max_bytes, errstr, errstr_size)) {
    case CES_APPLY_OK:
        break;
    case CES_APPLY_INTERRUPTED:
        return CES_PIPELINE_INTERRUPTED;
    case CES_APPLY_FATAL:
        return CES_PIPELINE_FATAL;
    default:
        ces_log_warning("%s: going back to the positions stored in PostgreSQL", errstr);
        return ces_flight_rewind(p, errstr, errstr_size);
    }
    return CES_PIPELINE_OK;
}

/* Sends the partition back to the position PostgreSQL holds. Returns 0, or -1 when that could not
 * be read (*status says why, errstr too) or the feed could not seek (*status CES_APPLY_OK). */
static int rewind_partition(ces_pipeline_t *p, ces_partition_t *part, ces_apply_status_t *status,
                            char *errstr, size_t errstr_size) {
    int64_t stored;
    *status = ces_apply_read_positions(p->apply, part->topic, &part->partition, 1, &stored, errstr,
                                     errstr_size);
    if (*status != CES_APPLY_OK)
        return -1;
    int64_t target = ces_positions_on_rewind(&part->pos, stored);
    part->has_frontier = false; /* what it delivered is read again */
    part->at_eof = false;
    const ces_feed_t *feed = &p->feed;
    if (feed->seek != NULL && feed->seek(feed->opaque, part->topic, part->partition, target) != 0)
        return -1;
    return 0;
}

/* Drops everything read and not committed: records staged, the batch in flight (landed first:
 * the positions read afterwards account for it), held transactions and segments, a streamed
 * transaction. */
static void drop_uncommitted(ces_pipeline_t *p) {
    char why[256];
    ces_staging_drop(p);
    /* Whether it commits or not, the positions read below account for it. */
    if (p->flying && land_in_flight(p, why, sizeof(why)) != CES_APPLY_OK)
        ces_log_debug("the batch in flight was not applied: %s", why);
    ces_batch_clear(&p->batch);
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(p->reasm)) != NULL)
        ces_reasm_group_free(g);
    ces_reasm_forget_completed(p->reasm);
    if (p->order != NULL)
        ces_order_reset(p->order);
    ces_lateness_forget(&p->late);
    ces_stream_abort(&p->stream, p->apply);
}

void ces_flight_forget(ces_pipeline_t *p) {
    drop_uncommitted(p);
    ces_partitions_iter_t it = {0};
    ces_partition_t *part;
    while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
        if (part->assigned)
            ces_partitions_give_up(part);
    }
}

ces_pipeline_status_t ces_flight_rewind(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    /* Records read ahead are read again from the positions below. */
    drop_uncommitted(p);
    ces_partitions_iter_t it = {0};
    ces_partition_t *part;
    while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
        ces_apply_status_t status;
        if (!part->pos.has_next || rewind_partition(p, part, &status, errstr, errstr_size) == 0)
            continue;
        if (status == CES_APPLY_INTERRUPTED)
            return CES_PIPELINE_INTERRUPTED;
        if (status == CES_APPLY_OK)
            snprintf(errstr, errstr_size, "could not seek back to the stored positions");
        return CES_PIPELINE_FATAL;
    }
    return CES_PIPELINE_OK;
}
