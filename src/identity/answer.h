/*
 * answer: what a token endpoint or a token command said, taken apart without I/O: the token and its
 * expiry from every answer shape ces2pg meets, an error answer's classification and message, the
 * claims of a JWT, and the cache's refresh rule.
 *
 * Everything here reads text from outside (an endpoint, a command, a token), so it is bounded:
 * answers of at most CES_ANSWER_MAX_BODY bytes, JSON nested at most CES_ANSWER_MAX_DEPTH deep
 * (checked before yajl builds a tree, whose freeing recurses), tokens of at most
 * CES_ANSWER_MAX_TOKEN bytes. Messages quote an endpoint's text only escaped (ces_log_escape)
 * and never a token.
 */
#ifndef CES_ANSWER_H
#define CES_ANSWER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "identity/identity.h"

#define CES_ANSWER_MAX_BODY (64 * 1024)
#define CES_ANSWER_MAX_TOKEN (32 * 1024)
#define CES_ANSWER_MAX_DEPTH 16

/*
 * The token of a successful JSON answer (body[0..len), not NUL-terminated):
 *   - IMDS: {"access_token": "...", "expires_in": "3599", "expires_on": "1765130400", ...}
 *   - App Service: the same, expires_on a string or a number;
 *   - Entra v2.0: {"access_token": "...", "expires_in": 3599, "token_type": "Bearer"};
 *   - az account get-access-token: {"accessToken": "...", "expiresOn": "2026-12-07 18:00:00.000000",
 *     "expires_on": 1765130400}.
 * The expiry is expires_on (epoch seconds) when present, else now_ms + expires_in, else
 * expiresOn (az's local time), else the token's own exp claim. On CES_IDENTITY_OK *token is a
 * new string owned by the caller and *expires_at_ms the expiry (ms since the epoch). Otherwise
 * CES_IDENTITY_UNAVAILABLE (a garbled answer: not JSON, no token, a token that cannot be a SASL
 * token or a password, no expiry) or CES_IDENTITY_NOMEM, with errstr set.
 */
ces_identity_err_t ces_answer_token(const char *body, size_t len, int64_t now_ms, char **token,
                                    int64_t *expires_at_ms, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/* A command's standard output: a JSON answer as above, or a bare token (surrounding white space
 * dropped) whose expiry is its JWT exp claim. A bare token without one is CES_IDENTITY_CONFIG:
 * the command has to print JSON with expires_on instead. Ownership as for ces_answer_token. */
ces_identity_err_t ces_answer_command_output(const char *out, size_t len, int64_t now_ms,
                                             char **token, int64_t *expires_at_ms, char *errstr,
                                             size_t errstr_size) __attribute__((warn_unused_result));

/*
 * An answer other than HTTP 200: CES_IDENTITY_REFUSED for 4xx (but 408, 429, and 410 from IMDS)
 * that carries a JSON error body, CES_IDENTITY_UNAVAILABLE for everything else. msg gets
 * "HTTP STATUS" and what the body says: Entra's {"error": ..., "error_description": "AADSTS7000215:
 * Invalid client secret provided. Ensure ... Trace ID: ...", "error_codes": [7000215]} becomes
 * "HTTP 401: AADSTS7000215: Invalid client secret provided." (the description's first sentence,
 * its AADSTS code added from error_codes when the description lacks it); IMDS's
 * {"error": "invalid_request", "error_description": "Identity not found"} becomes
 * "HTTP 400: invalid_request: Identity not found"; App Service's {"message": ...} is quoted.
 */
ces_identity_err_t ces_answer_error(long status, bool imds, const char *body, size_t len,
                                    char *msg, size_t msg_size);

/* True when token[0..len) can be a SASL OAUTHBEARER token and a libpq password: 1 to
 * CES_ANSWER_MAX_TOKEN printable ASCII characters, no space. */
bool ces_answer_token_usable(const char *token, size_t len);

/* The resource that managed identity endpoints and commands take for scope: scope without a
 * trailing "/.default". A new string owned by the caller, or NULL when memory runs out. */
char *ces_answer_resource(const char *scope) __attribute__((warn_unused_result));

/* The cache's rule: a token fetched with lifetime_ms to live is handed out again while its
 * remaining life (remaining_ms) is more than min(300 s, lifetime_ms / 4). */
bool ces_answer_still_fresh(int64_t lifetime_ms, int64_t remaining_ms);

/* The JWT claims behind ces_identity_token_claims (see identity.h for the meaning). */
int ces_answer_claims(const char *token, char *who, size_t who_size, char *aud, size_t aud_size,
                      int64_t *exp_s);

#endif
