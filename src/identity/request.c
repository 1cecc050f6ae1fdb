#include "identity/request.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A query or form built from parts: first measured, then written into one allocation. */
typedef struct {
    char *buf; /* NULL while measuring */
    size_t len;
} builder_t;

static void put_raw(builder_t *b, const char *s) {
    size_t n = strlen(s);
    if (b->buf != NULL)
        memcpy(b->buf + b->len, s, n);
    b->len += n;
}

/* Percent-encodes everything but RFC 3986's unreserved characters. */
static void put_escaped(builder_t *b, const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        bool plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                     (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~';
        if (b->buf != NULL) {
            if (plain) {
                b->buf[b->len] = (char)*p;
            } else {
                b->buf[b->len] = '%';
                b->buf[b->len + 1] = hex[*p >> 4];
                b->buf[b->len + 2] = hex[*p & 15];
            }
        }
        b->len += plain ? 1 : 3;
    }
}

/* Runs fill twice, measuring then writing; returns the new string or NULL. */
static char *build(void (*fill)(builder_t *, const char *const *), const char *const *args) {
    builder_t b = {NULL, 0};
    fill(&b, args);
    b.buf = malloc(b.len + 1);
    if (b.buf == NULL)
        return NULL;
    b.len = 0;
    fill(&b, args);
    b.buf[b.len] = '\0';
    return b.buf;
}

/* args: endpoint, api_version, resource, client_id (NULL or empty: none). */
static void fill_managed(builder_t *b, const char *const *args) {
    put_raw(b, args[0]);
    put_raw(b, strchr(args[0], '?') != NULL ? "&api-version=" : "?api-version=");
    put_escaped(b, args[1]);
    put_raw(b, "&resource=");
    put_escaped(b, args[2]);
    if (args[3] != NULL && args[3][0] != '\0') {
        put_raw(b, "&client_id=");
        put_escaped(b, args[3]);
    }
}

char *ces_request_managed_url(const char *endpoint, const char *api_version, const char *resource,
                              const char *client_id) {
    const char *args[] = {endpoint, api_version, resource, client_id};
    return build(fill_managed, args);
}

/* args: authority, tenant. */
static void fill_token_url(builder_t *b, const char *const *args) {
    size_t n = strlen(args[0]);
    while (n > 0 && args[0][n - 1] == '/')
        n--;
    if (b->buf != NULL)
        memcpy(b->buf + b->len, args[0], n);
    b->len += n;
    put_raw(b, "/");
    put_escaped(b, args[1]);
    put_raw(b, "/oauth2/v2.0/token");
}

char *ces_request_token_url(const char *authority, const char *tenant) {
    const char *args[] = {authority, tenant};
    return build(fill_token_url, args);
}

/* args: client_id, scope, secret (or NULL), assertion. */
static void fill_form(builder_t *b, const char *const *args) {
    put_raw(b, "client_id=");
    put_escaped(b, args[0]);
    put_raw(b, "&scope=");
    put_escaped(b, args[1]);
    put_raw(b, "&grant_type=client_credentials");
    if (args[2] != NULL) {
        put_raw(b, "&client_secret=");
        put_escaped(b, args[2]);
    } else {
        put_raw(b, "&client_assertion_type=");
        put_escaped(b, "urn:ietf:params:oauth:client-assertion-type:jwt-bearer");
        put_raw(b, "&client_assertion=");
        put_escaped(b, args[3]);
    }
}

char *ces_request_token_form(const char *client_id, const char *scope, const char *secret,
                             const char *assertion) {
    const char *args[] = {client_id, scope, secret, assertion != NULL ? assertion : ""};
    return build(fill_form, args);
}

void ces_request_free_secret(char *s) {
    if (s != NULL) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}
