/* cpu-pool.c - a persistent thread pool: workers sleep between graphs and meet at a spinning
 * barrier between nodes.
 *
 * Workers are created once, with the backend. To run a job, the caller bumps a generation
 * counter and wakes them (condition variable); all threads, the caller included as thread 0,
 * run the job, and the caller waits until every worker has reported back. Inside a job,
 * threads synchronise with bp_cpu_pool_barrier, which spins briefly (the next node is usually
 * microseconds away) and then yields, so an oversubscribed machine is not starved.
 *
 * Between jobs, workers watch the generation counter for about a millisecond before they go to
 * sleep (pausing, then yielding the core), and the caller watches the count of running workers
 * the same way before it sleeps:
 * token-by-token generation runs a small graph every few hundred microseconds, and waking a
 * sleeping thread costs far more than that on virtual machines (an idle vCPU must be scheduled
 * again), which made two threads slower than one.
 *
 * Contention. Every thread meets the others at a barrier after each node, so a thread the
 * kernel deschedules (another busy process on the machine: a desktop, a CI runner) holds every
 * other thread for the rest of its time slice, a few milliseconds, at each barrier it misses:
 * generation with two threads beside one busy process fell to a seventh of its speed, far
 * below one thread's. Work stealing does not cure it, because a thread descheduled in the
 * middle of its share holds that share (a half-done piece cannot be redone by another thread
 * without writing the same memory twice). So the pool watches for it instead: each thread
 * compares the wall time of the job with its own CPU time, and a thread off the CPU for more than
 * STALL_NS was descheduled (a barrier wait would not tell a descheduled thread from a slow
 * one); the pool then runs the following jobs
 * on the calling thread alone (workers idle, barriers free) for a while, doubling that while
 * stalls persist and trying all threads again after each period; a job without a stall ends
 * it. On a quiet machine no barrier waits that long, and nothing changes.
 *
 * A try costs a stalled job when the contention is still there. So before trying, the pool
 * looks at how long the CPUs it may run on were idle during the period (Linux's /proc/stat): if
 * that is less than half of what the workers would need, the other process is still busy and
 * the period is extended without a try. Where the file cannot be read, every period ends in a
 * try. */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu-impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How a thread watches for the next job (or the end of this one) before sleeping: a few
 * thousand pauses, then yielding the core (another thread of ours may be waiting for it, on a
 * machine with fewer free cores than threads) until about a millisecond has passed. */
#define POOL_PAUSES 2000
#define POOL_WATCH_NS 1000000L

/* A thread off the CPU this long during a job: it was descheduled (a quiet machine takes a
 * thread away for microseconds). */
#define STALL_NS 500000L
/* How long jobs then run on the calling thread alone: from SOLO_MIN_NS, doubled while stalls
 * persist, up to SOLO_MAX_NS. */
#define SOLO_MIN_NS 20000000L
#define SOLO_MAX_NS 640000000L

static long elapsed_ns(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long thread_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Runs job as thread ith of nth and records in *stall how long the thread was off the CPU
 * during it (wall time less its own CPU time), when that is the longest of the job so far. A
 * thread that spins or computes accrues CPU time; one the kernel deschedules does not. */
static void timed_job(bp_cpu_job_fn job, void *arg, int ith, int nth, atomic_long *stall)
{
    const long long w0 = now_ns(), c0 = thread_cpu_ns();
    job(arg, ith, nth);
    const long long off = (now_ns() - w0) - (thread_cpu_ns() - c0);
    long seen = atomic_load_explicit(stall, memory_order_relaxed);
    while (off > seen && !atomic_compare_exchange_weak_explicit(stall, &seen, (long)off,
                                                                memory_order_relaxed,
                                                                memory_order_relaxed)) {
    }
}

/* Spins, then yields, until done(arg) (true) or the watch is over (false). Inlined with a
 * constant done in each caller below. */
BP_CPU_INLINE bool watch(bool (*done)(const void *), const void *arg)
{
    struct timespec t0;
    for (int i = 0;; i++) {
        if (done(arg))
            return true;
        if (i < POOL_PAUSES) {
            CPU_RELAX();
            continue;
        }
        if (i == POOL_PAUSES)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        else if (elapsed_ns(&t0) > POOL_WATCH_NS)
            return false;
        sched_yield();
    }
}

struct generation_watch {
    atomic_uint *v;
    unsigned unlike;
    const atomic_bool *stop;
};

static bool generation_moved(const void *arg)
{
    const struct generation_watch *w = arg;
    return atomic_load_explicit(w->v, memory_order_acquire) != w->unlike ||
           (w->stop && atomic_load_explicit(w->stop, memory_order_relaxed));
}

/* Watches *v until it differs from `unlike` or stop is set (true), or the watch is over. */
static bool watch_uint(atomic_uint *v, unsigned unlike, const atomic_bool *stop)
{
    const struct generation_watch w = {v, unlike, stop};
    return watch(generation_moved, &w);
}

static bool is_zero(const void *arg)
{
    return atomic_load_explicit((const atomic_int *)arg, memory_order_acquire) == 0;
}

static bool watch_zero(atomic_int *v)
{
    return watch(is_zero, v);
}

struct bp_cpu_pool {
    int n_threads;
    pthread_t *threads;
    /* Threads taking part in the current job: n_threads, or 1 while jobs run solo. */
    int active;
    /* The longest time a thread was off the CPU during the current job (ns), and the solo
     * period (caller only). */
    atomic_long stall_ns;
    long long solo_until, solo_ns;
    /* The CPUs this process may run on, and their idle ticks when the solo period began (-1:
     * unknown, then the period ends in a try). */
    cpu_set_t affinity;
    bool probe;
    long long idle_mark, mark_ns;
    bool force_solo; /* BP_CPU_FORCE_SOLO=1: every job solo, as under contention (diagnostic) */
    bool adaptive;   /* BP_CPU_ADAPTIVE=0 turns the solo periods off */

    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t done;
    atomic_uint generation; /* bumped per job, under lock */
    atomic_int running;     /* workers still in the current job */
    bool stop;
    atomic_bool stop_flag; /* stop, readable without the lock */
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
        watch_uint(&pool->generation, seen, &pool->stop_flag);
        pthread_mutex_lock(&pool->lock);
        while (atomic_load_explicit(&pool->generation, memory_order_relaxed) == seen &&
               !pool->stop)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        seen = atomic_load_explicit(&pool->generation, memory_order_relaxed);
        bp_cpu_job_fn job = pool->job;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);

        timed_job(job, arg, wa.ith, pool->n_threads, &pool->stall_ns);

        if (atomic_fetch_sub_explicit(&pool->running, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->lock); /* the caller may be asleep on `done` */
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

/* Idle time (idle + iowait) of the CPUs in mask since boot, in clock ticks, from /proc/stat; -1
 * where it cannot be read. */
static long long idle_ticks(const cpu_set_t *mask)
{
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL)
        return -1;
    char line[512];
    long long sum = 0;
    bool any = false;
    while (fgets(line, sizeof(line), f) != NULL && strncmp(line, "cpu", 3) == 0) {
        int id;
        unsigned long long user, nice, sys, idle, iowait;
        if (line[3] != ' ' &&
            sscanf(line + 3, "%d %llu %llu %llu %llu %llu", &id, &user, &nice, &sys, &idle,
                   &iowait) == 6 &&
            id >= 0 && id < CPU_SETSIZE && CPU_ISSET(id, mask)) {
            sum += (long long)(idle + iowait);
            any = true;
        }
    }
    fclose(f);
    return any ? sum : -1;
}

/* Starts (or restarts) the clock of idle time for a solo period. */
static void mark_idle(struct bp_cpu_pool *pool)
{
    pool->idle_mark = pool->probe ? idle_ticks(&pool->affinity) : -1;
    pool->mark_ns = now_ns();
}

/* Whether the workers would still find no free CPU: the CPUs we may use were idle, since the
 * mark, for less than half of the time the workers would need. False when unknown. */
static bool still_contended(struct bp_cpu_pool *pool)
{
    const long long idle = pool->idle_mark >= 0 ? idle_ticks(&pool->affinity) : -1;
    const long hz = sysconf(_SC_CLK_TCK);
    if (idle < 0 || hz <= 0)
        return false;
    const double idle_ns = (double)(idle - pool->idle_mark) * 1e9 / (double)hz;
    const double need_ns = (double)(now_ns() - pool->mark_ns) * (pool->n_threads - 1);
    return idle_ns < 0.5 * need_ns;
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
    pool->active = n_threads;
    atomic_init(&pool->stall_ns, 0);
    const char *force = getenv("BP_CPU_FORCE_SOLO");
    pool->force_solo = force != NULL && force[0] == '1';
    const char *adaptive = getenv("BP_CPU_ADAPTIVE");
    pool->adaptive = adaptive == NULL || adaptive[0] != '0';
    CPU_ZERO(&pool->affinity);
    pool->probe = sched_getaffinity(0, sizeof(pool->affinity), &pool->affinity) == 0;
    pool->idle_mark = -1;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    atomic_init(&pool->arrived, 0);
    atomic_init(&pool->phase, 0);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->running, 0);
    atomic_init(&pool->stop_flag, false);
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
    atomic_store(&pool->stop_flag, true);
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

/* After a job on every thread: a stall starts (or lengthens) a solo period, a job without one
 * ends the back-off. */
static void after_job(struct bp_cpu_pool *pool)
{
    if (pool->adaptive && atomic_load_explicit(&pool->stall_ns, memory_order_relaxed) > STALL_NS) {
        pool->solo_ns = pool->solo_ns == 0 ? SOLO_MIN_NS
                        : pool->solo_ns * 2 > SOLO_MAX_NS ? SOLO_MAX_NS
                                                          : pool->solo_ns * 2;
        pool->solo_until = now_ns() + pool->solo_ns;
        mark_idle(pool);
    } else {
        pool->solo_ns = 0;
        pool->solo_until = 0;
    }
}

bool bp_cpu_pool_solo(const struct bp_cpu_pool *pool)
{
    return pool->n_threads == 1 || pool->force_solo || pool->solo_until != 0;
}

void bp_cpu_pool_run(struct bp_cpu_pool *pool, bp_cpu_job_fn job, void *arg)
{
    if (pool->n_threads == 1) {
        job(arg, 0, 1);
        return;
    }
    bool solo = pool->force_solo || (pool->solo_until != 0 && now_ns() < pool->solo_until);
    if (!solo && pool->solo_until != 0 && still_contended(pool)) {
        /* The period is over but the CPUs are still busy: another period, without a try. */
        pool->solo_until = now_ns() + pool->solo_ns;
        mark_idle(pool);
        solo = true;
    }
    if (solo) {
        pool->active = 1; /* the workers stay idle; barriers are free */
        job(arg, 0, 1);
        return;
    }
    pool->active = pool->n_threads;
    atomic_store_explicit(&pool->stall_ns, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool->lock);
    pool->job = job;
    pool->arg = arg;
    atomic_store_explicit(&pool->running, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    timed_job(job, arg, 0, pool->n_threads, &pool->stall_ns);

    if (!watch_zero(&pool->running)) {
        pthread_mutex_lock(&pool->lock);
        while (atomic_load_explicit(&pool->running, memory_order_acquire) > 0)
            pthread_cond_wait(&pool->done, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
    }
    after_job(pool);
}

void bp_cpu_pool_barrier(struct bp_cpu_pool *pool)
{
    const int n = pool->active;
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
        if (spins < POOL_PAUSES)
            CPU_RELAX();
        else
            sched_yield();
    }
}
