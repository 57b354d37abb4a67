/* cpu-ops.c - the CPU kernels of every op except MUL_MAT.
 *
 * Each kernel handles any strides of its sources (broadcast, permuted and other views) and
 * writes destination rows that are contiguous along ne[0] (bp_cpu_supports_op checks that).
 * Work is split over the rows of the destination, so every thread gets a share even when a
 * tensor has fewer rows than threads in one dimension. Kernels that may run in place (see the
 * contract in bp-plugin.h) read what they need of a row before writing it. */
#include "config.h"

#include <math.h>
#include <string.h>

#include "cpu-impl.h"

#define ROWS_OF(t) ((t)->ne[1] * (t)->ne[2] * (t)->ne[3])

/* Splits a flat row index into (i1, i2, i3) for tensor t. */
BP_CPU_INLINE void unflatten(const bp_tensor *t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3)
{
    *i1 = r % t->ne[1];
    *i2 = (r / t->ne[1]) % t->ne[2];
    *i3 = r / (t->ne[1] * t->ne[2]);
}

/* Row (i1,i2,i3) of t as floats: a pointer into t when it already is a contiguous f32 row,
 * else converted or gathered into tmp. */
static const float *row_f32(const bp_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *tmp)
{
    const char *row = bp_cpu_row(t, i1, i2, i3);
    const size_t esz = bp_type_size(t->type);
    if (t->nb[0] == esz) {
        if (t->type == BP_TYPE_F32)
            return (const float *)row;
        bp_cpu_to_float(t->type, row, tmp, t->ne[0]);
        return tmp;
    }
    /* Non-contiguous rows exist only for plain types (quantised axis 0 never moves). */
    const int64_t nb0 = (int64_t)t->nb[0];
    switch (t->type) {
    case BP_TYPE_F32:
        for (int64_t i = 0; i < t->ne[0]; i++)
            memcpy(tmp + i, row + i * nb0, sizeof(float));
        break;
    case BP_TYPE_F16:
        for (int64_t i = 0; i < t->ne[0]; i++) {
            uint16_t h;
            memcpy(&h, row + i * nb0, sizeof(h));
            tmp[i] = bp_cpu_half_to_float(h);
        }
        break;
    default:
        for (int64_t i = 0; i < t->ne[0]; i++)
            bp_cpu_to_float(t->type, row + i * nb0, tmp + i, 1);
        break;
    }
    return tmp;
}

static void write_row(bp_tensor *t, int64_t i1, int64_t i2, int64_t i3, const float *src)
{
    bp_cpu_from_float(t->type, src, bp_cpu_row(t, i1, i2, i3), t->ne[0]);
}

/* ---- Copies ----------------------------------------------------------------------------- */

/* Tile of copy_strided: rows of dst at d[0..nr), row i0 of the tile at src s + i0 * sn0 with
 * consecutive dst rows sn1 apart. E is the element size (2 or 4). */
#define COPY_TILE(E, TYPE)                                                                     \
    static void copy_tile_##E(char *const *d, int nr, const char *s, int64_t sn0, int64_t sn1,  \
                              int64_t i0b, int64_t i0e)                                        \
    {                                                                                          \
        for (int64_t i0 = i0b; i0 < i0e; i0++) {                                               \
            const char *c = s + i0 * sn0;                                                      \
            for (int r = 0; r < nr; r++, c += sn1) {                                           \
                TYPE v;                                                                        \
                memcpy(&v, c, sizeof(v));                                                      \
                memcpy(d[r] + i0 * (int64_t)sizeof(v), &v, sizeof(v));                         \
            }                                                                                  \
        }                                                                                      \
    }
COPY_TILE(2, uint16_t)
COPY_TILE(4, uint32_t)
#undef COPY_TILE

#if defined(BP_CPU_HAVE_AVX2)
/* 16 x 16 elements of 16 bits: input row i (16 contiguous elements at s + i * sn0) becomes
 * column i of the output, whose row j is stored at d[j] + off. Four rounds of unpacks (16, 32,
 * 64 bits within 128-bit lanes, then the lanes), 64 shuffles for 256 elements. */
static void transpose16_u16(const char *s, int64_t sn0, char *const *d, int64_t off)
{
    __m256i l[16], a[16], b[16], c[16];
    for (int i = 0; i < 16; i++)
        l[i] = _mm256_loadu_si256((const __m256i *)(s + i * sn0));
    /* a[2p], a[2p+1]: rows 2p, 2p+1 interleaved; columns 0-3|8-11, then 4-7|12-15. */
    for (int p = 0; p < 8; p++) {
        a[2 * p] = _mm256_unpacklo_epi16(l[2 * p], l[2 * p + 1]);
        a[2 * p + 1] = _mm256_unpackhi_epi16(l[2 * p], l[2 * p + 1]);
    }
    /* b[4q + m]: rows 4q..4q+3, columns 2m, 2m+1 | 2m+8, 2m+9. */
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            const __m256i x = a[4 * q + h], y = a[4 * q + 2 + h];
            b[4 * q + 2 * h] = _mm256_unpacklo_epi32(x, y);
            b[4 * q + 2 * h + 1] = _mm256_unpackhi_epi32(x, y);
        }
    /* c[8g + j]: rows 8g..8g+7, column j in the low lane and j + 8 in the high one. */
    for (int g = 0; g < 2; g++)
        for (int m = 0; m < 4; m++) {
            const __m256i x = b[8 * g + m], y = b[8 * g + 4 + m];
            c[8 * g + 2 * m] = _mm256_unpacklo_epi64(x, y);
            c[8 * g + 2 * m + 1] = _mm256_unpackhi_epi64(x, y);
        }
    for (int j = 0; j < 8; j++) {
        _mm256_storeu_si256((__m256i *)(d[j] + off), _mm256_permute2x128_si256(c[j], c[8 + j], 0x20));
        _mm256_storeu_si256((__m256i *)(d[j + 8] + off),
                            _mm256_permute2x128_si256(c[j], c[8 + j], 0x31));
    }
}
#endif

/* dst (contiguous rows) = src of the same type and shape whose rows are strided: the transpose
 * of a contiguous tensor (CONT of a permuted KV cache), for instance. Elements are copied as they
 * are (no conversion), in tiles of 32 rows x 32 columns so that reads along src's contiguous
 * axis and writes along dst's rows both stay in cache lines already loaded; the tile's row
 * pointers are computed once (stores through char pointers would otherwise make the compiler
 * reload the tensors' strides for every element). Threads take tiles of 32 rows. */
static void copy_strided(bp_tensor *dst, const bp_tensor *src, const struct bp_cpu_params *p)
{
    enum { T = 32 };
    const size_t esz = bp_type_size(dst->type);
    const int64_t n0 = dst->ne[0], n1 = dst->ne[1], tiles1 = (n1 + T - 1) / T;
    const int64_t sn0 = (int64_t)src->nb[0], sn1 = (int64_t)src->nb[1];
    int64_t t0, t1;
    bp_cpu_split(tiles1 * dst->ne[2] * dst->ne[3], p->ith, p->nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t i1b = (t % tiles1) * T, i2 = (t / tiles1) % dst->ne[2];
        const int64_t i3 = t / (tiles1 * dst->ne[2]);
        const int nr = (int)(i1b + T < n1 ? T : n1 - i1b);
        char *d[T];
        for (int r = 0; r < nr; r++)
            d[r] = bp_cpu_row(dst, i1b + r, i2, i3);
        const char *s = bp_cpu_row(src, i1b, i2, i3);
        for (int64_t i0b = 0; i0b < n0; i0b += T) {
            const int64_t i0e = i0b + T < n0 ? i0b + T : n0;
#if defined(BP_CPU_HAVE_AVX2)
            if (esz == 2 && sn1 == 2) { /* a transpose: 16 x 16 blocks in registers */
                int64_t i0 = i0b;
                for (; i0 + 16 <= i0e; i0 += 16)
                    for (int r = 0; r + 16 <= nr; r += 16)
                        transpose16_u16(s + i0 * sn0 + r * 2, sn0, d + r, i0 * 2);
                const int rfull = nr / 16 * 16;
                if (rfull < nr) /* rows past the last 16, all columns of the tile */
                    copy_tile_2(d + rfull, nr - rfull, s + rfull * sn1, sn0, sn1, i0b, i0e);
                if (i0 < i0e) /* columns past the last 16, the rows done above */
                    copy_tile_2(d, rfull, s, sn0, sn1, i0, i0e);
                continue;
            }
#endif
            if (esz == 2)
                copy_tile_2(d, nr, s, sn0, sn1, i0b, i0e);
            else
                copy_tile_4(d, nr, s, sn0, sn1, i0b, i0e);
        }
    }
}

static void op_copy(bp_tensor *dst, const bp_tensor *src, const struct bp_cpu_params *p)
{
    /* Same type, both contiguous: bytes, split evenly. */
    if (src->type == dst->type && bp_is_contiguous(src) && bp_is_contiguous(dst)) {
        int64_t n = (int64_t)bp_nbytes(dst), b0, b1;
        bp_cpu_split(n, p->ith, p->nth, &b0, &b1);
        if (dst->data != src->data)
            memcpy((char *)dst->data + b0, (const char *)src->data + b0, (size_t)(b1 - b0));
        return;
    }
    float *tmp = p->wdata;
    if (bp_are_same_shape(src, dst) && src->type == dst->type &&
        bp_type_block_size(src->type) == 1 && dst->nb[0] == bp_type_size(dst->type) &&
        src->nb[0] != bp_type_size(src->type)) {
        copy_strided(dst, src, p);
        return;
    }
    if (bp_are_same_shape(src, dst)) {
        int64_t r0, r1;
        bp_cpu_split(ROWS_OF(dst), p->ith, p->nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            int64_t i1, i2, i3;
            unflatten(dst, r, &i1, &i2, &i3);
            const float *x = row_f32(src, i1, i2, i3, tmp);
            if (dst->type == BP_TYPE_F32 && dst->nb[0] == sizeof(float)) {
                if ((const void *)x != bp_cpu_row(dst, i1, i2, i3))
                    memcpy(bp_cpu_row(dst, i1, i2, i3), x, (size_t)dst->ne[0] * sizeof(float));
            } else if (dst->nb[0] == bp_type_size(dst->type)) {
                write_row(dst, i1, i2, i3, x);
            } else {
                char *d = bp_cpu_row(dst, i1, i2, i3);
                for (int64_t i = 0; i < dst->ne[0]; i++)
                    bp_type_get_traits(dst->type)->from_float(x + i, d + i * (int64_t)dst->nb[0], 1);
            }
        }
        return;
    }
    /* Different shapes, same element count: the source read in logical order (any strides)
     * fills the contiguous, non-quantised destination in order. Split over source rows. */
    const int64_t n0 = src->ne[0];
    const size_t ds = bp_type_size(dst->type);
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(src), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(src, r, &i1, &i2, &i3);
        const float *x = row_f32(src, i1, i2, i3, tmp);
        bp_cpu_from_float(dst->type, x, (char *)dst->data + r * n0 * (int64_t)ds, n0);
    }
}

static void op_get_rows(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *ids = dst->src[1];
    const bool repacked = bp_cpu_repacked_base(a) != NULL;
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(dst, r, &i1, &i2, &i3);
        int32_t id = *(const int32_t *)((const char *)ids->data + i1 * (int64_t)ids->nb[0] +
                                        i2 * (int64_t)ids->nb[1] + i3 * (int64_t)ids->nb[2]);
        float *out = bp_cpu_row(dst, i1, i2, i3);
        if (id < 0 || id >= a->ne[1]) {
            /* An id out of range reads nothing: the row becomes NaN, never a wild read, and
             * the compute fails. */
            for (int64_t i = 0; i < dst->ne[0]; i++)
                out[i] = NAN;
            bp_cpu_fault(p, dst);
            continue;
        }
        if (repacked) { /* the row's blocks in their usual order first (wdata: 2 ne[0] floats) */
            char *blk = p->wdata;
            const size_t bs = bp_type_size(a->type);
            for (int64_t kb = 0; kb < a->ne[0] / bp_type_block_size(a->type); kb++)
                bp_cpu_repack_get_block(a, id, kb, blk + (size_t)kb * bs);
            bp_cpu_to_float(a->type, blk, out, a->ne[0]);
            continue;
        }
        const float *x = row_f32(a, id, i2, i3, out);
        if (x != out)
            memcpy(out, x, (size_t)dst->ne[0] * sizeof(float));
    }
}

static void op_set_rows(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *src = dst->src[1], *ids = dst->src[2];
    float *tmp = p->wdata;
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(src), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(src, r, &i1, &i2, &i3);
        int32_t id = *(const int32_t *)((const char *)ids->data + i1 * (int64_t)ids->nb[0] +
                                        (i2 % ids->ne[1]) * (int64_t)ids->nb[1] +
                                        (i3 % ids->ne[2]) * (int64_t)ids->nb[2]);
        if (id < 0 || id >= dst->ne[1]) {
            bp_cpu_fault(p, dst); /* nothing is written; the compute fails */
            continue;
        }
        const float *x = row_f32(src, i1, i2, i3, tmp);
        write_row(dst, id, i2, i3, x);
    }
}

/* ---- Element-wise ----------------------------------------------------------------------- */

static void op_binary(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t n0 = dst->ne[0], b0n = b->ne[0];
    float *ta = p->wdata, *tb = ta + n0;
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(dst, r, &i1, &i2, &i3);
        const float *x = row_f32(a, i1, i2, i3, ta);
        const float *y = row_f32(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3], tb);
        float *z = bp_cpu_row(dst, i1, i2, i3);
        for (int64_t j0 = 0; j0 < n0; j0 += b0n) {
            const float *xs = x + j0;
            float *zs = z + j0;
            switch (dst->op) {
            case BP_OP_ADD:
                for (int64_t i = 0; i < b0n; i++)
                    zs[i] = xs[i] + y[i];
                break;
            case BP_OP_SUB:
                for (int64_t i = 0; i < b0n; i++)
                    zs[i] = xs[i] - y[i];
                break;
            case BP_OP_MUL:
                for (int64_t i = 0; i < b0n; i++)
                    zs[i] = xs[i] * y[i];
                break;
            default:
                for (int64_t i = 0; i < b0n; i++)
                    zs[i] = xs[i] / y[i];
                break;
            }
        }
    }
}

/* The tanh approximation, written as x * sigmoid(2z): 0.5 (1 + tanh z) = 1 / (1 + e^-2z). Same
 * function, but no 1 + tanh(z) that cancels to 0 in float for z below about -9 (where the
 * value is x e^2z, tiny but not 0; found by tests/fuzz). */
BP_CPU_INLINE float gelu(float x)
{
    const float c = 0.79788456080286535588f; /* sqrt(2/pi) */
    return x / (1.0f + expf(-2.0f * c * (x + 0.044715f * x * x * x)));
}

BP_CPU_INLINE float gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

BP_CPU_INLINE float silu(float x)
{
    return x / (1.0f + expf(-x));
}

static void unary_row(enum bp_unary_op op, const float *x, float *y, int64_t n)
{
    switch (op) {
    case BP_UNARY_OP_NEG:
        for (int64_t i = 0; i < n; i++)
            y[i] = -x[i];
        break;
    case BP_UNARY_OP_ABS:
        for (int64_t i = 0; i < n; i++)
            y[i] = fabsf(x[i]);
        break;
    case BP_UNARY_OP_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case BP_UNARY_OP_GELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = gelu(x[i]);
        break;
    case BP_UNARY_OP_SILU:
        for (int64_t i = 0; i < n; i++)
            y[i] = silu(x[i]);
        break;
    case BP_UNARY_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case BP_UNARY_OP_TANH:
        for (int64_t i = 0; i < n; i++)
            y[i] = tanhf(x[i]);
        break;
    case BP_UNARY_OP_EXP:
        for (int64_t i = 0; i < n; i++)
            y[i] = expf(x[i]);
        break;
    case BP_UNARY_OP_SQR:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * x[i];
        break;
    case BP_UNARY_OP_SQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = sqrtf(x[i]);
        break;
    case BP_UNARY_OP_GELU_ERF:
        for (int64_t i = 0; i < n; i++)
            y[i] = gelu_erf(x[i]);
        break;
    default:
        break;
    }
}

static void op_unary_scale(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0];
    const float s = dst->op == BP_OP_SCALE ? bp_get_op_param_f32(dst, 0) : 0.0f;
    const enum bp_unary_op uop = bp_get_unary_op(dst);
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(dst, r, &i1, &i2, &i3);
        const float *x = row_f32(a, i1, i2, i3, p->wdata);
        float *y = bp_cpu_row(dst, i1, i2, i3);
        if (dst->op == BP_OP_SCALE) {
            for (int64_t i = 0; i < dst->ne[0]; i++)
                y[i] = x[i] * s;
        } else if (dst->op == BP_OP_CLAMP) {
            const float lo = bp_get_op_param_f32(dst, 0), hi = bp_get_op_param_f32(dst, 1);
            for (int64_t i = 0; i < dst->ne[0]; i++) /* NaN fails both tests: kept */
                y[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
        } else {
            unary_row(uop, x, y, dst->ne[0]);
        }
    }
}

/* y = silu(g) * u over n floats, 64 at a time: the exponentials of a chunk vectorised, then
 * the quotients. A chunk with an argument where the vector exp is not exact in range (|g| >= 80)
 * or not finite goes the scalar way. y may be g or u (in place). */
static void swiglu_row(const float *g, const float *u, float *y, int64_t n)
{
    float e[64];
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const int64_t m = n - i0 < 64 ? n - i0 : 64;
        int in_range = 1;
        for (int64_t i = 0; i < m; i++) {
            e[i] = -g[i0 + i];
            in_range &= fabsf(e[i]) < 80.0f; /* NaN fails */
        }
        if (!in_range) {
            for (int64_t i = 0; i < m; i++)
                y[i0 + i] = silu(g[i0 + i]) * u[i0 + i];
            continue;
        }
        bp_cpu_exp_inplace(e, m);
        for (int64_t i = 0; i < m; i++)
            y[i0 + i] = g[i0 + i] / (1.0f + e[i]) * u[i0 + i];
    }
}

static void op_glu(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const enum bp_glu_op op = bp_get_glu_op(dst);
    const int64_t n = dst->ne[0];
    float *ta = p->wdata, *tb = ta + a->ne[0];
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(dst, r, &i1, &i2, &i3);
        const float *g = row_f32(a, i1, i2, i3, ta);
        const float *u = b ? row_f32(b, i1, i2, i3, tb) : g + n;
        float *y = bp_cpu_row(dst, i1, i2, i3);
        if (op == BP_GLU_OP_SWIGLU) {
            swiglu_row(g, u, y, n);
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            y[i] = (op == BP_GLU_OP_SWIGLU  ? silu(g[i])
                    : op == BP_GLU_OP_GEGLU ? gelu(g[i])
                                            : gelu_erf(g[i])) *
                   u[i];
    }
}

/* ---- Rows: reductions, norms, softmax, rope -------------------------------------------- */

/* The sum of x[i]^2 in double precision, vectorised (several partial sums). */
static double sum_squares(const float *x, int64_t n)
{
    int64_t i = 0;
    double sq = 0.0;
#if defined(BP_CPU_HAVE_AVX512)
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        const __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        s0 = _mm512_fmadd_pd(lo, lo, s0);
        s1 = _mm512_fmadd_pd(hi, hi, s1);
    }
    sq = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#elif defined(BP_CPU_HAVE_AVX2)
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        const __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double part[4];
    _mm256_storeu_pd(part, _mm256_add_pd(s0, s1));
    sq = part[0] + part[1] + part[2] + part[3];
#endif
    for (; i < n; i++)
        sq += (double)x[i] * x[i];
    return sq;
}

static void op_row_reduce(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0];
    const int64_t n = a->ne[0];
    const float eps = bp_get_op_param_f32(dst, 0);
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(a, r, &i1, &i2, &i3);
        const float *x = row_f32(a, i1, i2, i3, p->wdata);
        double sum = 0.0, sq = 0.0;
        switch (dst->op) {
        case BP_OP_SUM_ROWS:
        case BP_OP_MEAN:
            for (int64_t i = 0; i < n; i++)
                sum += x[i];
            *(float *)bp_cpu_row(dst, i1, i2, i3) =
                (float)(dst->op == BP_OP_MEAN ? sum / (double)n : sum);
            break;
        case BP_OP_ARGMAX: {
            /* The first maximum; NaN never compares greater, so it is skipped (even at index
             * 0), and a row with nothing above -inf gives 0, as the reference does. */
            int32_t best = 0;
            float best_v = -INFINITY;
            for (int64_t i = 0; i < n; i++) {
                if (x[i] > best_v) {
                    best_v = x[i];
                    best = (int32_t)i;
                }
            }
            *(int32_t *)bp_cpu_row(dst, i1, i2, i3) = best;
            break;
        }
        case BP_OP_RMS_NORM: {
            sq = sum_squares(x, n);
            const float scale = (float)(1.0 / sqrt(sq / (double)n + eps));
            float *y = bp_cpu_row(dst, i1, i2, i3);
            for (int64_t i = 0; i < n; i++)
                y[i] = x[i] * scale;
            break;
        }
        case BP_OP_L2_NORM: {
            sq = sum_squares(x, n);
            const float scale = (float)(1.0 / fmax(sqrt(sq), (double)eps));
            float *y = bp_cpu_row(dst, i1, i2, i3);
            for (int64_t i = 0; i < n; i++)
                y[i] = x[i] * scale;
            break;
        }
        case BP_OP_NORM: {
            for (int64_t i = 0; i < n; i++)
                sum += x[i];
            const double mean = sum / (double)n;
            for (int64_t i = 0; i < n; i++)
                sq += (x[i] - mean) * (x[i] - mean);
            const float scale = (float)(1.0 / sqrt(sq / (double)n + eps));
            float *y = bp_cpu_row(dst, i1, i2, i3);
            for (int64_t i = 0; i < n; i++)
                y[i] = (float)((x[i] - mean) * scale);
            break;
        }
        default:
            break;
        }
    }
}

/* Whether element i comes before element j (values v) in the order: by value, NaN last, ties
 * by index. */
BP_CPU_INLINE bool sorts_before(const float *v, int32_t i, int32_t j, bool desc)
{
    const float x = v[i], y = v[j];
    if (isnan(x) || isnan(y))
        return isnan(x) != isnan(y) ? !isnan(x) : i < j;
    if (x != y)
        return desc ? x > y : x < y;
    return i < j;
}

/* ARGSORT and TOP_K: a bottom-up merge sort of each row's indices (stable, O(n log n)); TOP_K
 * keeps the first k of the descending order. Scratch: the row as floats, two index arrays. */
static void op_sort_rows(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0];
    const int64_t n = a->ne[0];
    const bool desc = dst->op == BP_OP_TOP_K || bp_get_op_param_i32(dst, 0) == BP_SORT_DESC;
    float *vals = p->wdata;
    int32_t *idx = (int32_t *)(vals + n), *tmp = idx + n;
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(a, r, &i1, &i2, &i3);
        const float *x = row_f32(a, i1, i2, i3, vals);
        int32_t *from = idx, *to = tmp;
        for (int64_t i = 0; i < n; i++)
            from[i] = (int32_t)i;
        for (int64_t w = 1; w < n; w *= 2) {
            for (int64_t lo = 0; lo < n; lo += 2 * w) {
                const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
                int64_t i = lo, j = mid, o = lo;
                while (i < mid && j < hi)
                    to[o++] = sorts_before(x, from[j], from[i], desc) ? from[j++] : from[i++];
                while (i < mid)
                    to[o++] = from[i++];
                while (j < hi)
                    to[o++] = from[j++];
            }
            int32_t *t = from;
            from = to;
            to = t;
        }
        memcpy(bp_cpu_row(dst, i1, i2, i3), from, (size_t)dst->ne[0] * sizeof(int32_t));
    }
}

static void op_soft_max(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *mask = dst->src[1], *sinks = dst->src[2];
    const float scale = bp_get_op_param_f32(dst, 0);
    const int64_t n = a->ne[0];
    float *tmp = p->wdata, *mrow = tmp + n;
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(a), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(a, r, &i1, &i2, &i3);
        const float *x = row_f32(a, i1, i2, i3, tmp);
        const float *m = mask ? row_f32(mask, i1, i2 % mask->ne[2], i3 % mask->ne[3], mrow)
                              : NULL;
        float *y = bp_cpu_row(dst, i1, i2, i3);
        float max = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i] * scale + (m ? m[i] : 0.0f);
            y[i] = v;
            max = v > max ? v : max;
        }
        const float sink = sinks ? ((const float *)sinks->data)[i2] : -INFINITY;
        max = sink > max ? sink : max;
        if (max == -INFINITY) { /* every entry masked: zeros, not NaN */
            memset(y, 0, (size_t)n * sizeof(float));
            continue;
        }
        double sum = sinks ? (double)expf(sink - max) : 0.0;
        for (int64_t i = 0; i < n; i++) {
            y[i] = expf(y[i] - max);
            sum += y[i];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n; i++)
            y[i] *= inv;
    }
}

static void op_rope(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *x = dst->src[0], *pos = dst->src[1];
    const int n_dims = bp_get_op_param_i32(dst, 0);
    const bool neox = bp_get_op_param_i32(dst, 1) == BP_ROPE_NEOX;
    const float base = bp_get_op_param_f32(dst, 2), fscale = bp_get_op_param_f32(dst, 3);
    const float ext = bp_get_op_param_f32(dst, 4), mag = bp_get_op_param_f32(dst, 5);
    const float lo = bp_get_op_param_f32(dst, 6), hi = bp_get_op_param_f32(dst, 7);
    const int half = n_dims / 2;
    /* Rows run head by head within a position, so the angles of one position serve every
     * head: cos/sin are recomputed only when the position changes. */
    float *inv_freq = p->wdata, *cos_t = inv_freq + half, *sin_t = cos_t + half;
    float *tmp = sin_t + half;
    bool have = false;
    int32_t have_pos = 0;
    for (int i = 0; i < half; i++) { /* YaRN: each pair between interpolation and extrapolation */
        const float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
        const float mix = ext * (1.0f - fminf(1.0f, fmaxf(0.0f, y)));
        inv_freq[i] = powf(base, -2.0f * (float)i / (float)n_dims) * (fscale * (1.0f - mix) + mix);
    }
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(x), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i1, i2, i3;
        unflatten(x, r, &i1, &i2, &i3);
        const int32_t ipos = *(const int32_t *)((const char *)pos->data + i2 * (int64_t)pos->nb[0]);
        if (!have || ipos != have_pos) {
            for (int i = 0; i < half; i++) {
                const float theta = (float)ipos * inv_freq[i];
                cos_t[i] = cosf(theta) * mag;
                sin_t[i] = sinf(theta) * mag;
            }
            have = true;
            have_pos = ipos;
        }
        const float *in = row_f32(x, i1, i2, i3, tmp);
        float *out = bp_cpu_row(dst, i1, i2, i3);
        for (int i = 0; i < half; i++) {
            const float c = cos_t[i], s = sin_t[i];
            const int j0 = neox ? i : 2 * i, j1 = neox ? i + half : 2 * i + 1;
            const float v0 = in[j0], v1 = in[j1];
            out[j0] = v0 * c - v1 * s;
            out[j1] = v0 * s + v1 * c;
        }
        if (in != out) {
            for (int64_t i = n_dims; i < x->ne[0]; i++)
                out[i] = in[i];
        }
    }
}

static void op_concat(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int dim = bp_get_op_param_i32(dst, 0);
    const size_t esz = bp_type_size(dst->type);
    int64_t r0, r1;
    bp_cpu_split(ROWS_OF(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        int64_t i[4] = {0};
        unflatten(dst, r, &i[1], &i[2], &i[3]);
        char *out = bp_cpu_row(dst, i[1], i[2], i[3]);
        for (int64_t i0 = 0; i0 < dst->ne[0]; i0++) {
            int64_t j[4] = {i0, i[1], i[2], i[3]};
            const bp_tensor *s = a;
            if (j[dim] >= a->ne[dim]) {
                j[dim] -= a->ne[dim];
                s = b;
            }
            const char *in = (const char *)s->data + j[0] * (int64_t)s->nb[0] +
                             j[1] * (int64_t)s->nb[1] + j[2] * (int64_t)s->nb[2] +
                             j[3] * (int64_t)s->nb[3];
            memcpy(out + i0 * (int64_t)esz, in, esz);
        }
    }
}

/* ---- Dispatch --------------------------------------------------------------------------- */

void bp_cpu_compute_node(bp_tensor *node, const struct bp_cpu_params *p)
{
    switch (node->op) {
    case BP_OP_DUP:
    case BP_OP_CONT:
    case BP_OP_CPY:
        op_copy(node, node->src[0], p);
        break;
    case BP_OP_GET_ROWS:
        op_get_rows(node, p);
        break;
    case BP_OP_SET_ROWS:
        op_set_rows(node, p);
        break;
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
        op_binary(node, p);
        break;
    case BP_OP_SCALE:
    case BP_OP_UNARY:
    case BP_OP_CLAMP:
        op_unary_scale(node, p);
        break;
    case BP_OP_GLU:
        op_glu(node, p);
        break;
    case BP_OP_SUM_ROWS:
    case BP_OP_MEAN:
    case BP_OP_ARGMAX:
    case BP_OP_NORM:
    case BP_OP_RMS_NORM:
    case BP_OP_L2_NORM:
        op_row_reduce(node, p);
        break;
    case BP_OP_SOFT_MAX:
        op_soft_max(node, p);
        break;
    case BP_OP_ARGSORT:
    case BP_OP_TOP_K:
        op_sort_rows(node, p);
        break;
    case BP_OP_ROPE:
        op_rope(node, p);
        break;
    case BP_OP_CONCAT:
        op_concat(node, p);
        break;
    case BP_OP_MUL_MAT:
        bp_cpu_mul_mat(node, p);
        break;
    case BP_OP_MUL_MAT_ID:
        bp_cpu_mul_mat_id(node, p);
        break;
    case BP_OP_FLASH_ATTN_EXT:
        bp_cpu_flash_attn(node, p);
        break;
    default: /* NONE and the views compute nothing */
        break;
    }
}

/* Scratch: a couple of rows of floats for gathering and converting sources. */
void bp_cpu_work_size(const bp_tensor *node, int nth, size_t *per_thread, size_t *shared)
{
    *per_thread = 0;
    *shared = 0;
    if (node->op == BP_OP_MUL_MAT) {
        bp_cpu_mul_mat_work_size(node, nth, per_thread, shared);
        return;
    }
    if (node->op == BP_OP_MUL_MAT_ID) {
        bp_cpu_mul_mat_id_work_size(node, nth, per_thread, shared);
        return;
    }
    if (node->op == BP_OP_FLASH_ATTN_EXT) {
        bp_cpu_flash_attn_work_size(node, nth, per_thread);
        return;
    }
    if (node->op == BP_OP_ARGSORT || node->op == BP_OP_TOP_K || node->op == BP_OP_ROPE) {
        *per_thread = (size_t)(3 * node->src[0]->ne[0] + 64) * sizeof(float);
        return;
    }
    int64_t widest = node->ne[0];
    for (int s = 0; s < BP_MAX_SRC; s++) {
        if (node->src[s] && node->src[s]->ne[0] > widest)
            widest = node->src[s]->ne[0];
    }
    *per_thread = (size_t)(2 * widest + 64) * sizeof(float);
}

static bool is_float_type(enum bp_type t)
{
    return t == BP_TYPE_F32 || t == BP_TYPE_F16 || t == BP_TYPE_BF16;
}

/* Element (block) sizes of the types, kept here so that supports_op, asked for every node of
 * every scheduled graph, makes no calls. */
static const size_t type_sizes[BP_TYPE_COUNT] = {
    [BP_TYPE_F32] = 4,
    [BP_TYPE_F16] = 2,
    [BP_TYPE_BF16] = 2,
    [BP_TYPE_I32] = 4,
    [BP_TYPE_Q8_0] = sizeof(struct bp_block_q8_0),
    [BP_TYPE_Q4_0] = sizeof(struct bp_block_q4_0),
    [BP_TYPE_Q4_1] = sizeof(struct bp_block_q4_1),
    [BP_TYPE_Q5_0] = sizeof(struct bp_block_q5_0),
    [BP_TYPE_Q5_1] = sizeof(struct bp_block_q5_1),
    [BP_TYPE_Q8_1] = sizeof(struct bp_block_q8_1),
    [BP_TYPE_Q2_K] = sizeof(struct bp_block_q2_k),
    [BP_TYPE_Q3_K] = sizeof(struct bp_block_q3_k),
    [BP_TYPE_Q4_K] = sizeof(struct bp_block_q4_k),
    [BP_TYPE_Q5_K] = sizeof(struct bp_block_q5_k),
    [BP_TYPE_Q6_K] = sizeof(struct bp_block_q6_k),
    [BP_TYPE_Q8_K] = sizeof(struct bp_block_q8_k),
    [BP_TYPE_IQ4_NL] = sizeof(struct bp_block_iq4_nl),
    [BP_TYPE_IQ4_XS] = sizeof(struct bp_block_iq4_xs),
};
/* A type added to the enum must be added above (a size of 0 would refuse it everywhere). */
_Static_assert(BP_TYPE_COUNT == BP_TYPE_IQ4_XS + 1, "type_sizes lacks a type");

static bool rows_contiguous(const bp_tensor *t)
{
    return (unsigned)t->type < BP_TYPE_COUNT && t->nb[0] == type_sizes[t->type];
}

bool bp_cpu_supports_op(const bp_tensor *op)
{
    const bp_tensor *a = op->src[0], *b = op->src[1];
    switch (op->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true;
    case BP_OP_DUP:
    case BP_OP_CONT:
    case BP_OP_CPY:
        /* A quantised result needs a quantiser (none yet for the k-quants and IQ4_XS). */
        if (!bp_cpu_can_from_float(op->type))
            return false;
        if (bp_are_same_shape(a, op))
            return rows_contiguous(op) || bp_type_block_size(op->type) == 1;
        return bp_is_contiguous(op) && bp_type_block_size(op->type) == 1;
    case BP_OP_GET_ROWS: /* repacked tables one matrix (stacked ones are MUL_MAT_ID's) */
        return a->type != BP_TYPE_I32 && op->type == BP_TYPE_F32 && rows_contiguous(op) &&
               (a->ne[2] == 1 || bp_cpu_repacked_base(a) == NULL);
    case BP_OP_SET_ROWS:
        return op->type != BP_TYPE_I32 && rows_contiguous(op) && op->src[1]->type == BP_TYPE_F32 &&
               bp_cpu_can_from_float(op->type);
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
        return op->type == BP_TYPE_F32 && a->type == BP_TYPE_F32 && b->type == BP_TYPE_F32 &&
               rows_contiguous(op);
    case BP_OP_SCALE:
    case BP_OP_UNARY:
    case BP_OP_CLAMP:
    case BP_OP_NORM:
    case BP_OP_RMS_NORM:
    case BP_OP_L2_NORM:
    case BP_OP_SOFT_MAX:
    case BP_OP_ROPE:
    case BP_OP_GLU:
        return op->type == BP_TYPE_F32 && a->type == BP_TYPE_F32 && rows_contiguous(op) &&
               (op->src[1] == NULL || is_float_type(op->src[1]->type) ||
                op->op == BP_OP_ROPE);
    case BP_OP_SUM_ROWS:
    case BP_OP_MEAN:
    case BP_OP_ARGMAX:
        return a->type == BP_TYPE_F32;
    case BP_OP_ARGSORT:
    case BP_OP_TOP_K:
        return a->type == BP_TYPE_F32 && op->type == BP_TYPE_I32 && rows_contiguous(op);
    case BP_OP_CONCAT:
        return bp_type_block_size(op->type) == 1 && rows_contiguous(op);
    case BP_OP_MUL_MAT:
        return bp_cpu_mul_mat_supported(op);
    case BP_OP_MUL_MAT_ID:
        return bp_cpu_mul_mat_id_supported(op);
    case BP_OP_FLASH_ATTN_EXT:
        return bp_cpu_flash_attn_supported(op);
    default:
        return false;
    }
}
