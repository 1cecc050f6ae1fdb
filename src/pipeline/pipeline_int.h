/*
 * pipeline_int: the pipeline room's private header (pipeline.c, intake.c, release.c, flight.c,
 * loop.c, and the unit tests of the release rules). Nothing outside the room includes it.
 *
 * All of the pipeline's state lives in struct ces_pipeline_s and is touched by the thread that
 * runs the loop only, except a stage's records while the decoding team works on them (intake.c).
 */
#ifndef CES_PIPELINE_INT_H
#define CES_PIPELINE_INT_H

#include "util/map.h"
#include "order/order.h"
#include "pipeline/pipeline.h"
#include "apply/positions.h"
#include "util/team.h"
#include "order/window.h"

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
 * malloc lock: a fifth of the loop's waits on bench/run insert with two threads), within a bound
 * on the memory they keep. */
#define SPARE_BYTES (2u << 20)

typedef struct {
    staged_t items[STAGE_RECORDS];
    size_t count;
    size_t bytes;
} stage_t;

/* What the pipeline knows of one partition. */
typedef struct {
    char *topic; /* owned; items and offsets refer to it */
    int32_t partition;
    ces_partition_position_t pos; /* where it stands (positions.h) */
    bool assigned;      /* ours now: the orderer waits for it */
    bool has_frontier;
    ces_lsn_t frontier; /* highest commit LSN it delivered: it will not deliver older ones */
    bool at_eof;        /* caught up with the broker since its last record */
    int64_t eof_offset; /* where the end was when it was reached */
    int64_t last_record_ms;
    bool paused;
    /* Transactions up to this one were sent before the partition was assigned to us: its events of
     * them come from before we owned it, not late (has_late_floor). */
    bool has_late_floor;
    ces_lsn_t late_floor;
} partition_t;

/* Transaction mode: how the bet of the reorder window is doing (release.c). A transaction counts
 * as sent once the batch it was released into went to PostgreSQL; an event of a transaction at or
 * before the newest one sent arrived too late to join it (the transaction was torn). */
#define SENT_HISTORY 1024 /* transactions whose sending time is remembered */
#define TORN_HISTORY 64   /* torn transactions remembered, so each is counted once */

typedef struct {
    ces_lsn_t lsn;
    int64_t sent_ms;   /* 0: released into the batch being built, not sent yet */
    int64_t window_ms; /* the reorder window in force when it was released */
} sent_t;

typedef struct {
    ces_window_t window; /* the effective reorder window */
    bool has_released;
    ces_lsn_t released_max; /* the newest transaction released into a batch */
    bool has_sent;
    ces_lsn_t sent_max; /* the newest transaction sent to PostgreSQL */
    sent_t sent[SENT_HISTORY]; /* a ring, in LSN order: newest at sent_next - 1 */
    size_t sent_count, sent_next, unstamped; /* the newest `unstamped` are not sent yet */
    ces_lsn_t torn[TORN_HISTORY]; /* a ring of the last torn transactions */
    size_t torn_count, torn_next;
    int64_t last_warning_ms; /* the warnings about late events are rate-limited */
    uint64_t unreported;     /* late events since the last warning */
} lateness_t;

struct ces_pipeline_s {
    ces_pipeline_options_t options;
    ces_decoder_t *decoder;
    ces_apply_t *apply;
    ces_feed_t feed; /* all NULL until ces_pipeline_set_feed */
    ces_reasm_t *reasm;
    ces_order_t *order;          /* transaction mode only */
    ces_map_t *partitions;       /* "topic\x1fpartition" -> partition_t */
    partition_t *last_partition; /* reference into partitions: the one looked up last */
    ces_batch_t batch;
    int64_t batch_started_ms;
    /* The batch PostgreSQL is applying while the next one is read (flight.c). */
    ces_batch_t in_flight;
    bool flying;
    int64_t in_flight_started_ms;
    bool in_flight_commits; /* false: a part of the streamed transaction */
    unsigned adds; /* records taken in: every few, libpq is given the chance to send more */
    /* Stages used in turn: stages[fill_index] takes ces_intake_stage's records, and the ndecoding
     * before it (oldest first) are handed to the team and not taken in yet. */
    stage_t stages[STAGE_DEPTH];
    size_t fill_index;
    size_t ndecoding;
    /* Arenas whole events were decoded in, emptied: the next records are decoded in them (a
     * record's JSON trees need several blocks, which would be malloc'ed and freed each time). */
    ces_arena_t *spares[STAGE_DEPTH * STAGE_RECORDS];
    size_t nspares;
    size_t spare_bytes; /* their footprints, at most SPARE_BYTES */
    /* Decoding threads besides the loop's, each with a decoder of its own. */
    ces_team_t *team;
    ces_decoder_t **helper_decoders;
    size_t nhelpers;
    ces_pipeline_stats_t stats;
    /* A source transaction too large for memory is streamed into one open PostgreSQL transaction. */
    bool streaming;
    bool stream_complete; /* its last events are in the batch: the next flush commits */
    ces_lsn_t stream_lsn;
    ces_apply_stats_t stream_stats; /* what the open transaction holds, counted once committed */
    lateness_t late; /* transaction mode */
    /* A rebalance callback could not take in the records staged before it (a source gap among
     * them, with kafka.on_source_gap = "stop", or a failure): the consumer then stops with a
     * generic error, and the loop ends with this status and message instead. */
    ces_pipeline_status_t rebalance_status;
    char rebalance_error[1024];
};

/* ---- pipeline.c ---- */

/* The partition's entry (made when create and new; NULL when out of memory or unknown). */
partition_t *ces_pipeline_partition(ces_pipeline_t *p, const char *topic, int32_t partition,
                                    bool create);
/* events and bytes (of arenas) reach a batch's limits (apply.batch_max_events or _bytes). */
bool ces_pipeline_exceeds_batch(const ces_pipeline_t *p, size_t events, size_t bytes);
/* The batch being built: what the next flush would apply (unit tests and diagnostics). */
size_t ces_pipeline_batch_events(const ces_pipeline_t *p);
const ces_item_t *ces_pipeline_batch_item(const ces_pipeline_t *p, size_t i);

/* ---- intake.c: records in, events and dead letters out ---- */

/*
 * Stages a record (nothing is decoded yet): its handle and value stay untouched until taken in,
 * then the handle is released through the feed whatever happens. Returns true when the stage is
 * full: then ces_intake_take must come before the next ces_intake_stage.
 */
bool ces_intake_stage(ces_pipeline_t *p, const ces_record_t *record);
/* How many records may be staged now (0 .. the stage's free slots). In partition mode each record
 * may become an item of the batch being read, which stays within its limits (twice them while a
 * batch is in flight); 0 then means: take the staged records in and send. In transaction mode
 * held events are bounded by pausing partitions instead. */
size_t ces_intake_room(const ces_pipeline_t *p);
/* True while records are staged or decoding, not yet taken in. */
bool ces_intake_busy(const ces_pipeline_t *p);
/*
 * Takes the staged records in, in order. With more_coming (the stage filled and more records wait
 * to be read), the records just staged are decoded by the other threads while the caller goes on,
 * and taken in by the next call: until then they count as not yet read (a rewind drops them).
 * Without it, every staged record is taken in before it returns.
 */
ces_pipeline_status_t ces_intake_take(ces_pipeline_t *p, int64_t now_ms, bool more_coming,
                                      char *errstr, size_t errstr_size);
/* Stages one record and takes it in at once (unit tests). */
ces_pipeline_status_t ces_intake_add(ces_pipeline_t *p, const ces_record_t *record,
                                     int64_t now_ms, char *errstr, size_t errstr_size);
/* Releases the records staged and not taken in (they are read again). */
void ces_intake_drop(ces_pipeline_t *p);
/*
 * Reading of topic[partition] resumed at offset (its first record, or eof: its end): a source gap
 * when that is not where it was to resume after an assignment or a rewind (positions.h). A gap is
 * logged and counted; it stops the loop (CES_PIPELINE_SOURCE_GAP, what to do in errstr) or, with
 * kafka.on_source_gap = "continue", is recorded with the batch whose position moves past it.
 */
ces_pipeline_status_t ces_intake_check_resume(ces_pipeline_t *p, const char *topic,
                                              int32_t partition, int64_t offset, bool eof,
                                              char *errstr, size_t errstr_size);
/* The broker has no record at offset of topic[partition], and librdkafka stopped the partition
 * (auto.offset.reset=error): a source gap, which stops the loop or moves the partition on to the
 * first record the broker holds. */
ces_pipeline_status_t ces_intake_out_of_range(ces_pipeline_t *p, const char *topic,
                                              int32_t partition, int64_t offset, char *errstr,
                                              size_t errstr_size);
/* Segment groups older than reassembly.timeout_ms become dead letters. Returns 0 or -1 (memory). */
int ces_intake_expire(ces_pipeline_t *p, int64_t now_ms);
/* The input ended: every incomplete segment group becomes dead letters. Returns 0 or -1. */
int ces_intake_give_up_all(ces_pipeline_t *p, int64_t now_ms);

/* Gives a record's handle back to the feed. */
static inline void ces_intake_give_back(ces_pipeline_t *p, void *handle) {
    if (handle != NULL && p->feed.give_back != NULL)
        p->feed.give_back(p->feed.opaque, handle);
}

/* ---- release.c: when held transactions go, and bounded memory ---- */

/*
 * Transaction mode: is an event of commit LSN lsn, from source, too late to join its transaction
 * (one at or before it went to PostgreSQL already, while its partition was ours)? Returns false, or
 * true with *torn_first set when no late event of lsn was seen before. Cheap: one comparison for an
 * event on time.
 */
bool ces_release_is_late(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                         bool *torn_first);
/* topic[partition] was assigned to us now: what was sent before is no business of its events. */
void ces_release_assigned(ces_pipeline_t *p, partition_t *part);
/* A late event was taken in at now_ms (not a duplicate): remembers its transaction as torn, warns
 * (rate-limited) and adapts the window. */
void ces_release_late(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                      bool torn_first, int64_t now_ms);
/* Transaction mode: did an event of commit LSN lsn, not late, come after its transaction (or a
 * later one) was released into the batch being built? Then it cannot join that batch; if the batch
 * goes to PostgreSQL before the event is released, its transaction is torn, which the release
 * decides (the item's after_release). One comparison for an event on time. */
bool ces_release_after_release(const ces_pipeline_t *p, ces_lsn_t lsn);
/* Such an event was taken in at now_ms: the window's bet was lost, and it grows as for a late
 * event that came at once. */
void ces_release_came_after_release(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn,
                                    int64_t now_ms);
/* The batch being built goes to PostgreSQL now: the transactions released into it are sent. */
void ces_release_sent(ces_pipeline_t *p, int64_t now_ms);
/* Forgets what was sent (after going back to the stored positions, records are read again). */
void ces_release_forget(ces_pipeline_t *p);

/* The partition of source delivered an event of commit LSN lsn: it will deliver no older one. */
void ces_release_saw_commit(ces_pipeline_t *p, const ces_source_t *source, ces_lsn_t lsn);
/* The partition reached the end of what the broker holds (it is caught up), at eof_offset. */
void ces_release_partition_eof(ces_pipeline_t *p, const char *topic, int32_t partition,
                               int64_t eof_offset);
/* Gives up segment groups that timed out, releases the source transactions that are complete
 * into the batch, streams one too large for a batch, and pauses or resumes partitions to keep
 * memory bounded. */
ces_pipeline_status_t ces_release_tick(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                       size_t errstr_size);
/* The input ended: every incomplete segment group becomes dead letters, every held transaction
 * is complete and goes into the batch. */
ces_pipeline_status_t ces_release_drain(ces_pipeline_t *p, int64_t now_ms, char *errstr,
                                        size_t errstr_size);

/* ---- flight.c: the batch in flight, commits and rewinds ---- */

/* Applies the batch and stores the positions it covers, in one PostgreSQL transaction (after
 * completing the batch in flight): when it returns, everything is committed. */
ces_pipeline_status_t ces_flight_flush(ces_pipeline_t *p, char *errstr, size_t errstr_size);
/* The same without waiting: the batch goes in flight, PostgreSQL executes it while the loop reads
 * the next one, and the next send, flush or complete commits it. Its positions are stored (in
 * PostgreSQL and Kafka) only then. The parts of a streamed transaction go the same way; its last
 * part, which commits, waits. */
ces_pipeline_status_t ces_flight_send(ces_pipeline_t *p, char *errstr, size_t errstr_size);
/* Waits for the batch in flight and commits it (nothing to do when there is none). */
ces_pipeline_status_t ces_flight_complete(ces_pipeline_t *p, char *errstr, size_t errstr_size);
/* True unless a batch is in flight that PostgreSQL is still executing (then a send, flush or
 * complete would wait, and the loop had better read on). Also true once the batch being read has
 * grown to twice its limits: then waiting for PostgreSQL is what keeps memory bounded. */
bool ces_flight_ready(ces_pipeline_t *p);
/* Opens one PostgreSQL transaction for the source transaction at lsn, too large for a batch,
 * after committing what is complete. */
ces_pipeline_status_t ces_flight_begin_stream(ces_pipeline_t *p, ces_lsn_t lsn, char *errstr,
                                              size_t errstr_size);
/* Drops what is held in memory (staged, batch, segments, held transactions, an open stream) and
 * goes back to the positions PostgreSQL holds. */
ces_pipeline_status_t ces_flight_rewind(ces_pipeline_t *p, char *errstr, size_t errstr_size);

/* ---- loop.c: when to read, send and complete ---- */

/* True when the batch is full or batch_max_ms old. */
bool ces_loop_due(const ces_pipeline_t *p, int64_t now_ms);
/* True when an open batch has waited long enough that a pause in arrivals should apply it. */
bool ces_loop_settled(const ces_pipeline_t *p, int64_t now_ms);
/* How long to wait for the next record, at most max_ms. */
int ces_loop_wait_ms(const ces_pipeline_t *p, int64_t now_ms, int max_ms);

#endif
