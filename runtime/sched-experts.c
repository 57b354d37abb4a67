/* sched-experts.c - the scheduler's copies of stacked expert weights: when a split's input is
 * read only as the experts of MUL_MAT_ID nodes, only the experts their ids choose are copied.
 *
 * The ids are known only once the router has run, so the scheduler waits for every backend
 * (the ids may come from any of them, or from this split's own input copies) and reads them. The
 * used experts are copied in runs of consecutive ones, each run followed by the rows of the next
 * expert that cover 512 bytes (as ggml pads with 512 bytes), so that a kernel reading a little past an expert finds
 * finite weights rather than whatever the copy's memory held. Experts no id names are not
 * copied at all: their part of the copy keeps what it held, which no kernel reads. With an
 * expert cache (bp_sched_set_expert_cache), the used experts come from slots on the device
 * where it holds them. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "bp-impl.h"

#include <backplane/bp-sched.h>

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

bool bp__sched_experts_only(const bp_graph *sg, const bp_tensor *src, const bp_tensor *copy,
                            bool *ids_known)
{
    bp_tensor *users[MAX_USERS];
    const int n = src->ne[2] >= 2 && src->ne[3] == 1 && bp_is_contiguous(src)
                      ? expert_users(sg, copy, users)
                      : 0;
    /* The ids must be known when the split's inputs are copied: made by an earlier split (or
     * copied in as an input), not by the router inside this one. */
    *ids_known = true;
    for (int u = 0; u < n; u++)
        if (made_in(sg, users[u]->src[2]))
            *ids_known = false;
    return n > 0;
}

/* ---- The expert cache ------------------------------------------------------------------------
 * Per stacked tensor and backend, a buffer of `slots` experts on the backend's device and which
 * expert each slot holds. A used expert held there is copied from the slot (within the device),
 * any other from the source and then kept in the least recently used slot that this compute
 * does not need. The weights are taken not to change while they are cached. */

struct expert_cache {
    const bp_tensor *src;
    int backend;
    int slots;
    bp_buffer *buf;
    int32_t *slot_expert; /* slots entries: the expert held, or -1 */
    uint64_t *stamp;      /* slots entries: the compute that last used it */
    int32_t *expert_slot; /* n_expert entries: the slot holding it, or -1 */
};

struct bp__expert_caches {
    struct expert_cache *c;
    size_t n, cap;
    uint64_t clock;
};

struct bp__expert_caches *bp__expert_caches_new(void)
{
    return bp__calloc(1, sizeof(struct bp__expert_caches), "the scheduler's expert caches");
}

static void cache_free(struct expert_cache *c)
{
    bp_buffer_free(c->buf);
    bp__free(c->slot_expert);
    bp__free(c->stamp);
    bp__free(c->expert_slot);
}

void bp__expert_caches_free(struct bp__expert_caches *ec)
{
    if (ec == NULL)
        return;
    for (size_t i = 0; i < ec->n; i++)
        cache_free(&ec->c[i]);
    bp__free(ec->c);
    bp__free(ec);
}

void bp__expert_caches_clear(struct bp__expert_caches *ec)
{
    for (size_t i = 0; ec != NULL && i < ec->n; i++)
        cache_free(&ec->c[i]);
    if (ec != NULL)
        ec->n = 0;
}

/* The cache of src on backend b with `slots` slots, made on first use; NULL when it cannot be
 * had (no memory for it on the device: the experts are then copied from the source). */
static struct expert_cache *cache_of(struct bp__expert_caches *ec, const bp_tensor *src, int b,
                                     bp_backend *be, int slots)
{
    if (slots > src->ne[2]) /* more slots than experts hold nothing more */
        slots = (int)src->ne[2];
    for (size_t i = 0; i < ec->n; i++)
        if (ec->c[i].src == src && ec->c[i].backend == b)
            return ec->c[i].buf != NULL ? &ec->c[i] : NULL; /* NULL: could not be had */
    if (ec->n == ec->cap) {
        size_t cap = ec->cap ? 2 * ec->cap : 16;
        struct expert_cache *c = bp__realloc(ec->c, cap * sizeof(*c), "the expert caches");
        if (c == NULL) {
            bp_clear_error(); /* no cache: the experts come from the source */
            return NULL;
        }
        ec->c = c;
        ec->cap = cap;
    }
    struct expert_cache *c = &ec->c[ec->n];
    memset(c, 0, sizeof(*c));
    c->src = src;
    c->backend = b;
    c->slots = slots;
    c->buf = bp_buffer_type_alloc(bp_backend_get_default_buffer_type(be),
                                  (size_t)slots * src->nb[2]);
    c->slot_expert = bp__malloc((size_t)slots * sizeof(int32_t), "an expert cache");
    c->stamp = bp__calloc((size_t)slots, sizeof(uint64_t), "an expert cache");
    c->expert_slot = bp__malloc((size_t)src->ne[2] * sizeof(int32_t), "an expert cache");
    if (c->buf == NULL || c->slot_expert == NULL || c->stamp == NULL || c->expert_slot == NULL) {
        /* No cache for this tensor: its experts come from the source from now on, and the
         * failure is said once, not at every compute. */
        bp_log(BP_LOG_WARN, "scheduler: no expert cache of %d slots (%zu bytes) for %s on %s: "
               "%s; its experts are copied from their source", slots,
               (size_t)slots * src->nb[2], src->name, bp_backend_get_name(be), bp_last_error());
        bp_clear_error();
        cache_free(c);
        memset(c, 0, sizeof(*c));
        c->src = src;
        c->backend = b;
        ec->n++;
        return NULL;
    }
    for (int i = 0; i < slots; i++)
        c->slot_expert[i] = -1;
    for (int64_t e = 0; e < src->ne[2]; e++)
        c->expert_slot[e] = -1;
    ec->n++;
    return c;
}

/* Expert e of a stacked tensor like src, as a tensor of its own at data in buf. */
static bp_tensor expert_at(const bp_tensor *src, bp_buffer *buf, char *data)
{
    bp_tensor t = *src;
    t.view_src = NULL;
    t.view_offs = 0;
    t.op = BP_OP_NONE;
    memset(t.src, 0, sizeof(t.src));
    t.ne[2] = t.ne[3] = 1;
    t.nb[3] = t.nb[2];
    t.buffer = buf;
    t.data = data;
    return t;
}

/* Expert e into copy: from the cache when it holds it, else from the source and into the
 * cache's least recently used slot not needed by this compute. */
static enum bp_status copy_cached(struct expert_cache *c, uint64_t now, const bp_tensor *src,
                                  bp_tensor *copy, int64_t e,
                                  struct bp_sched_expert_stats *stats)
{
    const size_t stride = src->nb[2];
    bp_tensor to = expert_at(src, copy->buffer, (char *)copy->data + (size_t)e * stride);
    const int held = c->expert_slot[e];
    if (held >= 0) {
        bp_tensor from = expert_at(src, c->buf, (char *)bp_buffer_get_base(c->buf) +
                                                    (size_t)held * stride);
        c->stamp[held] = now;
        stats->hits++;
        stats->bytes_from_cache += stride;
        return bp_tensor_copy(&from, &to);
    }
    stats->misses++;
    stats->bytes_from_source += stride;
    enum bp_status st = copy_range(src, copy, (size_t)e * stride, stride);
    int victim = -1;
    for (int i = 0; i < c->slots; i++)
        if (c->stamp[i] != now && (victim < 0 || c->stamp[i] < c->stamp[victim]))
            victim = i;
    if (st != BP_OK || victim < 0) /* every slot holds an expert this compute needs */
        return st;
    if (c->slot_expert[victim] >= 0)
        c->expert_slot[c->slot_expert[victim]] = -1;
    bp_tensor slot = expert_at(src, c->buf, (char *)bp_buffer_get_base(c->buf) +
                                                (size_t)victim * stride);
    st = bp_tensor_copy(&to, &slot);
    if (st == BP_OK) {
        c->slot_expert[victim] = (int32_t)e;
        c->expert_slot[e] = victim;
        c->stamp[victim] = now;
    }
    return st;
}

enum bp_status bp__sched_copy_experts(bp_backend *const *backends, int n_backends, int b,
                                      const bp_graph *sg, bp_tensor *src, bp_tensor *copy,
                                      struct bp__expert_caches *ec, int slots,
                                      struct bp_sched_expert_stats *stats)
{
    bp_tensor *users[MAX_USERS];
    const int n_users = expert_users(sg, copy, users);
    const int64_t n_expert = src->ne[2];
    /* The ids: produced by any backend, or copied in by this split's inputs. */
    for (int i = 0; i < n_backends; i++) {
        enum bp_status st = bp_backend_synchronize(backends[i]);
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
    struct expert_cache *c =
        slots > 0 && ec != NULL ? cache_of(ec, src, b, backends[b], slots) : NULL;
    const uint64_t now = ec != NULL ? ++ec->clock : 0;
    if (c != NULL) /* what this compute needs is not evicted by it */
        for (int64_t e = 0; e < n_expert; e++)
            if (used[e] && c->expert_slot[e] >= 0)
                c->stamp[c->expert_slot[e]] = now;
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
        const size_t after = e1 < n_expert ? (size_t)e1 * stride + pad : total;
        const size_t end = after < total ? after : total;
        if (c == NULL) {
            st = copy_range(src, copy, off, end - off);
            stats->misses += (uint64_t)(e1 - e0);
            stats->bytes_from_source += end - off;
        } else {
            for (int64_t e = e0; e < e1 && st == BP_OK; e++)
                st = copy_cached(c, now, src, copy, e, stats);
            if (st == BP_OK && end > (size_t)e1 * stride) { /* the padding, from the source */
                st = copy_range(src, copy, (size_t)e1 * stride, end - (size_t)e1 * stride);
                stats->bytes_from_source += end - (size_t)e1 * stride;
            }
        }
        e0 = e1;
    }
    free(used);
    return st;
}
