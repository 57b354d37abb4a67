/* sched-impl.h - private to runtime/: the scheduler's state, shared by sched.c (assignment,
 * splits, copies, compute) and sched-query.c (queries, control, the DOT picture). */
#ifndef BP_SCHED_IMPL_H
#define BP_SCHED_IMPL_H

#include <stdatomic.h>

#include "backend-impl.h"
#include "ptrmap.h"
#include <backplane/bp-alloc.h>
#include <backplane/bp-sched.h>

enum why {
    WHY_NONE = 0,
    WHY_PINNED,
    WHY_BUFFER,
    WHY_INPUT,
    WHY_WEIGHTS,
    WHY_OFFLOAD,
    WHY_EXPAND_ACCEL,
    WHY_EXPAND_ANY,
    WHY_UPGRADE,
    WHY_MOST_INPUTS,
    WHY_FIRST_SUPPORTING,
    WHY_CONSUMER,
    WHY_VIEW_SOURCE,
    WHY_COPY,
};



/* What the scheduler knows of one tensor; s->map gives its index in s->infos. */
struct tinfo {
    signed char backend;
    unsigned char why;
    unsigned short sup_known, sup; /* supports_op answers per backend, asked at most once */
    short copy[BP_SCHED_MAX_BACKENDS]; /* index + 1 into sched->copies, 0: none */
};

struct copy_set {
    bp_tensor *src;
    int backend;
    bp_tensor *t[BP_SCHED_MAX_COPIES];
};

struct split {
    int backend;
    int i0, i1; /* nodes [i0, i1) of the graph */
    int n_inputs;
    bp_tensor *inputs[BP_SCHED_MAX_SPLIT_INPUTS];
    bp_graph *graph;
};

struct subst {
    bp_tensor *node;
    int slot;
    bp_tensor *orig;
};

struct pin {
    const bp_tensor *t;
    int backend;
};

struct bp_sched {
    _Atomic bool busy; /* a call is in progress: another thread's call is refused (BP_ERR_BUSY) */
    int n_backends;
    bp_backend *backends[BP_SCHED_MAX_BACKENDS];
    bp_buffer_type *bufts[BP_SCHED_MAX_BACKENDS];
    bool pinned[BP_SCHED_MAX_BACKENDS]; /* bufts[i] is another device's host type default_buft
                                         * chose, given up when it cannot be allocated */
    bp_gallocr *galloc;
    bool parallel;
    bool used_experts; /* copy only the experts MUL_MAT_ID's ids choose (sched-experts.c) */
    int expert_slots;  /* and through caches of this many experts per tensor and device */
    struct bp__expert_caches *expert_caches;
    struct prediction {
        const bp_tensor *experts, *ids; /* bp_sched_predict_experts */
        bool issued;                    /* acted on in the compute under way */
        uint64_t gen;                   /* made and user are of this split_gen's splits */
        int made, user; /* the split computing ids and the first after it copying experts */
    } *preds;
    uint64_t split_gen; /* counts the times the graph was split (0: never) */
    int n_preds;
    size_t cap_preds;
    struct bp_sched_expert_stats expert_stats; /* of the last compute */
    size_t copied_bytes, expert_bytes_copied, expert_bytes_total; /* of the last compute */
    int n_copies;
    int cur_copy;
    bp_event *events[BP_SCHED_MAX_BACKENDS][BP_SCHED_MAX_COPIES];
    bool recorded[BP_SCHED_MAX_BACKENDS][BP_SCHED_MAX_COPIES];
    size_t graph_size;
    int debug;

    struct bp__ptrmap map; /* tensor -> index in infos; cleared in O(1) per split */
    struct tinfo *infos;   /* bp__ptrmap_limit(&map) entries */
    size_t cap_infos;
    bool overflow;  /* the table got too full during a split: grow it and split again */
    struct tinfo scratch;

    struct split *splits;
    int n_splits;
    size_t cap_splits;

    bp_context *ctx; /* metadata of the input copies */
    struct copy_set *copies;
    int n_copy_sets;
    size_t cap_copy_sets;

    bp_graph *graph; /* nodes of the user graph, leafs plus copies: what the allocator sees */
    bp_tensor **node_buf;
    bp_tensor **leaf_buf;
    int *node_ids;
    int *leaf_ids;
    size_t cap_node_buf, cap_leaf_buf, cap_node_ids, cap_leaf_ids;

    struct subst *subst;
    int n_subst;
    size_t cap_subst;

    struct pin *pins;
    int n_pins;
    size_t cap_pins;

    struct tinfo **node_ti; /* the table entry of each node of the graph being split */
    size_t cap_node_ti;

    bp_sched_eval_fn eval_fn;
    void *eval_user;
    bp_graph *direct; /* one backend: the user's graph is the split and the allocator's graph */
    const bp_graph *allocated; /* the graph alloc_graph was last called for, until computed */

    /* The graph last computed, still split and allocated: computing it again unchanged (the
     * same fingerprint) makes its source swaps again instead of splitting and allocating. */
    const bp_graph *kept;
    uint64_t kept_print;
    struct kept_subst {
        bp_tensor *node, *orig, *copy;
        int slot;
    } *kept_subst;
    int n_kept_subst;
    size_t cap_kept_subst;
};

/* sched.c's helpers for sched-query.c: a tensor's record (new on first mention), whether it has
 * one, a backend's index (-1: not the scheduler's), and entering and leaving a call (refused
 * with BP_ERR_BUSY while another thread is in one). */
struct tinfo *bp__sched_info(bp_sched *s, const bp_tensor *t);
bool bp__sched_known(const bp_sched *s, const bp_tensor *t);
int bp__sched_backend_index(const bp_sched *s, const bp_backend *be);
bool bp__sched_enter(bp_sched *s, const char *fn);
void bp__sched_leave(bp_sched *s);
/* Every backend waited for and the last graph's sources put back (before caches are freed). */
void bp__sched_quiet(bp_sched *s);

#endif
