/* model.c - the decoder of model.h, and how a meta device stores its matrices. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/bp-plugin.h> /* bp_set_error */

#include "model.h"

#define SEEDED(name_, layers, embd, ff, heads, vocab, ctx)                                    \
    {.name = (name_), .n_layer = (layers), .n_embd = (embd), .n_ff = (ff), .n_head = (heads),   \
     .n_vocab = (vocab), .n_ctx = (ctx), .n_head_kv = (heads), .rope_mode = BP_ROPE_NEOX,       \
     .rope_base = 10000.0f, .rope_scale = 1.0f, .norm_eps = 1e-5f, .kv_type = BP_TYPE_F16}

static const struct model_config configs[] = {
    /* n_ff and n_embd are multiples of 32, so every weight type (Q8_0, Q4_0 blocks) fits. */
    SEEDED("tiny", 2, 128, 352, 4, 1024, 256),
    SEEDED("small", 8, 512, 1408, 8, 8192, 512),
    SEEDED("base", 16, 2048, 5632, 16, 32000, 512),
    /* Mixtral's shape, scaled down: eight experts, two per token (about 20 M parameters, 6 M
     * of them used per token). */
    {.name = "moe", .n_layer = 4, .n_embd = 256, .n_ff = 704, .n_head = 4, .n_vocab = 4096,
     .n_ctx = 512, .n_head_kv = 4, .rope_mode = BP_ROPE_NEOX, .rope_base = 10000.0f,
     .rope_scale = 1.0f, .norm_eps = 1e-5f, .kv_type = BP_TYPE_F16, .n_expert = 8,
     .n_expert_used = 2},
};

const struct model_config *model_config_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); i++)
        if (strcmp(configs[i].name, name) == 0)
            return &configs[i];
    return NULL;
}

const char *model_config_names(void)
{
    return "tiny, small, base, moe";
}

/* Width of the keys and values: n_head_kv heads of n_embd / n_head. */
static int64_t kv_width(const struct model_config *c)
{
    return (int64_t)c->n_embd / c->n_head * c->n_head_kv;
}

int64_t model_n_params(const struct model_config *c)
{
    const int64_t E = c->n_embd, F = c->n_ff, EK = kv_width(c);
    const int64_t mlps = c->n_expert > 0 ? c->n_expert : 1, router = (int64_t)c->n_expert * E;
    return 2 * (int64_t)c->n_vocab * E + E +
           (int64_t)c->n_layer * (2 * E * E + 2 * E * EK + 3 * E * F * mlps + router + 2 * E);
}

enum bp_type model_row_type(enum bp_type wtype, int64_t ne0)
{
    if (ne0 % bp_type_block_size(wtype) == 0)
        return wtype;
    /* llama.cpp's tensor_type_fallback (see tools/quantize-plan.c). */
    const enum bp_type f = wtype == BP_TYPE_Q2_K || wtype == BP_TYPE_Q3_K ? BP_TYPE_Q4_0
                           : wtype == BP_TYPE_Q4_K                        ? BP_TYPE_Q5_0
                           : wtype == BP_TYPE_Q5_K                        ? BP_TYPE_Q5_1
                           : wtype == BP_TYPE_Q6_K                        ? BP_TYPE_Q8_0
                           : wtype == BP_TYPE_IQ4_XS                      ? BP_TYPE_IQ4_NL
                                                                          : BP_TYPE_F16;
    return ne0 % bp_type_block_size(f) == 0 ? f : BP_TYPE_F16;
}

/* Bytes of a matrix of rows of ne0 in the weight type (or its fallback). */
static size_t row_bytes(enum bp_type wtype, int64_t ne0)
{
    return bp_row_size(model_row_type(wtype, ne0), ne0);
}

size_t model_weight_bytes(const struct model_config *c, enum bp_type wtype)
{
    const int64_t E = c->n_embd, F = c->n_ff, EK = kv_width(c);
    const size_t mlps = c->n_expert > 0 ? (size_t)c->n_expert : 1;
    const size_t mat = 2 * (size_t)c->n_vocab * row_bytes(wtype, E) +
                       (size_t)c->n_layer * ((2 * (size_t)E + 2 * (size_t)EK) * row_bytes(wtype, E) +
                                             mlps * (2 * (size_t)F * row_bytes(wtype, E) +
                                                     (size_t)E * row_bytes(wtype, F)));
    const size_t router = (size_t)c->n_layer * (size_t)c->n_expert * (size_t)E * sizeof(float);
    return mat + router + (size_t)(1 + 2 * c->n_layer) * (size_t)E * sizeof(float);
}

size_t model_expert_bytes(const struct model_config *c, enum bp_type wtype)
{
    const int64_t E = c->n_embd, F = c->n_ff;
    return (size_t)c->n_layer * (size_t)c->n_expert *
           (2 * (size_t)F * row_bytes(wtype, E) + (size_t)E * row_bytes(wtype, F));
}

size_t model_kv_bytes(const struct model_config *c)
{
    return 2 * (size_t)c->n_layer * (size_t)c->n_ctx * bp_row_size(c->kv_type, kv_width(c));
}

/* ---- Weights -------------------------------------------------------------------------------- */

struct rng {
    uint64_t s;
};

static float next_uniform(struct rng *r) /* in [-1, 1) */
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    const uint64_t x = r->s * 0x2545F4914F6CDD1Dull;
    return (float)((double)(x >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* Rows of t drawn from uniform(-scale, scale) around `center`, in t's type. */
static enum bp_status fill(bp_tensor *t, uint64_t seed, float center, float scale)
{
    struct rng r = {seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull};
    for (int i = 0; i < 4; i++)
        next_uniform(&r);
    const int64_t n0 = t->ne[0], rows = bp_nrows(t);
    const size_t row_bytes = bp_row_size(t->type, n0);
    float *f = malloc((size_t)n0 * sizeof(float));
    char *conv = malloc(row_bytes);
    enum bp_status st = BP_OK;
    if (f == NULL || conv == NULL)
        st = bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory filling '%s'", t->name);
    for (int64_t row = 0; row < rows && st == BP_OK; row++) {
        for (int64_t i = 0; i < n0; i++)
            f[i] = center + scale * next_uniform(&r);
        if (bp_quantize_rows(t->type, f, conv, 1, n0, NULL) == 0)
            st = bp_last_status();
        else
            st = bp_tensor_set(t, conv, (size_t)row * t->nb[1], row_bytes);
    }
    free(f);
    free(conv);
    return st;
}

/* A weight matrix: rows that type's blocks do not divide take its fallback (model_row_type). */
static bp_tensor *matrix(bp_context *ctx, enum bp_type type, int64_t cols, int64_t rows,
                         const char *fmt, int il)
{
    bp_tensor *t = bp_new_tensor_2d(ctx, model_row_type(type, cols), cols, rows);
    return t ? bp_format_name(t, fmt, il) : NULL;
}

static bp_tensor *stacked(bp_context *ctx, enum bp_type type, int64_t cols, int64_t rows,
                          int64_t n, const char *fmt, int il)
{
    bp_tensor *t = bp_new_tensor_3d(ctx, model_row_type(type, cols), cols, rows, n);
    return t ? bp_format_name(t, fmt, il) : NULL;
}

static bool describe(struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int64_t E = c->n_embd, F = c->n_ff;
    const enum bp_type wt = m->wtype;
    bp_context *w = m->wctx;
    m->tok_embd = matrix(m->ectx, wt, E, c->n_vocab, "token_embd", 0);
    m->out_norm = bp_set_name(bp_new_tensor_1d(w, BP_TYPE_F32, E), "output_norm");
    m->output = matrix(w, wt, E, c->n_vocab, "output", 0);
    if (!m->tok_embd || !m->out_norm || !m->output)
        return false;
    for (int il = 0; il < c->n_layer; il++) {
        struct model_layer *l = &m->layers[il];
        l->attn_norm = matrix(w, BP_TYPE_F32, E, 1, "blk.%d.attn_norm", il);
        l->wq = matrix(w, wt, E, E, "blk.%d.attn_q", il);
        l->wk = matrix(w, wt, E, kv_width(c), "blk.%d.attn_k", il);
        l->wv = matrix(w, wt, E, kv_width(c), "blk.%d.attn_v", il);
        l->wo = matrix(w, wt, E, E, "blk.%d.attn_output", il);
        l->ffn_norm = matrix(w, BP_TYPE_F32, E, 1, "blk.%d.ffn_norm", il);
        if (c->n_expert > 0) {
            bp_context *x = m->xctx;
            l->ffn_gate_inp = matrix(w, BP_TYPE_F32, E, c->n_expert, "blk.%d.ffn_gate_inp", il);
            l->ffn_gate_exps = stacked(x, wt, E, F, c->n_expert, "blk.%d.ffn_gate_exps", il);
            l->ffn_up_exps = stacked(x, wt, E, F, c->n_expert, "blk.%d.ffn_up_exps", il);
            l->ffn_down_exps = stacked(x, wt, F, E, c->n_expert, "blk.%d.ffn_down_exps", il);
            if (!l->ffn_gate_inp || !l->ffn_gate_exps || !l->ffn_up_exps || !l->ffn_down_exps)
                return false;
        } else {
            l->w_gate = matrix(w, wt, E, F, "blk.%d.ffn_gate", il);
            l->w_up = matrix(w, wt, E, F, "blk.%d.ffn_up", il);
            l->w_down = matrix(w, wt, F, E, "blk.%d.ffn_down", il);
            if (!l->w_gate || !l->w_up || !l->w_down)
                return false;
        }
        l->k_cache = matrix(m->kvctx, c->kv_type, kv_width(c), c->n_ctx, "blk.%d.cache_k", il);
        l->v_cache = matrix(m->kvctx, c->kv_type, kv_width(c), c->n_ctx, "blk.%d.cache_v", il);
        if (!l->attn_norm || !l->wq || !l->wk || !l->wv || !l->wo || !l->ffn_norm ||
            !l->k_cache || !l->v_cache)
            return false;
    }
    return true;
}

static enum bp_status fill_all(struct model *m, uint64_t seed)
{
    const struct model_config *c = &m->cfg;
    const float se = sqrtf(3.0f / (float)c->n_embd), sf = sqrtf(3.0f / (float)c->n_ff);
    uint64_t k = seed * 1000003u;
    enum bp_status st = fill(m->tok_embd, ++k, 0.0f, 1.0f);
    if (st == BP_OK)
        st = fill(m->out_norm, ++k, 1.0f, 0.1f);
    if (st == BP_OK)
        st = fill(m->output, ++k, 0.0f, se);
    for (int il = 0; il < c->n_layer && st == BP_OK; il++) {
        const struct model_layer *l = &m->layers[il];
        const bool moe = l->ffn_gate_exps != NULL;
        bp_tensor *const mats[] = {l->wq, l->wk, l->wv, l->wo,
                                   moe ? l->ffn_gate_inp : l->w_gate,
                                   moe ? l->ffn_gate_exps : l->w_up,
                                   moe ? l->ffn_up_exps : NULL};
        st = fill(l->attn_norm, ++k, 1.0f, 0.1f);
        if (st == BP_OK)
            st = fill(l->ffn_norm, ++k, 1.0f, 0.1f);
        for (int i = 0; i < 7 && st == BP_OK; i++)
            if (mats[i] != NULL)
                st = fill(mats[i], ++k, 0.0f, se);
        if (st == BP_OK)
            st = fill(moe ? l->ffn_down_exps : l->w_down, ++k, 0.0f, sf);
    }
    return st;
}

enum bp_status model_prepare(struct model *m, const struct model_config *cfg)
{
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->layers = calloc((size_t)cfg->n_layer, sizeof(*m->layers));
    m->wctx = bp_context_new(3 + 12 * (size_t)cfg->n_layer);
    m->ectx = bp_context_new(1);
    m->kvctx = bp_context_new(2 * (size_t)cfg->n_layer);
    m->xctx = cfg->n_expert > 0 ? bp_context_new(3 * (size_t)cfg->n_layer) : NULL;
    if (m->layers == NULL || m->wctx == NULL || m->ectx == NULL || m->kvctx == NULL ||
        (cfg->n_expert > 0 && m->xctx == NULL)) {
        model_free(m);
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory describing the model");
    }
    return BP_OK;
}

enum bp_status model_allocate(struct model *m, const struct model_placement *where)
{
    for (size_t i = 0; i < bp_context_get_n_tensors(m->wctx); i++)
        bp_set_param(bp_context_get_tensor(m->wctx, i));
    bp_set_param(m->tok_embd);
    m->wbuf = bp_alloc_ctx_tensors(m->wctx, where->weights);
    if (m->wbuf == NULL)
        return bp_last_status();
    if (m->ebuf == NULL) { /* (a table used in place from a file's mapping has its own) */
        m->ebuf = bp_alloc_ctx_tensors(m->ectx, where->embedding);
        if (m->ebuf == NULL)
            return bp_last_status();
    }
    bp_buffer_set_usage(m->wbuf, BP_BUFFER_USAGE_WEIGHTS);
    bp_buffer_set_usage(m->ebuf, BP_BUFFER_USAGE_WEIGHTS);
    if (m->xctx != NULL && m->xbuf == NULL) { /* (experts left in a file have theirs) */
        for (size_t i = 0; i < bp_context_get_n_tensors(m->xctx); i++)
            bp_set_param(bp_context_get_tensor(m->xctx, i));
        m->xbuf = bp_alloc_ctx_tensors(m->xctx, where->experts ? where->experts : where->weights);
        if (m->xbuf == NULL)
            return bp_last_status();
        bp_buffer_set_usage(m->xbuf, BP_BUFFER_USAGE_WEIGHTS);
    }
    m->kvbuf = bp_alloc_ctx_tensors(m->kvctx, where->kv);
    if (m->kvbuf == NULL)
        return bp_last_status();
    return bp_buffer_clear(m->kvbuf, 0);
}

enum bp_status model_init(struct model *m, const struct model_config *cfg, enum bp_type wtype,
                          const struct model_placement *where, uint64_t seed)
{
    enum bp_status st = model_prepare(m, cfg);
    if (st != BP_OK)
        return st;
    m->wtype = wtype;
    st = describe(m) ? BP_OK : bp_last_status();
    if (st == BP_OK)
        st = model_allocate(m, where);
    if (st == BP_OK)
        st = fill_all(m, seed);
    if (st != BP_OK)
        model_free(m);
    return st;
}

void model_free(struct model *m)
{
    bp_buffer_free(m->wbuf);
    bp_buffer_free(m->ebuf);
    bp_buffer_free(m->kvbuf);
    bp_buffer_free(m->xbuf);
    bp_context_free(m->xctx);
    bp_context_free(m->wctx);
    bp_context_free(m->ectx);
    bp_context_free(m->kvctx);
    free(m->layers);
    memset(m, 0, sizeof(*m));
}

/* ---- One step ---------------------------------------------------------------------------------- */

#define CHECK(x)                                                                                 \
    do {                                                                                         \
        if ((x) == NULL)                                                                         \
            goto fail;                                                                           \
    } while (0)

/* Adds t and what it needs to the step's graph now, to set the order of independent nodes. */
#define EXPAND(t)                                                                                \
    do {                                                                                         \
        if (bp_graph_build_forward(st->graph, (t)) != BP_OK)                                     \
            goto fail;                                                                           \
    } while (0)

/* Cache positions a step reads: exactly the filled ones for a prompt, a multiple of KV_PAD for
 * one token (the rest masked), so that consecutive generation steps have the same graph. */
#define KV_PAD 256

static int step_kv(const struct model_config *c, int n_tok, int pos0)
{
    const int kv = pos0 + n_tok;
    if (n_tok != 1)
        return kv;
    const int padded = (kv + KV_PAD - 1) / KV_PAD * KV_PAD;
    return padded < c->n_ctx ? padded : c->n_ctx; /* kv <= n_ctx: the callers check */
}

bool model_step_reuse(struct model_step *st, const struct model *m, int n_tok, int pos0)
{
    if (st->graph == NULL || n_tok != 1 || st->n_tok != 1 || pos0 < 0 ||
        pos0 + 1 > m->cfg.n_ctx || step_kv(&m->cfg, 1, pos0) != st->kv)
        return false;
    st->pos0 = pos0;
    return true;
}

/* Mixtral's MLP over cur [E, T]: the router's softmax over the experts, the n_expert_used
 * most probable per token with their probabilities renormalised to sum to one, each chosen
 * expert's SwiGLU MLP (MUL_MAT_ID), and the weighted sum over the chosen ones. NULL with the
 * error of the op that failed. */
static bp_tensor *moe_ffn(bp_context *ctx, const struct model_config *c,
                          const struct model_layer *l, bp_tensor *cur)
{
    const int64_t E = c->n_embd, T = cur->ne[1], U = c->n_expert_used;
    bp_tensor *probs, *sel, *w, *x3, *gate, *up, *h, *out;
    if (!(probs = bp_soft_max(ctx, bp_mul_mat(ctx, l->ffn_gate_inp, cur)))) /* [n_expert, T] */
        return NULL;
    if (!(sel = bp_top_k(ctx, probs, (int)U))) /* I32 [U, T] */
        return NULL;
    /* The chosen experts' probabilities [1, U, T], renormalised. */
    if (!(w = bp_get_rows(ctx, bp_reshape_3d(ctx, probs, 1, c->n_expert, T), sel)))
        return NULL;
    bp_tensor *wsum = bp_sum_rows(ctx, bp_reshape_2d(ctx, w, U, T)); /* [1, T] */
    if (!wsum || !(w = bp_div(ctx, w, bp_reshape_3d(ctx, wsum, 1, 1, T))))
        return NULL;
    if (!(x3 = bp_reshape_3d(ctx, cur, E, 1, T))) /* one activation per token, for every slot */
        return NULL;
    if (!(gate = bp_mul_mat_id(ctx, l->ffn_gate_exps, x3, sel)) || /* [F, U, T] */
        !(up = bp_mul_mat_id(ctx, l->ffn_up_exps, x3, sel)) || !(h = bp_swiglu(ctx, gate, up)) ||
        !(out = bp_mul_mat_id(ctx, l->ffn_down_exps, h, sel)) || /* [E, U, T] */
        !(out = bp_mul(ctx, out, w)))
        return NULL;
    /* The sum over the U slots: slot 0 plus each of the others, as [E, T] views. */
    bp_tensor *sum = bp_view_2d(ctx, out, E, T, out->nb[2], 0);
    for (int64_t u = 1; u < U && sum != NULL; u++)
        sum = bp_add(ctx, sum, bp_view_2d(ctx, out, E, T, out->nb[2], (size_t)u * out->nb[1]));
    return sum != NULL ? bp_cont(ctx, sum) : NULL;
}

/* The experts predicted for layer l from a hidden state normed (before its weight): the
 * layer's router after its norm weight (softmax keeps the order), the m->predict_experts most
 * likely per token, most likely first; an output of the step's graph, expanded into it now, so
 * that it is computed before the experts of the layers before l run and the scheduler can load
 * them meanwhile (bp_sched_predict_experts). NULL with the error. */
static bp_tensor *predict(bp_context *ctx, const struct model *m, struct model_step *st,
                          const struct model_layer *l, bp_tensor *normed)
{
    const int n = m->predict_experts < m->cfg.n_expert ? m->predict_experts : m->cfg.n_expert;
    bp_tensor *p = normed != NULL ? bp_mul(ctx, normed, l->ffn_norm) : NULL;
    if (p == NULL || (p = bp_top_k(ctx, bp_mul_mat(ctx, l->ffn_gate_inp, p), n)) == NULL)
        return NULL;
    bp_set_output(p);
    return bp_graph_build_forward(st->graph, p) == BP_OK ? p : NULL;
}

enum bp_status model_step_build(const struct model *m, int n_tok, int pos0, struct model_step *st)
{
    const struct model_config *c = &m->cfg;
    memset(st, 0, sizeof(*st));
    if (c->kv_type != BP_TYPE_F16 && !m->flash_attn)
        return bp_set_error(BP_ERR_UNSUPPORTED, "model '%s': a %s KV cache needs fused attention "
                            "(the unfused form transposes the values, which a quantised cache "
                            "cannot)", c->name, bp_type_name(c->kv_type));
    if (n_tok < 1 || pos0 < 0 || pos0 + n_tok > c->n_ctx)
        return bp_set_error(BP_ERR_INVALID_ARG, "model '%s': positions %d..%d do not fit its "
                            "context of %d", c->name, pos0, pos0 + n_tok - 1, c->n_ctx);
    const int64_t E = c->n_embd, H = c->n_head, D = E / H, HK = c->n_head_kv, T = n_tok;
    const int64_t KV = step_kv(c, n_tok, pos0);
    const float eps = c->norm_eps, kq_scale = 1.0f / sqrtf((float)D);
    const size_t n_nodes = 64 + (c->n_expert > 0 ? 64 : 48) * (size_t)c->n_layer;
    st->n_tok = n_tok;
    st->pos0 = pos0;
    st->kv = (int)KV;
    st->ctx = bp_context_new(n_nodes);
    st->graph = bp_graph_new(n_nodes * 2);
    if (st->ctx == NULL || st->graph == NULL)
        goto fail;
    if (m->predict_experts > 0 && c->n_expert > 0 &&
        (st->pred = calloc((size_t)c->n_layer, sizeof(*st->pred))) == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory for the expert predictions");
        goto fail;
    }
    bp_context *ctx = st->ctx;
    CHECK(st->tokens = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_I32, T), "tokens"));
    CHECK(st->pos = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_I32, T), "pos"));
    bp_set_input(st->tokens);
    bp_set_input(st->pos);
    /* Fused attention masks a prompt causally by itself; a padded cache needs the mask. */
    const bool use_mask = !m->flash_attn || KV != pos0 + n_tok || n_tok == 1;
    if (use_mask) {
        CHECK(st->mask = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F16, KV, T), "mask"));
        bp_set_input(st->mask);
    }

    bp_tensor *x, *cur;
    CHECK(x = bp_get_rows(ctx, m->tok_embd, st->tokens));
    if (st->pred != NULL) /* layer 0's from the embeddings alone */
        CHECK(st->pred[0] = predict(ctx, m, st, &m->layers[0], bp_rms_norm(ctx, x, eps)));
    for (int il = 0; il < c->n_layer; il++) {
        const struct model_layer *l = &m->layers[il];
        CHECK(cur = bp_rms_norm(ctx, x, eps));
        CHECK(cur = bp_mul(ctx, cur, l->attn_norm));

        bp_tensor *q, *k, *v;
        CHECK(q = bp_mul_mat(ctx, l->wq, cur));
        CHECK(k = bp_mul_mat(ctx, l->wk, cur));
        CHECK(v = bp_mul_mat(ctx, l->wv, cur));
        if (l->bq != NULL) {
            CHECK(q = bp_add(ctx, q, l->bq));
            CHECK(k = bp_add(ctx, k, l->bk));
            CHECK(v = bp_add(ctx, v, l->bv));
        }
        /* The three products first, side by side in the graph: they are independent, so a
         * device may run them without waiting in between (the CPU's threads do). */
        EXPAND(q);
        EXPAND(k);
        EXPAND(v);
        CHECK(q = bp_reshape_3d(ctx, q, D, H, T));
        CHECK(k = bp_reshape_3d(ctx, k, D, HK, T));
        const int rd = c->rope_dims > 0 ? c->rope_dims : (int)D;
        if (c->yarn_ext_factor > 0.0f) {
            CHECK(q = bp_rope_ext(ctx, q, st->pos, rd, c->rope_mode, c->yarn_n_ctx_orig,
                                  c->rope_base, c->rope_scale, c->yarn_ext_factor,
                                  c->yarn_attn_factor, c->yarn_beta_fast, c->yarn_beta_slow));
            CHECK(k = bp_rope_ext(ctx, k, st->pos, rd, c->rope_mode, c->yarn_n_ctx_orig,
                                  c->rope_base, c->rope_scale, c->yarn_ext_factor,
                                  c->yarn_attn_factor, c->yarn_beta_fast, c->yarn_beta_slow));
        } else {
            CHECK(q = bp_rope(ctx, q, st->pos, rd, c->rope_mode, c->rope_base, c->rope_scale));
            CHECK(k = bp_rope(ctx, k, st->pos, rd, c->rope_mode, c->rope_base, c->rope_scale));
        }

        /* This step's keys and values into the cache (row = position), then the cached
         * positions 0..KV-1 as [D, KV, HK] views of what was written. */
        bp_tensor *kc, *vc;
        CHECK(kc = bp_set_rows(ctx, l->k_cache, bp_reshape_2d(ctx, k, D * HK, T), st->pos));
        CHECK(vc = bp_set_rows(ctx, l->v_cache, v, st->pos));
        bp_tensor *K, *V;
        const size_t head_bytes = bp_row_size(c->kv_type, D); /* one head of a cache row */
        CHECK(K = bp_view_3d(ctx, kc, D, KV, HK, kc->nb[1], head_bytes, 0));
        CHECK(V = bp_view_3d(ctx, vc, D, KV, HK, vc->nb[1], head_bytes, 0));

        CHECK(q = bp_permute(ctx, q, 0, 2, 1, 3)); /* [D, T, H] */
        if (m->flash_attn) {
            /* One fused op, reading the cache in place: [D, H, T] out. */
            bp_tensor *att;
            CHECK(att = bp_flash_attn_ext(ctx, q, K, V, st->mask, kq_scale, 0.0f,
                                          st->mask != NULL ? 0 : BP_ATTN_CAUSAL));
            CHECK(cur = bp_reshape_2d(ctx, att, E, T));
        } else {
            /* Grouped-query attention is MUL_MAT's broadcasting over dimension 2: query head h
             * meets key/value head h / (H / HK). */
            bp_tensor *kq;
            CHECK(kq = bp_mul_mat(ctx, K, q)); /* [KV, T, H] */
            CHECK(kq = bp_soft_max_ext(ctx, kq, st->mask, kq_scale));
            CHECK(V = bp_cont(ctx, bp_permute(ctx, V, 1, 0, 2, 3))); /* [KV, D, HK] */
            bp_tensor *kqv;
            CHECK(kqv = bp_mul_mat(ctx, V, kq));           /* [D, T, H] */
            CHECK(kqv = bp_permute(ctx, kqv, 0, 2, 1, 3)); /* [D, H, T] */
            CHECK(cur = bp_cont_4d(ctx, kqv, E, T, 1, 1));
        }
        if (il == c->n_layer - 1 && T > 1) {
            /* Only the last position's logits are wanted: past the last attention, the other
             * positions' rows are dead work (the cache holds what later tokens need). */
            CHECK(cur = bp_view_2d(ctx, cur, E, 1, cur->nb[1], (size_t)(T - 1) * cur->nb[1]));
            CHECK(x = bp_view_2d(ctx, x, E, 1, x->nb[1], (size_t)(T - 1) * x->nb[1]));
        }
        CHECK(cur = bp_mul_mat(ctx, l->wo, cur));
        CHECK(x = bp_add(ctx, x, cur));

        CHECK(cur = bp_rms_norm(ctx, x, eps));
        if (st->pred != NULL && il + 1 < c->n_layer)
            CHECK(st->pred[il + 1] = predict(ctx, m, st, &m->layers[il + 1], cur));
        CHECK(cur = bp_mul(ctx, cur, l->ffn_norm));
        if (l->ffn_gate_exps != NULL) {
            CHECK(cur = moe_ffn(ctx, c, l, cur));
            EXPAND(cur);
        } else {
            bp_tensor *gate, *up;
            CHECK(gate = bp_mul_mat(ctx, l->w_gate, cur));
            CHECK(up = bp_mul_mat(ctx, l->w_up, cur));
            EXPAND(gate);
            EXPAND(up);
            CHECK(cur = bp_swiglu(ctx, gate, up));
            CHECK(cur = bp_mul_mat(ctx, l->w_down, cur));
        }
        CHECK(x = bp_add(ctx, x, cur));
    }
    CHECK(cur = bp_rms_norm(ctx, x, eps));
    CHECK(cur = bp_mul(ctx, cur, m->out_norm));
    CHECK(st->logits = bp_set_name(bp_mul_mat(ctx, m->output, cur), "logits"));
    bp_set_output(st->logits);
    if (bp_graph_build_forward(st->graph, st->logits) != BP_OK)
        goto fail;
    for (int i = 0; m->half_precision && i < bp_graph_get_n_nodes(st->graph); i++) {
        bp_tensor *n = bp_graph_get_node(st->graph, i);
        if (n->op == BP_OP_MUL_MAT)
            bp_mul_mat_set_precision(n, BP_MM_PRECISION_HALF);
    }
    return BP_OK;
fail:;
    enum bp_status s = bp_last_status() != BP_OK ? bp_last_status() : BP_ERR_OUT_OF_MEMORY;
    model_step_free(st);
    return s;
}

enum bp_status model_step_inputs(const struct model_step *st, const int32_t *tokens)
{
    const int T = st->n_tok, KV = st->kv;
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    uint16_t *mask = malloc((size_t)KV * (size_t)T * sizeof(uint16_t));
    if (pos == NULL || mask == NULL) {
        free(pos);
        free(mask);
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory for the step's inputs");
    }
    const uint16_t zero = bp_fp32_to_fp16(0.0f), ninf = bp_fp32_to_fp16(-INFINITY);
    for (int j = 0; j < T; j++) {
        pos[j] = st->pos0 + j;
        for (int i = 0; i < KV; i++)
            mask[(size_t)j * KV + (size_t)i] = i <= st->pos0 + j ? zero : ninf;
    }
    enum bp_status s = bp_tensor_set(st->tokens, tokens, 0, (size_t)T * sizeof(int32_t));
    if (s == BP_OK)
        s = bp_tensor_set(st->pos, pos, 0, (size_t)T * sizeof(int32_t));
    if (s == BP_OK && st->mask != NULL)
        s = bp_tensor_set(st->mask, mask, 0, (size_t)KV * (size_t)T * sizeof(uint16_t));
    free(pos);
    free(mask);
    return s;
}

void model_step_free(struct model_step *st)
{
    free(st->pred);
    bp_graph_free(st->graph);
    bp_context_free(st->ctx);
    memset(st, 0, sizeof(*st));
}

/* ---- Split over a meta device ---------------------------------------------------------------- */

/* The split the meta backend stores the model's matrices in (Megatron): attention q/k/v and the
 * MLP's gate/up by output rows, the attention output and the MLP's down by input columns (each
 * expert's alike, for a mixture of experts), the
 * output projection by vocabulary rows; whole heads (or blocks of 32) per device. Embeddings
 * and norms stay whole. Each device then holds about 1/n of the model. */
bool model_meta_split(const bp_tensor *w, int n, struct bp_meta_split *out, void *user)
{
    const struct model_config *c = user;
    /* "blk.N.attn_q" (seeded) or "blk.N.attn_q.weight" (a GGUF file): the kind is attn_q. */
    char name[BP_MAX_NAME];
    snprintf(name, sizeof(name), "%s", w->name);
    const size_t len = strlen(name);
    if (len > 7 && strcmp(name + len - 7, ".weight") == 0)
        name[len - 7] = '\0';
    const char *dot = strrchr(name, '.');
    const char *kind = dot ? dot + 1 : name;
    int axis;
    int64_t unit;
    if (strcmp(kind, "attn_q") == 0 || strcmp(kind, "attn_k") == 0 ||
        strcmp(kind, "attn_v") == 0) {
        axis = 1;
        unit = c->n_embd / c->n_head;
    } else if (strcmp(kind, "attn_output") == 0) {
        axis = 0;
        unit = c->n_embd / c->n_head;
    } else if (strcmp(kind, "ffn_gate") == 0 || strcmp(kind, "ffn_up") == 0 ||
               strcmp(kind, "ffn_gate_exps") == 0 || strcmp(kind, "ffn_up_exps") == 0 ||
               strcmp(name, "output") == 0) {
        axis = 1; /* of every expert, for the stacked ones */
        unit = 32;
    } else if (strcmp(kind, "ffn_down") == 0 || strcmp(kind, "ffn_down_exps") == 0) {
        axis = 0;
        unit = 32;
    } else {
        return false;
    }
    const int64_t ne = w->ne[axis], units = ne / unit;
    if (unit < 1 || ne % unit != 0 || units < n || (axis == 0 && unit % 32 != 0))
        return false; /* cannot be cut into whole units for every device: keep it whole */
    memset(out, 0, sizeof(*out));
    out->state = BP_META_SPLIT;
    out->axis = axis;
    for (int p = 0; p < n; p++)
        out->sizes[p] = (units / n + (p < units % n ? 1 : 0)) * unit;
    return true;
}
