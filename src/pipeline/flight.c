/*
 * flight: batches to PostgreSQL and what follows their commit (docs/semantics.md, "Delivery").
 *
 * At most one batch is in flight: sent through the apply door without waiting, PostgreSQL executes
 * it while the loop reads and decodes the next one. Its positions are stored (in PostgreSQL, inside
 * its transaction, fenced; then in Kafka for monitoring) and its events count as applied only once
 * it has committed. A batch that cannot be applied (fenced by another instance, or a streamed
 * transaction lost with its connection) sends every partition back to the position PostgreSQL
 * holds, dropping whatever is held in memory: it is read again.
 */
#include "pipeline/pipeline_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

typedef struct {
    ces_pipeline_t *p;
    int failed;
} collect_t;

/* Adds the partition's position, held back by what is not yet applied, to the batch. */
static void collect_position(void *value, void *arg) {
    collect_t *c = arg;
    partition_t *part = value;
    ces_pipeline_t *p = c->p;
    int64_t held = INT64_MAX, offset;
    if (ces_reasm_min_offset(p->reasm, part->topic, part->partition, &offset) && offset < held)
        held = offset;
    if (p->order != NULL && ces_order_min_offset(p->order, part->topic, part->partition, &offset) &&
        offset < held)
        held = offset;
    ces_offset_update_t update;
    if (!ces_positions_to_store(&part->pos, part->topic, part->partition, held, &update))
        return;
    const ces_source_gap_t *gap = ces_positions_gap_to_store(&part->pos);
    if (ces_batch_set_offset(&p->batch, &update) != 0 ||
        (gap != NULL && ces_batch_add_gap(&p->batch, gap) != 0))
        c->failed = 1;
}

/* What follows a batch that PostgreSQL accepted: committed, or (!commit) one part of a streamed
 * transaction. Clears batch. */
static void batch_applied(ces_pipeline_t *p, ces_batch_t *batch, const ces_apply_stats_t *st,
                          bool commit, int64_t started_ms) {
    if (p->options.on_applied != NULL)
        p->options.on_applied(p->options.on_applied_opaque, batch,
                              (double)(ces_clock_now_ms() - started_ms) / 1000.0);
    if (!commit) {
        p->stream_stats.events_applied += st->events_applied;
        p->stream_stats.dead_letters += st->dead_letters;
        ces_batch_clear(batch);
        return;
    }
    p->stats.events_applied += st->events_applied + p->stream_stats.events_applied;
    p->stats.dead_letters += st->dead_letters + p->stream_stats.dead_letters;
    p->stats.batches++;
    if (p->streaming)
        ces_log_info("large source transaction committed (%llu events in its PostgreSQL transaction)",
                     (unsigned long long)(st->events_applied + p->stream_stats.events_applied));
    p->streaming = false;
    p->stream_complete = false;
    memset(&p->stream_stats, 0, sizeof(p->stream_stats));
    if (p->order != NULL)
        ces_order_committed(p->order, batch);
    for (size_t i = 0; i < batch->noffsets; i++) {
        const ces_offset_update_t *o = &batch->offsets[i];
        partition_t *part = ces_pipeline_partition(p, o->topic, o->partition, false);
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
    bool commit = !p->streaming || p->stream_complete;
    if (p->options.store_offsets && commit) {
        collect_t c = {p, 0};
        ces_map_each(p->partitions, collect_position, &c);
        if (c.failed) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_PIPELINE_FATAL;
        }
    }
    if (p->batch.count == 0 && p->batch.noffsets == 0 && !(p->streaming && commit))
        return CES_PIPELINE_OK;
    int64_t started_ms = ces_clock_now_ms();
    ces_release_sent(p, started_ms);
    p->batch.retrying = p->options.retry_dead_letters;
    p->batch.reorder_window_ms = p->order != NULL ? ces_window_ms(&p->late.window) : -1;
    /* The last part of a streamed transaction commits it: that one waits. */
    if (async && !(p->streaming && commit) &&
        (p->order == NULL || ces_order_set_in_flight(p->order, &p->batch) == 0))
        return send_in_flight(p, commit, started_ms, errstr, errstr_size);
    ces_apply_stats_t st = {0};
    ces_apply_status_t rc =
        p->streaming && commit
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
    switch (ces_apply_stream_begin(p->apply, errstr, errstr_size)) {
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
    char text[23];
    ces_lsn_format(lsn, text);
    ces_log_info("source transaction %s is larger than a batch (%zu events or %zu bytes): "
                 "streaming it into one PostgreSQL transaction",
                 text, p->options.batch_max_events, p->options.batch_max_bytes);
    p->streaming = true;
    p->stream_lsn = lsn;
    return CES_PIPELINE_OK;
}

typedef struct {
    ces_pipeline_t *p;
    int failed;
    char *errstr;
    size_t errstr_size;
    ces_apply_status_t status;
} rewind_t;

static void rewind_partition(void *value, void *arg) {
    rewind_t *r = arg;
    partition_t *part = value;
    const ces_feed_t *feed = &r->p->feed;
    if (r->failed || !part->pos.has_next)
        return;
    int64_t stored;
    r->status = ces_apply_read_offsets(r->p->apply, part->topic, &part->partition, 1, &stored,
                                       r->errstr, r->errstr_size);
    if (r->status != CES_APPLY_OK) {
        r->failed = 1;
        return;
    }
    int64_t target = ces_positions_on_rewind(&part->pos, stored);
    part->has_frontier = false; /* what it delivered is read again */
    part->at_eof = false;
    if (feed->seek != NULL && feed->seek(feed->opaque, part->topic, part->partition, target) != 0)
        r->failed = 1;
}

ces_pipeline_status_t ces_flight_rewind(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    char why[256];
    /* Records read ahead are read again from the positions below. */
    ces_intake_drop(p);
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
    ces_release_forget(p);
    ces_apply_stream_abort(p->apply);
    p->streaming = false;
    p->stream_complete = false;
    memset(&p->stream_stats, 0, sizeof(p->stream_stats));
    rewind_t r = {p, 0, errstr, errstr_size, CES_APPLY_OK};
    ces_map_each(p->partitions, rewind_partition, &r);
    if (r.failed) {
        if (r.status == CES_APPLY_INTERRUPTED)
            return CES_PIPELINE_INTERRUPTED;
        if (r.status == CES_APPLY_OK)
            snprintf(errstr, errstr_size, "could not seek back to the stored positions");
        return CES_PIPELINE_FATAL;
    }
    return CES_PIPELINE_OK;
}
