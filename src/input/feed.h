/*
 * feed: where the pipeline's records come from.
 *
 * The daemon's feed is the Kafka consumer (consumer.c); replay's is a set of files (replay.c). The
 * pipeline reads records, gives them back, and, when the feed is a Kafka consumer, moves its fetch
 * positions, pauses partitions and stores positions for monitoring, only through this table, so
 * that it needs to know nothing of librdkafka (and unit tests can give it a feed of their own).
 */
#ifndef CES_FEED_H
#define CES_FEED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One record as the feed hands it over. value and handle stay the feed's until given back. */
typedef struct {
    const char *topic; /* reference: valid while the partition is assigned (Kafka), or the file */
    int32_t partition;
    int64_t offset;
    const void *value;
    size_t len;
    void *handle; /* give back with feed->give_back once the record's bytes are copied */
} ces_record_t;

typedef enum {
    CES_POLL_RECORD,
    CES_POLL_EOF,   /* record->topic and ->partition reached the end of what the broker has, at
                     * record->offset */
    CES_POLL_IDLE,  /* nothing arrived within the timeout */
    CES_POLL_END,   /* the input ended (replay): nothing more will come */
    CES_POLL_OUT_OF_RANGE, /* the broker has no record at the position record->offset of
                            * record->topic and ->partition, and auto.offset.reset says not to
                            * move (error): the partition stops */
    CES_POLL_FATAL, /* the feed cannot go on; errstr says why */
} ces_poll_status_t;

/* Offset meaning "no stored position: use Kafka's committed offset, then auto.offset.reset". */
#define CES_OFFSET_UNSET (-1)

typedef struct {
    /* Waits up to timeout_ms for one record. Required. */
    ces_poll_status_t (*poll)(void *opaque, int timeout_ms, ces_record_t *record, char *errstr,
                              size_t errstr_size);
    /* Gives back a record's handle (never NULL when called). NULL when handles are always NULL. */
    void (*give_back)(void *opaque, void *handle);
    /* The operations of a Kafka consumer; NULL for a feed that has no partitions to move. */
    /* Moves a partition's fetch position (records from offset on are read again). 0 or -1. */
    int (*seek)(void *opaque, const char *topic, int32_t partition, int64_t offset);
    /* Stops (pause) or resumes fetching a partition. 0 or -1. */
    int (*pause)(void *opaque, const char *topic, int32_t partition, bool pause);
    /* The partition's high watermark as of the last fetch (no round trip). 0, or -1 when unknown. */
    int (*high_watermark)(void *opaque, const char *topic, int32_t partition, int64_t *high);
    /* The partition's first and next offsets, asked of the broker (a round trip of at most a few
     * seconds). 0, or -1 when it could not be asked. */
    int (*watermarks)(void *opaque, const char *topic, int32_t partition, int64_t *low,
                      int64_t *high);
    /* Tells the broker a position PostgreSQL has committed (for lag monitoring only). */
    void (*store_position)(void *opaque, const char *topic, int32_t partition, int64_t next);
    void *opaque;
} ces_feed_t;

#endif
