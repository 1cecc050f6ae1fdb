/*
 * pipeline: the door of the room: the pipeline's life, its stats and its partitions as the rest of
 * the program sees them. See pipeline.h for the room's files; the loop (loop.c) and the rebalance
 * callbacks (rebalance.c) are the door's other rooms.
 */
#include "pipeline/pipeline.h"

#include <stdlib.h>

#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/staging.h"
#include "pipeline/state.h"
#include "util/clock.h"

ces_pipeline_t *ces_pipeline_new(const ces_pipeline_options_t *options, ces_decoder_t *decoder,
                                 ces_apply_t *apply) {
    ces_pipeline_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->options = *options;
    p->decoder = decoder;
    p->apply = apply;
    ces_lateness_init(&p->late, options->reorder_window_ms, options->reorder_window_max_ms,
                      options->reorder_window_adaptive);
    p->reasm = ces_reasm_new(&options->reasm);
    p->partitions = ces_partitions_new();
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
    ces_staging_drop(p);
    ces_batch_clear(&p->batch);
    ces_batch_free(&p->batch);
    ces_batch_clear(&p->in_flight);
    ces_batch_free(&p->in_flight);
    ces_reasm_destroy(p->reasm);
    ces_order_destroy(p->order);
    ces_partitions_destroy(p->partitions);
    for (size_t i = 0; i < p->nspares; i++)
        ces_arena_destroy(p->spares[i]);
    ces_team_destroy(p->team);
    for (size_t i = 0; i < p->nhelpers; i++)
        ces_decoder_destroy(p->helper_decoders[i]);
    free(p->helper_decoders);
    free(p);
}

void ces_pipeline_set_feed(ces_pipeline_t *p, const ces_feed_t *feed) { p->feed = *feed; }

bool ces_pipeline_exceeds_batch(const ces_pipeline_t *p, size_t events, size_t bytes) {
    return events >= p->options.batch_max_events ||
           (p->options.batch_max_bytes > 0 && bytes >= p->options.batch_max_bytes);
}

size_t ces_pipeline_batch_events(const ces_pipeline_t *p) { return p->batch.count; }

const ces_item_t *ces_pipeline_batch_item(const ces_pipeline_t *p, size_t i) {
    return i < p->batch.count ? &p->batch.items[i] : NULL;
}

void ces_pipeline_inherit_window(ces_pipeline_t *p, int64_t window_ms) {
    if (p->order != NULL && window_ms >= 0)
        ces_lateness_inherit(&p->late, window_ms, ces_clock_now_ms());
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
    stats->reorder_window_ms = p->order ? ces_lateness_window_ms(&p->late) : -1;
}

void ces_pipeline_each_partition(ces_pipeline_t *p,
                                 void (*fn)(void *arg, const char *topic, int32_t partition,
                                            int64_t position),
                                 void *arg) {
    ces_partitions_iter_t it = {0};
    const ces_partition_t *part;
    while ((part = ces_partitions_next(p->partitions, &it)) != NULL) {
        if (part->assigned)
            fn(arg, part->topic, part->partition, ces_positions_next_to_apply(&part->pos));
    }
}
