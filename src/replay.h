/*
 * replay: records from files instead of Kafka, through the same pipeline.
 *
 * One record per line: a line starting with '{' is a JSON record, any other non-empty line is the
 * base64 of a binary record. A record's source is the file path, partition 0 and its line number.
 */
#ifndef CES_REPLAY_H
#define CES_REPLAY_H

#include <stddef.h>

#include "pipeline.h"
#include "types.h" /* ces_base64_decode, for base64 lines */

typedef enum {
    CES_REPLAY_OK = 0,
    CES_REPLAY_IO,          /* a file could not be read; errstr says which */
    CES_REPLAY_INTERRUPTED, /* stopped by a signal */
    CES_REPLAY_FATAL,
} ces_replay_status_t;

/* Feeds every line of paths[0..npaths) to pipeline, applying batches as they fill, and a final one.
 * stop is polled between records. */
ces_replay_status_t ces_replay_files(ces_pipeline_t *pipeline, char *const *paths, size_t npaths,
                                     volatile sig_atomic_t *stop, char *errstr,
                                     size_t errstr_size);

#endif
