/* transformer.c - the llama-shaped decoder graph of transformer.h. */
#include "transformer.h"

#include <math.h>
#include <stdlib.h>

#define CHECK(x)                                                                               \
    do {                                                                                       \
        if ((x) == NULL)                                                                       \
            return false;                                                                      \
    } while (0)

size_t tf_weights_n_tensors(const struct tf_config *cfg)
{
    return 3 + 9 * (size_t)cfg->n_layer;
}

size_t tf_graph_n_tensors(const struct tf_config *cfg)
{
    return 8 + 40 * (size_t)cfg->n_layer;
}

bool tf_weights_new(bp_context *wctx, const struct tf_config *cfg, struct tf_weights *w)
{
    const int64_t E = cfg->n_embd, F = cfg->n_ff;
    w->layers = calloc((size_t)cfg->n_layer, sizeof(*w->layers));
    CHECK(w->layers);
    CHECK(w->tok_embd = bp_new_tensor_2d(wctx, cfg->wtype, E, cfg->n_vocab));
    CHECK(w->out_norm = bp_new_tensor_1d(wctx, BP_TYPE_F32, E));
    CHECK(w->output = bp_new_tensor_2d(wctx, cfg->wtype, E, cfg->n_vocab));
    for (int il = 0; il < cfg->n_layer; il++) {
        struct tf_layer *l = &w->layers[il];
        CHECK(l->attn_norm = bp_new_tensor_1d(wctx, BP_TYPE_F32, E));
        CHECK(l->wq = bp_format_name(bp_new_tensor_2d(wctx, cfg->wtype, E, E), "blk.%d.wq", il));
        CHECK(l->wk = bp_format_name(bp_new_tensor_2d(wctx, cfg->wtype, E, E), "blk.%d.wk", il));
        CHECK(l->wv = bp_format_name(bp_new_tensor_2d(wctx, cfg->wtype, E, E), "blk.%d.wv", il));
        CHECK(l->wo = bp_format_name(bp_new_tensor_2d(wctx, cfg->wtype, E, E), "blk.%d.wo", il));
        CHECK(l->ffn_norm = bp_new_tensor_1d(wctx, BP_TYPE_F32, E));
        CHECK(l->w_gate = bp_new_tensor_2d(wctx, cfg->wtype, E, F));
        CHECK(l->w_up = bp_new_tensor_2d(wctx, cfg->wtype, E, F));
        CHECK(l->w_down = bp_new_tensor_2d(wctx, cfg->wtype, F, E));
    }
    for (size_t i = 0; i < bp_context_get_n_tensors(wctx); i++)
        bp_set_param(bp_context_get_tensor(wctx, i));
    return true;
}

bool tf_build(bp_context *ctx, const struct tf_config *cfg, const struct tf_weights *w,
              struct tf_graph *out)
{
    const int64_t E = cfg->n_embd, T = cfg->n_tok, H = cfg->n_head, D = E / H;
    const float eps = 1e-5f, kq_scale = 1.0f / sqrtf((float)D);

    CHECK(out->tokens = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_I32, T), "tokens"));
    CHECK(out->pos = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_I32, T), "pos"));
    CHECK(out->mask = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F16, T, T), "mask"));
    bp_set_input(out->tokens);
    bp_set_input(out->pos);
    bp_set_input(out->mask);

    bp_tensor *inp, *cur;
    CHECK(inp = bp_get_rows(ctx, w->tok_embd, out->tokens));
    for (int il = 0; il < cfg->n_layer; il++) {
        const struct tf_layer *l = &w->layers[il];
        CHECK(cur = bp_rms_norm(ctx, inp, eps));
        CHECK(cur = bp_mul(ctx, cur, l->attn_norm));

        bp_tensor *q, *k, *v;
        CHECK(q = bp_mul_mat(ctx, l->wq, cur));
        CHECK(k = bp_mul_mat(ctx, l->wk, cur));
        CHECK(v = bp_mul_mat(ctx, l->wv, cur));
        CHECK(q = bp_reshape_3d(ctx, q, D, H, T));
        CHECK(k = bp_reshape_3d(ctx, k, D, H, T));
        CHECK(q = bp_rope(ctx, q, out->pos, (int)D, BP_ROPE_NEOX, 10000.0f, 1.0f));
        CHECK(k = bp_rope(ctx, k, out->pos, (int)D, BP_ROPE_NEOX, 10000.0f, 1.0f));
        CHECK(q = bp_permute(ctx, q, 0, 2, 1, 3)); /* [D, T, H] */
        CHECK(k = bp_permute(ctx, k, 0, 2, 1, 3));

        bp_tensor *kq;
        CHECK(kq = bp_mul_mat(ctx, k, q)); /* [T_kv, T, H] */
        CHECK(kq = bp_soft_max_ext(ctx, kq, out->mask, kq_scale));

        CHECK(v = bp_reshape_3d(ctx, v, D, H, T));
        CHECK(v = bp_permute(ctx, v, 1, 2, 0, 3)); /* [T_kv, D, H] */
        CHECK(v = bp_cont(ctx, v));

        bp_tensor *kqv;
        CHECK(kqv = bp_mul_mat(ctx, v, kq));             /* [D, T, H] */
        CHECK(kqv = bp_permute(ctx, kqv, 0, 2, 1, 3));   /* [D, H, T] */
        CHECK(cur = bp_cont_4d(ctx, kqv, E, T, 1, 1));
        CHECK(cur = bp_mul_mat(ctx, l->wo, cur));

        bp_tensor *ffn_inp;
        CHECK(ffn_inp = bp_add(ctx, cur, inp));
        CHECK(cur = bp_rms_norm(ctx, ffn_inp, eps));
        CHECK(cur = bp_mul(ctx, cur, l->ffn_norm));

        bp_tensor *gate, *up;
        CHECK(gate = bp_mul_mat(ctx, l->w_gate, cur));
        CHECK(up = bp_mul_mat(ctx, l->w_up, cur));
        CHECK(gate = bp_silu(ctx, gate));
        CHECK(cur = bp_mul(ctx, gate, up));
        CHECK(cur = bp_mul_mat(ctx, l->w_down, cur));
        CHECK(inp = bp_add(ctx, cur, ffn_inp));
    }
    CHECK(cur = bp_rms_norm(ctx, inp, eps));
    CHECK(cur = bp_mul(ctx, cur, w->out_norm));
    CHECK(out->logits = bp_set_name(bp_mul_mat(ctx, w->output, cur), "logits"));
    bp_set_output(out->logits);
    return true;
}
