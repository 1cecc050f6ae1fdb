/*
 * capture: Event Hubs Capture files as the pipeline's feed (`ces2pg replay --capture`).
 *
 * Capture archives each partition of a hub, one Avro file per time window (capfile.h), under a
 * name made from its archive name format, by default
 * {Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}. The records
 * carry no partition: it is read from the path, matched against that format (options.layout, the
 * same text as Capture's setting; every placeholder once, as Azure requires). A file whose path
 * does not match is an error.
 *
 * Files may come in any order and overlap (a window captured twice, copies). Within a partition
 * the records go out in SequenceNumber order: a partition's files are probed for their first
 * sequence number and merged, each file being in order itself (a record out of order in its file
 * goes out as it comes, and is counted). A sequence number already handed over is skipped (the
 * overlap); a jump over missing ones is logged. A file is opened only when the merge reaches its
 * first record, so memory holds one block of each file that overlaps the position, not the files.
 *
 * Partitions are interleaved as a hub would deliver them: the next record comes from the
 * partition whose next record's file has the earliest window (the time in its path), in turn among
 * equals, so that an event's segments and a transaction's events, sent together to several
 * partitions, arrive close together. Partitions the pipeline pauses wait; a partition with nothing
 * more reports its end (CES_POLL_EOF) so that it holds no transaction back.
 *
 * A record is handed over as the CES record its Body holds, from topic "capture:NAMESPACE/HUB",
 * the partition id, and its SequenceNumber as offset: dead letters name that. Nothing is stored
 * (replay stores no positions).
 */
#ifndef CES_CAPTURE_H
#define CES_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "input/feed.h"

/* Capture's default archive name format. */
#define CES_CAPTURE_DEFAULT_LAYOUT                                                                \
    "{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}"

typedef struct {
    const char *layout;      /* the archive name format; NULL: CES_CAPTURE_DEFAULT_LAYOUT */
    size_t max_record_bytes; /* decode.max_record_bytes: a block may hold a few such records */
    bool progress;           /* a progress line on stderr about once a second */
} ces_capture_options_t;

typedef struct {
    uint64_t files;        /* found */
    uint64_t files_read;   /* read to their end */
    uint64_t files_failed; /* missing, unreadable, not Capture files, truncated or corrupt */
    uint64_t records;      /* handed to the pipeline */
    uint64_t duplicates;   /* records whose sequence number was handed over already: skipped */
    uint64_t out_of_order; /* records below the one before them in their file: handed over */
    uint64_t gaps;         /* jumps over sequence numbers that no file held */
} ces_capture_stats_t;

typedef struct ces_capture_s ces_capture_t;

/* Checks an archive name format: the nine placeholders, each once, and text between them. Returns
 * 0, or -1 with a sentence in errstr. */
int ces_capture_check_layout(const char *layout, char *errstr, size_t errstr_size);

/*
 * Finds the Capture files among paths[0..npaths) (files, and directories searched recursively for
 * *.avro), each file's partition from its path. A path that is missing, or a file whose path does
 * not match the layout, is logged as an ERROR and counted as failed. Returns NULL with a sentence
 * in errstr when the layout is not a valid archive name format or memory runs out. paths are
 * copied. Owned by the caller.
 */
ces_capture_t *ces_capture_new(char *const *paths, size_t npaths,
                               const ces_capture_options_t *options, char *errstr,
                               size_t errstr_size);
/* Accepts NULL. Records not yet released are the pipeline's to release first. */
void ces_capture_destroy(ces_capture_t *capture);

/* The capture as a feed: poll hands over one record per call (never waiting), CES_POLL_EOF once
 * for each partition that has nothing more, CES_POLL_IDLE while every unfinished partition is
 * paused, CES_POLL_END at the end; a file that fails is logged and counted, and the rest goes on.
 * A record's value is its own, freed by release. The feed refers to capture. */
void ces_capture_feed(ces_capture_t *capture, ces_feed_t *feed);

void ces_capture_get_stats(const ces_capture_t *capture, ces_capture_stats_t *stats);

/*
 * Matches path against the layout compiled by ces_capture_new: the partition id, the topic
 * ("capture:NAMESPACE/HUB", written into topic) and the window's time (seconds since the epoch,
 * from the path's date and time). Returns 0, or -1 when the path does not match. For tests.
 */
int ces_capture_match_path(const ces_capture_t *capture, const char *path, int32_t *partition,
                           char *topic, size_t topic_size, int64_t *window);

#endif
