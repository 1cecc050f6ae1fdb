/*
 * metadata: ces2pg's own schema in the target database (apply.metadata_schema, "ces2pg").
 *
 * It holds offsets (the consumer positions, fenced: positions.h), dead_letters (what could not be
 * applied, with the record's bytes), tombstones (the versions of deleted keys, so that an older
 * change resent late cannot bring a row back; see docs/semantics.md), source_gaps (stored
 * positions that were gone from the broker, and where reading resumed: positions.h), progress
 * (per group, the last commit applied and the reorder window in force, for `ces2pg status`) and
 * adoptions (tables loaded by another tool and marked with a snapshot's LSN: adopt.h). The DDL is
 * idempotent and
 * tolerates another instance running it at the same moment; it runs on every new connection.
 */
#ifndef CES_METADATA_H
#define CES_METADATA_H

#include "apply/pgerr.h"
#include "apply/session.h"

typedef struct ces_metadata_s ces_metadata_t;

/* Copies schema (the metadata schema's name) and version_column (the per-row version column's
 * name). Returns NULL when out of memory. Owned by the caller. */
ces_metadata_t *ces_metadata_new(const char *schema, const char *version_column)
    __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_metadata_destroy(ces_metadata_t *metadata);

/* Quotes the names for session's connection and creates the schema and its tables. Returns 0, or
 * -1 with e set. */
int ces_metadata_setup(ces_metadata_t *metadata, ces_session_t *session, ces_pgerr_t *e)
    __attribute__((warn_unused_result));

/* A session of an operator command's own (no retry, no heartbeat) whose every connection sets the
 * metadata schema up, connected once, with password or, when password_token (may be NULL) has a
 * fetch, a token from it. Returns it (owned by the caller; metadata and password_token's opaque
 * are references that must outlive it), or NULL with errstr set. */
ces_session_t *ces_metadata_connect(ces_metadata_t *metadata, const char *conninfo,
                                    const char *password,
                                    const ces_token_source_t *password_token, char *errstr,
                                    size_t errstr_size)
    __attribute__((warn_unused_result));

/* Names quoted for SQL, and the dead-letter INSERT; NULL before the first ces_metadata_setup.
 * Each is owned by metadata and valid until the next setup or destroy. */
const char *ces_metadata_schema_quoted(const ces_metadata_t *metadata);  /* "ces2pg" */
const char *ces_metadata_tombstones(const ces_metadata_t *metadata);     /* "ces2pg".tombstones */
const char *ces_metadata_version_quoted(const ces_metadata_t *metadata); /* "_ces_lsn" */
/* INSERT INTO <schema>.dead_letters with parameters $1 topic, $2 partition, $3 offset, $4 reason,
 * $5 logicalid, $6 payload (binary), $7 class (ces_dl_class_name), $8 source table ("schema.table",
 * NULL when the record was not decoded). */
const char *ces_metadata_dead_letter_sql(const ces_metadata_t *metadata);
/* A retried dead letter that failed again keeps its row with the new reason: $1 reason, $2 class,
 * $3 source table (NULL keeps the old), $4 the ids (bigint[] text). */
const char *ces_metadata_dead_letter_again_sql(const ces_metadata_t *metadata);
/* Retried dead letters that applied leave the table: $1 the ids (bigint[] text). */
const char *ces_metadata_dead_letters_retired_sql(const ces_metadata_t *metadata);
/* The group's progress, one row per group: $1 group, $2 last commit LSN applied, $3 its commit
 * time (seconds since the epoch; NULL keeps the old), $4 the reorder window in force (ms). */
const char *ces_metadata_progress_sql(const ces_metadata_t *metadata);

#endif
