/*
 * libFuzzer harness over the Event Hubs Capture container reader (capfile.h): one input is one
 * Capture file, read record by record to its end or its first error, as `ces2pg replay --capture`
 * reads every file it finds (they are untrusted bytes, like Kafka records).
 *
 * Findings are crashes, sanitizer reports, leaks (LeakSanitizer, avro-c's allocations the guard
 * failed to sweep included), and contract breaches turned into aborts: an error without a reason,
 * "out of memory" for a file (which would stop the replay instead of skipping the file), a record
 * read after the end or an error, and a body larger than a block may hold.
 *
 * Built by -DCES2PG_FUZZ=ON with clang; tests/fuzz/run runs it after fuzz_decode, seeded with
 * tests/fuzz/capture-seeds/ and tests/fixtures/capture/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/capfile.h"

static ces_capfile_schemas_t *schemas;
static volatile unsigned char sink;
/* Small, so that inputs of a few KB reach the bounds. */
static const ces_capfile_limits_t limits = {.max_block_bytes = 64u << 10, .max_map_items = 64};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if ((schemas = ces_capfile_schemas_new()) == NULL)
        abort();
    return 0;
}

static void breach(const char *what, const char *why) {
    fprintf(stderr, "capfile: %s (%s)\n", what, why);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* fmemopen wants a writable buffer of at least one byte. */
    char *copy = malloc(size + 1);
    if (copy == NULL)
        abort();
    memcpy(copy, data, size);
    FILE *stream = fmemopen(copy, size > 0 ? size : 1, "rb");
    if (stream == NULL)
        abort();
    if (size == 0)
        fgetc(stream);
    char why[600] = "";
    ces_capfile_status_t st;
    ces_capfile_t *f = ces_capfile_open_stream(schemas, stream, "fuzz", &limits, &st, why,
                                               sizeof(why));
    if (f != NULL)
        why[0] = '\0'; /* a header read twice may leave its first attempt's reason behind */
    ces_capfile_record_t r;
    while (f != NULL && (st = ces_capfile_next(f, &r, why, sizeof(why))) == CES_CAPFILE_RECORD) {
        if (r.body == NULL || r.body_len > limits.max_block_bytes)
            breach("a record's body is missing or larger than a block", why);
        if (r.body_len > 0)
            sink ^= r.body[0] ^ r.body[r.body_len - 1]; /* both ends are the reader's to give */
        free(r.body);
    }
    if (st == CES_CAPFILE_NOMEM)
        breach("out of memory for a file", why);
    if (st != CES_CAPFILE_END && why[0] == '\0')
        breach("an error without a reason", "");
    if (f != NULL && ces_capfile_next(f, &r, why, sizeof(why)) == CES_CAPFILE_RECORD)
        breach("a record after the end or an error", why);
    ces_capfile_close(f);
    free(copy);
    return 0;
}
