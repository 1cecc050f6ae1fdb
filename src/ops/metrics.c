#include "ops/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/array.h"
#include "util/map.h"

#ifndef CES2PG_VERSION
#define CES2PG_VERSION "0.0.0"
#endif

/* Upper bounds of the batch duration histogram, in seconds. */
static const double batch_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                       0.25,  0.5,   1,    2.5,   5,    10};
#define NBUCKETS (sizeof(batch_buckets) / sizeof(batch_buckets[0]))

/* Labels of ces_op_t (1..3). */
static const char *const op_names[4] = {"unknown", "insert", "update", "delete"};

/* A batch's events name a few tables over and over: the last ones found are compared with the
 * event's names first, which costs less than making the key and hashing it (a strlen and a hash
 * per applied event; bench/NOTES.md). */
#define RECENT_TABLES 8

typedef struct {
    char *name; /* "schema.table" of the source, or "other" */
    size_t name_len; /* of a source's name (0 for "other") */
    uint64_t applied[4]; /* by ces_op_t */
} table_counts_t;

typedef struct {
    char *topic;
    int32_t partition;
    int64_t position, high;
} partition_gauge_t;

/* Torn transactions of one partition: counted per partition that delivered the late event.
 * Partitions are few (Event Hubs: at most 32 per hub on Standard); at most
 * CES_METRICS_MAX_TORN_PARTITIONS are kept by name, the rest count in the last entry. */
#define CES_METRICS_MAX_TORN_PARTITIONS 1024

typedef struct {
    char *topic;
    int32_t partition;
    uint64_t torn;
} torn_counts_t;

struct ces_metrics_s {
    pthread_mutex_t lock;
    /* Under lock. */
    ces_map_t *by_name; /* name -> table_counts_t */
    table_counts_t **tables;
    size_t ntables, tables_cap;
    table_counts_t *other; /* tables beyond CES_METRICS_MAX_TABLES */
    table_counts_t *recent[RECENT_TABLES]; /* the tables counted last, the latest first */
    uint64_t dead_letters[CES_DL_NCLASSES];
    uint64_t late_events;
    torn_counts_t *torn; /* in order of first sight */
    size_t ntorn, torn_cap;
    uint64_t buckets[NBUCKETS]; /* not cumulative; summed when rendered */
    uint64_t batch_count;
    double batch_seconds;
    bool has_commit_time;
    double last_commit_time; /* envelope time of the last applied event, seconds since the epoch */
    double last_delay;       /* wall clock at its commit minus that */
    ces_pipeline_stats_t stats;
    partition_gauge_t *partitions;
    size_t npartitions;
    /* Lock-free. */
    atomic_llong heartbeat_ms;
    atomic_bool connected;
    atomic_size_t assigned;
    atomic_ullong fetch_wakeups;
    atomic_llong retry_since_ms; /* the first retry since the last progress; 0: none */
    atomic_ullong retries[CES_APPLY_NRETRY_REASONS + 1]; /* by retry_reasons, then "unknown" */
    /* Microsoft Entra tokens, by ces_metrics_side_t; a side's series appear once it is used. */
    atomic_bool token_used[CES_METRICS_NSIDES];
    atomic_llong token_expires_ms[CES_METRICS_NSIDES]; /* since the epoch; 0: none yet */
    atomic_ullong token_failures[CES_METRICS_NSIDES];
    atomic_int role;              /* ces_metrics_role_t */
    atomic_llong writer_epoch;
    atomic_llong unowned_partitions; /* of the subscribed topics, not this writer's; -1: unknown */
};

static const char *const side_names[CES_METRICS_NSIDES] = {"kafka", "postgres"};

static const char *const retry_reasons[CES_APPLY_NRETRY_REASONS] = CES_APPLY_RETRY_REASONS;

ces_metrics_t *ces_metrics_new(void) {
    ces_metrics_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    if (pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        return NULL;
    }
    m->by_name = ces_map_new();
    if (m->by_name == NULL) {
        ces_metrics_destroy(m);
        return NULL;
    }
    m->stats.reorder_window_ms = -1; /* unknown until the loop publishes */
    atomic_init(&m->heartbeat_ms, 0);
    atomic_init(&m->connected, false);
    atomic_init(&m->assigned, 0);
    atomic_init(&m->fetch_wakeups, 0);
    atomic_init(&m->retry_since_ms, 0);
    for (size_t i = 0; i <= CES_APPLY_NRETRY_REASONS; i++)
        atomic_init(&m->retries[i], 0);
    atomic_init(&m->role, CES_METRICS_ROLE_NONE);
    atomic_init(&m->writer_epoch, 0);
    atomic_init(&m->unowned_partitions, -1);
    for (size_t i = 0; i < CES_METRICS_NSIDES; i++) {
        atomic_init(&m->token_used[i], false);
        atomic_init(&m->token_expires_ms[i], 0);
        atomic_init(&m->token_failures[i], 0);
    }
    return m;
}

static void free_partitions(ces_metrics_t *m) {
    for (size_t i = 0; i < m->npartitions; i++)
        free(m->partitions[i].topic);
    free(m->partitions);
    m->partitions = NULL;
    m->npartitions = 0;
}

void ces_metrics_destroy(ces_metrics_t *m) {
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->ntables; i++) {
        free(m->tables[i]->name);
        free(m->tables[i]);
    }
    free(m->tables);
    if (m->other != NULL) {
        free(m->other->name);
        free(m->other);
    }
    free_partitions(m);
    for (size_t i = 0; i < m->ntorn; i++)
        free(m->torn[i].topic);
    free(m->torn);
    ces_map_destroy(m->by_name);
    pthread_mutex_destroy(&m->lock);
    free(m);
}


static table_counts_t *table_named(ces_metrics_t *m, const ces_event_t *ev) {
    char name[512];
    const char *parts[] = {ev->schema, ev->table};
    size_t len = ces_map_key(name, sizeof(name), '.', parts, 2);
    table_counts_t *t = ces_map_get(m->by_name, name, len);
    if (t != NULL)
        return t;
    if (m->ntables >= CES_METRICS_MAX_TABLES)
        goto other;
    table_counts_t **tables = CES_ARRAY_RESERVE(m->tables, m->tables_cap, m->ntables + 1, 16);
    if (tables == NULL)
        goto other;
    m->tables = tables;
    t = calloc(1, sizeof(*t));
    if (t == NULL || (t->name = strndup(name, len)) == NULL ||
        ces_map_put(m->by_name, name, len, t) != 0) {
        if (t != NULL)
            free(t->name);
        free(t);
        goto other;
    }
    t->name_len = len;
    m->tables[m->ntables++] = t;
    return t;
other:
    if (m->other == NULL) {
        m->other = calloc(1, sizeof(*m->other));
        if (m->other != NULL && (m->other->name = strdup("other")) == NULL) {
            free(m->other);
            m->other = NULL;
        }
    }
    return m->other;
}

/* The counts of ev's table, the latest found moved to the front of m->recent. A key cut to fit
 * its buffer is never the names it was cut from (ces_map_key_is): such tables are always looked
 * up. */
static table_counts_t *table_for(ces_metrics_t *m, const ces_event_t *ev) {
    size_t i = 0;
    const char *parts[] = {ev->schema, ev->table};
    while (i < RECENT_TABLES && m->recent[i] != NULL &&
           !ces_map_key_is(m->recent[i]->name, m->recent[i]->name_len, '.', parts, 2))
        i++;
    table_counts_t *t = i < RECENT_TABLES ? m->recent[i] : NULL;
    if (t == NULL) {
        t = table_named(m, ev);
        if (t == NULL || t == m->other) /* named by no event: not worth a place */
            return t;
        i = RECENT_TABLES - 1;
    }
    memmove(&m->recent[1], &m->recent[0], i * sizeof(m->recent[0]));
    m->recent[0] = t;
    return t;
}

/* A late event (item->late) applied: counted, and its transaction as torn once (item->torn). */
static void count_late(ces_metrics_t *m, const ces_item_t *item) {
    m->late_events++;
    if (!item->torn)
        return;
    const ces_source_t *src = &item->source;
    size_t i = 0;
    while (i < m->ntorn && !(m->torn[i].partition == src->partition &&
                             strcmp(m->torn[i].topic, src->topic) == 0))
        i++;
    if (i == m->ntorn && m->ntorn == CES_METRICS_MAX_TORN_PARTITIONS)
        i = m->ntorn - 1; /* beyond the cap: in the last entry */
    if (i == m->ntorn) {
        torn_counts_t *torn = CES_ARRAY_RESERVE(m->torn, m->torn_cap, m->ntorn + 1, 8);
        if (torn == NULL)
            return; /* a count less: not worth failing for */
        m->torn = torn;
        char *topic = strdup(src->topic);
        if (topic == NULL)
            return;
        m->torn[m->ntorn++] = (torn_counts_t){topic, src->partition, 0};
    }
    m->torn[i].torn++;
}

void ces_metrics_add_batch(ces_metrics_t *m, const ces_batch_t *batch, double seconds) {
    /* The last event applied is the newest (batches are in commit order): parse its time once. */
    const char *time_text = NULL;
    for (size_t i = batch->count; i > 0 && time_text == NULL; i--) {
        if (batch->items[i - 1].kind == CES_ITEM_EVENT)
            time_text = batch->items[i - 1].event.time;
    }
    double commit_time = 0;
    bool has_time = time_text != NULL && ces_event_parse_time(time_text, &commit_time) == 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);

    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < batch->count; i++) {
        const ces_item_t *item = &batch->items[i];
        if (i + CES_ITEM_AHEAD < batch->count) /* the names it compares */
            ces_item_prefetch(item[CES_ITEM_AHEAD].event.schema);
        if (item->late)
            count_late(m, item);
        if (item->kind == CES_ITEM_EVENT) {
            table_counts_t *t = table_for(m, &item->event);
            unsigned op = (unsigned)item->event.op;
            if (t != NULL)
                t->applied[op < 4 ? op : 0]++;
        } else {
            m->dead_letters[item->dl_class]++;
        }
    }
    if (batch->count > 0 || batch->npositions > 0) {
        size_t b = 0;
        while (b < NBUCKETS && seconds > batch_buckets[b])
            b++;
        if (b < NBUCKETS)
            m->buckets[b]++;
        m->batch_count++;
        m->batch_seconds += seconds;
    }
    if (has_time) {
        m->has_commit_time = true;
        m->last_commit_time = commit_time;
        m->last_delay = (double)now.tv_sec + (double)now.tv_nsec / 1e9 - commit_time;
        if (m->last_delay < 0)
            m->last_delay = 0; /* clocks of the source and here disagree */
    }
    pthread_mutex_unlock(&m->lock);
}

void ces_metrics_set_stats(ces_metrics_t *m, const ces_pipeline_stats_t *stats,
                           const ces_metrics_partition_t *parts, size_t n) {
    partition_gauge_t *copy = n ? calloc(n, sizeof(*copy)) : NULL;
    size_t ncopy = 0;
    for (size_t i = 0; copy != NULL && i < n; i++) {
        copy[i].topic = strdup(parts[i].topic);
        if (copy[i].topic == NULL)
            break;
        copy[i].partition = parts[i].partition;
        copy[i].position = parts[i].position;
        copy[i].high = parts[i].high;
        ncopy++;
    }
    pthread_mutex_lock(&m->lock);
    m->stats = *stats;
    free_partitions(m);
    m->partitions = copy;
    m->npartitions = ncopy;
    pthread_mutex_unlock(&m->lock);
}

void ces_metrics_heartbeat(ces_metrics_t *m, int64_t now_ms) {
    atomic_store(&m->heartbeat_ms, (long long)now_ms);
}

void ces_metrics_set_connected(ces_metrics_t *m, bool connected) {
    atomic_store(&m->connected, connected);
}

void ces_metrics_set_assigned(ces_metrics_t *m, size_t partitions) {
    atomic_store(&m->assigned, partitions);
}

void ces_metrics_set_fetch_wakeups(ces_metrics_t *m, uint64_t wakeups) {
    atomic_store(&m->fetch_wakeups, (unsigned long long)wakeups);
}

void ces_metrics_retrying(ces_metrics_t *m, const char *reason, int64_t now_ms) {
    if (reason == NULL) {
        atomic_store(&m->retry_since_ms, 0);
        return;
    }
    size_t i = 0;
    while (i < CES_APPLY_NRETRY_REASONS && strcmp(retry_reasons[i], reason) != 0)
        i++;
    atomic_fetch_add(&m->retries[i], 1);
    long long none = 0;
    long long since = now_ms > 0 ? (long long)now_ms : 1;
    atomic_compare_exchange_strong(&m->retry_since_ms, &none, since);
}

bool ces_metrics_alive(const ces_metrics_t *m, int64_t now_ms, int64_t max_age_ms) {
    ces_metrics_t *mm = (ces_metrics_t *)m;
    long long beat = atomic_load(&mm->heartbeat_ms);
    long long since = atomic_load(&mm->retry_since_ms);
    return beat > 0 && now_ms - beat <= max_age_ms && (since == 0 || now_ms - since <= max_age_ms);
}

bool ces_metrics_ready(const ces_metrics_t *m) {
    ces_metrics_t *mm = (ces_metrics_t *)m;
    if (atomic_load(&mm->role) == CES_METRICS_ROLE_STANDBY)
        return atomic_load(&mm->connected); /* ready to take over */
    return atomic_load(&mm->connected) && atomic_load(&mm->assigned) > 0 &&
           atomic_load(&mm->retry_since_ms) == 0;
}

ces_metrics_role_t ces_metrics_role(const ces_metrics_t *m) {
    return (ces_metrics_role_t)atomic_load(&((ces_metrics_t *)m)->role);
}

void ces_metrics_set_role(ces_metrics_t *m, ces_metrics_role_t role, int64_t epoch) {
    atomic_store(&m->role, (int)role);
    atomic_store(&m->writer_epoch, epoch);
}

void ces_metrics_set_unowned(ces_metrics_t *m, int64_t partitions) {
    atomic_store(&m->unowned_partitions, partitions);
}


static int64_t partition_lag(const partition_gauge_t *p) {
    if (p->high < 0 || p->position < 0)
        return -1;
    return p->high > p->position ? p->high - p->position : 0;
}

void ces_metrics_summary(ces_metrics_t *m, ces_metrics_summary_t *s) {
    memset(s, 0, sizeof(*s));
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->npartitions; i++) {
        int64_t lag = partition_lag(&m->partitions[i]);
        if (lag > 0)
            s->lag += lag;
    }
    s->delay_seconds = m->has_commit_time ? m->last_delay : -1;
    for (size_t i = 0; i < CES_DL_NCLASSES; i++)
        s->dead_letters += m->dead_letters[i];
    pthread_mutex_unlock(&m->lock);
}

/* A label value with \, " and newline escaped, as the text format wants. */
static void put_label(FILE *out, const char *v) {
    for (; *v != '\0'; v++) {
        if (*v == '\\')
            fputs("\\\\", out);
        else if (*v == '"')
            fputs("\\\"", out);
        else if (*v == '\n')
            fputs("\\n", out);
        else
            fputc(*v, out);
    }
}

static void header(FILE *out, const char *name, const char *type, const char *help) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static long process_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = -1;
    if (f == NULL)
        return -1;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2)
        resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}

/* The counters (under the lock). */
static void render_counters(ces_metrics_t *m, FILE *out) {
    const ces_pipeline_stats_t *st = &m->stats;
    header(out, "ces2pg_build_info", "gauge", "Version of the running ces2pg.");
    fprintf(out, "ces2pg_build_info{version=\"%s\"} 1\n", CES2PG_VERSION);
    header(out, "ces2pg_records_consumed_total", "counter",
           "Kafka records read (events, segments and undecodable records).");
    fprintf(out, "ces2pg_records_consumed_total %llu\n", (unsigned long long)st->records);
    header(out, "ces2pg_events_consumed_total", "counter",
           "Row change events decoded, by operation (before filtering and duplicate removal).");
    for (int op = 1; op <= 3; op++)
        fprintf(out, "ces2pg_events_consumed_total{op=\"%s\"} %llu\n", op_names[op],
                (unsigned long long)st->events_consumed[op]);
    header(out, "ces2pg_events_applied_total", "counter",
           "Row change events committed to PostgreSQL, by operation and source table (at most "
           "1000 tables by name, the rest as table=\"other\").");
    for (size_t i = 0; i <= m->ntables; i++) {
        const table_counts_t *t = i < m->ntables ? m->tables[i] : m->other;
        if (t == NULL)
            continue;
        for (int op = 1; op <= 3; op++) {
            fprintf(out, "ces2pg_events_applied_total{op=\"%s\",table=\"", op_names[op]);
            put_label(out, t->name);
            fprintf(out, "\"} %llu\n", (unsigned long long)t->applied[op]);
        }
    }
    header(out, "ces2pg_events_duplicate_total", "counter",
           "Resent events recognised and skipped before applying.");
    fprintf(out, "ces2pg_events_duplicate_total %llu\n", (unsigned long long)st->duplicates);
    header(out, "ces2pg_events_excluded_total", "counter",
           "Events of tables left out by schema.include / schema.exclude.");
    fprintf(out, "ces2pg_events_excluded_total %llu\n", (unsigned long long)st->excluded);
    header(out, "ces2pg_dead_letters_total", "counter",
           "Records and events written to the dead letter table, by reason.");
    for (int c = 0; c < CES_DL_NCLASSES; c++)
        fprintf(out, "ces2pg_dead_letters_total{reason=\"%s\"} %llu\n", ces_dl_class_name(c),
                (unsigned long long)m->dead_letters[c]);
    header(out, "ces2pg_source_gaps_total", "counter",
           "Stored positions found gone at the broker (retention, a recreated topic): changes that "
           "never reached PostgreSQL. See kafka.on_source_gap and the metadata schema's "
           "source_gaps table.");
    fprintf(out, "ces2pg_source_gaps_total %llu\n", (unsigned long long)st->source_gaps);
    header(out, "ces2pg_source_gap_records_total", "counter",
           "Records those gaps skipped, where the broker could tell.");
    fprintf(out, "ces2pg_source_gap_records_total %llu\n",
            (unsigned long long)st->source_gap_records);
    header(out, "ces2pg_late_events_total", "counter",
           "Events applied after their source transaction went to PostgreSQL without them "
           "(transaction mode: they came later than the reorder window).");
    fprintf(out, "ces2pg_late_events_total %llu\n", (unsigned long long)m->late_events);
    header(out, "ces2pg_transactions_torn_total", "counter",
           "Source transactions a PostgreSQL reader could see in parts, by the partition whose "
           "events came late.");
    for (size_t i = 0; i < m->ntorn; i++) {
        fprintf(out, "ces2pg_transactions_torn_total{topic=\"");
        put_label(out, m->torn[i].topic);
        fprintf(out, "\",partition=\"%d\"} %llu\n", (int)m->torn[i].partition,
                (unsigned long long)m->torn[i].torn);
    }
    header(out, "ces2pg_batch_duration_seconds", "histogram",
           "Time to apply one batch (one PostgreSQL transaction), retries included.");
    uint64_t cumulative = 0;
    for (size_t b = 0; b < NBUCKETS; b++) {
        cumulative += m->buckets[b];
        fprintf(out, "ces2pg_batch_duration_seconds_bucket{le=\"%g\"} %llu\n", batch_buckets[b],
                (unsigned long long)cumulative);
    }
    fprintf(out, "ces2pg_batch_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)m->batch_count);
    fprintf(out, "ces2pg_batch_duration_seconds_sum %.6f\n", m->batch_seconds);
    fprintf(out, "ces2pg_batch_duration_seconds_count %llu\n", (unsigned long long)m->batch_count);
}

/* The writer role of transaction order (lock-free): absent in partition order. */
static void render_role(ces_metrics_t *m, FILE *out) {
    int role = atomic_load(&m->role);
    if (role == CES_METRICS_ROLE_NONE)
        return;
    header(out, "ces2pg_writer", "gauge",
           "1 while this instance is its group's writer (transaction order), 0 while it is a "
           "standby.");
    fprintf(out, "ces2pg_writer %d\n", role == CES_METRICS_ROLE_WRITER ? 1 : 0);
    header(out, "ces2pg_writer_epoch", "gauge",
           "The epoch this instance writes, or last wrote, under (raised at every takeover).");
    fprintf(out, "ces2pg_writer_epoch %lld\n", (long long)atomic_load(&m->writer_epoch));
    long long unowned = atomic_load(&m->unowned_partitions);
    header(out, "ces2pg_partitions_not_owned", "gauge",
           "Partitions of the subscribed topics another consumer of the group holds: a writer "
           "that does not own them all cannot apply its transactions whole.");
    if (unowned >= 0)
        fprintf(out, "ces2pg_partitions_not_owned %lld\n", unowned);
}

/* The retries by reason (lock-free). */
static void render_retries(ces_metrics_t *m, FILE *out) {
    header(out, "ces2pg_postgres_retries_total", "counter",
           "Backoff waits before PostgreSQL is tried again after a transient failure (connecting, "
           "a batch rolled back, a target table read again), by reason.");
    for (size_t i = 0; i < CES_APPLY_NRETRY_REASONS; i++)
        fprintf(out, "ces2pg_postgres_retries_total{reason=\"%s\"} %llu\n", retry_reasons[i],
                atomic_load(&m->retries[i]));
    unsigned long long unknown = atomic_load(&m->retries[CES_APPLY_NRETRY_REASONS]);
    if (unknown > 0)
        fprintf(out, "ces2pg_postgres_retries_total{reason=\"unknown\"} %llu\n", unknown);
}

void ces_metrics_token_used(ces_metrics_t *m, ces_metrics_side_t side) {
    atomic_store(&m->token_used[side], true);
}

void ces_metrics_token_fetched(ces_metrics_t *m, ces_metrics_side_t side, int64_t expires_at_ms) {
    atomic_store(&m->token_expires_ms[side], expires_at_ms);
}

void ces_metrics_token_failed(ces_metrics_t *m, ces_metrics_side_t side) {
    atomic_fetch_add(&m->token_failures[side], 1);
}

/* The Microsoft Entra tokens (lock-free): the families always, series for the sides using them. */
static void render_tokens(ces_metrics_t *m, FILE *out, const struct timespec *now) {
    int64_t now_ms = (int64_t)now->tv_sec * 1000 + now->tv_nsec / 1000000;
    header(out, "ces2pg_identity_token_expiry_seconds", "gauge",
           "Seconds until the latest Microsoft Entra token of a side (kafka, postgres) expires; "
           "negative once it has.");
    for (size_t i = 0; i < CES_METRICS_NSIDES; i++) {
        int64_t expires = atomic_load(&m->token_expires_ms[i]);
        if (atomic_load(&m->token_used[i]) && expires > 0)
            fprintf(out, "ces2pg_identity_token_expiry_seconds{side=\"%s\"} %.3f\n",
                    side_names[i], (double)(expires - now_ms) / 1000);
    }
    header(out, "ces2pg_identity_token_fetch_failures_total", "counter",
           "Microsoft Entra token fetches that failed (the endpoint unreachable, slow or "
           "refusing), by side.");
    for (size_t i = 0; i < CES_METRICS_NSIDES; i++) {
        if (atomic_load(&m->token_used[i]))
            fprintf(out, "ces2pg_identity_token_fetch_failures_total{side=\"%s\"} %llu\n",
                    side_names[i], atomic_load(&m->token_failures[i]));
    }
}

/* The gauges (under the lock). */
static void render_gauges(ces_metrics_t *m, FILE *out) {
    const ces_pipeline_stats_t *st = &m->stats;
    header(out, "ces2pg_postgres_connected", "gauge", "1 while connected to PostgreSQL.");
    fprintf(out, "ces2pg_postgres_connected %d\n", atomic_load(&m->connected) ? 1 : 0);
    header(out, "ces2pg_partitions_assigned", "gauge", "Kafka partitions assigned to ces2pg.");
    fprintf(out, "ces2pg_partitions_assigned %zu\n", atomic_load(&m->assigned));
    header(out, "ces2pg_kafka_fetch_wakeups_total", "counter",
           "Times librdkafka's fetcher was woken up: its prefetch queue had filled up and drained "
           "to half, or a paused partition was resumed (under a backlog these are frequent: each "
           "saves librdkafka 2.0 up to a second of idling).");
    fprintf(out, "ces2pg_kafka_fetch_wakeups_total %llu\n", atomic_load(&m->fetch_wakeups));
    header(out, "ces2pg_consumer_lag", "gauge",
           "Records of a partition not yet applied: high watermark minus the position stored in "
           "PostgreSQL.");
    for (size_t i = 0; i < m->npartitions; i++) {
        int64_t lag = partition_lag(&m->partitions[i]);
        if (lag < 0)
            continue;
        fprintf(out, "ces2pg_consumer_lag{topic=\"");
        put_label(out, m->partitions[i].topic);
        fprintf(out, "\",partition=\"%d\"} %lld\n", (int)m->partitions[i].partition,
                (long long)lag);
    }
    if (st->reorder_window_ms >= 0) {
        header(out, "ces2pg_reorder_window_seconds", "gauge",
               "The effective reorder window of transaction mode: how long a caught-up partition "
               "must be quiet before the transactions it could still add to are applied.");
        fprintf(out, "ces2pg_reorder_window_seconds %.3f\n", (double)st->reorder_window_ms / 1000);
    }
    header(out, "ces2pg_pending_segment_groups", "gauge",
           "Segment groups waiting for the rest of their event.");
    fprintf(out, "ces2pg_pending_segment_groups %zu\n", st->pending_segments);
    header(out, "ces2pg_pending_events", "gauge",
           "Events held until their source transaction can be applied in order.");
    fprintf(out, "ces2pg_pending_events %zu\n", st->pending_events);
    header(out, "ces2pg_pending_bytes", "gauge",
           "Memory of the events held for ordering (bounded by apply.max_pending_bytes).");
    fprintf(out, "ces2pg_pending_bytes %zu\n", st->pending_bytes);
    header(out, "ces2pg_pending_transactions", "gauge",
           "Source transactions held until they can be applied in order.");
    fprintf(out, "ces2pg_pending_transactions %zu\n", st->pending_transactions);
    header(out, "ces2pg_reassembly_bytes", "gauge",
           "Bytes of segments held for reassembly (bounded by reassembly.max_bytes).");
    fprintf(out, "ces2pg_reassembly_bytes %zu\n", st->pending_segment_bytes);
    if (m->has_commit_time) {
        header(out, "ces2pg_last_applied_commit_timestamp_seconds", "gauge",
               "Source commit time (envelope time) of the last event applied, seconds since the "
               "epoch.");
        fprintf(out, "ces2pg_last_applied_commit_timestamp_seconds %.3f\n", m->last_commit_time);
        header(out, "ces2pg_replication_delay_seconds", "gauge",
               "Time from the source commit of the last applied event to its commit in "
               "PostgreSQL.");
        fprintf(out, "ces2pg_replication_delay_seconds %.3f\n", m->last_delay);
    }
}

int ces_metrics_render(ces_metrics_t *m, char **out_buf, size_t *out_len) {
    *out_buf = NULL;
    *out_len = 0;
    FILE *out = open_memstream(out_buf, out_len);
    if (out == NULL)
        return -1;
    long rss = process_rss_bytes();
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);

    pthread_mutex_lock(&m->lock);
    render_counters(m, out);
    render_gauges(m, out);
    pthread_mutex_unlock(&m->lock);
    render_retries(m, out);
    render_tokens(m, out, &now);
    render_role(m, out);
    if (rss >= 0) {
        header(out, "ces2pg_process_resident_memory_bytes", "gauge",
               "Resident memory of the ces2pg process.");
        fprintf(out, "ces2pg_process_resident_memory_bytes %ld\n", rss);
    }
    header(out, "ces2pg_scrape_timestamp_seconds", "gauge", "When this page was made.");
    fprintf(out, "ces2pg_scrape_timestamp_seconds %lld.%03ld\n", (long long)now.tv_sec,
            now.tv_nsec / 1000000);
    if (fclose(out) != 0 || *out_buf == NULL) {
        free(*out_buf);
        *out_buf = NULL;
        return -1;
    }
    return 0;
}
