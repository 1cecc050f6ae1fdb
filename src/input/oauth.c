#include "input/oauth.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

struct ces_oauth_s {
    ces_token_source_t source;
    char *scope;
    /* Written once by the refreshing thread before refused is set, read after it is seen set. */
    char refusal[1024];
    atomic_bool refused;
};

ces_oauth_t *ces_oauth_new(const ces_token_source_t *source, const char *scope) {
    ces_oauth_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return NULL;
    o->source = *source;
    atomic_init(&o->refused, false);
    if ((o->scope = strdup(scope != NULL ? scope : "")) == NULL) {
        free(o);
        return NULL;
    }
    return o;
}

void ces_oauth_destroy(ces_oauth_t *o) {
    if (o == NULL)
        return;
    free(o->scope);
    free(o);
}

void ces_oauth_attach(rd_kafka_conf_t *conf,
                      void (*refresh_cb)(rd_kafka_t *rk, const char *config, void *opaque)) {
    rd_kafka_conf_set_oauthbearer_token_refresh_cb(conf, refresh_cb);
    /* Refreshes go to a queue of their own, served by librdkafka's background thread once
     * ces_oauth_start enables it: the main loop may be inside a long batch when a token is due. */
    rd_kafka_conf_enable_sasl_queue(conf, 1);
}

int ces_oauth_start(rd_kafka_t *rk, char *errstr, size_t errstr_size) {
    rd_kafka_error_t *error = rd_kafka_sasl_background_callbacks_enable(rk);
    if (error == NULL)
        return 0;
    snprintf(errstr, errstr_size, "kafka: cannot refresh OAUTHBEARER tokens in the background: %s",
             rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
    return -1;
}

void ces_oauth_refresh(ces_oauth_t *o, rd_kafka_t *rk) {
    char *token = NULL, err[768], why[1024];
    int64_t expires_at_ms = 0;
    ces_token_status_t st =
        o->source.fetch(o->source.opaque, false, &token, &expires_at_ms, err, sizeof(err));
    if (st == CES_TOKEN_OK) {
        char kerr[512];
        /* The principal is the broker's to read from the token (Event Hubs and Kafka's validator
         * both do); librdkafka wants a name all the same. */
        rd_kafka_resp_err_t rerr = rd_kafka_oauthbearer_set_token(
            rk, token, expires_at_ms, "ces2pg", NULL, 0, kerr, sizeof(kerr));
        explicit_bzero(token, strlen(token));
        free(token);
        if (rerr == RD_KAFKA_RESP_ERR_NO_ERROR)
            return;
        /* kerr says what librdkafka disliked (its expiry, its characters), never the token. */
        snprintf(why, sizeof(why), "librdkafka refused the token from %s: %s", o->source.describe,
                 kerr);
        ces_log_error("kafka: %s", why);
        rd_kafka_oauthbearer_set_token_failure(rk, why);
        return;
    }
    snprintf(why, sizeof(why), "no token from %s for %s: %s", o->source.describe, o->scope, err);
    rd_kafka_oauthbearer_set_token_failure(rk, why);
    if (st == CES_TOKEN_FATAL && !atomic_load(&o->refused)) {
        snprintf(o->refusal, sizeof(o->refusal), "kafka: %s", why);
        atomic_store(&o->refused, true);
    }
}

bool ces_oauth_refused(ces_oauth_t *o, char *why, size_t why_size) {
    if (o == NULL || !atomic_load(&o->refused))
        return false;
    snprintf(why, why_size, "%s", o->refusal);
    return true;
}

const char *ces_oauth_scope(const ces_oauth_t *o) { return o->scope; }
