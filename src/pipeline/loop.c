/*
 * loop: the one loop of ces2pg, for the daemon and replay alike. It decides when to read records,
 * decode them, release held transactions, send a batch and complete the one in flight
 * (docs/architecture.md, "The loop").
 *
 * A turn: release what the clock allows (segment timeouts, held transactions, pausing); send the
 * batch when it is due and PostgreSQL has finished the one before; read the records the feed
 * already holds, as many as the pipeline has room for, into a stage that the decoding threads
 * work on while this thread takes in the stages before it that are decoded; then, when nothing
 * more arrived, apply the open batch once it has settled, or complete the batch in flight. A batch
 * is applied when it is full, when it is batch_max_ms old, or at the first pause in arrivals once
 * it has been open for a few milliseconds: a trickle is applied at once, a backlog in full batches
 * while the next one is read.
 */
#include "pipeline/loop.h"

#include <stdio.h>

#include "pipeline/flight.h"
#include "pipeline/intake.h"
#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/release.h"
#include "pipeline/staging.h"
#include "pipeline/state.h"
#include "pipeline/stream.h"
#include "util/clock.h"
#include "util/log.h"

/* How often an idle loop checks that its PostgreSQL connection is still there (for /readyz). */
#define PG_CHECK_MS 1000

/* How long an open batch waits for more records before a pause in arrivals applies it. Under a
 * backlog a batch fills while the one before it is in flight, so this matters for a trickle only,
 * where it is most of the latency: keep it at a few milliseconds. */
#define SETTLE_MS 5

static int64_t settle_ms(const ces_pipeline_t *p) {
    return p->options.batch_max_ms < SETTLE_MS ? p->options.batch_max_ms : SETTLE_MS;
}

bool ces_loop_due(const ces_pipeline_t *p, int64_t now_ms) {
    if (ces_pipeline_exceeds_batch(p, p->batch.count, p->batch.bytes))
        return true;
    return p->batch.count > 0 && now_ms - p->batch_started_ms >= p->options.batch_max_ms;
}

bool ces_loop_settled(const ces_pipeline_t *p, int64_t now_ms) {
    return p->batch.count == 0 || now_ms - p->batch_started_ms >= settle_ms(p);
}

int ces_loop_wait_ms(const ces_pipeline_t *p, int64_t now_ms, int max_ms) {
    /* A batch in flight is completed as soon as nothing more is waiting in the feed. */
    if (p->flying && max_ms > 1)
        max_ms = 1;
    /* Held transactions are released by time (the reorder window): look again soon. */
    if (p->order != NULL && ces_order_pending_events(p->order) > 0 && max_ms > 10)
        max_ms = 10;
    if (p->batch.count == 0)
        return max_ms;
    int64_t age = now_ms - p->batch_started_ms;
    int64_t left = (age < settle_ms(p) ? settle_ms(p) : p->options.batch_max_ms) - age;
    if (left <= 0)
        return p->flying ? 1 : 0; /* due, but it waits for the batch in flight: do not spin */
    return left < max_ms ? (int)left : max_ms;
}

/* Something waits to be applied or stored. */
static bool pending(const ces_pipeline_t *p) {
    if (p->batch.count > 0)
        return true;
    ces_partitions_iter_t it = {0};
    const ces_partition_t *part;
    while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
        if (part->pos.dirty)
            return true;
    }
    return false;
}

/* Streams the oldest held transaction when it has outgrown a batch and nothing older can come:
 * opens its PostgreSQL transaction first (flight), then sends each part release lets go. */
static ces_pipeline_status_t stream_large_transaction(ces_pipeline_t *p, int64_t now_ms,
                                                      char *errstr, size_t errstr_size) {
    ces_lsn_t lsn;
    switch (ces_release_stream_next(p, now_ms, &lsn)) {
    case CES_RELEASE_STREAM_NONE:
        return CES_PIPELINE_OK;
    case CES_RELEASE_STREAM_START: {
        ces_pipeline_status_t st = ces_flight_begin_stream(p, lsn, errstr, errstr_size);
        if (st != CES_PIPELINE_OK || !p->stream.open)
            return st; /* or it went back to the stored positions */
        break;
    }
    case CES_RELEASE_STREAM_PART:
        break;
    }
    if (ces_release_stream_part(p, lsn, now_ms) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    /* Applied while the next part is read, like a full batch. */
    return ces_flight_send(p, errstr, errstr_size);
}

ces_pipeline_status_t ces_loop_tick(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                    size_t errstr_size) {
    if (ces_intake_expire(p, now_ms) != 0 || ces_release_transactions(p, now_ms, false) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    ces_pipeline_status_t st = stream_large_transaction(p, now_ms, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    ces_release_bound_memory(p);
    if (p->order != NULL)
        ces_lateness_tick(&p->late, now_ms);
    return CES_PIPELINE_OK;
}

/* The input ended: every incomplete segment group becomes dead letters, every held transaction
 * is complete and goes into the batch. */
static ces_pipeline_status_t drain(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                   size_t errstr_size) {
    if (ces_intake_give_up_all(p, now_ms) != 0 || ces_release_transactions(p, now_ms, true) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    return CES_PIPELINE_OK;
}

typedef struct {
    const ces_pipeline_hooks_t *hooks;
    int64_t last_pg_check_ms;
    bool ended; /* the feed said CES_POLL_END, and everything read is applied */
} loop_t;

static void turn_hook(const loop_t *loop, int64_t now_ms, bool waiting) {
    if (loop->hooks != NULL && loop->hooks->on_turn != NULL)
        loop->hooks->on_turn(loop->hooks->opaque, now_ms, waiting);
}

/*
 * Reads what the feed holds into the stage, as many records as the pipeline has room for, and
 * takes in what is staged. Only the first record may be waited for, and not while records read
 * before are still being decoded. Returns the last poll's status (CES_POLL_RECORD when the
 * pipeline had no room: records may wait, none was read) and, in *read, how many were read.
 */
static ces_poll_status_t read_records(ces_pipeline_t *p, int64_t now_ms, size_t *read,
                                      ces_record_t *rec, ces_pipeline_status_t *st, char *errstr,
                                      size_t errstr_size) {
    size_t room = ces_intake_room(p);
    bool decoding = ces_intake_busy(p);
    ces_poll_status_t ps = CES_POLL_RECORD;
    bool stage_full = false;
    *read = 0;
    while (*read < room && !stage_full) {
        int wait_ms =
            *read > 0 || decoding ? 0 : ces_loop_wait_ms(p, now_ms, p->options.poll_ms);
        ps = p->feed.poll(p->feed.opaque, wait_ms, rec, errstr, errstr_size);
        if (ps != CES_POLL_RECORD)
            break;
        stage_full = ces_intake_stage(p, rec);
        (*read)++;
    }
    /* A full stage means more records wait: they are decoded while the loop goes on, and taken
     * in with the next stage or as soon as no record is waiting. */
    bool read_on = ps == CES_POLL_RECORD && room > 0;
    if (*read > 0 || decoding)
        *st = ces_intake_take(p, ces_clock_now_ms(), read_on, errstr, errstr_size);
    return ps;
}

/* One turn of the loop. */
static ces_pipeline_status_t turn(ces_pipeline_t *p, loop_t *loop, int64_t now_ms, char *errstr,
                                  size_t errstr_size) {
    ces_pipeline_status_t st = ces_loop_tick(p, now_ms, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    /* A full batch goes to PostgreSQL without waiting: the next one is read meanwhile. While
     * PostgreSQL still executes the batch before it, records are read on (into the batch and
     * then held, both bounded) rather than waiting for it. */
    if (ces_loop_due(p, now_ms) && ces_flight_ready(p)) {
        if (p->flying)
            turn_hook(loop, now_ms, true); /* the send waits for the batch in flight */
        if ((st = ces_flight_send(p, errstr, errstr_size)) != CES_PIPELINE_OK)
            return st;
    }
    size_t read;
    ces_record_t rec;
    ces_poll_status_t ps = read_records(p, now_ms, &read, &rec, &st, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    switch (ps) {
    case CES_POLL_RECORD:
        return CES_PIPELINE_OK;
    case CES_POLL_FATAL:
        /* The feed stopped because a rebalance callback failed: the pipeline knows why (a source
         * gap ends with its own exit status). */
        if (p->rebalance_status != CES_PIPELINE_OK) {
            snprintf(errstr, errstr_size, "%s", p->rebalance_error);
            return p->rebalance_status;
        }
        return CES_PIPELINE_FATAL;
    case CES_POLL_END:
        /* Nothing more will come: held transactions are complete, incomplete segment groups are
         * dead letters now, and everything is applied. */
        loop->ended = true;
        if ((st = drain(p, ces_clock_now_ms(), errstr, errstr_size)) != CES_PIPELINE_OK)
            return st;
        return ces_flight_flush(p, errstr, errstr_size);
    case CES_POLL_EOF:
        st = ces_intake_check_resume(p, rec.topic, rec.partition, rec.offset, true, errstr,
                                     errstr_size);
        if (st != CES_PIPELINE_OK)
            return st;
        ces_release_partition_eof(p, rec.topic, rec.partition, rec.offset);
        break;
    case CES_POLL_OUT_OF_RANGE:
        st = ces_intake_out_of_range(p, rec.topic, rec.partition, rec.offset, errstr, errstr_size);
        if (st != CES_PIPELINE_OK)
            return st;
        break;
    case CES_POLL_IDLE:
        break;
    }
    bool proceed = ces_flight_ready(p);
    now_ms = ces_clock_now_ms();
    if (pending(p) && ces_loop_settled(p, now_ms)) {
        /* Nothing more arrived right now: apply what we have instead of waiting (once the batch
         * before it is done; it is completed when the next pause comes). */
        if (proceed)
            st = ces_flight_send(p, errstr, errstr_size);
    } else if (p->flying) {
        if (proceed)
            st = ces_flight_complete(p, errstr, errstr_size);
    } else if (ps == CES_POLL_IDLE && read == 0 && p->apply != NULL &&
               now_ms - loop->last_pg_check_ms >= PG_CHECK_MS) {
        /* Idle: notice a PostgreSQL that went away (or came back). */
        ces_apply_check(p->apply);
        loop->last_pg_check_ms = now_ms;
    }
    return st;
}

ces_pipeline_status_t ces_pipeline_run(ces_pipeline_t *p, const ces_pipeline_hooks_t *hooks,
                                       volatile sig_atomic_t *stop, char *errstr,
                                       size_t errstr_size) {
    loop_t loop = {.hooks = hooks, .last_pg_check_ms = ces_clock_now_ms()};
    ces_pipeline_status_t st = CES_PIPELINE_OK;
    while (st == CES_PIPELINE_OK && !loop.ended && !*stop) {
        int64_t now = ces_clock_now_ms();
        turn_hook(&loop, now, false);
        st = turn(p, &loop, now, errstr, errstr_size);
    }
    if ((st == CES_PIPELINE_FATAL || st == CES_PIPELINE_SOURCE_GAP) && p->flying) {
        /* What was sent before the failure is committed, as if it had been applied at once. */
        char why[256];
        if (ces_flight_complete(p, why, sizeof(why)) != CES_PIPELINE_OK)
            ces_log_error("the last batch sent: %s", why);
    }
    if (st == CES_PIPELINE_OK && !loop.ended) {
        /* A stop: what is complete is applied. */
        if (hooks != NULL && hooks->on_stopping != NULL)
            hooks->on_stopping(hooks->opaque);
        st = ces_flight_flush(p, errstr, errstr_size);
        if (st == CES_PIPELINE_OK)
            st = CES_PIPELINE_STOPPED;
    }
    /* Records read ahead and not taken in are read again after a restart, like anything not
     * committed; their handles go back to the feed now, before the feed goes. */
    ces_staging_drop(p);
    return st;
}
