#include "apply/positions.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "apply/pgerr.h"
#include "apply/session.h"
#include "util/strbuf.h"

/* ============================================================================================== */
/* 1. The pipeline's bookkeeping                                                                  */
/* ============================================================================================== */

void ces_positions_on_assign(ces_partition_position_t *pos, const char *topic,
                             int32_t partition, int64_t stored) {
    /* A first start (no stored position) has nothing to check: Kafka's committed offset or
     * auto.offset.reset decide where it begins. */
    *pos = (ces_partition_position_t){
        .has_stored = stored >= 0, .stored = stored, .expect_from = stored >= 0 ? stored : -1};
    if (stored >= 0)
        ces_log_info("%s[%d]: resuming at offset %lld stored in PostgreSQL", topic,
                     (int)partition, (long long)stored);
    else
        ces_log_info("%s[%d]: no position stored in PostgreSQL; starting from Kafka's "
                     "committed offset or auto.offset.reset",
                     topic, (int)partition);
}

void ces_positions_on_revoke(ces_partition_position_t *pos) {
    *pos = (ces_partition_position_t){.stored = -1, .expect_from = -1};
}

bool ces_positions_check_resume(ces_partition_position_t *pos, const char *topic,
                                int32_t partition, int64_t offset, bool eof,
                                ces_source_gap_t *gap) {
    if (pos->expect_from < 0 || offset == pos->expect_from) {
        if (!eof) /* the end being there is no record: the first one is still to come */
            pos->expect_from = -1;
        return false;
    }
    *gap = (ces_source_gap_t){
        .topic = topic,
        .partition = partition,
        .stored = pos->expect_from,
        .resumed = offset,
        .skipped = offset > pos->expect_from ? offset - pos->expect_from : -1,
        .reason = offset > pos->expect_from
                      ? "the records from the stored position on were no longer at the broker "
                        "(retention, or records deleted)"
                      : "the stored position is past the end of the partition (the topic was "
                        "recreated or truncated)",
    };
    return true;
}

void ces_positions_resume_checked(ces_partition_position_t *pos, const ces_source_gap_t *gap) {
    pos->expect_from = -1;
    if (gap != NULL) {
        pos->gap = *gap;
        pos->gap_pending = true;
        pos->gap_sent = false;
    }
}

const ces_source_gap_t *ces_positions_gap_to_store(ces_partition_position_t *pos) {
    if (!pos->gap_pending || pos->gap_sent)
        return NULL;
    pos->gap_sent = true;
    return &pos->gap;
}

void ces_positions_on_read(ces_partition_position_t *pos, int64_t offset) {
    if (!pos->has_next)
        pos->first = offset;
    pos->next = offset + 1;
    pos->has_next = true;
    pos->dirty = true;
}

bool ces_positions_to_store(const ces_partition_position_t *pos, const char *topic,
                            int32_t partition, int64_t held, ces_position_update_t *update) {
    if (!pos->dirty || !pos->has_next)
        return false;
    int64_t next = held < pos->next ? held : pos->next;
    /* Held records can keep a position at or before the stored one: nothing new to store. After
     * an accepted gap behind the stored position (the partition now ends before it), positions
     * count from where reading resumed; the stored one stays the fence. */
    int64_t floor = pos->gap_pending && pos->gap.resumed < pos->stored ? pos->gap.resumed
                                                                        : pos->stored;
    if (pos->has_stored && next <= floor)
        return false;
    *update = (ces_position_update_t){.topic = topic,
                                    .partition = partition,
                                    .has_expected = pos->has_stored,
                                    .expected = pos->stored,
                                    .next = next};
    return true;
}

void ces_positions_on_commit(ces_partition_position_t *pos, int64_t next) {
    pos->has_stored = true;
    pos->stored = next;
    if (pos->gap_pending && pos->gap_sent && next >= pos->gap.resumed)
        pos->gap_pending = pos->gap_sent = false; /* recorded with this batch */
    /* Held records kept it short of what was read: those still count as not stored. */
    pos->dirty = pos->next != next;
}

int64_t ces_positions_on_rewind(ces_partition_position_t *pos, int64_t stored) {
    if (!pos->has_next)
        return -1;
    /* Records from first on were read under this assignment; any before it were never ours. */
    int64_t target = stored >= 0 ? stored : pos->first;
    pos->has_stored = stored >= 0;
    pos->stored = stored;
    pos->dirty = false;
    pos->next = target;
    if (target < pos->first)
        pos->first = target;
    /* Read again from there, and checked again: a gap not recorded yet is found again. */
    pos->expect_from = stored >= 0 ? target : -1;
    pos->gap_pending = pos->gap_sent = false;
    return target;
}

int64_t ces_positions_next_to_apply(const ces_partition_position_t *pos) {
    return pos->has_stored ? pos->stored : pos->has_next ? pos->next : -1;
}

/* ============================================================================================== */
/* 2. Positions in PostgreSQL (the apply room)                                                    */
/* ============================================================================================== */

struct ces_positions_s {
    char *group_id;
    char *sql_update;
    char *sql_read;
    char *sql_gap;
    char *sql_writer;
    char *sql_writer_check;
    /* The writer fence (writer.h); no holder: none. */
    char *holder;
    char epoch[24];
};

ces_positions_t *ces_positions_new(const char *group_id) {
    ces_positions_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    if ((p->group_id = strdup(group_id)) == NULL) {
        ces_positions_destroy(p);
        return NULL;
    }
    return p;
}

void ces_positions_destroy(ces_positions_t *p) {
    if (p == NULL)
        return;
    free(p->group_id);
    free(p->holder);
    free(p->sql_writer);
    free(p->sql_writer_check);
    free(p->sql_update);
    free(p->sql_read);
    free(p->sql_gap);
    free(p);
}

int ces_positions_set_schema(ces_positions_t *p, const char *schema_quoted) {
    ces_strbuf_t update = {0}, read = {0}, gap = {0}, writer = {0}, check = {0};
    /* The same, without renewing (and so without locking the row) for the parts of a streamed
     * transaction, which stays open for longer than a writer's renewal may wait. */
    ces_strbuf_add(&check, "SELECT 1 / count(*)::int FROM ");
    ces_strbuf_add(&check, schema_quoted);
    ces_strbuf_add(&check, ".writers WHERE group_id = $1 AND holder = $2 AND epoch = $3");
    /* The writer fence: the batch commits only while the writers row still names this instance
     * with its epoch (renewing its lease); otherwise the same division by zero as below. */
    ces_strbuf_add(&writer, "WITH held AS (UPDATE ");
    ces_strbuf_add(&writer, schema_quoted);
    ces_strbuf_add(&writer, ".writers SET renewed_at = clock_timestamp()"
                            " WHERE group_id = $1 AND holder = $2 AND epoch = $3 RETURNING 1)"
                            " SELECT 1 / count(*)::int FROM held");
    /* The fence: the position is stored only over the one this instance read ($5; NULL: none).
     * If another instance moved it, nothing is stored and the division by zero
     * (ERRCODE_DIVISION_BY_ZERO, recognised by ces_positions_fence_raised as inflight.h drains the
     * pipeline) aborts the transaction before the COMMIT that follows it in the same pipeline. */
    ces_strbuf_add(&update, "WITH stored AS (INSERT INTO ");
    ces_strbuf_add(&update, schema_quoted);
    ces_strbuf_add(&update,
                   ".offsets AS o (group_id, topic, partition, next_offset) VALUES ($1, $2, $3, $4)"
                   " ON CONFLICT (group_id, topic, partition) DO UPDATE"
                   " SET next_offset = EXCLUDED.next_offset, updated_at = now()"
                   " WHERE o.next_offset = $5 RETURNING 1) SELECT 1 / count(*)::int FROM stored");
    ces_strbuf_add(&read, "SELECT partition, next_offset FROM ");
    ces_strbuf_add(&read, schema_quoted);
    ces_strbuf_add(&read, ".offsets WHERE group_id = $1 AND topic = $2");
    ces_strbuf_add(&gap, "INSERT INTO ");
    ces_strbuf_add(&gap, schema_quoted);
    ces_strbuf_add(&gap, ".source_gaps (group_id, topic, partition, stored_position, resumed_at,"
                         " skipped_records, reason) VALUES ($1, $2, $3, $4, $5, $6, $7)");
    free(p->sql_update);
    free(p->sql_read);
    free(p->sql_gap);
    free(p->sql_writer);
    free(p->sql_writer_check);
    p->sql_update = p->sql_read = p->sql_gap = p->sql_writer = p->sql_writer_check = NULL;
    if (update.failed || read.failed || gap.failed || writer.failed || check.failed) {
        ces_strbuf_free(&update);
        ces_strbuf_free(&read);
        ces_strbuf_free(&gap);
        ces_strbuf_free(&writer);
        ces_strbuf_free(&check);
        return -1;
    }
    p->sql_writer = writer.buf;
    p->sql_writer_check = check.buf;
    p->sql_update = update.buf;
    p->sql_read = read.buf;
    p->sql_gap = gap.buf;
    return 0;
}

const char *ces_positions_update_sql(const ces_positions_t *p) { return p->sql_update; }

int ces_positions_set_writer(ces_positions_t *p, const char *holder, int64_t epoch) {
    char *copy = holder != NULL ? strdup(holder) : NULL;
    if (holder != NULL && copy == NULL)
        return -1;
    free(p->holder);
    p->holder = copy;
    snprintf(p->epoch, sizeof(p->epoch), "%lld", (long long)epoch);
    return 0;
}

const char *ces_positions_writer_sql(const ces_positions_t *p, bool renew, const char *values[3]) {
    if (p->holder == NULL)
        return NULL;
    values[0] = p->group_id;
    values[1] = p->holder;
    values[2] = p->epoch;
    return renew ? p->sql_writer : p->sql_writer_check;
}

void ces_positions_update_params(const ces_positions_t *p, const ces_position_update_t *o,
                                 ces_positions_params_t *params) {
    snprintf(params->partition, sizeof(params->partition), "%d", (int)o->partition);
    snprintf(params->next, sizeof(params->next), "%lld", (long long)o->next);
    snprintf(params->expected, sizeof(params->expected), "%lld", (long long)o->expected);
    params->values[0] = p->group_id;
    params->values[1] = o->topic;
    params->values[2] = params->partition;
    params->values[3] = params->next;
    params->values[4] = o->has_expected ? params->expected : NULL;
}

const char *ces_positions_group(const ces_positions_t *p) { return p->group_id; }

const char *ces_positions_gap_sql(const ces_positions_t *p) { return p->sql_gap; }

void ces_positions_gap_params(const ces_positions_t *p, const ces_source_gap_t *gap,
                              ces_positions_gap_params_t *params) {
    snprintf(params->partition, sizeof(params->partition), "%d", (int)gap->partition);
    snprintf(params->stored, sizeof(params->stored), "%lld", (long long)gap->stored);
    snprintf(params->resumed, sizeof(params->resumed), "%lld", (long long)gap->resumed);
    snprintf(params->skipped, sizeof(params->skipped), "%lld", (long long)gap->skipped);
    params->values[0] = p->group_id;
    params->values[1] = gap->topic;
    params->values[2] = params->partition;
    params->values[3] = params->stored;
    params->values[4] = params->resumed;
    params->values[5] = gap->skipped >= 0 ? params->skipped : NULL;
    params->values[6] = gap->reason;
}

bool ces_positions_fence_raised(const PGresult *res) {
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    return state != NULL && strcmp(state, ERRCODE_DIVISION_BY_ZERO) == 0;
}

int ces_positions_read(const ces_positions_t *p, ces_session_t *session, const char *topic,
                       const int32_t *partitions, size_t n, int64_t *offsets, ces_pgerr_t *e) {
    if (p->sql_read == NULL) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        return -1;
    }
    PGconn *conn = ces_session_conn(session);
    const char *params[2] = {p->group_id, topic};
    PGresult *r = PQexecParams(conn, p->sql_read, 2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        ces_pgerr_from_result(e, conn, r, -1);
        PQclear(r);
        return -1;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        int32_t partition = (int32_t)strtol(PQgetvalue(r, row, 0), NULL, 10);
        int64_t offset = strtoll(PQgetvalue(r, row, 1), NULL, 10);
        for (size_t i = 0; i < n; i++) {
            if (partitions[i] == partition)
                offsets[i] = offset;
        }
    }
    PQclear(r);
    return 0;
}

bool ces_positions_committed(const ces_batch_t *batch, ces_positions_reader_t read, void *opaque) {
    if (batch->npositions == 0)
        return false;
    for (size_t i = 0; i < batch->npositions; i++) {
        const ces_position_update_t *o = &batch->positions[i];
        int64_t stored;
        if (read(opaque, o->topic, o->partition, &stored) != 0 || stored != o->next)
            return false;
    }
    return true;
}
