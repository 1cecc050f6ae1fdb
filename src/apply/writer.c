#include "apply/writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply/metadata.h"
#include "apply/session.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/strbuf.h"

struct ces_writer_s {
    ces_writer_options_t o; /* strings owned */
    ces_metadata_t *metadata;
    ces_session_t *session; /* of its own: the advisory lock lives as long as it does */
    uint64_t session_epoch; /* of the session the statements were made for */
    bool locked;            /* this session holds the advisory lock */
    int64_t epoch;
    int64_t window_ms; /* the stream's last stored reorder window when the role was taken; -1 */
    char lease_ms[24];
    char epoch_text[24];
    char *sql_take, *sql_renew, *sql_release, *sql_seen, *sql_announce, *sql_leave;
    const char *announced; /* the role last written into instances ("writer", "standby") */
    int64_t announced_ms;
    char seen[256];
};

/* The advisory lock of a group: two keys, so that no other user of hashtext(group) meets it. */
#define LOCK_KEYS "hashtext('ces2pg writer'), hashtext($1)"

static void free_sql(ces_writer_t *w) {
    free(w->sql_take);
    free(w->sql_renew);
    free(w->sql_release);
    free(w->sql_seen);
    free(w->sql_announce);
    free(w->sql_leave);
    w->sql_take = w->sql_renew = w->sql_release = w->sql_seen = NULL;
    w->sql_announce = w->sql_leave = NULL;
}

void ces_writer_destroy(ces_writer_t *w) {
    if (w == NULL)
        return;
    ces_session_destroy(w->session);
    ces_metadata_destroy(w->metadata);
    free_sql(w);
    free((char *)w->o.conninfo);
    if (w->o.password != NULL)
        explicit_bzero((char *)w->o.password, strlen(w->o.password));
    free((char *)w->o.password);
    free((char *)w->o.metadata_schema);
    free((char *)w->o.version_column);
    free((char *)w->o.group_id);
    free((char *)w->o.holder);
    free(w);
}

ces_writer_t *ces_writer_new(const ces_writer_options_t *o) {
    ces_writer_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->window_ms = -1;
    w->o = *o;
    w->o.conninfo = strdup(o->conninfo);
    w->o.password = o->password ? strdup(o->password) : NULL;
    w->o.metadata_schema = strdup(o->metadata_schema);
    w->o.version_column = strdup(o->version_column);
    w->o.group_id = strdup(o->group_id);
    w->o.holder = strdup(o->holder);
    snprintf(w->lease_ms, sizeof(w->lease_ms), "%lld", (long long)o->lease_ms);
    w->metadata = ces_metadata_new(o->metadata_schema, o->version_column);
    if (w->o.conninfo == NULL || (o->password && w->o.password == NULL) ||
        w->o.metadata_schema == NULL || w->o.version_column == NULL || w->o.group_id == NULL ||
        w->o.holder == NULL || w->metadata == NULL) {
        ces_writer_destroy(w);
        return NULL;
    }
    return w;
}

static char *join(const char *a, const char *schema, const char *b, const char *schema2,
                  const char *c) {
    ces_strbuf_t s = {0};
    ces_strbuf_add(&s, a);
    ces_strbuf_add(&s, schema);
    ces_strbuf_add(&s, b);
    if (schema2 != NULL) {
        ces_strbuf_add(&s, schema2);
        ces_strbuf_add(&s, c);
    }
    if (s.failed) {
        ces_strbuf_free(&s);
        return NULL;
    }
    return s.buf;
}

/* The statements, for the session's quoting of the metadata schema. */
static int make_sql(ces_writer_t *w) {
    const char *q = ces_metadata_schema_quoted(w->metadata);
    free_sql(w);
    /* Taken when the writer's lease ran out, or when this session got the advisory lock the
     * writer held (its session is gone), or when the role was given up (-infinity). $4: got the
     * lock. */
    w->sql_take = join(
        "INSERT INTO ", q,
        ".writers AS w (group_id, holder, epoch, renewed_at, lease_ms, locked, since)"
        " VALUES ($1, $2, 1, clock_timestamp(), $3, $4, clock_timestamp())"
        " ON CONFLICT (group_id) DO UPDATE SET holder = EXCLUDED.holder, epoch = w.epoch + 1,"
        " renewed_at = EXCLUDED.renewed_at, lease_ms = EXCLUDED.lease_ms,"
        " locked = EXCLUDED.locked, since = EXCLUDED.since"
        " WHERE ($4 AND w.locked)"
        "  OR w.renewed_at + w.lease_ms * interval '1 millisecond' < clock_timestamp()"
        " RETURNING epoch, (SELECT reorder_window_ms FROM ",
        q, ".progress WHERE group_id = $1)");
    w->sql_renew = join("UPDATE ", q,
                        ".writers SET renewed_at = clock_timestamp(), locked = $4"
                        " WHERE group_id = $1 AND holder = $2 AND epoch = $3",
                        NULL, NULL);
    w->sql_release = join("UPDATE ", q,
                          ".writers SET renewed_at = '-infinity'"
                          " WHERE group_id = $1 AND holder = $2 AND epoch = $3",
                          NULL, NULL);
    w->sql_seen = join("SELECT holder || ' (epoch ' || epoch || ') since ' ||"
                       " to_char(since, 'YYYY-MM-DD HH24:MI:SS TZ') FROM ",
                       q, ".writers WHERE group_id = $1", NULL, NULL);
    w->sql_announce = join(
        "INSERT INTO ", q,
        ".instances AS i (group_id, holder, role, since, seen_at)"
        " VALUES ($1, $2, $3, clock_timestamp(), clock_timestamp())"
        " ON CONFLICT (group_id, holder) DO UPDATE SET role = EXCLUDED.role, seen_at ="
        " EXCLUDED.seen_at, since = CASE WHEN i.role = EXCLUDED.role THEN i.since"
        " ELSE EXCLUDED.since END",
        NULL, NULL);
    w->sql_leave = join("DELETE FROM ", q, ".instances WHERE group_id = $1 AND holder = $2", NULL,
                        NULL);
    w->announced = NULL;
    return w->sql_take && w->sql_renew && w->sql_release && w->sql_seen && w->sql_announce &&
                   w->sql_leave
               ? 0
               : -1;
}

/* The session, connected, with its statements. Returns 0, or -1 with errstr set. */
static int connected(ces_writer_t *w, char *errstr, size_t errstr_size) {
    if (w->session != NULL && ces_session_connected(w->session) &&
        ces_session_epoch(w->session) == w->session_epoch)
        return 0;
    w->locked = false; /* a new session holds no lock */
    ces_pgerr_t e = CES_PGERR_INIT;
    if (w->session != NULL) {
        if (ces_session_connect_once(w->session, &e) != 0) {
            snprintf(errstr, errstr_size, "%s", e.message);
            return -1;
        }
    } else {
        w->session = ces_metadata_connect(w->metadata, w->o.conninfo, w->o.password,
                                          &w->o.password_token, errstr, errstr_size);
        if (w->session == NULL)
            return -1;
    }
    /* A renewal waits behind a batch that holds the row (the batch renews it too): not long. */
    if (ces_session_exec(w->session, "SET lock_timeout = '500ms'", &e) != 0 ||
        make_sql(w) != 0) {
        snprintf(errstr, errstr_size, "%s", e.message[0] ? e.message : "out of memory");
        ces_session_disconnect(w->session);
        return -1;
    }
    w->session_epoch = ces_session_epoch(w->session);
    return 0;
}

/* One statement; its result (owned by the caller), or NULL with errstr set. */
static PGresult *query(ces_writer_t *w, const char *sql, int n, const char *const *params,
                       char *errstr, size_t errstr_size) {
    ces_pgerr_t e = CES_PGERR_INIT;
    PGresult *r = ces_session_query(w->session, sql, n, params, &e);
    if (r == NULL) {
        snprintf(errstr, errstr_size, "%s", e.message);
        if (!ces_session_connected(w->session))
            ces_session_disconnect(w->session);
    }
    return r;
}

/* Takes the advisory lock when this session does not hold it yet. Returns 0, or -1. */
static int lock(ces_writer_t *w, char *errstr, size_t errstr_size) {
    if (w->locked)
        return 0;
    const char *params[1] = {w->o.group_id};
    PGresult *r = query(w, "SELECT pg_try_advisory_lock(" LOCK_KEYS ")", 1, params, errstr,
                        errstr_size);
    if (r == NULL)
        return -1;
    w->locked = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return 0;
}

static void unlock(ces_writer_t *w) {
    if (!w->locked)
        return;
    const char *params[1] = {w->o.group_id};
    char err[256];
    PGresult *r = query(w, "SELECT pg_advisory_unlock(" LOCK_KEYS ")", 1, params, err, sizeof(err));
    PQclear(r);
    w->locked = false;
}

/* Writes this instance's role into instances when it changed, and every few seconds anyway (its
 * seen_at tells `status` it is alive). Best effort. */
static void announce(ces_writer_t *w, const char *role) {
    enum { EVERY_MS = 5000 };
    int64_t now = ces_clock_now_ms();
    if (w->announced == role && now - w->announced_ms < EVERY_MS)
        return;
    const char *params[3] = {w->o.group_id, w->o.holder, role};
    char err[256];
    PGresult *r = query(w, w->sql_announce, 3, params, err, sizeof(err));
    if (r != NULL) {
        w->announced = role;
        w->announced_ms = now;
    }
    PQclear(r);
}

static void remember_seen(ces_writer_t *w) {
    const char *params[1] = {w->o.group_id};
    char err[256];
    PGresult *r = query(w, w->sql_seen, 1, params, err, sizeof(err));
    snprintf(w->seen, sizeof(w->seen), "%s",
             r != NULL && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
}

/* The role is another instance's: this session gives the lock up (a writer that took over by its
 * lease may not hold it yet) and remembers who writes, for messages. */
static ces_writer_role_t standing_by(ces_writer_t *w) {
    unlock(w);
    remember_seen(w);
    return CES_WRITER_STANDBY;
}

ces_writer_role_t ces_writer_try(ces_writer_t *w, char *errstr, size_t errstr_size) {
    if (connected(w, errstr, errstr_size) != 0 || lock(w, errstr, errstr_size) != 0)
        return CES_WRITER_UNKNOWN;
    const char *params[4] = {w->o.group_id, w->o.holder, w->lease_ms, w->locked ? "t" : "f"};
    PGresult *r = query(w, w->sql_take, 4, params, errstr, errstr_size);
    if (r == NULL)
        return CES_WRITER_UNKNOWN;
    bool took = PQntuples(r) == 1;
    if (took) {
        w->epoch = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        w->window_ms = PQgetisnull(r, 0, 1) ? -1 : strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    }
    PQclear(r);
    if (!took) {
        announce(w, "standby");
        return standing_by(w);
    }
    snprintf(w->epoch_text, sizeof(w->epoch_text), "%lld", (long long)w->epoch);
    announce(w, "writer");
    return CES_WRITER_WRITER;
}

ces_writer_role_t ces_writer_renew(ces_writer_t *w, char *errstr, size_t errstr_size) {
    if (connected(w, errstr, errstr_size) != 0 || lock(w, errstr, errstr_size) != 0)
        return CES_WRITER_UNKNOWN;
    const char *params[4] = {w->o.group_id, w->o.holder, w->epoch_text, w->locked ? "t" : "f"};
    PGresult *r = query(w, w->sql_renew, 4, params, errstr, errstr_size);
    if (r == NULL)
        return CES_WRITER_UNKNOWN;
    bool held = strcmp(PQcmdTuples(r), "1") == 0;
    PQclear(r);
    if (!held)
        return standing_by(w);
    announce(w, "writer");
    return CES_WRITER_WRITER;
}

void ces_writer_release(ces_writer_t *w) {
    char err[256];
    if (w->epoch == 0 || connected(w, err, sizeof(err)) != 0)
        return;
    const char *params[3] = {w->o.group_id, w->o.holder, w->epoch_text};
    PGresult *r = query(w, w->sql_release, 3, params, err, sizeof(err));
    PQclear(r);
    unlock(w);
}

void ces_writer_leave(ces_writer_t *w) {
    char err[256];
    if (w->session == NULL || connected(w, err, sizeof(err)) != 0)
        return;
    const char *params[2] = {w->o.group_id, w->o.holder};
    PGresult *r = query(w, w->sql_leave, 2, params, err, sizeof(err));
    PQclear(r);
}

int64_t ces_writer_epoch(const ces_writer_t *w) { return w->epoch; }

int64_t ces_writer_window_ms(const ces_writer_t *w) { return w->window_ms; }

const char *ces_writer_seen(const ces_writer_t *w) { return w->seen; }
