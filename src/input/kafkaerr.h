/*
 * kafkaerr: what an error librdkafka reports on its own (its error callback) means for ces2pg.
 *
 * librdkafka reconnects by itself after a network accident, so most errors only need a warning.
 * A few never heal by retrying and stop the daemon with a sentence the operator can act on. The
 * decision is made on librdkafka's error code wherever the code tells the cases apart; only
 * RD_KAFKA_RESP_ERR__SSL covers both a certificate refused (fatal) and a connection cut during the
 * handshake (transient), and for it librdkafka's text is read against one table. Pure: no client.
 */
#ifndef CES_KAFKAERR_H
#define CES_KAFKAERR_H

#include <librdkafka/rdkafka.h>
#include <stddef.h>

typedef enum {
    CES_KAFKAERR_TRANSIENT = 0, /* librdkafka retries: log a warning and go on */
    CES_KAFKAERR_FATAL,         /* the client is unusable (RD_KAFKA_RESP_ERR__FATAL) */
    CES_KAFKAERR_AUTHENTICATION, /* the credentials are wrong: retrying only locks the account */
    CES_KAFKAERR_TLS,            /* certificates or protocol: retrying cannot fix it */
} ces_kafkaerr_class_t;

/* The class of an error passed to librdkafka's error callback, with its reason text. */
ces_kafkaerr_class_t ces_kafkaerr_classify(rd_kafka_resp_err_t err, const char *reason);

/* What the operator should check for a class that stops the daemon ("authentication failed
 * (check ...)"); NULL for CES_KAFKAERR_TRANSIENT. A static string. */
const char *ces_kafkaerr_advice(ces_kafkaerr_class_t cls);

/* The table of texts that make an RD_KAFKA_RESP_ERR__SSL transient: the index-th entry (a static
 * string), or NULL past the end. For the unit test that holds table and decision together. */
const char *ces_kafkaerr_transient_tls_text(size_t index);

#endif
