/*
 * replay: records from files, as the pipeline's feed (the daemon's is the Kafka consumer).
 *
 * One record per line: a line starting with '{' is a JSON record, any other non-empty line is the
 * base64 of a binary record (a line that is not base64 either is handed over as it is, for the
 * decoder to say what it is not). A record's source is the file path as topic, partition 0 and its
 * line number as offset. "-" is standard input. Files are read in the order given.
 */
#ifndef CES_REPLAY_H
#define CES_REPLAY_H

#include <stddef.h>

#include "input/feed.h"

typedef struct ces_replay_s ces_replay_t;

/* paths (references, e.g. argv) must outlive the replay and every record it hands over. NULL when
 * out of memory. */
ces_replay_t *ces_replay_new(char *const *paths, size_t npaths);
/* Accepts NULL. Records not yet released are the pipeline's to release first. */
void ces_replay_destroy(ces_replay_t *replay);

/* The replay as a feed: poll hands over one record per call (never waiting), CES_POLL_END after the
 * last line of the last file, CES_POLL_FATAL when a file cannot be opened or read. A record's value
 * is its own copy, freed by release. The feed refers to replay. */
void ces_replay_feed(ces_replay_t *replay, ces_feed_t *feed);

#endif
