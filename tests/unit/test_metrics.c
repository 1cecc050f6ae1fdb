/* metrics: envelope times, dead letters by class, the Prometheus page and its bounded labels;
 * configuration: ${ENV} references, secret files and $CREDENTIALS_DIRECTORY. */
#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include "conf/config.h"
#include "ops/metrics.h"

static void parses_envelope_times(void **state) {
    (void)state;
    double t;
    assert_int_equal(ces_event_parse_time("2025-03-14T16:51:39.613Z", &t), 0);
    assert_true(t > 1741971099.612 && t < 1741971099.614);
    assert_int_equal(ces_event_parse_time("2025-03-14T16:51:39Z", &t), 0);
    assert_true(t == 1741971099.0);
    assert_int_equal(ces_event_parse_time("2025-03-14T18:51:39.5+02:00", &t), 0);
    assert_true(t == 1741971099.5);
    assert_int_equal(ces_event_parse_time("2025-03-14T16:51:39.1234567", &t), 0);
    static const char *const bad[] = {"", "2025-03-14", "2025-13-14T16:51:39Z",
                                      "2025-03-14T16:51:39.Z", "2025-03-14T16:51:39Zjunk",
                                      "2025-03-14 16:51:39Z", "2025-03-14T16:51:39+0200"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(ces_event_parse_time(bad[i], &t), -1);
    assert_int_equal(ces_event_parse_time(NULL, &t), -1);
}

static ces_item_t dead(const char *reason, ces_dl_class_t cls) {
    ces_item_t item;
    memset(&item, 0, sizeof(item));
    item.kind = CES_ITEM_DEAD_LETTER;
    item.reason = reason;
    item.dl_class = cls;
    return item;
}

/* Dead letters count by the class they were made with, whatever their reason says. */
static void counts_dead_letters_by_class(void **state) {
    (void)state;
    static const char *const names[CES_DL_NCLASSES] = {
        "decode",           "no_primary_key", "rejected_by_postgres", "segment_timeout",
        "reassembly_limit", "type_conflict",  "schema",         "reserved_target",
        "name_collision"};
    ces_metrics_t *m = ces_metrics_new();
    assert_non_null(m);
    ces_batch_t batch = {0};
    for (int c = 0; c < CES_DL_NCLASSES; c++) {
        assert_string_equal(ces_dl_class_name((ces_dl_class_t)c), names[c]);
        for (int k = 0; k <= c; k++) {
            ces_item_t *item = ces_batch_add(&batch);
            assert_non_null(item);
            /* The same wording for every class: the text plays no part. */
            *item = dead("type conflict: table has no primary key", (ces_dl_class_t)c);
        }
    }
    ces_metrics_add_batch(m, &batch, 0.01);
    char *page;
    size_t len;
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    for (int c = 0; c < CES_DL_NCLASSES; c++) {
        char line[128];
        snprintf(line, sizeof(line), "ces2pg_dead_letters_total{reason=\"%s\"} %d\n", names[c],
                 c + 1);
        if (strstr(page, line) == NULL)
            fail_msg("missing: %s", line);
    }
    assert_null(strstr(page, "reason=\"other\""));
    ces_metrics_summary_t sum;
    ces_metrics_summary(m, &sum);
    assert_int_equal(sum.dead_letters, CES_DL_NCLASSES * (CES_DL_NCLASSES + 1) / 2);
    free(page);
    free(batch.items);
    free(batch.positions);
    ces_metrics_destroy(m);
}

/* Late events count once each, torn transactions once per transaction by the partition whose event
 * came late; the effective reorder window is a gauge in transaction mode only. */
static void counts_late_events_and_torn_transactions(void **state) {
    (void)state;
    ces_metrics_t *m = ces_metrics_new();
    assert_non_null(m);
    ces_batch_t batch = {0};
    static const struct {
        int32_t partition;
        bool late, torn;
    } items[] = {{0, false, false}, {1, true, true}, {1, true, false}, {2, true, true},
                 {1, true, true},   {0, false, false}};
    for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++) {
        ces_item_t *item = ces_batch_add(&batch);
        assert_non_null(item);
        item->kind = CES_ITEM_EVENT;
        item->event.op = CES_OP_UPDATE;
        item->event.schema = "dbo";
        item->event.table = "accounts";
        item->source = (ces_source_t){"ces", items[i].partition, (int64_t)i};
        item->late = items[i].late;
        item->torn = items[i].torn;
    }
    ces_metrics_add_batch(m, &batch, 0.01);
    ces_pipeline_stats_t stats = {.reorder_window_ms = 625};
    ces_metrics_set_stats(m, &stats, NULL, 0);
    char *page;
    size_t len;
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    assert_non_null(strstr(page, "ces2pg_late_events_total 4\n"));
    assert_non_null(
        strstr(page, "ces2pg_transactions_torn_total{topic=\"ces\",partition=\"1\"} 2\n"));
    assert_non_null(
        strstr(page, "ces2pg_transactions_torn_total{topic=\"ces\",partition=\"2\"} 1\n"));
    assert_null(strstr(page, "partition=\"0\"} "));
    assert_non_null(strstr(page, "ces2pg_reorder_window_seconds 0.625\n"));
    free(page);
    stats.reorder_window_ms = -1; /* partition mode */
    ces_metrics_set_stats(m, &stats, NULL, 0);
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    assert_null(strstr(page, "ces2pg_reorder_window_seconds"));
    free(page);
    free(batch.items);
    free(batch.positions);
    ces_metrics_destroy(m);
}

/* Torn transactions of more partitions than the first allocation holds: each keeps its own count
 * as the array grows, in the order of first sight. */
static void counts_torn_transactions_of_many_partitions(void **state) {
    (void)state;
    ces_metrics_t *m = ces_metrics_new();
    assert_non_null(m);
    enum { NPARTS = 37 };
    ces_batch_t batch = {0};
    for (int round = 0; round < 2; round++) {
        for (int32_t p = 0; p < NPARTS; p++) {
            if (round == 1 && p % 3 != 0)
                continue;
            ces_item_t *item = ces_batch_add(&batch);
            assert_non_null(item);
            item->kind = CES_ITEM_EVENT;
            item->event.op = CES_OP_INSERT;
            item->event.schema = "dbo";
            item->event.table = "t";
            item->source = (ces_source_t){"ces", NPARTS - 1 - p, (int64_t)round};
            item->late = item->torn = true;
        }
    }
    ces_metrics_add_batch(m, &batch, 0.01);
    char *page;
    size_t len;
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    const char *previous = page;
    for (int32_t p = 0; p < NPARTS; p++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "ces2pg_transactions_torn_total{topic=\"ces\",partition=\"%d\"} %d\n",
                 (int)(NPARTS - 1 - p), p % 3 == 0 ? 2 : 1);
        const char *at = strstr(page, line);
        if (at == NULL || at < previous)
            fail_msg("missing or out of order: %s", line);
        previous = at;
    }
    free(page);
    free(batch.items);
    free(batch.positions);
    ces_metrics_destroy(m);
}

/* Tables beyond the cap count as "other"; label values are escaped. */
static void renders_bounded_labels(void **state) {
    (void)state;
    ces_metrics_t *m = ces_metrics_new();
    assert_non_null(m);
    enum { N = CES_METRICS_MAX_TABLES + 5 };
    ces_batch_t batch = {0};
    static char names[N][16];
    for (int i = 0; i < N; i++) {
        ces_item_t *item = ces_batch_add(&batch);
        assert_non_null(item);
        item->kind = CES_ITEM_EVENT;
        item->event.op = CES_OP_INSERT;
        item->event.schema = "dbo";
        snprintf(names[i], sizeof(names[i]), i == 0 ? "q\"t\\x" : "t%d", i);
        item->event.table = names[i];
        item->event.time = "2025-03-14T16:51:39.613Z";
    }
    ces_item_t *dl = ces_batch_add(&batch);
    *dl = dead("not JSON", CES_DL_DECODE);
    ces_metrics_add_batch(m, &batch, 0.02);
    char *page;
    size_t len;
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    assert_non_null(strstr(page, "ces2pg_events_applied_total{op=\"insert\",table=\"dbo.q\\\"t\\\\x\"} 1\n"));
    assert_non_null(strstr(page, "ces2pg_events_applied_total{op=\"insert\",table=\"other\"} 5\n"));
    assert_null(strstr(page, "table=\"dbo.t1004\""));
    assert_non_null(strstr(page, "ces2pg_dead_letters_total{reason=\"decode\"} 1\n"));
    assert_non_null(strstr(page, "ces2pg_batch_duration_seconds_bucket{le=\"0.025\"} 1\n"));
    assert_non_null(strstr(page, "ces2pg_batch_duration_seconds_bucket{le=\"0.01\"} 0\n"));
    assert_non_null(strstr(page, "ces2pg_last_applied_commit_timestamp_seconds 1741971099.613\n"));
    free(page);
    free(batch.items);
    free(batch.positions);
    ces_metrics_destroy(m);
}

/* Many tables, interleaved, in several batches: each one's events counted under its own name,
 * however often the tables change and whichever names share a prefix. */
static void counts_each_of_many_interleaved_tables(void **state) {
    (void)state;
    ces_metrics_t *m = ces_metrics_new();
    assert_non_null(m);
    static const char *const schemas[] = {"dbo", "dbo", "dbo", "dbo.t1", "sales", "dbo",
                                          "dbo", "db",  "dbo", "dbo",    "dbo",   "x",
                                          "dbo", NULL, "dbo_x", "dbo"};
    static const char *const tables[] = {"t1", "t10", "t11", "x", "t1", "t1x",
                                         "T1", "o.t1", "t2", "t3", "t4",  "dbo.t1",
                                         "",   "t5",  "t1", "x.t1"};
    enum { NTABLES = sizeof(tables) / sizeof(tables[0]) };
    uint64_t expected[NTABLES][4] = {{0}};
    for (int round = 0; round < 3; round++) {
        ces_batch_t batch = {0};
        for (unsigned k = 0; k < 500; k++) {
            unsigned t = (k * 7 + k / 13 + (unsigned)round * 5) % NTABLES;
            if (k % 9 < 4) /* runs of one table too */
                t = (k / 9) % NTABLES;
            ces_op_t op = (ces_op_t)(1 + (k + t) % 3);
            ces_item_t *item = ces_batch_add(&batch);
            assert_non_null(item);
            item->kind = CES_ITEM_EVENT;
            item->event.op = op;
            item->event.schema = schemas[t];
            item->event.table = tables[t];
            expected[t][op]++;
        }
        ces_metrics_add_batch(m, &batch, 0.01);
        free(batch.items);
        free(batch.positions);
    }
    /* Joined with '.', every pair of these names makes a different key; many share a prefix. */
    char *page;
    size_t len;
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    static const char *const op_label[4] = {NULL, "insert", "update", "delete"};
    for (size_t t = 0; t < NTABLES; t++) {
        for (int op = 1; op <= 3; op++) {
            char line[160];
            snprintf(line, sizeof(line), "ces2pg_events_applied_total{op=\"%s\",table=\"%s.%s\"} %llu\n",
                     op_label[op], schemas[t] ? schemas[t] : "", tables[t],
                     (unsigned long long)expected[t][op]);
            if (expected[t][op] > 0 && strstr(page, line) == NULL)
                fail_msg("missing: %s", line);
        }
    }
    free(page);
    ces_metrics_destroy(m);
}

static char path[64];

/* A stretch of retries is counted by reason, makes the process not ready at once, and not alive
 * once it has lasted longer than the liveness age, though the loop still turns; a success ends it. */
static void retries_are_counted_and_are_no_progress(void **state) {
    (void)state;
    ces_metrics_t *m = ces_metrics_new();
    assert_non_null(m);
    ces_metrics_set_connected(m, true);
    ces_metrics_set_assigned(m, 4);
    ces_metrics_heartbeat(m, 1000);
    assert_true(ces_metrics_ready(m));
    assert_true(ces_metrics_alive(m, 1000, 30000));
    ces_metrics_retrying(m, "timeout", 1000);
    ces_metrics_retrying(m, "timeout", 3000);
    ces_metrics_retrying(m, "no such reason", 5000);
    assert_false(ces_metrics_ready(m));
    /* The loop keeps turning while it retries: alive until the stretch is older than the age. */
    ces_metrics_heartbeat(m, 30000);
    assert_true(ces_metrics_alive(m, 30000, 30000));
    ces_metrics_heartbeat(m, 31500);
    assert_false(ces_metrics_alive(m, 31500, 30000));
    char *page = NULL;
    size_t len = 0;
    assert_int_equal(ces_metrics_render(m, &page, &len), 0);
    assert_non_null(strstr(page, "ces2pg_postgres_retries_total{reason=\"timeout\"} 2\n"));
    assert_non_null(strstr(page, "ces2pg_postgres_retries_total{reason=\"unknown\"} 1\n"));
    free(page);
    /* A success ends the stretch: ready and alive again, the count kept. */
    ces_metrics_retrying(m, NULL, 32000);
    assert_true(ces_metrics_ready(m));
    assert_true(ces_metrics_alive(m, 32000, 30000));
    ces_metrics_destroy(m);
}

static void write_file(char *name, const char *text) {
    int fd = mkstemp(name);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void expands_environment_and_reads_secrets(void **state) {
    (void)state;
    char dir[] = "/tmp/ces2pg-creds-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char secret[128];
    snprintf(secret, sizeof(secret), "%s/pg-password", dir);
    FILE *f = fopen(secret, "w");
    assert_non_null(f);
    fputs("  s3cret-pw \n", f);
    fclose(f);
    assert_int_equal(chmod(secret, 0600), 0); /* a secret others may read is refused */
    setenv("CREDENTIALS_DIRECTORY", dir, 1);
    setenv("CES_TEST_HOST", "db.example", 1);
    strcpy(path, "/tmp/ces2pg-test-XXXXXX");
    write_file(path, "postgres = { conninfo = \"host=${CES_TEST_HOST} port=$5 dbname=x\";\n"
                     "  password_file = \"pg-password\"; };\n");
    ces_config_t *c = NULL;
    char err[512];
    assert_int_equal(ces_config_load(path, CES_CONFIG_REPLAY, &c, err, sizeof(err)),
                     CES_CONFIG_OK);
    assert_string_equal(c->pg_conninfo, "host=db.example port=$5 dbname=x");
    assert_string_equal(c->pg_password, "s3cret-pw");
    char *printed = NULL;
    size_t plen = 0;
    FILE *out = open_memstream(&printed, &plen);
    ces_config_print(c, out);
    fclose(out);
    assert_null(strstr(printed, "s3cret-pw"));
    free(printed);
    ces_config_destroy(c);
    unlink(path);

    unsetenv("CES_TEST_UNSET");
    strcpy(path, "/tmp/ces2pg-test-XXXXXX");
    write_file(path, "postgres = {\n  conninfo = \"password=${CES_TEST_UNSET}\";\n};\n");
    assert_int_equal(ces_config_load(path, CES_CONFIG_REPLAY, &c, err, sizeof(err)),
                     CES_CONFIG_ERROR);
    assert_non_null(strstr(err, ":2: postgres.conninfo: environment variable CES_TEST_UNSET is "
                                "not set"));
    unlink(path);

    unsetenv("CREDENTIALS_DIRECTORY");
    strcpy(path, "/tmp/ces2pg-test-XXXXXX");
    write_file(path, "postgres = { conninfo = \"x=y\"; password_file = \"pg-password\"; };\n");
    assert_int_equal(ces_config_load(path, CES_CONFIG_REPLAY, &c, err, sizeof(err)),
                     CES_CONFIG_ERROR);
    assert_non_null(strstr(err, "postgres.password_file: cannot read 'pg-password'"));
    unlink(path);
    unlink(secret);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parses_envelope_times),
        cmocka_unit_test(counts_dead_letters_by_class),
        cmocka_unit_test(counts_late_events_and_torn_transactions),
        cmocka_unit_test(counts_torn_transactions_of_many_partitions),
        cmocka_unit_test(renders_bounded_labels),
        cmocka_unit_test(counts_each_of_many_interleaved_tables),
        cmocka_unit_test(expands_environment_and_reads_secrets),
        cmocka_unit_test(retries_are_counted_and_are_no_progress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
