/*
 * oauth: Kafka's SASL OAUTHBEARER with tokens ces2pg fetches itself.
 *
 * Debian's librdkafka has no libcurl, so its own OIDC cannot fetch a token. librdkafka instead
 * asks for one through its refresh callback, at start and at 80% of each token's life, on its
 * SASL background thread (so that a refresh happens while the main loop is busy with a batch);
 * this module answers from a token source (util/token.h) and remembers a refusal that retrying
 * cannot fix, which the consumer's poll reports. librdkafka retries a failed refresh by itself.
 */
#ifndef CES_OAUTH_H
#define CES_OAUTH_H

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>

#include "util/token.h"

typedef struct ces_oauth_s ces_oauth_t;

/* A handle answering librdkafka's refreshes from source (copied; its opaque and describe must
 * outlive the handle), for messages naming scope. Owned by the caller; NULL when out of memory. */
ces_oauth_t *ces_oauth_new(const ces_token_source_t *source, const char *scope);
void ces_oauth_destroy(ces_oauth_t *oauth); /* accepts NULL */

/* Sets conf up for OAUTHBEARER refreshes on the SASL background thread. refresh_cb is the
 * caller's callback (librdkafka passes it conf's opaque), which calls ces_oauth_refresh. */
void ces_oauth_attach(rd_kafka_conf_t *conf,
                      void (*refresh_cb)(rd_kafka_t *rk, const char *config, void *opaque));
/* Starts the background refreshes of rk, made from a conf ces_oauth_attach set up. Returns 0, or
 * -1 with errstr set. */
int ces_oauth_start(rd_kafka_t *rk, char *errstr, size_t errstr_size);

/* Fetches a token and hands it to rk, or tells rk the fetch failed (librdkafka tries again ten
 * seconds later). Any thread. */
void ces_oauth_refresh(ces_oauth_t *oauth, rd_kafka_t *rk);

/* True when a token was refused for good (a wrong secret, an unknown tenant): why says so. Any
 * thread. */
bool ces_oauth_refused(ces_oauth_t *oauth, char *why, size_t why_size);

/* The scope asked for, for messages (the broker checks the token's audience against it). */
const char *ces_oauth_scope(const ces_oauth_t *oauth);

#endif
