/*
 * positions: the home of consumer positions (where each partition's next record is).
 *
 * A position is stored in PostgreSQL in the same transaction as the changes it covers, so that
 * after any failure consumption resumes exactly where the committed data ends (the delivery
 * guarantees and the fence are in docs/semantics.md). This module has two halves:
 *
 *   1. PostgreSQL's half (the apply room, below): the fenced update of <metadata schema>.offsets,
 *      reading stored positions back, and telling from them whether a COMMIT whose answer was lost
 *      took place. The offsets table itself is created by metadata.h.
 *   2. The pipeline's half: the bookkeeping of which positions may be stored. It is to be added to
 *      this same pair of files, in the second section at the end of this header.
 */
#ifndef CES_POSITIONS_H
#define CES_POSITIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "pgerr.h"
#include "session.h"

/* ============================================================================================== */
/* 1. Positions in PostgreSQL                                                                     */
/* ============================================================================================== */

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
                                 const ces_offset_update_t *update, ces_positions_params_t *params);
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

/* ============================================================================================== */
/* 2. The pipeline's bookkeeping of positions                                                     */
/* ============================================================================================== */

/* (To be added here.) */

#endif
