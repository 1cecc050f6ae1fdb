/*
 * inflight: one attempt's statements in libpq's pipeline, and the reading of their results.
 *
 * An attempt sends without waiting for answers (libpq's pipeline mode), syncing every
 * CES_INFLIGHT_CHUNK statements so that unread results never fill the socket buffers; then it
 * reads the results, all at once (ces_inflight_drain) or bit by bit as they come
 * (ces_inflight_ready), and notices the first error, the fence (positions.h) and a plain INSERT's
 * taken key (bulk.h). Each statement sent is recorded here with what its result means (its kind);
 * what is sent is the business of the senders (sender.h, ledger.h, prepared.h). A failed attempt's
 * pipeline is read to its end and rolled back (ces_inflight_roll_back).
 *
 * Every function that returns int returns 0, or -1 after recording the error in the attempt's
 * error record; once it holds an error the attempt must be rolled back.
 */
#ifndef CES_INFLIGHT_H
#define CES_INFLIGHT_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "apply/catalog.h"
#include "apply/pgerr.h"
#include "apply/session.h"

/* Statements sent between two pipeline syncs. Their results (a few dozen bytes each) must fit in
 * the socket buffers, because nothing reads them until the sync: 256 keeps that far below 64 KB. */
#define CES_INFLIGHT_CHUNK 256

/* What a statement's result means. */
typedef enum {
    CES_INFLIGHT_OTHER,       /* fine or an error, nothing more */
    CES_INFLIGHT_ROW,         /* one change (item: its batch index) */
    CES_INFLIGHT_BULK,        /* a bulk statement: bad data in it sends the retry row by row */
    CES_INFLIGHT_DEAD_LETTER, /* a dead letter (item: its batch index) */
    CES_INFLIGHT_OFFSET,      /* a fenced position update: the fence may answer it */
    CES_INFLIGHT_COMMIT,      /* COMMIT: any other answer is an error */
} ces_inflight_kind_t;

typedef struct ces_inflight_s ces_inflight_t;

/* Returns the pipeline of one attempt on session's connection, or NULL when out of memory; errors
 * go to e (a reference: the attempt's first error). nonblocking: send without waiting for the
 * socket (libpq buffers the rest). Owned by the caller. */
ces_inflight_t *ces_inflight_new(ces_session_t *session, ces_pgerr_t *e, bool nonblocking)
    __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_inflight_destroy(ces_inflight_t *inflight);

/* The connection statements are sent on (a reference into the session). */
PGconn *ces_inflight_conn(const ces_inflight_t *inflight);
/* The epoch of the session statements are sent on (session.h). */
uint64_t ces_inflight_epoch(const ces_inflight_t *inflight);

/* Enters pipeline mode (and nonblocking mode when asked). */
int ces_inflight_begin(ces_inflight_t *inflight) __attribute__((warn_unused_result));

/* Records the outcome ok of a PQsend* call (1: sent): on success its result is expected, of kind
 * for batch item item (-1: none). */
int ces_inflight_sent(ces_inflight_t *inflight, int ok, ces_inflight_kind_t kind, long item)
    __attribute__((warn_unused_result));
/* The same for a bulk plain INSERT into table (owned by the catalog): a unique violation means a
 * key was taken, and the retry sends upserts. */
int ces_inflight_sent_insert(ces_inflight_t *inflight, int ok, ces_catalog_table_t *table)
    __attribute__((warn_unused_result));
/* The same for the Parse of a statement for batch item item (-1: a bulk one), which records in
 * *epoch the session epoch it is prepared in: set now (later statements of the pipeline may use it
 * at once, the server parses in order), and back to 0 when the Parse fails. */
int ces_inflight_sent_parse(ces_inflight_t *inflight, int ok, long item, uint64_t *epoch)
    __attribute__((warn_unused_result));
/* Records that sending failed for lack of memory. Returns -1. */
int ces_inflight_out_of_memory(ces_inflight_t *inflight);

/* Sends sql (no parameters). */
int ces_inflight_simple(ces_inflight_t *inflight, const char *sql)
    __attribute__((warn_unused_result));
/* Sends the COMMIT of a whole transaction (an answer other than COMMIT is an error). */
int ces_inflight_commit(ces_inflight_t *inflight) __attribute__((warn_unused_result));
/* Syncs and reads the results when CES_INFLIGHT_CHUNK statements wait. */
int ces_inflight_maybe_sync(ces_inflight_t *inflight) __attribute__((warn_unused_result));
/* Ends what the attempt sends with the Sync after which every result can be read. */
int ces_inflight_seal(ces_inflight_t *inflight) __attribute__((warn_unused_result));

/* Hands libpq's buffered statements to the socket (nonblocking mode), without waiting. */
void ces_inflight_progress(ces_inflight_t *inflight);
/* The same, and reads the results that have come, without waiting. True when
 * ces_inflight_drain will not wait for PostgreSQL to execute what was sent (it is done, or
 * something failed). */
bool ces_inflight_ready(ces_inflight_t *inflight);
/* Back to blocking mode, and reads every result up to the last Sync. */
int ces_inflight_drain(ces_inflight_t *inflight) __attribute__((warn_unused_result));
/* Sends a Sync and reads every result up to it. */
int ces_inflight_sync_and_drain(ces_inflight_t *inflight) __attribute__((warn_unused_result));
/* True when a position update met the fence (the transaction is then aborted). */
bool ces_inflight_fenced(const ces_inflight_t *inflight);
/* Leaves pipeline mode after a successful attempt; a failure is only recorded in the error record
 * (CES_PGERR_RETRY). */
void ces_inflight_end(ces_inflight_t *inflight);

/* After a failed attempt: reads what was sent to its last Sync, rolls back (whole: the
 * transaction; else the stream's step, to its savepoint), and leaves the connection in blocking
 * mode outside the pipeline, or closes it when it cannot. */
void ces_inflight_roll_back(ces_inflight_t *inflight, bool whole);

#endif
