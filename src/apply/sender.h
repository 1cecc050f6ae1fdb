/*
 * sender: one attempt's statements through libpq's pipeline, and their results.
 *
 * An attempt sends a batch's row changes, dead letters and fenced positions without waiting for
 * answers (libpq's pipeline mode), syncing every CES_SENDER_PIPELINE_CHUNK statements so that
 * unread results never fill the socket buffers; then it reads the results, all at once
 * (ces_sender_drain) or bit by bit as they come (ces_sender_ready), and notices the first error,
 * the fence (positions.h) and a plain INSERT's taken key (bulk.h). Row changes go in bulk unless
 * the attempt asks for one statement per change. A failed attempt's pipeline is read to its end and
 * rolled back (ces_sender_roll_back).
 *
 * Statements are prepared once per connection: the cache (ces_sender_stmts_t) outlives attempts
 * and maps a statement's signature to its name and the session epoch it was prepared in, so a new
 * connection prepares again without being told.
 *
 * Every function that returns int returns 0, or -1 after recording the error in the attempt's
 * error record (options.e); once it holds an error the attempt must be rolled back.
 */
#ifndef CES_SENDER_H
#define CES_SENDER_H

#include <stdbool.h>
#include <stdint.h>

#include "order/batch.h"
#include "apply/catalog.h"
#include "apply/metadata.h"
#include "apply/pgerr.h"
#include "apply/positions.h"
#include "apply/session.h"

/* Statements sent between two pipeline syncs. Their results (a few dozen bytes each) must fit in
 * the socket buffers, because nothing reads them until the sync: 256 keeps that far below 64 KB. */
#define CES_SENDER_PIPELINE_CHUNK 256

/* The prepared-statement cache. */
typedef struct ces_sender_stmts_s ces_sender_stmts_t;

/* Returns an empty cache, or NULL when out of memory. Owned by the caller. */
ces_sender_stmts_t *ces_sender_stmts_new(void) __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_sender_stmts_destroy(ces_sender_stmts_t *stmts);

typedef struct ces_sender_s ces_sender_t;

typedef struct {
    ces_session_t *session;           /* reference: connected */
    ces_sender_stmts_t *stmts;        /* reference */
    const ces_metadata_t *metadata;   /* reference: names and the dead-letter statement */
    const ces_positions_t *positions; /* reference: the fenced update */
    ces_pgerr_t *e;       /* reference: where the attempt's first error goes */
    bool bulk;            /* gather row changes into bulk statements (off: row by row) */
    bool plain_inserts;   /* send INS of new keys as plain INSERTs (off after a taken key) */
    bool nonblocking;     /* send without waiting for the socket (libpq buffers the rest) */
    uint64_t attempt;     /* the attempt's number, for the tables' plain-INSERT policy */
} ces_sender_options_t;

/* Returns a sender for one attempt, or NULL when out of memory. Owned by the caller; batch items
 * and tables given to it must outlive it. */
ces_sender_t *ces_sender_new(const ces_sender_options_t *options)
    __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_sender_destroy(ces_sender_t *sender);

/* Enters pipeline mode (and nonblocking mode when asked). */
int ces_sender_begin(ces_sender_t *sender) __attribute__((warn_unused_result));
/* Sends sql (no parameters). */
int ces_sender_simple(ces_sender_t *sender, const char *sql) __attribute__((warn_unused_result));
/* Sends the change of batch item idx to its target table (owned by the catalog). An event that
 * cannot be applied (it lacks a key value) is not sent: *reject says why. */
int ces_sender_event(ces_sender_t *sender, long idx, ces_item_t *item, ces_catalog_table_t *table,
                     ces_reject_t *reject) __attribute__((warn_unused_result));
/* Sends the dead letter of batch item idx: a new row, or with retrying (`dead-letters retry`) the
 * new reason of the rows it was retried from. */
int ces_sender_dead_letter(ces_sender_t *sender, long idx, const ces_item_t *item, bool retrying)
    __attribute__((warn_unused_result));
/* Syncs and reads the results when CES_SENDER_PIPELINE_CHUNK statements wait. */
int ces_sender_maybe_sync(ces_sender_t *sender) __attribute__((warn_unused_result));
/* Sends every gathered bulk statement. */
int ces_sender_flush_bulk(ces_sender_t *sender) __attribute__((warn_unused_result));
/* Sends what the batch's transaction records besides its changes: the fenced positions, the
 * source gaps they move past, and the group's progress (or, retrying, the removal of the dead
 * letters that applied). */
int ces_sender_positions(ces_sender_t *sender, const ces_batch_t *batch)
    __attribute__((warn_unused_result));
/* Sends the COMMIT of a whole transaction (an answer other than COMMIT is an error). */
int ces_sender_commit(ces_sender_t *sender) __attribute__((warn_unused_result));
/* Ends what the attempt sends with the Sync after which every result can be read. */
int ces_sender_seal(ces_sender_t *sender) __attribute__((warn_unused_result));

/* Hands libpq's buffered statements to the socket (nonblocking mode), without waiting. */
void ces_sender_progress(ces_sender_t *sender);
/* The same, and reads the results that have come, without waiting. True when ces_sender_drain
 * will not wait for PostgreSQL to execute what was sent (it is done, or something failed). */
bool ces_sender_ready(ces_sender_t *sender);
/* Back to blocking mode, and reads every result up to the last Sync. */
int ces_sender_drain(ces_sender_t *sender) __attribute__((warn_unused_result));
/* Sends a Sync and reads every result up to it. */
int ces_sender_sync_and_drain(ces_sender_t *sender) __attribute__((warn_unused_result));
/* True when a position update met the fence (the transaction is then aborted). */
bool ces_sender_fenced(const ces_sender_t *sender);
/* Leaves pipeline mode after a successful attempt; a failure is only recorded in the error record
 * (CES_PGERR_RETRY). */
void ces_sender_end(ces_sender_t *sender);

/* After a failed attempt: reads what was sent to its last Sync, rolls back (whole: the
 * transaction; else the stream's step, to its savepoint), and leaves the connection in blocking
 * mode outside the pipeline, or closes it when it cannot. */
void ces_sender_roll_back(ces_sender_t *sender, bool whole);

#endif
