/* ref.h - private to the source tree (tests/, tools/): the plain reference implementation of every op, in double
 * precision, reading and writing tensor->data as host memory. Every backend is compared with
 * it; it is written for clarity, not speed. */
#ifndef BP_TEST_REF_H
#define BP_TEST_REF_H

#include <backplane/backplane.h>

/* Computes one node from its sources (already computed); views and leafs do nothing. Returns
 * false for an op or type combination it does not know. */
bool ref_compute_node(bp_tensor *node);
/* Every node of the graph in order. */
bool ref_compute_graph(bp_graph *g);

/* Element access by coordinates, for non-quantised types. */
double ref_get(const bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
void ref_set(bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v);

/* The reference definitions of the unary functions (GELU: tanh approximation). */
double ref_unary(enum bp_unary_op op, double x);

#endif
