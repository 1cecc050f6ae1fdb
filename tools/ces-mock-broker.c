/*
 * ces-mock-broker: run librdkafka's embedded mock Kafka cluster as a process.
 *
 * The integration tests and the demo need a Kafka-protocol broker without a
 * JVM. librdkafka ships one in-process (rdkafka_mock.h); this program hosts it,
 * creates the requested topics, prints the bootstrap server list as the first
 * line on stdout and serves until SIGTERM or SIGINT.
 *
 *   ces-mock-broker [--brokers N] [--topic NAME:PARTITIONS]... [--debug CTX]
 *                   [--control]
 *
 * The mock cluster listens on 127.0.0.1 on ports chosen by the kernel.
 *
 * Control channel (--control; without it stdin is never read). After the
 * bootstrap line, commands are read from stdin, one per line, and each gets
 * exactly one reply line on stdout: "ok", or "error: " and the reason (the
 * command is then not carried out). Every command is also logged on stderr.
 *
 *   down BROKER_ID                disconnect the broker's clients and refuse
 *                                 new connections (-1: every broker); its
 *                                 partitions keep their leader
 *   up BROKER_ID                  accept connections again (-1: every broker)
 *   errors APIKEY COUNT ERRCODE   the next COUNT requests of type APIKEY, to
 *                                 any broker, fail with ERRCODE
 *   clear APIKEY                  forget the errors still pending for APIKEY
 *
 * Brokers are numbered 1..N. APIKEY is a Kafka request type by name (Fetch,
 * OffsetCommit, JoinGroup, Heartbeat, ...: see the table below) or number;
 * ERRCODE a librdkafka error code by name, without its RD_KAFKA_RESP_ERR_
 * prefix (NOT_COORDINATOR, REBALANCE_IN_PROGRESS, _TRANSPORT: the broker
 * disconnects the client), or number. Names are case-insensitive. Empty lines
 * and lines starting with '#' get no reply. At the end of stdin the cluster
 * serves on until SIGTERM or SIGINT.
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
 * pace (see tests/harness/mockbroker.py, PacedProducer).
 *
 * On SIGTERM or SIGINT it logs the signal and the pid that sent it on stderr
 * and stops. Exit status: 0 after a clean stop, 64 on a usage error, 1 on
 * failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define EXIT_USAGE 64
#define MAX_BROKERS 16
#define MAX_PARTITIONS 1024
#define MAX_TOPICS 64
#define STEP_MS 50
#define MAX_LINE 512
#define MAX_ERRORS 1000

struct topic_spec {
        const char *name; /* reference to argv (NUL-terminated copy below) */
        char buf[256];
        int partitions;
};

static volatile sig_atomic_t stop_requested = 0; /* the signal's number */
static volatile sig_atomic_t stop_sender    = 0; /* its sender's pid */

static void on_signal(int sig, siginfo_t *info, void *context) {
        (void)context;
        stop_sender    = info ? (sig_atomic_t)info->si_pid : 0;
        stop_requested = sig;
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
                "  --control                read commands on stdin, one per line,\n"
                "                           and answer each on stdout (\"ok\" or\n"
                "                           \"error: ...\"):\n"
                "                             down BROKER_ID | up BROKER_ID\n"
                "                             errors APIKEY COUNT ERRCODE\n"
                "                             clear APIKEY\n"
                "                           (brokers 1..N, -1 for all; APIKEY e.g.\n"
                "                           Fetch, Heartbeat; ERRCODE e.g.\n"
                "                           NOT_COORDINATOR; see the source's header)\n"
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

/*
 * The control channel (--control).
 */

/* Kafka request types by name: the ones the mock cluster serves. */
static const struct {
        const char *name;
        int16_t key;
} api_keys[] = {
    {"Produce", 0},           {"Fetch", 1},
    {"ListOffsets", 2},       {"Metadata", 3},
    {"OffsetCommit", 8},      {"OffsetFetch", 9},
    {"FindCoordinator", 10},  {"JoinGroup", 11},
    {"Heartbeat", 12},        {"LeaveGroup", 13},
    {"SyncGroup", 14},        {"DescribeGroups", 15},
    {"ListGroups", 16},       {"SaslHandshake", 17},
    {"ApiVersions", 18},      {"CreateTopics", 19},
    {"InitProducerId", 22},   {"OffsetForLeaderEpoch", 23},
    {"AddPartitionsToTxn", 24}, {"AddOffsetsToTxn", 25},
    {"EndTxn", 26},           {"TxnOffsetCommit", 28},
    {"SaslAuthenticate", 36},
};

struct control {
        rd_kafka_mock_cluster_t *mcluster; /* reference to the cluster */
        int broker_cnt;
        char line[MAX_LINE + 1];
        size_t len;     /* bytes of the current line in line */
        int overlong;   /* the current line passed MAX_LINE: skip to its end */
        int open;       /* stdin not at its end yet */
};

/* Writes one reply line to stdout. A controller that went away is logged,
 * the cluster serves on. */
static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void reply(const char *fmt, ...) {
        va_list ap;
        int rc;

        va_start(ap, fmt);
        rc = vprintf(fmt, ap);
        va_end(ap);
        if (rc < 0 || putchar('\n') == EOF || fflush(stdout) != 0) {
                fprintf(stderr, "ces-mock-broker: cannot write a reply: %s\n",
                        strerror(errno));
                clearerr(stdout);
        }
}

static int parse_api_key(const char *s, int16_t *out) {
        size_t i;
        int v;

        for (i = 0; i < sizeof(api_keys) / sizeof(api_keys[0]); i++) {
                if (!strcasecmp(s, api_keys[i].name)) {
                        *out = api_keys[i].key;
                        return 0;
                }
        }
        if (parse_int(s, 0, 1000, &v))
                return -1;
        *out = (int16_t)v;
        return 0;
}

/* An error code by librdkafka's name for it (with or without the
 * RD_KAFKA_RESP_ERR_ prefix) or by number; only codes librdkafka knows. */
static int parse_err_code(const char *s, rd_kafka_resp_err_t *out) {
        static const char prefix[] = "RD_KAFKA_RESP_ERR_";
        const struct rd_kafka_err_desc *descs;
        size_t cnt, i;
        int by_number, v = 0;

        if (!strncasecmp(s, prefix, sizeof(prefix) - 1))
                s += sizeof(prefix) - 1;
        by_number = parse_int(s, -1000, 1000, &v) == 0;
        rd_kafka_get_err_descs(&descs, &cnt);
        for (i = 0; i < cnt; i++) {
                if (!descs[i].name)
                        continue;
                if (by_number ? (int)descs[i].code == v
                              : !strcasecmp(s, descs[i].name)) {
                        *out = descs[i].code;
                        return 0;
                }
        }
        return -1;
}

static int parse_broker_id(const struct control *c, const char *s,
                           int32_t *out) {
        int v;

        if (parse_int(s, -1, c->broker_cnt, &v) || v == 0)
                return -1;
        *out = v;
        return 0;
}

/* Splits line into at most max words (in place); returns how many. */
static int split_words(char *line, char **words, int max) {
        int n = 0;
        char *p = line;

        while (*p) {
                while (*p && isspace((unsigned char)*p))
                        *p++ = '\0';
                if (!*p)
                        break;
                if (n == max)
                        return max + 1;
                words[n++] = p;
                while (*p && !isspace((unsigned char)*p))
                        p++;
        }
        return n;
}

static void run_command(struct control *c, char *line) {
        char *w[5];
        int n, i;
        int32_t broker;
        int16_t api;
        int count;
        rd_kafka_resp_err_t err;
        static rd_kafka_resp_err_t errs[MAX_ERRORS];

        n = split_words(line, w, 4);
        if (n == 0 || w[0][0] == '#')
                return;
        fprintf(stderr, "ces-mock-broker: control:");
        for (i = 0; i < n && i < 4; i++)
                fprintf(stderr, " %s", w[i]);
        fprintf(stderr, "%s\n", n > 4 ? " ..." : "");

        if (!strcasecmp(w[0], "down") || !strcasecmp(w[0], "up")) {
                int down = !strcasecmp(w[0], "down");
                if (n != 2) {
                        reply("error: usage: %s BROKER_ID", w[0]);
                } else if (parse_broker_id(c, w[1], &broker)) {
                        reply("error: no broker '%s' (brokers are 1..%d, "
                              "or -1 for all)",
                              w[1], c->broker_cnt);
                } else if ((err = down ? rd_kafka_mock_broker_set_down(
                                             c->mcluster, broker)
                                       : rd_kafka_mock_broker_set_up(
                                             c->mcluster, broker))) {
                        reply("error: %s %d: %s", w[0], (int)broker,
                              rd_kafka_err2str(err));
                } else {
                        reply("ok");
                }
        } else if (!strcasecmp(w[0], "errors")) {
                if (n != 4) {
                        reply("error: usage: errors APIKEY COUNT ERRCODE");
                } else if (parse_api_key(w[1], &api)) {
                        reply("error: unknown request type '%s' (a name "
                              "such as Fetch or Heartbeat, or a number "
                              "0..1000)",
                              w[1]);
                } else if (parse_int(w[2], 1, MAX_ERRORS, &count)) {
                        reply("error: invalid count '%s' (1..%d)", w[2],
                              MAX_ERRORS);
                } else if (parse_err_code(w[3], &err)) {
                        reply("error: unknown error code '%s' (a librdkafka "
                              "name such as NOT_COORDINATOR, or its number)",
                              w[3]);
                } else {
                        for (i = 0; i < count; i++)
                                errs[i] = err;
                        rd_kafka_mock_push_request_errors_array(
                            c->mcluster, api, (size_t)count, errs);
                        reply("ok");
                }
        } else if (!strcasecmp(w[0], "clear")) {
                if (n != 2) {
                        reply("error: usage: clear APIKEY");
                } else if (parse_api_key(w[1], &api)) {
                        reply("error: unknown request type '%s'", w[1]);
                } else {
                        rd_kafka_mock_clear_request_errors(c->mcluster, api);
                        reply("ok");
                }
        } else {
                reply("error: unknown command '%s' (down, up, errors, clear)",
                      w[0]);
        }
}

/* Reads what stdin has (waiting at most STEP_MS) and runs every complete
 * line. At the end of stdin a last unterminated line is run too. */
static void control_step(struct control *c) {
        struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
        char buf[4096];
        ssize_t got, i;

        if (!c->open) {
                sleep_ms(STEP_MS);
                return;
        }
        if (poll(&pfd, 1, STEP_MS) <= 0)
                return; /* nothing yet, or a signal */
        got = read(STDIN_FILENO, buf, sizeof(buf));
        if (got < 0) {
                if (errno == EINTR || errno == EAGAIN)
                        return;
                fprintf(stderr,
                        "ces-mock-broker: reading commands: %s; the control "
                        "channel is closed\n",
                        strerror(errno));
                c->open = 0;
                return;
        }
        if (got == 0) {
                c->open = 0;
                if (c->len > 0 && !c->overlong) {
                        c->line[c->len] = '\0';
                        run_command(c, c->line);
                }
                c->len = 0;
                return;
        }
        for (i = 0; i < got; i++) {
                if (buf[i] == '\n') {
                        if (c->overlong) {
                                reply("error: command longer than %d bytes",
                                      MAX_LINE);
                        } else {
                                c->line[c->len] = '\0';
                                run_command(c, c->line);
                        }
                        c->len      = 0;
                        c->overlong = 0;
                } else if (c->len == MAX_LINE) {
                        c->overlong = 1;
                } else if (!c->overlong) {
                        c->line[c->len++] = buf[i];
                }
        }
}

int main(int argc, char **argv) {
        static struct topic_spec topics[MAX_TOPICS];
        int topic_cnt     = 0;
        int broker_cnt    = 1;
        const char *debug = NULL;
        int control       = 0;
        static struct control ctl;
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
                } else if (!strcmp(opt, "--control")) {
                        control = 1;
                } else if (!strcmp(opt, "--debug")) {
                        if (++i >= argc)
                                return usage_error("%s needs a value", opt);
                        debug = argv[i];
                } else {
                        return usage_error("unknown argument '%s'", opt);
                }
        }

        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_signal;
        sa.sa_flags     = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL)) {
                perror("ces-mock-broker: sigaction");
                return EXIT_FAILURE;
        }
        /* A controller that went away must not kill the cluster: a failed
         * reply is logged instead. */
        if (control && signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
                perror("ces-mock-broker: signal");
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

        ctl.mcluster   = mcluster;
        ctl.broker_cnt = broker_cnt;
        ctl.open       = control;
        while (!stop_requested)
                control_step(&ctl);
        /* Who stopped the cluster, for the logs of tests that did not. */
        fprintf(stderr, "ces-mock-broker: stopping on signal %d from pid %d\n",
                (int)stop_requested, (int)stop_sender);

        rd_kafka_mock_cluster_destroy(mcluster);
        rd_kafka_destroy(rk);
        return 0;
}
