#include "pipeline.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "map.h"
#include "order.h"
#include "team.h"

/*
 * A record on its way in. ces_pipeline_stage keeps it; the team decodes it (prepare: any thread,
 * touching only the record's own slot and the worker's decoder); then it is taken in, in order, on
 * the pipeline's thread (take).
 */
typedef struct {
    ces_record_t rec;
    ces_arena_t *arena; /* decoding arena: owned by the slot until taken */
    const void *raw;    /* the record's copy in arena */
    bool nomem;
    ces_decode_status_t envelope_status;
    ces_envelope_t env;
    bool whole;                          /* the envelope says the record is a whole event */
    ces_decode_status_t event_status;    /* whole: of its Data */
    ces_event_t event;                   /* decoded: in arena */
    char reason[512];
} staged_t;

/* Records staged before they are decoded together: enough to share among a few threads, few
 * enough that the batch and the held events do not grow much past their limits meanwhile. */
#define STAGE_RECORDS 32
#define STAGE_BYTES (256u << 10)

typedef struct {
    staged_t items[STAGE_RECORDS];
    size_t count;
    size_t bytes;
} stage_t;

/* What the pipeline knows of one partition. */
typedef struct {
    char *topic; /* owned; items and offsets refer to it */
    int32_t partition;
    bool has_expected; /* PostgreSQL holds a position for it */
    int64_t expected;  /* ... and this is it (the fence) */
    bool has_next;
    int64_t next; /* offset after the last record read */
    bool dirty;   /* records were read since the last stored position */
    bool assigned; /* ours now: the orderer waits for it */
    bool has_frontier;
    ces_lsn_t frontier; /* highest commit LSN it delivered: it will not deliver older ones */
    bool at_eof;        /* caught up with the broker since its last record */
    int64_t eof_offset; /* where the end was when it was reached */
    int64_t last_record_ms;
    bool paused;
} partition_t;

struct ces_pipeline_s {
    ces_pipeline_options_t options;
    ces_decoder_t *decoder;
    ces_apply_t *apply;
    ces_consumer_t *consumer;
    ces_reasm_t *reasm;
    ces_order_t *order;    /* transaction mode only */
    ces_map_t *partitions; /* "topic\x1fpartition" -> partition_t */
    partition_t *last_partition; /* reference into partitions: the one looked up last */
    ces_batch_t batch;
    int64_t batch_started_ms;
    /* The batch PostgreSQL is applying while the next one is read (ces_pipeline_send). */
    ces_batch_t in_flight;
    bool flying;
    int64_t in_flight_started_ms;
    bool in_flight_commits; /* false: a part of the streamed transaction */
    unsigned adds; /* records added: every few, libpq is given the chance to send more */
    /* Two stages: while the helpers decode one, the pipeline's thread takes in the other. */
    stage_t stages[2];
    stage_t *filling;  /* takes ces_pipeline_stage's records */
    stage_t *decoding; /* handed to the team and not taken in yet; NULL: none */
    /* Arenas whole events were decoded in, emptied: the next records are decoded in them (a
     * record's JSON trees need several blocks, which would be malloc'ed and freed each time). */
    ces_arena_t *spares[STAGE_RECORDS];
    size_t nspares;
    /* Decoding threads besides the caller's, each with a decoder of its own. */
    ces_team_t *team;
    ces_decoder_t **helper_decoders;
    size_t nhelpers;
    ces_pipeline_stats_t stats;
    /* A source transaction too large for memory is streamed into one open PostgreSQL transaction. */
    bool streaming;
    bool stream_complete; /* its last events are in the batch: the next flush commits */
    ces_lsn_t stream_lsn;
    ces_apply_stats_t stream_stats; /* what the open transaction holds, counted once committed */
};

static void partition_free(void *value, void *arg) {
    (void)arg;
    partition_t *p = value;
    free(p->topic);
    free(p);
}

ces_pipeline_t *ces_pipeline_new(const ces_pipeline_options_t *options, ces_decoder_t *decoder,
                                 ces_apply_t *apply) {
    ces_pipeline_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->options = *options;
    p->decoder = decoder;
    p->apply = apply;
    p->filling = &p->stages[0];
    p->reasm = ces_reasm_new(&options->reasm);
    p->partitions = ces_map_new();
    if (options->ordering == CES_ORDER_BY_TRANSACTION)
        p->order = ces_order_new(options->dedup_window);
    if (p->reasm == NULL || p->partitions == NULL ||
        (options->ordering == CES_ORDER_BY_TRANSACTION && p->order == NULL)) {
        ces_pipeline_destroy(p);
        return NULL;
    }
    if (options->decode_threads > 1) {
        size_t n = options->decode_threads - 1;
        p->helper_decoders = calloc(n, sizeof(*p->helper_decoders));
        if (p->helper_decoders == NULL) {
            ces_pipeline_destroy(p);
            return NULL;
        }
        for (; p->nhelpers < n; p->nhelpers++) {
            p->helper_decoders[p->nhelpers] = ces_decoder_new(ces_decoder_limits(decoder));
            if (p->helper_decoders[p->nhelpers] == NULL) {
                ces_pipeline_destroy(p);
                return NULL;
            }
        }
        p->team = ces_team_new((void *const *)p->helper_decoders, n);
        if (p->team == NULL) {
            ces_pipeline_destroy(p);
            return NULL;
        }
    }
    return p;
}

/* Releases the records of a stage from item from on, undecoded or decoded (not while the team
 * works on it). */
static void unstage(stage_t *stage, size_t from) {
    for (size_t i = from; i < stage->count; i++) {
        staged_t *s = &stage->items[i];
        ces_consumer_release(s->rec.handle);
        ces_arena_destroy(s->arena);
        s->arena = NULL;
    }
    stage->count = 0;
    stage->bytes = 0;
}

static void prepare(void *worker, void *job, size_t item);

/* The stage the team decodes, complete (this thread doing what is left), or NULL. */
static stage_t *finish_decoding(ces_pipeline_t *p) {
    stage_t *stage = p->decoding;
    if (stage != NULL)
        ces_team_finish(p->team, prepare, stage, p->decoder, stage->count);
    p->decoding = NULL;
    return stage;
}

/* Records read but not taken in are dropped: after a seek back, or a failure, they are read
 * again. */
void ces_pipeline_drop_staged(ces_pipeline_t *p) {
    stage_t *decoded = finish_decoding(p);
    if (decoded != NULL)
        unstage(decoded, 0);
    unstage(p->filling, 0);
}

void ces_pipeline_destroy(ces_pipeline_t *p) {
    if (p == NULL)
        return;
    ces_batch_clear(&p->batch);
    ces_batch_free(&p->batch);
    ces_batch_clear(&p->in_flight);
    ces_batch_free(&p->in_flight);
    ces_reasm_destroy(p->reasm);
    ces_order_destroy(p->order);
    if (p->partitions != NULL)
        ces_map_clear(p->partitions, partition_free, NULL);
    ces_map_destroy(p->partitions);
    ces_pipeline_drop_staged(p);
    for (size_t i = 0; i < p->nspares; i++)
        ces_arena_destroy(p->spares[i]);
    ces_team_destroy(p->team);
    for (size_t i = 0; i < p->nhelpers; i++)
        ces_decoder_destroy(p->helper_decoders[i]);
    free(p->helper_decoders);
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
    return part;
}

/* Adds a dead-letter item; takes arena. */
static int add_dead_letter(ces_pipeline_t *p, const ces_source_t *source, const char *reason,
                           const char *logicalid, const void *raw, size_t raw_len,
                           ces_arena_t *arena) {
    ces_item_t item = {
        .kind = CES_ITEM_DEAD_LETTER,
        .source = *source,
        .arena = arena,
        .raw = raw,
        .raw_len = raw_len,
        .reason = ces_arena_strndup(arena, reason, strlen(reason)),
        .logicalid = logicalid ? ces_arena_strndup(arena, logicalid, strlen(logicalid)) : NULL,
    };
    if (item.reason == NULL || (logicalid != NULL && item.logicalid == NULL) ||
        ces_batch_push(&p->batch, &item) != 0) {
        ces_arena_destroy(arena);
        return -1;
    }
    ces_log_warning("dead letter: %s[%d]@%lld: %s", source->topic, (int)source->partition,
                    (long long)source->offset, reason);
    return 0;
}

static bool matches_any(const char *const *globs, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        if (fnmatch(globs[i], name, FNM_CASEFOLD) == 0)
            return true;
    }
    return false;
}

/* schema.include / schema.exclude on "schema.table" (case-insensitive, like SQL Server names). */
static bool table_selected(const ces_pipeline_t *p, const ces_event_t *event) {
    if (p->options.ninclude == 0 && p->options.nexclude == 0)
        return true;
    char name[2 * CES_DECODE_MAX_NAME_BYTES + 2]; /* never cut */
    const char *parts[] = {event->schema, event->table};
    ces_map_key(name, sizeof(name), '.', parts, 2);
    if (p->options.ninclude > 0 && !matches_any(p->options.include, p->options.ninclude, name))
        return false;
    return !matches_any(p->options.exclude, p->options.nexclude, name);
}

/* The partition delivered an event of this commit LSN: it will deliver no older one (CES keeps
 * commit order within a partition for every partition scheme but None). */
static void advance_frontier(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn) {
    partition_t *part = partition_get(p, source->topic, source->partition, false);
    if (part != NULL && (!part->has_frontier || ces_lsn_compare(part->frontier, lsn) < 0)) {
        part->frontier = lsn;
        part->has_frontier = true;
    }
}

/* An event item: straight into the batch (partition mode) or held by the orderer. Takes arena;
 * more lists the other records the event was joined from (may be NULL). */
static int add_event(ces_pipeline_t *p, const ces_source_t *source, const ces_event_t *event,
                     const void *raw, size_t raw_len, ces_arena_t *arena,
                     const ces_source_t *more, size_t nmore) {
    if ((unsigned)event->op < 4)
        p->stats.events_consumed[event->op]++;
    if (p->order != NULL) {
        /* Even a skipped event tells how far its partitions have come. */
        advance_frontier(p, source, event->position.commit_lsn);
        for (size_t i = 0; i < nmore; i++)
            advance_frontier(p, &more[i], event->position.commit_lsn);
    }
    if (!table_selected(p, event)) {
        p->stats.excluded++;
        ces_arena_destroy(arena);
        return 0;
    }
    ces_item_t tmp = {
        .kind = CES_ITEM_EVENT,
        .source = *source,
        .event = *event,
        .logicalid = event->logicalid,
        .more_sources = more,
        .nmore_sources = nmore,
        .raw = raw,
        .raw_len = raw_len,
        .arena = arena,
    };
    if (p->order == NULL) {
        if (ces_batch_push(&p->batch, &tmp) != 0) {
            ces_arena_destroy(arena);
            return -1;
        }
        return 0;
    }
    /* A duplicate's arena (and the event in it) is freed by ces_order_add: keep its id for the
     * log line. */
    char logicalid[160] = "";
    if (ces_log_current_level >= CES_LOG_DEBUG)
        snprintf(logicalid, sizeof(logicalid), "%s", event->logicalid ? event->logicalid : "");
    switch (ces_order_add(p->order, &tmp)) {
    case CES_ORDER_HELD:
        return 0;
    case CES_ORDER_DUPLICATE: /* counted by the orderer (ces_pipeline_get_stats) */
        ces_log_debug("duplicate of an applied or held event skipped: %s[%d]@%lld (%s)",
                      source->topic, (int)source->partition, (long long)source->offset,
                      logicalid);
        return 0;
    case CES_ORDER_NOMEM:
        break;
    }
    ces_arena_destroy(arena);
    return -1;
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
        if (add_dead_letter(p, &s->source, reason, g->logicalid, s->raw, s->raw_len,
                            s->arena) != 0)
            rc = -1;
    }
    g->count = 0; /* every segment now belongs to an item */
    ces_reasm_group_free(g);
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
    /* The event stands for every segment: each one's partition must not store a position past it
     * until the event is applied. */
    ces_source_t source = g->segments[0].source;
    ces_source_t *more = NULL;
    if (g->count > 1) {
        more = ces_arena_alloc(arena, (g->count - 1) * sizeof(*more));
        if (more == NULL) {
            ces_arena_destroy(arena);
            return -1;
        }
        for (size_t i = 1; i < g->count; i++)
            more[i - 1] = g->segments[i].source;
    }
    int rc = add_event(p, &source, &event, data, g->data_len, arena, more, g->count - 1);
    ces_reasm_group_free(g);
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
    case CES_REASM_DUPLICATE:
        p->stats.duplicates++;
        return CES_PIPELINE_OK;
    case CES_REASM_NOMEM:
        break;
    }
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

/*
 * Decodes a staged record as far as it goes without the pipeline's state: its envelope and, for a
 * whole event, its Data, in the slot's arena (take makes the compact copy the event is held as).
 * Runs on any thread of the team, with that thread's decoder (worker).
 */
static void prepare(void *worker, void *job, size_t item) {
    ces_decoder_t *decoder = worker;
    staged_t *s = &((stage_t *)job)->items[item];
    const ces_record_t *rec = &s->rec;
    /* The record is copied: librdkafka's message is released when the record is taken in. (A
     * held message keeps the buffer of its whole fetch alive. Measured on bench/run insert,
     * this alone did not change peak RSS, which librdkafka's prefetch dominates; it removes the
     * dependence on it.) The decoded tree and strings take about as much again as the record. */
    if (s->arena == NULL)
        s->arena = ces_arena_new_sized(rec->len * 2 + 512);
    s->raw = s->arena != NULL ? ces_arena_strndup(s->arena, rec->value, rec->len) : NULL;
    if (s->raw == NULL) {
        s->nomem = true;
        return;
    }
    s->envelope_status = ces_decode_envelope(decoder, s->arena, s->raw, rec->len, &s->env,
                                             s->reason, sizeof(s->reason));
    s->whole = s->envelope_status == CES_DECODE_OK && is_whole(&s->env);
    if (!s->whole)
        return;
    /* The data string is the arena's copy, read only here: decoded in place (see take for the
     * record that turns out to be a segment after all). */
    s->event_status = ces_decode_event_in_place(decoder, s->arena, &s->env, (char *)s->env.data,
                                                s->env.data_len, &s->event, s->reason,
                                                sizeof(s->reason));
}

/* Takes in a prepared record, in order, on the pipeline's thread. */
static ces_pipeline_status_t take(ces_pipeline_t *p, staged_t *s, int64_t now_ms, char *errstr,
                                  size_t errstr_size) {
    const ces_record_t *rec = &s->rec;
    ces_arena_t *arena = s->arena;
    s->arena = NULL;
    ces_consumer_release(rec->handle);
    if (p->flying && (++p->adds & 15) == 0)
        ces_apply_progress(p->apply);
    const void *raw = s->raw;
    if (s->nomem)
        goto nomem;
    ces_source_t source = {.topic = NULL, .partition = rec->partition, .offset = rec->offset};
    partition_t *part = partition_get(p, rec->topic, rec->partition, true);
    if (part == NULL)
        goto nomem;
    if (!p->options.store_offsets)
        part->assigned = true; /* a replayed file is a partition of its own */
    part->next = rec->offset + 1;
    part->has_next = true;
    part->dirty = true;
    part->at_eof = false;
    part->last_record_ms = now_ms;
    source.topic = part->topic;
    p->stats.records++;
    if (p->batch.count == 0)
        p->batch_started_ms = now_ms;

    ces_envelope_t env = s->env;
    if (s->envelope_status == CES_DECODE_NOMEM)
        goto nomem;
    if (s->envelope_status == CES_DECODE_REJECTED) {
        if (add_dead_letter(p, &source, s->reason, NULL, raw, rec->len, arena) != 0)
            goto nomem_taken;
        return CES_PIPELINE_OK;
    }
    if (s->whole) {
        if (s->event_status == CES_DECODE_OK) {
            /* Held, the event keeps only itself and its record: the decoding arena, JSON trees
             * included, is several times their size. (Made here, not by the decoding thread:
             * memory is then allocated and freed by this thread alone.) */
            ces_arena_t *compact =
                ces_arena_new_sized(ces_event_copy_size(&s->event) + rec->len + 16 + 64);
            ces_event_t held;
            const void *held_raw = compact ? ces_arena_strndup(compact, raw, rec->len) : NULL;
            if (held_raw == NULL || ces_event_copy(&s->event, compact, &held) != 0) {
                ces_arena_destroy(compact);
                goto nomem;
            }
            ces_arena_reset(arena);
            if (p->nspares < STAGE_RECORDS)
                p->spares[p->nspares++] = arena;
            else
                ces_arena_destroy(arena);
            if (add_event(p, &source, &held, held_raw, rec->len, compact, NULL, 0) != 0)
                goto nomem_taken;
            return CES_PIPELINE_OK;
        }
        if (s->event_status == CES_DECODE_NOMEM)
            goto nomem;
        /* A current-generation record with index 1 and finalsegment may also be the last of two
         * 0-based segments: only then does its data fail to decode on its own. */
        if (env.legacy || env.index != 1 || env.data == NULL) {
            if (add_dead_letter(p, &source, s->reason, env.logicalid, raw, rec->len, arena) != 0)
                goto nomem_taken;
            return CES_PIPELINE_OK;
        }
        /* Its data went to the failed decoding: the segment takes the envelope read again. */
        char again[512];
        ces_decode_status_t st =
            ces_decode_envelope(p->decoder, arena, raw, rec->len, &env, again, sizeof(again));
        if (st == CES_DECODE_NOMEM)
            goto nomem;
        if (st != CES_DECODE_OK) {
            /* It was read once already: the same bytes cannot fail now. */
            if (add_dead_letter(p, &source, again, NULL, raw, rec->len, arena) != 0)
                goto nomem_taken;
            return CES_PIPELINE_OK;
        }
    }
    if (env.data == NULL) {
        if (add_dead_letter(p, &source, "a segment must carry data as a string", env.logicalid,
                            raw, rec->len, arena) != 0)
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
    };
    ces_reasm_group_t *group = NULL;
    char reason[512];
    ces_reasm_status_t rs =
        ces_reasm_add(p->reasm, env.logicalid, &seg, now_ms, &group, reason, sizeof(reason));
    return handle_reasm(p, rs, group, reason, errstr, errstr_size);
nomem:
    ces_arena_destroy(arena);
nomem_taken:
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

bool ces_pipeline_stage(ces_pipeline_t *p, const ces_record_t *rec) {
    stage_t *stage = p->filling;
    staged_t *s = &stage->items[stage->count++];
    s->rec = *rec;
    s->arena = p->nspares > 0 ? p->spares[--p->nspares] : NULL;
    s->nomem = false;
    s->whole = false;
    stage->bytes += rec->len;
    return stage->count == STAGE_RECORDS || stage->bytes >= STAGE_BYTES;
}

size_t ces_pipeline_stage_room(const ces_pipeline_t *p) {
    size_t room = STAGE_RECORDS - p->filling->count;
    if (p->options.ordering != CES_ORDER_BY_PARTITION)
        return room;
    size_t limits = p->flying ? 2 : 1;
    size_t staged = p->filling->count, staged_bytes = p->filling->bytes;
    if (p->decoding != NULL) {
        staged += p->decoding->count;
        staged_bytes += p->decoding->bytes;
    }
    size_t events = p->batch.count + staged, max_events = limits * p->options.batch_max_events;
    if (events >= max_events)
        return 0;
    if (max_events - events < room)
        room = max_events - events;
    /* A held event takes about twice its record's bytes (its compact copy and the record). */
    if (p->options.batch_max_bytes > 0 &&
        p->batch.bytes + 2 * staged_bytes >= limits * p->options.batch_max_bytes)
        return 0;
    return room;
}

bool ces_pipeline_has_staged(const ces_pipeline_t *p) {
    return p->decoding != NULL || p->filling->count > 0;
}

/* Takes in a decoded stage's records, in order. */
static ces_pipeline_status_t take_stage(ces_pipeline_t *p, stage_t *stage, int64_t now_ms,
                                        char *errstr, size_t errstr_size) {
    for (size_t i = 0; i < stage->count; i++) {
        ces_pipeline_status_t st = take(p, &stage->items[i], now_ms, errstr, errstr_size);
        if (st != CES_PIPELINE_OK) {
            unstage(stage, i + 1);
            return st;
        }
    }
    stage->count = 0;
    stage->bytes = 0;
    return CES_PIPELINE_OK;
}

ces_pipeline_status_t ces_pipeline_add_staged(ces_pipeline_t *p, int64_t now_ms, bool more_coming,
                                              char *errstr, size_t errstr_size) {
    stage_t *decoded = finish_decoding(p);
    stage_t *next = p->filling;
    if (more_coming && p->team != NULL && next->count > 0) {
        /* The helpers decode the stage just filled while this thread takes in the one before
         * and reads on: the pipeline's own work no longer leaves them idle. */
        ces_team_start(p->team, prepare, next, next->count);
        p->decoding = next;
        p->filling = next == &p->stages[0] ? &p->stages[1] : &p->stages[0];
        next = NULL;
    } else {
        ces_team_run(p->team, prepare, next, p->decoder, next->count);
    }
    ces_pipeline_status_t st = CES_PIPELINE_OK;
    if (decoded != NULL)
        st = take_stage(p, decoded, now_ms, errstr, errstr_size);
    if (st == CES_PIPELINE_OK && next != NULL)
        st = take_stage(p, next, now_ms, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        ces_pipeline_drop_staged(p);
    return st;
}

ces_pipeline_status_t ces_pipeline_add(ces_pipeline_t *p, const ces_record_t *rec, int64_t now_ms,
                                       char *errstr, size_t errstr_size) {
    ces_pipeline_stage(p, rec);
    return ces_pipeline_add_staged(p, now_ms, false, errstr, errstr_size);
}

/* Is every partition we own past lsn (or caught up and quiet), so that no event of a transaction
 * at or before lsn can still arrive? */
typedef struct {
    const ces_pipeline_t *p;
    ces_lsn_t lsn;
    int64_t now_ms;
    int64_t window_ms;
    bool ready;
} ready_scan_t;

/*
 * Caught up and quiet for the window. The end-of-partition event only says the partition was caught
 * up when it was fetched: if records arrived since (ces2pg was busy applying, or another partition
 * kept it reading), librdkafka's cached high watermark is past what was read, and the partition is
 * not quiet, however old its last record.
 */
static bool partition_quiet(const ces_pipeline_t *p, const partition_t *part, int64_t now_ms,
                            int64_t window_ms) {
    if (!part->at_eof || now_ms - part->last_record_ms < window_ms)
        return false;
    int64_t high;
    if (p->consumer != NULL &&
        ces_consumer_high_watermark(p->consumer, part->topic, part->partition, &high) == 0 &&
        high > (part->has_next ? part->next : part->eof_offset))
        return false;
    return true;
}

static void scan_ready(void *value, void *arg) {
    ready_scan_t *r = arg;
    const partition_t *part = value;
    if (!r->ready || !part->assigned)
        return;
    if (part->has_frontier && ces_lsn_compare(part->frontier, r->lsn) > 0)
        return;
    if (!partition_quiet(r->p, part, r->now_ms, r->window_ms))
        r->ready = false;
}

/* events and bytes (of arenas) reach a batch's limits: apply.batch_max_events or
 * apply.batch_max_bytes (0: none). */
static bool exceeds_batch(const ces_pipeline_t *p, size_t events, size_t bytes) {
    return events >= p->options.batch_max_events ||
           (p->options.batch_max_bytes > 0 && bytes >= p->options.batch_max_bytes);
}

static bool batch_full(const ces_pipeline_t *p) {
    return exceeds_batch(p, p->batch.count, p->batch.bytes);
}

/* Moves every complete source transaction, oldest first, into the batch. */
static int release_transactions(ces_pipeline_t *p, int64_t now_ms, bool drain) {
    if (p->order == NULL)
        return 0;
    if (p->streaming && !p->stream_complete) {
        /* The streamed transaction's events are no longer held, so ask about its LSN directly. */
        ready_scan_t r = {p, p->stream_lsn, now_ms, p->options.reorder_window_ms, true};
        if (!drain)
            ces_map_each(p->partitions, scan_ready, &r);
        p->stream_complete = r.ready;
    }
    ces_lsn_t lsn;
    /* Whole transactions only: the batch may grow past its size by the last one. */
    while (!(batch_full(p) && !drain) && ces_order_oldest(p->order, &lsn, NULL, NULL)) {
        if (!drain) {
            ready_scan_t r = {p, lsn, now_ms, p->options.reorder_window_ms, true};
            ces_map_each(p->partitions, scan_ready, &r);
            if (!r.ready)
                break;
        }
        if (p->batch.count == 0)
            p->batch_started_ms = now_ms;
        if (p->streaming && ces_lsn_compare(lsn, p->stream_lsn) >= 0)
            p->stream_complete = true; /* ready at lsn means ready at the streamed one too */
        if (ces_order_pop_oldest(p->order, &p->batch) < 0)
            return -1;
    }
    return 0;
}

static ces_pipeline_status_t stream_large_transaction(ces_pipeline_t *p, int64_t now_ms,
                                                      char *errstr, size_t errstr_size);

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
    if (!part->assigned || ps->p->consumer == NULL)
        return;
    /* A partition that has not passed the oldest transaction must keep going, or nothing moves. */
    bool needed = !ps->have_oldest || !part->has_frontier ||
                  ces_lsn_compare(part->frontier, ps->oldest) <= 0;
    bool want = !needed && (ps->mode == BOUND_PAUSE || (ps->mode == BOUND_HOLD && part->paused));
    if (want != part->paused &&
        ces_consumer_pause(ps->p->consumer, part->topic, part->partition, want) == 0)
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
        if (give_up_group(p, g, reason) != 0)
            goto nomem;
    }
    if (release_transactions(p, now_ms, false) != 0)
        goto nomem;
    ces_pipeline_status_t st = stream_large_transaction(p, now_ms, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    bound_memory(p);
    return CES_PIPELINE_OK;
nomem:
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

void ces_pipeline_partition_eof(ces_pipeline_t *p, const char *topic, int32_t partition,
                                int64_t eof_offset) {
    partition_t *part = partition_get(p, topic, partition, false);
    if (part != NULL) {
        part->at_eof = true;
        part->eof_offset = eof_offset;
    }
}

ces_pipeline_status_t ces_pipeline_drain(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(p->reasm)) != NULL) {
        char reason[300];
        snprintf(reason, sizeof(reason),
                 "segment group incomplete at the end of the input: %zu segment(s) received",
                 g->count);
        if (p->batch.count == 0)
            p->batch_started_ms = ces_clock_now_ms();
        if (give_up_group(p, g, reason) != 0)
            goto nomem;
    }
    if (release_transactions(p, ces_clock_now_ms(), true) != 0)
        goto nomem;
    return CES_PIPELINE_OK;
nomem:
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

bool ces_pipeline_due(const ces_pipeline_t *p, int64_t now_ms) {
    if (batch_full(p))
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

/* How long an open batch waits for more records before a pause in arrivals applies it. Under a
 * backlog a batch fills while the one before it is in flight, so this matters for a trickle,
 * where it is most of the latency: 5 ms instead of 20 halved p50 at 2,000 events/s (bench/run
 * latency: partition order 16-20 -> 7-9 ms, p99 38-57 -> 24-35 ms) and, side by side, changed
 * no throughput scenario beyond its noise. */
static int64_t settle_ms(const ces_pipeline_t *p) {
    return p->options.batch_max_ms < 5 ? p->options.batch_max_ms : 5;
}

int ces_pipeline_wait_ms(const ces_pipeline_t *p, int64_t now_ms, int max_ms) {
    /* A batch in flight is completed as soon as nothing more is waiting in librdkafka. */
    if (p->flying && max_ms > 1)
        max_ms = 1;
    /* Held transactions are released by time (the reorder window): look again soon. */
    if (p->order != NULL && ces_order_pending_events(p->order) > 0 && max_ms > 10)
        max_ms = 10;
    if (p->batch.count == 0)
        return max_ms;
    /* A batch is applied when it is full, when it is batch_max_ms old, or when nothing more is
     * waiting in librdkafka and it has been open for settle_ms: a steady trickle is applied within
     * a few milliseconds, a backlog in full batches. */
    int64_t age = now_ms - p->batch_started_ms;
    int64_t left = (age < settle_ms(p) ? settle_ms(p) : p->options.batch_max_ms) - age;
    if (left <= 0)
        return p->flying ? 1 : 0; /* due, but it waits for the batch in flight: do not spin */
    return left < max_ms ? (int)left : max_ms;
}

bool ces_pipeline_settled(const ces_pipeline_t *p, int64_t now_ms) {
    return p->batch.count == 0 || now_ms - p->batch_started_ms >= settle_ms(p);
}

/* The position a partition may store: the next record to read, held back by waiting segments. */
static int64_t committable(const ces_pipeline_t *p, const partition_t *part) {
    int64_t next = part->next;
    int64_t held;
    if (ces_reasm_min_offset(p->reasm, part->topic, part->partition, &held) && held < next)
        next = held;
    if (p->order != NULL && ces_order_min_offset(p->order, part->topic, part->partition, &held) &&
        held < next)
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
        partition_t *part = partition_get(p, o->topic, o->partition, false);
        if (part != NULL) {
            part->has_expected = true;
            part->expected = o->next;
            part->dirty = part->next != o->next;
        }
        if (p->consumer != NULL)
            ces_consumer_store_offset(p->consumer, o->topic, o->partition, o->next);
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
        return rewind_all(p, errstr, errstr_size);
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

ces_pipeline_status_t ces_pipeline_complete(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    if (!p->flying)
        return CES_PIPELINE_OK;
    ces_apply_status_t rc = land_in_flight(p, errstr, errstr_size);
    return rc == CES_APPLY_OK ? CES_PIPELINE_OK : apply_failed(p, rc, errstr, errstr_size);
}

bool ces_pipeline_flying(const ces_pipeline_t *p) { return p->flying; }

bool ces_pipeline_ready(ces_pipeline_t *p) {
    if (!p->flying)
        return true;
    /* Memory stays bounded: a batch that has grown to twice its limits (in partition mode events
     * go straight into it) waits for PostgreSQL rather than grow on. */
    if (exceeds_batch(p, p->batch.count / 2, p->batch.bytes / 2))
        return true;
    return ces_apply_ready(p->apply);
}

/* Sends the batch (with the positions it covers) to PostgreSQL; with async, returns while
 * PostgreSQL executes it, to be completed by the next flush or ces_pipeline_complete. */
static ces_pipeline_status_t flush(ces_pipeline_t *p, bool async, char *errstr,
                                   size_t errstr_size) {
    ces_pipeline_status_t pst = ces_pipeline_complete(p, errstr, errstr_size);
    if (pst != CES_PIPELINE_OK)
        return pst;
    /* Inside a streamed transaction nothing is committed, so no position is stored, until its end. */
    bool commit = !p->streaming || p->stream_complete;
    if (p->options.store_offsets && commit) {
        collect_t c = {p, 0};
        ces_map_each(p->partitions, collect_offset, &c);
        if (c.failed) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_PIPELINE_FATAL;
        }
    }
    if (p->batch.count == 0 && p->batch.noffsets == 0 && !(p->streaming && commit))
        return CES_PIPELINE_OK;
    int64_t started_ms = ces_clock_now_ms();
    /* The last part of a streamed transaction commits it: that one waits. */
    if (async && !(p->streaming && commit) &&
        (p->order == NULL || ces_order_set_in_flight(p->order, &p->batch) == 0)) {
        /* The batch moves to in_flight (where ces_apply_send keeps pointing), and the emptied
         * in_flight, with its arrays, becomes the next batch. */
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

ces_pipeline_status_t ces_pipeline_flush(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    return flush(p, false, errstr, errstr_size);
}

ces_pipeline_status_t ces_pipeline_send(ces_pipeline_t *p, char *errstr, size_t errstr_size) {
    return flush(p, p->apply != NULL, errstr, errstr_size);
}

/* Is every owned partition at or past lsn (or quiet), so that no older transaction can come? Then
 * the transaction at lsn may be applied as it arrives, even before it is complete. */
static void scan_startable(void *value, void *arg) {
    ready_scan_t *r = arg;
    const partition_t *part = value;
    if (!r->ready || !part->assigned)
        return;
    if (part->has_frontier && ces_lsn_compare(part->frontier, r->lsn) >= 0)
        return;
    if (!partition_quiet(r->p, part, r->now_ms, r->window_ms))
        r->ready = false;
}

/* Streams the oldest transaction when it has outgrown a batch and nothing older can come. */
static ces_pipeline_status_t stream_large_transaction(ces_pipeline_t *p, int64_t now_ms,
                                                      char *errstr, size_t errstr_size) {
    ces_lsn_t lsn;
    size_t events, bytes;
    if (p->order == NULL || p->stream_complete ||
        !ces_order_oldest(p->order, &lsn, &events, &bytes) ||
        !exceeds_batch(p, events, bytes))
        return CES_PIPELINE_OK;
    if (p->streaming) {
        if (ces_lsn_compare(lsn, p->stream_lsn) != 0)
            return CES_PIPELINE_OK;
    } else {
        ready_scan_t r = {p, lsn, now_ms, p->options.reorder_window_ms, true};
        ces_map_each(p->partitions, scan_startable, &r);
        if (!r.ready)
            return CES_PIPELINE_OK;
        /* Commit what is complete before the long transaction opens. */
        ces_pipeline_status_t st = ces_pipeline_flush(p, errstr, errstr_size);
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
            return rewind_all(p, errstr, errstr_size);
        }
        char text[23];
        ces_lsn_format(lsn, text);
        ces_log_info("source transaction %s is larger than a batch (%zu events or %zu bytes): "
                     "streaming it into one PostgreSQL transaction",
                     text, p->options.batch_max_events, p->options.batch_max_bytes);
        p->streaming = true;
        p->stream_lsn = lsn;
    }
    if (p->batch.count == 0)
        p->batch_started_ms = now_ms;
    if (ces_order_pop_oldest(p->order, &p->batch) < 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    /* Applied while the next part is read, like a full batch. */
    return flush(p, true, errstr, errstr_size);
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
    part->has_frontier = false; /* what it delivered is read again */
    part->at_eof = false;
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
    char why[256];
    /* Records read ahead are read again from the positions below. */
    ces_pipeline_drop_staged(p);
    /* Whether it commits or not, the positions read below account for it. */
    if (p->flying && land_in_flight(p, why, sizeof(why)) != CES_APPLY_OK)
        ces_log_debug("the batch in flight was not applied: %s", why);
    ces_batch_clear(&p->batch);
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(p->reasm)) != NULL)
        ces_reasm_group_free(g);
    ces_reasm_forget_completed(p->reasm);
    if (p->order != NULL)
        ces_order_clear(p->order);
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

/* Records staged before a rebalance were read while the assignment was the old one: they are taken
 * in under it, as if each had been added when it was read. */
static int take_staged_before_rebalance(ces_pipeline_t *p) {
    char err[512];
    if (ces_pipeline_has_staged(p) &&
        ces_pipeline_add_staged(p, ces_clock_now_ms(), false, err, sizeof(err)) != CES_PIPELINE_OK) {
        ces_log_error("taking in the records read before a rebalance: %s", err);
        return -1;
    }
    return 0;
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
    if (ces_pipeline_complete(p, err, sizeof(err)) == CES_PIPELINE_FATAL) {
        ces_log_error("committing before an assignment: %s", err);
        return -1;
    }
    if (p->apply != NULL && /* NULL only in unit tests of the ordering rules */
        ces_apply_read_offsets(p->apply, topic, partitions, n, offsets, err, sizeof(err)) !=
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
        part->assigned = true;
        part->has_frontier = false;
        part->at_eof = false;
        part->paused = false;
        part->last_record_ms = ces_clock_now_ms();
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
    if (take_staged_before_rebalance(p) != 0)
        return -1;
    /* Commit what is complete while the partitions are still ours (the fence refuses it if they
     * are not), then forget them. Segments waiting for reassembly are dropped: the positions stored
     * never passed them, so whoever owns the partitions next reads them again. */
    ces_pipeline_status_t st = ces_pipeline_flush(p, err, sizeof(err));
    if (st == CES_PIPELINE_FATAL) {
        ces_log_error("committing before revocation: %s", err);
        return -1;
    }
    /* Held transactions and segments may cover the revoked partitions: drop them all and go back to
     * the stored positions of the partitions we keep (nothing past a held record was stored). */
    for (size_t i = 0; i < n; i++) {
        partition_t *part = partition_get(p, topic, partitions[i], false);
        if (part != NULL) {
            part->has_next = false;
            part->dirty = false;
            part->has_expected = false;
            part->assigned = false;
            part->has_frontier = false;
            part->at_eof = false;
            part->paused = false;
        }
    }
    bool holding = ces_reasm_pending_groups(p->reasm) > 0 ||
                   (p->order != NULL && ces_order_pending_events(p->order) > 0);
    if (holding && rewind_all(p, err, sizeof(err)) != CES_PIPELINE_OK)
        ces_log_warning("going back before revocation: %s", err);
    return 0;
}

size_t ces_pipeline_batch_events(const ces_pipeline_t *p) { return p->batch.count; }

const ces_item_t *ces_pipeline_batch_item(const ces_pipeline_t *p, size_t i) {
    return i < p->batch.count ? &p->batch.items[i] : NULL;
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
}

typedef struct {
    void (*fn)(void *arg, const char *topic, int32_t partition, int64_t position);
    void *arg;
} each_partition_t;

static void each_partition(void *value, void *arg) {
    const partition_t *part = value;
    each_partition_t *e = arg;
    if (part->assigned)
        e->fn(e->arg, part->topic, part->partition,
              part->has_expected ? part->expected : part->has_next ? part->next : -1);
}

void ces_pipeline_each_partition(ces_pipeline_t *p,
                                 void (*fn)(void *arg, const char *topic, int32_t partition,
                                            int64_t position),
                                 void *arg) {
    each_partition_t e = {fn, arg};
    ces_map_each(p->partitions, each_partition, &e);
}
