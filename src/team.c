#include "team.h"

#include <pthread.h>
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

struct ces_team_s {
    pthread_mutex_t lock;
    pthread_cond_t work;     /* helpers wait here for a job */
    pthread_cond_t finished; /* the caller waits here for the last item */
    /* The job, written under lock before generation moves on. */
    ces_team_fn fn;
    void *job;
    size_t n;
    uint32_t generation;
    bool stopping;
    /* generation << 32 | the next item to claim. A helper that comes late to a job (the caller
     * did every item and went on to the next job) sees another generation and claims nothing. */
    _Atomic uint64_t claim;
    /* Items done in the current job: a job's items are all done before the next one starts,
     * since an item claimed is counted before the caller can see the count complete. */
    _Atomic size_t done;
    helper_t *helpers;
    size_t nhelpers;
};

static bool claim(ces_team_t *t, uint32_t generation, size_t n, size_t *item) {
    uint64_t s = atomic_load_explicit(&t->claim, memory_order_relaxed);
    for (;;) {
        if ((uint32_t)(s >> 32) != generation || (s & UINT32_MAX) >= n)
            return false;
        if (atomic_compare_exchange_weak(&t->claim, &s, s + 1)) {
            *item = (size_t)(s & UINT32_MAX);
            return true;
        }
    }
}

static void *helper_main(void *arg) {
    helper_t *h = arg;
    ces_team_t *t = h->team;
    uint32_t seen = 0;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (t->generation == seen && !t->stopping)
            pthread_cond_wait(&t->work, &t->lock);
        if (t->stopping)
            break;
        seen = t->generation;
        ces_team_fn fn = t->fn;
        void *job = t->job;
        size_t n = t->n;
        pthread_mutex_unlock(&t->lock);
        size_t item;
        while (claim(t, seen, n, &item)) {
            fn(h->worker, job, item);
            if (atomic_fetch_add(&t->done, 1) + 1 == n) {
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
    t->fn = fn;
    t->job = job;
    t->n = n;
    t->generation++;
    atomic_store(&t->done, 0);
    atomic_store(&t->claim, (uint64_t)t->generation << 32);
    pthread_cond_broadcast(&t->work);
    pthread_mutex_unlock(&t->lock);
}

void ces_team_finish(ces_team_t *t, ces_team_fn fn, void *job, void *caller, size_t n) {
    if (!worth_sharing(t, n)) {
        for (size_t i = 0; i < n; i++)
            fn(caller, job, i);
        return;
    }
    /* Only the caller writes generation. */
    uint32_t generation = t->generation;
    size_t item;
    while (claim(t, generation, n, &item)) {
        fn(caller, job, item);
        atomic_fetch_add(&t->done, 1);
    }
    if (atomic_load(&t->done) == n)
        return;
    pthread_mutex_lock(&t->lock);
    while (atomic_load(&t->done) != n)
        pthread_cond_wait(&t->finished, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

void ces_team_run(ces_team_t *t, ces_team_fn fn, void *job, void *caller, size_t n) {
    ces_team_start(t, fn, job, n);
    ces_team_finish(t, fn, job, caller, n);
}
