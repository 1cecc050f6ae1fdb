#include "positions.h"

#include "log.h"

void ces_positions_on_assign(ces_partition_position_t *pos, const char *topic,
                             int32_t partition, int64_t stored) {
    *pos = (ces_partition_position_t){.has_stored = stored >= 0, .stored = stored};
    if (stored >= 0)
        ces_log_info("%s[%d]: resuming at offset %lld stored in PostgreSQL", topic,
                     (int)partition, (long long)stored);
    else
        ces_log_info("%s[%d]: no position stored in PostgreSQL; starting from Kafka's "
                     "committed offset or auto.offset.reset",
                     topic, (int)partition);
}

void ces_positions_on_revoke(ces_partition_position_t *pos) {
    *pos = (ces_partition_position_t){.stored = -1};
}

void ces_positions_on_read(ces_partition_position_t *pos, int64_t offset) {
    if (!pos->has_next)
        pos->first = offset;
    pos->next = offset + 1;
    pos->has_next = true;
    pos->dirty = true;
}

bool ces_positions_to_store(const ces_partition_position_t *pos, const char *topic,
                            int32_t partition, int64_t held, ces_offset_update_t *update) {
    if (!pos->dirty || !pos->has_next)
        return false;
    int64_t next = held < pos->next ? held : pos->next;
    /* Held records can keep a position at or before the stored one: nothing new to store. */
    if (pos->has_stored && next <= pos->stored)
        return false;
    *update = (ces_offset_update_t){.topic = topic,
                                    .partition = partition,
                                    .has_expected = pos->has_stored,
                                    .expected = pos->stored,
                                    .next = next};
    return true;
}

void ces_positions_on_commit(ces_partition_position_t *pos, int64_t next) {
    pos->has_stored = true;
    pos->stored = next;
    /* Held records kept it short of what was read: those still count as not stored. */
    pos->dirty = pos->next != next;
}

int64_t ces_positions_on_rewind(ces_partition_position_t *pos, int64_t stored) {
    if (!pos->has_next)
        return -1;
    /* Records from first on were read under this assignment; any before it were never ours. */
    int64_t target = stored >= 0 ? stored : pos->first;
    pos->has_stored = stored >= 0;
    pos->stored = stored;
    pos->dirty = false;
    pos->next = target;
    if (target < pos->first)
        pos->first = target;
    return target;
}

int64_t ces_positions_next_to_apply(const ces_partition_position_t *pos) {
    return pos->has_stored ? pos->stored : pos->has_next ? pos->next : -1;
}
