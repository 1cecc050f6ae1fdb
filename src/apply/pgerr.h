/*
 * pgerr: what a PostgreSQL error means for ces2pg, and the record of the first error of an attempt.
 *
 * SQLSTATEs carry PostgreSQL's own names (errcodes.txt, as pgbench.c spells them), so that no code
 * outside this header is a bare literal. Classifying one is pure: it needs the SQLSTATE and whether
 * the connection still works (PQstatus), no server, and never the message's wording. The outcome is
 * what the apply room does next: retry with backoff, dead-letter one change, reload a table, give
 * up, or retry the batch another way (the failure semantics are in docs/semantics.md).
 *
 * A failed connection is the one place where only text exists: libpq keeps no SQLSTATE of a
 * refused startup (PQgetResult then gives a result without PG_DIAG_SQLSTATE), and its own
 * failures (a bad option, a certificate) have none. Those are told by one table of texts
 * (ces_pgerr_connect_texts).
 */
#ifndef CES_PGERR_H
#define CES_PGERR_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

/* Single SQLSTATEs. */
#define ERRCODE_T_R_SERIALIZATION_FAILURE "40001"
#define ERRCODE_T_R_DEADLOCK_DETECTED "40P01"
#define ERRCODE_LOCK_NOT_AVAILABLE "55P03"
#define ERRCODE_ADMIN_SHUTDOWN "57P01"
#define ERRCODE_CRASH_SHUTDOWN "57P02"
#define ERRCODE_CANNOT_CONNECT_NOW "57P03"
#define ERRCODE_QUERY_CANCELED "57014"
#define ERRCODE_DIVISION_BY_ZERO "22012"
#define ERRCODE_UNIQUE_VIOLATION "23505"
#define ERRCODE_CARDINALITY_VIOLATION "21000"
#define ERRCODE_UNDEFINED_TABLE "42P01"
#define ERRCODE_UNDEFINED_COLUMN "42703"
#define ERRCODE_DUPLICATE_TABLE "42P07"
#define ERRCODE_DUPLICATE_SCHEMA "42P06"
#define ERRCODE_DUPLICATE_COLUMN "42701"
#define ERRCODE_DUPLICATE_OBJECT "42710"
#define ERRCODE_INSUFFICIENT_PRIVILEGE "42501"

/* SQLSTATE classes: the first two characters, shared by every code of the class. */
#define ERRCODE_CLASS_CONNECTION_EXCEPTION "08"
#define ERRCODE_CLASS_DATA_EXCEPTION "22"
#define ERRCODE_CLASS_INTEGRITY_CONSTRAINT_VIOLATION "23"
#define ERRCODE_CLASS_INSUFFICIENT_RESOURCES "53"
#define ERRCODE_CLASS_PROGRAM_LIMIT_EXCEEDED "54"
#define ERRCODE_CLASS_INVALID_TRANSACTION_STATE "25"
#define ERRCODE_CLASS_INVALID_AUTHORIZATION "28"
#define ERRCODE_CLASS_INVALID_CATALOG_NAME "3D"
#define ERRCODE_CLASS_SAVEPOINT_EXCEPTION "3B"
#define ERRCODE_CLASS_OPERATOR_INTERVENTION "57"
#define ERRCODE_CLASS_SYSTEM_ERROR "58"
#define ERRCODE_CLASS_CONFIG_FILE_ERROR "F0"
#define ERRCODE_CLASS_INTERNAL_ERROR "XX"

/* What an attempt must do next. The first six follow a failure (or its absence); the last two are
 * no failure of the batch but a change of strategy: the same batch is tried again another way. */
typedef enum {
    CES_PGERR_NONE = 0, /* nothing: the attempt succeeded */
    CES_PGERR_RETRY,    /* transient: roll back, back off, try again */
    CES_PGERR_DATA,     /* bad data in one change: dead-letter it (failed_item), try again */
    CES_PGERR_STALE,    /* the table changed underneath: forget cached tables, try again */
    CES_PGERR_FENCED,   /* another instance moved a stored position: give the batch up */
    CES_PGERR_FATAL,    /* cannot go on: stop */
    CES_PGERR_RETRY_ROW_BY_ROW,   /* a bulk statement hit bad data: row by row finds the change */
    CES_PGERR_RETRY_WITH_UPSERTS, /* a plain INSERT found its key taken: upserts instead (bulk.h) */
} ces_pgerr_action_t;

struct ces_catalog_table_s; /* catalog.h */

/* The first error of an attempt. Initialise with CES_PGERR_INIT. */
typedef struct ces_pgerr_s {
    ces_pgerr_action_t action;
    long failed_item; /* index into the batch, or -1 */
    bool in_commit;   /* the failure hit COMMIT: the outcome is unknown */
    bool in_ddl;      /* the failure was the DDL of failed_item's target table */
    bool stale_again; /* a table "changed underneath" so often at this change that it is the
                       * change's (a data error now: apply.c's stale_in_stream) */
    char sqlstate[6]; /* "" when PostgreSQL gave none */
    char message[512];
    struct ces_catalog_table_s *taken; /* CES_PGERR_RETRY_WITH_UPSERTS: reference to the table
                                        * of the plain INSERT (owned by the catalog) */
} ces_pgerr_t;

#define CES_PGERR_INIT {.failed_item = -1}

/* Records an error unless e already holds one: later errors are consequences of the first. The
 * message is cut to fit and loses trailing newlines and spaces. sqlstate may be NULL. */
void ces_pgerr_set(ces_pgerr_t *e, ces_pgerr_action_t action, long item, const char *sqlstate,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Records the error of res (NULL: of conn, e.g. a lost connection), classified as an error of
 * ces2pg's own statement (ces_pgerr_classify). */
void ces_pgerr_from_result(ces_pgerr_t *e, const PGconn *conn, const PGresult *res, long item);

/* The failed statement was one an event asked for (its row change, or the DDL of its target
 * table): an error that would stop ces2pg becomes the event's (CES_PGERR_DATA) unless it is about
 * ces2pg itself (ces_pgerr_classify_event). Other actions are kept. */
void ces_pgerr_blame_event(ces_pgerr_t *e);

/* Forgets the error: e is as CES_PGERR_INIT made it. */
void ces_pgerr_clear(ces_pgerr_t *e);

/* What follows a failed statement, by its SQLSTATE (NULL or "" when the server sent none). Without
 * a working connection, or without a SQLSTATE, every failure is worth a retry. */
ces_pgerr_action_t ces_pgerr_classify(const char *sqlstate, bool connection_ok);

/* Why an attempt that failed with e (CES_PGERR_RETRY or CES_PGERR_STALE) is retried, as the
 * retry counter's label says (one of CES_APPLY_RETRY_REASONS, apply.h): "connection" (lost, or a
 * server shutting down), "conflict" (serialization failure, deadlock), "timeout" (a lock or
 * statement timeout, a cancel), "resources" (class 53), "table_changed" (CES_PGERR_STALE). */
const char *ces_pgerr_retry_reason(const ces_pgerr_t *e);

/* The same for a statement an event asked for (its row change on a target table, or that table's
 * DDL): what is transient is retried and a stale description reloaded as above, but an error that
 * concerns ces2pg itself (its session or transaction: classes 25, 3B; its login and database: 28,
 * 3D; the server: 57 but for the retried codes, 58, F0, XX) stops it, and every other error
 * (classes 42 and 0A among them: a refused DDL, a privilege on the target table, a generated
 * column, a trigger that raises) is the event's: CES_PGERR_DATA. A 42501 can also be about
 * ces2pg's metadata schema (the version guard reads its tombstones): the caller checks. */
ces_pgerr_action_t ces_pgerr_classify_event(const char *sqlstate, bool connection_ok);

/* A text of libpq's message for a failed connection, and what a message holding it means. */
typedef struct {
    const char *text;
    ces_pgerr_action_t action;
} ces_pgerr_connect_text_t;

/* The one table of texts ces_pgerr_classify_connect_failure decides by; its length in *n. */
const ces_pgerr_connect_text_t *ces_pgerr_connect_texts(size_t *n);

/* What follows a failed connection attempt (PQstatus not CONNECTION_OK), from libpq's message: the
 * action of the first text of ces_pgerr_connect_texts it holds (a rejected login, a missing
 * database, a configuration libpq refuses: CES_PGERR_FATAL), else CES_PGERR_RETRY (a refused or
 * unreachable server, one starting up). */
ces_pgerr_action_t ces_pgerr_classify_connect_failure(const char *message);

/* True for the SQLSTATEs a session gets when another one ran the same idempotent DDL at the same
 * moment (IF NOT EXISTS does not stop two from trying): the DDL is done, by the other session. */
bool ces_pgerr_is_ddl_race(const char *sqlstate);

/* Errors of one change's data (or a plain INSERT's taken key): in a stream, only the step is
 * undone and sent again; the transaction goes on. */
bool ces_pgerr_undoes_only_the_step(ces_pgerr_action_t action);

#endif
