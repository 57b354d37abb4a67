/* example-async-plugin.c - an asynchronous backplane plugin in one file: registry "ExampleAsync"
 * with one device "ASYNC0" that computes ADD, MUL and SCALE on f32 tensors, like
 * example-plugin.c, but behind a queue: each backend has a worker thread that runs what was
 * queued (graphs, copies, event records and waits) in order, while the caller goes on.
 *
 * It keeps the contract of bp-plugin.h ("Asynchronous devices"), and each rule is kept where a
 * comment below says so. What to copy for a real device (a stream, a command queue):
 * - the queue and the worker (queue_push, worker_main), which run in order and record the first
 *   failure for the next synchronize (take_error);
 * - the buffers' plain members wait for the device to go idle first (wait_device_idle), so that
 *   bp_tensor_get after an asynchronous compute returns the result;
 * - events as generation counters (record: a new target; the worker marks it reached);
 * - waits that take a deadline (wait_for), behind synchronize_timeout and
 *   event_synchronize_timeout.
 * Memory is plain host memory, but its buffer type says it is not host memory (is_host false):
 * the runtime then moves data only through the members, which are ordered with the queue. A
 * buffer type that is host memory (pinned memory) is read and written by others directly,
 * which nothing orders; this example does without one.
 *
 * One mutex guards all of the plugin's shared state; one condition variable (`changed`) is
 * broadcast whenever a job finishes, and every waiter re-checks what it waits for. Simple and
 * clearly correct, which matters more here than the last microsecond.
 *
 * Two proc addresses are test hooks (tests/test-async.c): "example_async_hold" stops a
 * backend's worker before its next job (so a deadline can be seen to pass) and
 * "example_async_fail_next" makes the next graph fail in the worker. A real plugin has none.
 *
 * Build: cc -shared -fPIC -pthread -o backplane-example_async.so example-async-plugin.c \
 *            $(pkg-config --cflags --libs backplane) */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, pthread_condattr_setclock under -std=c11 */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <backplane/bp-plugin.h>

#define NAME "ASYNC0"

/* ---- The kernels (as in example-plugin.c) ------------------------------------------------ */

/* Element (i0, i1, i2, i3) of t, for f32 tensors whose dimension 0 is contiguous. */
static float *at(const bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (float *)((char *)t->data + i0 * 4 + i1 * (int64_t)t->nb[1] + i2 * (int64_t)t->nb[2] +
                     i3 * (int64_t)t->nb[3]);
}

/* dst = a (op) b, b broadcast over a; or dst = a * scale. Element by element, so in place is
 * fine. */
static void compute_node(bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const float scale = dst->op == BP_OP_SCALE ? bp_get_op_param_f32(dst, 0) : 0.0f;
    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < dst->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < dst->ne[0]; i0++) {
                    const float x = *at(a, i0, i1, i2, i3);
                    float r = x * scale;
                    if (dst->op != BP_OP_SCALE) {
                        const float y = *at(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2],
                                            i3 % b->ne[3]);
                        r = dst->op == BP_OP_ADD ? x + y : x * y;
                    }
                    *at(dst, i0, i1, i2, i3) = r;
                }
}

/* Exactly what compute_node does (and views, which compute nothing). */
static bool supported(const bp_tensor *op)
{
    switch (op->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true;
    case BP_OP_ADD:
    case BP_OP_MUL:
    case BP_OP_SCALE:
        for (int s = 0; s < (op->op == BP_OP_SCALE ? 1 : 2); s++)
            if (op->src[s]->type != BP_TYPE_F32 || op->src[s]->nb[0] != sizeof(float))
                return false;
        return op->type == BP_TYPE_F32 && op->nb[0] == sizeof(float);
    default:
        return false;
    }
}

/* ---- Shared state, events and waiting ----------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed;  /* broadcast when a job finishes; CLOCK_MONOTONIC (plugin_init) */
static int n_pending;           /* jobs queued on all backends and not finished (under lock) */

/* An event: recording sets a new target generation, the worker reaching the record marks it
 * done. refs counts the owner and the queued jobs that name it, so event_free may come while a
 * record or wait is still queued (the contract's rule). */
struct event {
    uint64_t recorded, done;
    int refs;
};

/* Drops one reference (under lock); the last one frees the event. */
static void event_unref(struct event *ev)
{
    if (--ev->refs == 0)
        free(ev);
}

/* The deadline timeout_ns from now (CLOCK_MONOTONIC, the clock `changed` waits on). */
static struct timespec deadline_in(int64_t timeout_ns)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    int64_t ns = t.tv_nsec + timeout_ns % 1000000000;
    t.tv_sec += (time_t)(timeout_ns / 1000000000 + ns / 1000000000);
    t.tv_nsec = (long)(ns % 1000000000);
    return t;
}

/* Waits (under lock) for the next change; false once the deadline (NULL: none) has passed. */
static bool wait_for(const struct timespec *deadline)
{
    if (deadline == NULL)
        return pthread_cond_wait(&changed, &lock) == 0;
    return pthread_cond_timedwait(&changed, &lock, deadline) != ETIMEDOUT;
}

/* Plain members call this first: everything queued on the device so far is finished. */
static void wait_device_idle(void)
{
    pthread_mutex_lock(&lock);
    while (n_pending > 0)
        wait_for(NULL);
    pthread_mutex_unlock(&lock);
}

/* ---- The queue and the worker -------------------------------------------------------------- */

enum job_kind { JOB_GRAPH, JOB_COPY, JOB_RECORD, JOB_WAIT };

struct job {
    struct job *next;
    enum job_kind kind;
    bp_graph *graph;         /* JOB_GRAPH: kept until synchronize, as the contract allows */
    void *dst;               /* JOB_COPY: memcpy(dst, src, size) */
    const void *src;
    size_t size;
    struct event *ev;        /* JOB_RECORD / JOB_WAIT, and the generation they mean */
    uint64_t gen;
};

/* A backend's context: its queue, its worker and the first error the worker met. */
struct queue {
    pthread_t thread;
    pthread_cond_t work;     /* signalled when a job is queued, or to stop */
    struct job *head, *tail;
    int n_queued;            /* queued or running */
    bool stop, hold, fail_next;
    enum bp_status error;    /* first failure since the last synchronize, and its sentence */
    char message[256];
};

/* Appends job j (allocated by the caller) and wakes the worker; takes a reference on its event. */
static void queue_push(struct queue *q, struct job *j)
{
    pthread_mutex_lock(&lock);
    if (j->ev != NULL)
        j->ev->refs++;
    if (q->tail != NULL)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->n_queued++;
    n_pending++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&lock);
}

/* A new job of kind k, or NULL after bp_set_error. */
static struct job *job_new(enum job_kind k)
{
    struct job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        bp_set_error(BP_ERR_OUT_OF_MEMORY, NAME ": no memory to queue work");
    else
        j->kind = k;
    return j;
}

/* Runs job j on the worker, without the lock (nobody else touches the caller's data until
 * synchronize, by contract). Returns false with a sentence in why on failure. */
static bool run_job(const struct job *j, bool fail, char *why, size_t why_size)
{
    if (j->kind == JOB_COPY) {
        memcpy(j->dst, j->src, j->size);
    } else if (j->kind == JOB_GRAPH) {
        if (fail) {
            snprintf(why, why_size, NAME ": a queued graph failed (the example_async_fail_next "
                     "test hook)");
            return false;
        }
        for (int i = 0; i < bp_graph_get_n_nodes(j->graph); i++) {
            bp_tensor *node = bp_graph_get_node(j->graph, i);
            if (node->op == BP_OP_ADD || node->op == BP_OP_MUL || node->op == BP_OP_SCALE)
                compute_node(node);
        }
    }
    return true;
}

/* Finishes job j (under lock): marks its event, drops it, and wakes every waiter. */
static void job_done(struct queue *q, struct job *j)
{
    if (j->kind == JOB_RECORD && j->ev->done < j->gen)
        j->ev->done = j->gen;
    q->head = j->next;
    if (q->head == NULL)
        q->tail = NULL;
    q->n_queued--;
    n_pending--;
    if (j->ev != NULL)
        event_unref(j->ev);
    free(j);
    pthread_cond_broadcast(&changed);
}

/* The worker: takes jobs in order until told to stop with nothing left. A failed job records
 * the first error; later jobs still run (events still happen, so no waiter hangs). */
static void *worker_main(void *arg)
{
    struct queue *q = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!q->stop && (q->head == NULL || q->hold))
            pthread_cond_wait(&q->work, &lock);
        if (q->head == NULL)
            break; /* stop, and nothing left */
        struct job *j = q->head;
        while (j->kind == JOB_WAIT && j->ev->done < j->gen)
            wait_for(NULL); /* another backend's record; its worker broadcasts */
        const bool fail = j->kind == JOB_GRAPH && q->fail_next;
        q->fail_next = q->fail_next && !fail;
        pthread_mutex_unlock(&lock);
        char why[sizeof(q->message)];
        const bool ok = run_job(j, fail, why, sizeof(why));
        pthread_mutex_lock(&lock);
        if (!ok && q->error == BP_OK) {
            q->error = BP_ERR_BACKEND;
            memcpy(q->message, why, sizeof(why));
        }
        job_done(q, j);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* ---- The backend: queueing members, synchronize, events ------------------------------------ */

static const char *be_name(bp_backend *be)
{
    (void)be;
    return NAME;
}

/* Returns the worker's first error since the last synchronize once, and clears it (under
 * lock): the contract's "reported once". */
static enum bp_status take_error(struct queue *q)
{
    enum bp_status st = q->error;
    if (st != BP_OK)
        bp_set_error(st, "%s", q->message);
    q->error = BP_OK;
    return st;
}

/* Waits until q is empty or the deadline (NULL: none) passes; BP_ERR_TIMEOUT leaves the work
 * queued and the error (if any) for a later synchronize. */
static enum bp_status be_wait(bp_backend *be, const struct timespec *deadline)
{
    struct queue *q = bp_backend_get_context(be);
    pthread_mutex_lock(&lock);
    bool in_time = true;
    while (q->n_queued > 0 && in_time)
        in_time = wait_for(deadline);
    enum bp_status st = q->n_queued > 0 ? BP_ERR_TIMEOUT : take_error(q);
    pthread_mutex_unlock(&lock);
    if (st == BP_ERR_TIMEOUT)
        bp_set_error(st, NAME ": queued work is still running after the deadline");
    return st;
}

static enum bp_status be_synchronize(bp_backend *be)
{
    return be_wait(be, NULL);
}

static enum bp_status be_synchronize_timeout(bp_backend *be, int64_t timeout_ns)
{
    const struct timespec deadline = deadline_in(timeout_ns);
    return be_wait(be, &deadline);
}

/* Queues the graph. Everything is checked now, so an unsupported op is an error of this call and
 * nothing is queued; the graph itself is read by the worker later (the contract lets it). */
static enum bp_status be_graph_compute(bp_backend *be, bp_graph *g)
{
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        const bp_tensor *node = bp_graph_get_node(g, i);
        if (!supported(node))
            return bp_set_error(BP_ERR_UNSUPPORTED, NAME ": %s ('%s') is not supported",
                                bp_op_name(node->op), node->name);
    }
    struct job *j = job_new(JOB_GRAPH);
    if (j == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    j->graph = g;
    queue_push(bp_backend_get_context(be), j);
    return BP_OK;
}

/* Queues memcpy(dst, src, size): the async set/get of the caller's data. */
static enum bp_status queue_copy(bp_backend *be, void *dst, const void *src, size_t size)
{
    struct job *j = job_new(JOB_COPY);
    if (j == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    j->dst = dst;
    j->src = src;
    j->size = size;
    queue_push(bp_backend_get_context(be), j);
    return BP_OK;
}

static enum bp_status be_set_async(bp_backend *be, bp_tensor *t, const void *data, size_t offset,
                                   size_t size)
{
    return queue_copy(be, (char *)t->data + offset, data, size);
}

static enum bp_status be_get_async(bp_backend *be, const bp_tensor *t, void *data, size_t offset,
                                   size_t size)
{
    return queue_copy(be, data, (const char *)t->data + offset, size);
}

static bp_buffer_type *the_buft; /* made once by plugin_init */

/* Whether buf is memory of this plugin's buffer type. */
static bool is_ours(bp_buffer *buf)
{
    return bp_buffer_get_type(buf) == the_buft;
}

/* Queues a copy between two tensors of our memory on one backend: its queue runs in order, so
 * src is complete when the copy reads it. Anything else is declined (false, no error) and the
 * runtime synchronizes both backends and copies through the plain members. Queueing a copy out
 * of host memory would be wrong here: the CPU could overwrite that memory (its next split)
 * before the worker reads it, and nothing orders the two. */
static bool be_cpy_async(bp_backend *src_be, bp_backend *dst_be, const bp_tensor *src,
                         bp_tensor *dst)
{
    if (src_be != dst_be || !is_ours(src->buffer) || !is_ours(dst->buffer))
        return false;
    return queue_copy(dst_be, dst->data, src->data, bp_nbytes(src)) == BP_OK;
}

/* A new mark: the event's next generation, reached when the worker gets to this job. */
static enum bp_status be_event_record(bp_backend *be, void *event)
{
    struct event *ev = event;
    struct job *j = job_new(JOB_RECORD);
    if (j == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    j->gen = ++ev->recorded;
    pthread_mutex_unlock(&lock);
    j->ev = ev;
    queue_push(bp_backend_get_context(be), j);
    return BP_OK;
}

/* Later work of be waits for the latest record as of now (none: no wait, as CUDA). */
static enum bp_status be_event_wait(bp_backend *be, void *event)
{
    struct event *ev = event;
    pthread_mutex_lock(&lock);
    const uint64_t gen = ev->recorded;
    pthread_mutex_unlock(&lock);
    if (gen == 0)
        return BP_OK;
    struct job *j = job_new(JOB_WAIT);
    if (j == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    j->ev = ev;
    j->gen = gen;
    queue_push(bp_backend_get_context(be), j);
    return BP_OK;
}

/* Stops q's worker (after what is queued) and frees q. */
static void queue_stop(struct queue *q)
{
    pthread_mutex_lock(&lock);
    q->stop = true;
    q->hold = false;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&lock);
    pthread_join(q->thread, NULL);
    pthread_cond_destroy(&q->work);
    free(q);
}

/* Called after the runtime synchronized the backend (the contract's rule for free). */
static void be_free(bp_backend *be)
{
    queue_stop(bp_backend_get_context(be));
}

static const struct bp_backend_iface backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = be_name,
    .free = be_free,
    .set_tensor_async = be_set_async,
    .get_tensor_async = be_get_async,
    .cpy_tensor_async = be_cpy_async,
    .synchronize = be_synchronize,
    .graph_compute = be_graph_compute,
    .event_record = be_event_record,
    .event_wait = be_event_wait,
    .synchronize_timeout = be_synchronize_timeout, /* plugin API 1.1 */
};

/* ---- Buffers: host memory the runtime reaches only through these members ------------------ */

/* Every plain member waits for the device's queued work first: the contract's ordering. */

static void buf_free(bp_buffer *buf)
{
    free(bp_buffer_get_context(buf));
}

static void *buf_base(bp_buffer *buf)
{
    return bp_buffer_get_context(buf);
}

static enum bp_status buf_memset(bp_buffer *buf, bp_tensor *t, uint8_t value, size_t offset,
                                 size_t size)
{
    (void)buf;
    wait_device_idle();
    memset((char *)t->data + offset, value, size);
    return BP_OK;
}

static enum bp_status buf_set(bp_buffer *buf, bp_tensor *t, const void *data, size_t offset,
                              size_t size)
{
    (void)buf;
    wait_device_idle();
    memcpy((char *)t->data + offset, data, size);
    return BP_OK;
}

static enum bp_status buf_get(bp_buffer *buf, const bp_tensor *t, void *data, size_t offset,
                              size_t size)
{
    (void)buf;
    wait_device_idle();
    memcpy(data, (const char *)t->data + offset, size);
    return BP_OK;
}

static enum bp_status buf_clear(bp_buffer *buf, uint8_t value)
{
    wait_device_idle();
    memset(bp_buffer_get_context(buf), value, bp_buffer_get_size(buf));
    return BP_OK;
}

static const struct bp_buffer_iface buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = buf_free,
    .get_base = buf_base,
    .memset_tensor = buf_memset,
    .set_tensor = buf_set,
    .get_tensor = buf_get,
    .clear = buf_clear,
};

static const char *buft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "ExampleAsync";
}

/* 64-byte aligned host memory; at least 64 bytes, so that a 0-byte buffer has a base. */
static bp_buffer *buft_alloc(bp_buffer_type *buft, size_t size)
{
    void *mem = aligned_alloc(64, size == 0 ? 64 : (size + 63) / 64 * 64);
    if (mem == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, NAME ": no memory for a buffer of %zu bytes", size);
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &buffer_iface, mem, size);
    if (buf == NULL)
        free(mem); /* still ours when bp_buffer_new fails */
    return buf;
}

static size_t buft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return 64;
}

static const struct bp_buffer_type_iface buffer_type_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = buft_name,
    .alloc_buffer = buft_alloc,
    .get_alignment = buft_alignment,
    /* is_host absent: false, so that nobody touches the memory behind the queue's back */
};

/* ---- Events of the device ------------------------------------------------------------------ */

static void *dev_event_new(bp_device *dev)
{
    (void)dev;
    struct event *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        bp_set_error(BP_ERR_OUT_OF_MEMORY, NAME ": no memory for an event");
    else
        ev->refs = 1; /* the owner's */
    return ev;
}

/* The owner's reference; queued records and waits keep theirs until the worker is done. */
static void dev_event_free(bp_device *dev, void *event)
{
    (void)dev;
    pthread_mutex_lock(&lock);
    event_unref(event);
    pthread_mutex_unlock(&lock);
}

/* Waits until the latest record (as of now) has happened, or the deadline (NULL: none). */
static enum bp_status event_wait_until(struct event *ev, const struct timespec *deadline)
{
    pthread_mutex_lock(&lock);
    const uint64_t target = ev->recorded;
    bool in_time = true;
    while (ev->done < target && in_time)
        in_time = wait_for(deadline);
    const bool reached = ev->done >= target;
    pthread_mutex_unlock(&lock);
    if (!reached)
        return bp_set_error(BP_ERR_TIMEOUT, NAME ": the event has not happened by the deadline");
    return BP_OK;
}

static enum bp_status dev_event_synchronize(bp_device *dev, void *event)
{
    (void)dev;
    return event_wait_until(event, NULL);
}

static enum bp_status dev_event_synchronize_timeout(bp_device *dev, void *event,
                                                    int64_t timeout_ns)
{
    (void)dev;
    const struct timespec deadline = deadline_in(timeout_ns);
    return event_wait_until(event, &deadline);
}

/* ---- The device ---------------------------------------------------------------------------- */

static const char *dev_name(bp_device *dev)
{
    (void)dev;
    return NAME;
}

static const char *dev_description(bp_device *dev)
{
    (void)dev;
    return "asynchronous example plugin: ADD, MUL and SCALE on a worker thread";
}

static void dev_memory(bp_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    (void)dev;
    *free_bytes = *total_bytes = 0; /* host memory: no device limit to report */
}

static enum bp_device_type dev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_ACCEL;
}

/* async: the rules of bp-plugin.h hold; events: record, wait and synchronize work. */
static void dev_caps(bp_device *dev, struct bp_device_caps *caps)
{
    (void)dev;
    *caps = (struct bp_device_caps){.async = true, .events = true};
}

/* A backend is a queue and its worker thread. */
static bp_backend *dev_init_backend(bp_device *dev, const char *params)
{
    if (params != NULL && params[0] != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, NAME ": it takes no parameters, not '%s'", params);
        return NULL;
    }
    struct queue *q = calloc(1, sizeof(*q));
    if (q == NULL || pthread_cond_init(&q->work, NULL) != 0) {
        free(q);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, NAME ": no memory for a backend");
        return NULL;
    }
    if (pthread_create(&q->thread, NULL, worker_main, q) != 0) {
        pthread_cond_destroy(&q->work);
        free(q);
        bp_set_error(BP_ERR_BACKEND, NAME ": could not start a worker thread");
        return NULL;
    }
    bp_backend *be = bp_backend_new(dev, &backend_iface, q);
    if (be == NULL)
        queue_stop(q); /* still ours when bp_backend_new fails */
    return be;
}

static bp_buffer_type *dev_buffer_type(bp_device *dev)
{
    (void)dev;
    return the_buft;
}

static bool dev_supports_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    return supported(op);
}

static bool dev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    (void)dev;
    return buft == the_buft;
}

static const struct bp_device_iface device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = dev_name,
    .get_description = dev_description,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .get_caps = dev_caps,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_buffer_type,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
    .event_new = dev_event_new,
    .event_free = dev_event_free,
    .event_synchronize = dev_event_synchronize,
    .event_synchronize_timeout = dev_event_synchronize_timeout, /* plugin API 1.1 */
};

/* ---- Test hooks (proc addresses; a real plugin has none) ----------------------------------- */

/* Holds (on) or releases (off) be's worker before its next job. */
static void hook_hold(bp_backend *be, bool on)
{
    struct queue *q = bp_backend_get_context(be);
    pthread_mutex_lock(&lock);
    q->hold = on;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&lock);
}

/* The next graph be's worker runs fails (BP_ERR_BACKEND at the next synchronize). */
static void hook_fail_next(bp_backend *be)
{
    struct queue *q = bp_backend_get_context(be);
    pthread_mutex_lock(&lock);
    q->fail_next = true;
    pthread_mutex_unlock(&lock);
}

/* ---- The registry and the descriptor -------------------------------------------------------- */

static bp_device *the_device;

static const char *reg_name(bp_registry *reg)
{
    (void)reg;
    return "ExampleAsync";
}

static size_t reg_device_count(bp_registry *reg)
{
    (void)reg;
    return 1;
}

static bp_device *reg_device(bp_registry *reg, size_t index)
{
    (void)reg;
    (void)index;
    return the_device;
}

static void *reg_proc_address(bp_registry *reg, const char *name)
{
    (void)reg;
    void (*fn)(void) = NULL;
    if (strcmp(name, "example_async_hold") == 0)
        fn = (void (*)(void))hook_hold;
    else if (strcmp(name, "example_async_fail_next") == 0)
        fn = (void (*)(void))hook_fail_next;
    void *p;
    memcpy(&p, &fn, sizeof(p)); /* (ISO C has no function to void * conversion) */
    return p;
}

static const struct bp_registry_iface registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = reg_name,
    .get_device_count = reg_device_count,
    .get_device = reg_device,
    .get_proc_address = reg_proc_address,
};

/* `changed` times its waits by CLOCK_MONOTONIC, which a static initializer cannot ask for. */
static bool init_changed(void)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return false;
    bool ok = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) == 0 &&
              pthread_cond_init(&changed, &a) == 0;
    pthread_condattr_destroy(&a);
    return ok;
}

/* Describes the device; workers start only with a backend. */
static bp_registry *plugin_init(void)
{
    if (!init_changed()) {
        bp_set_error(BP_ERR_BACKEND, NAME ": could not make a condition variable");
        return NULL;
    }
    bp_registry *reg = bp_registry_new(&registry_iface, NULL);
    if (reg == NULL)
        return NULL;
    the_device = bp_device_new(reg, &device_iface, NULL);
    the_buft = the_device ? bp_buffer_type_new(the_device, &buffer_type_iface, NULL) : NULL;
    if (the_buft == NULL) {
        bp_registry_free(reg); /* frees the device too */
        return NULL;
    }
    return reg;
}

/* name (the file is backplane-example_async.so), variant, CPU features, init, score */
BP_PLUGIN_DEFINE("example_async", "", 0, plugin_init, NULL);
