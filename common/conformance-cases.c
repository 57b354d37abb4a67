/* conformance-cases.c - private to the source tree: every (op, type, shape) case of the conformance
 * suite. Shapes include 1, odd primes, sizes that are not multiples of a SIMD width or of the
 * 512-wide K blocks of blocked matrix products, broadcast sources, and permuted, transposed and
 * strided views as sources. Each builder makes its own leafs; variants pick shapes and types. */
#include "conformance.h"

#include <math.h>
#include <stddef.h>

#define NMSE_F32 1e-9   /* float kernels against the double reference */
#define NMSE_QUANT 2e-4 /* MUL_MAT with Q8_0/Q4_0 weights: activations are quantised to Q8_0 */
#define NMSE_HALF 1e-5  /* MUL_MAT under BP_MM_PRECISION_HALF: activations rounded to 16 bits */
/* Rows written in the KV-cache types: exact where backend and reference share the runtime's
 * quantiser; IQ4_NL's two searches for the best scale may round a sum differently (fused
 * multiply-adds) and pick another scale for a block, which costs far less than this. */
#define NMSE_KV_ROWS 1e-4

static bp_tensor *leaf(bp_context *ctx, enum bp_type t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return bp_new_tensor_4d(ctx, t, a, b, c, d);
}

static bp_tensor *f32(bp_context *ctx, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return leaf(ctx, BP_TYPE_F32, a, b, c, d);
}

/* Shape sets for element-wise families: a, then (variant-dependent) a non-contiguous form. */
static const int64_t shapes[][4] = {
    {1, 1, 1, 1}, {7, 5, 3, 2}, {33, 1, 1, 1}, {16, 17, 1, 1}, {131, 3, 2, 1}, {5, 1, 7, 1},
};
#define N_SHAPES 6

/* Variants 0..N_SHAPES-1: contiguous shape v; N_SHAPES..2*N_SHAPES-1: the same values reached
 * through a permuted view of a leaf laid out differently. */
static bp_tensor *shaped(bp_context *ctx, int v, const char *name)
{
    const int64_t *s = shapes[v % N_SHAPES];
    if (v < N_SHAPES)
        return bp_set_name(f32(ctx, s[0], s[1], s[2], s[3]), name);
    /* A leaf [s1, s0, s3, s2] permuted back to [s0, s1, s2, s3]. */
    bp_tensor *l = bp_set_name(f32(ctx, s[1], s[0], s[3], s[2]), name);
    return bp_permute(ctx, l, 1, 0, 3, 2);
}

/* ---- Copies and rows -------------------------------------------------------------------- */

static const enum bp_type all_types[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_BF16, BP_TYPE_Q8_0,
                                         BP_TYPE_Q4_0};

static bp_tensor *b_cpy(bp_context *ctx, int v) /* f32 -> every type, and back */
{
    enum bp_type t = all_types[v % 5];
    if (v < 5)
        return bp_cpy(ctx, f32(ctx, 64, 3, 2, 1), leaf(ctx, t, 64, 3, 2, 1));
    if (v < 10)
        return bp_cont(ctx, leaf(ctx, t, 96, 5, 1, 1)); /* t -> t: same-type copy */
    if (v < 15)
        return bp_cpy(ctx, leaf(ctx, t, 32, 7, 1, 1), f32(ctx, 32, 7, 1, 1));
    switch (v) {
    case 15: /* transposed source */
        return bp_cont(ctx, bp_transpose(ctx, f32(ctx, 13, 7, 2, 1)));
    case 16: /* permuted source into f16 */
        return bp_cpy(ctx, bp_permute(ctx, f32(ctx, 5, 3, 4, 2), 2, 0, 3, 1),
                      leaf(ctx, BP_TYPE_F16, 3, 2, 5, 4));
    case 17: /* different shape, same element count */
        return bp_cpy(ctx, f32(ctx, 6, 35, 1, 1), leaf(ctx, BP_TYPE_F16, 10, 21, 1, 1));
    case 18:
        return bp_dup(ctx, bp_view_2d(ctx, f32(ctx, 9, 8, 1, 1), 5, 3, 9 * 4, 2 * 9 * 4 + 4));
    case 20: /* attention's merge of heads: a permuted source laid out in another shape */
        return bp_cont_4d(ctx, bp_permute(ctx, f32(ctx, 8, 5, 3, 1), 0, 2, 1, 3), 24, 5, 1, 1);
    case 21: /* into f16, from a transposed source */
        return bp_cpy(ctx, bp_transpose(ctx, f32(ctx, 6, 7, 1, 1)), leaf(ctx, BP_TYPE_F16, 42, 1, 1, 1));
    case 22: { /* attention's V: an f16 cache [E = 3 heads x 64, 45 positions] seen as [64, 45, 3],
                * transposed per head (blocks of 16 x 16 and edges in both directions) */
        bp_tensor *cache = leaf(ctx, BP_TYPE_F16, 192, 45, 1, 1);
        bp_tensor *v3 = bp_view_3d(ctx, cache, 64, 45, 3, cache->nb[1], 64 * cache->nb[0], 0);
        return bp_cont(ctx, bp_permute(ctx, v3, 1, 0, 2, 3));
    }
    case 23: /* f16 and bf16 transposes with odd sizes on both sides */
        return bp_cont(ctx, bp_transpose(ctx, leaf(ctx, BP_TYPE_F16, 37, 50, 2, 1)));
    case 24:
        return bp_cont(ctx, bp_transpose(ctx, leaf(ctx, BP_TYPE_BF16, 33, 17, 1, 1)));
    default: /* i32 copy (variant 19) */
        return bp_cont(ctx, bp_transpose(ctx, leaf(ctx, BP_TYPE_I32, 4, 3, 1, 1)));
    }
}

static bp_tensor *b_get_rows(bp_context *ctx, int v)
{
    enum bp_type t = all_types[v % 5];
    int64_t e = t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0 ? 64 : 37;
    if (v < 5)
        return bp_get_rows(ctx, leaf(ctx, t, e, 11, 1, 1), leaf(ctx, BP_TYPE_I32, 5, 1, 1, 1));
    /* batched: one id list per matrix */
    return bp_get_rows(ctx, leaf(ctx, t, e, 6, 3, 1), leaf(ctx, BP_TYPE_I32, 4, 3, 1, 1));
}

static bp_tensor *b_set_rows(bp_context *ctx, int v)
{
    enum bp_type t = all_types[v % 5];
    int64_t e = t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0 ? 64 : 19;
    if (v < 5)
        return bp_set_rows(ctx, leaf(ctx, t, e, 9, 1, 1), f32(ctx, e, 4, 1, 1),
                           leaf(ctx, BP_TYPE_I32, 4, 1, 1, 1));
    /* per-head rows, ids broadcast over heads, source a permuted view */
    bp_tensor *src = bp_permute(ctx, f32(ctx, e, 3, 4, 1), 0, 2, 1, 3); /* [e, 4, 3] */
    return bp_set_rows(ctx, leaf(ctx, t, e, 10, 3, 1), src, leaf(ctx, BP_TYPE_I32, 4, 1, 1, 1));
}

/* ---- Element-wise ----------------------------------------------------------------------- */

static bp_tensor *binary(bp_context *ctx, int v, bp_tensor *(*fn)(bp_context *, bp_tensor *,
                                                                   bp_tensor *), const char *bname)
{
    bp_tensor *a = shaped(ctx, v % (2 * N_SHAPES), "a");
    int mode = v / (2 * N_SHAPES);
    bp_tensor *b;
    if (mode == 0) /* same shape */
        b = bp_set_name(f32(ctx, a->ne[0], a->ne[1], a->ne[2], a->ne[3]), bname);
    else if (mode == 1) /* one row repeated */
        b = bp_set_name(f32(ctx, a->ne[0], 1, 1, 1), bname);
    else /* a column repeated along ne0, tiled over the rest */
        b = bp_set_name(f32(ctx, 1, a->ne[1], 1, a->ne[3]), bname);
    return fn(ctx, a, b);
}

static bp_tensor *b_add(bp_context *ctx, int v) { return binary(ctx, v, bp_add, "b"); }
static bp_tensor *b_sub(bp_context *ctx, int v) { return binary(ctx, v, bp_sub, "b"); }
static bp_tensor *b_mul(bp_context *ctx, int v) { return binary(ctx, v, bp_mul, "b"); }
static bp_tensor *b_div(bp_context *ctx, int v) { return binary(ctx, v, bp_div, "pos:b"); }

static bp_tensor *b_binary_transposed_b(bp_context *ctx, int v)
{
    bp_tensor *a = f32(ctx, 9, 6, 1, 1);
    bp_tensor *b = bp_transpose(ctx, f32(ctx, 6, 9, 1, 1));
    return v == 0 ? bp_add(ctx, a, b) : bp_mul(ctx, a, b);
}

static bp_tensor *b_scale(bp_context *ctx, int v)
{
    return bp_scale(ctx, shaped(ctx, v, "a"), -1.75f);
}

static bp_tensor *b_unary(bp_context *ctx, int v)
{
    enum bp_unary_op op = (enum bp_unary_op)(v % BP_UNARY_OP_COUNT);
    int s = v / BP_UNARY_OP_COUNT; /* 0..2*N_SHAPES-1 */
    return bp_unary(ctx, shaped(ctx, s, op == BP_UNARY_OP_SQRT ? "pos:a" : "a"), op);
}

static bp_tensor *b_glu(bp_context *ctx, int v)
{
    enum bp_glu_op op = (enum bp_glu_op)(v % BP_GLU_OP_COUNT);
    switch (v / BP_GLU_OP_COUNT) {
    case 0:
        return bp_glu(ctx, f32(ctx, 22, 3, 2, 1), NULL, op);
    case 1:
        return bp_glu(ctx, f32(ctx, 37, 4, 1, 1), f32(ctx, 37, 4, 1, 1), op);
    default:
        return bp_glu(ctx, shaped(ctx, N_SHAPES + 1, "a"), shaped(ctx, 1, "b"), op);
    }
}

/* ---- Rows ------------------------------------------------------------------------------- */

static const enum bp_op row_ops[] = {BP_OP_SUM_ROWS, BP_OP_MEAN, BP_OP_ARGMAX, BP_OP_NORM,
                                     BP_OP_RMS_NORM};

static bp_tensor *b_rows(bp_context *ctx, int v)
{
    bp_tensor *a = shaped(ctx, v / 5, "a");
    switch (row_ops[v % 5]) {
    case BP_OP_SUM_ROWS:
        return bp_sum_rows(ctx, a);
    case BP_OP_MEAN:
        return bp_mean(ctx, a);
    case BP_OP_ARGMAX:
        return bp_argmax(ctx, a);
    case BP_OP_NORM:
        return bp_norm(ctx, a, 1e-5f);
    default:
        return bp_rms_norm(ctx, a, 1e-6f);
    }
}

static bp_tensor *b_soft_max(bp_context *ctx, int v)
{
    switch (v) {
    case 0:
        return bp_soft_max(ctx, f32(ctx, 1, 3, 1, 1));
    case 1:
        return bp_soft_max(ctx, f32(ctx, 37, 5, 2, 1));
    case 2: /* f32 mask broadcast over heads, scale */
        return bp_soft_max_ext(ctx, f32(ctx, 19, 6, 4, 1), f32(ctx, 19, 6, 1, 1), 0.37f);
    case 3: /* f16 causal mask with a fully masked row, padded mask rows */
        return bp_soft_max_ext(ctx, f32(ctx, 33, 8, 3, 1),
                               bp_set_name(leaf(ctx, BP_TYPE_F16, 33, 8, 1, 1), "mask:causal"),
                               0.125f);
    case 4: /* permuted input (attention scores as views) */
        return bp_soft_max_ext(ctx, bp_permute(ctx, f32(ctx, 16, 4, 5, 1), 0, 2, 1, 3),
                               bp_set_name(f32(ctx, 16, 5, 1, 1), "mask:causal"), 1.0f);
    default: { /* attention sinks, one per head; with a fully masked row (only the sink) */
        bp_tensor *s = v == 5 ? bp_soft_max_ext(ctx, f32(ctx, 19, 6, 4, 1), f32(ctx, 19, 6, 1, 1),
                                                0.37f)
                              : bp_soft_max_ext(ctx, f32(ctx, 33, 8, 3, 1),
                                                bp_set_name(leaf(ctx, BP_TYPE_F16, 33, 8, 1, 1),
                                                            "mask:causal"),
                                                0.125f);
        return s && bp_soft_max_add_sinks(s, f32(ctx, s->ne[2], 1, 1, 1)) == BP_OK ? s : NULL;
    }
    }
}

static bp_tensor *b_rope(bp_context *ctx, int v)
{
    enum bp_rope_mode mode = v % 2 ? BP_ROPE_NEOX : BP_ROPE_NORMAL;
    switch (v / 2) {
    case 0:
        return bp_rope(ctx, f32(ctx, 64, 4, 5, 1), leaf(ctx, BP_TYPE_I32, 5, 1, 1, 1), 64, mode,
                       10000.0f, 1.0f);
    case 1: /* partial rotation, odd head count */
        return bp_rope(ctx, f32(ctx, 18, 3, 7, 1), leaf(ctx, BP_TYPE_I32, 7, 1, 1, 1), 10, mode,
                       500.0f, 0.5f);
    case 3: /* YaRN: positions past a short original context, every pair on the ramp's sides */
        return bp_rope_ext(ctx, f32(ctx, 64, 4, 5, 1), leaf(ctx, BP_TYPE_I32, 5, 1, 1, 1), 64,
                           mode, 16, 10000.0f, 0.25f, 1.0f, 1.0f, 32.0f, 1.0f);
    case 4: /* YaRN half strength, a magnitude factor, partial rotation */
        return bp_rope_ext(ctx, f32(ctx, 48, 3, 7, 1), leaf(ctx, BP_TYPE_I32, 7, 1, 1, 1), 32,
                           mode, 24, 500000.0f, 0.125f, 0.5f, 0.9f, 16.0f, 2.0f);
    default: { /* a strided view: q out of a fused qkv projection */
        bp_tensor *qkv = f32(ctx, 3 * 32, 6, 1, 1);
        bp_tensor *q = bp_view_3d(ctx, qkv, 16, 2, 6, 16 * 4, 3 * 32 * 4, 0);
        return bp_rope(ctx, q, leaf(ctx, BP_TYPE_I32, 6, 1, 1, 1), 16, mode, 10000.0f, 1.0f);
    }
    }
}

static bp_tensor *b_concat(bp_context *ctx, int v)
{
    int dim = v % 4;
    int64_t a[4] = {5, 3, 2, 2}, b[4] = {5, 3, 2, 2};
    b[dim] = 4;
    enum bp_type t = v < 4 ? BP_TYPE_F32 : BP_TYPE_F16;
    return bp_concat(ctx, leaf(ctx, t, a[0], a[1], a[2], a[3]),
                     leaf(ctx, t, b[0], b[1], b[2], b[3]), dim);
}

static bp_tensor *b_clamp(bp_context *ctx, int v) /* bounds inside and outside [-1, 1] */
{
    static const float lo[] = {-0.5f, -2.0f, -INFINITY}, hi[] = {0.25f, 0.5f, 0.0f};
    return bp_clamp(ctx, shaped(ctx, v / 3, "a"), lo[v % 3], hi[v % 3]);
}

static bp_tensor *b_l2_norm(bp_context *ctx, int v)
{
    return bp_l2_norm(ctx, shaped(ctx, v, "a"), v % 2 ? 1e-6f : 0.0f);
}

/* ARGSORT both ways and TOP_K over rows of 1, odd and SIMD-odd lengths, a permuted view, ties
 * (values rounded to steps of 1/4, so many repeat: the order of indices decides) and rows of a
 * router's and a small vocabulary's length. */
static bp_tensor *b_sort(bp_context *ctx, int v)
{
    switch (v) {
    case 0:
        return bp_argsort(ctx, f32(ctx, 1, 3, 1, 1), BP_SORT_ASC);
    case 1:
        return bp_argsort(ctx, f32(ctx, 37, 5, 2, 1), BP_SORT_DESC);
    case 2:
        return bp_argsort(ctx, shaped(ctx, N_SHAPES + 4, "a"), BP_SORT_ASC);
    case 3: /* ties */
        return bp_argsort(ctx, bp_set_name(f32(ctx, 64, 4, 1, 1), "ties:a"), BP_SORT_DESC);
    case 4: /* a router: top 2 of 8 experts */
        return bp_top_k(ctx, f32(ctx, 8, 9, 1, 1), 2);
    case 5:
        return bp_top_k(ctx, bp_set_name(f32(ctx, 33, 3, 2, 1), "ties:a"), 33);
    default: /* top 40 of a vocabulary of 1000 */
        return bp_top_k(ctx, f32(ctx, 1000, 2, 1, 1), 40);
    }
}

/* ---- Attention ---------------------------------------------------------------------------- */

/* FLASH_ATTN_EXT: decoding (one query row) and prompts (many, causal), grouped-query and
 * multi-query heads, key counts across the CPU's 64-key tiles, every key/value type, masks
 * explicit (f16 causal with a fully masked row, f32 broadcast over heads) and implicit,
 * soft-capping, values narrower than keys, two sequences, and q/k/v as views of the layouts a
 * model produces (q permuted from [D, H, T], k and v out of a [D * H_kv, n_ctx] cache). */
static bp_tensor *b_flash_attn(bp_context *ctx, int v)
{
    const enum bp_type f16 = BP_TYPE_F16;
    switch (v) {
    case 0: /* decode, multi-head, f16 cache, no mask */
        return bp_flash_attn_ext(ctx, f32(ctx, 64, 1, 4, 1), leaf(ctx, f16, 64, 37, 4, 1),
                                 leaf(ctx, f16, 64, 37, 4, 1), NULL, 0.125f, 0.0f, 0);
    case 1: /* grouped-query (8 heads, 2 for keys), causal, keys across a tile boundary */
        return bp_flash_attn_ext(ctx, f32(ctx, 64, 5, 8, 1), leaf(ctx, f16, 64, 70, 2, 1),
                                 leaf(ctx, f16, 64, 70, 2, 1), NULL, 0.125f, 0.0f,
                                 BP_ATTN_CAUSAL);
    case 2: /* explicit f16 causal mask with padded rows and a fully masked row */
        return bp_flash_attn_ext(ctx, f32(ctx, 32, 7, 3, 1), leaf(ctx, f16, 32, 33, 3, 1),
                                 leaf(ctx, f16, 32, 33, 3, 1),
                                 bp_set_name(leaf(ctx, f16, 33, 8, 1, 1), "mask:causal"), 0.2f,
                                 0.0f, 0);
    case 3: /* f32 keys and values, soft-capping, Dv != D, D not a multiple of 16, 2 sequences */
        return bp_flash_attn_ext(ctx, f32(ctx, 80, 3, 2, 2), f32(ctx, 80, 19, 2, 2),
                                 f32(ctx, 48, 19, 2, 2), NULL, 0.7f, 2.5f, 0);
    case 4: { /* bf16 cache views, q permuted, causal over three tiles */
        const int64_t D = 16, H = 3, T = 4, KV = 130;
        bp_tensor *q = bp_permute(ctx, f32(ctx, D, H, T, 1), 0, 2, 1, 3); /* [D, T, H] */
        bp_tensor *kc = leaf(ctx, BP_TYPE_BF16, D * H, 140, 1, 1);
        bp_tensor *vc = leaf(ctx, BP_TYPE_BF16, D * H, 140, 1, 1);
        bp_tensor *k = bp_view_3d(ctx, kc, D, KV, H, kc->nb[1], (size_t)D * kc->nb[0], 0);
        bp_tensor *vv = bp_view_3d(ctx, vc, D, KV, H, vc->nb[1], (size_t)D * vc->nb[0], 0);
        return bp_flash_attn_ext(ctx, q, k, vv, NULL, 0.25f, 0.0f, BP_ATTN_CAUSAL);
    }
    case 5: /* multi-query, long, f32 mask broadcast over the heads */
        return bp_flash_attn_ext(ctx, f32(ctx, 32, 2, 4, 1), leaf(ctx, f16, 32, 300, 1, 1),
                                 leaf(ctx, f16, 32, 300, 1, 1), f32(ctx, 300, 2, 1, 1), 0.18f,
                                 0.0f, 0);
    case 6: { /* a q8_0 cache (views of [D x H_kv, n_ctx]), grouped-query, causal */
        const int64_t D = 64, HK = 2, KV = 45;
        bp_tensor *kc = leaf(ctx, BP_TYPE_Q8_0, D * HK, 48, 1, 1);
        bp_tensor *vc = leaf(ctx, BP_TYPE_Q8_0, D * HK, 48, 1, 1);
        bp_tensor *k = bp_view_3d(ctx, kc, D, KV, HK, kc->nb[1], bp_row_size(BP_TYPE_Q8_0, D), 0);
        bp_tensor *vv = bp_view_3d(ctx, vc, D, KV, HK, vc->nb[1], bp_row_size(BP_TYPE_Q8_0, D), 0);
        return bp_flash_attn_ext(ctx, f32(ctx, D, 3, 4, 1), k, vv, NULL, 0.125f, 0.0f,
                                 BP_ATTN_CAUSAL);
    }
    case 7: { /* padding: the last 3 cache rows hold NaN and inf, masked for every query */
        bp_tensor *kc = bp_set_name(leaf(ctx, f16, 32 * 2, 40, 1, 1), "nan3:k");
        bp_tensor *vc = bp_set_name(leaf(ctx, f16, 32 * 2, 40, 1, 1), "nan3:v");
        bp_tensor *k = bp_view_3d(ctx, kc, 32, 40, 2, kc->nb[1], 32 * kc->nb[0], 0);
        bp_tensor *vv = bp_view_3d(ctx, vc, 32, 40, 2, vc->nb[1], 32 * vc->nb[0], 0);
        return bp_flash_attn_ext(ctx, f32(ctx, 32, 5, 4, 1), k, vv,
                                 bp_set_name(leaf(ctx, f16, 40, 5, 1, 1), "mask:pad3"), 0.2f,
                                 0.0f, 0);
    }
    default: /* a prompt: many rows, several row blocks, causal */
        return bp_flash_attn_ext(ctx, f32(ctx, 32, 64, 2, 1), leaf(ctx, f16, 32, 64, 1, 1),
                                 leaf(ctx, f16, 32, 64, 1, 1), NULL, 0.18f, 0.0f, BP_ATTN_CAUSAL);
    }
}

/* ---- Matrix products -------------------------------------------------------------------- */

/* (K, M, N): vectors, odd sizes, every CPU strategy (dot products for N < 16, the broadcast
 * kernel for 16 <= N <= 48, the packed GEMM above), K across a 512-wide block boundary. */
static const int64_t mm_shapes[][3] = {
    {32, 1, 1},    {64, 7, 1},     {96, 13, 5},  {64, 17, 9}, {320, 33, 17},
    {544, 45, 64}, {32, 70, 8},    {288, 40, 150}, {64, 3, 129},
    {96, 29, 40},  {64, 24, 16}, /* broadcast kernel: a last chunk of 8, one of exactly 16 */
    {544, 530, 520}, /* AMX kernel (F16/BF16): several blocks of K, rows and columns, edges */
    {96, 37, 1}, /* one column against whole groups of eight quantised rows and a rest */
};
#define N_MM_SHAPES 13

static bp_tensor *mul_mat_case(bp_context *ctx, int v, enum bp_type t)
{
    if (v < N_MM_SHAPES) {
        const int64_t *s = mm_shapes[v];
        return bp_mul_mat(ctx, leaf(ctx, t, s[0], s[1], 1, 1), f32(ctx, s[0], s[2], 1, 1));
    }
    switch (v - N_MM_SHAPES) {
    case 0: /* batch broadcast: 2 x 1 weight matrices over 4 x 3 activations */
        return bp_mul_mat(ctx, leaf(ctx, t, 64, 6, 2, 1), f32(ctx, 64, 9, 4, 3));
    case 1: /* activations as a permuted view (rows still contiguous) */
        return bp_mul_mat(ctx, leaf(ctx, t, 64, 5, 1, 1),
                          bp_permute(ctx, f32(ctx, 64, 3, 4, 1), 0, 2, 1, 3));
    case 2: /* weights as a permuted view: attention's k */
        return bp_mul_mat(ctx, bp_permute(ctx, leaf(ctx, t, 64, 3, 10, 1), 0, 2, 1, 3),
                          bp_permute(ctx, f32(ctx, 64, 3, 12, 1), 0, 2, 1, 3));
    case 3: /* the same with enough columns for the GEMM kernels (attention over a prompt) */
        return bp_mul_mat(ctx, bp_permute(ctx, leaf(ctx, t, 64, 2, 37, 1), 0, 2, 1, 3),
                          bp_permute(ctx, f32(ctx, 64, 2, 20, 1), 0, 2, 1, 3));
    default: /* batch broadcast with enough columns for the GEMM kernels */
        return bp_mul_mat(ctx, leaf(ctx, t, 96, 20, 2, 1), f32(ctx, 96, 33, 4, 1));
    }
}

/* MUL_MAT_ID, four shapes per weight type: (K, M, experts, slots, tokens, activations shared by
 * a token's slots). Random ids give each expert about slots * tokens / experts columns: the
 * dot-product kernels, the broadcast kernel and the packed GEMM (K across a 512 block, the
 * activations a permuted view); some experts may get none. */
static bp_tensor *mul_mat_id_case(bp_context *ctx, int v, enum bp_type t)
{
    static const int64_t s[][6] = {
        {64, 13, 4, 2, 3, 0}, {96, 37, 8, 2, 40, 1}, {64, 33, 3, 2, 50, 0}, {544, 20, 2, 2, 70, 0},
    };
    const int64_t *c = s[v];
    bp_tensor *as = leaf(ctx, t, c[0], c[1], c[2], 1);
    bp_tensor *ids = leaf(ctx, BP_TYPE_I32, c[3], c[4], 1, 1);
    bp_tensor *b = v == 3 ? bp_permute(ctx, f32(ctx, c[0], c[4], c[3], 1), 0, 2, 1, 3)
                          : f32(ctx, c[0], c[5] ? 1 : c[3], c[4], 1);
    return bp_mul_mat_id(ctx, as, b, ids);
}

static bp_tensor *b_mm_id_float(bp_context *ctx, int v)
{
    return mul_mat_id_case(ctx, v / 3, all_types[v % 3]);
}

static bp_tensor *b_mm_id_quant(bp_context *ctx, int v)
{
    return mul_mat_id_case(ctx, v / 2, all_types[3 + v % 2]);
}

static bp_tensor *b_mm_f32(bp_context *ctx, int v) { return mul_mat_case(ctx, v, BP_TYPE_F32); }
static bp_tensor *b_mm_f16(bp_context *ctx, int v) { return mul_mat_case(ctx, v, BP_TYPE_F16); }
static bp_tensor *b_mm_bf16(bp_context *ctx, int v) { return mul_mat_case(ctx, v, BP_TYPE_BF16); }
static bp_tensor *b_mm_q8_0(bp_context *ctx, int v) { return mul_mat_case(ctx, v, BP_TYPE_Q8_0); }
static bp_tensor *b_mm_q4_0(bp_context *ctx, int v) { return mul_mat_case(ctx, v, BP_TYPE_Q4_0); }

/* Float weights allow any K. Variants 0-9: the dot-product kernels (N < 16); 10-14: the
 * blocked GEMM (N > 48), K past one 512-deep block with a tail that is not a whole vector. */
static bp_tensor *b_mm_odd_k(bp_context *ctx, int v)
{
    static const int64_t k[] = {1, 3, 17, 257, 263}, k_gemm[] = {513, 515, 529, 769, 1031};
    static const enum bp_type t_gemm[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_BF16};
    if (v >= 10)
        return bp_mul_mat(ctx, leaf(ctx, t_gemm[v % 3], k_gemm[v - 10], 37 + v, 1, 1),
                          f32(ctx, k_gemm[v - 10], 50 + 7 * (v - 10), 1, 1));
    enum bp_type t = v < 5 ? BP_TYPE_F32 : BP_TYPE_F16;
    return bp_mul_mat(ctx, leaf(ctx, t, k[v % 5], 9, 1, 1), f32(ctx, k[v % 5], 1 + v % 3 * 6, 1, 1));
}

/* Shapes drawn from a fixed generator (variant v is the seed), so that the GEMM-sized kernels
 * (AMX on CPUs that have it) meet row, column and K counts that the fixed list above does not:
 * K a multiple of 32 up to 320, M up to 200, N up to 300; F16/BF16 or Q8_0/Q4_0 by variant. */
static bp_tensor *mul_mat_random(bp_context *ctx, int v, bool quant)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(v + 1);
    int64_t r[3];
    for (int i = 0; i < 3; i++) {
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        r[i] = (int64_t)(x >> 33);
    }
    const int64_t K = 32 * (1 + r[0] % 10), M = 1 + r[1] % 200, N = 1 + r[2] % 300;
    const enum bp_type t = quant ? (v % 2 ? BP_TYPE_Q4_0 : BP_TYPE_Q8_0)
                                 : (v % 2 ? BP_TYPE_BF16 : BP_TYPE_F16);
    return bp_mul_mat(ctx, leaf(ctx, t, K, M, 1, 1), f32(ctx, K, N, 1, 1));
}

static bp_tensor *b_mm_rand_float(bp_context *ctx, int v) { return mul_mat_random(ctx, v, false); }

/* BF16 and F16 weights under BP_MM_PRECISION_HALF: every fixed shape, then the random ones with
 * K made odd or past one 512-deep block on some variants (the CPU's BF16 kernel packs K in
 * pairs and blocks of 512). */
static bp_tensor *b_mm_half(bp_context *ctx, int v)
{
    const enum bp_type t = v % 2 ? BP_TYPE_F16 : BP_TYPE_BF16;
    bp_tensor *r;
    if (v < 2 * (N_MM_SHAPES + 5)) {
        r = mul_mat_case(ctx, v / 2, t);
    } else {
        /* BF16's own kernels: odd K (a partial last step of 32 or pair), few and many
         * columns. */
        static const int64_t K[] = {63, 515, 1031, 96, 777, 1024, 33, 70, 5};
        static const int64_t N[] = {16, 29, 42, 55, 68, 81, 1, 3, 7};
        const int u = v - 2 * (N_MM_SHAPES + 5);
        r = bp_mul_mat(ctx, leaf(ctx, BP_TYPE_BF16, K[u], 37 + 11 * u, 1, 1),
                       f32(ctx, K[u], N[u], 1, 1));
    }
    return bp_mul_mat_set_precision(r, BP_MM_PRECISION_HALF);
}
static bp_tensor *b_mm_rand_quant(bp_context *ctx, int v) { return mul_mat_random(ctx, v, true); }

/* ---- The weight and cache types beyond Q8_0/Q4_0 -------------------------------------------
 *
 * Blocks of 32 (Q4_1, Q5_1 with Q8_1 activations, Q5_0, IQ4_NL with Q8_0) and super-blocks of
 * 256 (Q2_K to Q6_K, IQ4_XS with Q8_K). */

static const enum bp_type types32[] = {BP_TYPE_Q4_1, BP_TYPE_Q5_0, BP_TYPE_Q5_1, BP_TYPE_IQ4_NL};
static const enum bp_type types256[] = {BP_TYPE_Q2_K, BP_TYPE_Q3_K, BP_TYPE_Q4_K,
                                        BP_TYPE_Q5_K, BP_TYPE_Q6_K, BP_TYPE_IQ4_XS};
#define N_MM_MORE 7

/* MUL_MAT shapes in units u of the type's block: K = 5u (for 32, a multiple of 32 but not of
 * 64), 3 and 17 columns, columns of B further apart than K (a view of wider rows), one row and
 * one column, broadcast batches, one column against 37 rows, 130 columns in two batches. */
static bp_tensor *mul_mat_more(bp_context *ctx, int v, enum bp_type t)
{
    const int64_t u = bp_type_block_size(t);
    switch (v) {
    case 0:
        return bp_mul_mat(ctx, leaf(ctx, t, 5 * u, 19, 1, 1), f32(ctx, 5 * u, 3, 1, 1));
    case 1:
        return bp_mul_mat(ctx, leaf(ctx, t, 3 * u, 11, 1, 1), f32(ctx, 3 * u, 17, 1, 1));
    case 2: {
        bp_tensor *wide = f32(ctx, 3 * u + 32, 7, 1, 1);
        return bp_mul_mat(ctx, leaf(ctx, t, 3 * u, 9, 1, 1),
                          bp_view_2d(ctx, wide, 3 * u, 7, wide->nb[1], 0));
    }
    case 3:
        return bp_mul_mat(ctx, leaf(ctx, t, u, 1, 1, 1), f32(ctx, u, 1, 1, 1));
    case 4:
        return bp_mul_mat(ctx, leaf(ctx, t, 2 * u, 6, 2, 1), f32(ctx, 2 * u, 3, 4, 3));
    case 5:
        return bp_mul_mat(ctx, leaf(ctx, t, 2 * u, 37, 1, 1), f32(ctx, 2 * u, 1, 1, 1));
    default: /* enough columns for the CPU's packed GEMM over converted rows */
        return bp_mul_mat(ctx, leaf(ctx, t, 2 * u, 7, 2, 1), f32(ctx, 2 * u, 130, 2, 1));
    }
}

/* Blocks of 32: every shape of the Q8_0/Q4_0 cases, then the ones above. */
static bp_tensor *mul_mat_32(bp_context *ctx, int v, enum bp_type t)
{
    return v < N_MM_SHAPES + 5 ? mul_mat_case(ctx, v, t)
                               : mul_mat_more(ctx, v - (N_MM_SHAPES + 5), t);
}

static bp_tensor *b_mm_q4_1(bp_context *ctx, int v) { return mul_mat_32(ctx, v, BP_TYPE_Q4_1); }
static bp_tensor *b_mm_q5_0(bp_context *ctx, int v) { return mul_mat_32(ctx, v, BP_TYPE_Q5_0); }
static bp_tensor *b_mm_q5_1(bp_context *ctx, int v) { return mul_mat_32(ctx, v, BP_TYPE_Q5_1); }
static bp_tensor *b_mm_iq4_nl(bp_context *ctx, int v) { return mul_mat_32(ctx, v, BP_TYPE_IQ4_NL); }

/* Six shapes per type, then the last one (130 columns) for each type. */
static bp_tensor *b_mm_kquant(bp_context *ctx, int v)
{
    if (v >= 6 * (N_MM_MORE - 1))
        return mul_mat_more(ctx, N_MM_MORE - 1, types256[v - 6 * (N_MM_MORE - 1)]);
    return mul_mat_more(ctx, v % (N_MM_MORE - 1), types256[v / (N_MM_MORE - 1)]);
}

static bp_tensor *b_mm_id_32(bp_context *ctx, int v)
{
    return mul_mat_id_case(ctx, v / 4, types32[v % 4]);
}

/* MUL_MAT_ID with super-blocks: one column per expert, then several (a token's slots sharing
 * activations). */
static bp_tensor *b_mm_id_kquant(bp_context *ctx, int v)
{
    const enum bp_type t = types256[v / 2];
    if (v % 2 == 0)
        return bp_mul_mat_id(ctx, leaf(ctx, t, 256, 13, 4, 1), f32(ctx, 256, 2, 3, 1),
                             leaf(ctx, BP_TYPE_I32, 2, 3, 1, 1));
    return bp_mul_mat_id(ctx, leaf(ctx, t, 512, 9, 3, 1), f32(ctx, 512, 1, 20, 1),
                         leaf(ctx, BP_TYPE_I32, 2, 20, 1, 1));
}

/* GET_ROWS of every new type (dequantised by the runtime's converters): a table, then one per
 * matrix of a batch. */
static bp_tensor *b_get_rows_more(bp_context *ctx, int v)
{
    const enum bp_type t = v / 2 < 4 ? types32[v / 2] : types256[v / 2 - 4];
    const int64_t e = 2 * bp_type_block_size(t);
    if (v % 2 == 0)
        return bp_get_rows(ctx, leaf(ctx, t, e, 11, 1, 1), leaf(ctx, BP_TYPE_I32, 5, 1, 1, 1));
    return bp_get_rows(ctx, leaf(ctx, t, e, 6, 3, 1), leaf(ctx, BP_TYPE_I32, 4, 3, 1, 1));
}

/* The KV-cache types: SET_ROWS (a cache row per token; per head from a permuted source), CPY
 * from f32 and back. */
static bp_tensor *b_kv_rows(bp_context *ctx, int v)
{
    const enum bp_type t = types32[v % 4];
    switch (v / 4) {
    case 0:
        return bp_set_rows(ctx, leaf(ctx, t, 96, 9, 1, 1), f32(ctx, 96, 4, 1, 1),
                           leaf(ctx, BP_TYPE_I32, 4, 1, 1, 1));
    case 1: {
        bp_tensor *src = bp_permute(ctx, f32(ctx, 64, 3, 4, 1), 0, 2, 1, 3); /* [64, 4, 3] */
        return bp_set_rows(ctx, leaf(ctx, t, 64, 10, 3, 1), src, leaf(ctx, BP_TYPE_I32, 4, 1, 1, 1));
    }
    case 2:
        return bp_cpy(ctx, f32(ctx, 64, 3, 2, 1), leaf(ctx, t, 64, 3, 2, 1));
    default:
        return bp_cpy(ctx, leaf(ctx, t, 32, 7, 1, 1), f32(ctx, 32, 7, 1, 1));
    }
}

/* FLASH_ATTN_EXT reading K and V in the KV-cache types (Q4_0 too): views of [D x H_kv, n_ctx] caches,
 * grouped-query; a prompt (causal) and a decoding step across a 64-key tile. */
static bp_tensor *b_flash_attn_kv(bp_context *ctx, int v)
{
    static const enum bp_type kv[] = {BP_TYPE_Q4_0, BP_TYPE_Q4_1, BP_TYPE_Q5_0, BP_TYPE_Q5_1,
                                      BP_TYPE_IQ4_NL};
    const enum bp_type t = kv[v % 5];
    const bool decode = v >= 5;
    const int64_t D = 64, HK = 2, KV = decode ? 70 : 45;
    bp_tensor *kc = leaf(ctx, t, D * HK, 72, 1, 1), *vc = leaf(ctx, t, D * HK, 72, 1, 1);
    bp_tensor *k = bp_view_3d(ctx, kc, D, KV, HK, kc->nb[1], bp_row_size(t, D), 0);
    bp_tensor *vv = bp_view_3d(ctx, vc, D, KV, HK, vc->nb[1], bp_row_size(t, D), 0);
    return bp_flash_attn_ext(ctx, f32(ctx, D, decode ? 1 : 3, 4, 1), k, vv, NULL, 0.125f, 0.0f,
                             decode ? 0 : BP_ATTN_CAUSAL);
}

const struct conf_case conf_cases[] = {
    {"cpy", b_cpy, 25, NMSE_F32},
    {"get_rows", b_get_rows, 10, NMSE_F32},
    {"set_rows", b_set_rows, 10, NMSE_F32},
    {"add", b_add, 6 * N_SHAPES, NMSE_F32},
    {"sub", b_sub, 6 * N_SHAPES, NMSE_F32},
    {"mul", b_mul, 6 * N_SHAPES, NMSE_F32},
    {"div", b_div, 6 * N_SHAPES, NMSE_F32},
    {"binary_transposed_b", b_binary_transposed_b, 2, NMSE_F32},
    {"scale", b_scale, 2 * N_SHAPES, NMSE_F32},
    {"unary", b_unary, BP_UNARY_OP_COUNT * 2 * N_SHAPES, NMSE_F32},
    {"glu", b_glu, 3 * BP_GLU_OP_COUNT, NMSE_F32},
    {"rows", b_rows, 5 * 2 * N_SHAPES, NMSE_F32},
    {"soft_max", b_soft_max, 7, NMSE_F32},
    {"rope", b_rope, 10, NMSE_F32},
    {"concat", b_concat, 8, NMSE_F32},
    {"flash_attn_ext", b_flash_attn, 9, NMSE_F32},
    {"clamp", b_clamp, 3 * 2 * N_SHAPES, NMSE_F32},
    {"l2_norm", b_l2_norm, 2 * N_SHAPES, NMSE_F32},
    {"argsort_top_k", b_sort, 7, NMSE_F32},
    {"mul_mat_f32", b_mm_f32, N_MM_SHAPES + 5, NMSE_F32},
    {"mul_mat_f16", b_mm_f16, N_MM_SHAPES + 5, NMSE_F32},
    {"mul_mat_bf16", b_mm_bf16, N_MM_SHAPES + 5, NMSE_F32},
    {"mul_mat_q8_0", b_mm_q8_0, N_MM_SHAPES + 5, NMSE_QUANT},
    {"mul_mat_q4_0", b_mm_q4_0, N_MM_SHAPES + 5, NMSE_QUANT},
    {"mul_mat_odd_k", b_mm_odd_k, 15, NMSE_F32},
    {"mul_mat_random_f16_bf16", b_mm_rand_float, 12, NMSE_F32},
    {"mul_mat_random_q8_0_q4_0", b_mm_rand_quant, 12, NMSE_QUANT},
    {"mul_mat_id", b_mm_id_float, 12, NMSE_F32},
    {"mul_mat_id_quant", b_mm_id_quant, 8, NMSE_QUANT},
    {"mul_mat_half", b_mm_half, 2 * (N_MM_SHAPES + 5) + 9, NMSE_HALF},
    {"mul_mat_q4_1", b_mm_q4_1, N_MM_SHAPES + 5 + N_MM_MORE, NMSE_QUANT},
    {"mul_mat_q5_0", b_mm_q5_0, N_MM_SHAPES + 5 + N_MM_MORE, NMSE_QUANT},
    {"mul_mat_q5_1", b_mm_q5_1, N_MM_SHAPES + 5 + N_MM_MORE, NMSE_QUANT},
    {"mul_mat_iq4_nl", b_mm_iq4_nl, N_MM_SHAPES + 5 + N_MM_MORE, NMSE_QUANT},
    {"mul_mat_id_q4_1_q5_iq4_nl", b_mm_id_32, 16, NMSE_QUANT},
    {"get_rows_new_types", b_get_rows_more, 20, NMSE_F32},
    {"kv_rows_q4_1_q5_iq4_nl", b_kv_rows, 16, NMSE_KV_ROWS},
    {"flash_attn_ext_kv_types", b_flash_attn_kv, 10, NMSE_F32},
    {"mul_mat_kquant", b_mm_kquant, 6 * N_MM_MORE, NMSE_QUANT},
    {"mul_mat_id_kquant", b_mm_id_kquant, 12, NMSE_QUANT},
};
const int conf_n_cases = (int)(sizeof(conf_cases) / sizeof(conf_cases[0]));
