/*
 * bench/decode: decoding speed on one core.
 *
 * Reads records in the replay format (one record per line: JSON as it is, anything else base64 of a
 * binary (Avro) record; e.g. from tools/ces-gen --out) and decodes each one (envelope and Data, as
 * the pipeline does for an unsplit record) repeatedly for a few seconds. Prints records/s and MB/s
 * of record bytes. Time is the thread's CPU time, so other load on the machine does not count.
 *
 * For JSON records it also times yajl alone over the same records: their three JSON layers
 * (envelope, `data`, row images) read the way bench/kafka-drain --parse-json reads them for
 * bench/run's JSON floor (bench/json-floor.h: yajl's callback parser, building and copying
 * nothing), and prints decode's rate over yajl's (issue 20's target: at least 0.85). The two
 * alternate pass by pass over the records until each has had SECONDS of CPU time, so that both
 * see the same conditions. Binary (Avro) records have no yajl figure.
 *
 * With THREADS > 1 the records are decoded by that many threads, 32 at a time, the way the daemon
 * shares them (src/util/team.c); time is then wall time, so run it on an otherwise idle machine, and
 * there is no yajl-alone figure (it is a one-core figure).
 *
 *   build/bench-decode FILE [SECONDS [THREADS]]
 *
 * bench/run-decode generates the standard inputs (1 KB and 200 KB events, JSON and Avro) and runs
 * this on each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/decode.h"
#include "json-floor.h"
#include "format/types.h" /* ces_base64_decode */
#include "util/team.h"

static double clock_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct {
    char **records;
    size_t *lens;
    size_t first;
    size_t rejected[64]; /* per worker, so that workers write apart */
} job_t;

typedef struct {
    ces_decoder_t *decoder;
    size_t index;
} worker_t;

static void decode_one(void *worker_arg, void *job_arg, size_t item) {
    worker_t *w = worker_arg;
    job_t *job = job_arg;
    size_t i = job->first + item;
    ces_arena_t *arena = ces_arena_new();
    ces_envelope_t env;
    ces_event_t ev;
    char err[256];
    if (arena == NULL ||
        ces_decode_envelope(w->decoder, arena, job->records[i], job->lens[i], &env, err,
                            sizeof(err)) != CES_DECODE_OK ||
        ces_decode_event_in_place(w->decoder, arena, &env, (char *)env.data, env.data_len, &ev,
                                  err, sizeof(err)) != CES_DECODE_OK)
        job->rejected[w->index]++;
    ces_arena_destroy(arena);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [SECONDS [THREADS]]\n", argv[0]);
        return 64;
    }
    double seconds = argc > 2 ? atof(argv[2]) : 3.0;
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "THREADS: 1..64\n");
        return 64;
    }
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
    worker_t workers[64];
    void *helpers[63];
    for (int t = 0; t < threads; t++) {
        workers[t].index = (size_t)t;
        workers[t].decoder = ces_decoder_new(&limits);
        if (workers[t].decoder == NULL)
            return 1;
        if (t > 0)
            helpers[t - 1] = &workers[t];
    }
    ces_team_t *team = threads > 1 ? ces_team_new(helpers, (size_t)threads - 1) : NULL;
    if (threads > 1 && team == NULL)
        return 1;
    clockid_t clock = threads > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
    job_t job = {.records = records, .lens = lens};
    /* yajl alone: JSON records only, on one thread, alternating with the decoder. */
    int yajl_alone = threads == 1 && binary == 0;
    json_floor_t jf;
    if (yajl_alone && json_floor_init(&jf) != 0) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    size_t passes = 0, yajl_passes = 0;
    double el = 0, yajl_el = 0;
    while (el < seconds || (yajl_alone && yajl_el < seconds)) {
        if (el < seconds) {
            double t0 = clock_s(clock);
            for (job.first = 0; job.first < n; job.first += 32) {
                size_t chunk = n - job.first < 32 ? n - job.first : 32;
                ces_team_run(team, decode_one, &job, &workers[0], chunk);
            }
            el += clock_s(clock) - t0;
            passes++;
        }
        if (yajl_alone && yajl_el < seconds) {
            double t0 = clock_s(clock);
            for (size_t i = 0; i < n; i++)
                json_floor_record(&jf, records[i], lens[i]);
            yajl_el += clock_s(clock) - t0;
            yajl_passes++;
        }
    }
    size_t rejected = 0;
    for (int t = 0; t < threads; t++)
        rejected += job.rejected[t];
    double rate = (double)(passes * n) / el;
    printf("records: %zu (%zu binary, %.0f bytes average, %zu rejected)\n", n, binary,
           (double)bytes / (double)n, rejected / passes);
    printf("decode: %.0f records/s, %.1f MB/s on %d thread%s (%s time)\n", rate,
           (double)(passes * bytes) / el / 1e6, threads, threads > 1 ? "s" : "",
           threads > 1 ? "wall" : "CPU");
    if (yajl_alone) {
        double yajl_rate = (double)(yajl_passes * n) / yajl_el;
        unsigned long long parsed = jf.layers / yajl_passes, broken = jf.broken / yajl_passes;
        printf("yajl alone: %.0f records/s, %.1f MB/s (three layers: %llu JSON texts, %.2f per "
               "record, %llu not whole; CPU time)\n",
               yajl_rate, (double)(yajl_passes * bytes) / yajl_el / 1e6, parsed,
               (double)parsed / (double)n, broken);
        printf("decode ÷ yajl alone: %.2f (target ≥ 0.85: %s)\n", rate / yajl_rate,
               rate / yajl_rate >= 0.85 ? "met" : "not met");
        json_floor_free(&jf);
    } else {
        printf("yajl alone: n/a (%s)\n", binary > 0 ? "binary (Avro) records: no JSON layers"
                                                     : "a one-thread figure: THREADS is 1 for it");
        printf("decode ÷ yajl alone: n/a\n");
    }
    ces_team_destroy(team);
    for (int t = 0; t < threads; t++)
        ces_decoder_destroy(workers[t].decoder);
    for (size_t i = 0; i < n; i++)
        free(records[i]);
    free(records);
    free(lens);
    return 0;
}
