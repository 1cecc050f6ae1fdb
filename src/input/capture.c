#include "input/capture.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/capfile.h"
#include "util/array.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/map.h"
#include "util/strbuf.h"

/* A block may hold several records of decode.max_record_bytes, and Capture's hold far less. */
#define MIN_BLOCK_BYTES (64u << 20)
/* SystemProperties and Properties: Kafka headers and AMQP properties, a handful each. */
#define MAX_MAP_ITEMS 4096
#define PROGRESS_MS 1000

/* The archive name format's placeholders, and what each matches in a path. */
enum { P_NAMESPACE, P_EVENTHUB, P_PARTITION, P_YEAR, P_MONTH, P_DAY, P_HOUR, P_MINUTE, P_SECOND,
       NPLACEHOLDERS };
static const struct {
    const char *name, *pattern;
} placeholders[NPLACEHOLDERS] = {
    {"{Namespace}", "([^/]+)"},   {"{EventHub}", "([^/]+)"},   {"{PartitionId}", "([0-9]+)"},
    {"{Year}", "([0-9]{4})"},     {"{Month}", "([0-9]{1,2})"}, {"{Day}", "([0-9]{1,2})"},
    {"{Hour}", "([0-9]{1,2})"},   {"{Minute}", "([0-9]{1,2})"}, {"{Second}", "([0-9]{1,2})"},
};

/* One Capture file. */
typedef struct {
    char *path;
    uint64_t size;
    int64_t window; /* the time in its path */
    int64_t first;  /* its first sequence number, once probed */
    bool done;
    bool warned; /* about a record out of order */
    ces_capfile_t *open; /* while the merge reads it */
    ces_capfile_record_t head; /* its next record, while open */
    bool has_prev;
    int64_t prev; /* the sequence number before head */
} cfile_t;

/* One partition of one hub: its files, merged by sequence number. */
typedef struct {
    char *topic; /* "capture:NAMESPACE/HUB" */
    int32_t id;
    cfile_t **files; /* by first sequence number once probed */
    size_t nfiles, cap;
    size_t next_file; /* the first file not opened yet */
    cfile_t **open;   /* the files being merged */
    size_t nopen;
    bool probed, exhausted, eof_sent, paused;
    bool has_high;           /* a record went to the pipeline (the first always goes in order) */
    int64_t high;            /* the highest sequence number handed over in order */
    const char *high_path;   /* ... and its file */
    cfile_t *ready;          /* the file whose head goes next; NULL: not known yet */
} part_t;

struct ces_capture_s {
    regex_t layout;
    int groups[NPLACEHOLDERS]; /* the regex group of each placeholder */
    ces_capfile_schemas_t *schemas;
    ces_capfile_limits_t limits;
    part_t **parts;
    size_t nparts;
    ces_map_t *by_key; /* "topic\x1fid" -> part_t */
    cfile_t **all;     /* every file, for progress */
    size_t nall, cap_all;
    size_t turn;       /* the partition that went last: equals take turns after it */
    ces_capture_stats_t stats;
    bool nomem;
    bool progress;
    bool line_open; /* a progress line is on the terminal without its newline */
    int64_t started_ms, last_progress_ms;
};

/* ---------------------------------------------------------------------------------------------
 * The archive name format.
 */

/* Appends c to the expression, escaped when it means something to a regular expression. */
static void add_literal(ces_strbuf_t *re, char c) {
    char text[3] = {'\\', c, '\0'};
    ces_strbuf_add(re, strchr(".[]()*+?{}|^$\\", c) != NULL ? text : text + 1);
}

/* The format as an extended regular expression over the end of a path; groups[] gets the group
 * of each placeholder. Returns 0, or -1 with errstr set. */
static int layout_regex(const char *layout, ces_strbuf_t *re, int groups[NPLACEHOLDERS],
                        char *errstr, size_t errstr_size) {
    for (int i = 0; i < NPLACEHOLDERS; i++)
        groups[i] = 0;
    int group = 1; /* group 1 is the start of the path or a '/' */
    ces_strbuf_add(re, "(^|/)");
    for (const char *p = layout; *p != '\0';) {
        int which = -1;
        for (int i = 0; i < NPLACEHOLDERS && *p == '{' && which < 0; i++) {
            if (strncmp(p, placeholders[i].name, strlen(placeholders[i].name)) == 0)
                which = i;
        }
        if (*p == '{' && (which < 0 || groups[which] != 0)) {
            snprintf(errstr, errstr_size, "capture layout '%s': %s placeholder at '%.20s' (use "
                     "{Namespace}, {EventHub}, {PartitionId}, {Year}, {Month}, {Day}, {Hour}, "
                     "{Minute} and {Second}, each once)", layout,
                     which < 0 ? "unknown" : "repeated", p);
            return -1;
        }
        if (which < 0) {
            add_literal(re, *p++);
            continue;
        }
        groups[which] = ++group;
        ces_strbuf_add(re, placeholders[which].pattern);
        p += strlen(placeholders[which].name);
    }
    ces_strbuf_add(re, "(\\.avro)?$");
    for (int i = 0; i < NPLACEHOLDERS; i++) {
        if (groups[i] == 0) {
            snprintf(errstr, errstr_size, "capture layout '%s' lacks %s (Capture's archive name "
                     "format has every placeholder)", layout, placeholders[i].name);
            return -1;
        }
    }
    return 0;
}

int ces_capture_check_layout(const char *layout, char *errstr, size_t errstr_size) {
    ces_strbuf_t re = {0};
    int groups[NPLACEHOLDERS];
    int rc = layout_regex(layout, &re, groups, errstr, errstr_size);
    ces_strbuf_free(&re);
    return rc;
}

static int compile_layout(ces_capture_t *c, const char *layout, char *errstr, size_t errstr_size) {
    ces_strbuf_t re = {0};
    int rc = layout_regex(layout, &re, c->groups, errstr, errstr_size);
    if (rc == 0 && re.failed) {
        snprintf(errstr, errstr_size, "out of memory");
        rc = -1;
    }
    if (rc == 0 && regcomp(&c->layout, re.buf, REG_EXTENDED) != 0) {
        snprintf(errstr, errstr_size, "capture layout '%s' cannot be matched", layout);
        rc = -1;
    }
    ces_strbuf_free(&re);
    return rc;
}

/* The number in path[m] (digits only: the pattern says so), or -1 when it has more digits than
 * any int32_t. */
static int64_t group_number(const char *path, const regmatch_t *m) {
    if (m->rm_eo - m->rm_so > 10)
        return -1;
    int64_t v = 0;
    for (regoff_t i = m->rm_so; i < m->rm_eo; i++)
        v = v * 10 + (path[i] - '0');
    return v;
}

int ces_capture_match_path(const ces_capture_t *c, const char *path, int32_t *partition,
                           char *topic, size_t topic_size, int64_t *window) {
    regmatch_t m[NPLACEHOLDERS + 3];
    if (regexec(&c->layout, path, NPLACEHOLDERS + 3, m, 0) != 0)
        return -1;
    int64_t id = group_number(path, &m[c->groups[P_PARTITION]]);
    if (id < 0 || id > INT32_MAX)
        return -1;
    *partition = (int32_t)id;
    const regmatch_t *ns = &m[c->groups[P_NAMESPACE]], *hub = &m[c->groups[P_EVENTHUB]];
    snprintf(topic, topic_size, "capture:%.*s/%.*s", (int)(ns->rm_eo - ns->rm_so),
             path + ns->rm_so, (int)(hub->rm_eo - hub->rm_so), path + hub->rm_so);
    struct tm tm = {
        .tm_year = (int)group_number(path, &m[c->groups[P_YEAR]]) - 1900,
        .tm_mon = (int)group_number(path, &m[c->groups[P_MONTH]]) - 1,
        .tm_mday = (int)group_number(path, &m[c->groups[P_DAY]]),
        .tm_hour = (int)group_number(path, &m[c->groups[P_HOUR]]),
        .tm_min = (int)group_number(path, &m[c->groups[P_MINUTE]]),
        .tm_sec = (int)group_number(path, &m[c->groups[P_SECOND]]),
    };
    *window = (int64_t)timegm(&tm);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Finding the files.
 */

typedef struct {
    char **paths;
    size_t n, cap;
} pathlist_t;

static int pathlist_add(pathlist_t *l, const char *path) {
    char **bigger = CES_ARRAY_RESERVE(l->paths, l->cap, l->n + 1, 64);
    if (bigger == NULL)
        return -1;
    l->paths = bigger;
    return (l->paths[l->n++] = strdup(path)) == NULL ? -1 : 0;
}

static bool is_avro_name(const char *name) {
    size_t n = strlen(name);
    return n > 5 && strcmp(name + n - 5, ".avro") == 0;
}

/* Adds the *.avro files under dir, recursively; directories reached through a symbolic link are
 * not entered (no loops). An unreadable directory is logged and counted. Returns -1 when out of
 * memory. */
static int walk(ces_capture_t *c, const char *dir, pathlist_t *out) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        ces_log_error("capture: %s: %s", dir, strerror(errno));
        c->stats.files_failed++;
        return 0;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *child = NULL;
        if (asprintf(&child, "%s/%s", dir, e->d_name) < 0) {
            rc = -1;
            break;
        }
        struct stat st;
        if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode))
            rc = walk(c, child, out);
        else if (is_avro_name(e->d_name) && stat(child, &st) == 0 && S_ISREG(st.st_mode))
            rc = pathlist_add(out, child);
        free(child);
    }
    closedir(d);
    return rc;
}

static int compare_paths(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static part_t *partition_of(ces_capture_t *c, const char *topic, int32_t id) {
    char key[512];
    int len = snprintf(key, sizeof(key), "%s\x1f%" PRId32, topic, id);
    part_t *p = ces_map_get(c->by_key, key, (size_t)len);
    if (p != NULL)
        return p;
    part_t **bigger = realloc(c->parts, (c->nparts + 1) * sizeof(*bigger));
    if (bigger == NULL)
        return NULL;
    c->parts = bigger;
    if ((p = calloc(1, sizeof(*p))) == NULL)
        return NULL;
    p->id = id;
    if ((p->topic = strdup(topic)) == NULL || ces_map_put(c->by_key, key, (size_t)len, p) != 0) {
        free(p->topic);
        free(p);
        return NULL;
    }
    c->parts[c->nparts++] = p;
    return p;
}

/* Makes room for one more file in *files (n used of *cap). Returns 0, or -1 when out of memory. */
static int room_for_one(cfile_t ***files, size_t n, size_t *cap) {
    cfile_t **bigger = CES_ARRAY_RESERVE(*files, *cap, n + 1, 16);
    if (bigger == NULL)
        return -1;
    *files = bigger;
    return 0;
}

/* Files the Capture file at path under its partition (from its path). Returns -1 when out of
 * memory; a path that does not match the layout is logged and counted. */
static int add_file(ces_capture_t *c, const char *path, uint64_t size) {
    int32_t id;
    int64_t window;
    char topic[256];
    c->stats.files++;
    /* A path relative to a folder below the layout's first component ("." in a partition's
     * folder) matches once made absolute. */
    char *real = NULL;
    int matched = ces_capture_match_path(c, path, &id, topic, sizeof(topic), &window);
    if (matched != 0 && (real = realpath(path, NULL)) != NULL)
        matched = ces_capture_match_path(c, real, &id, topic, sizeof(topic), &window);
    free(real);
    if (matched != 0) {
        ces_log_error("capture: %s: cannot tell its partition: its path does not end as the "
                      "capture layout says (--capture-layout)", path);
        c->stats.files_failed++;
        return 0;
    }
    part_t *p = partition_of(c, topic, id);
    cfile_t *f = calloc(1, sizeof(*f));
    if (p == NULL || f == NULL || (f->path = strdup(path)) == NULL) {
        free(f);
        return -1;
    }
    f->size = size;
    f->window = window;
    if (room_for_one(&p->files, p->nfiles, &p->cap) != 0 ||
        room_for_one(&c->all, c->nall, &c->cap_all) != 0) {
        free(f->path);
        free(f);
        return -1;
    }
    p->files[p->nfiles++] = f;
    c->all[c->nall++] = f;
    return 0;
}

/* Every Capture file among paths: files as given, directories searched. Returns -1 when out of
 * memory. */
static int find_files(ces_capture_t *c, char *const *paths, size_t npaths) {
    pathlist_t found = {0};
    int rc = 0;
    for (size_t i = 0; i < npaths && rc == 0; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            ces_log_error("capture: %s: %s", paths[i], strerror(errno));
            c->stats.files_failed++;
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk(c, paths[i], &found);
        } else {
            rc = pathlist_add(&found, paths[i]);
        }
    }
    if (found.n > 0)
        qsort(found.paths, found.n, sizeof(char *), compare_paths);
    for (size_t i = 0; i < found.n && rc == 0; i++) {
        struct stat st;
        if (i > 0 && strcmp(found.paths[i], found.paths[i - 1]) == 0)
            continue; /* named twice */
        rc = add_file(c, found.paths[i], stat(found.paths[i], &st) == 0 ? (uint64_t)st.st_size : 0);
    }
    for (size_t i = 0; i < found.n; i++)
        free(found.paths[i]);
    free(found.paths);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * One partition: its files merged by sequence number.
 */

/* Clears the progress line, so that a message logged now starts a line of its own. */
static void end_progress_line(ces_capture_t *c) {
    if (c->line_open)
        fputs("\r\033[K", stderr);
    c->line_open = false;
}

static void file_close(part_t *p, cfile_t *f) {
    ces_capfile_close(f->open);
    f->open = NULL;
    f->done = true;
    free(f->head.body);
    f->head.body = NULL;
    for (size_t i = 0; p != NULL && i < p->nopen; i++) {
        if (p->open[i] == f) {
            p->open[i] = p->open[--p->nopen];
            break;
        }
    }
}

/* The file's next record into its head; at its end, or an error (logged, counted), it closes. */
static void file_advance(ces_capture_t *c, part_t *p, cfile_t *f) {
    char why[600];
    ces_capfile_status_t st = ces_capfile_next(f->open, &f->head, why, sizeof(why));
    if (st == CES_CAPFILE_RECORD)
        return;
    if (st == CES_CAPFILE_END) {
        c->stats.files_read++;
    } else if (st == CES_CAPFILE_NOMEM) {
        c->nomem = true;
    } else {
        end_progress_line(c);
        ces_log_error("capture: %s (the records before it were read; the rest of the file is "
                      "lost)", why);
        c->stats.files_failed++;
    }
    file_close(p, f);
}

/* Opens the file and reads its first record into its head. Returns true when it has one. */
static bool file_open(ces_capture_t *c, part_t *p, cfile_t *f) {
    char why[600];
    ces_capfile_status_t st;
    f->has_prev = false;
    f->open = ces_capfile_open(c->schemas, f->path, &c->limits, &st, why, sizeof(why));
    if (f->open == NULL) {
        if (st == CES_CAPFILE_NOMEM) {
            c->nomem = true;
        } else {
            end_progress_line(c);
            ces_log_error("capture: %s", why);
        }
        c->stats.files_failed += st != CES_CAPFILE_NOMEM;
        f->done = true;
        return false;
    }
    if (p != NULL)
        p->open[p->nopen++] = f;
    file_advance(c, p, f);
    return f->open != NULL;
}

static int compare_files(const void *a, const void *b) {
    const cfile_t *x = *(cfile_t *const *)a, *y = *(cfile_t *const *)b;
    if (x->done != y->done)
        return x->done ? 1 : -1;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->window != y->window)
        return x->window < y->window ? -1 : 1;
    return strcmp(x->path, y->path);
}

/* Learns each file's first sequence number (closing it again: only files that overlap the merge's
 * position stay open) and orders the files by it. Returns -1 when out of memory. */
static int probe(ces_capture_t *c, part_t *p) {
    p->probed = true;
    if ((p->open = calloc(p->nfiles + 1, sizeof(*p->open))) == NULL)
        return -1;
    for (size_t i = 0; i < p->nfiles && !c->nomem; i++) {
        cfile_t *f = p->files[i];
        if (file_open(c, NULL, f)) {
            f->first = f->head.sequence;
            ces_capfile_close(f->open);
            free(f->head.body);
            f->head.body = NULL;
            f->open = NULL;
        }
    }
    qsort(p->files, p->nfiles, sizeof(*p->files), compare_files);
    return c->nomem ? -1 : 0;
}

static cfile_t *lowest_head(const part_t *p) {
    cfile_t *min = NULL;
    for (size_t i = 0; i < p->nopen; i++) {
        if (min == NULL || p->open[i]->head.sequence < min->head.sequence)
            min = p->open[i];
    }
    return min;
}

/* The file whose head goes next, skipping sequence numbers handed over already; NULL when the
 * partition has nothing more (then it is exhausted) or memory ran out. */
static cfile_t *part_ready(ces_capture_t *c, part_t *p) {
    if (p->ready != NULL || p->exhausted)
        return p->ready;
    if (!p->probed && probe(c, p) != 0)
        return NULL;
    while (!c->nomem) {
        cfile_t *min = lowest_head(p);
        /* A file not opened yet joins once the merge reaches its first record. */
        while (p->next_file < p->nfiles) {
            cfile_t *n = p->files[p->next_file];
            if (!n->done && min != NULL && n->first > min->head.sequence)
                break;
            p->next_file++;
            if (!n->done && file_open(c, p, n))
                min = lowest_head(p);
        }
        if (min == NULL) {
            p->exhausted = true;
            return NULL;
        }
        if (min->has_prev && min->head.sequence < min->prev) {
            /* Out of order in its own file: it goes as it comes (the version guard decides). */
            c->stats.out_of_order++;
            if (!min->warned) {
                end_progress_line(c);
                ces_log_warning("capture: %s: sequence number %" PRId64 " comes after %" PRId64
                                " in the file; its records out of order go as they come",
                                min->path, min->head.sequence, min->prev);
            }
            min->warned = true;
            return p->ready = min;
        }
        if (!p->has_high || min->head.sequence > p->high)
            return p->ready = min;
        c->stats.duplicates++; /* an overlap: this sequence number went already */
        min->prev = min->head.sequence;
        min->has_prev = true;
        free(min->head.body);
        min->head.body = NULL;
        file_advance(c, p, min);
    }
    return NULL;
}

/* Hands the ready record over as *rec and moves its file on. */
static void part_take(ces_capture_t *c, part_t *p, ces_record_t *rec) {
    cfile_t *f = p->ready;
    int64_t seq = f->head.sequence;
    bool in_order = !f->has_prev || seq >= f->prev;
    if (in_order && p->has_high && seq > p->high + 1) {
        c->stats.gaps++;
        end_progress_line(c);
        ces_log_warning("%s[%" PRId32 "]: no file holds sequence numbers %" PRId64
                        " to %" PRId64 " (between %s and %s)", p->topic, p->id, p->high + 1,
                        seq - 1, p->high_path, f->path);
    }
    if (in_order) {
        p->high = seq;
        p->has_high = true;
        p->high_path = f->path;
    }
    *rec = (ces_record_t){.topic = p->topic,
                          .partition = p->id,
                          .offset = seq,
                          .value = f->head.body,
                          .len = f->head.body_len,
                          .handle = f->head.body};
    f->head.body = NULL;
    f->prev = seq;
    f->has_prev = true;
    p->ready = NULL;
    c->stats.records++;
    file_advance(c, p, f);
}

/* ---------------------------------------------------------------------------------------------
 * Progress.
 */

static void progress_line(ces_capture_t *c, int64_t now, bool last) {
    if (!c->progress || (!last && now - c->last_progress_ms < PROGRESS_MS))
        return;
    c->last_progress_ms = now;
    uint64_t total = 0, done = 0, finished = 0;
    for (size_t i = 0; i < c->nall; i++) {
        const cfile_t *f = c->all[i];
        total += f->size;
        done += f->done ? f->size : f->open != NULL ? ces_capfile_bytes_read(f->open) : 0;
        finished += f->done;
    }
    double secs = (double)(now - c->started_ms) / 1000.0;
    double rate = secs > 0 ? (double)c->stats.records / secs : 0;
    char eta[32] = "-";
    if (done > 0 && total > done && secs > 0) {
        double left = secs * (double)(total - done) / (double)done;
        snprintf(eta, sizeof(eta), "%d:%02d:%02d", (int)(left / 3600), (int)left / 60 % 60,
                 (int)left % 60);
    }
    fprintf(stderr, "\rcapture: %" PRIu64 " records, %.0f/s, files %" PRIu64 "/%zu, %.0f%%, "
            "ETA %s\033[K%s", c->stats.records, rate, finished, c->nall,
            total > 0 ? 100.0 * (double)done / (double)total : 100.0, eta, last ? "\n" : "");
    c->line_open = !last;
}

/* ---------------------------------------------------------------------------------------------
 * The feed.
 */

/* The partition whose next record's file has the earliest window, in turn among equals after
 * the one that went last; *paused says whether an unfinished partition was passed over because
 * the pipeline paused it. */
static part_t *choose(ces_capture_t *c, bool *paused) {
    part_t *best = NULL;
    int64_t best_window = 0;
    size_t best_index = 0;
    *paused = false;
    for (size_t k = 0; k < c->nparts && !c->nomem; k++) {
        size_t i = (c->turn + 1 + k) % c->nparts;
        part_t *p = c->parts[i];
        if (p->exhausted)
            continue;
        if (p->paused) {
            *paused = true;
            continue;
        }
        cfile_t *f = part_ready(c, p);
        if (f != NULL && (best == NULL || f->window < best_window)) {
            best = p;
            best_window = f->window;
            best_index = i;
        }
    }
    if (best != NULL)
        c->turn = best_index;
    return best;
}

/* A partition that has nothing more and was read from says so once (its end). */
static part_t *ended_partition(ces_capture_t *c) {
    for (size_t i = 0; i < c->nparts; i++) {
        part_t *p = c->parts[i];
        if (p->exhausted && !p->eof_sent) {
            p->eof_sent = true;
            if (p->has_high)
                return p;
        }
    }
    return NULL;
}

static ces_poll_status_t capture_poll(void *opaque, int timeout_ms, ces_record_t *record,
                                      char *errstr, size_t errstr_size) {
    (void)timeout_ms; /* files never make anyone wait */
    ces_capture_t *c = opaque;
    int64_t now = ces_clock_now_ms();
    progress_line(c, now, false);
    bool paused = false;
    part_t *next = choose(c, &paused);
    if (c->nomem) {
        snprintf(errstr, errstr_size, "out of memory reading Capture files");
        return CES_POLL_FATAL;
    }
    /* A partition that has just run out says so before the next record goes. */
    part_t *ended = ended_partition(c);
    if (ended != NULL) {
        *record = (ces_record_t){.topic = ended->topic, .partition = ended->id,
                                 .offset = ended->high + 1};
        return CES_POLL_EOF;
    }
    if (next != NULL) {
        part_take(c, next, record);
        return CES_POLL_RECORD;
    }
    if (paused)
        return CES_POLL_IDLE;
    progress_line(c, now, true);
    return CES_POLL_END;
}

static void capture_give_back(void *opaque, void *handle) {
    (void)opaque;
    free(handle);
}

static int capture_pause(void *opaque, const char *topic, int32_t partition, bool pause) {
    ces_capture_t *c = opaque;
    char key[512];
    int len = snprintf(key, sizeof(key), "%s\x1f%" PRId32, topic, partition);
    part_t *p = ces_map_get(c->by_key, key, (size_t)len);
    if (p == NULL)
        return -1;
    p->paused = pause;
    return 0;
}

void ces_capture_feed(ces_capture_t *c, ces_feed_t *feed) {
    *feed = (ces_feed_t){.poll = capture_poll,
                         .give_back = capture_give_back,
                         .pause = capture_pause,
                         .opaque = c};
}

void ces_capture_get_stats(const ces_capture_t *c, ces_capture_stats_t *stats) {
    *stats = c->stats;
}

/* ---------------------------------------------------------------------------------------------
 * Making and freeing.
 */

ces_capture_t *ces_capture_new(char *const *paths, size_t npaths,
                               const ces_capture_options_t *o, char *errstr, size_t errstr_size) {
    ces_capture_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    if (compile_layout(c, o->layout ? o->layout : CES_CAPTURE_DEFAULT_LAYOUT, errstr,
                       errstr_size) != 0) {
        free(c);
        return NULL;
    }
    size_t block = 4 * o->max_record_bytes;
    if (block > UINT_MAX) /* zlib counts a block's bytes in an unsigned int */
        block = UINT_MAX;
    c->limits = (ces_capfile_limits_t){
        .max_block_bytes = block > MIN_BLOCK_BYTES ? block : MIN_BLOCK_BYTES,
        .max_map_items = MAX_MAP_ITEMS};
    c->progress = o->progress;
    c->turn = SIZE_MAX; /* the first partition goes first */
    c->started_ms = c->last_progress_ms = ces_clock_now_ms();
    if ((c->schemas = ces_capfile_schemas_new()) == NULL || (c->by_key = ces_map_new()) == NULL ||
        find_files(c, paths, npaths) != 0) {
        snprintf(errstr, errstr_size, "out of memory");
        ces_capture_destroy(c);
        return NULL;
    }
    return c;
}

void ces_capture_destroy(ces_capture_t *c) {
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->nparts; i++) {
        part_t *p = c->parts[i];
        for (size_t j = 0; j < p->nfiles; j++) {
            file_close(NULL, p->files[j]);
            free(p->files[j]->path);
            free(p->files[j]);
        }
        free(p->files);
        free(p->open);
        free(p->topic);
        free(p);
    }
    free(c->parts);
    free(c->all);
    ces_map_destroy(c->by_key);
    ces_capfile_schemas_destroy(c->schemas);
    regfree(&c->layout);
    free(c);
}
