/*
 * partitions: the pipeline's table of partitions, what it knows of each (where it stands, whether
 * it is ours, how far its commits have come, whether it is caught up), below the stages that read
 * and write it (intake, release, flight) and the rebalance callbacks.
 *
 * Touched by the loop's thread only. Entries are made on first sight and stay until the table goes
 * (a revoked partition keeps its entry, not assigned).
 */
#ifndef CES_PARTITIONS_H
#define CES_PARTITIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "apply/positions.h"
#include "format/event.h"
#include "order/batch.h"
#include "util/map.h"

/* What the pipeline knows of one partition. */
typedef struct {
    char *topic; /* owned; items and offsets refer to it */
    int32_t partition;
    ces_partition_position_t pos; /* where it stands (positions.h) */
    bool assigned;      /* ours now: the orderer waits for it */
    bool has_frontier;
    ces_lsn_t frontier; /* highest commit LSN it delivered: it will not deliver older ones */
    bool at_eof;        /* caught up with the broker since its last record */
    int64_t eof_offset; /* where the end was when it was reached */
    int64_t last_record_ms;
    bool paused;
    /* Transactions up to this one were sent before the partition was assigned to us: its events of
     * them come from before we owned it, not late (has_late_floor). */
    bool has_late_floor;
    ces_lsn_t late_floor;
} ces_partition_t;

typedef struct ces_partitions_s ces_partitions_t;

/* An empty table, or NULL when out of memory. */
ces_partitions_t *ces_partitions_new(void);
/* Frees the table and every entry (references to entries and their topics die with it). Accepts
 * NULL. */
void ces_partitions_destroy(ces_partitions_t *table);

/* The entry of topic[partition], made when create and new (not assigned, nothing stored); NULL when
 * out of memory, or unknown and !create. The entry is the table's: valid until the table goes. */
ces_partition_t *ces_partitions_get(ces_partitions_t *table, const char *topic, int32_t partition,
                                    bool create);

/* Where a walk over the table stands: start it zeroed (ces_partitions_iter_t it = {0}). */
typedef ces_map_iter_t ces_partitions_iter_t;
/* The next entry of the walk, or NULL at the end. No entry may be made during the walk. */
ces_partition_t *ces_partitions_next(const ces_partitions_t *table, ces_partitions_iter_t *it);

/* The partition is ours no more (revoked, or given up with a consumer that goes): it is not
 * waited for, and its next owner starts from the stored position. */
void ces_partitions_give_up(ces_partition_t *part);

/* The partition of source delivered an event of commit LSN lsn: it will deliver no older one. */
void ces_partitions_saw_commit(ces_partitions_t *table, const ces_source_t *source, ces_lsn_t lsn);

#endif
