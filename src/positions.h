/*
 * positions: where each partition stands, and what may be stored for it.
 *
 * The one home of consumer positions (docs/semantics.md, "Delivery"). A position is the next
 * offset to apply. Its life:
 *   1. at assignment the pipeline reads the stored position from PostgreSQL (through the apply
 *      door) and keeps it as the fence: ces_positions_on_assign;
 *   2. every record read moves `next` on: ces_positions_on_read;
 *   3. each batch carries, per partition, the position it may store: `next`, held back by every
 *      record not yet applied or dead-lettered (segments waiting for the rest of their event,
 *      events held for their transaction), and fenced on the stored one: ces_positions_to_store;
 *   4. the batch's transaction stores it only where PostgreSQL still holds the fence;
 *   5. once committed it is the new fence (ces_positions_on_commit) and the feed tells Kafka, for
 *      lag monitoring only;
 *   6. a batch that could not be applied (fenced, or a streamed transaction lost) sends every
 *      partition back to the position PostgreSQL holds: ces_positions_on_rewind.
 *
 * A ces_partition_position_t is a plain value inside the pipeline's partition table; these
 * functions keep its fields consistent. Nothing here does I/O.
 */
#ifndef CES_POSITIONS_H
#define CES_POSITIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "batch.h"

typedef struct {
    bool has_stored; /* PostgreSQL holds a position for the partition */
    int64_t stored;  /* ... and this is it: the fence of the next update */
    bool has_next;   /* a record was read since the assignment */
    int64_t next;    /* the offset after the last record read */
    int64_t first;   /* the first offset read since the assignment (has_next) */
    bool dirty;      /* records were read since the last stored position */
} ces_partition_position_t;

/* The partition was assigned with stored (-1: PostgreSQL has none). Logs where reading resumes. */
void ces_positions_on_assign(ces_partition_position_t *pos, const char *topic,
                             int32_t partition, int64_t stored);

/* The partition was taken away: nothing of it is known any more. */
void ces_positions_on_revoke(ces_partition_position_t *pos);

/* The record at offset was read. */
void ces_positions_on_read(ces_partition_position_t *pos, int64_t offset);

/*
 * The position to store for the partition with the next batch: `next`, or held when that is lower
 * (the lowest offset of a record read but not yet applied or dead-lettered; INT64_MAX when none).
 * Returns true and fills *update (referring to topic) when there is a new position to store.
 */
bool ces_positions_to_store(const ces_partition_position_t *pos, const char *topic,
                            int32_t partition, int64_t held, ces_offset_update_t *update);

/* A batch that stored next for the partition committed: next is the fence now. */
void ces_positions_on_commit(ces_partition_position_t *pos, int64_t next);

/*
 * Goes back to stored, the position PostgreSQL holds now (-1: none): records after it are read
 * again. Without one, nothing of this assignment was committed, and reading starts over at the
 * first record read since the assignment. Returns the offset to read from, or -1 when no record
 * was read since the assignment (nothing to go back over).
 */
int64_t ces_positions_on_rewind(ces_partition_position_t *pos, int64_t stored);

/* The next offset to apply: the stored position, else the next record to read, else -1. */
int64_t ces_positions_next_to_apply(const ces_partition_position_t *pos);

#endif
