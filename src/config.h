/*
 * config: the libconfig file, validated against one table of keys.
 *
 * Every key ces2pg understands is a row of the table in config.c, with its type, default and help
 * text; conf/ces2pg.conf documents the same keys. Unknown keys, wrong types and missing required keys
 * are errors that name the file, the line and the key.
 */
#ifndef CES_CONFIG_H
#define CES_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

    char *pg_conninfo;
    int64_t pg_retry_max_ms;

    int64_t apply_batch_max_events;
    int64_t apply_batch_max_ms;

    char *schema_metadata;
    bool schema_auto_create;
    bool schema_auto_evolve;

    int64_t decode_max_record_bytes;
    int64_t decode_max_event_bytes;
    int64_t decode_max_depth;
    int64_t decode_max_columns;
    int64_t decode_max_value_bytes;

    int64_t reassembly_max_bytes;
    int64_t reassembly_max_segments;
    int64_t reassembly_timeout_ms;

    char *log_level;
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

/* True when a librdkafka property name (name[0..len)) may hold a credential and must not be shown. */
bool ces_config_is_secret_property(const char *name, size_t len);

/* Writes every key with its effective value, one "key = value" per line (for --check-config). */
void ces_config_print(const ces_config_t *config, FILE *out);

#endif
