#include "util/team.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    ces_team_t *team;
    void *worker;
    pthread_t thread;
} helper_t;

/* A job started and not finished yet. */
typedef struct {
    ces_team_fn fn;
    void *job;
    size_t n;
    uint32_t generation; /* written under lock when the job starts */
    /* generation << 32 | the next item to claim. A helper that comes late to a job (the caller
     * did every item and went on, and the slot holds a later job now) sees another generation
     * and claims nothing. */
    _Atomic uint64_t claim;
    /* Items done: a job's items are all done before its slot is reused, since an item claimed is
     * counted before the caller can see the count complete. */
    _Atomic size_t done;
} job_t;

struct ces_team_s {
    pthread_mutex_t lock;
    pthread_cond_t work;     /* helpers wait here for a job with items to claim */
    pthread_cond_t finished; /* the caller waits here for the last item of its oldest job */
    /* Jobs started and not finished, oldest first: slots[head], ..., written under lock. */
    job_t slots[CES_TEAM_MAX_JOBS];
    size_t head, count;
    uint32_t generation;
    bool stopping;
    /* The caller waits on `finished`: only then does the helper that completes a job take the lock
     * to wake it (and the caller the lock to be woken). With the done counts, a Dekker pair: the
     * caller sets it and then reads done, a helper adds to done and then reads it, so one of the
     * two sees the other. */
    _Atomic bool caller_waits;
    helper_t *helpers;
    size_t nhelpers;
};

/* Spinning for about 40 microseconds on the benchmark machine (a pause lasts 10 to 140 cycles,
 * depending on the CPU), the time a helper takes for an item or a few. */
#define FINISH_SPINS 4096

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static bool claim(job_t *j, uint32_t generation, size_t n, size_t *item) {
    uint64_t s = atomic_load_explicit(&j->claim, memory_order_relaxed);
    for (;;) {
        if ((uint32_t)(s >> 32) != generation || (s & UINT32_MAX) >= n)
            return false;
        if (atomic_compare_exchange_weak(&j->claim, &s, s + 1)) {
            *item = (size_t)(s & UINT32_MAX);
            return true;
        }
    }
}

/* The oldest job with an item left to claim, or NULL. Under lock. */
static job_t *job_to_help(ces_team_t *t) {
    for (size_t k = 0; k < t->count; k++) {
        job_t *j = &t->slots[(t->head + k) % CES_TEAM_MAX_JOBS];
        uint64_t s = atomic_load_explicit(&j->claim, memory_order_relaxed);
        if ((s & UINT32_MAX) < j->n)
            return j;
    }
    return NULL;
}

static void *helper_main(void *arg) {
    helper_t *h = arg;
    ces_team_t *t = h->team;
#ifdef SCHED_BATCH
    /* Woken for a job, a helper does not take the CPU from the thread that woke it (the loop,
     * ces2pg's critical path): on two cores shared with PostgreSQL and the broker it did, at
     * every stage handed out. It still gets its fair share of the CPU. */
    struct sched_param batch = {.sched_priority = 0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
#endif
    pthread_mutex_lock(&t->lock);
    for (;;) {
        job_t *j;
        while ((j = job_to_help(t)) == NULL && !t->stopping)
            pthread_cond_wait(&t->work, &t->lock);
        if (t->stopping)
            break;
        uint32_t generation = j->generation;
        ces_team_fn fn = j->fn;
        void *job = j->job;
        size_t n = j->n;
        pthread_mutex_unlock(&t->lock);
        size_t item;
        while (claim(j, generation, n, &item)) {
            fn(h->worker, job, item);
            if (atomic_fetch_add(&j->done, 1) + 1 == n && atomic_load(&t->caller_waits)) {
                pthread_mutex_lock(&t->lock);
                pthread_cond_signal(&t->finished);
                pthread_mutex_unlock(&t->lock);
            }
        }
        pthread_mutex_lock(&t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

ces_team_t *ces_team_new(void *const *workers, size_t helpers) {
    if (helpers == 0)
        return NULL;
    ces_team_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->helpers = calloc(helpers, sizeof(helper_t));
    if (t->helpers == NULL) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->work, NULL);
    pthread_cond_init(&t->finished, NULL);
    /* Threads inherit the signal mask: the helpers get every signal blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (size_t i = 0; i < helpers; i++) {
        helper_t *h = &t->helpers[i];
        h->team = t;
        h->worker = workers[i];
        if (pthread_create(&h->thread, NULL, helper_main, h) != 0)
            break;
        pthread_setname_np(h->thread, "ces2pg-decode");
        t->nhelpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (t->nhelpers < helpers) {
        ces_team_destroy(t);
        return NULL;
    }
    return t;
}

void ces_team_destroy(ces_team_t *t) {
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    t->stopping = true;
    pthread_cond_broadcast(&t->work);
    pthread_mutex_unlock(&t->lock);
    for (size_t i = 0; i < t->nhelpers; i++)
        pthread_join(t->helpers[i].thread, NULL);
    pthread_cond_destroy(&t->finished);
    pthread_cond_destroy(&t->work);
    pthread_mutex_destroy(&t->lock);
    free(t->helpers);
    free(t);
}

/* One item is not worth waking anybody for. */
static bool worth_sharing(const ces_team_t *t, size_t n) {
    return t != NULL && n >= 2 && n <= UINT32_MAX;
}

void ces_team_start(ces_team_t *t, ces_team_fn fn, void *job, size_t n) {
    if (!worth_sharing(t, n))
        return;
    pthread_mutex_lock(&t->lock);
    /* Full: the job is not handed out, and its finish does it (see there). */
    if (t->count < CES_TEAM_MAX_JOBS) {
        job_t *j = &t->slots[(t->head + t->count) % CES_TEAM_MAX_JOBS];
        j->fn = fn;
        j->job = job;
        j->n = n;
        j->generation = ++t->generation;
        atomic_store(&j->done, 0);
        atomic_store(&j->claim, (uint64_t)j->generation << 32);
        t->count++;
        pthread_cond_broadcast(&t->work);
    }
    pthread_mutex_unlock(&t->lock);
}

/* The oldest job started and not finished when it is job, else NULL (a job not handed out). Only
 * the caller starts and finishes jobs, so it reads head and count without the lock. */
static job_t *oldest_if(ces_team_t *t, const void *job, size_t n) {
    if (!worth_sharing(t, n) || t->count == 0 || t->slots[t->head].job != job)
        return NULL;
    return &t->slots[t->head];
}

bool ces_team_done(ces_team_t *t, const void *job, size_t n) {
    job_t *j = oldest_if(t, job, n);
    return j == NULL || atomic_load(&j->done) == n;
}

void ces_team_finish(ces_team_t *t, ces_team_fn fn, void *job, void *caller, size_t n) {
    job_t *j = oldest_if(t, job, n);
    if (j == NULL) {
        for (size_t i = 0; i < n; i++)
            fn(caller, job, i);
        return;
    }
    uint32_t generation = j->generation;
    size_t item;
    while (claim(j, generation, n, &item)) {
        fn(caller, job, item);
        atomic_fetch_add(&j->done, 1);
    }
    /* What is left is an item a helper is in the middle of: a few microseconds, less than
     * sleeping and being woken takes, and sleeping would leave this core idle (bench/NOTES.md). A
     * helper the scheduler took off the CPU takes longer: then this thread sleeps after all. */
    for (unsigned spin = 0; spin < FINISH_SPINS && atomic_load(&j->done) != n; spin++)
        cpu_relax();
    pthread_mutex_lock(&t->lock);
    while (atomic_load(&j->done) != n) {
        atomic_store(&t->caller_waits, true);
        if (atomic_load(&j->done) != n)
            pthread_cond_wait(&t->finished, &t->lock);
    }
    atomic_store(&t->caller_waits, false);
    t->head = (t->head + 1) % CES_TEAM_MAX_JOBS;
    t->count--;
    pthread_mutex_unlock(&t->lock);
}

void ces_team_run(ces_team_t *t, ces_team_fn fn, void *job, void *caller, size_t n) {
    if (t != NULL && t->count > 0) {
        /* Behind unfinished jobs: sharing it would have it wait for them. */
        for (size_t i = 0; i < n; i++)
            fn(caller, job, i);
        return;
    }
    ces_team_start(t, fn, job, n);
    ces_team_finish(t, fn, job, caller, n);
}
