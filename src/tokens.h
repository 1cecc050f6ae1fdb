/*
 * tokens: Microsoft Entra ID for the two sides that log in, Kafka (SASL OAUTHBEARER) and
 * PostgreSQL (the token as the password).
 *
 * On top of the house with main.c and daemon.c: it joins the identity layer (which fetches and
 * caches tokens), the configuration (identity.*, kafka.auth, postgres.auth and their scopes) and
 * the metrics. The consumer and the PostgreSQL session see only the token sources it puts into
 * the configuration (util/token.h). Every fetch is logged when it brings a new token (which
 * identity, the token's subject and audience, when it expires; never the token), counted when it
 * fails, and a refusal that retrying cannot fix is remembered for the exit status.
 */
#ifndef CES_TOKENS_H
#define CES_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "conf/config.h"
#include "ops/metrics.h"

typedef struct ces_tokens_s ces_tokens_t;

/*
 * When kafka.auth or postgres.auth is "entra": makes the identity from the identity.* keys (and
 * the environment variables of Microsoft's SDKs), logs which one it is, and sets the token sources
 * config->kafka_token and config->pg_token of the sides that use it. Fetches nothing. *out is NULL
 * when no side uses Entra, else owned by the caller, who destroys it after config's last use.
 * Returns 0, or -1 with errstr set (settings that cannot work).
 */
int ces_tokens_attach(ces_config_t *config, ces_tokens_t **out, char *errstr,
                      size_t errstr_size);

/* From now on, fetches are counted in metrics (a reference: call again with NULL before it is
 * destroyed). Any thread may be fetching meanwhile. tokens may be NULL. */
void ces_tokens_set_metrics(ces_tokens_t *tokens, ces_metrics_t *metrics);

/* True when Entra refused a token for good (a wrong secret, an unknown tenant or client, no
 * identity): a configuration problem. tokens may be NULL. */
bool ces_tokens_refused(const ces_tokens_t *tokens);

/* Fetches a token for each side that uses Entra and prints one line for each (the identity, the
 * token's subject and audience, when it expires): --check-config --fetch-tokens. Returns 0, or -1
 * with errstr set. tokens may be NULL (nothing to fetch: prints that). */
int ces_tokens_check(ces_tokens_t *tokens, FILE *out, char *errstr, size_t errstr_size);

void ces_tokens_destroy(ces_tokens_t *tokens); /* accepts NULL */

#endif
