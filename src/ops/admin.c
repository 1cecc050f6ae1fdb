#include "ops/admin.h"

#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_gen.h>

#include "apply/adopt.h"
#include "apply/tableplan.h"
#include "input/consumer.h"
#include "format/json.h"
#include "util/log.h"
#include "format/types.h"
#include "util/array.h"

/* ---------------------------------------------------------------------------------------------- */
/* JSON output                                                                                    */

static void json_key(yajl_gen g, const char *key) {
    yajl_gen_string(g, (const unsigned char *)key, strlen(key));
}

static void json_str(yajl_gen g, const char *key, const char *value) {
    json_key(g, key);
    if (value == NULL)
        yajl_gen_null(g);
    else
        yajl_gen_string(g, (const unsigned char *)value, strlen(value));
}

static void json_int(yajl_gen g, const char *key, long long value) {
    json_key(g, key);
    yajl_gen_integer(g, value);
}

/* A figure that cannot be negative, where -1 means not known (no position stored, a broker that
 * did not answer): null, which a reader cannot take for a number. */
static void json_count(yajl_gen g, const char *key, long long value) {
    json_key(g, key);
    if (value >= 0)
        yajl_gen_integer(g, value);
    else
        yajl_gen_null(g);
}

/* Writes what g holds to out, with a newline, and frees it. */
static void json_flush(yajl_gen g, FILE *out) {
    const unsigned char *buf;
    size_t len;
    if (yajl_gen_get_buf(g, &buf, &len) == yajl_gen_status_ok) {
        fwrite(buf, 1, len, out);
        fputc('\n', out);
    }
    yajl_gen_free(g);
}

/* ---------------------------------------------------------------------------------------------- */
/* Text output                                                                                    */

/* Text for a terminal: escaped (util/log.h) in buf, cut to fit; "-" for NULL. Names, reasons and
 * messages come from events, PostgreSQL and the brokers: none may move the cursor or end a line. */
static const char *safe(char *buf, size_t size, const char *text) {
    if (text == NULL)
        return "-";
    ces_log_escape(buf, size, text, strlen(text));
    return buf;
}

/* "ces2pg: WHAT: MESSAGE" on err, the message (libpq's or librdkafka's, often over several
 * lines) escaped, however long. */
static void say_error(FILE *err, const char *what, const char *message) {
    fprintf(err, "ces2pg: %s: ", what);
    ces_log_escape_put(err, message);
    fputc('\n', err);
}

/* ---------------------------------------------------------------------------------------------- */
/* dead-letters list, show, purge                                                                 */

typedef struct {
    FILE *out;
    yajl_gen g; /* NULL: text */
} list_t;

static void dead_letter_json(yajl_gen g, const ces_dead_letter_row_t *dl) {
    json_int(g, "id", dl->id);
    json_str(g, "created_at", dl->created_at);
    json_str(g, "class", dl->class);
    json_str(g, "source_table", dl->source_table);
    json_str(g, "topic", dl->topic);
    json_int(g, "partition", dl->partition);
    json_int(g, "offset", dl->offset);
    json_str(g, "reason", dl->reason);
    json_str(g, "logicalid", dl->logicalid);
    json_str(g, "retried_at", dl->retried_at);
    json_int(g, "payload_bytes", (long long)dl->payload_len);
}

static void list_row(void *arg, const ces_dead_letter_row_t *dl) {
    list_t *l = arg;
    if (l->g != NULL) {
        yajl_gen_map_open(l->g);
        dead_letter_json(l->g, dl);
        yajl_gen_map_close(l->g);
        return;
    }
    char created[128], class[128], topic[1024], table[1024], reason[201];
    fprintf(l->out, "%-8lld %-29.29s %-20s %s[%d]@%lld %s: %s\n", (long long)dl->id,
            safe(created, sizeof(created), dl->created_at), safe(class, sizeof(class), dl->class),
            safe(topic, sizeof(topic), dl->topic), (int)dl->partition, (long long)dl->offset,
            safe(table, sizeof(table), dl->source_table), safe(reason, sizeof(reason), dl->reason));
}

int ces_admin_list(ces_inspect_t *inspect, const char *class, const char *table, bool json,
                   FILE *out, char *errstr, size_t errstr_size) {
    list_t l = {out, json ? yajl_gen_alloc(NULL) : NULL};
    if (json && l.g == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    if (l.g != NULL)
        yajl_gen_array_open(l.g);
    else
        fprintf(out, "%-8s %-29s %-20s %s\n", "ID", "CREATED", "CLASS",
                "TOPIC[PARTITION]@OFFSET TABLE: REASON");
    long n = ces_inspect_dead_letters(inspect, class, table, list_row, &l, errstr, errstr_size);
    if (l.g != NULL) {
        yajl_gen_array_close(l.g);
        if (n >= 0)
            json_flush(l.g, out);
        else
            yajl_gen_free(l.g);
    } else if (n >= 0) {
        fprintf(out, "(%ld dead letter%s)\n", n, n == 1 ? "" : "s");
    }
    return n < 0 ? -1 : 0;
}

/* True when bytes are UTF-8 text without NULs or line breaks: printable as one line as they are
 * (and as a JSON string: yajl_gen does not check UTF-8 here). */
static bool one_line_text(const unsigned char *p, size_t len) {
    return ces_utf8_valid((const char *)p, len) && memchr(p, '\0', len) == NULL &&
           memchr(p, '\n', len) == NULL && memchr(p, '\r', len) == NULL;
}

typedef struct {
    FILE *out;
    bool json;
    bool failed; /* out of memory */
} show_t;

/* "label:        value", the value escaped; absent: none. */
static void show_field(FILE *out, const char *label, const char *value, const char *none) {
    fprintf(out, "%-14s", label);
    ces_log_escape_put(out, value != NULL ? value : none);
    fputc('\n', out);
}

static void show_text(FILE *out, const ces_dead_letter_row_t *dl, bool text, const char *b64) {
    char record[1024];
    fprintf(out, "id:           %lld\n", (long long)dl->id);
    show_field(out, "created at:", dl->created_at, "-");
    show_field(out, "class:", dl->class, "-");
    show_field(out, "source table:", dl->source_table, "-");
    fprintf(out, "record:       %s[%d]@%lld\n", safe(record, sizeof(record), dl->topic),
            (int)dl->partition, (long long)dl->offset);
    show_field(out, "logicalid:", dl->logicalid, "-");
    show_field(out, "retried at:", dl->retried_at, "never");
    show_field(out, "reason:", dl->reason, "-");
    fprintf(out, "payload:      %zu bytes, %s (one line, as `ces2pg replay` reads it):\n",
            dl->payload_len, text ? "text" : "base64");
    if (text)
        fwrite(dl->payload, 1, dl->payload_len, out);
    else
        fputs(b64, out);
    fputc('\n', out);
}

static void show_row(void *arg, const ces_dead_letter_row_t *dl) {
    show_t *s = arg;
    /* For a terminal, only text with nothing to escape is shown as it is: escaped, it would no
     * longer be the record replay reads, and base64 is. */
    bool text = one_line_text(dl->payload, dl->payload_len) &&
                (s->json || ces_log_is_plain((const char *)dl->payload, dl->payload_len));
    char *b64 = text ? NULL : ces_base64_encode(dl->payload, dl->payload_len);
    if (!text && b64 == NULL) {
        s->failed = true;
        return;
    }
    if (s->json) {
        yajl_gen g = yajl_gen_alloc(NULL);
        if (g == NULL) {
            s->failed = true;
            free(b64);
            return;
        }
        yajl_gen_map_open(g);
        dead_letter_json(g, dl);
        json_str(g, "payload_encoding", text ? "text" : "base64");
        json_key(g, "payload");
        yajl_gen_string(g, text ? dl->payload : (const unsigned char *)b64,
                        text ? dl->payload_len : strlen(b64));
        yajl_gen_map_close(g);
        json_flush(g, s->out);
    } else {
        show_text(s->out, dl, text, b64);
    }
    free(b64);
}

int ces_admin_show(ces_inspect_t *inspect, int64_t id, bool json, FILE *out, char *errstr,
                   size_t errstr_size) {
    show_t s = {out, json, false};
    int found = ces_inspect_dead_letter(inspect, id, show_row, &s, errstr, errstr_size);
    if (found < 0)
        return -1;
    if (s.failed) {
        snprintf(errstr, errstr_size, "out of memory");
        return -1;
    }
    return found ? 0 : 1;
}

int ces_admin_purge(ces_inspect_t *inspect, const char *before, FILE *out, char *errstr,
                    size_t errstr_size) {
    /* An age is a number and a unit ("30 days"); anything else is a time. */
    char *end;
    strtod(before, &end);
    bool is_interval = end != before && *end == ' ';
    long n = ces_inspect_purge(inspect, before, is_interval, errstr, errstr_size);
    if (n < 0)
        return -1;
    fprintf(out, "purged %ld dead letter%s made before %s%s\n", n, n == 1 ? "" : "s",
            is_interval ? "now minus " : "", before);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* dead-letters retry: a feed of dead letters                                                     */

struct ces_retry_feed_s {
    ces_inspect_t *inspect;
    int64_t *ids;
    size_t n, next;
    size_t handed; /* ids[0..handed) were found and handed to the pipeline */
    unsigned char *payload; /* the record being handed over, until the next poll */
    size_t len;
    int64_t id;
    bool found;
    bool failed;
};

ces_retry_feed_t *ces_retry_feed_new(ces_inspect_t *inspect, const int64_t *ids, size_t n) {
    ces_retry_feed_t *r = calloc(1, sizeof(*r));
    if (r == NULL || (r->ids = malloc((n + 1) * sizeof(*ids))) == NULL) {
        free(r);
        return NULL;
    }
    memcpy(r->ids, ids, n * sizeof(*ids));
    r->n = n;
    r->inspect = inspect;
    return r;
}

void ces_retry_feed_destroy(ces_retry_feed_t *r) {
    if (r == NULL)
        return;
    free(r->ids);
    free(r);
}

static void take_payload(void *arg, const ces_dead_letter_row_t *dl) {
    ces_retry_feed_t *r = arg;
    r->found = true;
    r->len = dl->payload_len;
    r->payload = malloc(dl->payload_len + 1);
    if (r->payload == NULL) {
        r->failed = true;
        return;
    }
    if (dl->payload_len > 0)
        memcpy(r->payload, dl->payload, dl->payload_len);
}

static ces_poll_status_t retry_poll(void *opaque, int timeout_ms, ces_record_t *record,
                                    char *errstr, size_t errstr_size) {
    (void)timeout_ms;
    ces_retry_feed_t *r = opaque;
    while (r->next < r->n) {
        r->id = r->ids[r->next++];
        r->found = r->failed = false;
        r->payload = NULL;
        if (ces_inspect_dead_letter(r->inspect, r->id, take_payload, r, errstr, errstr_size) < 0)
            return CES_POLL_FATAL;
        if (r->failed) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_POLL_FATAL;
        }
        if (!r->found) {
            ces_log_warning("dead letter %lld is not in the table (never was, or purged or "
                            "retried meanwhile)", (long long)r->id);
            continue;
        }
        r->ids[r->handed++] = r->id; /* next > handed: never overwrites one still to come */
        *record = (ces_record_t){.topic = CES_ADMIN_RETRY_TOPIC,
                                 .partition = 0,
                                 .offset = r->id,
                                 .value = r->payload,
                                 .len = r->len,
                                 .handle = r->payload};
        return CES_POLL_RECORD;
    }
    return CES_POLL_END;
}

static void retry_give_back(void *opaque, void *handle) {
    (void)opaque;
    free(handle);
}

const int64_t *ces_retry_feed_handed(const ces_retry_feed_t *r, size_t *n) {
    *n = r->handed;
    return r->ids;
}

void ces_retry_feed(ces_retry_feed_t *r, ces_feed_t *feed) {
    *feed = (ces_feed_t){.poll = retry_poll, .give_back = retry_give_back, .opaque = r};
}

/* ---------------------------------------------------------------------------------------------- */
/* status                                                                                         */

typedef struct {
    char *topic;
    int32_t partition;
    int64_t low, high;  /* -1: unknown */
    int64_t stored;     /* -1: no position in PostgreSQL */
    char *updated_at;   /* of the stored position */
} part_status_t;

typedef struct {
    part_status_t *parts;
    size_t nparts, cap;
    bool progress_found;
    char *last_commit_lsn, *last_commit_time;
    int64_t window_ms;
    double since_update_s;
    ces_dead_letter_count_t *dls; /* strings owned (copied) */
    size_t ndls, dls_cap;
    int64_t dead_letters;
    ces_gap_row_t *gaps; /* strings owned (copied) */
    size_t ngaps, gaps_cap;
    ces_instance_row_t *instances; /* strings owned (copied) */
    size_t ninstances, instances_cap;
    bool nomem;
} status_t;

static char *dup_or_null(status_t *s, const char *text) {
    if (text == NULL)
        return NULL;
    char *copy = strdup(text);
    if (copy == NULL)
        s->nomem = true;
    return copy;
}

static void status_partition(void *arg, const char *topic, int32_t partition, int64_t low,
                             int64_t high) {
    status_t *s = arg;
    part_status_t *parts = CES_ARRAY_RESERVE(s->parts, s->cap, s->nparts + 1, 16);
    if (parts == NULL) {
        s->nomem = true;
        return;
    }
    s->parts = parts;
    s->parts[s->nparts++] = (part_status_t){dup_or_null(s, topic), partition, low, high, -1, NULL};
}

static void status_position(void *arg, const ces_position_row_t *row) {
    status_t *s = arg;
    for (size_t i = 0; i < s->nparts; i++) {
        part_status_t *p = &s->parts[i];
        if (p->partition == row->partition && p->topic && strcmp(p->topic, row->topic) == 0) {
            p->stored = row->next_offset;
            p->updated_at = dup_or_null(s, row->updated_at);
        }
    }
}

static void status_progress(void *arg, const ces_progress_row_t *row) {
    status_t *s = arg;
    s->progress_found = row->found;
    s->window_ms = row->reorder_window_ms;
    s->since_update_s = row->seconds_since_update;
    s->last_commit_lsn = dup_or_null(s, row->last_commit_lsn);
    s->last_commit_time = dup_or_null(s, row->last_commit_time);
}

static void status_dead_letters(void *arg, const ces_dead_letter_count_t *row) {
    status_t *s = arg;
    ces_dead_letter_count_t *dls = CES_ARRAY_RESERVE(s->dls, s->dls_cap, s->ndls + 1, 8);
    if (dls == NULL) {
        s->nomem = true;
        return;
    }
    s->dls = dls;
    s->dls[s->ndls++] = (ces_dead_letter_count_t){dup_or_null(s, row->class), row->count,
                                                  dup_or_null(s, row->newest)};
    s->dead_letters += row->count;
}

static void status_gap(void *arg, const ces_gap_row_t *row) {
    status_t *s = arg;
    ces_gap_row_t *gaps = CES_ARRAY_RESERVE(s->gaps, s->gaps_cap, s->ngaps + 1, 8);
    if (gaps == NULL) {
        s->nomem = true;
        return;
    }
    s->gaps = gaps;
    ces_gap_row_t g = *row;
    g.recorded_at = dup_or_null(s, row->recorded_at);
    g.topic = dup_or_null(s, row->topic);
    g.reason = dup_or_null(s, row->reason);
    s->gaps[s->ngaps++] = g;
}

static void status_instance(void *arg, const ces_instance_row_t *row) {
    status_t *s = arg;
    ces_instance_row_t *is = CES_ARRAY_RESERVE(s->instances, s->instances_cap, s->ninstances + 1, 4);
    if (is == NULL) {
        s->nomem = true;
        return;
    }
    s->instances = is;
    s->instances[s->ninstances++] = (ces_instance_row_t){
        dup_or_null(s, row->holder), dup_or_null(s, row->role), dup_or_null(s, row->since),
        row->seen_seconds_ago};
}

static void status_free(status_t *s) {
    for (size_t i = 0; i < s->ninstances; i++) {
        free((char *)s->instances[i].holder);
        free((char *)s->instances[i].role);
        free((char *)s->instances[i].since);
    }
    free(s->instances);
    for (size_t i = 0; i < s->nparts; i++) {
        free(s->parts[i].topic);
        free(s->parts[i].updated_at);
    }
    free(s->parts);
    for (size_t i = 0; i < s->ndls; i++) {
        free((char *)s->dls[i].class);
        free((char *)s->dls[i].newest);
    }
    free(s->dls);
    for (size_t i = 0; i < s->ngaps; i++) {
        free((char *)s->gaps[i].recorded_at);
        free((char *)s->gaps[i].topic);
        free((char *)s->gaps[i].reason);
    }
    free(s->gaps);
    free(s->last_commit_lsn);
    free(s->last_commit_time);
}

static int64_t lag_of(const part_status_t *p) {
    if (p->high < 0)
        return -1;
    int64_t from = p->stored >= 0 ? p->stored : p->low;
    return from >= 0 && p->high > from ? p->high - from : 0;
}

/* The verdict, and why, from what was gathered. */
static ces_admin_health_t judge(const status_t *s, int members, const char *group,
                                const ces_admin_status_options_t *o, char *why, size_t why_size) {
    int64_t lag = 0;
    for (size_t i = 0; i < s->nparts; i++)
        lag += lag_of(&s->parts[i]) > 0 ? lag_of(&s->parts[i]) : 0;
    if (members == 0) {
        snprintf(why, why_size, "no ces2pg of group %s is running (%lld records waiting)", group,
                 (long long)lag);
        return CES_ADMIN_CRITICAL;
    }
    if (lag > 0 && (!s->progress_found || s->since_update_s > (double)o->stale_after_s)) {
        snprintf(why, why_size,
                 "stalled: %lld records waiting and no commit for %.0f s (--stale-after %lld)",
                 (long long)lag, s->progress_found ? s->since_update_s : -1.0,
                 (long long)o->stale_after_s);
        return CES_ADMIN_CRITICAL;
    }
    if (s->ngaps > 0) {
        snprintf(why, why_size, "%zu source gap(s) recorded: changes missing from PostgreSQL",
                 s->ngaps);
        return CES_ADMIN_WARNING;
    }
    if (s->dead_letters > 0) {
        snprintf(why, why_size, "%lld dead letter(s) to look at (ces2pg dead-letters list)",
                 (long long)s->dead_letters);
        return CES_ADMIN_WARNING;
    }
    if (o->max_lag > 0 && lag > o->max_lag) {
        snprintf(why, why_size, "%lld records waiting (--max-lag %lld)", (long long)lag,
                 (long long)o->max_lag);
        return CES_ADMIN_WARNING;
    }
    snprintf(why, why_size, "%lld records waiting", (long long)lag);
    return CES_ADMIN_OK;
}

static const char *health_name(ces_admin_health_t h) {
    static const char *const names[] = {"OK", "WARNING", "CRITICAL", "UNKNOWN"};
    return names[h];
}

static void print_status_text(const status_t *s, int members, const char *state,
                              const char *group, ces_admin_health_t h, const char *why,
                              FILE *out) {
    char a[1024], b[1024], c[256]; /* escaped texts (safe) */
    if (members >= 0)
        fprintf(out, "group %s: %d member(s), state %s\n", safe(a, sizeof(a), group), members,
                safe(c, sizeof(c), state));
    else
        fprintf(out, "group %s: members unknown (the brokers did not say)\n",
                safe(a, sizeof(a), group));
    fprintf(out, "%-32s %12s %12s %10s  %s\n", "PARTITION", "STORED", "HIGH", "LAG",
            "STORED AT");
    for (size_t i = 0; i < s->nparts; i++) {
        const part_status_t *p = &s->parts[i];
        char name[300], stored[24] = "-", high[24] = "?", lag[24] = "?";
        snprintf(name, sizeof(name), "%s[%d]", safe(a, sizeof(a) / 4, p->topic),
                 (int)p->partition);
        if (p->stored >= 0)
            snprintf(stored, sizeof(stored), "%lld", (long long)p->stored);
        if (p->high >= 0)
            snprintf(high, sizeof(high), "%lld", (long long)p->high);
        if (lag_of(p) >= 0)
            snprintf(lag, sizeof(lag), "%lld", (long long)lag_of(p));
        fprintf(out, "%-32s %12s %12s %10s  %s\n", name, stored, high, lag,
                safe(c, sizeof(c), p->updated_at));
    }
    if (s->progress_found)
        fprintf(out, "last commit applied: LSN %s, committed at the source %s, %.1f s ago\n",
                s->last_commit_lsn ? safe(a, sizeof(a), s->last_commit_lsn) : "?",
                s->last_commit_time ? safe(b, sizeof(b), s->last_commit_time) : "?",
                s->since_update_s);
    else
        fprintf(out, "last commit applied: none yet\n");
    if (s->window_ms >= 0)
        fprintf(out, "reorder window: %lld ms (as of the last commit)\n", (long long)s->window_ms);
    fprintf(out, "dead letters: %lld", (long long)s->dead_letters);
    for (size_t i = 0; i < s->ndls; i++)
        fprintf(out, "%s %s %lld (newest %s)", i ? "," : ":", safe(a, sizeof(a), s->dls[i].class),
                (long long)s->dls[i].count, safe(b, sizeof(b), s->dls[i].newest));
    for (size_t i = 0; i < s->ninstances; i++)
        fprintf(out, "%s%s %s since %s", i ? ", " : "\ninstances: ",
                safe(a, sizeof(a), s->instances[i].role), safe(b, sizeof(b), s->instances[i].holder),
                safe(c, sizeof(c), s->instances[i].since));
    fprintf(out, "\nsource gaps: %zu\n", s->ngaps);
    for (size_t i = 0; i < s->ngaps; i++) {
        const ces_gap_row_t *g = &s->gaps[i];
        fprintf(out, "  %s %s[%d]: stored %lld, resumed at %lld, %lld record(s) skipped\n",
                safe(c, sizeof(c), g->recorded_at), safe(a, sizeof(a), g->topic),
                (int)g->partition, (long long)g->stored_position,
                (long long)g->resumed_at, (long long)g->skipped_records);
    }
    fprintf(out, "health: %s: %s\n", health_name(h), safe(a, sizeof(a), why));
}

static void print_status_json(const status_t *s, int members, const char *state,
                              const char *group, ces_admin_health_t h, const char *why,
                              FILE *out) {
    yajl_gen g = yajl_gen_alloc(NULL);
    if (g == NULL)
        return;
    yajl_gen_map_open(g);
    json_str(g, "group", group);
    json_key(g, "members");
    if (members >= 0)
        yajl_gen_integer(g, members);
    else
        yajl_gen_null(g);
    json_str(g, "group_state", state);
    json_key(g, "partitions");
    yajl_gen_array_open(g);
    for (size_t i = 0; i < s->nparts; i++) {
        const part_status_t *p = &s->parts[i];
        yajl_gen_map_open(g);
        json_str(g, "topic", p->topic);
        json_int(g, "partition", p->partition);
        json_count(g, "stored_position", p->stored);
        json_count(g, "low_watermark", p->low);
        json_count(g, "high_watermark", p->high);
        json_count(g, "lag", lag_of(p));
        json_str(g, "stored_at", p->updated_at);
        yajl_gen_map_close(g);
    }
    yajl_gen_array_close(g);
    json_str(g, "last_commit_lsn", s->last_commit_lsn);
    json_str(g, "last_commit_time", s->last_commit_time);
    json_key(g, "seconds_since_last_commit");
    if (s->progress_found)
        yajl_gen_double(g, s->since_update_s);
    else
        yajl_gen_null(g);
    json_count(g, "reorder_window_ms", s->window_ms);
    json_key(g, "dead_letters");
    yajl_gen_map_open(g);
    for (size_t i = 0; i < s->ndls; i++)
        json_int(g, s->dls[i].class, s->dls[i].count);
    yajl_gen_map_close(g);
    json_key(g, "source_gaps");
    yajl_gen_array_open(g);
    for (size_t i = 0; i < s->ngaps; i++) {
        const ces_gap_row_t *gap = &s->gaps[i];
        yajl_gen_map_open(g);
        json_str(g, "recorded_at", gap->recorded_at);
        json_str(g, "topic", gap->topic);
        json_int(g, "partition", gap->partition);
        json_int(g, "stored_position", gap->stored_position);
        json_int(g, "resumed_at", gap->resumed_at);
        json_count(g, "skipped_records", gap->skipped_records);
        json_str(g, "reason", gap->reason);
        yajl_gen_map_close(g);
    }
    yajl_gen_array_close(g);
    json_key(g, "instances");
    yajl_gen_array_open(g);
    for (size_t i = 0; i < s->ninstances; i++) {
        yajl_gen_map_open(g);
        json_str(g, "holder", s->instances[i].holder);
        json_str(g, "role", s->instances[i].role);
        json_str(g, "since", s->instances[i].since);
        yajl_gen_map_close(g);
    }
    yajl_gen_array_close(g);
    json_str(g, "health", health_name(h));
    json_str(g, "reason", why);
    yajl_gen_map_close(g);
    json_flush(g, out);
}

ces_admin_health_t ces_admin_status(const ces_config_t *config,
                                    const ces_admin_status_options_t *o, FILE *out, FILE *err) {
    status_t s = {.window_ms = -1};
    char errstr[1024], state[64], why[512];
    int members = -1;
    ces_admin_health_t h = CES_ADMIN_UNKNOWN;
    ces_inspect_options_t io = {config->pg_conninfo,           config->pg_password,
                                config->schema_metadata,       config->apply_version_column,
                                config->kafka_group_id,        config->pg_token};
    ces_inspect_t *inspect = ces_inspect_open(&io, errstr, sizeof(errstr));
    if (inspect == NULL) {
        say_error(err, "status", errstr);
        goto done;
    }
    if (ces_consumer_inspect(config, status_partition, &s, &members, state, sizeof(state), errstr,
                             sizeof(errstr)) != CES_CONSUMER_OK) {
        say_error(err, "status", errstr);
        goto done;
    }
    ces_inspect_status_fns_t fns = {status_position, status_progress, status_dead_letters,
                                    status_gap,      &s,              status_instance};
    if (ces_inspect_status(inspect, &fns, errstr, sizeof(errstr)) != 0) {
        say_error(err, "status", errstr);
        goto done;
    }
    if (s.nomem) {
        fprintf(err, "ces2pg: status: out of memory\n");
        goto done;
    }
    /* In transaction order the writer's static membership outlives a clean stop until its
     * session times out; the instances it keeps in PostgreSQL (gone at a clean stop) say. */
    if (strcmp(config->apply_ordering, "transaction") == 0 && s.ninstances == 0 && members > 0)
        members = 0;
    h = judge(&s, members, config->kafka_group_id, o, why, sizeof(why));
    if (o->json)
        print_status_json(&s, members, state, config->kafka_group_id, h, why, out);
    else
        print_status_text(&s, members, state, config->kafka_group_id, h, why, out);
done:
    status_free(&s);
    ces_inspect_close(inspect);
    return h;
}

/* ---------------------------------------------------------------------------------------------- */
/* adopt                                                                                          */

typedef struct {
    ces_adopt_t *adopt;
    ces_lsn_t lsn;
    FILE *out, *err;
    long tables, adopted, without_key, failed;
    long long rows;
} adopting_t;

/* Adopts one table and says how it went. */
static void adopt_one(adopting_t *ad, const char *schema, const char *table, bool listed) {
    long long marked;
    bool kept_higher;
    char err[1024], lsn[23], raw[1024], name[1024];
    ces_lsn_format(ad->lsn, lsn);
    /* Target names come from events: escaped, like everything ces2pg prints for a terminal. */
    snprintf(raw, sizeof(raw), "%s.%s", schema, table);
    safe(name, sizeof(name), raw);
    ad->tables++;
    switch (ces_adopt_table(ad->adopt, schema, table, ad->lsn, &marked, &kept_higher, err,
                            sizeof(err))) {
    case CES_ADOPT_OK:
        ad->adopted++;
        ad->rows += marked;
        fprintf(ad->out, "adopt: %s: %lld rows marked with the version of %s%s\n", name, marked,
                lsn,
                kept_higher ? " (an earlier adoption at a later LSN keeps its trigger)" : "");
        break;
    case CES_ADOPT_NO_PRIMARY_KEY:
        ad->without_key++;
        ad->failed += !listed; /* asked for by name: an error; found by --all: reported */
        fprintf(listed ? ad->out : ad->err, "adopt: %s: no primary key: not adopted (ces2pg "
                "applies changes by key; its events become dead letters)\n", name);
        break;
    case CES_ADOPT_NO_TABLE:
        ad->failed++;
        fprintf(ad->err, "ces2pg: adopt: %s: no such table\n", name);
        break;
    case CES_ADOPT_FAILED:
        ad->failed++;
        fprintf(ad->err, "ces2pg: adopt: %s: ", name);
        ces_log_escape_put(ad->err, err);
        fputs(" (nothing of it changed)\n", ad->err);
        break;
    }
}

static void adopt_listed(void *arg, const ces_adopt_table_t *t) {
    adopt_one(arg, t->schema, t->table, true);
}

/* The schema part of schema.target when it names one schema (no placeholder), folded; else NULL. */
static char *target_schema(const ces_config_t *config, bool preserve_case) {
    const char *target = config->schema_target, *dot = strchr(target, '.');
    if (dot == NULL || memchr(target, '{', (size_t)(dot - target)) != NULL)
        return NULL;
    char *part = strndup(target, (size_t)(dot - target));
    char *folded = part != NULL ? ces_tableplan_fold_name(part, preserve_case) : NULL;
    free(part);
    return folded;
}

/* --table SCHEMA.TABLE: split at its first dot and folded as ces2pg folds target names. */
static void adopt_named(adopting_t *ad, const char *name, bool preserve_case) {
    const char *dot = strchr(name, '.');
    char *schema = dot != NULL ? strndup(name, (size_t)(dot - name)) : NULL;
    char *fs = schema != NULL ? ces_tableplan_fold_name(schema, preserve_case) : NULL;
    char *ft = dot != NULL ? ces_tableplan_fold_name(dot + 1, preserve_case) : NULL;
    if (fs != NULL && ft != NULL && fs[0] != '\0' && ft[0] != '\0') {
        adopt_one(ad, fs, ft, false);
    } else {
        ad->failed++;
        char shown[1024];
        fprintf(ad->err, "ces2pg: adopt: '%s' is not SCHEMA.TABLE\n",
                safe(shown, sizeof(shown), name));
    }
    free(schema);
    free(fs);
    free(ft);
}

int ces_admin_adopt(const ces_config_t *config, char *const *tables, size_t ntables,
                    ces_lsn_t lsn, FILE *out, FILE *err) {
    char why[1024];
    ces_adopt_options_t o = {config->pg_conninfo, config->pg_password, config->schema_metadata,
                             config->apply_version_column, config->pg_token};
    adopting_t ad = {.lsn = lsn, .out = out, .err = err};
    if ((ad.adopt = ces_adopt_open(&o, why, sizeof(why))) == NULL) {
        say_error(err, "adopt", why);
        return 1;
    }
    bool preserve = strcmp(config->schema_identifier_case, "preserve") == 0;
    if (ntables > 0) {
        for (size_t i = 0; i < ntables; i++)
            adopt_named(&ad, tables[i], preserve);
    } else {
        char *schema = target_schema(config, preserve);
        if (ces_adopt_each_table(ad.adopt, schema, adopt_listed, &ad, why, sizeof(why)) < 0) {
            say_error(err, "adopt", why);
            ad.failed++;
        } else if (ad.tables == 0) {
            fprintf(err, "ces2pg: adopt: no table in %s%s\n", schema ? "schema " : "any schema",
                    schema ? safe(why, sizeof(why), schema) : "");
            ad.failed++;
        }
        free(schema);
    }
    fprintf(out, "adopt: %ld table(s) adopted, %lld rows marked, %ld without a primary key, "
            "%ld failed\n", ad.adopted, ad.rows, ad.without_key, ad.failed);
    ces_adopt_close(ad.adopt);
    return ad.failed > 0 ? 1 : 0;
}
