#include "ops/http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/log.h"
#include "util/clock.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

struct ces_http_s {
    struct MHD_Daemon *daemon;
    ces_metrics_t *metrics; /* reference */
};

static MHD_Result_t reply(struct MHD_Connection *conn, unsigned status, const char *type,
                          void *body, size_t len, bool owned) {
    struct MHD_Response *r =
        owned ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
              : MHD_create_response_from_buffer(len, body, MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_Result_t rc = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return rc;
}

static MHD_Result_t text(struct MHD_Connection *conn, unsigned status, const char *body) {
    return reply(conn, status, "text/plain; charset=utf-8", (void *)body, strlen(body), false);
}

static MHD_Result_t handle(void *cls, struct MHD_Connection *conn, const char *url,
                           const char *method, const char *version, const char *upload_data,
                           size_t *upload_data_size, void **con_cls) {
    (void)version;
    (void)upload_data;
    (void)con_cls;
    ces_http_t *h = cls;
    if (*upload_data_size != 0) /* a body we do not want */
        return text(conn, MHD_HTTP_BAD_REQUEST, "no request body expected\n");
    bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!head && strcmp(method, MHD_HTTP_METHOD_GET) != 0)
        return text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    if (strcmp(url, "/metrics") == 0) {
        char *buf;
        size_t len;
        if (ces_metrics_render(h->metrics, &buf, &len) != 0)
            return text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", buf, len,
                     true);
    }
    if (strcmp(url, "/healthz") == 0) {
        bool ok = ces_metrics_alive(h->metrics, ces_clock_now_ms(), CES_HTTP_ALIVE_MS);
        return ok ? text(conn, MHD_HTTP_OK, "ok\n")
                  : text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "main loop stalled\n");
    }
    if (strcmp(url, "/readyz") == 0) {
        bool ok = ces_metrics_ready(h->metrics);
        if (ok && ces_metrics_role(h->metrics) == CES_METRICS_ROLE_STANDBY)
            return text(conn, MHD_HTTP_OK, "ready: standby (another instance writes)\n");
        return ok ? text(conn, MHD_HTTP_OK, "ready\n")
                  : text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                         "not ready: PostgreSQL not connected, retrying, or no partition "
                         "assigned\n");
    }
    return text(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n");
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    ces_log_writev(CES_LOG_WARNING, fmt, ap);
}

/* Splits "HOST:PORT" or "[V6]:PORT". Returns 0, or -1. */
static int split_listen(const char *listen, char *host, size_t host_size, char *port,
                        size_t port_size) {
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon == listen || colon[1] == '\0')
        return -1;
    const char *h = listen;
    size_t hlen = (size_t)(colon - listen);
    if (h[0] == '[') {
        if (hlen < 2 || h[hlen - 1] != ']')
            return -1;
        h++;
        hlen -= 2;
    }
    if (hlen == 0 || hlen >= host_size || strlen(colon + 1) >= port_size)
        return -1;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    snprintf(port, port_size, "%s", colon + 1);
    return 0;
}

ces_http_t *ces_http_start(const char *listen, ces_metrics_t *metrics, char *errstr,
                           size_t errstr_size) {
    char host[256], port[16];
    if (split_listen(listen, host, sizeof(host), port, sizeof(port)) != 0) {
        snprintf(errstr, errstr_size, "http.listen '%s' is not HOST:PORT", listen);
        return NULL;
    }
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || ai == NULL) {
        snprintf(errstr, errstr_size, "http.listen '%s': %s", listen,
                 gai ? gai_strerror(gai) : "no address");
        return NULL;
    }
    ces_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        freeaddrinfo(ai);
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    h->metrics = metrics;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    uint16_t portnum = (uint16_t)atoi(port);
    h->daemon = MHD_start_daemon(
        flags, portnum, NULL, NULL, handle, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->daemon == NULL) {
        snprintf(errstr, errstr_size,
                 "cannot serve HTTP on %s (http.listen): address in use or not available",
                 listen);
        free(h);
        return NULL;
    }
    ces_log_info("serving /metrics, /healthz and /readyz on http://%s", listen);
    return h;
}

void ces_http_stop(ces_http_t *h) {
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
