/*
 * apply: the only stage that talks to PostgreSQL.
 *
 * One batch is one PostgreSQL transaction holding its row changes, its dead letters and the new
 * consumer positions (fenced on the values read at assignment), sent through libpq's pipeline mode.
 * Target tables are created and extended outside that transaction, idempotently. Transient failures
 * (lost connection, deadlock, serialization, lock timeout, admin shutdown) roll back and retry the
 * same batch with capped exponential backoff; a change PostgreSQL rejects for what it asks (bad
 * data, a refused DDL of its table, a privilege on its table, a trigger that raises: every error
 * that is neither transient nor about ces2pg's own connection, database or metadata schema,
 * ces_pgerr_classify_event) becomes a dead letter and the rest of the batch is retried without it.
 */
#ifndef CES_APPLY_H
#define CES_APPLY_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apply/catalog.h"
#include "order/batch.h"
#include "util/token.h"

typedef struct {
    const char *conninfo;
    const char *metadata_schema;
    const char *group_id; /* the consumer group whose positions are stored */
    bool auto_create;
    bool auto_evolve;
    int64_t retry_max_ms;            /* cap of the exponential backoff */
    const char *target;              /* "{schema}.{table}": target table from source names */
    ces_catalog_rule_fn rule_of;     /* per-table rules (catalog.h); NULL: none */
    void *rule_opaque;
    bool preserve_case;              /* false: ASCII letters of names are lower-cased */
    bool lsn_guard;                  /* per-row version column and tombstones */
    const char *version_column;      /* its name, e.g. "_ces_lsn" */
    int64_t tombstone_retention_s;   /* tombstones older than this are purged */
    volatile sig_atomic_t *stop_now; /* when set, retries give up (the batch stays rolled back) */
    const char *password; /* libpq's password parameter, overriding conninfo's (a secret; may be
                           * NULL) */
    ces_token_source_t password_token; /* instead of password when its fetch is set (session.h) */
    /* Called when the connection opens or closes, and at every step of a backoff wait (so that a
     * PostgreSQL outage does not look like a stuck process); may be NULL. */
    void (*heartbeat)(void *opaque, bool connected);
    void *heartbeat_opaque;
    /* Called with heartbeat_opaque and the reason (one of CES_APPLY_RETRY_REASONS) of every
     * retry as it starts its backoff wait, and with NULL once something succeeds after retries
     * (a batch committed, the connection made at start, positions read); may be NULL. While
     * retries last nothing progresses (the daemon says not ready, and not alive after long). */
    void (*retrying)(void *opaque, const char *reason);
} ces_apply_options_t;

/* Every reason a retry may give (the label of ces2pg_postgres_retries_total): connecting to PostgreSQL;
 * a lost connection or a server shutting down; a serialization failure or deadlock; a lock or
 * statement timeout; PostgreSQL short of resources (class 53); a target table that changed
 * underneath (it is read again). */
#define CES_APPLY_RETRY_REASONS                                                                   \
    {"connect", "connection", "conflict", "timeout", "resources", "table_changed"}
#define CES_APPLY_NRETRY_REASONS 6

/* A target table that changes underneath the same change this many times running is not
 * changing: the change is dead-lettered (CES_DL_REJECTED_BY_POSTGRES, or CES_DL_SCHEMA when its
 * table's DDL failed so). */
#define CES_APPLY_STALE_TRIES 3

typedef enum {
    CES_APPLY_OK = 0,
    CES_APPLY_FENCED,      /* stored positions moved under us: the batch was rolled back */
    CES_APPLY_INTERRUPTED, /* a stop was requested while retrying: the batch was rolled back */
    CES_APPLY_FATAL,       /* cannot go on (authentication, permissions, missing database...) */
    CES_APPLY_LOST,        /* a streamed transaction was rolled back: read it again */
} ces_apply_status_t;

typedef struct {
    uint64_t events_applied;
    uint64_t dead_letters;
    uint64_t retries;
} ces_apply_stats_t;

typedef struct ces_apply_s ces_apply_t;

/* Copies the options. Returns NULL when out of memory. Owned by the caller. */
/* Whether libpq can parse conninfo as a connection string (nothing is connected). Says nothing
 * more, since libpq's message may quote the string and with it a password. */
bool ces_apply_conninfo_valid(const char *conninfo);

ces_apply_t *ces_apply_new(const ces_apply_options_t *options);
void ces_apply_destroy(ces_apply_t *apply);

/* Every batch committed from now on checks that holder still writes with epoch (writer.h), in its
 * own transaction; NULL holder: no check. Returns 0, or -1 when out of memory. */
int ces_apply_set_writer(ces_apply_t *apply, const char *holder, int64_t epoch)
    __attribute__((warn_unused_result));

/* Connects (retrying transient failures) and creates the metadata schema and its tables. */
ces_apply_status_t ces_apply_start(ces_apply_t *apply, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/*
 * Reads the stored next offsets of topic's partitions[0..n) into offsets[0..n); -1 where PostgreSQL
 * has none.
 */
ces_apply_status_t ces_apply_read_positions(ces_apply_t *apply, const char *topic,
                                          const int32_t *partitions, size_t n, int64_t *offsets,
                                          char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/*
 * Applies batch in one transaction. Items that PostgreSQL rejects are turned into dead letters in
 * place. stats (may be NULL) is increased by what was committed.
 */
ces_apply_status_t ces_apply_batch(ces_apply_t *apply, ces_batch_t *batch,
                                   ces_apply_stats_t *stats, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/*
 * The same in two halves, so that the caller goes on (decoding the next batch) while PostgreSQL
 * executes this one. ces_apply_send sends batch's statements without waiting; batch stays the
 * caller's and must stay unchanged until ces_apply_finish, which waits for the results, commits,
 * and, if anything failed, retries exactly as ces_apply_batch would (rejected changes become dead
 * letters in place). ces_apply_progress, called often meanwhile, hands libpq's buffered
 * statements to the socket. ces_apply_ready does that too and reads the results that have come,
 * without waiting: true when ces_apply_finish will not wait for PostgreSQL to execute the batch
 * (it is done, or something failed; finish tells which), so that the caller can go on reading
 * meanwhile. While a batch is in flight (sent, not finished) no other ces_apply_
 * call but these and ces_apply_connected may be made. Inside a streamed transaction the batch is
 * sent as one part of it, as ces_apply_batch would (its last part, ces_apply_stream_commit, waits).
 */
ces_apply_status_t ces_apply_send(ces_apply_t *apply, ces_batch_t *batch, char *errstr,
                                  size_t errstr_size) __attribute__((warn_unused_result));
void ces_apply_progress(ces_apply_t *apply);
bool ces_apply_ready(ces_apply_t *apply);
ces_apply_status_t ces_apply_finish(ces_apply_t *apply, ces_apply_stats_t *stats, char *errstr,
                                    size_t errstr_size) __attribute__((warn_unused_result));

/*
 * Streaming one source transaction too large to hold in memory: ces_apply_stream_begin opens a
 * PostgreSQL transaction; while it is open, ces_apply_batch applies each batch as a part of it (under
 * a savepoint, so a rejected change dead-letters only itself) without committing;
 * ces_apply_stream_commit applies the last part with the positions and commits. Any other failure
 * returns CES_APPLY_LOST: the transaction is rolled back and the caller must read the stream again
 * from the stored positions. ces_apply_stream_abort rolls back an open stream.
 */
ces_apply_status_t ces_apply_stream_begin(ces_apply_t *apply, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));
ces_apply_status_t ces_apply_stream_commit(ces_apply_t *apply, ces_batch_t *batch,
                                           ces_apply_stats_t *stats, char *errstr,
                                           size_t errstr_size) __attribute__((warn_unused_result));
void ces_apply_stream_abort(ces_apply_t *apply);
bool ces_apply_streaming(const ces_apply_t *apply);

/* True while a connection is open and healthy. */
bool ces_apply_connected(const ces_apply_t *apply);

/* Between batches: notices a connection the server closed (reads what is pending without
 * waiting), or, when there is none, tries once to connect. Returns ces_apply_connected(). */
bool ces_apply_check(ces_apply_t *apply);

#endif
