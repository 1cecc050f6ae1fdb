/*
 * ledger: what a batch's transaction records besides its row changes.
 *
 * The dead letters (a new row, or with `dead-letters retry` the new reason of the rows an event
 * was retried from), the fenced positions, the source gaps they move past, and the group's
 * progress (or, retrying, the removal of the dead letters that applied). Everything goes through
 * the attempt's pipeline (inflight.h), in the statements metadata.h and positions.h spell.
 *
 * Every function returns 0, or -1 after recording the error in inflight's error record.
 */
#ifndef CES_LEDGER_H
#define CES_LEDGER_H

#include <stdbool.h>

#include "apply/inflight.h"
#include "apply/metadata.h"
#include "apply/positions.h"
#include "order/batch.h"

/* Sends the dead letter of batch item idx: a new row, or with retrying (`dead-letters retry`) the
 * new reason of the rows it was retried from. */
int ces_ledger_dead_letter(ces_inflight_t *inflight, const ces_metadata_t *metadata, long idx,
                           const ces_item_t *item, bool retrying)
    __attribute__((warn_unused_result));

/* Sends the writer's check without renewal (positions.h), for a streamed transaction's parts: a
 * writer that lost its role stops there instead of holding its rows locked to the end. */
int ces_ledger_writer_check(ces_inflight_t *inflight, const ces_positions_t *positions)
    __attribute__((warn_unused_result));

/* Sends what the batch's transaction records besides its changes: the fenced positions, the
 * source gaps they move past, and the group's progress (or, retrying, the removal of the dead
 * letters that applied). */
int ces_ledger_positions(ces_inflight_t *inflight, const ces_metadata_t *metadata,
                         const ces_positions_t *positions, const ces_batch_t *batch)
    __attribute__((warn_unused_result));

#endif
