/*
 * pipeline: the door of the room, the partition table and rebalances. See pipeline.h for the
 * room's files.
 */
#include "pipeline/pipeline_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

static void partition_free(void *value, void *arg) {
    (void)arg;
    partition_t *part = value;
    free(part->topic);
    free(part);
}

ces_pipeline_t *ces_pipeline_new(const ces_pipeline_options_t *options, ces_decoder_t *decoder,
                                 ces_apply_t *apply) {
    ces_pipeline_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->options = *options;
    p->decoder = decoder;
    p->apply = apply;
    ces_window_init(&p->late.window, options->reorder_window_ms, options->reorder_window_max_ms,
                    options->reorder_window_adaptive);
    p->reasm = ces_reasm_new(&options->reasm);
    p->partitions = ces_map_new();
    if (options->ordering == CES_ORDER_BY_TRANSACTION)
        p->order = ces_order_new(options->dedup_window);
    if (p->reasm == NULL || p->partitions == NULL ||
        (options->ordering == CES_ORDER_BY_TRANSACTION && p->order == NULL))
        goto fail;
    if (options->decode_threads > 1) {
        size_t n = options->decode_threads - 1;
        p->helper_decoders = calloc(n, sizeof(*p->helper_decoders));
        if (p->helper_decoders == NULL)
            goto fail;
        for (; p->nhelpers < n; p->nhelpers++) {
            p->helper_decoders[p->nhelpers] = ces_decoder_new(ces_decoder_limits(decoder));
            if (p->helper_decoders[p->nhelpers] == NULL)
                goto fail;
        }
        p->team = ces_team_new((void *const *)p->helper_decoders, n);
        if (p->team == NULL)
            goto fail;
    }
    return p;
fail:
    ces_pipeline_destroy(p);
    return NULL;
}

void ces_pipeline_destroy(ces_pipeline_t *p) {
    if (p == NULL)
        return;
    ces_intake_drop(p);
    ces_batch_clear(&p->batch);
    ces_batch_free(&p->batch);
    ces_batch_clear(&p->in_flight);
    ces_batch_free(&p->in_flight);
    ces_reasm_destroy(p->reasm);
    ces_order_destroy(p->order);
    if (p->partitions != NULL)
        ces_map_clear(p->partitions, partition_free, NULL);
    ces_map_destroy(p->partitions);
    for (size_t i = 0; i < p->nspares; i++)
        ces_arena_destroy(p->spares[i]);
    ces_team_destroy(p->team);
    for (size_t i = 0; i < p->nhelpers; i++)
        ces_decoder_destroy(p->helper_decoders[i]);
    free(p->helper_decoders);
    free(p);
}

void ces_pipeline_set_feed(ces_pipeline_t *p, const ces_feed_t *feed) { p->feed = *feed; }

static size_t partition_key(char *buf, size_t size, const char *topic, int32_t partition) {
    int n = snprintf(buf, size, "%s\x1f%d", topic, (int)partition);
    return n < 0 ? 0 : (size_t)n >= size ? size - 1 : (size_t)n;
}

partition_t *ces_pipeline_partition(ces_pipeline_t *p, const char *topic, int32_t partition,
                                    bool create) {
    /* Records mostly come in runs from one partition: skip formatting and hashing the key. */
    partition_t *last = p->last_partition;
    if (last != NULL && last->partition == partition && strcmp(last->topic, topic) == 0)
        return last;
    char key[512];
    size_t len = partition_key(key, sizeof(key), topic, partition);
    partition_t *part = ces_map_get(p->partitions, key, len);
    if (part != NULL)
        p->last_partition = part;
    if (part != NULL || !create)
        return part;
    part = calloc(1, sizeof(*part));
    if (part == NULL || (part->topic = strdup(topic)) == NULL ||
        ces_map_put(p->partitions, key, len, part) != 0) {
        if (part)
            free(part->topic);
        free(part);
        return NULL;
    }
    part->partition = partition;
    part->pos.stored = -1;
    part->pos.expect_from = -1; /* nothing to check until an assignment says where to resume */
    return part;
}

bool ces_pipeline_exceeds_batch(const ces_pipeline_t *p, size_t events, size_t bytes) {
    return events >= p->options.batch_max_events ||
           (p->options.batch_max_bytes > 0 && bytes >= p->options.batch_max_bytes);
}

size_t ces_pipeline_batch_events(const ces_pipeline_t *p) { return p->batch.count; }

const ces_item_t *ces_pipeline_batch_item(const ces_pipeline_t *p, size_t i) {
    return i < p->batch.count ? &p->batch.items[i] : NULL;
}

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
        ces_apply_read_offsets(p->apply, topic, partitions, n, offsets, err, sizeof(err)) !=
            CES_APPLY_OK) {
        ces_log_error("reading stored positions of topic %s: %s", topic, err);
        return -1;
    }
    int64_t now = ces_clock_now_ms();
    for (size_t i = 0; i < n; i++) {
        partition_t *part = ces_pipeline_partition(p, topic, partitions[i], true);
        if (part == NULL)
            return -1;
        ces_positions_on_assign(&part->pos, topic, partitions[i], offsets[i]);
        ces_release_assigned(p, part);
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
    bool abandon_stream = p->streaming && !p->stream_complete;
    /* Commit what is complete while the partitions are still ours (the fence refuses it if they
     * are not), then forget them. */
    if (!abandon_stream && ces_flight_flush(p, err, sizeof(err)) == CES_PIPELINE_FATAL) {
        ces_log_error("committing before revocation: %s", err);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        partition_t *part = ces_pipeline_partition(p, topic, partitions[i], false);
        if (part != NULL) {
            ces_positions_on_revoke(&part->pos);
            part->assigned = false;
            part->has_frontier = false;
            part->at_eof = false;
            part->paused = false;
        }
    }
    /* What is held for the revoked partitions goes (their positions never passed it: the next
     * owner reads it again); what is held for the partitions we keep stays, and they read on. An
     * event joined from segments of a revoked partition and a kept one cannot be split: then
     * every partition goes back to its stored position. */
    if (abandon_stream) {
        char lsn[23];
        ces_lsn_format(p->stream_lsn, lsn);
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

void ces_pipeline_get_stats(const ces_pipeline_t *p, ces_pipeline_stats_t *stats) {
    *stats = p->stats;
    /* The orderer drops resent events on arrival, and also when it releases a transaction if
     * their first copy went to PostgreSQL meanwhile (it was in the batch being read when the copy
     * came): it counts both. */
    if (p->order != NULL)
        stats->duplicates += ces_order_duplicates(p->order);
    stats->pending_events = p->order ? ces_order_pending_events(p->order) : 0;
    stats->pending_segments = ces_reasm_pending_groups(p->reasm);
    stats->pending_transactions = p->order ? ces_order_pending_transactions(p->order) : 0;
    stats->pending_segment_bytes = ces_reasm_pending_bytes(p->reasm);
    stats->pending_bytes = p->order ? ces_order_pending_bytes(p->order) : 0;
    stats->reorder_window_ms = p->order ? ces_window_ms(&p->late.window) : -1;
}

typedef struct {
    void (*fn)(void *arg, const char *topic, int32_t partition, int64_t position);
    void *arg;
} each_partition_t;

static void each_partition(void *value, void *arg) {
    const partition_t *part = value;
    each_partition_t *e = arg;
    if (part->assigned)
        e->fn(e->arg, part->topic, part->partition, ces_positions_next_to_apply(&part->pos));
}

void ces_pipeline_each_partition(ces_pipeline_t *p,
                                 void (*fn)(void *arg, const char *topic, int32_t partition,
                                            int64_t position),
                                 void *arg) {
    each_partition_t e = {fn, arg};
    ces_map_each(p->partitions, each_partition, &e);
}
