/* meta-compute.c - computing a graph on a meta device: the states of its tensors, the
 * conversions between them, and running each part's share of it.
 *
 * Every tensor of the graph has a state: MIRRORED (each part holds all of it), SPLIT on an axis
 * with a size per part, or PARTIAL (each part holds a summand). Walking the nodes in order, the
 * rules of meta-rules.c pick the states a node wants its sources in and the state of its result
 * (docs/meta.md has the table); a source in another state is converted first: a MIRRORED tensor
 * is sliced for free (its data is already on every part), a SPLIT one is gathered, a PARTIAL one
 * all-reduced. Every part gets a "shadow" of each node - the same op on its slice of memory -
 * queued on that part's backend. Gathers and all-reduces need finished data, so they first run
 * what is queued. Anything a rule does not cover runs MIRRORED: every part computes it in full,
 * which is always correct. */
#include "config.h"

#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "meta-impl.h"
#include "meta-rules.h"

struct record {
    const bp_tensor *t;
    struct bp_meta_split s;
    bp_tensor *sh[BP_META_MAX_DEVICES];
    /* A sliced weight needed in another state: a whole copy per part for this run. */
    bp_buffer *temp[BP_META_MAX_DEVICES];
};

struct run {
    struct meta_backend *mb;
    struct meta_dev *md;
    int n;
    bp_context *ctx;
    struct bp_meta_ptab recs; /* tensor -> struct record */
    bp_tensor **pending[BP_META_MAX_DEVICES];
    int n_pending[BP_META_MAX_DEVICES];
    int cap_pending;
    /* Across processes: the first failure on this rank. From then on the rank computes nothing
     * and takes part in the next collective as failed, so every rank stops there with an
     * error (never a rank left waiting); told: a collective has reported it (or another
     * rank's) to every rank. */
    enum bp_status failed;
    bool told;
};

static const struct bp_meta_split MIRROR = {.state = BP_META_MIRRORED};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- Records and shadows ---------------------------------------------------------------- */

/* t's record, made when missing; NULL when out of memory (with the error set). */
static struct record *rec_of(struct run *r, const bp_tensor *t)
{
    bool added;
    struct record *rec = bp_meta_ptab_put(&r->recs, t, &added);
    if (rec == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", r->md->name);
        return NULL;
    }
    if (added) {
        const struct meta_slot *sl = bp_meta_sliced_slot(t);
        rec->t = t;
        /* a sliced weight is in its storage split; anything else as the last run left it */
        rec->s = sl != NULL ? sl->s : bp_meta_state_get(&r->md->states, t);
    }
    return rec;
}

static bool make_shadows(struct run *r, const bp_tensor *t, const struct bp_meta_split *s,
                         bp_tensor **out)
{
    for (int p = 0; p < r->n; p++) {
        if (!bp_meta_local(r->md, p)) {
            out[p] = NULL; /* on another process */
            continue;
        }
        out[p] = bp_meta_shadow(r->ctx, r->md, t, s, p);
        if (out[p] == NULL)
            return false;
    }
    return true;
}

/* ---- Running what is queued -------------------------------------------------------------- */

/* One part's graph on a thread of its own, for backends whose compute blocks the caller. */
struct part_job {
    bp_backend *backend;
    bp_graph *graph;
    enum bp_status status;
    char error[256];
};

static void run_job(struct part_job *j)
{
    j->status = bp_backend_graph_compute(j->backend, j->graph);
    if (j->status != BP_OK)
        snprintf(j->error, sizeof(j->error), "%s", bp_last_error());
}

enum { WORKER_IDLE, WORKER_BUSY, WORKER_QUIT };

static void *worker_main(void *arg)
{
    struct meta_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->state == WORKER_IDLE)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->state == WORKER_QUIT)
            break;
        pthread_mutex_unlock(&w->mu);
        run_job(w->job);
        pthread_mutex_lock(&w->mu);
        w->state = WORKER_IDLE;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Hands j to w's thread (started on first use); false when no thread can be had. */
static bool worker_submit(struct meta_worker *w, struct part_job *j)
{
    if (!w->running) {
        if (pthread_mutex_init(&w->mu, NULL) != 0)
            return false;
        if (pthread_cond_init(&w->cv, NULL) != 0) {
            pthread_mutex_destroy(&w->mu);
            return false;
        }
        w->state = WORKER_IDLE;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pthread_cond_destroy(&w->cv);
            pthread_mutex_destroy(&w->mu);
            return false;
        }
        w->running = true;
    }
    pthread_mutex_lock(&w->mu);
    w->job = j;
    w->state = WORKER_BUSY;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return true;
}

static void worker_wait(struct meta_worker *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->state == WORKER_BUSY)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

void bp_meta_workers_stop(struct meta_backend *mb)
{
    for (int p = 0; p < BP_META_MAX_DEVICES; p++) {
        struct meta_worker *w = &mb->workers[p];
        if (!w->running)
            continue;
        pthread_mutex_lock(&w->mu);
        w->state = WORKER_QUIT;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        w->running = false;
    }
}

static enum bp_status flush(struct run *r)
{
    bp_graph *graphs[BP_META_MAX_DEVICES] = {0};
    enum bp_status st = BP_OK;
    int n_graphs = 0;
    for (int p = 0; p < r->n && st == BP_OK; p++) {
        if (r->n_pending[p] == 0)
            continue;
        graphs[p] = bp_graph_new((size_t)r->n_pending[p] * (BP_MAX_SRC + 2) + 16);
        if (graphs[p] == NULL)
            st = bp_last_status();
        for (int i = 0; st == BP_OK && i < r->n_pending[p]; i++)
            st = bp_graph_build_forward(graphs[p], r->pending[p][i]);
        n_graphs++;
    }
    /* Parts that compute asynchronously are started from here; the others (the CPU: its compute
     * returns when done) run on worker threads the backend keeps, the last one on this thread. */
    struct part_job jobs[BP_META_MAX_DEVICES];
    bool handed[BP_META_MAX_DEVICES] = {false};
    int last_sync = -1;
    for (int p = 0; p < r->n && st == BP_OK; p++) {
        if (graphs[p] == NULL)
            continue;
        if (r->mb->async[p] || n_graphs == 1) {
            st = bp_backend_graph_compute_async(r->mb->parts[p], graphs[p]);
            continue;
        }
        jobs[p] = (struct part_job){.backend = r->mb->parts[p], .graph = graphs[p]};
        last_sync = p;
    }
    for (int p = 0; p < last_sync && st == BP_OK; p++) {
        if (graphs[p] == NULL || r->mb->async[p] || n_graphs == 1)
            continue;
        handed[p] = worker_submit(&r->mb->workers[p], &jobs[p]);
        if (!handed[p])
            run_job(&jobs[p]); /* no thread to be had: run it here */
    }
    if (last_sync >= 0 && st == BP_OK)
        run_job(&jobs[last_sync]);
    for (int p = 0; p < last_sync; p++) {
        if (handed[p])
            worker_wait(&r->mb->workers[p]);
    }
    for (int p = 0; p <= last_sync && st == BP_OK; p++) {
        if (graphs[p] != NULL && !r->mb->async[p] && n_graphs > 1 && jobs[p].status != BP_OK)
            st = bp_set_error(jobs[p].status, "%s", jobs[p].error);
    }
    for (int p = 0; p < r->n; p++) {
        enum bp_status s2 = r->mb->parts[p] ? bp_backend_synchronize(r->mb->parts[p]) : BP_OK;
        if (st == BP_OK)
            st = s2;
        bp_graph_free(graphs[p]);
        /* Done: from now on these are plain data to later graphs, not work. */
        for (int i = 0; i < r->n_pending[p]; i++) {
            bp_tensor *sh = r->pending[p][i];
            sh->op = BP_OP_NONE;
            memset(sh->src, 0, sizeof(sh->src));
        }
        r->n_pending[p] = 0;
    }
    return st;
}

static bool queue(struct run *r, int p, bp_tensor *sh)
{
    if (r->n_pending[p] == r->cap_pending) {
        int cap = r->cap_pending ? 2 * r->cap_pending : 256;
        for (int q = 0; q < r->n; q++) {
            bp_tensor **g = realloc(r->pending[q], (size_t)cap * sizeof(*g));
            if (g == NULL)
                return false;
            r->pending[q] = g;
        }
        r->cap_pending = cap;
    }
    r->pending[p][r->n_pending[p]++] = sh;
    return true;
}

/* ---- Conversions ------------------------------------------------------------------------- */

/* A sliced weight needed whole (or split otherwise) in this run: every part gets a whole copy,
 * assembled from all parts' slices, freed when the run ends. */
static enum bp_status assemble(struct run *r, const bp_tensor *t, const struct meta_slot *sl,
                              const struct bp_meta_split *s, bp_buffer **temp);

/* A rank that has failed, at a collective the others reach with t: it takes part as failed
 * with the count that collective sums (its data are not read), so every rank returns an error
 * there. The failure is st (recorded in r->failed when it is the first). */
static enum bp_status tell_failure_st(struct run *r, const bp_tensor *t, enum bp_status st)
{
    if (r->failed == BP_OK)
        r->failed = st;
    const enum bp_status failed = r->failed;
    const bool floats = t->type == BP_TYPE_F32 || t->type == BP_TYPE_F16 ||
                        t->type == BP_TYPE_BF16;
    bp_tensor *ts[BP_META_MAX_DEVICES] = {0};
    bp_tensor *shape = r->ctx == NULL ? NULL
                       : floats ? bp_new_tensor_4d(r->ctx, t->type, t->ne[0], t->ne[1], t->ne[2],
                                                   t->ne[3])
                                : bp_new_tensor_1d(r->ctx, BP_TYPE_I32,
                                                   (int64_t)((bp_nbytes(t) + 3) / 4));
    for (int p = 0; p < r->n; p++)
        ts[p] = bp_meta_local(r->md, p) ? shape : NULL;
    if (shape != NULL) /* (else the others time out: nothing here to say the count with) */
        r->mb->allreduce_checked(r->mb->comm, ts, r->n, failed);
    r->told = true;
    return failed;
}

static enum bp_status tell_failure(struct run *r, const bp_tensor *t)
{
    return tell_failure_st(r, t, r->failed);
}

static enum bp_status unslice(struct run *r, struct record *rec)
{
    const bp_tensor *t = rec->t;
    const struct meta_slot *sl = bp_meta_sliced_slot(t);
    if (r->md->ranked) /* slices on other processes: summed across them */
        return assemble(r, t, sl, &sl->s, rec->temp);
    const size_t bytes = bp_nbytes(t);
    char *tmp = malloc(bp_row_size(t->type, t->ne[0]) + 64);
    if (tmp == NULL)
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", r->md->name);
    enum bp_status st = BP_OK;
    for (int p = 0; p < r->n && st == BP_OK; p++) {
        rec->temp[p] = bp_buffer_type_alloc(bp_device_get_buffer_type(r->md->parts[p]), bytes);
        if (rec->temp[p] == NULL)
            st = bp_last_status();
    }
    for (int q = 0; q < r->n && st == BP_OK; q++) {
        if (sl->s.sizes[q] == 0)
            continue;
        bp_tensor *from = bp_meta_packed_shadow(r->ctx, t, sl, q);
        if (from == NULL) {
            st = bp_last_status();
            break;
        }
        for (int p = 0; p < r->n && st == BP_OK; p++) {
            bp_tensor to = bp_meta_slice_in_whole(t, sl, q, from, rec->temp[p],
                                          bp_buffer_get_base(rec->temp[p]));
            st = bp_meta_copy_rows(from, &to, tmp);
        }
    }
    free(tmp);
    return st;
}

/* The whole of t into temp[p] of every local part, from slices some of which are on other
 * processes: each local part contributes its own slice in an otherwise zero whole copy, and
 * the copies are summed across every part: as F32, F16 or BF16 values for those types (a
 * value plus zeros is the value), any other type's bytes as 32-bit integers (exact). sl: t's
 * slot when it is a sliced weight (its slices packed), else NULL (slices of s in t's own
 * storage). temp[] gets buffers the caller frees. */
static enum bp_status assemble(struct run *r, const bp_tensor *t, const struct meta_slot *sl,
                               const struct bp_meta_split *s, bp_buffer **temp)
{
    char desc[BP_TENSOR_DESC_SIZE];
    if (!bp_is_contiguous(t))
        return bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s is split across processes and needed "
                            "whole; only contiguous tensors can be gathered across processes",
                            r->md->name, bp_describe_tensor(t, desc, sizeof(desc)));
    const bool floats = t->type == BP_TYPE_F32 || t->type == BP_TYPE_F16 ||
                        t->type == BP_TYPE_BF16;
    const size_t bytes = bp_nbytes(t), words = (bytes + 3) / 4;
    char *tmp = malloc(bp_row_size(t->type, t->ne[0]) + 64);
    bp_tensor *whole[BP_META_MAX_DEVICES] = {0};
    enum bp_status st = tmp == NULL ? bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory",
                                                   r->md->name)
                                    : BP_OK;
    for (int p = 0; p < r->n && st == BP_OK; p++) {
        if (!bp_meta_local(r->md, p))
            continue;
        temp[p] = bp_buffer_type_alloc(bp_device_get_buffer_type(r->md->parts[p]), words * 4);
        st = temp[p] != NULL ? bp_buffer_clear(temp[p], 0) : bp_last_status();
        if (st != BP_OK || s->sizes[p] == 0)
            continue;
        bp_tensor *from = sl ? bp_meta_packed_shadow(r->ctx, t, sl, p)
                             : bp_meta_shadow(r->ctx, r->md, t, s, p);
        if (from == NULL) {
            st = bp_last_status();
            break;
        }
        bp_tensor to = *from;
        if (sl != NULL) {
            to = bp_meta_slice_in_whole(t, sl, p, from, temp[p], bp_buffer_get_base(temp[p]));
        } else {
            to.buffer = temp[p];
            to.data = (char *)bp_buffer_get_base(temp[p]) +
                      ((char *)from->data - (char *)bp_meta_part_address(t, p));
        }
        st = bp_meta_copy_rows(from, &to, tmp);
    }
    /* What is summed: t's values, or its bytes as words. */
    for (int p = 0; p < r->n && st == BP_OK; p++) {
        if (!bp_meta_local(r->md, p))
            continue;
        whole[p] = floats ? bp_meta_shadow_at(r->ctx, t, &MIRROR, p, temp[p],
                                              bp_buffer_get_base(temp[p]))
                          : bp_new_tensor_1d(r->ctx, BP_TYPE_I32, (int64_t)words);
        if (whole[p] == NULL) {
            st = bp_last_status();
            break;
        }
        whole[p]->buffer = temp[p];
        whole[p]->data = bp_buffer_get_base(temp[p]);
    }
    free(tmp);
    if (st != BP_OK) /* this rank's failure, told at the collective the others are at */
        return tell_failure_st(r, t, st);
    const double t0 = now();
    st = r->mb->allreduce_checked(r->mb->comm, whole, r->n, BP_OK);
    r->mb->reduce_seconds += now() - t0;
    r->mb->reduce_bytes += bytes;
    return st;
}

/* SPLIT -> MIRRORED across processes: assembled in temporary whole copies, then copied into
 * t's own storage on every local part. */
static enum bp_status gather_ranked(struct run *r, const bp_tensor *t,
                                    const struct bp_meta_split *s)
{
    bp_buffer *temp[BP_META_MAX_DEVICES] = {0};
    enum bp_status st = assemble(r, t, NULL, s, temp);
    for (int p = 0; p < r->n && st == BP_OK; p++) {
        if (!bp_meta_local(r->md, p))
            continue;
        bp_tensor *whole = bp_meta_shadow_at(r->ctx, t, &MIRROR, p, temp[p],
                                             bp_buffer_get_base(temp[p]));
        bp_tensor *own = bp_meta_shadow(r->ctx, r->md, t, &MIRROR, p);
        st = whole && own ? bp_tensor_copy(whole, own) : bp_last_status();
    }
    for (int p = 0; p < r->n; p++)
        bp_buffer_free(temp[p]);
    return st;
}

/* SPLIT -> MIRRORED: every part receives every other part's slice. */
static enum bp_status gather(struct run *r, const bp_tensor *t, const struct bp_meta_split *s)
{
    if (r->md->ranked)
        return gather_ranked(r, t, s);
    char *tmp = malloc(bp_row_size(t->type, t->ne[0]) + 64);
    if (tmp == NULL)
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", r->md->name);
    enum bp_status st = BP_OK;
    for (int q = 0; q < r->n && st == BP_OK; q++) {
        if (s->sizes[q] == 0)
            continue;
        bp_tensor *from = bp_meta_shadow(r->ctx, r->md, t, s, q);
        for (int p = 0; p < r->n && st == BP_OK && from; p++) {
            if (p == q)
                continue;
            bp_tensor to = *from; /* part q's slice, placed in part p's memory */
            to.buffer = bp_meta_part_buffer(t, p);
            to.data = (char *)bp_meta_part_address(t, p) +
                      ((char *)from->data - (char *)bp_meta_part_address(t, q));
            st = bp_meta_copy_rows(from, &to, tmp);
        }
        if (from == NULL)
            st = bp_last_status();
    }
    free(tmp);
    return st;
}

/* full[p] += the copy of full[q] held in tmp[p], on part p's backend. */
static enum bp_status add_into(struct run *r, int p, bp_tensor *full, bp_tensor *tmp)
{
    bp_tensor *sum = bp_new_tensor_4d(r->ctx, full->type, full->ne[0], full->ne[1], full->ne[2],
                                      full->ne[3]);
    if (sum == NULL)
        return bp_last_status();
    sum->op = BP_OP_ADD;
    sum->src[0] = full;
    sum->src[1] = tmp;
    sum->buffer = full->buffer;
    sum->data = full->data; /* in place: element i reads and writes only element i */
    char desc[BP_TENSOR_DESC_SIZE];
    if (!bp_device_supports_op(bp_backend_get_device(r->mb->parts[p]), sum))
        return bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s cannot add up partial sums of %s",
                            r->md->name, bp_backend_get_name(r->mb->parts[p]),
                            bp_describe_tensor(full, desc, sizeof(desc)));
    bp_graph *g = bp_graph_new(8);
    if (g == NULL)
        return bp_last_status();
    enum bp_status st = bp_graph_build_forward(g, sum);
    if (st == BP_OK)
        st = bp_backend_graph_compute(r->mb->parts[p], g);
    bp_graph_free(g);
    sum->op = BP_OP_NONE; /* done: plain data from now on */
    sum->src[0] = sum->src[1] = NULL;
    return st;
}

/* Sums full[0..n) in place without collectives: fold the parts beyond the largest power of two
 * m onto the first ones, butterfly over m (at step s, part p adds part p ^ s's value), copy the
 * result back out to the folded parts. Copies go device to device (or through the host, as
 * bp_tensor_copy does for the pair); the adds are ADD graphs on each part's own backend. */
static enum bp_status butterfly(struct run *r, bp_tensor *const *full)
{
    const int n = r->n;
    int m = 1;
    while (m * 2 <= n)
        m *= 2;
    const size_t bytes = bp_nbytes(full[0]);
    bp_buffer *tbuf[BP_META_MAX_DEVICES] = {0};
    bp_tensor *tmp[BP_META_MAX_DEVICES] = {0};
    enum bp_status st = BP_OK;
    for (int p = 0; p < m && st == BP_OK; p++) {
        bp_buffer_type *bt = bp_device_get_buffer_type(r->md->parts[p]);
        tbuf[p] = bp_buffer_type_alloc(bt, bytes);
        tmp[p] = tbuf[p] ? bp_new_tensor_4d(r->ctx, full[p]->type, full[p]->ne[0], full[p]->ne[1],
                                            full[p]->ne[2], full[p]->ne[3])
                         : NULL;
        if (tmp[p] == NULL) {
            st = bp_last_status();
            break;
        }
        tmp[p]->buffer = tbuf[p];
        tmp[p]->data = bp_buffer_get_base(tbuf[p]);
    }
    for (int p = m; p < n && st == BP_OK; p++) { /* fold */
        st = bp_tensor_copy(full[p], tmp[p - m]);
        if (st == BP_OK)
            st = add_into(r, p - m, full[p - m], tmp[p - m]);
    }
    for (int step = 1; step < m && st == BP_OK; step *= 2) {
        for (int p = 0; p < m && st == BP_OK; p++) /* every copy before any add of this step */
            st = bp_tensor_copy(full[p ^ step], tmp[p]);
        for (int p = 0; p < m && st == BP_OK; p++)
            st = add_into(r, p, full[p], tmp[p]);
    }
    for (int p = m; p < n && st == BP_OK; p++) /* unfold */
        st = bp_tensor_copy(full[p - m], full[p]);
    for (int p = 0; p < m; p++)
        bp_buffer_free(tbuf[p]);
    return st;
}

/* PARTIAL -> MIRRORED: the parts' summands are added up on every part. */
static enum bp_status allreduce(struct run *r, const bp_tensor *t)
{
    const double t0 = now();
    enum bp_status st = BP_OK;
    bp_tensor *full[BP_META_MAX_DEVICES];
    if (!make_shadows(r, t, &MIRROR, full))
        return bp_last_status();
    char desc[BP_TENSOR_DESC_SIZE];
    if (!bp_is_contiguous(t))
        st = bp_set_error(BP_ERR_UNSUPPORTED, "%s: cannot add up partial sums of the "
                          "non-contiguous tensor %s", r->md->name,
                          bp_describe_tensor(t, desc, sizeof(desc)));
    else if (r->md->ranked)
        st = r->mb->allreduce_checked(r->mb->comm, full, r->n, r->failed);
    else if (r->mb->comm != NULL && t->type == BP_TYPE_F32)
        st = r->mb->allreduce(r->mb->comm, full, r->n);
    else
        st = butterfly(r, full);
    r->mb->reduce_seconds += now() - t0;
    r->mb->n_reduces++;
    r->mb->reduce_bytes += bp_nbytes(t);
    return st;
}

/* The shadows of t in state want (converting t's data first when needed). */
static enum bp_status need(struct run *r, const bp_tensor *t, const struct bp_meta_split *want,
                           bp_tensor **out)
{
    if (bp_meta_inside_slices(t))
        return bp_meta_refuse_inside_slices(r->md, t, "a computation");
    struct record *rec = rec_of(r, t);
    if (rec == NULL)
        return bp_last_status();
    const struct meta_slot *sl = bp_meta_sliced_slot(t);
    if (sl != NULL && !bp_meta_same_state(&sl->s, want, r->n)) {
        /* Stored in slices, wanted otherwise: whole copies for this run, then any state of
         * those is a view of them. */
        if (r->md->ranked && r->failed != BP_OK && rec->temp[bp_meta_first_local(r->md)] == NULL)
            return tell_failure(r, t);
        if (rec->temp[bp_meta_first_local(r->md)] == NULL) {
            enum bp_status st = unslice(r, rec);
            if (st != BP_OK)
                return st;
        }
        for (int p = 0; p < r->n; p++) {
            out[p] = bp_meta_local(r->md, p)
                         ? bp_meta_shadow_at(r->ctx, t, want, p, rec->temp[p],
                                             bp_buffer_get_base(rec->temp[p]))
                         : NULL;
            if (out[p] == NULL && bp_meta_local(r->md, p))
                return bp_last_status();
        }
        return BP_OK;
    }
    if (bp_meta_same_state(&rec->s, want, r->n) && rec->sh[bp_meta_first_local(r->md)] != NULL) {
        memcpy(out, rec->sh, (size_t)r->n * sizeof(*out));
        return BP_OK;
    }
    if (!bp_meta_same_state(&rec->s, want, r->n) && rec->s.state != BP_META_MIRRORED) {
        /* Bring it to MIRRORED: that needs t's finished data. A rank that has failed goes
         * to the collective only, to tell the others. */
        if (r->failed != BP_OK)
            return tell_failure(r, t);
        enum bp_status st = flush(r);
        if (st != BP_OK && r->md->ranked) {
            r->failed = st;
            return tell_failure(r, t);
        }
        if (st == BP_OK)
            st = rec->s.state == BP_META_SPLIT ? gather(r, t, &rec->s) : allreduce(r, t);
        if (st != BP_OK) {
            r->told = r->md->ranked; /* a collective failed: every rank knows */
            return st;
        }
        rec->s = MIRROR;
        if (!make_shadows(r, t, &MIRROR, rec->sh))
            return bp_last_status();
    }
    if (bp_meta_same_state(&rec->s, want, r->n)) {
        if (rec->sh[bp_meta_first_local(r->md)] == NULL && !make_shadows(r, t, want, rec->sh))
            return bp_last_status();
        memcpy(out, rec->sh, (size_t)r->n * sizeof(*out));
        return BP_OK;
    }
    /* MIRRORED data sliced as wanted: free, the data is on every part. */
    return make_shadows(r, t, want, out) ? BP_OK : bp_last_status();
}

/* ---- Deciding states --------------------------------------------------------------------- */

static bool is_weight(const bp_tensor *t)
{
    const bp_tensor *owner = t->view_src ? t->view_src : t;
    return owner->buffer != NULL && bp_buffer_get_usage(owner->buffer) == BP_BUFFER_USAGE_WEIGHTS;
}

/* Decides the states of node's sources and result (meta-rules.c) from the states its sources
 * are in: want[k] for each source. A product with a weight stored whole first asks the user's
 * split policy; an invalid answer is the only way this fails. */
static enum bp_status decide(struct run *r, const bp_tensor *node,
                             struct bp_meta_split want[BP_MAX_SRC], struct bp_meta_split *out)
{
    struct bp_meta_rule_in in = {.node = node, .n = r->n};
    for (int k = 0; k < BP_MAX_SRC; k++) {
        const struct record *rec = node->src[k] != NULL ? rec_of(r, node->src[k]) : NULL;
        if (node->src[k] != NULL && rec == NULL)
            return bp_last_status();
        in.src[k] = rec != NULL ? rec->s : MIRROR;
    }
    in.src0_weight = node->src[0] != NULL && is_weight(node->src[0]);
    if (bp_meta_rules_ask_policy(&in)) {
        struct bp_meta_split u;
        bool given;
        const enum bp_status st = bp_meta_ask_split(r->md, node->src[0], &u, &given);
        if (st != BP_OK)
            return st;
        if (given && u.state == BP_META_SPLIT)
            in.src[0] = u;
    }
    struct bp_meta_decision d;
    if (bp_meta_rules_decide(&in, &d) == BP_META_RULE_INVALID) {
        char desc[BP_TENSOR_DESC_SIZE];
        return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s: %s", r->md->name,
                            bp_describe_tensor(node, desc, sizeof(desc)), d.reason);
    }
    memcpy(want, d.want, sizeof(d.want));
    *out = d.out;
    return BP_OK;
}

/* ---- The graph --------------------------------------------------------------------------- */

/* A CONT/DUP that changes the shape of a split source writes a slice of its contiguous result
 * that is not a box in the result's own shape (heads [h0, h1) of [head_dim, n_head, T] are a
 * strided set of columns of [n_embd, T]). Backends copy that as a same-shape copy instead: the
 * destination is the result's memory seen in the source's shape, sliced like the source. */
static bool reshaping_copy(const bp_tensor *node, const struct bp_meta_split *in,
                           const struct bp_meta_split *out)
{
    return (node->op == BP_OP_CONT || node->op == BP_OP_DUP) && in->state == BP_META_SPLIT &&
           out->state == BP_META_SPLIT && !bp_are_same_shape(node->src[0], node) &&
           bp_is_contiguous(node) && bp_type_block_size(node->type) == 1 &&
           node->type == node->src[0]->type;
}

static bp_tensor *regroup_target(struct run *r, const bp_tensor *node,
                                 const struct bp_meta_split *in, const bp_tensor *src_part, int p)
{
    const bp_tensor *a = node->src[0];
    bp_tensor *t = bp_new_tensor_4d(r->ctx, node->type, src_part->ne[0], src_part->ne[1],
                                    src_part->ne[2], src_part->ne[3]);
    if (t == NULL)
        return NULL;
    size_t nb[4];
    nb[0] = bp_type_size(node->type);
    for (int d = 1; d < 4; d++)
        nb[d] = nb[d - 1] * (size_t)a->ne[d - 1];
    memcpy(t->nb, nb, sizeof(nb));
    memcpy(t->name, node->name, sizeof(t->name));
    t->buffer = bp_meta_part_buffer(node, p);
    t->data = (char *)bp_meta_part_address(node, p) +
              (size_t)bp_meta_split_start(in, p) * nb[in->axis];
    return t;
}

/* Checks that every node of g is in one of md's buffers and gives every tensor involved its
 * storage on the parts (buffers get theirs at first use). */
static enum bp_status prepare_graph(struct meta_dev *md, bp_graph *g)
{
    const int nn = bp_graph_get_n_nodes(g), nl = bp_graph_get_n_leafs(g);
    enum bp_status st = BP_OK;
    for (int i = 0; i < nn; i++) {
        const bp_tensor *t = bp_graph_get_node(g, i);
        char desc[BP_TENSOR_DESC_SIZE];
        if (t->buffer == NULL || bp_buffer_get_type(t->buffer) != md->buft)
            return bp_set_error(BP_ERR_INVALID_ARG, "%s: %s node %s is not in one of its "
                                "buffers", md->name, bp_op_name(t->op),
                                bp_describe_tensor(t, desc, sizeof(desc)));
    }
    for (int i = 0; i < nn + nl && st == BP_OK; i++) {
        const bp_tensor *t = i < nn ? bp_graph_get_node(g, i) : bp_graph_get_leaf(g, i - nn);
        for (int k = -1; k < BP_MAX_SRC && st == BP_OK; k++) {
            const bp_tensor *u = k < 0 ? t : t->src[k];
            if (u != NULL && u->buffer != NULL && bp_buffer_get_type(u->buffer) == md->buft)
                st = bp_meta_prepare(u);
        }
    }
    return st;
}

/* One node: decides its states, converts its sources, and queues its shadow on every part (a
 * view computes nothing: its shadows already point at its data). */
static enum bp_status compute_node(struct run *r, bp_tensor *node)
{
    if (bp_meta_inside_slices(node)) /* (a view into a sliced weight: no part can address it) */
        return bp_meta_refuse_inside_slices(r->md, node, bp_op_name(node->op));
    struct bp_meta_split want[BP_MAX_SRC], out;
    enum bp_status st = decide(r, node, want, &out);
    bp_tensor *srcs[BP_MAX_SRC][BP_META_MAX_DEVICES] = {{0}};
    for (int k = 0; k < BP_MAX_SRC && st == BP_OK; k++) {
        if (node->src[k] != NULL)
            st = need(r, node->src[k], &want[k], srcs[k]);
    }
    if (st != BP_OK)
        return st;
    struct record *rec = rec_of(r, node);
    if (rec == NULL)
        return bp_last_status();
    rec->s = out;
    if (r->failed != BP_OK) /* failed: the states go on as everywhere, nothing is computed */
        return r->failed;
    if (!make_shadows(r, node, &out, rec->sh))
        return bp_last_status();
    if (bp_op_is_view(node->op))
        return BP_OK;
    const bool regroup = reshaping_copy(node, &want[0], &out);
    for (int p = 0; p < r->n; p++) {
        if (!bp_meta_local(r->md, p))
            continue; /* its process computes it */
        bp_tensor *sh = regroup ? regroup_target(r, node, &want[0], srcs[0][p], p) : rec->sh[p];
        if (sh == NULL)
            return bp_last_status();
        sh->op = node->op;
        const bp_tensor *own_layout = NULL; /* a weight slice in a layout of the part's own */
        for (int k = 0; k < BP_MAX_SRC; k++) {
            sh->src[k] = srcs[k][p];
            if (sh->src[k] != NULL && sh->src[k]->buffer != NULL &&
                bp_buffer_get_type(sh->src[k]->buffer) !=
                    bp_device_get_buffer_type(r->md->parts[p]) &&
                bp_meta_sliced_slot(node->src[k]) != NULL)
                own_layout = sh->src[k];
        }
        if (own_layout != NULL && !bp_device_supports_op(r->md->parts[p], sh)) {
            char desc[BP_TENSOR_DESC_SIZE];
            return bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s %s: part %d (%s) holds its slice of "
                                "a source in a layout of its own (%s), which it cannot compute "
                                "this op from; BP_META_NO_REPACK=1 keeps slices plain",
                                r->md->name, bp_op_name(node->op),
                                bp_describe_tensor(node, desc, sizeof(desc)), p,
                                bp_device_get_name(r->md->parts[p]),
                                bp_buffer_type_get_name(bp_buffer_get_type(own_layout->buffer)));
        }
        if (!queue(r, p, sh))
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", r->md->name);
    }
    return BP_OK;
}

/* Remembers what each tensor holds, so reads gather, sum or pick accordingly (a sliced weight
 * stays what its storage is). */
static enum bp_status remember_states(struct run *r)
{
    const void *key;
    void *val;
    for (size_t i = 0; bp_meta_ptab_next(&r->recs, &i, &key, &val);) {
        const struct record *rec = val;
        if (bp_meta_sliced_slot(rec->t) == NULL &&
            !bp_meta_state_set(&r->md->states, rec->t, &rec->s))
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", r->md->name);
    }
    return BP_OK;
}

/* The nodes of g with parts on other processes. A failure on this rank does not stop it at
 * once: it walks on without computing to the next collective and takes part as failed there,
 * so that every rank stops at that collective with an error. Outputs are gathered on every
 * rank at the end (a caller reads them from this rank's parts), and a last collective checks
 * that every rank finished well. */
static enum bp_status compute_ranked(struct run *r, bp_graph *g, enum bp_status st)
{
    const int nn = bp_graph_get_n_nodes(g);
    r->failed = st;
    for (int i = 0; i < nn && !r->told; i++) {
        st = compute_node(r, bp_graph_get_node(g, i));
        if (st != BP_OK && !r->told && r->failed == BP_OK)
            r->failed = st;
    }
    for (int i = 0; i < nn && !r->told; i++) {
        bp_tensor *t = bp_graph_get_node(g, i);
        bp_tensor *sh[BP_META_MAX_DEVICES];
        if (t->flags & BP_TENSOR_FLAG_OUTPUT) {
            st = need(r, t, &MIRROR, sh);
            if (st != BP_OK && !r->told && r->failed == BP_OK)
                r->failed = st;
        }
    }
    if (!r->told) {
        if (r->failed == BP_OK && (st = flush(r)) != BP_OK)
            r->failed = st;
        float x = 0;
        bp_buffer *hb = bp_buffer_from_host_ptr(&x, sizeof(x));
        bp_tensor *one = hb && r->ctx ? bp_new_tensor_1d(r->ctx, BP_TYPE_F32, 1) : NULL;
        bp_tensor *ts[BP_META_MAX_DEVICES] = {0};
        if (one != NULL) {
            one->buffer = hb;
            one->data = &x;
            for (int p = 0; p < r->n; p++)
                ts[p] = bp_meta_local(r->md, p) ? one : NULL;
            st = r->mb->allreduce_checked(r->mb->comm, ts, r->n, r->failed);
        } else {
            st = r->failed != BP_OK ? r->failed : bp_last_status();
        }
        bp_buffer_free(hb);
        return st;
    }
    return r->failed != BP_OK ? r->failed : st;
}

enum bp_status bp_meta_graph_compute(struct meta_backend *mb, bp_graph *g)
{
    struct run r = {.mb = mb, .md = mb->md, .n = mb->md->n};
    const int nn = bp_graph_get_n_nodes(g), nl = bp_graph_get_n_leafs(g);
    enum bp_status st = prepare_graph(mb->md, g);
    if (st != BP_OK)
        return st;
    /* Room for a record of every tensor of the graph from the start. */
    bp_meta_ptab_init(&r.recs, sizeof(struct record));
    const bool reserved = bp_meta_ptab_reserve(&r.recs, 2 * (size_t)(nn + nl + 1));
    r.ctx = bp_context_new((size_t)(nn + nl + 8) * (size_t)r.n * (BP_MAX_SRC + 3) + 64);
    if (!reserved || r.ctx == NULL)
        st = bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", mb->md->name);
    if (mb->md->ranked)
        st = compute_ranked(&r, g, st);
    else
        for (int i = 0; i < nn && st == BP_OK; i++)
            st = compute_node(&r, bp_graph_get_node(g, i));
    if (st == BP_OK)
        st = flush(&r);
    if (st == BP_OK)
        st = remember_states(&r);
    const void *key;
    void *val;
    for (size_t i = 0; bp_meta_ptab_next(&r.recs, &i, &key, &val);)
        for (int p = 0; p < r.n; p++)
            bp_buffer_free(((struct record *)val)->temp[p]);
    for (int p = 0; p < r.n; p++)
        free(r.pending[p]);
    bp_context_free(r.ctx);
    bp_meta_ptab_close(&r.recs);
    return st;
}

