/*
 * sender: one attempt's row changes, as statements in libpq's pipeline.
 *
 * Row changes go in bulk (bulk.h gathers them into one statement per table and kind) unless the
 * attempt asks for one statement per change; a change that moves its row's key goes row by row,
 * after whatever waits for either key. Statements are prepared once per connection (prepared.h)
 * and sent through the attempt's pipeline (inflight.h), which reads their results.
 *
 * Every function that returns int returns 0, or -1 after recording the error in the attempt's
 * error record (the pipeline's); once it holds an error the attempt must be rolled back.
 */
#ifndef CES_SENDER_H
#define CES_SENDER_H

#include <stdbool.h>
#include <stdint.h>

#include "apply/catalog.h"
#include "apply/inflight.h"
#include "apply/metadata.h"
#include "apply/prepared.h"
#include "order/batch.h"

typedef struct ces_sender_s ces_sender_t;

typedef struct {
    ces_inflight_t *inflight;       /* reference: the attempt's pipeline and error record */
    ces_prepared_t *prepared;       /* reference */
    const ces_metadata_t *metadata; /* reference: names */
    bool bulk;          /* gather row changes into bulk statements (off: row by row) */
    bool plain_inserts; /* send INS of new keys as plain INSERTs (off after a taken key) */
    uint64_t attempt;   /* the attempt's number, for the tables' plain-INSERT policy */
} ces_sender_options_t;

/* Returns a sender for one attempt, or NULL when out of memory. Owned by the caller; batch items
 * and tables given to it must outlive it, and it must be destroyed before its pipeline. */
ces_sender_t *ces_sender_new(const ces_sender_options_t *options)
    __attribute__((warn_unused_result));
/* Accepts NULL. */
void ces_sender_destroy(ces_sender_t *sender);

/* Sends the change of batch item idx to its target table (owned by the catalog). An event that
 * cannot be applied (it lacks a key value) is not sent: *reject says why. */
int ces_sender_event(ces_sender_t *sender, long idx, ces_item_t *item, ces_catalog_table_t *table,
                     ces_reject_t *reject) __attribute__((warn_unused_result));
/* Sends every gathered bulk statement. */
int ces_sender_flush_bulk(ces_sender_t *sender) __attribute__((warn_unused_result));

#endif
