/*
 * reasm: joins the segments of split events (docs/ces-format.md, "Segments").
 *
 * Segments of one event share a logicalid and may arrive in any order, from any partition, more than
 * once. A group is complete when every index from the base (0 or 1) to the final segment is present.
 * Memory is bounded: total bytes held, segments per group, and a timeout; a group that breaks a
 * bound is handed back whole so that each of its segments becomes a dead letter.
 */
#ifndef CES_REASM_H
#define CES_REASM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "order/batch.h"
#include "format/decode.h"

typedef struct {
    size_t max_bytes;    /* data bytes held by all incomplete groups */
    size_t max_segments; /* segments in one group */
    int64_t timeout_ms;  /* an incomplete group older than this is given up */
} ces_reasm_limits_t;

/* One segment. The reassembler owns arena while it holds the segment. */
typedef struct {
    ces_source_t source;
    ces_envelope_t envelope; /* its strings live in arena */
    int64_t index;
    bool final_segment;
    int64_t split_total; /* legacy splittotalcnt, or -1 */
    const char *data;    /* this segment's slice, in arena */
    size_t data_len;
    const void *raw; /* the record, kept for a dead letter */
    size_t raw_len;
    ces_arena_t *arena;
} ces_segment_t;

/* A group handed back: complete (data holds the joined Data), or given up (data is NULL). The caller
 * owns it and every segment's arena in it; free with ces_reasm_group_free. */
typedef struct {
    char *logicalid;
    ces_segment_t *segments; /* in index order when complete, arrival order when given up */
    size_t count;
    char *data;
    size_t data_len;
    bool candidate_base1; /* complete only if the index base is 1: segment 0 may still come */
    int64_t first_ms;     /* when the first segment arrived */
} ces_reasm_group_t;

typedef struct ces_reasm_s ces_reasm_t;

ces_reasm_t *ces_reasm_new(const ces_reasm_limits_t *limits);
/* Frees every held segment. Accepts NULL. */
void ces_reasm_destroy(ces_reasm_t *reasm);

typedef enum {
    CES_REASM_HELD,     /* kept; nothing to do yet */
    CES_REASM_COMPLETE, /* *group is complete */
    CES_REASM_GIVEN_UP, /* *group broke a bound; reason says which */
    CES_REASM_DUPLICATE, /* a segment of a group completed recently: freed */
    CES_REASM_NOMEM,
} ces_reasm_status_t;

/*
 * Adds a segment of logicalid (the reassembler takes segment's arena). A duplicate index is
 * freed at once (its arena destroyed) unless it is the only copy.
 */
ces_reasm_status_t ces_reasm_add(ces_reasm_t *reasm, const char *logicalid,
                                 const ces_segment_t *segment, int64_t now_ms,
                                 ces_reasm_group_t **group, char *reason, size_t reason_size);

/* Puts back a candidate group whose joined data did not decode (its base was 0 after all): it waits
 * for segment 0. */
ces_reasm_status_t ces_reasm_put_back(ces_reasm_t *reasm, ces_reasm_group_t *group);

/* Hands back one group older than the timeout, or NULL. */
ces_reasm_group_t *ces_reasm_expire(ces_reasm_t *reasm, int64_t now_ms);

/* Lowest offset held for (topic, partition); false when none is held. */
bool ces_reasm_min_offset(const ces_reasm_t *reasm, const char *topic, int32_t partition,
                          int64_t *offset);

/* Forgets which groups completed (after going back to stored positions, their segments are read
 * again and must not count as duplicates). */
void ces_reasm_forget_completed(ces_reasm_t *reasm);

/*
 * Drops the groups whose segments all came from sources pred picks, and returns how many; or, when
 * a group mixes such segments with others, drops nothing and returns -1 (the caller must go back
 * to the stored positions of every partition involved instead).
 */
long ces_reasm_drop_sources(ces_reasm_t *reasm, ces_source_pred_t pred, void *arg);

/* Hands back every group, one per call, or NULL (on revocation: they will be read again). */
ces_reasm_group_t *ces_reasm_take_any(ces_reasm_t *reasm);

size_t ces_reasm_pending_groups(const ces_reasm_t *reasm);
size_t ces_reasm_pending_bytes(const ces_reasm_t *reasm);

void ces_reasm_group_free(ces_reasm_group_t *group);

#endif
