#include "input/kafkaerr.h"

#include <stdbool.h>
#include <string.h>

/* Texts of an RD_KAFKA_RESP_ERR__SSL that is a network accident (a connection cut or timed out
 * during the handshake) rather than a problem with certificates or protocol. The one place where
 * librdkafka's wording decides. */
static const char *const transient_tls[] = {"Disconnected",     "unexpected eof", "reset by peer",
                                            "Connection reset", "timed out",
                                            "SSL transport error"};

const char *ces_kafkaerr_transient_tls_text(size_t index) {
    return index < sizeof(transient_tls) / sizeof(transient_tls[0]) ? transient_tls[index] : NULL;
}

static bool tls_is_transient(const char *reason) {
    for (size_t i = 0; ces_kafkaerr_transient_tls_text(i) != NULL; i++) {
        if (strstr(reason, ces_kafkaerr_transient_tls_text(i)) != NULL)
            return true;
    }
    return false;
}

ces_kafkaerr_class_t ces_kafkaerr_classify(rd_kafka_resp_err_t err, const char *reason) {
    switch (err) {
    case RD_KAFKA_RESP_ERR__FATAL:
        return CES_KAFKAERR_FATAL;
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
        return CES_KAFKAERR_AUTHENTICATION;
    case RD_KAFKA_RESP_ERR__SSL:
        return reason != NULL && tls_is_transient(reason) ? CES_KAFKAERR_TRANSIENT
                                                          : CES_KAFKAERR_TLS;
    case RD_KAFKA_RESP_ERR__TRANSPORT:        /* a connection failed or was cut */
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN: /* until one comes back */
    case RD_KAFKA_RESP_ERR__RESOLVE:          /* DNS may answer next time */
    default:
        /* librdkafka reconnects by itself. */
        return CES_KAFKAERR_TRANSIENT;
    }
}

const char *ces_kafkaerr_advice(ces_kafkaerr_class_t cls) {
    switch (cls) {
    case CES_KAFKAERR_FATAL:
        return "fatal error";
    case CES_KAFKAERR_AUTHENTICATION:
        return "authentication failed (check kafka.eventhubs_connection_string, or the sasl.* "
               "properties)";
    case CES_KAFKAERR_TLS:
        return "TLS failure (check kafka.ssl_ca_file, the broker's certificate and host name, and "
               "that the broker port speaks TLS)";
    case CES_KAFKAERR_TRANSIENT:
        break;
    }
    return NULL;
}
