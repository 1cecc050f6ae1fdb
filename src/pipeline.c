#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "map.h"

/* What the pipeline knows of one partition. */
typedef struct {
    char *topic; /* owned; items and offsets refer to it */
    int32_t partition;
    bool has_expected; /* PostgreSQL holds a position for it */
    int64_t expected;  /* ... and this is it (the fence) */
    bool has_next;
    int64_t next; /* offset after the last record read */
    bool dirty;   /* records were read since the last stored position */
} partition_t;

struct ces_pipeline_s {
    ces_pipeline_options_t options;
    ces_decoder_t *decoder;
    ces_apply_t *apply;
    ces_consumer_t *consumer;
    ces_reasm_t *reasm;
    ces_map_t *partitions; /* "topic\x1fpartition" -> partition_t */
    ces_map_t *topics;     /* interned topic names for sources outside Kafka (replay) */
    ces_batch_t batch;
    int64_t batch_started_ms;
    ces_pipeline_stats_t stats;
};

int64_t ces_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void release_owner(void *owner) { ces_consumer_release(owner); }

static void partition_free(void *value, void *arg) {
    (void)arg;
    partition_t *p = value;
    free(p->topic);
    free(p);
}

static void string_free(void *value, void *arg) {
    (void)arg;
    free(value);
}

ces_pipeline_t *ces_pipeline_new(const ces_pipeline_options_t *options, ces_decoder_t *decoder,
                                 ces_apply_t *apply) {
    ces_pipeline_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->options = *options;
    p->decoder = decoder;
    p->apply = apply;
    p->reasm = ces_reasm_new(&options->reasm);
    p->partitions = ces_map_new();
    p->topics = ces_map_new();
    if (p->reasm == NULL || p->partitions == NULL || p->topics == NULL) {
        ces_pipeline_destroy(p);
        return NULL;
    }
    return p;
}

void ces_pipeline_destroy(ces_pipeline_t *p) {
    if (p == NULL)
        return;
    ces_batch_clear(&p->batch, release_owner);
    ces_batch_free(&p->batch);
    ces_reasm_destroy(p->reasm, release_owner);
    if (p->partitions != NULL)
        ces_map_clear(p->partitions, partition_free, NULL);
    ces_map_destroy(p->partitions);
    if (p->topics != NULL)
        ces_map_clear(p->topics, string_free, NULL);
    ces_map_destroy(p->topics);
    free(p);
}

void ces_pipeline_set_consumer(ces_pipeline_t *p, ces_consumer_t *consumer) {
    p->consumer = consumer;
}

static size_t partition_key(char *buf, size_t size, const char *topic, int32_t partition) {
    int n = snprintf(buf, size, "%s\x1f%d", topic, (int)partition);
    return n < 0 ? 0 : (size_t)n >= size ? size - 1 : (size_t)n;
}

static partition_t *partition_get(ces_pipeline_t *p, const char *topic, int32_t partition,
                                  bool create) {
    char key[512];
    size_t len = partition_key(key, sizeof(key), topic, partition);
    partition_t *part = ces_map_get(p->partitions, key, len);
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
    return part;
}

/* Adds a dead-letter item; takes arena and owner. */
static int add_dead_letter(ces_pipeline_t *p, const ces_source_t *source, const char *reason,
                           const char *logicalid, const void *raw, size_t raw_len,
                           ces_arena_t *arena, void *owner) {
    ces_item_t *item = ces_batch_add(&p->batch);
    if (item == NULL) {
        release_owner(owner);
        ces_arena_destroy(arena);
        return -1;
    }
    item->kind = CES_ITEM_DEAD_LETTER;
    item->source = *source;
    item->arena = arena;
    item->owner = owner;
    item->raw = raw;
    item->raw_len = raw_len;
    item->reason = ces_arena_strndup(arena, reason, strlen(reason));
    item->logicalid = logicalid ? ces_arena_strndup(arena, logicalid, strlen(logicalid)) : NULL;
    ces_log_warning("dead letter: %s[%d]@%lld: %s", source->topic, (int)source->partition,
                    (long long)source->offset, reason);
    return item->reason == NULL ? -1 : 0;
}

static int add_event(ces_pipeline_t *p, const ces_source_t *source, const ces_event_t *event,
                     const void *raw, size_t raw_len, ces_arena_t *arena, void *owner) {
    ces_item_t *item = ces_batch_add(&p->batch);
    if (item == NULL) {
        release_owner(owner);
        ces_arena_destroy(arena);
        return -1;
    }
    item->kind = CES_ITEM_EVENT;
    item->source = *source;
    item->event = *event;
    item->logicalid = event->logicalid;
    item->arena = arena;
    item->owner = owner;
    item->raw = raw;
    item->raw_len = raw_len;
    return 0;
}

static bool is_whole(const ces_envelope_t *env) {
    if (env->legacy)
        return env->split_total == 0 || env->split_total == 1;
    return env->final_segment && env->index <= 1;
}

/* Dead-letters every segment of a group that cannot be applied; takes the group. */
static int give_up_group(ces_pipeline_t *p, ces_reasm_group_t *g, const char *reason) {
    int rc = 0;
    for (size_t i = 0; i < g->count; i++) {
        ces_segment_t *s = &g->segments[i];
        if (add_dead_letter(p, &s->source, reason, g->logicalid, s->raw, s->raw_len, s->arena,
                            s->owner) != 0)
            rc = -1;
    }
    g->count = 0; /* every segment now belongs to an item */
    ces_reasm_group_free(g, NULL);
    return rc;
}

/* A complete group: decode the joined Data into one event item. */
static int add_joined(ces_pipeline_t *p, ces_reasm_group_t *g, char *errstr, size_t errstr_size) {
    ces_arena_t *arena = ces_arena_new();
    if (arena == NULL)
        return -1;
    /* The event outlives the segments: copy what it borrows from the first envelope. */
    ces_envelope_t env = g->segments[0].envelope;
    env.id = ces_arena_strndup(arena, env.id, strlen(env.id));
    env.logicalid = ces_arena_strndup(arena, env.logicalid, strlen(env.logicalid));
    env.time = env.time ? ces_arena_strndup(arena, env.time, strlen(env.time)) : NULL;
    char *data = ces_arena_strndup(arena, g->data, g->data_len);
    if (env.id == NULL || env.logicalid == NULL || data == NULL) {
        ces_arena_destroy(arena);
        return -1;
    }
    ces_event_t event;
    char reason[512];
    ces_decode_status_t st =
        ces_decode_event(p->decoder, arena, &env, data, g->data_len, &event, reason, sizeof(reason));
    if (st == CES_DECODE_NOMEM) {
        ces_arena_destroy(arena);
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    if (st == CES_DECODE_REJECTED) {
        ces_arena_destroy(arena);
        if (g->candidate_base1) {
            /* Indexes 1..final were there but the join does not decode: the base is 0 and the first
             * segment is still to come. */
            return ces_reasm_put_back(p->reasm, g) == CES_REASM_NOMEM ? -1 : 0;
        }
        char why[600];
        snprintf(why, sizeof(why), "joined segments: %s", reason);
        return give_up_group(p, g, why);
    }
    /* The event's source for messages is its first segment; every segment's position is covered by
     * the partitions' read positions. */
    ces_source_t source = g->segments[0].source;
    int rc = add_event(p, &source, &event, data, g->data_len, arena, NULL);
    ces_reasm_group_free(g, release_owner);
    return rc;
}

static ces_pipeline_status_t handle_reasm(ces_pipeline_t *p, ces_reasm_status_t rs,
                                          ces_reasm_group_t *g, const char *reason, char *errstr,
                                          size_t errstr_size) {
    switch (rs) {
    case CES_REASM_HELD:
        return CES_PIPELINE_OK;
    case CES_REASM_COMPLETE:
        return add_joined(p, g, errstr, errstr_size) == 0 ? CES_PIPELINE_OK : CES_PIPELINE_FATAL;
    case CES_REASM_GIVEN_UP:
        return give_up_group(p, g, reason) == 0 ? CES_PIPELINE_OK : CES_PIPELINE_FATAL;
    case CES_REASM_NOMEM:
        break;
    }
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

static const char *intern_topic(ces_pipeline_t *p, const char *topic) {
    char *t = ces_map_get(p->topics, topic, strlen(topic));
    if (t != NULL)
        return t;
    t = strdup(topic);
    if (t == NULL || ces_map_put(p->topics, topic, strlen(topic), t) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

ces_pipeline_status_t ces_pipeline_add(ces_pipeline_t *p, const ces_record_t *rec, int64_t now_ms,
                                       char *errstr, size_t errstr_size) {
    void *owner = rec->handle;
    ces_arena_t *arena = ces_arena_new();
    if (arena == NULL) {
        release_owner(owner);
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    ces_source_t source = {.topic = NULL, .partition = rec->partition, .offset = rec->offset};
    if (p->options.store_offsets) {
        partition_t *part = partition_get(p, rec->topic, rec->partition, true);
        if (part == NULL)
            goto nomem;
        part->next = rec->offset + 1;
        part->has_next = true;
        part->dirty = true;
        source.topic = part->topic;
    } else {
        source.topic = intern_topic(p, rec->topic);
        if (source.topic == NULL)
            goto nomem;
    }
    p->stats.records++;
    if (p->batch.count == 0)
        p->batch_started_ms = now_ms;

    const void *raw = rec->value;
    if (owner == NULL) {
        raw = ces_arena_strndup(arena, rec->value, rec->len);
        if (raw == NULL)
            goto nomem;
    }
    ces_envelope_t env;
    char reason[512];
    ces_decode_status_t st =
        ces_decode_envelope(p->decoder, arena, raw, rec->len, &env, reason, sizeof(reason));
    if (st == CES_DECODE_NOMEM)
        goto nomem;
    if (st == CES_DECODE_REJECTED) {
        if (add_dead_letter(p, &source, reason, NULL, raw, rec->len, arena, owner) != 0)
            goto nomem_taken;
        return CES_PIPELINE_OK;
    }
    if (is_whole(&env)) {
        ces_event_t event;
        st = ces_decode_event(p->decoder, arena, &env, env.data, env.data_len, &event, reason,
                              sizeof(reason));
        if (st == CES_DECODE_OK) {
            if (add_event(p, &source, &event, raw, rec->len, arena, owner) != 0)
                goto nomem_taken;
            return CES_PIPELINE_OK;
        }
        if (st == CES_DECODE_NOMEM)
            goto nomem;
        /* A current-generation record with index 1 and finalsegment may also be the last of two
         * 0-based segments: only then does its data fail to decode on its own. */
        if (env.legacy || env.index != 1 || env.data == NULL) {
            if (add_dead_letter(p, &source, reason, env.logicalid, raw, rec->len, arena, owner) !=
                0)
                goto nomem_taken;
            return CES_PIPELINE_OK;
        }
    }
    if (env.data == NULL) {
        if (add_dead_letter(p, &source, "a segment must carry data as a string", env.logicalid,
                            raw, rec->len, arena, owner) != 0)
            goto nomem_taken;
        return CES_PIPELINE_OK;
    }
    ces_segment_t seg = {
        .source = source,
        .envelope = env,
        .index = env.index,
        .final_segment = env.final_segment,
        .split_total = env.legacy ? env.split_total : -1,
        .data = env.data,
        .data_len = env.data_len,
        .raw = raw,
        .raw_len = rec->len,
        .arena = arena,
        .owner = owner,
    };
    ces_reasm_group_t *group = NULL;
    ces_reasm_status_t rs = ces_reasm_add(p->reasm, env.logicalid, &seg, now_ms, &group, reason,
                                          sizeof(reason), release_owner);
    return handle_reasm(p, rs, group, reason, errstr, errstr_size);
nomem:
    release_owner(owner);
    ces_arena_destroy(arena);
nomem_taken:
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

ces_pipeline_status_t ces_pipeline_tick(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                        size_t errstr_size) {
    ces_reasm_group_t *g;
    while ((g = ces_reasm_expire(p->reasm, now_ms)) != NULL) {
        char reason[300];
        snprintf(reason, sizeof(reason),
                 "segment group incomplete after %lld ms (reassembly.timeout_ms): %zu segment(s) "
                 "received",
                 (long long)p->options.reasm.timeout_ms, g->count);
        if (p->batch.count == 0)
            p->batch_started_ms = now_ms;
        if (give_up_group(p, g, reason) != 0) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_PIPELINE_FATAL;
        }
    }
    return CES_PIPELINE_OK;
}

ces_pipeline_status_t ces_pipeline_give_up_segments(ces_pipeline_t *p, char *errstr,
                                                    size_t errstr_size) {
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(p->reasm)) != NULL) {
        char reason[300];
        snprintf(reason, sizeof(reason),
                 "segment group incomplete at the end of the input: %zu segment(s) received",
                 g->count);
        if (give_up_group(p, g, reason) != 0) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_PIPELINE_FATAL;
        }
    }
    return CES_PIPELINE_OK;
}

bool ces_pipeline_due(const ces_pipeline_t *p, int64_t now_ms) {
    if (p->batch.count >= p->options.batch_max_events)
        return true;
    return p->batch.count > 0 && now_ms - p->batch_started_ms >= p->options.batch_max_ms;
}

typedef struct {
    const ces_pipeline_t *p;
    bool dirty;
} dirty_scan_t;

static void scan_dirty(void *value, void *arg) {
    dirty_scan_t *s = arg;
    s->dirty = s->dirty || ((partition_t *)value)->dirty;
}

bool ces_pipeline_pending(const ces_pipeline_t *p) {
    if (p->batch.count > 0)
        return true;
    dirty_scan_t s = {p, false};
    ces_map_each(p->partitions, scan_dirty, &s);
    return s.dirty;
}

int ces_pipeline_wait_ms(const ces_pipeline_t *p, int64_t now_ms, int max_ms) {
    if (p->batch.count == 0)
        return max_ms;
    int64_t left = p->batch_started_ms + p->options.batch_max_ms - now_ms;
    if (left < 0)
        return 0;
    return left < max_ms ? (int)left : max_ms;
}

/* The position a partition may store: the next record to read, held back by waiting segments. */
static int64_t committable(const ces_pipeline_t *p, const partition_t *part) {
    int64_t next = part->next;
    int64_t held;
    if (ces_reasm_min_offset(p->reasm, part->topic, part->partition, &held) && held < next)
        next = held;
    return next;
}

typedef struct {
    ces_pipeline_t *p;
    int failed;
} collect_t;

static void collect_offset(void *value, void *arg) {
    collect_t *c = arg;
    partition_t *part = value;
    if (!part->dirty || !part->has_next)
        return;
    int64_t next = committable(c->p, part);
    if (part->has_expected && next <= part->expected)
        return;
    ces_offset_update_t u = {.topic = part->topic,
                             .partition = part->partition,
                             .has_expected = part->has_expected,
                             .expected = part->expected,
                             .next = next};
    if (ces_batch_set_offset(&c->p->batch, &u) != 0)
        c->failed = 1;
}

/* Drops what is in memory and goes back to the positions PostgreSQL holds. */
static ces_pipeline_status_t rewind_all(ces_pipeline_t *p, char *errstr, size_t errstr_size);

ces_pipeline_status_t ces_pipeline_flush(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    if (p->options.store_offsets) {
        collect_t c = {p, 0};
        ces_map_each(p->partitions, collect_offset, &c);
        if (c.failed) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_PIPELINE_FATAL;
        }
    }
    if (p->batch.count == 0 && p->batch.noffsets == 0)
        return CES_PIPELINE_OK;
    ces_apply_stats_t st = {0};
    ces_apply_status_t rc = ces_apply_batch(p->apply, &p->batch, &st, errstr, errstr_size);
    p->stats.retries += st.retries;
    switch (rc) {
    case CES_APPLY_OK:
        break;
    case CES_APPLY_FENCED:
        ces_log_warning("%s: going back to the positions stored in PostgreSQL", errstr);
        return rewind_all(p, errstr, errstr_size);
    case CES_APPLY_INTERRUPTED:
        return CES_PIPELINE_INTERRUPTED;
    case CES_APPLY_FATAL:
        return CES_PIPELINE_FATAL;
    }
    p->stats.events_applied += st.events_applied;
    p->stats.dead_letters += st.dead_letters;
    p->stats.batches++;
    for (size_t i = 0; i < p->batch.noffsets; i++) {
        const ces_offset_update_t *o = &p->batch.offsets[i];
        partition_t *part = partition_get(p, o->topic, o->partition, false);
        if (part != NULL) {
            part->has_expected = true;
            part->expected = o->next;
            part->dirty = part->next != o->next;
        }
        if (p->consumer != NULL)
            ces_consumer_store_offset(p->consumer, o->topic, o->partition, o->next);
    }
    ces_batch_clear(&p->batch, release_owner);
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
    if (r->failed || !part->has_next)
        return;
    int64_t stored;
    r->status = ces_apply_read_offsets(r->p->apply, part->topic, &part->partition, 1, &stored,
                                       r->errstr, r->errstr_size);
    if (r->status != CES_APPLY_OK) {
        r->failed = 1;
        return;
    }
    /* Without a stored position, nothing of this assignment was committed: start over at the first
     * record that is still unaccounted for, which is no later than the oldest one read. */
    int64_t target = stored >= 0 ? stored : (part->has_expected ? part->expected : -1);
    part->has_expected = stored >= 0;
    part->expected = stored;
    part->dirty = false;
    if (target < 0) {
        ces_log_warning("%s[%d]: no stored position to go back to; records read since the "
                        "assignment will be read from Kafka's committed offset after the next "
                        "rebalance",
                        part->topic, (int)part->partition);
        return;
    }
    part->next = target;
    if (r->p->consumer != NULL &&
        ces_consumer_seek(r->p->consumer, part->topic, part->partition, target) != 0)
        r->failed = 1;
}

static ces_pipeline_status_t rewind_all(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    ces_batch_clear(&p->batch, release_owner);
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(p->reasm)) != NULL)
        ces_reasm_group_free(g, release_owner);
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

int ces_pipeline_on_assigned(void *opaque, const char *topic, const int32_t *partitions, size_t n,
                             int64_t *offsets) {
    ces_pipeline_t *p = opaque;
    char err[512];
    if (ces_apply_read_offsets(p->apply, topic, partitions, n, offsets, err, sizeof(err)) !=
        CES_APPLY_OK) {
        ces_log_error("reading stored positions of topic %s: %s", topic, err);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        partition_t *part = partition_get(p, topic, partitions[i], true);
        if (part == NULL)
            return -1;
        part->has_expected = offsets[i] >= 0;
        part->expected = offsets[i];
        part->has_next = false;
        part->dirty = false;
        if (offsets[i] >= 0)
            ces_log_info("%s[%d]: resuming at offset %lld stored in PostgreSQL", topic,
                         (int)partitions[i], (long long)offsets[i]);
        else
            ces_log_info("%s[%d]: no position stored in PostgreSQL; starting from Kafka's "
                         "committed offset or auto.offset.reset",
                         topic, (int)partitions[i]);
        offsets[i] = offsets[i] >= 0 ? offsets[i] : CES_OFFSET_UNSET;
    }
    return 0;
}

int ces_pipeline_on_revoked(void *opaque, const char *topic, const int32_t *partitions, size_t n) {
    ces_pipeline_t *p = opaque;
    char err[512];
    /* Commit what is complete while the partitions are still ours (the fence refuses it if they
     * are not), then forget them. Segments waiting for reassembly are dropped: the positions stored
     * never passed them, so whoever owns the partitions next reads them again. */
    ces_pipeline_status_t st = ces_pipeline_flush(p, err, sizeof(err));
    if (st == CES_PIPELINE_FATAL) {
        ces_log_error("committing before revocation: %s", err);
        return -1;
    }
    if (ces_reasm_pending_groups(p->reasm) > 0 && rewind_all(p, err, sizeof(err)) != CES_PIPELINE_OK)
        ces_log_warning("going back before revocation: %s", err);
    for (size_t i = 0; i < n; i++) {
        partition_t *part = partition_get(p, topic, partitions[i], false);
        if (part != NULL) {
            part->has_next = false;
            part->dirty = false;
            part->has_expected = false;
        }
    }
    return 0;
}

void ces_pipeline_get_stats(const ces_pipeline_t *p, ces_pipeline_stats_t *stats) {
    *stats = p->stats;
}
