/*
 * stream: the streamed source transaction (stream.h).
 */
#include "pipeline/stream.h"

#include <string.h>

#include "util/log.h"

ces_apply_status_t ces_stream_begin(ces_stream_t *s, ces_apply_t *apply, ces_lsn_t lsn,
                                    size_t max_events, size_t max_bytes, char *errstr,
                                    size_t errstr_size) {
    ces_apply_status_t rc = ces_apply_stream_begin(apply, errstr, errstr_size);
    if (rc != CES_APPLY_OK)
        return rc;
    char text[23];
    ces_lsn_format(lsn, text);
    ces_log_info("source transaction %s is larger than a batch (%zu events or %zu bytes): "
                 "streaming it into one PostgreSQL transaction",
                 text, max_events, max_bytes);
    s->open = true;
    s->lsn = lsn;
    return CES_APPLY_OK;
}

void ces_stream_part_applied(ces_stream_t *s, const ces_apply_stats_t *st) {
    s->stats.events_applied += st->events_applied;
    s->stats.dead_letters += st->dead_letters;
}

void ces_stream_committed(ces_stream_t *s, const ces_apply_stats_t *last) {
    if (s->open)
        ces_log_info("large source transaction committed (%llu events in its PostgreSQL transaction)",
                     (unsigned long long)(last->events_applied + s->stats.events_applied));
    s->open = false;
    s->complete = false;
    memset(&s->stats, 0, sizeof(s->stats));
}

void ces_stream_abort(ces_stream_t *s, ces_apply_t *apply) {
    ces_apply_stream_abort(apply);
    s->open = false;
    s->complete = false;
    memset(&s->stats, 0, sizeof(s->stats));
}
