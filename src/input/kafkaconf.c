#include "input/kafkaconf.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf/secret.h"

/* A property and its value. */
typedef struct {
    const char *name;
    const char *value;
} setting_t;

#define COUNT(table) (sizeof(table) / sizeof((table)[0]))

/* Properties ces2pg sets itself; the user sets them through dedicated keys or not at all. */
static const char *const reserved[] = {"group.id", "enable.auto.offset.store", "bootstrap.servers",
                                       "group.instance.id"};

/* Defaults ces2pg chooses; each may be overridden through kafka.properties. */
static const setting_t defaults[] = {
    {"auto.offset.reset", "earliest"},
    {"enable.auto.commit", "true"},
    /* librdkafka hands over one partition's fetch at a time, and in transaction order nothing is
     * released until every partition has delivered past a transaction: with large fetches the
     * orderer holds a large chunk per partition and hits apply.max_pending_events, pausing
     * partitions again and again. So fetches stay small; a batch larger than this is still
     * fetched whole. */
    {"max.partition.fetch.bytes", "262144"},
    /* Under a backlog librdkafka's prefetch with its defaults (100,000 messages or 64 MB) is most
     * of ces2pg's memory. These bound it to about 8 MB; the fetch nudger (nudger.h) keeps so small
     * a prefetch from stalling the fetcher. */
    {"queued.min.messages", "2000"},
    {"queued.max.messages.kbytes", "8192"},
    /* A join or a leave moves only the partitions that change owner: the others keep fetching,
     * and what is held for them in memory stays (pipeline.c drops only a revoked partition's). */
    {"partition.assignment.strategy", "cooperative-sticky"},
    /* A member that vanished (kill -9, a lost host) holds its partitions until its session times
     * out: librdkafka's 45 s was a 45 s gap in replication for the whole group. 10 s, with
     * heartbeats every 3 s, notices it sooner and rides out a pause of a few seconds. With
     * static membership (kafka.group_instance_id) a restarted member gets its partitions back at
     * once whatever this is. Event Hubs mode sets Microsoft's 30 s instead (below). */
    {"session.timeout.ms", "10000"},
    {"heartbeat.interval.ms", "3000"},
};

/* Event Hubs mode (kafka.eventhubs_connection_string): how the Kafka endpoint authenticates. */
static const setting_t eventhubs_security[] = {
    {"security.protocol", "SASL_SSL"},
    {"sasl.mechanisms", "PLAIN"},
    {"sasl.username", "$ConnectionString"},
};

/* Microsoft's recommended client settings for Event Hubs (applied in Event Hubs mode); each may be
 * overridden through kafka.properties. Azure closes connections idle for 240 s. */
static const setting_t eventhubs_defaults[] = {
    {"socket.keepalive.enable", "true"},  {"metadata.max.age.ms", "180000"},
    {"connections.max.idle.ms", "180000"}, {"session.timeout.ms", "30000"},
    {"heartbeat.interval.ms", "3000"},     {"max.poll.interval.ms", "300000"},
};

/* Set from kafka.eventhubs_connection_string; naming them in kafka.properties too is an error. */
static const char *const eventhubs_reserved[] = {"sasl.username", "sasl.password"};

/* kafka.auth = "entra": OAUTHBEARER with the tokens ces2pg fetches (input/oauth.h). TLS as Event
 * Hubs wants it; security.protocol may still be set in kafka.properties (a test broker). */
static const setting_t entra_security[] = {
    {"security.protocol", "SASL_SSL"},
    {"sasl.mechanisms", "OAUTHBEARER"},
};

/* What would fight the tokens ces2pg hands librdkafka: its own OIDC (not in Debian's build), an
 * unsecured JWT, another mechanism, a password. */
static const char *const entra_reserved[] = {"sasl.mechanisms", "sasl.mechanism",
                                             "sasl.oauthbearer.method", "sasl.oauthbearer.config",
                                             "enable.sasl.oauthbearer.unsecure.jwt",
                                             "sasl.username", "sasl.password"};

/* Needed by ces2pg itself: the transaction orderer must know when a partition is caught up. */
static const setting_t forced[] = {
    {"enable.partition.eof", "true"},
};

/* Sets ces2pg's own settings (defaults, Microsoft's, forced): librdkafka refusing one is a fault
 * of this build, not of the configuration. */
static int set_own(rd_kafka_conf_t *conf, const setting_t *table, size_t n,
                   ces_consumer_status_t *status, char *errstr, size_t errstr_size) {
    char err[512];
    for (size_t i = 0; i < n; i++) {
        if (rd_kafka_conf_set(conf, table[i].name, table[i].value, err, sizeof(err)) !=
            RD_KAFKA_CONF_OK) {
            snprintf(errstr, errstr_size, "librdkafka: %s", err);
            *status = CES_CONSUMER_FATAL;
            return -1;
        }
    }
    return 0;
}

/* Event Hubs mode: SASL_SSL with the connection string as the password, then Microsoft's
 * settings. */
static int set_eventhubs(rd_kafka_conf_t *conf, const ces_config_t *config,
                         ces_consumer_status_t *status, char *errstr, size_t errstr_size) {
    char err[512];
    for (size_t i = 0; i < COUNT(eventhubs_security); i++) {
        if (rd_kafka_conf_set(conf, eventhubs_security[i].name, eventhubs_security[i].value, err,
                              sizeof(err)) != RD_KAFKA_CONF_OK) {
            snprintf(errstr, errstr_size, "%s: kafka.eventhubs_connection_string: %s",
                     config->path, err);
            return -1;
        }
    }
    /* librdkafka's message could quote the value: say less. */
    if (rd_kafka_conf_set(conf, "sasl.password", config->kafka_eventhubs_connection_string, err,
                          sizeof(err)) != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size,
                 "%s: kafka.eventhubs_connection_string: librdkafka refused it as sasl.password",
                 config->path);
        return -1;
    }
    return set_own(conf, eventhubs_defaults, COUNT(eventhubs_defaults), status, errstr,
                   errstr_size);
}

static bool entra(const ces_config_t *config) {
    return config->kafka_auth != NULL && strcmp(config->kafka_auth, "entra") == 0;
}

static bool listed(const char *const *names, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(name, names[i]) == 0)
            return true;
    }
    return false;
}

/* One "name=value" of kafka.properties, at line of the file. */
static int set_property(rd_kafka_conf_t *conf, const ces_config_t *config, const char *item,
                        int line, char *errstr, size_t errstr_size) {
    size_t name_len = strcspn(item, "=");
    char name[256];
    snprintf(name, sizeof(name), "%.*s", (int)name_len, item);
    if (config->kafka_eventhubs_connection_string != NULL &&
        listed(eventhubs_reserved, COUNT(eventhubs_reserved), name)) {
        snprintf(errstr, errstr_size,
                 "%s:%d: kafka.properties: '%s' is set from kafka.eventhubs_connection_string: "
                 "remove one of them",
                 config->path, line, name);
        return -1;
    }
    if (entra(config) && listed(entra_reserved, COUNT(entra_reserved), name)) {
        snprintf(errstr, errstr_size,
                 "%s:%d: kafka.properties: '%s' is set by kafka.auth = \"entra\" (ces2pg fetches "
                 "the tokens itself: see the identity section): remove it",
                 config->path, line, name);
        return -1;
    }
    if (listed(reserved, COUNT(reserved), name)) {
        snprintf(errstr, errstr_size,
                 "%s:%d: kafka.properties: '%s' is set by ces2pg itself (use kafka.group_id, "
                 "kafka.group_instance_id and kafka.brokers)",
                 config->path, line, name);
        return -1;
    }
    char err[512];
    if (rd_kafka_conf_set(conf, name, item + name_len + 1, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
        /* err may quote the value, which may be a secret: name the property only. */
        bool secret = ces_secret_property_name(name, strlen(name));
        snprintf(errstr, errstr_size, "%s:%d: kafka.properties: %s", config->path, line,
                 secret ? "invalid value for a credential property" : err);
        if (secret)
            snprintf(errstr + strlen(errstr), errstr_size - strlen(errstr), " '%s'", name);
        return -1;
    }
    return 0;
}

/* A property from a dedicated key (named in errors) when that key has a value. */
static int set_key(rd_kafka_conf_t *conf, const ces_config_t *config, const char *key,
                   const char *name, const char *value, char *errstr, size_t errstr_size) {
    char err[512];
    if (value != NULL &&
        rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
        snprintf(errstr, errstr_size, "%s: %s: %s", config->path, key, err);
        return -1;
    }
    return 0;
}

/* Transaction order has one writer per group (apply/writer.h), and only the writer joins the
 * group: all the instances of a stream (its group and topics) join under one static name, so that
 * a standby taking over replaces the writer's membership at once instead of after the dead
 * writer's session timed out. The topics are in the name (a hash of them): a member rejoining
 * under a static name keeps its old assignment, which a group given other topics must not. Group
 * ids may hold what instance ids may not: those bytes become '_'. */
static void writer_instance_id(const ces_config_t *config, char *out, size_t out_size) {
    uint32_t hash = 2166136261u; /* FNV-1a over the topics, in the order given */
    for (size_t t = 0; t < config->kafka_topics.count; t++) {
        for (const char *p = config->kafka_topics.items[t]; *p != '\0'; p++)
            hash = (hash ^ (unsigned char)*p) * 16777619u;
        hash = (hash ^ 0xFFu) * 16777619u;
    }
    int n = snprintf(out, out_size, "ces2pg-writer-%.200s-%08x", config->kafka_group_id,
                     (unsigned)hash);
    for (int i = 0; i < n && (size_t)i < out_size - 1; i++) {
        char ch = out[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            out[i] = '_';
    }
}

rd_kafka_conf_t *ces_kafkaconf_build(const ces_config_t *config, ces_consumer_status_t *status,
                                     char *errstr, size_t errstr_size) {
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    *status = CES_CONSUMER_CONFIG;
    char shared_id[250];
    bool transaction_order =
        config->apply_ordering != NULL && strcmp(config->apply_ordering, "transaction") == 0 &&
        config->kafka_group_id != NULL;
    if (transaction_order)
        writer_instance_id(config, shared_id, sizeof(shared_id));
    if (set_own(conf, defaults, COUNT(defaults), status, errstr, errstr_size) != 0)
        goto fail;
    if (config->kafka_eventhubs_connection_string != NULL &&
        set_eventhubs(conf, config, status, errstr, errstr_size) != 0)
        goto fail;
    if (entra(config) &&
        (set_own(conf, entra_security, COUNT(entra_security), status, errstr, errstr_size) != 0 ||
         set_own(conf, eventhubs_defaults, COUNT(eventhubs_defaults), status, errstr,
                 errstr_size) != 0))
        goto fail;
    if (set_key(conf, config, "kafka.ssl_ca_file", "ssl.ca.location", config->kafka_ssl_ca_file,
                errstr, errstr_size) != 0)
        goto fail;
    for (size_t i = 0; i < config->kafka_properties.count; i++) {
        if (set_property(conf, config, config->kafka_properties.items[i],
                         config->kafka_properties.lines[i], errstr, errstr_size) != 0)
            goto fail;
    }
    if (set_key(conf, config, "kafka.brokers", "bootstrap.servers", config->kafka_brokers, errstr,
                errstr_size) != 0 ||
        set_key(conf, config, "kafka.group_instance_id", "group.instance.id",
                transaction_order ? shared_id : config->kafka_group_instance_id, errstr,
                errstr_size) != 0 ||
        set_key(conf, config, "kafka.group_id", "group.id", config->kafka_group_id, errstr,
                errstr_size) != 0 ||
        /* Positions live in PostgreSQL: ces2pg stores Kafka's after each commit. */
        set_key(conf, config, "kafka.group_id", "enable.auto.offset.store", "false", errstr,
                errstr_size) != 0)
        goto fail;
    if (set_own(conf, forced, COUNT(forced), status, errstr, errstr_size) != 0)
        goto fail;
    *status = CES_CONSUMER_OK;
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

int64_t ces_kafkaconf_int(const rd_kafka_conf_t *conf, const char *name, int64_t fallback) {
    char value[64];
    size_t size = sizeof(value);
    if (rd_kafka_conf_get(conf, name, value, &size) != RD_KAFKA_CONF_OK)
        return fallback;
    char *end;
    long long v = strtoll(value, &end, 10);
    return end != value && v > 0 ? v : fallback;
}
