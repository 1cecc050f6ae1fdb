/* identity against real endpoints: a token service on 127.0.0.1 (libmicrohttpd) standing in for
 * IMDS, App Service and Entra's v2.0 endpoint, and real commands run by /bin/sh. Every error is
 * checked for the secrets that went into its request. */
#include "test_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "identity/identity.h"
#include "util/clock.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

#define SECRET "s3cr3t+/=&~client-secret-value"
#define HEADER "app-service-header-secret"
#define ASSERTION_1 "eyJhbGciOiJSUzI1NiJ9.assertion-one.sig"
#define ASSERTION_2 "eyJhbGciOiJSUzI1NiJ9.assertion-two.sig"
#define SCOPE_EH "https://ns1.servicebus.windows.net/.default"
#define SCOPE_PG "https://ossrdbms-aad.database.windows.net/.default"

/* The token service: what it answers next, and what the last request asked. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct MHD_Daemon *daemon;
    unsigned short port;
    /* what to answer */
    unsigned status;
    char answer[80 * 1024];
    bool hang; /* wait until released (or 10 s) before answering */
    bool released;
    /* what came */
    int requests;
    char method[8], path[256], resource[256], api_version[32], client_id[64], metadata[16],
        identity_header[128], body[8192];
} srv = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

typedef struct {
    char body[8192];
    size_t len;
} upload_t;

static void copy_value(struct MHD_Connection *conn, enum MHD_ValueKind kind, const char *key,
                       char *dst, size_t size) {
    const char *v = MHD_lookup_connection_value(conn, kind, key);
    snprintf(dst, size, "%s", v != NULL ? v : "");
}

static MHD_Result_t handle(void *cls, struct MHD_Connection *conn, const char *url,
                           const char *method, const char *version, const char *upload_data,
                           size_t *upload_data_size, void **con_cls) {
    (void)cls;
    (void)version;
    upload_t *up = *con_cls;
    if (up == NULL) {
        *con_cls = calloc(1, sizeof(upload_t));
        return *con_cls != NULL ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size != 0) {
        size_t n = *upload_data_size;
        if (n > sizeof(up->body) - 1 - up->len)
            n = sizeof(up->body) - 1 - up->len;
        memcpy(up->body + up->len, upload_data, n);
        up->len += n;
        *upload_data_size = 0;
        return MHD_YES;
    }
    pthread_mutex_lock(&srv.lock);
    srv.requests++;
    snprintf(srv.method, sizeof(srv.method), "%s", method);
    snprintf(srv.path, sizeof(srv.path), "%s", url);
    copy_value(conn, MHD_GET_ARGUMENT_KIND, "resource", srv.resource, sizeof(srv.resource));
    copy_value(conn, MHD_GET_ARGUMENT_KIND, "api-version", srv.api_version,
               sizeof(srv.api_version));
    copy_value(conn, MHD_GET_ARGUMENT_KIND, "client_id", srv.client_id, sizeof(srv.client_id));
    copy_value(conn, MHD_HEADER_KIND, "Metadata", srv.metadata, sizeof(srv.metadata));
    copy_value(conn, MHD_HEADER_KIND, "X-IDENTITY-HEADER", srv.identity_header,
               sizeof(srv.identity_header));
    memcpy(srv.body, up->body, up->len + 1);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (srv.hang && !srv.released &&
           pthread_cond_timedwait(&srv.cond, &srv.lock, &until) != ETIMEDOUT)
        ;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(srv.answer), srv.answer,
                                                             MHD_RESPMEM_MUST_COPY);
    unsigned status = srv.status;
    pthread_mutex_unlock(&srv.lock);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_Result_t rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    (void)toe;
    free(*con_cls);
    *con_cls = NULL;
}

static int start_server(void **state) {
    (void)state;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    srv.daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL, handle,
        NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED,
        completed, NULL, MHD_OPTION_END);
    if (srv.daemon == NULL)
        return -1;
    srv.port = MHD_get_daemon_info(srv.daemon, MHD_DAEMON_INFO_BIND_PORT)->port;
    return 0;
}

static int stop_server(void **state) {
    (void)state;
    MHD_stop_daemon(srv.daemon);
    return 0;
}

/* Clears what came and sets what the service answers next. */
static void answer(unsigned status, const char *body) {
    pthread_mutex_lock(&srv.lock);
    srv.status = status;
    snprintf(srv.answer, sizeof(srv.answer), "%s", body);
    srv.hang = srv.released = false;
    srv.method[0] = srv.path[0] = srv.resource[0] = srv.api_version[0] = '\0';
    srv.client_id[0] = srv.metadata[0] = srv.identity_header[0] = srv.body[0] = '\0';
    pthread_mutex_unlock(&srv.lock);
}

static int requests(void) {
    pthread_mutex_lock(&srv.lock);
    int n = srv.requests;
    pthread_mutex_unlock(&srv.lock);
    return n;
}

/* The value of field in the last form body, decoded. */
static const char *form_field(const char *field) {
    static char out[1024];
    size_t flen = strlen(field);
    out[0] = '\0';
    for (const char *p = srv.body; *p != '\0';) {
        size_t len = strcspn(p, "&");
        if (len > flen && strncmp(p, field, flen) == 0 && p[flen] == '=') {
            size_t n = 0;
            for (const char *v = p + flen + 1; v < p + len && n < sizeof(out) - 1; v++) {
                unsigned hex;
                if (*v == '%' && sscanf(v + 1, "%2x", &hex) == 1) {
                    out[n++] = (char)hex;
                    v += 2;
                } else {
                    out[n++] = *v == '+' ? ' ' : *v;
                }
            }
            out[n] = '\0';
            return out;
        }
        p += len + (p[len] == '&');
    }
    return NULL;
}

static int64_t now_s(void) {
    return (int64_t)time(NULL);
}

/* A JSON token answer of the IMDS shape (numbers as strings), the token token. */
static const char *imds_answer(const char *token, int64_t lifetime_s) {
    static char body[2048];
    snprintf(body, sizeof(body),
             "{\"access_token\":\"%s\",\"client_id\":\"c\",\"expires_in\":\"%lld\","
             "\"expires_on\":\"%lld\",\"ext_expires_in\":\"%lld\",\"not_before\":\"%lld\","
             "\"resource\":\"r\",\"token_type\":\"Bearer\"}",
             token, (long long)lifetime_s, (long long)(now_s() + lifetime_s),
             (long long)lifetime_s, (long long)now_s());
    return body;
}

static const char *url(const char *path) {
    static char buf[4][256];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, 256, "http://127.0.0.1:%u%s", srv.port, path);
    return b;
}

/* ces_identity_token, the error string left in err; the token (if any) freed after checking it
 * against want (NULL: any). */
static ces_identity_err_t get(ces_identity_t *id, const char *scope, bool fresh, const char *want,
                              char *err, size_t err_size) {
    char *token = NULL;
    int64_t expires = -1;
    err[0] = '\0';
    ces_identity_err_t rc = ces_identity_token(id, scope, fresh, &token, &expires, err, err_size);
    if (rc == CES_IDENTITY_OK) {
        assert_non_null(token);
        if (want != NULL)
            assert_string_equal(token, want);
        assert_true(expires > (now_s() - 5) * 1000);
        free(token);
    } else {
        assert_null(token);
        assert_true(err[0] != '\0');
        assert_null(strchr(err, '\n'));
    }
    return rc;
}

/* No secret of any request in err. */
static void assert_no_secret(const char *err) {
    static const char *const secrets[] = {SECRET, HEADER, ASSERTION_1, ASSERTION_2, "tok-"};
    for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++) {
        if (strstr(err, secrets[i]) != NULL)
            fail_msg("error quotes a secret: %s", err);
    }
}

static void imds_tokens_are_fetched_and_cached(void **state) {
    (void)state;
    char err[1024];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_MANAGED_IDENTITY,
                                 .imds_endpoint = url("/metadata/identity/oauth2/token")};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(200, imds_answer("tok-imds-1", 3600));
    int before = requests();
    assert_int_equal(get(id, SCOPE_PG, false, "tok-imds-1", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 1);
    assert_string_equal(srv.method, "GET");
    assert_string_equal(srv.path, "/metadata/identity/oauth2/token");
    assert_string_equal(srv.api_version, "2018-02-01");
    assert_string_equal(srv.resource, "https://ossrdbms-aad.database.windows.net");
    assert_string_equal(srv.metadata, "true");
    assert_string_equal(srv.client_id, "");
    /* Cached: no request; fresh: one; another scope: one of its own. */
    answer(200, imds_answer("tok-imds-2", 3600));
    assert_int_equal(get(id, SCOPE_PG, false, "tok-imds-1", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 1);
    assert_int_equal(get(id, SCOPE_PG, true, "tok-imds-2", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 2);
    assert_int_equal(get(id, SCOPE_PG, false, "tok-imds-2", err, sizeof(err)), CES_IDENTITY_OK);
    answer(200, imds_answer("tok-imds-eh", 3600));
    assert_int_equal(get(id, SCOPE_EH, false, "tok-imds-eh", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 3);
    assert_string_equal(srv.resource, "https://ns1.servicebus.windows.net");
    assert_int_equal(get(id, SCOPE_PG, false, "tok-imds-2", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 3);
    ces_identity_destroy(id);

    /* A user-assigned identity is asked for by client_id. */
    s.client_id = "uami-client-id";
    id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(200, imds_answer("tok-imds-3", 3600));
    assert_int_equal(get(id, SCOPE_PG, false, "tok-imds-3", err, sizeof(err)), CES_IDENTITY_OK);
    assert_string_equal(srv.client_id, "uami-client-id");
    ces_identity_destroy(id);
}

/* A token is fetched again once less than a quarter of its life is left (2 s: margin 0.5 s). */
static void a_token_near_its_expiry_is_fetched_again(void **state) {
    (void)state;
    char err[1024];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_MANAGED_IDENTITY,
                                 .imds_endpoint = url("/token")};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(200, "{\"access_token\":\"tok-short-1\",\"expires_in\":\"2\"}");
    int before = requests();
    assert_int_equal(get(id, SCOPE_EH, false, "tok-short-1", err, sizeof(err)), CES_IDENTITY_OK);
    answer(200, "{\"access_token\":\"tok-short-2\",\"expires_in\":\"2\"}");
    assert_int_equal(get(id, SCOPE_EH, false, "tok-short-1", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 1);
    struct timespec wait = {1, 600 * 1000 * 1000}; /* 1.6 s: 0.4 s left, under the margin */
    nanosleep(&wait, NULL);
    assert_int_equal(get(id, SCOPE_EH, false, "tok-short-2", err, sizeof(err)), CES_IDENTITY_OK);
    assert_int_equal(requests(), before + 2);
    /* An answer that is expired already is no token (a clock far off). */
    answer(200, "{\"access_token\":\"tok-old\",\"expires_on\":\"1700000000\"}");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "expired"));
    assert_no_secret(err);
    ces_identity_destroy(id);
}

static void app_service_sends_its_header_and_never_shows_it(void **state) {
    (void)state;
    char err[1024];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_APP_SERVICE,
                                 .identity_endpoint = url("/msi/token"),
                                 .identity_header = HEADER};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    assert_null(strstr(ces_identity_describe(id), HEADER));
    char body[512];
    snprintf(body, sizeof(body),
             "{\"access_token\":\"tok-app-1\",\"expires_on\":%lld,\"resource\":\"r\","
             "\"token_type\":\"Bearer\",\"client_id\":\"c\"}",
             (long long)(now_s() + 3600));
    answer(200, body);
    assert_int_equal(get(id, SCOPE_EH, false, "tok-app-1", err, sizeof(err)), CES_IDENTITY_OK);
    assert_string_equal(srv.path, "/msi/token");
    assert_string_equal(srv.api_version, "2019-08-01");
    assert_string_equal(srv.identity_header, HEADER);
    assert_string_equal(srv.resource, "https://ns1.servicebus.windows.net");
    /* A refusal that quotes the header back: REFUSED, the header redacted. */
    answer(400, "{\"statusCode\":400,\"message\":\"No managed identity found for header "
                HEADER "\"}");
    assert_int_equal(get(id, SCOPE_EH, true, NULL, err, sizeof(err)), CES_IDENTITY_REFUSED);
    assert_non_null(strstr(err, "HTTP 400: No managed identity found for header (secret)"));
    assert_non_null(strstr(err, url("/msi/token")));
    assert_no_secret(err);
    ces_identity_destroy(id);
}

static void a_client_secret_is_posted_and_its_refusal_quoted(void **state) {
    (void)state;
    char err[1024];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_CLIENT_SECRET,
                                 .tenant_id = "tenant-1",
                                 .client_id = "sp-client",
                                 .client_secret = SECRET,
                                 .authority_host = url("/")};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(200, "{\"token_type\":\"Bearer\",\"expires_in\":3599,\"ext_expires_in\":3599,"
                "\"access_token\":\"tok-sp-1\"}");
    assert_int_equal(get(id, SCOPE_EH, false, "tok-sp-1", err, sizeof(err)), CES_IDENTITY_OK);
    assert_string_equal(srv.method, "POST");
    assert_string_equal(srv.path, "/tenant-1/oauth2/v2.0/token");
    assert_string_equal(form_field("client_id"), "sp-client");
    assert_string_equal(form_field("scope"), SCOPE_EH);
    assert_string_equal(form_field("grant_type"), "client_credentials");
    assert_string_equal(form_field("client_secret"), SECRET);
    assert_null(form_field("client_assertion"));
    answer(401, "{\"error\":\"invalid_client\",\"error_description\":\"AADSTS7000215: Invalid "
                "client secret provided. Ensure the secret being sent in the request is the "
                "client secret value, not the client secret ID, for a secret added to app "
                "'sp-client'.\\r\\nTrace ID: 4c7d\\r\\nCorrelation ID: 9f1e\\r\\nTimestamp: "
                "2025-12-07 17:00:00Z\",\"error_codes\":[7000215],\"timestamp\":\"2025-12-07 "
                "17:00:00Z\",\"trace_id\":\"4c7d\",\"correlation_id\":\"9f1e\"}");
    assert_int_equal(get(id, SCOPE_EH, true, NULL, err, sizeof(err)), CES_IDENTITY_REFUSED);
    char want[512];
    snprintf(want, sizeof(want),
             "POST %s: HTTP 401: AADSTS7000215: Invalid client secret provided.",
             url("/tenant-1/oauth2/v2.0/token"));
    assert_string_equal(err, want);
    /* The cached token is still handed out: a refusal does not empty the cache. */
    assert_int_equal(get(id, SCOPE_EH, false, "tok-sp-1", err, sizeof(err)), CES_IDENTITY_OK);
    /* An endpoint that echoes the secret: redacted. */
    answer(400, "{\"error\":\"invalid_request\",\"error_description\":\"bad secret " SECRET
                "\"}");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_REFUSED);
    assert_no_secret(err);
    assert_non_null(strstr(err, "bad secret (secret)"));
    ces_identity_destroy(id);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void workload_identity_reads_its_token_file_for_every_request(void **state) {
    (void)state;
    char err[1024], file[] = "/tmp/ces2pg-federated-XXXXXX";
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    close(fd);
    write_file(file, ASSERTION_1 "\n");
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_WORKLOAD_IDENTITY,
                                 .tenant_id = "tenant-2",
                                 .client_id = "wl-client",
                                 .federated_token_file = file,
                                 .authority_host = url("")};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(200, "{\"token_type\":\"Bearer\",\"expires_in\":3599,\"access_token\":\"tok-wl-1\"}");
    assert_int_equal(get(id, SCOPE_PG, false, "tok-wl-1", err, sizeof(err)), CES_IDENTITY_OK);
    assert_string_equal(srv.path, "/tenant-2/oauth2/v2.0/token");
    assert_string_equal(form_field("client_assertion"), ASSERTION_1);
    assert_string_equal(form_field("client_assertion_type"),
                        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer");
    assert_string_equal(form_field("client_id"), "wl-client");
    assert_null(form_field("client_secret"));
    /* kubelet rotated the file. */
    write_file(file, ASSERTION_2);
    answer(200, "{\"token_type\":\"Bearer\",\"expires_in\":3599,\"access_token\":\"tok-wl-2\"}");
    assert_int_equal(get(id, SCOPE_PG, true, "tok-wl-2", err, sizeof(err)), CES_IDENTITY_OK);
    assert_string_equal(form_field("client_assertion"), ASSERTION_2);
    /* Refused, quoting the assertion: redacted. */
    answer(401, "{\"error\":\"invalid_client\",\"error_description\":\"AADSTS700211: No matching "
                "federated identity record found for presented assertion issuer. Assertion "
                ASSERTION_2 ".\",\"error_codes\":[700211]}");
    assert_int_equal(get(id, SCOPE_PG, true, NULL, err, sizeof(err)), CES_IDENTITY_REFUSED);
    assert_non_null(strstr(err, "HTTP 401: AADSTS700211: No matching federated identity record "
                                "found for presented assertion issuer."));
    assert_no_secret(err);
    /* The file gone: a configuration problem, named. */
    unlink(file);
    int before = requests();
    assert_int_equal(get(id, SCOPE_PG, true, NULL, err, sizeof(err)), CES_IDENTITY_CONFIG);
    assert_non_null(strstr(err, file));
    assert_int_equal(requests(), before);
    ces_identity_destroy(id);
}

/* Outages, slowness and garbage are UNAVAILABLE, and say what happened. */
static void outages_and_slowness_are_unavailable(void **state) {
    (void)state;
    char err[1024];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_MANAGED_IDENTITY,
                                 .imds_endpoint = url("/token"),
                                 .timeout_ms = 300};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(500, "{\"error\":\"unknown_error\",\"error_description\":\"Failed to get token.\"}");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    char want[256];
    snprintf(want, sizeof(want), "GET %s: HTTP 500: unknown_error: Failed to get token.",
             url("/token"));
    assert_string_equal(err, want);
    answer(429, "");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "HTTP 429"));
    answer(410, "");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    answer(200, "<html>proxy says hi</html>");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "not a JSON object"));
    answer(200, "{\"access_token\":\"tok- space\",\"expires_in\":\"60\"}");
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_no_secret(err);
    /* Over 64 KiB: the transfer is cut. */
    char big[70 * 1024];
    memset(big, ' ', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    big[0] = '{';
    big[sizeof(big) - 2] = '}';
    answer(200, big);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "longer than 64 KiB"));
    /* Slow: no answer within the timeout. */
    answer(200, imds_answer("tok-late", 3600));
    pthread_mutex_lock(&srv.lock);
    srv.hang = true;
    pthread_mutex_unlock(&srv.lock);
    int64_t start = ces_clock_now_ms();
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    int64_t took = ces_clock_now_ms() - start;
    assert_true(took >= 250 && took < 3000);
    assert_non_null(strstr(err, "no answer within 300 ms"));
    pthread_mutex_lock(&srv.lock);
    srv.released = true;
    pthread_cond_broadcast(&srv.cond);
    pthread_mutex_unlock(&srv.lock);
    ces_identity_destroy(id);
    /* Nobody listening. */
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(addr);
    assert_int_equal(bind(sock, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(getsockname(sock, (struct sockaddr *)&addr, &alen), 0);
    close(sock); /* bound, never listening: connections are refused */
    char closed[128];
    snprintf(closed, sizeof(closed), "http://127.0.0.1:%u/token", ntohs(addr.sin_port));
    s.imds_endpoint = closed;
    id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, closed));
    ces_identity_destroy(id);
}

/* Many threads at once against one handle (librdkafka's background thread and the main thread). */
static void *hammer(void *arg) {
    ces_identity_t *id = arg;
    char err[512];
    for (int i = 0; i < 20; i++) {
        char *token = NULL;
        int64_t expires;
        if (ces_identity_token(id, i % 2 ? SCOPE_EH : SCOPE_PG, i % 5 == 0, &token, &expires, err,
                               sizeof(err)) != CES_IDENTITY_OK ||
            strcmp(token, "tok-shared") != 0) {
            free(token);
            return (void *)1;
        }
        free(token);
    }
    return NULL;
}

static void threads_share_one_handle(void **state) {
    (void)state;
    char err[512];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_MANAGED_IDENTITY,
                                 .imds_endpoint = url("/token")};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    answer(200, imds_answer("tok-shared", 3600));
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, hammer, id), 0);
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        assert_null(rc);
    }
    ces_identity_destroy(id);
}

static ces_identity_t *command_identity(const char *command, int timeout_ms) {
    char err[512];
    ces_identity_settings_t s = {.source = CES_IDENTITY_SOURCE_COMMAND, .command = command,
                                 .timeout_ms = timeout_ms};
    ces_identity_t *id = ces_identity_new(&s, err, sizeof(err));
    assert_non_null(id);
    return id;
}

/* The pipes this process has open (the loopback service's sockets come and go on their own). */
static int open_pipes(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300], target[64] = "";
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        if (readlink(path, target, sizeof(target) - 1) > 0 && strncmp(target, "pipe:", 5) == 0)
            n++;
    }
    closedir(d);
    return n;
}

static void a_command_prints_json_or_a_bare_jwt(void **state) {
    (void)state;
    char err[1024], cmd[2048];
    int pipes = open_pipes();
    /* az's JSON; the scope and resource in its environment. */
    snprintf(cmd, sizeof(cmd),
             "test \"$CES2PG_TOKEN_SCOPE\" = '%s' && "
             "test \"$CES2PG_TOKEN_RESOURCE\" = 'https://ns1.servicebus.windows.net' && "
             "printf '{\"accessToken\": \"tok-az-1\", \"expiresOn\": \"2030-01-01 00:00:00.000000\","
             " \"expires_on\": %lld, \"subscription\": \"s\", \"tenant\": \"t\", "
             "\"tokenType\": \"Bearer\"}\\n'",
             SCOPE_EH, (long long)(now_s() + 3600));
    ces_identity_t *id = command_identity(cmd, 5000);
    assert_string_equal(ces_identity_describe(id), "command (test ...)");
    assert_int_equal(get(id, SCOPE_EH, false, "tok-az-1", err, sizeof(err)), CES_IDENTITY_OK);
    ces_identity_destroy(id);
    /* A bare JWT, dated by its exp claim. header {"alg":"none"}, payload {"exp":4102444800}. */
    id = command_identity("echo eyJhbGciOiJub25lIn0.eyJleHAiOjQxMDI0NDQ4MDB9.c2ln", 5000);
    char *token = NULL;
    int64_t expires;
    assert_int_equal(ces_identity_token(id, SCOPE_PG, false, &token, &expires, err, sizeof(err)),
                     CES_IDENTITY_OK);
    assert_string_equal(token, "eyJhbGciOiJub25lIn0.eyJleHAiOjQxMDI0NDQ4MDB9.c2ln");
    assert_int_equal(expires, 4102444800000LL);
    free(token);
    ces_identity_destroy(id);
    /* Nothing of ces2pg's reaches the command: its descriptors are 0, 1 and 2, those this process
     * lets every child inherit (the test runner's), and ls's own directory. */
    id = command_identity("printf '{\"access_token\":\"fd-%s\",\"expires_in\":60}' "
                          "\"$(ls /proc/self/fd | tr '\\n' '-')\"",
                          5000);
    token = NULL;
    assert_int_equal(ces_identity_token(id, SCOPE_PG, false, &token, &expires, err, sizeof(err)),
                     CES_IDENTITY_OK);
    int unexplained = 0;
    for (char *p = token + 3; *p != '\0'; p += strcspn(p, "-") + 1) {
        int fd = atoi(p), flags = fcntl(fd, F_GETFD);
        if (fd > 2 && (flags < 0 || (flags & FD_CLOEXEC) != 0)) /* ls's directory, or a leak */
            unexplained++;
    }
    assert_int_equal(unexplained, 1);
    free(token);
    ces_identity_destroy(id);
    assert_int_equal(open_pipes(), pipes);
}

static void a_failing_command_is_unavailable_and_quoted_from_stderr(void **state) {
    (void)state;
    char err[1024];
    ces_identity_t *id = command_identity(
        "echo tok-stdout-never-shown; "
        "printf 'ERROR: Please run \\047az login\\047 to setup account.\\033[2J\\nsecond line\\n' "
        ">&2; exit 1",
        5000);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "the command exited with status 1: ERROR: Please run 'az login' "
                                "to setup account.\\x1b[2J"));
    assert_null(strstr(err, "second line"));
    assert_no_secret(err);
    ces_identity_destroy(id);
    id = command_identity("kill -TERM $$", 5000);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "killed by signal 15"));
    ces_identity_destroy(id);
    /* SIGPIPE is ignored here (as in the daemon) but not in the command. */
    id = command_identity("kill -PIPE $$; echo tok-after-sigpipe", 5000);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "killed by signal 13"));
    ces_identity_destroy(id);
    id = command_identity("head -c 70000 /dev/zero | tr '\\0' a", 5000);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    assert_non_null(strstr(err, "more than 64 KiB"));
    ces_identity_destroy(id);
    id = command_identity("echo opaque-token-no-expiry", 5000);
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_CONFIG);
    assert_null(strstr(err, "opaque-token"));
    ces_identity_destroy(id);
}

/* True once pid is gone or a zombie (its parent, killed too, left it to init). */
static bool gone(pid_t pid) {
    for (int i = 0; i < 200; i++) {
        char path[64], stat[256] = "";
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            return true;
        bool read = fgets(stat, sizeof(stat), f) != NULL;
        fclose(f);
        const char *state_char = read ? strrchr(stat, ')') : NULL;
        if (state_char != NULL && (state_char[2] == 'Z' || state_char[2] == 'X'))
            return true;
        struct timespec ten_ms = {0, 10 * 1000 * 1000};
        nanosleep(&ten_ms, NULL);
    }
    return false;
}

static void a_slow_command_is_killed_with_what_it_started(void **state) {
    (void)state;
    char err[1024], file[] = "/tmp/ces2pg-cmdpid-XXXXXX", cmd[256];
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof(cmd), "sleep 30 & echo $! > %s; wait", file);
    ces_identity_t *id = command_identity(cmd, 300);
    int64_t start = ces_clock_now_ms();
    assert_int_equal(get(id, SCOPE_PG, false, NULL, err, sizeof(err)), CES_IDENTITY_UNAVAILABLE);
    int64_t took = ces_clock_now_ms() - start;
    assert_true(took >= 250 && took < 3000);
    assert_non_null(strstr(err, "did not finish within 300 ms and was killed"));
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    int pid = 0;
    assert_int_equal(fscanf(f, "%d", &pid), 1);
    fclose(f);
    unlink(file);
    assert_true(pid > 0);
    assert_true(gone((pid_t)pid));
    ces_identity_destroy(id);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as the daemon does: the command must not inherit it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(imds_tokens_are_fetched_and_cached),
        cmocka_unit_test(a_token_near_its_expiry_is_fetched_again),
        cmocka_unit_test(app_service_sends_its_header_and_never_shows_it),
        cmocka_unit_test(a_client_secret_is_posted_and_its_refusal_quoted),
        cmocka_unit_test(workload_identity_reads_its_token_file_for_every_request),
        cmocka_unit_test(outages_and_slowness_are_unavailable),
        cmocka_unit_test(threads_share_one_handle),
        cmocka_unit_test(a_command_prints_json_or_a_bare_jwt),
        cmocka_unit_test(a_failing_command_is_unavailable_and_quoted_from_stderr),
        cmocka_unit_test(a_slow_command_is_killed_with_what_it_started),
    };
    return cmocka_run_group_tests(tests, start_server, stop_server);
}
