#include "apply/apply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/catalog.h"
#include "apply/inflight.h"
#include "apply/janitor.h"
#include "apply/ledger.h"
#include "util/log.h"
#include "apply/metadata.h"
#include "apply/pgerr.h"
#include "apply/positions.h"
#include "apply/prepared.h"
#include "apply/sender.h"
#include "apply/session.h"

/* What one attempt sends: a whole transaction, or a part of a streamed one (see apply.h). */
typedef enum {
    STEP_WHOLE, /* BEGIN ... COMMIT */
    STEP_CHUNK, /* inside the open transaction, under a savepoint; no COMMIT */
    STEP_LAST,  /* the last part, the positions, COMMIT */
} step_t;

/* One attempt at a batch. Its pipeline refers to e, so an attempt is never copied. */
typedef struct {
    ces_inflight_t *inflight;
    ces_sender_t *sender;
    ces_catalog_table_t **tables; /* the target table of each item (owned by the catalog) */
    ces_pgerr_t e;
    ces_batch_t *batch; /* reference: the caller's */
    step_t step;
} attempt_t;

struct ces_apply_s {
    ces_session_t *session;
    ces_metadata_t *metadata;
    ces_positions_t *positions;
    ces_catalog_t *catalog;
    ces_janitor_t *janitor;
    ces_prepared_t *prepared;
    uint64_t stream_epoch; /* the session epoch a streamed transaction began in; 0: none */
    attempt_t *async;      /* a batch sent by ces_apply_send, not finished yet */
    uint64_t attempts;     /* attempts begun: the plain-INSERT policy's and missing tables' clock */
    char *metadata_schema; /* its name, unquoted: a 42501 may be about it */
    /* A table changing underneath inside a streamed transaction loses the transaction, which is
     * read again from its start: what it has met is kept across those restarts, so that a change
     * that keeps failing so is found (row by row) and dead-lettered instead of restarting the
     * stream for ever. Forgotten once a streamed transaction commits. */
    struct {
        bool rows;             /* its parts go row by row: the failing change is named */
        unsigned count;        /* times running the same change (at) failed so */
        ces_version_t at;
    } stream_stale;
};

/* A streamed transaction is open while the connection it began on is. */
static bool stream_open(const ces_apply_t *a) {
    return a->stream_epoch != 0 && a->stream_epoch == ces_session_epoch(a->session);
}

static ces_apply_status_t from_session(ces_session_status_t st) {
    switch (st) {
    case CES_SESSION_OK:
        return CES_APPLY_OK;
    case CES_SESSION_INTERRUPTED:
        return CES_APPLY_INTERRUPTED;
    case CES_SESSION_FATAL:
        break;
    }
    return CES_APPLY_FATAL;
}

static ces_apply_status_t ensure_connected(ces_apply_t *a, char *errstr, size_t errstr_size) {
    return from_session(ces_session_ensure_connected(a->session, errstr, errstr_size));
}

/* Every new connection: the metadata schema, and the statements that name it. */
static int on_connect(void *opaque, ces_session_t *session, ces_pgerr_t *e) {
    ces_apply_t *a = opaque;
    if (ces_metadata_setup(a->metadata, session, e) != 0)
        return -1;
    if (ces_positions_set_schema(a->positions, ces_metadata_schema_quoted(a->metadata)) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    return 0;
}

static void attempt_end(attempt_t *at);

bool ces_apply_conninfo_valid(const char *conninfo) {
    PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
    PQconninfoFree(opts);
    return opts != NULL;
}

ces_apply_t *ces_apply_new(const ces_apply_options_t *o) {
    ces_apply_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    ces_session_options_t session = {.conninfo = o->conninfo,
                                     .password = o->password,
                                     .password_token = o->password_token,
                                     .retry_max_ms = o->retry_max_ms,
                                     .stop_now = o->stop_now,
                                     .heartbeat = o->heartbeat,
                                     .heartbeat_opaque = o->heartbeat_opaque,
                                     .retrying = o->retrying,
                                     .on_connect = on_connect,
                                     .on_connect_opaque = a};
    ces_catalog_options_t catalog = {.target = o->target,
                                     .rule_of = o->rule_of,
                                     .rule_opaque = o->rule_opaque,
                                     .preserve_case = o->preserve_case,
                                     .auto_create = o->auto_create,
                                     .auto_evolve = o->auto_evolve,
                                     .lsn_guard = o->lsn_guard,
                                     .version_column = o->version_column,
                                     .metadata_schema = o->metadata_schema};
    a->session = ces_session_new(&session);
    a->metadata = ces_metadata_new(o->metadata_schema,
                                   o->version_column ? o->version_column : "_ces_lsn");
    a->positions = ces_positions_new(o->group_id ? o->group_id : "");
    a->catalog = ces_catalog_new(&catalog);
    a->janitor = ces_janitor_new(o->lsn_guard, o->tombstone_retention_s);
    a->prepared = ces_prepared_new();
    a->metadata_schema = strdup(o->metadata_schema ? o->metadata_schema : "ces2pg");
    if (!a->metadata_schema || !a->session || !a->metadata || !a->positions || !a->catalog ||
        !a->janitor || !a->prepared) {
        ces_apply_destroy(a);
        return NULL;
    }
    return a;
}

void ces_apply_destroy(ces_apply_t *a) {
    if (a == NULL)
        return;
    if (a->async != NULL) {
        attempt_end(a->async);
        free(a->async);
    }
    ces_session_destroy(a->session);
    ces_catalog_destroy(a->catalog);
    ces_prepared_destroy(a->prepared);
    ces_metadata_destroy(a->metadata);
    ces_positions_destroy(a->positions);
    ces_janitor_destroy(a->janitor);
    free(a->metadata_schema);
    free(a);
}

bool ces_apply_connected(const ces_apply_t *a) { return ces_session_connected(a->session); }

bool ces_apply_check(ces_apply_t *a) {
    if (a->async != NULL)
        return ces_apply_connected(a);
    return ces_session_check(a->session, stream_open(a));
}

ces_apply_status_t ces_apply_start(ces_apply_t *a, char *errstr, size_t errstr_size) {
    ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
    if (st == CES_APPLY_OK)
        ces_session_backoff_reset(a->session);
    return st;
}

ces_apply_status_t ces_apply_read_positions(ces_apply_t *a, const char *topic,
                                          const int32_t *partitions, size_t n, int64_t *offsets,
                                          char *errstr, size_t errstr_size) {
    for (size_t i = 0; i < n; i++)
        offsets[i] = -1;
    for (;;) {
        ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
        if (st != CES_APPLY_OK)
            return st;
        ces_pgerr_t e = CES_PGERR_INIT;
        if (ces_positions_read(a->positions, a->session, topic, partitions, n, offsets, &e) == 0) {
            ces_session_backoff_reset(a->session);
            return CES_APPLY_OK;
        }
        if (e.action != CES_PGERR_RETRY) {
            snprintf(errstr, errstr_size, "reading stored positions: %s", e.message);
            return CES_APPLY_FATAL;
        }
        ces_log_warning("reading stored positions: %s (retrying)", e.message);
        ces_session_disconnect(a->session);
        if (ces_session_backoff_sleep(a->session, ces_session_backoff_next(
                                                      a->session, ces_pgerr_retry_reason(&e))) !=
            0) {
            snprintf(errstr, errstr_size, "stopped while waiting for PostgreSQL");
            return CES_APPLY_INTERRUPTED;
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* One attempt                                                                                    */

/* Resolves every event's table before the transaction starts (DDL commits on its own). Events that
 * cannot be applied become dead letters here. */
static int prepare_tables(ces_apply_t *a, ces_batch_t *batch, ces_catalog_table_t **tables,
                          ces_pgerr_t *e) {
    for (size_t i = 0; i < batch->count; i++) {
        ces_item_t *item = &batch->items[i];
        if (i + CES_ITEM_AHEAD < batch->count) { /* the names and the shape it compares */
            ces_item_prefetch(item[CES_ITEM_AHEAD].event.db);
            ces_item_prefetch(item[CES_ITEM_AHEAD].event.shape);
        }
        tables[i] = NULL;
        if (item->kind != CES_ITEM_EVENT)
            continue;
        ces_reject_t reject = {0};
        tables[i] = ces_catalog_ensure(a->catalog, a->session,
                                       ces_metadata_version_quoted(a->metadata), &item->event,
                                       item->arena,
                                       a->attempts, &reject, e);
        if (tables[i] != NULL)
            continue;
        if (e->action == CES_PGERR_STALE && e->failed_item < 0) {
            e->failed_item = (long)i; /* so that a table that keeps changing ends (retry_after) */
            e->in_ddl = true;
        }
        if (e->action == CES_PGERR_DATA && e->failed_item < 0) {
            /* DDL refused because of what this event asks (a name PostgreSQL refuses, a type
             * the table cannot take, a table ces2pg may not alter...): the event's. */
            char reason[600];
            snprintf(reason, sizeof(reason),
                     "creating or extending the target table failed: %s%s%s%s", e->message,
                     e->sqlstate[0] ? " (SQLSTATE " : "", e->sqlstate, e->sqlstate[0] ? ")" : "");
            ces_log_warning("%s.%s.%s %s at %s[%d]@%lld: %s", item->event.db, item->event.schema,
                            item->event.table, ces_op_name(item->event.op), item->source.topic,
                            (int)item->source.partition, (long long)item->source.offset, reason);
            ces_pgerr_clear(e);
            if (ces_batch_item_reject(item, CES_DL_SCHEMA, reason) != 0) {
                ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
                return -1;
            }
            continue;
        }
        if (e->action != CES_PGERR_NONE)
            return -1;
        if (reject.reason == NULL)
            reject = (ces_reject_t){CES_DL_SCHEMA, "the target table is unusable"};
        if (ces_batch_item_reject(item, reject.cls, reject.reason) != 0) {
            ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* Makes attempt number a->attempts + 1 at batch. Returns 0, or -1 when out of memory. */
static int attempt_begin(ces_apply_t *a, attempt_t *at, ces_batch_t *batch, step_t step, bool bulk,
                         bool plain_inserts, bool nonblocking) {
    *at = (attempt_t){.e = CES_PGERR_INIT, .batch = batch, .step = step};
    at->tables = calloc(batch->count + 1, sizeof(*at->tables));
    if (at->tables == NULL)
        return -1;
    a->attempts++;
    at->inflight = ces_inflight_new(a->session, &at->e, nonblocking);
    ces_sender_options_t options = {.inflight = at->inflight,
                                    .prepared = a->prepared,
                                    .metadata = a->metadata,
                                    .bulk = bulk,
                                    .plain_inserts = plain_inserts,
                                    .attempt = a->attempts};
    if (at->inflight == NULL || (at->sender = ces_sender_new(&options)) == NULL) {
        ces_inflight_destroy(at->inflight);
        free(at->tables);
        return -1;
    }
    return 0;
}

static void attempt_end(attempt_t *at) {
    ces_sender_destroy(at->sender);
    ces_inflight_destroy(at->inflight);
    free(at->tables);
}

/* Sends one attempt's statements up to the Sync that ends them; nothing is read yet (unless more
 * than CES_INFLIGHT_CHUNK results wait). A nonblocking pipeline only buffers what the socket
 * does not take: ces_apply_progress and attempt_finish send the rest. Returns 0, or -1 with at->e
 * set. */
static int attempt_send(ces_apply_t *a, attempt_t *at) {
    ces_pgerr_t *e = &at->e;
    ces_inflight_t *q = at->inflight;
    ces_batch_t *batch = at->batch;
    if (prepare_tables(a, batch, at->tables, e) != 0 || ces_inflight_begin(q) != 0 ||
        ces_inflight_simple(q, at->step == STEP_WHOLE ? "BEGIN" : "SAVEPOINT ces_step") != 0 ||
        (at->step == STEP_CHUNK && ces_ledger_writer_check(q, a->positions) != 0))
        return -1;
    for (size_t i = 0; i < batch->count; i++) {
        ces_item_t *item = &batch->items[i];
        if (i + CES_ITEM_AHEAD < batch->count) { /* its fields, and the first of their values */
            ces_item_prefetch(item[CES_ITEM_AHEAD].event.pkkey);
            ces_item_prefetch(item[CES_ITEM_AHEAD].event.table);
        }
        if (item->kind == CES_ITEM_EVENT) {
            ces_reject_t reject = {0};
            if (ces_sender_event(at->sender, (long)i, item, at->tables[i], &reject) != 0)
                return -1;
            if (reject.reason != NULL &&
                ces_batch_item_reject(item, reject.cls, reject.reason) != 0) {
                ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
                return -1;
            }
        }
        if (item->kind == CES_ITEM_DEAD_LETTER &&
            ces_ledger_dead_letter(q, a->metadata, (long)i, item, batch->retrying) != 0)
            return -1;
        if (ces_inflight_maybe_sync(q) != 0 || e->action != CES_PGERR_NONE)
            return -1;
    }
    if (ces_sender_flush_bulk(at->sender) != 0 ||
        (at->step != STEP_CHUNK && ces_ledger_positions(q, a->metadata, a->positions, batch) != 0))
        return -1;
    /* A whole transaction commits in the same pipeline: the fence aborts it before COMMIT, and
     * ces2pg need not wait for one more round trip. */
    if ((at->step == STEP_WHOLE && ces_inflight_commit(q) != 0) || ces_inflight_seal(q) != 0)
        return -1;
    return e->action != CES_PGERR_NONE ? -1 : 0;
}

/* Reads what attempt_send sent, checks the fence and commits (or releases the step's savepoint).
 * Returns 0, or -1 with at->e set (then the attempt must be abandoned). */
static int attempt_finish(ces_apply_t *a, attempt_t *at) {
    ces_pgerr_t *e = &at->e;
    ces_inflight_t *q = at->inflight;
    if (ces_inflight_drain(q) != 0 || e->action != CES_PGERR_NONE) {
        /* The connection broke with COMMIT sent (attempt_send got that far, or finish would not
         * be called): it may have committed, and apply_step asks. */
        if (at->step == STEP_WHOLE && !ces_session_connected(a->session))
            e->in_commit = true;
        return -1;
    }
    if (ces_inflight_fenced(q)) {
        ces_pgerr_set(e, CES_PGERR_FENCED, -1, NULL,
                      "the stored consumer position moved, or this instance is no longer the "
                      "writer: another instance took over");
        return -1;
    }
    /* A whole transaction's COMMIT was in the pipeline, and every result was fine. */
    if (at->step != STEP_WHOLE &&
        (ces_inflight_simple(q, at->step == STEP_CHUNK ? "RELEASE SAVEPOINT ces_step" : "COMMIT") !=
             0 ||
         ces_inflight_sync_and_drain(q) != 0 || e->action != CES_PGERR_NONE)) {
        e->in_commit = at->step != STEP_CHUNK;
        return -1;
    }
    ces_inflight_end(q);
    return 0;
}

/* Whether v is the change a streamed transaction last failed at with a table changing
 * underneath. */
static bool stale_again_at(const ces_apply_t *a, const ces_version_t *v) {
    return a->stream_stale.count > 0 &&
           ces_lsn_compare(v->commit_lsn, a->stream_stale.at.commit_lsn) == 0 &&
           v->sequence == a->stream_stale.at.sequence;
}

/* A table changed underneath inside a streamed transaction, at the same change for the last
 * CES_APPLY_STALE_TRIES - 1 times it was read again: this time the change is taken for what it
 * asks (a trigger naming a missing table, ...) and e becomes a data error, which undoes only the
 * step and dead-letters the change. */
static void stale_in_stream(ces_apply_t *a, const attempt_t *at, ces_pgerr_t *e) {
    const ces_batch_t *batch = at->batch;
    if (at->step == STEP_WHOLE || e->action != CES_PGERR_STALE || e->in_commit ||
        e->failed_item < 0 || (size_t)e->failed_item >= batch->count ||
        batch->items[e->failed_item].kind != CES_ITEM_EVENT)
        return;
    if (stale_again_at(a, &batch->items[e->failed_item].event.version) &&
        a->stream_stale.count + 1 >= CES_APPLY_STALE_TRIES) {
        a->stream_stale.count = 0;
        e->action = CES_PGERR_DATA;
        e->stale_again = true;
    }
}

/* After a failed attempt: rolls back what it did. A data error undoes only a stream's step;
 * anything else loses the whole transaction. */
static void attempt_abandon(attempt_t *at) {
    ces_inflight_roll_back(at->inflight, at->step == STEP_WHOLE ||
                                         !ces_pgerr_undoes_only_the_step(at->e.action) ||
                                         at->e.in_commit);
}

/* One attempt, sent and finished; its outcome in *e. */
static void attempt(ces_apply_t *a, ces_batch_t *batch, step_t step, bool bulk,
                    bool plain_inserts, ces_pgerr_t *e) {
    attempt_t at;
    if (attempt_begin(a, &at, batch, step, bulk, plain_inserts, false) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return;
    }
    if (attempt_send(a, &at) != 0 || attempt_finish(a, &at) != 0) {
        stale_in_stream(a, &at, &at.e);
        attempt_abandon(&at);
    }
    *e = at.e;
    attempt_end(&at);
}

/* ---------------------------------------------------------------------------------------------- */
/* The retry decision                                                                             */

/* How the next attempt at a batch is made. */
typedef struct {
    bool bulk;           /* off once a bulk statement hit bad data: row by row finds the change */
    bool plain_inserts;  /* off once a plain INSERT found its key taken */
    bool commit_unknown; /* the last attempt failed during COMMIT */
    unsigned stale;      /* CES_PGERR_STALE running, at the same change (stale_item) */
    long stale_item;
} retry_t;

static int read_one_position(void *opaque, const char *topic, int32_t partition,
                             int64_t *stored) {
    char err[256];
    return ces_apply_read_positions(opaque, topic, &partition, 1, stored, err, sizeof(err)) ==
                   CES_APPLY_OK
               ? 0
               : -1;
}

static void count_committed(const ces_batch_t *batch, ces_apply_stats_t *stats) {
    if (stats == NULL)
        return;
    for (size_t i = 0; i < batch->count; i++) {
        if (batch->items[i].kind == CES_ITEM_EVENT)
            stats->events_applied++;
        else
            stats->dead_letters++;
    }
}

/* A 42501 in an event's statement is the event's (a target table ces2pg may not write or alter)
 * unless ces2pg lost its privileges on its own metadata schema, where its dead letters and
 * positions go and which the version guard reads. Returns 1 when ces2pg may still use the schema
 * and each table in it, 0 when not, -1 when the question failed (e says why). */
static int own_schema_usable(ces_apply_t *a, ces_pgerr_t *e) {
    /* One privilege per call: given several, has_table_privilege says whether any is held. */
    static const char *sql =
        "SELECT has_schema_privilege(n.oid, 'USAGE') AND NOT EXISTS ("
        "  SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relkind = 'r'"
        "   AND NOT (has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT')"
        "        AND has_table_privilege(c.oid, 'UPDATE') AND has_table_privilege(c.oid, 'DELETE')))"
        "  FROM pg_catalog.pg_namespace n WHERE n.nspname = $1";
    const char *params[1] = {a->metadata_schema};
    PGresult *r = ces_session_query(a->session, sql, 1, params, e);
    if (r == NULL)
        return -1;
    int usable = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return usable;
}

static bool item_is_event(const ces_batch_t *batch, long i) {
    return i >= 0 && (size_t)i < batch->count && batch->items[i].kind == CES_ITEM_EVENT;
}

/* A change PostgreSQL rejected becomes a dead letter (class cls); the batch is tried again
 * without it. Returns true to try again, false with *status to give up. */
static bool reject_failed_item(ces_batch_t *batch, const ces_pgerr_t *e, ces_dl_class_t cls,
                               char *errstr, size_t errstr_size, ces_apply_status_t *status) {
    if (item_is_event(batch, e->failed_item)) {
        ces_item_t *item = &batch->items[e->failed_item];
        char reason[700];
        snprintf(reason, sizeof(reason), "PostgreSQL rejected the change%s: %s (SQLSTATE %s)",
                 e->action == CES_PGERR_STALE || e->stale_again
                     ? ", its table changing underneath each time"
                     : "",
                 e->message, e->sqlstate);
        ces_log_warning("%s.%s.%s %s at %s[%d]@%lld: %s", item->event.db, item->event.schema,
                        item->event.table, ces_op_name(item->event.op), item->source.topic,
                        (int)item->source.partition, (long long)item->source.offset, reason);
        if (ces_batch_item_reject(item, cls, reason) != 0) {
            snprintf(errstr, errstr_size, "out of memory");
            *status = CES_APPLY_FATAL;
            return false;
        }
        return true;
    }
    snprintf(errstr, errstr_size, "PostgreSQL rejected ces2pg's own bookkeeping: %s (SQLSTATE %s)",
             e->message, e->sqlstate);
    *status = CES_APPLY_FATAL;
    return false;
}

/* Waits before the batch is tried again after e (capped exponential backoff, counted by reason),
 * unless a stop is requested. Returns true to try again, false with *status to give up. */
static bool wait_to_retry(ces_apply_t *a, const ces_pgerr_t *e, const char *why,
                          ces_apply_stats_t *stats, char *errstr, size_t errstr_size,
                          ces_apply_status_t *status) {
    if (stats)
        stats->retries++;
    int64_t ms = ces_session_backoff_next(a->session, ces_pgerr_retry_reason(e));
    ces_log_warning("PostgreSQL: %s%s%s%s; rolling back and retrying the batch in %lld ms",
                    e->message, e->sqlstate[0] ? " SQLSTATE " : "", e->sqlstate, why,
                    (long long)ms);
    if (ces_session_backoff_sleep(a->session, ms) != 0) {
        snprintf(errstr, errstr_size, "stopped while retrying a batch");
        *status = CES_APPLY_INTERRUPTED;
        return false;
    }
    return true;
}

/* An event's change (or its table's DDL) was refused for what it asks: a dead letter, unless the
 * refusal is a privilege ces2pg lacks on its own metadata schema. */
static bool rejected(ces_apply_t *a, ces_batch_t *batch, const ces_pgerr_t *e, char *errstr,
                     size_t errstr_size, ces_apply_status_t *status) {
    if (strcmp(e->sqlstate, ERRCODE_INSUFFICIENT_PRIVILEGE) == 0) {
        ces_pgerr_t check = CES_PGERR_INIT;
        int usable = own_schema_usable(a, &check);
        if (usable <= 0) {
            snprintf(errstr, errstr_size,
                     "permission denied on ces2pg's metadata schema \"%s\": %s%s%s",
                     a->metadata_schema, e->message,
                     usable < 0 ? "; and checking it failed: " : "",
                     usable < 0 ? check.message : "");
            *status = CES_APPLY_FATAL;
            return false;
        }
    }
    return reject_failed_item(batch, e, e->in_ddl ? CES_DL_SCHEMA : CES_DL_REJECTED_BY_POSTGRES,
                              errstr, errstr_size, status);
}

/* A target table changed underneath (e): it is read again in a new session after a wait. The
 * same change finding it changed CES_APPLY_STALE_TRIES times running is dead-lettered (a bulk
 * statement goes row by row first, to find the change): what it asks keeps failing the same way,
 * e.g. a trigger that names a column or table that does not exist. */
static bool stale(ces_apply_t *a, ces_batch_t *batch, const ces_pgerr_t *e, retry_t *r,
                  ces_apply_stats_t *stats, char *errstr, size_t errstr_size,
                  ces_apply_status_t *status) {
    r->stale = r->stale_item == e->failed_item ? r->stale + 1 : 1;
    r->stale_item = e->failed_item;
    if (r->stale >= CES_APPLY_STALE_TRIES && item_is_event(batch, e->failed_item)) {
        r->stale = 0;
        return reject_failed_item(batch, e,
                                  e->in_ddl ? CES_DL_SCHEMA : CES_DL_REJECTED_BY_POSTGRES, errstr,
                                  errstr_size, status);
    }
    if (r->stale >= CES_APPLY_STALE_TRIES && r->bulk) {
        r->bulk = false;
        r->stale = 0;
    }
    ces_catalog_forget(a->catalog);
    /* Statements of the old shape may still exist on the server: start a new session (whose
     * epoch makes every statement prepared again). */
    ces_session_disconnect(a->session);
    return wait_to_retry(a, e, " (a target table changed underneath; reading it again)", stats,
                         errstr, errstr_size, status);
}

/* A table changed underneath a streamed transaction's part (e): counts the change it failed at
 * (stale_in_stream), and waits as any retry does before the transaction is read again. Returns
 * true, or false with *status when stopped meanwhile. */
static bool stream_stale_wait(ces_apply_t *a, const ces_batch_t *batch, const ces_pgerr_t *e,
                              ces_apply_stats_t *stats, char *errstr, size_t errstr_size,
                              ces_apply_status_t *status) {
    if (item_is_event(batch, e->failed_item)) {
        const ces_version_t *v = &batch->items[e->failed_item].event.version;
        a->stream_stale.count = stale_again_at(a, v) ? a->stream_stale.count + 1 : 1;
        a->stream_stale.at = *v;
    }
    a->stream_stale.rows = true;
    return wait_to_retry(a, e, " (a target table changed underneath; reading the streamed "
                         "transaction again)", stats, errstr, errstr_size, status);
}

/* Decides what follows the failed attempt e at batch. Returns true to try again (as r now says),
 * false with *status to give up. */
static bool retry_after(ces_apply_t *a, ces_batch_t *batch, step_t step, const ces_pgerr_t *e,
                        retry_t *r, ces_apply_stats_t *stats, char *errstr, size_t errstr_size,
                        ces_apply_status_t *status) {
    if (step != STEP_WHOLE && !ces_pgerr_undoes_only_the_step(e->action) &&
        e->action != CES_PGERR_FENCED && e->action != CES_PGERR_FATAL &&
        !(e->action == CES_PGERR_RETRY && e->in_commit)) {
        /* The open transaction is gone: what was streamed must be read again, after a wait when
         * a table changed underneath (and row by row, to name the change if it happens again). */
        if (e->action == CES_PGERR_STALE && !stream_stale_wait(a, batch, e, stats, errstr,
                                                               errstr_size, status))
            return false;
        snprintf(errstr, errstr_size, "%s", e->message);
        if (!ces_session_connected(a->session) || e->action == CES_PGERR_STALE)
            ces_session_disconnect(a->session);
        if (e->action == CES_PGERR_STALE)
            ces_catalog_forget(a->catalog);
        a->stream_epoch = 0;
        *status = CES_APPLY_LOST;
        return false;
    }
    switch (e->action) {
    case CES_PGERR_RETRY_ROW_BY_ROW:
        ces_log_debug("a bulk statement was rejected (%s, SQLSTATE %s): applying the batch "
                      "row by row",
                      e->message, e->sqlstate);
        r->bulk = false;
        return true;
    case CES_PGERR_RETRY_WITH_UPSERTS:
        /* Not a failure: see the bulk path (bulk.h). The table sends upserts for a while. */
        ces_catalog_insert_taken(e->taken, a->attempts);
        ces_log_debug("a plain INSERT found a key taken (%s): applying the batch again with "
                      "upserts",
                      e->message);
        r->plain_inserts = false;
        return true;
    case CES_PGERR_DATA:
        return rejected(a, batch, e, errstr, errstr_size, status);
    case CES_PGERR_STALE:
        return stale(a, batch, e, r, stats, errstr, errstr_size, status);
    case CES_PGERR_FENCED:
        snprintf(errstr, errstr_size, "%s", e->message);
        a->stream_epoch = 0;
        *status = CES_APPLY_FENCED;
        return false;
    case CES_PGERR_RETRY:
        r->commit_unknown = e->in_commit;
        if (!ces_session_connected(a->session))
            ces_session_disconnect(a->session);
        return wait_to_retry(a, e, "", stats, errstr, errstr_size, status);
    default:
        snprintf(errstr, errstr_size, "PostgreSQL: %s%s%s", e->message,
                 e->sqlstate[0] ? " SQLSTATE " : "", e->sqlstate);
        *status = CES_APPLY_FATAL;
        return false;
    }
}

/* Applies batch as step, retrying as its failures require. first (may be NULL) is the outcome of
 * a first attempt already made (ces_apply_send): the loop starts by handling it. */
static ces_apply_status_t apply_step(ces_apply_t *a, ces_batch_t *batch, step_t step,
                                     const ces_pgerr_t *first, ces_apply_stats_t *stats,
                                     char *errstr, size_t errstr_size) {
    retry_t r = {.bulk = step == STEP_WHOLE || !a->stream_stale.rows, .plain_inserts = true,
                 .stale_item = -2};
    for (;;) {
        ces_pgerr_t e = CES_PGERR_INIT;
        if (first != NULL) {
            e = *first;
            first = NULL;
        } else {
            if (step != STEP_WHOLE && !ces_session_connected(a->session)) {
                snprintf(errstr, errstr_size, "the connection of the open transaction was lost");
                return CES_APPLY_LOST;
            }
            ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
            if (st != CES_APPLY_OK)
                return st;
            if (r.commit_unknown && ces_positions_committed(batch, read_one_position, a)) {
                ces_log_info("the batch had been committed before the connection was lost");
                break;
            }
            if (r.commit_unknown) {
                snprintf(errstr, errstr_size,
                         "the streamed transaction was lost with the connection");
                return CES_APPLY_LOST;
            }
            attempt(a, batch, step, r.bulk, r.plain_inserts, &e);
        }
        if (e.action == CES_PGERR_NONE)
            break;
        ces_apply_status_t status;
        if (!retry_after(a, batch, step, &e, &r, stats, errstr, errstr_size, &status))
            return status;
    }
    ces_session_backoff_reset(a->session);
    if (step == STEP_LAST) {
        a->stream_epoch = 0;
        a->stream_stale.rows = false;
        a->stream_stale.count = 0;
    }
    count_committed(batch, stats);
    return CES_APPLY_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* The door                                                                                       */

static void between_batches(ces_apply_t *a) {
    ces_janitor_run(a->janitor, a->session, ces_metadata_tombstones(a->metadata));
}

int ces_apply_set_writer(ces_apply_t *a, const char *holder, int64_t epoch) {
    return ces_positions_set_writer(a->positions, holder, epoch);
}

ces_apply_status_t ces_apply_batch(ces_apply_t *a, ces_batch_t *batch, ces_apply_stats_t *stats,
                                   char *errstr, size_t errstr_size) {
    bool whole = !stream_open(a);
    ces_apply_status_t st = apply_step(a, batch, whole ? STEP_WHOLE : STEP_CHUNK, NULL, stats,
                                       errstr, errstr_size);
    if (st == CES_APPLY_OK && whole)
        between_batches(a);
    return st;
}

ces_apply_status_t ces_apply_stream_begin(ces_apply_t *a, char *errstr, size_t errstr_size) {
    ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
    if (st != CES_APPLY_OK)
        return st;
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_session_exec(a->session, "BEGIN", &e) != 0) {
        snprintf(errstr, errstr_size, "%s", e.message);
        if (!ces_session_connected(a->session))
            ces_session_disconnect(a->session);
        return e.action == CES_PGERR_FATAL ? CES_APPLY_FATAL : CES_APPLY_LOST;
    }
    a->stream_epoch = ces_session_epoch(a->session);
    return CES_APPLY_OK;
}

ces_apply_status_t ces_apply_stream_commit(ces_apply_t *a, ces_batch_t *batch,
                                           ces_apply_stats_t *stats, char *errstr,
                                           size_t errstr_size) {
    return apply_step(a, batch, STEP_LAST, NULL, stats, errstr, errstr_size);
}

void ces_apply_stream_abort(ces_apply_t *a) {
    if (!stream_open(a))
        return;
    a->stream_epoch = 0;
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_apply_connected(a) && ces_session_exec(a->session, "ROLLBACK", &e) != 0)
        ces_session_disconnect(a->session);
}

bool ces_apply_streaming(const ces_apply_t *a) { return stream_open(a); }

ces_apply_status_t ces_apply_send(ces_apply_t *a, ces_batch_t *batch, char *errstr,
                                  size_t errstr_size) {
    if (a->async != NULL) {
        snprintf(errstr, errstr_size, "a batch was sent while another one is open");
        return CES_APPLY_FATAL;
    }
    step_t step = stream_open(a) ? STEP_CHUNK : STEP_WHOLE;
    if (step == STEP_CHUNK && !ces_apply_connected(a)) {
        snprintf(errstr, errstr_size, "the connection of the open transaction was lost");
        a->stream_epoch = 0;
        return CES_APPLY_LOST;
    }
    if (step == STEP_WHOLE) {
        ces_apply_status_t st = ensure_connected(a, errstr, errstr_size);
        if (st != CES_APPLY_OK)
            return st;
    }
    attempt_t *at = malloc(sizeof(*at));
    if (at == NULL || attempt_begin(a, at, batch, step, true, true, true) != 0) {
        free(at);
        snprintf(errstr, errstr_size, "out of memory");
        return CES_APPLY_FATAL;
    }
    a->async = at;
    /* A failure here is handled by ces_apply_finish like any failed attempt. */
    (void)attempt_send(a, at);
    return CES_APPLY_OK;
}

void ces_apply_progress(ces_apply_t *a) {
    if (a->async != NULL)
        ces_inflight_progress(a->async->inflight);
}

bool ces_apply_ready(ces_apply_t *a) {
    return a->async == NULL || ces_inflight_ready(a->async->inflight);
}

ces_apply_status_t ces_apply_finish(ces_apply_t *a, ces_apply_stats_t *stats, char *errstr,
                                    size_t errstr_size) {
    attempt_t *at = a->async;
    if (at == NULL)
        return CES_APPLY_OK;
    a->async = NULL;
    if (at->e.action != CES_PGERR_NONE || attempt_finish(a, at) != 0)
        attempt_abandon(at);
    ces_batch_t *batch = at->batch;
    step_t step = at->step;
    ces_pgerr_t e = at->e;
    attempt_end(at);
    free(at);
    ces_apply_status_t st = apply_step(a, batch, step, &e, stats, errstr, errstr_size);
    if (st == CES_APPLY_OK && step == STEP_WHOLE)
        between_batches(a);
    return st;
}
