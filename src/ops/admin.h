/*
 * admin: the operator commands `ces2pg dead-letters`, `ces2pg status` and `ces2pg adopt`
 * (docs/architecture.md).
 *
 * They read and change the metadata schema through inspect.h, ask the brokers through
 * consumer.h, and print for people or, with --json, one JSON document (written with yajl's
 * generator). `dead-letters retry` runs the daemon's own pipeline over a feed of dead letters
 * (main.c wires it); this module provides that feed.
 */
#ifndef CES_ADMIN_H
#define CES_ADMIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "conf/config.h"
#include "format/event.h"
#include "input/feed.h"
#include "apply/inspect.h"

/* The topic a retried dead letter's record comes from: its offset is the dead letter's id. */
#define CES_ADMIN_RETRY_TOPIC "ces2pg.dead_letters"

/* `status`'s verdict, as its exit status (the monitoring-plugin convention). */
typedef enum {
    CES_ADMIN_OK = 0,
    CES_ADMIN_WARNING = 1,  /* dead letters or source gaps to look at, or a lag above --max-lag */
    CES_ADMIN_CRITICAL = 2, /* replication is not running, or has stalled with work to do */
    CES_ADMIN_UNKNOWN = 3,  /* PostgreSQL or the brokers could not be asked */
} ces_admin_health_t;

/* Prints the dead letters of class (NULL: any) and source table "schema.table" (NULL: any), a line
 * each or one JSON array. Returns 0, or -1 with errstr set. */
int ces_admin_list(ces_inspect_t *inspect, const char *class, const char *table, bool json,
                   FILE *out, char *errstr, size_t errstr_size);
/* Prints one dead letter with its record: as text when it is UTF-8 without NULs (a JSON record, fit
 * for `ces2pg replay`), else in base64 (the replay format of binary records). Returns 0, 1 when
 * there is no such dead letter, or -1. */
int ces_admin_show(ces_inspect_t *inspect, int64_t id, bool json, FILE *out, char *errstr,
                   size_t errstr_size);
/* Deletes the dead letters made before `before`: an age ("30 days", "12 hours") or a time
 * PostgreSQL reads ("2026-12-01", "2026-12-01 12:00+00"). Returns 0, or -1. */
int ces_admin_purge(ces_inspect_t *inspect, const char *before, FILE *out, char *errstr,
                    size_t errstr_size);

typedef struct ces_retry_feed_s ces_retry_feed_t;
/* A feed of the dead letters ids[0..n) (copied), each one record: its payload, from topic
 * CES_ADMIN_RETRY_TOPIC, partition 0, offset its id. inspect is a reference. NULL when out of
 * memory. */
ces_retry_feed_t *ces_retry_feed_new(ces_inspect_t *inspect, const int64_t *ids, size_t n);
void ces_retry_feed_destroy(ces_retry_feed_t *feed);
void ces_retry_feed(ces_retry_feed_t *retry, ces_feed_t *feed);
/* The ids the feed has handed to the pipeline so far (those found in the table), in order, *n of
 * them. The array is the feed's. */
const int64_t *ces_retry_feed_handed(const ces_retry_feed_t *retry, size_t *n);

typedef struct {
    bool json;
    int64_t stale_after_s; /* with lag, a last commit older than this is a stall (CRITICAL) */
    int64_t max_lag;       /* records; more is a WARNING (0: no limit) */
} ces_admin_status_options_t;

/* Reports per partition the stored position, the broker's high watermark and the lag; the group's
 * members; the last commit applied and the reorder window in force; dead letters by class; source
 * gaps. Returns the verdict (the exit status). */
ces_admin_health_t ces_admin_status(const ces_config_t *config,
                                    const ces_admin_status_options_t *options, FILE *out,
                                    FILE *err);

/*
 * `adopt`: marks the tables named in tables[0..ntables) ("SCHEMA.TABLE", folded as ces2pg folds
 * target names), or with none every table of the schema schema.target names (every schema but
 * PostgreSQL's own and the metadata schema when its schema part has a placeholder), with the
 * version of lsn (adopt.h). Prints a line per table and a total; a table without a primary key is
 * an error when named, and reported when found. Returns the exit status: 0, or 1 when a table
 * could not be adopted.
 */
int ces_admin_adopt(const ces_config_t *config, char *const *tables, size_t ntables,
                    ces_lsn_t lsn, FILE *out, FILE *err);

#endif
