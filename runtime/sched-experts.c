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
 * where it holds them; with predictions (bp_sched_predict_experts), a copy thread loads the
 * experts a later product is predicted to use into those slots while the graph computes. */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Bytes [off, off + size) of src into copy (the same layout). */
static enum bp_status copy_range(const bp_tensor *src, bp_tensor *copy, size_t off, size_t size)
{
    if (bp_buffer_is_host(src->buffer))
        return bp_tensor_set(copy, (const char *)src->data + off, off, size);
    void *tmp = malloc(size);
    if (tmp == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory staging %zu bytes of "
                         "experts of %s", size, bp__describe(src).s);
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
 * does not need. The weights are taken not to change while they are cached.
 *
 * Prefetch: the scheduler thread (the one computing) decides everything about the slots: which
 * expert a slot holds, which slot a prefetch fills. The copy thread only copies: it takes jobs
 * (expert e of src into slot i) in order, and counts done_seq up as each lands. A slot whose
 * job has not landed has slot_seq > done_seq: the scheduler waits for it before reading it and
 * never picks it as a victim. Writes into cache buffers, the copy thread's and the
 * scheduler's, take buf_lock, so no buffer sees two calls at once. At the end of every compute
 * the queue is drained (jobs not started are dropped, their slots emptied), so the copy thread
 * never runs while the caller has control of the weights. */

struct expert_cache {
    const bp_tensor *src;
    int backend;
    int slots;
    bp_buffer *buf;
    int32_t *slot_expert; /* slots entries: the expert held, or -1 */
    uint64_t *stamp;      /* slots entries: the clock when last needed */
    uint64_t *slot_seq;   /* slots entries: the prefetch job filling it (0: none) */
    bool *slot_bad;       /* slots entries: that job failed (written by the copy thread) */
    bool *slot_ahead;     /* slots entries: filled by a prefetch and not read since */
    int32_t *expert_slot; /* n_expert entries: the slot holding it, or -1 */
    /* Read in place: the products see the slots as a stack of `slots` experts (view) and ids
     * mapped to slots (ids[u], in ids_buf, one per product). */
    bp_tensor view;
    bp_tensor ids[MAX_USERS];
    bp_buffer *ids_buf;
};

struct prefetch_job {
    struct expert_cache *c;
    int64_t e;
    int slot;
    uint64_t seq;
    bp_buffer_type *staging_type; /* host memory the device reads fastest, or NULL */
};

struct bp__expert_caches {
    struct expert_cache **c;
    size_t n, cap;
    uint64_t clock;

    pthread_mutex_t lock; /* the queue, running, slot_bad, the counters, quit */
    pthread_cond_t work, landed;
    pthread_mutex_t buf_lock; /* writes into the caches' buffers */
    pthread_t thread;
    bool started, quit, no_thread;
    struct prefetch_job *jobs; /* [head, tail) waiting */
    size_t head, tail, cap_jobs;
    bool busy;                 /* the copy thread is doing `running` */
    struct prefetch_job running;
    uint64_t seq;              /* the last job queued */
    _Atomic uint64_t done_seq; /* the highest job landed (jobs land in order) */
    /* since the last drain: the copy thread's time, and what it loaded */
    uint64_t busy_ns, done_jobs;
    size_t done_bytes;
    /* the copy thread's staging memory (sources the host cannot address) */
    bp_buffer *staging_buf;
    void *staging_mem;
    size_t staging_size;
    bp_buffer_type *staging_type;
};

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

struct bp__expert_caches *bp__expert_caches_new(void)
{
    struct bp__expert_caches *ec =
        bp__calloc(1, sizeof(struct bp__expert_caches), "the scheduler's expert caches");
    if (ec == NULL)
        return NULL;
    bool ok[4];
    ok[0] = pthread_mutex_init(&ec->lock, NULL) == 0;
    ok[1] = pthread_mutex_init(&ec->buf_lock, NULL) == 0;
    ok[2] = pthread_cond_init(&ec->work, NULL) == 0;
    ok[3] = pthread_cond_init(&ec->landed, NULL) == 0;
    if (!ok[0] || !ok[1] || !ok[2] || !ok[3]) {
        if (ok[0])
            pthread_mutex_destroy(&ec->lock);
        if (ok[1])
            pthread_mutex_destroy(&ec->buf_lock);
        if (ok[2])
            pthread_cond_destroy(&ec->work);
        if (ok[3])
            pthread_cond_destroy(&ec->landed);
        bp__free(ec);
        bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: no mutex or condition for the expert "
                  "caches");
        return NULL;
    }
    atomic_init(&ec->done_seq, 0);
    return ec;
}

static void cache_free(struct expert_cache *c)
{
    if (c == NULL)
        return;
    bp_buffer_free(c->buf);
    bp_buffer_free(c->ids_buf);
    bp__free(c->slot_expert);
    bp__free(c->stamp);
    bp__free(c->slot_seq);
    bp__free(c->slot_bad);
    bp__free(c->slot_ahead);
    bp__free(c->expert_slot);
    bp__free(c);
}

static void staging_free(struct bp__expert_caches *ec)
{
    bp_buffer_free(ec->staging_buf);
    if (ec->staging_buf == NULL)
        free(ec->staging_mem);
    ec->staging_buf = NULL;
    ec->staging_mem = NULL;
    ec->staging_size = 0;
}

void bp__expert_caches_free(struct bp__expert_caches *ec)
{
    if (ec == NULL)
        return;
    bp__expert_caches_clear(ec);
    if (ec->started) {
        pthread_mutex_lock(&ec->lock);
        ec->quit = true;
        pthread_cond_signal(&ec->work);
        pthread_mutex_unlock(&ec->lock);
        pthread_join(ec->thread, NULL);
    }
    staging_free(ec);
    pthread_cond_destroy(&ec->work);
    pthread_cond_destroy(&ec->landed);
    pthread_mutex_destroy(&ec->buf_lock);
    pthread_mutex_destroy(&ec->lock);
    bp__free(ec->jobs);
    bp__free(ec->c);
    bp__free(ec);
}

void bp__expert_caches_clear(struct bp__expert_caches *ec)
{
    if (ec == NULL)
        return;
    struct bp_sched_expert_stats ignored = {0};
    bp__expert_caches_drain(ec, &ignored);
    for (size_t i = 0; i < ec->n; i++)
        cache_free(ec->c[i]);
    ec->n = 0;
    staging_free(ec); /* (its buffer type may be of a device no longer used) */
}

/* The padding after a run of experts of src: whole rows covering EXPERT_PAD bytes (a source
 * in a layout read in whole blocks, CPU_REPACK, takes only such ranges), at most one expert. */
static size_t pad_of(const bp_tensor *src)
{
    const size_t stride = src->nb[2], row = src->nb[1];
    const size_t pad_rows = (EXPERT_PAD + row - 1) / row * row;
    return stride < pad_rows ? stride : pad_rows;
}

/* The cache of src on backend b with `slots` slots, made on first use; NULL when it cannot be
 * had (no memory for it on the device: the experts are then copied from the source). */
static struct expert_cache *cache_of(struct bp__expert_caches *ec, const bp_graph *ug,
                                     const bp_tensor *src, int b, bp_backend *be, int slots)
{
    if (slots > src->ne[2]) /* more slots than experts hold nothing more */
        slots = (int)src->ne[2];
    for (size_t i = 0; i < ec->n; i++)
        if (ec->c[i]->src == src && ec->c[i]->backend == b)
            return ec->c[i]->buf != NULL ? ec->c[i] : NULL; /* NULL: could not be had */
    if (ec->n == ec->cap) {
        size_t cap = ec->cap ? 2 * ec->cap : 16;
        struct expert_cache **c = bp__realloc(ec->c, cap * sizeof(*c), "the expert caches");
        if (c == NULL) {
            bp_clear_error(); /* no cache: the experts come from the source */
            return NULL;
        }
        ec->c = c;
        ec->cap = cap;
    }
    struct expert_cache *c = bp__calloc(1, sizeof(*c), "an expert cache");
    if (c == NULL) {
        bp_clear_error();
        return NULL;
    }
    c->src = src;
    c->backend = b;
    c->slots = slots;
    ec->c[ec->n++] = c;
    if (bp_device_get_type(bp_backend_get_device(be)) == BP_DEVICE_TYPE_META) {
        /* A meta device stores each tensor split by its rule; slots have none. */
        bp_log(BP_LOG_INFO, "scheduler: no expert cache on the meta device %s; the experts of "
               "%s are copied from their source", bp_backend_get_name(be), bp__describe_in(ug, src).s);
        return NULL;
    }
    /* The slots, then rows covering the padding a kernel may read past the last one; cleared,
     * so that what a kernel reads past an expert is finite. */
    c->buf = bp_buffer_type_alloc(bp_backend_get_default_buffer_type(be),
                                  (size_t)slots * src->nb[2] + pad_of(src));
    if (c->buf != NULL && bp_buffer_clear(c->buf, 0) != BP_OK) {
        bp_buffer_free(c->buf);
        c->buf = NULL;
    }
    c->slot_expert = bp__malloc((size_t)slots * sizeof(int32_t), "an expert cache");
    c->stamp = bp__calloc((size_t)slots, sizeof(uint64_t), "an expert cache");
    c->slot_seq = bp__calloc((size_t)slots, sizeof(uint64_t), "an expert cache");
    c->slot_bad = bp__calloc((size_t)slots, sizeof(bool), "an expert cache");
    c->slot_ahead = bp__calloc((size_t)slots, sizeof(bool), "an expert cache");
    c->expert_slot = bp__malloc((size_t)src->ne[2] * sizeof(int32_t), "an expert cache");
    if (c->buf == NULL || c->slot_expert == NULL || c->stamp == NULL || c->slot_seq == NULL ||
        c->slot_bad == NULL || c->slot_ahead == NULL || c->expert_slot == NULL) {
        /* No cache for this tensor: its experts come from the source from now on, and the
         * failure is said once, not at every compute (the entry stays, without a buffer). */
        bp_log(BP_LOG_WARN, "scheduler: no expert cache of %d slots (%zu bytes) for %s on %s: "
               "%s; its experts are copied from their source", slots,
               (size_t)slots * src->nb[2], bp__describe_in(ug, src).s, bp_backend_get_name(be),
               bp_last_error());
        bp_clear_error();
        bp_buffer_free(c->buf);
        c->buf = NULL;
        return NULL;
    }
    for (int i = 0; i < slots; i++)
        c->slot_expert[i] = -1;
    for (int64_t e = 0; e < src->ne[2]; e++)
        c->expert_slot[e] = -1;
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
    t.flags = 0;
    t.extra = NULL;
    t.buffer = buf;
    t.data = data;
    return t;
}

/* Slot i of c, filled by a prefetch: waits until it landed. False when the load failed (the
 * slot is then empty). Called by the scheduler thread only. */
static bool slot_ready(struct bp__expert_caches *ec, struct expert_cache *c, int i,
                       struct bp_sched_expert_stats *stats)
{
    if (c->slot_seq[i] == 0)
        return true;
    bool bad;
    if (atomic_load(&ec->done_seq) >= c->slot_seq[i]) {
        pthread_mutex_lock(&ec->lock);
        bad = c->slot_bad[i];
        c->slot_bad[i] = false;
        pthread_mutex_unlock(&ec->lock);
    } else {
        const uint64_t t0 = now_ns();
        pthread_mutex_lock(&ec->lock);
        while (atomic_load(&ec->done_seq) < c->slot_seq[i])
            pthread_cond_wait(&ec->landed, &ec->lock);
        bad = c->slot_bad[i];
        c->slot_bad[i] = false;
        pthread_mutex_unlock(&ec->lock);
        stats->wait_seconds += (double)(now_ns() - t0) * 1e-9;
    }
    c->slot_seq[i] = 0;
    if (bad) { /* empty, and free to take (even in the compute that needed it) */
        c->expert_slot[c->slot_expert[i]] = -1;
        c->slot_expert[i] = -1;
        c->slot_ahead[i] = false;
        c->stamp[i] = 0;
    }
    return !bad;
}

/* The queued jobs of cache c (of every cache when c is NULL) are dropped, their slots emptied,
 * except those of experts in keep[] (c's experts this compute uses: slot_ready waits for them
 * before they are read), and a job of c under way is waited for: then nothing writes c's
 * buffer by the time its products run. By the scheduler thread, which owns the slots. */
static void quiesce(struct bp__expert_caches *ec, const struct expert_cache *c, const bool *keep,
                    struct bp_sched_expert_stats *stats)
{
    if (!ec->started)
        return;
    pthread_mutex_lock(&ec->lock);
    size_t kept = ec->head;
    for (size_t i = ec->head; i < ec->tail; i++) {
        struct prefetch_job *j = &ec->jobs[i];
        if ((c != NULL && j->c != c) || (keep != NULL && keep[j->e])) {
            ec->jobs[kept++] = *j;
            continue;
        }
        struct expert_cache *jc = j->c;
        jc->expert_slot[jc->slot_expert[j->slot]] = -1;
        jc->slot_expert[j->slot] = -1;
        jc->slot_ahead[j->slot] = false;
        jc->slot_seq[j->slot] = 0;
        jc->stamp[j->slot] = 0;
    }
    ec->tail = kept;
    if (ec->busy && (c == NULL || ec->running.c == c)) {
        const uint64_t t0 = now_ns();
        while (ec->busy)
            pthread_cond_wait(&ec->landed, &ec->lock);
        stats->wait_seconds += (double)(now_ns() - t0) * 1e-9;
    }
    pthread_mutex_unlock(&ec->lock);
}

/* The least recently used slot of c not needed at clock now and not being filled, or -1. */
static int victim_of(struct bp__expert_caches *ec, const struct expert_cache *c, uint64_t now)
{
    const uint64_t done = atomic_load(&ec->done_seq);
    int victim = -1;
    for (int i = 0; i < c->slots; i++)
        if (c->stamp[i] != now && c->slot_seq[i] <= done &&
            (victim < 0 || c->stamp[i] < c->stamp[victim]))
            victim = i;
    return victim;
}

/* Slot i of c, now to hold expert e (the expert it held forgotten). */
static void assign_slot(struct expert_cache *c, int i, int64_t e, uint64_t now)
{
    if (c->slot_expert[i] >= 0)
        c->expert_slot[c->slot_expert[i]] = -1;
    c->slot_expert[i] = (int32_t)e;
    c->expert_slot[e] = i;
    c->stamp[i] = now;
    c->slot_ahead[i] = false;
}

/* bp_tensor_copy into or out of a cache buffer, with the other writer of cache buffers (the
 * copy thread) kept out. */
static enum bp_status cache_copy(struct bp__expert_caches *ec, const bp_tensor *from,
                                 bp_tensor *to)
{
    pthread_mutex_lock(&ec->buf_lock);
    enum bp_status st = bp_tensor_copy(from, to);
    pthread_mutex_unlock(&ec->buf_lock);
    return st;
}

/* Expert e into copy: from the cache when it holds it, else from the source and into the
 * cache's least recently used slot not needed by this compute. */
static enum bp_status copy_cached(struct bp__expert_caches *ec, struct expert_cache *c,
                                  uint64_t now, const bp_tensor *src, bp_tensor *copy, int64_t e,
                                  struct bp_sched_expert_stats *stats)
{
    const size_t stride = src->nb[2];
    bp_tensor to = expert_at(src, copy->buffer, (char *)copy->data + (size_t)e * stride);
    const int held = c->expert_slot[e];
    if (held >= 0 && slot_ready(ec, c, held, stats)) {
        bp_tensor from = expert_at(src, c->buf, (char *)bp_buffer_get_base(c->buf) +
                                                    (size_t)held * stride);
        c->stamp[held] = now;
        stats->hits++;
        if (c->slot_ahead[held])
            stats->prefetch_hits++;
        c->slot_ahead[held] = false;
        stats->bytes_from_cache += stride;
        return cache_copy(ec, &from, &to);
    }
    stats->misses++;
    stats->bytes_from_source += stride;
    enum bp_status st = copy_range(src, copy, (size_t)e * stride, stride);
    const int victim = victim_of(ec, c, now);
    if (st != BP_OK || victim < 0) /* every slot holds an expert this compute needs */
        return st;
    slot_ready(ec, c, victim, stats); /* landed already: only its state is settled */
    bp_tensor slot = expert_at(src, c->buf, (char *)bp_buffer_get_base(c->buf) +
                                                (size_t)victim * stride);
    assign_slot(c, victim, e, now);
    st = cache_copy(ec, &to, &slot);
    if (st != BP_OK) {
        c->expert_slot[e] = -1;
        c->slot_expert[victim] = -1;
    }
    return st;
}

/* Expert e of c's source into slot i, by the scheduler thread. */
static enum bp_status fill_slot(struct bp__expert_caches *ec, struct expert_cache *c, int i,
                                int64_t e)
{
    const bp_tensor *src = c->src;
    const size_t stride = src->nb[2];
    bp_tensor slot = expert_at(src, c->buf, (char *)bp_buffer_get_base(c->buf) +
                                                (size_t)i * stride);
    if (bp_buffer_is_host(src->buffer)) {
        pthread_mutex_lock(&ec->buf_lock);
        enum bp_status st = bp_tensor_set(&slot, (const char *)src->data + (size_t)e * stride,
                                          0, stride);
        pthread_mutex_unlock(&ec->buf_lock);
        return st;
    }
    void *tmp = malloc(stride);
    if (tmp == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory staging an expert of "
                         "%s", bp__describe(src).s);
    enum bp_status st = bp_tensor_get(src, tmp, (size_t)e * stride, stride);
    if (st == BP_OK) {
        pthread_mutex_lock(&ec->buf_lock);
        st = bp_tensor_set(&slot, tmp, 0, stride);
        pthread_mutex_unlock(&ec->buf_lock);
    }
    free(tmp);
    return st;
}

/* The products of the split read the used experts in place in c: each used expert is made to
 * sit in a slot (hits held already; misses from the source into the least recently used slot
 * this compute does not need), each product's ids are mapped to slots into a buffer of c's,
 * and swaps[] gets the sources to give the products (the slots as a stack, the mapped ids).
 * vals[u]: the values of users[u]'s ids, all in range. */
static enum bp_status read_in_place(struct bp__expert_caches *ec, struct expert_cache *c,
                                    uint64_t now, bp_tensor *const *users, int n_users,
                                    int32_t *const *vals, const bool *used,
                                    struct bp_sched_expert_stats *stats,
                                    struct bp__expert_swap *swaps, int *n_swaps)
{
    const bp_tensor *src = c->src;
    const size_t stride = src->nb[2];
    enum bp_status st = BP_OK;
    for (int64_t e = 0; e < src->ne[2] && st == BP_OK; e++) {
        if (!used[e])
            continue;
        const int held = c->expert_slot[e];
        if (held >= 0 && slot_ready(ec, c, held, stats)) {
            stats->hits++;
            stats->prefetch_hits += c->slot_ahead[held];
            c->slot_ahead[held] = false;
            stats->bytes_from_cache += stride;
            continue;
        }
        int v = victim_of(ec, c, now);
        for (int i = 0; v < 0 && i < c->slots; i++) { /* the rest are being filled: wait */
            slot_ready(ec, c, i, stats);
            v = victim_of(ec, c, now);
        }
        BP_ASSERT(v >= 0); /* at most `slots` experts are used, the others' slots are free */
        slot_ready(ec, c, v, stats); /* (a landed prefetch: its state settled) */
        assign_slot(c, v, e, now);
        stats->misses++;
        stats->bytes_from_source += stride;
        st = fill_slot(ec, c, v, e);
        if (st != BP_OK) {
            c->expert_slot[e] = -1;
            c->slot_expert[v] = -1;
        }
    }
    /* The mapped ids, each product's in its own aligned part of ids_buf. */
    bp_buffer_type *bt = bp_buffer_get_type(c->buf);
    const size_t align = bp_buffer_type_get_alignment(bt);
    size_t need = 0;
    for (int u = 0; u < n_users; u++)
        need += (bp_nbytes(users[u]->src[2]) + align - 1) / align * align;
    if (st == BP_OK && (c->ids_buf == NULL || bp_buffer_get_size(c->ids_buf) < need)) {
        bp_buffer_free(c->ids_buf);
        if ((c->ids_buf = bp_buffer_type_alloc(bt, need)) == NULL)
            st = bp_last_status();
    }
    size_t off = 0;
    for (int u = 0; u < n_users && st == BP_OK; u++) {
        const bp_tensor *ids = users[u]->src[2];
        const int64_t n = bp_nelements(ids);
        for (int64_t i = 0; i < n; i++)
            vals[u][i] = c->expert_slot[vals[u][i]];
        bp_tensor *t = &c->ids[u];
        *t = *ids;
        t->op = BP_OP_NONE;
        memset(t->src, 0, sizeof(t->src));
        t->view_src = NULL;
        t->view_offs = 0;
        t->flags = 0;
        t->extra = NULL;
        t->buffer = c->ids_buf;
        t->data = (char *)bp_buffer_get_base(c->ids_buf) + off;
        off += (bp_nbytes(ids) + align - 1) / align * align;
        st = bp_tensor_set(t, vals[u], 0, bp_nbytes(ids));
        swaps[(*n_swaps)++] = (struct bp__expert_swap){users[u], 0, &c->view};
        swaps[(*n_swaps)++] = (struct bp__expert_swap){users[u], 2, t};
    }
    c->view = expert_at(src, c->buf, bp_buffer_get_base(c->buf));
    c->view.ne[2] = c->slots;
    c->view.nb[3] = (size_t)c->slots * stride;
    return st;
}

enum bp_status bp__sched_copy_experts(bp_backend *const *backends, int n_backends, int b,
                                      const bp_graph *ug, const bp_graph *sg, bp_tensor *src,
                                      bp_tensor *copy,
                                      struct bp__expert_caches *ec, int slots,
                                      struct bp_sched_expert_stats *stats,
                                      struct bp__expert_swap *swaps, int *n_swaps)
{
    bp_tensor *users[MAX_USERS];
    int32_t *vals[MAX_USERS] = {NULL};
    const int n_users = expert_users(sg, copy, users);
    const int64_t n_expert = src->ne[2];
    *n_swaps = 0;
    /* The ids: produced by any backend, or copied in by this split's inputs. */
    for (int i = 0; i < n_backends; i++) {
        enum bp_status st = bp_backend_synchronize(backends[i]);
        if (st != BP_OK)
            return st;
    }
    const uint64_t t0 = now_ns();
    const double waited = stats->wait_seconds;
    bool *used = calloc((size_t)n_expert, sizeof(bool));
    if (used == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory for the experts of %s",
                         bp__describe_in(ug, src).s);
    /* The ids' values: the experts used, and whether all are in range (then the products can
     * read them in place from a cache; an id out of range is left to the product to report). */
    enum bp_status st = BP_OK;
    bool in_range = true;
    for (int u = 0; u < n_users && st == BP_OK; u++) {
        const bp_tensor *ids = users[u]->src[2];
        const int64_t n = bp_nelements(ids);
        if (!bp_is_contiguous(ids)) { /* unusual ids: every expert */
            in_range = false;
            for (int64_t e = 0; e < n_expert; e++)
                used[e] = true;
            continue;
        }
        if ((vals[u] = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t))) == NULL) {
            st = bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory reading the expert "
                           "ids %s", bp__describe_in(ug, ids).s);
            break;
        }
        st = bp_tensor_get(ids, vals[u], 0, (size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n && st == BP_OK; i++) {
            if (vals[u][i] >= 0 && vals[u][i] < n_expert)
                used[vals[u][i]] = true;
            else
                in_range = false;
        }
    }
    struct expert_cache *c =
        slots > 0 && ec != NULL && st == BP_OK ? cache_of(ec, ug, src, b, backends[b], slots) : NULL;
    if (c != NULL) /* c's wrong predictions are dropped; nothing else writes c after this */
        quiesce(ec, c, used, stats);
    const uint64_t now = ec != NULL ? ++ec->clock : 0;
    int64_t n_used = 0;
    for (int64_t e = 0; e < n_expert; e++)
        n_used += used[e];
    if (c != NULL) /* what this compute needs is not evicted by it */
        for (int64_t e = 0; e < n_expert; e++)
            if (used[e] && c->expert_slot[e] >= 0)
                c->stamp[c->expert_slot[e]] = now;
    if (c != NULL && in_range && n_used <= c->slots) {
        st = read_in_place(ec, c, now, users, n_users, vals, used, stats, swaps, n_swaps);
        goto done;
    }
    /* Copied into copy: runs of used experts, each followed by the padding. */
    const size_t stride = src->nb[2], total = bp_nbytes(src), pad = pad_of(src);
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
                st = copy_cached(ec, c, now, src, copy, e, stats);
            if (st == BP_OK && end > (size_t)e1 * stride) { /* the padding, from the source */
                st = copy_range(src, copy, (size_t)e1 * stride, end - (size_t)e1 * stride);
                stats->bytes_from_source += end - (size_t)e1 * stride;
            }
        }
        e0 = e1;
    }
done:
    for (int u = 0; u < n_users; u++)
        free(vals[u]);
    free(used);
    /* the time spent copying, not waiting for the copy thread */
    stats->copy_seconds += (double)(now_ns() - t0) * 1e-9 - (stats->wait_seconds - waited);
    return st;
}

/* ---- Prefetch ------------------------------------------------------------------------------ */

/* Staging memory of at least size bytes for the copy thread, of type t (NULL: malloc). */
static void *staging(struct bp__expert_caches *ec, size_t size, bp_buffer_type *t)
{
    if (ec->staging_size >= size && ec->staging_type == t)
        return ec->staging_mem;
    staging_free(ec);
    if (t != NULL && (ec->staging_buf = bp_buffer_type_alloc(t, size)) != NULL) {
        ec->staging_mem = bp_buffer_get_base(ec->staging_buf);
    } else {
        bp_clear_error(); /* no pinned memory: plain memory does, more slowly */
        t = NULL;
        ec->staging_mem = malloc(size);
    }
    if (ec->staging_mem == NULL)
        return NULL;
    ec->staging_size = size;
    ec->staging_type = t;
    return ec->staging_mem;
}

/* The copy thread's work: expert j->e of its cache's source into slot j->slot. */
static enum bp_status load_slot(struct bp__expert_caches *ec, const struct prefetch_job *j)
{
    const bp_tensor *src = j->c->src;
    const size_t stride = src->nb[2];
    const void *from;
    if (bp_buffer_is_host(src->buffer)) {
        from = (const char *)src->data + (size_t)j->e * stride;
    } else { /* through memory the host can address (pinned where the device offers it) */
        void *tmp = staging(ec, stride, j->staging_type);
        if (tmp == NULL)
            return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: no staging memory for "
                             "prefetching %s", bp__describe(src).s);
        enum bp_status st = bp_tensor_get(src, tmp, (size_t)j->e * stride, stride);
        if (st != BP_OK)
            return st;
        from = tmp;
    }
    bp_tensor slot = expert_at(src, j->c->buf, (char *)bp_buffer_get_base(j->c->buf) +
                                                   (size_t)j->slot * stride);
    pthread_mutex_lock(&ec->buf_lock);
    enum bp_status st = bp_tensor_set(&slot, from, 0, stride);
    pthread_mutex_unlock(&ec->buf_lock);
    return st;
}

static void *copy_thread(void *arg)
{
    struct bp__expert_caches *ec = arg;
    pthread_mutex_lock(&ec->lock);
    for (;;) {
        while (!ec->quit && ec->head == ec->tail)
            pthread_cond_wait(&ec->work, &ec->lock);
        if (ec->quit)
            break;
        const struct prefetch_job j = ec->jobs[ec->head++];
        ec->running = j;
        ec->busy = true;
        pthread_mutex_unlock(&ec->lock);
        const uint64_t t0 = now_ns();
        const enum bp_status st = load_slot(ec, &j);
        const uint64_t t1 = now_ns();
        if (st != BP_OK) /* the scheduler copies that expert itself, and meets the error */
            bp_clear_error();
        pthread_mutex_lock(&ec->lock);
        ec->busy_ns += t1 - t0;
        if (st == BP_OK) {
            ec->done_jobs++;
            ec->done_bytes += j.c->src->nb[2];
        }
        j.c->slot_bad[j.slot] = st != BP_OK;
        if (j.seq > atomic_load(&ec->done_seq))
            atomic_store(&ec->done_seq, j.seq);
        ec->busy = false;
        pthread_cond_broadcast(&ec->landed);
    }
    pthread_mutex_unlock(&ec->lock);
    return NULL;
}

/* Whether the copy thread runs (started on first use; false, said once, when it cannot). */
static bool thread_running(struct bp__expert_caches *ec)
{
    if (ec->started || ec->no_thread)
        return ec->started;
    int e = pthread_create(&ec->thread, NULL, copy_thread, ec);
    if (e != 0) {
        ec->no_thread = true;
        bp_log(BP_LOG_WARN, "scheduler: no thread for prefetching experts (%s); experts are "
               "copied when used", strerror(e));
        return false;
    }
    ec->started = true;
    return true;
}

enum bp_status bp__sched_prefetch_experts(bp_backend *const *backends, int b,
                                          const bp_graph *ug, const bp_tensor *src,
                                          const bp_tensor *ids,
                                          struct bp__expert_caches *ec, int slots,
                                          struct bp_sched_expert_stats *stats)
{
    const int64_t n_expert = src->ne[2];
    if (ids->type != BP_TYPE_I32 || !bp_is_contiguous(ids))
        return BP_OK; /* (a tensor other than the prediction at its address: nothing to do) */
    struct expert_cache *c = cache_of(ec, ug, src, b, backends[b], slots);
    if (c == NULL || !thread_running(ec))
        return BP_OK; /* nothing to fill: the experts are copied when used */
    bool *want = calloc((size_t)n_expert, sizeof(bool));
    if (want == NULL)
        return bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory for the predicted "
                         "experts of %s", bp__describe_in(ug, src).s);
    /* The ids in their order (most likely first, when they come from a top-k) */
    const int64_t n = bp_nelements(ids);
    int32_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    enum bp_status st = v == NULL ? bp__error(BP_ERR_OUT_OF_MEMORY, "scheduler: out of memory "
                                              "reading the expert ids %s",
                                              bp__describe_in(ug, ids).s)
                                  : bp_tensor_get(ids, v, 0, (size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n && st == BP_OK; i++)
        if (v[i] >= 0 && v[i] < n_expert)
            want[v[i]] = true;
    const uint64_t now = ++ec->clock;
    for (int64_t e = 0; e < n_expert && st == BP_OK; e++) /* held already: kept */
        if (want[e] && c->expert_slot[e] >= 0)
            c->stamp[c->expert_slot[e]] = now;
    bp_buffer_type *host = bp_device_get_host_buffer_type(bp_backend_get_device(backends[b]));
    if (host == NULL)
        bp_clear_error(); /* (a device without one) */
    int queued = 0;
    pthread_mutex_lock(&ec->lock);
    for (int64_t i = 0; i < n && st == BP_OK; i++) {
        const int64_t e = v[i];
        if (e < 0 || e >= n_expert || c->expert_slot[e] >= 0)
            continue;
        const int s = victim_of(ec, c, now);
        if (s < 0) /* more predicted than slots */
            break;
        if (ec->tail == ec->cap_jobs) {
            const size_t cap = ec->cap_jobs ? 2 * ec->cap_jobs : 64;
            struct prefetch_job *jobs = bp__realloc(ec->jobs, cap * sizeof(*jobs),
                                                    "the prefetch queue");
            if (jobs == NULL) {
                bp_clear_error(); /* the rest are copied when used */
                break;
            }
            ec->jobs = jobs;
            ec->cap_jobs = cap;
        }
        c->slot_bad[s] = false; /* (a failure of its last, landed job: now overwritten) */
        assign_slot(c, s, e, now);
        c->slot_ahead[s] = true;
        c->slot_seq[s] = ++ec->seq;
        ec->jobs[ec->tail++] = (struct prefetch_job){c, e, s, ec->seq, host};
        queued++;
    }
    if (queued > 0)
        pthread_cond_signal(&ec->work);
    pthread_mutex_unlock(&ec->lock);
    free(v);
    free(want);
    (void)stats; /* (what lands is counted by the copy thread) */
    return st;
}

void bp__expert_caches_drain(struct bp__expert_caches *ec, struct bp_sched_expert_stats *stats)
{
    if (ec == NULL || !ec->started)
        return;
    quiesce(ec, NULL, NULL, stats); /* the queue dropped, the job under way waited for */
    pthread_mutex_lock(&ec->lock);
    ec->head = ec->tail = 0;
    stats->prefetch_seconds += (double)ec->busy_ns * 1e-9;
    stats->prefetched += ec->done_jobs;
    stats->bytes_prefetched += ec->done_bytes;
    ec->busy_ns = ec->done_jobs = 0;
    ec->done_bytes = 0;
    pthread_mutex_unlock(&ec->lock);
    /* A prefetched expert this compute did not read stays cached, but a later compute's hit
     * on it is an ordinary hit: prefetch_hits counts what this compute's prefetches earned. */
    for (size_t k = 0; k < ec->n; k++)
        for (int i = 0; ec->c[k]->buf != NULL && i < ec->c[k]->slots; i++)
            ec->c[k]->slot_ahead[i] = false;
}
