/* graph.c - graphs: build in topological order from outputs, leafs vs nodes, use counts, views.
 *
 * Building walks sources depth-first with an explicit stack (a chain of ten thousand ops must
 * not overflow the C stack) and appends each tensor after all of its sources. A pointer map
 * (ptrmap.h), sized once at creation, remembers which tensors are already in the graph and how
 * many node sources point at each one. A build that runs out of room is undone completely: the
 * node and leaf counts are restored and the map is rebuilt from them. */
#include "config.h"

#include <limits.h>
#include <string.h>

#include "bp-impl.h"
#include "ptrmap.h"

struct frame {
    bp_tensor *t;
    int next; /* next source slot to visit: 0..BP_MAX_SRC-1 sources, BP_MAX_SRC is view_src */
};

struct bp_graph {
    size_t capacity; /* nodes and leafs each */
    int n_nodes;
    int n_leafs;
    bp_tensor **nodes;
    bp_tensor **leafs;

    struct bp__ptrmap uses; /* every tensor of the graph -> node sources pointing at it */

    struct frame *stack; /* 2 * capacity + 1 frames: every frame is a distinct new tensor */
    bool hash_stale;     /* set by bp__graph_set: rebuilt on first use, most users never ask */
};

static void rehash(bp_graph *g);

/* The hash set and use counts, rebuilt first if bp__graph_set left them stale. */
static const bp_graph *fresh(const bp_graph *g)
{
    if (g->hash_stale) {
        bp_graph *m = (bp_graph *)g; /* logically const: only the cache changes */
        rehash(m);
        m->hash_stale = false;
    }
    return g;
}

static bool hash_has(const bp_graph *g, const bp_tensor *p)
{
    return bp__ptrmap_get(&g->uses, p) != NULL;
}

static void hash_insert(bp_graph *g, const bp_tensor *p)
{
    bool added;
    /* Never refused: the map has room for 2 * capacity entries, more than a graph holds. */
    int *uses = bp__ptrmap_put(&g->uses, p, 0, &added);
    BP_ASSERT(uses != NULL);
}

static void count_uses(bp_graph *g, const bp_tensor *node)
{
    for (int s = 0; s < BP_MAX_SRC; s++) {
        if (node->src[s] == NULL)
            continue;
        /* A source outside the graph (possible in a graph view) has no entry to count in. */
        int *uses = bp__ptrmap_get(&g->uses, node->src[s]);
        if (uses != NULL)
            (*uses)++;
    }
}

/* Rebuilds the tensor set and use counts from the node and leaf arrays. */
static void rehash(bp_graph *g)
{
    bp__ptrmap_clear(&g->uses);
    for (int i = 0; i < g->n_leafs; i++)
        hash_insert(g, g->leafs[i]);
    for (int i = 0; i < g->n_nodes; i++)
        hash_insert(g, g->nodes[i]);
    for (int i = 0; i < g->n_nodes; i++)
        count_uses(g, g->nodes[i]);
}

bp_graph *bp_graph_new(size_t capacity)
{
    if (capacity == 0 || capacity > INT_MAX / 4)
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_graph_new: capacity %zu is out of range (1 to %d)", capacity,
                              INT_MAX / 4);
    bp_graph *g = bp__calloc(1, sizeof(*g), "a graph");
    if (g == NULL)
        return NULL;
    g->capacity = capacity;

    g->nodes = bp__calloc(capacity, sizeof(*g->nodes), "graph nodes");
    if (g->nodes == NULL)
        goto fail;
    g->leafs = bp__calloc(capacity, sizeof(*g->leafs), "graph leafs");
    if (g->leafs == NULL)
        goto fail;
    /* At most 2 * capacity entries, so the map stays at most half full. */
    if (!bp__ptrmap_init(&g->uses, 4 * capacity, "the graph's tensor set"))
        goto fail;
    g->stack = bp__calloc(2 * capacity + 1, sizeof(*g->stack), "the graph build stack");
    if (g->stack == NULL)
        goto fail;
    return g;

fail:
    bp_graph_free(g);
    return NULL;
}

void bp_graph_free(bp_graph *g)
{
    if (g == NULL)
        return;
    bp__free(g->stack);
    bp__ptrmap_close(&g->uses);
    bp__free(g->leafs);
    bp__free(g->nodes);
    bp__free(g);
}

void bp_graph_reset(bp_graph *g)
{
    if (g == NULL)
        return;
    g->n_nodes = 0;
    g->n_leafs = 0;
    rehash(g);
    g->hash_stale = false;
}

/* Appends t as a node or a leaf; false when that list is full. */
static bool append(bp_graph *g, bp_tensor *t)
{
    if (t->op == BP_OP_NONE) {
        if ((size_t)g->n_leafs >= g->capacity)
            return false;
        g->leafs[g->n_leafs++] = t;
    } else {
        if ((size_t)g->n_nodes >= g->capacity)
            return false;
        g->nodes[g->n_nodes++] = t;
        count_uses(g, t);
    }
    return true;
}

static bp_tensor *child(const bp_tensor *t, int slot)
{
    return slot < BP_MAX_SRC ? t->src[slot] : t->view_src;
}

enum bp_status bp_graph_build_forward(bp_graph *g, bp_tensor *out)
{
    if (g == NULL || out == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_graph_build_forward: graph and output must not "
                         "be NULL");
    fresh(g);
    if (hash_has(g, out))
        return BP_OK;

    const int saved_nodes = g->n_nodes, saved_leafs = g->n_leafs;
    const size_t max_entries = 2 * g->capacity;
    size_t entries = (size_t)saved_nodes + (size_t)saved_leafs;
    enum bp_status st = BP_OK;
    const bp_tensor *culprit = out;
    int depth = 0;

    hash_insert(g, out);
    entries++;
    g->stack[depth++] = (struct frame){out, 0};

    while (depth > 0) {
        struct frame *f = &g->stack[depth - 1];
        bp_tensor *t = f->t;
        if (!bp__op_valid(t->op)) {
            st = BP_ERR_INVALID_ARG;
            culprit = t;
            break;
        }
        if (f->next <= BP_MAX_SRC) {
            bp_tensor *c = child(t, f->next++);
            if (c != NULL && !hash_has(g, c)) {
                if (entries >= max_entries) {
                    st = BP_ERR_CAPACITY;
                    culprit = c;
                    break;
                }
                hash_insert(g, c);
                entries++;
                g->stack[depth++] = (struct frame){c, 0};
            }
            continue;
        }
        if (!append(g, t)) {
            st = BP_ERR_CAPACITY;
            culprit = t;
            break;
        }
        depth--;
    }

    if (st == BP_OK)
        return BP_OK;

    g->n_nodes = saved_nodes;
    g->n_leafs = saved_leafs;
    rehash(g);
    if (st == BP_ERR_INVALID_ARG)
        return bp__error(st, "bp_graph_build_forward: tensor %s has an invalid op %d",
                         bp__describe(culprit).s, (int)culprit->op);
    return bp__error(st,
                     "bp_graph_build_forward: graph is full (%zu nodes and %zu leafs) while adding "
                     "%s; create it with a larger capacity",
                     g->capacity, g->capacity, bp__describe(culprit).s);
}

size_t bp_graph_get_capacity(const bp_graph *g)
{
    return g ? g->capacity : 0;
}

int bp_graph_get_n_nodes(const bp_graph *g)
{
    return g ? g->n_nodes : 0;
}

int bp_graph_get_n_leafs(const bp_graph *g)
{
    return g ? g->n_leafs : 0;
}

static bp_tensor *index_list(bp_tensor **list, int n, int i)
{
    if (i < 0)
        i += n;
    return i >= 0 && i < n ? list[i] : NULL;
}

bp_tensor *bp_graph_get_node(const bp_graph *g, int i)
{
    return g ? index_list(g->nodes, g->n_nodes, i) : NULL;
}

bp_tensor *bp_graph_get_leaf(const bp_graph *g, int i)
{
    return g ? index_list(g->leafs, g->n_leafs, i) : NULL;
}

bool bp_graph_contains(const bp_graph *g, const bp_tensor *t)
{
    return g != NULL && t != NULL && hash_has(fresh(g), t);
}

int bp_graph_get_use_count(const bp_graph *g, const bp_tensor *t)
{
    if (g == NULL || t == NULL)
        return 0;
    const int *uses = bp__ptrmap_get(&fresh(g)->uses, t);
    return uses != NULL ? *uses : 0;
}

bp_tensor *bp_graph_find(const bp_graph *g, const char *name)
{
    if (g == NULL || name == NULL)
        return NULL;
    for (int i = 0; i < g->n_leafs; i++) {
        if (strcmp(g->leafs[i]->name, name) == 0)
            return g->leafs[i];
    }
    for (int i = 0; i < g->n_nodes; i++) {
        if (strcmp(g->nodes[i]->name, name) == 0)
            return g->nodes[i];
    }
    return NULL;
}

bp_graph *bp_graph_view(const bp_graph *g, int i0, int i1)
{
    if (g == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_graph_view: graph is NULL");
    if (i0 < 0 || i1 < i0 || i1 > g->n_nodes)
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS,
                              "bp_graph_view: node range [%d, %d) is not inside the graph's %d "
                              "nodes",
                              i0, i1, g->n_nodes);
    size_t cap = (size_t)(i1 - i0);
    if (cap < (size_t)g->n_leafs)
        cap = (size_t)g->n_leafs;
    bp_graph *v = bp_graph_new(cap ? cap : 1);
    if (v == NULL)
        return NULL;
    memcpy(v->nodes, g->nodes + i0, (size_t)(i1 - i0) * sizeof(*v->nodes));
    memcpy(v->leafs, g->leafs, (size_t)g->n_leafs * sizeof(*v->leafs));
    v->n_nodes = i1 - i0;
    v->n_leafs = g->n_leafs;
    rehash(v);
    return v;
}

enum bp_status bp__graph_set(bp_graph *g, bp_tensor *const *nodes, int n_nodes,
                             bp_tensor *const *leafs, int n_leafs)
{
    if ((size_t)n_nodes > g->capacity || (size_t)n_leafs > g->capacity)
        return bp__error(BP_ERR_CAPACITY, "graph of %zu cannot hold %d nodes and %d leafs",
                         g->capacity, n_nodes, n_leafs);
    if (n_nodes > 0)
        memcpy(g->nodes, nodes, (size_t)n_nodes * sizeof(*nodes));
    if (n_leafs > 0)
        memcpy(g->leafs, leafs, (size_t)n_leafs * sizeof(*leafs));
    g->n_nodes = n_nodes;
    g->n_leafs = n_leafs;
    g->hash_stale = true;
    return BP_OK;
}

/* What identifies a computed graph as unchanged: its nodes and leafs, in order, with everything
 * of each that decides placement and memory: op, type, shape and strides, op parameters,
 * flags (an output marked since), sources, view and memory. A graph rebuilt from new tensors
 * differs in pointers or in unallocated memory, one rebuilt at the same addresses in its
 * shapes, sources or memory. Four independent lanes of a multiply-xorshift mix keep it to about
 * 10 ns per node. The scheduler calls it with the sources as the user set them (not swapped for
 * copies) to recognise the graph it computed last (sched.c, keep_graph). */
static uint64_t rotl64(uint64_t x, int r)
{
    return x << r | x >> (64 - r);
}

uint64_t bp__graph_fingerprint(const bp_graph *g)
{
    uint64_t h[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                     0x082efa98ec4e6c89ull};
    /* Each lane takes one value per tensor, folded from several fields with distinct rotations
     * (cheap, independent operations); only the mix itself is a chain. */
#define MIX(l, v)                                                                              \
    do {                                                                                       \
        h[l] = (h[l] ^ (v)) * 0x9e3779b97f4a7c15ull;                                           \
        h[l] ^= h[l] >> 29;                                                                    \
    } while (0)
    const int n = g->n_nodes, nl = g->n_leafs;
    bp_tensor *const *nodes = g->nodes, *const *leafs = g->leafs;
    MIX(0, (uint64_t)n);
    MIX(1, (uint64_t)nl);
    enum { N_PARAMS = sizeof(((bp_tensor *)0)->op_params) / sizeof(int32_t) }; /* even */
    for (int i = 0; i < n + nl; i++) {
        const bp_tensor *t = i < n ? nodes[i] : leafs[i - n];
        const uint64_t where = (uintptr_t)t ^ rotl64((uintptr_t)t->data, 17) ^
                               rotl64((uintptr_t)t->view_src, 31) ^ rotl64(t->view_offs, 47);
        uint64_t what = (uint64_t)t->op << 40 ^ (uint64_t)t->type << 20 ^ t->flags;
        uint64_t params[N_PARAMS / 2];
        memcpy(params, t->op_params, sizeof(params));
        for (int k = 0; k < N_PARAMS / 2; k++)
            what ^= rotl64(params[k], 3 + 8 * k);
        uint64_t srcs = 0, shape = 0;
        for (int k = 0; k < BP_MAX_SRC; k++)
            srcs ^= rotl64((uintptr_t)t->src[k], 1 + 13 * k);
        for (int d = 0; d < BP_MAX_DIMS; d++)
            shape ^= rotl64((uint64_t)t->ne[d], 1 + 7 * d) ^ rotl64(t->nb[d], 33 + 7 * d);
        MIX(0, where);
        MIX(1, what);
        MIX(2, srcs);
        MIX(3, shape);
    }
#undef MIX
    return h[0] ^ rotl64(h[1], 16) ^ rotl64(h[2], 32) ^ rotl64(h[3], 48);
}

bp_tensor **bp__graph_nodes(const bp_graph *g)
{
    return g->nodes;
}

bp_tensor **bp__graph_leafs(const bp_graph *g)
{
    return g->leafs;
}
