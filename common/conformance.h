/* conformance.h - private to the source tree: runs op cases on a backend and compares every
 * result with the reference implementation (ref.c). Used by every backend's conformance suite
 * in tests/ and by the installed `backplane conformance` command. */
#ifndef BP_TEST_CONFORMANCE_H
#define BP_TEST_CONFORMANCE_H

#include <backplane/backplane.h>

/* Builds one case in ctx and returns the tensor to compare. Leafs are filled with seeded random
 * data, shaped by hints in their names: "pos:" values in (0.5, 1.5) (divisors, square roots),
 * "mask:causal" 0 / -inf causal mask with one row fully masked, "ties:" values in steps of
 * 1/4 (many equal), "mask:pad3" a mask of the last 3 columns, "nan3:" NaN and inf in the last
 * 3 rows (of a 2-D leaf). I32 leafs get valid ids or
 * positions for whatever consumes them. */
typedef bp_tensor *(*conf_build_fn)(bp_context *ctx, int variant);

struct conf_case {
    const char *name;
    conf_build_fn build;
    int n_variants;
    double max_nmse; /* normalised mean squared error allowed against the reference */
};

/* Normalised mean squared error: sum (x - r)^2 / sum r^2 (0 when both are all zero). */
double conf_nmse(const float *x, const float *ref, int64_t n);

/* Runs variant v of case c on backend be. Returns true when the backend supports every node and
 * matches the reference; on failure writes a one-line reason (names the case, variant and the
 * error) into why. *unsupported is set when the backend declined a node (supports_op false). */
bool conf_run(bp_backend *be, const struct conf_case *c, int v, bool *unsupported, char *why,
              size_t why_size);

/* Runs every variant of c on be (unsupported counts as failed); returns
 * how many failed and writes the first reason into first. */
int conf_run_variants(bp_backend *be, const struct conf_case *c, char *first, size_t first_size);

/* Every case of the suite (conformance-cases.c). */
extern const struct conf_case conf_cases[];
extern const int conf_n_cases;

#endif
