/* meta-impl.h - private to plugins/meta/: what the meta plugin's files share. */
#ifndef BP_META_IMPL_H
#define BP_META_IMPL_H

#include <pthread.h>

#include <backplane/bp-comm.h>
#include <backplane/bp-meta.h>
#include <backplane/bp-plugin.h>

#include "meta-state.h"

struct meta_dev {
    char *name; /* "Meta(A,B,...)", heap: the parts' names have no length limit */
    char description[512];
    int n;
    /* Parts on another process ("DEVICE@RANK", docs/distributed.md) have no device here:
     * parts[p] is NULL, rank[p] says where it is; nothing of theirs is stored or computed on
     * this rank, and conversions that involve them go through the cross-rank communicator. */
    bp_device *parts[BP_META_MAX_DEVICES];
    int rank[BP_META_MAX_DEVICES];
    bool ranked; /* some part is on another process */
    bp_meta_split_fn split_fn;
    void *split_user;
    bp_device *dev;
    bp_buffer_type *buft;
    struct bp_meta_states states; /* tensor -> state after the last computation (meta-state.c) */
};

/* How one weight is stored in a weights buffer (usage BP_BUFFER_USAGE_WEIGHTS): a buffer of its
 * own on every part, holding the whole tensor, or - when the split callback gave it a split
 * when it was first written - only that part's slice, packed (docs/meta.md, "Memory"). */
struct meta_slot {
    const char *data; /* where the tensor is in the meta buffer's address range */
    size_t nbytes;
    bool sliced;
    struct bp_meta_split s; /* sliced: the split it is stored in */
    enum bp_type type;      /* the weight's type and shape, for its slices' descriptions */
    int64_t ne[BP_MAX_DIMS];
    bp_buffer *part[BP_META_MAX_DEVICES]; /* NULL for parts on another process */
    size_t part_bytes[BP_META_MAX_DEVICES]; /* what each part holds (also those elsewhere) */
};

/* A meta buffer stands for an address range it reserves (no memory). Its storage on the parts
 * is made at first use: for a weights buffer, one slot per tensor; for any other buffer, one
 * buffer of the full size per part ("materialised"), with the same layout as the range. */
struct meta_buf {
    struct meta_dev *md;
    char *reserve;
    size_t size, reserve_size;
    bool materialized;
    bp_buffer *parts[BP_META_MAX_DEVICES]; /* materialised */
    struct meta_slot *slots;               /* weights buffers, sorted by data */
    size_t n_slots, cap_slots;
};

/* A thread that runs one part's graphs for a part whose compute blocks the caller. */
struct meta_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state; /* WORKER_IDLE, WORKER_BUSY, WORKER_QUIT (meta-compute.c) */
    void *job;
    bool running; /* thread, mutex and condition exist */
};

struct meta_backend {
    struct meta_dev *md;
    bp_backend *parts[BP_META_MAX_DEVICES];
    bool async[BP_META_MAX_DEVICES]; /* compute returns before the work is done */
    bp_comm *comm; /* when every part is of one registry that has collectives, or across
                    * processes (the MPI registry's, over every part) */
    bp_comm_allreduce_fn allreduce;
    bp_comm_allreduce_checked_fn allreduce_checked; /* across processes */
    bp_comm_free_fn comm_free;
    struct meta_worker workers[BP_META_MAX_DEVICES];
    double reduce_seconds; /* time spent in all-reduces, for benchmarks */
    int n_reduces;
    size_t reduce_bytes; /* bytes of the tensors all-reduced (gathers across processes too) */
};

/* Whether part p is on this process (its device and backend are here). */
static inline bool bp_meta_local(const struct meta_dev *md, int p)
{
    return md->parts[p] != NULL;
}

/* The first part on this process (every meta device has one). */
static inline int bp_meta_first_local(const struct meta_dev *md)
{
    int p = 0;
    while (p < md->n - 1 && md->parts[p] == NULL)
        p++;
    return p;
}

/* meta-buffer.c */
/* Where t's data lives on part `part`. For a sliced weight that is the part's packed slice. */
void *bp_meta_part_address(const bp_tensor *t, int part);
bp_buffer *bp_meta_part_buffer(const bp_tensor *t, int part);
/* Makes sure t has storage on the parts (materialises its buffer, or gives a weight without
 * one a zeroed whole slot). */
enum bp_status bp_meta_prepare(const bp_tensor *t);
/* The slot of a sliced weight whose data t is (t itself or a same-address view), else NULL. */
const struct meta_slot *bp_meta_sliced_slot(const bp_tensor *t);
/* Whether t lies in a sliced weight's storage without being that weight (a view at another
 * address, or of another shape): no part's packed slice can hold it as it is. */
bool bp_meta_inside_slices(const bp_tensor *t);
/* BP_ERR_UNSUPPORTED for such a t, saying `what` (an op, "a read") cannot use it. */
enum bp_status bp_meta_refuse_inside_slices(const struct meta_dev *md, const bp_tensor *t,
                                            const char *what);
/* Asks md's split callback how weight w is split and checks the answer (docs/meta.md,
 * "Overriding the policy"). BP_OK with *given true and *out filled when the callback chose a
 * split or MIRRORED; BP_OK with *given false when there is no callback or it left the choice to
 * the default policy; an error naming w, the axis and the sizes when the answer is invalid. */
enum bp_status bp_meta_ask_split(struct meta_dev *md, const bp_tensor *w,
                                 struct bp_meta_split *out, bool *given);
/* Shadows: t as part p sees it, a tensor made in ctx (owned by ctx) over the part's memory.
 * In state s, laid out like t in (buf, base): sliced when s is SPLIT. */
bp_tensor *bp_meta_shadow_at(bp_context *ctx, const bp_tensor *t, const struct bp_meta_split *s,
                             int p, bp_buffer *buf, void *base);
/* Part p's packed slice of a sliced weight: rows of the slice's own width. */
bp_tensor *bp_meta_packed_shadow(bp_context *ctx, const bp_tensor *t, const struct meta_slot *sl,
                                 int p);
/* In state s on t's own storage; NULL with the error set when t is stored in slices of another
 * split. */
bp_tensor *bp_meta_shadow(bp_context *ctx, const struct meta_dev *md, const bp_tensor *t,
                          const struct bp_meta_split *s, int p);
/* Copies src's elements into dst (same shape, each with its own strides) through tmp, a host
 * buffer of at least one row of src. */
enum bp_status bp_meta_copy_rows(const bp_tensor *src, bp_tensor *dst, char *tmp);
/* Where part p's slice (packed) of a sliced weight t sits in a whole copy of t at (buf, base). */
bp_tensor bp_meta_slice_in_whole(const bp_tensor *t, const struct meta_slot *sl, int p,
                                 const bp_tensor *packed, bp_buffer *buf, char *base);
/* Bytes buf (a meta buffer) holds on its part `part`. */
size_t bp_meta_buffer_bytes_on(bp_buffer *buf, int part);
/* md's buffer type (bp_buffer_type_new: owned by md's device). */
bp_buffer_type *bp_meta_buffer_type_new(struct meta_dev *md);

/* meta-compute.c */
enum bp_status bp_meta_graph_compute(struct meta_backend *mb, bp_graph *g);
/* Ends and joins the backend's worker threads. */
void bp_meta_workers_stop(struct meta_backend *mb);

#endif
