/* cpu-pool.c - a persistent thread pool: workers sleep between graphs and meet at a spinning
 * barrier between nodes.
 *
 * Workers are created once, with the backend. To run a job, the caller bumps a generation
 * counter and wakes them (condition variable); all threads, the caller included as thread 0,
 * run the job, and the caller waits until every worker has reported back. Inside a job,
 * threads synchronise with bp_cpu_pool_barrier, which spins briefly (the next node is usually
 * microseconds away) and then yields, so an oversubscribed machine is not starved. */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "cpu-impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

struct bp_cpu_pool {
    int n_threads;
    pthread_t *threads;

    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t done;
    unsigned generation; /* bumped per job, under lock */
    int running;         /* workers still in the current job */
    bool stop;
    bp_cpu_job_fn job;
    void *arg;

    /* The barrier: arrivals in this phase, and the phase number. */
    _Alignas(64) atomic_int arrived;
    _Alignas(64) atomic_uint phase;
};

struct worker_arg {
    struct bp_cpu_pool *pool;
    int ith;
};

static void *worker_main(void *argp)
{
    struct worker_arg wa = *(struct worker_arg *)argp;
    free(argp);
    struct bp_cpu_pool *pool = wa.pool;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        while (pool->generation == seen && !pool->stop)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        seen = pool->generation;
        bp_cpu_job_fn job = pool->job;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);

        job(arg, wa.ith, pool->n_threads);

        pthread_mutex_lock(&pool->lock);
        if (--pool->running == 0)
            pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->lock);
    }
}

struct bp_cpu_pool *bp_cpu_pool_new(int n_threads)
{
    if (n_threads < 1) {
        bp_set_error(BP_ERR_INVALID_ARG, "CPU: thread count %d must be at least 1", n_threads);
        return NULL;
    }
    struct bp_cpu_pool *pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU: out of memory creating a thread pool");
        return NULL;
    }
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    atomic_init(&pool->arrived, 0);
    atomic_init(&pool->phase, 0);
    pool->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (pool->threads == NULL)
        goto fail;
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa == NULL)
            goto fail_threads;
        *wa = (struct worker_arg){pool, i};
        if (pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            goto fail_threads;
        }
        continue;
    fail_threads:
        /* Stop the workers already started, then give up. */
        pool->n_threads = i;
        bp_cpu_pool_free(pool);
        bp_set_error(BP_ERR_BACKEND, "CPU: could not start thread %d of %d", i, n_threads);
        return NULL;
    }
    return pool;

fail:
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
    bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU: out of memory creating a thread pool");
    return NULL;
}

void bp_cpu_pool_free(struct bp_cpu_pool *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

int bp_cpu_pool_n_threads(const struct bp_cpu_pool *pool)
{
    return pool->n_threads;
}

void bp_cpu_pool_run(struct bp_cpu_pool *pool, bp_cpu_job_fn job, void *arg)
{
    if (pool->n_threads == 1) {
        job(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->job = job;
    pool->arg = arg;
    pool->running = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    job(arg, 0, pool->n_threads);

    pthread_mutex_lock(&pool->lock);
    while (pool->running > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}

void bp_cpu_pool_barrier(struct bp_cpu_pool *pool)
{
    const int n = pool->n_threads;
    if (n == 1)
        return;
    unsigned phase = atomic_load_explicit(&pool->phase, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&pool->arrived, 1, memory_order_acq_rel) == n - 1) {
        atomic_store_explicit(&pool->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->phase, 1, memory_order_release);
        return;
    }
    for (unsigned spins = 0; atomic_load_explicit(&pool->phase, memory_order_acquire) == phase;
         spins++) {
        if (spins < 2000)
            CPU_RELAX();
        else
            sched_yield();
    }
}
