/* tf-model.c - see tf-model.h. */
#include <math.h>
#include <stdlib.h>

#include "test-util.h"
#include "tf-model.h"

void model_init(struct model *m, const struct tf_config *cfg, bp_buffer_type *buft)
{
    m->wctx = bp_context_new(tf_weights_n_tensors(cfg));
    ck_assert(tf_weights_new(m->wctx, cfg, &m->w));
    m->wbuf = bp_alloc_ctx_tensors(m->wctx, buft);
    ck_assert_ptr_nonnull(m->wbuf);
    bp_buffer_set_usage(m->wbuf, BP_BUFFER_USAGE_WEIGHTS);
    uint32_t seed = 7;
    for (size_t i = 0; i < bp_context_get_n_tensors(m->wctx); i++) {
        bp_tensor *t = bp_context_get_tensor(m->wctx, i);
        const int64_t n = bp_nelements(t);
        float *v = malloc((size_t)n * sizeof(float));
        for (int64_t j = 0; j < n; j++) {
            seed = seed * 1664525u + 1013904223u;
            v[j] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.4f;
        }
        /* Weights of any type: the floats are converted to the tensor's own type first. */
        const struct bp_type_traits *tr = bp_type_get_traits(t->type);
        const size_t bytes = bp_nbytes(t);
        void *conv = malloc(bytes);
        ck_assert(tr != NULL && conv != NULL);
        tr->from_float(v, conv, n);
        ck_assert_int_eq(bp_tensor_set(t, conv, 0, bytes), BP_OK);
        free(conv);
        free(v);
    }
}

void model_free(struct model *m)
{
    bp_buffer_free(m->wbuf);
    free(m->w.layers);
    bp_context_free(m->wctx);
}

void set_inputs(const struct tf_graph *tg, const struct tf_config *cfg, int salt)
{
    const int T = cfg->n_tok;
    int32_t tok[64], pos[64];
    uint16_t mask[64 * 64];
    for (int i = 0; i < T; i++) {
        tok[i] = (i * 7 + 3 + salt) % cfg->n_vocab;
        pos[i] = i;
    }
    for (int r = 0; r < T; r++)
        for (int c = 0; c < T; c++)
            mask[r * T + c] = c <= r ? bp_fp32_to_fp16(0.0f) : bp_fp32_to_fp16(-INFINITY);
    ck_assert_int_eq(bp_tensor_set(tg->tokens, tok, 0, (size_t)T * 4), BP_OK);
    ck_assert_int_eq(bp_tensor_set(tg->pos, pos, 0, (size_t)T * 4), BP_OK);
    ck_assert_int_eq(bp_tensor_set(tg->mask, mask, 0, (size_t)T * T * 2), BP_OK);
}

void assert_close_nmse(const float *x, const float *ref, int64_t n, double max_nmse)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    ck_assert_msg(den > 0 && num / den < max_nmse, "NMSE %g (limit %g)", num / den, max_nmse);
}
