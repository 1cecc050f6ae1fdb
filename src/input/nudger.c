#include "input/nudger.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "util/log.h"

struct ces_nudger_s {
    rd_kafka_t *rk;          /* reference to the consumer */
    rd_kafka_queue_t *queue; /* reference to its consumer queue, for its length */
    /* The prefetch limits in force (librdkafka's, after kafka.properties), and what the queue is
     * estimated to hold from its length and the running mean of record sizes. */
    int64_t max_messages;
    int64_t max_bytes;
    int64_t mean_len;
    bool filled; /* reached the limits since the last nudge */
    uint64_t wakeups;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool wanted; /* under lock */
    bool stop;   /* under lock */
};

static void *nudger_main(void *arg) {
    ces_nudger_t *n = arg;
    pthread_mutex_lock(&n->lock);
    for (;;) {
        while (!n->wanted && !n->stop)
            pthread_cond_wait(&n->cond, &n->lock);
        if (n->stop)
            break;
        n->wanted = false;
        pthread_mutex_unlock(&n->lock);
        rd_kafka_topic_partition_list_t *parts = NULL;
        if (rd_kafka_assignment(n->rk, &parts) == RD_KAFKA_RESP_ERR_NO_ERROR && parts->cnt > 0) {
            for (int i = 0; i < parts->cnt; i++)
                parts->elems[i].offset = RD_KAFKA_OFFSET_END; /* as a timestamp: "latest" */
            /* The answer does not matter, only that each leader's thread wakes up. */
            rd_kafka_offsets_for_times(n->rk, parts, 500);
        }
        if (parts != NULL)
            rd_kafka_topic_partition_list_destroy(parts);
        pthread_mutex_lock(&n->lock);
    }
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

ces_nudger_t *ces_nudger_new(rd_kafka_t *rk, rd_kafka_queue_t *queue, int64_t max_messages,
                             int64_t max_bytes) {
    ces_nudger_t *n = calloc(1, sizeof(*n));
    if (n == NULL)
        goto fail;
    *n = (ces_nudger_t){.rk = rk, .queue = queue, .max_messages = max_messages,
                        .max_bytes = max_bytes};
    if (pthread_mutex_init(&n->lock, NULL) != 0)
        goto fail;
    if (pthread_cond_init(&n->cond, NULL) != 0) {
        pthread_mutex_destroy(&n->lock);
        goto fail;
    }
    if (pthread_create(&n->thread, NULL, nudger_main, n) != 0) {
        pthread_cond_destroy(&n->cond);
        pthread_mutex_destroy(&n->lock);
        goto fail;
    }
    pthread_setname_np(n->thread, "ces2pg-wakeup");
    return n;
fail:
    free(n);
    ces_log_warning("kafka: no thread to wake up the fetcher: a full prefetch queue may pause "
                    "fetching for up to a second");
    return NULL;
}

void ces_nudger_destroy(ces_nudger_t *n) {
    if (n == NULL)
        return;
    pthread_mutex_lock(&n->lock);
    n->stop = true;
    pthread_cond_signal(&n->cond);
    pthread_mutex_unlock(&n->lock);
    pthread_join(n->thread, NULL);
    pthread_cond_destroy(&n->cond);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

void ces_nudger_nudge(ces_nudger_t *n) {
    if (n == NULL)
        return;
    n->wakeups++;
    pthread_mutex_lock(&n->lock);
    n->wanted = true;
    pthread_cond_signal(&n->cond);
    pthread_mutex_unlock(&n->lock);
}

void ces_nudger_watch(ces_nudger_t *n, const rd_kafka_message_t *m) {
    if (n == NULL)
        return;
    if (m != NULL)
        n->mean_len += ((int64_t)m->len - n->mean_len) / 64;
    int64_t queued = rd_kafka_queue_length(n->queue);
    int64_t bytes = queued * n->mean_len;
    /* 90%: the estimate of the bytes is a mean, and one record has just been taken out. */
    if (queued * 10 >= n->max_messages * 9 || bytes * 10 >= n->max_bytes * 9) {
        n->filled = true;
    } else if (n->filled && queued * 2 <= n->max_messages && bytes * 2 <= n->max_bytes) {
        n->filled = false;
        ces_nudger_nudge(n);
    }
}

uint64_t ces_nudger_wakeups(const ces_nudger_t *n) { return n != NULL ? n->wakeups : 0; }
