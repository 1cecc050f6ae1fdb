/*
 * token: where a short-lived credential comes from, as the layers that log in see it.
 *
 * With Microsoft Entra ID, ces2pg logs in to Event Hubs (SASL OAUTHBEARER) and to Azure Database
 * for PostgreSQL (the token is the password) with access tokens that expire within minutes or
 * hours. The layer that fetches them (identity) sits beside input and apply, not below them: the
 * consumer and the PostgreSQL session only call this interface, and main.c hands them one that
 * fetches from the configured identity and counts what happens in the metrics.
 */
#ifndef CES_TOKEN_H
#define CES_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    CES_TOKEN_OK = 0,
    CES_TOKEN_RETRY, /* the token service is unreachable, slow or busy: retry with backoff */
    CES_TOKEN_FATAL, /* refused (a wrong secret, an unknown tenant) or unusable settings: stop */
} ces_token_status_t;

typedef struct {
    /*
     * A token, from a cache while it is far enough from its expiry; fresh skips the cache (after
     * a login refused with the cached one). Any thread. On CES_TOKEN_OK *token is a new string
     * owned by the caller, who wipes it (explicit_bzero) before freeing it, and *expires_at_ms
     * its expiry in milliseconds since the epoch. Otherwise errstr says why in one line that
     * holds no secret.
     */
    ces_token_status_t (*fetch)(void *opaque, bool fresh, char **token, int64_t *expires_at_ms,
                                char *errstr, size_t errstr_size);
    void *opaque;
    /* What the token stands for in messages: "Microsoft Entra ID (managed identity ...)". */
    const char *describe;
} ces_token_source_t;

#endif
