/*
 * daemon: the stages built from the configuration, and the loop's hooks (daemon.h).
 */
#include "daemon.h"

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "apply/writer.h"
#include "input/consumer.h"
#include "ops/http.h"
#include "ops/metrics.h"
#include "ops/notify.h"
#include "util/array.h"
#include "util/clock.h"
#include "util/log.h"

#ifndef CES2PG_VERSION
#define CES2PG_VERSION "0.0.0"
#endif

/* How often the loop's hook copies the gauges for /metrics (never per event). */
#define METRICS_PUBLISH_MS 100

void ces_daemon_decode_limits(const ces_config_t *c, ces_decode_limits_t *l) {
    if (ces_decode_format_parse(c->kafka_format, &l->format) != 0) /* validated by config.c */
        l->format = CES_FORMAT_AUTO;
    l->max_record_bytes = (size_t)c->decode_max_record_bytes;
    l->max_event_bytes = (size_t)c->decode_max_event_bytes;
    l->max_depth = (size_t)c->decode_max_depth;
    l->max_columns = (size_t)c->decode_max_columns;
    l->max_value_bytes = (size_t)c->decode_max_value_bytes;
}

/* decode.threads = 0: one per two CPUs the process may run on (its affinity, which a container's
 * cpuset sets), at least 1 and at most 4. The other half is left to librdkafka's threads and to
 * the PostgreSQL beside ces2pg: on two CPUs shared with both, a second decoding thread costs more
 * CPU than it saves (bench/NOTES.md). */
static size_t decode_threads(const ces_config_t *c) {
    if (c->decode_threads > 0)
        return (size_t)c->decode_threads;
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    int threads = cpus / 2;
    return threads < 1 ? 1 : threads > 4 ? 4 : (size_t)threads;
}

void ces_daemon_pipeline_options(const ces_config_t *c, bool store_positions,
                                 ces_pipeline_options_t *o) {
    memset(o, 0, sizeof(*o));
    o->decode_threads = decode_threads(c);
    o->poll_ms = (int)c->kafka_poll_ms;
    o->stop_on_source_gap = strcmp(c->kafka_on_source_gap, "continue") != 0;
    o->batch_max_events = (size_t)c->apply_batch_max_events;
    o->batch_max_bytes = (size_t)c->apply_batch_max_bytes;
    o->batch_max_ms = c->apply_batch_max_ms;
    o->store_positions = store_positions;
    o->reasm.max_bytes = (size_t)c->reassembly_max_bytes;
    o->reasm.max_segments = (size_t)c->reassembly_max_segments;
    o->reasm.timeout_ms = c->reassembly_timeout_ms;
    o->reasm.max_groups = (size_t)c->reassembly_max_groups;
    o->reasm.max_logicalid_bytes = (size_t)c->reassembly_max_logicalid_bytes;
    o->ordering = strcmp(c->apply_ordering, "partition") == 0 ? CES_ORDER_BY_PARTITION
                                                              : CES_ORDER_BY_TRANSACTION;
    o->reorder_window_ms = c->apply_reorder_window_ms;
    o->reorder_window_max_ms = c->apply_reorder_window_max_ms;
    o->reorder_window_adaptive = c->apply_reorder_window_adaptive;
    o->dedup_window = (size_t)c->apply_dedup_window;
    o->max_pending_events = (size_t)c->apply_max_pending_events;
    o->max_pending_bytes = (size_t)c->apply_max_pending_bytes;
    o->include = (const char *const *)c->schema_include.items;
    o->ninclude = c->schema_include.count;
    o->exclude = (const char *const *)c->schema_exclude.items;
    o->nexclude = c->schema_exclude.count;
}

/* The catalog's question for a source table: what its rule in schema.tables says (conf/rules.h). */
static bool table_rule(void *opaque, const char *schema, const char *table,
                       ces_catalog_rule_t *rule) {
    const ces_config_t *c = opaque;
    const ces_rule_t *r = ces_rules_match(&c->schema_tables, schema, table);
    if (r == NULL)
        return false;
    *rule = (ces_catalog_rule_t){.target = r->target,
                                 .deleted_column = r->deletes == CES_RULE_DELETES_SOFT
                                                       ? r->deleted_column
                                                       : NULL,
                                 .history_table = r->history_table,
                                 .history_only = r->history == CES_RULE_HISTORY_ONLY,
                                 .columns = {.include = (const char *const *)r->include.items,
                                             .ninclude = r->include.count,
                                             .exclude = (const char *const *)r->exclude.items,
                                             .nexclude = r->exclude.count,
                                             .rename_from =
                                                 (const char *const *)r->rename_from.items,
                                             .rename_to = (const char *const *)r->rename_to.items,
                                             .nrename = r->rename_from.count,
                                             .type_columns =
                                                 (const char *const *)r->type_columns.items,
                                             .types = (const char *const *)r->types.items,
                                             .type_zones = (const char *const *)r->type_zones.items,
                                             .ntypes = r->type_columns.count,
                                             .mask_columns =
                                                 (const char *const *)r->mask_columns.items,
                                             .masks = (const char *const *)r->masks.items,
                                             .nmasks = r->mask_columns.count},
                                 .mask_key = c->schema_mask_key,
                                 .line = r->line};
    return true;
}

/* An apply stage whose heartbeat (may be NULL) hears of the connection and of backoff waits, and
 * whose retrying hook (may be NULL) of retries and their end. */
static ces_apply_t *make_apply(const ces_config_t *c, volatile sig_atomic_t *stop_now,
                               void (*heartbeat)(void *, bool),
                               void (*retrying)(void *, const char *), void *opaque) {
    ces_apply_options_t o = {
        .conninfo = c->pg_conninfo,
        .metadata_schema = c->schema_metadata,
        .group_id = c->kafka_group_id,
        .auto_create = c->schema_auto_create,
        .auto_evolve = c->schema_auto_evolve,
        .retry_max_ms = c->pg_retry_max_ms,
        .target = c->schema_target,
        .rule_of = c->schema_tables.count > 0 ? table_rule : NULL,
        .rule_opaque = (void *)c, /* read only: the configuration outlives the apply stage */
        .preserve_case = strcmp(c->schema_identifier_case, "preserve") == 0,
        .lsn_guard = c->apply_lsn_guard,
        .version_column = c->apply_version_column,
        .tombstone_retention_s = c->apply_tombstone_retention_s,
        .stop_now = stop_now,
        .password = c->pg_password,
        .password_token = c->pg_token,
        .heartbeat = heartbeat,
        .heartbeat_opaque = opaque,
        .retrying = retrying,
    };
    return ces_apply_new(&o);
}

ces_apply_t *ces_daemon_apply_new(const ces_config_t *config, volatile sig_atomic_t *stop_now) {
    return make_apply(config, stop_now, NULL, NULL, NULL);
}

/* What the daemon's hooks and its loop share. Main thread only; metrics is shared with the HTTP
 * thread through its own lock and atomics. */
typedef struct {
    const char *path;     /* the configuration file */
    ces_config_t *config; /* as loaded at start: what the stages were made from */
    ces_config_t *current; /* the latest valid file (config itself until a reload changes it) */
    ces_metrics_t *metrics;
    ces_pipeline_t *pipeline;
    ces_apply_t *apply;
    ces_consumer_t *consumer;
    const ces_daemon_signals_t *signals; /* reference: main.c's flags */
    int64_t watchdog_ms; /* systemd's WatchdogSec / 2, or 0 */
    int64_t last_watchdog_ms;
    int64_t last_publish_ms;
    bool ready; /* READY=1 was sent */
    bool stopping; /* STOPPING=1 was sent */
    ces_pipeline_stats_t progress_base; /* the counters at the last progress line */
    int64_t last_progress_ms;
    /* Settings a SIGHUP may change. */
    int64_t progress_ms; /* 0: no progress line */
    char *http_listen;   /* owned; "" when off */
    ces_http_t *http;
    /* Transaction order: one writer per group (apply/writer.h); NULL in partition order. */
    ces_writer_t *writer;
    bool writing;          /* this instance is the writer now */
    bool stepping_down;    /* it lost the role, or could not renew it in time */
    int64_t renewed_ms;    /* when the last renewal that held the role was begun */
    int64_t next_renew_ms;
    int64_t next_owned_ms; /* when the writer next counts the partitions it does not own */
    int64_t compete_after_ms; /* a writer that stepped down for Kafka waits a lease */
    bool warned_unowned;
    /* The loop ends: a stop signal, or stepping down. (apply watches the stop signal only: a
     * writer stepping down while PostgreSQL is away finishes its retries, fenced.) */
    volatile sig_atomic_t leave;
    char holder[300]; /* this instance's name as a writer: host/pid */
} daemon_t;

/* Pings systemd's watchdog every half period, unless retries have gone on without progress for
 * longer than the period (WatchdogSec): then systemd stops the process as stuck. */
static void ping_watchdog(daemon_t *d, int64_t now) {
    if (d->watchdog_ms > 0 && now - d->last_watchdog_ms >= d->watchdog_ms &&
        ces_metrics_alive(d->metrics, now, 2 * d->watchdog_ms)) {
        ces_notify("WATCHDOG=1");
        d->last_watchdog_ms = now;
    }
}

/* The writer role (below): renewing it, and giving it up when it cannot be renewed in time. */
static void renew_role(daemon_t *d, int64_t now);
static void role_deadline(daemon_t *d, int64_t now);

/* apply's hook: the connection opened or closed, or a retry is waiting. */
static void on_apply_heartbeat(void *opaque, bool connected) {
    daemon_t *d = opaque;
    int64_t now = ces_clock_now_ms();
    if (*d->signals->stop)
        d->leave = 1;
    role_deadline(d, now);
    ces_metrics_heartbeat(d->metrics, now);
    ces_metrics_set_connected(d->metrics, connected);
    ping_watchdog(d, now);
}

/* apply's hook: a retry begins its wait (reason), or something succeeded after retries (NULL). */
static void on_apply_retrying(void *opaque, const char *reason) {
    daemon_t *d = opaque;
    ces_metrics_retrying(d->metrics, reason, ces_clock_now_ms());
}

/* The pipeline's hook: once per batch PostgreSQL accepted. */
static void on_batch_applied(void *opaque, const ces_batch_t *batch, double seconds) {
    ces_metrics_add_batch(((daemon_t *)opaque)->metrics, batch, seconds);
}

typedef struct {
    ces_consumer_t *consumer;
    ces_metrics_partition_t *parts;
    size_t n, cap;
} partitions_t;

static void collect_partition(void *arg, const char *topic, int32_t partition, int64_t position) {
    partitions_t *ps = arg;
    ces_metrics_partition_t *parts = CES_ARRAY_RESERVE(ps->parts, ps->cap, ps->n + 1, 16);
    if (parts == NULL)
        return; /* a gauge less: not worth failing for */
    ps->parts = parts;
    ces_metrics_partition_t *p = &ps->parts[ps->n++];
    p->topic = topic;
    p->partition = partition;
    p->position = position;
    if (ps->consumer == NULL || ces_consumer_high_watermark(ps->consumer, topic, partition,
                                                            &p->high) != 0)
        p->high = -1;
}

/* Copies the pipeline's counters and the partitions' lag for /metrics. */
static void publish_metrics(daemon_t *d, ces_pipeline_t *pipeline, ces_consumer_t *consumer) {
    ces_pipeline_stats_t stats;
    ces_pipeline_get_stats(pipeline, &stats);
    partitions_t ps = {.consumer = consumer};
    ces_pipeline_each_partition(pipeline, collect_partition, &ps);
    ces_metrics_set_stats(d->metrics, &stats, ps.parts, ps.n);
    if (consumer != NULL)
        ces_metrics_set_fetch_wakeups(d->metrics, ces_consumer_fetch_wakeups(consumer));
    free(ps.parts);
}

/* The progress line: logged while records arrive or changes are applied (a change applied after
 * the last record arrived is reported too), and systemd's STATUS= always. */
static void report_progress(daemon_t *d, const ces_pipeline_stats_t *now,
                            const ces_pipeline_stats_t *before, int64_t elapsed_ms) {
    double secs = elapsed_ms > 0 ? (double)elapsed_ms / 1000.0 : 1.0;
    ces_metrics_summary_t sum;
    ces_metrics_summary(d->metrics, &sum);
    char delay[32];
    if (sum.delay_seconds >= 0)
        snprintf(delay, sizeof(delay), "%.1f s", sum.delay_seconds);
    else
        snprintf(delay, sizeof(delay), "unknown");
    char line[512];
    snprintf(line, sizeof(line),
             "%.0f events/s, %.0f records/s, lag %lld records, delay %s, %llu events applied, "
             "%llu dead letters, %llu duplicates skipped, %zu events waiting for their "
             "transaction, %llu retries",
             (double)(now->events_applied - before->events_applied) / secs,
             (double)(now->records - before->records) / secs, (long long)sum.lag, delay,
             (unsigned long long)now->events_applied, (unsigned long long)now->dead_letters,
             (unsigned long long)now->duplicates, now->pending_events,
             (unsigned long long)now->retries);
    if (now->records != before->records || now->events_applied != before->events_applied ||
        now->dead_letters != before->dead_letters)
        ces_log_info("progress: %s", line);
    ces_notify_status("%s", line);
}

/* Starts, stops or moves the HTTP server to listen ("" for none). Returns 0, or -1 with the old
 * server kept. */
static int set_http(daemon_t *d, const char *listen) {
    if (d->http_listen != NULL && strcmp(d->http_listen, listen) == 0)
        return 0;
    char *copy = strdup(listen);
    if (copy == NULL) {
        ces_log_error("out of memory");
        return -1;
    }
    /* The same port may be asked for again on another address: free it first. */
    ces_http_stop(d->http);
    d->http = NULL;
    char err[512];
    ces_http_t *h = NULL;
    if (listen[0] != '\0' && (h = ces_http_start(listen, d->metrics, err, sizeof(err))) == NULL) {
        ces_log_error("%s", err);
        free(copy);
        if (d->http_listen != NULL && d->http_listen[0] != '\0')
            d->http = ces_http_start(d->http_listen, d->metrics, err, sizeof(err));
        return -1;
    }
    if (listen[0] == '\0' && d->http_listen != NULL && d->http_listen[0] != '\0')
        ces_log_info("HTTP server stopped (http.listen is empty)");
    d->http = h;
    free(d->http_listen);
    d->http_listen = copy;
    return 0;
}

static void log_changed_key(const char *key, bool reloadable, void *arg) {
    (void)arg;
    if (reloadable)
        ces_log_info("reload: %s changed", key);
    else
        ces_log_warning("reload: %s changed, but takes effect only after a restart", key);
}

/* SIGHUP: reads the file again and applies what may change while running (the keys marked RELOAD
 * in config.c). An invalid file changes nothing. Returns the configuration now current. */
static ces_config_t *reload(daemon_t *d, const char *path, ces_config_t *current) {
    ces_notify("RELOADING=1");
    ces_log_info("SIGHUP: reloading %s", path);
    ces_config_t *next = NULL;
    char err[1024];
    if (ces_config_load(path, CES_CONFIG_DAEMON, &next, err, sizeof(err)) != CES_CONFIG_OK) {
        ces_log_error("reload failed, the running configuration stays: %s", err);
        ces_notify("READY=1");
        return current;
    }
    ces_config_diff(current, next, log_changed_key, NULL);
    ces_log_level_t level;
    if (ces_log_level_parse(next->log_level, &level) == 0)
        ces_log_set_level(level);
    ces_log_format_t format;
    if (ces_log_format_parse(next->log_format, &format) == 0)
        ces_log_set_format(format);
    d->progress_ms = next->log_progress_interval * 1000;
    set_http(d, next->http_listen);
    ces_log_info("configuration reloaded (log level %s)", next->log_level);
    ces_notify("READY=1");
    return next;
}

/* The loop's hook, at every turn: liveness, reload, /metrics, readiness, the progress line. */
static void on_turn(void *opaque, int64_t now, bool waiting) {
    daemon_t *d = opaque;
    ces_metrics_heartbeat(d->metrics, now);
    ping_watchdog(d, now);
    if (*d->signals->stop)
        d->leave = 1;
    renew_role(d, now);
    if (*d->signals->reload) {
        *d->signals->reload = 0;
        ces_config_t *next = reload(d, d->path, d->current);
        if (next != d->current && d->current != d->config)
            ces_config_destroy(d->current);
        d->current = next;
    }
    /* A turn that is about to wait for PostgreSQL shows what was read before it. */
    if (waiting || now - d->last_publish_ms >= METRICS_PUBLISH_MS) {
        ces_metrics_set_assigned(d->metrics, ces_consumer_assigned_count(d->consumer));
        publish_metrics(d, d->pipeline, d->consumer);
        d->last_publish_ms = now;
        if (!d->ready && ces_apply_connected(d->apply) && ces_consumer_joined(d->consumer)) {
            d->ready = true;
            ces_notify("READY=1");
            ces_notify_status("running");
            ces_log_info("ready: PostgreSQL connected, consumer group joined");
        }
    }
    if (d->progress_ms > 0 && now - d->last_progress_ms >= d->progress_ms) {
        publish_metrics(d, d->pipeline, d->consumer);
        ces_pipeline_stats_t stats;
        ces_pipeline_get_stats(d->pipeline, &stats);
        report_progress(d, &stats, &d->progress_base, now - d->last_progress_ms);
        d->progress_base = stats;
        d->last_progress_ms = now;
    }
}

static void on_stopping(void *opaque) {
    daemon_t *d = opaque;
    if (d->stepping_down && !*d->signals->stop) {
        ces_log_info("stepping down: applying what is complete (the batches of a writer that "
                     "lost its role are refused), then leaving the consumer group");
        return;
    }
    d->stopping = true;
    ces_notify("STOPPING=1");
    ces_log_info("stopping: applying what is complete, then leaving the consumer group");
}

/* ---------------------------------------------------------------------------------------------- */
/* The writer role (transaction order)                                                            */

/* A standby asks for the role this often; a writer renews it this often (and at least four times
 * a lease). */
#define ROLE_TRY_MS 500
#define ROLE_RENEW_MS 1000

static void step_down(daemon_t *d, const char *why) {
    ces_log_warning("writer of group '%s': %s: stepping down", d->config->kafka_group_id, why);
    d->stepping_down = true;
    d->leave = 1;
}

/* A writer that could not renew its role for most of a lease stops applying before a standby may
 * start: the lease is measured from when the last good renewal was begun, PostgreSQL's from a
 * little later. */
static void role_deadline(daemon_t *d, int64_t now) {
    if (d->writer == NULL || !d->writing || d->stepping_down ||
        now - d->renewed_ms <= d->config->ha_lease_ms * 7 / 10)
        return;
    char why[128];
    snprintf(why, sizeof(why), "the role could not be renewed for %lld ms (the lease is %lld ms)",
             (long long)(now - d->renewed_ms), (long long)d->config->ha_lease_ms);
    step_down(d, why);
}

/* A writer owns every partition of its topics: only it is in the group, unless something else
 * joined it (an instance in partition order, another tool under the same group id). Then its
 * transactions cannot be applied whole: said once, and counted. */
static void check_owned(daemon_t *d, int64_t now) {
    enum { EVERY_MS = 10000, METADATA_MS = 500 };
    if (d->consumer == NULL || !ces_consumer_joined(d->consumer) || now < d->next_owned_ms)
        return;
    d->next_owned_ms = now + EVERY_MS;
    int64_t total = ces_consumer_count_partitions(d->consumer, d->config->kafka_topics.items,
                                                  d->config->kafka_topics.count, METADATA_MS);
    if (total < 0)
        return;
    int64_t unowned = total - (int64_t)ces_consumer_assigned_count(d->consumer);
    ces_metrics_set_unowned(d->metrics, unowned < 0 ? 0 : unowned);
    if (unowned > 0 && !d->warned_unowned) {
        ces_log_warning("transaction order: this writer of group '%s' owns %zu of the %lld "
                        "partitions of its topics; another consumer of the group holds the rest, "
                        "so a source transaction spanning both cannot be applied whole",
                        d->config->kafka_group_id, ces_consumer_assigned_count(d->consumer),
                        (long long)total);
        d->warned_unowned = true;
    }
}

/* A writer that cannot reach any broker for longer than a lease gives the role up, so that a
 * standby with a working path can write (and waits a lease before it competes again). */
static void check_brokers(daemon_t *d, int64_t now) {
    int64_t since = d->consumer != NULL ? ces_consumer_brokers_down_since(d->consumer) : 0;
    if (since == 0 || now - since <= d->config->ha_lease_ms || d->stepping_down)
        return;
    if (ces_consumer_count_partitions(d->consumer, d->config->kafka_topics.items,
                                      d->config->kafka_topics.count, 200) >= 0)
        return; /* a broker answers: the stream is only quiet */
    char why[128];
    snprintf(why, sizeof(why), "no Kafka broker could be reached for %lld ms",
             (long long)(now - since));
    step_down(d, why);
    d->compete_after_ms = now + d->config->ha_lease_ms;
}

static void renew_role(daemon_t *d, int64_t now) {
    if (d->writer != NULL && d->writing) {
        check_owned(d, now);
        check_brokers(d, now);
    }
    if (d->writer == NULL || !d->writing || d->stepping_down || now < d->next_renew_ms)
        return;
    int64_t every = d->config->ha_lease_ms / 4 < ROLE_RENEW_MS ? d->config->ha_lease_ms / 4
                                                                : ROLE_RENEW_MS;
    d->next_renew_ms = now + every;
    char err[512];
    ces_writer_role_t role = ces_writer_renew(d->writer, err, sizeof(err));
    if (role == CES_WRITER_WRITER) {
        d->renewed_ms = now;
        return;
    }
    if (role == CES_WRITER_STANDBY) {
        char why[400];
        snprintf(why, sizeof(why), "another instance took the role over (%s)",
                 ces_writer_seen(d->writer));
        step_down(d, why);
        return;
    }
    ces_log_warning("writer of group '%s': cannot renew the role: %s", d->config->kafka_group_id,
                    err);
    role_deadline(d, ces_clock_now_ms());
}

/* What a standby's wait does at each step: liveness, the watchdog, a reload. */
static void standby_turn(daemon_t *d, int64_t now) {
    ces_metrics_heartbeat(d->metrics, now);
    ping_watchdog(d, now);
    if (*d->signals->reload) {
        *d->signals->reload = 0;
        ces_config_t *next = reload(d, d->path, d->current);
        if (next != d->current && d->current != d->config)
            ces_config_destroy(d->current);
        d->current = next;
    }
}

/* This instance becomes the writer: its batches are fenced on its epoch from now on. */
static bool become_writer(daemon_t *d, int64_t asked_ms) {
    int64_t epoch = ces_writer_epoch(d->writer);
    if (ces_apply_set_writer(d->apply, d->holder, epoch) != 0) {
        ces_log_error("out of memory");
        return false;
    }
    ces_pipeline_inherit_window(d->pipeline, ces_writer_window_ms(d->writer));
    d->writing = true;
    d->stepping_down = false;
    d->leave = 0;
    d->renewed_ms = asked_ms;
    d->next_renew_ms = asked_ms + ROLE_TRY_MS;
    ces_metrics_set_role(d->metrics, CES_METRICS_ROLE_WRITER, epoch);
    ces_log_info("writer of group '%s' (epoch %lld, as %s): joining the consumer group",
                 d->config->kafka_group_id, (long long)epoch, d->holder);
    return true;
}

/* A standby until this instance gets the role (true), or until a stop is asked for (false). */
static bool wait_for_role(daemon_t *d) {
    d->writing = false;
    ces_metrics_set_role(d->metrics, CES_METRICS_ROLE_STANDBY, ces_writer_epoch(d->writer));
    char err[1024], said[1024] = "";
    int64_t next_try = 0;
    while (!*d->signals->stop) {
        int64_t now = ces_clock_now_ms();
        standby_turn(d, now);
        if (now >= next_try && now >= d->compete_after_ms) {
            next_try = now + ROLE_TRY_MS;
            ces_writer_role_t role = ces_writer_try(d->writer, err, sizeof(err));
            ces_metrics_set_connected(d->metrics, role != CES_WRITER_UNKNOWN);
            if (role == CES_WRITER_WRITER)
                return become_writer(d, now);
            if (role == CES_WRITER_STANDBY && strcmp(said, "standby") != 0) {
                ces_log_info("standby for group '%s': %s writes; taking over when it stops, dies "
                             "or its lease of %lld ms runs out",
                             d->config->kafka_group_id, ces_writer_seen(d->writer),
                             (long long)d->config->ha_lease_ms);
                snprintf(said, sizeof(said), "standby");
                if (!d->ready) {
                    d->ready = true;
                    ces_notify("READY=1");
                }
                ces_notify_status("standby: another instance writes");
            } else if (role == CES_WRITER_UNKNOWN && strcmp(said, err) != 0) {
                ces_log_warning("standby for group '%s': cannot ask PostgreSQL who writes: %s",
                                d->config->kafka_group_id, err);
                snprintf(said, sizeof(said), "%s", err);
            }
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

/* After a term that ended by itself: was this writer replaced? Only a writer joins under the
 * shared static name, so another member under it is a new writer (which PostgreSQL's fence
 * already keeps this one from committing past); and a term that failed may have failed because the
 * role went (a writer frozen past its lease). Either is a step down, not a failure. */
static void check_replaced(daemon_t *d, ces_pipeline_status_t st) {
    char err[512];
    if (ces_consumer_fenced(d->consumer)) {
        ces_log_warning("writer of group '%s': another instance joined the consumer group as the "
                        "writer: stepping down",
                        d->config->kafka_group_id);
        d->stepping_down = true;
    } else if (st == CES_PIPELINE_FATAL &&
               ces_writer_renew(d->writer, err, sizeof(err)) == CES_WRITER_STANDBY) {
        ces_log_warning("writer of group '%s': another instance took the role over (%s): "
                        "stepping down",
                        d->config->kafka_group_id, ces_writer_seen(d->writer));
        d->stepping_down = true;
    }
}

/* One term of consuming: joins the consumer group, runs the loop until a stop, a failure or a step
 * down, and leaves the group (the revocation commits what is complete). */
static ces_daemon_status_t run_term(daemon_t *d) {
    char err[1024];
    ces_consumer_callbacks_t callbacks = {
        .assigned = ces_pipeline_on_assigned,
        .revoked = ces_pipeline_on_revoked,
        .opaque = d->pipeline,
    };
    ces_consumer_status_t cst =
        ces_consumer_new(d->config, &callbacks, &d->consumer, err, sizeof(err));
    if (cst != CES_CONSUMER_OK) {
        ces_log_error("%s", err);
        return cst == CES_CONSUMER_CONFIG ? CES_DAEMON_CONFIG : CES_DAEMON_FAILED;
    }
    ces_feed_t feed;
    ces_consumer_feed(d->consumer, &feed);
    ces_pipeline_set_feed(d->pipeline, &feed);
    ces_notify_status("joining the consumer group");
    d->last_progress_ms = ces_clock_now_ms();
    ces_pipeline_get_stats(d->pipeline, &d->progress_base);
    ces_pipeline_hooks_t hooks = {.on_turn = on_turn, .on_stopping = on_stopping, .opaque = d};
    ces_pipeline_status_t st = ces_pipeline_run(d->pipeline, &hooks, &d->leave, err, sizeof(err));
    if (d->writer != NULL && !d->stepping_down && !*d->signals->stop)
        check_replaced(d, st);
    /* A writer that steps down may write again in a later term, with another consumer: nothing of
     * this one may outlive it (a fenced consumer revokes nothing on its way out). The loop applied
     * what was complete before it returned. */
    if (d->stepping_down && !*d->signals->stop)
        ces_pipeline_forget(d->pipeline);
    /* Leaving the group revokes the assignment: the pipeline commits what is complete. */
    ces_consumer_destroy(d->consumer);
    d->consumer = NULL;
    ces_metrics_set_assigned(d->metrics, 0);
    if (d->stepping_down && !*d->signals->stop)
        return CES_DAEMON_OK;
    if (!d->stopping)
        ces_notify("STOPPING=1");
    switch (st) {
    case CES_PIPELINE_INTERRUPTED:
        ces_log_warning("the last batch was rolled back; it will be read again after restart");
        return CES_DAEMON_OK;
    case CES_PIPELINE_FATAL:
        ces_log_error("%s", err);
        return CES_DAEMON_FAILED;
    case CES_PIPELINE_SOURCE_GAP:
        ces_log_error("%s", err);
        return CES_DAEMON_SOURCE_GAP;
    default:
        return CES_DAEMON_OK;
    }
}

/* Transaction order: a standby until the role is had, then the writer for as long as it is held;
 * a writer that lost it is a standby again. */
static ces_daemon_status_t serve_roles(daemon_t *d) {
    for (;;) {
        if (!wait_for_role(d))
            return CES_DAEMON_OK; /* stopped while a standby */
        ces_daemon_status_t st = run_term(d);
        bool stopped = *d->signals->stop;
        if (!d->stepping_down || stopped) {
            ces_writer_release(d->writer);
            return st;
        }
        ces_writer_release(d->writer);
        if (ces_apply_set_writer(d->apply, NULL, 0) != 0)
            return CES_DAEMON_FAILED;
        ces_log_warning("stepped down: a standby again");
    }
}

/* Connects to PostgreSQL, then consumes: at once in partition order, as the writer in
 * transaction order. */
static ces_daemon_status_t serve(daemon_t *d) {
    char err[1024];
    ces_notify_status("connecting to PostgreSQL");
    ces_apply_status_t ast = ces_apply_start(d->apply, err, sizeof(err));
    if (ast != CES_APPLY_OK) {
        if (ast == CES_APPLY_INTERRUPTED)
            return CES_DAEMON_OK;
        ces_log_error("%s", err);
        return CES_DAEMON_FAILED;
    }
    return d->writer != NULL ? serve_roles(d) : run_term(d);
}

ces_daemon_status_t ces_daemon_run(const char *path, ces_config_t *config, ces_tokens_t *tokens,
                                   const ces_daemon_signals_t *signals) {
    ces_daemon_status_t rc = CES_DAEMON_FAILED;
    daemon_t d = {.path = path,
                  .config = config,
                  .current = config,
                  .signals = signals,
                  .progress_ms = config->log_progress_interval * 1000,
                  .watchdog_ms = ces_notify_watchdog_interval_ms()};
    ces_decode_limits_t limits;
    ces_daemon_decode_limits(config, &limits);
    ces_pipeline_options_t popts;
    ces_daemon_pipeline_options(config, true, &popts);
    popts.on_applied = on_batch_applied;
    popts.on_applied_opaque = &d;
    d.metrics = ces_metrics_new();
    ces_decoder_t *decoder = ces_decoder_new(&limits);
    d.apply = make_apply(config, signals->stop, on_apply_heartbeat, on_apply_retrying, &d);
    if (strcmp(config->apply_ordering, "transaction") == 0) {
        char host[256] = "localhost";
        gethostname(host, sizeof(host) - 1);
        snprintf(d.holder, sizeof(d.holder), "%s/%ld", host, (long)getpid());
        ces_writer_options_t wo = {
            .conninfo = config->pg_conninfo,
            .password = config->pg_password,
            .password_token = config->pg_token,
            .metadata_schema = config->schema_metadata,
            .version_column = config->apply_version_column,
            .group_id = config->kafka_group_id,
            .holder = d.holder,
            .lease_ms = config->ha_lease_ms,
        };
        if ((d.writer = ces_writer_new(&wo)) == NULL) {
            ces_log_error("out of memory");
            goto done;
        }
    }
    if (d.metrics == NULL || decoder == NULL || d.apply == NULL ||
        (d.pipeline = ces_pipeline_new(&popts, decoder, d.apply)) == NULL) {
        ces_log_error("out of memory");
        goto done;
    }
    ces_log_info("ces2pg %s starting with %s", CES2PG_VERSION, path);
    ces_log_info("decoding records on %zu thread(s) (decode.threads = %lld)", popts.decode_threads,
                 (long long)config->decode_threads);
    ces_metrics_heartbeat(d.metrics, ces_clock_now_ms());
    ces_tokens_set_metrics(tokens, d.metrics);
    if (set_http(&d, config->http_listen) != 0)
        goto done;
    rc = serve(&d);
done:
    if (d.pipeline != NULL) {
        /* Leaving the group revokes the assignment: the pipeline commits what is complete. */
        ces_consumer_destroy(d.consumer);
        ces_pipeline_stats_t stats;
        ces_pipeline_get_stats(d.pipeline, &stats);
        ces_log_info("stopped: %llu records, %llu events applied, %llu dead letters, %llu "
                     "duplicates skipped, %llu events of excluded tables skipped",
                     (unsigned long long)stats.records, (unsigned long long)stats.events_applied,
                     (unsigned long long)stats.dead_letters, (unsigned long long)stats.duplicates,
                     (unsigned long long)stats.excluded);
    }
    ces_http_stop(d.http);
    free(d.http_listen);
    ces_tokens_set_metrics(tokens, NULL);
    ces_pipeline_destroy(d.pipeline);
    if (d.writer != NULL)
        ces_writer_leave(d.writer);
    ces_writer_destroy(d.writer);
    ces_apply_destroy(d.apply);
    ces_decoder_destroy(decoder);
    ces_metrics_destroy(d.metrics);
    if (d.current != config)
        ces_config_destroy(d.current);
    return rc;
}
