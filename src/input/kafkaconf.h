/*
 * kafkaconf: the translation of ces2pg's configuration into librdkafka properties.
 *
 * In order: ces2pg's defaults, Event Hubs mode (SASL_SSL with the connection string as password,
 * then Microsoft's recommended settings), kafka.ssl_ca_file, kafka.properties (which override every
 * default but may not name what ces2pg sets itself), the group and brokers from their own keys,
 * and last the settings ces2pg forces. Pure: nothing connects, and librdkafka itself checks and
 * reports each value. Errors name the file and line and never quote a secret.
 */
#ifndef CES_KAFKACONF_H
#define CES_KAFKACONF_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/config.h"
#include "input/consumer.h"

/*
 * Builds the librdkafka configuration of config, without callbacks or opaque. Returns it (owned by
 * the caller: rd_kafka_new takes it, else rd_kafka_conf_destroy) with *status CES_CONSUMER_OK, or
 * NULL with *status CES_CONSUMER_CONFIG (a setting is wrong: errstr names file and line) or
 * CES_CONSUMER_FATAL (librdkafka refused one of ces2pg's own settings) and a sentence in errstr.
 */
rd_kafka_conf_t *ces_kafkaconf_build(const ces_config_t *config, ces_consumer_status_t *status,
                                     char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/* The positive integer value of property name in conf, or fallback when it has none. */
int64_t ces_kafkaconf_int(const rd_kafka_conf_t *conf, const char *name, int64_t fallback);

#endif
