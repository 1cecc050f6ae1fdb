#include "identity/identity.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "identity/answer.h"
#include "identity/command.h"
#include "identity/fetch.h"
#include "identity/request.h"
#include "util/clock.h"
#include "util/log.h"

#define DEFAULT_AUTHORITY "https://login.microsoftonline.com/"
#define DEFAULT_IMDS "http://169.254.169.254/metadata/identity/oauth2/token"
#define DEFAULT_TIMEOUT_MS 10000
/* Scopes in use at once: Event Hubs and PostgreSQL, and room for a few more. */
#define CACHE_SLOTS 8
/* The largest federated token file read: a projected service account token is about 1 KiB. */
#define MAX_ASSERTION (64 * 1024)

/* Where tokens come from, once AUTO and managed identity are resolved. */
typedef enum { KIND_IMDS, KIND_APP_SERVICE, KIND_WORKLOAD, KIND_SECRET, KIND_COMMAND } kind_t;

typedef struct {
    char *scope; /* NULL: a free slot */
    char *token;
    int64_t expires_at_ms; /* CLOCK_REALTIME */
    int64_t fetched_ms;    /* ces_clock_now_ms at the fetch: the cache ages on the monotonic
                              clock, so a step of the wall clock neither keeps nor drops it */
    int64_t lifetime_ms;
} slot_t;

struct ces_identity_s {
    kind_t kind;
    char *client_id; /* NULL: none (a system-assigned managed identity) */
    char *tenant_id;
    char *token_file;
    char *secret;    /* the client secret or the identity header: wiped on destroy */
    char *endpoint;  /* IMDS, App Service, or the v2.0 token URL */
    char *command;
    char *ca_file;
    int timeout_ms;
    char description[1024];
    pthread_mutex_t lock; /* guards cache */
    slot_t cache[CACHE_SLOTS];
};

static const char *const source_names[] = {"auto",          "managed_identity", "app_service",
                                           "workload_identity", "client_secret", "command"};

int ces_identity_source_parse(const char *name, ces_identity_source_t *source) {
    for (size_t i = 0; i < sizeof(source_names) / sizeof(source_names[0]); i++) {
        if (strcmp(name, source_names[i]) == 0) {
            *source = (ces_identity_source_t)i;
            return 0;
        }
    }
    return -1;
}

const char *ces_identity_source_name(ces_identity_source_t source) {
    return (size_t)source < sizeof(source_names) / sizeof(source_names[0]) ? source_names[source]
                                                                           : "?";
}

/* The setting, else the environment variable (env NULL: none); empty counts as unset. */
static const char *pick(const char *setting, const char *env) {
    if (setting != NULL && setting[0] != '\0')
        return setting;
    const char *v = env != NULL ? getenv(env) : NULL;
    return v != NULL && v[0] != '\0' ? v : NULL;
}

/* True when s is one line of printable text (it may be named in a log line or sent in a header). */
static bool printable(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p < ' ' || *p == 0x7f)
            return false;
    }
    return true;
}

static bool http_url(const char *s) {
    if (strncmp(s, "http://", 7) != 0 && strncmp(s, "https://", 8) != 0)
        return false;
    return printable(s) && strchr(s, ' ') == NULL;
}

/* A tenant goes into the token URL's path: a GUID or a domain name. */
static bool tenant_ok(const char *s) {
    for (const char *p = s; *p != '\0'; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '.' || *p == '_'))
            return false;
    }
    return s[0] != '\0';
}

/* The kind the source resolves to, and why for AUTO (into why, else ""). */
static kind_t resolve_kind(const ces_identity_settings_t *s, char *why, size_t why_size) {
    bool token_file = pick(s->federated_token_file, "AZURE_FEDERATED_TOKEN_FILE") != NULL;
    bool app_service = pick(s->identity_endpoint, "IDENTITY_ENDPOINT") != NULL &&
                       pick(s->identity_header, "IDENTITY_HEADER") != NULL &&
                       (s->imds_endpoint == NULL || s->imds_endpoint[0] == '\0');
    why[0] = '\0';
    switch (s->source) {
    case CES_IDENTITY_SOURCE_APP_SERVICE:
        return KIND_APP_SERVICE;
    case CES_IDENTITY_SOURCE_WORKLOAD_IDENTITY:
        return KIND_WORKLOAD;
    case CES_IDENTITY_SOURCE_CLIENT_SECRET:
        return KIND_SECRET;
    case CES_IDENTITY_SOURCE_COMMAND:
        return KIND_COMMAND;
    case CES_IDENTITY_SOURCE_MANAGED_IDENTITY:
        return app_service ? KIND_APP_SERVICE : KIND_IMDS;
    case CES_IDENTITY_SOURCE_AUTO:
    default:
        break;
    }
    if (token_file) {
        snprintf(why, why_size, "; source auto: a federated token file is set");
        return KIND_WORKLOAD;
    }
    if (app_service) {
        snprintf(why, why_size, "; source auto: IDENTITY_ENDPOINT and IDENTITY_HEADER are set");
        return KIND_APP_SERVICE;
    }
    snprintf(why, why_size, "; source auto: no federated token file, no App Service endpoint");
    return KIND_IMDS;
}

/* What the resolved kind needs, read from s and the environment; strings still borrowed. */
typedef struct {
    const char *client_id, *tenant_id, *authority, *token_file, *secret, *endpoint, *command;
} resolved_t;

/* Fills r for kind and checks it. Returns 0, or -1 with errstr set. */
static int resolve(const ces_identity_settings_t *s, kind_t kind, resolved_t *r, char *errstr,
                   size_t errstr_size) {
    memset(r, 0, sizeof(*r));
    r->client_id = pick(s->client_id, "AZURE_CLIENT_ID");
    const char *missing = NULL;
    if (kind == KIND_IMDS) {
        r->endpoint = pick(s->imds_endpoint, NULL) ? s->imds_endpoint : DEFAULT_IMDS;
    } else if (kind == KIND_APP_SERVICE) {
        r->endpoint = pick(s->identity_endpoint, "IDENTITY_ENDPOINT");
        r->secret = pick(s->identity_header, "IDENTITY_HEADER");
        missing = r->endpoint == NULL ? "identity_endpoint (or IDENTITY_ENDPOINT)"
                  : r->secret == NULL ? "identity_header (or IDENTITY_HEADER)"
                                      : NULL;
    } else if (kind == KIND_WORKLOAD || kind == KIND_SECRET) {
        r->tenant_id = pick(s->tenant_id, "AZURE_TENANT_ID");
        r->authority = pick(s->authority_host, "AZURE_AUTHORITY_HOST");
        if (r->authority == NULL)
            r->authority = DEFAULT_AUTHORITY;
        if (kind == KIND_WORKLOAD)
            r->token_file = pick(s->federated_token_file, "AZURE_FEDERATED_TOKEN_FILE");
        else
            r->secret = pick(s->client_secret, NULL);
        missing = r->tenant_id == NULL   ? "tenant_id (or AZURE_TENANT_ID)"
                  : r->client_id == NULL ? "client_id (or AZURE_CLIENT_ID)"
                  : kind == KIND_SECRET && r->secret == NULL
                      ? "client_secret"
                  : kind == KIND_WORKLOAD && r->token_file == NULL
                      ? "federated_token_file (or AZURE_FEDERATED_TOKEN_FILE)"
                      : NULL;
    } else {
        r->command = pick(s->command, NULL);
        missing = r->command == NULL ? "command" : NULL;
    }
    const char *bad = NULL;
    if (missing != NULL)
        snprintf(errstr, errstr_size, "the identity needs %s", missing);
    else if (r->endpoint != NULL && !http_url(r->endpoint))
        bad = "its endpoint is no http:// or https:// URL on one line";
    else if (r->authority != NULL && !http_url(r->authority))
        bad = "its authority host is no http:// or https:// URL on one line";
    else if (r->tenant_id != NULL && !tenant_ok(r->tenant_id))
        bad = "its tenant id is neither a GUID nor a domain name";
    else if ((r->client_id != NULL && !printable(r->client_id)) ||
             (r->token_file != NULL && !printable(r->token_file)) ||
             (r->secret != NULL && !printable(r->secret)) || (s->ca_file && !printable(s->ca_file)))
        bad = "a setting holds a line break or a control character";
    else if (s->timeout_ms < 0)
        bad = "its timeout is negative";
    if (bad != NULL)
        snprintf(errstr, errstr_size, "the identity cannot work: %s", bad);
    return missing != NULL || bad != NULL ? -1 : 0;
}

/* The description of the resolved identity, without secrets. */
static void describe(ces_identity_t *id, const resolved_t *r, const char *why) {
    char client[300] = "system-assigned";
    if (id->client_id != NULL)
        snprintf(client, sizeof(client), "client_id %s", id->client_id);
    size_t size = sizeof(id->description);
    if (id->kind == KIND_IMDS) {
        snprintf(id->description, size, "managed identity (IMDS %s, %s%s)", id->endpoint, client,
                 why);
    } else if (id->kind == KIND_APP_SERVICE) {
        snprintf(id->description, size, "managed identity (App Service endpoint %s, %s%s)",
                 id->endpoint, client, why);
    } else if (id->kind == KIND_WORKLOAD) {
        snprintf(id->description, size,
                 "workload identity (tenant %s, client %s, token file %s, authority %s%s)",
                 id->tenant_id, id->client_id, id->token_file, r->authority, why);
    } else if (id->kind == KIND_SECRET) {
        snprintf(id->description, size,
                 "service principal with a client secret (tenant %s, client %s, authority %s)",
                 id->tenant_id, id->client_id, r->authority);
    } else {
        /* A command line may carry a secret: name its program only. */
        size_t n = strcspn(id->command, " \t\n");
        char program[CES_LOG_ESCAPED_SIZE(64)];
        ces_log_escape(program, sizeof(program), id->command, n < 64 ? n : 64);
        snprintf(id->description, size, "command (%s%s)", program,
                 id->command[n] != '\0' ? " ..." : "");
    }
}

/* strdup that keeps NULL; sets *failed when memory runs out. */
static char *copy(const char *s, bool *failed) {
    char *c = s != NULL ? strdup(s) : NULL;
    if (s != NULL && c == NULL)
        *failed = true;
    return c;
}

ces_identity_t *ces_identity_new(const ces_identity_settings_t *s, char *errstr,
                                 size_t errstr_size) {
    char why[128];
    kind_t kind = resolve_kind(s, why, sizeof(why));
    resolved_t r;
    if (resolve(s, kind, &r, errstr, errstr_size) != 0)
        return NULL;
    ces_identity_t *id = calloc(1, sizeof(*id));
    if (id == NULL || pthread_mutex_init(&id->lock, NULL) != 0) {
        free(id);
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    bool failed = false;
    id->kind = kind;
    id->timeout_ms = s->timeout_ms > 0 ? s->timeout_ms : DEFAULT_TIMEOUT_MS;
    id->client_id = copy(r.client_id, &failed);
    id->tenant_id = copy(r.tenant_id, &failed);
    id->token_file = copy(r.token_file, &failed);
    id->secret = copy(r.secret, &failed);
    id->command = copy(r.command, &failed);
    id->ca_file = copy(pick(s->ca_file, NULL), &failed);
    if (kind == KIND_WORKLOAD || kind == KIND_SECRET) {
        id->endpoint = ces_request_token_url(r.authority, r.tenant_id);
        failed = failed || id->endpoint == NULL;
    } else {
        id->endpoint = copy(r.endpoint, &failed);
    }
    if (failed) {
        ces_identity_destroy(id);
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    describe(id, &r, why);
    return id;
}

void ces_identity_destroy(ces_identity_t *id) {
    if (id == NULL)
        return;
    for (size_t i = 0; i < CACHE_SLOTS; i++) {
        free(id->cache[i].scope);
        ces_request_free_secret(id->cache[i].token);
    }
    pthread_mutex_destroy(&id->lock);
    free(id->client_id);
    free(id->tenant_id);
    free(id->token_file);
    ces_request_free_secret(id->secret);
    free(id->endpoint);
    ces_request_free_secret(id->command);
    free(id->ca_file);
    free(id);
}

const char *ces_identity_describe(const ces_identity_t *id) {
    return id->description;
}

int ces_identity_token_claims(const char *token, char *who, size_t who_size, char *aud,
                              size_t aud_size, int64_t *exp_s) {
    return ces_answer_claims(token, who, who_size, aud, aud_size, exp_s);
}

static int64_t realtime_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads the federated token file (kubelet rotates it: read for every request) into a new string
 * without surrounding white space. Returns it (owned by the caller, to be wiped), or NULL with
 * errstr set. */
static char *read_assertion(const char *path, char *errstr, size_t errstr_size) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(errstr, errstr_size, "cannot read the federated token file %s: %s", path,
                 strerror(errno));
        return NULL;
    }
    char *buf = malloc(MAX_ASSERTION + 1);
    size_t len = buf != NULL ? fread(buf, 1, MAX_ASSERTION + 1, f) : 0;
    bool failed = buf == NULL || ferror(f) || len > MAX_ASSERTION;
    fclose(f);
    size_t start = 0;
    while (!failed && start < len && strchr(" \t\r\n", buf[start]) != NULL)
        start++;
    while (!failed && len > start && strchr(" \t\r\n", buf[len - 1]) != NULL)
        len--;
    if (failed || len == start || !ces_answer_token_usable(buf + start, len - start)) {
        snprintf(errstr, errstr_size, "the federated token file %s %s", path,
                 buf == NULL ? "cannot be read: out of memory"
                 : failed    ? "cannot be read or is over 64 KiB"
                             : "holds no token (empty, or spaces or control characters inside)");
        if (buf != NULL)
            explicit_bzero(buf, MAX_ASSERTION + 1);
        free(buf);
        return NULL;
    }
    memmove(buf, buf + start, len - start);
    buf[len - start] = '\0';
    return buf;
}

/* One request to the endpoint and its answer taken apart; errstr names the method and endpoint. */
static ces_identity_err_t ask(const ces_identity_t *id, const ces_fetch_request_t *req, bool imds,
                              char **token, int64_t *expires_at_ms, char *errstr,
                              size_t errstr_size) {
    ces_fetch_answer_t answer;
    char detail[768];
    ces_identity_err_t err = ces_fetch(req, &answer, detail, sizeof(detail));
    if (err == CES_IDENTITY_OK && answer.status == 200)
        err = ces_answer_token(answer.body, answer.len, realtime_ms(), token, expires_at_ms,
                               detail, sizeof(detail));
    else if (err == CES_IDENTITY_OK)
        err = ces_answer_error(answer.status, imds, answer.body, answer.len, detail,
                               sizeof(detail));
    ces_fetch_answer_free(&answer);
    if (err != CES_IDENTITY_OK)
        snprintf(errstr, errstr_size, "%s %s: %s", req->form != NULL ? "POST" : "GET",
                 id->endpoint, detail);
    return err;
}

static ces_identity_err_t from_managed(const ces_identity_t *id, const char *scope, char **token,
                                       int64_t *expires_at_ms, char *errstr, size_t errstr_size) {
    ces_identity_err_t err = CES_IDENTITY_NOMEM;
    bool imds = id->kind == KIND_IMDS;
    char *resource = ces_answer_resource(scope);
    char *url = resource == NULL ? NULL
                : ces_request_managed_url(id->endpoint, imds ? "2018-02-01" : "2019-08-01",
                                          resource, id->client_id);
    static const char prefix[] = "X-IDENTITY-HEADER: ";
    size_t header_size = imds ? 0 : sizeof(prefix) + strlen(id->secret);
    char *header = imds ? NULL : malloc(header_size);
    if (url == NULL || (!imds && header == NULL)) {
        snprintf(errstr, errstr_size, "out of memory");
        goto done;
    }
    if (header != NULL)
        snprintf(header, header_size, "%s%s", prefix, id->secret);
    const char *headers[] = {imds ? "Metadata: true" : header, NULL};
    ces_fetch_request_t req = {url, headers, NULL, id->timeout_ms, id->ca_file, true};
    err = ask(id, &req, imds, token, expires_at_ms, errstr, errstr_size);
done:
    ces_request_free_secret(header);
    free(url);
    free(resource);
    return err;
}

static ces_identity_err_t from_entra(const ces_identity_t *id, const char *scope, char **token,
                                     int64_t *expires_at_ms, char **assertion, char *errstr,
                                     size_t errstr_size) {
    if (id->kind == KIND_WORKLOAD) {
        *assertion = read_assertion(id->token_file, errstr, errstr_size);
        if (*assertion == NULL)
            return CES_IDENTITY_CONFIG;
    }
    char *form = ces_request_token_form(id->client_id, scope,
                                        id->kind == KIND_SECRET ? id->secret : NULL, *assertion);
    if (form == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return CES_IDENTITY_NOMEM;
    }
    ces_fetch_request_t req = {id->endpoint, NULL, form, id->timeout_ms, id->ca_file, false};
    ces_identity_err_t err = ask(id, &req, false, token, expires_at_ms, errstr, errstr_size);
    ces_request_free_secret(form);
    return err;
}

static ces_identity_err_t from_command(const ces_identity_t *id, const char *scope, char **token,
                                       int64_t *expires_at_ms, char *errstr, size_t errstr_size) {
    ces_identity_err_t err = CES_IDENTITY_NOMEM;
    char *resource = ces_answer_resource(scope), *out = NULL;
    size_t scope_size = strlen(scope) + sizeof("CES2PG_TOKEN_SCOPE=");
    size_t resource_size = strlen(scope) + sizeof("CES2PG_TOKEN_RESOURCE=");
    char *scope_var = malloc(scope_size), *resource_var = malloc(resource_size);
    char detail[768];
    size_t len = 0;
    if (resource == NULL || scope_var == NULL || resource_var == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        goto done;
    }
    snprintf(scope_var, scope_size, "CES2PG_TOKEN_SCOPE=%s", scope);
    snprintf(resource_var, resource_size, "CES2PG_TOKEN_RESOURCE=%s", resource);
    const char *env[] = {scope_var, resource_var, NULL};
    err = ces_command_run(id->command, env, id->timeout_ms, &out, &len, detail, sizeof(detail));
    if (err == CES_IDENTITY_OK)
        err = ces_answer_command_output(out, len, realtime_ms(), token, expires_at_ms, detail,
                                        sizeof(detail));
    if (err != CES_IDENTITY_OK)
        snprintf(errstr, errstr_size, "%s: %s", id->description, detail);
done:
    if (out != NULL)
        explicit_bzero(out, len);
    free(out);
    free(resource_var);
    free(scope_var);
    free(resource);
    return err;
}

/* Replaces every occurrence of secret (when long enough to tell) in errstr by "(secret)": an
 * endpoint's error text is quoted, and an endpoint could quote what it was sent. */
static void redact(char *errstr, const char *secret) {
    size_t n = secret != NULL ? strlen(secret) : 0;
    if (n < 4)
        return;
    for (char *p = strstr(errstr, secret); p != NULL; p = strstr(p, secret)) {
        static const char mark[] = "(secret)";
        size_t tail = strlen(p + n);
        size_t m = n < sizeof(mark) - 1 ? n : sizeof(mark) - 1;
        memcpy(p, mark, m);
        memmove(p + m, p + n, tail + 1);
        p += m;
    }
}

/* The cached token for scope when it is still fresh: copies it out and returns true. */
static bool cached(ces_identity_t *id, const char *scope, char **token, int64_t *expires_at_ms,
                   bool *nomem) {
    bool hit = false;
    int64_t now = ces_clock_now_ms();
    pthread_mutex_lock(&id->lock);
    for (size_t i = 0; i < CACHE_SLOTS && !hit; i++) {
        slot_t *s = &id->cache[i];
        if (s->scope == NULL || strcmp(s->scope, scope) != 0)
            continue;
        if (!ces_answer_still_fresh(s->lifetime_ms, s->lifetime_ms - (now - s->fetched_ms)))
            break;
        *token = strdup(s->token);
        *nomem = *token == NULL;
        *expires_at_ms = s->expires_at_ms;
        hit = !*nomem;
    }
    pthread_mutex_unlock(&id->lock);
    return hit;
}

/* Keeps a copy of token for scope, in the slot of the same scope, else a free one, else the one
 * that expires first. Out of memory only costs the cache. */
static void keep(ces_identity_t *id, const char *scope, const char *token, int64_t expires_at_ms,
                 int64_t fetched_ms, int64_t lifetime_ms) {
    char *scope_copy = strdup(scope), *token_copy = strdup(token);
    pthread_mutex_lock(&id->lock);
    slot_t *slot = NULL, *unused = NULL, *first_to_expire = &id->cache[0];
    for (size_t i = 0; i < CACHE_SLOTS; i++) {
        slot_t *s = &id->cache[i];
        if (s->scope != NULL && strcmp(s->scope, scope) == 0)
            slot = s;
        else if (s->scope == NULL && unused == NULL)
            unused = s;
        if (s->expires_at_ms < first_to_expire->expires_at_ms)
            first_to_expire = s;
    }
    if (slot == NULL)
        slot = unused != NULL ? unused : first_to_expire;
    free(slot->scope);
    ces_request_free_secret(slot->token);
    memset(slot, 0, sizeof(*slot));
    if (scope_copy != NULL && token_copy != NULL) {
        *slot = (slot_t){scope_copy, token_copy, expires_at_ms, fetched_ms, lifetime_ms};
        scope_copy = token_copy = NULL;
    }
    pthread_mutex_unlock(&id->lock);
    free(scope_copy);
    ces_request_free_secret(token_copy);
}

ces_identity_err_t ces_identity_token(ces_identity_t *id, const char *scope, bool fresh,
                                      char **token, int64_t *expires_at_ms, char *errstr,
                                      size_t errstr_size) {
    *token = NULL;
    *expires_at_ms = 0;
    if (scope == NULL || scope[0] == '\0' || strlen(scope) > 1024 || !printable(scope) ||
        strchr(scope, ' ') != NULL) {
        snprintf(errstr, errstr_size, "a token scope must be one URI without spaces");
        return CES_IDENTITY_CONFIG;
    }
    bool nomem = false;
    if (!fresh && cached(id, scope, token, expires_at_ms, &nomem))
        return CES_IDENTITY_OK;
    int64_t fetched_ms = ces_clock_now_ms(), now_real = realtime_ms();
    char *assertion = NULL;
    ces_identity_err_t err = CES_IDENTITY_NOMEM;
    if (nomem)
        snprintf(errstr, errstr_size, "out of memory");
    else if (id->kind == KIND_IMDS || id->kind == KIND_APP_SERVICE)
        err = from_managed(id, scope, token, expires_at_ms, errstr, errstr_size);
    else if (id->kind == KIND_COMMAND)
        err = from_command(id, scope, token, expires_at_ms, errstr, errstr_size);
    else
        err = from_entra(id, scope, token, expires_at_ms, &assertion, errstr, errstr_size);
    if (err == CES_IDENTITY_OK && *expires_at_ms <= now_real) {
        snprintf(errstr, errstr_size, "%s: the token it answered expired %lld s ago: is "
                 "this machine's clock right?", id->description,
                 (long long)((now_real - *expires_at_ms) / 1000));
        ces_request_free_secret(*token);
        *token = NULL;
        err = CES_IDENTITY_UNAVAILABLE;
    }
    if (err == CES_IDENTITY_OK) {
        keep(id, scope, *token, *expires_at_ms, fetched_ms, *expires_at_ms - now_real);
    } else {
        redact(errstr, id->secret);
        redact(errstr, assertion);
    }
    ces_request_free_secret(assertion);
    return err;
}
