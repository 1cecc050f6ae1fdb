#include "replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "types.h"

static ces_replay_status_t replay_status(ces_pipeline_status_t st) {
    switch (st) {
    case CES_PIPELINE_OK: return CES_REPLAY_OK;
    case CES_PIPELINE_INTERRUPTED: return CES_REPLAY_INTERRUPTED;
    case CES_PIPELINE_FATAL: break;
    }
    return CES_REPLAY_FATAL;
}

static ces_replay_status_t replay_file(ces_pipeline_t *p, const char *path,
                                       volatile sig_atomic_t *stop, char *errstr,
                                       size_t errstr_size) {
    ces_replay_status_t rc = CES_REPLAY_OK;
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (f == NULL) {
        snprintf(errstr, errstr_size, "%s: %s", path, strerror(errno));
        return CES_REPLAY_IO;
    }
    char *line = NULL;
    size_t cap = 0;
    unsigned char *binary = NULL;
    size_t binary_cap = 0;
    ssize_t len;
    int64_t line_no = 0;
    errno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        if (stop != NULL && *stop) {
            rc = CES_REPLAY_INTERRUPTED;
            goto done;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        size_t start = strspn(line, " \t");
        if ((size_t)len == start)
            continue; /* blank line */
        ces_record_t rec = {.topic = path, .partition = 0, .offset = line_no, .handle = NULL};
        if (line[start] == '{') {
            rec.value = line;
            rec.len = (size_t)len;
        } else {
            size_t need = (size_t)len * 3 / 4 + 3;
            if (need > binary_cap) {
                unsigned char *b = realloc(binary, need);
                if (b == NULL) {
                    snprintf(errstr, errstr_size, "out of memory");
                    rc = CES_REPLAY_FATAL;
                    goto done;
                }
                binary = b;
                binary_cap = need;
            }
            long n = ces_base64_decode(line + start, (size_t)len - start, binary);
            if (n < 0) {
                /* Not base64 either: keep the line as it is; the decoder says what it is not. */
                rec.value = line;
                rec.len = (size_t)len;
            } else {
                rec.value = binary;
                rec.len = (size_t)n;
            }
        }
        int64_t now = ces_clock_now_ms();
        if (ces_pipeline_add(p, &rec, now, errstr, errstr_size) != CES_PIPELINE_OK ||
            ces_pipeline_tick(p, now, errstr, errstr_size) != CES_PIPELINE_OK) {
            rc = CES_REPLAY_FATAL;
            goto done;
        }
        /* A full batch is applied while the next lines are read. */
        if (ces_pipeline_due(p, now) &&
            (rc = replay_status(ces_pipeline_send(p, errstr, errstr_size))) != CES_REPLAY_OK)
            goto done;
    }
    if (ferror(f)) {
        snprintf(errstr, errstr_size, "%s: %s", path, strerror(errno));
        rc = CES_REPLAY_IO;
    }
done:
    free(line);
    free(binary);
    if (f != stdin)
        fclose(f);
    return rc;
}

ces_replay_status_t ces_replay_files(ces_pipeline_t *p, char *const *paths, size_t npaths,
                                     volatile sig_atomic_t *stop, char *errstr,
                                     size_t errstr_size) {
    for (size_t i = 0; i < npaths; i++) {
        ces_replay_status_t rc = replay_file(p, paths[i], stop, errstr, errstr_size);
        if (rc != CES_REPLAY_OK) {
            /* What was sent before the failure is committed, as if it had been applied at once. */
            char why[256];
            if (ces_pipeline_complete(p, why, sizeof(why)) != CES_PIPELINE_OK)
                ces_log_error("the last batch sent: %s", why);
            return rc;
        }
    }
    /* Nothing more will come: held transactions are complete, incomplete segment groups are dead
     * letters now. */
    if (ces_pipeline_drain(p, errstr, errstr_size) != CES_PIPELINE_OK)
        return CES_REPLAY_FATAL;
    return replay_status(ces_pipeline_flush(p, errstr, errstr_size));
}
