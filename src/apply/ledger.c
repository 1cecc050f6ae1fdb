#include "apply/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/decode.h"
#include "format/utf8.h"
#include "util/map.h"
#include "util/strbuf.h"

/* Sends sql with its n parameters (text unless formats says otherwise), whose result is of kind
 * for batch item item. */
static int send_query(ces_inflight_t *q, const char *sql, int n, const char *const *values,
                      const int *lengths, const int *formats, ces_inflight_kind_t kind, long item) {
    int ok = PQsendQueryParams(ces_inflight_conn(q), sql, n, NULL, values, lengths, formats, 0);
    return ces_inflight_sent(q, ok, kind, item);
}

/* Returns a malloc'd copy of s where every byte that is not part of valid UTF-8 is '?', so that
 * messages built from untrusted names can be stored as text. */
static char *utf8_sanitize(const char *s) {
    size_t len = strlen(s);
    char *out = malloc(len + 1);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len;) {
        size_t valid = ces_utf8_check(s + i, len - i);
        memcpy(out + i, s + i, valid);
        i += valid;
        if (i < len)
            out[i++] = '?';
    }
    out[len] = '\0';
    return out;
}

/* Appends the offsets of item's records (when retrying: the ids of its dead letters) to a bigint[]
 * literal being built, *n of them so far. */
static void add_source_ids(ces_strbuf_t *ids, const ces_item_t *item, size_t *n) {
    for (size_t m = 0; m <= item->nmore_sources; m++) {
        const ces_source_t *src = m == 0 ? &item->source : &item->more_sources[m - 1];
        ces_strbuf_addf(ids, "%s%lld", (*n)++ ? "," : "", (long long)src->offset);
    }
}

/* The ids of the dead letters item was retried from, as a bigint[] literal ("{3,7}"); NULL when
 * out of memory. */
static char *retried_ids(const ces_item_t *item) {
    ces_strbuf_t ids = {0};
    size_t n = 0;
    ces_strbuf_add(&ids, "{");
    add_source_ids(&ids, item, &n);
    ces_strbuf_add(&ids, "}");
    if (ids.failed) {
        ces_strbuf_free(&ids);
        return NULL;
    }
    return ids.buf;
}

int ces_ledger_dead_letter(ces_inflight_t *q, const ces_metadata_t *metadata, long idx,
                           const ces_item_t *item, bool retrying) {
    char partition[16], offset[24], table[2 * CES_DECODE_MAX_NAME_BYTES + 2];
    snprintf(partition, sizeof(partition), "%d", (int)item->source.partition);
    snprintf(offset, sizeof(offset), "%lld", (long long)item->source.offset);
    const char *parts[] = {item->event.schema, item->event.table};
    bool decoded = item->event.table != NULL && item->event.schema != NULL;
    if (decoded)
        ces_map_key(table, sizeof(table), '.', parts, 2);
    char *reason = utf8_sanitize(item->reason ? item->reason : "unknown");
    char *topic = utf8_sanitize(item->source.topic ? item->source.topic : "");
    char *logicalid = item->logicalid ? utf8_sanitize(item->logicalid) : NULL;
    char *source_table = decoded ? utf8_sanitize(table) : NULL;
    char *ids = retrying ? retried_ids(item) : NULL;
    int rc = -1;
    if (reason == NULL || topic == NULL || (item->logicalid && logicalid == NULL) ||
        (decoded && source_table == NULL) || (retrying && ids == NULL)) {
        ces_inflight_out_of_memory(q);
        goto done;
    }
    const char *class = ces_dl_class_name(item->dl_class);
    if (retrying) {
        const char *values[4] = {reason, class, source_table, ids};
        rc = send_query(q, ces_metadata_dead_letter_again_sql(metadata), 4, values, NULL, NULL,
                        CES_INFLIGHT_DEAD_LETTER, idx);
        goto done;
    }
    const char *values[8] = {topic, partition, offset, reason, logicalid, item->raw, class,
                             source_table};
    int lengths[8] = {0, 0, 0, 0, 0, (int)item->raw_len, 0, 0};
    int formats[8] = {0, 0, 0, 0, 0, 1, 0, 0};
    if (item->raw == NULL)
        values[5] = NULL;
    rc = send_query(q, ces_metadata_dead_letter_sql(metadata), 8, values, lengths, formats,
                    CES_INFLIGHT_DEAD_LETTER, idx);
done:
    free(reason);
    free(topic);
    free(logicalid);
    free(source_table);
    free(ids);
    return rc;
}

/* The dead letters retried into batch's events that applied leave the table with them. */
static int send_retired(ces_inflight_t *q, const ces_metadata_t *metadata,
                        const ces_batch_t *batch) {
    ces_strbuf_t ids = {0};
    size_t n = 0;
    ces_strbuf_add(&ids, "{");
    for (size_t i = 0; i < batch->count; i++) {
        const ces_item_t *item = &batch->items[i];
        if (item->kind == CES_ITEM_EVENT)
            add_source_ids(&ids, item, &n);
    }
    ces_strbuf_add(&ids, "}");
    int rc = -1;
    if (ids.failed) {
        ces_inflight_out_of_memory(q);
    } else if (n == 0) {
        rc = 0;
    } else {
        const char *values[1] = {ids.buf};
        rc = send_query(q, ces_metadata_dead_letters_retired_sql(metadata), 1, values, NULL,
                        NULL, CES_INFLIGHT_OTHER, -1);
    }
    ces_strbuf_free(&ids);
    return rc;
}

/* The group's progress: the newest commit the batch applies, and the window in force. */
static int send_progress(ces_inflight_t *q, const ces_metadata_t *metadata,
                         const ces_positions_t *positions, const ces_batch_t *batch) {
    const ces_item_t *newest = NULL;
    for (size_t i = 0; i < batch->count; i++) {
        const ces_item_t *item = &batch->items[i];
        if (item->kind == CES_ITEM_EVENT &&
            (newest == NULL ||
             ces_version_compare(&item->event.version, &newest->event.version) > 0))
            newest = item;
    }
    if (newest == NULL)
        return 0;
    char lsn[23], time[32], window[24];
    double seconds;
    ces_lsn_format(newest->event.version.commit_lsn, lsn);
    bool has_time = ces_event_parse_time(newest->event.time, &seconds) == 0;
    if (has_time)
        snprintf(time, sizeof(time), "%.6f", seconds);
    snprintf(window, sizeof(window), "%lld", (long long)batch->reorder_window_ms);
    const char *values[4] = {ces_positions_group(positions), lsn, has_time ? time : NULL,
                             batch->reorder_window_ms >= 0 ? window : NULL};
    return send_query(q, ces_metadata_progress_sql(metadata), 4, values, NULL, NULL,
                      CES_INFLIGHT_OTHER, -1);
}

int ces_ledger_writer_check(ces_inflight_t *q, const ces_positions_t *positions) {
    const char *writer[3];
    const char *sql = ces_positions_writer_sql(positions, false, writer);
    return sql == NULL ? 0 : send_query(q, sql, 3, writer, NULL, NULL, CES_INFLIGHT_OFFSET, -1);
}

int ces_ledger_positions(ces_inflight_t *q, const ces_metadata_t *metadata,
                         const ces_positions_t *positions, const ces_batch_t *batch) {
    const char *writer[3];
    const char *writer_sql = ces_positions_writer_sql(positions, true, writer);
    if (writer_sql != NULL && send_query(q, writer_sql, 3, writer, NULL, NULL,
                                         CES_INFLIGHT_OFFSET, -1) != 0)
        return -1;
    for (size_t i = 0; i < batch->npositions; i++) {
        ces_positions_params_t params;
        ces_positions_update_params(positions, &batch->positions[i], &params);
        if (send_query(q, ces_positions_update_sql(positions), CES_POSITIONS_UPDATE_NPARAMS,
                       params.values, NULL, NULL, CES_INFLIGHT_OFFSET, (long)i) != 0)
            return -1;
    }
    if (batch->retrying ? send_retired(q, metadata, batch) != 0
                        : send_progress(q, metadata, positions, batch) != 0)
        return -1;
    for (size_t i = 0; i < batch->ngaps; i++) {
        ces_positions_gap_params_t params;
        ces_positions_gap_params(positions, &batch->gaps[i], &params);
        if (send_query(q, ces_positions_gap_sql(positions), CES_POSITIONS_GAP_NPARAMS,
                       params.values, NULL, NULL, CES_INFLIGHT_OTHER, -1) != 0)
            return -1;
    }
    return 0;
}
