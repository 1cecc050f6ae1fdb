/*
 * session: ces2pg's one connection to PostgreSQL and its life.
 *
 * It connects (the password given apart overrides conninfo's), sets the session up so that values
 * are read the same whatever the server's defaults, passes libpq's notices to the logger, waits
 * between attempts with a capped exponential backoff that a stop request ends, runs statements
 * outside a pipeline, and quotes identifiers with libpq's escaping.
 *
 * Other modules keep state that belongs to one connection (prepared statements, an open streamed
 * transaction). Instead of being told when the connection goes, they remember the session's
 * epoch when they made that state: the epoch changes on every connect and disconnect, so state of
 * another epoch is gone with its connection. See docs/architecture.md for the apply room.
 */
#ifndef CES_SESSION_H
#define CES_SESSION_H

#include <libpq-fe.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "apply/pgerr.h"
#include "util/token.h"

/* libpq's settings of every connection unless the conninfo says otherwise: a connect gives up
 * after 10 s; an idle connection is probed after 30 s, every 10 s, and dropped after 3 unanswered
 * probes; data PostgreSQL has not acknowledged for 60 s drops it too. (Strings: libpq's values.) */
#define CES_SESSION_CONNECT_TIMEOUT "10"
#define CES_SESSION_KEEPALIVES_IDLE "30"
#define CES_SESSION_KEEPALIVES_INTERVAL "10"
#define CES_SESSION_KEEPALIVES_COUNT "3"
#define CES_SESSION_TCP_USER_TIMEOUT "60000"

/* The backoff: the first wait, then doubling up to postgres.retry_max_ms. */
#define CES_SESSION_BACKOFF_FIRST_MS 100
#define CES_SESSION_BACKOFF_GROWTH 2
/* A wait sleeps in steps this long, checking the stop flag and beating the heart between them. */
#define CES_SESSION_SLEEP_STEP_MS 50
/* A statement still executing this long after a stop was requested is cancelled (ces2pg would
 * otherwise wait for a lock or a slow trigger as long as they last). */
#define CES_SESSION_STOP_GRACE_MS 5000

typedef struct ces_session_s ces_session_t;

typedef struct {
    const char *conninfo;
    const char *password; /* libpq's password parameter, overriding conninfo's (a secret; may be
                           * NULL) */
    /* Where the password comes from instead, when its fetch is set: a token fetched before every
     * connect (from its cache while far from expiry), and once more fresh when PostgreSQL refuses
     * the login made with a cached one (Azure Database for PostgreSQL checks a token only at
     * login). Copied; its opaque and describe must outlive the session. */
    ces_token_source_t password_token;
    int64_t retry_max_ms; /* cap of the backoff */
    volatile sig_atomic_t *stop_now; /* reference; when set, waits end (may be NULL) */
    /* Called when the connection opens or closes, and at every step of a backoff wait (so that a
     * PostgreSQL outage does not look like a stuck process); may be NULL. */
    void (*heartbeat)(void *opaque, bool connected);
    void *heartbeat_opaque;
    /* Called with the reason of every retry as its wait is chosen (ces_session_backoff_next),
     * and with NULL when the retries end (ces_session_backoff_reset after one); its opaque is
     * heartbeat_opaque. May be NULL. */
    void (*retrying)(void *opaque, const char *reason);
    /* Called on every new connection before it counts as connected (the apply room creates its
     * metadata schema there). Returns 0, or -1 with e set: the connection is then closed. May be
     * NULL. */
    int (*on_connect)(void *opaque, ces_session_t *session, ces_pgerr_t *e);
    void *on_connect_opaque;
} ces_session_options_t;

typedef enum {
    CES_SESSION_OK = 0,
    CES_SESSION_FATAL,       /* cannot connect, and retrying will not help (errstr says why) */
    CES_SESSION_INTERRUPTED, /* a stop was requested while waiting */
} ces_session_status_t;

/* Copies the options' strings. Returns NULL when out of memory. Owned by the caller; nothing is
 * connected until ces_session_connect_once or ces_session_ensure_connected. */
ces_session_t *ces_session_new(const ces_session_options_t *options)
    __attribute__((warn_unused_result));
/* Closes the connection (without a heartbeat) and frees the session. Accepts NULL. */
void ces_session_destroy(ces_session_t *session);

/* The connection, or NULL. A reference: valid until the next connect or disconnect. */
PGconn *ces_session_conn(const ces_session_t *session);
/* True while a connection is open and healthy. */
bool ces_session_connected(const ces_session_t *session);
/* Changes on every connect and disconnect; never 0 while a connection is open. */
uint64_t ces_session_epoch(const ces_session_t *session);

/* Closes any connection, then connects once and sets the session up. Returns 0, or -1 with e set
 * (CES_PGERR_RETRY when trying again may help). */
int ces_session_connect_once(ces_session_t *session, ces_pgerr_t *e)
    __attribute__((warn_unused_result));
/* Connects, retrying transient failures with backoff until connected, a fatal error, or a stop. */
ces_session_status_t ces_session_ensure_connected(ces_session_t *session, char *errstr,
                                                  size_t errstr_size)
    __attribute__((warn_unused_result));
/* Closes the connection (PostgreSQL rolls back whatever it had open) and tells the heartbeat. */
void ces_session_disconnect(ces_session_t *session);

/* Between batches: notices a connection the server closed by reading what is pending without
 * waiting (unless a transaction is open on it, whose results are not ours to read), or, when
 * there is none, tries once to connect. Returns ces_session_connected(). */
bool ces_session_check(ces_session_t *session, bool transaction_open);

/* The next wait of the backoff, for a retry because of reason (a static string: one of
 * CES_APPLY_RETRY_REASONS, apply.h), which the retrying hook hears of. */
int64_t ces_session_backoff_next(ces_session_t *session, const char *reason);
/* Starts the backoff again from CES_SESSION_BACKOFF_FIRST_MS (after a success): the retries, if
 * any, have ended. */
void ces_session_backoff_reset(ces_session_t *session);
/* Sleeps ms milliseconds in steps, so that a stop request ends the wait. Returns 0, or -1 when a
 * stop was requested. */
int ces_session_backoff_sleep(ces_session_t *session, int64_t ms)
    __attribute__((warn_unused_result));

/* Waits until libpq can give the next result without blocking, checking the stop flag every
 * CES_SESSION_SLEEP_STEP_MS: once a stop has been requested for CES_SESSION_STOP_GRACE_MS, the
 * statement under way is cancelled (it then fails with 57014, which ends the attempt). A broken
 * connection returns at once: PQgetResult reports it. */
void ces_session_await_result(ces_session_t *session);

/* Runs sql (one or more statements, no parameters) outside any pipeline. Returns 0, or -1 with e
 * set. */
int ces_session_exec(ces_session_t *session, const char *sql, ces_pgerr_t *e)
    __attribute__((warn_unused_result));
/* The same for idempotent DDL that other instances may run at the same moment: losing that race
 * (ces_pgerr_is_ddl_race) counts as success, and e is cleared. */
int ces_session_exec_ddl(ces_session_t *session, const char *sql, ces_pgerr_t *e)
    __attribute__((warn_unused_result));
/* Runs sql with nparams text parameters. Returns its result when it holds rows or a command's
 * status (the caller's, to PQclear); otherwise NULL, with the error (PostgreSQL's or the
 * connection's) in e. */
PGresult *ces_session_query(ces_session_t *session, const char *sql, int nparams,
                            const char *const *params, ces_pgerr_t *e)
    __attribute__((warn_unused_result));

/* name quoted as an SQL identifier by libpq (which needs a connection object, open or not).
 * Returns a malloc'd string owned by the caller, or NULL when out of memory or before the first
 * connection attempt. */
char *ces_session_quote(const ces_session_t *session, const char *name)
    __attribute__((warn_unused_result));

#endif
