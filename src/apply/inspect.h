/*
 * inspect: what an operator asks of the metadata schema (`ces2pg dead-letters`, `ces2pg status`).
 *
 * Part of the apply room (it talks to PostgreSQL through a session of its own), for the operator
 * commands only: the daemon never calls it. Connecting runs the metadata schema's idempotent DDL, as
 * the daemon does, so that a schema made by an older ces2pg has the columns asked for here. Rows are
 * handed to callbacks; their strings are owned by the inspector and valid during the call only.
 */
#ifndef CES_INSPECT_H
#define CES_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/token.h"

typedef struct ces_inspect_s ces_inspect_t;

typedef struct {
    const char *conninfo;
    const char *password; /* may be NULL (a secret) */
    const char *metadata_schema;
    const char *version_column;
    const char *group_id;
    ces_token_source_t password_token; /* instead of password when its fetch is set (session.h) */
} ces_inspect_options_t;

/* Connects (no retry). Returns the inspector, or NULL with errstr set. Owned by the caller. */
ces_inspect_t *ces_inspect_open(const ces_inspect_options_t *options, char *errstr,
                                size_t errstr_size) __attribute__((warn_unused_result));
void ces_inspect_close(ces_inspect_t *inspect);

/* One row of the dead-letter table. payload is set by ces_inspect_dead_letter only. */
typedef struct {
    int64_t id;
    const char *created_at; /* text, as PostgreSQL prints timestamptz */
    const char *class;      /* NULL for rows made before ces2pg classed them */
    const char *source_table;
    const char *topic;
    int32_t partition;
    int64_t offset;
    const char *reason;
    const char *logicalid; /* may be NULL */
    const char *retried_at; /* when a retry last failed on it; NULL: never retried */
    const unsigned char *payload;
    size_t payload_len;
} ces_dead_letter_row_t;

typedef void (*ces_dead_letter_fn)(void *arg, const ces_dead_letter_row_t *row);

/* Calls fn for every dead letter of class (NULL: any) and source table (NULL: any), oldest first.
 * Returns the number of rows, or -1 with errstr set. */
long ces_inspect_dead_letters(ces_inspect_t *inspect, const char *class, const char *table,
                              ces_dead_letter_fn fn, void *arg, char *errstr, size_t errstr_size);
/* Calls fn with dead letter id, payload included. Returns 1, 0 when there is no such row, or -1. */
int ces_inspect_dead_letter(ces_inspect_t *inspect, int64_t id, ces_dead_letter_fn fn, void *arg,
                            char *errstr, size_t errstr_size);
/* The ids of the dead letters of class (NULL: any), oldest first, into a new array (*ids, free it).
 * Returns their number, or -1. */
long ces_inspect_dead_letter_ids(ces_inspect_t *inspect, const char *class, int64_t **ids,
                                 char *errstr, size_t errstr_size);
/* Deletes the dead letters made before `before`: a time PostgreSQL reads as timestamptz, or, when
 * is_interval, an age (an interval such as "30 days"). Returns how many, or -1. */
long ces_inspect_purge(ces_inspect_t *inspect, const char *before, bool is_interval,
                       char *errstr, size_t errstr_size);

/* The server's clock, as timestamptz text, into buf. Returns 0, or -1 with errstr set. */
int ces_inspect_now(ces_inspect_t *inspect, char *buf, size_t size, char *errstr,
                    size_t errstr_size);
/* After a retry that ran to its end: deletes the dead letters among ids[0..n) that the retry
 * neither applied (those left with their batch) nor dead-lettered again since `since` (a time from
 * ces_inspect_now before it began). They are the records the pipeline skipped: duplicates of
 * records applied, or events of tables the configuration excludes. Returns how many, or -1. */
long ces_inspect_retire_skipped(ces_inspect_t *inspect, const int64_t *ids, size_t n,
                                const char *since, char *errstr, size_t errstr_size);

/* What `status` reports from PostgreSQL. */
typedef struct {
    const char *topic;
    int32_t partition;
    int64_t next_offset; /* the stored position */
    const char *updated_at;
} ces_position_row_t;

typedef struct {
    bool found; /* the group has applied something */
    const char *last_commit_lsn;
    const char *last_commit_time;
    int64_t reorder_window_ms; /* -1: unknown (partition mode) */
    double seconds_since_update; /* how long ago the last batch committed */
} ces_progress_row_t;

typedef struct {
    const char *class; /* "unclassified" for rows made before ces2pg classed them */
    int64_t count;
    const char *newest; /* created_at of the newest */
} ces_dead_letter_count_t;

typedef struct {
    const char *recorded_at;
    const char *topic;
    int32_t partition;
    int64_t stored_position;
    int64_t resumed_at;
    int64_t skipped_records; /* -1: unknown */
    const char *reason;
} ces_gap_row_t;

/* An instance of the group in transaction order, seen in the last minute. */
typedef struct {
    const char *holder;
    const char *role; /* "writer" or "standby" */
    const char *since;
    double seen_seconds_ago;
} ces_instance_row_t;

typedef struct {
    void (*position)(void *arg, const ces_position_row_t *row);
    void (*progress)(void *arg, const ces_progress_row_t *row);
    void (*dead_letters)(void *arg, const ces_dead_letter_count_t *row);
    void (*gap)(void *arg, const ces_gap_row_t *row);
    void *arg;
    void (*instance)(void *arg, const ces_instance_row_t *row);
} ces_inspect_status_fns_t;

/* Reports the group's stored positions, its progress, the dead letters by class and the source
 * gaps recorded, through fns (members may be NULL). Returns 0, or -1 with errstr set. */
int ces_inspect_status(ces_inspect_t *inspect, const ces_inspect_status_fns_t *fns, char *errstr,
                       size_t errstr_size);

#endif
