/*
 * team: the calling thread and a few helper threads working through one job's items together.
 *
 * Decoding is most of ces2pg's CPU, and each record decodes on its own. A job is a number of items
 * that the caller and the helpers claim one at a time, so a helper that the scheduler keeps off
 * the CPU (PostgreSQL and the broker share the machine) only takes fewer items: the caller never
 * waits for more than the items a helper is in the middle of. ces_team_run returns when every
 * item is done, so what follows it sees every item's result (the team's locks order the memory).
 *
 * Helpers block every signal: handlers run in the threads that had them before.
 */
#ifndef CES_TEAM_H
#define CES_TEAM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ces_team_s ces_team_t;

/* Does item `item` of job with the worker's own context (the caller's or one helper's). */
typedef void (*ces_team_fn)(void *worker, void *job, size_t item);

/*
 * Starts `helpers` threads, helper i working with workers[i] (references, which must outlive the
 * team). Returns NULL when a thread or memory cannot be had; then the caller works alone.
 */
ces_team_t *ces_team_new(void *const *workers, size_t helpers);
/* Stops and joins the helpers. Accepts NULL. Not while a job runs. */
void ces_team_destroy(ces_team_t *team);

/*
 * Runs fn for every item in [0, n): the caller with its context caller, the helpers with theirs,
 * each item once. team may be NULL: the caller does every item. Returns when all are done. With
 * jobs started and not finished, the caller does every item (they would come first).
 */
void ces_team_run(ces_team_t *team, ces_team_fn fn, void *job, void *caller, size_t n);

/*
 * The same in two steps, so that the caller can do something else while the helpers work:
 * ces_team_start hands the job to the helpers and returns at once; ces_team_finish (with the same
 * fn, job and n) has the caller do the items nobody has claimed yet and returns when all are done.
 * Up to CES_TEAM_MAX_JOBS jobs may be started and not finished; the helpers work on the oldest
 * first, and the jobs are finished in the order they were started. A job started beyond that
 * limit is not handed out: its finish does every item.
 */
#define CES_TEAM_MAX_JOBS 8
void ces_team_start(ces_team_t *team, ces_team_fn fn, void *job, size_t n);
void ces_team_finish(ces_team_t *team, ces_team_fn fn, void *job, void *caller, size_t n);
/* True when finishing job, the oldest job started and not finished, will not wait for a helper:
 * every item is done, or the job was not handed out (one item, or beyond the limit) and its
 * finish does every item at once. */
bool ces_team_done(ces_team_t *team, const void *job, size_t n);

#endif
