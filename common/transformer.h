/* transformer.h - private to the source tree: shared by bench/ and tests/ (common/libcommon.a).
 * Builds a llama-shaped decoder graph from the public op builders: the allocator, scheduler and
 * meta benchmarks measure it, and the multi-backend suites (through tests/tf-model.h) compare
 * its logits across backends. */
#ifndef BP_COMMON_TRANSFORMER_H
#define BP_COMMON_TRANSFORMER_H

#include <backplane/backplane.h>

struct tf_config {
    int n_layer;
    int n_embd;
    int n_ff;
    int n_head;
    int n_vocab;
    int n_tok;         /* tokens in this graph (the prompt, or 1 when generating) */
    enum bp_type wtype; /* type of the 2-D weight matrices */
};

struct tf_layer {
    bp_tensor *attn_norm, *wq, *wk, *wv, *wo;
    bp_tensor *ffn_norm, *w_gate, *w_up, *w_down;
};

/* The weights, in their own context (caller frees the context). */
struct tf_weights {
    bp_tensor *tok_embd, *out_norm, *output;
    struct tf_layer *layers; /* n_layer entries, caller frees */
};

/* The graph inputs and result, in the compute context. */
struct tf_graph {
    bp_tensor *tokens; /* I32 [n_tok] */
    bp_tensor *pos;    /* I32 [n_tok] */
    bp_tensor *mask;   /* F16 [n_tok, n_tok], causal: 0 or -inf */
    bp_tensor *logits; /* F32 [n_vocab, n_tok] */
};

/* Tensors needed by tf_weights_new and tf_build for cfg. */
size_t tf_weights_n_tensors(const struct tf_config *cfg);
size_t tf_graph_n_tensors(const struct tf_config *cfg);

/* Describes the weights in wctx; returns false with bp_last_error() set on failure. */
bool tf_weights_new(bp_context *wctx, const struct tf_config *cfg, struct tf_weights *w);
/* Builds one forward pass in ctx: per layer rms_norm, attention with RoPE, causal softmax,
 * output projection and residual, rms_norm, SwiGLU MLP and residual; then the final norm and
 * output projection. */
bool tf_build(bp_context *ctx, const struct tf_config *cfg, const struct tf_weights *w,
              struct tf_graph *out);

#endif
