/*
 * The decoding team: every item of every job done exactly once, by the caller and the helpers,
 * the results visible when ces_team_run returns, job after job.
 */
#include "test_util.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "util/team.h"

#define HELPERS 3
#define ITEMS 500

typedef struct {
    int id; /* 0: the caller */
} worker_t;

typedef struct {
    int done_by[ITEMS];      /* worker id + 1, written once per item */
    _Atomic int times[ITEMS]; /* how often each item ran */
    _Atomic int helper_items; /* items helpers finished */
    bool caller_waits;       /* the caller's first item waits until a helper finished one */
} job_t;

static void wait_for_a_helper(job_t *job) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (atomic_load(&job->helper_items) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 20)
            fail_msg("no helper took an item in 20 s");
        sched_yield();
    }
}

static void do_item(void *worker, void *job_arg, size_t item) {
    worker_t *w = worker;
    job_t *job = job_arg;
    if (w->id == 0 && job->caller_waits) {
        job->caller_waits = false; /* only the caller reads or writes it */
        wait_for_a_helper(job);
    }
    job->done_by[item] = w->id + 1;
    atomic_fetch_add(&job->times[item], 1);
    if (w->id != 0)
        atomic_fetch_add(&job->helper_items, 1);
}

static void check_all_once(job_t *job, size_t n) {
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&job->times[i]), 1);
        assert_true(job->done_by[i] >= 1 && job->done_by[i] <= HELPERS + 1);
    }
    for (size_t i = n; i < ITEMS; i++)
        assert_int_equal(atomic_load(&job->times[i]), 0);
}

/* A team of HELPERS helpers; workers[0] is the caller's. */
static ces_team_t *new_team(worker_t workers[HELPERS + 1]) {
    void *helper_ctx[HELPERS];
    for (int i = 0; i <= HELPERS; i++)
        workers[i].id = i;
    for (int i = 0; i < HELPERS; i++)
        helper_ctx[i] = &workers[i + 1];
    ces_team_t *team = ces_team_new(helper_ctx, HELPERS);
    assert_non_null(team);
    return team;
}

/* Helpers do take items: the caller's first item cannot end before one of theirs has. */
static void helpers_take_items(void **state) {
    (void)state;
    worker_t workers[HELPERS + 1];
    ces_team_t *team = new_team(workers);
    job_t *job = calloc(1, sizeof(*job));
    assert_non_null(job);
    job->caller_waits = true;
    ces_team_run(team, do_item, job, &workers[0], ITEMS);
    check_all_once(job, ITEMS);
    assert_true(atomic_load(&job->helper_items) >= 1);
    free(job);
    ces_team_destroy(team);
}

/* Many short jobs of every size in a row: a helper that comes late to a job must not take an item
 * of the next one, and every job is complete when run returns. */
static void jobs_back_to_back(void **state) {
    (void)state;
    worker_t workers[HELPERS + 1];
    ces_team_t *team = new_team(workers);
    job_t *job = calloc(1, sizeof(*job));
    assert_non_null(job);
    for (int round = 0; round < 3000; round++) {
        size_t n = (size_t)(round % 40);
        memset(job, 0, sizeof(*job));
        ces_team_run(team, do_item, job, &workers[0], n);
        check_all_once(job, n);
    }
    free(job);
    ces_team_destroy(team);
}

/* Jobs started ahead: the helpers work through them while the caller goes on, the caller finishes
 * them in order (helping with what is left), and a job beyond CES_TEAM_MAX_JOBS is done by its
 * finish. Rounds of slots reused with jobs of every size must never run an item twice. */
static void jobs_started_ahead(void **state) {
    (void)state;
    enum { JOBS = CES_TEAM_MAX_JOBS + 2 };
    worker_t workers[HELPERS + 1];
    ces_team_t *team = new_team(workers);
    job_t *jobs = calloc(JOBS, sizeof(*jobs));
    assert_non_null(jobs);
    size_t sizes[JOBS];
    for (int round = 0; round < 500; round++) {
        memset(jobs, 0, JOBS * sizeof(*jobs));
        size_t depth = 1 + (size_t)round % JOBS; /* jobs outstanding at once */
        size_t started = 0, finished = 0;
        for (size_t k = 0; k < JOBS; k++) {
            sizes[k] = (size_t)((round * 7 + (int)k * 13) % 60);
            ces_team_start(team, do_item, &jobs[k], sizes[k]);
            started++;
            while (started - finished >= depth) {
                ces_team_finish(team, do_item, &jobs[finished], &workers[0], sizes[finished]);
                check_all_once(&jobs[finished], sizes[finished]);
                finished++;
            }
        }
        for (; finished < started; finished++) {
            ces_team_finish(team, do_item, &jobs[finished], &workers[0], sizes[finished]);
            check_all_once(&jobs[finished], sizes[finished]);
        }
    }
    /* A job left to the helpers alone is done without the caller, and then reported done. */
    memset(jobs, 0, sizeof(*jobs));
    ces_team_start(team, do_item, &jobs[0], ITEMS);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!ces_team_done(team, &jobs[0], ITEMS)) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 20)
            fail_msg("the helpers did not finish a job in 20 s");
        sched_yield();
    }
    assert_int_equal(atomic_load(&jobs[0].helper_items), ITEMS);
    ces_team_finish(team, do_item, &jobs[0], &workers[0], ITEMS);
    check_all_once(&jobs[0], ITEMS);
    /* A job of one item is not handed out: done at once by its finish, nothing to wait for. */
    memset(jobs, 0, sizeof(*jobs));
    ces_team_start(team, do_item, &jobs[0], 1);
    assert_true(ces_team_done(team, &jobs[0], 1));
    assert_int_equal(atomic_load(&jobs[0].times[0]), 0);
    ces_team_finish(team, do_item, &jobs[0], &workers[0], 1);
    check_all_once(&jobs[0], 1);
    assert_int_equal(jobs[0].done_by[0], 1);
    /* Every slot taken: the next job is not handed out, so its finish does it all. */
    memset(jobs, 0, JOBS * sizeof(*jobs));
    for (size_t k = 0; k < JOBS; k++) {
        jobs[k].caller_waits = false;
        ces_team_start(team, do_item, &jobs[k], ITEMS);
    }
    for (size_t k = 0; k < JOBS; k++) {
        if (k >= CES_TEAM_MAX_JOBS)
            assert_true(ces_team_done(team, &jobs[k], ITEMS)); /* nothing to wait for */
        ces_team_finish(team, do_item, &jobs[k], &workers[0], ITEMS);
        check_all_once(&jobs[k], ITEMS);
        if (k >= CES_TEAM_MAX_JOBS)
            assert_int_equal(atomic_load(&jobs[k].helper_items), 0);
    }
    free(jobs);
    ces_team_destroy(team);
}

/* Without a team the caller does every item itself. */
static void no_team(void **state) {
    (void)state;
    worker_t caller = {0};
    job_t *job = calloc(1, sizeof(*job));
    assert_non_null(job);
    ces_team_run(NULL, do_item, job, &caller, 10);
    check_all_once(job, 10);
    for (int i = 0; i < 10; i++)
        assert_int_equal(job->done_by[i], 1);
    free(job);
    assert_null(ces_team_new(NULL, 0));
    ces_team_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(helpers_take_items),
        cmocka_unit_test(jobs_back_to_back),
        cmocka_unit_test(jobs_started_ahead),
        cmocka_unit_test(no_team),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
