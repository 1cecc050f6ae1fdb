#include "test_util.h"

#include "input/kafkaerr.h"

/* Errors librdkafka reports on its own: the code decides, and only an SSL error's text is read,
 * against one table. Every text of the table must make an SSL error transient (else table and
 * decision disagree), and the wordings below, seen from librdkafka, must keep their class. */
static void kafka_errors_are_classified_by_code_and_one_table(void **state) {
    (void)state;
    size_t n = 0;
    for (const char *t; (t = ces_kafkaerr_transient_tls_text(n)) != NULL; n++) {
        char reason[256];
        snprintf(reason, sizeof(reason),
                 "ssl://b:9093/bootstrap: SSL handshake failed: %s (after 12ms in state "
                 "SSL_HANDSHAKE)",
                 t);
        if (ces_kafkaerr_classify(RD_KAFKA_RESP_ERR__SSL, reason) != CES_KAFKAERR_TRANSIENT)
            fail_msg("'%s' is in the table but not transient", t);
        /* Under a code that decides by itself, the text changes nothing. */
        assert_int_equal(ces_kafkaerr_classify(RD_KAFKA_RESP_ERR__AUTHENTICATION, reason),
                         CES_KAFKAERR_AUTHENTICATION);
    }
    assert_true(n > 0);

    static const char *const transient_tls[] = {
        "ssl://b:9093/1: Disconnected (after 3ms in state SSL_HANDSHAKE)",
        "ssl://b:9093/1: SSL handshake failed: unexpected eof while reading",
        "ssl://b:9093/1: SSL transport error: Connection reset by peer",
        "ssl://b:9093/1: Connection setup timed out in state SSL_HANDSHAKE",
    };
    for (size_t i = 0; i < sizeof(transient_tls) / sizeof(transient_tls[0]); i++)
        assert_int_equal(ces_kafkaerr_classify(RD_KAFKA_RESP_ERR__SSL, transient_tls[i]),
                         CES_KAFKAERR_TRANSIENT);
    static const char *const fatal_tls[] = {
        "ssl://b:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
        "verify failed: broker certificate could not be verified, verify that ssl.ca.location is "
        "correctly configured or root CA certificates are installed",
        "ssl://b:9092/bootstrap: SSL handshake failed: error:0A00010B:SSL routines::wrong version "
        "number",
    };
    for (size_t i = 0; i < sizeof(fatal_tls) / sizeof(fatal_tls[0]); i++)
        assert_int_equal(ces_kafkaerr_classify(RD_KAFKA_RESP_ERR__SSL, fatal_tls[i]),
                         CES_KAFKAERR_TLS);

    assert_int_equal(ces_kafkaerr_classify(RD_KAFKA_RESP_ERR__FATAL, "fenced"), CES_KAFKAERR_FATAL);
    assert_int_equal(ces_kafkaerr_classify(RD_KAFKA_RESP_ERR__AUTHENTICATION,
                                           "SASL authentication error: Invalid username or "
                                           "password"),
                     CES_KAFKAERR_AUTHENTICATION);
    /* librdkafka reconnects by itself: a certificate's wording under these codes is not read. */
    static const rd_kafka_resp_err_t transient_codes[] = {
        RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
        RD_KAFKA_RESP_ERR__RESOLVE, RD_KAFKA_RESP_ERR__TIMED_OUT};
    for (size_t i = 0; i < sizeof(transient_codes) / sizeof(transient_codes[0]); i++)
        assert_int_equal(ces_kafkaerr_classify(transient_codes[i], "certificate verify failed"),
                         CES_KAFKAERR_TRANSIENT);

    /* What the daemon's last words say (tests/realbroker greps for them). */
    assert_null(ces_kafkaerr_advice(CES_KAFKAERR_TRANSIENT));
    assert_non_null(strstr(ces_kafkaerr_advice(CES_KAFKAERR_FATAL), "fatal error"));
    assert_non_null(
        strstr(ces_kafkaerr_advice(CES_KAFKAERR_AUTHENTICATION), "authentication failed"));
    assert_non_null(strstr(ces_kafkaerr_advice(CES_KAFKAERR_TLS), "TLS failure"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kafka_errors_are_classified_by_code_and_one_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
