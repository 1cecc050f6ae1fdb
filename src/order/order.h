/*
 * order: source transactions waiting to be applied in commit order.
 *
 * In transaction mode, decoded events are grouped by commit LSN. The pipeline decides when the
 * oldest transaction is complete (every owned partition has passed its LSN, or is caught up and
 * quiet) and pops it whole, its events in sequence order, so that a PostgreSQL reader never sees
 * part of a source transaction. A small window of recently committed positions recognises resent
 * duplicates.
 */
#ifndef CES_ORDER_H
#define CES_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "order/batch.h"

typedef struct ces_order_s ces_order_t;

/* dedup_window: how many committed positions are remembered to recognise duplicates. */
ces_order_t *ces_order_new(size_t dedup_window);
/* Frees every held item. Accepts NULL. */
void ces_order_destroy(ces_order_t *order);

typedef enum {
    CES_ORDER_HELD,
    CES_ORDER_DUPLICATE, /* the same position is held or was committed recently: item freed */
    CES_ORDER_NOMEM,
} ces_order_status_t;

/* Takes an event item (its arena). */
ces_order_status_t ces_order_add(ces_order_t *order, const ces_item_t *item);

/* The oldest held transaction, its number of events and the bytes they hold (either may be NULL):
 * false when nothing is held. */
bool ces_order_oldest(const ces_order_t *order, ces_lsn_t *lsn, size_t *events, size_t *bytes);

/* Moves the oldest transaction's items, in sequence order, to the end of batch. Items already
 * committed (recently seen positions) are freed instead. Returns the number moved, -1 when
 * out of memory. */
long ces_order_pop_oldest(ces_order_t *order, ces_batch_t *batch);

/* While batch is being applied (sent, not yet committed), resent copies of its events are
 * duplicates too: remembers its positions until ces_order_clear_in_flight. Returns 0, or -1 when
 * out of memory (nothing remembered). */
int ces_order_set_in_flight(ces_order_t *order, const ces_batch_t *batch);
void ces_order_clear_in_flight(ces_order_t *order);

/* Remembers the positions of the committed event items of batch (for duplicate detection). */
void ces_order_committed(ces_order_t *order, const ces_batch_t *batch);

/* Lowest offset held for (topic, partition); false when none. */
bool ces_order_min_offset(ces_order_t *order, const char *topic, int32_t partition,
                          int64_t *offset);

/*
 * Drops the held events whose records all came from sources pred picks (the partitions being
 * revoked), and returns how many; transactions left empty go. When an event joined from segments
 * mixes such records with others, drops nothing and returns -1 (the caller goes back to the stored
 * positions instead). The transactions' other events stay held: their partitions are still ours.
 */
long ces_order_drop_sources(ces_order_t *order, ces_source_pred_t pred, void *arg);

/* Drops everything held and forgets the positions sent and recently committed (after a rewind:
 * PostgreSQL's stored positions are then the truth, and a commit it acknowledged may be lost, as
 * with synchronous_commit = off and a crash; what is read again must not be skipped as a
 * duplicate). */
void ces_order_reset(ces_order_t *order);

size_t ces_order_pending_events(const ces_order_t *order);
/* Memory of the held events (ces_item_bytes: their arenas and items). */
size_t ces_order_pending_bytes(const ces_order_t *order);
size_t ces_order_pending_transactions(const ces_order_t *order);
uint64_t ces_order_duplicates(const ces_order_t *order);

#endif
