#include "apply/janitor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/strbuf.h"

struct ces_janitor_s {
    bool lsn_guard;
    int64_t tombstone_retention_s;
    int64_t last_purge_ms;
};

ces_janitor_t *ces_janitor_new(bool lsn_guard, int64_t tombstone_retention_s) {
    ces_janitor_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->lsn_guard = lsn_guard;
    j->tombstone_retention_s = tombstone_retention_s;
    return j;
}

void ces_janitor_destroy(ces_janitor_t *j) { free(j); }

static void purge_tombstones(ces_janitor_t *j, ces_session_t *session, const char *tombstones) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, "DELETE FROM ");
    ces_strbuf_add(&sql, tombstones);
    ces_strbuf_add(&sql, " WHERE ctid = ANY (ARRAY (SELECT ctid FROM ");
    ces_strbuf_add(&sql, tombstones);
    ces_strbuf_addf(&sql, " WHERE deleted_at < now() - make_interval(secs => $1) LIMIT %d))",
                    CES_JANITOR_PURGE_ROWS);
    char secs[24];
    snprintf(secs, sizeof(secs), "%lld", (long long)j->tombstone_retention_s);
    const char *params[1] = {secs};
    PGresult *r = sql.failed ? NULL
                             : PQexecParams(ces_session_conn(session), sql.buf, 1, NULL, params,
                                            NULL, NULL, 0);
    if (PQresultStatus(r) == PGRES_COMMAND_OK) {
        if (strcmp(PQcmdTuples(r), "0") != 0)
            ces_log_info("purged %s tombstones older than %lld s", PQcmdTuples(r),
                         (long long)j->tombstone_retention_s);
    } else {
        ces_log_warning("purging tombstones: %s", r ? PQresultErrorMessage(r) : "out of memory");
    }
    PQclear(r);
    ces_strbuf_free(&sql);
}

void ces_janitor_run(ces_janitor_t *j, ces_session_t *session, const char *tombstones) {
    if (!j->lsn_guard || tombstones == NULL || !ces_session_connected(session))
        return;
    int64_t now = ces_clock_now_ms();
    int64_t retention_ms = j->tombstone_retention_s * 1000;
    int64_t every =
        retention_ms < CES_JANITOR_PURGE_INTERVAL_MS ? retention_ms : CES_JANITOR_PURGE_INTERVAL_MS;
    if (now - j->last_purge_ms < every)
        return;
    j->last_purge_ms = now;
    purge_tombstones(j, session, tombstones);
}
