/*
 * nudger: wakes up librdkafka's fetcher when it would otherwise wait.
 *
 * librdkafka before 2.1 stops fetching once the consumer queue holds queued.min.messages or
 * queued.max.messages.kbytes, and looks again only when the broker's thread wakes up: after up to
 * a second when no request is in flight (librdkafka issue #2879, fixed in 2.1 by
 * fetch.queue.backoff.ms, whose default still waits a second). With a prefetch small enough to
 * bound memory that second would dominate a backlog's replication. A resumed partition waits the
 * same way, so pausing partitions to bound memory would stall fetching for seconds. Any request
 * to a broker wakes its thread, which then decides again what to fetch; the cheapest the public
 * API sends to every leader at once is a ListOffsets (rd_kafka_offsets_for_times). So when the
 * queue has filled up and drained to half again, or a partition is resumed, a thread of the
 * nudger sends one. It runs with every librdkafka version: one code path.
 */
#ifndef CES_NUDGER_H
#define CES_NUDGER_H

#include <librdkafka/rdkafka.h>
#include <stdint.h>

typedef struct ces_nudger_s ces_nudger_t;

/*
 * Starts the nudger's thread for the consumer rk, whose consumer queue is queue and whose prefetch
 * limits are max_messages and max_bytes. rk and queue are references: both must outlive the
 * nudger. Returns NULL (with a warning logged) when no thread can be started: the consumer then
 * works, only slower under a backlog. Owned by the caller (ces_nudger_destroy).
 */
ces_nudger_t *ces_nudger_new(rd_kafka_t *rk, rd_kafka_queue_t *queue, int64_t max_messages,
                             int64_t max_bytes);

/* Stops the thread and frees the nudger. Accepts NULL. */
void ces_nudger_destroy(ces_nudger_t *nudger);

/* Called by the polling thread after every poll, with the record it got (NULL for none or an
 * error): once the queue has reached the limits and drained to half, the fetcher has stopped and
 * is woken up. Accepts a NULL nudger. */
void ces_nudger_watch(ces_nudger_t *nudger, const rd_kafka_message_t *m);

/* Wakes the fetcher up now (a partition was resumed). Accepts a NULL nudger. */
void ces_nudger_nudge(ces_nudger_t *nudger);

/* Times the fetcher was woken up; 0 for a NULL nudger. */
uint64_t ces_nudger_wakeups(const ces_nudger_t *nudger);

#endif
