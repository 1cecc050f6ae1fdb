/*
 * metrics: what /metrics, /healthz, /readyz and the progress line report.
 *
 * The main loop writes, the HTTP server's thread reads. Counters that need a walk over a batch (events
 * applied per operation and table, dead letters per reason, batch durations) are added once per
 * committed batch; gauges (positions, lag, what is held in memory) are copied once per loop turn
 * at most every 100 ms; both under one mutex, never per event. Liveness (the loop's last turn),
 * the PostgreSQL connection, retries and the assignment are atomics, so that /healthz and /readyz
 * never wait for the main loop.
 *
 * Label cardinality is bounded: at most CES_METRICS_MAX_TABLES tables are tracked by name, the rest
 * count under table="other"; dead letters count by the class they were made with (batch.h).
 */
#ifndef CES_METRICS_H
#define CES_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "order/batch.h"
#include "pipeline/pipeline.h"

#define CES_METRICS_MAX_TABLES 1000

typedef struct ces_metrics_s ces_metrics_t;

/* One assigned partition, for the lag gauges. */
typedef struct {
    const char *topic; /* reference, copied by ces_metrics_set_partitions */
    int32_t partition;
    int64_t position; /* next offset to apply (stored in PostgreSQL), or -1 when not known */
    int64_t high;     /* high watermark, or -1 when not known yet */
} ces_metrics_partition_t;

/* What the progress line says, read by the main loop. */
typedef struct {
    int64_t lag;            /* sum of the partitions' lag (records not yet applied) */
    double delay_seconds;   /* replication delay at the last commit; < 0 when unknown */
    uint64_t dead_letters;  /* total */
} ces_metrics_summary_t;

/* NULL when out of memory. */
/* The two sides that log in (Microsoft Entra tokens are counted by side). */
typedef enum { CES_METRICS_KAFKA = 0, CES_METRICS_POSTGRES, CES_METRICS_NSIDES } ces_metrics_side_t;

/* An instance's part in transaction order's one-writer rule (none in partition order). */
typedef enum {
    CES_METRICS_ROLE_NONE = 0,
    CES_METRICS_ROLE_WRITER,
    CES_METRICS_ROLE_STANDBY,
} ces_metrics_role_t;

ces_metrics_t *ces_metrics_new(void);
void ces_metrics_destroy(ces_metrics_t *metrics);

/* Microsoft Entra tokens, from any thread: side logs in with them (its series appear), a token
 * was fetched that expires at expires_at_ms (since the epoch), a fetch failed. */
void ces_metrics_token_used(ces_metrics_t *metrics, ces_metrics_side_t side);
void ces_metrics_token_fetched(ces_metrics_t *metrics, ces_metrics_side_t side,
                               int64_t expires_at_ms);
void ces_metrics_token_failed(ces_metrics_t *metrics, ces_metrics_side_t side);

/* Any thread: the writer role (a standby is ready while PostgreSQL is connected), its epoch, and
 * the partitions of the subscribed topics the writer does not own (-1: unknown). */
void ces_metrics_set_role(ces_metrics_t *metrics, ces_metrics_role_t role, int64_t epoch);
ces_metrics_role_t ces_metrics_role(const ces_metrics_t *metrics);
void ces_metrics_set_unowned(ces_metrics_t *metrics, int64_t partitions);

/* A batch was applied (items are now events applied or dead letters) in seconds. Reads the commit
 * time of its last event (the envelope's time) once. Main loop. */
void ces_metrics_add_batch(ces_metrics_t *metrics, const ces_batch_t *batch, double seconds);

/* The pipeline's counters and gauges, and the partitions (copied). Main loop. */
void ces_metrics_set_stats(ces_metrics_t *metrics, const ces_pipeline_stats_t *stats,
                           const ces_metrics_partition_t *partitions, size_t npartitions);

/* Liveness and readiness (any thread, lock-free). now_ms is ces_clock_now_ms(). */
void ces_metrics_heartbeat(ces_metrics_t *metrics, int64_t now_ms);
void ces_metrics_set_connected(ces_metrics_t *metrics, bool connected);
void ces_metrics_set_assigned(ces_metrics_t *metrics, size_t partitions);
/* ces_consumer_fetch_wakeups(), for its counter. */
void ces_metrics_set_fetch_wakeups(ces_metrics_t *metrics, uint64_t wakeups);
/* A retry of reason (one of CES_APPLY_RETRY_REASONS, apply.h; another counts as "unknown") begins
 * its wait: counted, and the retries since the last progress make one stretch from the first.
 * reason NULL: something succeeded, the stretch ended. Any thread, lock-free. */
void ces_metrics_retrying(ces_metrics_t *metrics, const char *reason, int64_t now_ms);
/* The loop turned within max_age_ms, and no stretch of retries has lasted longer than that: a
 * retry beats the heart (the loop is not stuck) but is no progress. */
bool ces_metrics_alive(const ces_metrics_t *metrics, int64_t now_ms, int64_t max_age_ms);
/* PostgreSQL is connected, partitions are assigned, and no retry is under way. */
bool ces_metrics_ready(const ces_metrics_t *metrics);

void ces_metrics_summary(ces_metrics_t *metrics, ces_metrics_summary_t *summary);

/*
 * Writes the Prometheus text exposition format (version 0.0.4) into a new buffer (*out, *len; free
 * it). Returns 0, or -1 when out of memory. Any thread.
 */
int ces_metrics_render(ces_metrics_t *metrics, char **out, size_t *len);

#endif
