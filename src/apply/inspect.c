#include "apply/inspect.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/metadata.h"
#include "apply/pgerr.h"
#include "apply/session.h"
#include "util/strbuf.h"

struct ces_inspect_s {
    ces_session_t *session;
    ces_metadata_t *metadata;
    char *group_id;
};

ces_inspect_t *ces_inspect_open(const ces_inspect_options_t *o, char *errstr,
                                size_t errstr_size) {
    ces_inspect_t *in = calloc(1, sizeof(*in));
    if (in == NULL || (in->metadata = ces_metadata_new(o->metadata_schema, o->version_column)) ==
                          NULL || (in->group_id = strdup(o->group_id)) == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        ces_inspect_close(in);
        return NULL;
    }
    in->session = ces_metadata_connect(in->metadata, o->conninfo, o->password, &o->password_token, errstr,
                                       errstr_size);
    if (in->session == NULL) {
        ces_inspect_close(in);
        return NULL;
    }
    return in;
}

void ces_inspect_close(ces_inspect_t *in) {
    if (in == NULL)
        return;
    ces_session_destroy(in->session);
    ces_metadata_destroy(in->metadata);
    free(in->group_id);
    free(in);
}

/* Runs sql (naming the metadata schema as %s once) with params; NULL with errstr set on failure.
 * The result is the caller's (PQclear). */
static PGresult *query(ces_inspect_t *in, const char *head, const char *tail, int nparams,
                       const char *const *params, char *errstr, size_t errstr_size) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, head);
    ces_strbuf_add(&sql, ces_metadata_schema_quoted(in->metadata));
    ces_strbuf_add(&sql, tail);
    if (sql.failed) {
        ces_strbuf_free(&sql);
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    ces_pgerr_t e = CES_PGERR_INIT;
    PGresult *r = ces_session_query(in->session, sql.buf, nparams, params, &e);
    ces_strbuf_free(&sql);
    if (r == NULL)
        snprintf(errstr, errstr_size, "PostgreSQL: %s", e.message);
    return r;
}

static const char *text_or_null(const PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

#define DEAD_LETTER_COLUMNS                                                                        \
    "SELECT id, created_at, class, source_table, topic, partition, \"offset\", reason, logicalid, " \
    "octet_length(payload), retried_at"

static void dead_letter_row(const PGresult *r, int row, ces_dead_letter_row_t *out) {
    *out = (ces_dead_letter_row_t){
        .id = strtoll(PQgetvalue(r, row, 0), NULL, 10),
        .created_at = PQgetvalue(r, row, 1),
        .class = text_or_null(r, row, 2),
        .source_table = text_or_null(r, row, 3),
        .topic = PQgetvalue(r, row, 4),
        .partition = (int32_t)strtol(PQgetvalue(r, row, 5), NULL, 10),
        .offset = strtoll(PQgetvalue(r, row, 6), NULL, 10),
        .reason = PQgetvalue(r, row, 7),
        .logicalid = text_or_null(r, row, 8),
        .payload_len = (size_t)strtoull(PQgetvalue(r, row, 9), NULL, 10),
        .retried_at = text_or_null(r, row, 10),
    };
}

long ces_inspect_dead_letters(ces_inspect_t *in, const char *class, const char *table,
                              ces_dead_letter_fn fn, void *arg, char *errstr,
                              size_t errstr_size) {
    const char *params[2] = {class, table};
    PGresult *r = query(in, DEAD_LETTER_COLUMNS " FROM ",
                        ".dead_letters WHERE ($1::text IS NULL OR class = $1)"
                        " AND ($2::text IS NULL OR lower(source_table) = lower($2)) ORDER BY id",
                        2, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    for (int row = 0; row < PQntuples(r); row++) {
        ces_dead_letter_row_t dl;
        dead_letter_row(r, row, &dl);
        fn(arg, &dl);
    }
    long n = PQntuples(r);
    PQclear(r);
    return n;
}

int ces_inspect_dead_letter(ces_inspect_t *in, int64_t id, ces_dead_letter_fn fn, void *arg,
                            char *errstr, size_t errstr_size) {
    char idtext[24];
    snprintf(idtext, sizeof(idtext), "%lld", (long long)id);
    const char *params[1] = {idtext};
    PGresult *r = query(in, DEAD_LETTER_COLUMNS ", payload FROM ", ".dead_letters WHERE id = $1",
                        1, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    int found = PQntuples(r) > 0;
    if (found) {
        ces_dead_letter_row_t dl;
        dead_letter_row(r, 0, &dl);
        size_t len = 0;
        unsigned char *payload = NULL;
        if (!PQgetisnull(r, 0, 11) &&
            (payload = PQunescapeBytea((const unsigned char *)PQgetvalue(r, 0, 11), &len)) ==
                NULL) {
            snprintf(errstr, errstr_size, "out of memory");
            PQclear(r);
            return -1;
        }
        dl.payload = payload;
        dl.payload_len = len;
        fn(arg, &dl);
        PQfreemem(payload);
    }
    PQclear(r);
    return found;
}

long ces_inspect_dead_letter_ids(ces_inspect_t *in, const char *class, int64_t **ids,
                                 char *errstr, size_t errstr_size) {
    const char *params[1] = {class};
    *ids = NULL;
    PGresult *r = query(in, "SELECT id FROM ",
                        ".dead_letters WHERE ($1::text IS NULL OR class = $1) ORDER BY id", 1,
                        params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    long n = PQntuples(r);
    *ids = calloc((size_t)n + 1, sizeof(**ids));
    if (*ids == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        PQclear(r);
        return -1;
    }
    for (long i = 0; i < n; i++)
        (*ids)[i] = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
    PQclear(r);
    return n;
}

long ces_inspect_purge(ces_inspect_t *in, const char *before, bool is_interval, char *errstr,
                       size_t errstr_size) {
    const char *params[1] = {before};
    PGresult *r = query(in, "DELETE FROM ",
                        is_interval ? ".dead_letters WHERE created_at < now() - $1::interval"
                                    : ".dead_letters WHERE created_at < $1::timestamptz",
                        1, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    long n = strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return n;
}

int ces_inspect_now(ces_inspect_t *in, char *buf, size_t size, char *errstr, size_t errstr_size) {
    /* clock_timestamp(): now() would be the start of the session's transaction. */
    ces_pgerr_t e = CES_PGERR_INIT;
    PGresult *r = ces_session_query(in->session, "SELECT clock_timestamp()", 0, NULL, &e);
    if (r == NULL) {
        snprintf(errstr, errstr_size, "PostgreSQL: %s", e.message);
        return -1;
    }
    snprintf(buf, size, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return 0;
}

long ces_inspect_retire_skipped(ces_inspect_t *in, const int64_t *ids, size_t n, const char *since,
                                char *errstr, size_t errstr_size) {
    ces_strbuf_t list = {0};
    ces_strbuf_add(&list, "{");
    for (size_t i = 0; i < n; i++)
        ces_strbuf_addf(&list, "%s%lld", i ? "," : "", (long long)ids[i]);
    ces_strbuf_add(&list, "}");
    if (list.failed) {
        ces_strbuf_free(&list);
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    const char *params[2] = {list.buf, since};
    PGresult *r = query(in, "DELETE FROM ",
                        ".dead_letters WHERE id = ANY ($1::bigint[])"
                        " AND (retried_at IS NULL OR retried_at < $2::timestamptz)",
                        2, params, errstr, errstr_size);
    ces_strbuf_free(&list);
    if (r == NULL)
        return -1;
    long deleted = strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return deleted;
}

static int status_positions(ces_inspect_t *in, const ces_inspect_status_fns_t *fns, char *errstr,
                            size_t errstr_size) {
    const char *params[1] = {in->group_id};
    PGresult *r = query(in, "SELECT topic, partition, next_offset, updated_at FROM ",
                        ".offsets WHERE group_id = $1 ORDER BY topic, partition", 1, params,
                        errstr, errstr_size);
    if (r == NULL)
        return -1;
    for (int row = 0; row < PQntuples(r) && fns->position != NULL; row++) {
        ces_position_row_t p = {PQgetvalue(r, row, 0),
                                (int32_t)strtol(PQgetvalue(r, row, 1), NULL, 10),
                                strtoll(PQgetvalue(r, row, 2), NULL, 10), PQgetvalue(r, row, 3)};
        fns->position(fns->arg, &p);
    }
    PQclear(r);
    params[0] = in->group_id;
    r = query(in,
              "SELECT last_commit_lsn, last_commit_time, reorder_window_ms,"
              " extract(epoch FROM now() - updated_at) FROM ",
              ".progress WHERE group_id = $1", 1, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    ces_progress_row_t pr = {.found = PQntuples(r) > 0, .reorder_window_ms = -1};
    if (pr.found) {
        pr.last_commit_lsn = text_or_null(r, 0, 0);
        pr.last_commit_time = text_or_null(r, 0, 1);
        if (!PQgetisnull(r, 0, 2))
            pr.reorder_window_ms = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        pr.seconds_since_update = strtod(PQgetvalue(r, 0, 3), NULL);
    }
    if (fns->progress != NULL)
        fns->progress(fns->arg, &pr);
    PQclear(r);
    return 0;
}

int ces_inspect_status(ces_inspect_t *in, const ces_inspect_status_fns_t *fns, char *errstr,
                       size_t errstr_size) {
    if (status_positions(in, fns, errstr, errstr_size) != 0)
        return -1;
    PGresult *r = query(in,
                        "SELECT coalesce(class, 'unclassified'), count(*), max(created_at) FROM ",
                        ".dead_letters GROUP BY 1 ORDER BY 1", 0, NULL, errstr, errstr_size);
    if (r == NULL)
        return -1;
    for (int row = 0; row < PQntuples(r) && fns->dead_letters != NULL; row++) {
        ces_dead_letter_count_t c = {PQgetvalue(r, row, 0),
                                     strtoll(PQgetvalue(r, row, 1), NULL, 10),
                                     PQgetvalue(r, row, 2)};
        fns->dead_letters(fns->arg, &c);
    }
    PQclear(r);
    const char *params[1] = {in->group_id};
    r = query(in,
              "SELECT recorded_at, topic, partition, stored_position, resumed_at,"
              " coalesce(skipped_records, -1), reason FROM ",
              ".source_gaps WHERE group_id = $1 ORDER BY id", 1, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    for (int row = 0; row < PQntuples(r) && fns->gap != NULL; row++) {
        ces_gap_row_t g = {PQgetvalue(r, row, 0),
                           PQgetvalue(r, row, 1),
                           (int32_t)strtol(PQgetvalue(r, row, 2), NULL, 10),
                           strtoll(PQgetvalue(r, row, 3), NULL, 10),
                           strtoll(PQgetvalue(r, row, 4), NULL, 10),
                           strtoll(PQgetvalue(r, row, 5), NULL, 10),
                           PQgetvalue(r, row, 6)};
        fns->gap(fns->arg, &g);
    }
    PQclear(r);
    r = query(in,
              "SELECT holder, role, since, extract(epoch FROM clock_timestamp() - seen_at) FROM ",
              ".instances WHERE group_id = $1 AND seen_at > clock_timestamp() - interval '1 minute'"
              " ORDER BY role DESC, since",
              1, params, errstr, errstr_size);
    if (r == NULL)
        return -1;
    for (int row = 0; row < PQntuples(r) && fns->instance != NULL; row++) {
        ces_instance_row_t i = {PQgetvalue(r, row, 0), PQgetvalue(r, row, 1),
                                PQgetvalue(r, row, 2), strtod(PQgetvalue(r, row, 3), NULL)};
        fns->instance(fns->arg, &i);
    }
    PQclear(r);
    return 0;
}
