/*
 * main: the command line, signals, and the operator commands; the daemon's wiring is daemon.c.
 * The only place that decides exit codes (and the only one that may call exit()): 0 clean stop or
 * successful replay, 64 usage error, 65 a source gap stopped it (or replay --capture left a file
 * unread), 78 configuration error, 1 anything else.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "daemon.h"
#include "tokens.h"
#include "apply/apply.h"
#include "apply/tableplan.h"
#include "conf/config.h"
#include "format/decode.h"
#include "input/capture.h"
#include "input/consumer.h"
#include "input/replay.h"
#include "ops/admin.h"
#include "pipeline/pipeline.h"
#include "util/log.h"

#ifndef CES2PG_VERSION
#define CES2PG_VERSION "0.0.0"
#endif

#define EXIT_USAGE 64
#define EXIT_CONFIG 78
/* A gap at the source (kafka.on_source_gap = "stop"): restarting cannot fix it; an operator must
 * re-seed or accept it. 65 is sysexits' EX_DATAERR; the systemd unit does not restart on it. */
#define EXIT_SOURCE_GAP 65
/* replay --capture: Capture files that could not be read to their end (the rest was applied). */
#define EXIT_CAPTURE_UNREAD 65

/* "ces2pg: WHAT: MESSAGE" (WHAT NULL: "ces2pg: MESSAGE") on stderr, the message escaped
 * (util/log.h): the pipeline's and PostgreSQL's errors quote names from events and run over
 * lines. */
static void print_error(const char *what, const char *message) {
    fprintf(stderr, "ces2pg: %s%s", what != NULL ? what : "", what != NULL ? ": " : "");
    ces_log_escape_put(stderr, message);
    fputc('\n', stderr);
}

static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t reload_requested = 0;

/* The first SIGTERM/SIGINT asks for a graceful stop and restores the default action, so that a
 * second one ends the process at once, even while the first is being honoured (sigaction is
 * async-signal-safe). */
static void on_stop_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void on_reload_signal(int sig) {
    (void)sig;
    reload_requested = 1;
}

static void install_signals(bool daemon) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* The handler only sets a flag; SA_RESETHAND gives the signal its default action back as it is
     * delivered, so a second SIGTERM (or Ctrl-C) ends the process at once, even while the main loop
     * waits in PostgreSQL. */
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_flags = 0;
    if (daemon) {
        sa.sa_handler = on_reload_signal;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGHUP, &sa, NULL);
    }
    signal(SIGPIPE, SIG_IGN);
}

static void usage(FILE *out) {
    fprintf(out,
            "ces2pg %s: replicate SQL Server Change Event Streaming (CES) events from Kafka or\n"
            "Azure Event Hubs into PostgreSQL, exactly once.\n"
            "\n"
            "Usage:\n"
            "  ces2pg -c FILE                 run the daemon in the foreground (logs to stderr)\n"
            "  ces2pg --check-config -c FILE  validate the configuration and exit\n"
            "  ces2pg replay -c FILE PATH...  apply records from files instead of Kafka: one record\n"
            "                                 per line, '{' starts a JSON record, any other line is\n"
            "                                 the base64 of a binary (Avro) record; PATH - is stdin\n"
            "  ces2pg replay -c FILE --capture [--capture-layout FORMAT] PATH...\n"
            "                                 apply Event Hubs Capture files (PATH: files, or folders\n"
            "                                 searched for *.avro), each Body a record; a partition's\n"
            "                                 files are merged by sequence number, repeats skipped;\n"
            "                                 the partition comes from each file's path, matched\n"
            "                                 against FORMAT, Capture's archive name format (default\n"
            "                                 {Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/\n"
            "                                 {Day}/{Hour}/{Minute}/{Second}); no position is stored\n"
            "  ces2pg dead-letters -c FILE list [--class C] [--table SCHEMA.TABLE] [--json]\n"
            "  ces2pg dead-letters -c FILE show ID [--json]\n"
            "                                 the dead letters and the record of one (as replay\n"
            "                                 reads it); classes: decode, no_primary_key,\n"
            "                                 rejected_by_postgres, segment_timeout,\n"
            "                                 reassembly_limit, type_conflict, schema\n"
            "  ces2pg dead-letters -c FILE retry [--class C | ID...]\n"
            "                                 apply them again through the daemon's path (the\n"
            "                                 version guard keeps newer rows); what applies leaves\n"
            "                                 the table, what fails again keeps its row, new reason\n"
            "  ces2pg dead-letters -c FILE purge --before TIME\n"
            "                                 delete those made before TIME (\"30 days\" or a time)\n"
            "  ces2pg status -c FILE [--json] [--stale-after S] [--max-lag N]\n"
            "                                 positions, lag, last commit, dead letters, source\n"
            "                                 gaps; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN\n"
            "  ces2pg adopt -c FILE (--table SCHEMA.TABLE ... | --all) --lsn LSN\n"
            "                                 mark rows copied by another tool with the version of\n"
            "                                 the source snapshot's LSN (0x0000002A000001F00003 or\n"
            "                                 0000002A:000001F0:0003): changes committed at or\n"
            "                                 before it are skipped, later ones apply; --all: the\n"
            "                                 tables of schema.target's schema (of every schema\n"
            "                                 when it is {schema}); exit 1 when one is not adopted\n"
            "  ces2pg --version | --help\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE   configuration file (libconfig syntax; see conf/ces2pg.conf)\n"
            "      --check-config  validate FILE, print the effective settings, exit\n"
            "      --fetch-tokens  with --check-config: also fetch a Microsoft Entra token for\n"
            "                      each side whose auth is \"entra\" (proves the identity works)\n"
            "  -V, --version       print the version\n"
            "  -h, --help          print this help\n"
            "\n"
            "Exit status: 0 clean stop (SIGTERM/SIGINT) or successful replay, 64 usage error,\n"
            "65 a gap at the source stopped it (kafka.on_source_gap), or replay --capture could\n"
            "not read a file to its end (the rest was applied), 78 configuration error (Microsoft\n"
            "Entra ID refusing the identity included), 1 any other fatal error; status: 0 OK,\n"
            "1 WARNING, 2 CRITICAL, 3 UNKNOWN.\n"
            "See ces2pg(8) and ces2pg.conf(5).\n",
            CES2PG_VERSION);
}

/* Microsoft Entra ID of the configuration loaded (NULL when no side uses it): its token sources are
 * in the configuration, so it lives as long as that (release_config). */
static ces_tokens_t *entra;

/* Frees a configuration of load_config, and its Entra tokens. */
static void release_config(ces_config_t *config) {
    ces_config_destroy(config);
    ces_tokens_destroy(entra);
    entra = NULL;
}

/* Loads the configuration and sets the log level; prints the error and returns NULL if invalid. */
static ces_config_t *load_config(const char *path, ces_config_mode_t mode) {
    ces_config_t *config = NULL;
    char err[1024];
    if (ces_config_load(path, mode, &config, err, sizeof(err)) != CES_CONFIG_OK) {
        fprintf(stderr, "ces2pg: %s\n", err);
        return NULL;
    }
    if (ces_tokens_attach(config, &entra, err, sizeof(err)) != 0) {
        fprintf(stderr, "ces2pg: %s\n", err);
        ces_config_destroy(config);
        return NULL;
    }
    if (!ces_apply_conninfo_valid(config->pg_conninfo)) {
        /* libpq's message may quote the string, which may hold a password: say less. */
        fprintf(stderr, "ces2pg: %s: postgres.conninfo is not a valid libpq connection string\n",
                path);
        release_config(config);
        return NULL;
    }
    ces_log_level_t level;
    if (ces_log_level_parse(config->log_level, &level) == 0)
        ces_log_set_level(level);
    ces_log_format_t format;
    if (ces_log_format_parse(config->log_format, &format) == 0)
        ces_log_set_format(format);
    return config;
}

/* --check-config [--fetch-tokens]: with fetch_tokens, a token for each side that uses Microsoft
 * Entra ID must be had too (a refusal is a configuration error, an endpoint out of reach 1). */
static int check_config(const char *path, bool fetch_tokens) {
    ces_config_t *config = load_config(path, CES_CONFIG_DAEMON);
    if (config == NULL)
        return EXIT_CONFIG;
    char err[2048];
    int rc = 0;
    if (ces_consumer_check_config(config, err, sizeof(err)) != CES_CONSUMER_OK) {
        fprintf(stderr, "ces2pg: %s\n", err);
        rc = EXIT_CONFIG;
    } else if (fetch_tokens && ces_tokens_check(entra, stdout, err, sizeof(err)) != 0) {
        fprintf(stderr, "ces2pg: %s\n", err);
        rc = ces_tokens_refused(entra) ? EXIT_CONFIG : 1;
    } else {
        printf("%s: configuration is valid\n", path);
        ces_config_print(config, stdout);
        ces_rules_describe(stdout, &config->schema_tables, config->schema_target);
        ces_tableplan_describe_names(stdout,
                                     config->apply_lsn_guard ? config->apply_version_column : NULL,
                                     config->schema_metadata);
    }
    release_config(config);
    return rc;
}

/* A failure that Entra refusing a token caused is a configuration error (a wrong client secret,
 * an unknown tenant, no such identity): retrying will not help. */
static int failure_exit(void) {
    return ces_tokens_refused(entra) ? EXIT_CONFIG : 1;
}

/* Runs the daemon's pipeline over feed (replay's files, or dead letters to retry) against config's
 * PostgreSQL, positions not stored, and prints "NAME: records=N applied=N dead_letters=N". Returns
 * the exit status. */
static int run_feed(const ces_config_t *config, ces_feed_t *feed, bool retrying,
                    const char *name) {
    int rc = 1;
    ces_decode_limits_t limits;
    ces_daemon_decode_limits(config, &limits);
    ces_pipeline_options_t popts;
    ces_daemon_pipeline_options(config, false, &popts);
    popts.retry_dead_letters = retrying;
    ces_decoder_t *decoder = ces_decoder_new(&limits);
    ces_apply_t *apply = ces_daemon_apply_new(config, &stop_requested);
    ces_pipeline_t *pipeline = NULL;
    char err[1024];
    if (decoder == NULL || apply == NULL ||
        (pipeline = ces_pipeline_new(&popts, decoder, apply)) == NULL) {
        fprintf(stderr, "ces2pg: out of memory\n");
        goto done;
    }
    ces_apply_status_t ast = ces_apply_start(apply, err, sizeof(err));
    if (ast != CES_APPLY_OK) {
        print_error(NULL, err);
        rc = ast == CES_APPLY_INTERRUPTED ? 0 : 1;
        goto done;
    }
    ces_pipeline_set_feed(pipeline, feed);
    ces_pipeline_status_t st = ces_pipeline_run(pipeline, NULL, &stop_requested, err, sizeof(err));
    ces_pipeline_stats_t stats;
    ces_pipeline_get_stats(pipeline, &stats);
    printf("%s: records=%llu applied=%llu dead_letters=%llu\n", name,
           (unsigned long long)stats.records, (unsigned long long)stats.events_applied,
           (unsigned long long)stats.dead_letters);
    if (stats.duplicates > 0 || stats.excluded > 0)
        printf("%s: duplicates_skipped=%llu excluded=%llu\n", name,
               (unsigned long long)stats.duplicates, (unsigned long long)stats.excluded);
    fflush(stdout);
    switch (st) {
    case CES_PIPELINE_OK: rc = 0; break;
    case CES_PIPELINE_STOPPED:
    case CES_PIPELINE_INTERRUPTED:
        fprintf(stderr, "ces2pg: %s stopped by a signal before the end of its input\n", name);
        rc = 1;
        break;
    case CES_PIPELINE_FATAL:
    case CES_PIPELINE_SOURCE_GAP: /* no stored positions here: never */
        print_error(name, err);
        rc = 1;
        break;
    }
done:
    /* The pipeline gives the records it holds back to the feed before the feed goes. */
    ces_pipeline_destroy(pipeline);
    ces_apply_destroy(apply);
    ces_decoder_destroy(decoder);
    return rc;
}

/* replay --capture: the Capture files among paths, through run_feed; a file not read to its end
 * makes the exit status EXIT_CAPTURE_UNREAD. */
static int run_capture(const ces_config_t *config, char *const *paths, size_t npaths,
                       const char *layout) {
    ces_capture_options_t o = {.layout = layout,
                               .max_record_bytes = (size_t)config->decode_max_record_bytes,
                               .progress = isatty(STDERR_FILENO) == 1};
    char err[1024];
    ces_capture_t *capture = ces_capture_new(paths, npaths, &o, err, sizeof(err));
    if (capture == NULL) {
        print_error(NULL, err);
        return 1;
    }
    ces_feed_t feed;
    ces_capture_feed(capture, &feed);
    int rc = run_feed(config, &feed, false, "replay");
    ces_capture_stats_t s;
    ces_capture_get_stats(capture, &s);
    printf("capture: files=%llu read=%llu failed=%llu duplicates_skipped=%llu out_of_order=%llu "
           "sequence_gaps=%llu\n", (unsigned long long)s.files, (unsigned long long)s.files_read,
           (unsigned long long)s.files_failed, (unsigned long long)s.duplicates,
           (unsigned long long)s.out_of_order, (unsigned long long)s.gaps);
    fflush(stdout);
    if (rc == 0 && (s.files_failed > 0 || s.files == 0)) {
        if (s.files == 0)
            fprintf(stderr, "ces2pg: replay: no Capture file (*.avro) found\n");
        else
            fprintf(stderr, "ces2pg: replay: %llu Capture file(s) or path(s) could not be read to "
                    "their end (see the errors above); everything else was applied\n",
                    (unsigned long long)s.files_failed);
        rc = EXIT_CAPTURE_UNREAD;
    }
    ces_capture_destroy(capture);
    return rc;
}

/* The daemon until a stop signal: its status as an exit code. */
static int run_daemon(const char *path) {
    ces_config_t *config = load_config(path, CES_CONFIG_DAEMON);
    if (config == NULL)
        return EXIT_CONFIG;
    ces_daemon_signals_t signals = {&stop_requested, &reload_requested};
    ces_daemon_status_t st = ces_daemon_run(path, config, entra, &signals);
    int rc = st == CES_DAEMON_OK            ? 0
             : st == CES_DAEMON_CONFIG     ? EXIT_CONFIG
             : st == CES_DAEMON_SOURCE_GAP ? EXIT_SOURCE_GAP
                                           : failure_exit();
    release_config(config);
    return rc;
}

static int run_replay(const char *path, char *const *files, size_t nfiles, bool capture,
                      const char *layout) {
    ces_config_t *config = load_config(path, CES_CONFIG_REPLAY);
    if (config == NULL)
        return EXIT_CONFIG;
    if (capture) {
        int rc = run_capture(config, files, nfiles, layout);
        release_config(config);
        return rc;
    }
    int rc = 1;
    ces_replay_t *replay = ces_replay_new(files, nfiles);
    if (replay == NULL) {
        fprintf(stderr, "ces2pg: out of memory\n");
    } else {
        ces_feed_t feed;
        ces_replay_feed(replay, &feed);
        rc = run_feed(config, &feed, false, "replay");
        if (rc == 1)
            rc = failure_exit();
    }
    ces_replay_destroy(replay);
    release_config(config);
    return rc;
}

/* --table may be given this often (adopt). */
#define MAX_TABLES 256

/* The options of the operator commands (after the command word). */
typedef struct {
    const char *config_path;
    const char *class;
    const char *table; /* the last --table */
    char *tables[MAX_TABLES]; /* every --table (adopt) */
    size_t ntables;
    const char *before;
    const char *lsn;
    bool all;
    bool json;
    int64_t stale_after_s;
    int64_t max_lag;
} command_options_t;

/* Parses argv[1..] of `ces2pg COMMAND ...`; leaves the operands at argv[optind..]. Returns 0, -1
 * after printing --help (the command then exits 0), or EXIT_USAGE after saying why. */
static int parse_command(int argc, char **argv, command_options_t *o) {
    enum { OPT_CLASS = 1000, OPT_TABLE, OPT_BEFORE, OPT_JSON, OPT_STALE, OPT_MAX_LAG, OPT_LSN,
           OPT_ALL };
    static const struct option options[] = {
        {"config", required_argument, NULL, 'c'},   {"class", required_argument, NULL, OPT_CLASS},
        {"table", required_argument, NULL, OPT_TABLE}, {"before", required_argument, NULL, OPT_BEFORE},
        {"json", no_argument, NULL, OPT_JSON},      {"stale-after", required_argument, NULL, OPT_STALE},
        {"max-lag", required_argument, NULL, OPT_MAX_LAG}, {"help", no_argument, NULL, 'h'},
        {"lsn", required_argument, NULL, OPT_LSN},  {"all", no_argument, NULL, OPT_ALL},
        {NULL, 0, NULL, 0},
    };
    *o = (command_options_t){.stale_after_s = 300, .max_lag = 0};
    optind = 2;
    int opt;
    char *end;
    while ((opt = getopt_long(argc, argv, "c:h", options, NULL)) != -1) {
        switch (opt) {
        case 'c': o->config_path = optarg; break;
        case 'h': usage(stdout); return -1;
        case OPT_CLASS: o->class = optarg; break;
        case OPT_TABLE:
            if (o->ntables == MAX_TABLES) {
                fprintf(stderr, "ces2pg: at most %d --table\n", MAX_TABLES);
                return EXIT_USAGE;
            }
            o->table = o->tables[o->ntables++] = optarg;
            break;
        case OPT_LSN: o->lsn = optarg; break;
        case OPT_ALL: o->all = true; break;
        case OPT_BEFORE: o->before = optarg; break;
        case OPT_JSON: o->json = true; break;
        case OPT_STALE:
        case OPT_MAX_LAG: {
            long long v = strtoll(optarg, &end, 10);
            if (end == optarg || *end != '\0' || v < 0) {
                fprintf(stderr, "ces2pg: --%s wants a number of %s, not '%s'\n",
                        opt == OPT_STALE ? "stale-after" : "max-lag",
                        opt == OPT_STALE ? "seconds" : "records", optarg);
                return EXIT_USAGE;
            }
            *(opt == OPT_STALE ? &o->stale_after_s : &o->max_lag) = v;
            break;
        }
        default: fprintf(stderr, "Try 'ces2pg --help'.\n"); return EXIT_USAGE;
        }
    }
    if (o->config_path == NULL) {
        fprintf(stderr, "ces2pg: a configuration file is required (-c FILE)\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* An id on the command line (positive), or -1 after saying why. */
static int64_t parse_id(const char *text) {
    char *end;
    long long id = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || id <= 0) {
        fprintf(stderr, "ces2pg: '%s' is not a dead letter id\n", text);
        return -1;
    }
    return id;
}

/* dead-letters retry: the ids given, else every dead letter (of --class). */
static int retry_dead_letters(const ces_config_t *config, ces_inspect_t *inspect,
                              const command_options_t *o, char **operands, int noperands) {
    char err[1024] = ""; /* a failure to report (the pipeline's own are logged) */
    int64_t *ids = NULL;
    ces_retry_feed_t *retry = NULL;
    int rc = 1;
    long n = noperands;
    if (noperands > 0) {
        if ((ids = calloc((size_t)noperands, sizeof(*ids))) == NULL) {
            snprintf(err, sizeof(err), "out of memory");
            goto done;
        }
        for (int i = 0; i < noperands; i++) {
            if ((ids[i] = parse_id(operands[i])) < 0) {
                rc = EXIT_USAGE;
                goto done;
            }
        }
    } else if ((n = ces_inspect_dead_letter_ids(inspect, o->class, &ids, err, sizeof(err))) < 0) {
        goto done;
    }
    char since[64];
    if (ces_inspect_now(inspect, since, sizeof(since), err, sizeof(err)) != 0)
        goto done;
    if ((retry = ces_retry_feed_new(inspect, ids, (size_t)n)) == NULL) {
        snprintf(err, sizeof(err), "out of memory");
        goto done;
    }
    ces_feed_t feed;
    ces_retry_feed(retry, &feed);
    rc = run_feed(config, &feed, true, "retry");
    size_t nhanded = 0;
    const int64_t *handed = ces_retry_feed_handed(retry, &nhanded);
    if (rc == 0 && nhanded > 0) {
        /* Only after a run to the end: before it, a record not yet applied is not skipped. */
        long skipped =
            ces_inspect_retire_skipped(inspect, handed, nhanded, since, err, sizeof(err));
        if (skipped < 0)
            rc = 1;
        else if (skipped > 0)
            printf("retry: removed %ld that the pipeline skipped (duplicates of records "
                   "applied, or events of excluded tables)\n", skipped);
    }
done:
    if (err[0] != '\0') {
        print_error("dead-letters retry", err);
        rc = 1;
    }
    ces_retry_feed_destroy(retry);
    free(ids);
    return rc;
}

static int run_dead_letters(int argc, char **argv) {
    command_options_t o;
    int rc = parse_command(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    const char *action = optind < argc ? argv[optind++] : "";
    char **operands = argv + optind;
    int noperands = argc - optind;
    bool list = strcmp(action, "list") == 0, show = strcmp(action, "show") == 0,
         retry = strcmp(action, "retry") == 0, purge = strcmp(action, "purge") == 0;
    if ((!list && !show && !retry && !purge) || (show && noperands != 1) ||
        ((list || purge) && noperands != 0) || (purge && o.before == NULL) ||
        (retry && noperands > 0 && o.class != NULL)) {
        fprintf(stderr, "ces2pg: dead-letters wants list, show ID, retry [--class C | ID...] or "
                        "purge --before TIME\nTry 'ces2pg --help'.\n");
        return EXIT_USAGE;
    }
    ces_config_t *config = load_config(o.config_path, CES_CONFIG_REPLAY);
    if (config == NULL)
        return EXIT_CONFIG;
    char err[1024];
    ces_inspect_options_t io = {config->pg_conninfo,           config->pg_password,
                                config->schema_metadata,       config->apply_version_column,
                                config->kafka_group_id,        config->pg_token};
    ces_inspect_t *inspect = ces_inspect_open(&io, err, sizeof(err));
    rc = 1;
    if (inspect == NULL) {
        print_error("dead-letters", err);
    } else if (retry) {
        rc = retry_dead_letters(config, inspect, &o, operands, noperands);
    } else if (show) {
        int64_t id = parse_id(operands[0]);
        int found = id < 0 ? -2 : ces_admin_show(inspect, id, o.json, stdout, err, sizeof(err));
        rc = found == 0 ? 0 : found == -2 ? EXIT_USAGE : 1;
        if (found == 1)
            fprintf(stderr, "ces2pg: no dead letter has id %lld\n", (long long)id);
        else if (found == -1)
            print_error("dead-letters show", err);
    } else {
        int done = list ? ces_admin_list(inspect, o.class, o.table, o.json, stdout, err, sizeof(err))
                        : ces_admin_purge(inspect, o.before, stdout, err, sizeof(err));
        rc = done == 0 ? 0 : 1;
        if (done != 0) {
            char what[32];
            snprintf(what, sizeof(what), "dead-letters %s", action);
            print_error(what, err);
        }
    }
    ces_inspect_close(inspect);
    release_config(config);
    return rc;
}

static int run_status(int argc, char **argv) {
    command_options_t o;
    int rc = parse_command(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (optind < argc) {
        fprintf(stderr, "ces2pg: unexpected argument '%s'\nTry 'ces2pg --help'.\n", argv[optind]);
        return EXIT_USAGE;
    }
    ces_config_t *config = load_config(o.config_path, CES_CONFIG_DAEMON);
    if (config == NULL)
        return EXIT_CONFIG;
    ces_admin_status_options_t so = {o.json, o.stale_after_s, o.max_lag};
    rc = (int)ces_admin_status(config, &so, stdout, stderr);
    release_config(config);
    return rc;
}

/* ces2pg adopt -c FILE (--table SCHEMA.TABLE ... | --all) --lsn LSN */
static int run_adopt(int argc, char **argv) {
    command_options_t o;
    int rc = parse_command(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (optind < argc || o.lsn == NULL || (o.ntables > 0) == o.all) {
        fprintf(stderr, "ces2pg: adopt wants --lsn LSN and either --table SCHEMA.TABLE (as often "
                        "as needed) or --all\nTry 'ces2pg --help'.\n");
        return EXIT_USAGE;
    }
    ces_lsn_t lsn;
    if (ces_lsn_parse_operator(o.lsn, &lsn) != 0) {
        fprintf(stderr, "ces2pg: adopt: '%s' is not an LSN as SQL Server prints it "
                        "(0x0000002A000001F00003, or 0000002A:000001F0:0003)\n", o.lsn);
        return EXIT_USAGE;
    }
    ces_config_t *config = load_config(o.config_path, CES_CONFIG_REPLAY);
    if (config == NULL)
        return EXIT_CONFIG;
    if (!config->apply_lsn_guard) {
        fprintf(stderr, "ces2pg: adopt: %s: apply.lsn_guard is off, so no version is compared and "
                        "adopting changes nothing\n", o.config_path);
        release_config(config);
        return EXIT_CONFIG;
    }
    rc = ces_admin_adopt(config, o.tables, o.ntables, lsn, stdout, stderr);
    release_config(config);
    return rc;
}

/*
 * Every command holds the PostgreSQL password or the Event Hubs key in its memory, which a core
 * dump would write to disk for anyone who may read dumps. Not dumpable also keeps other processes
 * of the same user from attaching to this one. CES2PG_CORE_DUMPS=1 keeps the kernel's default, to
 * debug a crash (systemd's unit sets LimitCORE=0 as well).
 */
static void forbid_core_dumps(void) {
    const char *keep = getenv("CES2PG_CORE_DUMPS");
    if (keep != NULL && strcmp(keep, "1") == 0)
        return;
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        fprintf(stderr, "ces2pg: warning: core dumps stay on: prctl: %s\n", strerror(errno));
}

int main(int argc, char **argv) {
    forbid_core_dumps();
    /* librdkafka's threads would each get a malloc arena of their own; two keep the footprint of
     * a backlog from multiplying. MALLOC_ARENA_MAX, glibc's own variable, overrides it. */
    if (getenv("MALLOC_ARENA_MAX") == NULL)
        mallopt(M_ARENA_MAX, 2);
    if (argc > 1 && strcmp(argv[1], "dead-letters") == 0) {
        install_signals(false);
        return run_dead_letters(argc, argv);
    }
    if (argc > 1 && strcmp(argv[1], "status") == 0)
        return run_status(argc, argv);
    if (argc > 1 && strcmp(argv[1], "adopt") == 0)
        return run_adopt(argc, argv);
    enum { OPT_CHECK_CONFIG = 1000, OPT_CAPTURE, OPT_CAPTURE_LAYOUT, OPT_FETCH_TOKENS };
    static const struct option options[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
        {"fetch-tokens", no_argument, NULL, OPT_FETCH_TOKENS},
        {"capture", no_argument, NULL, OPT_CAPTURE},
        {"capture-layout", required_argument, NULL, OPT_CAPTURE_LAYOUT},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *layout = NULL;
    bool check = false, capture = false, fetch_tokens = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:Vh", options, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case OPT_CHECK_CONFIG: check = true; break;
        case OPT_FETCH_TOKENS: fetch_tokens = true; break;
        case OPT_CAPTURE: capture = true; break;
        case OPT_CAPTURE_LAYOUT: layout = optarg; capture = true; break;
        case 'V': printf("ces2pg %s\n", CES2PG_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "Try 'ces2pg --help'.\n");
            return EXIT_USAGE;
        }
    }
    bool replay = optind < argc && strcmp(argv[optind], "replay") == 0;
    if (replay)
        optind++;
    if (config_path == NULL) {
        fprintf(stderr, "ces2pg: a configuration file is required (-c FILE)\nTry 'ces2pg --help'.\n");
        return EXIT_USAGE;
    }
    if (replay && check) {
        fprintf(stderr, "ces2pg: --check-config does not go with replay\n");
        return EXIT_USAGE;
    }
    char why[512];
    if (capture && (!replay || (layout != NULL && ces_capture_check_layout(layout, why,
                                                                          sizeof(why)) != 0))) {
        fprintf(stderr, "ces2pg: %s\nTry 'ces2pg --help'.\n",
                replay ? why : "--capture and --capture-layout go with replay only");
        return EXIT_USAGE;
    }
    if (replay && optind >= argc) {
        fprintf(stderr, "ces2pg: replay needs at least one PATH\nTry 'ces2pg --help'.\n");
        return EXIT_USAGE;
    }
    if (!replay && optind < argc) {
        fprintf(stderr, "ces2pg: unexpected argument '%s'\nTry 'ces2pg --help'.\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (fetch_tokens && !check) {
        fprintf(stderr, "ces2pg: --fetch-tokens goes with --check-config\nTry 'ces2pg --help'.\n");
        return EXIT_USAGE;
    }
    if (check)
        return check_config(config_path, fetch_tokens);
    install_signals(!replay);
    if (replay)
        return run_replay(config_path, argv + optind, (size_t)(argc - optind), capture, layout);
    return run_daemon(config_path);
}
