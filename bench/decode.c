/*
 * bench/decode: decoding speed on one core.
 *
 * Reads records in the replay format (one JSON record per line, e.g. from tools/ces-gen --out) and
 * decodes each one (envelope and Data) repeatedly for a few seconds. Prints records/s and MB/s.
 *
 *   build/bench-decode FILE [SECONDS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
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
    char **lines = NULL;
    size_t *lens = NULL, n = 0, cap = 0, bytes = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        while (len > 0 && line[len - 1] == '\n')
            len--;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            lines = realloc(lines, cap * sizeof(*lines));
            lens = realloc(lens, cap * sizeof(*lens));
        }
        lines[n] = strndup(line, (size_t)len);
        lens[n++] = (size_t)len;
        bytes += (size_t)len;
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
    size_t done = 0, done_bytes = 0, rejected = 0;
    double start = now_s(), end;
    do {
        for (size_t i = 0; i < n; i++) {
            ces_arena_t *arena = ces_arena_new();
            ces_envelope_t env;
            ces_event_t ev;
            char err[256];
            if (ces_decode_envelope(d, arena, lines[i], lens[i], &env, err, sizeof(err)) !=
                    CES_DECODE_OK ||
                ces_decode_event(d, arena, &env, env.data, env.data_len, &ev, err, sizeof(err)) !=
                    CES_DECODE_OK)
                rejected++;
            ces_arena_destroy(arena);
        }
        done += n;
        done_bytes += bytes;
        end = now_s();
    } while (end - start < seconds);
    double el = end - start;
    printf("records: %zu (%.0f bytes average, %zu rejected)\n", n, (double)bytes / (double)n,
           rejected / (done / n));
    printf("decode: %.0f records/s, %.1f MB/s on one core\n", (double)done / el,
           (double)done_bytes / el / 1e6);
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
    free(lens);
    ces_decoder_destroy(d);
    return 0;
}
