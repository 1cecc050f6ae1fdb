/*
 * staging: records read and not taken in yet, decoded meanwhile (by the team of decoding threads
 * when there is one), and the emptied decoding arenas kept for the next ones. Below intake, which
 * stages records and takes them in, and below flight and the loop, which drop what is staged when
 * reading goes back or ends.
 *
 * A staged record's handle and bytes are the feed's until the record is taken in or dropped; then
 * the handle is given back to the feed (ces_staging_give_back, in state.h), whatever happens.
 */
#ifndef CES_STAGING_H
#define CES_STAGING_H

#include <stdbool.h>
#include <stddef.h>

#include "format/decode.h"
#include "input/feed.h"
#include "pipeline/pipeline.h"
#include "util/arena.h"

/*
 * A record on its way in. ces_intake_stage keeps it; the team decodes it (any thread, touching only
 * the record's own slot and the worker's decoder); then it is taken in, in order, on the loop's
 * thread.
 */
typedef struct {
    ces_record_t rec;
    ces_arena_t *arena; /* decoding arena: owned by the slot until taken */
    bool nomem;
    ces_decode_status_t envelope_status;
    ces_envelope_t env;
    bool whole;                       /* the envelope says the record is a whole event */
    ces_decode_status_t event_status; /* whole: of its Data */
    ces_event_t event;                /* decoded: in arena */
    char reason[512];
} staged_t;

/* Records staged before they are decoded together: enough to share among a few threads, few
 * enough that the batch and the held events do not grow much past their limits meanwhile. */
#define STAGE_RECORDS 32
#define STAGE_BYTES (256u << 10)
/* Stages: one filling and the rest decoding ahead, so that a helper always has a stage to work on
 * while this thread reads, takes in and sends (and rarely waits for a helper in mid-record). */
#define STAGE_DEPTH 4
/* Emptied decoding arenas kept for the next records: with helpers, one for every record the stages
 * hold (alone, the loop's thread decodes each record in the one the record before it left), so that
 * none is made by a decoding thread and freed by this one (glibc then takes the other thread's
 * malloc lock, which the loop then waits for), within a bound on the memory they keep. */
#define SPARE_BYTES (2u << 20)

typedef struct {
    staged_t items[STAGE_RECORDS];
    size_t count;
    size_t bytes;
} stage_t;

/*
 * Decodes a staged record as far as it goes without the pipeline's state: its envelope and, for a
 * whole event, its Data, in the slot's arena (taking it in makes the compact copy the event is
 * held as). A ces_team_fn: job is a stage_t, worker the thread's decoder; runs on any thread of the
 * team.
 */
void ces_staging_decode(void *worker, void *job, size_t item);

/* The index of stage k (0: the oldest) of those the team decodes (k < ndecoding). */
size_t ces_staging_decoding_index(const ces_pipeline_t *p, size_t k);
/* The oldest stage the team decodes, complete (this thread doing what is left), or NULL. */
stage_t *ces_staging_finish_oldest(ces_pipeline_t *p);
/* Gives back the records of a stage from item from on, undecoded or decoded (not while the team
 * works on it), and empties the stage. */
void ces_staging_unstage(ces_pipeline_t *p, stage_t *stage, size_t from);
/* Gives back every record staged and not taken in (after a seek back, or a failure, they are read
 * again). */
void ces_staging_drop(ces_pipeline_t *p);

/* The emptied decoding arena kept last (the likeliest still in the core's cache), or NULL. */
ces_arena_t *ces_staging_take_spare(ces_pipeline_t *p);
/* Keeps an emptied decoding arena for a later record, within SPARE_BYTES; else frees it. Takes
 * arena. */
void ces_staging_keep_spare(ces_pipeline_t *p, ces_arena_t *arena);

#endif
