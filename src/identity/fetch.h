/*
 * fetch: one HTTP request to a token endpoint with libcurl, bounded in time and size.
 *
 * No redirect is followed (a token endpoint that redirects is misconfigured, and a redirect must
 * not carry a secret elsewhere), only http and https are spoken, and no signal is used for
 * timeouts (CURLOPT_NOSIGNAL: the daemon's threads own the signals). Each request has its own
 * easy handle, so any thread may fetch at any time.
 */
#ifndef CES_FETCH_H
#define CES_FETCH_H

#include <stdbool.h>
#include <stddef.h>

#include "identity/identity.h"

typedef struct {
    const char *url;             /* named in no error here: the caller does */
    const char *const *headers;  /* "Name: value" lines, NULL-terminated, or NULL; may hold a
                                    secret: libcurl's copies are wiped */
    const char *form;            /* an application/x-www-form-urlencoded POST body; NULL: GET */
    int timeout_ms;              /* for the whole request, connecting included */
    const char *ca_file;         /* NULL: the system's CA bundle */
    bool no_proxy;               /* for endpoints on the machine (IMDS, App Service) */
} ces_fetch_request_t;

typedef struct {
    long status; /* the HTTP status */
    char *body;  /* NUL-terminated; may hold a token: release with ces_fetch_answer_free */
    size_t len;
} ces_fetch_answer_t;

/* Sends req and reads the answer, whatever its status, into *answer (owned by the caller, released
 * with ces_fetch_answer_free also on failure). CES_IDENTITY_UNAVAILABLE when no whole answer of at
 * most CES_ANSWER_MAX_BODY bytes came in time (errstr: libcurl's reason, escaped),
 * CES_IDENTITY_NOMEM when memory ran out. */
ces_identity_err_t ces_fetch(const ces_fetch_request_t *req, ces_fetch_answer_t *answer,
                             char *errstr, size_t errstr_size) __attribute__((warn_unused_result));

/* Wipes and frees the answer's body. */
void ces_fetch_answer_free(ces_fetch_answer_t *answer);

#endif
