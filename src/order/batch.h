/*
 * batch: what one PostgreSQL transaction applies — row changes, dead letters and the consumer
 * positions they cover.
 *
 * The pipeline fills a batch and keeps ownership of everything in it; the apply stage reads it and
 * may turn an event that PostgreSQL rejects into a dead letter (ces_batch_item_reject).
 */
#ifndef CES_BATCH_H
#define CES_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/arena.h"
#include "format/event.h"

typedef enum {
    CES_ITEM_EVENT,
    CES_ITEM_DEAD_LETTER,
} ces_item_kind_t;

/* Why a record or event became a dead letter. It is set where the dead letter is made, and
 * /metrics counts by it (ces2pg_dead_letters_total{reason}); the reason text is for people. */
typedef enum {
    CES_DL_DECODE,               /* the record (or the joined segments) could not be decoded */
    CES_DL_NO_PRIMARY_KEY,       /* the target table has no primary key */
    CES_DL_REJECTED_BY_POSTGRES, /* PostgreSQL rejected the values (SQLSTATE 22, 23, 54) */
    CES_DL_SEGMENTS_INCOMPLETE,  /* a segment group never completed (timeout, end of input) */
    CES_DL_REASSEMBLY_LIMIT,     /* a segment group broke reassembly.max_* */
    CES_DL_TYPE_CONFLICT,        /* a source column's type changed beyond its target column */
    CES_DL_SCHEMA,               /* the target table is missing, lacks a column or a key value */
    CES_DL_RESERVED_TARGET,      /* the target is ces2pg's metadata or a PostgreSQL system schema */
    CES_DL_NAME_COLLISION,       /* another source name maps to the same target table or column */
    CES_DL_NCLASSES
} ces_dl_class_t;

/* The class's label value: "decode", "no_primary_key", ... */
const char *ces_dl_class_name(ces_dl_class_t cls);

/* Why an event cannot be applied, as the apply room finds out: the class and the reason of the
 * dead letter it becomes. reason NULL: nothing wrong. reason is a static string or one its finder
 * keeps until the batch is applied. */
typedef struct {
    ces_dl_class_t cls;
    const char *reason;
} ces_reject_t;

/* Where a record came from: a Kafka position, or a replay file and line. */
typedef struct {
    const char *topic; /* reference to a string that outlives the batch */
    int32_t partition;
    int64_t offset;
} ces_source_t;

/* Says whether a record's source is one of a set (e.g. the partitions being revoked). */
typedef bool (*ces_source_pred_t)(void *arg, const ces_source_t *source);

typedef struct {
    ces_item_kind_t kind;
    ces_dl_class_t dl_class; /* CES_ITEM_DEAD_LETTER: the class of reason */
    ces_source_t source;
    ces_event_t event;   /* CES_ITEM_EVENT: points into arena */
    const char *reason;  /* CES_ITEM_DEAD_LETTER: why; points into arena */
    /* Its memory as first counted (ces_item_bytes), 0 until then: the passes over held items that
     * count it again (releasing a transaction, filling a batch) then need not read the arena,
     * out of the core's cache by then.
     * An arena that grows after that (a dead letter's reason) is not counted again. */
    size_t bytes;
    const char *logicalid; /* may be NULL */
    const void *raw;     /* the record's bytes, kept for a dead letter */
    size_t raw_len;
    const ces_source_t *more_sources; /* other records this item covers (segments), in arena */
    size_t nmore_sources;
    ces_arena_t *arena;  /* owned by the item; raw lives in it too (the Kafka message is given
                          * back as soon as the record is copied) */
    bool late; /* transaction mode: it came after its transaction went to PostgreSQL */
    bool torn; /* ... and it is the first such event of that transaction */
    /* transaction mode: it came after its transaction was released into a batch not yet sent;
     * late if that batch goes before it (release.c) */
    bool after_release;
} ces_item_t;

/* The position to store for one partition, fenced on the value read from PostgreSQL. */
typedef struct {
    const char *topic;
    int32_t partition;
    bool has_expected; /* false: PostgreSQL had no row for this partition */
    int64_t expected;
    int64_t next;
} ces_position_update_t;

/* A gap at the source: a partition's stored position was no longer there (retention, a recreated
 * topic), and reading resumed elsewhere. Recorded with the batch whose position moves past it. */
typedef struct {
    const char *topic; /* reference to a string that outlives the batch */
    int32_t partition;
    int64_t stored;  /* the position PostgreSQL held */
    int64_t resumed; /* where reading resumed */
    int64_t skipped; /* records between the two that were never read; -1: unknown */
    const char *reason; /* static text */
} ces_source_gap_t;

typedef struct {
    ces_item_t *items;
    size_t count;
    size_t capacity;
    size_t bytes; /* the items' memory, as ces_batch_push counted it (ces_item_bytes) */
    ces_position_update_t *positions; /* the position to store, one per partition */
    size_t npositions;
    size_t positions_capacity;
    ces_source_gap_t *gaps; /* the source gaps its positions move past */
    size_t ngaps;
    size_t gaps_capacity;
    /* `ces2pg dead-letters retry`: every item's sources are dead letters (the offset is the row's
     * id): those that apply leave the table, those that fail again keep their row. */
    bool retrying;
    int64_t reorder_window_ms; /* in force as it is applied (progress); -1: none */
} ces_batch_t;

/* How many items ahead a pass over a batch asks for the memory it is going to read of an item:
 * each event lives in an allocation of its own, and a batch (up to apply.batch_max_bytes, 4 MB)
 * is out of the core's cache again by the next pass over it (resolving tables, sending, counting,
 * freeing): the loops that make those reads wait for them unless they are asked for ahead.
 * (Taking a transaction out of order reads no more than the items themselves: see bytes.) */
#define CES_ITEM_AHEAD 8

/* Asks for addr's cache line, to be read (a hint: addr may be NULL or anything). */
static inline void ces_item_prefetch(const void *addr) { __builtin_prefetch(addr, 0, 3); }

/* Appends an empty item and returns it, or NULL when out of memory. The batch owns the array. */
ces_item_t *ces_batch_add(ces_batch_t *batch);
/* Appends a copy of item and counts its memory in batch->bytes; the batch takes the arena. Returns
 * 0, or -1 when out of memory (the arena is still the caller's). */
int ces_batch_push(ces_batch_t *batch, const ces_item_t *item);
/* The memory an item holds while it waits, as the byte limits count it: its arena and the item
 * itself (held in an array). A narrow event's item is a quarter of what its arena holds. Once
 * counted (item->bytes set), that count. */
size_t ces_item_bytes(const ces_item_t *item);
/* Appends or replaces the stored position for (topic, partition). Returns 0, or -1 (no memory). */
int ces_batch_set_position(ces_batch_t *batch, const ces_position_update_t *update);

/* Appends a source gap. Returns 0, or -1 (no memory). */
int ces_batch_add_gap(ces_batch_t *batch, const ces_source_gap_t *gap);

/* Turns an event item into a dead letter of class cls with a copy of reason. Returns 0, or -1 (no
 * memory). */
int ces_batch_item_reject(ces_item_t *item, ces_dl_class_t cls, const char *reason);

/* Frees every item's arena and empties the batch. */
void ces_batch_clear(ces_batch_t *batch);
/* Frees the arrays. */
void ces_batch_free(ces_batch_t *batch);

#endif
