/*
 * daemon: the daemon's wiring. Builds the stages (decoder, apply, pipeline) from the configuration,
 * and runs the loop with its hooks: liveness and systemd's watchdog, SIGHUP reloads, /metrics,
 * readiness, the progress line, STOPPING=1.
 *
 * main.c keeps the command line, the signal handlers and the exit codes: this module reads the
 * flags the handlers set, returns a status that main.c turns into an exit code, and never exits.
 * Replay and the retry of dead letters build their stages here too, so that they run the daemon's
 * path.
 */
#ifndef CES_DAEMON_H
#define CES_DAEMON_H

#include <signal.h>
#include <stdbool.h>

#include "apply/apply.h"
#include "conf/config.h"
#include "format/decode.h"
#include "pipeline/pipeline.h"
#include "tokens.h"

typedef enum {
    CES_DAEMON_OK = 0,     /* stopped by a signal (what was complete is applied) */
    CES_DAEMON_FAILED,     /* out of memory, PostgreSQL or Kafka failed for good: logged */
    CES_DAEMON_CONFIG,     /* the consumer rejected the configuration: logged */
    CES_DAEMON_SOURCE_GAP, /* a gap at the source stopped it (kafka.on_source_gap = "stop") */
} ces_daemon_status_t;

/* The flags main.c's signal handlers set (references: they must outlive the run). */
typedef struct {
    volatile sig_atomic_t *stop;   /* a graceful stop was asked for */
    volatile sig_atomic_t *reload; /* SIGHUP: read the file again; the daemon clears it */
} ces_daemon_signals_t;

/* The decoder's limits from the decode.* keys. */
void ces_daemon_decode_limits(const ces_config_t *config, ces_decode_limits_t *limits);

/* The pipeline's options from the configuration; store_positions is false where positions are not
 * stored (replay, retry). The options refer to config's lists: config must outlive them. */
void ces_daemon_pipeline_options(const ces_config_t *config, bool store_positions,
                                 ces_pipeline_options_t *options);

/* A new apply stage from the postgres.*, schema.* and apply.* keys; its retries give up when
 * *stop_now is set (reference). config must outlive it. NULL when out of memory; owned by the
 * caller (ces_apply_destroy). */
ces_apply_t *ces_daemon_apply_new(const ces_config_t *config, volatile sig_atomic_t *stop_now);

/*
 * Runs the daemon on config, loaded from path (reference: left as it is, and it must outlive the
 * call; path is read again on SIGHUP): connects to PostgreSQL, joins the consumer group, and runs
 * the loop until a stop signal or a failure, logging what happens. Returns how it ended.
 */
ces_daemon_status_t ces_daemon_run(const char *path, ces_config_t *config, ces_tokens_t *tokens,
                                   const ces_daemon_signals_t *signals);

#endif
