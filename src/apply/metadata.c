#include "apply/metadata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/strbuf.h"

struct ces_metadata_s {
    char *schema;
    char *version_column;
    /* Made by ces_metadata_setup, for its connection. */
    char *schema_quoted;
    char *tombstones;
    char *version_quoted;
    /* Statements on the metadata tables (see metadata.h). */
    char *sql_dead_letter;
    char *sql_dead_letter_again;
    char *sql_dead_letters_retired;
    char *sql_progress;
};

ces_metadata_t *ces_metadata_new(const char *schema, const char *version_column) {
    ces_metadata_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->schema = strdup(schema);
    m->version_column = strdup(version_column);
    if (m->schema == NULL || m->version_column == NULL) {
        ces_metadata_destroy(m);
        return NULL;
    }
    return m;
}

static void forget_names(ces_metadata_t *m) {
    free(m->schema_quoted);
    free(m->tombstones);
    free(m->version_quoted);
    free(m->sql_dead_letter);
    free(m->sql_dead_letter_again);
    free(m->sql_dead_letters_retired);
    free(m->sql_progress);
    m->schema_quoted = m->tombstones = m->version_quoted = NULL;
    m->sql_dead_letter = m->sql_dead_letter_again = m->sql_dead_letters_retired = NULL;
    m->sql_progress = NULL;
}

void ces_metadata_destroy(ces_metadata_t *m) {
    if (m == NULL)
        return;
    forget_names(m);
    free(m->schema);
    free(m->version_column);
    free(m);
}

static void add_ddl(ces_strbuf_t *sql, const char *schema) {
    ces_strbuf_add(sql, "CREATE SCHEMA IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ";\nCREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".offsets (\n"
                        "  group_id text NOT NULL,\n"
                        "  topic text NOT NULL,\n"
                        "  partition integer NOT NULL,\n"
                        "  next_offset bigint NOT NULL,\n"
                        "  updated_at timestamptz NOT NULL DEFAULT now(),\n"
                        "  PRIMARY KEY (group_id, topic, partition));\n"
                        "CREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".dead_letters (\n"
                        "  id bigserial PRIMARY KEY,\n"
                        "  created_at timestamptz NOT NULL DEFAULT now(),\n"
                        "  topic text,\n"
                        "  partition integer,\n"
                        "  \"offset\" bigint,\n"
                        "  reason text NOT NULL,\n"
                        "  logicalid text,\n"
                        "  payload bytea,\n"
                        "  class text,\n"
                        "  source_table text,\n"
                        "  retried_at timestamptz);\n"
                        /* Dead-letter tables made before ces2pg classed and retried them. */
                        "ALTER TABLE ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".dead_letters ADD COLUMN IF NOT EXISTS class text,"
                        " ADD COLUMN IF NOT EXISTS source_table text,"
                        " ADD COLUMN IF NOT EXISTS retried_at timestamptz;\n"
                        "CREATE INDEX IF NOT EXISTS dead_letters_class ON ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".dead_letters (class);\n"
                        "CREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".tombstones (\n"
                        "  relid oid NOT NULL,\n"
                        "  key text[] NOT NULL,\n"
                        "  version numeric NOT NULL,\n"
                        "  deleted_at timestamptz NOT NULL DEFAULT now(),\n"
                        "  PRIMARY KEY (relid, key));\n"
                        "CREATE INDEX IF NOT EXISTS tombstones_deleted_at ON ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".tombstones (deleted_at);\n"
                        "CREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".source_gaps (\n"
                        "  id bigserial PRIMARY KEY,\n"
                        "  recorded_at timestamptz NOT NULL DEFAULT now(),\n"
                        "  group_id text NOT NULL,\n"
                        "  topic text NOT NULL,\n"
                        "  partition integer NOT NULL,\n"
                        "  stored_position bigint NOT NULL,\n"
                        "  resumed_at bigint NOT NULL,\n"
                        "  skipped_records bigint,\n"
                        "  reason text NOT NULL);\n"
                        "CREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".progress (\n"
                        "  group_id text PRIMARY KEY,\n"
                        "  last_commit_lsn text,\n"
                        "  last_commit_time timestamptz,\n"
                        "  reorder_window_ms bigint,\n"
                        "  updated_at timestamptz NOT NULL DEFAULT now());\n"
                        "CREATE TABLE IF NOT EXISTS ");
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".adoptions (\n"
                        "  relid oid PRIMARY KEY,\n"
                        "  table_name text NOT NULL,\n"
                        "  lsn text NOT NULL,\n"
                        "  version numeric NOT NULL,\n"
                        "  adopted_at timestamptz NOT NULL DEFAULT now());\n"
                        "CREATE TABLE IF NOT EXISTS ");
    /* The writer of each group in transaction order (apply/writer.h): one row a group. */
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".writers (\n"
                        "  group_id text PRIMARY KEY,\n"
                        "  holder text NOT NULL,\n"
                        "  epoch bigint NOT NULL,\n"
                        "  renewed_at timestamptz NOT NULL,\n"
                        "  lease_ms integer NOT NULL,\n"
                        "  locked boolean NOT NULL,\n"
                        "  since timestamptz NOT NULL DEFAULT now());\n"
                        "CREATE TABLE IF NOT EXISTS ");
    /* Every instance of a group in transaction order, writer or standby, for `ces2pg status`. */
    ces_strbuf_add(sql, schema);
    ces_strbuf_add(sql, ".instances (\n"
                        "  group_id text NOT NULL,\n"
                        "  holder text NOT NULL,\n"
                        "  role text NOT NULL,\n"
                        "  since timestamptz NOT NULL,\n"
                        "  seen_at timestamptz NOT NULL,\n"
                        "  PRIMARY KEY (group_id, holder));\n");
}

/* One statement naming the schema: prefix, the quoted schema, suffix. NULL when out of memory. */
static char *statement(const char *prefix, const char *schema, const char *suffix) {
    ces_strbuf_t sql = {0};
    ces_strbuf_add(&sql, prefix);
    ces_strbuf_add(&sql, schema);
    ces_strbuf_add(&sql, suffix);
    if (sql.failed) {
        ces_strbuf_free(&sql);
        return NULL;
    }
    return sql.buf;
}

/* The quoted names and the dead-letter statement, for the session's connection. */
static int make_names(ces_metadata_t *m, const ces_session_t *session) {
    forget_names(m);
    m->schema_quoted = ces_session_quote(session, m->schema);
    m->version_quoted = ces_session_quote(session, m->version_column);
    if (m->schema_quoted == NULL || m->version_quoted == NULL)
        return -1;
    m->tombstones = malloc(strlen(m->schema_quoted) + sizeof(".tombstones"));
    if (m->tombstones == NULL)
        return -1;
    sprintf(m->tombstones, "%s.tombstones", m->schema_quoted);
    const char *q = m->schema_quoted;
    m->sql_dead_letter = statement(
        "INSERT INTO ", q,
        ".dead_letters (topic, partition, \"offset\", reason, logicalid, payload, class,"
        " source_table) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)");
    m->sql_dead_letter_again = statement(
        "UPDATE ", q,
        ".dead_letters SET reason = $1, class = $2, source_table = coalesce($3, source_table),"
        " retried_at = now() WHERE id = ANY ($4::bigint[])");
    m->sql_dead_letters_retired =
        statement("DELETE FROM ", q, ".dead_letters WHERE id = ANY ($1::bigint[])");
    m->sql_progress = statement(
        "INSERT INTO ", q,
        ".progress AS p (group_id, last_commit_lsn, last_commit_time, reorder_window_ms)"
        " VALUES ($1, $2, to_timestamp($3::double precision), $4) ON CONFLICT (group_id) DO"
        " UPDATE SET last_commit_lsn = coalesce(EXCLUDED.last_commit_lsn, p.last_commit_lsn),"
        " last_commit_time = coalesce(EXCLUDED.last_commit_time, p.last_commit_time),"
        " reorder_window_ms = EXCLUDED.reorder_window_ms, updated_at = now()");
    return m->sql_dead_letter && m->sql_dead_letter_again && m->sql_dead_letters_retired &&
                   m->sql_progress
               ? 0
               : -1;
}

int ces_metadata_setup(ces_metadata_t *m, ces_session_t *session, ces_pgerr_t *e) {
    ces_strbuf_t sql = {0};
    int rc = -1;
    if (make_names(m, session) != 0) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        goto done;
    }
    add_ddl(&sql, m->schema_quoted);
    if (sql.failed) {
        ces_pgerr_set(e, CES_PGERR_FATAL, -1, NULL, "out of memory");
        goto done;
    }
    /* Two instances may race to create the schema: the loser runs it again to create the rest. */
    if (ces_session_exec_ddl(session, sql.buf, e) != 0 ||
        ces_session_exec_ddl(session, sql.buf, e) != 0)
        goto done;
    rc = 0;
done:
    ces_strbuf_free(&sql);
    return rc;
}

static int setup_on_connect(void *opaque, ces_session_t *session, ces_pgerr_t *e) {
    return ces_metadata_setup(opaque, session, e);
}

ces_session_t *ces_metadata_connect(ces_metadata_t *m, const char *conninfo, const char *password,
                                    const ces_token_source_t *password_token, char *errstr,
                                    size_t errstr_size) {
    ces_session_options_t so = {.conninfo = conninfo,
                                .password = password,
                                .password_token = password_token ? *password_token
                                                                 : (ces_token_source_t){0},
                                .on_connect = setup_on_connect,
                                .on_connect_opaque = m};
    ces_session_t *session = ces_session_new(&so);
    if (session == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    ces_pgerr_t e = CES_PGERR_INIT;
    if (ces_session_connect_once(session, &e) != 0) {
        snprintf(errstr, errstr_size, "%s", e.message);
        ces_session_destroy(session);
        return NULL;
    }
    return session;
}

const char *ces_metadata_schema_quoted(const ces_metadata_t *m) { return m->schema_quoted; }
const char *ces_metadata_tombstones(const ces_metadata_t *m) { return m->tombstones; }
const char *ces_metadata_version_quoted(const ces_metadata_t *m) { return m->version_quoted; }
const char *ces_metadata_dead_letter_sql(const ces_metadata_t *m) { return m->sql_dead_letter; }
const char *ces_metadata_dead_letter_again_sql(const ces_metadata_t *m) {
    return m->sql_dead_letter_again;
}
const char *ces_metadata_dead_letters_retired_sql(const ces_metadata_t *m) {
    return m->sql_dead_letters_retired;
}
const char *ces_metadata_progress_sql(const ces_metadata_t *m) { return m->sql_progress; }
