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
    int n_ctx;     /* KV cache length: prompt plus generated tokens must fit */
    int n_head_kv; /* key/value heads (grouped-query attention): divides n_head */
    int rope_mode; /* BP_ROPE_NEOX (the seeded models, qwen2) or BP_ROPE_NORMAL (llama) */
    int rope_dims; /* dimensions of each head that rope rotates; 0: all of them */
    float rope_base, rope_scale, norm_eps; /* rope_scale: the position factor (1 / linear
                                            * scaling factor) */
    /* YaRN (bp_rope_ext) when yarn_ext_factor > 0: pairs between rope_scale and 1 by their
     * wavelength against yarn_n_ctx_orig; 0: plain rope. */
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int yarn_n_ctx_orig;
    enum bp_type kv_type; /* of the KV cache: BP_TYPE_F16, or Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
                           * (fused attention only) */
    /* Mixture of experts (Mixtral): n_expert MLPs of n_ff per layer, n_expert_used of them per
     * token chosen by a router (softmax, top k, weights renormalised); 0: one dense MLP. */
    int n_expert, n_expert_used;
};

/* "tiny", "small", "base" (about 1B parameters) or "moe" (8 experts, 2 used); NULL for
 * anything else. */
const struct model_config *model_config_by_name(const char *name);
/* Names of the configurations, for messages: "tiny, small, base, moe". */
const char *model_config_names(void);
/* Parameters and weight bytes of cfg with 2-D weights of type wtype (norms are f32). */
int64_t model_n_params(const struct model_config *cfg);
/* The type a weight matrix with rows of ne0 elements gets for the weight type wtype: wtype
 * itself when its blocks divide ne0, else llama.cpp's fallback (Q2_K and Q3_K to Q4_0, Q4_K to
 * Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to IQ4_NL; F16 when those do not fit either). */
enum bp_type model_row_type(enum bp_type wtype, int64_t ne0);
size_t model_weight_bytes(const struct model_config *cfg, enum bp_type wtype);
/* Bytes of the stacked expert matrices of cfg with weights of type wtype (0 without experts). */
size_t model_expert_bytes(const struct model_config *cfg, enum bp_type wtype);
/* Bytes of the KV cache (keys and values of cfg->kv_type for every layer and position). */
size_t model_kv_bytes(const struct model_config *cfg);

struct model_layer {
    bp_tensor *attn_norm, *wq, *wk, *wv, *wo;
    bp_tensor *bq, *bk, *bv; /* biases of q, k, v (qwen2), else NULL */
    bp_tensor *ffn_norm, *w_gate, *w_up, *w_down; /* dense MLP, else NULL */
    /* Mixture of experts, else NULL: the router F32 [n_embd, n_expert] and the experts' stacked
     * matrices [n_embd, n_ff, n_expert] (gate, up) and [n_ff, n_embd, n_expert] (down). */
    bp_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
    bp_tensor *k_cache, *v_cache; /* kv_type [n_embd_kv, n_ctx]: row p holds position p */
};

struct model {
    struct model_config cfg;
    enum bp_type wtype;
    bp_context *wctx, *ectx, *kvctx, *xctx;
    /* weights, the token embedding table, the KV cache, the stacked experts (NULL without) */
    bp_buffer *wbuf, *ebuf, *kvbuf, *xbuf;
    bp_tensor *tok_embd, *out_norm, *output;
    struct model_layer *layers;
    bool weights_in_place; /* a file's weights used in its mapping (model_init_gguf) */
    bool half_precision; /* every MUL_MAT under BP_MM_PRECISION_HALF; set before building */
    bool flash_attn; /* attention as one FLASH_ATTN_EXT (no mask input) rather than MUL_MAT,
                      * SOFT_MAX, MUL_MAT; set before building steps */
    int predict_experts; /* steps also predict each next layer's this many most likely experts
                          * per token (model_step.pred); 0: no prediction */
};

/* Where the model's memory goes. Each tensor must live where a backend that runs its ops
 * can use it: the weights where MUL_MAT by them runs, the token embedding table where its
 * GET_ROWS runs, the KV cache where SET_ROWS writes it (a destination is never copied). */
struct model_placement {
    bp_buffer_type *weights, *embedding, *kv;
    bp_buffer_type *experts; /* the stacked expert matrices; NULL: with the weights */
    /* model_init_gguf only: the file's path, to leave the stacked experts in it (a File
     * buffer read with pread) instead of placing them in `experts`; NULL: placed */
    const char *experts_file;
};

/* Describes, allocates (the weight and embedding buffers marked as weights) and fills the
 * model from seed; the KV cache is zeroed. BP_OK or a status with bp_last_error() set; on
 * failure nothing is left to free. */
enum bp_status model_init(struct model *m, const struct model_config *cfg, enum bp_type wtype,
                          const struct model_placement *where, uint64_t seed);
void model_free(struct model *m);
/* The steps of model_init for model-gguf.c: prepare sets cfg and makes the contexts and layers;
 * the caller describes the tensors; allocate marks and allocates them where `where` says, and
 * zeroes the KV cache. Each returns BP_OK or a status with bp_last_error() set; model_free
 * frees what they made. */
enum bp_status model_prepare(struct model *m, const struct model_config *cfg);
enum bp_status model_allocate(struct model *m, const struct model_placement *where);

/* ---- GGUF files (model-gguf.c) ------------------------------------------------------------
 * A llama-architecture GGUF (llama, mistral, qwen2): its hyper-parameters as a model_config
 * (name: general.name or the architecture) and the type of its matrices; BP_OK, or a status with
 * a sentence saying what the file lacks or has that the decoder cannot run. */
enum bp_status model_gguf_config(const bp_gguf *g, struct model_config *cfg, char *name,
                                 size_t name_size, enum bp_type *wtype);
/* Bytes of the file's tensors that model_init_gguf allocates (an absent output.weight counts as
 * a copy of token_embd.weight). */
size_t model_gguf_weight_bytes(const bp_gguf *g);
/* Like model_init, with cfg as model_gguf_config gave it for g (its name kept by the caller for
 * the model's life) and the weights of the file, each tensor in its own type. A file holding
 * tensors the decoder does not use is refused, naming one. Where the weights go to host memory
 * and the file's tensors are 64-byte aligned they are used in place in the file's mapping
 * (weights_in_place): g must then stay open until model_free. */
enum bp_status model_init_gguf(struct model *m, const bp_gguf *g, const struct model_config *cfg,
                               const struct model_placement *where);
/* Writes the model as a llama-architecture GGUF that model_init_gguf (and llama.cpp) reads:
 * q and k rows reordered for llama's rope when the model uses NeoX's, as the HF converter does. */
enum bp_status model_save_gguf(const struct model *m, const char *path);

/* One forward step over n_tok tokens at positions pos0.., attending to the n_kv = pos0 + n_tok
 * cached positions; logits are those of the last token only ([n_vocab]). */
struct model_step {
    bp_context *ctx;
    bp_graph *graph;
    bp_tensor *tokens, *pos, *mask, *logits;
    int n_tok, pos0;
    int kv; /* cache positions the step's attention reads (padded for one token) */
    /* With model.predict_experts: per layer, the experts predicted for it, most likely first
     * (I32 [predict_experts, T]: the layer's router applied to the previous layer's MLP input,
     * layer 0's to the token embeddings). */
    bp_tensor **pred;
};

enum bp_status model_step_build(const struct model *m, int n_tok, int pos0, struct model_step *st);
/* Whether st, built for an earlier step, is also the graph of a step of n_tok tokens at pos0:
 * one token each, and the same padded cache length (generation steps read the cache padded to
 * a multiple of 256 positions, masked past the filled ones). Then st takes the new position
 * and its graph can be computed again as it is. */
bool model_step_reuse(struct model_step *st, const struct model *m, int n_tok, int pos0);
/* Sets tokens, positions and the causal mask (after the scheduler has allocated the graph). */
enum bp_status model_step_inputs(const struct model_step *st, const int32_t *tokens);
void model_step_free(struct model_step *st);

/* A bp_meta_split_fn (user: the model_config) that stores the model's matrices split the
 * Megatron way, so that each device of a meta device holds about 1/n of the model. */
bool model_meta_split(const bp_tensor *w, int n, struct bp_meta_split *out, void *user);

#endif
