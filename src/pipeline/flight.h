/*
 * flight: batches to PostgreSQL and what follows their commit, a stage of the loop
 * (docs/semantics.md, "Delivery").
 *
 * At most one batch is in flight: sent through the apply door without waiting, PostgreSQL executes
 * it while the loop reads and decodes the next one. Its positions are stored (in PostgreSQL, inside
 * its transaction, fenced; then in Kafka for monitoring) and its events count as applied only once
 * it has committed. A batch that cannot be applied (fenced by another instance, or a streamed
 * transaction lost with its connection) sends every partition back to the position PostgreSQL
 * holds, dropping whatever is held in memory: it is read again.
 */
#ifndef CES_FLIGHT_H
#define CES_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>

#include "format/event.h"
#include "pipeline/pipeline.h"

/* Applies the batch and stores the positions it covers, in one PostgreSQL transaction (after
 * completing the batch in flight): when it returns, everything is committed. */
ces_pipeline_status_t ces_flight_flush(ces_pipeline_t *p, char *errstr, size_t errstr_size);
/* The same without waiting: the batch goes in flight, PostgreSQL executes it while the loop reads
 * the next one, and the next send, flush or complete commits it. Its positions are stored (in
 * PostgreSQL and Kafka) only then. The parts of a streamed transaction go the same way; its last
 * part, which commits, waits. */
ces_pipeline_status_t ces_flight_send(ces_pipeline_t *p, char *errstr, size_t errstr_size);
/* Waits for the batch in flight and commits it (nothing to do when there is none). */
ces_pipeline_status_t ces_flight_complete(ces_pipeline_t *p, char *errstr, size_t errstr_size);
/* True unless a batch is in flight that PostgreSQL is still executing (then a send, flush or
 * complete would wait, and the loop had better read on). Also true once the batch being read has
 * grown to twice its limits: then waiting for PostgreSQL is what keeps memory bounded. */
bool ces_flight_ready(ces_pipeline_t *p);
/* Opens one PostgreSQL transaction for the source transaction at lsn, too large for a batch,
 * after committing what is complete. When it could not be opened for a reason that passes
 * (another instance, a lost connection), goes back to the stored positions instead and returns
 * CES_PIPELINE_OK with nothing streamed (p->stream.open false). */
ces_pipeline_status_t ces_flight_begin_stream(ces_pipeline_t *p, ces_lsn_t lsn, char *errstr,
                                              size_t errstr_size);
/* Drops what is held in memory (staged, batch, segments, held transactions, an open stream) and
 * goes back to the positions PostgreSQL holds. */
ces_pipeline_status_t ces_flight_rewind(ces_pipeline_t *p, char *errstr, size_t errstr_size);

/* Drops what ces_flight_rewind drops and gives every partition up without seeking: the consumer
 * that read them is going, and the next one starts from the stored positions. */
void ces_flight_forget(ces_pipeline_t *p);

#endif
