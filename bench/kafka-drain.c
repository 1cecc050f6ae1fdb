/*
 * bench/kafka-drain: the Kafka ceiling of bench/run. A plain librdkafka consumer that reads every
 * partition of a topic from the beginning to its end and does nothing with the records.
 *
 *   build/bench-kafka-drain [--parse-json] BROKERS TOPIC [name=value ...]
 *
 * Extra arguments are librdkafka properties (the same fetch settings ces2pg is given). Partitions
 * are assigned directly (no consumer group), so the time is the fetch path alone. Prints one JSON
 * line: {"records": N, "bytes": B, "seconds": S, "cpu_s": C, "layers": L, "broken_layers": K}
 * (S from creating the consumer to the last partition's end, C the CPU time of the whole process,
 * librdkafka's threads included; L and K count the JSON texts parsed and those that did not parse
 * whole, with --parse-json). Exits 1 on any error.
 *
 * With --parse-json every record is also read the way the least a yajl-based CES decoder must do
 * (below): bench/run's JSON floor.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <yajl/yajl_parse.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * --parse-json: the least JSON work any CES decoder built on yajl must do, done to every record.
 * Each record is three JSON layers (docs/ces-format.md): the envelope, the `data` string it carries, and the
 * row images `old` and `current` inside that. Each layer is read once with yajl's callback parser,
 * strings unchecked (yajl_dont_validate_strings) and numbers left as text, building nothing and
 * copying nothing: the inner layers are parsed from inside the callback that hands their string
 * over. A segment's `data` is a slice that does not parse by itself; its parse stops at the first
 * error, which is never more work than the joined event's parse would be. So the CPU time of this
 * drain is a floor under the CPU any JSON-reading ces2pg needs for the same topic.
 */
#define FLOOR_ARENA (64u << 20) /* three layers of a 1 MB record, with yajl's doubling buffers */

typedef struct {
    unsigned char *base;
    size_t used;
} floor_arena_t;

/* yajl's allocations for one record are carved from one block, all dropped at the next record,
 * so that malloc does not count in the floor (ces2pg pools them too). */
static void *floor_malloc(void *ctx, size_t size) {
    floor_arena_t *a = ctx;
    size_t need = ((size + 15) & ~(size_t)15) + 16;
    if (need > FLOOR_ARENA - a->used) {
        fprintf(stderr, "kafka-drain: a record needs more than %u bytes of yajl buffers\n",
                FLOOR_ARENA);
        exit(1);
    }
    unsigned char *p = a->base + a->used;
    memcpy(p, &size, sizeof(size));
    a->used += need;
    return p + 16;
}

static void *floor_realloc(void *ctx, void *ptr, size_t size) {
    if (ptr == NULL)
        return floor_malloc(ctx, size);
    size_t old;
    memcpy(&old, (unsigned char *)ptr - 16, sizeof(old));
    if (size <= old)
        return ptr;
    void *grown = floor_malloc(ctx, size);
    memcpy(grown, ptr, old);
    return grown;
}

static void floor_free(void *ctx, void *ptr) {
    (void)ctx;
    (void)ptr;
}

typedef struct {
    yajl_alloc_funcs *alloc;
    int key; /* the key just read names the next layer */
    unsigned long long layers, broken;
} floor_t;

static int floor_ignore_string(void *ctx, const unsigned char *s, size_t len) {
    (void)ctx;
    (void)s;
    (void)len;
    return 1;
}

static int floor_ignore_number(void *ctx, const char *s, size_t len) {
    (void)ctx;
    (void)s;
    (void)len;
    return 1;
}

static void floor_parse(floor_t *f, const yajl_callbacks *cb, const unsigned char *text,
                        size_t len);

static int floor_key(void *ctx, const unsigned char *key, size_t len, const char *a,
                     const char *b) {
    floor_t *f = ctx;
    f->key = (len == strlen(a) && memcmp(key, a, len) == 0) ||
             (b != NULL && len == strlen(b) && memcmp(key, b, len) == 0);
    return 1;
}

static int image_key(void *ctx, const unsigned char *key, size_t len) {
    return floor_key(ctx, key, len, "old", "current");
}

static int envelope_key(void *ctx, const unsigned char *key, size_t len) {
    return floor_key(ctx, key, len, "data", NULL);
}

static const yajl_callbacks image_callbacks = {
    .yajl_string = floor_ignore_string,
    .yajl_number = floor_ignore_number,
};

/* The string just read, when its key named the next layer, is parsed as that layer. */
static int inner_layer(void *ctx, const yajl_callbacks *cb, const unsigned char *s, size_t len) {
    floor_t *f = ctx;
    if (f->key && len > 0) {
        floor_t inner = {.alloc = f->alloc};
        floor_parse(&inner, cb, s, len);
        f->layers += inner.layers;
        f->broken += inner.broken;
    }
    f->key = 0;
    return 1;
}

static int data_string(void *ctx, const unsigned char *s, size_t len) {
    return inner_layer(ctx, &image_callbacks, s, len);
}

static const yajl_callbacks data_callbacks = {
    .yajl_string = data_string,
    .yajl_number = floor_ignore_number,
    .yajl_map_key = image_key,
};

static int envelope_string(void *ctx, const unsigned char *s, size_t len) {
    return inner_layer(ctx, &data_callbacks, s, len);
}

static const yajl_callbacks envelope_callbacks = {
    .yajl_string = envelope_string,
    .yajl_number = floor_ignore_number,
    .yajl_map_key = envelope_key,
};

static void floor_parse(floor_t *f, const yajl_callbacks *cb, const unsigned char *text,
                        size_t len) {
    yajl_handle h = yajl_alloc(cb, f->alloc, f);
    if (h == NULL) {
        fprintf(stderr, "kafka-drain: out of memory\n");
        exit(1);
    }
    yajl_config(h, yajl_dont_validate_strings, 1);
    f->layers++;
    if (yajl_parse(h, text, len) != yajl_status_ok || yajl_complete_parse(h) != yajl_status_ok)
        f->broken++;
    yajl_free(h);
}

static void set(rd_kafka_conf_t *conf, const char *name, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "kafka-drain: %s=%s: %s\n", name, value, err);
        exit(1);
    }
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv) {
    int parse_json = argc > 1 && strcmp(argv[1], "--parse-json") == 0;
    if (parse_json) {
        argv++;
        argc--;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s [--parse-json] BROKERS TOPIC [name=value ...]\n", argv[0]);
        return 64;
    }
    floor_arena_t arena = {0};
    yajl_alloc_funcs alloc = {floor_malloc, floor_realloc, floor_free, &arena};
    floor_t floor = {.alloc = &alloc};
    if (parse_json && (arena.base = malloc(FLOOR_ARENA)) == NULL) {
        fprintf(stderr, "kafka-drain: out of memory\n");
        return 1;
    }
    double start = now_s();
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", argv[1]);
    set(conf, "group.id", "bench-kafka-drain");
    set(conf, "enable.partition.eof", "true");
    set(conf, "enable.auto.commit", "false");
    set(conf, "auto.offset.reset", "earliest");
    for (int i = 3; i < argc; i++) {
        char *kv = strdup(argv[i]), *eq = strchr(kv, '=');
        if (eq == NULL) {
            fprintf(stderr, "kafka-drain: expected name=value, got %s\n", argv[i]);
            return 64;
        }
        *eq = '\0';
        set(conf, kv, eq + 1);
        free(kv);
    }
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (rk == NULL) {
        fprintf(stderr, "kafka-drain: %s\n", err);
        return 1;
    }
    rd_kafka_poll_set_consumer(rk);

    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, argv[2], NULL);
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, &md, 15000);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1 || md->topics[0].err ||
        md->topics[0].partition_cnt < 1) {
        fprintf(stderr, "kafka-drain: no metadata for topic %s: %s\n", argv[2],
                rd_kafka_err2str(e ? e : md->topic_cnt == 1 ? md->topics[0].err : e));
        return 1;
    }
    int nparts = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(parts, argv[2], md->topics[0].partitions[i].id)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    if ((e = rd_kafka_assign(rk, parts)) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kafka-drain: assign: %s\n", rd_kafka_err2str(e));
        return 1;
    }
    rd_kafka_topic_partition_list_destroy(parts);

    unsigned long long records = 0, bytes = 0;
    int at_end = 0;
    char *eof = calloc((size_t)nparts + 1, 1);
    while (at_end < nparts) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 1000);
        if (m == NULL)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (m->partition >= 0 && m->partition < nparts && !eof[m->partition]) {
                eof[m->partition] = 1;
                at_end++;
            }
        } else if (m->err) {
            fprintf(stderr, "kafka-drain: %s\n", rd_kafka_message_errstr(m));
            return 1;
        } else {
            records++;
            bytes += m->len;
            if (parse_json) {
                arena.used = 0;
                floor.key = 0;
                floor_parse(&floor, &envelope_callbacks, m->payload, m->len);
            }
        }
        rd_kafka_message_destroy(m);
    }
    double seconds = now_s() - start;
    printf("{\"records\": %llu, \"bytes\": %llu, \"seconds\": %.3f, \"cpu_s\": %.3f, "
           "\"layers\": %llu, \"broken_layers\": %llu}\n",
           records, bytes, seconds, cpu_s(), floor.layers, floor.broken);
    rd_kafka_assign(rk, NULL);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    free(eof);
    free(arena.base);
    return 0;
}
