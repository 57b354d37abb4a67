/* alloc.c - placing tensors in buffers: the linear allocator and the graph allocator.
 *
 * The graph allocator plans before it places. Planning walks the nodes in execution order with
 * one simulated free list per buffer type: a node gets memory when it is computed and gives it
 * back when its last consumer has run (a view keeps its source alive until the view's own
 * consumers are done), or takes over the memory of a source it is the last consumer of. The high-water mark of each free list is the compute buffer that type
 * needs. Placing then points every tensor at base + planned offset. Planning a graph again gives
 * the same layout, so a buffer reserved with a worst-case graph fits the smaller graphs that
 * follow it; when one does not fit, the buffer is reallocated and the event counted. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "backend-impl.h"
#include "ptrmap.h"
#include <backplane/bp-alloc.h>

/* n rounded up to a multiple of align; false when that does not fit in size_t. */
static bool align_up(size_t n, size_t align, size_t *out)
{
    size_t padded;
    if (align <= 1) {
        *out = n;
        return true;
    }
    if (!bp__add_size(n, align - 1, &padded))
        return false;
    *out = padded / align * align;
    return true;
}

/* ---- Linear allocator ------------------------------------------------------------------- */

struct bp_tallocr bp_tallocr_init(bp_buffer *buffer)
{
    struct bp_tallocr ta = {buffer, buffer ? bp_buffer_get_alignment(buffer) : 1, 0};
    return ta;
}

enum bp_status bp_tallocr_alloc(struct bp_tallocr *ta, bp_tensor *t)
{
    if (ta == NULL || ta->buffer == NULL || t == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_tallocr_alloc: allocator, buffer and tensor must "
                         "not be NULL");
    if (t->view_src != NULL)
        return bp__error(BP_ERR_INVALID_ARG,
                         "bp_tallocr_alloc: %s is a view and shares its source's memory",
                         bp__describe(t).s);
    size_t size = bp_buffer_type_get_alloc_size(ta->buffer->buft, t);
    size_t offset = ta->offset, end = 0;
    size_t cap = bp_buffer_get_size(ta->buffer);
    if (!align_up(ta->offset, ta->alignment, &offset) || !bp__add_size(offset, size, &end) ||
        end > cap)
        return bp__error(BP_ERR_OUT_OF_MEMORY,
                         "bp_tallocr_alloc: %s needs %zu bytes at offset %zu but the buffer has "
                         "%zu bytes",
                         bp__describe(t).s, size, offset, cap);
    enum bp_status st =
        bp__place_tensor(ta->buffer, t, (char *)bp_buffer_get_base(ta->buffer) + offset);
    if (st == BP_OK)
        ta->offset = end;
    return st;
}

bp_buffer *bp_alloc_ctx_tensors(bp_context *ctx, bp_buffer_type *buft)
{
    if (ctx == NULL || buft == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_alloc_ctx_tensors: context and buffer type "
                              "must not be NULL");
    size_t align = bp_buffer_type_get_alignment(buft), total = 0;
    size_t n = bp_context_get_n_tensors(ctx);
    for (size_t i = 0; i < n; i++) {
        bp_tensor *t = bp_context_get_tensor(ctx, i);
        if (t->data != NULL || t->view_src != NULL)
            continue;
        size_t sz, start;
        if (!align_up(bp_buffer_type_get_alloc_size(buft, t), align, &sz) ||
            !align_up(total, align, &start) || !bp__add_size(start, sz, &total))
            return bp__error_null(BP_ERR_OUT_OF_MEMORY, "bp_alloc_ctx_tensors: the tensors of "
                                  "the context need more than SIZE_MAX bytes together");
    }
    bp_buffer *buf = bp_buffer_type_alloc(buft, total);
    if (buf == NULL)
        return NULL;
    struct bp_tallocr ta = bp_tallocr_init(buf);
    for (size_t i = 0; i < n; i++) {
        bp_tensor *t = bp_context_get_tensor(ctx, i);
        if (t->data == NULL && t->view_src == NULL && bp_tallocr_alloc(&ta, t) != BP_OK) {
            /* The buffer was sized with the same rules: a plugin whose alloc_size answers
             * changed between two calls. Say whose call failed, keeping the reason. */
            char why[512];
            snprintf(why, sizeof(why), "%s", bp_last_error());
            bp__error(bp_last_status(), "bp_alloc_ctx_tensors: placing the tensors in a new %s "
                      "buffer failed: %s", bp_buffer_type_get_name(buft), why);
            goto fail;
        }
    }
    for (size_t i = 0; i < n; i++) {
        bp_tensor *t = bp_context_get_tensor(ctx, i);
        if (t->view_src != NULL && t->data == NULL && t->view_src->data != NULL &&
            bp_tensor_init_view(t) != BP_OK)
            goto fail;
    }
    return buf;

fail:
    /* Unplace what was placed so no tensor points into the freed buffer. */
    for (size_t i = 0; i < n; i++) {
        bp_tensor *t = bp_context_get_tensor(ctx, i);
        if (t->buffer == buf) {
            t->buffer = NULL;
            t->data = NULL;
        }
    }
    bp_buffer_free(buf);
    return NULL;
}

/* ---- Graph allocator: simulated free lists ---------------------------------------------- */

struct block {
    size_t offset;
    size_t size;
};

/* Free space of one buffer type, sorted by offset; the last block is the open-ended tail. */
struct free_list {
    size_t alignment;
    struct block *blocks;
    int n;
    size_t cap;
    size_t high_water;
};

#define TAIL_END (SIZE_MAX / 2)

static void fl_reset(struct free_list *fl)
{
    fl->n = 1;
    fl->blocks[0] = (struct block){0, TAIL_END};
    fl->high_water = 0;
}

/* Best fit among the closed blocks, else the tail. Sizes are already aligned. False when not
 * even the tail can hold size (the plan would need more than TAIL_END bytes). */
static bool fl_alloc(struct free_list *fl, size_t size, size_t *out)
{
    *out = 0;
    if (size == 0)
        return true;
    int best = -1;
    for (int i = 0; i < fl->n - 1; i++) {
        if (fl->blocks[i].size >= size && (best < 0 || fl->blocks[i].size < fl->blocks[best].size))
            best = i;
    }
    if (best < 0) {
        best = fl->n - 1;
        if (fl->blocks[best].size < size)
            return false;
    }
    struct block *b = &fl->blocks[best];
    size_t offset = b->offset;
    b->offset += size;
    b->size -= size;
    if (b->size == 0 && best != fl->n - 1) {
        memmove(b, b + 1, (size_t)(fl->n - best - 1) * sizeof(*b));
        fl->n--;
    }
    if (offset + size > fl->high_water)
        fl->high_water = offset + size;
    *out = offset;
    return true;
}

static void fl_free(struct free_list *fl, size_t offset, size_t size)
{
    if (size == 0)
        return;
    int i = 0;
    while (i < fl->n && fl->blocks[i].offset < offset)
        i++;
    bool merge_prev = i > 0 && fl->blocks[i - 1].offset + fl->blocks[i - 1].size == offset;
    bool merge_next = i < fl->n && offset + size == fl->blocks[i].offset;
    if (merge_prev && merge_next) {
        fl->blocks[i - 1].size += size + fl->blocks[i].size;
        memmove(&fl->blocks[i], &fl->blocks[i + 1], (size_t)(fl->n - i - 1) * sizeof(struct block));
        fl->n--;
    } else if (merge_prev) {
        fl->blocks[i - 1].size += size;
    } else if (merge_next) {
        fl->blocks[i].offset = offset;
        fl->blocks[i].size += size;
    } else {
        BP_ASSERT((size_t)fl->n < fl->cap);
        memmove(&fl->blocks[i + 1], &fl->blocks[i], (size_t)(fl->n - i) * sizeof(struct block));
        fl->blocks[i] = (struct block){offset, size};
        fl->n++;
    }
}

/* ---- Graph allocator -------------------------------------------------------------------- */

/* What the plan knows of one tensor; ga->map gives its index in ga->infos. */
struct tinfo {
    int n_children; /* consumers not yet computed */
    int n_views;    /* views whose consumers are not all computed */
    int buft;
    size_t offset;
    size_t size;
    bool in_graph;  /* a node or leaf of the graph being planned */
    bool planned;   /* has memory planned by this allocator */
    bool live;      /* that memory is currently held */
    bool may_free;  /* not handed on to an in-place consumer, not pinned */
};

struct bp_gallocr {
    int n_bufts;
    bp_buffer_type **bufts;
    bp_buffer **buffers;
    struct free_list *lists;

    struct bp__ptrmap map; /* tensor -> index in infos; a new plan clears it in O(1) */
    struct tinfo *infos;
    size_t cap_infos;
    struct tinfo **cache; /* per plan: the entries of every leaf, node and node source */
    size_t cache_cap;

    bp_buffer **old; /* buffers this allocator freed: tensors may still point into them */
    size_t n_old, cap_old;
    int n_reallocs;
    int failed_id;      /* the buffer whose last growth failed (-1: none), and the size asked */
    size_t failed_size;
};

bp_gallocr *bp_gallocr_new(bp_buffer_type *const *bufts, int n)
{
    if (bufts == NULL || n <= 0)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_gallocr_new: need at least one buffer type");
    for (int i = 0; i < n; i++) {
        if (bufts[i] == NULL)
            return bp__error_null(BP_ERR_INVALID_ARG, "bp_gallocr_new: buffer type %d is NULL", i);
    }
    bp_gallocr *ga = bp__calloc(1, sizeof(*ga), "a graph allocator");
    if (ga == NULL)
        return NULL;
    ga->n_bufts = n;
    ga->failed_id = -1;
    ga->bufts = bp__calloc((size_t)n, sizeof(*ga->bufts), "graph allocator buffer types");
    ga->buffers = bp__calloc((size_t)n, sizeof(*ga->buffers), "graph allocator buffers");
    ga->lists = bp__calloc((size_t)n, sizeof(*ga->lists), "graph allocator free lists");
    if (ga->bufts == NULL || ga->buffers == NULL || ga->lists == NULL) {
        bp_gallocr_free(ga);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        ga->bufts[i] = bufts[i];
        ga->lists[i].alignment = bp_buffer_type_get_alignment(bufts[i]);
    }
    return ga;
}

void bp_gallocr_free(bp_gallocr *ga)
{
    if (ga == NULL)
        return;
    for (int i = 0; i < ga->n_bufts; i++) {
        if (ga->buffers)
            bp_buffer_free(ga->buffers[i]);
        if (ga->lists)
            bp__free(ga->lists[i].blocks);
    }
    bp__free(ga->old);
    bp__free(ga->cache);
    bp__free(ga->infos);
    bp__ptrmap_close(&ga->map);
    bp__free(ga->lists);
    bp__free(ga->buffers);
    bp__free(ga->bufts);
    bp__free(ga);
}

/* The plan's entry for t, new and zeroed on first mention. */
static struct tinfo *info_of(bp_gallocr *ga, const bp_tensor *t)
{
    bool added;
    int *i = bp__ptrmap_put(&ga->map, t, (int)ga->map.used, &added);
    /* plan() sized the map and infos for every tensor the graph can mention. */
    BP_ASSERT(i != NULL);
    if (added)
        memset(&ga->infos[*i], 0, sizeof(ga->infos[*i]));
    return &ga->infos[*i];
}

static bool owns_buffer(const bp_gallocr *ga, const bp_buffer *buf)
{
    if (buf == NULL)
        return false;
    for (int i = 0; i < ga->n_bufts; i++) {
        if (ga->buffers[i] == buf)
            return true;
    }
    for (size_t i = 0; i < ga->n_old; i++) {
        if (ga->old[i] == buf)
            return true;
    }
    return false;
}

int bp__gallocr_failed(const bp_gallocr *ga, size_t *size)
{
    if (size != NULL)
        *size = ga->failed_size;
    return ga->failed_id;
}

bool bp__gallocr_owns(const bp_gallocr *ga, const bp_buffer *buf)
{
    return ga != NULL && owns_buffer(ga, buf);
}

/* Memory of its own that this allocator must provide (not a view, not placed elsewhere). */
static bool needs_memory(const bp_gallocr *ga, const bp_tensor *t)
{
    return t->view_src == NULL && (t->data == NULL || owns_buffer(ga, t->buffer));
}

static bool pinned(const bp_tensor *t)
{
    return t->op == BP_OP_NONE || (t->flags & (BP_TENSOR_FLAG_INPUT | BP_TENSOR_FLAG_OUTPUT));
}

static enum bp_status plan_alloc(bp_gallocr *ga, struct tinfo *ti, const bp_tensor *t)
{
    struct free_list *fl = &ga->lists[ti->buft];
    size_t need = bp_buffer_type_get_alloc_size(ga->bufts[ti->buft], t);
    if (!align_up(need, fl->alignment, &ti->size) || !fl_alloc(fl, ti->size, &ti->offset))
        return bp__error(BP_ERR_OUT_OF_MEMORY,
                         "graph allocator: %s needs %zu bytes of %s, and with the tensors live "
                         "beside it the plan would pass %zu bytes",
                         bp__describe(t).s, need, bp_buffer_type_get_name(ga->bufts[ti->buft]),
                         (size_t)TAIL_END);
    ti->planned = ti->live = true;
    ti->may_free = !pinned(t);
    return BP_OK;
}

static void plan_release(bp_gallocr *ga, struct tinfo *ti)
{
    if (!ti->live || !ti->may_free)
        return;
    fl_free(&ga->lists[ti->buft], ti->offset, ti->size);
    ti->live = false;
}

/* Ops whose result may take the memory of a source with the same layout (the contract in
 * bp-plugin.h): element-wise ops, where any same-shaped source qualifies, and row-wise ops that
 * read a whole row of src[0] before writing it, where only src[0] does. Returns how many
 * leading sources qualify (0: none). */
static int inplace_sources(const bp_tensor *t)
{
    switch (t->op) {
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
        return 2;
    case BP_OP_GLU:
        return t->src[1] != NULL ? 2 : 0;
    case BP_OP_SCALE:
    case BP_OP_UNARY:
    case BP_OP_CLAMP:
    case BP_OP_NORM:
    case BP_OP_RMS_NORM:
    case BP_OP_L2_NORM:
    case BP_OP_SOFT_MAX:
    case BP_OP_ROPE:
        return 1;
    default:
        return 0;
    }
}

static bool same_layout(const bp_tensor *a, const bp_tensor *b)
{
    if (a->type != b->type)
        return false;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i])
            return false;
    }
    return true;
}

/* Takes over the memory of a source that this node is the last user of. */
static bool plan_inplace(bp_gallocr *ga, struct tinfo *ti, const bp_tensor *node)
{
    const int n_src = inplace_sources(node);
    for (int s = 0; s < n_src; s++) {
        const bp_tensor *p = node->src[s];
        if (p == NULL || p->view_src != NULL || pinned(p) || !same_layout(p, node))
            continue;
        struct tinfo *pi = info_of(ga, p);
        if (!pi->live || !pi->may_free || pi->n_children != 1 || pi->n_views != 0 ||
            pi->buft != ti->buft)
            continue;
        ti->offset = pi->offset;
        ti->size = pi->size;
        ti->planned = ti->live = true;
        ti->may_free = !pinned(node);
        pi->may_free = false; /* the memory is the node's now */
        return true;
    }
    return false;
}

/* The buffer type id given for tensor t (node or leaf i): an index into the allocator's
 * buffer types. The message says which tensor and what the index means; -1 is what a caller
 * that has not placed a tensor anywhere passes. */
static enum bp_status bad_id(const bp_gallocr *ga, const char *what, int i, const bp_tensor *t,
                             int id)
{
    if (id < 0)
        return bp__error(BP_ERR_INVALID_ARG, "graph allocator: %s %d, %s, is placed in no buffer "
                         "type (its index is %d; the allocator's buffer types are numbered 0 "
                         "to %d)", what, i, bp__describe(t).s, id, ga->n_bufts - 1);
    return bp__error(BP_ERR_INVALID_ARG, "graph allocator: %s %d, %s, is placed in buffer type "
                     "%d, but the allocator has %d buffer type%s (0 to %d)", what, i,
                     bp__describe(t).s, id, ga->n_bufts, BP_PLURAL(ga->n_bufts),
                     ga->n_bufts - 1);
}

static enum bp_status check_ids(const bp_gallocr *ga, const bp_graph *g, const int *node_ids,
                                const int *leaf_ids)
{
    for (int i = 0; node_ids && i < bp_graph_get_n_nodes(g); i++)
        if (node_ids[i] < 0 || node_ids[i] >= ga->n_bufts)
            return bad_id(ga, "node", i, bp_graph_get_node(g, i), node_ids[i]);
    for (int i = 0; leaf_ids && i < bp_graph_get_n_leafs(g); i++)
        if (leaf_ids[i] < 0 || leaf_ids[i] >= ga->n_bufts)
            return bad_id(ga, "leaf", i, bp_graph_get_leaf(g, i), leaf_ids[i]);
    return BP_OK;
}

/* The plan's cache of table entries, so that every lookup is done once per plan: one entry
 * per leaf, then one row per node holding the node's, its view source's and its sources'. */
enum { ROW_NODE, ROW_VIEW, ROW_SRC, ROW_SIZE = ROW_SRC + BP_MAX_SRC };

static struct tinfo **node_row(const bp_gallocr *ga, int n_leafs, int i)
{
    return ga->cache + n_leafs + (size_t)i * ROW_SIZE;
}

/* Empties the table, the free lists and the cache, with room for a graph of this size. */
static enum bp_status plan_reset(bp_gallocr *ga, int n_nodes, int n_leafs)
{
    /* Room for every tensor the graph can mention, the map at most half full. */
    const size_t mentions = (size_t)n_nodes * ROW_SIZE + (size_t)n_leafs + 1;
    if (!bp__ptrmap_reserve(&ga->map, 2 * mentions, "allocator state") ||
        !bp__grow((void **)&ga->infos, &ga->cap_infos, bp__ptrmap_limit(&ga->map),
                  sizeof(*ga->infos), "allocator state"))
        return BP_ERR_OUT_OF_MEMORY;
    bp__ptrmap_clear(&ga->map);
    const size_t blocks = (size_t)n_nodes + (size_t)n_leafs + 2;
    for (int i = 0; i < ga->n_bufts; i++) {
        struct free_list *fl = &ga->lists[i];
        if (!bp__grow((void **)&fl->blocks, &fl->cap, blocks, sizeof(*fl->blocks),
                      "allocator free list"))
            return BP_ERR_OUT_OF_MEMORY;
        fl_reset(fl);
    }
    const size_t cache = (size_t)n_nodes * ROW_SIZE + (size_t)n_leafs;
    if (!bp__grow((void **)&ga->cache, &ga->cache_cap, cache, sizeof(*ga->cache),
                  "allocator cache"))
        return BP_ERR_OUT_OF_MEMORY;
    return BP_OK;
}

/* Fills the cache: every leaf and node is in the graph; counts each tensor's consumers and
 * views. A source outside the graph must have memory already. */
static enum bp_status plan_lookups(bp_gallocr *ga, bp_graph *g, const int *node_ids)
{
    const int n_nodes = bp_graph_get_n_nodes(g), n_leafs = bp_graph_get_n_leafs(g);
    bp_tensor **nodes = bp__graph_nodes(g), **leafs = bp__graph_leafs(g);
    for (int i = 0; i < n_leafs; i++) {
        ga->cache[i] = info_of(ga, leafs[i]);
        ga->cache[i]->in_graph = true;
    }
    for (int i = 0; i < n_nodes; i++) {
        struct tinfo **row = node_row(ga, n_leafs, i);
        row[ROW_NODE] = info_of(ga, nodes[i]);
        row[ROW_NODE]->in_graph = true;
    }
    for (int i = 0; i < n_nodes; i++) {
        bp_tensor *node = nodes[i];
        struct tinfo **row = node_row(ga, n_leafs, i);
        row[ROW_NODE]->buft = node_ids ? node_ids[i] : 0;
        for (int s = 0; s < BP_MAX_SRC; s++) {
            bp_tensor *src = node->src[s];
            row[ROW_SRC + s] = NULL;
            if (src == NULL)
                continue;
            struct tinfo *si = info_of(ga, src);
            if (!si->in_graph && src->data == NULL)
                return bp__error(BP_ERR_INVALID_ARG,
                                 "graph allocator: source %s of node %s is not in the graph and "
                                 "has no memory",
                                 bp__describe(src).s, bp__describe(node).s);
            si->n_children++;
            row[ROW_SRC + s] = si;
        }
        row[ROW_VIEW] = node->view_src ? info_of(ga, node->view_src) : NULL;
        if (row[ROW_VIEW] != NULL)
            row[ROW_VIEW]->n_views++;
    }
    return BP_OK;
}

/* Leafs and inputs live for the whole graph: they get memory before any node. */
static enum bp_status plan_inputs(bp_gallocr *ga, bp_graph *g, const int *leaf_ids)
{
    const int n_nodes = bp_graph_get_n_nodes(g), n_leafs = bp_graph_get_n_leafs(g);
    bp_tensor **nodes = bp__graph_nodes(g), **leafs = bp__graph_leafs(g);
    enum bp_status st;
    for (int i = 0; i < n_leafs; i++) {
        ga->cache[i]->buft = leaf_ids ? leaf_ids[i] : 0;
        if (needs_memory(ga, leafs[i]) && (st = plan_alloc(ga, ga->cache[i], leafs[i])) != BP_OK)
            return st;
    }
    for (int i = 0; i < n_nodes; i++) {
        if ((nodes[i]->flags & BP_TENSOR_FLAG_INPUT) && needs_memory(ga, nodes[i]) &&
            (st = plan_alloc(ga, node_row(ga, n_leafs, i)[ROW_NODE], nodes[i])) != BP_OK)
            return st;
    }
    return BP_OK;
}

/* node (its cache row) has run: the sources it was the last consumer of give their memory
 * back, a view's through its source once the source's views are all done. */
static void release_sources(bp_gallocr *ga, const bp_tensor *node, struct tinfo *const *row)
{
    for (int s = 0; s < BP_MAX_SRC; s++) {
        struct tinfo *pi = row[ROW_SRC + s];
        if (pi == NULL || --pi->n_children > 0 || pi->n_views > 0)
            continue;
        const bp_tensor *src = node->src[s];
        if (src->view_src != NULL) {
            struct tinfo *vi = info_of(ga, src->view_src);
            if (--vi->n_views == 0 && vi->n_children == 0)
                plan_release(ga, vi);
        } else {
            plan_release(ga, pi);
        }
    }
}

/* The nodes in execution order: each gets memory (in place of a source where it can), then
 * releases what it was the last to use. */
static enum bp_status plan_nodes(bp_gallocr *ga, bp_graph *g)
{
    const int n_nodes = bp_graph_get_n_nodes(g), n_leafs = bp_graph_get_n_leafs(g);
    bp_tensor **nodes = bp__graph_nodes(g);
    enum bp_status st;
    for (int i = 0; i < n_nodes; i++) {
        bp_tensor *node = nodes[i];
        struct tinfo **row = node_row(ga, n_leafs, i);
        struct tinfo *ti = row[ROW_NODE];
        if (row[ROW_VIEW] != NULL)
            ti->buft = row[ROW_VIEW]->buft;
        else if (!ti->planned && needs_memory(ga, node) && !plan_inplace(ga, ti, node) &&
                 (st = plan_alloc(ga, ti, node)) != BP_OK)
            return st;
        release_sources(ga, node, row);
    }
    return BP_OK;
}

/* Plans g: where every tensor that needs memory goes, and each buffer type's high-water mark. */
static enum bp_status plan(bp_gallocr *ga, bp_graph *g, const int *node_ids, const int *leaf_ids)
{
    enum bp_status st = check_ids(ga, g, node_ids, leaf_ids);
    if (st == BP_OK)
        st = plan_reset(ga, bp_graph_get_n_nodes(g), bp_graph_get_n_leafs(g));
    if (st == BP_OK)
        st = plan_lookups(ga, g, node_ids);
    if (st == BP_OK)
        st = plan_inputs(ga, g, leaf_ids);
    if (st == BP_OK)
        st = plan_nodes(ga, g);
    return st;
}

/* Replaces buffer id with one of at least size bytes. */
static enum bp_status grow(bp_gallocr *ga, int id, size_t size)
{
    bp_buffer *buf = bp_buffer_type_alloc(ga->bufts[id], size);
    ga->failed_id = buf == NULL ? id : -1;
    ga->failed_size = buf == NULL ? size : 0;
    if (buf == NULL)
        return bp_last_status() != BP_OK ? bp_last_status() : BP_ERR_OUT_OF_MEMORY;
    bp_buffer_set_usage(buf, BP_BUFFER_USAGE_COMPUTE);
    if (ga->buffers[id] != NULL) {
        if (!bp__grow((void **)&ga->old, &ga->cap_old, ga->n_old + 1, sizeof(*ga->old),
                      "allocator history")) {
            bp_buffer_free(buf);
            return BP_ERR_OUT_OF_MEMORY;
        }
        ga->old[ga->n_old++] = ga->buffers[id];
        bp_buffer_free(ga->buffers[id]);
    }
    ga->buffers[id] = buf;
    bp_log(BP_LOG_DEBUG, "graph allocator: %s compute buffer is %zu bytes",
           bp_buffer_type_get_name(ga->bufts[id]), size);
    return BP_OK;
}

enum bp_status bp_gallocr_reserve(bp_gallocr *ga, bp_graph *graph, const int *node_ids,
                                  const int *leaf_ids)
{
    if (ga == NULL || graph == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gallocr_reserve: allocator and graph must not be "
                         "NULL");
    ga->failed_id = -1;
    enum bp_status st = plan(ga, graph, node_ids, leaf_ids);
    for (int i = 0; st == BP_OK && i < ga->n_bufts; i++) {
        size_t need = ga->lists[i].high_water;
        if (ga->buffers[i] == NULL || bp_buffer_get_size(ga->buffers[i]) < need)
            st = grow(ga, i, need);
    }
    return st;
}

static enum bp_status place(bp_gallocr *ga, bp_tensor *t, const struct tinfo *ti)
{
    if (t->view_src != NULL) {
        if (t->view_src->data == NULL || (t->data != NULL && !owns_buffer(ga, t->buffer)))
            return BP_OK;
        return bp_tensor_init_view(t);
    }
    if (!ti->planned)
        return BP_OK;
    bp_buffer *buf = ga->buffers[ti->buft];
    return bp__place_tensor(buf, t, (char *)bp_buffer_get_base(buf) + ti->offset);
}

enum bp_status bp_gallocr_alloc_graph(bp_gallocr *ga, bp_graph *graph, const int *node_ids,
                                      const int *leaf_ids)
{
    if (ga == NULL || graph == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_gallocr_alloc_graph: allocator and graph must "
                         "not be NULL");
    ga->failed_id = -1;
    enum bp_status st = plan(ga, graph, node_ids, leaf_ids);
    for (int i = 0; st == BP_OK && i < ga->n_bufts; i++) {
        size_t need = ga->lists[i].high_water;
        if (ga->buffers[i] != NULL && bp_buffer_get_size(ga->buffers[i]) >= need)
            continue;
        if (ga->buffers[i] != NULL) {
            ga->n_reallocs++;
            bp_log(BP_LOG_DEBUG, "graph allocator: graph needs %zu bytes of %s, more than the "
                   "%zu reserved; reallocating", need, bp_buffer_type_get_name(ga->bufts[i]),
                   bp_buffer_get_size(ga->buffers[i]));
        }
        st = grow(ga, i, need);
    }
    /* The plan left each tensor's table entry in the cache: leafs, then per node. */
    bp_tensor **leafs = bp__graph_leafs(graph), **nodes = bp__graph_nodes(graph);
    const int nl = bp_graph_get_n_leafs(graph);
    for (int i = 0; st == BP_OK && i < nl; i++)
        st = place(ga, leafs[i], ga->cache[i]);
    for (int i = 0; st == BP_OK && i < bp_graph_get_n_nodes(graph); i++)
        st = place(ga, nodes[i], node_row(ga, nl, i)[ROW_NODE]);
    return st;
}

size_t bp_gallocr_get_buffer_size(bp_gallocr *ga, int id)
{
    if (ga == NULL || id < 0 || id >= ga->n_bufts || ga->buffers[id] == NULL)
        return 0;
    return bp_buffer_get_size(ga->buffers[id]);
}

int bp_gallocr_get_n_reallocs(bp_gallocr *ga)
{
    return ga ? ga->n_reallocs : 0;
}

/* ---- Single-buffer-type shortcuts ------------------------------------------------------- */

bp_buffer *bp_alloc_ctx_tensors_for_backend(bp_context *ctx, bp_backend *backend)
{
    if (backend == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: backend is NULL", __func__);
    bp_buffer_type *buft = bp_backend_get_default_buffer_type(backend);
    return buft != NULL ? bp_alloc_ctx_tensors(ctx, buft) : NULL;
}

bp_gallocr *bp_gallocr_new_1(bp_buffer_type *buft)
{
    return bp_gallocr_new(&buft, 1);
}

enum bp_status bp_gallocr_reserve_1(bp_gallocr *ga, bp_graph *graph)
{
    return bp_gallocr_reserve(ga, graph, NULL, NULL);
}

enum bp_status bp_gallocr_alloc_graph_1(bp_gallocr *ga, bp_graph *graph)
{
    return bp_gallocr_alloc_graph(ga, graph, NULL, NULL);
}
