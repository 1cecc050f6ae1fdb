/*
 * pipeline: record -> decode -> reassemble -> order -> batch -> apply -> positions
 * (docs/architecture.md).
 *
 * The daemon feeds it records from the Kafka consumer, replay from files; both run exactly this
 * code, down to the one loop (ces_pipeline_run) that decides when to read, decode, release held
 * transactions, send a batch and complete the one in flight. The pipeline owns everything held in
 * memory between a record and its commit, and with it the rule that a stored position never
 * passes a record not yet applied or dead-lettered (positions.h).
 *
 * The room's files, bottom to top (no module calls one above it):
 *   - partitions (the partition table), lateness (late events, torn transactions, the reorder
 *     window's bet), staging (records read ahead, decoded on several threads), stream (a source
 *     transaction streamed into one PostgreSQL transaction), and pipeline.c (this door: the
 *     pipeline's life and stats), with state.h, the room's shared state;
 *   - the stages: intake (records in: reassembly, dead letters, source gaps), release (when held
 *     transactions go into the batch, when one is streamed, pausing partitions to bound memory),
 *     flight (the batch in flight, commits, rewinds, opening a stream);
 *   - loop.c (ces_pipeline_run: the loop, which calls the stages in turn) and rebalance.c (the
 *     rebalance callbacks below, which do the same from inside the feed's poll).
 * Each module has its own header; only this one is for the rest of the program.
 */
#ifndef CES_PIPELINE_H
#define CES_PIPELINE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apply/apply.h"
#include "format/decode.h"
#include "input/feed.h"
#include "order/reasm.h"

typedef enum {
    CES_ORDER_BY_TRANSACTION, /* whole source transactions, in commit order across partitions */
    CES_ORDER_BY_PARTITION,   /* arrival order per partition, no waiting */
} ces_ordering_t;

typedef struct {
    size_t batch_max_events;
    size_t batch_max_bytes; /* of the events' memory (arenas): a batch is full at either limit */
    int64_t batch_max_ms;
    int poll_ms;        /* the longest wait for a record when nothing else is due */
    bool store_positions; /* false for replay: positions of files are not stored */
    bool stop_on_source_gap; /* kafka.on_source_gap = "stop": a gap stops the loop */
    bool retry_dead_letters; /* the records are dead letters being retried (offset: the row's id) */
    ces_reasm_limits_t reasm;
    ces_ordering_t ordering;
    int64_t reorder_window_ms;     /* how long a caught-up partition must be quiet, at first */
    int64_t reorder_window_max_ms; /* ... and at most, as late events make it grow */
    bool reorder_window_adaptive;  /* false: it stays at reorder_window_ms */
    size_t dedup_window;       /* committed positions remembered to spot duplicates */
    size_t max_pending_events; /* events held for ordering before partitions are paused */
    size_t max_pending_bytes;  /* the same in bytes of their memory; 0: no limit */
    size_t decode_threads;     /* threads that decode staged records, the caller's included */
    /* Globs on "schema.table" of the source (references): events of a table that matches no
     * include (when there are some) or any exclude are skipped and counted. */
    const char *const *include;
    size_t ninclude;
    const char *const *exclude;
    size_t nexclude;
    /* Called after each batch PostgreSQL accepted, before the batch is cleared (may be NULL): its
     * items are now events applied or dead letters; seconds is how long applying took. A streamed
     * source transaction reports each part when it is sent. For metrics. */
    void (*on_applied)(void *opaque, const ces_batch_t *batch, double seconds);
    void *on_applied_opaque;
} ces_pipeline_options_t;

typedef struct {
    uint64_t records;
    uint64_t events_applied;
    uint64_t dead_letters;
    uint64_t retries;
    uint64_t batches;
    uint64_t duplicates; /* resent events recognised and skipped */
    uint64_t excluded;   /* events of tables left out by schema.include / schema.exclude */
    size_t pending_events; /* held for ordering (not yet in a batch) */
    size_t pending_segments; /* segment groups waiting for reassembly */
    uint64_t events_consumed[4]; /* decoded events by ces_op_t (index 0 unused) */
    size_t pending_transactions;  /* source transactions held for ordering */
    size_t pending_segment_bytes; /* bytes held by segment groups */
    size_t pending_bytes;         /* memory of the events held for ordering */
    int64_t reorder_window_ms;    /* the effective reorder window; -1 in partition mode */
    uint64_t source_gaps;         /* stored positions found gone at the broker */
    uint64_t source_gap_records;  /* records they skipped, where known */
} ces_pipeline_stats_t;

typedef enum {
    CES_PIPELINE_OK = 0,      /* the input ended and everything read is committed (replay) */
    CES_PIPELINE_STOPPED,     /* a stop was requested: what was complete is committed */
    CES_PIPELINE_INTERRUPTED, /* a stop was requested while PostgreSQL was retried: the batch
                               * being applied was rolled back (it is read again) */
    CES_PIPELINE_FATAL,
    CES_PIPELINE_SOURCE_GAP, /* a stored position was gone at the broker and kafka.on_source_gap
                              * is "stop": errstr says what happened and what to do */
} ces_pipeline_status_t;

/* What the loop tells its owner. Every member may be NULL. */
typedef struct {
    /* At the start of every turn, and with waiting = true just before the loop may wait for
     * PostgreSQL to finish the batch in flight: the daemon's heartbeat, watchdog, reload, metrics
     * and progress line live there. */
    void (*on_turn)(void *opaque, int64_t now_ms, bool waiting);
    /* Once, when a stop was seen, before what is complete is applied. */
    void (*on_stopping)(void *opaque);
    void *opaque;
} ces_pipeline_hooks_t;

typedef struct ces_pipeline_s ces_pipeline_t;

/* decoder and apply are references: they must outlive the pipeline (apply may be NULL in unit tests
 * that never apply). NULL when out of memory. */
ces_pipeline_t *ces_pipeline_new(const ces_pipeline_options_t *options, ces_decoder_t *decoder,
                                 ces_apply_t *apply);
/* Frees pending work without applying it (what was not committed is read again after a restart).
 * Every record the feed handed over is given back first, so the feed may go after this. */
void ces_pipeline_destroy(ces_pipeline_t *pipeline);

/* Where records come from (copied). Set before ces_pipeline_run and before the consumer can call
 * the rebalance callbacks below; the feed's opaque must outlive the pipeline's use of it. */
void ces_pipeline_set_feed(ces_pipeline_t *pipeline, const ces_feed_t *feed);

/*
 * Runs the loop until the feed ends (CES_POLL_END: everything read is applied, incomplete segment
 * groups become dead letters; returns CES_PIPELINE_OK), *stop is set (what is complete is applied;
 * CES_PIPELINE_STOPPED, or CES_PIPELINE_INTERRUPTED when PostgreSQL was being retried), or
 * something fails for good (CES_PIPELINE_FATAL; the batch in flight is completed first). errstr
 * says why when the status is neither OK nor STOPPED (CES_PIPELINE_SOURCE_GAP: a gap at the source
 * stopped it, and the batch in flight is completed too). hooks may be NULL.
 */
ces_pipeline_status_t ces_pipeline_run(ces_pipeline_t *pipeline, const ces_pipeline_hooks_t *hooks,
                                       volatile sig_atomic_t *stop, char *errstr,
                                       size_t errstr_size);

/*
 * The consumer's rebalance callbacks (ces_consumer_callbacks_t); opaque is the pipeline. An
 * assignment reads the stored positions from PostgreSQL; a revocation commits what is complete
 * while the partitions are still ours and drops what is held for them.
 */
int ces_pipeline_on_assigned(void *opaque, const char *topic, const int32_t *partitions, size_t n,
                             int64_t *offsets);
int ces_pipeline_on_revoked(void *opaque, const char *topic, const int32_t *partitions, size_t n);

void ces_pipeline_get_stats(const ces_pipeline_t *pipeline, ces_pipeline_stats_t *stats);

/* The end of a term of consuming whose consumer goes without revoking its partitions (a writer
 * fenced by Kafka, or stepping down): drops every record read and not committed and forgets the
 * partitions, so that the next term starts clean from the positions stored in PostgreSQL. Call it
 * while the consumer still exists (staged records go back to it). */
void ces_pipeline_forget(ces_pipeline_t *pipeline);

/* Transaction order: the reorder window the stream's last writer stored with its last commit
 * (-1: none), for a writer that takes over or restarts, so that what the window learned about the
 * partitions' lag is not learned again by tearing transactions. */
void ces_pipeline_inherit_window(ces_pipeline_t *pipeline, int64_t window_ms);

/* Calls fn for every assigned partition with the next offset to apply: the position stored in
 * PostgreSQL, else the next record to read, else -1. */
void ces_pipeline_each_partition(ces_pipeline_t *pipeline,
                                 void (*fn)(void *arg, const char *topic, int32_t partition,
                                            int64_t position),
                                 void *arg);

#endif
