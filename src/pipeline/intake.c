/*
 * intake: records in, events and dead letters out (intake.h; pipeline.h names the room's other
 * files).
 *
 * A record is staged, decoded (by the team of decoding threads when there is one: staging lets the
 * helpers decode up to STAGE_DEPTH - 1 stages ahead while this thread reads, takes in and sends;
 * alone, this thread decodes each record just before taking it in), and taken in on the loop's
 * thread, in order: a whole event goes to the orderer (transaction mode) or into the batch
 * (partition mode), a segment to the reassembler, anything that cannot be decoded into the batch
 * as a dead letter with the record's bytes. Events of tables left out by schema.include/exclude
 * are counted and dropped here.
 */
#include "pipeline/intake.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/lateness.h"
#include "pipeline/partitions.h"
#include "pipeline/staging.h"
#include "pipeline/state.h"
#include "util/log.h"

/* Adds a dead-letter item; takes arena. */
static int add_dead_letter(ces_pipeline_t *p, const ces_source_t *source, ces_dl_class_t cls,
                           const char *reason,
                           const char *logicalid, const void *raw, size_t raw_len,
                           ces_arena_t *arena) {
    ces_item_t item = {
        .kind = CES_ITEM_DEAD_LETTER,
        .dl_class = cls,
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

/* An event item: straight into the batch (partition mode) or held by the orderer. Takes arena;
 * more lists the other records the event was joined from (may be NULL). */
static int add_event(ces_pipeline_t *p, const ces_source_t *source, const ces_event_t *event,
                     const void *raw, size_t raw_len, ces_arena_t *arena,
                     const ces_source_t *more, size_t nmore, int64_t now_ms) {
    if ((unsigned)event->op < 4)
        p->stats.events_consumed[event->op]++;
    ces_lsn_t lsn = event->version.commit_lsn;
    bool torn_first = false;
    bool late = p->order != NULL && ces_lateness_is_late(&p->late, p->partitions, source, lsn, &torn_first);
    bool after_release = p->order != NULL && ces_lateness_after_release(&p->late, lsn); /* never late */
    if (p->order != NULL) {
        /* Even a skipped event tells how far its partitions have come. */
        ces_partitions_saw_commit(p->partitions, source, event->version.commit_lsn);
        for (size_t i = 0; i < nmore; i++)
            ces_partitions_saw_commit(p->partitions, &more[i], event->version.commit_lsn);
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
        .late = late,
        .torn = late && torn_first,
        .after_release = after_release,
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
        if (late)
            ces_lateness_late(&p->late, p->partitions, source, lsn, torn_first, now_ms);
        else if (after_release)
            ces_lateness_came_after_release(&p->late, p->partitions, source, lsn, now_ms);
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

/* Dead-letters every segment of a group that cannot be applied; takes the group. */
static int give_up_group(ces_pipeline_t *p, ces_reasm_group_t *g, ces_dl_class_t cls,
                         const char *reason) {
    int rc = 0;
    for (size_t i = 0; i < g->count; i++) {
        ces_segment_t *s = &g->segments[i];
        if (add_dead_letter(p, &s->source, cls, reason, g->logicalid, s->raw, s->raw_len,
                            s->arena) != 0)
            rc = -1;
    }
    g->count = 0; /* every segment now belongs to an item */
    ces_reasm_group_free(g);
    return rc;
}

/* A complete group: decode the joined Data into one event item. */
static int add_joined(ces_pipeline_t *p, ces_reasm_group_t *g, int64_t now_ms, char *errstr,
                      size_t errstr_size) {
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
        return give_up_group(p, g, CES_DL_DECODE, why);
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
    int rc = add_event(p, &source, &event, data, g->data_len, arena, more, g->count - 1, now_ms);
    ces_reasm_group_free(g);
    return rc;
}

static ces_pipeline_status_t handle_reasm(ces_pipeline_t *p, ces_reasm_status_t rs,
                                          ces_reasm_group_t *g, const char *reason,
                                          int64_t now_ms, char *errstr, size_t errstr_size) {
    switch (rs) {
    case CES_REASM_HELD:
        return CES_PIPELINE_OK;
    case CES_REASM_COMPLETE:
        return add_joined(p, g, now_ms, errstr, errstr_size) == 0 ? CES_PIPELINE_OK
                                                                   : CES_PIPELINE_FATAL;
    case CES_REASM_GIVEN_UP:
        return give_up_group(p, g, CES_DL_REASSEMBLY_LIMIT, reason) == 0 ? CES_PIPELINE_OK
                                                                          : CES_PIPELINE_FATAL;
    case CES_REASM_DUPLICATE:
        p->stats.duplicates++;
        return CES_PIPELINE_OK;
    case CES_REASM_NOMEM:
        break;
    }
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

/* A record that cannot be decoded: a dead letter with its bytes. Takes arena. */
static ces_pipeline_status_t undecodable(ces_pipeline_t *p, const ces_source_t *source,
                                         const char *reason, const char *logicalid,
                                         const void *raw, size_t len, ces_arena_t *arena,
                                         char *errstr, size_t errstr_size) {
    if (add_dead_letter(p, source, CES_DL_DECODE, reason, logicalid, raw, len, arena) == 0)
        return CES_PIPELINE_OK;
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

/* The record rec was read: its partition moves on past it (checked first for a source gap when
 * reading resumed there), and *source says where it came from. Returns CES_PIPELINE_OK, the gap's
 * status (then the record is not taken in: nothing past the gap is read), or CES_PIPELINE_FATAL
 * (out of memory). */
static ces_pipeline_status_t note_read(ces_pipeline_t *p, const ces_record_t *rec, int64_t now_ms,
                                       ces_source_t *source, char *errstr, size_t errstr_size) {
    ces_partition_t *part = ces_partitions_get(p->partitions, rec->topic, rec->partition, true);
    if (part == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    if (part->pos.expect_from >= 0) {
        ces_pipeline_status_t st = ces_intake_check_resume(p, part->topic, rec->partition,
                                                           rec->offset, false, errstr, errstr_size);
        if (st != CES_PIPELINE_OK)
            return st;
    }
    if (!p->options.store_positions)
        part->assigned = true; /* a replayed file is a partition of its own */
    ces_positions_on_read(&part->pos, rec->offset);
    part->at_eof = false;
    part->last_record_ms = now_ms;
    *source = (ces_source_t){.topic = part->topic, .partition = rec->partition,
                             .offset = rec->offset};
    p->stats.records++;
    if (p->batch.count == 0)
        p->batch_started_ms = now_ms;
    return CES_PIPELINE_OK;
}

/* The longest reason a held segment's dead letter is given (give_up_group's callers). */
#define DEAD_LETTER_REASON_ROOM 640

/* Room for a string of len bytes in an arena: its NUL, rounded up to the arena's alignment. */
static size_t arena_room(size_t len) { return len + 1 + 15; }

static char *copy_string(ces_arena_t *arena, const char *s) {
    return s != NULL ? ces_arena_strndup(arena, s, strlen(s)) : NULL;
}

/*
 * The segment as it is held: what joining it and its dead letter need (the envelope's strings, its
 * data, the record), copied into an arena of their size, into *seg. Its decoding arena holds the
 * record's whole JSON tree too (tens of MB for a record whose other attributes are large, while
 * its data may be one byte): that goes back to decode a later record (ces_staging_keep_spare),
 * whatever happens. Takes arena; returns 0, or -1 when out of memory.
 */
static int hold_segment(ces_pipeline_t *p, const ces_source_t *source, const ces_envelope_t *env,
                        const void *raw, size_t raw_len, ces_arena_t *arena,
                        ces_segment_t *seg) {
    /* And room for what its dead letter would add (a reason, the logicalid again), so that it
     * does not take a block of its own then. */
    size_t room = arena_room(raw_len) + arena_room(env->data_len) +
                  2 * arena_room(strlen(env->logicalid)) + DEAD_LETTER_REASON_ROOM +
                  (env->id != NULL ? arena_room(strlen(env->id)) : 0) +
                  (env->time != NULL ? arena_room(strlen(env->time)) : 0);
    ces_arena_t *held = ces_arena_new_whole(room);
    ces_envelope_t e = *env;
    const void *raw_copy = NULL;
    if (held != NULL) {
        e.id = copy_string(held, env->id);
        e.logicalid = copy_string(held, env->logicalid);
        e.time = copy_string(held, env->time);
        e.data = ces_arena_strndup(held, env->data, env->data_len);
        e.data_tree = NULL; /* a segment carries data as a string */
        raw_copy = ces_arena_strndup(held, raw, raw_len);
    }
    ces_staging_keep_spare(p, arena);
    if (held == NULL || raw_copy == NULL || e.data == NULL || e.logicalid == NULL ||
        (env->id != NULL && e.id == NULL) || (env->time != NULL && e.time == NULL)) {
        ces_arena_destroy(held);
        return -1;
    }
    *seg = (ces_segment_t){
        .source = *source,
        .envelope = e,
        .index = e.index,
        .final_segment = e.final_segment,
        .split_total = e.legacy ? e.split_total : -1,
        .data = e.data,
        .data_len = e.data_len,
        .raw = raw_copy,
        .raw_len = raw_len,
        .arena = held,
    };
    return 0;
}

/* A segment of an event (env, its record's copy raw): to the reassembler, which may complete its
 * group. Takes arena. */
static ces_pipeline_status_t add_segment(ces_pipeline_t *p, const ces_source_t *source,
                                         const ces_envelope_t *env, const void *raw,
                                         size_t raw_len, ces_arena_t *arena, int64_t now_ms,
                                         char *errstr, size_t errstr_size) {
    if (env->data == NULL)
        return undecodable(p, source, "a segment must carry data as a string", env->logicalid,
                           raw, raw_len, arena, errstr, errstr_size);
    ces_segment_t seg;
    if (hold_segment(p, source, env, raw, raw_len, arena, &seg) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_PIPELINE_FATAL;
    }
    ces_reasm_group_t *group = NULL;
    char reason[512];
    ces_reasm_status_t rs = ces_reasm_add(p->reasm, seg.envelope.logicalid, &seg, now_ms, &group,
                                          reason, sizeof(reason));
    return handle_reasm(p, rs, group, reason, now_ms, errstr, errstr_size);
}

/* Takes in a decoded record, in order, on the loop's thread. */
static ces_pipeline_status_t take_record(ces_pipeline_t *p, staged_t *s, int64_t now_ms,
                                         char *errstr, size_t errstr_size) {
    const ces_record_t *rec = &s->rec;
    ces_arena_t *arena = s->arena;
    s->arena = NULL;
    /* The record's one copy, made before its bytes go back to the feed: a whole event's goes
     * into its compact copy (the decoding arena, JSON trees included, is several times the size
     * of both, and is kept for a later record); anything else's stays in its decoding arena (a
     * segment until its group is joined, a dead letter until it is written). Made here, not by a
     * decoding thread: memory is then allocated and freed by this thread alone. */
    ces_event_t held;
    ces_arena_t *compact = NULL;
    const void *raw = NULL;
    bool whole_event = !s->nomem && s->whole && s->event_status == CES_DECODE_OK;
    if (whole_event) {
        compact = ces_event_copy_new(&s->event, rec->len + 16 + 64, &held);
        raw = compact ? ces_arena_strndup(compact, rec->value, rec->len) : NULL;
    } else if (!s->nomem) {
        raw = ces_arena_strndup(arena, rec->value, rec->len);
    }
    s->nomem = s->nomem || raw == NULL;
    ces_staging_give_back(p, rec->handle);
    if (p->flying && (++p->adds & 15) == 0)
        ces_apply_progress(p->apply);
    if (s->nomem)
        goto nomem;
    ces_source_t source;
    ces_pipeline_status_t st = note_read(p, rec, now_ms, &source, errstr, errstr_size);
    if (st != CES_PIPELINE_OK) {
        ces_arena_destroy(compact);
        ces_arena_destroy(arena);
        return st;
    }
    ces_envelope_t env = s->env;
    if (s->envelope_status == CES_DECODE_NOMEM)
        goto nomem;
    if (s->envelope_status == CES_DECODE_REJECTED)
        return undecodable(p, &source, s->reason, NULL, raw, rec->len, arena, errstr,
                           errstr_size);
    if (s->whole) {
        if (whole_event) {
            /* Held as its compact copy: the decoding arena decodes a later record. */
            ces_staging_keep_spare(p, arena);
            if (add_event(p, &source, &held, raw, rec->len, compact, NULL, 0, now_ms) != 0)
                goto nomem_taken;
            return CES_PIPELINE_OK;
        }
        if (s->event_status == CES_DECODE_NOMEM)
            goto nomem;
        /* A current-generation record with index 1 and finalsegment may also be the last of two
         * 0-based segments: only then does its data fail to decode on its own. */
        if (env.legacy || env.index != 1 || env.data == NULL)
            return undecodable(p, &source, s->reason, env.logicalid, raw, rec->len, arena,
                               errstr, errstr_size);
        /* Its data went to the failed decoding: the segment takes the envelope read again. */
        char again[512];
        ces_decode_status_t ds =
            ces_decode_envelope(p->decoder, arena, raw, rec->len, &env, again, sizeof(again));
        if (ds == CES_DECODE_NOMEM)
            goto nomem;
        if (ds != CES_DECODE_OK) /* it was read once already: the same bytes cannot fail now */
            return undecodable(p, &source, again, NULL, raw, rec->len, arena, errstr,
                               errstr_size);
    }
    return add_segment(p, &source, &env, raw, rec->len, arena, now_ms, errstr, errstr_size);
nomem:
    ces_arena_destroy(compact);
    ces_arena_destroy(arena);
nomem_taken:
    snprintf(errstr, errstr_size, "out of memory");
    return CES_PIPELINE_FATAL;
}

bool ces_intake_stage(ces_pipeline_t *p, const ces_record_t *rec) {
    stage_t *stage = &p->stages[p->fill_index];
    staged_t *s = &stage->items[stage->count++];
    s->rec = *rec;
    /* Helpers decode with the arena given here; alone, this thread gives each record the arena
     * the record before it left, as it decodes it (take_stage). */
    s->arena = p->team != NULL ? ces_staging_take_spare(p) : NULL;
    s->nomem = false;
    s->whole = false;
    stage->bytes += rec->len;
    return stage->count == STAGE_RECORDS || stage->bytes >= STAGE_BYTES;
}

size_t ces_intake_room(const ces_pipeline_t *p) {
    const stage_t *filling = &p->stages[p->fill_index];
    size_t room = STAGE_RECORDS - filling->count;
    if (p->options.ordering != CES_ORDER_BY_PARTITION)
        return room;
    size_t limits = p->flying ? 2 : 1;
    size_t staged = filling->count, staged_bytes = filling->bytes;
    for (size_t k = 0; k < p->ndecoding; k++) {
        const stage_t *d = &p->stages[ces_staging_decoding_index(p, k)];
        staged += d->count;
        staged_bytes += d->bytes;
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

bool ces_intake_busy(const ces_pipeline_t *p) {
    return p->ndecoding > 0 || p->stages[p->fill_index].count > 0;
}

/*
 * Takes in a stage's records, in order: decoded already (by the team), or, decode_each, each
 * decoded just before it is taken in, in the arena the record before it left. Alone, that keeps
 * one decoding arena going round instead of one per staged record (each as large as its record,
 * which adds up in peak memory on wide records), and a record's bytes, tree and event are
 * still in the core's cache when it is copied.
 */
static ces_pipeline_status_t take_stage(ces_pipeline_t *p, stage_t *stage, bool decode_each,
                                        int64_t now_ms, char *errstr, size_t errstr_size) {
    for (size_t i = 0; i < stage->count; i++) {
        staged_t *s = &stage->items[i];
        if (decode_each) {
            s->arena = ces_staging_take_spare(p); /* staged without one (ces_intake_stage) */
            ces_staging_decode(p->decoder, stage, i);
        }
        ces_pipeline_status_t st = take_record(p, s, now_ms, errstr, errstr_size);
        if (st != CES_PIPELINE_OK) {
            ces_staging_unstage(p, stage, i + 1);
            return st;
        }
    }
    stage->count = 0;
    stage->bytes = 0;
    return CES_PIPELINE_OK;
}

/*
 * With helpers and more records coming, the stage just filled is handed to them and this thread
 * goes on: it takes in the decoded stages that are ready, and waits for (helps with) the oldest
 * only when every stage is taken, so that a helper the scheduler keeps off the CPU for a while
 * (PostgreSQL and the broker share the machine) delays nothing. Otherwise everything staged is
 * decoded and taken in now.
 */
ces_pipeline_status_t ces_intake_take(ces_pipeline_t *p, int64_t now_ms, bool more_coming,
                                      char *errstr, size_t errstr_size) {
    bool ahead = more_coming && p->team != NULL;
    stage_t *next = &p->stages[p->fill_index];
    if (ahead && next->count > 0) {
        ces_team_start(p->team, ces_staging_decode, next, next->count);
        p->ndecoding++;
        p->fill_index = (p->fill_index + 1) % STAGE_DEPTH;
        next = NULL;
    }
    ces_pipeline_status_t st = CES_PIPELINE_OK;
    while (st == CES_PIPELINE_OK && p->ndecoding > 0) {
        stage_t *oldest = &p->stages[ces_staging_decoding_index(p, 0)];
        if (ahead && p->ndecoding < STAGE_DEPTH - 1 &&
            !ces_team_done(p->team, oldest, oldest->count))
            break;
        st = take_stage(p, ces_staging_finish_oldest(p), false, now_ms, errstr, errstr_size);
    }
    if (st == CES_PIPELINE_OK && next != NULL) {
        if (p->team != NULL)
            ces_team_run(p->team, ces_staging_decode, next, p->decoder, next->count);
        st = take_stage(p, next, p->team == NULL, now_ms, errstr, errstr_size);
    }
    if (st != CES_PIPELINE_OK)
        ces_staging_drop(p);
    return st;
}

ces_pipeline_status_t ces_intake_add(ces_pipeline_t *p, const ces_record_t *rec, int64_t now_ms,
                                     char *errstr, size_t errstr_size) {
    ces_intake_stage(p, rec);
    return ces_intake_take(p, now_ms, false, errstr, errstr_size);
}

/* A gap at the source: logged, counted, and either the end of the loop or recorded with the batch
 * that moves past it. */
static ces_pipeline_status_t source_gap(ces_pipeline_t *p, ces_partition_t *part,
                                        const ces_source_gap_t *gap, char *errstr,
                                        size_t errstr_size) {
    p->stats.source_gaps++;
    char skipped[64] = "an unknown number of records";
    if (gap->skipped >= 0) {
        p->stats.source_gap_records += (uint64_t)gap->skipped;
        snprintf(skipped, sizeof(skipped), "%lld record(s)", (long long)gap->skipped);
    }
    ces_log_error("source gap on %s[%d]: PostgreSQL's stored position is %lld, but reading "
                  "resumes at %lld: %s; %s were never read, and their changes are missing from "
                  "PostgreSQL",
                  gap->topic, (int)gap->partition, (long long)gap->stored,
                  (long long)gap->resumed, gap->reason, skipped);
    if (p->options.stop_on_source_gap) {
        snprintf(errstr, errstr_size,
                 "stopped at a source gap on %s[%d] (kafka.on_source_gap = \"stop\"): nothing "
                 "past position %lld is applied. To re-seed, reload the tables this partition "
                 "feeds from SQL Server (rows loaded before ces2pg are adopted, and newer changes "
                 "still win), then accept the gap. To accept it, start ces2pg once with "
                 "kafka.on_source_gap = \"continue\": the gap is recorded in the metadata "
                 "schema's source_gaps table and replication goes on from %lld",
                 gap->topic, (int)gap->partition, (long long)gap->stored,
                 (long long)gap->resumed);
        return CES_PIPELINE_SOURCE_GAP;
    }
    ces_log_warning("%s[%d]: going on from %lld (kafka.on_source_gap = \"continue\"); the gap is "
                    "recorded in the metadata schema's source_gaps table",
                    gap->topic, (int)gap->partition, (long long)gap->resumed);
    ces_positions_resume_checked(&part->pos, gap);
    return CES_PIPELINE_OK;
}

/* Records between the stored position and the first one read may be missing for reasons that lose
 * nothing (transaction markers of a transactional producer, compaction): only a broker whose
 * partition now starts past the stored position has lost records. When it cannot be asked, the
 * gap stands: never silent. */
static bool records_removed(const ces_pipeline_t *p, const ces_source_gap_t *gap) {
    int64_t low, high;
    if (p->feed.watermarks == NULL ||
        p->feed.watermarks(p->feed.opaque, gap->topic, gap->partition, &low, &high) != 0)
        return true;
    return low > gap->stored;
}

ces_pipeline_status_t ces_intake_check_resume(ces_pipeline_t *p, const char *topic,
                                              int32_t partition, int64_t offset, bool eof,
                                              char *errstr, size_t errstr_size) {
    ces_partition_t *part = ces_partitions_get(p->partitions, topic, partition, false);
    ces_source_gap_t gap;
    if (part == NULL ||
        !ces_positions_check_resume(&part->pos, part->topic, partition, offset, eof, &gap))
        return CES_PIPELINE_OK;
    if (gap.skipped > 0 && !records_removed(p, &gap)) {
        ces_log_info("%s[%d]: reading resumes at %lld, not at the stored %lld: the offsets between "
                     "hold no records (transaction markers or compaction), no gap",
                     part->topic, (int)partition, (long long)offset, (long long)gap.stored);
        ces_positions_resume_checked(&part->pos, NULL);
        return CES_PIPELINE_OK;
    }
    return source_gap(p, part, &gap, errstr, errstr_size);
}

ces_pipeline_status_t ces_intake_out_of_range(ces_pipeline_t *p, const char *topic,
                                              int32_t partition, int64_t offset, char *errstr,
                                              size_t errstr_size) {
    ces_partition_t *part = ces_partitions_get(p->partitions, topic, partition, false);
    if (part == NULL)
        return CES_PIPELINE_OK;
    int64_t low = -1, high;
    bool known = p->feed.watermarks != NULL &&
                 p->feed.watermarks(p->feed.opaque, topic, partition, &low, &high) == 0;
    ces_source_gap_t gap = {
        .topic = part->topic,
        .partition = partition,
        .stored = offset,
        .resumed = known ? low : offset,
        .skipped = known && low > offset ? low - offset : -1,
        .reason = "the broker holds no record at the stored position (auto.offset.reset=error)",
    };
    ces_pipeline_status_t st = source_gap(p, part, &gap, errstr, errstr_size);
    if (st != CES_PIPELINE_OK)
        return st;
    if (!known || p->feed.seek == NULL ||
        p->feed.seek(p->feed.opaque, part->topic, partition, low) != 0) {
        snprintf(errstr, errstr_size, "%s[%d]: cannot move past the source gap at %lld",
                 part->topic, (int)partition, (long long)offset);
        return CES_PIPELINE_FATAL;
    }
    return CES_PIPELINE_OK;
}

int ces_intake_expire(ces_pipeline_t *p, int64_t now_ms) {
    ces_reasm_group_t *g;
    while ((g = ces_reasm_expire(p->reasm, now_ms)) != NULL) {
        char reason[300];
        snprintf(reason, sizeof(reason),
                 "segment group incomplete after %lld ms (reassembly.timeout_ms): %zu segment(s) "
                 "received",
                 (long long)p->options.reasm.timeout_ms, g->count);
        if (p->batch.count == 0)
            p->batch_started_ms = now_ms;
        if (give_up_group(p, g, CES_DL_SEGMENTS_INCOMPLETE, reason) != 0)
            return -1;
    }
    return 0;
}

int ces_intake_give_up_all(ces_pipeline_t *p, int64_t now_ms) {
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(p->reasm)) != NULL) {
        char reason[300];
        snprintf(reason, sizeof(reason),
                 "segment group incomplete at the end of the input: %zu segment(s) received",
                 g->count);
        if (p->batch.count == 0)
            p->batch_started_ms = now_ms;
        if (give_up_group(p, g, CES_DL_SEGMENTS_INCOMPLETE, reason) != 0)
            return -1;
    }
    return 0;
}
