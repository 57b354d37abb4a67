/* ops.c - the op table and the builders of every computing op.
 *
 * Each builder checks its sources' types and shapes and either returns a new tensor describing
 * the op or NULL with an error naming the op and the shapes involved. Nothing is computed here.
 *
 * Op parameter layout (tensor.op_params, int32 slots; floats stored bit for bit):
 *   VIEW      [0..1] byte offset (size_t)          PERMUTE  [0..3] axes
 *   SCALE     [0] scale (f32)                      UNARY    [0] enum bp_unary_op
 *   NORM, RMS_NORM [0] eps (f32)                   SOFT_MAX [0] scale (f32)
 *   ROPE      [0] n_dims, [1] mode, [2] freq_base (f32), [3] freq_scale (f32); YaRN: [4]
 *             ext_factor, [5] magnitude, [6..7] ramp pairs, [8] attn_factor, [9] beta_fast,
 *             [10] beta_slow (f32), [11] n_ctx_orig (bp-tensor.h)
 *   CONCAT    [0] dim                              GLU      [0] enum bp_glu_op, [1] 1 if split
 *   FLASH_ATTN_EXT [0] scale (f32), [1] softcap (f32), [2] flags (enum bp_attn_flags)
 *   CLAMP     [0] lo (f32), [1] hi (f32)         L2_NORM  [0] eps (f32)
 *   ARGSORT   [0] enum bp_sort_order              TOP_K    [0] k
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "bp-impl.h"

struct op_info {
    const char *name;
    int n_src;
    bool is_view;
};

static const struct op_info op_table[BP_OP_COUNT] = {
#define BP_OP_ROW(name, n_src, is_view) [BP_OP_##name] = {#name, n_src, is_view},
    BP_OP_MAP(BP_OP_ROW)
#undef BP_OP_ROW
};

static const char *const unary_names[BP_UNARY_OP_COUNT] = {
#define BP_UNARY_ROW(name) [BP_UNARY_OP_##name] = #name,
    BP_UNARY_OP_MAP(BP_UNARY_ROW)
#undef BP_UNARY_ROW
};

bool bp__op_valid(enum bp_op op)
{
    return (unsigned)op < BP_OP_COUNT;
}

const char *bp_op_name(enum bp_op op)
{
    return bp__op_valid(op) ? op_table[op].name : "INVALID";
}

int bp_op_n_src(enum bp_op op)
{
    return bp__op_valid(op) ? op_table[op].n_src : 0;
}

bool bp_op_is_view(enum bp_op op)
{
    return bp__op_valid(op) && op_table[op].is_view;
}

const char *bp_unary_op_name(enum bp_unary_op op)
{
    return (unsigned)op < BP_UNARY_OP_COUNT ? unary_names[op] : "INVALID";
}

const char *bp_glu_op_name(enum bp_glu_op op)
{
    switch (op) {
    case BP_GLU_OP_SWIGLU:
        return "SWIGLU";
    case BP_GLU_OP_GEGLU:
        return "GEGLU";
    case BP_GLU_OP_GEGLU_ERF:
        return "GEGLU_ERF";
    default:
        return "INVALID";
    }
}

static void set_param_f32(bp_tensor *t, int i, float v)
{
    memcpy(&t->op_params[i], &v, sizeof(v));
}

/* Common check: every listed source must be non-NULL. */
#define REQUIRE_SRC(op, t)                                                                     \
    do {                                                                                       \
        if ((t) == NULL)                                                                       \
            return bp__error_null(BP_ERR_INVALID_ARG, "%s: source '%s' is NULL", op, #t);      \
    } while (0)

static bp_tensor *require_type(const char *op, const char *role, const bp_tensor *t,
                               enum bp_type want)
{
    if (t->type != want)
        return bp__error_null(BP_ERR_TYPE, "%s: %s %s must be %s", op, role, bp__describe(t).s,
                              bp_type_name(want));
    return (bp_tensor *)t;
}

/* A new tensor of the given type and shape that computes op from a (and optionally b). */
static bp_tensor *make(bp_context *ctx, const char *opname, enum bp_op op, enum bp_type type,
                       int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
{
    bp_tensor *t = bp__new_tensor_impl(ctx, type, (int64_t[]){ne0, ne1, ne2, ne3}, opname);
    if (t != NULL)
        t->op = op;
    return t;
}

/* Result with a's shape: a fresh tensor, or a view of a for in-place ops. */
static bp_tensor *make_like(bp_context *ctx, const char *opname, enum bp_op op, bp_tensor *a,
                            bool inplace)
{
    if (!inplace)
        return make(ctx, opname, op, a->type, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    bp_tensor *t = bp__view_of(ctx, a, opname);
    if (t != NULL)
        t->op = op;
    return t;
}

/* ---- Rows ------------------------------------------------------------------------------- */

bp_tensor *bp_get_rows(bp_context *ctx, bp_tensor *a, bp_tensor *ids)
{
    REQUIRE_SRC("bp_get_rows", a);
    REQUIRE_SRC("bp_get_rows", ids);
    if (!require_type("bp_get_rows", "ids", ids, BP_TYPE_I32))
        return NULL;
    if (a->type == BP_TYPE_I32)
        return bp__error_null(BP_ERR_TYPE, "bp_get_rows: table %s must be a float or quantised type",
                              bp__describe(a).s);
    if (ids->ne[3] != 1 || a->ne[2] != ids->ne[1] || a->ne[3] != ids->ne[2])
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_get_rows: ids %s must be [n, %lld, %lld, 1] to index table %s",
                              bp__describe(ids).s, (long long)a->ne[2], (long long)a->ne[3],
                              bp__describe(a).s);
    bp_tensor *t = make(ctx, "bp_get_rows", BP_OP_GET_ROWS, BP_TYPE_F32, a->ne[0], ids->ne[0],
                        ids->ne[1], ids->ne[2]);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->src[1] = ids;
    return t;
}

bp_tensor *bp_set_rows(bp_context *ctx, bp_tensor *dst, bp_tensor *src, bp_tensor *ids)
{
    REQUIRE_SRC("bp_set_rows", dst);
    REQUIRE_SRC("bp_set_rows", src);
    REQUIRE_SRC("bp_set_rows", ids);
    if (!require_type("bp_set_rows", "src", src, BP_TYPE_F32) ||
        !require_type("bp_set_rows", "ids", ids, BP_TYPE_I32))
        return NULL;
    if (dst->type == BP_TYPE_I32)
        return bp__error_null(BP_ERR_TYPE, "bp_set_rows: destination %s must be a float or "
                              "quantised type", bp__describe(dst).s);
    if (src->ne[0] != dst->ne[0] || src->ne[2] != dst->ne[2] || src->ne[3] != dst->ne[3])
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_set_rows: rows of src %s do not fit destination %s (ne0, ne2 and "
                              "ne3 must match)",
                              bp__describe(src).s, bp__describe(dst).s);
    if (ids->ne[0] != src->ne[1] || ids->ne[3] != 1 || ids->ne[1] == 0 || ids->ne[2] == 0 ||
        src->ne[2] % ids->ne[1] != 0 || src->ne[3] % ids->ne[2] != 0)
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_set_rows: ids %s must be [%lld, b, c, 1] with b dividing %lld and "
                              "c dividing %lld, for src %s",
                              bp__describe(ids).s, (long long)src->ne[1], (long long)src->ne[2],
                              (long long)src->ne[3], bp__describe(src).s);
    if (bp__tensors_overlap(src, dst))
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_set_rows: rows %s overlap their destination %s; copy them with "
                              "bp_cont first",
                              bp__describe(src).s, bp__describe(dst).s);
    bp_tensor *t = bp__view_of(ctx, dst, "bp_set_rows");
    if (t == NULL)
        return NULL;
    t->op = BP_OP_SET_ROWS;
    t->src[0] = dst;
    t->src[1] = src;
    t->src[2] = ids;
    return t;
}

/* ---- Element-wise ----------------------------------------------------------------------- */

static bp_tensor *binary(bp_context *ctx, const char *opname, enum bp_op op, bp_tensor *a,
                         bp_tensor *b, bool inplace)
{
    REQUIRE_SRC(opname, a);
    REQUIRE_SRC(opname, b);
    if (a->type != BP_TYPE_F32 || b->type != BP_TYPE_F32)
        return bp__error_null(BP_ERR_TYPE, "%s: operands %s and %s must both be f32", opname,
                              bp__describe(a).s, bp__describe(b).s);
    if (!bp_can_repeat(b, a))
        return bp__error_null(BP_ERR_SHAPE,
                              "%s: cannot broadcast %s over %s (each size of the first operand "
                              "must be a multiple of the second's)",
                              opname, bp__describe(b).s, bp__describe(a).s);
    bp_tensor *t = make_like(ctx, opname, op, a, inplace);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

bp_tensor *bp_add(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_add", BP_OP_ADD, a, b, false);
}
bp_tensor *bp_sub(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_sub", BP_OP_SUB, a, b, false);
}
bp_tensor *bp_mul(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_mul", BP_OP_MUL, a, b, false);
}
bp_tensor *bp_div(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_div", BP_OP_DIV, a, b, false);
}
bp_tensor *bp_add_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_add_inplace", BP_OP_ADD, a, b, true);
}
bp_tensor *bp_sub_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_sub_inplace", BP_OP_SUB, a, b, true);
}
bp_tensor *bp_mul_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_mul_inplace", BP_OP_MUL, a, b, true);
}
bp_tensor *bp_div_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    return binary(ctx, "bp_div_inplace", BP_OP_DIV, a, b, true);
}

static bp_tensor *scale_impl(bp_context *ctx, const char *opname, bp_tensor *a, float s,
                             bool inplace)
{
    REQUIRE_SRC(opname, a);
    if (!require_type(opname, "operand", a, BP_TYPE_F32))
        return NULL;
    bp_tensor *t = make_like(ctx, opname, BP_OP_SCALE, a, inplace);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    set_param_f32(t, 0, s);
    return t;
}

bp_tensor *bp_scale(bp_context *ctx, bp_tensor *a, float s)
{
    return scale_impl(ctx, "bp_scale", a, s, false);
}

bp_tensor *bp_scale_inplace(bp_context *ctx, bp_tensor *a, float s)
{
    return scale_impl(ctx, "bp_scale_inplace", a, s, true);
}

static bp_tensor *unary_impl(bp_context *ctx, bp_tensor *a, enum bp_unary_op op, bool inplace)
{
    const char *opname = inplace ? "bp_unary_inplace" : "bp_unary";
    REQUIRE_SRC(opname, a);
    if ((unsigned)op >= BP_UNARY_OP_COUNT)
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: %d is not a unary op (valid: 0..%d)",
                              opname, (int)op, BP_UNARY_OP_COUNT - 1);
    if (a->type != BP_TYPE_F32)
        return bp__error_null(BP_ERR_TYPE, "%s: %s operand %s must be f32", opname,
                              bp_unary_op_name(op), bp__describe(a).s);
    bp_tensor *t = make_like(ctx, opname, BP_OP_UNARY, a, inplace);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->op_params[0] = (int32_t)op;
    return t;
}

bp_tensor *bp_unary(bp_context *ctx, bp_tensor *a, enum bp_unary_op op)
{
    return unary_impl(ctx, a, op, false);
}

bp_tensor *bp_unary_inplace(bp_context *ctx, bp_tensor *a, enum bp_unary_op op)
{
    return unary_impl(ctx, a, op, true);
}

#define BP_UNARY_SHORTHAND(fn, OP)                                                             \
    bp_tensor *fn(bp_context *ctx, bp_tensor *a)                                               \
    {                                                                                          \
        return unary_impl(ctx, a, BP_UNARY_OP_##OP, false);                                    \
    }
BP_UNARY_SHORTHAND(bp_neg, NEG)
BP_UNARY_SHORTHAND(bp_abs, ABS)
BP_UNARY_SHORTHAND(bp_relu, RELU)
BP_UNARY_SHORTHAND(bp_gelu, GELU)
BP_UNARY_SHORTHAND(bp_silu, SILU)
BP_UNARY_SHORTHAND(bp_sigmoid, SIGMOID)
BP_UNARY_SHORTHAND(bp_tanh, TANH)
BP_UNARY_SHORTHAND(bp_exp, EXP)
BP_UNARY_SHORTHAND(bp_sqr, SQR)
BP_UNARY_SHORTHAND(bp_sqrt, SQRT)
BP_UNARY_SHORTHAND(bp_gelu_erf, GELU_ERF)
#undef BP_UNARY_SHORTHAND

/* ---- Row reductions and normalisations -------------------------------------------------- */

static bp_tensor *reduce_rows(bp_context *ctx, const char *opname, enum bp_op op, bp_tensor *a,
                              enum bp_type out_type)
{
    REQUIRE_SRC(opname, a);
    if (!require_type(opname, "operand", a, BP_TYPE_F32))
        return NULL;
    if (op == BP_OP_ARGMAX && a->ne[0] == 0)
        return bp__error_null(BP_ERR_SHAPE, "%s: rows of %s are empty, so they have no maximum",
                              opname, bp__describe(a).s);
    bp_tensor *t = make(ctx, opname, op, out_type, 1, a->ne[1], a->ne[2], a->ne[3]);
    if (t != NULL)
        t->src[0] = a;
    return t;
}

bp_tensor *bp_sum_rows(bp_context *ctx, bp_tensor *a)
{
    return reduce_rows(ctx, "bp_sum_rows", BP_OP_SUM_ROWS, a, BP_TYPE_F32);
}

bp_tensor *bp_mean(bp_context *ctx, bp_tensor *a)
{
    return reduce_rows(ctx, "bp_mean", BP_OP_MEAN, a, BP_TYPE_F32);
}

bp_tensor *bp_argmax(bp_context *ctx, bp_tensor *a)
{
    return reduce_rows(ctx, "bp_argmax", BP_OP_ARGMAX, a, BP_TYPE_I32);
}

static bp_tensor *norm_impl(bp_context *ctx, const char *opname, enum bp_op op, bp_tensor *a,
                            float eps)
{
    REQUIRE_SRC(opname, a);
    if (!require_type(opname, "operand", a, BP_TYPE_F32))
        return NULL;
    if (!(eps >= 0.0f) || isinf(eps))
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: eps %g for %s must be finite and >= 0",
                              opname, (double)eps, bp__describe(a).s);
    bp_tensor *t = make_like(ctx, opname, op, a, false);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    set_param_f32(t, 0, eps);
    return t;
}

bp_tensor *bp_norm(bp_context *ctx, bp_tensor *a, float eps)
{
    return norm_impl(ctx, "bp_norm", BP_OP_NORM, a, eps);
}

bp_tensor *bp_rms_norm(bp_context *ctx, bp_tensor *a, float eps)
{
    return norm_impl(ctx, "bp_rms_norm", BP_OP_RMS_NORM, a, eps);
}

bp_tensor *bp_l2_norm(bp_context *ctx, bp_tensor *a, float eps)
{
    return norm_impl(ctx, "bp_l2_norm", BP_OP_L2_NORM, a, eps);
}

bp_tensor *bp_argsort(bp_context *ctx, bp_tensor *a, enum bp_sort_order order)
{
    REQUIRE_SRC("bp_argsort", a);
    if (!require_type("bp_argsort", "operand", a, BP_TYPE_F32))
        return NULL;
    if (order != BP_SORT_ASC && order != BP_SORT_DESC)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_argsort: %d is not a sort order "
                              "(BP_SORT_ASC or BP_SORT_DESC)", (int)order);
    if (a->ne[0] > INT32_MAX)
        return bp__error_null(BP_ERR_SHAPE, "bp_argsort: rows of %s are longer than an I32 "
                              "index reaches", bp__describe(a).s);
    bp_tensor *t = make(ctx, "bp_argsort", BP_OP_ARGSORT, BP_TYPE_I32, a->ne[0], a->ne[1],
                        a->ne[2], a->ne[3]);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->op_params[0] = (int32_t)order;
    return t;
}

bp_tensor *bp_top_k(bp_context *ctx, bp_tensor *a, int k)
{
    REQUIRE_SRC("bp_top_k", a);
    if (!require_type("bp_top_k", "operand", a, BP_TYPE_F32))
        return NULL;
    if (k < 1 || k > a->ne[0])
        return bp__error_null(BP_ERR_SHAPE, "bp_top_k: k = %d for rows of %lld values of %s "
                              "(need 1 <= k <= ne0)", k, (long long)a->ne[0],
                              bp__describe(a).s);
    if (a->ne[0] > INT32_MAX)
        return bp__error_null(BP_ERR_SHAPE, "bp_top_k: rows of %s are longer than an I32 index "
                              "reaches", bp__describe(a).s);
    bp_tensor *t = make(ctx, "bp_top_k", BP_OP_TOP_K, BP_TYPE_I32, k, a->ne[1], a->ne[2],
                        a->ne[3]);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->op_params[0] = k;
    return t;
}

bp_tensor *bp_clamp(bp_context *ctx, bp_tensor *a, float lo, float hi)
{
    REQUIRE_SRC("bp_clamp", a);
    if (!require_type("bp_clamp", "operand", a, BP_TYPE_F32))
        return NULL;
    if (isnan(lo) || isnan(hi) || lo > hi)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_clamp: bounds [%g, %g] for %s must be "
                              "numbers with lo <= hi", (double)lo, (double)hi,
                              bp__describe(a).s);
    bp_tensor *t = make_like(ctx, "bp_clamp", BP_OP_CLAMP, a, false);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    set_param_f32(t, 0, lo);
    set_param_f32(t, 1, hi);
    return t;
}

/* ---- Matrix multiplication -------------------------------------------------------------- */

bp_tensor *bp_mul_mat(bp_context *ctx, bp_tensor *a, bp_tensor *b)
{
    REQUIRE_SRC("bp_mul_mat", a);
    REQUIRE_SRC("bp_mul_mat", b);
    if (a->type == BP_TYPE_I32)
        return bp__error_null(BP_ERR_TYPE, "bp_mul_mat: weights %s must be a float or quantised "
                              "type", bp__describe(a).s);
    if (!require_type("bp_mul_mat", "activations", b, BP_TYPE_F32))
        return NULL;
    if (a->ne[0] != b->ne[0])
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_mul_mat: inner dimensions differ: %s has K = %lld but %s has "
                              "K = %lld",
                              bp__describe(a).s, (long long)a->ne[0], bp__describe(b).s,
                              (long long)b->ne[0]);
    if (a->ne[2] == 0 || a->ne[3] == 0 || b->ne[2] % a->ne[2] != 0 || b->ne[3] % a->ne[3] != 0)
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_mul_mat: batch dimensions of %s must be multiples of those of %s",
                              bp__describe(b).s, bp__describe(a).s);
    bp_tensor *t = make(ctx, "bp_mul_mat", BP_OP_MUL_MAT, BP_TYPE_F32, a->ne[1], b->ne[1],
                        b->ne[2], b->ne[3]);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

bp_tensor *bp_mul_mat_id(bp_context *ctx, bp_tensor *as, bp_tensor *b, bp_tensor *ids)
{
    REQUIRE_SRC("bp_mul_mat_id", as);
    REQUIRE_SRC("bp_mul_mat_id", b);
    REQUIRE_SRC("bp_mul_mat_id", ids);
    if (as->type == BP_TYPE_I32)
        return bp__error_null(BP_ERR_TYPE, "bp_mul_mat_id: expert weights %s must be a float or "
                              "quantised type", bp__describe(as).s);
    if (!require_type("bp_mul_mat_id", "activations", b, BP_TYPE_F32) ||
        !require_type("bp_mul_mat_id", "ids", ids, BP_TYPE_I32))
        return NULL;
    if (as->ne[3] != 1 || as->ne[2] < 1)
        return bp__error_null(BP_ERR_SHAPE, "bp_mul_mat_id: expert weights %s must be [K, M, "
                              "n_expert, 1] with at least one expert", bp__describe(as).s);
    const size_t bs = bp_type_size(as->type);
    if (as->nb[0] != bs || as->nb[1] % bs != 0 || as->nb[2] % bs != 0)
        return bp__error_null(BP_ERR_SHAPE, "bp_mul_mat_id: expert weights %s must have rows "
                              "contiguous along K, and row and expert strides of whole %s blocks",
                              bp__describe(as).s, bp_type_name(as->type));
    if (ids->ne[2] != 1 || ids->ne[3] != 1)
        return bp__error_null(BP_ERR_SHAPE, "bp_mul_mat_id: ids %s must be [n_used, n_tokens, 1, "
                              "1]", bp__describe(ids).s);
    if (b->ne[0] != as->ne[0] || (b->ne[1] != 1 && b->ne[1] != ids->ne[0]) ||
        b->ne[2] != ids->ne[1] || b->ne[3] != 1)
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_mul_mat_id: activations %s must be [%lld, %lld or 1, %lld, 1] "
                              "for expert weights %s and ids %s",
                              bp__describe(b).s, (long long)as->ne[0], (long long)ids->ne[0],
                              (long long)ids->ne[1], bp__describe(as).s, bp__describe(ids).s);
    bp_tensor *t = make(ctx, "bp_mul_mat_id", BP_OP_MUL_MAT_ID, BP_TYPE_F32, as->ne[1],
                        ids->ne[0], ids->ne[1], 1);
    if (t == NULL)
        return NULL;
    t->src[0] = as;
    t->src[1] = b;
    t->src[2] = ids;
    return t;
}

bp_tensor *bp_mul_mat_set_precision(bp_tensor *mm, enum bp_mm_precision precision)
{
    if (mm == NULL || mm->op != BP_OP_MUL_MAT)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_mul_mat_set_precision: %s is not a "
                              "MUL_MAT node", mm ? bp__describe(mm).s : "NULL");
    if (precision != BP_MM_PRECISION_DEFAULT && precision != BP_MM_PRECISION_HALF)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_mul_mat_set_precision: %d is not a "
                              "precision (BP_MM_PRECISION_DEFAULT or _HALF)", (int)precision);
    mm->op_params[0] = (int32_t)precision;
    return mm;
}

enum bp_mm_precision bp_mul_mat_get_precision(const bp_tensor *mm)
{
    return mm != NULL && mm->op == BP_OP_MUL_MAT && mm->op_params[0] == BP_MM_PRECISION_HALF
               ? BP_MM_PRECISION_HALF
               : BP_MM_PRECISION_DEFAULT;
}

/* ---- Attention pieces ------------------------------------------------------------------- */

bp_tensor *bp_soft_max(bp_context *ctx, bp_tensor *a)
{
    return bp_soft_max_ext(ctx, a, NULL, 1.0f);
}

bp_tensor *bp_soft_max_ext(bp_context *ctx, bp_tensor *a, bp_tensor *mask, float scale)
{
    REQUIRE_SRC("bp_soft_max", a);
    if (!require_type("bp_soft_max", "operand", a, BP_TYPE_F32))
        return NULL;
    if (!isfinite(scale))
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_soft_max: scale %g for %s is not finite",
                              (double)scale, bp__describe(a).s);
    if (mask != NULL) {
        if (mask->type != BP_TYPE_F32 && mask->type != BP_TYPE_F16)
            return bp__error_null(BP_ERR_TYPE, "bp_soft_max: mask %s must be f32 or f16",
                                  bp__describe(mask).s);
        if (mask->ne[0] != a->ne[0] || mask->ne[1] < a->ne[1] || mask->ne[2] == 0 ||
            mask->ne[3] == 0 || a->ne[2] % mask->ne[2] != 0 || a->ne[3] % mask->ne[3] != 0)
            return bp__error_null(BP_ERR_SHAPE,
                                  "bp_soft_max: mask %s does not cover %s (need the same ne0, at "
                                  "least as many rows, and ne2/ne3 dividing the input's)",
                                  bp__describe(mask).s, bp__describe(a).s);
    }
    bp_tensor *t = make_like(ctx, "bp_soft_max", BP_OP_SOFT_MAX, a, false);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->src[1] = mask;
    set_param_f32(t, 0, scale);
    return t;
}

enum bp_status bp_soft_max_add_sinks(bp_tensor *s, bp_tensor *sinks)
{
    if (s == NULL || sinks == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_soft_max_add_sinks: %s is NULL",
                         s == NULL ? "the softmax" : "sinks");
    if (s->op != BP_OP_SOFT_MAX)
        return bp__error(BP_ERR_INVALID_ARG, "bp_soft_max_add_sinks: %s is not a SOFT_MAX node",
                         bp__describe(s).s);
    if (s->src[2] != NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_soft_max_add_sinks: %s has sinks already",
                         bp__describe(s).s);
    if (sinks->type != BP_TYPE_F32 || !bp_is_contiguous(sinks) ||
        bp_nelements(sinks) != s->ne[2] || sinks->ne[0] != s->ne[2])
        return bp__error(BP_ERR_SHAPE, "bp_soft_max_add_sinks: sinks %s must be an f32 vector "
                         "of one value per head (%lld) of %s", bp__describe(sinks).s,
                         (long long)s->ne[2], bp__describe(s).s);
    s->src[2] = sinks;
    return BP_OK;
}

bp_tensor *bp_rope(bp_context *ctx, bp_tensor *x, bp_tensor *pos, int n_dims,
                   enum bp_rope_mode mode, float freq_base, float freq_scale)
{
    REQUIRE_SRC("bp_rope", x);
    REQUIRE_SRC("bp_rope", pos);
    if (!require_type("bp_rope", "input", x, BP_TYPE_F32) ||
        !require_type("bp_rope", "positions", pos, BP_TYPE_I32))
        return NULL;
    if (pos->ne[0] != x->ne[2] || bp_nelements(pos) != pos->ne[0])
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_rope: positions %s must be a vector of one position per token "
                              "(%lld) of %s",
                              bp__describe(pos).s, (long long)x->ne[2], bp__describe(x).s);
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > x->ne[0])
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_rope: n_dims %d must be even, positive and at most the head size "
                              "%lld of %s",
                              n_dims, (long long)x->ne[0], bp__describe(x).s);
    if (mode != BP_ROPE_NORMAL && mode != BP_ROPE_NEOX)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_rope: mode %d is neither BP_ROPE_NORMAL nor "
                              "BP_ROPE_NEOX", (int)mode);
    if (!(freq_base > 0.0f) || !isfinite(freq_base) || !(freq_scale > 0.0f) ||
        !isfinite(freq_scale))
        return bp__error_null(BP_ERR_INVALID_ARG,
                              "bp_rope: freq_base %g and freq_scale %g must be finite and positive",
                              (double)freq_base, (double)freq_scale);
    bp_tensor *t = make_like(ctx, "bp_rope", BP_OP_ROPE, x, false);
    if (t == NULL)
        return NULL;
    t->src[0] = x;
    t->src[1] = pos;
    t->op_params[0] = n_dims;
    t->op_params[1] = (int32_t)mode;
    set_param_f32(t, 2, freq_base);
    set_param_f32(t, 3, freq_scale);
    set_param_f32(t, 4, 0.0f);
    set_param_f32(t, 5, 1.0f);
    return t;
}

/* The pair position where a rotation's wavelength fits n_ctx_orig exactly n_rot times. */
static double yarn_corr_dim(int n_dims, int n_ctx_orig, double n_rot, double base)
{
    return n_dims * log(n_ctx_orig / (n_rot * 2 * M_PI)) / (2 * log(base));
}

bp_tensor *bp_rope_ext(bp_context *ctx, bp_tensor *x, bp_tensor *pos, int n_dims,
                       enum bp_rope_mode mode, int n_ctx_orig, float freq_base, float freq_scale,
                       float ext_factor, float attn_factor, float beta_fast, float beta_slow)
{
    if (!(ext_factor >= 0.0f && ext_factor <= 1.0f) || !(attn_factor > 0.0f) ||
        !isfinite(attn_factor) || !isfinite(beta_fast) || !isfinite(beta_slow) ||
        !(beta_fast > 0.0f) || !(beta_slow > 0.0f) || (ext_factor > 0.0f && n_ctx_orig < 1))
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_rope_ext: ext_factor %g must be in [0, 1], "
                              "attn_factor %g, beta_fast %g and beta_slow %g finite and positive, "
                              "n_ctx_orig %d positive", (double)ext_factor, (double)attn_factor,
                              (double)beta_fast, (double)beta_slow, n_ctx_orig);
    bp_tensor *t = bp_rope(ctx, x, pos, n_dims, mode, freq_base, freq_scale);
    if (t == NULL)
        return NULL;
    double lo = 0, hi = 0, mscale = attn_factor;
    if (ext_factor > 0.0f) {
        lo = fmax(0.0, floor(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base)));
        hi = fmin(n_dims - 1, ceil(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base)));
        mscale *= 1.0 + 0.1 * log(1.0 / freq_scale);
    }
    set_param_f32(t, 4, ext_factor);
    set_param_f32(t, 5, (float)mscale);
    set_param_f32(t, 6, (float)lo);
    set_param_f32(t, 7, (float)hi);
    set_param_f32(t, 8, attn_factor);
    set_param_f32(t, 9, beta_fast);
    set_param_f32(t, 10, beta_slow);
    t->op_params[11] = n_ctx_orig;
    return t;
}

bp_tensor *bp_concat(bp_context *ctx, bp_tensor *a, bp_tensor *b, int dim)
{
    REQUIRE_SRC("bp_concat", a);
    REQUIRE_SRC("bp_concat", b);
    if (dim < 0 || dim >= BP_MAX_DIMS)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_concat: dim %d is not 0..3", dim);
    if (a->type != b->type || bp_type_block_size(a->type) != 1)
        return bp__error_null(BP_ERR_TYPE,
                              "bp_concat: %s and %s must have the same, non-quantised type",
                              bp__describe(a).s, bp__describe(b).s);
    int64_t ne[BP_MAX_DIMS];
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (i != dim && a->ne[i] != b->ne[i])
            return bp__error_null(BP_ERR_SHAPE,
                                  "bp_concat: %s and %s differ in dimension %d, not only in the "
                                  "concatenated dimension %d",
                                  bp__describe(a).s, bp__describe(b).s, i, dim);
        ne[i] = a->ne[i];
    }
    if (__builtin_add_overflow(a->ne[dim], b->ne[dim], &ne[dim]))
        return bp__error_null(BP_ERR_SHAPE,
                              "bp_concat: %s and %s together are too long in dimension %d",
                              bp__describe(a).s, bp__describe(b).s, dim);
    bp_tensor *t = make(ctx, "bp_concat", BP_OP_CONCAT, a->type, ne[0], ne[1], ne[2], ne[3]);
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->src[1] = b;
    t->op_params[0] = dim;
    return t;
}

bp_tensor *bp_glu(bp_context *ctx, bp_tensor *a, bp_tensor *b, enum bp_glu_op op)
{
    REQUIRE_SRC("bp_glu", a);
    if ((unsigned)op >= BP_GLU_OP_COUNT)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_glu: %d is not a GLU op (valid: 0..%d)",
                              (int)op, BP_GLU_OP_COUNT - 1);
    if (!require_type("bp_glu", "gate", a, BP_TYPE_F32))
        return NULL;
    bp_tensor *t;
    if (b != NULL) {
        if (!require_type("bp_glu", "value", b, BP_TYPE_F32))
            return NULL;
        if (!bp_are_same_shape(a, b))
            return bp__error_null(BP_ERR_SHAPE, "bp_glu: gate %s and value %s differ in shape",
                                  bp__describe(a).s, bp__describe(b).s);
        t = make_like(ctx, "bp_glu", BP_OP_GLU, a, false);
    } else {
        if (a->ne[0] % 2 != 0)
            return bp__error_null(BP_ERR_SHAPE,
                                  "bp_glu: %s has an odd row length, so it cannot be split into "
                                  "gate and value halves",
                                  bp__describe(a).s);
        t = make(ctx, "bp_glu", BP_OP_GLU, BP_TYPE_F32, a->ne[0] / 2, a->ne[1], a->ne[2],
                 a->ne[3]);
    }
    if (t == NULL)
        return NULL;
    t->src[0] = a;
    t->src[1] = b;
    t->op_params[0] = (int32_t)op;
    t->op_params[1] = b == NULL;
    return t;
}

bp_tensor *bp_swiglu(bp_context *ctx, bp_tensor *gate, bp_tensor *up)
{
    return bp_glu(ctx, gate, up, BP_GLU_OP_SWIGLU);
}

bp_tensor *bp_geglu(bp_context *ctx, bp_tensor *gate, bp_tensor *up)
{
    return bp_glu(ctx, gate, up, BP_GLU_OP_GEGLU);
}

bp_tensor *bp_geglu_erf(bp_context *ctx, bp_tensor *gate, bp_tensor *up)
{
    return bp_glu(ctx, gate, up, BP_GLU_OP_GEGLU_ERF);
}

/* The key and value types: the float ones and llama.cpp's quantised cache types (blocks of 32,
 * so every row must be whole blocks). */
static bool attn_kv_type(enum bp_type t)
{
    return t == BP_TYPE_F32 || t == BP_TYPE_F16 || t == BP_TYPE_BF16 || t == BP_TYPE_Q8_0 ||
           t == BP_TYPE_Q4_0 || t == BP_TYPE_Q4_1 || t == BP_TYPE_Q5_0 || t == BP_TYPE_Q5_1 ||
           t == BP_TYPE_IQ4_NL;
}

bp_tensor *bp_flash_attn_ext(bp_context *ctx, bp_tensor *q, bp_tensor *k, bp_tensor *v,
                             bp_tensor *mask, float scale, float softcap, int flags)
{
    static const char *const op = "bp_flash_attn_ext";
    REQUIRE_SRC(op, q);
    REQUIRE_SRC(op, k);
    REQUIRE_SRC(op, v);
    if (!require_type(op, "query", q, BP_TYPE_F32))
        return NULL;
    if (!attn_kv_type(k->type) || !attn_kv_type(v->type))
        return bp__error_null(BP_ERR_TYPE, "%s: keys %s and values %s must be f32, f16, bf16, "
                              "q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl", op, bp__describe(k).s,
                              bp__describe(v).s);
    if (k->ne[0] % bp_type_block_size(k->type) != 0 ||
        v->ne[0] % bp_type_block_size(v->type) != 0)
        return bp__error_null(BP_ERR_SHAPE, "%s: quantised keys %s or values %s need rows of whole "
                              "32-value blocks", op, bp__describe(k).s, bp__describe(v).s);
    if (!isfinite(scale) || !isfinite(softcap) || softcap < 0.0f)
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: scale %g and softcap %g must be finite, "
                              "softcap 0 (none) or positive", op, (double)scale, (double)softcap);
    if ((flags & ~BP_ATTN_CAUSAL) != 0)
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: flags 0x%x name no option (valid: "
                              "BP_ATTN_CAUSAL)", op, (unsigned)flags);
    if (k->ne[0] != q->ne[0] || v->ne[1] != k->ne[1] || v->ne[2] != k->ne[2] ||
        v->ne[3] != k->ne[3])
        return bp__error_null(BP_ERR_SHAPE, "%s: keys %s must have the query's row length and "
                              "the values' %s positions and heads (query %s)", op,
                              bp__describe(k).s, bp__describe(v).s, bp__describe(q).s);
    if (k->ne[2] == 0 || q->ne[2] % k->ne[2] != 0 || (k->ne[3] != 1 && k->ne[3] != q->ne[3]))
        return bp__error_null(BP_ERR_SHAPE, "%s: the %lld key/value heads of %s must divide the "
                              "%lld query heads of %s, and their sequences be 1 or as many",
                              op, (long long)k->ne[2], bp__describe(k).s, (long long)q->ne[2],
                              bp__describe(q).s);
    if ((flags & BP_ATTN_CAUSAL) != 0 && q->ne[1] > k->ne[1])
        return bp__error_null(BP_ERR_SHAPE, "%s: causal attention of %lld query rows over %lld "
                              "keys: the queries must be the last positions of the keys", op,
                              (long long)q->ne[1], (long long)k->ne[1]);
    if (mask != NULL) {
        if (mask->type != BP_TYPE_F32 && mask->type != BP_TYPE_F16)
            return bp__error_null(BP_ERR_TYPE, "%s: mask %s must be f32 or f16", op,
                                  bp__describe(mask).s);
        if (mask->ne[0] != k->ne[1] || mask->ne[1] < q->ne[1] || mask->ne[2] == 0 ||
            mask->ne[3] == 0 || q->ne[2] % mask->ne[2] != 0 || q->ne[3] % mask->ne[3] != 0)
            return bp__error_null(BP_ERR_SHAPE, "%s: mask %s does not cover the scores of query "
                                  "%s over keys %s (need one column per key, a row per query, "
                                  "ne2/ne3 dividing the heads/sequences)", op,
                                  bp__describe(mask).s, bp__describe(q).s, bp__describe(k).s);
    }
    bp_tensor *t = make(ctx, op, BP_OP_FLASH_ATTN_EXT, BP_TYPE_F32, v->ne[0], q->ne[2], q->ne[1],
                        q->ne[3]);
    if (t == NULL)
        return NULL;
    t->src[0] = q;
    t->src[1] = k;
    t->src[2] = v;
    t->src[3] = mask;
    set_param_f32(t, 0, scale);
    set_param_f32(t, 1, softcap);
    t->op_params[2] = flags;
    return t;
}
