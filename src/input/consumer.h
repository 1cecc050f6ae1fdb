/*
 * consumer: the only stage that talks to librdkafka.
 *
 * A high-level consumer in a group, with offset storing left to ces2pg: positions live in
 * PostgreSQL, and Kafka's committed offsets are only written after PostgreSQL commits (for lag
 * monitoring). On assignment the owner is asked for the stored positions; on revocation it is asked
 * to commit what is complete first. Both the eager and the cooperative rebalance protocols work.
 */
#ifndef CES_CONSUMER_H
#define CES_CONSUMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/config.h"
#include "input/feed.h"

typedef struct {
    /* Partitions were assigned: fill offsets[i] with the position to start from (or
     * CES_OFFSET_UNSET). Returns 0, or -1 to stop the daemon (errors already logged). */
    int (*assigned)(void *opaque, const char *topic, const int32_t *partitions, size_t n,
                    int64_t *offsets);
    /* Partitions are about to be taken away: apply and commit what is complete for them, drop the
     * rest. Returns 0, or -1 to stop the daemon. */
    int (*revoked)(void *opaque, const char *topic, const int32_t *partitions, size_t n);
    void *opaque;
} ces_consumer_callbacks_t;

typedef enum {
    CES_CONSUMER_OK = 0,
    CES_CONSUMER_CONFIG, /* a property is invalid: errstr names the file and line */
    CES_CONSUMER_FATAL,
} ces_consumer_status_t;

typedef struct ces_consumer_s ces_consumer_t;

/* Checks every Kafka setting of config without connecting. */
ces_consumer_status_t ces_consumer_check_config(const ces_config_t *config, char *errstr,
                                                size_t errstr_size);

/*
 * The value config gives librdkafka's property name, after ces2pg's defaults, Event Hubs mode,
 * kafka.properties and the settings ces2pg forces, as librdkafka itself reports it (its own
 * default when nobody sets it). Copies it into value (cut to value_size) and returns
 * CES_CONSUMER_OK, or an error in errstr as ces_consumer_check_config would, or CES_CONSUMER_CONFIG
 * when librdkafka has no value for name (an unknown name, or one unset and without default).
 * Nothing connects.
 */
ces_consumer_status_t ces_consumer_property(const ces_config_t *config, const char *name,
                                            char *value, size_t value_size, char *errstr,
                                            size_t errstr_size);

/*
 * Creates the consumer and subscribes to config's topics. callbacks is copied. On success *out is
 * owned by the caller (ces_consumer_destroy).
 */
ces_consumer_status_t ces_consumer_new(const ces_config_t *config,
                                       const ces_consumer_callbacks_t *callbacks,
                                       ces_consumer_t **out, char *errstr, size_t errstr_size)
    __attribute__((warn_unused_result));

/* Since when (the monotonic clock) librdkafka has said that no broker is up, with no record and
 * no broker's answer since; 0 while they are reachable. */
int64_t ces_consumer_brokers_down_since(const ces_consumer_t *consumer);

/* The partitions of topics[0..n) the brokers know, asked with a metadata request of at most
 * timeout_ms (the calling thread waits); -1 when they did not say. An answer clears
 * ces_consumer_brokers_down_since. */
int64_t ces_consumer_count_partitions(ces_consumer_t *consumer, char *const *topics, size_t n,
                                      int timeout_ms);

/* Leaves the group (revoking the assignment through the callbacks) and frees the consumer. Accepts
 * NULL. */
void ces_consumer_destroy(ces_consumer_t *consumer);

/*
 * For `ces2pg status`: asks the brokers about config's topics and group without joining it. Calls
 * fn for every partition with its first and next offsets (low -1 when they could not be asked), and
 * sets *members to the group's active members (-1 when unknown) and state (at most state_size
 * bytes, e.g. "Stable", "Empty"). Returns CES_CONSUMER_OK, or an error in errstr.
 */
ces_consumer_status_t ces_consumer_inspect(const ces_config_t *config,
                                           void (*fn)(void *arg, const char *topic,
                                                      int32_t partition, int64_t low,
                                                      int64_t high),
                                           void *arg, int *members, char *state,
                                           size_t state_size, char *errstr, size_t errstr_size);

/* The consumer as the pipeline's feed (every operation of ces_feed_t). The feed refers to the
 * consumer, which must outlive its use. */
void ces_consumer_feed(ces_consumer_t *consumer, ces_feed_t *feed);

/* Waits up to timeout_ms for one record (never CES_POLL_END). */
ces_poll_status_t ces_consumer_poll(ces_consumer_t *consumer, int timeout_ms, ces_record_t *record,
                                    char *errstr, size_t errstr_size);

/* Frees a record's message (handle). Accepts NULL. */
void ces_consumer_give_back(void *handle);

/* Tells Kafka the next offset of a partition, after PostgreSQL committed it (monitoring only). */
void ces_consumer_store_offset(ces_consumer_t *consumer, const char *topic, int32_t partition,
                               int64_t next_offset);

/* Moves a partition's fetch position (after a rolled-back batch). Returns 0 or -1. */
int ces_consumer_seek(ces_consumer_t *consumer, const char *topic, int32_t partition,
                      int64_t offset);

/* Stops (pause = true) or resumes fetching a partition: memory stays bounded while the records
 * already read wait for slower partitions. Returns 0 or -1. */
int ces_consumer_pause(ces_consumer_t *consumer, const char *topic, int32_t partition, bool pause);

/* The partition's high watermark as of the last fetch response (cached: no round trip). Returns 0,
 * or -1 when librdkafka does not know it yet. */
int ces_consumer_high_watermark(ces_consumer_t *consumer, const char *topic, int32_t partition,
                                int64_t *high);

/* Number of partitions currently assigned. */
size_t ces_consumer_assigned_count(const ces_consumer_t *consumer);

/* True once the consumer has joined its group (a first assignment arrived, possibly empty). */
bool ces_consumer_joined(const ces_consumer_t *consumer);

/* True when librdkafka stopped the consumer because another member joined the group under the
 * same static membership name (group.instance.id): in transaction order, a writer that another
 * instance replaced. */
bool ces_consumer_fenced(ces_consumer_t *consumer);

/* Times librdkafka's fetcher was woken up: the prefetch queue had filled to librdkafka's limits and
 * drained to half, or a paused partition was resumed (see nudger.h). */
uint64_t ces_consumer_fetch_wakeups(const ces_consumer_t *consumer);

#endif
