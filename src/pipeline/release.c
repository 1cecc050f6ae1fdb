/*
 * release: when held source transactions go into the batch (transaction mode), when one too large
 * for a batch is streamed, and which partitions stop fetching while too much is held
 * (docs/semantics.md, "Ordering and atomicity").
 *
 * The rule: the oldest held transaction goes when every owned partition has either delivered a
 * later commit (its frontier: CES keeps commit order within a partition for every partition scheme
 * but None) or is caught up with the broker and has been quiet for apply.reorder_window_ms.
 */
#include "pipeline/pipeline_int.h"

#include <stdio.h>

#include "util/log.h"

/* At most one warning about late events this often; the ones in between are counted in it. */
#define LATE_WARNING_INTERVAL_MS 10000

bool ces_release_is_late(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                         bool *torn_first) {
    const lateness_t *l = &p->late;
    if (!l->has_sent || ces_lsn_compare(lsn, l->sent_max) > 0)
        return false;
    /* A partition assigned after those transactions went (a rebalance) brings its events of them
     * only now: they were the previous owner's to apply (a transaction spanning two instances is
     * applied in parts by design), and no window of ours would have waited for them. */
    const partition_t *part = ces_pipeline_partition(p, source->topic, source->partition, false);
    if (part != NULL && part->has_late_floor && ces_lsn_compare(lsn, part->late_floor) <= 0)
        return false;
    *torn_first = true;
    for (size_t i = 0; i < l->torn_count && *torn_first; i++)
        *torn_first = ces_lsn_compare(l->torn[i], lsn) != 0;
    return true;
}

/* The transaction at lsn, or when it was not released itself the first one after it: when it went
 * to PostgreSQL, and the window it was released under. Among those sent (sent), or among all
 * released. NULL when it is older than what is remembered. */
static const sent_t *sent_entry(const lateness_t *l, ces_lsn_t lsn, bool sent) {
    const sent_t *found = NULL;
    size_t skip = sent ? l->unstamped : 0;
    for (size_t k = 0; k < l->sent_count - skip; k++) {
        const sent_t *s = &l->sent[(l->sent_next + SENT_HISTORY - skip - 1 - k) % SENT_HISTORY];
        if (ces_lsn_compare(s->lsn, lsn) < 0)
            break;
        found = s;
    }
    return found;
}

/* Grows the window (when that helps) for an event of lsn that came lateness ms after its
 * transaction went to PostgreSQL (0: after it was released, before it was sent), released with the
 * window at then. */
static void grow_window(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                        int64_t lateness, int64_t then, int64_t now) {
    lateness_t *l = &p->late;
    /* A partition that delivered a later commit before this event keeps no commit order (the
     * None partition scheme): no window would have held the transaction for it. */
    const partition_t *part = ces_pipeline_partition(p, source->topic, source->partition, false);
    bool window_helps = part == NULL || !part->has_frontier ||
                        ces_lsn_compare(part->frontier, lsn) <= 0;
    int64_t before = ces_window_ms(&l->window);
    if (window_helps && ces_window_late(&l->window, lateness, then, now))
        ces_log_warning("reorder window: %lld ms -> %lld ms, to wait for events as late as the "
                        "last one (apply.reorder_window_max_ms = %lld)",
                        (long long)before, (long long)ces_window_ms(&l->window),
                        (long long)l->window.max_ms);
}

/* Remembers the transaction at lsn as torn (torn_first: the first late event of it) and warns,
 * rate-limited. lateness: how long after the transaction went to PostgreSQL the event came; -1
 * when it came before, but after the transaction had been released into a batch. */
static void note_torn(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                      bool torn_first, int64_t lateness, int64_t now) {
    lateness_t *l = &p->late;
    if (torn_first) {
        l->torn[l->torn_next] = lsn;
        l->torn_next = (l->torn_next + 1) % TORN_HISTORY;
        if (l->torn_count < TORN_HISTORY)
            l->torn_count++;
    }
    if (now - l->last_warning_ms < LATE_WARNING_INTERVAL_MS) {
        l->unreported++;
        return;
    }
    char text[23], when[64];
    ces_lsn_format(lsn, text);
    if (lateness >= 0)
        snprintf(when, sizeof(when), "%lld ms after", (long long)lateness);
    else
        snprintf(when, sizeof(when), "after it was released, and before");
    ces_log_warning("torn transaction: an event of source transaction %s came from %s[%d] %s "
                    "the transaction went to PostgreSQL without it; applied now (%llu more late "
                    "events since the last warning)",
                    text, source->topic, (int)source->partition, when,
                    (unsigned long long)l->unreported);
    l->last_warning_ms = now;
    l->unreported = 0;
}

void ces_release_late(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                      bool torn_first, int64_t now) {
    lateness_t *l = &p->late;
    const sent_t *sent = sent_entry(l, lsn, true);
    /* Older than what is remembered: at least as late as the oldest remembered. */
    if (sent == NULL && l->sent_count > l->unstamped)
        sent = &l->sent[(l->sent_next + SENT_HISTORY - l->sent_count) % SENT_HISTORY];
    int64_t lateness = sent ? now - sent->sent_ms : 0;
    int64_t then = sent ? sent->window_ms : ces_window_ms(&l->window);
    note_torn(p, source, lsn, torn_first, lateness, now);
    grow_window(p, source, lsn, lateness, then, now);
}

bool ces_release_after_release(const ces_pipeline_t *p, ces_lsn_t lsn) {
    const lateness_t *l = &p->late;
    return l->has_released && ces_lsn_compare(lsn, l->released_max) <= 0 &&
           (!l->has_sent || ces_lsn_compare(lsn, l->sent_max) > 0);
}

void ces_release_came_after_release(ces_pipeline_t *p, const ces_source_t *source,
                                    ces_lsn_t lsn, int64_t now) {
    /* The window it was released under: the events of one episode grow the window once. */
    const sent_t *released = sent_entry(&p->late, lsn, false);
    grow_window(p, source, lsn, 0,
                released ? released->window_ms : ces_window_ms(&p->late.window), now);
}

/* A transaction at lsn went into the batch being built. */
static void note_released(ces_pipeline_t *p, ces_lsn_t lsn) {
    lateness_t *l = &p->late;
    /* A late transaction is released out of order: it adds nothing to what was sent. */
    if (l->has_released && ces_lsn_compare(lsn, l->released_max) <= 0)
        return;
    l->has_released = true;
    l->released_max = lsn;
    l->sent[l->sent_next] = (sent_t){lsn, 0, ces_window_ms(&l->window)};
    l->sent_next = (l->sent_next + 1) % SENT_HISTORY;
    if (l->sent_count < SENT_HISTORY)
        l->sent_count++;
    if (l->unstamped < SENT_HISTORY)
        l->unstamped++;
}

void ces_release_assigned(ces_pipeline_t *p, partition_t *part) {
    part->has_late_floor = p->late.has_sent;
    part->late_floor = p->late.sent_max;
}

void ces_release_sent(ces_pipeline_t *p, int64_t now_ms) {
    lateness_t *l = &p->late;
    if (!l->has_released)
        return;
    for (size_t k = 0; k < l->unstamped; k++)
        l->sent[(l->sent_next + SENT_HISTORY - 1 - k) % SENT_HISTORY].sent_ms = now_ms;
    l->unstamped = 0;
    l->has_sent = true;
    l->sent_max = l->released_max;
}

void ces_release_forget(ces_pipeline_t *p) {
    lateness_t *l = &p->late;
    l->has_released = l->has_sent = false;
    l->sent_count = l->sent_next = l->unstamped = 0;
}

void ces_release_saw_commit(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn) {
    partition_t *part = ces_pipeline_partition(p, source->topic, source->partition, false);
    if (part != NULL && (!part->has_frontier || ces_lsn_compare(part->frontier, lsn) < 0)) {
        part->frontier = lsn;
        part->has_frontier = true;
    }
}

void ces_release_partition_eof(ces_pipeline_t *p, const char *topic, int32_t partition,
                               int64_t eof_offset) {
    partition_t *part = ces_pipeline_partition(p, topic, partition, false);
    if (part != NULL) {
        part->at_eof = true;
        part->eof_offset = eof_offset;
    }
}

/* Is every partition we own past lsn (or caught up and quiet), so that no event of a transaction
 * at or before lsn can still arrive? */
typedef struct {
    const ces_pipeline_t *p;
    ces_lsn_t lsn;
    int64_t now_ms;
    int64_t window_ms;
    bool ready;
    size_t owned; /* partitions assigned: with none, nothing is ready (not vacuously) */
} ready_scan_t;

/*
 * Caught up and quiet for the window. The end-of-partition event only says the partition was caught
 * up when it was fetched: if records arrived since (ces2pg was busy applying, or another partition
 * kept it reading), the feed's cached high watermark is past what was read, and the partition is
 * not quiet, however old its last record.
 */
static bool partition_quiet(const ces_pipeline_t *p, const partition_t *part, int64_t now_ms,
                            int64_t window_ms) {
    if (!part->at_eof || now_ms - part->last_record_ms < window_ms)
        return false;
    int64_t high;
    if (p->feed.high_watermark != NULL &&
        p->feed.high_watermark(p->feed.opaque, part->topic, part->partition, &high) == 0 &&
        high > (part->pos.has_next ? part->pos.next : part->eof_offset))
        return false;
    return true;
}

static void scan_ready(void *value, void *arg) {
    ready_scan_t *r = arg;
    const partition_t *part = value;
    if (!r->ready || !part->assigned)
        return;
    r->owned++;
    if (part->has_frontier && ces_lsn_compare(part->frontier, r->lsn) > 0)
        return;
    if (!partition_quiet(r->p, part, r->now_ms, r->window_ms))
        r->ready = false;
}

/* Is every owned partition at or past lsn (or quiet), so that no older transaction can come? Then
 * the transaction at lsn may be applied as it arrives, even before it is complete. */
static void scan_startable(void *value, void *arg) {
    ready_scan_t *r = arg;
    const partition_t *part = value;
    if (!r->ready || !part->assigned)
        return;
    r->owned++;
    if (part->has_frontier && ces_lsn_compare(part->frontier, r->lsn) >= 0)
        return;
    if (!partition_quiet(r->p, part, r->now_ms, r->window_ms))
        r->ready = false;
}

static bool all_partitions(const ces_pipeline_t *p, void (*scan)(void *, void *), ces_lsn_t lsn,
                           int64_t now_ms) {
    ready_scan_t r = {p, lsn, now_ms, ces_window_ms(&p->late.window), true, 0};
    ces_map_each(p->partitions, scan, &r);
    return r.ready && r.owned > 0;
}

/*
 * Moves the oldest held transaction (at lsn) into the batch. Its events that came after it (or a
 * later one) had been released into a batch, and before that batch went to PostgreSQL, were not
 * late when they came (ces_release_after_release): they are when that batch has gone since, and
 * the transaction is torn. Had the batch not gone yet, they join it, and nothing is torn.
 */
static int pop_oldest(ces_pipeline_t *p, ces_lsn_t lsn, int64_t now_ms) {
    size_t first = p->batch.count;
    if (ces_order_pop_oldest(p->order, &p->batch) < 0)
        return -1;
    if (!p->late.has_sent || ces_lsn_compare(lsn, p->late.sent_max) > 0)
        return 0;
    for (size_t i = first; i < p->batch.count; i++) {
        ces_item_t *item = &p->batch.items[i];
        bool torn_first;
        if (item->after_release && ces_release_is_late(p, &item->source, lsn, &torn_first)) {
            item->late = true;
            item->torn = torn_first;
            note_torn(p, &item->source, lsn, torn_first, -1, now_ms);
        }
    }
    return 0;
}

/* Moves every complete source transaction, oldest first, into the batch (every one when drain). */
static int release_transactions(ces_pipeline_t *p, int64_t now_ms, bool drain) {
    if (p->order == NULL)
        return 0;
    if (p->streaming && !p->stream_complete) {
        /* The streamed transaction's events are no longer held, so ask about its LSN directly. */
        p->stream_complete = drain || all_partitions(p, scan_ready, p->stream_lsn, now_ms);
        if (p->stream_complete)
            note_released(p, p->stream_lsn);
    }
    ces_lsn_t lsn;
    /* Whole transactions only: the batch may grow past its size by the last one. */
    while ((drain || !ces_pipeline_exceeds_batch(p, p->batch.count, p->batch.bytes)) &&
           ces_order_oldest(p->order, &lsn, NULL, NULL)) {
        if (!drain && !all_partitions(p, scan_ready, lsn, now_ms))
            break;
        if (p->batch.count == 0)
            p->batch_started_ms = now_ms;
        if (p->streaming && ces_lsn_compare(lsn, p->stream_lsn) >= 0)
            p->stream_complete = true; /* ready at lsn means ready at the streamed one too */
        if (pop_oldest(p, lsn, now_ms) < 0)
            return -1;
        note_released(p, lsn);
    }
    return 0;
}

/* Streams the oldest transaction when it has outgrown a batch and nothing older can come. */
static ces_pipeline_status_t stream_large_transaction(ces_pipeline_t *p, int64_t now_ms,
                                                      char *errstr, size_t errstr_size) {
    ces_lsn_t lsn;
    size_t events, bytes;
    if (p->order == NULL || p->stream_complete ||
        !ces_order_oldest(p->order, &lsn, &events, &bytes) ||
        !ces_pipeline_exceeds_batch(p, events, bytes))
        return CES_PIPELINE_OK;
    if (p->streaming) {
        if (ces_lsn_compare(lsn, p->stream_lsn) != 0)
            return CES_PIPELINE_OK;
    } else {
        if (!all_partitions(p, scan_startable, lsn, now_ms))
            return CES_PIPELINE_OK;
        ces_pipeline_status_t st = ces_flight_begin_stream(p, lsn, errstr, errstr_size);
        if (st != CES_PIPELINE_OK || !p->streaming)
            return st; /* or it went back to the stored positions */
    }
    if (p->batch.count == 0)
        p->batch_started_ms = now_ms;
    if (pop_oldest(p, lsn, now_ms) < 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    /* Applied while the next part is read, like a full batch. */
    return ces_flight_send(p, errstr, errstr_size);
}

/* Keeps memory bounded: while too many events, or too many bytes of them, wait for ordering,
 * partitions that are not holding back the oldest transaction stop fetching; they resume once the
 * backlog has halved. A partition that holds it back is resumed at once, whatever the backlog: the
 * oldest transaction moves on while others are paused, and a paused partition it has overtaken
 * would otherwise wait for a backlog that cannot shrink until that partition moves. */
typedef enum { BOUND_PAUSE, BOUND_HOLD, BOUND_RESUME } bound_mode_t;

typedef struct {
    ces_pipeline_t *p;
    bound_mode_t mode;
    bool have_oldest;
    ces_lsn_t oldest;
} pause_scan_t;

static void scan_pause(void *value, void *arg) {
    pause_scan_t *ps = arg;
    partition_t *part = value;
    const ces_feed_t *feed = &ps->p->feed;
    if (!part->assigned || feed->pause == NULL)
        return;
    /* A partition that has not passed the oldest transaction must keep going, or nothing moves. */
    bool needed = !ps->have_oldest || !part->has_frontier ||
                  ces_lsn_compare(part->frontier, ps->oldest) <= 0;
    bool want = !needed && (ps->mode == BOUND_PAUSE || (ps->mode == BOUND_HOLD && part->paused));
    if (want != part->paused && feed->pause(feed->opaque, part->topic, part->partition, want) == 0)
        part->paused = want;
}

/* Where n stands against limit (0: none): 2 at or past it, 1 past half of it, 0 below. */
static int mark(size_t n, size_t limit) {
    if (limit == 0)
        return 0;
    return n >= limit ? 2 : n > limit / 2 ? 1 : 0;
}

static void bound_memory(ces_pipeline_t *p) {
    if (p->order == NULL || p->options.max_pending_events == 0)
        return;
    int events = mark(ces_order_pending_events(p->order), p->options.max_pending_events);
    int bytes = mark(ces_order_pending_bytes(p->order), p->options.max_pending_bytes);
    int worst = events > bytes ? events : bytes;
    pause_scan_t ps = {p, BOUND_RESUME, false, {0, 0}};
    if (worst == 2)
        ps.mode = BOUND_PAUSE;
    else if (worst == 1)
        ps.mode = BOUND_HOLD; /* between the marks: only needed partitions change */
    ps.have_oldest = ces_order_oldest(p->order, &ps.oldest, NULL, NULL);
    ces_map_each(p->partitions, scan_pause, &ps);
}

ces_pipeline_status_t ces_release_tick(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                       size_t errstr_size) {
    if (ces_intake_expire(p, now_ms) != 0 || release_transactions(p, now_ms, false) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    ces_pipeline_status_t st = stream_large_transaction(p, now_ms, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    bound_memory(p);
    int64_t before = ces_window_ms(&p->late.window);
    if (p->order != NULL && ces_window_tick(&p->late.window, now_ms))
        ces_log_info("reorder window: %lld ms -> %lld ms (no late event for %lld s)",
                     (long long)before, (long long)ces_window_ms(&p->late.window),
                     (long long)(now_ms - p->late.window.last_late_ms) / 1000);
    return CES_PIPELINE_OK;
}

ces_pipeline_status_t ces_release_drain(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                        size_t errstr_size) {
    if (ces_intake_give_up_all(p, now_ms) != 0 || release_transactions(p, now_ms, true) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    return CES_PIPELINE_OK;
}
