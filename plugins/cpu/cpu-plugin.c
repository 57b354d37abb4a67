/* cpu-plugin.c - the CPU plugin: registry "CPU", one device "CPU", backends with a persistent
 * thread pool, and the descriptor of this build variant.
 *
 * The same sources build several variants (backplane-cpu-x86_64, -avx2, -avx512), each with its
 * own compiler flags and the CPU features those flags need in its descriptor; the loader picks
 * the best one this machine runs. Init only describes the device: the thread pool and scratch
 * memory are made when a backend is created. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "cpu-impl.h"

#ifndef BP_CPU_VARIANT
#define BP_CPU_VARIANT ""
#endif
#ifndef BP_CPU_FEATURES
#define BP_CPU_FEATURES 0
#endif
#ifndef BP_CPU_SCORE
#define BP_CPU_SCORE 10
#endif

struct cpu_backend {
    struct bp_cpu_pool *pool;
    /* A compute or a thread-count change is in progress. The runtime refuses a second thread
     * on the backend itself, but the "bp_set_n_threads" proc address can also be called
     * directly, so it and compute exclude each other here too (BP_ERR_BUSY) instead of
     * resizing the pool under a running graph. */
    atomic_bool busy;
    int n_threads;
    char *work;            /* 64-byte aligned scratch: per-thread slices, then a shared one */
    size_t work_size;
    bool *barrier;         /* per node of the graph being computed: wait for all first */
    int barrier_cap;
    bool meet_every_node;  /* BP_CPU_NODE_BARRIERS=all: no plan, every node waits */
};

#define BP_CPU_MAX_DEVICES 64

struct cpu_device {
    char name[16];
    char description[256];
    bp_device *dev;
    bp_buffer_type *repack; /* CPU_REPACK, owned by dev */
};

/* BP_CPU_DEVICES=N splits the machine into N devices ("CPU0".."CPU<N-1>"; one device is just
 * "CPU"), so that multi-device code such as the meta backend runs without GPUs. Each backend has
 * its own thread pool; by default the cores are shared out evenly. */
struct cpu_registry {
    bp_registry *reg;
    int n_devices;
    struct cpu_device devices[BP_CPU_MAX_DEVICES];
};

static struct cpu_registry *the_cpu; /* one per process: the plugin is loaded once */

const char *bp_cpu_variant_name(void)
{
    return BP_CPU_VARIANT[0] ? BP_CPU_VARIANT : "generic";
}

static int online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- Backend ---------------------------------------------------------------------------- */

static const char *cpu_backend_name(bp_backend *be)
{
    const struct cpu_device *d = bp_device_get_context(bp_backend_get_device(be));
    return d->name;
}

bool bp_cpu_is_own_backend(bp_backend *be)
{
    if (be == NULL || the_cpu == NULL)
        return false;
    for (int i = 0; i < the_cpu->n_devices; i++) {
        if (bp_backend_get_device(be) == the_cpu->devices[i].dev)
            return true;
    }
    return false;
}

struct bp_cpu_pool *bp_cpu_backend_pool(bp_backend *be)
{
    const struct cpu_backend *cb = bp_backend_get_context(be);
    return cb->pool;
}

static void cpu_backend_free(bp_backend *be)
{
    struct cpu_backend *cb = bp_backend_get_context(be);
    bp_cpu_pool_free(cb->pool);
    free(cb->work);
    free(cb->barrier);
    free(cb);
}

struct graph_job {
    bp_graph *graph;
    struct cpu_backend *cb;
    size_t per_thread;    /* bytes, multiple of 64 */
    const bool *barrier; /* per node: whether all threads meet before it */
    _Atomic(const bp_tensor *) fault; /* bp_cpu_fault */
};

static bool computes(const bp_tensor *t)
{
    return !(t->op == BP_OP_NONE || t->op == BP_OP_RESHAPE || t->op == BP_OP_VIEW ||
             t->op == BP_OP_PERMUTE || t->op == BP_OP_TRANSPOSE);
}

static bool runs(const bp_tensor *t)
{
    return computes(t) && bp_nelements(t) > 0;
}

/* ---- Where threads must meet -------------------------------------------------------------
 * Each thread computes its share of a node and, by default, waits for the others before the
 * next node. That wait is only needed when the next node could see another thread's unfinished
 * work: it reads memory that a node since the last meeting writes (read after write), it writes
 * memory that such a node reads or writes (the allocator reuses memory: write after read), or
 * both use the shared scratch. Otherwise (the query, key and value products of one input, the
 * gate and up products, independent element-wise work) the threads run on without meeting.
 * Memory is compared as byte ranges [data, data + bp_nbytes), views included, so the test is
 * conservative. The plan depends on the graph alone, so every thread makes the same decisions
 * and the kernels' own barriers still pair up. */

#define PENDING_MAX 32 /* ranges remembered since the last meeting; beyond, meet */

struct range {
    const char *lo, *hi;
};

static struct range range_of(const bp_tensor *t)
{
    const char *lo = t->data;
    return (struct range){lo, lo + bp_nbytes(t)};
}

static bool overlaps_any(struct range r, const struct range *set, int n)
{
    for (int i = 0; i < n; i++)
        if (r.lo < set[i].hi && set[i].lo < r.hi)
            return true;
    return false;
}

struct planner {
    struct range writes[PENDING_MAX], reads[PENDING_MAX];
    int n_w, n_r;
    bool started, shared_used;
};

/* Whether node (which runs, and uses the shared scratch or not) must wait for all threads
 * before it, given the nodes planned since the last meeting; then records it. */
static bool plan_node(struct planner *pl, const bp_tensor *node, bool uses_shared)
{
    const struct range out = range_of(node);
    int n_src = 0;
    bool meet = overlaps_any(out, pl->writes, pl->n_w) || overlaps_any(out, pl->reads, pl->n_r) ||
                (uses_shared && pl->shared_used);
    for (int s = 0; s < BP_MAX_SRC; s++) {
        if (node->src[s] == NULL || node->src[s]->data == NULL)
            continue;
        n_src++;
        meet = meet || overlaps_any(range_of(node->src[s]), pl->writes, pl->n_w);
    }
    meet = meet || pl->n_w + 1 > PENDING_MAX || pl->n_r + n_src > PENDING_MAX;
    const bool first = !pl->started;
    if (meet || first) {
        pl->n_w = pl->n_r = 0;
        pl->shared_used = false;
    }
    pl->started = true;
    pl->writes[pl->n_w++] = out;
    for (int s = 0; s < BP_MAX_SRC; s++)
        if (node->src[s] != NULL && node->src[s]->data != NULL)
            pl->reads[pl->n_r++] = range_of(node->src[s]);
    pl->shared_used = pl->shared_used || uses_shared;
    return meet && !first;
}

static void graph_job_run(void *arg, int ith, int nth)
{
    struct graph_job *job = arg;
    struct bp_cpu_params p = {
        .ith = ith,
        .nth = nth,
        .wdata = job->cb->work + (size_t)ith * job->per_thread,
        .wshared = job->cb->work + (size_t)nth * job->per_thread,
        .pool = job->cb->pool,
        .fault = &job->fault,
    };
    const int n = bp_graph_get_n_nodes(job->graph);
    bool started = false;
    for (int i = 0; i < n; i++) {
        bp_tensor *node = bp_graph_get_node(job->graph, i);
        if (!runs(node))
            continue;
        if (started && (job->barrier == NULL || job->barrier[i]))
            bp_cpu_pool_barrier(p.pool);
        bp_cpu_compute_node(node, &p);
        started = true;
    }
    /* No meeting after the last node: bp_cpu_pool_run returns when every thread has. */
}

static enum bp_status graph_compute(struct cpu_backend *cb, bp_graph *g);

static bool enter(struct cpu_backend *cb, const char *fn)
{
    bool expected = false;
    if (atomic_compare_exchange_strong(&cb->busy, &expected, true))
        return true;
    bp_set_error(BP_ERR_BUSY, "CPU: %s: the backend is computing or changing its thread count "
                 "on another thread; a backend is used by one thread at a time", fn);
    return false;
}

static enum bp_status cpu_graph_compute(bp_backend *be, bp_graph *g)
{
    struct cpu_backend *cb = bp_backend_get_context(be);
    if (!enter(cb, "graph compute"))
        return BP_ERR_BUSY;
    enum bp_status st = graph_compute(cb, g);
    atomic_store(&cb->busy, false);
    return st;
}

static enum bp_status graph_compute(struct cpu_backend *cb, bp_graph *g)
{
    const int nth = cb->n_threads;
    const int n_nodes = bp_graph_get_n_nodes(g);
    /* The meeting plan, for more than one thread (without memory for it, every node waits
     * for all threads, as it always may; none either while the pool runs jobs on one thread,
     * where meetings are free). */
    const bool want_plan = nth > 1 && !cb->meet_every_node && !bp_cpu_pool_solo(cb->pool);
    if (want_plan && n_nodes > cb->barrier_cap) {
        bool *b = realloc(cb->barrier, (size_t)n_nodes * sizeof(*b));
        if (b != NULL) {
            cb->barrier = b;
            cb->barrier_cap = n_nodes;
        }
    }
    const bool planned = want_plan && n_nodes <= cb->barrier_cap;
    struct planner pl = {.n_w = 0};
    size_t per_thread = 0, shared = 0;
    for (int i = 0; i < n_nodes; i++) {
        bp_tensor *node = bp_graph_get_node(g, i);
        if (planned)
            cb->barrier[i] = false;
        if (!computes(node))
            continue;
        char desc[BP_TENSOR_DESC_SIZE];
        if (!bp_cpu_supports_op(node)) {
            const bool mm_rows = (node->op == BP_OP_MUL_MAT || node->op == BP_OP_MUL_MAT_ID) &&
                                 (node->src[0]->nb[0] != bp_type_size(node->src[0]->type) ||
                                  node->src[1]->nb[0] != sizeof(float));
            return bp_set_error(BP_ERR_UNSUPPORTED, "CPU: no kernel for %s node %s%s",
                                bp_op_name(node->op), bp_describe_tensor(node, desc, sizeof(desc)),
                                mm_rows ? " (MUL_MAT and MUL_MAT_ID read both operands along K, "
                                          "their dimension 0, which must be contiguous: make a "
                                          "transposed operand contiguous with bp_cont first)"
                                        : "");
        }
        if (node->data == NULL)
            return bp_set_error(BP_ERR_INVALID_ARG, "CPU: %s node %s has no memory",
                                bp_op_name(node->op), bp_describe_tensor(node, desc, sizeof(desc)));
        size_t pt, sh, pt1 = 0, sh1 = 0;
        bp_cpu_work_size(node, nth, &pt, &sh);
        if (nth > 1) /* the pool may run the graph on one thread (contention) */
            bp_cpu_work_size(node, 1, &pt1, &sh1);
        per_thread = pt > per_thread ? pt : per_thread;
        per_thread = pt1 > per_thread ? pt1 : per_thread;
        shared = sh > shared ? sh : shared;
        shared = sh1 > shared ? sh1 : shared;
        if (planned && bp_nelements(node) > 0)
            cb->barrier[i] = plan_node(&pl, node, sh > 0 || sh1 > 0);
    }
    per_thread = (per_thread + 63) / 64 * 64;
    size_t need = per_thread * (size_t)nth + shared + 64;
    if (need > cb->work_size) {
        free(cb->work);
        cb->work = aligned_alloc(64, (need + 63) / 64 * 64);
        cb->work_size = cb->work ? need : 0;
        if (cb->work == NULL)
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU: out of memory for %zu bytes of "
                                "scratch", need);
    }
    struct graph_job job = {g, cb, per_thread, planned ? cb->barrier : NULL, NULL};
    bp_cpu_pool_run(cb->pool, graph_job_run, &job);
    const bp_tensor *bad = atomic_load(&job.fault);
    if (bad != NULL) {
        char desc[BP_TENSOR_DESC_SIZE];
        const bool mmid = bad->op == BP_OP_MUL_MAT_ID, set = bad->op == BP_OP_SET_ROWS;
        return bp_set_error(BP_ERR_OUT_OF_BOUNDS, "CPU: %s node %s: %s in src[%d] is outside "
                            "0..%lld; %s", bp_op_name(bad->op),
                            bp_describe_tensor(bad, desc, sizeof(desc)),
                            mmid ? "an expert id" : "a row id", mmid || set ? 2 : 1,
                            (long long)(mmid  ? bad->src[0]->ne[2]
                                        : set ? bad->ne[1]
                                              : bad->src[0]->ne[1]) - 1,
                            mmid  ? "the results of the slots it names are undefined"
                            : set ? "those rows were not written"
                                  : "those result rows are NaN");
    }
    return BP_OK;
}

/* Events of a synchronous backend: recording happens after the work it follows is done. */
static enum bp_status cpu_event_record(bp_backend *be, void *event)
{
    (void)be;
    *(int *)event = 1;
    return BP_OK;
}

static enum bp_status cpu_event_wait(bp_backend *be, void *event)
{
    (void)be;
    (void)event;
    return BP_OK;
}

static const struct bp_backend_iface cpu_backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = cpu_backend_name,
    .free = cpu_backend_free,
    .graph_compute = cpu_graph_compute,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
};

static enum bp_status set_threads(struct cpu_backend *cb, int n)
{
    if (n < 1 || n > 1024)
        return bp_set_error(BP_ERR_INVALID_ARG, "CPU: thread count %d is not in 1..1024", n);
    if (cb->pool != NULL && n == cb->n_threads)
        return BP_OK;
    struct bp_cpu_pool *pool = bp_cpu_pool_new(n);
    if (pool == NULL)
        return bp_last_status();
    bp_cpu_pool_free(cb->pool);
    cb->pool = pool;
    cb->n_threads = n;
    return BP_OK;
}

/* At most this many bytes of a parameter are quoted in a message (the facts come first). */
#define SHOWN 64

/* The backend parameters: comma-separated key=value items, spaces around an item ignored;
 * known: "threads=N". Scanned in place, so no length limit hides an item. An empty item, an
 * unknown key, a key given twice and a value that is not a number in range are errors. */
static enum bp_status parse_params(const char *params, int *threads)
{
    if (params == NULL || params[0] == '\0')
        return BP_OK;
    bool have_threads = false;
    const char *p = params;
    for (int i = 1;; i++) {
        const char *end = p + strcspn(p, ",");
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        const int len = b - a > SHOWN ? SHOWN : (int)(b - a);
        const char *more = b - a > SHOWN ? "..." : "";
        if (a == b)
            return bp_set_error(BP_ERR_INVALID_ARG, "CPU: backend parameter %d is empty (an "
                                "extra or missing comma?); parameters are comma-separated "
                                "key=value items", i);
        const char *eq = memchr(a, '=', (size_t)(b - a));
        if (eq == NULL || eq - a != 7 || strncmp(a, "threads", 7) != 0)
            return bp_set_error(BP_ERR_INVALID_ARG, "CPU: unknown backend parameter '%.*s%s' "
                                "(known: threads=N)", len, a, more);
        if (have_threads)
            return bp_set_error(BP_ERR_INVALID_ARG, "CPU: backend parameter 'threads' is given "
                                "twice");
        /* Digits only (strtol would take signs and spaces), stopping before it can overflow. */
        long v = 0;
        const char *d = eq + 1;
        while (d < b && *d >= '0' && *d <= '9' && v <= 1024)
            v = v * 10 + (*d++ - '0');
        if (d == eq + 1 || d != b || v < 1 || v > 1024)
            return bp_set_error(BP_ERR_INVALID_ARG, "CPU: '%.*s%s' is not a thread count in "
                                "1..1024", len, a, more);
        *threads = (int)v;
        have_threads = true;
        if (*end == '\0')
            return BP_OK;
        p = end + 1;
    }
}

static bp_backend *cpu_init_backend(bp_device *dev, const char *params)
{
    int threads = online_cores() / the_cpu->n_devices;
    if (threads < 1)
        threads = 1;
    if (parse_params(params, &threads) != BP_OK)
        return NULL;
    struct cpu_backend *cb = calloc(1, sizeof(*cb));
    if (cb == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU: out of memory creating a backend");
        return NULL;
    }
    if (set_threads(cb, threads) != BP_OK) {
        free(cb);
        return NULL;
    }
    const char *meet = getenv("BP_CPU_NODE_BARRIERS");
    cb->meet_every_node = meet != NULL && strcmp(meet, "all") == 0;
    bp_backend *be = bp_backend_new(dev, &cpu_backend_iface, cb);
    if (be == NULL) {
        bp_cpu_pool_free(cb->pool);
        free(cb);
    }
    return be;
}

/* Proc address "bp_set_n_threads" (bp_set_n_threads_fn, behind bp_backend_set_n_threads). */
static enum bp_status cpu_set_n_threads(bp_backend *be, int n)
{
    if (!bp_cpu_is_own_backend(be))
        return bp_set_error(BP_ERR_INVALID_ARG, "CPU: bp_set_n_threads: not a CPU backend");
    struct cpu_backend *cb = bp_backend_get_context(be);
    if (!enter(cb, "bp_set_n_threads"))
        return BP_ERR_BUSY;
    enum bp_status st = set_threads(cb, n);
    atomic_store(&cb->busy, false);
    return st;
}

/* ---- Device ----------------------------------------------------------------------------- */

static const char *cpu_dev_name(bp_device *dev)
{
    const struct cpu_device *d = bp_device_get_context(dev);
    return d->name;
}

static const char *cpu_dev_description(bp_device *dev)
{
    const struct cpu_device *d = bp_device_get_context(dev);
    return d->description;
}

static void cpu_dev_memory(bp_device *dev, size_t *free_bytes, size_t *total)
{
    (void)dev;
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES),
         phys = sysconf(_SC_PHYS_PAGES);
    *free_bytes = page > 0 && avail > 0 ? (size_t)page * (size_t)avail : 0;
    *total = page > 0 && phys > 0 ? (size_t)page * (size_t)phys : 0;
}

static enum bp_device_type cpu_dev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_CPU;
}

static void cpu_dev_caps(bp_device *dev, struct bp_device_caps *caps)
{
    (void)dev;
    *caps = (struct bp_device_caps){
        .async = false, .host_buffer = false, .buffer_from_host_ptr = true, .events = true};
}

static bp_buffer_type *cpu_dev_buft(bp_device *dev)
{
    (void)dev;
    return bp_host_buffer_type();
}

static bp_buffer *cpu_dev_from_host_ptr(bp_device *dev, void *ptr, size_t size, size_t max)
{
    (void)dev;
    (void)max;
    return bp_buffer_from_host_ptr(ptr, size);
}

static bool cpu_dev_supports_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    return bp_cpu_repack_supports_op(op) && bp_cpu_supports_op(op);
}

/* Host memory, and any CPU device's repacked buffers (they are host memory too). */
static bool cpu_dev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    (void)dev;
    return bp_buffer_type_is_host(buft) || bp_cpu_is_repack_buft(buft);
}

static void *cpu_event_new(bp_device *dev)
{
    (void)dev;
    return calloc(1, sizeof(int));
}

static void cpu_event_free(bp_device *dev, void *event)
{
    (void)dev;
    free(event);
}

static enum bp_status cpu_event_synchronize(bp_device *dev, void *event)
{
    (void)dev;
    (void)event;
    return BP_OK; /* work is finished when graph_compute returns */
}

static const struct bp_device_iface cpu_device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = cpu_dev_name,
    .get_description = cpu_dev_description,
    .get_memory = cpu_dev_memory,
    .get_type = cpu_dev_type,
    .get_caps = cpu_dev_caps,
    .init_backend = cpu_init_backend,
    .get_buffer_type = cpu_dev_buft,
    .buffer_from_host_ptr = cpu_dev_from_host_ptr,
    .supports_op = cpu_dev_supports_op,
    .supports_buft = cpu_dev_supports_buft,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_synchronize = cpu_event_synchronize,
};

/* ---- Registry --------------------------------------------------------------------------- */

static const char *cpu_reg_name(bp_registry *reg)
{
    (void)reg;
    return "CPU";
}

static size_t cpu_reg_count(bp_registry *reg)
{
    (void)reg;
    return (size_t)the_cpu->n_devices;
}

static bp_device *cpu_reg_device(bp_registry *reg, size_t i)
{
    (void)reg;
    return the_cpu->devices[i].dev;
}

/* Proc address "bp_cpu_repack_buffer_type": bp_buffer_type *(*)(bp_device *). */
static bp_buffer_type *cpu_repack_buffer_type(bp_device *dev)
{
    for (int i = 0; the_cpu != NULL && i < the_cpu->n_devices; i++) {
        if (the_cpu->devices[i].dev == dev)
            return the_cpu->devices[i].repack;
    }
    bp_set_error(BP_ERR_INVALID_ARG, "bp_cpu_repack_buffer_type: %s is not a CPU device",
                 dev ? bp_device_get_name(dev) : "NULL");
    return NULL;
}

/* Proc address "bp_cpu_repack_type": bool (*)(bp_device *, enum bp_type). */
static bool cpu_repack_type(bp_device *dev, enum bp_type type)
{
    return cpu_repack_buffer_type(dev) != NULL && bp_cpu_repack_stores(type);
}

static void *cpu_reg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    if (strcmp(name, "bp_cpu_repack_buffer_type") == 0)
        return (void *)cpu_repack_buffer_type;
    if (strcmp(name, "bp_cpu_repack_type") == 0)
        return (void *)cpu_repack_type;
    if (strcmp(name, "bp_set_n_threads") == 0)
        return (void *)cpu_set_n_threads;
    if (strcmp(name, "bp_comm_init") == 0)
        return (void *)bp_cpu_comm_init;
    if (strcmp(name, "bp_comm_allreduce") == 0)
        return (void *)bp_cpu_comm_allreduce;
    if (strcmp(name, "bp_comm_free") == 0)
        return (void *)bp_cpu_comm_free;
    return NULL;
}

static void cpu_reg_free(bp_registry *reg)
{
    (void)reg;
    free(the_cpu);
    the_cpu = NULL;
}

static const struct bp_registry_iface cpu_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = cpu_reg_name,
    .get_device_count = cpu_reg_count,
    .get_device = cpu_reg_device,
    .get_proc_address = cpu_reg_proc,
    .free = cpu_reg_free,
};

static void read_model_name(char *out, size_t n)
{
    snprintf(out, n, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v != NULL) {
                v += 2;
                v[strcspn(v, "\n")] = '\0';
                snprintf(out, n, "%s", v);
            }
            break;
        }
    }
    fclose(f);
}

static bp_registry *cpu_plugin_init(void)
{
    if (the_cpu != NULL) {
        bp_set_error(BP_ERR_BUSY, "CPU: the plugin is already initialised");
        return NULL;
    }
#if !defined(BP_CPU_HAVE_F16C)
    bp_cpu_half_table_init(); /* before any kernel can run: the loader calls init first */
#endif
    struct cpu_registry *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU: out of memory");
        return NULL;
    }
    int n = 1;
    const char *env = getenv("BP_CPU_DEVICES");
    if (env != NULL && env[0] != '\0') {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end == env || *end != '\0' || v < 1 || v > BP_CPU_MAX_DEVICES) {
            free(c);
            bp_set_error(BP_ERR_INVALID_ARG, "CPU: BP_CPU_DEVICES='%s' is not a device count in "
                         "1..%d", env, BP_CPU_MAX_DEVICES);
            return NULL;
        }
        n = (int)v;
    }
    char model[192];
    read_model_name(model, sizeof(model));
    const char *amx = bp_cpu_amx_available() ? "+amx" : "";
    c->n_devices = n;
    for (int i = 0; i < n; i++) {
        struct cpu_device *d = &c->devices[i];
        if (n == 1) {
            snprintf(d->name, sizeof(d->name), "CPU");
            snprintf(d->description, sizeof(d->description), "%s (%d cores, %s%s kernels)", model,
                     online_cores(), bp_cpu_variant_name(), amx);
        } else {
            snprintf(d->name, sizeof(d->name), "CPU%d", i);
            snprintf(d->description, sizeof(d->description),
                     "%s (device %d of %d sharing %d cores, %s%s kernels)", model, i, n,
                     online_cores(), bp_cpu_variant_name(), amx);
        }
    }
    the_cpu = c;
    c->reg = bp_registry_new(&cpu_registry_iface, c);
    if (c->reg == NULL) {
        free(c);
        the_cpu = NULL;
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        c->devices[i].dev = bp_device_new(c->reg, &cpu_device_iface, &c->devices[i]);
        if (c->devices[i].dev != NULL)
            c->devices[i].repack = bp_cpu_repack_buft_new(c->devices[i].dev);
        if (c->devices[i].dev == NULL || c->devices[i].repack == NULL) {
            bp_registry_free(c->reg); /* frees c through cpu_reg_free */
            return NULL;
        }
    }
    return c->reg;
}

static int cpu_plugin_score(void)
{
    return BP_CPU_SCORE;
}

BP_PLUGIN_DEFINE("cpu", BP_CPU_VARIANT, BP_CPU_FEATURES, cpu_plugin_init, cpu_plugin_score);
