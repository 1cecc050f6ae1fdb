/*
 * request: the URLs and form bodies of token requests, percent-encoded.
 *
 * A URL carries no secret (client_id and resource are not secrets), so it may be named in errors;
 * the client secret and the client assertion go only into a POST body, which is built in one
 * allocation of its exact size so that no copy of a secret is left behind by a growing buffer,
 * and is wiped by ces_request_free_secret.
 */
#ifndef CES_REQUEST_H
#define CES_REQUEST_H

/* endpoint?api-version=API_VERSION&resource=RESOURCE[&client_id=CLIENT_ID] ('&' instead of '?'
 * when endpoint already has a query), for IMDS and the App Service endpoint. client_id NULL or
 * empty: the system-assigned identity. A new string owned by the caller, or NULL when memory runs
 * out. */
char *ces_request_managed_url(const char *endpoint, const char *api_version, const char *resource,
                              const char *client_id) __attribute__((warn_unused_result));

/* AUTHORITY/TENANT/oauth2/v2.0/token, with one slash after the authority whether or not it ends in
 * one. A new string owned by the caller, or NULL when memory runs out. */
char *ces_request_token_url(const char *authority, const char *tenant)
    __attribute__((warn_unused_result));

/* The client-credentials form for the v2.0 token endpoint: client_id, scope,
 * grant_type=client_credentials and either client_secret=SECRET (secret non-NULL) or the
 * jwt-bearer client_assertion=ASSERTION. A new string owned by the caller, to be released with
 * ces_request_free_secret; NULL when memory runs out. */
char *ces_request_token_form(const char *client_id, const char *scope, const char *secret,
                             const char *assertion) __attribute__((warn_unused_result));

/* Wipes and frees a string that holds a secret. NULL is fine. */
void ces_request_free_secret(char *s);

#endif
