/*
 * window: the reorder window of transaction mode, and how it adapts (docs/semantics.md,
 * "Transaction mode").
 *
 * A source transaction is released when every owned partition has passed it or has been caught up
 * and quiet for the window: the window is a bet that no partition's events arrive later than that.
 * When an event arrives for a transaction already released (a torn transaction), the bet was lost
 * by `lateness`: the window that would have held the transaction back is the one in force when it
 * was released plus that lateness. The window then grows to cover it with a margin, up to the
 * maximum; the late events of one episode all ask for about the same window, so a burst of them
 * grows it once. After a quiet
 * period with no late event it shrinks back, halving its excess over the start at every step, so
 * that a passing disturbance does not cost latency forever.
 *
 * A plain value with no I/O; the caller passes the time, so the rule is tested with a fake clock.
 */
#ifndef CES_WINDOW_H
#define CES_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

/* No late event for this long, and the window starts shrinking. */
#define CES_WINDOW_QUIET_MS 60000
/* Then, every this long, its excess over the start is halved. */
#define CES_WINDOW_SHRINK_STEP_MS 10000
/* An excess smaller than this is dropped at the next step (the window is back at its start). */
#define CES_WINDOW_SNAP_MS 20
/* The margin added to the window a late event called for: a quarter of it, at least this; and a
 * late event moves the window only when it asks for at least this much more. */
#define CES_WINDOW_MARGIN_MIN_MS 50

typedef struct {
    int64_t start_ms; /* apply.reorder_window_ms: where the window starts and returns to */
    int64_t max_ms;   /* apply.reorder_window_max_ms: it never grows past this */
    bool adaptive;    /* apply.reorder_window_adaptive: false keeps it at start */
    int64_t current_ms;
    int64_t last_late_ms;   /* when the last late event was seen */
    int64_t last_shrink_ms; /* when it last shrank */
} ces_window_t;

void ces_window_init(ces_window_t *window, int64_t start_ms, int64_t max_ms, bool adaptive);

/*
 * An event came lateness_ms after its transaction was released with the window at then_ms, at
 * now_ms. Grows the window to cover it (when adaptive). Returns true when the window changed.
 */
bool ces_window_late(ces_window_t *window, int64_t lateness_ms, int64_t then_ms, int64_t now_ms);

/* Starts from a window an earlier writer of the stream learned (a takeover, a restart), clamped
 * to [start, max], as if a late event had just called for it: it holds for a quiet period before it
 * shrinks. Returns true when the window changed. No-op when not adaptive. */
bool ces_window_inherit(ces_window_t *window, int64_t window_ms, int64_t now_ms);

/* The passing of time: after CES_WINDOW_QUIET_MS without a late event the window shrinks toward its
 * start. Returns true when it changed. */
bool ces_window_tick(ces_window_t *window, int64_t now_ms);

static inline int64_t ces_window_ms(const ces_window_t *window) { return window->current_ms; }

#endif
