/* sched.c - the scheduler: assigns every node of a graph to one of several backends, cuts the
 * graph where the backend changes, copies each split's inputs into the split's backend,
 * allocates everything through the graph allocator and runs the splits in order.
 *
 * Assignment, in passes (assign_all; the reasons are what BP_SCHED_DEBUG=2 prints):
 *   1. assign_pinned_and_placed: pinned by the user; already in a buffer (the highest-priority
 *      backend that can use that buffer type and runs the op); graph inputs go to the CPU
 *      backend (the last); an op that reads weights (buffer usage WEIGHTS) goes where the
 *      weights are, unless a higher-priority backend asks to offload it.
 *   2. expand to unassigned neighbours: down then up the node list, accelerators first (the
 *      CPU does not spread), then everyone.
 *   3. upgrade: a node moves to a higher-priority backend that runs it and can use the buffers
 *      of everything it touches.
 *   4. assign_rest: the backend holding most of the node's inputs, else the highest-priority
 *      one that runs it; a node no backend runs is an error naming it.
 *   5. place_views_and_leafs: leafs and views without a backend take their consumer's or their
 *      source's.
 * check_assignments then refuses a node placed where it cannot run or write.
 *
 * Splits (cut_splits): a run of consecutive nodes on one backend. Every source of a split's
 * node that lives on another backend gets a copy (add_input_copies: one per split input, reused
 * within the split) allocated in the split's backend as a graph input; the node's source
 * pointer is swapped to the copy until the computation is finished (then restored), so the
 * allocator and the backend see one consistent graph (build_alloc_graph, set_split_graphs).
 * With `parallel`, BP_SCHED_MAX_COPIES sets of copies rotate between evaluations and each
 * backend's events keep a copy from being overwritten while still in use.
 *
 * Every tensor's assignment lives in a record found through a pointer map (ptrmap.h) that is
 * cleared in O(1) per split. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "sched-impl.h"

static const char *const why_text[] = {
    "unassigned",        "pinned by the user", "its memory is there", "graph input (CPU)",
    "its weights are there", "offloaded",      "expanded from a neighbour (accelerators)",
    "expanded from a neighbour", "moved up to a higher-priority backend",
    "most of its inputs are there", "the first backend that runs it", "its consumer is there",
    "its view source is there", "input copy",
};

/* ---- Small helpers ---------------------------------------------------------------------- */

/* The entry of t, new (unassigned) on first mention. */
static struct tinfo *info(bp_sched *s, const bp_tensor *t)
{
    bool added;
    int *i = bp__ptrmap_put(&s->map, t, (int)s->map.used, &added);
    if (i == NULL) {
        /* Too full to stay fast (or at all): answer from scratch, split again bigger. */
        s->overflow = true;
        memset(&s->scratch, 0, sizeof(s->scratch));
        s->scratch.backend = -1;
        return &s->scratch;
    }
    struct tinfo *ti = &s->infos[*i];
    if (added) {
        memset(ti, 0, sizeof(*ti));
        ti->backend = -1;
    }
    return ti;
}

/* Whether t has an entry (from the last split), without making one. */
static bool known(const bp_sched *s, const bp_tensor *t)
{
    return bp__ptrmap_get(&s->map, t) != NULL;
}

/* Empties the table in O(1), for the next split. */
static void clear_infos(bp_sched *s)
{
    bp__ptrmap_clear(&s->map);
    s->overflow = false;
}

/* Makes room for at least want slots (1024 at least). The entries array may move: every
 * struct tinfo pointer taken before is stale, so this runs only before a split starts. */
static bool resize_infos(bp_sched *s, size_t want)
{
    return bp__ptrmap_reserve(&s->map, want > 1024 ? want : 1024,
                              "the scheduler's tensor table") &&
           bp__grow((void **)&s->infos, &s->cap_infos, bp__ptrmap_limit(&s->map),
                    sizeof(*s->infos), "the scheduler's tensor table");
}

static int backend_index(const bp_sched *s, const bp_backend *be)
{
    for (int i = 0; i < s->n_backends; i++) {
        if (s->backends[i] == be)
            return i;
    }
    return -1;
}

static bool is_view_op(const bp_tensor *t)
{
    return bp_op_is_view(t->op);
}

/* The buffer t was placed in before scheduling, or NULL: memory this scheduler's allocator gave
 * it on an earlier split (a node computed before, now pinned elsewhere or split anew) counts as
 * none, since the allocator places it again; and such a buffer may have been freed when it
 * grew, so it is compared, never read. */
static bp_buffer *buffer_of(const bp_sched *s, const bp_tensor *t)
{
    bp_buffer *buf = t->view_src ? t->view_src->buffer : t->buffer;
    return bp__gallocr_owns(s->galloc, buf) ? NULL : buf;
}

/* The highest-priority backend that can use buf's type (and runs op, when given). */
static int backend_for_buffer(const bp_sched *s, const bp_buffer *buf, const bp_tensor *op)
{
    bp_buffer_type *bt = buf->buft;
    for (int i = 0; i < s->n_backends; i++) {
        if (bp_backend_supports_buft(s->backends[i], bt) &&
            (op == NULL || bp_backend_supports_op(s->backends[i], op)))
            return i;
    }
    return -1;
}

static void assign(bp_sched *s, const bp_tensor *t, int backend, enum why why)
{
    struct tinfo *ti = info(s, t);
    ti->backend = (signed char)backend;
    ti->why = (unsigned char)why;
}

/* Whether backend b runs node (cached in its table entry). */
static bool supports(const bp_sched *s, struct tinfo *ti, const bp_tensor *node, int b)
{
    const unsigned short bit = (unsigned short)(1u << b);
    if (!(ti->sup_known & bit)) {
        ti->sup_known |= bit;
        if (bp_backend_supports_op(s->backends[b], node))
            ti->sup |= bit;
    }
    return (ti->sup & bit) != 0;
}

/* ---- Lifecycle -------------------------------------------------------------------------- */

static void restore_sources(bp_sched *s)
{
    for (int i = s->n_subst; i-- > 0;)
        s->subst[i].node->src[s->subst[i].slot] = s->subst[i].orig;
    s->n_subst = 0;
}

/* A backend's compute buffer type when the caller names none: its default, except that a CPU
 * backend computes in the host buffer type of the first other device that offers one it can use
 * (pinned memory for a GPU). Split inputs copied between the two then move by DMA straight from
 * page-locked memory instead of being staged through pageable memory. When that memory cannot be
 * had (pinned memory is scarce), the backend falls back to its default (drop_pinned). */
static bp_buffer_type *default_buft(bp_backend *const *backends, int n, int i)
{
    bp_device *dev = bp_backend_get_device(backends[i]);
    if (bp_device_get_type(dev) == BP_DEVICE_TYPE_CPU) {
        for (int j = 0; j < n; j++) {
            bp_device *other = bp_backend_get_device(backends[j]);
            struct bp_device_caps caps;
            if (j == i || bp_device_get_type(other) == BP_DEVICE_TYPE_CPU)
                continue;
            bp_device_get_caps(other, &caps);
            if (!caps.host_buffer)
                continue;
            bp_buffer_type *host = bp_device_get_host_buffer_type(other);
            if (host != NULL && bp_buffer_type_is_host(host) &&
                bp_backend_supports_buft(backends[i], host))
                return host;
        }
    }
    return bp_backend_get_default_buffer_type(backends[i]);
}

bp_sched *bp_sched_new(bp_backend *const *backends, bp_buffer_type *const *bufts, int n,
                       size_t graph_size, bool parallel)
{
    if (backends == NULL || n < 1)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_sched_new: need at least one backend");
    if (n > BP_SCHED_MAX_BACKENDS)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_sched_new: %d backends given; at most %d",
                              n, BP_SCHED_MAX_BACKENDS);
    for (int i = 0; i < n; i++) {
        if (backends[i] == NULL)
            return bp__error_null(BP_ERR_INVALID_ARG, "bp_sched_new: backend %d is NULL", i);
    }
    if (bp_device_get_type(bp_backend_get_device(backends[n - 1])) != BP_DEVICE_TYPE_CPU)
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_sched_new: the last backend must be a CPU backend, but it is %s "
                              "(a %s device)",
                              bp_backend_get_name(backends[n - 1]),
                              bp_device_type_name(bp_device_get_type(
                                  bp_backend_get_device(backends[n - 1]))));
    if (graph_size == 0 || graph_size > (1u << 24))
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_sched_new: graph_size %zu is out of range",
                              graph_size);

    bp_sched *s = bp__calloc(1, sizeof(*s), "a scheduler");
    if (s == NULL)
        return NULL;
    s->n_backends = n;
    s->graph_size = graph_size;
    s->parallel = parallel;
    s->n_copies = parallel ? BP_SCHED_MAX_COPIES : 1;
    s->used_experts = true;
    for (int i = 0; i < n; i++) {
        s->backends[i] = backends[i];
        s->bufts[i] = bufts && bufts[i] ? bufts[i] : default_buft(backends, n, i);
        s->pinned[i] = !(bufts && bufts[i]) &&
                       s->bufts[i] != bp_backend_get_default_buffer_type(backends[i]);
        if (s->bufts[i] == NULL || !bp_backend_supports_buft(backends[i], s->bufts[i])) {
            bp__error(BP_ERR_INVALID_ARG, "bp_sched_new: backend %s cannot use buffer type %s",
                      bp_backend_get_name(backends[i]), bp_buffer_type_get_name(s->bufts[i]));
            goto fail;
        }
    }
    const char *dbg = getenv("BP_SCHED_DEBUG");
    s->debug = dbg ? atoi(dbg) : 0;

    s->galloc = bp_gallocr_new(s->bufts, n);
    if (s->galloc == NULL)
        goto fail;
    if (!resize_infos(s, 4 * graph_size))
        goto fail;
    s->ctx = bp_context_new(graph_size + 64); /* grows on demand (split_graph) */
    s->graph = bp_graph_new(graph_size * (size_t)s->n_copies * 2 + 16);
    if (s->ctx == NULL || s->graph == NULL)
        goto fail;
    if (parallel) {
        for (int b = 0; b < n; b++) {
            struct bp_device_caps caps;
            bp_device_get_caps(bp_backend_get_device(backends[b]), &caps);
            for (int c = 0; c < s->n_copies && caps.events; c++) {
                s->events[b][c] = bp_event_new(bp_backend_get_device(backends[b]));
                if (s->events[b][c] == NULL)
                    goto fail;
            }
        }
    }
    return s;

fail:
    bp_sched_free(s);
    return NULL;
}

/* Nothing of the scheduler's is in use on a device any more: every backend finished (errors
 * are the next compute's to meet) and the sources of the last graph are its own again (a
 * product that read an expert cache in place points at it until then). Before a cache is
 * freed. */
void bp__sched_quiet(bp_sched *s)
{
    for (int b = 0; b < s->n_backends; b++)
        if (bp_backend_synchronize(s->backends[b]) != BP_OK)
            bp_clear_error();
    restore_sources(s);
}

void bp_sched_free(bp_sched *s)
{
    if (s == NULL)
        return;
    bp__sched_quiet(s);
    for (int b = 0; b < s->n_backends; b++)
        for (int c = 0; c < BP_SCHED_MAX_COPIES; c++)
            bp_event_free(s->events[b][c]);
    for (size_t i = 0; i < s->cap_splits; i++)
        bp_graph_free(s->splits[i].graph);
    bp__free(s->splits);
    bp_gallocr_free(s->galloc);
    bp_graph_free(s->graph);
    bp_context_free(s->ctx);
    bp__free(s->infos);
    bp__ptrmap_close(&s->map);
    bp__free(s->copies);
    bp__free(s->leaf_buf);
    bp__free(s->node_buf);
    bp__free(s->node_ids);
    bp__free(s->leaf_ids);
    bp__free(s->subst);
    bp__free(s->kept_subst);
    bp__free(s->pins);
    bp__free(s->preds);
    bp__free(s->node_ti);
    bp__expert_caches_free(s->expert_caches);
    bp__free(s);
}

/* One thread at a time per scheduler (bp-sched.h): a call that finds another in progress is
 * refused before it touches the split or allocation state. */
static bool sched_enter(bp_sched *s, const char *fn)
{
    bool expected = false;
    if (atomic_compare_exchange_strong(&s->busy, &expected, true))
        return true;
    bp__error(BP_ERR_BUSY,
              "%s: the scheduler is in use by another thread; a scheduler is used by one thread "
              "at a time",
              fn);
    return false;
}

static void sched_leave(bp_sched *s)
{
    atomic_store(&s->busy, false);
}

/* The public calls that take a scheduler and a graph: both checked, then body run inside the
 * one-thread-at-a-time guard. fn is the public name, for messages. */
static enum bp_status guarded(bp_sched *s, bp_graph *g, const char *fn,
                              enum bp_status (*body)(bp_sched *s, bp_graph *g))
{
    if (s == NULL || g == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "%s: scheduler and graph must not be NULL", fn);
    if (!sched_enter(s, fn))
        return BP_ERR_BUSY;
    enum bp_status st = body(s, g);
    sched_leave(s);
    return st;
}

void bp_sched_reset(bp_sched *s)
{
    if (s == NULL || !sched_enter(s, __func__))
        return;
    restore_sources(s);
    s->n_pins = 0;
    s->n_splits = 0;
    s->allocated = NULL;
    s->kept = NULL;
    s->direct = NULL;
    clear_infos(s);
    /* The weights may be others from now on. A product may still be reading a cache. */
    bp__sched_quiet(s);
    bp__expert_caches_clear(s->expert_caches);
    s->n_preds = 0;
    sched_leave(s);
}

/* ---- Assignment ------------------------------------------------------------------------- */

static int pinned_backend(const bp_sched *s, const bp_tensor *t)
{
    for (int i = 0; i < s->n_pins; i++) {
        if (s->pins[i].t == t)
            return s->pins[i].backend;
    }
    return -1;
}

/* assign_pinned_and_placed for one tensor: where its memory, role or weights put it. */
static void assign_from_current(bp_sched *s, const bp_tensor *t)
{
    int b = pinned_backend(s, t);
    if (b >= 0) {
        assign(s, t, b, WHY_PINNED);
        return;
    }
    const bp_buffer *buf = buffer_of(s, t);
    const bp_tensor *op = t->op == BP_OP_NONE || is_view_op(t) ? NULL : t;
    if (buf != NULL) {
        b = backend_for_buffer(s, buf, op);
        if (b < 0 && op != NULL)
            b = backend_for_buffer(s, buf, NULL);
        if (b >= 0) {
            assign(s, t, b, WHY_BUFFER);
            return;
        }
    }
    if (t->flags & BP_TENSOR_FLAG_INPUT) {
        assign(s, t, s->n_backends - 1, WHY_INPUT);
        return;
    }
    if (op == NULL)
        return;
    for (int i = 0; i < BP_MAX_SRC; i++) {
        const bp_tensor *src = t->src[i];
        const bp_buffer *sb = src ? buffer_of(s, src) : NULL;
        if (sb == NULL || sb->usage != BP_BUFFER_USAGE_WEIGHTS)
            continue;
        int wb = backend_for_buffer(s, sb, t);
        if (wb < 0)
            continue;
        /* A higher-priority backend may want the op even though the weights are elsewhere. */
        for (int h = 0; h < wb; h++) {
            if (bp_backend_supports_op(s->backends[h], t) &&
                bp_backend_offload_op(s->backends[h], t)) {
                assign(s, t, h, WHY_OFFLOAD);
                return;
            }
        }
        assign(s, t, wb, WHY_WEIGHTS);
        return;
    }
}

/* Expansion: walking the nodes down (or up), an unassigned node joins the backend of the last
 * assigned one when that backend runs it; without include_cpu the CPU does not spread. */
static void expand(bp_sched *s, bp_graph *g, bool up, bool include_cpu)
{
    const int n = bp_graph_get_n_nodes(g), cpu = s->n_backends - 1;
    bp_tensor **nodes = bp__graph_nodes(g);
    int cur = -1;
    for (int k = 0; k < n; k++) {
        const int i = up ? n - 1 - k : k;
        if (is_view_op(nodes[i]))
            continue;
        struct tinfo *ti = s->node_ti[i];
        if (ti->backend >= 0) {
            cur = (!include_cpu && ti->backend == cpu) ? -1 : ti->backend;
        } else if (cur >= 0 && supports(s, ti, nodes[i], cur)) {
            ti->backend = (signed char)cur;
            ti->why = include_cpu ? WHY_EXPAND_ANY : WHY_EXPAND_ACCEL;
        }
    }
}

/* Whether backend b can use the memory of every placed tensor node touches. */
static bool can_use_buffers(const bp_sched *s, int b, const bp_tensor *node)
{
    const bp_buffer *own = buffer_of(s, node);
    if (own != NULL && !bp_backend_supports_buft(s->backends[b], own->buft))
        return false;
    for (int i = 0; i < BP_MAX_SRC; i++) {
        const bp_buffer *sb = node->src[i] ? buffer_of(s, node->src[i]) : NULL;
        if (sb != NULL && !bp_backend_supports_buft(s->backends[b], sb->buft))
            return false;
    }
    return true;
}

static enum bp_status unsupported(bp_sched *s, const bp_tensor *node, int i)
{
    char names[256] = "";
    for (int b = 0; b < s->n_backends; b++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof(names) - used, "%s%s", b ? ", " : "",
                 bp_backend_get_name(s->backends[b]));
    }
    return bp__error(BP_ERR_UNSUPPORTED, "scheduler: no backend (%s) supports %s node %d %s",
                     names, bp_op_name(node->op), i, bp__describe(node).s);
}

/* The rule every assignment must end with: a node runs only on a backend that supports it,
 * and that backend can use the node's own memory when the node writes into memory placed
 * before scheduling (a KV cache that SET_ROWS updates, a pre-allocated output). Sources are
 * copied to the backend when it cannot read them; a destination cannot be, so a node whose
 * destination only unsupported backends can use is refused here with the reason. */
static enum bp_status check_assignments(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g);
    bp_tensor **nodes = bp__graph_nodes(g);
    for (int i = 0; i < n; i++) {
        const bp_tensor *node = nodes[i];
        struct tinfo *ti = s->node_ti[i];
        if (is_view_op(node))
            continue;
        const int b = ti->backend;
        const bp_buffer *own = buffer_of(s, node);
        if (b >= 0 && supports(s, ti, node, b) &&
            (own == NULL || bp_backend_supports_buft(s->backends[b], own->buft)))
            continue;
        if (b >= 0 && ti->why == WHY_PINNED && !supports(s, ti, node, b))
            return bp__error(BP_ERR_UNSUPPORTED,
                             "scheduler: %s node %d %s is pinned to backend %s, which does not "
                             "support it",
                             bp_op_name(node->op), i, bp__describe(node).s,
                             bp_backend_get_name(s->backends[b]));
        if (own == NULL)
            return unsupported(s, node, i);
        /* The node writes into memory it already has: say who can use it and who runs it. */
        char users[256] = "", runners[256] = "";
        for (int k = 0; k < s->n_backends; k++) {
            char *list = bp_backend_supports_buft(s->backends[k], own->buft) ? users
                       : supports(s, ti, node, k)                            ? runners
                                                                            : NULL;
            if (list != NULL) {
                size_t used = strlen(list);
                snprintf(list + used, 256 - used, "%s%s", used ? ", " : "",
                         bp_backend_get_name(s->backends[k]));
            }
        }
        bool many = strchr(users, ',') != NULL;
        return bp__error(BP_ERR_UNSUPPORTED,
                         "scheduler: %s node %d %s writes into its %s buffer, which only %s can "
                         "use, and %s not support %s%s%s%s; place that memory where a backend "
                         "that runs the op can use it",
                         bp_op_name(node->op), i, bp__describe(node).s,
                         bp_buffer_type_get_name(own->buft), users[0] ? users : "no backend",
                         many ? "they do" : "it does", bp_op_name(node->op),
                         runners[0] ? " (" : "", runners,
                         runners[0] ? " can run it but not use that memory)" : "");
    }
    return BP_OK;
}

/* One backend: nothing to decide, only whether it runs every node. */
static enum bp_status assign_single_backend(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g), nl = bp_graph_get_n_leafs(g);
    bp_tensor **nodes = bp__graph_nodes(g), **leafs = bp__graph_leafs(g);
    for (int i = 0; i < n; i++) {
        struct tinfo *ti = s->node_ti[i];
        if (!is_view_op(nodes[i]) && !supports(s, ti, nodes[i], 0))
            return unsupported(s, nodes[i], i);
        ti->backend = 0;
        ti->why = WHY_FIRST_SUPPORTING;
    }
    for (int i = 0; i < nl; i++) {
        struct tinfo *ti = info(s, leafs[i]);
        ti->backend = 0;
        ti->why = WHY_BUFFER;
    }
    return BP_OK;
}

/* Pins, memory already placed, graph inputs and weights, for leafs and nodes. */
static void assign_pinned_and_placed(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g), nl = bp_graph_get_n_leafs(g);
    bp_tensor **nodes = bp__graph_nodes(g), **leafs = bp__graph_leafs(g);
    for (int i = 0; i < nl; i++)
        assign_from_current(s, leafs[i]);
    for (int i = 0; i < n; i++)
        assign_from_current(s, nodes[i]);
}

/* Upgrade: a node moves to a higher-priority backend that runs it and can use its buffers. */
static void upgrade(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g);
    bp_tensor **nodes = bp__graph_nodes(g);
    for (int i = 0; i < n; i++) {
        bp_tensor *node = nodes[i];
        struct tinfo *ti = s->node_ti[i];
        if (is_view_op(node) || ti->backend <= 0 || ti->why == WHY_PINNED)
            continue;
        for (int b = 0; b < ti->backend; b++) {
            if (supports(s, ti, node, b) && can_use_buffers(s, b, node)) {
                ti->backend = (signed char)b;
                ti->why = WHY_UPGRADE;
                break;
            }
        }
    }
}

/* The backend holding most of node's inputs among those that run it, or -1. */
static int most_inputs(bp_sched *s, struct tinfo *ti, const bp_tensor *node)
{
    int count[BP_SCHED_MAX_BACKENDS] = {0}, best = -1;
    for (int k = 0; k < BP_MAX_SRC; k++) {
        if (node->src[k] == NULL)
            continue;
        int sb = info(s, node->src[k])->backend;
        if (sb >= 0 && supports(s, ti, node, sb))
            count[sb]++;
    }
    for (int b = 0; b < s->n_backends; b++) {
        if (count[b] > 0 && (best < 0 || count[b] > count[best]))
            best = b;
    }
    return best;
}

/* The rest: every node still unassigned goes where most of its inputs are, else to the first
 * backend that runs it; a node no backend runs is an error. */
static enum bp_status assign_rest(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g);
    bp_tensor **nodes = bp__graph_nodes(g);
    for (int i = 0; i < n; i++) {
        bp_tensor *node = nodes[i];
        struct tinfo *ti = s->node_ti[i];
        if (is_view_op(node) || ti->backend >= 0)
            continue;
        int best = most_inputs(s, ti, node);
        if (best >= 0) {
            ti->backend = (signed char)best;
            ti->why = WHY_MOST_INPUTS;
            continue;
        }
        for (int b = 0; b < s->n_backends && best < 0; b++) {
            if (supports(s, ti, node, b))
                best = b;
        }
        if (best < 0)
            return unsupported(s, node, i);
        ti->backend = (signed char)best;
        ti->why = WHY_FIRST_SUPPORTING;
    }
    return BP_OK;
}

/* Views run where their source's memory is (they compute nothing); leafs go with
 * their first consumer unless placed already, else to the CPU. */
static void place_views_and_leafs(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g), nl = bp_graph_get_n_leafs(g);
    bp_tensor **nodes = bp__graph_nodes(g), **leafs = bp__graph_leafs(g);
    for (int i = 0; i < n; i++) {
        bp_tensor *node = nodes[i];
        struct tinfo *ti = s->node_ti[i];
        if (is_view_op(node) && ti->backend < 0) {
            int vb = node->view_src ? info(s, node->view_src)->backend : -1;
            if (vb < 0 && node->src[0] != NULL)
                vb = info(s, node->src[0])->backend;
            ti->backend = (signed char)(vb >= 0 ? vb : s->n_backends - 1);
            ti->why = WHY_VIEW_SOURCE;
        }
        for (int k = 0; k < BP_MAX_SRC; k++) {
            bp_tensor *src = node->src[k];
            if (src != NULL && info(s, src)->backend < 0)
                assign(s, src, ti->backend, WHY_CONSUMER);
        }
    }
    for (int i = 0; i < nl; i++) {
        struct tinfo *ti = info(s, leafs[i]);
        if (ti->backend < 0)
            assign(s, leafs[i], s->n_backends - 1, WHY_CONSUMER);
    }
}

/* Every node and leaf of g gets a backend and a reason, in the passes of docs/sched.md. */
static enum bp_status assign_all(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g);
    bp_tensor **nodes = bp__graph_nodes(g);
    if (!bp__grow((void **)&s->node_ti, &s->cap_node_ti, (size_t)n, sizeof(*s->node_ti),
                  "the scheduler"))
        return BP_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++)
        s->node_ti[i] = info(s, nodes[i]);
    if (s->n_backends == 1)
        return assign_single_backend(s, g);

    assign_pinned_and_placed(s, g);
    expand(s, g, false, false); /* accelerators spread down, then up */
    expand(s, g, true, false);
    expand(s, g, false, true);  /* then every backend */
    expand(s, g, true, true);
    upgrade(s, g);
    enum bp_status st = assign_rest(s, g);
    if (st == BP_OK)
        place_views_and_leafs(s, g);
    return st;
}

/* ---- Splits ----------------------------------------------------------------------------- */

/* Whether backend b can read t where it lives (or will live: the buffer type of the backend it
 * is assigned to), so that no copy is needed. */
static bool readable_by(bp_sched *s, const bp_tensor *t, int b)
{
    const bp_buffer *buf = buffer_of(s, t);
    const int a = info(s, t)->backend; /* -1: not assigned (judged by b's own type) */
    bp_buffer_type *bt = buf ? buf->buft : s->bufts[a >= 0 ? a : b];
    return bp_backend_supports_buft(s->backends[b], bt);
}

static struct split *new_split(bp_sched *s, int backend, int i0)
{
    const size_t old_cap = s->cap_splits;
    if (!bp__grow((void **)&s->splits, &s->cap_splits, (size_t)s->n_splits + 1,
                  sizeof(*s->splits), "the scheduler's splits"))
        return NULL;
    /* New slots own no graph yet. */
    memset(s->splits + old_cap, 0, (s->cap_splits - old_cap) * sizeof(*s->splits));
    struct split *sp = &s->splits[s->n_splits++];
    sp->backend = backend;
    sp->i0 = sp->i1 = i0;
    sp->n_inputs = 0;
    return sp;
}

static bool listed(const struct split *sp, const bp_tensor *t)
{
    for (int j = 0; j < sp->n_inputs; j++) {
        if (sp->inputs[j] == t)
            return true;
    }
    return false;
}

/* The copy of src for backend b (making it and its rotation set on first use). */
static bp_tensor *copy_for(bp_sched *s, bp_tensor *src, int b)
{
    struct tinfo *ti = info(s, src);
    if (ti->copy[b] > 0)
        return s->copies[ti->copy[b] - 1].t[s->cur_copy];
    if (!bp__grow((void **)&s->copies, &s->cap_copy_sets, (size_t)s->n_copy_sets + 1,
                  sizeof(*s->copies), "the scheduler's input copies"))
        return NULL;
    struct copy_set *cs = &s->copies[s->n_copy_sets];
    cs->src = src;
    cs->backend = b;
    for (int c = 0; c < s->n_copies; c++) {
        bp_tensor *t = bp__new_tensor_impl(s->ctx, src->type, src->ne, "scheduler input copy");
        if (t == NULL)
            return NULL;
        memcpy(t->nb, src->nb, sizeof(t->nb));
        t->flags = BP_TENSOR_FLAG_INPUT;
        /* "<source>#<backend index>#<copy>", built by hand: this runs for every copy of every
         * graph, and snprintf would be most of its cost. */
        const char *base = src->name[0] ? src->name : bp_op_name(src->op);
        size_t l = strnlen(base, 40);
        memcpy(t->name, base, l);
        t->name[l++] = '#';
        if (b >= 10)
            t->name[l++] = (char)('0' + b / 10);
        t->name[l++] = (char)('0' + b % 10);
        t->name[l++] = '#';
        t->name[l++] = (char)('0' + c);
        t->name[l] = '\0';
        cs->t[c] = t;
        struct tinfo *ci = info(s, t);
        ci->backend = (signed char)b;
        ci->why = WHY_COPY;
    }
    ti = info(s, src); /* the table may not move, but keep the pointer honest */
    ti->copy[b] = (short)(++s->n_copy_sets);
    return cs->t[s->cur_copy];
}

static enum bp_status substitute(bp_sched *s, bp_tensor *node, int slot, bp_tensor *copy)
{
    if (!bp__grow((void **)&s->subst, &s->cap_subst, (size_t)s->n_subst + 1, sizeof(*s->subst),
                  "the scheduler's source swaps"))
        return BP_ERR_OUT_OF_MEMORY;
    s->subst[s->n_subst++] = (struct subst){node, slot, node->src[slot]};
    node->src[slot] = copy;
    return BP_OK;
}

/* Gives node i of the current split copies of the sources its backend cannot read where they
 * are (one copy per input per split, reused by the split's later nodes), cutting a new split
 * first when the new inputs would pass BP_SCHED_MAX_SPLIT_INPUTS. The split node i is in. */
static struct split *add_input_copies(bp_sched *s, struct split *sp, bp_tensor *node, int i,
                                      enum bp_status *st)
{
    /* Count the new inputs first: a split that would exceed the limit is cut before node. */
    int fresh_inputs = 0;
    bool foreign[BP_MAX_SRC];
    for (int k = 0; k < BP_MAX_SRC; k++) {
        bp_tensor *src = node->src[k];
        foreign[k] = src != NULL && !readable_by(s, src, sp->backend);
        if (foreign[k] && !listed(sp, src))
            fresh_inputs++;
    }
    if (sp->n_inputs + fresh_inputs > BP_SCHED_MAX_SPLIT_INPUTS && sp->i0 < i) {
        sp->i1 = i;
        sp = new_split(s, sp->backend, i);
        if (sp == NULL) {
            *st = BP_ERR_OUT_OF_MEMORY;
            return NULL;
        }
    }
    for (int k = 0; k < BP_MAX_SRC; k++) {
        bp_tensor *src = node->src[k];
        /* A source that was a copy target already reads the copy: compare with the split as
         * it stands after a possible cut (the backend is the same). */
        if (!foreign[k])
            continue;
        bp_tensor *copy = copy_for(s, src, sp->backend);
        if (copy == NULL) {
            *st = bp_last_status() != BP_OK ? bp_last_status() : BP_ERR_OUT_OF_MEMORY;
            return NULL;
        }
        if (!listed(sp, src))
            sp->inputs[sp->n_inputs++] = src;
        if ((*st = substitute(s, node, k, copy)) != BP_OK)
            return NULL;
    }
    return sp;
}

/* Whether t (or what it views) is one of nodes[i0, i1). */
static bool made_in_split(bp_tensor **nodes, int i0, int i1, const bp_tensor *t)
{
    for (int j = i0; t != NULL && j < i1; j++)
        if (nodes[j] == t || (t->view_src != NULL && nodes[j] == t->view_src))
            return true;
    return false;
}

/* Cuts g into splits, runs of consecutive nodes on one backend, with their input copies. */
static enum bp_status cut_splits(bp_sched *s, bp_graph *g)
{
    const int n = bp_graph_get_n_nodes(g);
    bp_tensor **nodes = bp__graph_nodes(g);
    s->n_splits = 0;
    struct split *sp = NULL;
    for (int i = 0; i < n; i++) {
        bp_tensor *node = nodes[i];
        const int b = s->node_ti[i]->backend;
        /* Views never start a split: they join the current one (they compute nothing). */
        if (sp == NULL || (b != sp->backend && !is_view_op(node))) {
            if (sp != NULL)
                sp->i1 = i;
            sp = new_split(s, b, i);
            if (sp == NULL)
                return BP_ERR_OUT_OF_MEMORY;
        }
        if (is_view_op(node)) /* (one backend comes here only for sources it cannot read) */
            continue;
        /* Stacked experts to copy for a MUL_MAT_ID whose ids this split computes: a split of
         * its own from here, so that the ids are known when its inputs are copied and only the
         * experts they choose need to come (sched-experts.c). */
        if (node->op == BP_OP_MUL_MAT_ID && sp->i0 < i && node->src[0] != NULL &&
            !readable_by(s, node->src[0], sp->backend) && made_in_split(nodes, sp->i0, i,
                                                                        node->src[2])) {
            sp->i1 = i;
            sp = new_split(s, b, i);
            if (sp == NULL)
                return BP_ERR_OUT_OF_MEMORY;
        }
        enum bp_status st = BP_OK;
        sp = add_input_copies(s, sp, node, i, &st);
        if (sp == NULL)
            return st;
    }
    if (sp != NULL)
        sp->i1 = n;
    return BP_OK;
}

/* ---- Split, allocate --------------------------------------------------------------------- */

static enum bp_status split_graph_once(bp_sched *s, bp_graph *g);

/* Splits g; when the copies and dependencies outgrow the scheduler's context, grows it and
 * starts again (the context holds only their metadata, so this is cheap and rare). */
static enum bp_status split_graph(bp_sched *s, bp_graph *g)
{
    const size_t tensors = (size_t)bp_graph_get_n_nodes(g) + (size_t)bp_graph_get_n_leafs(g);
    if (!resize_infos(s, 4 * tensors))
        return BP_ERR_OUT_OF_MEMORY;
    for (;;) {
        const size_t cap = bp_context_get_capacity(s->ctx);
        enum bp_status st = split_graph_once(s, g);
        if (s->overflow) {
            restore_sources(s);
            if (!resize_infos(s, 4 * bp__ptrmap_size(&s->map)))
                return BP_ERR_OUT_OF_MEMORY;
            continue;
        }
        if (st != BP_ERR_CAPACITY || bp_context_get_n_tensors(s->ctx) < cap)
            return st;
        bp_context *bigger = bp_context_new(2 * cap);
        if (bigger == NULL)
            return BP_ERR_OUT_OF_MEMORY;
        bp_context_free(s->ctx);
        s->ctx = bigger;
    }
}

/* Whether the one backend can read every source where it lives (else, e.g. for weights in a
 * File buffer, the graph is cut and those sources copied like any other backend's). */
static bool all_readable(bp_sched *s, bp_graph *g)
{
    bp_tensor **nodes = bp__graph_nodes(g);
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++)
        for (int k = 0; k < BP_MAX_SRC; k++) {
            const bp_tensor *src = nodes[i]->src[k];
            const bp_buffer *buf = src != NULL ? buffer_of(s, src) : NULL;
            if (buf != NULL && !bp_backend_supports_buft(s->backends[0], buf->buft))
                return false;
        }
    return true;
}

/* One backend: nothing to cut and nothing to copy, the graph itself is the one split. */
static enum bp_status split_direct(bp_sched *s, bp_graph *g)
{
    s->n_splits = 0;
    struct split *sp = new_split(s, 0, 0);
    if (sp == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    sp->i1 = bp_graph_get_n_nodes(g);
    s->direct = g;
    return BP_OK;
}

/* The nodes the allocator sees, with their backends: before each split, one view per split
 * input that reads it (so the input stays alive until the split's copies are made, even when
 * the split's own nodes now read the copy), then the split's nodes. Their number, or -1. */
static int alloc_nodes(bp_sched *s, bp_graph *g)
{
    bp_tensor **gnodes = bp__graph_nodes(g);
    int k = 0;
    for (int i = 0; i < s->n_splits; i++) {
        struct split *sp = &s->splits[i];
        for (int j = 0; j < sp->n_inputs; j++) {
            bp_tensor *in = sp->inputs[j];
            if (info(s, in)->backend < 0) {
                /* Said in the graph's terms, not as the allocator's complaint about the
                 * buffer type of the view that keeps the input alive. */
                const bp_buffer *own = buffer_of(s, in);
                bp__error(BP_ERR_UNSUPPORTED, "scheduler: %s, an input of the part of the "
                          "graph that runs on %s, is held by none of the scheduler's backends "
                          "(its memory: %s); give the scheduler a backend that can use that "
                          "memory, or copy the tensor where one can", bp__describe(in).s,
                          bp_backend_get_name(s->backends[sp->backend]),
                          own != NULL ? bp_buffer_type_get_name(own->buft) : "none yet");
                return -1;
            }
            bp_tensor *dep = bp__view_of(s->ctx, in, "scheduler input dependency");
            if (dep == NULL)
                return -1;
            dep->op = BP_OP_VIEW;
            dep->src[0] = in;
            s->node_buf[k] = dep;
            s->node_ids[k++] = info(s, in)->backend;
        }
        for (int q = sp->i0; q < sp->i1; q++) {
            s->node_buf[k] = gnodes[q];
            s->node_ids[k++] = s->node_ti[q]->backend;
        }
    }
    return k;
}

/* The leafs the allocator sees, with their backends: the user's leafs and every copy. Their
 * number. */
static int alloc_leafs(bp_sched *s, bp_graph *g)
{
    bp_tensor **gleafs = bp__graph_leafs(g);
    int k = 0;
    for (int i = 0; i < bp_graph_get_n_leafs(g); i++) {
        s->leaf_buf[k] = gleafs[i];
        s->leaf_ids[k++] = info(s, gleafs[i])->backend;
    }
    for (int c = 0; c < s->n_copy_sets; c++)
        for (int j = 0; j < s->n_copies; j++) {
            s->leaf_buf[k] = s->copies[c].t[j];
            s->leaf_ids[k++] = s->copies[c].backend;
        }
    return k;
}

/* Builds s->graph, what the allocator sees (alloc_nodes and alloc_leafs), and the ids of the
 * backend each of its tensors is allocated for. */
static enum bp_status build_alloc_graph(bp_sched *s, bp_graph *g)
{
    int total_inputs = 0;
    for (int i = 0; i < s->n_splits; i++)
        total_inputs += s->splits[i].n_inputs;
    const size_t n_alloc = (size_t)bp_graph_get_n_nodes(g) + (size_t)total_inputs;
    const size_t n_leafs =
        (size_t)bp_graph_get_n_leafs(g) + (size_t)s->n_copy_sets * (size_t)s->n_copies;
    const size_t need = n_alloc > n_leafs ? n_alloc : n_leafs;
    if (!bp__grow((void **)&s->node_ids, &s->cap_node_ids, need, sizeof(int), "scheduler ids") ||
        !bp__grow((void **)&s->leaf_ids, &s->cap_leaf_ids, need, sizeof(int), "scheduler ids") ||
        !bp__grow((void **)&s->leaf_buf, &s->cap_leaf_buf, need, sizeof(*s->leaf_buf),
                  "scheduler leafs") ||
        !bp__grow((void **)&s->node_buf, &s->cap_node_buf, need, sizeof(*s->node_buf),
                  "scheduler nodes"))
        return BP_ERR_OUT_OF_MEMORY;
    const int n_nodes_alloc = alloc_nodes(s, g);
    if (n_nodes_alloc < 0)
        return bp_last_status();
    const int n_leafs_alloc = alloc_leafs(s, g);
    if ((size_t)n_nodes_alloc > bp_graph_get_capacity(s->graph) ||
        (size_t)n_leafs_alloc > bp_graph_get_capacity(s->graph)) {
        bp_graph_free(s->graph);
        s->graph = bp_graph_new(need);
        if (s->graph == NULL)
            return BP_ERR_OUT_OF_MEMORY;
    }
    return bp__graph_set(s->graph, s->node_buf, n_nodes_alloc, s->leaf_buf, n_leafs_alloc);
}

/* Points the graph of each split, for its backend, at the split's nodes. A view never starts a
 * split, so one placed with its source on another backend can fall inside this split's range
 * (the graph lists it after this backend's nodes began): it computes nothing here, its
 * consumers in the split read it through their input copies, and its memory is another
 * device's, so it is left out of what the backend is given (backends are promised only
 * tensors in buffers their device supports). */
static enum bp_status set_split_graphs(bp_sched *s, bp_graph *g)
{
    bp_tensor **gnodes = bp__graph_nodes(g);
    bp_tensor **keep = NULL;
    int keep_cap = 0;
    enum bp_status st = BP_OK;
    for (int i = 0; i < s->n_splits && st == BP_OK; i++) {
        struct split *sp = &s->splits[i];
        int len = sp->i1 - sp->i0;
        if (len > keep_cap) {
            bp_tensor **k = realloc(keep, (size_t)len * sizeof(*k));
            if (k == NULL) {
                st = bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory for the node "
                               "list of a split of %d nodes", len);
                break;
            }
            keep = k;
            keep_cap = len;
        }
        int n = 0;
        for (int j = sp->i0; j < sp->i1; j++)
            if (!is_view_op(gnodes[j]) || (info(s, gnodes[j])->backend == sp->backend &&
                                           readable_by(s, gnodes[j], sp->backend)))
                keep[n++] = gnodes[j]; /* (a view of memory the backend cannot read is read
                                        * through its consumers' copies) */
        len = n;
        if (sp->graph == NULL || bp_graph_get_capacity(sp->graph) < (size_t)(len ? len : 1)) {
            bp_graph_free(sp->graph);
            sp->graph = bp_graph_new((size_t)(len ? len : 1));
            if (sp->graph == NULL) {
                st = BP_ERR_OUT_OF_MEMORY;
                break;
            }
        }
        st = bp__graph_set(sp->graph, keep, len, NULL, 0);
    }
    free(keep);
    return st;
}

/* One attempt at splitting g: assign, check, cut and copy, then the graphs for the allocator
 * and the backends. On failure every source swap is undone. */
static enum bp_status split_graph_once(bp_sched *s, bp_graph *g)
{
    restore_sources(s);
    s->split_gen++; /* predictions find their splits again */
    const int n = bp_graph_get_n_nodes(g);
    if ((size_t)n > s->graph_size)
        return bp__error(BP_ERR_CAPACITY, "scheduler: the graph has %d nodes; the scheduler was "
                         "made for %zu", n, s->graph_size);
    clear_infos(s);
    bp_context_reset(s->ctx);
    s->n_copy_sets = 0;

    s->direct = NULL;
    enum bp_status st = assign_all(s, g);
    if (st == BP_OK)
        st = check_assignments(s, g);
    if (st == BP_OK && s->n_backends == 1 && all_readable(s, g))
        return split_direct(s, g);
    if (st == BP_OK)
        st = cut_splits(s, g);
    if (st == BP_OK)
        st = build_alloc_graph(s, g);
    if (st == BP_OK)
        st = set_split_graphs(s, g);
    if (st != BP_OK)
        restore_sources(s);
    return st;
}

static void debug_print(bp_sched *s, bp_graph *g)
{
    if (s->debug <= 0)
        return;
    fprintf(stderr, "bp_sched: %d nodes in %d splits\n", bp_graph_get_n_nodes(g), s->n_splits);
    for (int i = 0; i < s->n_splits; i++) {
        struct split *sp = &s->splits[i];
        fprintf(stderr, "  split %d on %s: nodes %d..%d, %d inputs", i,
                bp_backend_get_name(s->backends[sp->backend]), sp->i0, sp->i1 - 1, sp->n_inputs);
        for (int j = 0; j < sp->n_inputs; j++)
            fprintf(stderr, "%s%s", j ? ", " : ": ", bp__describe(sp->inputs[j]).s);
        fprintf(stderr, "\n");
        if (s->debug < 2)
            continue;
        for (int k = sp->i0; k < sp->i1; k++) {
            bp_tensor *node = bp_graph_get_node(g, k);
            const struct tinfo *ti = info(s, node);
            fprintf(stderr, "    %4d %-10s %-10s %s (%s)\n", k, bp_op_name(node->op),
                    bp_backend_get_name(s->backends[ti->backend]), bp__describe(node).s,
                    why_text[ti->why]);
        }
    }
}

/* After an allocation failed for want of memory. When the buffer that could not be had is
 * pinned host memory that default_buft chose, that backend goes back to its default buffer type
 * (with a new allocator) and true says the allocation is worth another try. Any other buffer
 * (a device's own compute buffer, usually) is not the pinned memory's fault: every backend keeps
 * its buffer type, and the error is made to name the buffer that failed, its type and size. */
static bool drop_pinned(bp_sched *s)
{
    size_t size = 0;
    const int id = bp__gallocr_failed(s->galloc, &size);
    if (id < 0 || id >= s->n_backends)
        return false; /* not a compute buffer (the plan itself ran out of memory) */
    if (!s->pinned[id]) {
        bp__error(BP_ERR_OUT_OF_MEMORY,
                  "scheduler: the compute buffer of backend %s (buffer type %s, %zu bytes) could "
                  "not be allocated: %s",
                  bp_backend_get_name(s->backends[id]), bp_buffer_type_get_name(s->bufts[id]),
                  size, bp_last_error());
        return false;
    }
    bp_buffer_type *bufts[BP_SCHED_MAX_BACKENDS];
    memcpy(bufts, s->bufts, sizeof(bufts));
    bufts[id] = bp_backend_get_default_buffer_type(s->backends[id]);
    if (bufts[id] == NULL)
        return false;
    bp_gallocr *galloc = bp_gallocr_new(bufts, s->n_backends);
    if (galloc == NULL)
        return false;
    bp_log(BP_LOG_INFO, "scheduler: %s buffer of %zu bytes unavailable (%s); %s computes in %s "
           "instead", bp_buffer_type_get_name(s->bufts[id]), size, bp_last_error(),
           bp_backend_get_name(s->backends[id]), bp_buffer_type_get_name(bufts[id]));
    s->bufts[id] = bufts[id];
    s->pinned[id] = false;
    bp_gallocr_free(s->galloc);
    s->galloc = galloc;
    return true;
}

static enum bp_status alloc_graph(bp_sched *s, bp_graph *g)
{
    s->kept = NULL;
    enum bp_status st = split_graph(s, g);
    if (st != BP_OK)
        return st;
    debug_print(s, g);
    st = s->direct ? bp_gallocr_alloc_graph(s->galloc, g, NULL, NULL)
                   : bp_gallocr_alloc_graph(s->galloc, s->graph, s->node_ids, s->leaf_ids);
    if (st != BP_OK) {
        restore_sources(s);
        if (st == BP_ERR_OUT_OF_MEMORY && drop_pinned(s))
            return alloc_graph(s, g);
        return st;
    }
    s->allocated = g;
    return BP_OK;
}

static enum bp_status reserve(bp_sched *s, bp_graph *g)
{
    s->kept = NULL;
    enum bp_status st = split_graph(s, g);
    if (st == BP_OK)
        st = s->direct ? bp_gallocr_reserve(s->galloc, g, NULL, NULL)
                       : bp_gallocr_reserve(s->galloc, s->graph, s->node_ids, s->leaf_ids);
    restore_sources(s);
    s->allocated = NULL;
    if (st == BP_ERR_OUT_OF_MEMORY && drop_pinned(s))
        return reserve(s, g);
    return st;
}

enum bp_status bp_sched_reserve(bp_sched *s, bp_graph *g)
{
    return guarded(s, g, __func__, reserve);
}

enum bp_status bp_sched_alloc_graph(bp_sched *s, bp_graph *g)
{
    return guarded(s, g, __func__, alloc_graph);
}

/* ---- Compute ---------------------------------------------------------------------------- */

static bp_graph *graph_of(bp_sched *s, struct split *sp)
{
    return s->direct ? s->direct : sp->graph;
}

/* The index of the split whose graph has node t, or -1 (pointers compared only). */
static int split_of_node(bp_sched *s, const bp_tensor *t)
{
    for (int i = 0; i < s->n_splits; i++) {
        const bp_graph *g = graph_of(s, &s->splits[i]);
        bp_tensor *const *nodes = bp__graph_nodes(g);
        for (int j = 0; j < bp_graph_get_n_nodes(g); j++)
            if (nodes[j] == t)
                return i;
    }
    return -1;
}

/* The first split after split k that copies t in as stacked experts, or -1. */
static int expert_split_after(bp_sched *s, int k, bp_tensor *t)
{
    for (int i = k + 1; i < s->n_splits; i++) {
        struct split *sp = &s->splits[i];
        for (int j = 0; j < sp->n_inputs; j++) {
            bool ids_known = false;
            if (sp->inputs[j] == t &&
                bp__sched_experts_only(graph_of(s, sp), t, copy_for(s, t, sp->backend),
                                       &ids_known) && ids_known)
                return i;
        }
    }
    return -1;
}

/* Before split sp runs: starts the predictions whose ids an earlier split computed, for experts
 * a later split copies (sched-experts.c). Where the ids are made and which split copies the
 * experts is found once per split graph. synced: every backend has finished; otherwise the
 * backends that computed the ids and that will read the cache are waited for first (an
 * earlier product may still be reading the slots a prefetch would fill). A prediction that
 * cannot be acted on is skipped: prefetch never fails a compute. */
static enum bp_status prefetch(bp_sched *s, struct split *sp, bool synced)
{
    const int k = (int)(sp - s->splits);
    if (s->expert_slots == 0 || s->expert_caches == NULL || !s->used_experts)
        return BP_OK;
    bool waited[BP_SCHED_MAX_BACKENDS] = {false};
    for (int p = 0; p < s->n_preds; p++) {
        struct prediction *pr = &s->preds[p];
        if (pr->issued)
            continue;
        if (pr->gen != s->split_gen) {
            pr->made = split_of_node(s, pr->ids);
            pr->user = pr->made >= 0 ? expert_split_after(s, pr->made, (bp_tensor *)pr->experts)
                                     : -1;
            pr->gen = s->split_gen;
        }
        if (pr->made < 0 || pr->made >= k)
            continue; /* not in this graph, or not computed yet */
        pr->issued = true;
        if (pr->user <= k)
            continue; /* not copied in later, or by the split about to run (its slots) */
        const int wait_for[2] = {s->splits[pr->made].backend, s->splits[pr->user].backend};
        for (int w = 0; w < 2 && !synced; w++) {
            if (waited[wait_for[w]])
                continue;
            enum bp_status st = bp_backend_synchronize(s->backends[wait_for[w]]);
            if (st != BP_OK)
                return st;
            waited[wait_for[w]] = true;
        }
        if (bp__sched_prefetch_experts(s->backends, s->splits[pr->user].backend, s->kept,
                                       pr->experts,
                                       pr->ids, s->expert_caches, s->expert_slots,
                                       &s->expert_stats) != BP_OK)
            bp_clear_error(); /* (out of memory: that prediction is not loaded ahead) */
    }
    return BP_OK;
}

static enum bp_status copy_inputs(bp_sched *s, struct split *sp)
{
    bp_backend *be = s->backends[sp->backend];
    bp_event *ev = s->events[sp->backend][s->cur_copy];
    /* The previous user of this copy set on this backend must be done with it. */
    if (ev != NULL && s->recorded[sp->backend][s->cur_copy]) {
        enum bp_status st = bp_event_synchronize(ev);
        if (st != BP_OK)
            return st;
    }
    bool deferred[BP_SCHED_MAX_SPLIT_INPUTS];
    int n_deferred = 0;
    for (int j = 0; j < sp->n_inputs; j++) {
        bp_tensor *src = sp->inputs[j];
        bp_tensor *dst = copy_for(s, src, sp->backend);
        enum bp_status st;
        /* Stacked experts read only by MUL_MAT_ID: after the rest, once the ids are known. */
        bool ids_known = false;
        const bool experts = !(src->flags & BP_TENSOR_FLAG_INPUT) &&
                             bp__sched_experts_only(graph_of(s, sp), src, dst, &ids_known);
        deferred[j] = experts && ids_known && s->used_experts;
        if (deferred[j]) {
            n_deferred++;
            continue;
        }
        s->copied_bytes += bp_nbytes(src);
        if (experts) {
            s->expert_bytes_copied += bp_nbytes(src);
            s->expert_bytes_total += bp_nbytes(src);
        }
        if (src->flags & BP_TENSOR_FLAG_INPUT) {
            /* User data may change right after this call: copy it now. */
            st = bp_backend_synchronize(be);
            if (st == BP_OK)
                st = bp_tensor_copy(src, dst);
        } else {
            const int fb = info(s, src)->backend;
            const bp_buffer *sbuf = buffer_of(s, src);
            if (fb < 0 || (sbuf != NULL && !bp_backend_supports_buft(s->backends[fb], sbuf->buft))) {
                /* memory no backend holds (a File buffer): read through its buffer */
                st = bp_backend_synchronize(be);
                if (st == BP_OK)
                    st = bp_tensor_copy(src, dst);
            } else {
                st = bp_backend_tensor_copy_async(s->backends[fb], be, src, dst);
            }
        }
        if (st != BP_OK)
            return st;
    }
    for (int j = 0; j < sp->n_inputs && n_deferred > 0; j++) {
        if (!deferred[j])
            continue;
        bp_tensor *src = sp->inputs[j];
        const size_t before = s->expert_stats.bytes_from_source;
        struct bp__expert_swap swaps[32];
        int n_swaps = 0;
        enum bp_status st = bp__sched_copy_experts(
            s->backends, s->n_backends, sp->backend, s->kept, graph_of(s, sp), src,
            copy_for(s, src, sp->backend), s->expert_caches, s->expert_slots, &s->expert_stats,
            swaps, &n_swaps);
        /* The products read the experts in place in a cache: given its slots and mapped ids
         * for this compute (put back with the split's own swaps when it ends). */
        for (int i = 0; i < n_swaps && st == BP_OK; i++)
            st = substitute(s, swaps[i].node, swaps[i].slot, swaps[i].to);
        const size_t bytes = s->expert_stats.bytes_from_source - before;
        s->copied_bytes += bytes;
        s->expert_bytes_copied += bytes;
        s->expert_bytes_total += bp_nbytes(src);
        if (st != BP_OK)
            return st;
    }
    /* Predictions made so far start loading (after the deferred copies every backend has
     * finished: the ids were read). */
    return s->n_preds > 0 ? prefetch(s, sp, n_deferred > 0) : BP_OK;
}

/* Runs nodes [i0, i1) of split sp with the eval callback asking about each. Returns false in
 * *stop when the callback asked to stop. */
static enum bp_status compute_observed(bp_sched *s, struct split *sp, bool *stop)
{
    bp_backend *be = s->backends[sp->backend];
    bp_graph *sg = graph_of(s, sp);
    const int n = bp_graph_get_n_nodes(sg);
    int j0 = 0;
    while (j0 < n) {
        int j1 = j0;
        /* Run up to and including the first node the user wants to see. */
        bool want = false;
        while (j1 < n && !(want = s->eval_fn(bp_graph_get_node(sg, j1), true, s->eval_user)))
            j1++;
        const int end = want ? j1 + 1 : n;
        bp_graph *part = bp_graph_view(sg, j0, end);
        if (part == NULL)
            return bp_last_status();
        enum bp_status st = bp_backend_graph_compute_async(be, part);
        if (st == BP_OK)
            st = bp_backend_synchronize(be);
        bp_graph_free(part);
        if (st != BP_OK)
            return st;
        if (want && !s->eval_fn(bp_graph_get_node(sg, j1), false, s->eval_user)) {
            *stop = true;
            return BP_OK;
        }
        j0 = end;
    }
    return BP_OK;
}

/* Makes the kept graph's source swaps again; false (nothing swapped) when a swapped source is
 * not what it was. */
static bool reswap(bp_sched *s)
{
    for (int i = 0; i < s->n_kept_subst; i++) {
        const struct kept_subst *k = &s->kept_subst[i];
        if (k->node->src[k->slot] != k->orig || substitute(s, k->node, k->slot, k->copy) != BP_OK) {
            restore_sources(s);
            return false;
        }
    }
    return true;
}

/* Remembers g, being computed with its sources swapped, for computing again unchanged; print is
 * its fingerprint when have_print, else it is taken here. */
static void keep_graph(bp_sched *s, const bp_graph *g, bool have_print, uint64_t print)
{
    s->kept = NULL;
    if (s->parallel) /* the input copies alternate between copy sets */
        return;
    if (!bp__grow((void **)&s->kept_subst, &s->cap_kept_subst, (size_t)s->n_subst,
                  sizeof(*s->kept_subst), "the scheduler's kept source swaps")) {
        bp_clear_error(); /* not kept: the next compute splits again */
        return;
    }
    for (int i = 0; i < s->n_subst; i++) {
        const struct subst *x = &s->subst[i];
        s->kept_subst[i] = (struct kept_subst){x->node, x->orig, x->node->src[x->slot], x->slot};
    }
    s->n_kept_subst = s->n_subst;
    if (!have_print) { /* with the user's sources: undo the swaps, hash, make them again */
        restore_sources(s);
        print = bp__graph_fingerprint(g);
        if (!reswap(s)) /* cannot fail: the swap list already had room for them all */
            return;
    }
    s->kept_print = print;
    s->kept = g;
}

static enum bp_status graph_compute_async(bp_sched *s, bp_graph *g)
{
    enum bp_status st = BP_OK;
    const bool again = s->allocated != g && s->kept == g && s->n_subst == 0;
    const uint64_t print = again ? bp__graph_fingerprint(g) : 0;
    if (!(again && print == s->kept_print && reswap(s))) {
        if (s->allocated != g)
            st = alloc_graph(s, g);
        if (st != BP_OK)
            return st;
        keep_graph(s, g, false, 0);
    }
    s->allocated = NULL;
    s->copied_bytes = s->expert_bytes_copied = s->expert_bytes_total = 0;
    memset(&s->expert_stats, 0, sizeof(s->expert_stats));
    for (int p = 0; p < s->n_preds; p++)
        s->preds[p].issued = false;
    bool stop = false;
    for (int i = 0; i < s->n_splits && st == BP_OK && !stop; i++) {
        struct split *sp = &s->splits[i];
        st = copy_inputs(s, sp);
        if (st != BP_OK)
            break;
        if (s->eval_fn != NULL)
            st = compute_observed(s, sp, &stop);
        else
            st = bp_backend_graph_compute_async(s->backends[sp->backend], graph_of(s, sp));
        bp_event *ev = s->events[sp->backend][s->cur_copy];
        if (st == BP_OK && ev != NULL) {
            st = bp_event_record(ev, s->backends[sp->backend]);
            s->recorded[sp->backend][s->cur_copy] = st == BP_OK;
        }
    }
    /* Prefetches still under way are waited for, the rest dropped: the caller may change the
     * weights once this returns. */
    bp__expert_caches_drain(s->expert_caches, &s->expert_stats);
    s->copied_bytes += s->expert_stats.bytes_prefetched; /* (the copy thread's, this compute) */
    s->expert_bytes_copied += s->expert_stats.bytes_prefetched;
    if (st != BP_OK)
        s->kept = NULL; /* split again next time */
    if (s->parallel)
        s->cur_copy = (s->cur_copy + 1) % s->n_copies;
    return st;
}

enum bp_status bp_sched_graph_compute_async(bp_sched *s, bp_graph *g)
{
    return guarded(s, g, __func__, graph_compute_async);
}

static enum bp_status synchronize(bp_sched *s)
{
    enum bp_status st = BP_OK;
    for (int b = 0; b < s->n_backends; b++) {
        enum bp_status e = bp_backend_synchronize(s->backends[b]);
        if (st == BP_OK)
            st = e;
    }
    restore_sources(s);
    return st;
}

enum bp_status bp_sched_synchronize(bp_sched *s)
{
    if (s == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_synchronize: scheduler is NULL");
    if (!sched_enter(s, __func__))
        return BP_ERR_BUSY;
    enum bp_status st = synchronize(s);
    if (st != BP_OK)
        s->kept = NULL;
    sched_leave(s);
    return st;
}

static enum bp_status graph_compute(bp_sched *s, bp_graph *g)
{
    enum bp_status st = graph_compute_async(s, g);
    enum bp_status sy = synchronize(s);
    if (sy != BP_OK) /* a failure reported only now: split again next time */
        s->kept = NULL;
    return st != BP_OK ? st : sy;
}

enum bp_status bp_sched_graph_compute(bp_sched *s, bp_graph *g)
{
    return guarded(s, g, __func__, graph_compute);
}

/* ---- For sched-query.c ------------------------------------------------------------------- */

struct tinfo *bp__sched_info(bp_sched *s, const bp_tensor *t)
{
    return info(s, t);
}

bool bp__sched_known(const bp_sched *s, const bp_tensor *t)
{
    return known(s, t);
}

int bp__sched_backend_index(const bp_sched *s, const bp_backend *be)
{
    return backend_index(s, be);
}

bool bp__sched_enter(bp_sched *s, const char *fn)
{
    return sched_enter(s, fn);
}

void bp__sched_leave(bp_sched *s)
{
    sched_leave(s);
}
