/*
 * writer: one writer per stream in transaction order, the others warm standbys.
 *
 * Transaction order promises that a source transaction becomes visible whole, which holds only if
 * one instance applies all of a group's partitions. PostgreSQL, where exactly-once already lives,
 * is the arbiter: a row per group in the metadata schema's `writers` table names the writer, its
 * epoch (raised at every takeover) and when it last renewed its lease (PostgreSQL's clock, so that
 * no two hosts' clocks are compared), and the writer holds a session advisory lock besides.
 *
 * - A standby takes the role when the writer's lease ran out (a writer frozen with its sockets
 *   open, SIGSTOP, a paused VM), or at once when it gets the advisory lock the writer held (the
 *   writer's session is gone: kill -9, a crash, a lost connection), or when the writer gave it up
 *   (a clean stop).
 * - Every batch the writer commits checks, in its own transaction, that the row still names it
 *   with its epoch (apply sets that up: positions.h): a writer that lost the role can commit
 *   nothing more, whatever it still holds in memory, and the fenced positions stay the backstop.
 * - The writer renews on a session of its own; when it cannot for most of a lease, it stops
 *   applying before a standby may start (the daemon steps down).
 * See docs/semantics.md, "High availability", for why this is safe.
 */
#ifndef CES_WRITER_H
#define CES_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/token.h"

typedef struct ces_writer_s ces_writer_t;

typedef struct {
    const char *conninfo;
    const char *password;              /* may be NULL (a secret) */
    ces_token_source_t password_token; /* instead of password when its fetch is set */
    const char *metadata_schema;       /* unquoted */
    const char *version_column;        /* for the metadata schema's set-up */
    const char *group_id;
    const char *holder; /* this instance's name in the row and in messages */
    int64_t lease_ms;
} ces_writer_options_t;

typedef enum {
    CES_WRITER_STANDBY = 0, /* another instance writes (or the role was lost) */
    CES_WRITER_WRITER,      /* this instance writes */
    CES_WRITER_UNKNOWN,     /* PostgreSQL could not be asked (errstr says why) */
} ces_writer_role_t;

/* Copies the options' strings; connects nothing yet. NULL when out of memory. Owned by the caller
 * (ces_writer_destroy, which closes its session and with it the advisory lock). */
ces_writer_t *ces_writer_new(const ces_writer_options_t *options)
    __attribute__((warn_unused_result));
void ces_writer_destroy(ces_writer_t *writer); /* accepts NULL */

/* A standby asks for the role (connecting when needed). */
ces_writer_role_t ces_writer_try(ces_writer_t *writer, char *errstr, size_t errstr_size);

/* The writer renews its lease. STANDBY: the role was lost (another instance took it over). */
ces_writer_role_t ces_writer_renew(ces_writer_t *writer, char *errstr, size_t errstr_size);

/* The writer gives the role up at once (a clean stop, a step down): a standby may take it without
 * waiting for the lease. Best effort. */
void ces_writer_release(ces_writer_t *writer);

/* This instance stops: its line in `status`'s list of instances goes. Best effort. */
void ces_writer_leave(ces_writer_t *writer);

/* The epoch this instance writes under (0 before it ever wrote). */
int64_t ces_writer_epoch(const ces_writer_t *writer);

/* The reorder window (ms) stored with the stream's last commit when this instance took the role;
 * -1 when none was stored. */
int64_t ces_writer_window_ms(const ces_writer_t *writer);

/* The writer as last seen (by ces_writer_try): its name and since when, in text for messages
 * ("host-1/4242 since 2026-12-07 18:00:00+00"); "" when none was seen. */
const char *ces_writer_seen(const ces_writer_t *writer);

#endif
