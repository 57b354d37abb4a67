/* meta-impl.h - private to plugins/meta: what the meta plugin's files share. */
#ifndef BP_META_IMPL_H
#define BP_META_IMPL_H

#include <pthread.h>

#include <backplane/bp-comm.h>
#include <backplane/bp-meta.h>
#include <backplane/bp-plugin.h>

/* The state a tensor had after the last computation, for reading it back. */
struct meta_entry {
    const bp_tensor *t;
    const bp_buffer *buffer; /* where t was when the state was set: a later tensor at the same */
    const void *data;        /* address, or t moved elsewhere, does not inherit the state */
    struct bp_meta_split s;
};

struct meta_dev {
    char name[256];
    char description[512];
    int n;
    bp_device *parts[BP_META_MAX_DEVICES];
    bp_meta_split_fn split_fn;
    void *split_user;
    bp_device *dev;
    bp_buffer_type *buft;
    /* tensor -> state, open addressing; states of tensors not listed are MIRRORED */
    struct meta_entry *states;
    size_t states_size;
    size_t states_used;
};

struct meta_buf {
    struct meta_dev *md;
    bp_buffer *parts[BP_META_MAX_DEVICES];
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
    bp_comm *comm; /* when every part is of one registry that has collectives */
    bp_comm_allreduce_fn allreduce;
    bp_comm_free_fn comm_free;
    struct meta_worker workers[BP_META_MAX_DEVICES];
    double reduce_seconds; /* time spent in all-reduces, for benchmarks */
    int n_reduces;
};

/* meta-plugin.c */
void *meta_part_address(const bp_tensor *t, int part);
bp_buffer *meta_part_buffer(const bp_tensor *t, int part);
const struct bp_meta_split *meta_state_get(struct meta_dev *md, const bp_tensor *t);
bool meta_state_set(struct meta_dev *md, const bp_tensor *t, const struct bp_meta_split *s);
/* Drops the states of tensors in buf (freed or cleared: its data is the same on every part). */
void meta_states_forget(struct meta_dev *md, const bp_buffer *buf);

/* meta-compute.c */
enum bp_status meta_graph_compute(struct meta_backend *mb, bp_graph *g);
/* Ends and joins the backend's worker threads. */
void meta_workers_stop(struct meta_backend *mb);
/* Reads bytes [offset, offset + size) of t as the value its state represents. */
enum bp_status meta_read(struct meta_dev *md, const bp_tensor *t, void *data, size_t offset,
                         size_t size);

#endif
