#include "order/order.h"

#include "util/array.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ces_lsn_t lsn;
    ces_item_t *items;
    size_t count;
    size_t capacity;
    size_t bytes; /* the items' memory (ces_item_bytes) */
    /* At least the greatest sequence number among the items (items leave, it stays): a sequence
     * above it cannot be a duplicate, which spares the walk over every held item of the
     * transaction when its events arrive in order (from one partition). From several partitions
     * they interleave, and an event below the greatest is still looked for. */
    uint64_t max_sequence;
    /* The held items' sequence numbers, for the look for a copy once the transaction holds more
     * than ORDER_WALK_MAX: from several partitions a large transaction's events interleave, and
     * walking every held item for each of them is quadratic.
     * Open addressing, sequence + 1 (0 = empty; UINT64_MAX in seq_has_max), at most half full.
     * Built when first needed; dropped (seq_cap 0) when items leave the transaction other than
     * all at once, and built again from those that stay. */
    uint64_t *seq_slots;
    size_t seq_cap; /* 0 = not built */
    size_t seq_used;
    bool seq_has_max;
} txn_t;

#define ORDER_WALK_MAX 16 /* a transaction holding more is looked up in its sequence index */

#define ORDER_SPARE_TXNS 1024
#define ORDER_SPARE_ITEM_BYTES (256u << 10) /* the spares' item arrays together */

/* A binary min-heap of offsets. */
typedef struct {
    int64_t *v;
    size_t n;
    size_t cap;
} heap_t;

/* The offsets of one partition's records that held items cover. Items leave in LSN order, not in
 * offset order (and joined segments bring older offsets late), so the smallest is kept in a heap;
 * offsets that left go to a second heap and are dropped lazily when both tops agree. The position
 * a partition may store is asked at every batch: this keeps that O(log n) instead of a walk over
 * every held item. */
typedef struct {
    char *topic;
    int32_t partition;
    heap_t held;
    heap_t left;
} part_offsets_t;

struct ces_order_s {
    txn_t **txns; /* sorted by LSN, oldest first, starting at head */
    /* lsns[i] is txns[i]->lsn: the search for an event's transaction reads this array instead of
     * following a pointer to each transaction it passes, a cache miss each (and thousands may be
     * held). */
    ces_lsn_t *lsns;
    size_t head;
    size_t count; /* live entries from head */
    size_t capacity;
    size_t events;
    size_t bytes; /* the held items' arenas */
    uint64_t duplicates;
    /* Recently committed positions: a ring of the last dedup_window, indexed by a hash set. */
    ces_version_t *ring;
    size_t ring_size;
    size_t ring_next;
    size_t ring_used;
    uint32_t *slots; /* ring index + 1, 0 = empty; open addressing */
    size_t nslots;   /* power of two, > 2 * ring_size */
    /* The highest position remembered since the ring was last empty, so no entry lies above it:
     * a source's positions mostly rise, so most events lie above it and above the batch in
     * flight, and skip both lookups. */
    ces_version_t ring_max;
    part_offsets_t *parts;
    size_t nparts;
    size_t parts_capacity;
    bool nomem; /* an offset could not be recorded: min_offset walks the items instead */
    /* Positions of the batch PostgreSQL is applying (ces_order_set_in_flight), sorted. */
    ces_version_t *flight;
    size_t nflight;
    size_t flight_capacity;
    /* Transactions released empty, kept with their item arrays (within ORDER_SPARE_ITEM_BYTES)
     * for the next ones: a transaction of a few events costs three allocations, and a release
     * often ends hundreds of them at once. */
    txn_t *spare_txns[ORDER_SPARE_TXNS];
    size_t nspare_txns;
    size_t spare_item_bytes;
};

static int heap_push(heap_t *h, int64_t x) {
    int64_t *v = CES_ARRAY_RESERVE(h->v, h->cap, h->n + 1, 64);
    if (v == NULL)
        return -1;
    h->v = v;
    size_t i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2] > x) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
    return 0;
}

static void heap_pop(heap_t *h) {
    int64_t x = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1] < h->v[c])
            c++;
        if (h->v[c] >= x)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0)
        h->v[i] = x;
}

static part_offsets_t *part_offsets(ces_order_t *o, const char *topic, int32_t partition,
                                    bool create) {
    for (size_t i = 0; i < o->nparts; i++) {
        part_offsets_t *po = &o->parts[i];
        if (po->partition == partition && (po->topic == topic || strcmp(po->topic, topic) == 0))
            return po;
    }
    if (!create)
        return NULL;
    part_offsets_t *parts = CES_ARRAY_RESERVE(o->parts, o->parts_capacity, o->nparts + 1, 8);
    if (parts == NULL)
        return NULL;
    o->parts = parts;
    part_offsets_t *po = &o->parts[o->nparts];
    *po = (part_offsets_t){.topic = strdup(topic), .partition = partition};
    if (po->topic == NULL)
        return NULL;
    o->nparts++;
    return po;
}

/* Records that item's records are held (held) or left (!held). */
static void track_offsets(ces_order_t *o, const ces_item_t *item, bool held) {
    for (size_t m = 0; m <= item->nmore_sources && !o->nomem; m++) {
        const ces_source_t *s = m == 0 ? &item->source : &item->more_sources[m - 1];
        part_offsets_t *po = part_offsets(o, s->topic, s->partition, true);
        if (po == NULL || heap_push(held ? &po->held : &po->left, s->offset) != 0)
            o->nomem = true;
    }
}

static void parts_clear(ces_order_t *o) {
    for (size_t i = 0; i < o->nparts; i++) {
        free(o->parts[i].topic);
        free(o->parts[i].held.v);
        free(o->parts[i].left.v);
    }
    o->nparts = 0;
    o->nomem = false;
}

ces_order_t *ces_order_new(size_t dedup_window) {
    ces_order_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return NULL;
    if (dedup_window > 0) {
        o->ring_size = dedup_window;
        o->nslots = 16;
        while (o->nslots < dedup_window * 2 + 1)
            o->nslots *= 2;
        o->ring = calloc(dedup_window, sizeof(ces_version_t));
        o->slots = calloc(o->nslots, sizeof(uint32_t));
        if (o->ring == NULL || o->slots == NULL) {
            ces_order_destroy(o);
            return NULL;
        }
    }
    return o;
}

static void txn_free(txn_t *t) {
    for (size_t i = 0; i < t->count; i++)
        ces_arena_destroy(t->items[i].arena);
    free(t->items);
    free(t->seq_slots);
    free(t);
}

static void seq_index_drop(txn_t *t) {
    free(t->seq_slots);
    t->seq_slots = NULL;
    t->seq_cap = 0;
    t->seq_used = 0;
    t->seq_has_max = false;
}

static size_t seq_home(uint64_t key, size_t cap) {
    return (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (cap - 1);
}

/* Adds sequence to a built index; 0, or -1 when out of memory (the index is then dropped). */
static int seq_index_put(txn_t *t, uint64_t sequence) {
    if (sequence == UINT64_MAX) {
        t->seq_has_max = true;
        return 0;
    }
    if ((t->seq_used + 1) * 2 > t->seq_cap) {
        size_t cap = t->seq_cap * 2;
        uint64_t *slots = calloc(cap, sizeof(*slots));
        if (slots == NULL) {
            seq_index_drop(t);
            return -1;
        }
        for (size_t i = 0; i < t->seq_cap; i++) {
            if (t->seq_slots[i] == 0)
                continue;
            size_t h = seq_home(t->seq_slots[i], cap);
            while (slots[h] != 0)
                h = (h + 1) & (cap - 1);
            slots[h] = t->seq_slots[i];
        }
        free(t->seq_slots);
        t->seq_slots = slots;
        t->seq_cap = cap;
    }
    uint64_t key = sequence + 1;
    size_t h = seq_home(key, t->seq_cap);
    while (t->seq_slots[h] != 0) {
        if (t->seq_slots[h] == key)
            return 0;
        h = (h + 1) & (t->seq_cap - 1);
    }
    t->seq_slots[h] = key;
    t->seq_used++;
    return 0;
}

/* Builds the index of the items held: 0, or -1 when out of memory. */
static int seq_index_build(txn_t *t) {
    size_t cap = 64;
    while (cap < (t->count + 1) * 2)
        cap *= 2;
    t->seq_slots = calloc(cap, sizeof(*t->seq_slots));
    if (t->seq_slots == NULL)
        return -1;
    t->seq_cap = cap;
    for (size_t i = 0; i < t->count; i++) {
        if (seq_index_put(t, t->items[i].event.version.sequence) != 0)
            return -1;
    }
    return 0;
}

static bool seq_index_has(const txn_t *t, uint64_t sequence) {
    if (sequence == UINT64_MAX)
        return t->seq_has_max;
    uint64_t key = sequence + 1;
    size_t mask = t->seq_cap - 1;
    for (size_t h = seq_home(key, t->seq_cap); t->seq_slots[h] != 0; h = (h + 1) & mask) {
        if (t->seq_slots[h] == key)
            return true;
    }
    return false;
}

/* Whether t holds an item at sequence: the index when t holds many and it can be built, else
 * the walk. */
static bool holds_sequence(txn_t *t, uint64_t sequence) {
    if (t->count > ORDER_WALK_MAX && (t->seq_cap > 0 || seq_index_build(t) == 0))
        return seq_index_has(t, sequence);
    for (size_t i = 0; i < t->count; i++) {
        if (t->items[i].event.version.sequence == sequence)
            return true;
    }
    return false;
}

/* A transaction whose items have all left (their arenas are theirs): kept as a spare, or freed. */
static void txn_spent(ces_order_t *o, txn_t *t) {
    seq_index_drop(t);
    if (o->nspare_txns == ORDER_SPARE_TXNS) {
        free(t->items);
        free(t);
        return;
    }
    size_t bytes = t->capacity * sizeof(ces_item_t);
    if (o->spare_item_bytes + bytes > ORDER_SPARE_ITEM_BYTES) {
        free(t->items);
        t->items = NULL;
        t->capacity = 0;
        bytes = 0;
    }
    o->spare_item_bytes += bytes;
    t->count = 0;
    t->bytes = 0;
    o->spare_txns[o->nspare_txns++] = t;
}

/* 1: every record of item is from a source pred picks, 0: none is, -1: some are. */
static int item_picked(const ces_item_t *item, ces_source_pred_t pred, void *arg) {
    size_t n = 0;
    for (size_t m = 0; m <= item->nmore_sources; m++)
        n += pred(arg, m == 0 ? &item->source : &item->more_sources[m - 1]) ? 1 : 0;
    return n == 0 ? 0 : n == item->nmore_sources + 1 ? 1 : -1;
}

long ces_order_drop_sources(ces_order_t *o, ces_source_pred_t pred, void *arg) {
    for (size_t i = 0; i < o->count; i++) {
        const txn_t *t = o->txns[o->head + i];
        for (size_t k = 0; k < t->count; k++) {
            if (item_picked(&t->items[k], pred, arg) < 0)
                return -1;
        }
    }
    long dropped = 0;
    size_t kept_txns = 0;
    for (size_t i = 0; i < o->count; i++) {
        txn_t *t = o->txns[o->head + i];
        size_t kept = 0;
        for (size_t k = 0; k < t->count; k++) {
            ces_item_t *item = &t->items[k];
            if (item_picked(item, pred, arg) == 0) {
                t->items[kept++] = *item;
                continue;
            }
            size_t bytes = ces_item_bytes(item);
            track_offsets(o, item, false);
            ces_arena_destroy(item->arena);
            t->bytes -= bytes;
            o->bytes -= bytes;
            o->events--;
            dropped++;
        }
        if (kept < t->count)
            seq_index_drop(t);
        t->count = kept;
        if (kept == 0) {
            txn_spent(o, t);
        } else {
            o->lsns[o->head + kept_txns] = t->lsn;
            o->txns[o->head + kept_txns++] = t;
        }
    }
    o->count = kept_txns;
    if (o->count == 0)
        o->head = 0;
    return dropped;
}

static void drop_held(ces_order_t *o) {
    for (size_t i = 0; i < o->count; i++)
        txn_free(o->txns[o->head + i]);
    o->head = 0;
    o->count = 0;
    o->events = 0;
    o->bytes = 0;
    parts_clear(o);
}

void ces_order_reset(ces_order_t *o) {
    drop_held(o);
    o->ring_used = 0;
    o->ring_next = 0;
    o->nflight = 0;
    if (o->slots != NULL)
        memset(o->slots, 0, o->nslots * sizeof(*o->slots));
}

void ces_order_destroy(ces_order_t *o) {
    if (o == NULL)
        return;
    drop_held(o);
    for (size_t i = 0; i < o->nspare_txns; i++)
        txn_free(o->spare_txns[i]);
    free(o->parts);
    free(o->txns);
    free(o->lsns);
    free(o->ring);
    free(o->flight);
    free(o->slots);
    free(o);
}

static uint64_t version_hash(const ces_version_t *p) {
    uint64_t h = p->commit_lsn.low * 0x9E3779B97F4A7C15ULL;
    h ^= ((uint64_t)p->commit_lsn.high << 32 | (p->sequence & 0xFFFFFFFFu)) * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 29;
    return h;
}

static bool position_equal(const ces_version_t *a, const ces_version_t *b) {
    return ces_version_compare(a, b) == 0;
}

static int by_position(const void *a, const void *b) { return ces_version_compare(a, b); }

/* Sorts n elements of size bytes unless they already are in order, as they nearly always are (a
 * batch's positions come in release order, a transaction's events mostly in sequence order):
 * glibc's qsort would sort them anyway, and take a malloc for it. */
static void sort_unless_sorted(void *base, size_t n, size_t size,
                               int (*compare)(const void *, const void *)) {
    const unsigned char *p = base;
    for (size_t i = 1; i < n; i++) {
        if (compare(p + (i - 1) * size, p + i * size) > 0) {
            qsort(base, n, size, compare);
            return;
        }
    }
}

static bool seen(const ces_order_t *o, const ces_version_t *p) {
    if (o->ring_size == 0)
        return false;
    if (o->nflight > 0 && ces_version_compare(p, &o->flight[o->nflight - 1]) <= 0 &&
        ces_version_compare(p, &o->flight[0]) >= 0 &&
        bsearch(p, o->flight, o->nflight, sizeof(ces_version_t), by_position) != NULL)
        return true;
    if (o->ring_used == 0 || ces_version_compare(p, &o->ring_max) > 0)
        return false;
    size_t i = (size_t)version_hash(p) & (o->nslots - 1);
    while (o->slots[i] != 0) {
        if (position_equal(&o->ring[o->slots[i] - 1], p))
            return true;
        i = (i + 1) & (o->nslots - 1);
    }
    return false;
}

/* Removes ring entry r from the hash set (backward-shift deletion keeps probing intact). */
static void unindex(ces_order_t *o, size_t r) {
    size_t i = (size_t)version_hash(&o->ring[r]) & (o->nslots - 1);
    while (o->slots[i] != r + 1) {
        if (o->slots[i] == 0)
            return;
        i = (i + 1) & (o->nslots - 1);
    }
    size_t j = i;
    for (;;) {
        o->slots[i] = 0;
        for (;;) {
            j = (j + 1) & (o->nslots - 1);
            if (o->slots[j] == 0)
                return;
            size_t home = (size_t)version_hash(&o->ring[o->slots[j] - 1]) & (o->nslots - 1);
            /* Move slot j back to i unless its home lies cyclically in (i, j]. */
            bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays)
                break;
        }
        o->slots[i] = o->slots[j];
        i = j;
    }
}

static void remember(ces_order_t *o, const ces_version_t *p) {
    if (o->ring_size == 0 || seen(o, p))
        return;
    size_t r = o->ring_next;
    if (o->ring_used == o->ring_size)
        unindex(o, r);
    else
        o->ring_used++;
    if (o->ring_used == 1 || ces_version_compare(p, &o->ring_max) > 0)
        o->ring_max = *p;
    o->ring[r] = *p;
    o->ring_next = (r + 1) % o->ring_size;
    size_t i = (size_t)version_hash(p) & (o->nslots - 1);
    while (o->slots[i] != 0)
        i = (i + 1) & (o->nslots - 1);
    o->slots[i] = (uint32_t)(r + 1);
}

int ces_order_set_in_flight(ces_order_t *o, const ces_batch_t *batch) {
    o->nflight = 0;
    if (o->ring_size == 0)
        return 0;
    if (batch->count > o->flight_capacity) {
        ces_version_t *f = realloc(o->flight, batch->count * sizeof(*f));
        if (f == NULL)
            return -1;
        o->flight = f;
        o->flight_capacity = batch->count;
    }
    for (size_t i = 0; i < batch->count; i++) {
        if (batch->items[i].kind == CES_ITEM_EVENT)
            o->flight[o->nflight++] = batch->items[i].event.version;
    }
    if (o->nflight > 1) /* a batch of positions only has no events (and may have no array) */
        sort_unless_sorted(o->flight, o->nflight, sizeof(ces_version_t), by_position);
    return 0;
}

void ces_order_clear_in_flight(ces_order_t *o) { o->nflight = 0; }

/* How many positions ahead ces_order_committed asks for the slots it will touch. */
#define ORDER_PREFETCH_AHEAD 8

void ces_order_committed(ces_order_t *o, const ces_batch_t *batch) {
    size_t mask = o->nslots - 1;
    for (size_t i = 0; i < batch->count; i++) {
        /* The slots a position goes to, and those of the ring entries it pushes out, are at
         * random places of a table of megabytes: each a cache miss when waited for one after the
         * other. Asked for ahead, they overlap. */
        size_t ahead = i + ORDER_PREFETCH_AHEAD;
        if (o->ring_size > 0 && ahead < batch->count) {
            if (batch->items[ahead].kind == CES_ITEM_EVENT)
                __builtin_prefetch(
                    &o->slots[version_hash(&batch->items[ahead].event.version) & mask], 1);
            if (o->ring_used == o->ring_size) {
                const ces_version_t *out = &o->ring[(o->ring_next + ORDER_PREFETCH_AHEAD) %
                                                     o->ring_size];
                __builtin_prefetch(&o->slots[version_hash(out) & mask], 1);
            }
        }
        if (batch->items[i].kind == CES_ITEM_EVENT)
            remember(o, &batch->items[i].event.version);
    }
}

/* Index (from head) of the first transaction whose LSN is >= lsn. */
static size_t lower_bound(const ces_order_t *o, ces_lsn_t lsn) {
    const ces_lsn_t *lsns = o->lsns + o->head;
    size_t lo = 0, hi = o->count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ces_lsn_compare(lsns[mid], lsn) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static txn_t *find_or_insert(ces_order_t *o, ces_lsn_t lsn) {
    size_t at = lower_bound(o, lsn);
    if (at < o->count && ces_lsn_compare(o->lsns[o->head + at], lsn) == 0)
        return o->txns[o->head + at];
    if (o->head + o->count == o->capacity) {
        if (o->head > 0) {
            memmove(o->txns, o->txns + o->head, o->count * sizeof(txn_t *));
            memmove(o->lsns, o->lsns + o->head, o->count * sizeof(ces_lsn_t));
            o->head = 0;
        } else {
            size_t cap = o->capacity ? o->capacity * 2 : 64;
            txn_t **t = realloc(o->txns, cap * sizeof(*t));
            if (t == NULL)
                return NULL;
            o->txns = t;
            ces_lsn_t *l = realloc(o->lsns, cap * sizeof(*l));
            if (l == NULL)
                return NULL; /* txns is larger than it needs: harmless */
            o->lsns = l;
            o->capacity = cap;
        }
    }
    txn_t *t = o->nspare_txns > 0 ? o->spare_txns[--o->nspare_txns] : calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    o->spare_item_bytes -= t->capacity * sizeof(ces_item_t); /* 0 for a new one */
    t->lsn = lsn;
    txn_t **base = o->txns + o->head;
    memmove(base + at + 1, base + at, (o->count - at) * sizeof(txn_t *));
    base[at] = t;
    ces_lsn_t *lsns = o->lsns + o->head;
    memmove(lsns + at + 1, lsns + at, (o->count - at) * sizeof(ces_lsn_t));
    lsns[at] = lsn;
    o->count++;
    return t;
}

ces_order_status_t ces_order_add(ces_order_t *o, const ces_item_t *item) {
    const ces_version_t *pos = &item->event.version;
    /* Checked before a transaction is made for it: an empty one would block the release order. */
    bool duplicate = seen(o, pos);
    txn_t *t = duplicate ? NULL : find_or_insert(o, pos->commit_lsn);
    if (t == NULL && !duplicate)
        return CES_ORDER_NOMEM;
    bool above = t != NULL && (t->count == 0 || pos->sequence > t->max_sequence);
    if (!duplicate && !above)
        duplicate = holds_sequence(t, pos->sequence);
    if (duplicate) {
        o->duplicates++;
        ces_arena_destroy(item->arena);
        return CES_ORDER_DUPLICATE;
    }
    ces_item_t *items = CES_ARRAY_RESERVE(t->items, t->capacity, t->count + 1, 8);
    if (items == NULL)
        return CES_ORDER_NOMEM;
    t->items = items;
    if (above)
        t->max_sequence = pos->sequence;
    if (t->seq_cap > 0)
        (void)seq_index_put(t, pos->sequence); /* out of memory: dropped, built again or walked */
    size_t bytes = ces_item_bytes(item);
    ces_item_t *held = &t->items[t->count++];
    *held = *item;
    held->bytes = bytes;
    o->events++;
    t->bytes += bytes;
    o->bytes += bytes;
    track_offsets(o, item, true);
    return CES_ORDER_HELD;
}

bool ces_order_oldest(const ces_order_t *o, ces_lsn_t *lsn, size_t *events, size_t *bytes) {
    if (o->count == 0)
        return false;
    const txn_t *t = o->txns[o->head];
    *lsn = t->lsn;
    if (events != NULL)
        *events = t->count;
    if (bytes != NULL)
        *bytes = t->bytes;
    return true;
}

static int by_sequence(const void *a, const void *b) {
    const ces_item_t *x = a, *y = b;
    if (x->event.version.sequence != y->event.version.sequence)
        return x->event.version.sequence < y->event.version.sequence ? -1 : 1;
    /* Equal sequences cannot both be held (duplicates are dropped); keep arrival order. */
    return 0;
}

long ces_order_pop_oldest(ces_order_t *o, ces_batch_t *batch) {
    if (o->count == 0)
        return 0;
    txn_t *t = o->txns[o->head];
    sort_unless_sorted(t->items, t->count, sizeof(ces_item_t), by_sequence);
    long moved = 0;
    for (size_t i = 0; i < t->count; i++) {
        ces_item_t *src = &t->items[i];
        size_t bytes = ces_item_bytes(src); /* counted when it came: the arena is not read */
        if (seen(o, &src->event.version)) {
            track_offsets(o, src, false);
            o->duplicates++;
            ces_arena_destroy(src->arena);
        } else if (ces_batch_push(batch, src) == 0) {
            track_offsets(o, src, false);
            moved++;
        } else {
            /* Keep the rest held: shift them to the front of the transaction. */
            memmove(t->items, t->items + i, (t->count - i) * sizeof(ces_item_t));
            o->events -= i;
            t->count -= i;
            seq_index_drop(t);
            return -1;
        }
        t->bytes -= bytes;
        o->bytes -= bytes;
    }
    o->events -= t->count;
    txn_spent(o, t);
    o->head++;
    o->count--;
    if (o->count == 0)
        o->head = 0;
    return moved;
}

bool ces_order_min_offset(ces_order_t *o, const char *topic, int32_t partition,
                          int64_t *offset) {
    if (!o->nomem) {
        part_offsets_t *po = part_offsets(o, topic, partition, false);
        if (po == NULL)
            return false;
        while (po->held.n > 0 && po->left.n > 0 && po->held.v[0] == po->left.v[0]) {
            heap_pop(&po->held);
            heap_pop(&po->left);
        }
        if (po->held.n == 0)
            return false;
        *offset = po->held.v[0];
        return true;
    }
    /* Out of memory once: the heaps are incomplete until the orderer is cleared. */
    bool found = false;
    for (size_t i = 0; i < o->count; i++) {
        const txn_t *t = o->txns[o->head + i];
        for (size_t k = 0; k < t->count; k++) {
            const ces_item_t *item = &t->items[k];
            for (size_t m = 0; m <= item->nmore_sources; m++) {
                const ces_source_t *s = m == 0 ? &item->source : &item->more_sources[m - 1];
                if (s->partition == partition && (!found || s->offset < *offset) &&
                    strcmp(s->topic, topic) == 0) {
                    *offset = s->offset;
                    found = true;
                }
            }
        }
    }
    return found;
}

size_t ces_order_pending_events(const ces_order_t *o) { return o->events; }
size_t ces_order_pending_bytes(const ces_order_t *o) { return o->bytes; }
size_t ces_order_pending_transactions(const ces_order_t *o) { return o->count; }
uint64_t ces_order_duplicates(const ces_order_t *o) { return o->duplicates; }
