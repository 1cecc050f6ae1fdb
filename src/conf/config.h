/*
 * config: the libconfig file, validated against one table of keys.
 *
 * Every key ces2pg understands is a row of the table in config.c, with its type, default, range and
 * whether a reload may change it; conf/ces2pg.conf and ces2pg.conf(5) (man/, whose facts are
 * generated from the table) document the same keys. Unknown keys, wrong types and missing required keys
 * are errors that name the file, the line and the key.
 */
#ifndef CES_CONFIG_H
#define CES_CONFIG_H

/* The environment variable that names this instance in its consumer group when
 * kafka.group_instance_id is not set (the systemd unit and the compose file set it). */
#define CES_CONFIG_GROUP_INSTANCE_ENV "CES2PG_GROUP_INSTANCE_ID"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conf/rules.h"
#include "util/token.h"

typedef struct {
    char **items;
    int *lines; /* line of each item in the file, for error messages */
    size_t count;
} ces_strlist_t;

typedef struct {
    char *path; /* the file this was read from */

    char *kafka_brokers;
    ces_strlist_t kafka_topics;
    char *kafka_group_id;
    ces_strlist_t kafka_properties; /* "name=value" strings for librdkafka */
    int64_t kafka_poll_ms;
    char *kafka_format; /* record encoding: "auto", "json" or "avro" */
    /* Event Hubs mode: the connection string (a secret: never printed or logged). After loading it
     * holds the value of kafka.eventhubs_connection_string or the trimmed content of
     * kafka.eventhubs_connection_string_file, and kafka_brokers is derived from its Endpoint when
     * kafka.brokers is not set. NULL when neither key is set. */
    char *kafka_eventhubs_connection_string;
    char *kafka_eventhubs_connection_string_file;
    char *kafka_ssl_ca_file; /* ssl.ca.location: CA certificates (PEM) for a private CA */
    char *kafka_on_source_gap; /* "stop" or "continue" */
    /* group.instance.id (static membership): the key, else $CES2PG_GROUP_INSTANCE_ID; NULL: none */
    char *kafka_group_instance_id;
    /* kafka.auth: "entra" (SASL OAUTHBEARER with Microsoft Entra ID tokens), "connection_string"
     * (Event Hubs' shared key) or "properties" (whatever kafka.properties say); after loading,
     * never NULL: derived from the connection string when the key is not set. */
    char *kafka_auth;
    char *kafka_entra_scope; /* after loading: https://<first broker's host>/.default unless set */

    char *pg_conninfo;
    /* postgres.password_file (relative paths are looked up in $CREDENTIALS_DIRECTORY when set) and
     * the password read from it (a secret: never printed or logged), passed to libpq as the
     * password parameter. Both NULL when the key is not set. */
    char *pg_password_file;
    char *pg_password;
    int64_t pg_retry_max_ms;
    char *pg_auth;        /* "password" or "entra" (a token as the password, fresh per login) */
    char *pg_entra_scope; /* Azure Database for PostgreSQL's, unless set */

    /* The identity both sides use with Microsoft Entra ID (identity.*): NULL and 0 mean the
     * environment variables of Microsoft's SDKs, then the defaults (identity/identity.h). */
    char *identity_source;
    char *identity_client_id;
    char *identity_tenant_id;
    char *identity_authority_host;
    char *identity_federated_token_file;
    char *identity_client_secret_file;
    char *identity_client_secret; /* read from the file (a secret: never printed or logged) */
    char *identity_imds_endpoint;
    char *identity_endpoint;
    char *identity_command;
    int64_t identity_timeout_ms;
    /* Where the tokens come from when kafka.auth or postgres.auth is "entra": set by main.c after
     * loading (conf fetches nothing); fetch is NULL otherwise. Not keys: never printed, compared
     * or reloaded. */
    ces_token_source_t kafka_token;
    ces_token_source_t pg_token;

    int64_t apply_batch_max_events;
    int64_t apply_batch_max_bytes;
    int64_t apply_batch_max_ms;
    char *apply_ordering; /* "transaction" or "partition" */
    int64_t apply_reorder_window_ms;
    int64_t apply_reorder_window_max_ms;
    bool apply_reorder_window_adaptive;
    int64_t apply_max_pending_events;
    int64_t apply_max_pending_bytes;
    int64_t apply_dedup_window;
    bool apply_lsn_guard;
    char *apply_version_column;
    char *apply_tombstone_retention; /* "8 days" */
    int64_t apply_tombstone_retention_s; /* derived from it */

    char *schema_metadata;
    char *schema_target;          /* "{schema}.{table}" */
    char *schema_identifier_case; /* "lower" or "preserve" */
    ces_strlist_t schema_include; /* globs on "schema.table"; empty: every table */
    ces_strlist_t schema_exclude;
    ces_rules_t schema_tables; /* per-table rules (conf/rules.h); empty: the defaults for all */
    /* schema.mask_key_file (relative paths are looked up in $CREDENTIALS_DIRECTORY when set) and
     * the key read from it for the rules' hash masks (a secret: never printed or logged). */
    char *schema_mask_key_file;
    char *schema_mask_key;
    bool schema_auto_create;
    bool schema_auto_evolve;

    int64_t decode_max_record_bytes;
    int64_t decode_max_event_bytes;
    int64_t decode_max_depth;
    int64_t decode_max_columns;
    int64_t decode_max_value_bytes;
    int64_t decode_threads; /* 0: one per two CPUs this process may run on, 1..4 */

    int64_t reassembly_max_bytes;
    int64_t reassembly_max_segments;
    int64_t reassembly_max_groups;
    int64_t reassembly_max_logicalid_bytes;
    int64_t reassembly_timeout_ms;

    char *log_level;
    char *log_format;              /* "text" or "json" */
    int64_t log_progress_interval; /* seconds between progress lines; 0: none */

    char *http_listen; /* "HOST:PORT" of /metrics, /healthz, /readyz; empty: no HTTP server */

    int64_t ha_lease_ms; /* transaction order: how long a writer's role outlives its last renewal */
} ces_config_t;

typedef enum {
    CES_CONFIG_DAEMON, /* the kafka section is required */
    CES_CONFIG_REPLAY, /* no Kafka: the kafka section may be left out */
} ces_config_mode_t;

typedef enum {
    CES_CONFIG_OK = 0,
    CES_CONFIG_ERROR, /* errstr: "FILE:LINE: what is wrong" */
} ces_config_status_t;

/*
 * Reads and validates path. On success *config is a new object owned by the caller (free with
 * ces_config_destroy); on error *config is NULL and errstr names the file, line and key.
 */
ces_config_status_t ces_config_load(const char *path, ces_config_mode_t mode, ces_config_t **config,
                                    char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

void ces_config_destroy(ces_config_t *config);


/* Calls fn for every key whose value differs between a and b, saying whether SIGHUP may change
 * it. */
void ces_config_diff(const ces_config_t *a, const ces_config_t *b,
                     void (*fn)(const char *key, bool reloadable, void *arg), void *arg);

/* Writes every key with its effective value, one "key = value" per line (for --check-config). */
void ces_config_print(const ces_config_t *config, FILE *out);

/* What the table says of one key, for documentation (man/gen-keys.c writes ces2pg.conf(5)'s
 * facts from it). Every pointer refers to static storage. */
typedef struct {
    const char *name;          /* "group.key" */
    const char *type;          /* "string", "integer", "boolean" or "list of strings" */
    const char *default_value; /* as the table holds it; NULL: none (unset, or an empty list) */
    bool required_for_daemon;
    bool required_for_replay;
    bool has_range;            /* integers: min..max */
    int64_t min, max;
    bool reloadable;           /* SIGHUP changes it; otherwise a restart is needed */
} ces_config_key_info_t;

/* The number of keys in the table. */
size_t ces_config_key_count(void);

/* Fills *info with the index-th key of the table, in its order. Returns false past the end. */
bool ces_config_key_info(size_t index, ces_config_key_info_t *info);

#endif
