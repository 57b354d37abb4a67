/* bp-alloc.h - placing tensors in buffers: the linear allocator and the graph allocator. */
#ifndef BACKPLANE_BP_ALLOC_H
#define BACKPLANE_BP_ALLOC_H

#include <backplane/bp-backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Linear allocator: places tensors one after another (aligned) in one buffer. The caller owns
 * the buffer; the allocator is a plain struct on the caller's stack. */
struct bp_tallocr {
    bp_buffer *buffer;
    size_t alignment;
    size_t offset;
};

BP_API struct bp_tallocr bp_tallocr_init(bp_buffer *buffer);
/* Places t (not a view) at the next aligned offset; BP_ERR_OUT_OF_MEMORY when it does not fit. */
BP_API enum bp_status bp_tallocr_alloc(struct bp_tallocr *ta, bp_tensor *t);

/* Allocates one buffer of type buft for every tensor of ctx that has no memory yet, places
 * them, and points their views at them. Caller frees the buffer with bp_buffer_free (the tensors
 * then dangle). A context with nothing to place gives a zero-sized buffer. */
BP_API bp_buffer *bp_alloc_ctx_tensors(bp_context *ctx, bp_buffer_type *buft);
/* The same in the backend's default buffer type. */
BP_API bp_buffer *bp_alloc_ctx_tensors_for_backend(bp_context *ctx, bp_backend *backend);

/*
 * Graph allocator: gives every node and leaf of a graph that has no memory yet an address in
 * one compute buffer per buffer type, so that tensors whose lifetimes do not overlap share
 * memory. Leafs, inputs and outputs (BP_TENSOR_FLAG_INPUT/OUTPUT) live for the whole graph; an
 * element-wise op may write over its source in place when nothing else needs the source.
 * Tensors already placed in a buffer the allocator does not own (weights) are left alone.
 */
typedef struct bp_gallocr bp_gallocr;

/* n buffer types; buffer type i is "buft id" i below. Caller frees with bp_gallocr_free. */
BP_API bp_gallocr *bp_gallocr_new(bp_buffer_type *const *bufts, int n);
/* One buffer type (id 0): the common case. */
BP_API bp_gallocr *bp_gallocr_new_1(bp_buffer_type *buft);
BP_API void bp_gallocr_free(bp_gallocr *ga); /* frees its buffers too */

/* Sizes the buffers for a worst-case graph, allocating them now, so later graphs no larger than
 * it are placed without reallocating. node_ids/leaf_ids give each node/leaf its buft id (NULL:
 * all 0). */
BP_API enum bp_status bp_gallocr_reserve(bp_gallocr *ga, bp_graph *graph, const int *node_ids,
                                         const int *leaf_ids);
/* bp_gallocr_reserve with every node and leaf in buft id 0. */
BP_API enum bp_status bp_gallocr_reserve_1(bp_gallocr *ga, bp_graph *graph);
/* Places the graph's tensors, growing a buffer first if this graph needs more than was
 * reserved (bp_gallocr_get_n_reallocs counts those). */
BP_API enum bp_status bp_gallocr_alloc_graph(bp_gallocr *ga, bp_graph *graph, const int *node_ids,
                                             const int *leaf_ids);
/* bp_gallocr_alloc_graph with every node and leaf in buft id 0. */
BP_API enum bp_status bp_gallocr_alloc_graph_1(bp_gallocr *ga, bp_graph *graph);
/* Size of the compute buffer of buft id i (0 before the first reserve/alloc). */
BP_API size_t bp_gallocr_get_buffer_size(bp_gallocr *ga, int id);
/* How many times alloc_graph had to grow a buffer beyond what reserve sized. */
BP_API int bp_gallocr_get_n_reallocs(bp_gallocr *ga);

#ifdef __cplusplus
}
#endif

#endif
