/*
 * reasm: joins the segments of split events (docs/ces-format.md, "Segments").
 *
 * Segments of one event share a logicalid and may arrive in any order, from any partition, more than
 * once. A group is complete when every index from the base (0 or 1) to the final segment is present.
 * Memory is bounded: what the held segments cost (each one's arena as it stands, record and all,
 * not only its data), segments per group, open groups, the length of a logicalid, and a timeout; a
 * group that breaks a bound is handed back whole so that each of its segments becomes a dead
 * letter. Open groups are found by logicalid in a hash map, and kept oldest first, so that neither
 * adding a segment nor expiring a group walks them all.
 */
#ifndef CES_REASM_H
#define CES_REASM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "order/batch.h"
#include "format/decode.h"

/* Open groups at most, unless the limits say otherwise: a flood of first segments that never
 * complete (each a group of its own) is refused long before its groups' bookkeeping adds up. */
#define CES_REASM_DEFAULT_MAX_GROUPS 65536
/* The longest logicalid, unless the limits say otherwise. CES's are 78 bytes as observed
 * (docs/ces-format.md; Microsoft does not document them), so this leaves room; one far longer is
 * not CES's. It bounds what the ids of the open groups and of the 16,384 remembered completed
 * groups take (two copies each: about 17 MB at worst), which max_bytes does not count. */
#define CES_REASM_DEFAULT_MAX_LOGICALID 512

typedef struct {
    size_t max_bytes;    /* what all incomplete groups cost (ces_reasm_segment_bytes, and each
                          * group's own bookkeeping) */
    size_t max_segments; /* segments in one group */
    int64_t timeout_ms;  /* an incomplete group older than this is given up */
    size_t max_groups;   /* incomplete groups; 0: CES_REASM_DEFAULT_MAX_GROUPS */
    size_t max_logicalid_bytes; /* 0: CES_REASM_DEFAULT_MAX_LOGICALID */
} ces_reasm_limits_t;

/* One segment. The reassembler owns arena while it holds the segment, and counts it as it stands
 * (ces_arena_footprint), so whatever else the arena holds is paid for: the caller should hold
 * the segment in an arena sized for what it needs, not in the arena its record was decoded in. */
typedef struct {
    ces_source_t source;
    ces_envelope_t envelope; /* its strings live in arena */
    int64_t index;
    bool final_segment;
    int64_t split_total; /* legacy splittotalcnt, or -1 */
    const char *data;    /* this segment's slice, in arena */
    size_t data_len;
    const void *raw; /* the record, kept for a dead letter: in arena (counted with it) */
    size_t raw_len;
    ces_arena_t *arena;
} ces_segment_t;

/* A group handed back: complete (data holds the joined Data), or given up (data is NULL). The caller
 * owns it and every segment's arena in it; free with ces_reasm_group_free. */
typedef struct {
    char *logicalid; /* NULL for a segment refused for its logicalid's length */
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
    CES_REASM_GIVEN_UP, /* *group broke a bound; reason says which (a segment refused on its own,
                         * for its logicalid or because too many groups are open, comes back
                         * as a group of one) */
    CES_REASM_DUPLICATE, /* a segment of a group completed recently: freed */
    CES_REASM_NOMEM,
} ces_reasm_status_t;

/*
 * Adds a segment of logicalid (the reassembler takes segment's arena, also on failure). A duplicate
 * index is freed at once (its arena destroyed) unless it is the only copy.
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

/* What holding segment costs, as max_bytes counts it: its arena's footprint (the record and the
 * data in it) and the segment itself. */
size_t ces_reasm_segment_bytes(const ces_segment_t *segment);

size_t ces_reasm_pending_groups(const ces_reasm_t *reasm);
/* What the incomplete groups cost, as max_bytes counts it. */
size_t ces_reasm_pending_bytes(const ces_reasm_t *reasm);

void ces_reasm_group_free(ces_reasm_group_t *group);

#endif
