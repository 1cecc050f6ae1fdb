/* Capture files as a feed (capture.h): the partition from the path, files merged by sequence
 * number whatever their order and overlap, repeated sequence numbers skipped, jumps counted, a
 * broken file reported while the rest goes on, pauses, and each partition's end. The files are
 * the fixtures of tests/fixtures/capture, copied into a layout in a temporary directory. */
#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include "input/capture.h"

static char root[256];

static void copy_fixture(const char *name, const char *rel) {
    char src[512], dst[768], dir[768];
    snprintf(src, sizeof(src), "%s/capture/%s", CES_FIXTURES, name);
    snprintf(dst, sizeof(dst), "%s/%s", root, rel);
    snprintf(dir, sizeof(dir), "%s", dst);
    for (char *p = dir + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    size_t len;
    char *bytes = test_read_file(src, &len);
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    fclose(f);
    free(bytes);
}

static int setup(void **state) {
    (void)state;
    snprintf(root, sizeof(root), "/tmp/ces2pg-test-capture.XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    /* Partition 0: 10-12 (null.avro), 20-24 (deflate.avro), and 10-12 again (a window captured
     * twice) under a later time; partition 1: a truncated file (20-22, then broken); a file
     * whose path has no partition. */
    copy_fixture("deflate.avro", "ns/hub/0/2026/03/01/10/05/00.avro");
    copy_fixture("null.avro", "ns/hub/0/2026/03/01/10/00/00.avro");
    copy_fixture("null.avro", "ns/hub/0/2026/03/01/10/10/00.avro");
    copy_fixture("truncated.avro", "ns/hub/1/2026/03/01/10/00/00.avro");
    copy_fixture("empty.avro", "ns/hub/1/2026/03/01/10/05/00.avro");
    copy_fixture("null.avro", "ns/hub/stray.avro");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void layouts(void **state) {
    (void)state;
    char why[512];
    assert_int_equal(ces_capture_check_layout(CES_CAPTURE_DEFAULT_LAYOUT, why, sizeof(why)), 0);
    assert_int_equal(ces_capture_check_layout("x/{EventHub}-{Namespace}/{Year}{Month}{Day}/"
                                              "{Hour}.{Minute}.{Second}/p{PartitionId}",
                                              why, sizeof(why)), 0);
    assert_int_not_equal(ces_capture_check_layout("{Namespace}/{EventHub}/{PartitionId}", why,
                                                  sizeof(why)), 0);
    assert_non_null(strstr(why, "lacks {Year}"));
    assert_int_not_equal(ces_capture_check_layout(CES_CAPTURE_DEFAULT_LAYOUT "/{Week}", why,
                                                  sizeof(why)), 0);
    assert_non_null(strstr(why, "unknown placeholder at '{Week}'"));

    char *paths[] = {root};
    ces_capture_options_t o = {.layout = "{EventHub}-{Namespace}/{Year}{Month}{Day}/"
                                         "{Hour}.{Minute}.{Second}/p{PartitionId}"};
    ces_capture_t *c = ces_capture_new(paths, 0, &o, why, sizeof(why));
    assert_non_null(c);
    int32_t partition;
    int64_t window;
    char topic[128];
    assert_int_equal(ces_capture_match_path(c, "/data/hub-ns.x/20260301/10.5.9/p12.avro",
                                            &partition, topic, sizeof(topic), &window), 0);
    assert_int_equal(partition, 12);
    assert_string_equal(topic, "capture:ns.x/hub");
    assert_int_equal(window, 1772359509); /* 2026-03-01 10:05:09 UTC */
    assert_int_not_equal(ces_capture_match_path(c, "/data/hub-ns/20260301/10.5.9/pX.avro",
                                                &partition, topic, sizeof(topic), &window), 0);
    /* A partition id no int32_t holds is no partition (not its first digits). */
    assert_int_not_equal(ces_capture_match_path(c, "/data/hub-ns/20260301/10.5.9/p2147483648.avro",
                                                &partition, topic, sizeof(topic), &window), 0);
    assert_int_not_equal(ces_capture_match_path(c, "/data/hub-ns/20260301/10.5.9/p12345678901",
                                                &partition, topic, sizeof(topic), &window), 0);
    assert_int_equal(ces_capture_match_path(c, "/data/hub-ns/20260301/10.5.9/p2147483647",
                                            &partition, topic, sizeof(topic), &window), 0);
    assert_int_equal(partition, INT32_MAX);
    ces_capture_destroy(c);
}

/* Polls to the end; returns the records' "partition:offset" in order, EOFs as "eof:partition". */
static void drain(ces_capture_t *c, char *out, size_t size) {
    ces_feed_t feed;
    ces_capture_feed(c, &feed);
    out[0] = '\0';
    for (int i = 0; i < 100; i++) {
        ces_record_t r;
        char err[256];
        ces_poll_status_t st = feed.poll(feed.opaque, 0, &r, err, sizeof(err));
        size_t n = strlen(out);
        if (st == CES_POLL_END)
            return;
        if (st == CES_POLL_RECORD) {
            assert_string_equal(r.topic, "capture:ns/hub");
            snprintf(out + n, size - n, "%d:%lld ", (int)r.partition, (long long)r.offset);
            feed.give_back(feed.opaque, r.handle);
        } else {
            assert_int_equal(st, CES_POLL_EOF);
            snprintf(out + n, size - n, "eof:%d ", (int)r.partition);
        }
    }
    fail_msg("no end: %s", out);
}

static void merged_by_sequence_number(void **state) {
    (void)state;
    char *paths[] = {root};
    ces_capture_options_t o = {.max_record_bytes = 1 << 20};
    char why[256], got[1024];
    ces_capture_t *c = ces_capture_new(paths, 1, &o, why, sizeof(why));
    assert_non_null(c);
    drain(c, got, sizeof(got));
    /* Partitions take turns within a window: partition 1's 10:00 file goes with partition 0's
     * 10:00 file; partition 0's 10:05 records come after both. */
    assert_string_equal(got, "0:10 1:20 0:11 1:21 0:12 1:22 eof:1 0:20 0:21 0:22 0:23 0:24 eof:0 ");
    ces_capture_stats_t s;
    ces_capture_get_stats(c, &s);
    assert_int_equal(s.files, 6);
    assert_int_equal(s.files_read, 4);
    assert_int_equal(s.files_failed, 2); /* stray.avro, truncated.avro */
    assert_int_equal(s.records, 11);
    assert_int_equal(s.duplicates, 3);
    assert_int_equal(s.gaps, 1); /* 13 to 19 */
    assert_int_equal(s.out_of_order, 0);
    ces_capture_destroy(c);
}

/* A paused partition waits; the other goes on; nothing at all while every one is paused. */
static void pauses(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/ns/hub/0/2026/03/01/10/05/00.avro", root);
    char *paths[] = {path};
    ces_capture_options_t o = {.max_record_bytes = 1 << 20};
    char why[256];
    ces_capture_t *c = ces_capture_new(paths, 1, &o, why, sizeof(why));
    assert_non_null(c);
    ces_feed_t feed;
    ces_capture_feed(c, &feed);
    ces_record_t r;
    assert_int_equal(feed.poll(feed.opaque, 0, &r, why, sizeof(why)), CES_POLL_RECORD);
    assert_int_equal(r.offset, 20);
    feed.give_back(feed.opaque, r.handle);
    assert_int_equal(feed.pause(feed.opaque, "capture:ns/hub", 0, true), 0);
    assert_int_equal(feed.poll(feed.opaque, 0, &r, why, sizeof(why)), CES_POLL_IDLE);
    assert_int_equal(feed.pause(feed.opaque, "capture:ns/hub", 0, false), 0);
    assert_int_equal(feed.poll(feed.opaque, 0, &r, why, sizeof(why)), CES_POLL_RECORD);
    assert_int_equal(r.offset, 21);
    feed.give_back(feed.opaque, r.handle);
    assert_int_equal(feed.pause(feed.opaque, "capture:ns/hub", 7, true), -1);
    ces_capture_destroy(c); /* with a file still open */
}

/* From inside a partition's folder, "." is enough: the path is matched once made absolute. */
static void relative_paths(void **state) {
    (void)state;
    char here[512], dir[512];
    assert_non_null(getcwd(here, sizeof(here)));
    snprintf(dir, sizeof(dir), "%s/ns/hub/0", root);
    assert_int_equal(chdir(dir), 0);
    char *paths[] = {"."};
    ces_capture_options_t o = {.max_record_bytes = 1 << 20};
    char why[256];
    ces_capture_t *c = ces_capture_new(paths, 1, &o, why, sizeof(why));
    assert_int_equal(chdir(here), 0);
    assert_non_null(c);
    ces_capture_stats_t s;
    ces_capture_get_stats(c, &s);
    assert_int_equal(s.files, 3);
    assert_int_equal(s.files_failed, 0);
    ces_capture_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layouts),
        cmocka_unit_test(merged_by_sequence_number),
        cmocka_unit_test(pauses),
        cmocka_unit_test(relative_paths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
