/*
 * pipeline: record -> decode -> reassemble -> batch -> apply -> positions.
 *
 * The daemon feeds it records from the consumer, replay feeds it lines from files; both go through
 * exactly this code. It owns the in-memory state that the offset rules depend on: per partition, the
 * position PostgreSQL holds (the fence) and the next record not yet read, held back by segments that
 * wait for reassembly, so that a stored position never passes a record not yet applied or
 * dead-lettered.
 */
#ifndef CES_PIPELINE_H
#define CES_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apply.h"
#include "consumer.h"
#include "decode.h"
#include "reasm.h"

typedef enum {
    CES_ORDER_BY_TRANSACTION, /* whole source transactions, in commit order across partitions */
    CES_ORDER_BY_PARTITION,   /* arrival order per partition, no waiting */
} ces_ordering_t;

typedef struct {
    size_t batch_max_events;
    size_t batch_max_bytes; /* of the events' memory (arenas): a batch is full at either limit */
    int64_t batch_max_ms;
    bool store_offsets; /* false for replay: positions of files are not stored */
    ces_reasm_limits_t reasm;
    ces_ordering_t ordering;
    int64_t reorder_window_ms; /* how long a caught-up partition must be quiet */
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
} ces_pipeline_stats_t;

typedef enum {
    CES_PIPELINE_OK = 0,
    CES_PIPELINE_INTERRUPTED, /* a stop was requested while PostgreSQL was retried */
    CES_PIPELINE_FATAL,
} ces_pipeline_status_t;

typedef struct ces_pipeline_s ces_pipeline_t;

/* decoder and apply are references: they must outlive the pipeline (apply may be NULL in unit tests
 * that never flush). NULL when out of memory. */
ces_pipeline_t *ces_pipeline_new(const ces_pipeline_options_t *options, ces_decoder_t *decoder,
                                 ces_apply_t *apply);
/* Frees pending work without applying it (released records are read again after a restart). */
void ces_pipeline_destroy(ces_pipeline_t *pipeline);

/* The consumer to store positions to and seek (reference; NULL for replay). */
void ces_pipeline_set_consumer(ces_pipeline_t *pipeline, ces_consumer_t *consumer);

/*
 * Takes one record (with nothing staged). The pipeline copies the record's bytes and, with a
 * handle, releases the handle through the consumer before returning, whatever the status: the
 * caller must not use the handle (or the value it points into) afterwards. Held work never keeps
 * a librdkafka message alive.
 */
ces_pipeline_status_t ces_pipeline_add(ces_pipeline_t *pipeline, const ces_record_t *record,
                                       int64_t now_ms, char *errstr, size_t errstr_size);

/*
 * The same for several records read in a row, decoded by options.decode_threads threads at once.
 * ces_pipeline_stage keeps a record (its handle and value stay the caller's to leave alone, as
 * above) and returns true when the stage is full: it must not be called again before
 * ces_pipeline_add_staged. That takes the staged records in, in order, as ces_pipeline_add would
 * one by one, and releases every handle whatever the status. With more_coming (the stage filled
 * and more records wait to be read), the records just staged are decoded by the other threads
 * while this one goes on, and are taken in by the next ces_pipeline_add_staged: until then they
 * count as not yet read (a seek back drops them, to be read again). Without it, every staged
 * record is taken in before it returns. A rebalance callback that the consumer runs takes every
 * staged record in first.
 */
bool ces_pipeline_stage(ces_pipeline_t *pipeline, const ces_record_t *record);
/* How many records may be staged now (0 .. the stage's free slots). In partition mode each record
 * may become an item of the batch being read, which stays within its limits (twice them while a
 * batch is in flight: see ces_pipeline_ready); 0 then means: take the staged records in and send.
 * In transaction mode, held events are bounded by pausing partitions instead. */
size_t ces_pipeline_stage_room(const ces_pipeline_t *pipeline);
/* True while records are staged or decoding, not yet taken in. */
bool ces_pipeline_has_staged(const ces_pipeline_t *pipeline);
/* Releases the records staged and not taken in (they are read again after a restart). */
void ces_pipeline_drop_staged(ces_pipeline_t *pipeline);
ces_pipeline_status_t ces_pipeline_add_staged(ces_pipeline_t *pipeline, int64_t now_ms,
                                              bool more_coming, char *errstr, size_t errstr_size);

/* A partition reached the end of what the broker holds (it is caught up), at eof_offset. */
void ces_pipeline_partition_eof(ces_pipeline_t *pipeline, const char *topic, int32_t partition,
                                int64_t eof_offset);

/* The input ended (replay): every held transaction is complete, every incomplete segment group a
 * dead letter. */
ces_pipeline_status_t ces_pipeline_drain(ces_pipeline_t *pipeline, char *errstr,
                                         size_t errstr_size);

/* Gives up segment groups that timed out (they become dead letters in the batch), releases source
 * transactions that are complete, and pauses or resumes partitions to keep memory bounded. */
ces_pipeline_status_t ces_pipeline_tick(ces_pipeline_t *pipeline, int64_t now_ms, char *errstr,
                                        size_t errstr_size);

/* True when the batch is full or old enough to apply. */
bool ces_pipeline_due(const ces_pipeline_t *pipeline, int64_t now_ms);
/* True when something waits to be applied or stored. */
bool ces_pipeline_pending(const ces_pipeline_t *pipeline);
/* True when an open batch has waited long enough that a pause in arrivals should apply it. */
bool ces_pipeline_settled(const ces_pipeline_t *pipeline, int64_t now_ms);
/* How long to wait for the next record, at most max_ms. */
int ces_pipeline_wait_ms(const ces_pipeline_t *pipeline, int64_t now_ms, int max_ms);

/* Applies the batch and stores the positions it covers, in one PostgreSQL transaction (after
 * completing a batch in flight): when it returns, everything is committed. */
ces_pipeline_status_t ces_pipeline_flush(ces_pipeline_t *pipeline, char *errstr,
                                         size_t errstr_size);
/* The same without waiting: the batch goes in flight, PostgreSQL executes it while the caller reads
 * the next one, and the next send, flush or ces_pipeline_complete commits it. Its positions are
 * stored (in PostgreSQL and Kafka) only then. A streamed transaction's parts are applied at once. */
ces_pipeline_status_t ces_pipeline_send(ces_pipeline_t *pipeline, char *errstr,
                                        size_t errstr_size);
/* Waits for the batch in flight and commits it (nothing to do when there is none). */
ces_pipeline_status_t ces_pipeline_complete(ces_pipeline_t *pipeline, char *errstr,
                                            size_t errstr_size);
bool ces_pipeline_flying(const ces_pipeline_t *pipeline);
/* True unless a batch is in flight that PostgreSQL is still executing: then a send, flush or
 * ces_pipeline_complete would wait, and the caller had better go on reading records. Also true
 * once the batch being read has grown to twice its limits (apply.batch_max_events or
 * batch_max_bytes): then waiting for PostgreSQL is what keeps memory bounded. */
bool ces_pipeline_ready(ces_pipeline_t *pipeline);

/* Consumer callbacks (ces_consumer_callbacks_t); opaque is the pipeline. */
int ces_pipeline_on_assigned(void *opaque, const char *topic, const int32_t *partitions, size_t n,
                             int64_t *offsets);
int ces_pipeline_on_revoked(void *opaque, const char *topic, const int32_t *partitions, size_t n);

/* The batch being built: what the next flush would apply (for tests and diagnostics). */
size_t ces_pipeline_batch_events(const ces_pipeline_t *pipeline);
const ces_item_t *ces_pipeline_batch_item(const ces_pipeline_t *pipeline, size_t i);

void ces_pipeline_get_stats(const ces_pipeline_t *pipeline, ces_pipeline_stats_t *stats);

/* Calls fn for every assigned partition with the next offset to apply: the position stored in
 * PostgreSQL, else the next record to read, else -1. */
void ces_pipeline_each_partition(ces_pipeline_t *pipeline,
                                 void (*fn)(void *arg, const char *topic, int32_t partition,
                                            int64_t position),
                                 void *arg);

#endif
