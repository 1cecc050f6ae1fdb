#include "input/replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/types.h"

struct ces_replay_s {
    char *const *paths;
    size_t npaths;
    size_t next_path; /* the file to open after the current one */
    FILE *file;       /* the current file; NULL between files */
    const char *path; /* ... and its name */
    int64_t line_no;
    char *line;
    size_t line_capacity;
};

ces_replay_t *ces_replay_new(char *const *paths, size_t npaths) {
    ces_replay_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->paths = paths;
    r->npaths = npaths;
    return r;
}

static void close_file(ces_replay_t *r) {
    if (r->file != NULL && r->file != stdin)
        fclose(r->file);
    r->file = NULL;
}

void ces_replay_destroy(ces_replay_t *r) {
    if (r == NULL)
        return;
    close_file(r);
    free(r->line);
    free(r);
}

/* The record of one non-blank line (len > start), in a buffer of its own: the JSON text, or the
 * bytes its base64 stands for. Returns the buffer (the record's handle), or NULL when out of
 * memory. */
static unsigned char *line_record(const char *line, size_t start, size_t len, size_t *out_len) {
    unsigned char *buf = malloc(len + 4); /* what ces_base64_decode may need */
    if (buf == NULL)
        return NULL;
    long n = line[start] == '{' ? -1 : ces_base64_decode(line + start, len - start, buf);
    if (n < 0) {
        /* JSON, or not base64 either: the line as it is; the decoder says what it is not. */
        memcpy(buf, line, len);
        *out_len = len;
    } else {
        *out_len = (size_t)n;
    }
    return buf;
}

static ces_poll_status_t replay_poll(void *opaque, int timeout_ms, ces_record_t *record,
                                     char *errstr, size_t errstr_size) {
    (void)timeout_ms; /* a file never makes anyone wait */
    ces_replay_t *r = opaque;
    for (;;) {
        if (r->file == NULL) {
            if (r->next_path == r->npaths)
                return CES_POLL_END;
            r->path = r->paths[r->next_path++];
            r->line_no = 0;
            r->file = strcmp(r->path, "-") == 0 ? stdin : fopen(r->path, "r");
            if (r->file == NULL) {
                snprintf(errstr, errstr_size, "%s: %s", r->path, strerror(errno));
                return CES_POLL_FATAL;
            }
        }
        errno = 0;
        ssize_t len = getline(&r->line, &r->line_capacity, r->file);
        if (len < 0) {
            bool failed = ferror(r->file);
            int err = errno;
            close_file(r);
            if (failed) {
                snprintf(errstr, errstr_size, "%s: %s", r->path, strerror(err));
                return CES_POLL_FATAL;
            }
            continue;
        }
        r->line_no++;
        while (len > 0 && (r->line[len - 1] == '\n' || r->line[len - 1] == '\r'))
            r->line[--len] = '\0';
        size_t start = strspn(r->line, " \t");
        if ((size_t)len == start)
            continue; /* blank line */
        size_t value_len;
        unsigned char *value = line_record(r->line, start, (size_t)len, &value_len);
        if (value == NULL) {
            snprintf(errstr, errstr_size, "out of memory");
            return CES_POLL_FATAL;
        }
        *record = (ces_record_t){.topic = r->path,
                                 .partition = 0,
                                 .offset = r->line_no,
                                 .value = value,
                                 .len = value_len,
                                 .handle = value};
        return CES_POLL_RECORD;
    }
}

static void replay_give_back(void *opaque, void *handle) {
    (void)opaque;
    free(handle);
}

void ces_replay_feed(ces_replay_t *r, ces_feed_t *feed) {
    *feed = (ces_feed_t){.poll = replay_poll, .give_back = replay_give_back, .opaque = r};
}
