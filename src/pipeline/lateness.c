/*
 * lateness: late events, torn transactions and the reorder window's bet (lateness.h).
 */
#include "pipeline/lateness.h"

#include <stdio.h>
#include <string.h>

#include "util/log.h"

#define SENT_HISTORY CES_LATENESS_SENT_HISTORY
#define TORN_HISTORY CES_LATENESS_TORN_HISTORY

/* At most one warning about late events this often; the ones in between are counted in it. */
#define LATE_WARNING_INTERVAL_MS 10000

void ces_lateness_init(ces_lateness_t *l, int64_t start_ms, int64_t max_ms, bool adaptive) {
    memset(l, 0, sizeof(*l));
    ces_window_init(&l->window, start_ms, max_ms, adaptive);
}

int64_t ces_lateness_window_ms(const ces_lateness_t *l) { return ces_window_ms(&l->window); }

bool ces_lateness_sent_by(const ces_lateness_t *l, ces_lsn_t lsn) {
    return l->has_sent && ces_lsn_compare(lsn, l->sent_max) <= 0;
}

bool ces_lateness_is_late(const ces_lateness_t *l, ces_partitions_t *partitions,
                          const ces_source_t *source, ces_lsn_t lsn, bool *torn_first) {
    if (!ces_lateness_sent_by(l, lsn))
        return false;
    /* A partition assigned after those transactions went (a rebalance) brings its events of them
     * only now: they were the previous owner's to apply (a transaction spanning two instances is
     * applied in parts by design), and no window of ours would have waited for them. */
    const ces_partition_t *part =
        ces_partitions_get(partitions, source->topic, source->partition, false);
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
static const ces_lateness_sent_t *sent_entry(const ces_lateness_t *l, ces_lsn_t lsn, bool sent) {
    const ces_lateness_sent_t *found = NULL;
    size_t skip = sent ? l->unstamped : 0;
    for (size_t k = 0; k < l->sent_count - skip; k++) {
        const ces_lateness_sent_t *s =
            &l->sent[(l->sent_next + SENT_HISTORY - skip - 1 - k) % SENT_HISTORY];
        if (ces_lsn_compare(s->lsn, lsn) < 0)
            break;
        found = s;
    }
    return found;
}

/* Grows the window (when that helps) for an event of lsn that came lateness ms after its
 * transaction went to PostgreSQL (0: after it was released, before it was sent), released with the
 * window at then. */
static void grow_window(ces_lateness_t *l, ces_partitions_t *partitions,
                        const ces_source_t *source, ces_lsn_t lsn, int64_t lateness, int64_t then,
                        int64_t now) {
    /* A partition that delivered a later commit before this event keeps no commit order (the
     * None partition scheme): no window would have held the transaction for it. */
    const ces_partition_t *part =
        ces_partitions_get(partitions, source->topic, source->partition, false);
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
static void note_torn(ces_lateness_t *l, const ces_source_t *source, ces_lsn_t lsn,
                      bool torn_first, int64_t lateness, int64_t now) {
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

void ces_lateness_late(ces_lateness_t *l, ces_partitions_t *partitions,
                       const ces_source_t *source, ces_lsn_t lsn, bool torn_first, int64_t now) {
    const ces_lateness_sent_t *sent = sent_entry(l, lsn, true);
    /* Older than what is remembered: at least as late as the oldest remembered. */
    if (sent == NULL && l->sent_count > l->unstamped)
        sent = &l->sent[(l->sent_next + SENT_HISTORY - l->sent_count) % SENT_HISTORY];
    int64_t lateness = sent ? now - sent->sent_ms : 0;
    int64_t then = sent ? sent->window_ms : ces_window_ms(&l->window);
    note_torn(l, source, lsn, torn_first, lateness, now);
    grow_window(l, partitions, source, lsn, lateness, then, now);
}

bool ces_lateness_after_release(const ces_lateness_t *l, ces_lsn_t lsn) {
    return l->has_released && ces_lsn_compare(lsn, l->released_max) <= 0 &&
           (!l->has_sent || ces_lsn_compare(lsn, l->sent_max) > 0);
}

void ces_lateness_came_after_release(ces_lateness_t *l, ces_partitions_t *partitions,
                                     const ces_source_t *source, ces_lsn_t lsn, int64_t now) {
    /* The window it was released under: the events of one episode grow the window once. */
    const ces_lateness_sent_t *released = sent_entry(l, lsn, false);
    grow_window(l, partitions, source, lsn, 0,
                released ? released->window_ms : ces_window_ms(&l->window), now);
}

void ces_lateness_torn(ces_lateness_t *l, const ces_source_t *source, ces_lsn_t lsn,
                       bool torn_first, int64_t now) {
    note_torn(l, source, lsn, torn_first, -1, now);
}

void ces_lateness_released(ces_lateness_t *l, ces_lsn_t lsn) {
    /* A late transaction is released out of order: it adds nothing to what was sent. */
    if (l->has_released && ces_lsn_compare(lsn, l->released_max) <= 0)
        return;
    l->has_released = true;
    l->released_max = lsn;
    l->sent[l->sent_next] = (ces_lateness_sent_t){lsn, 0, ces_window_ms(&l->window)};
    l->sent_next = (l->sent_next + 1) % SENT_HISTORY;
    if (l->sent_count < SENT_HISTORY)
        l->sent_count++;
    if (l->unstamped < SENT_HISTORY)
        l->unstamped++;
}

void ces_lateness_sent(ces_lateness_t *l, int64_t now_ms) {
    if (!l->has_released)
        return;
    for (size_t k = 0; k < l->unstamped; k++)
        l->sent[(l->sent_next + SENT_HISTORY - 1 - k) % SENT_HISTORY].sent_ms = now_ms;
    l->unstamped = 0;
    l->has_sent = true;
    l->sent_max = l->released_max;
}

void ces_lateness_forget(ces_lateness_t *l) {
    l->has_released = l->has_sent = false;
    l->sent_count = l->sent_next = l->unstamped = 0;
}

void ces_lateness_assigned(const ces_lateness_t *l, ces_partition_t *part) {
    part->has_late_floor = l->has_sent;
    part->late_floor = l->sent_max;
}

void ces_lateness_inherit(ces_lateness_t *l, int64_t window_ms, int64_t now_ms) {
    int64_t before = ces_window_ms(&l->window);
    if (ces_window_inherit(&l->window, window_ms, now_ms))
        ces_log_info("reorder window: %lld ms -> %lld ms, as the stream's last writer left it",
                     (long long)before, (long long)ces_window_ms(&l->window));
}

void ces_lateness_tick(ces_lateness_t *l, int64_t now_ms) {
    int64_t before = ces_window_ms(&l->window);
    if (ces_window_tick(&l->window, now_ms))
        ces_log_info("reorder window: %lld ms -> %lld ms (no late event for %lld s)",
                     (long long)before, (long long)ces_window_ms(&l->window),
                     (long long)(now_ms - l->window.last_late_ms) / 1000);
}
