#include "order/batch.h"

#include "util/array.h"

#include <stdlib.h>
#include <string.h>

ces_item_t *ces_batch_add(ces_batch_t *batch) {
    ces_item_t *items = CES_ARRAY_RESERVE(batch->items, batch->capacity, batch->count + 1, 256);
    if (items == NULL)
        return NULL;
    batch->items = items;
    ces_item_t *item = &batch->items[batch->count++];
    memset(item, 0, sizeof(*item));
    return item;
}

int ces_batch_push(ces_batch_t *batch, const ces_item_t *item) {
    ces_item_t *dst = ces_batch_add(batch);
    if (dst == NULL)
        return -1;
    *dst = *item;
    dst->bytes = ces_item_bytes(item);
    batch->bytes += dst->bytes;
    return 0;
}

size_t ces_item_bytes(const ces_item_t *item) {
    return item->bytes != 0 ? item->bytes : ces_arena_footprint(item->arena) + sizeof(*item);
}

int ces_batch_set_position(ces_batch_t *batch, const ces_position_update_t *update) {
    for (size_t i = 0; i < batch->npositions; i++) {
        ces_position_update_t *o = &batch->positions[i];
        if (o->partition == update->partition && strcmp(o->topic, update->topic) == 0) {
            *o = *update;
            return 0;
        }
    }
    ces_position_update_t *o =
        CES_ARRAY_RESERVE(batch->positions, batch->positions_capacity, batch->npositions + 1, 16);
    if (o == NULL)
        return -1;
    batch->positions = o;
    batch->positions[batch->npositions++] = *update;
    return 0;
}

int ces_batch_add_gap(ces_batch_t *batch, const ces_source_gap_t *gap) {
    ces_source_gap_t *gaps =
        CES_ARRAY_RESERVE(batch->gaps, batch->gaps_capacity, batch->ngaps + 1, 4);
    if (gaps == NULL)
        return -1;
    batch->gaps = gaps;
    batch->gaps[batch->ngaps++] = *gap;
    return 0;
}

const char *ces_dl_class_name(ces_dl_class_t cls) {
    static const char *const names[CES_DL_NCLASSES] = {
        "decode",           "no_primary_key", "rejected_by_postgres", "segment_timeout",
        "reassembly_limit", "type_conflict",  "schema",         "reserved_target",
        "name_collision"};
    return (unsigned)cls < CES_DL_NCLASSES ? names[cls] : "unknown";
}

int ces_batch_item_reject(ces_item_t *item, ces_dl_class_t cls, const char *reason) {
    const char *copy = ces_arena_strndup(item->arena, reason, strlen(reason));
    if (copy == NULL)
        return -1;
    if (item->logicalid == NULL)
        item->logicalid = item->event.logicalid;
    item->kind = CES_ITEM_DEAD_LETTER;
    item->dl_class = cls;
    item->reason = copy;
    return 0;
}

void ces_batch_clear(ces_batch_t *batch) {
    for (size_t i = 0; i < batch->count; i++) {
        if (i + CES_ITEM_AHEAD < batch->count)
            ces_item_prefetch(batch->items[i + CES_ITEM_AHEAD].arena);
        ces_arena_destroy(batch->items[i].arena);
    }
    batch->count = 0;
    batch->bytes = 0;
    batch->npositions = 0;
    batch->ngaps = 0;
}

void ces_batch_free(ces_batch_t *batch) {
    free(batch->items);
    free(batch->positions);
    free(batch->gaps);
    memset(batch, 0, sizeof(*batch));
}
