#include "input/consumer.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf/secret.h"
#include "input/kafkaconf.h"
#include "input/kafkaerr.h"
#include "input/nudger.h"
#include "input/oauth.h"
#include "util/clock.h"
#include "util/log.h"

struct ces_consumer_s {
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue; /* the consumer queue, for the nudger */
    ces_nudger_t *nudger;    /* NULL when it could not start */
    ces_consumer_callbacks_t callbacks;
    size_t assigned;
    bool joined; /* a first assignment arrived */
    /* Any assignment arrived (also one whose positions could not be read): the group's assignor
     * has made its state, which librdkafka before 2.3.0 needs at destroy (settle_join). */
    bool synced;
    /* Closing a consumer that never had an assignment: what the group assigns now is taken and
     * given back for librdkafka's sake, never the owner's. */
    bool closing;
    struct ces_consumer_s *next_abandoned; /* see abandoned */
    bool failed; /* a callback asked to stop, or a Kafka error that retrying cannot fix */
    /* Secrets that must never reach the log, even through librdkafka's own messages: the Event
     * Hubs connection string and its SharedAccessKey. Owned; NULL when absent. */
    char *secrets[2];
    char eof_topic[256];
    char failure[1024];
    ces_oauth_t *oauth; /* kafka.auth = "entra": the tokens librdkafka asks for; else NULL */
    int64_t brokers_down_since; /* librdkafka said no broker is up, and nothing came since; 0 */
};

/* in, or a copy in out with every secret of c replaced by "(redacted)". */
static const char *redact(const ces_consumer_t *c, const char *in, char *out, size_t out_size) {
    size_t nsecrets = sizeof(c->secrets) / sizeof(c->secrets[0]);
    bool hit = false;
    for (size_t i = 0; c != NULL && i < nsecrets; i++)
        hit = hit || (c->secrets[i] != NULL && strstr(in, c->secrets[i]) != NULL);
    if (!hit)
        return in;
    static const char mark[] = "(redacted)";
    size_t o = 0;
    for (const char *p = in; *p != '\0' && o + 1 < out_size;) {
        size_t matched = 0;
        for (size_t i = 0; i < nsecrets && matched == 0; i++) {
            size_t n = c->secrets[i] ? strlen(c->secrets[i]) : 0;
            if (n > 0 && strncmp(p, c->secrets[i], n) == 0)
                matched = n;
        }
        if (matched > 0) {
            size_t n = sizeof(mark) - 1 < out_size - 1 - o ? sizeof(mark) - 1 : out_size - 1 - o;
            memcpy(out + o, mark, n);
            o += n;
            p += matched;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return out;
}

static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    char safe[4096];
    buf = redact(rd_kafka_opaque(rk), buf, safe, sizeof(safe));
    /* syslog levels: 0-3 errors, 4 warning, 5-6 notice/info, 7 debug */
    ces_log_level_t l = level <= 3   ? CES_LOG_ERROR
                        : level == 4 ? CES_LOG_WARNING
                        : level <= 6 ? CES_LOG_INFO
                                     : CES_LOG_DEBUG;
    ces_log(l, "kafka: %s: %s", fac, buf);
}

/* Runs on the thread that polls (the main queue is forwarded to the consumer queue): sets the
 * failure that ces_consumer_poll reports. */
static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    ces_consumer_t *c = opaque;
    char safe[1024];
    reason = redact(c, reason, safe, sizeof(safe));
    ces_kafkaerr_class_t cls = ces_kafkaerr_classify((rd_kafka_resp_err_t)err, reason);
    char why[512];
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && c->brokers_down_since == 0)
        c->brokers_down_since = ces_clock_now_ms();
    if (cls == CES_KAFKAERR_AUTHENTICATION && c->oauth != NULL &&
        strstr(reason, "Failed to acquire SASL OAUTHBEARER token") != NULL) {
        /* Our own fetch failed (oauth.c): the identity layer logged why, librdkafka asks again
         * in 10 s, and a refusal for good is reported by ces_consumer_poll. */
        ces_log_debug("kafka: %s", reason);
        return;
    }
    if (cls == CES_KAFKAERR_AUTHENTICATION && c->oauth != NULL && !c->failed) {
        /* Event Hubs and Kafka's validator refuse a token for another audience, or an identity
         * without the role, the same way: say which audience ces2pg asked for. */
        c->failed = true;
        snprintf(c->failure, sizeof(c->failure),
                 "kafka: the broker refused the Microsoft Entra token (audience %s; check "
                 "kafka.entra_scope, and that the identity has the role \"Azure Event Hubs Data "
                 "Receiver\" on the event hub): %s",
                 ces_oauth_scope(c->oauth), reason);
        return;
    }
    if (cls == CES_KAFKAERR_FATAL) {
        rd_kafka_fatal_error(rk, why, sizeof(why));
        reason = redact(c, why, safe, sizeof(safe));
    }
    if (cls == CES_KAFKAERR_TRANSIENT || c->failed) {
        /* Transient (librdkafka reconnects by itself), or the daemon is stopping already. */
        ces_log_warning("kafka: %s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
        return;
    }
    /* ces_consumer_poll reports it; the daemon logs it and exits 1. */
    c->failed = true;
    snprintf(c->failure, sizeof(c->failure), "kafka: %s: %s", ces_kafkaerr_advice(cls), reason);
}

static void consumer_free(ces_consumer_t *c) {
    for (size_t i = 0; i < sizeof(c->secrets) / sizeof(c->secrets[0]); i++)
        free(c->secrets[i]);
    ces_oauth_destroy(c->oauth);
    free(c);
}

/* librdkafka asks for a token (at start, and at 80% of each one's life). */
static void token_refresh_cb(rd_kafka_t *rk, const char *oauthbearer_config, void *opaque) {
    (void)oauthbearer_config;
    ces_consumer_t *c = opaque;
    ces_oauth_refresh(c->oauth, rk);
}

/* A consumer with the secrets of config that the log must never show, or NULL when out of
 * memory. */
static ces_consumer_t *consumer_alloc(const ces_config_t *config) {
    ces_consumer_t *c = calloc(1, sizeof(*c));
    const char *conn = config->kafka_eventhubs_connection_string;
    if (c != NULL && config->kafka_token.fetch != NULL &&
        (c->oauth = ces_oauth_new(&config->kafka_token, config->kafka_entra_scope)) == NULL) {
        consumer_free(c);
        return NULL;
    }
    if (c == NULL || conn == NULL)
        return c;
    if ((c->secrets[0] = strdup(conn)) == NULL) {
        consumer_free(c);
        return NULL;
    }
    c->secrets[1] = ces_secret_shared_access_key(conn);
    return c;
}

/* The librdkafka configuration of config with c's log and error callbacks (c is their opaque),
 * or NULL with *status and errstr set. */
static rd_kafka_conf_t *consumer_conf(ces_consumer_t *c, const ces_config_t *config,
                                      ces_consumer_status_t *status, char *errstr,
                                      size_t errstr_size) {
    rd_kafka_conf_t *conf = ces_kafkaconf_build(config, status, errstr, errstr_size);
    if (conf == NULL)
        return NULL;
    rd_kafka_conf_set_log_cb(conf, log_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    rd_kafka_conf_set_opaque(conf, c);
    if (c->oauth != NULL)
        ces_oauth_attach(conf, token_refresh_cb);
    return conf;
}

ces_consumer_status_t ces_consumer_check_config(const ces_config_t *config, char *errstr,
                                                size_t errstr_size) {
    ces_consumer_status_t status;
    rd_kafka_conf_t *conf = ces_kafkaconf_build(config, &status, errstr, errstr_size);
    if (conf != NULL)
        rd_kafka_conf_destroy(conf);
    return status;
}

ces_consumer_status_t ces_consumer_property(const ces_config_t *config, const char *name,
                                            char *value, size_t value_size, char *errstr,
                                            size_t errstr_size) {
    ces_consumer_status_t status;
    rd_kafka_conf_t *conf = ces_kafkaconf_build(config, &status, errstr, errstr_size);
    if (conf == NULL)
        return status;
    size_t size = value_size;
    if (rd_kafka_conf_get(conf, name, value, &size) != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "librdkafka has no value for '%s'", name);
        status = CES_CONSUMER_CONFIG;
    }
    rd_kafka_conf_destroy(conf);
    return status;
}

/* Calls the owner's callback once per topic present in parts. */
static int for_each_topic(ces_consumer_t *c, rd_kafka_topic_partition_list_t *parts, bool assign) {
    int32_t *partitions = calloc((size_t)parts->cnt + 1, sizeof(int32_t));
    int64_t *offsets = calloc((size_t)parts->cnt + 1, sizeof(int64_t));
    bool *done = calloc((size_t)parts->cnt + 1, sizeof(bool));
    int *idx = calloc((size_t)parts->cnt + 1, sizeof(int));
    int rc = -1;
    if (partitions == NULL || offsets == NULL || done == NULL || idx == NULL)
        goto out;
    for (int i = 0; i < parts->cnt; i++) {
        if (done[i])
            continue;
        const char *topic = parts->elems[i].topic;
        size_t n = 0;
        for (int j = i; j < parts->cnt; j++) {
            if (!done[j] && strcmp(parts->elems[j].topic, topic) == 0) {
                done[j] = true;
                idx[n] = j;
                partitions[n++] = parts->elems[j].partition;
            }
        }
        if (assign) {
            if (c->callbacks.assigned(c->callbacks.opaque, topic, partitions, n, offsets) != 0)
                goto out;
            for (size_t k = 0; k < n; k++)
                parts->elems[idx[k]].offset =
                    offsets[k] == CES_OFFSET_UNSET ? RD_KAFKA_OFFSET_INVALID : offsets[k];
        } else if (c->callbacks.revoked(c->callbacks.opaque, topic, partitions, n) != 0) {
            goto out;
        }
    }
    rc = 0;
out:
    free(partitions);
    free(offsets);
    free(done);
    free(idx);
    return rc;
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
    ces_consumer_t *c = opaque;
    bool cooperative = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    rd_kafka_error_t *error = NULL;
    rd_kafka_resp_err_t ret = RD_KAFKA_RESP_ERR_NO_ERROR;

    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
        c->synced = true;
    if (c->closing) {
        bool assign = err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        if (cooperative)
            error = assign ? rd_kafka_incremental_assign(rk, parts)
                           : rd_kafka_incremental_unassign(rk, parts);
        else
            ret = rd_kafka_assign(rk, assign ? parts : NULL);
    } else if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        if (for_each_topic(c, parts, true) != 0) {
            c->failed = true;
            snprintf(c->failure, sizeof(c->failure), "could not read stored positions");
            /* Take nothing: without the positions from PostgreSQL we must not consume. */
            if (cooperative)
                error = rd_kafka_incremental_assign(rk, NULL);
            else
                ret = rd_kafka_assign(rk, NULL);
        } else {
            if (cooperative)
                error = rd_kafka_incremental_assign(rk, parts);
            else
                ret = rd_kafka_assign(rk, parts);
            c->assigned = cooperative ? c->assigned + (size_t)parts->cnt : (size_t)parts->cnt;
            c->joined = true;
            /* A cooperative rebalance that moves nothing here assigns an empty list: not news.
             * The count is what this instance owns now. */
            if (cooperative && parts->cnt > 0)
                ces_log_info("assigned %zu partition(s) (%d new, cooperative)", c->assigned,
                             parts->cnt);
            else if (!cooperative)
                ces_log_info("assigned %d partition(s)", parts->cnt);
        }
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        /* A lost assignment (session timed out) may already belong to someone else: its pending
         * work is dropped by the owner, and the fenced offsets update refuses a stale write. */
        if (rd_kafka_assignment_lost(rk))
            ces_log_warning("assignment of %d partition(s) lost", parts->cnt);
        if (for_each_topic(c, parts, false) != 0) {
            c->failed = true;
            snprintf(c->failure, sizeof(c->failure), "could not commit work of revoked partitions");
        }
        if (cooperative) {
            error = rd_kafka_incremental_unassign(rk, parts);
            c->assigned = c->assigned >= (size_t)parts->cnt ? c->assigned - (size_t)parts->cnt : 0;
        } else {
            ret = rd_kafka_assign(rk, NULL);
            c->assigned = 0;
        }
        ces_log_info("revoked %d partition(s)%s", parts->cnt,
                     cooperative ? " (cooperative: the others stay)" : "");
    } else {
        ces_log_error("kafka: rebalance failed: %s", rd_kafka_err2str(err));
        if (cooperative)
            error = rd_kafka_incremental_unassign(rk, parts);
        else
            ret = rd_kafka_assign(rk, NULL);
        c->assigned = 0;
    }
    if (error != NULL) {
        ces_log_error("kafka: incremental (un)assign failed: %s", rd_kafka_error_string(error));
        rd_kafka_error_destroy(error);
    } else if (ret != RD_KAFKA_RESP_ERR_NO_ERROR) {
        ces_log_error("kafka: assign failed: %s", rd_kafka_err2str(ret));
    }
}

ces_consumer_status_t ces_consumer_new(const ces_config_t *config,
                                       const ces_consumer_callbacks_t *callbacks,
                                       ces_consumer_t **out, char *errstr, size_t errstr_size) {
    ces_consumer_status_t status;
    *out = NULL;
    ces_consumer_t *c = consumer_alloc(config);
    if (c == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_CONSUMER_FATAL;
    }
    c->callbacks = *callbacks;
    rd_kafka_conf_t *conf = consumer_conf(c, config, &status, errstr, errstr_size);
    if (conf == NULL) {
        consumer_free(c);
        return status;
    }
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    int64_t max_messages = ces_kafkaconf_int(conf, "queued.min.messages", 100000);
    int64_t max_bytes = ces_kafkaconf_int(conf, "queued.max.messages.kbytes", 65536) * 1024;
    char err[512];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (c->rk == NULL) {
        rd_kafka_conf_destroy(conf);
        char safe[sizeof(err)];
        snprintf(errstr, errstr_size, "%s: creating the Kafka consumer: %s", config->path,
                 redact(c, err, safe, sizeof(safe)));
        consumer_free(c);
        return CES_CONSUMER_CONFIG;
    }
    if (c->oauth != NULL && ces_oauth_start(c->rk, errstr, errstr_size) != 0) {
        ces_consumer_destroy(c);
        return CES_CONSUMER_FATAL;
    }
    rd_kafka_poll_set_consumer(c->rk);
    c->queue = rd_kafka_queue_get_consumer(c->rk);
    if (c->queue != NULL)
        c->nudger = ces_nudger_new(c->rk, c->queue, max_messages, max_bytes);

    rd_kafka_topic_partition_list_t *topics =
        rd_kafka_topic_partition_list_new((int)config->kafka_topics.count);
    for (size_t i = 0; i < config->kafka_topics.count; i++)
        rd_kafka_topic_partition_list_add(topics, config->kafka_topics.items[i],
                                          RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t rerr = rd_kafka_subscribe(c->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (rerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errstr, errstr_size, "subscribing: %s", rd_kafka_err2str(rerr));
        ces_nudger_destroy(c->nudger);
        if (c->queue != NULL)
            rd_kafka_queue_destroy(c->queue);
        rd_kafka_destroy(c->rk);
        consumer_free(c);
        return CES_CONSUMER_FATAL;
    }
    ces_log_info("subscribed to %zu topic(s) as group '%s' (librdkafka %s)",
                 config->kafka_topics.count, config->kafka_group_id, rd_kafka_version_str());
    *out = c;
    return CES_CONSUMER_OK;
}

/* Whether destroying the handle would abort: librdkafka before 2.3.0 (Debian 12 has 2.0.2)
 * asserts in rd_kafka_destroy() when a cooperative-sticky consumer's group answered its JoinGroup
 * (which picks the assignor, and makes rd_kafka_rebalance_protocol() say COOPERATIVE) but no
 * SyncGroup gave it an assignment yet, so the assignor's state is still NULL (librdkafka issue
 * 4312, fixed by pull request 4381). unknown: the answer when librdkafka cannot tell any more
 * (after rd_kafka_consumer_close(), rd_kafka_rebalance_protocol() may answer NULL). */
static bool destroy_would_abort(const ces_consumer_t *c, bool unknown) {
    if (c->synced)
        return false;
    const char *protocol = rd_kafka_rebalance_protocol(c->rk);
    return protocol != NULL ? strcmp(protocol, "COOPERATIVE") == 0 : unknown;
}

/* Consumers whose handle could not be destroyed (destroy_would_abort), kept reachable: they are
 * left on purpose, not lost. Main thread only. */
static ces_consumer_t *abandoned;

/* The longest a closing consumer waits for its group's first assignment. */
#define SETTLE_JOIN_MS 10000

/* A consumer stopped between its JoinGroup and its first assignment (a writer told to stop, or
 * to stand by, right after it subscribed) lets the join finish, for at most SETTLE_JOIN_MS,
 * taking nothing of what it is assigned, so that the handle can be destroyed. Returns whether
 * destroying it would still abort. */
static bool settle_join(ces_consumer_t *c) {
    if (!destroy_would_abort(c, false))
        return false;
    c->closing = true;
    int64_t until = ces_clock_now_ms() + SETTLE_JOIN_MS;
    char reason[128];
    while (!c->synced && rd_kafka_fatal_error(c->rk, reason, sizeof(reason)) == 0 &&
           ces_clock_now_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 100);
        if (m != NULL)
            rd_kafka_message_destroy(m);
    }
    return destroy_would_abort(c, true);
}

void ces_consumer_destroy(ces_consumer_t *c) {
    if (c == NULL)
        return;
    ces_nudger_destroy(c->nudger);
    if (c->queue != NULL)
        rd_kafka_queue_destroy(c->queue);
    bool would_abort = settle_join(c);
    /* Leaving the group revokes the assignment, so the owner commits what is complete. */
    rd_kafka_resp_err_t err = rd_kafka_consumer_close(c->rk);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        ces_log_warning("kafka: closing the consumer: %s", rd_kafka_err2str(err));
    if (destroy_would_abort(c, would_abort)) {
        /* The group is left and the handle never used again; it and c (its callbacks' opaque:
         * librdkafka's threads may still log through it) go with the process, or stay, idle,
         * beside the next consumer of a writer that stood down. */
        ces_log_warning("kafka: the consumer group did not finish joining within %d s; the "
                        "Kafka client is left as it is (destroying it now would abort: "
                        "librdkafka %s, fixed in 2.3.0)",
                        SETTLE_JOIN_MS / 1000, rd_kafka_version_str());
        c->next_abandoned = abandoned;
        abandoned = c;
        return;
    }
    rd_kafka_destroy(c->rk);
    consumer_free(c);
}

ces_poll_status_t ces_consumer_poll(ces_consumer_t *c, int timeout_ms, ces_record_t *record,
                                    char *errstr, size_t errstr_size) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, timeout_ms);
    ces_nudger_watch(c->nudger, m != NULL && m->err == RD_KAFKA_RESP_ERR_NO_ERROR ? m : NULL);
    if (!c->failed && ces_oauth_refused(c->oauth, c->failure, sizeof(c->failure)))
        c->failed = true;
    if (c->failed) {
        snprintf(errstr, errstr_size, "%s", c->failure);
        if (m != NULL) /* librdkafka does not accept NULL here */
            rd_kafka_message_destroy(m);
        return CES_POLL_FATAL;
    }
    if (m == NULL)
        return CES_POLL_IDLE;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR || m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
        c->brokers_down_since = 0;
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        /* Copied: the name belongs to the message's topic handle. */
        snprintf(c->eof_topic, sizeof(c->eof_topic), "%s", rd_kafka_topic_name(m->rkt));
        record->topic = c->eof_topic;
        record->partition = m->partition;
        record->offset = m->offset;
        record->handle = NULL;
        rd_kafka_message_destroy(m);
        return CES_POLL_EOF;
    }
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_resp_err_t err = m->err;
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
            char why[400];
            rd_kafka_fatal_error(c->rk, why, sizeof(why));
            snprintf(errstr, errstr_size, "kafka: fatal error: %s", why);
            rd_kafka_message_destroy(m);
            return CES_POLL_FATAL;
        }
        if (err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET && m->rkt != NULL) {
            /* auto.offset.reset=error: the position to resume from is gone and librdkafka stops
             * the partition; the pipeline judges the gap. (With earliest or latest librdkafka moves
             * on by itself, and the pipeline sees the gap in the first record's offset.) */
            snprintf(c->eof_topic, sizeof(c->eof_topic), "%s", rd_kafka_topic_name(m->rkt));
            record->topic = c->eof_topic;
            record->partition = m->partition;
            record->offset = m->offset;
            record->handle = NULL;
            ces_log_debug("kafka: %s [%d]: %s", c->eof_topic, (int)m->partition,
                          rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            return CES_POLL_OUT_OF_RANGE;
        }
        if (err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            ces_log_warning("kafka: %s%s%s [%d]: %s", rd_kafka_err2name(err),
                            m->rkt ? " on " : "", m->rkt ? rd_kafka_topic_name(m->rkt) : "",
                            (int)m->partition, rd_kafka_message_errstr(m));
        rd_kafka_message_destroy(m);
        return CES_POLL_IDLE;
    }
    record->topic = rd_kafka_topic_name(m->rkt);
    record->partition = m->partition;
    record->offset = m->offset;
    record->value = m->payload;
    record->len = m->len;
    record->handle = m;
    return CES_POLL_RECORD;
}

void ces_consumer_give_back(void *handle) {
    if (handle != NULL)
        rd_kafka_message_destroy(handle);
}

void ces_consumer_store_offset(ces_consumer_t *c, const char *topic, int32_t partition,
                               int64_t next_offset) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition)->offset = next_offset;
    rd_kafka_resp_err_t err = rd_kafka_offsets_store(c->rk, l);
    /* Fails harmlessly for a partition that was just revoked. */
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        ces_log_debug("kafka: storing offset %s[%d]@%lld: %s", topic, (int)partition,
                      (long long)next_offset, rd_kafka_err2str(err));
    rd_kafka_topic_partition_list_destroy(l);
}

/* How long a seek may take to be placed, by ces2pg's clock. librdkafka before 2.1 waited for the
 * answer to a seek in the wrong unit (its pull request 4230), far shorter than it was asked to, so
 * a seek its broker thread answers a few milliseconds late (a busy machine, a broker reconnecting)
 * reports a timeout while it goes on; ending the daemon for that turned a busy moment into a
 * restart. Such a seek is placed again (the same offset: harmless) until this long has passed. */
#define SEEK_MS 10000
#define SEEK_TRY_MS 1000
#define SEEK_PAUSE_NS (50 * 1000 * 1000)

int ces_consumer_seek(ces_consumer_t *c, const char *topic, int32_t partition, int64_t offset) {
    int64_t deadline = ces_clock_now_ms() + SEEK_MS;
    rd_kafka_resp_err_t err;
    const char *why;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_t *tp = rd_kafka_topic_partition_list_add(l, topic, partition);
    do {
        tp->offset = offset;
        tp->err = RD_KAFKA_RESP_ERR_NO_ERROR;
        rd_kafka_error_t *error = rd_kafka_seek_partitions(c->rk, l, SEEK_TRY_MS);
        err = error != NULL ? rd_kafka_error_code(error) : tp->err;
        why = error != NULL ? rd_kafka_err2str(err) : rd_kafka_err2str(tp->err);
        if (error != NULL)
            rd_kafka_error_destroy(error);
        if (err != RD_KAFKA_RESP_ERR__TIMED_OUT)
            break;
        nanosleep(&(struct timespec){.tv_nsec = SEEK_PAUSE_NS}, NULL);
    } while (ces_clock_now_ms() < deadline);
    rd_kafka_topic_partition_list_destroy(l);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        return 0;
    ces_log_error("kafka: seeking %s[%d] to %lld: %s", topic, (int)partition, (long long)offset,
                  why);
    return -1;
}

int ces_consumer_pause(ces_consumer_t *c, const char *topic, int32_t partition, bool pause) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition);
    rd_kafka_resp_err_t err =
        pause ? rd_kafka_pause_partitions(c->rk, l) : rd_kafka_resume_partitions(c->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        ces_log_warning("kafka: %s %s[%d]: %s", pause ? "pausing" : "resuming", topic,
                        (int)partition, rd_kafka_err2str(err));
        return -1;
    }
    /* A resumed partition waits for its broker's thread to look again, like a full queue. */
    if (!pause)
        ces_nudger_nudge(c->nudger);
    return 0;
}

int ces_consumer_high_watermark(ces_consumer_t *c, const char *topic, int32_t partition,
                                int64_t *high) {
    int64_t low;
    if (rd_kafka_get_watermark_offsets(c->rk, topic, partition, &low, high) !=
            RD_KAFKA_RESP_ERR_NO_ERROR ||
        *high < 0)
        return -1;
    return 0;
}

size_t ces_consumer_assigned_count(const ces_consumer_t *c) { return c->assigned; }

bool ces_consumer_joined(const ces_consumer_t *c) { return c->joined; }

bool ces_consumer_fenced(ces_consumer_t *c) {
    char why[8];
    return rd_kafka_fatal_error(c->rk, why, sizeof(why)) == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID;
}

int64_t ces_consumer_brokers_down_since(const ces_consumer_t *c) { return c->brokers_down_since; }

int64_t ces_consumer_count_partitions(ces_consumer_t *c, char *const *topics, size_t n,
                                      int timeout_ms) {
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(c->rk, topics[i], NULL);
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t err = rkt ? rd_kafka_metadata(c->rk, 0, rkt, &md, timeout_ms)
                                      : RD_KAFKA_RESP_ERR__FAIL;
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && md->topics[0].err == 0)
            total += md->topics[0].partition_cnt;
        else
            total = -1;
        if (md != NULL)
            rd_kafka_metadata_destroy(md);
        if (rkt != NULL)
            rd_kafka_topic_destroy(rkt);
        if (total < 0)
            return -1;
    }
    c->brokers_down_since = 0; /* a broker answered */
    return total;
}

uint64_t ces_consumer_fetch_wakeups(const ces_consumer_t *c) {
    return ces_nudger_wakeups(c->nudger);
}

/* How long `status` waits for each answer of the brokers. */
#define INSPECT_TIMEOUT_MS 10000

/* Calls fn for every partition of topic with its watermarks. Returns CES_CONSUMER_OK, or
 * CES_CONSUMER_FATAL with errstr set when the brokers do not know the topic. */
static ces_consumer_status_t inspect_topic(rd_kafka_t *rk, const char *topic,
                                           void (*fn)(void *arg, const char *topic,
                                                      int32_t partition, int64_t low,
                                                      int64_t high),
                                           void *arg, char *errstr, size_t errstr_size) {
    ces_consumer_status_t status = CES_CONSUMER_OK;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e =
        rkt ? rd_kafka_metadata(rk, 0, rkt, &md, INSPECT_TIMEOUT_MS) : RD_KAFKA_RESP_ERR__FAIL;
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt < 1 || md->topics[0].err) {
        snprintf(errstr, errstr_size, "kafka: topic %s: %s", topic,
                 rd_kafka_err2str(e ? e : md->topic_cnt ? md->topics[0].err
                                                        : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
        status = CES_CONSUMER_FATAL;
    }
    for (int i = 0; status == CES_CONSUMER_OK && i < md->topics[0].partition_cnt; i++) {
        int32_t partition = md->topics[0].partitions[i].id;
        int64_t low = -1, high = -1;
        if (rd_kafka_query_watermark_offsets(rk, topic, partition, &low, &high,
                                             INSPECT_TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR)
            low = high = -1;
        fn(arg, topic, partition, low, high);
    }
    if (md != NULL)
        rd_kafka_metadata_destroy(md);
    if (rkt != NULL)
        rd_kafka_topic_destroy(rkt);
    return status;
}

ces_consumer_status_t ces_consumer_inspect(const ces_config_t *config,
                                           void (*fn)(void *arg, const char *topic,
                                                      int32_t partition, int64_t low,
                                                      int64_t high),
                                           void *arg, int *members, char *state,
                                           size_t state_size, char *errstr, size_t errstr_size) {
    ces_consumer_status_t status;
    *members = -1;
    snprintf(state, state_size, "unknown");
    /* The log and error callbacks redact the secrets of this stand-in consumer. */
    ces_consumer_t *c = consumer_alloc(config);
    if (c == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_CONSUMER_FATAL;
    }
    rd_kafka_t *rk = NULL;
    rd_kafka_conf_t *conf = consumer_conf(c, config, &status, errstr, errstr_size);
    if (conf == NULL)
        goto done;
    char err[512];
    rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (rk == NULL) {
        rd_kafka_conf_destroy(conf);
        char safe[sizeof(err)];
        snprintf(errstr, errstr_size, "creating a Kafka client: %s",
                 redact(c, err, safe, sizeof(safe)));
        status = CES_CONSUMER_FATAL;
        goto done;
    }
    status = CES_CONSUMER_OK;
    if (c->oauth != NULL && ces_oauth_start(rk, errstr, errstr_size) != 0)
        status = CES_CONSUMER_FATAL;
    for (size_t t = 0; t < config->kafka_topics.count && status == CES_CONSUMER_OK; t++)
        status = inspect_topic(rk, config->kafka_topics.items[t], fn, arg, errstr, errstr_size);
    /* Brokers without ListGroups (librdkafka's mock cluster) leave the members unknown; a group
     * the brokers do not list has none. */
    const struct rd_kafka_group_list *groups = NULL;
    if (status == CES_CONSUMER_OK &&
        rd_kafka_list_groups(rk, config->kafka_group_id, &groups, INSPECT_TIMEOUT_MS) ==
            RD_KAFKA_RESP_ERR_NO_ERROR) {
        *members = groups->group_cnt > 0 ? groups->groups[0].member_cnt : 0;
        snprintf(state, state_size, "%s",
                 groups->group_cnt > 0 ? groups->groups[0].state : "Dead");
    }
    if (groups != NULL)
        rd_kafka_group_list_destroy(groups);
done:
    if (rk != NULL)
        rd_kafka_destroy(rk);
    consumer_free(c);
    return status;
}

/* The feed: the pipeline sees the consumer only through these. */
static ces_poll_status_t feed_poll(void *opaque, int timeout_ms, ces_record_t *record,
                                   char *errstr, size_t errstr_size) {
    return ces_consumer_poll(opaque, timeout_ms, record, errstr, errstr_size);
}

static void feed_give_back(void *opaque, void *handle) {
    (void)opaque;
    ces_consumer_give_back(handle);
}

static int feed_seek(void *opaque, const char *topic, int32_t partition, int64_t offset) {
    return ces_consumer_seek(opaque, topic, partition, offset);
}

static int feed_pause(void *opaque, const char *topic, int32_t partition, bool pause) {
    return ces_consumer_pause(opaque, topic, partition, pause);
}

static int feed_high_watermark(void *opaque, const char *topic, int32_t partition,
                               int64_t *high) {
    return ces_consumer_high_watermark(opaque, topic, partition, high);
}

static void feed_store_position(void *opaque, const char *topic, int32_t partition,
                                int64_t next) {
    ces_consumer_store_offset(opaque, topic, partition, next);
}

/* How long asking the broker for a partition's watermarks may take. */
#define WATERMARKS_TIMEOUT_MS 5000

static int feed_watermarks(void *opaque, const char *topic, int32_t partition, int64_t *low,
                           int64_t *high) {
    ces_consumer_t *c = opaque;
    rd_kafka_resp_err_t err =
        rd_kafka_query_watermark_offsets(c->rk, topic, partition, low, high, WATERMARKS_TIMEOUT_MS);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        ces_log_warning("kafka: asking the watermarks of %s[%d]: %s", topic, (int)partition,
                        rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

void ces_consumer_feed(ces_consumer_t *c, ces_feed_t *feed) {
    *feed = (ces_feed_t){
        .poll = feed_poll,
        .give_back = feed_give_back,
        .seek = feed_seek,
        .pause = feed_pause,
        .high_watermark = feed_high_watermark,
        .store_position = feed_store_position,
        .watermarks = feed_watermarks,
        .opaque = c,
    };
}
