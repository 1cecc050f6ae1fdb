/*
 * event: a decoded CES row change and the values it is made of.
 *
 * Every pointer in these structs refers to memory in the arena that the decoder was given; the
 * event lives exactly as long as that arena.
 */
#ifndef CES_EVENT_H
#define CES_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/arena.h"

/* A commit LSN "VLF:block:slot" as the number (VLF << 48) | (block << 16) | slot (docs/ces-format.md, "Commit LSN, order and version"). It is
 * 80 bits wide, so it is kept as two words compared high first. */
typedef struct {
    uint32_t high; /* VLF */
    uint64_t low;  /* (block << 16) | slot */
} ces_lsn_t;

/* An event's version: the total order of row changes, (commit LSN, sequence number inside the
 * transaction). */
typedef struct {
    ces_lsn_t commit_lsn;
    uint64_t sequence;
} ces_version_t;

typedef enum {
    CES_OP_INSERT = 1,
    CES_OP_UPDATE = 2,
    CES_OP_DELETE = 3,
} ces_op_t;

/* A column as announced in eventsource.cols: source name and SQL Server type text. */
typedef struct {
    const char *name;
    const char *type; /* e.g. "nvarchar(50)", "datetime2(7)", "decimal(10,2)" */
    /* strlen of each: the decoder knows them, so copies need not measure again. Both at most
     * CES_DECODE_MAX_NAME_BYTES (the decoder rejects longer ones), so 32 bits keep the array small
     * (held events carry it). */
    uint32_t name_len;
    uint32_t type_len;
} ces_column_t;

/* One named value of a row image or of pkkey. A column absent from the image is simply not in the
 * array (unchanged); is_null means SQL NULL. */
typedef struct {
    const char *name;
    const char *value; /* NUL-terminated text; NULL when is_null */
    size_t value_len;
    uint32_t name_len; /* strlen(name), as for ces_column_t */
    bool is_null;
} ces_field_t;

typedef struct {
    ces_op_t op;
    const char *id;
    const char *logicalid;
    const char *time; /* envelope commit time (UTC); may be NULL */
    const char *db;
    const char *schema;
    const char *table;
    ces_version_t version; /* (commit LSN, sequence): the event's place in source order */
    ces_column_t *cols;
    size_t ncols;
    ces_field_t *pkkey;
    size_t npkkey;
    ces_field_t *old;
    size_t nold;
    ces_field_t *current;
    size_t ncurrent;
    /* In a compact copy (ces_event_copy_new), the names that make the event's shape, packed in
     * one run with their NULs: every column's name and type, then the field names of pkkey,
     * current and old. NULL elsewhere. */
    const char *shape;
    size_t shape_len;
    /* A table rule's choice of columns was made on it (apply/columns.h): a retried batch must not
     * make it twice. */
    bool shaped;
} ces_event_t;

/* Parses "VLF:block:slot" (1-8, 1-8 and 1-4 hex digits). Returns 0, or -1 when malformed. */
int ces_lsn_parse(const char *text, size_t len, ces_lsn_t *lsn);
/* Parses the 20 hex digits of a logicalid's LSN part (8 + 8 + 4, no separators). */
int ces_lsn_parse_compact(const char *text, size_t len, ces_lsn_t *lsn);
/* Parses an LSN as SQL Server prints it for an operator: "0x" and 20 hex digits (binary(10), as
 * sys.fn_cdc_get_max_lsn returns it) or "VLF:block:slot" (as CES writes commitlsn and
 * sys.dm_db_log_stats its log_end_lsn). Nothing else: no spaces, no other prefix. Returns 0, or
 * -1 when malformed. */
int ces_lsn_parse_operator(const char *text, ces_lsn_t *lsn);
/* <0, 0, >0 as a is before, at or after b. Inline: the orderer compares LSNs in its search for
 * every event's transaction. */
static inline int ces_lsn_compare(ces_lsn_t a, ces_lsn_t b) {
    if (a.high != b.high)
        return a.high < b.high ? -1 : 1;
    if (a.low != b.low)
        return a.low < b.low ? -1 : 1;
    return 0;
}
/* Writes "VVVVVVVV:BBBBBBBB:SSSS" (22 characters and a NUL) into buf. */
void ces_lsn_format(ces_lsn_t lsn, char buf[23]);

int ces_version_compare(const ces_version_t *a, const ces_version_t *b);

/* Writes the version as one decimal number ordered like (commit LSN, sequence): the LSN as an
 * integer followed by the sequence in 20 digits. This is what the per-row version column holds. */
void ces_version_format(const ces_version_t *version, char *buf, size_t size);

/* Writes the highest version any change committed at lsn can have (the LSN followed by twenty
 * nines, above every sequence number): a row marked with it loses to every change committed after
 * lsn and wins against every change committed at or before it. */
void ces_version_ceiling(ces_lsn_t lsn, char *buf, size_t size);

const char *ces_op_name(ces_op_t op);

/* Copies event and everything it points to (its shape in one run, see ces_event_t) into a new
 * arena of one allocation, with room for
 * extra more bytes (the caller's, e.g. the record the event came from): decoding leaves the JSON
 * trees behind in its own arena, several times the size of the event itself. Returns the arena
 * (owned by the caller, who frees the copy with it), or NULL when out of memory. */
ces_arena_t *ces_event_copy_new(const ces_event_t *event, size_t extra, ces_event_t *copy);

/* Returns the field named name (exact match), or NULL. */
const ces_field_t *ces_fields_find(const ces_field_t *fields, size_t count, const char *name);

/* Writes a stable, line-oriented text form of event (golden files, debugging). Values are printed
 * with C-style escapes so that every byte is visible; names and types as far as their lengths
 * say (a length that disagrees with the text shows). */
void ces_event_dump(const ces_event_t *event, FILE *out);

/* Parses an envelope time "YYYY-MM-DDTHH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]" (no zone: UTC, as
 * CES writes it) to seconds since the epoch. Returns 0, or -1 when malformed (it is untrusted). */
int ces_event_parse_time(const char *text, double *seconds);

#endif
