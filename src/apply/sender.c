#include "apply/sender.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/bulk.h"
#include "format/decode.h"
#include "format/json.h"
#include "util/log.h"
#include "util/map.h"
#include "apply/sqltext.h"
#include "util/strbuf.h"
#include "format/types.h"

typedef struct {
    char *name;
    uint64_t epoch; /* the session epoch it was prepared in; 0: not prepared (its Parse failed) */
} stmt_t;

struct ces_sender_stmts_s {
    ces_map_t *by_signature; /* signature -> stmt_t */
    unsigned next_id;
};

typedef enum {
    PEND_OTHER,
    PEND_PREPARE,
    PEND_ROW,
    PEND_BULK,
    PEND_DEAD_LETTER,
    PEND_OFFSET,
    PEND_COMMIT
} pend_kind_t;

/* A statement whose result is still to be read. */
typedef struct {
    pend_kind_t kind;
    long item; /* batch index, or offset index for PEND_OFFSET */
    stmt_t *stmt;
    ces_catalog_table_t *inserted; /* a bulk plain INSERT: its table */
} pending_t;

struct ces_sender_s {
    ces_session_t *session;
    ces_sender_stmts_t *stmts;
    const ces_metadata_t *metadata;
    const ces_positions_t *positions;
    ces_pgerr_t *e;
    bool bulk;
    bool plain_inserts;
    bool nonblocking;
    uint64_t attempt;
    ces_bulk_t *gathered;
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
    /* scratch for one statement's parameters */
    const char **values;
    int *lengths;
    long *cols;
    const ces_field_t **fields;
    size_t scratch_capacity;
    unsigned *marks; /* per target column: == mark when the statement being built has it */
    size_t marks_capacity;
    unsigned mark;
    char *sig; /* the statement signature being built */
    size_t sig_capacity;
    char version[64];
    /* The last upsert's columns, by its event's shape (the names of its column list and images,
     * in order, which alone decide them): a table's events nearly always repeat a shape, and
     * resolving every name of every event was most of building an upsert. The shape is the
     * batch's (an event's compact copy), and the sender lives for one attempt, in which no table
     * changes. from[j]: the field for column cols[j], in current, or at ncurrent + k in pkkey. */
    struct {
        const ces_catalog_table_t *table;
        const char *shape; /* names only: the counts tell where each list starts */
        size_t shape_len;
        size_t ncols, npkkey, ncurrent, nold;
        size_t n;
        long *cols;
        uint32_t *from;
        size_t capacity;
    } recipe;
};

static void stmt_free(void *value, void *arg) {
    (void)arg;
    stmt_t *st = value;
    free(st->name);
    free(st);
}

ces_sender_stmts_t *ces_sender_stmts_new(void) {
    ces_sender_stmts_t *stmts = calloc(1, sizeof(*stmts));
    if (stmts == NULL)
        return NULL;
    if ((stmts->by_signature = ces_map_new()) == NULL) {
        free(stmts);
        return NULL;
    }
    return stmts;
}

void ces_sender_stmts_destroy(ces_sender_stmts_t *stmts) {
    if (stmts == NULL)
        return;
    ces_map_clear(stmts->by_signature, stmt_free, NULL);
    ces_map_destroy(stmts->by_signature);
    free(stmts);
}

static PGconn *conn_of(const ces_sender_t *s) { return ces_session_conn(s->session); }

static void out_of_memory(ces_sender_t *s) {
    ces_pgerr_set(s->e, CES_PGERR_FATAL, -1, NULL, "out of memory");
}

/* A PQsend* call failed: the connection is in trouble and the attempt stops. Returns -1. */
static int send_failed(ces_sender_t *s) {
    ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "sending to PostgreSQL: %s",
                  PQerrorMessage(conn_of(s)));
    return -1;
}

static int push_pending(ces_sender_t *s, pend_kind_t kind, long item, stmt_t *stmt) {
    if (s->npending == s->capacity) {
        size_t cap = s->capacity ? s->capacity * 2 : CES_SENDER_PIPELINE_CHUNK * 2;
        pending_t *p = realloc(s->pending, cap * sizeof(*p));
        if (p == NULL) {
            out_of_memory(s);
            return -1;
        }
        s->pending = p;
        s->capacity = cap;
    }
    s->pending[s->npending++] = (pending_t){kind, item, stmt, NULL};
    return 0;
}

/* Records the result of a PQsend* call: on success its result is expected (kind, item). */
static int sent(ces_sender_t *s, int ok, pend_kind_t kind, long item, stmt_t *stmt) {
    if (ok != 1)
        return send_failed(s);
    return push_pending(s, kind, item, stmt);
}

/* Ends what was sent with a Sync (its results can be read then). Returns -1 on a broken
 * connection. */
static int send_sync(ces_sender_t *s) {
    return PQpipelineSync(conn_of(s)) == 1 ? 0 : send_failed(s);
}

/* Forgets where an incremental drain stopped (the pending results are dropped or read anew). */
static void drain_reset(ces_sender_t *s) {
    s->drained = 0;
    s->between = false;
    s->drain_rc = 0;
    s->drain_done = false;
}

/* The error of one statement's result r (not the fence's): the first error of the attempt decides.
 * Returns -1 when the connection broke. */
static int result_failed(ces_sender_t *s, const pending_t *p, PGresult *r) {
    PGconn *conn = conn_of(s);
    long item = (p->kind == PEND_ROW || p->kind == PEND_PREPARE) ? p->item : -1;
    bool first = s->e->cls == CES_PGERR_NONE;
    ces_pgerr_from_result(s->e, conn, r, item);
    /* Bad data, or one key twice in a statement (two texts of one value, like "1" and "01"):
     * only row by row can tell which change it was. */
    if (first && p->inserted != NULL && strcmp(s->e->sqlstate, ERRCODE_UNIQUE_VIOLATION) == 0) {
        s->e->cls = CES_PGERR_INSERT_TAKEN;
        s->e->taken = p->inserted;
    } else if (first && p->kind == PEND_BULK &&
               (s->e->cls == CES_PGERR_DATA ||
                strcmp(s->e->sqlstate, ERRCODE_CARDINALITY_VIOLATION) == 0)) {
        s->e->cls = CES_PGERR_BULK;
    }
    return PQstatus(conn) != CONNECTION_OK ? -1 : 0;
}

/* Reads the result of the pending statement p. Returns -1 when the connection broke. */
static int read_result(ces_sender_t *s, const pending_t *p, PGresult *r) {
    ExecStatusType st = PQresultStatus(r);
    if (p->kind == PEND_PREPARE && st != PGRES_COMMAND_OK)
        p->stmt->epoch = 0; /* aborted or failed: Parse it again next time */
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        /* A COMMIT answered ROLLBACK undid the batch (it cannot happen inside a pipeline,
         * which skips everything after an error, but nothing else would notice). */
        if (p->kind == PEND_COMMIT && strcmp(PQcmdStatus(r), "COMMIT") != 0)
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL rolled the batch back (%s)",
                          PQcmdStatus(r));
        return 0;
    }
    if (p->kind == PEND_OFFSET && ces_positions_fence_raised(r)) {
        s->fenced = true; /* and the rest of the pipeline, COMMIT included, is skipped */
        return 0;
    }
    if (st == PGRES_PIPELINE_ABORTED)
        return 0;
    return result_failed(s, p, r);
}

/* Reads the Sync that ends the pending results. Returns -1 when it is not there. */
static int read_sync(ces_sender_t *s) {
    PGconn *conn = conn_of(s);
    int rc = 0;
    PGresult *r = PQgetResult(conn);
    if (r == NULL || PQresultStatus(r) != PGRES_PIPELINE_SYNC) {
        if (r != NULL)
            ces_pgerr_from_result(s->e, conn, r, -1);
        else
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL connection lost: %s",
                          PQerrorMessage(conn));
        rc = -1;
    }
    PQclear(r);
    return rc;
}

/* Reads the pending results up to the Sync. With wait false it stops where libpq would block and
 * returns 1; called again, it goes on from there (ces_sender_ready). Returns 0 at the Sync, -1 on
 * a broken connection. */
static int drain_some(ces_sender_t *s, bool wait) {
    PGconn *conn = conn_of(s);
    while (s->drained < s->npending || s->between) {
        if (!wait && PQisBusy(conn))
            return 1;
        PGresult *r = PQgetResult(conn);
        if (s->between) {
            /* The NULL that ends each statement's results. */
            s->between = false;
            if (r != NULL) {
                PQclear(r);
                ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL,
                              "unexpected extra result from PostgreSQL");
                s->drain_rc = -1;
            }
            continue;
        }
        pending_t *p = &s->pending[s->drained++];
        if (r == NULL) {
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL connection lost: %s",
                          PQerrorMessage(conn));
            drain_reset(s);
            return -1;
        }
        int rc = read_result(s, p, r);
        PQclear(r);
        if (rc != 0) {
            drain_reset(s);
            return -1;
        }
        s->between = true;
    }
    if (!wait && PQisBusy(conn))
        return 1;
    int rc = s->drain_rc;
    s->npending = 0;
    drain_reset(s);
    return read_sync(s) != 0 ? -1 : rc;
}

/* Reads every pending result up to the Sync (or returns what ces_sender_ready's drain found).
 * Returns -1 on a broken connection. */
static int drain(ces_sender_t *s) {
    if (s->drain_done) {
        int rc = s->drain_rc;
        drain_reset(s);
        return rc;
    }
    return drain_some(s, true);
}

/* Sends a Sync and reads every pending result. Returns -1 on a broken connection. */
static int sync_and_drain(ces_sender_t *s) { return send_sync(s) != 0 ? -1 : drain(s); }

int ces_sender_sync_and_drain(ces_sender_t *s) { return sync_and_drain(s); }

int ces_sender_maybe_sync(ces_sender_t *s) {
    if (s->npending < CES_SENDER_PIPELINE_CHUNK)
        return 0;
    return sync_and_drain(s);
}

int ces_sender_simple(ces_sender_t *s, const char *sql) {
    return sent(s, PQsendQueryParams(conn_of(s), sql, 0, NULL, NULL, NULL, NULL, 0), PEND_OTHER,
                -1, NULL);
}

int ces_sender_commit(ces_sender_t *s) {
    return sent(s, PQsendQueryParams(conn_of(s), "COMMIT", 0, NULL, NULL, NULL, NULL, 0),
                PEND_COMMIT, -1, NULL);
}

int ces_sender_seal(ces_sender_t *s) {
    if (send_sync(s) != 0)
        return -1;
    s->sent_all = true;
    return 0;
}

bool ces_sender_fenced(const ces_sender_t *s) { return s->fenced; }

int ces_sender_begin(ces_sender_t *s) {
    PGconn *conn = conn_of(s);
    if (PQenterPipelineMode(conn) != 1) {
        ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "entering pipeline mode: %s",
                      PQerrorMessage(conn));
        return -1;
    }
    if (s->nonblocking && PQsetnonblocking(conn, 1) != 0) {
        s->nonblocking = false;
        ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "PostgreSQL: %s", PQerrorMessage(conn));
        return -1;
    }
    return 0;
}

void ces_sender_end(ces_sender_t *s) {
    if (PQexitPipelineMode(conn_of(s)) != 1)
        ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "leaving pipeline mode: %s",
                      PQerrorMessage(conn_of(s)));
}

/* Back to blocking mode once libpq has sent all it buffered (reading results meanwhile, so that
 * the server never waits on a full socket). */
static int leave_nonblocking(ces_sender_t *s) {
    PGconn *conn = conn_of(s);
    if (!s->nonblocking)
        return 0;
    s->nonblocking = false;
    int flushed;
    while ((flushed = PQflush(conn)) == 1) {
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLOUT | POLLIN};
        if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
            ces_pgerr_set(s->e, CES_PGERR_RETRY, -1, NULL, "waiting for PostgreSQL: %s",
                          strerror(errno));
            return -1;
        }
        if ((pfd.revents & (POLLIN | POLLERR | POLLHUP)) && PQconsumeInput(conn) != 1)
            break; /* PQflush reports it */
    }
    return flushed == 0 && PQsetnonblocking(conn, 0) == 0 ? 0 : send_failed(s);
}

int ces_sender_drain(ces_sender_t *s) {
    return leave_nonblocking(s) != 0 || drain(s) != 0 ? -1 : 0;
}

void ces_sender_progress(ces_sender_t *s) {
    PGconn *conn = conn_of(s);
    if (!s->nonblocking || s->e->cls != CES_PGERR_NONE || conn == NULL)
        return;
    /* Errors show when the batch is finished. */
    if (PQflush(conn) >= 0)
        PQconsumeInput(conn);
}

bool ces_sender_ready(ces_sender_t *s) {
    PGconn *conn = conn_of(s);
    if (s->e->cls != CES_PGERR_NONE || conn == NULL || s->drain_done)
        return true;
    /* Trouble of any kind shows when the batch is finished: report ready. */
    if (s->nonblocking) {
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
    int rc = drain_some(s, false);
    if (rc == 1)
        return false;
    s->drain_done = true;
    s->drain_rc = rc;
    return true;
}

/* After the rollback of a failed attempt. Results that nobody read would be taken for the answers
 * to the next attempt's statements: a session that cannot leave pipeline mode is closed instead
 * (which rolls back whatever it had open). */
static void leave_pipeline_or_disconnect(ces_sender_t *s) {
    if (PQexitPipelineMode(conn_of(s)) == 1)
        return;
    ces_log_warning("PostgreSQL: leaving pipeline mode after a failed batch: %s; reconnecting",
                    PQerrorMessage(conn_of(s)));
    ces_session_disconnect(s->session);
}

/* Ends a failed attempt's pipeline, if the connection still works: reads what was sent to its
 * last Sync (an error may have been read before the rest of the results, even while libpq was
 * still sending), then rolls back the transaction, or in a stream only the step. */
static void roll_back(ces_sender_t *s, bool whole) {
    PGconn *conn = conn_of(s);
    if (PQstatus(conn) != CONNECTION_OK || PQpipelineStatus(conn) == PQ_PIPELINE_OFF)
        return;
    ces_pgerr_t ignored = CES_PGERR_INIT;
    ces_pgerr_t *saved = s->e;
    s->e = &ignored;
    if (s->sent_all && (s->npending > 0 || s->between) && leave_nonblocking(s) == 0)
        drain(s);
    s->npending = 0;
    drain_reset(s);
    if (ces_sender_simple(s, whole ? "ROLLBACK" : "ROLLBACK TO SAVEPOINT ces_step") == 0)
        sync_and_drain(s);
    s->e = saved;
    leave_pipeline_or_disconnect(s);
}

void ces_sender_roll_back(ces_sender_t *s, bool whole) {
    roll_back(s, whole);
    PGconn *conn = conn_of(s);
    if (conn != NULL && PQisnonblocking(conn) && PQsetnonblocking(conn, 0) != 0)
        ces_session_disconnect(s->session);
}

/* ---------------------------------------------------------------------------------------------- */
/* Statements                                                                                     */

static void build_statement(ces_strbuf_t *sql, const ces_sqltext_names_t *names,
                            ces_bulk_kind_t kind, const ces_catalog_desc_t *t, const long *cols,
                            size_t ncols) {
    switch (kind) {
    case CES_BULK_ROW_UPSERT:
        ces_sqltext_upsert(sql, names, t, cols, ncols, false);
        break;
    case CES_BULK_UPSERT:
        ces_sqltext_upsert(sql, names, t, cols, ncols, true);
        break;
    case CES_BULK_INSERT:
        ces_sqltext_insert(sql, names, t, cols, ncols, true);
        break;
    case CES_BULK_ROW_DELETE:
        ces_sqltext_delete(sql, names, t, false);
        break;
    case CES_BULK_DELETE:
        ces_sqltext_delete(sql, names, t, true);
        break;
    }
}

/* Sends the Parse of st's statement (kind on table, with ncols values). */
static int prepare(ces_sender_t *s, stmt_t *st, long item, ces_bulk_kind_t kind,
                   const ces_catalog_desc_t *t, const long *cols, size_t ncols) {
    ces_sqltext_names_t names = {.tombstones = ces_metadata_tombstones(s->metadata),
                                 .version = ces_metadata_version_quoted(s->metadata)};
    ces_strbuf_t sql = {0};
    build_statement(&sql, &names, kind, t, cols, ncols);
    if (sql.failed) {
        ces_strbuf_free(&sql);
        out_of_memory(s);
        return -1;
    }
    int ok = PQsendPrepare(conn_of(s), st->name, sql.buf, ces_sqltext_nparams(t, ncols), NULL);
    ces_strbuf_free(&sql);
    if (ok != 1)
        return send_failed(s);
    if (push_pending(s, PEND_PREPARE, item, st) != 0)
        return -1;
    /* Later statements of this pipeline may use it at once: the server parses in order. */
    st->epoch = ces_session_epoch(s->session);
    return 0;
}

/* Finds or makes the prepared statement for a signature; sends its Parse when the connection has
 * not seen it yet. */
static stmt_t *get_statement(ces_sender_t *s, const char *sig, size_t sig_len, long item,
                             ces_bulk_kind_t kind, const ces_catalog_desc_t *t, const long *cols,
                             size_t ncols) {
    ces_sender_stmts_t *stmts = s->stmts;
    stmt_t *st = ces_map_get(stmts->by_signature, sig, sig_len);
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        char name[32];
        snprintf(name, sizeof(name), "ces_%u", ++stmts->next_id);
        if (st == NULL || (st->name = strdup(name)) == NULL ||
            ces_map_put(stmts->by_signature, sig, sig_len, st) != 0) {
            if (st)
                free(st->name);
            free(st);
            out_of_memory(s);
            return NULL;
        }
    }
    if (st->epoch != ces_session_epoch(s->session) &&
        prepare(s, st, item, kind, t, cols, ncols) != 0)
        return NULL;
    return st;
}

/* The bulk gatherer's send callback. */
static int send_bulk_statement(void *opaque, const ces_bulk_statement_t *b) {
    ces_sender_t *s = opaque;
    stmt_t *st = get_statement(s, b->sig, b->sig_len, -1, b->kind, ces_catalog_desc(b->table),
                               b->cols, b->ncols);
    if (st == NULL)
        return -1;
    int rc = sent(s,
                  PQsendQueryPrepared(conn_of(s), st->name, b->nparams, b->values, b->lengths,
                                      b->formats, 0),
                  PEND_BULK, -1, NULL);
    if (rc == 0 && b->kind == CES_BULK_INSERT)
        s->pending[s->npending - 1].inserted = b->table;
    return rc;
}

static int bulk_outcome(ces_sender_t *s, ces_bulk_status_t rc) {
    if (rc == CES_BULK_NOMEM)
        out_of_memory(s);
    return rc == CES_BULK_OK ? 0 : -1;
}

int ces_sender_flush_bulk(ces_sender_t *s) { return bulk_outcome(s, ces_bulk_flush(s->gathered)); }

/* ---------------------------------------------------------------------------------------------- */
/* Row changes                                                                                    */

static int reserve_scratch(ces_sender_t *s, size_t n) {
    if (n <= s->scratch_capacity)
        return 0;
    size_t cap = n * 2;
    const char **v = realloc(s->values, cap * sizeof(*v));
    if (v)
        s->values = v;
    int *l = realloc(s->lengths, cap * sizeof(*l));
    if (l)
        s->lengths = l;
    long *c = realloc(s->cols, cap * sizeof(*c));
    if (c)
        s->cols = c;
    const ces_field_t **f = realloc(s->fields, cap * sizeof(*f));
    if (f)
        s->fields = f;
    if (!v || !l || !c || !f) {
        out_of_memory(s);
        return -1;
    }
    s->scratch_capacity = cap;
    return 0;
}

/* Converts a value for its column into parameter slot; NULL values stay NULL. Returns -1 when out
 * of memory. */
static int param_value(ces_sender_t *s, ces_item_t *item, const ces_catalog_desc_t *t, long col,
                       const ces_field_t *f, size_t slot) {
    if (f->is_null) {
        s->values[slot] = NULL;
        s->lengths[slot] = 0;
        return 0;
    }
    size_t len;
    const char *v = ces_types_convert(t->cols[col].conv, f->value, f->value_len, item->arena, &len);
    if (v == NULL) {
        out_of_memory(s);
        return -1;
    }
    s->values[slot] = v;
    s->lengths[slot] = (int)len;
    return 0;
}

/* Key value of pk column k: from the image (if given), else from pkkey. */
static const ces_field_t *key_field(ces_catalog_table_t *table, size_t k, const ces_field_t *image,
                                    size_t nimage, const ces_event_t *ev) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    for (size_t i = 0; i < nimage; i++) {
        if (ces_catalog_resolve_column(table, image[i].name) == (long)t->pk[k])
            return &image[i];
    }
    for (size_t i = 0; i < ev->npkkey; i++) {
        if (ces_catalog_resolve_column(table, ev->pkkey[i].name) == (long)t->pk[k])
            return &ev->pkkey[i];
    }
    return NULL;
}

/* Adds the event's version as parameter slot (when the table is guarded). Returns the number of
 * parameters. */
static int add_version_param(ces_sender_t *s, const ces_catalog_desc_t *t, const ces_event_t *ev,
                             size_t slot) {
    if (!ces_catalog_guarded(t))
        return (int)slot;
    ces_version_format(&ev->position, s->version, sizeof(s->version));
    s->values[slot] = s->version;
    s->lengths[slot] = 0;
    return (int)slot + 1;
}

/* Why a change without a value for a key column cannot be applied. */
#define MISSING_KEY_VALUE "the event lacks a value for a primary key column of the target table"

/* Sends a row statement of kind on the values s->values[0..n) of the columns cols (NULL for a
 * delete). */
static int send_row(ces_sender_t *s, long idx, const ces_event_t *ev, ces_bulk_kind_t kind,
                    const ces_catalog_desc_t *t, const long *cols, size_t n) {
    if (ces_bulk_reserve_signature(&s->sig, &s->sig_capacity, n) != 0) {
        out_of_memory(s);
        return -1;
    }
    size_t sl = ces_bulk_signature(s->sig, s->sig_capacity, kind, t->id, cols, cols ? n : 0);
    stmt_t *st = get_statement(s, s->sig, sl, idx, kind, t, cols, n);
    if (st == NULL)
        return -1;
    int nparams = add_version_param(s, t, ev, n);
    return sent(s,
                PQsendQueryPrepared(conn_of(s), st->name, nparams, s->values, s->lengths, NULL, 0),
                PEND_ROW, idx, NULL);
}

static int send_delete(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                       const ces_field_t *image, size_t nimage, bool bulk, ces_reject_t *reject) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    if (reserve_scratch(s, t->npk + 1) != 0)
        return -1;
    for (size_t k = 0; k < t->npk; k++) {
        const ces_field_t *f = key_field(table, k, image, nimage, &item->event);
        if (f == NULL || f->is_null) {
            *reject = (ces_reject_t){CES_DL_SCHEMA, MISSING_KEY_VALUE};
            return 0;
        }
        if (param_value(s, item, t, (long)t->pk[k], f, k) != 0)
            return -1;
    }
    if (bulk) {
        size_t key_slots[t->npk + 1];
        for (size_t k = 0; k < t->npk; k++)
            key_slots[k] = k;
        return bulk_outcome(s, ces_bulk_add(s->gathered, CES_BULK_DELETE, item, table, NULL,
                                            t->npk, s->values, s->lengths, key_slots, false));
    }
    return send_row(s, idx, &item->event, CES_BULK_ROW_DELETE, t, NULL, t->npk);
}

/* Starts a new set of column marks for table t (a column is in the set when marks[col] == mark). */
static int new_marks(ces_sender_t *s, const ces_catalog_desc_t *t) {
    if (t->ncols > s->marks_capacity) {
        unsigned *m = realloc(s->marks, t->ncols * 2 * sizeof(*m));
        if (m == NULL) {
            out_of_memory(s);
            return -1;
        }
        memset(m + s->marks_capacity, 0, (t->ncols * 2 - s->marks_capacity) * sizeof(*m));
        s->marks = m;
        s->marks_capacity = t->ncols * 2;
    }
    if (++s->mark == 0) { /* wrapped: old marks could look current */
        memset(s->marks, 0, s->marks_capacity * sizeof(*s->marks));
        s->mark = 1;
    }
    return 0;
}

/* Gathers into s->cols and s->fields the upsert's columns: those of the new image (the first of
 * names that fold alike), then key columns it lacks (from pkkey), sorted by column index. Returns
 * the count, 0 with *reject set when a key value is missing, or -1. */
static bool recipe_fits(const ces_sender_t *s, const ces_catalog_table_t *table,
                        const ces_event_t *ev) {
    return ev->shape != NULL && s->recipe.table == table && s->recipe.shape_len == ev->shape_len &&
           s->recipe.ncols == ev->ncols && s->recipe.npkkey == ev->npkkey &&
           s->recipe.ncurrent == ev->ncurrent && s->recipe.nold == ev->nold &&
           memcmp(s->recipe.shape, ev->shape, ev->shape_len) == 0;
}

/* Remembers the columns just gathered for events of ev's shape; without memory, nothing. */
static void recipe_keep(ces_sender_t *s, const ces_catalog_table_t *table, const ces_event_t *ev,
                        size_t n) {
    s->recipe.table = NULL;
    if (ev->shape == NULL)
        return;
    if (n > s->recipe.capacity) {
        long *cols = realloc(s->recipe.cols, n * sizeof(*cols));
        if (cols != NULL)
            s->recipe.cols = cols;
        uint32_t *from = realloc(s->recipe.from, n * sizeof(*from));
        if (from != NULL)
            s->recipe.from = from;
        if (cols == NULL || from == NULL)
            return;
        s->recipe.capacity = n;
    }
    for (size_t j = 0; j < n; j++) {
        /* Every field is in current or in pkkey; which one, told by address (as integers: C
         * orders only pointers into one array). */
        uintptr_t at = (uintptr_t)s->fields[j], current = (uintptr_t)ev->current;
        s->recipe.cols[j] = s->cols[j];
        s->recipe.from[j] = at - current < ev->ncurrent * sizeof(ces_field_t)
                                ? (uint32_t)(s->fields[j] - ev->current)
                                : (uint32_t)(ev->ncurrent + (size_t)(s->fields[j] - ev->pkkey));
    }
    s->recipe.table = table;
    s->recipe.shape = ev->shape;
    s->recipe.shape_len = ev->shape_len;
    s->recipe.ncols = ev->ncols;
    s->recipe.npkkey = ev->npkkey;
    s->recipe.ncurrent = ev->ncurrent;
    s->recipe.nold = ev->nold;
    s->recipe.n = n;
}

static long upsert_columns(ces_sender_t *s, ces_catalog_table_t *table, const ces_event_t *ev,
                           ces_reject_t *reject) {
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    const ces_field_t **fields = s->fields;
    size_t n = 0;
    if (recipe_fits(s, table, ev)) {
        for (size_t j = 0; j < s->recipe.n; j++) {
            uint32_t from = s->recipe.from[j];
            s->cols[j] = s->recipe.cols[j];
            fields[j] = from < ev->ncurrent ? &ev->current[from] : &ev->pkkey[from - ev->ncurrent];
        }
        return (long)s->recipe.n;
    }
    if (new_marks(s, t) != 0)
        return -1;
    for (size_t i = 0; i < ev->ncurrent; i++) {
        long col = ces_catalog_resolve_column(table, ev->current[i].name);
        if (col < 0 || s->marks[col] == s->mark)
            continue; /* a duplicate after case folding: the first wins */
        s->marks[col] = s->mark;
        s->cols[n] = col;
        fields[n++] = &ev->current[i];
    }
    for (size_t k = 0; k < t->npk; k++) {
        if (s->marks[t->pk[k]] == s->mark)
            continue;
        const ces_field_t *f = key_field(table, k, NULL, 0, ev);
        if (f == NULL) {
            *reject = (ces_reject_t){CES_DL_SCHEMA, MISSING_KEY_VALUE};
            return 0;
        }
        s->cols[n] = (long)t->pk[k];
        fields[n++] = f;
    }
    /* Column order decides the statement: sort by column index so equal shapes share one (events
     * list their columns in table order, so this is mostly one pass). */
    for (size_t i = 1; i < n; i++) {
        long c = s->cols[i];
        const ces_field_t *f = fields[i];
        size_t j = i;
        for (; j > 0 && s->cols[j - 1] > c; j--) {
            s->cols[j] = s->cols[j - 1];
            fields[j] = fields[j - 1];
        }
        s->cols[j] = c;
        fields[j] = f;
    }
    recipe_keep(s, table, ev, n);
    return (long)n;
}

static int send_upsert(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                       bool bulk, ces_reject_t *reject) {
    const ces_event_t *ev = &item->event;
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    if (reserve_scratch(s, ev->ncurrent + t->npk + 1) != 0)
        return -1;
    long counted = upsert_columns(s, table, ev, reject);
    if (counted < 0 || reject->reason != NULL)
        return counted < 0 ? -1 : 0;
    size_t n = (size_t)counted;
    for (size_t i = 0; i < n; i++) {
        if (param_value(s, item, t, s->cols[i], s->fields[i], i) != 0)
            return -1;
    }
    if (!bulk)
        return send_row(s, idx, ev, CES_BULK_ROW_UPSERT, t, s->cols, n);
    size_t key_slots[t->npk + 1];
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < t->npk; k++) {
            if ((size_t)s->cols[i] == t->pk[k])
                key_slots[k] = i;
        }
    }
    bool plain_insert = ev->op == CES_OP_INSERT && s->plain_inserts &&
                        ces_catalog_plain_inserts(table, s->attempt);
    return bulk_outcome(s, ces_bulk_add(s->gathered, CES_BULK_UPSERT, item, table, s->cols, n,
                                        s->values, s->lengths, key_slots, plain_insert));
}

/* True when an UPD moves the row: its old image holds a different primary key than the new one. */
static bool key_changed(ces_catalog_table_t *table, const ces_event_t *ev) {
    if (ev->op != CES_OP_UPDATE || ev->nold == 0)
        return false;
    const ces_catalog_desc_t *t = ces_catalog_desc(table);
    for (size_t k = 0; k < t->npk; k++) {
        const ces_field_t *o = NULL;
        for (size_t i = 0; i < ev->nold && o == NULL; i++) {
            if (ces_catalog_resolve_column(table, ev->old[i].name) == (long)t->pk[k])
                o = &ev->old[i];
        }
        const ces_field_t *n = key_field(table, k, ev->current, ev->ncurrent, ev);
        if (o == NULL || n == NULL || o->is_null || n->is_null)
            return false;
        if (o->value_len != n->value_len || memcmp(o->value, n->value, o->value_len) != 0)
            return true;
    }
    return false;
}

int ces_sender_event(ces_sender_t *s, long idx, ces_item_t *item, ces_catalog_table_t *table,
                     ces_reject_t *reject) {
    const ces_event_t *ev = &item->event;
    if (ev->op == CES_OP_DELETE)
        return send_delete(s, idx, item, table, ev->old, ev->nold, s->bulk, reject);
    if (ev->op == CES_OP_UPDATE && ev->nold == 0 && ces_catalog_note_no_old_image(table)) {
        /* include_old_values = 0 at the source: a changed key cannot be told from the new row. */
        ces_log_warning("table %s: UPD events carry no old row image (include_old_values = 0): "
                        "if a primary key is changed at the source, the row is upserted under "
                        "its new key and the row under the old key stays",
                        ces_catalog_desc(table)->qualified);
    }
    if (key_changed(table, ev)) {
        /* A move touches two keys: it goes row by row, after whatever waits for either. */
        if (ces_sender_flush_bulk(s) != 0)
            return -1;
        if (send_delete(s, idx, item, table, ev->old, ev->nold, false, reject) != 0 ||
            reject->reason != NULL)
            return reject->reason != NULL ? 0 : -1;
        return send_upsert(s, idx, item, table, false, reject);
    }
    return send_upsert(s, idx, item, table, s->bulk, reject);
}

/* ---------------------------------------------------------------------------------------------- */
/* Dead letters and positions                                                                     */

/* Returns a malloc'd copy of s where every byte that is not part of valid UTF-8 is '?', so that
 * messages built from untrusted names can be stored as text. */
static char *utf8_sanitize(const char *s) {
    size_t len = strlen(s);
    char *out = malloc(len + 1);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len;) {
        size_t valid = ces_utf8_check(s + i, len - i);
        memcpy(out + i, s + i, valid);
        i += valid;
        if (i < len)
            out[i++] = '?';
    }
    out[len] = '\0';
    return out;
}

/* Appends the offsets of item's records (when retrying: the ids of its dead letters) to a bigint[]
 * literal being built, *n of them so far. */
static void add_source_ids(ces_strbuf_t *ids, const ces_item_t *item, size_t *n) {
    for (size_t m = 0; m <= item->nmore_sources; m++) {
        const ces_source_t *src = m == 0 ? &item->source : &item->more_sources[m - 1];
        ces_strbuf_addf(ids, "%s%lld", (*n)++ ? "," : "", (long long)src->offset);
    }
}

/* The ids of the dead letters item was retried from, as a bigint[] literal ("{3,7}"); NULL when
 * out of memory. */
static char *retried_ids(const ces_item_t *item) {
    ces_strbuf_t ids = {0};
    size_t n = 0;
    ces_strbuf_add(&ids, "{");
    add_source_ids(&ids, item, &n);
    ces_strbuf_add(&ids, "}");
    if (ids.failed) {
        ces_strbuf_free(&ids);
        return NULL;
    }
    return ids.buf;
}

int ces_sender_dead_letter(ces_sender_t *s, long idx, const ces_item_t *item, bool retrying) {
    char partition[16], offset[24], table[2 * CES_DECODE_MAX_NAME_BYTES + 2];
    snprintf(partition, sizeof(partition), "%d", (int)item->source.partition);
    snprintf(offset, sizeof(offset), "%lld", (long long)item->source.offset);
    const char *parts[] = {item->event.schema, item->event.table};
    bool decoded = item->event.table != NULL && item->event.schema != NULL;
    if (decoded)
        ces_map_key(table, sizeof(table), '.', parts, 2);
    char *reason = utf8_sanitize(item->reason ? item->reason : "unknown");
    char *topic = utf8_sanitize(item->source.topic ? item->source.topic : "");
    char *logicalid = item->logicalid ? utf8_sanitize(item->logicalid) : NULL;
    char *source_table = decoded ? utf8_sanitize(table) : NULL;
    char *ids = retrying ? retried_ids(item) : NULL;
    int rc = -1;
    if (reason == NULL || topic == NULL || (item->logicalid && logicalid == NULL) ||
        (decoded && source_table == NULL) || (retrying && ids == NULL)) {
        out_of_memory(s);
        goto done;
    }
    const char *class = ces_dl_class_name(item->dl_class);
    if (retrying) {
        const char *values[4] = {reason, class, source_table, ids};
        rc = sent(s,
                  PQsendQueryParams(conn_of(s), ces_metadata_dead_letter_again_sql(s->metadata), 4,
                                    NULL, values, NULL, NULL, 0),
                  PEND_DEAD_LETTER, idx, NULL);
        goto done;
    }
    const char *values[8] = {topic, partition, offset, reason, logicalid, item->raw, class,
                             source_table};
    int lengths[8] = {0, 0, 0, 0, 0, (int)item->raw_len, 0, 0};
    int formats[8] = {0, 0, 0, 0, 0, 1, 0, 0};
    if (item->raw == NULL)
        values[5] = NULL;
    rc = sent(s,
              PQsendQueryParams(conn_of(s), ces_metadata_dead_letter_sql(s->metadata), 8, NULL,
                                values, lengths, formats, 0),
              PEND_DEAD_LETTER, idx, NULL);
done:
    free(reason);
    free(topic);
    free(logicalid);
    free(source_table);
    free(ids);
    return rc;
}

/* The dead letters retried into batch's events that applied leave the table with them. */
static int send_retired(ces_sender_t *s, const ces_batch_t *batch) {
    ces_strbuf_t ids = {0};
    size_t n = 0;
    ces_strbuf_add(&ids, "{");
    for (size_t i = 0; i < batch->count; i++) {
        const ces_item_t *item = &batch->items[i];
        if (item->kind == CES_ITEM_EVENT)
            add_source_ids(&ids, item, &n);
    }
    ces_strbuf_add(&ids, "}");
    int rc = -1;
    if (ids.failed) {
        out_of_memory(s);
    } else if (n == 0) {
        rc = 0;
    } else {
        const char *values[1] = {ids.buf};
        rc = sent(s,
                  PQsendQueryParams(conn_of(s), ces_metadata_dead_letters_retired_sql(s->metadata),
                                    1, NULL, values, NULL, NULL, 0),
                  PEND_OTHER, -1, NULL);
    }
    ces_strbuf_free(&ids);
    return rc;
}

/* The group's progress: the newest commit the batch applies, and the window in force. */
static int send_progress(ces_sender_t *s, const ces_batch_t *batch) {
    const ces_item_t *newest = NULL;
    for (size_t i = 0; i < batch->count; i++) {
        const ces_item_t *item = &batch->items[i];
        if (item->kind == CES_ITEM_EVENT &&
            (newest == NULL ||
             ces_position_compare(&item->event.position, &newest->event.position) > 0))
            newest = item;
    }
    if (newest == NULL)
        return 0;
    char lsn[23], time[32], window[24];
    double seconds;
    ces_lsn_format(newest->event.position.commit_lsn, lsn);
    bool has_time = ces_event_parse_time(newest->event.time, &seconds) == 0;
    if (has_time)
        snprintf(time, sizeof(time), "%.6f", seconds);
    snprintf(window, sizeof(window), "%lld", (long long)batch->reorder_window_ms);
    const char *values[4] = {ces_positions_group(s->positions), lsn, has_time ? time : NULL,
                             batch->reorder_window_ms >= 0 ? window : NULL};
    return sent(s,
                PQsendQueryParams(conn_of(s), ces_metadata_progress_sql(s->metadata), 4, NULL,
                                  values, NULL, NULL, 0),
                PEND_OTHER, -1, NULL);
}

int ces_sender_positions(ces_sender_t *s, const ces_batch_t *batch) {
    for (size_t i = 0; i < batch->noffsets; i++) {
        ces_positions_params_t params;
        ces_positions_update_params(s->positions, &batch->offsets[i], &params);
        if (sent(s,
                 PQsendQueryParams(conn_of(s), ces_positions_update_sql(s->positions),
                                   CES_POSITIONS_UPDATE_NPARAMS, NULL, params.values, NULL, NULL,
                                   0),
                 PEND_OFFSET, (long)i, NULL) != 0)
            return -1;
    }
    if (batch->retrying ? send_retired(s, batch) != 0 : send_progress(s, batch) != 0)
        return -1;
    for (size_t i = 0; i < batch->ngaps; i++) {
        ces_positions_gap_params_t params;
        ces_positions_gap_params(s->positions, &batch->gaps[i], &params);
        if (sent(s,
                 PQsendQueryParams(conn_of(s), ces_positions_gap_sql(s->positions),
                                   CES_POSITIONS_GAP_NPARAMS, NULL, params.values, NULL, NULL, 0),
                 PEND_OTHER, -1, NULL) != 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */

ces_sender_t *ces_sender_new(const ces_sender_options_t *o) {
    ces_sender_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->session = o->session;
    s->stmts = o->stmts;
    s->metadata = o->metadata;
    s->positions = o->positions;
    s->e = o->e;
    s->bulk = o->bulk;
    s->plain_inserts = o->plain_inserts;
    s->nonblocking = o->nonblocking;
    s->attempt = o->attempt;
    if ((s->gathered = ces_bulk_new(send_bulk_statement, s)) == NULL) {
        free(s);
        return NULL;
    }
    return s;
}

void ces_sender_destroy(ces_sender_t *s) {
    if (s == NULL)
        return;
    ces_bulk_destroy(s->gathered);
    free(s->pending);
    free(s->values);
    free(s->lengths);
    free(s->cols);
    free(s->fields);
    free(s->marks);
    free(s->sig);
    free(s->recipe.cols);
    free(s->recipe.from);
    free(s);
}
