/*
 * partitions: the partition table (partitions.h).
 */
#include "pipeline/partitions.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ces_partitions_s {
    ces_map_t *map;        /* "topic\x1fpartition" -> ces_partition_t */
    ces_partition_t *last; /* reference into map: the one looked up last */
};

ces_partitions_t *ces_partitions_new(void) {
    ces_partitions_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->map = ces_map_new();
    if (t->map == NULL) {
        free(t);
        return NULL;
    }
    return t;
}

static void partition_free(void *value, void *arg) {
    (void)arg;
    ces_partition_t *part = value;
    free(part->topic);
    free(part);
}

void ces_partitions_destroy(ces_partitions_t *t) {
    if (t == NULL)
        return;
    ces_map_clear(t->map, partition_free, NULL);
    ces_map_destroy(t->map);
    free(t);
}

static size_t partition_key(char *buf, size_t size, const char *topic, int32_t partition) {
    int n = snprintf(buf, size, "%s\x1f%d", topic, (int)partition);
    return n < 0 ? 0 : (size_t)n >= size ? size - 1 : (size_t)n;
}

ces_partition_t *ces_partitions_get(ces_partitions_t *t, const char *topic, int32_t partition,
                                    bool create) {
    /* Records mostly come in runs from one partition: skip formatting and hashing the key. */
    ces_partition_t *last = t->last;
    if (last != NULL && last->partition == partition && strcmp(last->topic, topic) == 0)
        return last;
    char key[512];
    size_t len = partition_key(key, sizeof(key), topic, partition);
    ces_partition_t *part = ces_map_get(t->map, key, len);
    if (part != NULL)
        t->last = part;
    if (part != NULL || !create)
        return part;
    part = calloc(1, sizeof(*part));
    if (part == NULL || (part->topic = strdup(topic)) == NULL ||
        ces_map_put(t->map, key, len, part) != 0) {
        if (part)
            free(part->topic);
        free(part);
        return NULL;
    }
    part->partition = partition;
    part->pos.stored = -1;
    part->pos.expect_from = -1; /* nothing to check until an assignment says where to resume */
    return part;
}

ces_partition_t *ces_partitions_next(const ces_partitions_t *t, ces_partitions_iter_t *it) {
    return ces_map_next(t->map, it, NULL, NULL);
}

void ces_partitions_give_up(ces_partition_t *part) {
    ces_positions_on_revoke(&part->pos);
    part->assigned = false;
    part->has_frontier = false;
    part->at_eof = false;
    part->paused = false;
}

void ces_partitions_saw_commit(ces_partitions_t *t, const ces_source_t *source, ces_lsn_t lsn) {
    ces_partition_t *part = ces_partitions_get(t, source->topic, source->partition, false);
    if (part != NULL && (!part->has_frontier || ces_lsn_compare(part->frontier, lsn) < 0)) {
        part->frontier = lsn;
        part->has_frontier = true;
    }
}
