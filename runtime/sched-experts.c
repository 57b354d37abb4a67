/* sched-experts.c - the scheduler's copies of stacked expert weights: when a split's input is
 * read only as the experts of MUL_MAT_ID nodes, only the experts their ids choose are copied.
 *
 * The ids are known only once the router has run, so the scheduler waits for every backend
 * (the ids may come from any of them, or from this split's own input copies) and reads them. The
 * used experts are copied in runs of consecutive ones, each run followed by the rows of the next
 * expert that cover 512 bytes (as ggml pads with 512 bytes), so that a kernel reading a little past an expert finds
 * finite weights rather than whatever the copy's memory held. Experts no id names are not
 * copied at all: their part of the copy keeps what it held, which no kernel reads. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "bp-impl.h"

#define MAX_USERS 16 /* MUL_MAT_ID nodes of one split reading the same copy */
#define EXPERT_PAD 512

/* The MUL_MAT_ID nodes of sg reading copy as their stacked experts (at most MAX_USERS), or 0
 * when copy is read in any other way (another slot, another op, a view of it). */
static int expert_users(const bp_graph *sg, const bp_tensor *copy, bp_tensor **users)
{
    int n = 0;
    for (int i = 0; i < bp_graph_get_n_nodes(sg); i++) {
        bp_tensor *node = bp_graph_get_node(sg, i);
        if (node->view_src == copy)
            return 0;
        for (int k = 0; k < BP_MAX_SRC; k++) {
            const bp_tensor *s = node->src[k];
            if (s == NULL || (s != copy && s->view_src != copy))
                continue;
            if (s != copy || node->op != BP_OP_MUL_MAT_ID || k != 0 || n == MAX_USERS)
                return 0;
            users[n++] = node;
        }
    }
    return n;
}

/* Marks in used[] the experts the ids of node name (ids in range only: one out of range fails
 * the compute itself). */
static enum bp_status mark_used(const bp_tensor *node, bool *used, int64_t n_expert)
{
    const bp_tensor *ids = node->src[2];
    const int64_t n = bp_nelements(ids);
    if (!bp_is_contiguous(ids)) {
        for (int64_t e = 0; e < n_expert; e++) /* unusual ids: every expert */
            used[e] = true;
        return BP_OK;
    }
    int32_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (v == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory reading the expert ids "
                         "of %s", node->name);
    enum bp_status st = bp_tensor_get(ids, v, 0, (size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n && st == BP_OK; i++)
        if (v[i] >= 0 && v[i] < n_expert)
            used[v[i]] = true;
    free(v);
    return st;
}

/* Bytes [off, off + size) of src into copy (the same layout). */
static enum bp_status copy_range(const bp_tensor *src, bp_tensor *copy, size_t off, size_t size)
{
    if (bp_buffer_is_host(src->buffer))
        return bp_tensor_set(copy, (const char *)src->data + off, off, size);
    void *tmp = malloc(size);
    if (tmp == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory staging %zu bytes of "
                         "experts of %s", size, src->name);
    enum bp_status st = bp_tensor_get(src, tmp, off, size);
    if (st == BP_OK)
        st = bp_tensor_set(copy, tmp, off, size);
    free(tmp);
    return st;
}

/* Whether t (or what it views) is computed by a node of sg: then it is not known before the
 * split runs. */
static bool made_in(const bp_graph *sg, const bp_tensor *t)
{
    for (int i = 0; i < bp_graph_get_n_nodes(sg); i++) {
        const bp_tensor *node = bp_graph_get_node(sg, i);
        if (node == t || (t->view_src != NULL && node == t->view_src))
            return true;
    }
    return false;
}

bool bp__sched_experts_only(const bp_graph *sg, const bp_tensor *src, const bp_tensor *copy)
{
    bp_tensor *users[MAX_USERS];
    const int n = src->ne[2] >= 2 && src->ne[3] == 1 && bp_is_contiguous(src)
                      ? expert_users(sg, copy, users)
                      : 0;
    /* The ids must be known when the split's inputs are copied: made by an earlier split (or
     * copied in as an input), not by the router inside this one. */
    for (int u = 0; u < n; u++)
        if (made_in(sg, users[u]->src[2]))
            return false;
    return n > 0;
}

enum bp_status bp__sched_copy_experts(bp_backend *const *backends, int n_backends,
                                      const bp_graph *sg, bp_tensor *src, bp_tensor *copy,
                                      size_t *bytes)
{
    bp_tensor *users[MAX_USERS];
    const int n_users = expert_users(sg, copy, users);
    const int64_t n_expert = src->ne[2];
    /* The ids: produced by any backend, or copied in by this split's inputs. */
    for (int b = 0; b < n_backends; b++) {
        enum bp_status st = bp_backend_synchronize(backends[b]);
        if (st != BP_OK)
            return st;
    }
    bool *used = calloc((size_t)n_expert, sizeof(bool));
    if (used == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory for the experts of %s",
                         src->name);
    enum bp_status st = BP_OK;
    for (int u = 0; u < n_users && st == BP_OK; u++)
        st = mark_used(users[u], used, n_expert);
    /* The padding in whole rows: a source in a layout read in whole blocks (CPU_REPACK) takes
     * only such ranges. */
    const size_t stride = src->nb[2], total = bp_nbytes(src), row = src->nb[1];
    const size_t pad_rows = (EXPERT_PAD + row - 1) / row * row;
    const size_t pad = stride < pad_rows ? stride : pad_rows;
    for (int64_t e0 = 0; e0 < n_expert && st == BP_OK;) {
        if (!used[e0]) {
            e0++;
            continue;
        }
        int64_t e1 = e0 + 1;
        while (e1 < n_expert && used[e1])
            e1++;
        const size_t off = (size_t)e0 * stride;
        size_t end = (size_t)e1 * stride + (e1 < n_expert ? pad : 0);
        end = end < total ? end : total;
        st = copy_range(src, copy, off, end - off);
        *bytes += end - off;
        e0 = e1;
    }
    free(used);
    return st;
}
