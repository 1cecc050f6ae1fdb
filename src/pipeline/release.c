/*
 * release: when held source transactions go into the batch (release.h).
 */
#include "pipeline/release.h"

#include <stdio.h>

#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/state.h"
#include "pipeline/stream.h"

void ces_release_partition_eof(ces_pipeline_t *p, const char *topic, int32_t partition,
                               int64_t eof_offset) {
    ces_partition_t *part = ces_partitions_get(p->partitions, topic, partition, false);
    if (part != NULL) {
        part->at_eof = true;
        part->eof_offset = eof_offset;
    }
}

/*
 * Caught up and quiet for the window. The end-of-partition event only says the partition was caught
 * up when it was fetched: if records arrived since (ces2pg was busy applying, or another partition
 * kept it reading), the feed's cached high watermark is past what was read, and the partition is
 * not quiet, however old its last record.
 */
static bool partition_quiet(const ces_pipeline_t *p, const ces_partition_t *part, int64_t now_ms,
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

/*
 * Is every partition we own past lsn (or caught up and quiet), so that no event of a transaction
 * at or before lsn can still arrive? With at_lsn, being at lsn is enough: then no older transaction
 * can come, and the one at lsn may be applied as it arrives, even before it is complete. With no
 * partition owned, nothing is ready (not vacuously).
 */
static bool all_partitions(ces_pipeline_t *p, ces_lsn_t lsn, bool at_lsn, int64_t now_ms) {
    int64_t window_ms = ces_lateness_window_ms(&p->late);
    size_t owned = 0;
    ces_partitions_iter_t it = {0};
    const ces_partition_t *part;
    while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
        if (!part->assigned)
            continue;
        owned++;
        if (part->has_frontier && ces_lsn_compare(part->frontier, lsn) >= (at_lsn ? 0 : 1))
            continue;
        if (!partition_quiet(p, part, now_ms, window_ms))
            return false;
    }
    return owned > 0;
}

/*
 * Moves the oldest held transaction (at lsn) into the batch. Its events that came after it (or a
 * later one) had been released into a batch, and before that batch went to PostgreSQL, were not
 * late when they came (ces_lateness_after_release): they are when that batch has gone since, and
 * the transaction is torn. Had the batch not gone yet, they join it, and nothing is torn.
 */
static int pop_oldest(ces_pipeline_t *p, ces_lsn_t lsn, int64_t now_ms) {
    size_t first = p->batch.count;
    if (ces_order_pop_oldest(p->order, &p->batch) < 0)
        return -1;
    if (!ces_lateness_sent_by(&p->late, lsn))
        return 0;
    for (size_t i = first; i < p->batch.count; i++) {
        ces_item_t *item = &p->batch.items[i];
        bool torn_first;
        if (item->after_release &&
            ces_lateness_is_late(&p->late, p->partitions, &item->source, lsn, &torn_first)) {
            item->late = true;
            item->torn = torn_first;
            ces_lateness_torn(&p->late, &item->source, lsn, torn_first, now_ms);
        }
    }
    return 0;
}

int ces_release_transactions(ces_pipeline_t *p, int64_t now_ms, bool drain) {
    if (p->order == NULL)
        return 0;
    if (p->stream.open && !p->stream.complete) {
        /* The streamed transaction's events are no longer held, so ask about its LSN directly. */
        p->stream.complete = drain || all_partitions(p, p->stream.lsn, false, now_ms);
        if (p->stream.complete)
            ces_lateness_released(&p->late, p->stream.lsn);
    }
    ces_lsn_t lsn;
    /* Whole transactions only: the batch may grow past its size by the last one. */
    while ((drain || !ces_pipeline_exceeds_batch(p, p->batch.count, p->batch.bytes)) &&
           ces_order_oldest(p->order, &lsn, NULL, NULL)) {
        if (!drain && !all_partitions(p, lsn, false, now_ms))
            break;
        if (p->batch.count == 0)
            p->batch_started_ms = now_ms;
        if (p->stream.open && ces_lsn_compare(lsn, p->stream.lsn) >= 0)
            p->stream.complete = true; /* ready at lsn means ready at the streamed one too */
        if (pop_oldest(p, lsn, now_ms) < 0)
            return -1;
        ces_lateness_released(&p->late, lsn);
    }
    return 0;
}

ces_release_stream_t ces_release_stream_next(ces_pipeline_t *p, int64_t now_ms, ces_lsn_t *lsn) {
    size_t events, bytes;
    if (p->order == NULL || p->stream.complete ||
        !ces_order_oldest(p->order, lsn, &events, &bytes) ||
        !ces_pipeline_exceeds_batch(p, events, bytes))
        return CES_RELEASE_STREAM_NONE;
    if (p->stream.open)
        return ces_lsn_compare(*lsn, p->stream.lsn) == 0 ? CES_RELEASE_STREAM_PART
                                                         : CES_RELEASE_STREAM_NONE;
    return all_partitions(p, *lsn, true, now_ms) ? CES_RELEASE_STREAM_START
                                                 : CES_RELEASE_STREAM_NONE;
}

int ces_release_stream_part(ces_pipeline_t *p, ces_lsn_t lsn, int64_t now_ms) {
    if (p->batch.count == 0)
        p->batch_started_ms = now_ms;
    return pop_oldest(p, lsn, now_ms);
}

/* A partition that holds back the oldest transaction is resumed at once, whatever the backlog: the
 * oldest transaction moves on while others are paused, and a paused partition it has overtaken
 * would otherwise wait for a backlog that cannot shrink until that partition moves. */
typedef enum { BOUND_PAUSE, BOUND_HOLD, BOUND_RESUME } bound_mode_t;

/* Where n stands against limit (0: none): 2 at or past it, 1 past half of it, 0 below. */
static int mark(size_t n, size_t limit) {
    if (limit == 0)
        return 0;
    return n >= limit ? 2 : n > limit / 2 ? 1 : 0;
}

void ces_release_bound_memory(ces_pipeline_t *p) {
    if (p->order == NULL || p->options.max_pending_events == 0)
        return;
    int events = mark(ces_order_pending_events(p->order), p->options.max_pending_events);
    int bytes = mark(ces_order_pending_bytes(p->order), p->options.max_pending_bytes);
    int worst = events > bytes ? events : bytes;
    bound_mode_t mode = BOUND_RESUME;
    if (worst == 2)
        mode = BOUND_PAUSE;
    else if (worst == 1)
        mode = BOUND_HOLD; /* between the marks: only needed partitions change */
    ces_lsn_t oldest = {0, 0};
    bool have_oldest = ces_order_oldest(p->order, &oldest, NULL, NULL);
    const ces_feed_t *feed = &p->feed;
    ces_partitions_iter_t it = {0};
    ces_partition_t *part;
    while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
        if (!part->assigned || feed->pause == NULL)
            continue;
        /* A partition that has not passed the oldest transaction must keep going, or nothing
         * moves. */
        bool needed = !have_oldest || !part->has_frontier ||
                      ces_lsn_compare(part->frontier, oldest) <= 0;
        bool want = !needed && (mode == BOUND_PAUSE || (mode == BOUND_HOLD && part->paused));
        if (want != part->paused &&
            feed->pause(feed->opaque, part->topic, part->partition, want) == 0)
            part->paused = want;
    }
}
