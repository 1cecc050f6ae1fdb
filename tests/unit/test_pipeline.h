/*
 * The fixture of the pipeline's unit tests (test_intake, test_staging, test_release, test_lateness,
 * test_loop, test_rebalance): pipelines without PostgreSQL, whose records are fed straight into
 * intake and whose batch being built is what a test looks at.
 */
#ifndef CES_TEST_PIPELINE_H
#define CES_TEST_PIPELINE_H

#include "test_util.h"

#include "pipeline/flight.h"
#include "pipeline/intake.h"
#include "pipeline/lateness.h"
#include "pipeline/loop.h"
#include "pipeline/partitions.h"
#include "pipeline/release.h"
#include "pipeline/staging.h"
#include "pipeline/state.h"

#define WINDOW 200

static ces_decoder_t *decoder;

static inline int setup(void **state) {
    (void)state;
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    decoder = ces_decoder_new(&limits);
    return decoder ? 0 : -1;
}

static inline int teardown(void **state) {
    (void)state;
    ces_decoder_destroy(decoder);
    return 0;
}

static inline ces_pipeline_options_t options_with(size_t batch_max_bytes, ces_ordering_t ordering,
                                           size_t decode_threads) {
    return (ces_pipeline_options_t){
        .batch_max_events = 1000,
        .batch_max_bytes = batch_max_bytes,
        .batch_max_ms = 100,
        .store_positions = true,
        .reasm = {1 << 20, 100, 5000},
        .ordering = ordering,
        .reorder_window_ms = WINDOW,
        .dedup_window = 100,
        .max_pending_events = 0,
        .decode_threads = decode_threads,
    };
}

/* A pipeline with partitions 0 and 1 of topic "ces" assigned, no positions stored. */
static inline ces_pipeline_t *new_pipeline_from(const ces_pipeline_options_t *o) {
    ces_pipeline_t *p = ces_pipeline_new(o, decoder, NULL);
    assert_non_null(p);
    int32_t parts[2] = {0, 1};
    int64_t offsets[2];
    assert_int_equal(ces_pipeline_on_assigned(p, "ces", parts, 2, offsets), 0);
    return p;
}

static inline ces_pipeline_t *new_pipeline_with(size_t batch_max_bytes, ces_ordering_t ordering,
                                         size_t decode_threads) {
    ces_pipeline_options_t o = options_with(batch_max_bytes, ordering, decode_threads);
    return new_pipeline_from(&o);
}

static inline ces_pipeline_t *new_pipeline_sized(size_t batch_max_bytes) {
    return new_pipeline_with(batch_max_bytes, CES_ORDER_BY_TRANSACTION, 1);
}

static inline ces_pipeline_t *new_pipeline(void) { return new_pipeline_sized(0); }

/* The record of one INS of table T, key key, at commit LSN 1:block:1 with sequence seq. */
static inline void make_record(char *rec, size_t size, unsigned block, unsigned seq, int key) {
    char data[512];
    snprintf(data, sizeof(data),
             "{\\\"eventsource\\\":{\\\"db\\\":\\\"d\\\",\\\"schema\\\":\\\"s\\\",\\\"tbl\\\":"
             "\\\"T\\\",\\\"cols\\\":[{\\\"name\\\":\\\"k\\\",\\\"type\\\":\\\"int\\\","
             "\\\"index\\\":0}],\\\"pkkey\\\":[{\\\"columnname\\\":\\\"k\\\",\\\"value\\\":"
             "\\\"%d\\\"}],\\\"transaction\\\":{\\\"commitlsn\\\":\\\"00000001:%08X:0001\\\","
             "\\\"sequencenumber\\\":%u}},\\\"eventrow\\\":{\\\"old\\\":\\\"{}\\\","
             "\\\"current\\\":\\\"{\\\\\\\"k\\\\\\\":\\\\\\\"%d\\\\\\\"}\\\"}}",
             key, block, seq, key);
    snprintf(rec, size,
             "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"i\","
             "\"logicalid\":\"u:00000001%08X0001:%020u\",\"operation\":\"INS\","
             "\"segmentindex\":1,\"finalsegment\":true,\"data\":\"%s\"}",
             block, seq, data);
}

/* Feeds one INS of table T, key key, at commit LSN 1:block:1 with sequence seq. */
static inline void feed(ces_pipeline_t *p, int32_t partition, int64_t offset, unsigned block,
                 unsigned seq, int key, int64_t now) {
    char rec[2048];
    make_record(rec, sizeof(rec), block, seq, key);
    ces_record_t r = {.topic = "ces", .partition = partition, .offset = offset, .value = rec,
                      .len = strlen(rec)};
    char err[256];
    assert_int_equal(ces_intake_add(p, &r, now, err, sizeof(err)), CES_PIPELINE_OK);
}

static inline void tick(ces_pipeline_t *p, int64_t now) {
    char err[256];
    assert_int_equal(ces_loop_tick(p, now, err, sizeof(err)), CES_PIPELINE_OK);
}

static inline unsigned seq_at(ces_pipeline_t *p, size_t i) {
    return (unsigned)ces_pipeline_batch_item(p, i)->event.version.sequence;
}

/* Four events in three complete transactions (10: two events, 11, 12). */
static inline void feed_three_transactions(ces_pipeline_t *p) {
    feed(p, 0, 0, 10, 1, 1, 0);
    feed(p, 0, 1, 10, 2, 2, 0);
    feed(p, 0, 2, 11, 1, 3, 0);
    feed(p, 1, 0, 12, 1, 4, 0);
    ces_release_partition_eof(p, "ces", 0, 3);
    ces_release_partition_eof(p, "ces", 1, 1);
}

/* What a flush does to the batch being built, without PostgreSQL: it is sent at now and commits. */
static inline void commit_batch(ces_pipeline_t *p, int64_t now) {
    ces_lateness_sent(&p->late, now);
    ces_order_committed(p->order, &p->batch);
    ces_batch_clear(&p->batch);
}

#endif
