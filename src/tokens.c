#include "tokens.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "identity/identity.h"
#include "util/log.h"

struct ces_tokens_s;

/* One side that logs in with tokens. */
typedef struct {
    struct ces_tokens_s *owner;
    ces_metrics_side_t side;
    const char *name; /* "kafka", "postgres" */
    const char *scope; /* config's, which outlives this */
    char describe[512];
    atomic_llong last_expires_ms; /* of the token logged last: a new one is logged once */
} side_t;

struct ces_tokens_s {
    ces_identity_t *identity;
    side_t sides[CES_METRICS_NSIDES];
    bool used[CES_METRICS_NSIDES];
    _Atomic(ces_metrics_t *) metrics;
    atomic_bool refused;
};

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "<who>, audience <aud>, expires 2026-12-07T18:00:00Z (in 3599 s)" of a token, never the token. */
static void token_facts(const char *token, int64_t expires_at_ms, char *out, size_t out_size) {
    char who[256], aud[256];
    if (ces_identity_token_claims(token, who, sizeof(who), aud, sizeof(aud), NULL) != 0) {
        snprintf(who, sizeof(who), "an opaque token");
        snprintf(aud, sizeof(aud), "unknown");
    }
    time_t secs = (time_t)(expires_at_ms / 1000);
    struct tm tm;
    char when[32] = "?";
    if (gmtime_r(&secs, &tm) != NULL)
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(out, out_size, "%s, audience %s, expires %s (in %lld s)", who, aud, when,
             (long long)((expires_at_ms - wall_ms()) / 1000));
}

/* The token source of a side (util/token.h). Any thread: librdkafka's background thread asks for
 * Kafka's, the main thread for PostgreSQL's. */
static ces_token_status_t fetch(void *opaque, bool fresh, char **token, int64_t *expires_at_ms,
                                char *errstr, size_t errstr_size) {
    side_t *s = opaque;
    ces_tokens_t *t = s->owner;
    ces_metrics_t *metrics = atomic_load(&t->metrics);
    ces_identity_err_t e = ces_identity_token(t->identity, s->scope, fresh, token, expires_at_ms,
                                              errstr, errstr_size);
    if (e == CES_IDENTITY_OK) {
        if (metrics != NULL)
            ces_metrics_token_fetched(metrics, s->side, *expires_at_ms);
        if (atomic_exchange(&s->last_expires_ms, *expires_at_ms) != *expires_at_ms) {
            char facts[640];
            token_facts(*token, *expires_at_ms, facts, sizeof(facts));
            ces_log_info("identity: new %s token from %s: %s", s->name, s->describe, facts);
        }
        return CES_TOKEN_OK;
    }
    if (metrics != NULL)
        ces_metrics_token_failed(metrics, s->side);
    if (e == CES_IDENTITY_UNAVAILABLE) {
        /* PostgreSQL's session says so as it retries; librdkafka does not. */
        if (s->side == CES_METRICS_KAFKA)
            ces_log_warning("identity: no kafka token from %s yet (librdkafka asks again in 10 "
                            "s): %s",
                            s->describe, errstr);
        return CES_TOKEN_RETRY;
    }
    /* Refused, unusable settings, or out of memory: the side's error path says why, once. */
    if (e != CES_IDENTITY_NOMEM)
        atomic_store(&t->refused, true);
    return CES_TOKEN_FATAL;
}

static void use_side(ces_tokens_t *t, ces_metrics_side_t side, const char *name,
                     const char *scope, ces_token_source_t *source) {
    side_t *s = &t->sides[side];
    s->owner = t;
    s->side = side;
    s->name = name;
    s->scope = scope;
    snprintf(s->describe, sizeof(s->describe), "Microsoft Entra ID, %s",
             ces_identity_describe(t->identity));
    atomic_init(&s->last_expires_ms, 0);
    t->used[side] = true;
    *source = (ces_token_source_t){.fetch = fetch, .opaque = s, .describe = s->describe};
    ces_log_debug("%s logs in with %s, tokens for %s", name, s->describe, scope);
}

int ces_tokens_attach(ces_config_t *c, ces_tokens_t **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    bool kafka = strcmp(c->kafka_auth, "entra") == 0, pg = strcmp(c->pg_auth, "entra") == 0;
    if (!kafka && !pg)
        return 0;
    if (kafka && c->kafka_entra_scope == NULL) {
        snprintf(errstr, errstr_size, "%s: kafka.auth = \"entra\" needs kafka.brokers or "
                 "kafka.entra_scope", c->path);
        return -1;
    }
    ces_identity_settings_t s = {
        .client_id = c->identity_client_id,
        .tenant_id = c->identity_tenant_id,
        .authority_host = c->identity_authority_host,
        .federated_token_file = c->identity_federated_token_file,
        .client_secret = c->identity_client_secret,
        .imds_endpoint = c->identity_imds_endpoint,
        .identity_endpoint = c->identity_endpoint,
        .command = c->identity_command,
        .timeout_ms = (int)c->identity_timeout_ms,
    };
    char why[512];
    ces_tokens_t *t = calloc(1, sizeof(*t));
    if (t == NULL || ces_identity_source_parse(c->identity_source, &s.source) != 0 ||
        (t->identity = ces_identity_new(&s, why, sizeof(why))) == NULL) {
        snprintf(errstr, errstr_size, "%s: identity: %s", c->path,
                 t == NULL ? "out of memory" : why);
        free(t);
        return -1;
    }
    atomic_init(&t->metrics, NULL);
    atomic_init(&t->refused, false);
    if (kafka)
        use_side(t, CES_METRICS_KAFKA, "kafka", c->kafka_entra_scope, &c->kafka_token);
    if (pg)
        use_side(t, CES_METRICS_POSTGRES, "postgres", c->pg_entra_scope, &c->pg_token);
    *out = t;
    return 0;
}

void ces_tokens_set_metrics(ces_tokens_t *t, ces_metrics_t *metrics) {
    if (t == NULL)
        return;
    for (size_t i = 0; metrics != NULL && i < CES_METRICS_NSIDES; i++) {
        if (t->used[i])
            ces_metrics_token_used(metrics, (ces_metrics_side_t)i);
    }
    atomic_store(&t->metrics, metrics);
}

bool ces_tokens_refused(const ces_tokens_t *t) {
    return t != NULL && atomic_load(&t->refused);
}

int ces_tokens_check(ces_tokens_t *t, FILE *out, char *errstr, size_t errstr_size) {
    if (t == NULL) {
        fprintf(out, "no side logs in with Microsoft Entra ID: no token to fetch\n");
        return 0;
    }
    for (size_t i = 0; i < CES_METRICS_NSIDES; i++) {
        side_t *s = &t->sides[i];
        if (!t->used[i])
            continue;
        char *token = NULL, why[768], facts[640];
        int64_t expires_at_ms;
        if (fetch(s, false, &token, &expires_at_ms, why, sizeof(why)) != CES_TOKEN_OK) {
            snprintf(errstr, errstr_size, "%s: no token from %s for %s: %s", s->name,
                     s->describe, s->scope, why);
            return -1;
        }
        token_facts(token, expires_at_ms, facts, sizeof(facts));
        explicit_bzero(token, strlen(token));
        free(token);
        fprintf(out, "%s: a token from %s for %s: %s\n", s->name, s->describe, s->scope, facts);
    }
    return 0;
}

void ces_tokens_destroy(ces_tokens_t *t) {
    if (t == NULL)
        return;
    ces_identity_destroy(t->identity);
    free(t);
}
