/*
 * staging: the emptied decoding arenas kept for later records.
 */
#include "test_pipeline.h"

/* The record of one INS of table T at LSN 1:block:1, key key, with a value of pad 'x's. */
static size_t padded_record(char *rec, size_t size, unsigned block, int key, size_t pad) {
    char *value = malloc(pad + 1);
    assert_non_null(value);
    memset(value, 'x', pad);
    value[pad] = '\0';
    int n = snprintf(
        rec, size,
        "{\"specversion\":\"1.0\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"id\":\"i\","
        "\"logicalid\":\"u:00000001%08X0001:%020u\",\"operation\":\"INS\","
        "\"segmentindex\":1,\"finalsegment\":true,\"data\":\"{\\\"eventsource\\\":{\\\"db\\\":"
        "\\\"d\\\",\\\"schema\\\":\\\"s\\\",\\\"tbl\\\":\\\"T\\\",\\\"cols\\\":[{\\\"name\\\":"
        "\\\"k\\\",\\\"type\\\":\\\"int\\\",\\\"index\\\":0},{\\\"name\\\":\\\"v\\\",\\\"type\\\":"
        "\\\"varchar\\\",\\\"index\\\":1}],\\\"pkkey\\\":[{\\\"columnname\\\":\\\"k\\\","
        "\\\"value\\\":\\\"%d\\\"}],\\\"transaction\\\":{\\\"commitlsn\\\":"
        "\\\"00000001:%08X:0001\\\",\\\"sequencenumber\\\":1}},\\\"eventrow\\\":{\\\"old\\\":"
        "\\\"{}\\\",\\\"current\\\":\\\"{\\\\\\\"k\\\\\\\":\\\\\\\"%d\\\\\\\",\\\\\\\"v\\\\\\\":"
        "\\\\\\\"%s\\\\\\\"}\\\"}}\"}",
        block, (unsigned)key, key, block, key, value);
    free(value);
    assert_true(n > 0 && (size_t)n < size);
    return (size_t)n;
}

/* Records of PADDED_BYTES 'x's each, large enough that a decoding arena outgrows its first block. */
enum { PADDED_RECORDS = 24, PADDED_BYTES = 40000, PADDED_SIZE = PADDED_BYTES + 2048 };

/* Stages the first n padded records, at offsets from first on. */
static void stage_padded(ces_pipeline_t *p, char (*recs)[PADDED_SIZE], size_t n, int64_t first) {
    for (size_t i = 0; i < n; i++)
        ces_intake_stage(p, &(ces_record_t){.topic = "ces", .partition = 0,
                                           .offset = first + (int64_t)i,
                                           .value = recs[i], .len = strlen(recs[i])});
}

static void take_staged(ces_pipeline_t *p) {
    char err[256];
    assert_int_equal(ces_intake_take(p, 0, false, err, sizeof(err)), CES_PIPELINE_OK);
}

/* The emptied decoding arenas kept for later records stay within SPARE_BYTES however large the
 * records were, and account for exactly what they keep. With helpers, each staged record is given
 * an arena; alone, every record is decoded in the one the record before it left. */
static void spare_arenas_stay_bounded(void **state) {
    (void)state;
    enum { N = PADDED_RECORDS, PAD = PADDED_BYTES };
    static char recs[N][PADDED_SIZE];
    for (size_t i = 0; i < N; i++)
        padded_record(recs[i], sizeof(recs[i]), 10 + (unsigned)i, (int)i, PAD);
    for (size_t threads = 1; threads <= 2; threads++) {
        ces_pipeline_t *p = new_pipeline_with(0, CES_ORDER_BY_PARTITION, threads);
        /* Twice: a fresh arena outgrows its first block and keeps nothing when emptied; used
         * again, it is made of one block as large as the record needed, which it keeps. */
        for (int round = 0; round < 2; round++) {
            stage_padded(p, recs, N, round * N);
            take_staged(p);
        }
        assert_int_equal(ces_pipeline_batch_events(p), 2 * N);
        assert_int_equal(ces_pipeline_batch_item(p, 0)->kind, CES_ITEM_EVENT);
        assert_int_equal(strlen(ces_pipeline_batch_item(p, N - 1)->event.current[1].value), PAD);
        assert_true(p->spare_bytes <= SPARE_BYTES);
        size_t kept = 0;
        for (size_t i = 0; i < p->nspares; i++)
            kept += ces_arena_footprint(p->spares[i]);
        assert_int_equal(kept, p->spare_bytes);
        stage_padded(p, recs, 3, 2 * N);
        if (threads == 1) {
            /* One arena went round: it holds one record's worth, and decodes the next ones. */
            assert_int_equal(p->nspares, 1);
            assert_true(kept > PAD && kept < 4 * PAD);
            ces_arena_t *spare = p->spares[0];
            take_staged(p);
            assert_int_equal(p->nspares, 1);
            assert_ptr_equal(p->spares[0], spare);
            assert_int_equal(p->spare_bytes, ces_arena_footprint(spare));
        } else {
            /* Each arena keeps about two records' worth: not all of them fit. The next records
             * took the spares when staged, and their bytes left the count. */
            assert_true(p->nspares > 0 && p->nspares < N);
            assert_true(kept > SPARE_BYTES / 2);
            size_t taken = 0;
            for (size_t i = 0; i < 3; i++)
                taken += ces_arena_footprint(p->stages[p->fill_index].items[i].arena);
            assert_int_equal(p->spare_bytes, kept - taken);
            take_staged(p);
            assert_true(p->spare_bytes <= SPARE_BYTES);
        }
        ces_pipeline_destroy(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spare_arenas_stay_bounded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
