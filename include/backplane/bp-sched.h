/* bp-sched.h - the scheduler: one graph split across several backends. */
#ifndef BACKPLANE_BP_SCHED_H
#define BACKPLANE_BP_SCHED_H

#include <stdio.h>

#include <backplane/bp-backend.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_SCHED_MAX_BACKENDS 16
#define BP_SCHED_MAX_COPIES 4        /* copies of split inputs with parallel = true */
#define BP_SCHED_MAX_SPLIT_INPUTS 30 /* a split needing more is cut again */

/* A scheduler is used by one thread at a time; a call that enters it while another thread's
 * call is in progress is refused with BP_ERR_BUSY (the threading rules are in bp-backend.h). */
typedef struct bp_sched bp_sched;

/*
 * Called before each node with ask = true: return true to observe that node. The scheduler then
 * computes up to and including it, waits, and calls again with ask = false; return false then to
 * stop the computation early (bp_sched_graph_compute returns BP_OK with the rest not computed).
 */
typedef bool (*bp_sched_eval_fn)(bp_tensor *t, bool ask, void *user_data);

/* backends in priority order; the last must be a CPU device. bufts: one buffer type per
 * backend, or NULL (the array or an entry) for the default: each backend's default buffer type,
 * except that a CPU backend uses the host buffer type of the first other device offering one it
 * can use (a GPU's pinned memory), so copies between them are asynchronous. graph_size: most
 * nodes of a graph it will see. parallel: pipeline graph evaluations (several copies of split
 * inputs, ordered by events). Caller frees with bp_sched_free (the backends stay the caller's). */
BP_API bp_sched *bp_sched_new(bp_backend *const *backends, bp_buffer_type *const *bufts, int n,
                              size_t graph_size, bool parallel);
BP_API void bp_sched_free(bp_sched *sched);

/* Sizes every backend's compute buffer for a worst-case graph. */
BP_API enum bp_status bp_sched_reserve(bp_sched *sched, bp_graph *measure_graph);
/* Assigns, splits and allocates graph (bp_sched_graph_compute does this itself when needed). */
BP_API enum bp_status bp_sched_alloc_graph(bp_sched *sched, bp_graph *graph);
/* Computes graph and waits for it. The graph computed last stays split and allocated: computing
 * it again unchanged (the same nodes and leafs, with the same sources, shapes, parameters, flags
 * and memory; only the data of inputs may differ) reuses that split and allocation instead of
 * making them again, until bp_sched_alloc_graph, bp_sched_reserve, bp_sched_reset or a pin. A
 * graph that changed, or any graph other than the one computed last, is split and allocated
 * again here, which may move its inputs: call bp_sched_alloc_graph first and then set the
 * inputs. The tensors the scheduler places point into its compute buffers, which it replaces
 * when a larger graph needs more and frees in bp_sched_free: a graph allocated before either
 * must be allocated again before its tensors are written or read, and after bp_sched_free it
 * can only be built anew (its tensors point at freed memory). A pipelined (parallel) scheduler
 * splits every time. */
BP_API enum bp_status bp_sched_graph_compute(bp_sched *sched, bp_graph *graph);
/* Queues graph; call bp_sched_synchronize before reading results. */
BP_API enum bp_status bp_sched_graph_compute_async(bp_sched *sched, bp_graph *graph);
BP_API enum bp_status bp_sched_synchronize(bp_sched *sched);
/* Forgets assignments and pins. */
BP_API void bp_sched_reset(bp_sched *sched);

/* Pins t to backend (one of the scheduler's) for the next graphs, until reset. */
BP_API enum bp_status bp_sched_set_tensor_backend(bp_sched *sched, bp_tensor *t,
                                                  bp_backend *backend);
/* The backend t was assigned in the last split graph; NULL when unknown. */
BP_API bp_backend *bp_sched_get_tensor_backend(bp_sched *sched, const bp_tensor *t);
BP_API int bp_sched_get_n_backends(bp_sched *sched);
BP_API bp_backend *bp_sched_get_backend(bp_sched *sched, int i);
BP_API int bp_sched_get_n_splits(bp_sched *sched);
/* Split i of the last split graph: the backend that runs it, and optionally how many graph
 * nodes it has and how many inputs are copied into it. NULL (BP_ERR_OUT_OF_BOUNDS) when there
 * is no split i. */
BP_API bp_backend *bp_sched_get_split_backend(bp_sched *sched, int i, int *n_nodes,
                                              int *n_inputs);
BP_API int bp_sched_get_n_copies(bp_sched *sched);
/* Bytes the last compute copied between backends (every split's inputs, and the experts the
 * prefetch loaded); with expert_bytes, of those the bytes of stacked expert weights read only
 * by MUL_MAT_ID (in part or whole), and with expert_bytes_whole what copying those tensors
 * whole would have taken. Zero before any compute (and for a NULL scheduler, with an error). */
BP_API size_t bp_sched_get_copied_bytes(bp_sched *sched, size_t *expert_bytes,
                                        size_t *expert_bytes_whole);
/* Stacked expert weights [K, M, n_expert] that a split reads only as src[0] of MUL_MAT_ID nodes
 * and that live on another backend: with on (the default), each compute copies only the experts
 * the nodes' ids choose, consecutive ones in one copy followed by the next expert's rows that
 * cover 512 bytes (so kernels reading a little past an expert find finite values); the
 * scheduler then waits for every backend once per such split to read the ids (a MUL_MAT_ID
 * whose ids its own split computes starts a new split). Off: the whole tensor, as any input. */
BP_API enum bp_status bp_sched_set_used_experts(bp_sched *sched, bool on);
/* An expert cache: for every stacked expert tensor copied as above, `slots` experts (at most
 * the tensor's) kept on the device of the backend that runs MUL_MAT_ID (in its default buffer
 * type, allocated at first use; none on a meta device; 0, the default: no cache). When the
 * experts a split's products use fit in the slots and their ids are in range, the products
 * read them there in place: for that compute their src[0] is the slots seen as a stack
 * [K, M, slots] and their src[2] the ids mapped to slots (an eval callback sees those). An
 * expert the cache holds costs nothing then (a hit); any other is copied from its source into
 * the least recently used slot this compute does not need (a miss). More experts than slots:
 * they are copied into the split's copy, hits from their slots within the device. The weights
 * must not change while cached; calling this again (or bp_sched_reset) waits for the backends
 * and empties every cache. Where a cache cannot be allocated the experts come from their
 * source, with a warning logged once. */
BP_API enum bp_status bp_sched_set_expert_cache(bp_sched *sched, int slots);
/* Prefetch: ids, a node of the graphs computed (I32, contiguous, like a MUL_MAT_ID's ids; mark
 * it an output, bp_set_output, so its memory is not reused before it is read), predicts which
 * experts of experts (stacked weights copied as bp_sched_set_used_experts describes) a later
 * MUL_MAT_ID will use: for instance the next layer's router applied to the current hidden
 * state, most likely first. At the first split boundary after the split computing ids (the
 * backends that made the ids and that will read the cache are waited for there), a copy thread
 * of the scheduler starts loading the predicted experts, in the order of the ids, into the
 * cache of the backend that will read them, while the graph computes on; that product then
 * finds them there. It needs an expert cache (bp_sched_set_expert_cache; without one a
 * prediction does nothing), fills at most the slots the current compute does not need, and
 * never changes results: a wrong prediction costs copies only, and a prediction that cannot
 * be acted on is skipped. When the product's experts are copied, the predicted ones not loaded
 * by then are dropped. Every compute waits at its end for the copy under way and drops the
 * jobs not started, so nothing is copied while the caller has control. A prediction stays
 * until replaced (the same experts again), removed (ids NULL) or bp_sched_reset; one whose ids
 * are not a node of the graph computed is ignored (only the pointer is compared). */
BP_API enum bp_status bp_sched_predict_experts(bp_sched *sched, const bp_tensor *experts,
                                               const bp_tensor *ids);
struct bp_sched_expert_stats {
    uint64_t hits, misses;    /* used experts a cache supplied, and copied from their source */
    size_t bytes_from_source; /* experts and their padding the computing thread copied between
                               * backends */
    size_t bytes_from_cache;  /* of used experts a cache supplied (read in place, or copied
                               * within the device) */
    uint64_t prefetched;      /* experts the copy thread loaded into caches (landed) */
    uint64_t prefetch_hits;   /* used experts found in a slot this compute's prefetches
                               * filled (at most prefetched) */
    size_t bytes_prefetched;  /* copied between backends by the copy thread */
    double copy_seconds;      /* the computing thread copying experts itself */
    double wait_seconds;      /* the computing thread waiting for the copy thread */
    double prefetch_seconds;  /* the copy thread copying (alongside the compute, but for the
                               * waits) */
};
/* What the last compute's expert copies did (zeros before any compute). */
BP_API enum bp_status bp_sched_get_expert_stats(bp_sched *sched,
                                                struct bp_sched_expert_stats *stats);
/* Bytes of backend's compute buffer (0 when it has none yet). */
BP_API size_t bp_sched_get_buffer_size(bp_sched *sched, bp_backend *backend);
/* The buffer type of backend's compute buffer (as bufts in bp_sched_new chose it); NULL when
 * backend is not one of the scheduler's. */
BP_API bp_buffer_type *bp_sched_get_buffer_type(bp_sched *sched, bp_backend *backend);
BP_API void bp_sched_set_eval_callback(bp_sched *sched, bp_sched_eval_fn fn, void *user_data);

/* Writes the last split graph as Graphviz DOT: one cluster per split, nodes coloured by backend,
 * copied inputs drawn as boxes. */
BP_API enum bp_status bp_sched_dump_dot(bp_sched *sched, bp_graph *graph, FILE *out);

#ifdef __cplusplus
}
#endif

#endif
