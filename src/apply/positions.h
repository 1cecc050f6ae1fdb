/*
 * positions: the one home of consumer positions (docs/semantics.md, "Delivery").
 *
 * A position is the next offset of a partition to apply. It is stored in PostgreSQL in the same
 * transaction as the changes it covers, so that after any failure consumption resumes exactly
 * where the committed data ends. Its life:
 *   1. at assignment the pipeline reads the stored position (through the apply door, which calls
 *      ces_positions_read) and keeps it as the fence: ces_positions_on_assign;
 *   2. every record read moves `next` on: ces_positions_on_read;
 *   3. each batch carries, per partition, the position it may store: `next`, held back by every
 *      record not yet applied or dead-lettered (segments waiting for the rest of their event,
 *      events held for their transaction), and fenced on the stored one: ces_positions_to_store;
 *   4. the batch's transaction stores it with the fenced update (ces_positions_update_sql), which
 *      stores nothing where another instance moved the position and aborts the transaction;
 *   5. once committed it is the new fence (ces_positions_on_commit) and the feed tells Kafka, for
 *      lag monitoring only; when the answer to COMMIT was lost, the stored positions tell whether
 *      it happened (ces_positions_committed);
 *   6. a batch that could not be applied (fenced, or a streamed transaction lost) sends every
 *      partition back to the position PostgreSQL holds: ces_positions_on_rewind.
 *
 * Two sections: the pipeline's bookkeeping (a plain value per partition in the pipeline's
 * partition table; no I/O), and PostgreSQL's half (the statements; called by the apply room only,
 * which is the only code that talks to PostgreSQL). The offsets table is created by metadata.h.
 */
#ifndef CES_POSITIONS_H
#define CES_POSITIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "order/batch.h"

/* ============================================================================================== */
/* 1. The pipeline's bookkeeping                                                                  */
/* ============================================================================================== */

typedef struct {
    bool has_stored; /* PostgreSQL holds a position for the partition */
    int64_t stored;  /* ... and this is it: the fence of the next update */
    bool has_next;   /* a record was read since the assignment */
    int64_t next;    /* the offset after the last record read */
    int64_t first;   /* the first offset read since the assignment (has_next) */
    bool dirty;      /* records were read since the last stored position */
    /* Where reading must resume: the position asked for at assignment or after a rewind, until the
     * first record shows it did (or did not: a source gap). -1: nothing to check (a first start,
     * or checked already). */
    int64_t expect_from;
    bool gap_pending; /* a source gap to record with the position that moves past it */
    bool gap_sent;    /* ... it went with a batch that has not committed yet */
    ces_source_gap_t gap;
} ces_partition_position_t;

/* The partition was assigned with stored (-1: PostgreSQL has none). Logs where reading resumes. */
void ces_positions_on_assign(ces_partition_position_t *pos, const char *topic,
                             int32_t partition, int64_t stored);

/*
 * The first record read after an assignment or a rewind is at offset (or, eof, the partition's end
 * is there). Returns false when that is where reading was to resume, or nothing was to be checked;
 * true with *gap filled (topic referred to) when it is elsewhere: a source gap, unless the records
 * in between are not data (the caller asks the broker). Records past the end of what the broker
 * holds are a gap of unknown size (skipped -1).
 */
bool ces_positions_check_resume(ces_partition_position_t *pos, const char *topic,
                                int32_t partition, int64_t offset, bool eof,
                                ces_source_gap_t *gap);
/* The caller judged the resume check: a gap (accepted: it is recorded with the next position that
 * moves past it), or no gap after all. Either way nothing more is checked until the next
 * assignment or rewind. */
void ces_positions_resume_checked(ces_partition_position_t *pos, const ces_source_gap_t *gap);
/* A source gap to record with a batch that stores update, once; NULL when none. */
const ces_source_gap_t *ces_positions_gap_to_store(ces_partition_position_t *pos);

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
                            int32_t partition, int64_t held, ces_position_update_t *update);

/* A batch that stored next for the partition committed: next is the fence now (and a gap it moved
 * past is recorded). */
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

/* ============================================================================================== */
/* 2. Positions in PostgreSQL (the apply room)                                                    */
/* ============================================================================================== */

/* Declared in libpq-fe.h, session.h and pgerr.h; not included, so that the pipeline, which keeps
 * the bookkeeping above, does not see libpq. */
typedef struct pg_result PGresult;
typedef struct ces_session_s ces_session_t;
typedef struct ces_pgerr_s ces_pgerr_t;

typedef struct ces_positions_s ces_positions_t;

/* The fenced update's parameters: $1 group, $2 topic, $3 partition, $4 the new position, $5 the
 * position read when the partition was assigned (NULL: there was none). */
#define CES_POSITIONS_UPDATE_NPARAMS 5

/* One position update's parameters, as text. values point into the struct itself: fill it with
 * ces_positions_update_params and use it where it lies (do not copy it). */
typedef struct {
    const char *values[CES_POSITIONS_UPDATE_NPARAMS];
    char partition[16];
    char next[24];
    char expected[24];
} ces_positions_params_t;

/* Copies group_id (the consumer group whose positions are stored). Returns NULL when out of
 * memory. Owned by the caller. */
ces_positions_t *ces_positions_new(const char *group_id) __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_positions_destroy(ces_positions_t *positions);
/* The consumer group (owned by positions). */
const char *ces_positions_group(const ces_positions_t *positions);

/* Builds the statements for the metadata schema (quoted, as ces_metadata_schema_quoted gives it).
 * Returns 0, or -1 when out of memory. */
int ces_positions_set_schema(ces_positions_t *positions, const char *schema_quoted)
    __attribute__((warn_unused_result));

/* The fenced update: stores a position only over the one this instance read. If another instance
 * moved it, nothing is stored and the statement divides by zero, which aborts the transaction
 * before its COMMIT. Owned by positions; NULL before ces_positions_set_schema. */
const char *ces_positions_update_sql(const ces_positions_t *positions);
/* Fills params for update (whose strings must outlive params' use). */
void ces_positions_update_params(const ces_positions_t *positions,
                                 const ces_position_update_t *update, ces_positions_params_t *params);
/* A source gap's row in <metadata schema>.source_gaps: $1 group ... $7 reason. As for the update,
 * values point into the struct itself. */
#define CES_POSITIONS_GAP_NPARAMS 7

typedef struct {
    const char *values[CES_POSITIONS_GAP_NPARAMS];
    char partition[16];
    char stored[24];
    char resumed[24];
    char skipped[24];
} ces_positions_gap_params_t;

/* The statement that records a gap. Owned by positions; NULL before ces_positions_set_schema. */
const char *ces_positions_gap_sql(const ces_positions_t *positions);

/* From now on every batch's transaction also checks, fenced like the positions, that this
 * instance (holder) is still the writer with epoch (writer.h), and renews its lease; NULL holder:
 * no check (partition order, replay). Returns 0, or -1 when out of memory. */
int ces_positions_set_writer(ces_positions_t *positions, const char *holder, int64_t epoch)
    __attribute__((warn_unused_result));
/* The writer check and its three parameters (in values, references valid until the next
 * set_writer), or NULL when there is none. renew: the check that also renews the lease (and locks
 * the row until the transaction ends: a transaction's last step); else a plain read (a streamed
 * transaction's parts). */
const char *ces_positions_writer_sql(const ces_positions_t *positions, bool renew,
                                     const char *values[3]);
/* Fills params for gap (whose strings must outlive params' use). */
void ces_positions_gap_params(const ces_positions_t *positions, const ces_source_gap_t *gap,
                              ces_positions_gap_params_t *params);

/* True when res is the fenced update's refusal (its division by zero). */
bool ces_positions_fence_raised(const PGresult *res);

/* Reads the stored next offsets of topic's partitions[0..n) into offsets[0..n), once (no retry);
 * offsets PostgreSQL has none for are left as they are. Returns 0, or -1 with e set. */
int ces_positions_read(const ces_positions_t *positions, ces_session_t *session, const char *topic,
                       const int32_t *partitions, size_t n, int64_t *offsets, ces_pgerr_t *e)
    __attribute__((warn_unused_result));

/* Reads one partition's stored position into *stored (-1: none). Returns 0, or -1 when it could
 * not be read. */
typedef int (*ces_positions_reader_t)(void *opaque, const char *topic, int32_t partition,
                                      int64_t *stored);

/* After a failure during COMMIT the outcome is unknown; the positions tell. True when every
 * partition of batch already stands at the batch's new position (so the commit happened); false
 * when one does not, cannot be read, or the batch stores no position. */
bool ces_positions_committed(const ces_batch_t *batch, ces_positions_reader_t read, void *opaque);

#endif
