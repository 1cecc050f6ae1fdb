#include "order/window.h"

void ces_window_init(ces_window_t *w, int64_t start_ms, int64_t max_ms, bool adaptive) {
    *w = (ces_window_t){.start_ms = start_ms,
                        .max_ms = max_ms > start_ms ? max_ms : start_ms,
                        .adaptive = adaptive,
                        .current_ms = start_ms};
}

bool ces_window_late(ces_window_t *w, int64_t lateness_ms, int64_t then_ms, int64_t now_ms) {
    w->last_late_ms = now_ms;
    if (!w->adaptive)
        return false;
    int64_t needed = then_ms + (lateness_ms > 0 ? lateness_ms : 0);
    int64_t margin = needed / 4 > CES_WINDOW_MARGIN_MIN_MS ? needed / 4 : CES_WINDOW_MARGIN_MIN_MS;
    int64_t want = needed + margin < w->max_ms ? needed + margin : w->max_ms;
    /* The late events of one episode come a little later each: they move the window once, not by
     * a few milliseconds each. */
    if (want < w->current_ms + CES_WINDOW_MARGIN_MIN_MS && want < w->max_ms)
        return false;
    if (want <= w->current_ms)
        return false;
    w->current_ms = want;
    w->last_shrink_ms = now_ms;
    return true;
}

bool ces_window_inherit(ces_window_t *w, int64_t window_ms, int64_t now_ms) {
    if (!w->adaptive)
        return false;
    int64_t want = window_ms < w->start_ms ? w->start_ms
                   : window_ms > w->max_ms ? w->max_ms
                                           : window_ms;
    w->last_late_ms = now_ms;
    w->last_shrink_ms = now_ms;
    if (want == w->current_ms)
        return false;
    w->current_ms = want;
    return true;
}

bool ces_window_tick(ces_window_t *w, int64_t now_ms) {
    if (w->current_ms == w->start_ms || now_ms - w->last_late_ms < CES_WINDOW_QUIET_MS ||
        now_ms - w->last_shrink_ms < CES_WINDOW_SHRINK_STEP_MS)
        return false;
    int64_t excess = (w->current_ms - w->start_ms) / 2;
    w->current_ms = excess < CES_WINDOW_SNAP_MS ? w->start_ms : w->start_ms + excess;
    w->last_shrink_ms = now_ms;
    return true;
}
