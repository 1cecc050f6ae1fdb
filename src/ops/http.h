/*
 * http: the operations endpoint, served by libmicrohttpd in its own thread.
 *
 *   GET /metrics   Prometheus text format (metrics.h)
 *   GET /healthz   200 while the main loop turns (it turned within CES_HTTP_ALIVE_MS), else 503
 *   GET /readyz    200 while PostgreSQL is connected and partitions are assigned, else 503
 *
 * The server only reads the metrics object (reference; it must outlive the server).
 */
#ifndef CES_HTTP_H
#define CES_HTTP_H

#include <stddef.h>

#include "ops/metrics.h"

/* How recently the main loop must have turned for /healthz to say 200. Apply waits (PostgreSQL
 * backoff) keep turning it; a batch that runs longer than this in PostgreSQL does not. */
#define CES_HTTP_ALIVE_MS 30000

typedef struct ces_http_s ces_http_t;

/*
 * Starts serving on listen ("HOST:PORT", "[V6ADDR]:PORT"). Returns the server, or NULL with errstr
 * set (address in use, unknown host...). Owned by the caller.
 */
ces_http_t *ces_http_start(const char *listen, ces_metrics_t *metrics, char *errstr,
                           size_t errstr_size);

/* Stops the thread and closes the socket. Accepts NULL. */
void ces_http_stop(ces_http_t *http);

#endif
