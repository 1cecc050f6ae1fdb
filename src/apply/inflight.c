#include "apply/inflight.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "apply/positions.h"
#include "util/array.h"
#include "util/log.h"

/* A Parse, told apart from the kinds the senders name. */
#define KIND_PARSE ((ces_inflight_kind_t)-1)

/* A statement whose result is still to be read. */
typedef struct {
    ces_inflight_kind_t kind;
    long item;                     /* batch index, or offset index for CES_INFLIGHT_OFFSET */
    uint64_t *epoch;               /* KIND_PARSE: where its statement records it was prepared */
    ces_catalog_table_t *inserted; /* a bulk plain INSERT: its table */
} pending_t;

struct ces_inflight_s {
    ces_session_t *session;
    ces_pgerr_t *e;
    bool nonblocking;
    pending_t *pending;
    size_t npending;
    size_t capacity;
    bool fenced;
    /* An incremental drain (drain_some without waiting): results read, whether the NULL after
     * the last one is still due, and, once it reached the Sync (drain_done), its outcome. */
    size_t drained;
    bool between;
    bool drain_done;
    int drain_rc;
    bool sent_all; /* the attempt's statements went through to their last Sync */
};

ces_inflight_t *ces_inflight_new(ces_session_t *session, ces_pgerr_t *e, bool nonblocking) {
    ces_inflight_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->session = session;
    q->e = e;
    q->nonblocking = nonblocking;
    return q;
}

void ces_inflight_destroy(ces_inflight_t *q) {
    if (q == NULL)
        return;
    free(q->pending);
    free(q);
}

PGconn *ces_inflight_conn(const ces_inflight_t *q) { return ces_session_conn(q->session); }

uint64_t ces_inflight_epoch(const ces_inflight_t *q) { return ces_session_epoch(q->session); }

int ces_inflight_out_of_memory(ces_inflight_t *q) {
    ces_pgerr_set(q->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
    return -1;
}

/* A PQsend* call failed: the connection is in trouble and the attempt stops. Returns -1. */
static int send_failed(ces_inflight_t *q) {
    ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "sending to PostgreSQL: %s",
                  PQerrorMessage(ces_inflight_conn(q)));
    return -1;
}

/* Records the outcome of a PQsend* call: on success, the result p is expected. */
static int sent(ces_inflight_t *q, int ok, pending_t p) {
    if (ok != 1)
        return send_failed(q);
    pending_t *pending =
        CES_ARRAY_RESERVE(q->pending, q->capacity, q->npending + 1, CES_INFLIGHT_CHUNK * 2);
    if (pending == NULL)
        return ces_inflight_out_of_memory(q);
    q->pending = pending;
    q->pending[q->npending++] = p;
    return 0;
}

int ces_inflight_sent(ces_inflight_t *q, int ok, ces_inflight_kind_t kind, long item) {
    return sent(q, ok, (pending_t){kind, item, NULL, NULL});
}

int ces_inflight_sent_insert(ces_inflight_t *q, int ok, ces_catalog_table_t *table) {
    return sent(q, ok, (pending_t){CES_INFLIGHT_BULK, -1, NULL, table});
}

int ces_inflight_sent_parse(ces_inflight_t *q, int ok, long item, uint64_t *epoch) {
    if (sent(q, ok, (pending_t){KIND_PARSE, item, epoch, NULL}) != 0)
        return -1;
    *epoch = ces_session_epoch(q->session);
    return 0;
}

/* Ends what was sent with a Sync (its results can be read then). Returns -1 on a broken
 * connection. */
static int send_sync(ces_inflight_t *q) {
    return PQpipelineSync(ces_inflight_conn(q)) == 1 ? 0 : send_failed(q);
}

/* Forgets where an incremental drain stopped (the pending results are dropped or read anew). */
static void drain_reset(ces_inflight_t *q) {
    q->drained = 0;
    q->between = false;
    q->drain_rc = 0;
    q->drain_done = false;
}

/* The error of one statement's result r (not the fence's): the first error of the attempt decides.
 * Returns -1 when the connection broke. */
static int result_failed(ces_inflight_t *q, const pending_t *p, PGresult *r) {
    PGconn *conn = ces_inflight_conn(q);
    long item = (p->kind == CES_INFLIGHT_ROW || p->kind == KIND_PARSE) ? p->item : -1;
    /* Row changes on target tables: what PostgreSQL refuses there is the events' (pgerr.h). */
    bool target = p->kind == CES_INFLIGHT_ROW || p->kind == CES_INFLIGHT_BULK ||
                  p->kind == KIND_PARSE;
    bool first = q->e->action == CES_PGERR_NONE;
    ces_pgerr_from_result(q->e, conn, r, item);
    if (first && target)
        ces_pgerr_blame_event(q->e);
    /* Bad data, or one key twice in a statement (two texts of one value, like "1" and "01"):
     * only row by row can tell which change it was. */
    if (first && p->inserted != NULL && strcmp(q->e->sqlstate, ERRCODE_UNIQUE_VIOLATION) == 0) {
        q->e->action = CES_PGERR_RETRY_WITH_UPSERTS;
        q->e->taken = p->inserted;
    } else if (first && target && item < 0 &&
               (q->e->action == CES_PGERR_DATA ||
                strcmp(q->e->sqlstate, ERRCODE_CARDINALITY_VIOLATION) == 0)) {
        q->e->action = CES_PGERR_RETRY_ROW_BY_ROW;
    }
    return PQstatus(conn) != CONNECTION_OK ? -1 : 0;
}

/* Reads the result of the pending statement p. Returns -1 when the connection broke. */
static int read_result(ces_inflight_t *q, const pending_t *p, PGresult *r) {
    ExecStatusType st = PQresultStatus(r);
    if (p->kind == KIND_PARSE && st != PGRES_COMMAND_OK)
        *p->epoch = 0; /* aborted or failed: Parse it again next time */
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        /* A COMMIT answered ROLLBACK undid the batch (it cannot happen inside a pipeline,
         * which skips everything after an error, but nothing else would notice). */
        if (p->kind == CES_INFLIGHT_COMMIT && strcmp(PQcmdStatus(r), "COMMIT") != 0)
            ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL rolled the batch back (%s)",
                          PQcmdStatus(r));
        return 0;
    }
    if (p->kind == CES_INFLIGHT_OFFSET && ces_positions_fence_raised(r)) {
        q->fenced = true; /* and the rest of the pipeline, COMMIT included, is skipped */
        return 0;
    }
    if (st == PGRES_PIPELINE_ABORTED)
        return 0;
    return result_failed(q, p, r);
}

/* Reads the Sync that ends the pending results. Returns -1 when it is not there. */
static int read_sync(ces_inflight_t *q) {
    PGconn *conn = ces_inflight_conn(q);
    int rc = 0;
    ces_session_await_result(q->session);
    PGresult *r = PQgetResult(conn);
    if (r == NULL || PQresultStatus(r) != PGRES_PIPELINE_SYNC) {
        if (r != NULL)
            ces_pgerr_from_result(q->e, conn, r, -1);
        else
            ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL connection lost: %s",
                          PQerrorMessage(conn));
        rc = -1;
    }
    PQclear(r);
    return rc;
}

/* Reads the next thing the pipeline holds: a pending statement's result, or the NULL that ends
 * each statement's results. Returns -1 on a broken connection. */
static int read_next(ces_inflight_t *q) {
    PGconn *conn = ces_inflight_conn(q);
    PGresult *r = PQgetResult(conn);
    if (q->between) {
        q->between = false;
        if (r != NULL) {
            PQclear(r);
            ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL,
                          "unexpected extra result from PostgreSQL");
            q->drain_rc = -1;
        }
        return 0;
    }
    pending_t *p = &q->pending[q->drained++];
    if (r == NULL) {
        ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL connection lost: %s",
                      PQerrorMessage(conn));
        drain_reset(q);
        return -1;
    }
    int rc = read_result(q, p, r);
    PQclear(r);
    if (rc != 0) {
        drain_reset(q);
        return -1;
    }
    q->between = true;
    return 0;
}

/* Reads the pending results up to the Sync. With wait false it stops where libpq would block and
 * returns 1; called again, it goes on from there (ces_inflight_ready). Returns 0 at the Sync, -1
 * on a broken connection. */
static int drain_some(ces_inflight_t *q, bool wait) {
    PGconn *conn = ces_inflight_conn(q);
    while (q->drained < q->npending || q->between) {
        if (!wait && PQisBusy(conn))
            return 1;
        if (wait)
            ces_session_await_result(q->session); /* a stop cancels a statement that lasts */
        if (read_next(q) != 0)
            return -1;
    }
    if (!wait && PQisBusy(conn))
        return 1;
    int rc = q->drain_rc;
    q->npending = 0;
    drain_reset(q);
    return read_sync(q) != 0 ? -1 : rc;
}

/* Reads every pending result up to the Sync (or returns what ces_inflight_ready's drain found).
 * Returns -1 on a broken connection. */
static int drain(ces_inflight_t *q) {
    if (q->drain_done) {
        int rc = q->drain_rc;
        drain_reset(q);
        return rc;
    }
    return drain_some(q, true);
}

/* Sends a Sync and reads every pending result. Returns -1 on a broken connection. */
static int sync_and_drain(ces_inflight_t *q) { return send_sync(q) != 0 ? -1 : drain(q); }

int ces_inflight_sync_and_drain(ces_inflight_t *q) { return sync_and_drain(q); }

int ces_inflight_maybe_sync(ces_inflight_t *q) {
    if (q->npending < CES_INFLIGHT_CHUNK)
        return 0;
    return sync_and_drain(q);
}

int ces_inflight_simple(ces_inflight_t *q, const char *sql) {
    return ces_inflight_sent(
        q, PQsendQueryParams(ces_inflight_conn(q), sql, 0, NULL, NULL, NULL, NULL, 0),
        CES_INFLIGHT_OTHER, -1);
}

int ces_inflight_commit(ces_inflight_t *q) {
    return ces_inflight_sent(
        q, PQsendQueryParams(ces_inflight_conn(q), "COMMIT", 0, NULL, NULL, NULL, NULL, 0),
        CES_INFLIGHT_COMMIT, -1);
}

int ces_inflight_seal(ces_inflight_t *q) {
    if (send_sync(q) != 0)
        return -1;
    q->sent_all = true;
    return 0;
}

bool ces_inflight_fenced(const ces_inflight_t *q) { return q->fenced; }

int ces_inflight_begin(ces_inflight_t *q) {
    PGconn *conn = ces_inflight_conn(q);
    if (PQenterPipelineMode(conn) != 1) {
        ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "entering pipeline mode: %s",
                      PQerrorMessage(conn));
        return -1;
    }
    if (q->nonblocking && PQsetnonblocking(conn, 1) != 0) {
        q->nonblocking = false;
        ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL: %s", PQerrorMessage(conn));
        return -1;
    }
    return 0;
}

void ces_inflight_end(ces_inflight_t *q) {
    if (PQexitPipelineMode(ces_inflight_conn(q)) != 1)
        ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "leaving pipeline mode: %s",
                      PQerrorMessage(ces_inflight_conn(q)));
}

/* Back to blocking mode once libpq has sent all it buffered (reading results meanwhile, so that
 * the server never waits on a full socket). */
static int leave_nonblocking(ces_inflight_t *q) {
    PGconn *conn = ces_inflight_conn(q);
    if (!q->nonblocking)
        return 0;
    q->nonblocking = false;
    int flushed;
    while ((flushed = PQflush(conn)) == 1) {
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLOUT | POLLIN};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
            ces_pgerr_set(q->e, CES_PGERR_RETRY, -1, NULL, "waiting for PostgreSQL: %s",
                          strerror(errno));
            return -1;
        }
        if ((pfd.revents & (POLLIN | POLLERR | POLLHUP)) && PQconsumeInput(conn) != 1)
            break; /* PQflush reports it */
    }
    return flushed == 0 && PQsetnonblocking(conn, 0) == 0 ? 0 : send_failed(q);
}

int ces_inflight_drain(ces_inflight_t *q) {
    return leave_nonblocking(q) != 0 || drain(q) != 0 ? -1 : 0;
}

void ces_inflight_progress(ces_inflight_t *q) {
    PGconn *conn = ces_inflight_conn(q);
    if (!q->nonblocking || q->e->action != CES_PGERR_NONE || conn == NULL)
        return;
    /* Errors show when the batch is finished. */
    if (PQflush(conn) >= 0)
        PQconsumeInput(conn);
}

bool ces_inflight_ready(ces_inflight_t *q) {
    PGconn *conn = ces_inflight_conn(q);
    if (q->e->action != CES_PGERR_NONE || conn == NULL || q->drain_done)
        return true;
    /* Trouble of any kind shows when the batch is finished: report ready. */
    if (q->nonblocking) {
        int flushed = PQflush(conn);
        if (flushed < 0)
            return true;
        if (flushed == 1) {
            PQconsumeInput(conn); /* the server may wait for us to read before it reads on */
            return false;
        }
    }
    if (PQconsumeInput(conn) != 1)
        return true;
    int rc = drain_some(q, false);
    if (rc == 1)
        return false;
    q->drain_done = true;
    q->drain_rc = rc;
    return true;
}

/* After the rollback of a failed attempt. Results that nobody read would be taken for the answers
 * to the next attempt's statements: a session that cannot leave pipeline mode is closed instead
 * (which rolls back whatever it had open). */
static void leave_pipeline_or_disconnect(ces_inflight_t *q) {
    if (PQexitPipelineMode(ces_inflight_conn(q)) == 1)
        return;
    ces_log_warning("PostgreSQL: leaving pipeline mode after a failed batch: %s; reconnecting",
                    PQerrorMessage(ces_inflight_conn(q)));
    ces_session_disconnect(q->session);
}

/* Ends a failed attempt's pipeline, if the connection still works: reads what was sent to its
 * last Sync (an error may have been read before the rest of the results, even while libpq was
 * still sending), then rolls back the transaction, or in a stream only the step. */
static void roll_back(ces_inflight_t *q, bool whole) {
    PGconn *conn = ces_inflight_conn(q);
    if (PQstatus(conn) != CONNECTION_OK || PQpipelineStatus(conn) == PQ_PIPELINE_OFF)
        return;
    ces_pgerr_t ignored = CES_PGERR_INIT;
    ces_pgerr_t *saved = q->e;
    q->e = &ignored;
    if (q->sent_all && (q->npending > 0 || q->between) && leave_nonblocking(q) == 0)
        drain(q);
    q->npending = 0;
    drain_reset(q);
    if (ces_inflight_simple(q, whole ? "ROLLBACK" : "ROLLBACK TO SAVEPOINT ces_step") == 0)
        sync_and_drain(q);
    q->e = saved;
    leave_pipeline_or_disconnect(q);
}

void ces_inflight_roll_back(ces_inflight_t *q, bool whole) {
    roll_back(q, whole);
    PGconn *conn = ces_inflight_conn(q);
    if (conn != NULL && PQisnonblocking(conn) && PQsetnonblocking(conn, 0) != 0)
        ces_session_disconnect(q->session);
}
