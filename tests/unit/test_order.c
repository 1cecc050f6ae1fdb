/* The transaction orderer: grouping by commit LSN, sequence order, duplicates, held offsets. */
#include "test_util.h"

#include "order/order.h"

static ces_item_t item(uint32_t vlf, uint64_t low, uint64_t seq, int32_t partition,
                       int64_t offset) {
    ces_item_t it = {0};
    it.kind = CES_ITEM_EVENT;
    it.source.topic = "ces";
    it.source.partition = partition;
    it.source.offset = offset;
    it.event.version.commit_lsn.high = vlf;
    it.event.version.commit_lsn.low = low;
    it.event.version.sequence = seq;
    it.arena = ces_arena_new();
    return it;
}

static void groups_and_orders(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(16);
    ces_batch_t batch = {0};
    /* Two transactions interleaved across partitions, out of order. */
    ces_item_t a2 = item(1, 100, 2, 1, 10), b1 = item(1, 200, 1, 0, 5), a1 = item(1, 100, 1, 0, 4),
               b2 = item(1, 200, 2, 1, 11), c1 = item(0, 900, 1, 2, 1);
    assert_int_equal(ces_order_add(o, &a2), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &b1), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &a1), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &b2), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &c1), CES_ORDER_HELD); /* older VLF: first */
    assert_int_equal(ces_order_pending_transactions(o), 3);
    assert_int_equal(ces_order_pending_events(o), 5);

    int64_t off;
    assert_true(ces_order_min_offset(o, "ces", 1, &off));
    assert_int_equal(off, 10);
    assert_true(ces_order_min_offset(o, "ces", 0, &off));
    assert_int_equal(off, 4);
    assert_false(ces_order_min_offset(o, "ces", 3, &off));
    assert_false(ces_order_min_offset(o, "other", 0, &off));

    ces_lsn_t lsn;
    size_t n;
    assert_true(ces_order_oldest(o, &lsn, &n, NULL));
    assert_int_equal(lsn.high, 0);
    assert_int_equal(n, 1);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    assert_true(ces_order_oldest(o, &lsn, &n, NULL));
    assert_true(lsn.high == 1 && lsn.low == 100 && n == 2);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 2);
    assert_int_equal(batch.count, 3);
    /* Sequence order inside the transaction, whatever the arrival order. */
    assert_int_equal(batch.items[1].event.version.sequence, 1);
    assert_int_equal(batch.items[2].event.version.sequence, 2);
    assert_int_equal(batch.items[1].source.offset, 4);
    assert_true(ces_order_min_offset(o, "ces", 0, &off));
    assert_int_equal(off, 5);
    assert_int_equal(ces_order_pending_events(o), 2);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* Held offsets against a brute-force model: items leave in LSN order, not offset order, and joined
 * segments bring offsets older than those already held. */
static void min_offsets_follow_what_is_held(void **state) {
    (void)state;
    enum { N = 400, PARTS = 3 };
    ces_order_t *o = ces_order_new(0);
    ces_batch_t batch = {0};
    static ces_source_t more[N][2];
    bool held[PARTS][4 * N] = {{false}};
    uint32_t rnd = 12345;
    int64_t next[PARTS] = {0, 0, 0};
    for (int i = 0; i < N; i++) {
        rnd = rnd * 1103515245u + 12345u;
        int32_t part = (int32_t)((rnd >> 16) % PARTS);
        /* LSNs out of arrival order: a later record may belong to an older transaction. */
        ces_item_t it = item(1, 1000 + (rnd >> 8) % 50, (uint64_t)i, part, next[part]++);
        if (i % 7 == 3) {
            /* Segments of a later event arrive on the other partitions (offsets skipped now). */
            for (int m = 0; m < 2; m++) {
                int32_t mp = (part + 1 + m) % PARTS;
                more[i + 4][m] = (ces_source_t){.topic = "ces", .partition = mp,
                                                .offset = next[mp]++};
            }
        }
        if (i % 7 == 0 && i >= 7) {
            /* ... and the event joined from them comes later, older offsets with it. */
            it.more_sources = more[i];
            it.nmore_sources = 2;
            for (int m = 0; m < 2; m++)
                held[more[i][m].partition][more[i][m].offset] = true;
        }
        held[part][it.source.offset] = true;
        assert_int_equal(ces_order_add(o, &it), CES_ORDER_HELD);
        if (i % 5 == 4) {
            long moved = ces_order_pop_oldest(o, &batch);
            assert_true(moved > 0);
            for (size_t b = 0; b < batch.count; b++) {
                const ces_item_t *x = &batch.items[b];
                held[x->source.partition][x->source.offset] = false;
                for (size_t m = 0; m < x->nmore_sources; m++)
                    held[x->more_sources[m].partition][x->more_sources[m].offset] = false;
            }
            ces_batch_clear(&batch);
        }
        for (int32_t p = 0; p < PARTS; p++) {
            int64_t want = -1, got;
            for (int64_t k = 0; k < 4 * N && want < 0; k++)
                want = held[p][k] ? k : -1;
            bool found = ces_order_min_offset(o, "ces", p, &got);
            assert_int_equal(found, want >= 0);
            if (found)
                assert_int_equal(got, want);
        }
    }
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* Held bytes follow the arenas in and out: what bounds memory in the pipeline. */
static void pending_bytes_follow_the_arenas(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(16);
    ces_batch_t batch = {0};
    ces_item_t a1 = item(1, 100, 1, 0, 1), a2 = item(1, 100, 2, 1, 1), b1 = item(1, 200, 1, 0, 2),
               dup = item(1, 100, 1, 1, 2);
    assert_non_null(ces_arena_alloc(a1.arena, 100000));
    assert_non_null(ces_arena_alloc(b1.arena, 300000));
    size_t fa1 = ces_item_bytes(&a1), fa2 = ces_item_bytes(&a2),
           fb1 = ces_item_bytes(&b1);
    assert_true(fa1 >= 100000 && fb1 >= 300000);
    assert_int_equal(ces_order_pending_bytes(o), 0);
    assert_int_equal(ces_order_add(o, &b1), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &a1), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &a2), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &dup), CES_ORDER_DUPLICATE); /* freed, not counted */
    /* An arena that grows while held is counted out as it was counted in (the count does not
     * drift, and releasing does not read the arena): the sums below stay those of the start. */
    assert_non_null(ces_arena_alloc(a2.arena, 200000));
    assert_int_equal(ces_order_pending_bytes(o), fa1 + fa2 + fb1);
    ces_lsn_t lsn;
    size_t events, bytes;
    assert_true(ces_order_oldest(o, &lsn, &events, &bytes));
    assert_int_equal(events, 2);
    assert_int_equal(bytes, fa1 + fa2);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 2);
    assert_int_equal(ces_order_pending_bytes(o), fb1);
    assert_int_equal(batch.bytes, fa1 + fa2);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    assert_int_equal(ces_order_pending_bytes(o), 0);
    assert_int_equal(batch.bytes, fa1 + fa2 + fb1);
    ces_batch_clear(&batch);
    assert_int_equal(batch.bytes, 0);
    /* A reset (rewind) forgets the held bytes too. */
    ces_item_t c1 = item(1, 300, 1, 0, 3);
    assert_non_null(ces_arena_alloc(c1.arena, 1000));
    assert_int_equal(ces_order_add(o, &c1), CES_ORDER_HELD);
    assert_true(ces_order_pending_bytes(o) > 0);
    ces_order_reset(o);
    assert_int_equal(ces_order_pending_bytes(o), 0);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* A batch in flight (sent, not committed): copies of its events are duplicates until it is done,
 * and after a failure they are not (they must be applied when read again). */
static void in_flight_positions_are_duplicates(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(16);
    ces_batch_t batch = {0};
    /* A batch of positions only (no events, no array yet) may fly too. */
    assert_int_equal(ces_order_set_in_flight(o, &batch), 0);
    ces_order_clear_in_flight(o);
    ces_item_t a = item(5, 1, 1, 0, 1), b = item(5, 1, 2, 0, 2), c = item(4, 9, 7, 1, 1);
    assert_int_equal(ces_order_add(o, &a), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &b), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &c), CES_ORDER_HELD);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1); /* c: the older VLF */
    assert_int_equal(ces_order_pop_oldest(o, &batch), 2);
    assert_int_equal(ces_order_set_in_flight(o, &batch), 0);
    ces_item_t again_b = item(5, 1, 2, 3, 9), again_c = item(4, 9, 7, 2, 4),
               other = item(5, 1, 3, 0, 3);
    assert_int_equal(ces_order_add(o, &again_b), CES_ORDER_DUPLICATE);
    assert_int_equal(ces_order_add(o, &again_c), CES_ORDER_DUPLICATE);
    assert_int_equal(ces_order_add(o, &other), CES_ORDER_HELD);
    /* It failed: nothing of it was committed, so a copy read again is new. */
    ces_order_clear_in_flight(o);
    ces_item_t third_b = item(5, 1, 2, 0, 2);
    assert_int_equal(ces_order_add(o, &third_b), CES_ORDER_HELD);
    assert_int_equal(ces_order_pending_events(o), 2);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* A copy that comes while the first is in the batch being read is held (nothing says yet that
 * it was applied); by the time its transaction is released, the first is in flight: the copy is
 * dropped then, and counted like one dropped on arrival. */
static void duplicate_released_after_the_first_went_out(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(4);
    ces_batch_t batch = {0}, next = {0};
    ces_item_t x = item(2, 1, 1, 0, 1), dup = item(2, 1, 1, 3, 7);
    assert_int_equal(ces_order_add(o, &x), CES_ORDER_HELD);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    assert_int_equal(ces_order_add(o, &dup), CES_ORDER_HELD);
    assert_int_equal(ces_order_duplicates(o), 0);
    assert_int_equal(ces_order_set_in_flight(o, &batch), 0);
    assert_int_equal(ces_order_pop_oldest(o, &next), 0);
    assert_int_equal(next.count, 0);
    assert_int_equal(ces_order_duplicates(o), 1);
    assert_int_equal(ces_order_pending_events(o), 0);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);
    ces_batch_free(&next);
    ces_order_destroy(o);
}

/* Within a held transaction: a sequence above every held one is new without a look; one below is
 * looked for, whether it is a copy or arrives late. */
static void duplicates_within_a_held_transaction(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(4);
    ces_batch_t batch = {0};
    static const struct {
        uint64_t seq;
        ces_order_status_t want;
    } adds[] = {{1, CES_ORDER_HELD},      {2, CES_ORDER_HELD},      {3, CES_ORDER_HELD},
                {2, CES_ORDER_DUPLICATE}, {5, CES_ORDER_HELD},      {4, CES_ORDER_HELD},
                {4, CES_ORDER_DUPLICATE}, {5, CES_ORDER_DUPLICATE}, {1, CES_ORDER_DUPLICATE},
                {6, CES_ORDER_HELD}};
    for (size_t i = 0; i < sizeof(adds) / sizeof(adds[0]); i++) {
        ces_item_t it = item(2, 7, adds[i].seq, 0, (int64_t)i);
        if (ces_order_add(o, &it) != adds[i].want)
            fail_msg("add %zu (sequence %llu): not %s", i, (unsigned long long)adds[i].seq,
                     adds[i].want == CES_ORDER_HELD ? "held" : "a duplicate");
    }
    assert_int_equal(ces_order_duplicates(o), 4);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 6);
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(batch.items[i].event.version.sequence, i + 1);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* A transaction of hundreds of events from four partitions, its events interleaved (each
 * partition's in sequence order, the partitions apart), so most arrive below the greatest held
 * sequence and are looked up in its sequence index; copies of held events among them, the
 * greatest and smallest sequences possible, and a quarter dropped with their partition: a copy
 * of a dropped event is new again, a copy of a kept one still a duplicate. */
/* Picks the sources of the partition *arg. */
static bool in_partition(void *arg, const ces_source_t *s) {
    return s->partition == *(const int32_t *)arg;
}

static void duplicates_within_a_large_interleaved_transaction(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(4);
    ces_batch_t batch = {0};
    int64_t offset = 0;
    size_t held = 0;
    /* Partition p carries sequences p+1, p+5, ...: partition 3 runs ahead, 0 behind. */
    for (int32_t p = 3; p >= 0; p--) {
        for (uint64_t s = (uint64_t)p + 1; s <= 400; s += 4) {
            ces_item_t it = item(5, 5, s, p, offset++);
            assert_int_equal(ces_order_add(o, &it), CES_ORDER_HELD);
            held++;
            if (s % 7 == 0) { /* a copy of an event held a while ago */
                ces_item_t copy = item(5, 5, s - 4 * (s % 3), p, offset++);
                if (ces_order_add(o, &copy) != CES_ORDER_DUPLICATE)
                    fail_msg("copy of sequence %llu not a duplicate",
                             (unsigned long long)(s - 4 * (s % 3)));
            }
        }
    }
    uint64_t extremes[] = {0, UINT64_MAX};
    for (size_t i = 0; i < 2; i++) {
        ces_item_t it = item(5, 5, extremes[i], 1, offset++);
        ces_item_t copy = item(5, 5, extremes[i], 1, offset++);
        assert_int_equal(ces_order_add(o, &it), CES_ORDER_HELD);
        assert_int_equal(ces_order_add(o, &copy), CES_ORDER_DUPLICATE);
        held++;
    }
    /* Never held, below the greatest: new. */
    ces_item_t gap = item(5, 5, 1000, 1, offset++), below = item(5, 5, 999, 1, offset++);
    assert_int_equal(ces_order_add(o, &gap), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &below), CES_ORDER_HELD);
    held += 2;
    assert_int_equal(ces_order_pending_events(o), held);

    int32_t two = 2;
    assert_int_equal(ces_order_drop_sources(o, in_partition, &two), 100);
    held -= 100;
    ces_item_t dropped_again = item(5, 5, 3, 1, offset++), kept_again = item(5, 5, 4, 0, offset++);
    assert_int_equal(ces_order_add(o, &dropped_again), CES_ORDER_HELD); /* sequence 3 left */
    assert_int_equal(ces_order_add(o, &kept_again), CES_ORDER_DUPLICATE);
    held++;
    ces_item_t kept_copy = item(5, 5, 397, 3, offset++); /* partition 0 held it */
    assert_int_equal(ces_order_add(o, &kept_copy), CES_ORDER_DUPLICATE);

    assert_int_equal(ces_order_pop_oldest(o, &batch), (long)held);
    for (size_t i = 1; i < batch.count; i++)
        assert_true(batch.items[i - 1].event.version.sequence <
                    batch.items[i].event.version.sequence);
    assert_int_equal(batch.items[0].event.version.sequence, 0);
    assert_true(batch.items[batch.count - 1].event.version.sequence == UINT64_MAX);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

static void duplicates_held_and_committed(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(4);
    ces_batch_t batch = {0};
    ces_item_t x = item(2, 1, 1, 0, 1), dup = item(2, 1, 1, 3, 7);
    assert_int_equal(ces_order_add(o, &x), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &dup), CES_ORDER_DUPLICATE);
    assert_int_equal(ces_order_pending_events(o), 1); /* the duplicate was freed, not held */
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    /* Not committed yet: a resend now is not known as applied. */
    ces_order_committed(o, &batch);
    ces_batch_clear(&batch);
    ces_item_t late = item(2, 1, 1, 1, 9);
    assert_int_equal(ces_order_add(o, &late), CES_ORDER_DUPLICATE);
    assert_int_equal(ces_order_duplicates(o), 2);
    /* The window forgets the oldest positions: four more commits push (2,1,1) out. */
    for (uint64_t s = 10; s < 14; s++) {
        ces_item_t it = item(3, s, 1, 0, (int64_t)s);
        assert_int_equal(ces_order_add(o, &it), CES_ORDER_HELD);
        assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
        ces_order_committed(o, &batch);
        ces_batch_clear(&batch);
    }
    ces_item_t again = item(2, 1, 1, 1, 20);
    assert_int_equal(ces_order_add(o, &again), CES_ORDER_HELD);
    /* ... while the recent ones are still known, also at pop time. */
    ces_item_t recent = item(3, 13, 1, 2, 21);
    assert_int_equal(ces_order_add(o, &recent), CES_ORDER_DUPLICATE);
    /* A reset (a rewind to PostgreSQL's positions, which may have lost a commit) forgets them:
     * read again, they are applied again. */
    ces_order_reset(o);
    assert_int_equal(ces_order_pending_events(o), 0);
    ces_item_t reread = item(3, 13, 1, 2, 21);
    assert_int_equal(ces_order_add(o, &reread), CES_ORDER_HELD);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* Thousands of transactions in a scrambled order, the oldest popped now and then, a partition's
 * dropped now and then, new ones after the held array has grown and been moved to its front: every
 * pop is the oldest held, as a plain model of the held LSNs says. */
static void release_order_through_growth_and_moves(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(0);
    ces_batch_t batch = {0};
    enum { N = 5000 };
    static uint64_t held[N]; /* the model: LSNs (VLF * 2^40 + low) held, unordered */
    static int32_t held_partition[N];
    size_t nheld = 0;
    uint64_t rng = 12345;
    size_t pops = 0;
    for (size_t i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t vlf = (uint32_t)(rng >> 62);
        uint64_t low = (rng >> 20) & 0xFFFFF;
        int32_t partition = (int32_t)((rng >> 40) & 3);
        ces_item_t it = item(vlf, low, 1, partition, (int64_t)i);
        ces_order_status_t st = ces_order_add(o, &it);
        bool known = false;
        for (size_t k = 0; k < nheld; k++)
            known = known || held[k] == ((uint64_t)vlf << 40 | low);
        assert_int_equal(st, known ? CES_ORDER_DUPLICATE : CES_ORDER_HELD);
        if (!known) {
            held_partition[nheld] = partition;
            held[nheld++] = (uint64_t)vlf << 40 | low;
        }
        if (i % 7 == 6 && nheld > 0) {
            size_t min = 0;
            for (size_t k = 1; k < nheld; k++)
                min = held[k] < held[min] ? k : min;
            assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
            const ces_lsn_t *got = &batch.items[0].event.version.commit_lsn;
            if (((uint64_t)got->high << 40 | got->low) != held[min])
                fail_msg("pop %zu: not the oldest held", pops);
            pops++;
            held[min] = held[--nheld];
            held_partition[min] = held_partition[nheld];
            ces_batch_clear(&batch);
        }
        if (i % 1000 == 999) {
            int32_t three = 3;
            long dropped = ces_order_drop_sources(o, in_partition, &three);
            long want = 0;
            for (size_t k = 0; k < nheld;) {
                if (held_partition[k] == 3) {
                    held[k] = held[--nheld];
                    held_partition[k] = held_partition[nheld];
                    want++;
                } else {
                    k++;
                }
            }
            assert_int_equal(dropped, want);
        }
    }
    assert_int_equal(ces_order_pending_transactions(o), nheld);
    uint64_t last = 0;
    while (nheld-- > 0) {
        assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
        const ces_lsn_t *got = &batch.items[0].event.version.commit_lsn;
        uint64_t lsn = (uint64_t)got->high << 40 | got->low;
        assert_true(lsn > last);
        last = lsn;
        ces_batch_clear(&batch);
    }
    assert_int_equal(ces_order_pop_oldest(o, &batch), 0);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

static void dedup_window_survives_churn(void **state) {
    (void)state;
    /* Many inserts and evictions: every position in the window stays findable. */
    ces_order_t *o = ces_order_new(1000);
    ces_batch_t batch = {0};
    for (uint64_t s = 1; s <= 20000; s++) {
        ces_item_t it = item(1, s / 7, s, 0, (int64_t)s);
        ces_order_add(o, &it);
        if (s % 50 == 0) {
            while (ces_order_pop_oldest(o, &batch) > 0)
                ;
            ces_order_committed(o, &batch);
            ces_batch_clear(&batch);
        }
    }
    for (uint64_t s = 20000 - 999; s <= 20000; s++) {
        ces_item_t it = item(1, s / 7, s, 0, 0);
        if (ces_order_add(o, &it) != CES_ORDER_DUPLICATE)
            fail_msg("position %llu of the window was forgotten", (unsigned long long)s);
    }
    ces_item_t old = item(1, 100 / 7, 100, 0, 0);
    assert_int_equal(ces_order_add(o, &old), CES_ORDER_HELD);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

/* Adds events at VLFs vlfs[0..4) (sequence 1) from partition, each expected to be want[i]. */
static void add_expecting(ces_order_t *o, int32_t partition, const uint32_t *vlfs,
                          const ces_order_status_t *want) {
    for (size_t i = 0; i < 4; i++) {
        ces_item_t it = item(vlfs[i], 1, 1, partition, (int64_t)i + 1);
        if (ces_order_add(o, &it) != want[i])
            fail_msg("the event at VLF %u was not %s", (unsigned)vlfs[i],
                     want[i] == CES_ORDER_HELD ? "held" : "a duplicate");
    }
}

/* Lookups skip what lies above the highest position remembered and outside the batch in flight:
 * positions committed out of order (an older transaction's events late from another partition)
 * are still found below it, and positions between two in flight are looked up too. */
static void duplicates_found_below_the_highest_position(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(100);
    ces_batch_t batch = {0};
    uint32_t order[] = {9, 3};
    for (size_t i = 0; i < 2; i++) {
        ces_item_t it = item(order[i], 1, 1, (int32_t)i, 1);
        assert_int_equal(ces_order_add(o, &it), CES_ORDER_HELD);
        assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
        ces_order_committed(o, &batch);
        ces_batch_clear(&batch);
    }
    /* Committed 9 then 3: copies of both are found, 5 and 10 are new. */
    add_expecting(o, 2, (const uint32_t[]){3, 9, 5, 10},
                  (const ces_order_status_t[]){CES_ORDER_DUPLICATE, CES_ORDER_DUPLICATE,
                                               CES_ORDER_HELD, CES_ORDER_HELD});
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    /* 5 and 10 in flight: copies of both are found, 7 (between them) and 11 are new. */
    assert_int_equal(ces_order_set_in_flight(o, &batch), 0);
    add_expecting(o, 3, (const uint32_t[]){5, 10, 7, 11},
                  (const ces_order_status_t[]){CES_ORDER_DUPLICATE, CES_ORDER_DUPLICATE,
                                               CES_ORDER_HELD, CES_ORDER_HELD});
    assert_int_equal(ces_order_duplicates(o), 4);
    ces_order_clear_in_flight(o);
    ces_order_committed(o, &batch);
    ces_batch_clear(&batch);
    ces_item_t late10 = item(10, 1, 1, 0, 9);
    assert_int_equal(ces_order_add(o, &late10), CES_ORDER_DUPLICATE);
    /* A batch in flight whose positions are not in order (made by hand here) is sorted first. */
    ces_item_t b20 = item(20, 1, 1, 0, 20), b15 = item(15, 1, 1, 0, 21);
    assert_int_equal(ces_batch_push(&batch, &b20), 0);
    assert_int_equal(ces_batch_push(&batch, &b15), 0);
    assert_int_equal(ces_order_set_in_flight(o, &batch), 0);
    add_expecting(o, 1, (const uint32_t[]){20, 15, 17, 21},
                  (const ces_order_status_t[]){CES_ORDER_DUPLICATE, CES_ORDER_DUPLICATE,
                                               CES_ORDER_HELD, CES_ORDER_HELD});
    ces_order_clear_in_flight(o);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);
    ces_order_destroy(o);
}

static bool partition_one(void *arg, const ces_source_t *source) {
    (void)arg;
    return source->partition == 1 && strcmp(source->topic, "ces") == 0;
}

/* A revocation drops only what the revoked partition holds: transactions keep their events of
 * other partitions, and transactions left empty go. An event joined from records of both cannot be
 * split: nothing is dropped, and the caller must go back. */
static void drops_a_revoked_partitions_events(void **state) {
    (void)state;
    ces_order_t *o = ces_order_new(16);
    ces_item_t a1 = item(1, 100, 1, 0, 4), a2 = item(1, 100, 2, 1, 10), b1 = item(1, 200, 1, 1, 11),
               c1 = item(1, 300, 1, 0, 5);
    assert_non_null(ces_arena_alloc(a2.arena, 1000)); /* memory the drop must give back */
    assert_int_equal(ces_order_add(o, &a1), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &a2), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &b1), CES_ORDER_HELD);
    assert_int_equal(ces_order_add(o, &c1), CES_ORDER_HELD);
    size_t bytes = ces_order_pending_bytes(o);
    assert_int_equal(ces_order_drop_sources(o, partition_one, NULL), 2);
    assert_int_equal(ces_order_pending_events(o), 2);
    assert_int_equal(ces_order_pending_transactions(o), 2); /* 200 had only partition 1's */
    assert_true(ces_order_pending_bytes(o) < bytes);
    int64_t off;
    assert_false(ces_order_min_offset(o, "ces", 1, &off));
    assert_true(ces_order_min_offset(o, "ces", 0, &off));
    assert_int_equal(off, 4);
    ces_batch_t batch = {0};
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1); /* 100 without its partition 1 event */
    assert_int_equal(batch.items[0].source.partition, 0);
    assert_int_equal(ces_order_pop_oldest(o, &batch), 1);
    assert_int_equal(batch.items[1].event.version.commit_lsn.low, 300);
    ces_batch_clear(&batch);
    ces_batch_free(&batch);

    /* An event joined from a segment on partition 0 and one on partition 1. */
    ces_item_t j = item(1, 400, 1, 0, 6);
    ces_source_t *more = ces_arena_alloc(j.arena, sizeof(*more));
    *more = (ces_source_t){"ces", 1, 12};
    j.more_sources = more;
    j.nmore_sources = 1;
    assert_int_equal(ces_order_add(o, &j), CES_ORDER_HELD);
    assert_int_equal(ces_order_drop_sources(o, partition_one, NULL), -1);
    assert_int_equal(ces_order_pending_events(o), 1);
    ces_order_destroy(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(drops_a_revoked_partitions_events),
        cmocka_unit_test(groups_and_orders),
        cmocka_unit_test(min_offsets_follow_what_is_held),
        cmocka_unit_test(duplicates_within_a_held_transaction),
        cmocka_unit_test(duplicates_within_a_large_interleaved_transaction),
        cmocka_unit_test(duplicates_held_and_committed),
        cmocka_unit_test(duplicate_released_after_the_first_went_out),
        cmocka_unit_test(pending_bytes_follow_the_arenas),
        cmocka_unit_test(in_flight_positions_are_duplicates),
        cmocka_unit_test(dedup_window_survives_churn),
        cmocka_unit_test(release_order_through_growth_and_moves),
        cmocka_unit_test(duplicates_found_below_the_highest_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
