#include "order/reasm.h"

#include "util/array.h"

#include <stdint.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/map.h"

typedef struct group_s {
    struct group_s *older, *newer; /* by first_ms: the oldest expires first */
    ces_reasm_group_t g; /* segments in arrival order until handed back */
    size_t capacity;
    int64_t first_ms;
    size_t bytes; /* what it costs: its segments and its own bookkeeping */
    bool have_final;
    int64_t final_index;
    int64_t legacy_total; /* > 0 for legacy split events */
    bool tried_base1;
} group_t;

/* How many completed groups are remembered, so that a segment resent after its event was joined
 * is recognised instead of starting a group that can never complete. */
#define COMPLETED_MEMORY 16384

struct ces_reasm_s {
    ces_reasm_limits_t limits;
    group_t *oldest, *newest;
    ces_map_t *open; /* logicalid -> group_t */
    size_t bytes;
    size_t ngroups;
    ces_map_t *completed;           /* logicalid -> slot + 1 in ring */
    char *ring[COMPLETED_MEMORY];   /* logicalids, oldest overwritten first */
    size_t ring_next;
};

ces_reasm_t *ces_reasm_new(const ces_reasm_limits_t *limits) {
    ces_reasm_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->limits = *limits;
    if (r->limits.max_groups == 0)
        r->limits.max_groups = CES_REASM_DEFAULT_MAX_GROUPS;
    if (r->limits.max_logicalid_bytes == 0)
        r->limits.max_logicalid_bytes = CES_REASM_DEFAULT_MAX_LOGICALID;
    r->completed = ces_map_new();
    r->open = ces_map_new();
    if (r->completed == NULL || r->open == NULL) {
        ces_map_destroy(r->completed);
        ces_map_destroy(r->open);
        free(r);
        return NULL;
    }
    return r;
}

void ces_reasm_forget_completed(ces_reasm_t *r) {
    ces_map_clear(r->completed, NULL, NULL);
    for (size_t i = 0; i < COMPLETED_MEMORY; i++) {
        free(r->ring[i]);
        r->ring[i] = NULL;
    }
    r->ring_next = 0;
}

static void remember_completed(ces_reasm_t *r, const char *logicalid) {
    size_t len = strlen(logicalid);
    if (ces_map_get(r->completed, logicalid, len) != NULL)
        return;
    char *old = r->ring[r->ring_next];
    if (old != NULL) {
        ces_map_remove(r->completed, old, strlen(old));
        free(old);
    }
    r->ring[r->ring_next] = strdup(logicalid);
    if (r->ring[r->ring_next] != NULL &&
        ces_map_put(r->completed, logicalid, len, (void *)(uintptr_t)(r->ring_next + 1)) != 0) {
        free(r->ring[r->ring_next]);
        r->ring[r->ring_next] = NULL;
    }
    r->ring_next = (r->ring_next + 1) % COMPLETED_MEMORY;
}

static void forget_one(ces_reasm_t *r, const char *logicalid) {
    uintptr_t slot = (uintptr_t)ces_map_remove(r->completed, logicalid, strlen(logicalid));
    if (slot != 0) {
        free(r->ring[slot - 1]);
        r->ring[slot - 1] = NULL;
    }
}

size_t ces_reasm_segment_bytes(const ces_segment_t *seg) {
    return sizeof(*seg) + ces_arena_footprint(seg->arena);
}

/* A group's own bookkeeping: itself, its logicalid (and the open map's copy of it, and that map's
 * slot). */
static size_t group_overhead(size_t logicalid_len) {
    return sizeof(group_t) + 2 * (logicalid_len + 1) + 4 * sizeof(void *);
}

/* Frees what a group owns, not the group itself. */
static void group_contents_free(ces_reasm_group_t *g) {
    for (size_t i = 0; i < g->count; i++)
        ces_arena_destroy(g->segments[i].arena);
    free(g->segments);
    free(g->logicalid);
    free(g->data);
}

void ces_reasm_group_free(ces_reasm_group_t *g) {
    if (g == NULL)
        return;
    group_contents_free(g);
    free(g);
}

/* Links grp in by first_ms: at the newest end but for a clock that went back or a group put back
 * (its first segment came earlier), so the walk back is short. */
static void link_group(ces_reasm_t *r, group_t *grp) {
    group_t *older = r->newest;
    while (older != NULL && older->first_ms > grp->first_ms)
        older = older->older;
    grp->older = older;
    grp->newer = older != NULL ? older->newer : r->oldest;
    if (grp->newer != NULL)
        grp->newer->older = grp;
    else
        r->newest = grp;
    if (older != NULL)
        older->newer = grp;
    else
        r->oldest = grp;
}

static void unlink_group(ces_reasm_t *r, group_t *grp) {
    if (grp->older != NULL)
        grp->older->newer = grp->newer;
    else
        r->oldest = grp->newer;
    if (grp->newer != NULL)
        grp->newer->older = grp->older;
    else
        r->newest = grp->older;
    ces_map_remove(r->open, grp->g.logicalid, strlen(grp->g.logicalid));
    r->bytes -= grp->bytes;
    r->ngroups--;
}

/* Makes grp an open group. Returns 0, or -1 when out of memory (grp is then not linked). */
static int open_group(ces_reasm_t *r, group_t *grp) {
    if (ces_map_put(r->open, grp->g.logicalid, strlen(grp->g.logicalid), grp) != 0)
        return -1;
    link_group(r, grp);
    r->bytes += grp->bytes;
    r->ngroups++;
    return 0;
}

static ces_reasm_group_t *hand_back(ces_reasm_t *r, group_t *grp) {
    unlink_group(r, grp);
    ces_reasm_group_t *out = malloc(sizeof(*out));
    if (out == NULL) {
        group_contents_free(&grp->g);
        free(grp);
        return NULL;
    }
    *out = grp->g;
    out->first_ms = grp->first_ms;
    free(grp);
    return out;
}

void ces_reasm_destroy(ces_reasm_t *r) {
    if (r == NULL)
        return;
    ces_reasm_group_t *g;
    while ((g = ces_reasm_take_any(r)) != NULL)
        ces_reasm_group_free(g);
    if (r->completed != NULL)
        ces_reasm_forget_completed(r);
    ces_map_destroy(r->completed);
    ces_map_destroy(r->open);
    free(r);
}

static int by_index(const void *a, const void *b) {
    const ces_segment_t *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Checks whether the group is complete; sorts and joins it if so. */
static bool complete(group_t *grp, bool *base1) {
    ces_reasm_group_t *g = &grp->g;
    bool have0 = false;
    int64_t max_index = -1;
    for (size_t i = 0; i < g->count; i++) {
        have0 = have0 || g->segments[i].index == 0;
        if (g->segments[i].index > max_index)
            max_index = g->segments[i].index;
    }
    *base1 = false;
    if (grp->legacy_total > 0)
        return (int64_t)g->count == grp->legacy_total;
    if (!grp->have_final || max_index > grp->final_index)
        return false;
    if (have0)
        return (int64_t)g->count == grp->final_index + 1;
    if (!grp->tried_base1 && (int64_t)g->count == grp->final_index) {
        *base1 = true;
        return true;
    }
    return false;
}

static int join(group_t *grp) {
    ces_reasm_group_t *g = &grp->g;
    qsort(g->segments, g->count, sizeof(ces_segment_t), by_index);
    size_t total = 0;
    for (size_t i = 0; i < g->count; i++)
        total += g->segments[i].data_len;
    g->data = malloc(total + 1);
    if (g->data == NULL)
        return -1;
    size_t off = 0;
    for (size_t i = 0; i < g->count; i++) {
        memcpy(g->data + off, g->segments[i].data, g->segments[i].data_len);
        off += g->segments[i].data_len;
    }
    g->data[total] = '\0';
    g->data_len = total;
    return 0;
}

/* Hands back seg alone, refused before it joined a group: a group of one, for its dead letter.
 * Takes seg's arena. */
static ces_reasm_status_t refuse(const ces_segment_t *seg, const char *logicalid,
                                 ces_reasm_group_t **out) {
    ces_reasm_group_t *g = calloc(1, sizeof(*g));
    if (g == NULL || (g->segments = malloc(sizeof(*seg))) == NULL ||
        (logicalid != NULL && (g->logicalid = strdup(logicalid)) == NULL)) {
        if (g != NULL)
            free(g->segments);
        free(g);
        ces_arena_destroy(seg->arena);
        return CES_REASM_NOMEM;
    }
    g->segments[0] = *seg;
    g->count = 1;
    *out = g;
    return CES_REASM_GIVEN_UP;
}

/* The open group of logicalid, or a new one (NULL: out of memory, or too many are open: *full). */
static group_t *group_for(ces_reasm_t *r, const char *logicalid, size_t len, int64_t now_ms,
                          bool *full) {
    *full = false;
    group_t *grp = ces_map_get(r->open, logicalid, len);
    if (grp != NULL)
        return grp;
    if (r->ngroups >= r->limits.max_groups) {
        *full = true;
        return NULL;
    }
    grp = calloc(1, sizeof(*grp));
    if (grp == NULL || (grp->g.logicalid = strdup(logicalid)) == NULL) {
        free(grp);
        return NULL;
    }
    grp->first_ms = now_ms;
    grp->bytes = group_overhead(len);
    if (open_group(r, grp) != 0) {
        free(grp->g.logicalid);
        free(grp);
        return NULL;
    }
    return grp;
}

/* Keeps seg in grp. Returns 0, or -1 when out of memory. */
static int hold(ces_reasm_t *r, group_t *grp, const ces_segment_t *seg) {
    ces_segment_t *s = CES_ARRAY_RESERVE(grp->g.segments, grp->capacity, grp->g.count + 1, 4);
    if (s == NULL)
        return -1;
    grp->g.segments = s;
    grp->g.segments[grp->g.count++] = *seg;
    size_t cost = ces_reasm_segment_bytes(seg);
    grp->bytes += cost;
    r->bytes += cost;
    if (seg->split_total > 0)
        grp->legacy_total = seg->split_total;
    if (seg->final_segment && seg->split_total < 0) {
        grp->have_final = true;
        grp->final_index = seg->index;
    }
    return 0;
}

ces_reasm_status_t ces_reasm_add(ces_reasm_t *r, const char *logicalid,
                                 const ces_segment_t *seg, int64_t now_ms,
                                 ces_reasm_group_t **out, char *reason, size_t reason_size) {
    *out = NULL;
    size_t len = strnlen(logicalid, r->limits.max_logicalid_bytes + 1);
    if (len > r->limits.max_logicalid_bytes) {
        snprintf(reason, reason_size,
                 "segment's logicalid is longer than %zu bytes (the longest ces2pg joins "
                 "segments by); it begins %.60s",
                 r->limits.max_logicalid_bytes, logicalid);
        return refuse(seg, NULL, out);
    }
    if (ces_map_get(r->completed, logicalid, len) != NULL) {
        ces_arena_destroy(seg->arena);
        return CES_REASM_DUPLICATE;
    }
    bool full;
    group_t *grp = group_for(r, logicalid, len, now_ms, &full);
    if (full) {
        snprintf(reason, reason_size,
                 "segment of group %.100s refused: %zu incomplete segment groups are held "
                 "already (the most ces2pg holds)",
                 logicalid, r->limits.max_groups);
        return refuse(seg, logicalid, out);
    }
    if (grp == NULL) {
        ces_arena_destroy(seg->arena);
        return CES_REASM_NOMEM;
    }
    for (size_t i = 0; i < grp->g.count; i++) {
        if (grp->g.segments[i].index == seg->index) {
            /* A resent duplicate: the copy we hold is as good. */
            ces_arena_destroy(seg->arena);
            return CES_REASM_HELD;
        }
    }
    if (hold(r, grp, seg) != 0) {
        ces_arena_destroy(seg->arena);
        if (grp->g.count == 0)
            ces_reasm_group_free(hand_back(r, grp));
        return CES_REASM_NOMEM;
    }

    if (grp->g.count > r->limits.max_segments) {
        snprintf(reason, reason_size,
                 "segment group %.100s has more than %zu segments (reassembly.max_segments)",
                 logicalid, r->limits.max_segments);
        *out = hand_back(r, grp);
        return *out ? CES_REASM_GIVEN_UP : CES_REASM_NOMEM;
    }
    if (r->bytes > r->limits.max_bytes) {
        snprintf(reason, reason_size,
                 "segments held for reassembly exceed %zu bytes (reassembly.max_bytes, counting "
                 "each segment's whole record) while joining group %.100s",
                 r->limits.max_bytes, logicalid);
        *out = hand_back(r, grp);
        return *out ? CES_REASM_GIVEN_UP : CES_REASM_NOMEM;
    }
    bool base1;
    if (!complete(grp, &base1))
        return CES_REASM_HELD;
    if (join(grp) != 0)
        return CES_REASM_NOMEM;
    *out = hand_back(r, grp);
    if (*out == NULL)
        return CES_REASM_NOMEM;
    (*out)->candidate_base1 = base1;
    remember_completed(r, logicalid);
    return CES_REASM_COMPLETE;
}

ces_reasm_status_t ces_reasm_put_back(ces_reasm_t *r, ces_reasm_group_t *g) {
    forget_one(r, g->logicalid); /* it was not complete after all */
    group_t *grp = calloc(1, sizeof(*grp));
    if (grp == NULL)
        return CES_REASM_NOMEM;
    free(g->data);
    g->data = NULL;
    g->data_len = 0;
    g->candidate_base1 = false;
    grp->g = *g;
    grp->capacity = g->count;
    grp->tried_base1 = true;
    grp->first_ms = g->first_ms;
    grp->bytes = group_overhead(strlen(g->logicalid));
    for (size_t i = 0; i < g->count; i++) {
        grp->bytes += ces_reasm_segment_bytes(&g->segments[i]);
        if (g->segments[i].final_segment) {
            grp->have_final = true;
            grp->final_index = g->segments[i].index;
        }
    }
    if (open_group(r, grp) != 0) {
        free(grp);
        return CES_REASM_NOMEM;
    }
    free(g);
    return CES_REASM_HELD;
}

ces_reasm_group_t *ces_reasm_expire(ces_reasm_t *r, int64_t now_ms) {
    group_t *g = r->oldest;
    if (g != NULL && now_ms - g->first_ms >= r->limits.timeout_ms)
        return hand_back(r, g);
    return NULL;
}

/* 1: every segment of g is from a source pred picks, 0: none is, -1: some are. */
static int picked(const group_t *g, ces_source_pred_t pred, void *arg) {
    size_t n = 0;
    for (size_t i = 0; i < g->g.count; i++)
        n += pred(arg, &g->g.segments[i].source) ? 1 : 0;
    return n == 0 ? 0 : n == g->g.count ? 1 : -1;
}

long ces_reasm_drop_sources(ces_reasm_t *r, ces_source_pred_t pred, void *arg) {
    for (const group_t *g = r->oldest; g != NULL; g = g->newer) {
        if (picked(g, pred, arg) < 0)
            return -1;
    }
    long dropped = 0;
    for (group_t *g = r->oldest, *next; g != NULL; g = next) {
        next = g->newer;
        if (picked(g, pred, arg) == 0)
            continue;
        unlink_group(r, g);
        group_contents_free(&g->g);
        free(g);
        dropped++;
    }
    return dropped;
}

ces_reasm_group_t *ces_reasm_take_any(ces_reasm_t *r) {
    return r->oldest ? hand_back(r, r->oldest) : NULL;
}

bool ces_reasm_min_offset(const ces_reasm_t *r, const char *topic, int32_t partition,
                          int64_t *offset) {
    bool found = false;
    for (const group_t *g = r->oldest; g != NULL; g = g->newer) {
        for (size_t i = 0; i < g->g.count; i++) {
            const ces_source_t *s = &g->g.segments[i].source;
            if (s->partition == partition && strcmp(s->topic, topic) == 0 &&
                (!found || s->offset < *offset)) {
                *offset = s->offset;
                found = true;
            }
        }
    }
    return found;
}

size_t ces_reasm_pending_groups(const ces_reasm_t *r) { return r->ngroups; }
size_t ces_reasm_pending_bytes(const ces_reasm_t *r) { return r->bytes; }
