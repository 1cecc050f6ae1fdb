/*
 * bulk: row changes gathered into statements of many rows.
 *
 * Row changes of one table with the same shape (upserts of one column list, or deletes) are
 * gathered and sent as one statement whose parameters are arrays, one per column, read with
 * unnest(): PostgreSQL plans and executes once for up to CES_BULK_MAX_ROWS rows instead of once
 * per row, which is most of its cost for small rows.
 *
 * Only the order of changes to one key matters (different keys, or tables, commute inside one
 * transaction). So the n-th change of a key in a batch goes to a group of generation n, and groups
 * are sent generation after generation: the changes of every key keep their order, however the
 * groups are cut. After CES_BULK_MAX_GENERATIONS changes of one key everything waiting is sent. A
 * bulk statement that PostgreSQL rejects as bad data cannot say which row was bad: the batch is
 * then retried row by row, where the row is found and dead-lettered.
 *
 * An INS whose key has no earlier change waiting goes as a plain INSERT, without ON CONFLICT: its
 * key is almost always new, and PostgreSQL's speculative insertion (ON CONFLICT) costs about two
 * thirds more than inserting. When the key is taken after all (a resent event, rows loaded before
 * ces2pg, a replay), the INSERT fails with ERRCODE_UNIQUE_VIOLATION and the batch is retried with
 * upserts, which do what they always did; so a plain INSERT never decides an outcome, it only saves
 * work when it succeeds. The table then sends upserts only for a while (ces_catalog_insert_taken),
 * so that a table whose keys keep being taken costs little.
 *
 * This module gathers and encodes; it does not talk to PostgreSQL. A full group is handed, with its
 * parameters in PostgreSQL's binary text[] format, to the send callback its owner gave.
 */
#ifndef CES_BULK_H
#define CES_BULK_H

#include <stdbool.h>
#include <stddef.h>

#include "order/batch.h"
#include "apply/catalog.h"

#define CES_BULK_MAX_ROWS 1000
#define CES_BULK_MAX_BYTES (4u << 20)
#define CES_BULK_MAX_GENERATIONS 8

/* What a statement does; its letter starts the statement's signature. */
typedef enum {
    CES_BULK_ROW_UPSERT = 'U', /* one row, with ON CONFLICT */
    CES_BULK_ROW_DELETE = 'D',
    CES_BULK_ROW_HISTORY = 'H', /* one change appended to a history table */
    CES_BULK_UPSERT = 'u', /* many rows, with ON CONFLICT */
    CES_BULK_INSERT = 'i', /* many rows, without */
    CES_BULK_DELETE = 'd',
    CES_BULK_HISTORY = 'h', /* many changes appended to a history table */
} ces_bulk_kind_t;

/* The room ces_bulk_signature needs for a statement on n columns. */
#define CES_BULK_SIGNATURE_SIZE(n) (16 + (size_t)(n) * 12)

/* Grows *buf (of *capacity bytes, the caller's, realloc'd) to hold a signature on n columns.
 * Returns 0, or -1 when out of memory (*buf unchanged). */
int ces_bulk_reserve_signature(char **buf, size_t *capacity, size_t n);

/* Writes the signature that names a statement (its kind, table and column list) into buf, which
 * must hold CES_BULK_SIGNATURE_SIZE(n) bytes, and returns its length (not NUL-terminated). Equal
 * signatures mean equal statement text. */
size_t ces_bulk_signature(char *buf, size_t size, ces_bulk_kind_t kind, unsigned table_id,
                          const long *cols, size_t n);

/* One gathered statement, as handed to the send callback. Every pointer is a reference, valid only
 * during the call. */
typedef struct {
    ces_bulk_kind_t kind;       /* CES_BULK_UPSERT, _INSERT, _DELETE or _HISTORY */
    ces_catalog_table_t *table; /* owned by the catalog */
    const char *sig;
    size_t sig_len;
    const long *cols; /* upserts, inserts, history: target columns of the values, sorted */
    size_t ncols;     /* for a delete, the key columns (cols is then unused) */
    int nparams;
    const char *const *values; /* one binary text[] per parameter */
    const int *lengths;
    const int *formats;
} ces_bulk_statement_t;

/* Sends stmt. Returns 0, or -1 after recording why (the callback's owner keeps the error). */
typedef int (*ces_bulk_send_t)(void *opaque, const ces_bulk_statement_t *stmt);

typedef enum {
    CES_BULK_OK = 0,
    CES_BULK_NOMEM,
    CES_BULK_SEND_FAILED, /* the send callback failed and recorded why */
} ces_bulk_status_t;

typedef struct ces_bulk_s ces_bulk_t;

/* Returns an empty gatherer that sends through send, or NULL when out of memory. Owned by the
 * caller. */
ces_bulk_t *ces_bulk_new(ces_bulk_send_t send, void *opaque) __attribute__((warn_unused_result));
/* Drops what is gathered, unsent. Accepts NULL. */
void ces_bulk_destroy(ces_bulk_t *bulk);

/*
 * Adds one change of item to its group: of its kind and shape, and of the generation after the
 * key's last change in the batch. values[0..n) and lengths[0..n) are its values (NULL: SQL NULL;
 * for a delete the key columns in key order, with cols NULL); key_slots[k] is the value slot of
 * key column k. plain_insert: an upsert whose key has no earlier change waiting may go as a plain
 * INSERT (the event is an INS and the table's policy allows it). The values are referenced until
 * sent: they must live as long as item's arena. May send groups (full ones, or all of them before
 * a key's next generation would exceed the limit). A history row (CES_BULK_HISTORY) has
 * CES_CATALOG_HISTORY_NVALUES values of its own before the columns' (its version first); they
 * too must live as long as item's arena, and it has no key_slots (NULL): history rows never
 * meet, so all go to the first generation.
 */
ces_bulk_status_t ces_bulk_add(ces_bulk_t *bulk, ces_bulk_kind_t kind, ces_item_t *item,
                               ces_catalog_table_t *table, const long *cols, size_t n,
                               const char *const *values, const int *lengths,
                               const size_t *key_slots, bool plain_insert)
    __attribute__((warn_unused_result));

/* Sends every group, generation after generation: before a change that must follow their rows,
 * and at the batch's end. */
ces_bulk_status_t ces_bulk_flush(ces_bulk_t *bulk) __attribute__((warn_unused_result));

#endif
