#include "consumer.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct ces_consumer_s {
    rd_kafka_t *rk;
    ces_consumer_callbacks_t callbacks;
    size_t assigned;
    bool failed; /* a callback asked to stop */
    char failure[512];
};

/* Properties ces2pg sets itself; the user sets them through dedicated keys or not at all. */
static const char *const reserved[] = {"group.id", "enable.auto.offset.store", "bootstrap.servers"};

/* Defaults ces2pg chooses; each may be overridden through kafka.properties. */
static const char *const defaults[][2] = {
    {"auto.offset.reset", "earliest"},
    {"enable.auto.commit", "true"},
    {"enable.partition.eof", "false"},
};

static void log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    (void)rk;
    /* syslog levels: 0-3 errors, 4 warning, 5-6 notice/info, 7 debug */
    ces_log_level_t l = level <= 3   ? CES_LOG_ERROR
                        : level == 4 ? CES_LOG_WARNING
                        : level <= 6 ? CES_LOG_INFO
                                     : CES_LOG_DEBUG;
    ces_log(l, "kafka: %s: %s", fac, buf);
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    (void)opaque;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char why[512];
        rd_kafka_fatal_error(rk, why, sizeof(why));
        ces_log_error("kafka: fatal error: %s", why);
        return;
    }
    /* Transient: librdkafka reconnects by itself. */
    ces_log_warning("kafka: %s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

/* Builds the librdkafka configuration from config. Returns NULL with errstr set. */
static rd_kafka_conf_t *build_conf(const ces_config_t *config, char *errstr, size_t errstr_size,
                                   ces_consumer_status_t *status) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char err[512];
    *status = CES_CONSUMER_CONFIG;
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        if (rd_kafka_conf_set(conf, defaults[i][0], defaults[i][1], err, sizeof(err)) !=
            RD_KAFKA_CONF_OK) {
            snprintf(errstr, errstr_size, "librdkafka: %s", err);
            *status = CES_CONSUMER_FATAL;
            goto fail;
        }
    }
    for (size_t i = 0; i < config->kafka_properties.count; i++) {
        const char *item = config->kafka_properties.items[i];
        int line = config->kafka_properties.lines[i];
        size_t name_len = strcspn(item, "=");
        char name[256];
        snprintf(name, sizeof(name), "%.*s", (int)name_len, item);
        for (size_t r = 0; r < sizeof(reserved) / sizeof(reserved[0]); r++) {
            if (strcmp(name, reserved[r]) == 0) {
                snprintf(errstr, errstr_size,
                         "%s:%d: kafka.properties: '%s' is set by ces2pg itself (use "
                         "kafka.group_id and kafka.brokers)",
                         config->path, line, name);
                goto fail;
            }
        }
        if (rd_kafka_conf_set(conf, name, item + name_len + 1, err, sizeof(err)) !=
            RD_KAFKA_CONF_OK) {
            /* err may quote the value, which may be a secret: name the property only. */
            bool secret = ces_config_is_secret_property(name, strlen(name));
            snprintf(errstr, errstr_size, "%s:%d: kafka.properties: %s", config->path, line,
                     secret ? "invalid value for a credential property" : err);
            if (secret)
                snprintf(errstr + strlen(errstr), errstr_size - strlen(errstr), " '%s'", name);
            goto fail;
        }
    }
    if (config->kafka_brokers != NULL &&
        rd_kafka_conf_set(conf, "bootstrap.servers", config->kafka_brokers, err, sizeof(err)) !=
            RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "%s: kafka.brokers: %s", config->path, err);
        goto fail;
    }
    if (rd_kafka_conf_set(conf, "group.id", config->kafka_group_id, err, sizeof(err)) !=
            RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, sizeof(err)) !=
            RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "%s: kafka.group_id: %s", config->path, err);
        goto fail;
    }
    rd_kafka_conf_set_log_cb(conf, log_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    *status = CES_CONSUMER_OK;
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

ces_consumer_status_t ces_consumer_check_config(const ces_config_t *config, char *errstr,
                                                size_t errstr_size) {
    ces_consumer_status_t status;
    rd_kafka_conf_t *conf = build_conf(config, errstr, errstr_size, &status);
    if (conf != NULL)
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

    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
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
            ces_log_info("assigned %d partition(s)%s", parts->cnt,
                         cooperative ? " (cooperative)" : "");
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
        ces_log_info("revoked %d partition(s)", parts->cnt);
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
    ces_consumer_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_CONSUMER_FATAL;
    }
    c->callbacks = *callbacks;
    rd_kafka_conf_t *conf = build_conf(config, errstr, errstr_size, &status);
    if (conf == NULL) {
        free(c);
        return status;
    }
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_opaque(conf, c);
    char err[512];
    c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (c->rk == NULL) {
        rd_kafka_conf_destroy(conf);
        free(c);
        snprintf(errstr, errstr_size, "%s: creating the Kafka consumer: %s", config->path, err);
        return CES_CONSUMER_CONFIG;
    }
    rd_kafka_poll_set_consumer(c->rk);

    rd_kafka_topic_partition_list_t *topics =
        rd_kafka_topic_partition_list_new((int)config->kafka_topics.count);
    for (size_t i = 0; i < config->kafka_topics.count; i++)
        rd_kafka_topic_partition_list_add(topics, config->kafka_topics.items[i],
                                          RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t rerr = rd_kafka_subscribe(c->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (rerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(errstr, errstr_size, "subscribing: %s", rd_kafka_err2str(rerr));
        rd_kafka_destroy(c->rk);
        free(c);
        return CES_CONSUMER_FATAL;
    }
    ces_log_info("subscribed to %zu topic(s) as group '%s' (librdkafka %s)",
                 config->kafka_topics.count, config->kafka_group_id, rd_kafka_version_str());
    *out = c;
    return CES_CONSUMER_OK;
}

void ces_consumer_destroy(ces_consumer_t *c) {
    if (c == NULL)
        return;
    /* Leaving the group revokes the assignment, so the owner commits what is complete. */
    rd_kafka_resp_err_t err = rd_kafka_consumer_close(c->rk);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        ces_log_warning("kafka: closing the consumer: %s", rd_kafka_err2str(err));
    rd_kafka_destroy(c->rk);
    free(c);
}

ces_poll_status_t ces_consumer_poll(ces_consumer_t *c, int timeout_ms, ces_record_t *record,
                                    char *errstr, size_t errstr_size) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, timeout_ms);
    if (c->failed) {
        snprintf(errstr, errstr_size, "%s", c->failure);
        rd_kafka_message_destroy(m);
        return CES_POLL_FATAL;
    }
    if (m == NULL)
        return CES_POLL_IDLE;
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_resp_err_t err = m->err;
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
            char why[400];
            rd_kafka_fatal_error(c->rk, why, sizeof(why));
            snprintf(errstr, errstr_size, "kafka: fatal error: %s", why);
            rd_kafka_message_destroy(m);
            return CES_POLL_FATAL;
        }
        if (err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET)
            /* The position to resume from is gone (retention, or a recreated topic): events between
             * it and where auto.offset.reset lands were never applied. Say so loudly; setting
             * auto.offset.reset=error in kafka.properties stops the partition instead. */
            ces_log_error("kafka: %s [%d]: %s: events may have been lost at the source",
                          m->rkt ? rd_kafka_topic_name(m->rkt) : "?", (int)m->partition,
                          rd_kafka_message_errstr(m));
        else if (err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
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

void ces_consumer_release(void *handle) {
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

int ces_consumer_seek(ces_consumer_t *c, const char *topic, int32_t partition, int64_t offset) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, partition)->offset = offset;
    rd_kafka_error_t *error = rd_kafka_seek_partitions(c->rk, l, 5000);
    int rc = 0;
    if (error != NULL) {
        ces_log_error("kafka: seeking %s[%d] to %lld: %s", topic, (int)partition,
                      (long long)offset, rd_kafka_error_string(error));
        rd_kafka_error_destroy(error);
        rc = -1;
    } else if (l->elems[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        ces_log_error("kafka: seeking %s[%d] to %lld: %s", topic, (int)partition,
                      (long long)offset, rd_kafka_err2str(l->elems[0].err));
        rc = -1;
    }
    rd_kafka_topic_partition_list_destroy(l);
    return rc;
}

size_t ces_consumer_assigned_count(const ces_consumer_t *c) { return c->assigned; }
