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
 * (bench/json-floor.h, which bench/decode.c shares for run-decode's "yajl alone"): bench/run's JSON
 * floor.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "json-floor.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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
    json_floor_t floor = {0};
    if (parse_json && json_floor_init(&floor) != 0) {
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
            if (parse_json)
                json_floor_record(&floor, m->payload, m->len);
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
    json_floor_free(&floor);
    return 0;
}
