/*
 * intake: records in, events and dead letters out (a stage of the loop).
 *
 * A record is staged (staging.h), decoded, and taken in on the loop's thread, in order: a whole
 * event goes to the orderer (transaction mode) or into the batch (partition mode), a segment to the
 * reassembler, anything that cannot be decoded into the batch as a dead letter with the record's
 * bytes. Where reading resumes is checked against the stored position (source gaps), and segment
 * groups that cannot complete become dead letters.
 */
#ifndef CES_INTAKE_H
#define CES_INTAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "input/feed.h"
#include "pipeline/pipeline.h"

/*
 * Stages a record (nothing is decoded yet): its handle and value stay untouched until taken in,
 * then the handle is given back to the feed whatever happens. Returns true when the stage is full:
 * then ces_intake_take must come before the next ces_intake_stage.
 */
bool ces_intake_stage(ces_pipeline_t *p, const ces_record_t *record);
/* How many records may be staged now (0 .. the stage's free slots). In partition mode each record
 * may become an item of the batch being read, which stays within its limits (twice them while a
 * batch is in flight); 0 then means: take the staged records in and send. In transaction mode
 * held events are bounded by pausing partitions instead. */
size_t ces_intake_room(const ces_pipeline_t *p);
/* True while records are staged or decoding, not yet taken in. */
bool ces_intake_busy(const ces_pipeline_t *p);
/*
 * Takes the staged records in, in order. With more_coming (the stage filled and more records wait
 * to be read), the records just staged are decoded by the other threads while the caller goes on,
 * and taken in by the next call: until then they count as not yet read (a rewind drops them).
 * Without it, every staged record is taken in before it returns. On failure every record staged
 * is given back (ces_staging_drop).
 */
ces_pipeline_status_t ces_intake_take(ces_pipeline_t *p, int64_t now_ms, bool more_coming,
                                      char *errstr, size_t errstr_size);
/* Stages one record and takes it in at once (unit tests). */
ces_pipeline_status_t ces_intake_add(ces_pipeline_t *p, const ces_record_t *record,
                                     int64_t now_ms, char *errstr, size_t errstr_size);
/*
 * Reading of topic[partition] resumed at offset (its first record, or eof: its end): a source gap
 * when that is not where it was to resume after an assignment or a rewind (positions.h). A gap is
 * logged and counted; it stops the loop (CES_PIPELINE_SOURCE_GAP, what to do in errstr) or, with
 * kafka.on_source_gap = "continue", is recorded with the batch whose position moves past it.
 */
ces_pipeline_status_t ces_intake_check_resume(ces_pipeline_t *p, const char *topic,
                                              int32_t partition, int64_t offset, bool eof,
                                              char *errstr, size_t errstr_size);
/* The broker has no record at offset of topic[partition], and librdkafka stopped the partition
 * (auto.offset.reset=error): a source gap, which stops the loop or moves the partition on to the
 * first record the broker holds. */
ces_pipeline_status_t ces_intake_out_of_range(ces_pipeline_t *p, const char *topic,
                                              int32_t partition, int64_t offset, char *errstr,
                                              size_t errstr_size);
/* Segment groups older than reassembly.timeout_ms become dead letters. Returns 0 or -1 (memory). */
int ces_intake_expire(ces_pipeline_t *p, int64_t now_ms);
/* The input ended: every incomplete segment group becomes dead letters. Returns 0 or -1. */
int ces_intake_give_up_all(ces_pipeline_t *p, int64_t now_ms);

#endif
