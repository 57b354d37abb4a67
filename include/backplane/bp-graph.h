/* bp-graph.h - computation graphs: the nodes reachable from some outputs, in execution order. */
#ifndef BACKPLANE_BP_GRAPH_H
#define BACKPLANE_BP_GRAPH_H

#include <backplane/bp-tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A graph lists tensors in topological order: every node comes after all of its sources.
 * "Leafs" are tensors that compute nothing (op NONE: weights, inputs, constants); "nodes" are
 * everything else, views included. Each tensor appears once. The graph points into the tensors'
 * contexts and owns only its arrays.
 */
typedef struct bp_graph bp_graph;

/* Room for up to capacity nodes and capacity leafs. Caller frees with bp_graph_free. */
BP_API bp_graph *bp_graph_new(size_t capacity);
BP_API void bp_graph_free(bp_graph *g);
/* Empties the graph, keeping its storage. */
BP_API void bp_graph_reset(bp_graph *g);

/* Adds out and everything it depends on that is not in the graph yet. On BP_ERR_CAPACITY
 * (or any other error) the graph is left exactly as it was before the call. */
BP_API enum bp_status bp_graph_build_forward(bp_graph *g, bp_tensor *out);

BP_API size_t bp_graph_get_capacity(const bp_graph *g);
BP_API int bp_graph_get_n_nodes(const bp_graph *g);
BP_API int bp_graph_get_n_leafs(const bp_graph *g);
/* i may be negative to count from the end (-1 is the last node). NULL when out of range. */
BP_API bp_tensor *bp_graph_get_node(const bp_graph *g, int i);
BP_API bp_tensor *bp_graph_get_leaf(const bp_graph *g, int i);
/* Whether t is in the graph, as a node or a leaf. */
BP_API bool bp_graph_contains(const bp_graph *g, const bp_tensor *t);
/* Number of node sources in g that are t (a node using t twice counts twice); 0 when none. */
BP_API int bp_graph_get_use_count(const bp_graph *g, const bp_tensor *t);
/* First node or leaf with this name, NULL (no error) when none. */
BP_API bp_tensor *bp_graph_find(const bp_graph *g, const char *name);

/* A new graph holding nodes [i0, i1) of g (and the same leafs), for running part of a graph.
 * Use counts are recomputed over the range. Caller frees with bp_graph_free. */
BP_API bp_graph *bp_graph_view(const bp_graph *g, int i0, int i1);

#ifdef __cplusplus
}
#endif

#endif
