/*
 * bench/decode: decoding speed on one core.
 *
 * Reads records in the replay format (one record per line: JSON as it is, anything else base64 of a
 * binary (Avro) record; e.g. from tools/ces-gen --out) and decodes each one (envelope and Data, as
 * the pipeline does for an unsplit record) repeatedly for a few seconds. Prints records/s and MB/s
 * of record bytes. Time is the thread's CPU time, so other load on the machine does not count.
 *
 *   build/bench-decode FILE [SECONDS]
 *
 * bench/run-decode generates the standard inputs (1 KB and 200 KB events, JSON and Avro) and runs
 * this on each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"
#include "replay.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [SECONDS]\n", argv[0]);
        return 64;
    }
    double seconds = argc > 2 ? atof(argv[2]) : 3.0;
    FILE *f = fopen(argv[1], "r");
    if (f == NULL) {
        perror(argv[1]);
        return 1;
    }
    char **records = NULL;
    size_t *lens = NULL, n = 0, cap = 0, bytes = 0, binary = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (len == 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            records = realloc(records, cap * sizeof(*records));
            lens = realloc(lens, cap * sizeof(*lens));
            if (records == NULL || lens == NULL)
                return 1;
        }
        long got = -1;
        char *rec = malloc((size_t)len * 3 / 4 + 3);
        if (rec == NULL)
            return 1;
        if (line[0] != '{')
            got = ces_base64_decode(line, (size_t)len, (unsigned char *)rec);
        if (got >= 0) {
            binary++;
        } else {
            free(rec);
            rec = strndup(line, (size_t)len);
            got = len;
        }
        records[n] = rec;
        lens[n++] = (size_t)got;
        bytes += (size_t)got;
    }
    free(line);
    fclose(f);
    if (n == 0) {
        fprintf(stderr, "%s: no records\n", argv[1]);
        return 1;
    }
    ces_decode_limits_t limits;
    ces_decode_limits_default(&limits);
    ces_decoder_t *d = ces_decoder_new(&limits);
    if (d == NULL)
        return 1;
    size_t done = 0, done_bytes = 0, rejected = 0;
    double start = cpu_s(), end;
    do {
        for (size_t i = 0; i < n; i++) {
            ces_arena_t *arena = ces_arena_new();
            ces_envelope_t env;
            ces_event_t ev;
            char err[256];
            if (ces_decode_envelope(d, arena, records[i], lens[i], &env, err, sizeof(err)) !=
                    CES_DECODE_OK ||
                ces_decode_event_in_place(d, arena, &env, (char *)env.data, env.data_len, &ev, err,
                                          sizeof(err)) != CES_DECODE_OK)
                rejected++;
            ces_arena_destroy(arena);
        }
        done += n;
        done_bytes += bytes;
        end = cpu_s();
    } while (end - start < seconds);
    double el = end - start;
    printf("records: %zu (%zu binary, %.0f bytes average, %zu rejected)\n", n, binary,
           (double)bytes / (double)n, rejected / (done / n));
    printf("decode: %.0f records/s, %.1f MB/s on one core (CPU time)\n", (double)done / el,
           (double)done_bytes / el / 1e6);
    for (size_t i = 0; i < n; i++)
        free(records[i]);
    free(records);
    free(lens);
    ces_decoder_destroy(d);
    return 0;
}
