#include "apply/session.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/log.h"

struct ces_session_s {
    char *conninfo;
    char *password; /* a secret: never logged */
    ces_token_source_t password_token;
    int64_t retry_max_ms;
    volatile sig_atomic_t *stop_now;
    void (*heartbeat)(void *opaque, bool connected);
    void *heartbeat_opaque;
    void (*retrying)(void *opaque, const char *reason);
    int (*on_connect)(void *opaque, ces_session_t *session, ces_pgerr_t *e);
    void *on_connect_opaque;

    PGconn *conn;
    uint64_t epoch;
    int64_t backoff_ms; /* the last wait; 0 before the first */
};

ces_session_t *ces_session_new(const ces_session_options_t *o) {
    ces_session_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->conninfo = strdup(o->conninfo);
    s->retry_max_ms = o->retry_max_ms;
    s->stop_now = o->stop_now;
    s->heartbeat = o->heartbeat;
    s->heartbeat_opaque = o->heartbeat_opaque;
    s->retrying = o->retrying;
    s->on_connect = o->on_connect;
    s->on_connect_opaque = o->on_connect_opaque;
    s->password_token = o->password_token;
    if (s->conninfo == NULL ||
        (o->password != NULL && (s->password = strdup(o->password)) == NULL)) {
        ces_session_destroy(s);
        return NULL;
    }
    return s;
}

void ces_session_destroy(ces_session_t *s) {
    if (s == NULL)
        return;
    if (s->conn != NULL)
        PQfinish(s->conn);
    free(s->conninfo);
    if (s->password != NULL) {
        explicit_bzero(s->password, strlen(s->password));
        free(s->password);
    }
    free(s);
}

PGconn *ces_session_conn(const ces_session_t *s) { return s->conn; }

bool ces_session_connected(const ces_session_t *s) {
    return s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK;
}

uint64_t ces_session_epoch(const ces_session_t *s) { return s->epoch; }

void ces_session_disconnect(ces_session_t *s) {
    if (s->conn == NULL)
        return;
    PQfinish(s->conn);
    s->conn = NULL;
    s->epoch++;
    if (s->heartbeat != NULL)
        s->heartbeat(s->heartbeat_opaque, false);
}

/* libpq's notices (e.g. "identifier will be truncated") go through our logger. */
static void notice_processor(void *arg, const char *message) {
    (void)arg;
    /* WARNINGs deserve attention; NOTICEs ("... already exists, skipping") are routine. */
    if (strncmp(message, "WARNING", 7) == 0)
        ces_log_warning("postgres: %s", message);
    else
        ces_log_debug("postgres: %s", message);
}

/* What PQexec would return, with the wait in ces_session_await_result, so that a statement (DDL
 * waiting on a lock included) is cancelled when a stop request outlives the grace period. The
 * first error wins: PostgreSQL runs nothing after it in one query string. NULL when the query
 * could not be sent. */
static PGresult *exec_and_wait(ces_session_t *s, const char *sql, int nparams,
                               const char *const *params) {
    int sent = nparams < 0 ? PQsendQuery(s->conn, sql)
                           : PQsendQueryParams(s->conn, sql, nparams, NULL, params, NULL, NULL, 0);
    if (sent != 1)
        return NULL;
    PGresult *kept = NULL, *r;
    for (;;) {
        ces_session_await_result(s);
        if ((r = PQgetResult(s->conn)) == NULL)
            break;
        ExecStatusType st = PQresultStatus(r);
        ExecStatusType kept_st = kept != NULL ? PQresultStatus(kept) : PGRES_COMMAND_OK;
        if (kept_st != PGRES_COMMAND_OK && kept_st != PGRES_TUPLES_OK &&
            kept_st != PGRES_EMPTY_QUERY) {
            PQclear(r);
            continue;
        }
        PQclear(kept);
        kept = r;
        if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH)
            break; /* no COPY goes through here; its state would never end this loop */
    }
    return kept;
}

int ces_session_exec(ces_session_t *s, const char *sql, ces_pgerr_t *e) {
    PGresult *r = exec_and_wait(s, sql, -1, NULL);
    int rc = 0;
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        ces_pgerr_from_result(e, s->conn, r, -1);
        rc = -1;
    }
    PQclear(r);
    return rc;
}

PGresult *ces_session_query(ces_session_t *s, const char *sql, int nparams,
                            const char *const *params, ces_pgerr_t *e) {
    PGresult *r = exec_and_wait(s, sql, nparams < 0 ? 0 : nparams, params);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        return r;
    ces_pgerr_from_result(e, s->conn, r, -1);
    PQclear(r);
    return NULL;
}

/* IF NOT EXISTS does not stop two sessions from both trying, and the loser gets a unique violation
 * or "already exists". That is success: the caller reads the catalog next and finds what the
 * winner made. */
int ces_session_exec_ddl(ces_session_t *s, const char *sql, ces_pgerr_t *e) {
    if (ces_session_exec(s, sql, e) == 0)
        return 0;
    if (!ces_pgerr_is_ddl_race(e->sqlstate))
        return -1;
    ces_log_debug("concurrent DDL (%s): %s", e->sqlstate, e->message);
    ces_pgerr_clear(e);
    return 0;
}

/* Opens s->conn with the password, or with a token from s->password_token (fresh or cached).
 * Returns 0, or -1 with e set (the connection closed). *refused_token tells a login refused with
 * a token, which a fresh one may get through. */
static int open_connection(ces_session_t *s, bool fresh, bool *refused_token, ces_pgerr_t *e) {
    char *token = NULL;
    const char *password = s->password;
    *refused_token = false;
    if (s->password_token.fetch != NULL) {
        char err[768];
        int64_t expires_at_ms;
        ces_token_status_t ts = s->password_token.fetch(s->password_token.opaque, fresh, &token,
                                                        &expires_at_ms, err, sizeof(err));
        if (ts != CES_TOKEN_OK) {
            ces_pgerr_set(e, ts == CES_TOKEN_RETRY ? CES_PGERR_RETRY : CES_PGERR_FATAL, -1, NULL,
                          "cannot connect to PostgreSQL: no token from %s: %s",
                          s->password_token.describe, err);
            return -1;
        }
        password = token;
    }
    /* Before dbname, so that the conninfo overrides them (expand_dbname): without them a server
     * that accepts and never answers, or a network that drops every packet, holds a connect or a
     * statement for as long as the kernel retransmits (a quarter of an hour), and with it a
     * writer's step down. connect_timeout only where PGCONNECT_TIMEOUT does not say. The password,
     * when given apart, after dbname: it overrides whatever conninfo says. */
    const char *connect_timeout = getenv("PGCONNECT_TIMEOUT") ? NULL : CES_SESSION_CONNECT_TIMEOUT;
    const char *const keywords[] = {"keepalives_idle", "keepalives_interval", "keepalives_count",
                                    "tcp_user_timeout", "connect_timeout", "dbname", "password",
                                    NULL};
    const char *const values[] = {CES_SESSION_KEEPALIVES_IDLE, CES_SESSION_KEEPALIVES_INTERVAL,
                                  CES_SESSION_KEEPALIVES_COUNT, CES_SESSION_TCP_USER_TIMEOUT,
                                  connect_timeout, s->conninfo, password, NULL};
    s->conn = PQconnectdbParams(keywords, values, 1);
    bool with_token = token != NULL;
    if (with_token) {
        explicit_bzero(token, strlen(token));
        free(token);
    }
    if (s->conn == NULL) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    s->epoch++;
    if (PQstatus(s->conn) != CONNECTION_OK) {
        const char *msg = PQerrorMessage(s->conn);
        *refused_token = with_token && strstr(msg, "authentication failed") != NULL;
        ces_pgerr_set(e, ces_pgerr_classify_connect_failure(msg), -1, NULL,
                      "cannot connect to PostgreSQL: %s", msg);
        ces_session_disconnect(s);
        return -1;
    }
    return 0;
}

int ces_session_connect_once(ces_session_t *s, ces_pgerr_t *e) {
    ces_session_disconnect(s);
    bool refused_token;
    if (open_connection(s, false, &refused_token, e) != 0) {
        if (!refused_token)
            return -1;
        ces_log_info("PostgreSQL refused the login with a cached token from %s; fetching a fresh "
                     "one", s->password_token.describe);
        ces_pgerr_clear(e);
        if (open_connection(s, true, &refused_token, e) != 0)
            return -1;
    }
    PQsetNoticeProcessor(s->conn, notice_processor, NULL);
    /* Values arrive as SQL Server text; make their reading independent of the server's defaults.
     * Every row change looks rows up by key (target tables, tombstones), and a plan made while a
     * table was small scans it instead. PostgreSQL keeps a prepared statement's generic plan
     * after five executions, until the table is next analysed: a replica that starts small and
     * grows fast then scans the tombstones for every new key and the table for every delete
     * statement. So each execution is planned for its parameters and the tables' sizes of the
     * moment, at the price of planning every bulk statement. Hash and merge joins stay off: every
     * statement joins its rows to a table by key. */
    if (ces_session_exec(s, "SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres';"
                            " SET extra_float_digits = 3; SET client_encoding = 'UTF8';"
                            " SET enable_hashjoin = off; SET enable_mergejoin = off",
                         e) != 0 ||
        /* before 12 there is no such setting: generic plans it is */
        (PQserverVersion(s->conn) >= 120000 &&
         ces_session_exec(s, "SET plan_cache_mode = force_custom_plan", e) != 0) ||
        (s->on_connect != NULL && s->on_connect(s->on_connect_opaque, s, e) != 0)) {
        ces_session_disconnect(s);
        return -1;
    }
    ces_log_info("connected to PostgreSQL (server %d, database %s)", PQserverVersion(s->conn),
                 PQdb(s->conn));
    if (s->heartbeat != NULL)
        s->heartbeat(s->heartbeat_opaque, true);
    return 0;
}

int64_t ces_session_backoff_next(ces_session_t *s, const char *reason) {
    if (s->retrying != NULL)
        s->retrying(s->heartbeat_opaque, reason);
    int64_t ms = s->backoff_ms ? s->backoff_ms * CES_SESSION_BACKOFF_GROWTH
                               : CES_SESSION_BACKOFF_FIRST_MS;
    if (ms > s->retry_max_ms)
        ms = s->retry_max_ms;
    s->backoff_ms = ms;
    return ms;
}

void ces_session_backoff_reset(ces_session_t *s) {
    if (s->backoff_ms != 0 && s->retrying != NULL)
        s->retrying(s->heartbeat_opaque, NULL);
    s->backoff_ms = 0;
}

static bool stop_requested(const ces_session_t *s) { return s->stop_now != NULL && *s->stop_now; }

int ces_session_backoff_sleep(ces_session_t *s, int64_t ms) {
    while (ms > 0) {
        if (stop_requested(s))
            return -1;
        if (s->heartbeat != NULL)
            s->heartbeat(s->heartbeat_opaque, ces_session_connected(s));
        int64_t step = ms < CES_SESSION_SLEEP_STEP_MS ? ms : CES_SESSION_SLEEP_STEP_MS;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
        nanosleep(&ts, NULL);
        ms -= step;
    }
    return stop_requested(s) ? -1 : 0;
}

/* Asks the server to cancel what the connection executes. */
static void cancel_statement(ces_session_t *s) {
    ces_log_warning("stop requested: cancelling the statement PostgreSQL is still executing "
                    "after %d ms", CES_SESSION_STOP_GRACE_MS);
    PGcancel *c = PQgetCancel(s->conn);
    char err[256];
    if (c == NULL || PQcancel(c, err, sizeof(err)) != 1)
        ces_log_warning("cancelling the statement failed: %s", c == NULL ? "no cancel key" : err);
    PQfreeCancel(c);
}

void ces_session_await_result(ces_session_t *s) {
    PGconn *conn = s->conn;
    int64_t stop_since = 0;
    bool cancelled = false;
    while (conn != NULL && PQisBusy(conn)) {
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
        if (pfd.fd < 0)
            return;
        int n = poll(&pfd, 1, CES_SESSION_SLEEP_STEP_MS);
        if ((n < 0 && errno != EINTR) || (n > 0 && PQconsumeInput(conn) != 1))
            return;
        if (cancelled || !stop_requested(s))
            continue;
        int64_t now = ces_clock_now_ms();
        if (stop_since == 0) {
            stop_since = now;
        } else if (now - stop_since >= CES_SESSION_STOP_GRACE_MS) {
            cancel_statement(s);
            cancelled = true;
        }
    }
}

ces_session_status_t ces_session_ensure_connected(ces_session_t *s, char *errstr,
                                                  size_t errstr_size) {
    while (!ces_session_connected(s)) {
        ces_pgerr_t e = CES_PGERR_INIT;
        if (ces_session_connect_once(s, &e) == 0)
            break;
        if (e.action != CES_PGERR_RETRY) {
            snprintf(errstr, errstr_size, "%s", e.message);
            return CES_SESSION_FATAL;
        }
        int64_t ms = ces_session_backoff_next(s, "connect");
        ces_log_warning("%s (retrying in %lld ms)", e.message, (long long)ms);
        if (ces_session_backoff_sleep(s, ms) != 0) {
            snprintf(errstr, errstr_size, "stopped while waiting for PostgreSQL");
            return CES_SESSION_INTERRUPTED;
        }
    }
    return CES_SESSION_OK;
}

bool ces_session_check(ces_session_t *s, bool transaction_open) {
    if (s->conn != NULL) {
        /* A server that shut down sent its goodbye and closed the socket: reading notices it. */
        if (!transaction_open && PQtransactionStatus(s->conn) == PQTRANS_IDLE &&
            (PQconsumeInput(s->conn) != 1 || PQstatus(s->conn) != CONNECTION_OK)) {
            ces_log_warning("PostgreSQL closed the connection: %s", PQerrorMessage(s->conn));
            ces_session_disconnect(s);
        }
        return ces_session_connected(s);
    }
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_session_connect_once(s, &e) != 0)
        ces_log_debug("reconnecting to PostgreSQL between batches: %s", e.message);
    return ces_session_connected(s);
}

char *ces_session_quote(const ces_session_t *s, const char *name) {
    char *q = PQescapeIdentifier(s->conn, name, strlen(name));
    if (q == NULL)
        return NULL;
    char *copy = strdup(q);
    PQfreemem(q);
    return copy;
}
