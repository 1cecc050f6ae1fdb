/*
 * ces-mock-broker: run librdkafka's embedded mock Kafka cluster as a process.
 *
 * The integration tests and the demo need a Kafka-protocol broker without a
 * JVM. librdkafka ships one in-process (rdkafka_mock.h); this program hosts it,
 * creates the requested topics, prints the bootstrap server list as the first
 * line on stdout and serves until SIGTERM or SIGINT.
 *
 *   ces-mock-broker [--brokers N] [--topic NAME:PARTITIONS]... [--debug CTX]
 *
 * The mock cluster listens on 127.0.0.1 on ports chosen by the kernel.
 *
 * Known behaviour of the librdkafka 2.0.x mock cluster: the first JoinGroup of
 * an empty consumer group is answered only after a fixed 3 s delay (the mock's
 * stand-in for the broker's group.initial.rebalance.delay.ms; newer librdkafka
 * versions make it configurable, 2.0.2 does not). Later rebalances wait up to
 * session.timeout.ms - 1000 ms for members to rejoin, so clients should use a
 * short session.timeout.ms against this broker. A member blocked in that first
 * join is not marked active, so session.timeout.ms must stay above ~3.5 s.
 *
 * Each mock partition keeps at most 5 MiB (and 100,000 messages): appending
 * drops the oldest message sets whether or not anyone has read them, and a
 * consumer behind them gets OFFSET_OUT_OF_RANGE and jumps to the new start.
 * Neither limit is settable in 2.0.2; produce big streams at the consumer's
 * pace (see tests/integration/conftest.py, PacedProducer).
 *
 * Exit status: 0 after a clean stop, 64 on a usage error, 1 on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define EXIT_USAGE 64
#define MAX_BROKERS 16
#define MAX_PARTITIONS 1024
#define MAX_TOPICS 64
#define STEP_MS 50

struct topic_spec {
        const char *name; /* reference to argv (NUL-terminated copy below) */
        char buf[256];
        int partitions;
};

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) {
        (void)sig;
        stop_requested = 1;
}

static void usage(FILE *out) {
        fprintf(out,
                "Usage: ces-mock-broker [--brokers N] [--topic NAME:PARTITIONS]... "
                "[--debug CONTEXTS]\n"
                "\n"
                "Start librdkafka's mock Kafka cluster on 127.0.0.1, create the\n"
                "given topics, print the bootstrap server list as the first line\n"
                "on stdout and serve until SIGTERM or SIGINT.\n"
                "\n"
                "  --brokers N              number of mock brokers (1..%d, default 1)\n"
                "  --topic NAME:PARTITIONS  create a topic (repeatable; replication\n"
                "                           factor min(brokers, 3))\n"
                "  --debug CONTEXTS         librdkafka debug contexts, e.g. mock,cgrp\n"
                "  --help                   show this help\n",
                MAX_BROKERS);
}

static int usage_error(const char *fmt, ...)
        __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...) {
        va_list ap;
        fputs("ces-mock-broker: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputs("\nTry 'ces-mock-broker --help'.\n", stderr);
        return EXIT_USAGE;
}

/* Parses a decimal integer in [min, max]; returns 0 on success. */
static int parse_int(const char *s, int min, int max, int *out) {
        char *end;
        long v;

        if (!*s)
                return -1;
        errno = 0;
        v     = strtol(s, &end, 10);
        if (errno || *end || v < min || v > max)
                return -1;
        *out = (int)v;
        return 0;
}

/* Kafka topic names: 1..249 of [A-Za-z0-9._-]. */
static int valid_topic_name(const char *s, size_t len) {
        size_t i;

        if (len == 0 || len > 249)
                return 0;
        for (i = 0; i < len; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                      c == '-'))
                        return 0;
        }
        return 1;
}

static int parse_topic(const char *arg, struct topic_spec *t) {
        const char *colon = strrchr(arg, ':');
        size_t len;

        if (!colon)
                return -1;
        len = (size_t)(colon - arg);
        if (!valid_topic_name(arg, len) || len >= sizeof(t->buf))
                return -1;
        if (parse_int(colon + 1, 1, MAX_PARTITIONS, &t->partitions))
                return -1;
        memcpy(t->buf, arg, len);
        t->buf[len] = '\0';
        t->name     = t->buf;
        return 0;
}

static void sleep_ms(int ms) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        /* EINTR on a signal simply ends this step early. */
        (void)nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
        static struct topic_spec topics[MAX_TOPICS];
        int topic_cnt     = 0;
        int broker_cnt    = 1;
        const char *debug = NULL;
        char errstr[512];
        rd_kafka_conf_t *conf;
        rd_kafka_t *rk;
        rd_kafka_mock_cluster_t *mcluster;
        struct sigaction sa;
        int replication;
        int i;

        for (i = 1; i < argc; i++) {
                const char *opt = argv[i];

                if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
                        usage(stdout);
                        return 0;
                } else if (!strcmp(opt, "--brokers")) {
                        if (++i >= argc)
                                return usage_error("%s needs a value", opt);
                        if (parse_int(argv[i], 1, MAX_BROKERS, &broker_cnt))
                                return usage_error(
                                    "invalid broker count '%s'", argv[i]);
                } else if (!strcmp(opt, "--topic")) {
                        if (++i >= argc)
                                return usage_error("%s needs a value", opt);
                        if (topic_cnt == MAX_TOPICS)
                                return usage_error("too many topics at '%s'",
                                                   argv[i]);
                        if (parse_topic(argv[i], &topics[topic_cnt]))
                                return usage_error(
                                    "invalid topic '%s' (expected "
                                    "NAME:PARTITIONS)",
                                    argv[i]);
                        topic_cnt++;
                } else if (!strcmp(opt, "--debug")) {
                        if (++i >= argc)
                                return usage_error("%s needs a value", opt);
                        debug = argv[i];
                } else {
                        return usage_error("unknown argument '%s'", opt);
                }
        }

        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL)) {
                perror("ces-mock-broker: sigaction");
                return EXIT_FAILURE;
        }

        /* The handle only hosts the mock cluster; it never produces. */
        conf = rd_kafka_conf_new();
        if (debug && rd_kafka_conf_set(conf, "debug", debug, errstr,
                                       sizeof(errstr)) != RD_KAFKA_CONF_OK) {
                rd_kafka_conf_destroy(conf);
                return usage_error("invalid --debug value: %s", errstr);
        }
        /* Keep the idle host handle quiet ("no bootstrap.servers"). */
        if (rd_kafka_conf_set(conf, "log_level", debug ? "7" : "3", errstr,
                              sizeof(errstr)) != RD_KAFKA_CONF_OK) {
                fprintf(stderr, "ces-mock-broker: %s\n", errstr);
                rd_kafka_conf_destroy(conf);
                return EXIT_FAILURE;
        }

        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        if (!rk) {
                fprintf(stderr, "ces-mock-broker: rd_kafka_new failed: %s\n",
                        errstr);
                rd_kafka_conf_destroy(conf);
                return EXIT_FAILURE;
        }
        conf = NULL; /* owned by rk */

        mcluster = rd_kafka_mock_cluster_new(rk, broker_cnt);
        if (!mcluster) {
                fprintf(stderr,
                        "ces-mock-broker: failed to create a mock cluster "
                        "with %d broker(s)\n",
                        broker_cnt);
                rd_kafka_destroy(rk);
                return EXIT_FAILURE;
        }

        replication = broker_cnt < 3 ? broker_cnt : 3;
        for (i = 0; i < topic_cnt; i++) {
                rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(
                    mcluster, topics[i].name, topics[i].partitions,
                    replication);
                if (err) {
                        fprintf(stderr,
                                "ces-mock-broker: cannot create topic '%s': "
                                "%s\n",
                                topics[i].name, rd_kafka_err2str(err));
                        rd_kafka_mock_cluster_destroy(mcluster);
                        rd_kafka_destroy(rk);
                        return EXIT_FAILURE;
                }
        }

        if (printf("%s\n", rd_kafka_mock_cluster_bootstraps(mcluster)) < 0 ||
            fflush(stdout) != 0) {
                perror("ces-mock-broker: stdout");
                rd_kafka_mock_cluster_destroy(mcluster);
                rd_kafka_destroy(rk);
                return EXIT_FAILURE;
        }

        while (!stop_requested)
                sleep_ms(STEP_MS);

        rd_kafka_mock_cluster_destroy(mcluster);
        rd_kafka_destroy(rk);
        return 0;
}
