/*
 * identity: Microsoft Entra ID access tokens for Event Hubs (SASL OAUTHBEARER) and Azure Database
 * for PostgreSQL (the token as the password).
 *
 * Debian's librdkafka is built without libcurl, so its own OIDC cannot run: ces2pg fetches tokens
 * itself, the way Microsoft's SDKs do, from one of these sources:
 *   - managed identity: the instance metadata service (IMDS) of a VM or scale set, or the App
 *     Service / Container Apps identity endpoint ($IDENTITY_ENDPOINT with $IDENTITY_HEADER);
 *   - workload identity (AKS): a client-credentials request to the tenant's v2.0 token endpoint
 *     with the projected service account token ($AZURE_FEDERATED_TOKEN_FILE) as client assertion;
 *   - a service principal with a client secret (read from a file by conf, never inline);
 *   - a command that prints a token (az account get-access-token, or anything else).
 * The same environment variables as the SDKs' DefaultAzureCredential fill what the settings leave
 * out, so a pod or VM set up for an SDK needs nothing more.
 *
 * Tokens are cached per scope and handed out again until shortly before they expire. No token,
 * secret, client assertion or identity header ever appears in an error or a description: those
 * end up in log lines, `status` output and metrics labels.
 */
#ifndef CES_IDENTITY_H
#define CES_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    CES_IDENTITY_OK = 0,
    /* The endpoint is unreachable or slow, answered HTTP 5xx, 408 or 429 (IMDS also 410: it is
     * being updated), answered something that is not a usable token, or the command failed or
     * timed out: retry with backoff. A command's non-zero exit is counted here because `az` and
     * its kind also fail for passing reasons (network, a refresh in progress); its first stderr
     * line in errstr says when it is a configuration problem ("az login"). */
    CES_IDENTITY_UNAVAILABLE,
    /* Entra or the managed identity endpoint said no (HTTP 4xx with an error body): a wrong client
     * secret, an unknown tenant or client, no identity assigned, an assertion refused. A
     * configuration problem: retrying will not help. */
    CES_IDENTITY_REFUSED,
    /* The settings cannot work: a missing tenant or client id, an unreadable federated token
     * file, a command that prints a token ces2pg cannot date. */
    CES_IDENTITY_CONFIG,
    CES_IDENTITY_NOMEM,
} ces_identity_err_t;

typedef enum {
    /* Workload identity when a federated token file is set, else App Service when both an
     * identity endpoint and its header are set, else IMDS: DefaultAzureCredential's order
     * without the developer tools (and without its environment client secret: ces2pg reads
     * secrets from files only). ces_identity_describe says which one was chosen. */
    CES_IDENTITY_SOURCE_AUTO = 0,
    /* App Service when an identity endpoint and header are set (and no IMDS endpoint is set
     * explicitly), else IMDS. */
    CES_IDENTITY_SOURCE_MANAGED_IDENTITY,
    CES_IDENTITY_SOURCE_APP_SERVICE,
    CES_IDENTITY_SOURCE_WORKLOAD_IDENTITY,
    CES_IDENTITY_SOURCE_CLIENT_SECRET,
    CES_IDENTITY_SOURCE_COMMAND,
} ces_identity_source_t;

/* Parses a source's name in the configuration: "auto", "managed_identity", "app_service",
 * "workload_identity", "client_secret" or "command". Returns 0 and sets *source, or -1. */
int ces_identity_source_parse(const char *name, ces_identity_source_t *source);
/* The configuration name of source (a static string). */
const char *ces_identity_source_name(ces_identity_source_t source);

/* What _new needs. Every string is borrowed for the call to _new, which copies what it uses; NULL
 * means the environment variable named, then the default. */
typedef struct {
    ces_identity_source_t source;
    const char *client_id;            /* $AZURE_CLIENT_ID: a user-assigned managed identity,
                                         the service principal, the workload identity's app */
    const char *tenant_id;            /* $AZURE_TENANT_ID */
    const char *authority_host;       /* $AZURE_AUTHORITY_HOST, else
                                         https://login.microsoftonline.com/ (sovereign clouds
                                         have their own) */
    const char *federated_token_file; /* $AZURE_FEDERATED_TOKEN_FILE; read for every request,
                                         as kubelet rotates it */
    const char *client_secret;        /* the secret itself (conf read it from a file); no
                                         environment fallback */
    const char *imds_endpoint;        /* http://169.254.169.254/metadata/identity/oauth2/token */
    const char *identity_endpoint;    /* $IDENTITY_ENDPOINT (App Service, Container Apps) */
    const char *identity_header;      /* $IDENTITY_HEADER (a secret) */
    const char *command;              /* run with /bin/sh -c; CES2PG_TOKEN_SCOPE and
                                         CES2PG_TOKEN_RESOURCE are set in its environment; no
                                         environment fallback */
    int timeout_ms;                   /* per request or command run; 0: 10000 */
    const char *ca_file;              /* a CA bundle for HTTPS; NULL: the system's */
} ces_identity_settings_t;

typedef struct ces_identity_s ces_identity_t;

/* Resolves the settings (environment fallbacks, the source AUTO picks) and checks that the chosen
 * source has what it needs; fetches nothing. Returns a handle owned by the caller (release with
 * ces_identity_destroy), or NULL with errstr set: settings that cannot work, or out of memory. */
ces_identity_t *ces_identity_new(const ces_identity_settings_t *s, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/* Wipes the secrets and cached tokens and frees id. NULL is fine. No call on id may be running. */
void ces_identity_destroy(ces_identity_t *id);

/*
 * A token for scope ("https://NS.servicebus.windows.net/.default"); the managed identity endpoints
 * and the command get the resource, scope without its trailing "/.default". Any thread: a mutex
 * guards the cache, and no lock is held while a token is fetched.
 *
 * A cached token for scope is returned while its remaining life is more than the refresh margin,
 * min(300 s, a quarter of its lifetime when fetched); fresh skips the cache (after a login that the
 * cached token did not get through). On CES_IDENTITY_OK, *token is a new string owned by the
 * caller (wipe it before freeing) and *expires_at_ms its expiry in milliseconds since the epoch
 * (CLOCK_REALTIME). Otherwise errstr holds one line saying what happened: the endpoint's URL, the
 * HTTP status and, for an Entra refusal, the AADSTS code with the first sentence of its
 * description; never a token, secret, assertion or header value.
 */
ces_identity_err_t ces_identity_token(ces_identity_t *id, const char *scope, bool fresh,
                                      char **token, int64_t *expires_at_ms, char *errstr,
                                      size_t errstr_size) __attribute__((warn_unused_result));

/* One line for the log naming the identity in use, without secrets: "managed identity (IMDS
 * http://..., client_id ...)", "workload identity (tenant T, client C, ...)". Valid until
 * ces_identity_destroy. */
const char *ces_identity_describe(const ces_identity_t *id);

/*
 * What a log line may say about a token, read from its JWT payload (not verified: for telling
 * which identity and audience a broker or server saw). who is the object id (oid), else the
 * application (appid, azp), else the subject (sub), followed by " (tenant TID)" when the token
 * names one; aud the audience (several joined by ","); *exp_s (NULL allowed) the exp claim in
 * seconds since the epoch, 0 when absent. Claims are escaped (ces_log_escape) and cut to the
 * buffers. Returns 0, or -1 when token is not a readable JWT (a command may print an opaque
 * token): then who and aud are empty.
 */
int ces_identity_token_claims(const char *token, char *who, size_t who_size, char *aud,
                              size_t aud_size, int64_t *exp_s);

#endif
