/* model.h - private to tools/: the llama-style decoder `backplane run` serves, with weights from
 * a seeded generator and a KV cache, built from the public op builders only, and the split a
 * meta device stores its matrices in. */
#ifndef BP_TOOLS_MODEL_H
#define BP_TOOLS_MODEL_H

#include <stdint.h>

#include <backplane/backplane.h>

struct model_config {
    const char *name;
    int n_layer, n_embd, n_ff, n_head, n_vocab;
    int n_ctx; /* KV cache length: prompt plus generated tokens must fit */
};

/* "tiny", "small" or "base" (about 1B parameters); NULL for anything else. */
const struct model_config *model_config_by_name(const char *name);
/* Names of the configurations, for messages: "tiny, small, base". */
const char *model_config_names(void);
/* Parameters and weight bytes of cfg with 2-D weights of type wtype (norms are f32). */
int64_t model_n_params(const struct model_config *cfg);
size_t model_weight_bytes(const struct model_config *cfg, enum bp_type wtype);
/* Bytes of the KV cache (f16 keys and values for every layer and position). */
size_t model_kv_bytes(const struct model_config *cfg);

struct model_layer {
    bp_tensor *attn_norm, *wq, *wk, *wv, *wo;
    bp_tensor *ffn_norm, *w_gate, *w_up, *w_down;
    bp_tensor *k_cache, *v_cache; /* f16 [n_embd, n_ctx]: row p holds position p */
};

struct model {
    struct model_config cfg;
    enum bp_type wtype;
    bp_context *wctx, *ectx, *kvctx;
    bp_buffer *wbuf, *ebuf, *kvbuf; /* weights, the token embedding table, the KV cache */
    bp_tensor *tok_embd, *out_norm, *output;
    struct model_layer *layers;
};

/* Where the model's memory goes. Each tensor must live where a backend that runs its ops
 * can use it: the weights where MUL_MAT by them runs, the token embedding table where its
 * GET_ROWS runs, the KV cache where SET_ROWS writes it (a destination is never copied). */
struct model_placement {
    bp_buffer_type *weights, *embedding, *kv;
};

/* Describes, allocates (the weight and embedding buffers marked as weights) and fills the
 * model from seed; the KV cache is zeroed. BP_OK or a status with bp_last_error() set; on
 * failure nothing is left to free. */
enum bp_status model_init(struct model *m, const struct model_config *cfg, enum bp_type wtype,
                          const struct model_placement *where, uint64_t seed);
void model_free(struct model *m);

/* One forward step over n_tok tokens at positions pos0.., attending to the n_kv = pos0 + n_tok
 * cached positions; logits are those of the last token only ([n_vocab]). */
struct model_step {
    bp_context *ctx;
    bp_graph *graph;
    bp_tensor *tokens, *pos, *mask, *logits;
    int n_tok, pos0;
};

enum bp_status model_step_build(const struct model *m, int n_tok, int pos0, struct model_step *st);
/* Sets tokens, positions and the causal mask (after the scheduler has allocated the graph). */
enum bp_status model_step_inputs(const struct model_step *st, const int32_t *tokens);
void model_step_free(struct model_step *st);

/* A bp_meta_split_fn (user: the model_config) that stores the model's matrices split the
 * Megatron way, so that each device of a meta device holds about 1/n of the model. */
bool model_meta_split(const bp_tensor *w, int n, struct bp_meta_split *out, void *user);

#endif
