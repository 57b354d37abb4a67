/* test-ops.c - the op table and every computing op builder: accepted shapes and rejected calls. */
#include <math.h>

#include "test-util.h"

static bp_context *ctx;

static void setup(void)
{
    ctx = bp_context_new(256);
    ck_assert_ptr_nonnull(ctx);
}

static void teardown(void)
{
    bp_context_free(ctx);
    ctx = NULL;
}

static bp_tensor *f32(int64_t a, int64_t b, int64_t c, int64_t d)
{
    return bp_new_tensor_4d(ctx, BP_TYPE_F32, a, b, c, d);
}

static bp_tensor *i32(int64_t a, int64_t b, int64_t c)
{
    return bp_new_tensor_3d(ctx, BP_TYPE_I32, a, b, c);
}

START_TEST(test_op_table)
{
    ck_assert_str_eq(bp_op_name(BP_OP_MUL_MAT), "MUL_MAT");
    ck_assert_str_eq(bp_op_name(BP_OP_COUNT), "INVALID");
    ck_assert_int_eq(bp_op_n_src(BP_OP_SET_ROWS), 3);
    ck_assert_int_eq(bp_op_n_src(BP_OP_ADD), 2);
    ck_assert_int_eq(bp_op_n_src(BP_OP_NONE), 0);
    ck_assert(bp_op_is_view(BP_OP_PERMUTE));
    ck_assert(bp_op_is_view(BP_OP_RESHAPE));
    ck_assert(!bp_op_is_view(BP_OP_CPY));
    ck_assert(!bp_op_is_view((enum bp_op)-3));
    ck_assert_str_eq(bp_unary_op_name(BP_UNARY_OP_SILU), "SILU");
    ck_assert_str_eq(bp_unary_op_name(BP_UNARY_OP_COUNT), "INVALID");
    ck_assert_str_eq(bp_glu_op_name(BP_GLU_OP_GEGLU), "GEGLU");
    ck_assert_str_eq(bp_glu_op_name((enum bp_glu_op)9), "INVALID");
    /* Every op has a distinct, non-empty name. */
    for (int i = 0; i < BP_OP_COUNT; i++) {
        ck_assert_int_gt((int)strlen(bp_op_name((enum bp_op)i)), 0);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(bp_op_name((enum bp_op)i), bp_op_name((enum bp_op)j));
    }
}
END_TEST

START_TEST(test_get_rows)
{
    bp_tensor *emb = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 100);
    bp_tensor *ids = i32(7, 1, 1);
    bp_tensor *r = bp_get_rows(ctx, emb, ids);
    ck_assert_shape(r, 64, 7, 1, 1);
    ck_assert_int_eq(r->type, BP_TYPE_F32);
    ck_assert_int_eq(r->op, BP_OP_GET_ROWS);
    ck_assert_ptr_eq(r->src[0], emb);
    ck_assert_ptr_eq(r->src[1], ids);
    /* Batched: one id list per matrix of a 3-D table. */
    ck_assert_shape(bp_get_rows(ctx, f32(8, 10, 3, 1), i32(4, 3, 1)), 8, 4, 3, 1);

    ck_assert_rejected(bp_get_rows(ctx, emb, f32(7, 1, 1, 1)), BP_ERR_TYPE, "must be i32");
    ck_assert_rejected(bp_get_rows(ctx, i32(4, 4, 1), ids), BP_ERR_TYPE, "float or quantised");
    ck_assert_rejected(bp_get_rows(ctx, f32(8, 10, 3, 1), i32(4, 2, 1)), BP_ERR_SHAPE,
                       "[n, 3, 1, 1]");
    ck_assert_rejected(bp_get_rows(ctx, NULL, ids), BP_ERR_INVALID_ARG, "NULL");
}
END_TEST

START_TEST(test_set_rows)
{
    bp_tensor *cache = bp_set_name(bp_new_tensor_3d(ctx, BP_TYPE_F16, 16, 32, 4), "k_cache");
    bp_tensor *src = f32(16, 5, 4, 1);
    bp_tensor *ids = i32(5, 1, 1); /* broadcast over the 4 heads */
    bp_tensor *r = bp_set_rows(ctx, cache, src, ids);
    ck_assert_shape(r, 16, 32, 4, 1);
    ck_assert_int_eq(r->type, BP_TYPE_F16);
    ck_assert_int_eq(r->op, BP_OP_SET_ROWS);
    ck_assert_ptr_eq(r->view_src, cache);
    ck_assert_ptr_eq(r->src[0], cache);
    ck_assert_ptr_eq(r->src[1], src);
    ck_assert_ptr_eq(r->src[2], ids);
    ck_assert_ptr_nonnull(bp_set_rows(ctx, cache, src, i32(5, 4, 1))); /* per-head ids */

    ck_assert_rejected(bp_set_rows(ctx, cache, f32(8, 5, 4, 1), ids), BP_ERR_SHAPE, "do not fit");
    ck_assert_rejected(bp_set_rows(ctx, cache, src, i32(6, 1, 1)), BP_ERR_SHAPE, "[5, b, c, 1]");
    ck_assert_rejected(bp_set_rows(ctx, cache, src, i32(5, 3, 1)), BP_ERR_SHAPE, "dividing");
    ck_assert_rejected(bp_set_rows(ctx, cache, bp_new_tensor_3d(ctx, BP_TYPE_F16, 16, 5, 4), ids),
                       BP_ERR_TYPE, "src");
    ck_assert_rejected(bp_set_rows(ctx, i32(16, 32, 4), src, ids), BP_ERR_TYPE, "destination");
    ck_assert_rejected(bp_set_rows(ctx, cache, src, NULL), BP_ERR_INVALID_ARG, "'ids' is NULL");
}
END_TEST

typedef bp_tensor *(*binary_fn)(bp_context *, bp_tensor *, bp_tensor *);

START_TEST(test_binary_broadcast)
{
    const struct {
        binary_fn fn;
        enum bp_op op;
        const char *name;
        bool inplace;
    } ops[] = {
        {bp_add, BP_OP_ADD, "bp_add", false},
        {bp_sub, BP_OP_SUB, "bp_sub", false},
        {bp_mul, BP_OP_MUL, "bp_mul", false},
        {bp_div, BP_OP_DIV, "bp_div", false},
        {bp_add_inplace, BP_OP_ADD, "bp_add_inplace", true},
        {bp_sub_inplace, BP_OP_SUB, "bp_sub_inplace", true},
        {bp_mul_inplace, BP_OP_MUL, "bp_mul_inplace", true},
        {bp_div_inplace, BP_OP_DIV, "bp_div_inplace", true},
    };
    bp_tensor *a = f32(6, 4, 3, 2);
    bp_tensor *rows = f32(6, 1, 1, 1);  /* one row repeated everywhere */
    bp_tensor *tiles = f32(3, 2, 3, 1); /* tiled twice along 0 and 1, once along 2, twice along 3 */
    bp_tensor *bad = f32(4, 4, 3, 2);
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        bp_tensor *r = ops[i].fn(ctx, a, rows);
        ck_assert_shape(r, 6, 4, 3, 2);
        ck_assert_int_eq(r->op, ops[i].op);
        ck_assert_ptr_eq(r->src[0], a);
        ck_assert_ptr_eq(r->src[1], rows);
        ck_assert_int_eq(bp_is_view(r), ops[i].inplace);
        if (ops[i].inplace)
            ck_assert_ptr_eq(r->view_src, a);
        ck_assert_shape(ops[i].fn(ctx, a, tiles), 6, 4, 3, 2);
        ck_assert_rejected(ops[i].fn(ctx, a, bad), BP_ERR_SHAPE, ops[i].name);
        ck_assert_rejected(ops[i].fn(ctx, rows, a), BP_ERR_SHAPE, "broadcast");
        ck_assert_rejected(ops[i].fn(ctx, a, i32(6, 1, 1)), BP_ERR_TYPE, "f32");
        ck_assert_rejected(ops[i].fn(ctx, a, NULL), BP_ERR_INVALID_ARG, "NULL");
    }
    /* A non-contiguous operand is fine for the builder (backends handle strides). */
    ck_assert_ptr_nonnull(bp_add(ctx, bp_transpose(ctx, f32(4, 6, 1, 1)), f32(6, 1, 1, 1)));
}
END_TEST

START_TEST(test_scale_and_unary)
{
    bp_tensor *a = f32(5, 3, 1, 1);
    bp_tensor *s = bp_scale(ctx, a, 0.25f);
    ck_assert_int_eq(s->op, BP_OP_SCALE);
    ck_assert_float_eq(bp_get_op_param_f32(s, 0), 0.25f);
    ck_assert(!bp_is_view(s));
    ck_assert_ptr_eq(bp_scale_inplace(ctx, a, 2.0f)->view_src, a);
    ck_assert_rejected(bp_scale(ctx, i32(5, 1, 1), 2.0f), BP_ERR_TYPE, "bp_scale");
    ck_assert_rejected(bp_scale(ctx, NULL, 2.0f), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_rejected(bp_scale_inplace(ctx, i32(5, 1, 1), 2.0f), BP_ERR_TYPE, "bp_scale_inplace");

    bp_tensor *(*const fns[BP_UNARY_OP_COUNT])(bp_context *, bp_tensor *) = {
        [BP_UNARY_OP_NEG] = bp_neg,   [BP_UNARY_OP_ABS] = bp_abs,
        [BP_UNARY_OP_RELU] = bp_relu, [BP_UNARY_OP_GELU] = bp_gelu,
        [BP_UNARY_OP_SILU] = bp_silu, [BP_UNARY_OP_SIGMOID] = bp_sigmoid,
        [BP_UNARY_OP_TANH] = bp_tanh, [BP_UNARY_OP_EXP] = bp_exp,
        [BP_UNARY_OP_SQR] = bp_sqr,   [BP_UNARY_OP_SQRT] = bp_sqrt,
        [BP_UNARY_OP_GELU_ERF] = bp_gelu_erf,
    };
    for (int op = 0; op < BP_UNARY_OP_COUNT; op++) {
        bp_tensor *u = fns[op](ctx, a);
        ck_assert_shape(u, 5, 3, 1, 1);
        ck_assert_int_eq(u->op, BP_OP_UNARY);
        ck_assert_int_eq(bp_get_unary_op(u), op);
        ck_assert_rejected(fns[op](ctx, bp_new_tensor_1d(ctx, BP_TYPE_F16, 4)), BP_ERR_TYPE,
                           bp_unary_op_name((enum bp_unary_op)op));
    }
    ck_assert_ptr_eq(bp_unary_inplace(ctx, a, BP_UNARY_OP_EXP)->view_src, a);
    ck_assert_rejected(bp_unary(ctx, a, BP_UNARY_OP_COUNT), BP_ERR_INVALID_ARG, "not a unary op");
    ck_assert_rejected(bp_unary(ctx, a, (enum bp_unary_op)-1), BP_ERR_INVALID_ARG, "-1");
    ck_assert_rejected(bp_unary_inplace(ctx, i32(5, 1, 1), BP_UNARY_OP_EXP), BP_ERR_TYPE,
                       "bp_unary_inplace");
}
END_TEST

START_TEST(test_reductions_and_norms)
{
    bp_tensor *a = f32(7, 3, 2, 1);
    bp_tensor *s = bp_sum_rows(ctx, a);
    ck_assert_shape(s, 1, 3, 2, 1);
    ck_assert_int_eq(s->type, BP_TYPE_F32);
    ck_assert_shape(bp_mean(ctx, a), 1, 3, 2, 1);
    bp_tensor *am = bp_argmax(ctx, a);
    ck_assert_shape(am, 1, 3, 2, 1);
    ck_assert_int_eq(am->type, BP_TYPE_I32);
    ck_assert_rejected(bp_sum_rows(ctx, i32(7, 1, 1)), BP_ERR_TYPE, "bp_sum_rows");
    ck_assert_rejected(bp_mean(ctx, NULL), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_rejected(bp_argmax(ctx, f32(0, 3, 1, 1)), BP_ERR_SHAPE, "empty");

    bp_tensor *n = bp_rms_norm(ctx, a, 1e-6f);
    ck_assert_shape(n, 7, 3, 2, 1);
    ck_assert_int_eq(n->op, BP_OP_RMS_NORM);
    ck_assert_float_eq(bp_get_op_param_f32(n, 0), 1e-6f);
    ck_assert_int_eq(bp_norm(ctx, a, 0.0f)->op, BP_OP_NORM);
    ck_assert_rejected(bp_norm(ctx, a, -1.0f), BP_ERR_INVALID_ARG, "eps");
    ck_assert_rejected(bp_rms_norm(ctx, a, NAN), BP_ERR_INVALID_ARG, "eps");
    ck_assert_rejected(bp_rms_norm(ctx, a, INFINITY), BP_ERR_INVALID_ARG, "eps");
    ck_assert_rejected(bp_norm(ctx, bp_new_tensor_1d(ctx, BP_TYPE_BF16, 4), 1e-5f), BP_ERR_TYPE,
                       "f32");
}
END_TEST

START_TEST(test_mul_mat)
{
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_Q8_0, 64, 10); /* K = 64, M = 10 */
    bp_tensor *x = f32(64, 3, 1, 1);                             /* N = 3 */
    bp_tensor *r = bp_mul_mat(ctx, w, x);
    ck_assert_shape(r, 10, 3, 1, 1);
    ck_assert_int_eq(r->type, BP_TYPE_F32);
    /* Grouped-query attention: 2 KV heads broadcast over 8 query heads. */
    bp_tensor *k = f32(16, 9, 2, 1), *q = f32(16, 5, 8, 1);
    ck_assert_shape(bp_mul_mat(ctx, k, q), 9, 5, 8, 1);
    /* Non-contiguous (transposed) weights are a valid description. */
    ck_assert_ptr_nonnull(bp_mul_mat(ctx, bp_transpose(ctx, f32(9, 16, 1, 1)), f32(16, 2, 1, 1)));

    ck_assert_rejected(bp_mul_mat(ctx, w, f32(32, 3, 1, 1)), BP_ERR_SHAPE, "K = 64");
    ck_assert_rejected(bp_mul_mat(ctx, f32(16, 9, 3, 1), q), BP_ERR_SHAPE, "multiples");
    ck_assert_rejected(bp_mul_mat(ctx, w, bp_new_tensor_2d(ctx, BP_TYPE_F16, 64, 3)), BP_ERR_TYPE,
                       "activations");
    ck_assert_rejected(bp_mul_mat(ctx, i32(64, 2, 1), x), BP_ERR_TYPE, "weights");
    ck_assert_rejected(bp_mul_mat(ctx, NULL, x), BP_ERR_INVALID_ARG, "NULL");

    /* Precision: the contract by default, half on request, only for MUL_MAT nodes. */
    ck_assert_int_eq(bp_mul_mat_get_precision(r), BP_MM_PRECISION_DEFAULT);
    ck_assert_ptr_eq(bp_mul_mat_set_precision(r, BP_MM_PRECISION_HALF), r);
    ck_assert_int_eq(bp_mul_mat_get_precision(r), BP_MM_PRECISION_HALF);
    ck_assert_int_eq(bp_get_op_param_i32(r, 0), BP_MM_PRECISION_HALF);
    ck_assert_ptr_eq(bp_mul_mat_set_precision(r, BP_MM_PRECISION_DEFAULT), r);
    ck_assert_int_eq(bp_mul_mat_get_precision(r), BP_MM_PRECISION_DEFAULT);
    ck_assert_rejected(bp_mul_mat_set_precision(r, (enum bp_mm_precision)7), BP_ERR_INVALID_ARG,
                       "not a precision");
    ck_assert_rejected(bp_mul_mat_set_precision(x, BP_MM_PRECISION_HALF), BP_ERR_INVALID_ARG,
                       "not a MUL_MAT");
    ck_assert_rejected(bp_mul_mat_set_precision(NULL, BP_MM_PRECISION_HALF), BP_ERR_INVALID_ARG,
                       "NULL");
    ck_assert_int_eq(bp_mul_mat_get_precision(x), BP_MM_PRECISION_DEFAULT);
    ck_assert_int_eq(bp_mul_mat_get_precision(NULL), BP_MM_PRECISION_DEFAULT);
}
END_TEST

START_TEST(test_soft_max)
{
    bp_tensor *kq = f32(10, 4, 8, 1); /* n_kv, n_tokens, heads */
    bp_tensor *sm = bp_soft_max(ctx, kq);
    ck_assert_shape(sm, 10, 4, 8, 1);
    ck_assert_ptr_null(sm->src[1]);
    ck_assert_float_eq(bp_get_op_param_f32(sm, 0), 1.0f);
    bp_tensor *mask = bp_new_tensor_2d(ctx, BP_TYPE_F16, 10, 6); /* padded rows are allowed */
    bp_tensor *m = bp_soft_max_ext(ctx, kq, mask, 0.125f);
    ck_assert_ptr_eq(m->src[1], mask);
    ck_assert_float_eq(bp_get_op_param_f32(m, 0), 0.125f);

    ck_assert_rejected(bp_soft_max_ext(ctx, kq, f32(9, 4, 1, 1), 1.0f), BP_ERR_SHAPE, "mask");
    ck_assert_rejected(bp_soft_max_ext(ctx, kq, f32(10, 3, 1, 1), 1.0f), BP_ERR_SHAPE, "rows");
    ck_assert_rejected(bp_soft_max_ext(ctx, kq, f32(10, 4, 3, 1), 1.0f), BP_ERR_SHAPE, "ne2");
    ck_assert_rejected(bp_soft_max_ext(ctx, kq, i32(10, 4, 1), 1.0f), BP_ERR_TYPE, "f32 or f16");
    ck_assert_rejected(bp_soft_max_ext(ctx, kq, NULL, INFINITY), BP_ERR_INVALID_ARG, "scale");
    ck_assert_rejected(bp_soft_max(ctx, i32(10, 4, 1)), BP_ERR_TYPE, "operand");
}
END_TEST

START_TEST(test_rope)
{
    bp_tensor *x = f32(64, 8, 5, 1); /* head_dim, heads, tokens */
    bp_tensor *pos = bp_new_tensor_1d(ctx, BP_TYPE_I32, 5);
    bp_tensor *r = bp_rope(ctx, x, pos, 64, BP_ROPE_NEOX, 10000.0f, 1.0f);
    ck_assert_shape(r, 64, 8, 5, 1);
    ck_assert_int_eq(r->op, BP_OP_ROPE);
    ck_assert_int_eq(bp_get_op_param_i32(r, 0), 64);
    ck_assert_int_eq(bp_get_op_param_i32(r, 1), BP_ROPE_NEOX);
    ck_assert_float_eq(bp_get_op_param_f32(r, 2), 10000.0f);
    ck_assert_float_eq(bp_get_op_param_f32(r, 3), 1.0f);
    ck_assert_ptr_nonnull(bp_rope(ctx, x, pos, 32, BP_ROPE_NORMAL, 500.0f, 0.5f)); /* partial */

    ck_assert_rejected(bp_rope(ctx, x, bp_new_tensor_1d(ctx, BP_TYPE_I32, 4), 64, BP_ROPE_NEOX,
                               1e4f, 1.0f),
                       BP_ERR_SHAPE, "one position per token");
    ck_assert_rejected(bp_rope(ctx, x, pos, 63, BP_ROPE_NEOX, 1e4f, 1.0f), BP_ERR_INVALID_ARG,
                       "n_dims 63");
    ck_assert_rejected(bp_rope(ctx, x, pos, 66, BP_ROPE_NEOX, 1e4f, 1.0f), BP_ERR_INVALID_ARG,
                       "n_dims 66");
    ck_assert_rejected(bp_rope(ctx, x, pos, 64, (enum bp_rope_mode)1, 1e4f, 1.0f),
                       BP_ERR_INVALID_ARG, "mode");
    ck_assert_rejected(bp_rope(ctx, x, pos, 64, BP_ROPE_NEOX, -1.0f, 1.0f), BP_ERR_INVALID_ARG,
                       "freq_base");
    ck_assert_rejected(bp_rope(ctx, x, f32(5, 1, 1, 1), 64, BP_ROPE_NEOX, 1e4f, 1.0f),
                       BP_ERR_TYPE, "positions");
}
END_TEST

START_TEST(test_concat)
{
    bp_tensor *a = f32(4, 3, 2, 1), *b = f32(4, 5, 2, 1);
    bp_tensor *c = bp_concat(ctx, a, b, 1);
    ck_assert_shape(c, 4, 8, 2, 1);
    ck_assert_int_eq(bp_get_op_param_i32(c, 0), 1);
    ck_assert_shape(bp_concat(ctx, a, f32(4, 3, 2, 6), 3), 4, 3, 2, 7);
    ck_assert_rejected(bp_concat(ctx, a, b, 0), BP_ERR_SHAPE, "dimension 1");
    ck_assert_rejected(bp_concat(ctx, a, b, 4), BP_ERR_INVALID_ARG, "dim 4");
    ck_assert_rejected(bp_concat(ctx, a, bp_new_tensor_3d(ctx, BP_TYPE_F16, 4, 3, 2), 1),
                       BP_ERR_TYPE, "same");
}
END_TEST

START_TEST(test_glu)
{
    bp_tensor *g = f32(12, 3, 1, 1), *u = f32(12, 3, 1, 1);
    bp_tensor *s = bp_swiglu(ctx, g, u);
    ck_assert_shape(s, 12, 3, 1, 1);
    ck_assert_int_eq(bp_get_glu_op(s), BP_GLU_OP_SWIGLU);
    ck_assert_int_eq(bp_get_op_param_i32(s, 1), 0);
    bp_tensor *h = bp_glu(ctx, g, NULL, BP_GLU_OP_GEGLU); /* gate and value halves of one tensor */
    ck_assert_shape(h, 6, 3, 1, 1);
    ck_assert_int_eq(bp_get_op_param_i32(h, 1), 1);
    ck_assert_int_eq(bp_geglu(ctx, g, u)->op, BP_OP_GLU);
    ck_assert_int_eq(bp_get_glu_op(bp_geglu_erf(ctx, g, u)), BP_GLU_OP_GEGLU_ERF);
    ck_assert_str_eq(bp_glu_op_name(BP_GLU_OP_GEGLU_ERF), "GEGLU_ERF");

    ck_assert_rejected(bp_swiglu(ctx, g, f32(12, 2, 1, 1)), BP_ERR_SHAPE, "differ in shape");
    ck_assert_rejected(bp_glu(ctx, f32(7, 2, 1, 1), NULL, BP_GLU_OP_SWIGLU), BP_ERR_SHAPE, "odd");
    ck_assert_rejected(bp_glu(ctx, g, u, BP_GLU_OP_COUNT), BP_ERR_INVALID_ARG, "not a GLU op");
    ck_assert_rejected(bp_swiglu(ctx, i32(12, 3, 1), NULL), BP_ERR_TYPE, "gate");
    ck_assert_rejected(bp_swiglu(ctx, NULL, u), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_rejected(bp_geglu(ctx, g, i32(12, 3, 1)), BP_ERR_TYPE, "value");
}
END_TEST

START_TEST(test_rope_ext)
{
    bp_tensor *x = f32(64, 4, 5, 1), *pos = bp_new_tensor_1d(ctx, BP_TYPE_I32, 5);
    bp_tensor *r = bp_rope_ext(ctx, x, pos, 64, BP_ROPE_NEOX, 4096, 10000.0f, 0.25f, 1.0f, 1.0f,
                               32.0f, 1.0f);
    ck_assert_int_eq(r->op, BP_OP_ROPE);
    ck_assert_float_eq(bp_get_op_param_f32(r, 4), 1.0f);
    /* the magnitude carries the interpolation's correction */
    ck_assert_float_eq_tol(bp_get_op_param_f32(r, 5), 1.0f + 0.1f * logf(4.0f), 1e-6f);
    /* pairs 0..lo extrapolate, hi.. interpolate: lo < hi inside the 32 pairs */
    ck_assert(bp_get_op_param_f32(r, 6) < bp_get_op_param_f32(r, 7));
    ck_assert(bp_get_op_param_f32(r, 7) <= 63.0f);
    bp_tensor *plain = bp_rope(ctx, x, pos, 64, BP_ROPE_NEOX, 10000.0f, 0.25f);
    ck_assert_float_eq(bp_get_op_param_f32(plain, 4), 0.0f);
    ck_assert_float_eq(bp_get_op_param_f32(plain, 5), 1.0f);
    ck_assert_rejected(bp_rope_ext(ctx, x, pos, 64, BP_ROPE_NEOX, 4096, 1e4f, 0.25f, 1.5f, 1.0f,
                                   32.0f, 1.0f),
                       BP_ERR_INVALID_ARG, "ext_factor");
    ck_assert_rejected(bp_rope_ext(ctx, x, pos, 64, BP_ROPE_NEOX, 0, 1e4f, 0.25f, 1.0f, 1.0f,
                                   32.0f, 1.0f),
                       BP_ERR_INVALID_ARG, "n_ctx_orig");
    ck_assert_rejected(bp_rope_ext(ctx, x, pos, 63, BP_ROPE_NEOX, 64, 1e4f, 0.25f, 1.0f, 1.0f,
                                   32.0f, 1.0f),
                       BP_ERR_INVALID_ARG, "n_dims");
}
END_TEST

START_TEST(test_clamp_l2_norm)
{
    bp_tensor *a = f32(7, 3, 2, 1);
    bp_tensor *c = bp_clamp(ctx, a, -1.0f, INFINITY);
    ck_assert_shape(c, 7, 3, 2, 1);
    ck_assert_int_eq(c->op, BP_OP_CLAMP);
    ck_assert_float_eq(bp_get_op_param_f32(c, 0), -1.0f);
    ck_assert_rejected(bp_clamp(ctx, a, 1.0f, -1.0f), BP_ERR_INVALID_ARG, "lo <= hi");
    ck_assert_rejected(bp_clamp(ctx, a, NAN, 1.0f), BP_ERR_INVALID_ARG, "bp_clamp");
    ck_assert_rejected(bp_clamp(ctx, i32(7, 3, 1), 0, 1), BP_ERR_TYPE, "bp_clamp");
    ck_assert_rejected(bp_clamp(ctx, NULL, 0, 1), BP_ERR_INVALID_ARG, "NULL");
    bp_tensor *n = bp_l2_norm(ctx, a, 1e-6f);
    ck_assert_int_eq(n->op, BP_OP_L2_NORM);
    ck_assert_shape(n, 7, 3, 2, 1);
    ck_assert_rejected(bp_l2_norm(ctx, a, -1.0f), BP_ERR_INVALID_ARG, "eps");
    ck_assert_rejected(bp_l2_norm(ctx, i32(7, 3, 1), 0.0f), BP_ERR_TYPE, "bp_l2_norm");
}
END_TEST

START_TEST(test_soft_max_sinks)
{
    bp_tensor *kq = f32(9, 4, 3, 1);
    bp_tensor *s = bp_soft_max_ext(ctx, kq, NULL, 0.5f);
    bp_tensor *sinks = f32(3, 1, 1, 1);
    ck_assert_int_eq(bp_soft_max_add_sinks(s, f32(4, 1, 1, 1)), BP_ERR_SHAPE);
    ck_assert_int_eq(bp_soft_max_add_sinks(s, bp_new_tensor_1d(ctx, BP_TYPE_F16, 3)), BP_ERR_SHAPE);
    ck_assert_ptr_null(s->src[2]); /* unchanged */
    ck_assert_int_eq(bp_soft_max_add_sinks(s, sinks), BP_OK);
    ck_assert_ptr_eq(s->src[2], sinks);
    ck_assert_int_eq(bp_soft_max_add_sinks(s, sinks), BP_ERR_INVALID_ARG); /* once only */
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "already"));
    ck_assert_int_eq(bp_soft_max_add_sinks(kq, sinks), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "not a SOFT_MAX"));
    ck_assert_int_eq(bp_soft_max_add_sinks(s, NULL), BP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(test_argsort_top_k)
{
    bp_tensor *a = f32(9, 3, 2, 1);
    bp_tensor *s = bp_argsort(ctx, a, BP_SORT_DESC);
    ck_assert_shape(s, 9, 3, 2, 1);
    ck_assert_int_eq(s->type, BP_TYPE_I32);
    ck_assert_int_eq(bp_get_op_param_i32(s, 0), BP_SORT_DESC);
    bp_tensor *t = bp_top_k(ctx, a, 2);
    ck_assert_shape(t, 2, 3, 2, 1);
    ck_assert_int_eq(t->type, BP_TYPE_I32);
    ck_assert_int_eq(t->op, BP_OP_TOP_K);
    ck_assert_ptr_nonnull(bp_top_k(ctx, a, 9));
    ck_assert_rejected(bp_top_k(ctx, a, 10), BP_ERR_SHAPE, "k = 10");
    ck_assert_rejected(bp_top_k(ctx, a, 0), BP_ERR_SHAPE, "k = 0");
    ck_assert_rejected(bp_argsort(ctx, a, (enum bp_sort_order)2), BP_ERR_INVALID_ARG,
                       "not a sort order");
    ck_assert_rejected(bp_argsort(ctx, i32(9, 3, 1), BP_SORT_ASC), BP_ERR_TYPE, "bp_argsort");
    ck_assert_rejected(bp_top_k(ctx, NULL, 1), BP_ERR_INVALID_ARG, "NULL");
}
END_TEST

START_TEST(test_mul_mat_id)
{
    bp_tensor *as = bp_new_tensor_4d(ctx, BP_TYPE_Q8_0, 64, 5, 8, 1);
    bp_tensor *ids = i32(2, 7, 1);
    bp_tensor *r = bp_mul_mat_id(ctx, as, f32(64, 2, 7, 1), ids);
    ck_assert_shape(r, 5, 2, 7, 1);
    ck_assert_int_eq(r->op, BP_OP_MUL_MAT_ID);
    ck_assert_int_eq(r->type, BP_TYPE_F32);
    ck_assert_ptr_eq(r->src[2], ids);
    ck_assert_str_eq(bp_op_name(BP_OP_MUL_MAT_ID), "MUL_MAT_ID");
    ck_assert_ptr_nonnull(bp_mul_mat_id(ctx, as, f32(64, 1, 7, 1), ids)); /* shared by slots */
    ck_assert_rejected(bp_mul_mat_id(ctx, as, f32(64, 3, 7, 1), ids), BP_ERR_SHAPE,
                       "[64, 2 or 1, 7, 1]");
    ck_assert_rejected(bp_mul_mat_id(ctx, as, f32(64, 2, 6, 1), ids), BP_ERR_SHAPE, "bp_mul_mat_id");
    ck_assert_rejected(bp_mul_mat_id(ctx, as, f32(32, 2, 7, 1), ids), BP_ERR_SHAPE, "bp_mul_mat_id");
    ck_assert_rejected(bp_mul_mat_id(ctx, as, f32(64, 2, 7, 1), f32(2, 7, 1, 1)), BP_ERR_TYPE,
                       "ids");
    ck_assert_rejected(bp_mul_mat_id(ctx, i32(64, 5, 8), f32(64, 2, 7, 1), ids), BP_ERR_TYPE,
                       "expert weights");
    ck_assert_rejected(bp_mul_mat_id(ctx, bp_new_tensor_4d(ctx, BP_TYPE_F32, 64, 5, 2, 2),
                                     f32(64, 2, 7, 1), ids),
                       BP_ERR_SHAPE, "n_expert, 1");
    /* An expert stride that is not a whole number of blocks (views cannot make one; a caller
     * writing the public strides can). */
    bp_tensor *odd = bp_new_tensor_4d(ctx, BP_TYPE_Q8_0, 64, 5, 8, 1);
    odd->nb[2] += 16;
    ck_assert_rejected(bp_mul_mat_id(ctx, odd, f32(64, 2, 7, 1), ids), BP_ERR_SHAPE,
                       "whole q8_0 blocks");
    ck_assert_rejected(bp_mul_mat_id(ctx, as, NULL, ids), BP_ERR_INVALID_ARG, "NULL");
}
END_TEST

START_TEST(test_flash_attn_ext)
{
    bp_tensor *q = f32(64, 5, 8, 1);
    bp_tensor *k = bp_new_tensor_4d(ctx, BP_TYPE_F16, 64, 70, 2, 1);
    bp_tensor *v = bp_new_tensor_4d(ctx, BP_TYPE_F16, 48, 70, 2, 1);
    bp_tensor *a = bp_flash_attn_ext(ctx, q, k, v, NULL, 0.125f, 0.0f, BP_ATTN_CAUSAL);
    ck_assert_shape(a, 48, 8, 5, 1); /* [Dv, heads, rows, sequences] */
    ck_assert_int_eq(a->op, BP_OP_FLASH_ATTN_EXT);
    ck_assert_ptr_eq(a->src[0], q);
    ck_assert_ptr_null(a->src[3]);
    ck_assert_float_eq(bp_get_op_param_f32(a, 0), 0.125f);
    ck_assert_int_eq(bp_get_op_param_i32(a, 2), BP_ATTN_CAUSAL);
    bp_tensor *mask = bp_new_tensor_2d(ctx, BP_TYPE_F16, 70, 8);
    ck_assert_ptr_nonnull(bp_flash_attn_ext(ctx, q, k, v, mask, 1.0f, 30.0f, 0));

    ck_assert_rejected(bp_flash_attn_ext(ctx, NULL, k, v, NULL, 1, 0, 0), BP_ERR_INVALID_ARG,
                       "NULL");
    ck_assert_rejected(bp_flash_attn_ext(ctx, bp_new_tensor_4d(ctx, BP_TYPE_F16, 64, 5, 8, 1), k,
                                         v, NULL, 1, 0, 0),
                       BP_ERR_TYPE, "query");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, i32(64, 70, 2), v, NULL, 1, 0, 0), BP_ERR_TYPE,
                       "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl");
    bp_tensor *kq8 = bp_new_tensor_4d(ctx, BP_TYPE_Q8_0, 64, 70, 2, 1); /* a q8_0 cache */
    ck_assert_ptr_nonnull(bp_flash_attn_ext(ctx, q, kq8, v, NULL, 1, 0, 0));
    static const enum bp_type kv[] = {BP_TYPE_Q4_0, BP_TYPE_Q4_1, BP_TYPE_Q5_0, BP_TYPE_Q5_1,
                                      BP_TYPE_IQ4_NL};
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        ck_assert_ptr_nonnull(bp_flash_attn_ext(ctx, q, bp_new_tensor_4d(ctx, kv[i], 64, 70, 2, 1),
                                                bp_new_tensor_4d(ctx, kv[i], 64, 70, 2, 1), NULL,
                                                1, 0, 0));
    /* the super-blocks and the activation types are no cache types */
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, bp_new_tensor_4d(ctx, BP_TYPE_Q4_K, 256, 70, 2, 1),
                                         v, NULL, 1, 0, 0),
                       BP_ERR_TYPE, "iq4_nl");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, k, v, NULL, NAN, 0, 0), BP_ERR_INVALID_ARG,
                       "finite");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, k, v, NULL, 1, -1, 0), BP_ERR_INVALID_ARG,
                       "softcap");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, k, v, NULL, 1, 0, 4), BP_ERR_INVALID_ARG,
                       "flags 0x4");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, f32(32, 70, 2, 1), v, NULL, 1, 0, 0),
                       BP_ERR_SHAPE, "row length");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, k, f32(48, 69, 2, 1), NULL, 1, 0, 0),
                       BP_ERR_SHAPE, "positions");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, f32(64, 70, 3, 1), f32(48, 70, 3, 1), NULL, 1,
                                         0, 0),
                       BP_ERR_SHAPE, "3 key/value heads");
    ck_assert_rejected(bp_flash_attn_ext(ctx, f32(64, 80, 8, 1), k, v, NULL, 1, 0,
                                         BP_ATTN_CAUSAL),
                       BP_ERR_SHAPE, "last positions");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, k, v, f32(70, 4, 1, 1), 1, 0, 0), BP_ERR_SHAPE,
                       "does not cover");
    ck_assert_rejected(bp_flash_attn_ext(ctx, q, k, v, i32(70, 8, 1), 1, 0, 0), BP_ERR_TYPE,
                       "mask");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    const struct {
        const TTest *fn;
        const char *name;
    } tests[] = {
        {test_op_table, "op_table"},     {test_get_rows, "get_rows"},
        {test_flash_attn_ext, "flash_attn_ext"},
        {test_clamp_l2_norm, "clamp_l2_norm"},
        {test_rope_ext, "rope_ext"},
        {test_argsort_top_k, "argsort_top_k"},
        {test_mul_mat_id, "mul_mat_id"},
        {test_soft_max_sinks, "soft_max_sinks"},
        {test_set_rows, "set_rows"},     {test_binary_broadcast, "binary"},
        {test_scale_and_unary, "unary"}, {test_reductions_and_norms, "reductions"},
        {test_mul_mat, "mul_mat"},       {test_soft_max, "soft_max"},
        {test_rope, "rope"},             {test_concat, "concat"},
        {test_glu, "glu"},
    };
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 10);
        tcase_add_test(tc, tests[i].fn);
        suite_add_tcase(s, tc);
    }
    return bp_test_run(s);
}
