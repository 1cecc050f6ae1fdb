/*
 * staging: records read ahead of being taken in, their decoding, and spare decoding arenas
 * (staging.h).
 */
#include "pipeline/staging.h"

#include "pipeline/state.h"

void ces_staging_unstage(ces_pipeline_t *p, stage_t *stage, size_t from) {
    for (size_t i = from; i < stage->count; i++) {
        staged_t *s = &stage->items[i];
        ces_staging_give_back(p, s->rec.handle);
        ces_arena_destroy(s->arena);
        s->arena = NULL;
    }
    stage->count = 0;
    stage->bytes = 0;
}

size_t ces_staging_decoding_index(const ces_pipeline_t *p, size_t k) {
    return (p->fill_index + STAGE_DEPTH - p->ndecoding + k) % STAGE_DEPTH;
}

stage_t *ces_staging_finish_oldest(ces_pipeline_t *p) {
    if (p->ndecoding == 0)
        return NULL;
    stage_t *stage = &p->stages[ces_staging_decoding_index(p, 0)];
    ces_team_finish(p->team, ces_staging_decode, stage, p->decoder, stage->count);
    p->ndecoding--;
    return stage;
}

void ces_staging_drop(ces_pipeline_t *p) {
    stage_t *decoded;
    while ((decoded = ces_staging_finish_oldest(p)) != NULL)
        ces_staging_unstage(p, decoded, 0);
    ces_staging_unstage(p, &p->stages[p->fill_index], 0);
}

/* The envelope says the record is a whole event, not a segment of one. */
static bool is_whole(const ces_envelope_t *env) {
    if (env->legacy)
        return env->split_total == 0 || env->split_total == 1;
    return env->final_segment && env->index <= 1;
}

void ces_staging_decode(void *worker, void *job, size_t item) {
    ces_decoder_t *decoder = worker;
    staged_t *s = &((stage_t *)job)->items[item];
    const ces_record_t *rec = &s->rec;
    /* Decoded from the feed's own bytes, which stay until the record is taken in (librdkafka's
     * message then goes back at once: a held message would keep the buffer of its whole fetch
     * alive). Taking in copies the record once, to wherever it is kept. The decoded tree and
     * strings take about as much as the record. */
    if (s->arena == NULL)
        s->arena = ces_arena_new_sized(rec->len + 512);
    if (s->arena == NULL) {
        s->nomem = true;
        return;
    }
    s->envelope_status = ces_decode_envelope(decoder, s->arena, rec->value, rec->len, &s->env,
                                             s->reason, sizeof(s->reason));
    s->whole = s->envelope_status == CES_DECODE_OK && is_whole(&s->env);
    if (!s->whole)
        return;
    /* The data string is the arena's copy, read only here: decoded in place (see intake.c for the
     * record that turns out to be a segment after all). */
    s->event_status = ces_decode_event_in_place(decoder, s->arena, &s->env, (char *)s->env.data,
                                                s->env.data_len, &s->event, s->reason,
                                                sizeof(s->reason));
}

ces_arena_t *ces_staging_take_spare(ces_pipeline_t *p) {
    if (p->nspares == 0)
        return NULL;
    ces_arena_t *arena = p->spares[--p->nspares];
    p->spare_bytes -= ces_arena_footprint(arena);
    return arena;
}

void ces_staging_keep_spare(ces_pipeline_t *p, ces_arena_t *arena) {
    ces_arena_reset(arena);
    size_t footprint = ces_arena_footprint(arena);
    if (p->nspares < sizeof(p->spares) / sizeof(p->spares[0]) &&
        p->spare_bytes + footprint <= SPARE_BYTES) {
        p->spares[p->nspares++] = arena;
        p->spare_bytes += footprint;
    } else {
        ces_arena_destroy(arena);
    }
}
