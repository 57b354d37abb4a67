/* tf-model.h - private to tests/: the transformer of common/transformer.h with weights from a
 * fixed generator, its inputs, and the NMSE check the multi-backend suites compare logits with. */
#ifndef BP_TESTS_TF_MODEL_H
#define BP_TESTS_TF_MODEL_H

#include "../common/transformer.h"

struct model {
    bp_context *wctx;
    struct tf_weights w;
    bp_buffer *wbuf;
};

/* Weights of cfg in buft (marked as weights), filled from a fixed generator; asserts success. */
void model_init(struct model *m, const struct tf_config *cfg, bp_buffer_type *buft);
void model_free(struct model *m);
/* Tokens (shifted by salt), positions 0.. and a causal mask. */
void set_inputs(const struct tf_graph *tg, const struct tf_config *cfg, int salt);
/* Fails the test unless sum (x - ref)^2 / sum ref^2 < max_nmse (and ref is not all zero). */
void assert_close_nmse(const float *x, const float *ref, int64_t n, double max_nmse);

#endif
