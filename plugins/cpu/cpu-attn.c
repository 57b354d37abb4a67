/* cpu-attn.c - FLASH_ATTN_EXT: attention with an online softmax, never holding the scores of
 * more than one tile of keys.
 *
 * Work is divided into units of one sequence, one key/value head and a block of query rows;
 * a unit takes every query head that reads that key/value head (grouped-query attention), so
 * each tile of keys and values is converted to f32 once and used by all the unit's queries.
 * Units are shared out among the threads. For each query the unit keeps the running maximum
 * M, the running sum S of exp(s - M) and the running weighted sum of values; a tile whose
 * maximum exceeds M rescales them once (exp(M_old - M_new)), so no score is ever exponentiated
 * twice. Keys a causal query cannot see are never read. */
#include "config.h"

#include <math.h>
#include <string.h>

#include "cpu-impl.h"

#define ATTN_TILE 64  /* keys converted and scored at a time */
#define ATTN_MAX_ROWS 32 /* query rows per unit, at most */

struct attn {
    const bp_tensor *q, *k, *v, *mask;
    bp_tensor *dst;
    float scale, softcap;
    bool causal;
    int64_t D, Dv, T, H, HK, G, KV, B;
    int64_t rows; /* query rows per unit */
    int64_t units, blocks;
};

static void attn_init(struct attn *a, bp_tensor *dst, int nth)
{
    a->dst = dst;
    a->q = dst->src[0];
    a->k = dst->src[1];
    a->v = dst->src[2];
    a->mask = dst->src[3];
    a->scale = bp_get_op_param_f32(dst, 0);
    a->softcap = bp_get_op_param_f32(dst, 1);
    a->causal = (bp_get_op_param_i32(dst, 2) & BP_ATTN_CAUSAL) != 0;
    a->D = a->q->ne[0];
    a->T = a->q->ne[1];
    a->H = a->q->ne[2];
    a->B = a->q->ne[3];
    a->KV = a->k->ne[1];
    a->HK = a->k->ne[2];
    a->G = a->H / a->HK;
    a->Dv = a->v->ne[0];
    /* Enough units to keep every thread busy (four each where the rows allow), each as many
     * rows as that leaves, up to ATTN_MAX_ROWS. */
    const int64_t heads = a->HK * a->B, want = 4 * (int64_t)nth;
    int64_t rows = heads >= want ? a->T : (a->T * heads + want - 1) / want;
    rows = rows < 1 ? 1 : rows > ATTN_MAX_ROWS ? ATTN_MAX_ROWS : rows;
    a->rows = rows;
    a->blocks = (a->T + rows - 1) / rows;
    a->units = heads * a->blocks;
}

/* Per-thread scratch, in floats: the key and value tiles, one tile of scores, a mask row, and
 * per query (G * rows of them) its maximum, its sum and its weighted values. */
static size_t attn_floats(const struct attn *a)
{
    const size_t nq = (size_t)(a->G * a->rows), D = (size_t)a->D, Dv = (size_t)a->Dv;
    return ATTN_TILE * (D + Dv) + D + (4 + 1) * ATTN_TILE + nq * (2 + Dv) + Dv + 64;
}

void bp_cpu_flash_attn_work_size(const bp_tensor *dst, int nth, size_t *per_thread)
{
    struct attn a;
    attn_init(&a, (bp_tensor *)dst, nth);
    *per_thread = attn_floats(&a) * sizeof(float);
}

/* x . y over n floats (few queries: scores key by key from the row-major tile). */
static float dot(const float *x, const float *y, int64_t n)
{
    int64_t i = 0;
    float s = 0.0f;
#if defined(BP_CPU_HAVE_AVX512)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(BP_CPU_HAVE_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    const __m256 t = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#else
    float acc[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += x[i + l] * y[i + l];
    for (int l = 0; l < 8; l++)
        s += acc[l];
#endif
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

#if defined(BP_CPU_HAVE_AVX2)
#define ATTN_DIRECT_F16 1
/* x . y over n values, y F16 (a row of the cache, read in place: decoding). */
static float dot_f16(const float *x, const uint16_t *y, int64_t n)
{
    int64_t i = 0;
    float s;
#if defined(BP_CPU_HAVE_AVX512)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i + 16))),
                             a1);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i),
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(y + i))), a0);
    s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#else
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8))), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i),
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i))), a0);
    const __m256 t = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++)
        s += x[i] * bp_cpu_half_to_float(y[i]);
    return s;
}

/* y += w * x over n values, x F16. */
static void axpy_f16(float *y, float w, const uint16_t *x, int64_t n)
{
    int64_t i = 0;
#if defined(BP_CPU_HAVE_AVX512)
    const __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(
                                    vw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                                    _mm512_loadu_ps(y + i)));
#else
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(
                                    vw, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                    _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] += w * bp_cpu_half_to_float(x[i]);
}
#endif

/* x[i] = exp(x[i]) for n floats: a degree-6 polynomial of the reduced argument times 2^k
 * (error about 2 ulp, far inside the conformance bound), 0 below -87.3 (so -inf gives 0), NaN
 * for NaN. */
#if defined(BP_CPU_HAVE_AVX512) || defined(BP_CPU_HAVE_AVX2)
#define EXP_POLY(V, FMA, SET)                                                                    \
    FMA(FMA(FMA(FMA(FMA(SET(1.9875691500e-4f), V, SET(1.3981999507e-3f)), V,                    \
                    SET(8.3334519073e-3f)), V, SET(4.1665795894e-2f)), V, SET(1.6666665459e-1f)),  \
        V, SET(5.0000001201e-1f))
#endif

void bp_cpu_exp_inplace(float *x, int64_t n)
{
    int64_t i = 0;
#if defined(BP_CPU_HAVE_AVX512)
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 under = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
        /* max/min return their second operand when one is NaN: NaN stays NaN */
        v = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), v));
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504089f)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), v);
        r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
        const __m512 p = EXP_POLY(r, _mm512_fmadd_ps, _mm512_set1_ps);
        const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
                                       _mm512_set1_ps(1.0f));
        _mm512_storeu_ps(x + i, _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(e, k)));
    }
#elif defined(BP_CPU_HAVE_AVX2)
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        const __m256 keep = _mm256_cmp_ps(v, _mm256_set1_ps(-87.3f), _CMP_NLT_UQ); /* NaN too */
        /* max/min return their second operand when one is NaN: NaN stays NaN */
        v = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), v));
        const __m256 k = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504089f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), v);
        r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
        const __m256 p = EXP_POLY(r, _mm256_fmadd_ps, _mm256_set1_ps);
        const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
                                       _mm256_set1_ps(1.0f));
        const __m256i pow2 = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        _mm256_storeu_ps(x + i, _mm256_and_ps(_mm256_mul_ps(e, _mm256_castsi256_ps(pow2)), keep));
    }
#endif
    for (; i < n; i++)
        x[i] = expf(x[i]);
}

/* y += w * x over n floats. */
static void axpy(float *y, float w, const float *x, int64_t n)
{
    int64_t i = 0;
#if defined(BP_CPU_HAVE_AVX512)
    const __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vw, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#elif defined(BP_CPU_HAVE_AVX2)
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] += w * x[i];
}

/* Register blocks of the two products of a tile, QB queries at a time: the scores of QB
 * queries over KC = NV vectors of keys (from the transposed key tile), and the weighted values
 * of QB queries over NV vectors of value dimensions. Each uses QB * NV accumulators. */
#define QB 4
#if defined(BP_CPU_HAVE_AVX512)
typedef __m512 vf;
#define VW 16
#define NV 4
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
#elif defined(BP_CPU_HAVE_AVX2)
typedef __m256 vf;
#define VW 8
#define NV 2
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
#else
typedef float vf;
#define VW 1
#define NV 4
#define VLOAD(p) (*(p))
#define VSTORE(p, x) (*(p) = (x))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSET1(x) (x)
#define VZERO() 0.0f
#endif
#define KC (NV * VW)
_Static_assert(ATTN_TILE % KC == 0, "a tile is whole blocks of keys");

/* s[r][0..nk) = q_r . k_j for the QB queries qp over the transposed tile kt ([D][ATTN_TILE],
 * zero beyond nk up to a whole block). */
static void tile_scores(const float *const qp[QB], const float *kt, int64_t D, int64_t nk,
                        float *s)
{
    for (int64_t c0 = 0; c0 < nk; c0 += KC) {
        vf acc[QB][NV];
        #pragma GCC unroll 16
        for (int r = 0; r < QB; r++)
            #pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                acc[r][v] = VZERO();
        for (int64_t d = 0; d < D; d++) {
            const float *kr = kt + d * ATTN_TILE + c0;
            vf kv[NV];
            #pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                kv[v] = VLOAD(kr + v * VW);
            #pragma GCC unroll 16
            for (int r = 0; r < QB; r++) {
                const vf x = VSET1(qp[r][d]);
                #pragma GCC unroll 16
                for (int v = 0; v < NV; v++)
                    acc[r][v] = VFMA(x, kv[v], acc[r][v]);
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < QB; r++)
            #pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                VSTORE(s + r * ATTN_TILE + c0 + v * VW, acc[r][v]);
    }
}

/* y_r += sum_j w[r][j] v_j over the value tile vt ([nk][Dv]) for the QB queries, skipping the
 * keys marked unused (when skip: a constant in each inlined copy, so that the loop without a
 * mask carries no test). */
BP_CPU_INLINE void tile_values_impl(float *const y[QB], const float *w, const float *vt,
                                    int64_t nk, int64_t Dv, const bool skip, const bool *unused)
{
    int64_t e0 = 0;
    for (; e0 + KC <= Dv; e0 += KC) {
        vf acc[QB][NV];
        #pragma GCC unroll 16
        for (int r = 0; r < QB; r++)
            #pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                acc[r][v] = VLOAD(y[r] + e0 + v * VW);
        for (int64_t j = 0; j < nk; j++) {
            if (skip && unused[j])
                continue;
            const float *vr = vt + j * Dv + e0;
            vf vv[NV];
            #pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                vv[v] = VLOAD(vr + v * VW);
            #pragma GCC unroll 16
            for (int r = 0; r < QB; r++) {
                const vf x = VSET1(w[r * ATTN_TILE + j]);
                #pragma GCC unroll 16
                for (int v = 0; v < NV; v++)
                    acc[r][v] = VFMA(x, vv[v], acc[r][v]);
            }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < QB; r++)
            #pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                VSTORE(y[r] + e0 + v * VW, acc[r][v]);
    }
    for (int r = 0; r < QB && e0 < Dv; r++) /* the dimensions beyond the last whole block */
        for (int64_t j = 0; j < nk; j++)
            if (!(skip && unused[j]))
                axpy(y[r] + e0, w[r * ATTN_TILE + j], vt + j * Dv + e0, Dv - e0);
}

/* tile_values_impl for a tile: with an explicit mask (masked), keys that no query weighs are
 * skipped, since their values may be anything (an unwritten, masked cache slot) and 0 * inf
 * would be NaN; without one every key of the tile is a written one. */
BP_CPU_INLINE void tile_values(float *const y[QB], const float *w, const float *vt,
                               int64_t nk, int64_t Dv, bool masked)
{
    if (!masked) {
        tile_values_impl(y, w, vt, nk, Dv, false, NULL);
        return;
    }
    bool unused[ATTN_TILE];
    for (int64_t j = 0; j < nk; j++) {
        unused[j] = true;
        for (int r = 0; r < QB; r++)
            unused[j] = unused[j] && w[r * ATTN_TILE + j] == 0.0f;
    }
    tile_values_impl(y, w, vt, nk, Dv, true, unused);
}

/* Whether mask entry j of a row is -inf (that key is out). */
static bool masked_out(const bp_tensor *mask, const char *row, int64_t j)
{
    if (mask->type == BP_TYPE_F16)
        return ((const uint16_t *)row)[j] == 0xfc00;
    return mask->type == BP_TYPE_F32 && ((const float *)row)[j] == -INFINITY;
}

/* One past the last key, below end, that any of the unit's queries (rows t0..t1 of the G heads
 * reading key/value head g) does not mask out; 0 when every key is out. */
static int64_t mask_end(const struct attn *a, int64_t b, int64_t g, int64_t t0, int64_t t1,
                        int64_t end)
{
    const bp_tensor *mask = a->mask;
    int64_t last = 0;
    for (int64_t hh = 0; hh < a->G && last < end; hh++) {
        const int64_t h = g * a->G + hh;
        if (hh > 0 && mask->ne[2] == 1)
            break; /* every head reads the same rows */
        for (int64_t i = t0; i < t1 && last < end; i++) {
            const char *row = bp_cpu_row(mask, i, h % mask->ne[2], b % mask->ne[3]);
            int64_t j = end;
            while (j > last && masked_out(mask, row, j - 1))
                j--;
            last = j;
        }
    }
    return last;
}

/* One unit's working state: where it is in the problem, its buffers in the thread's scratch,
 * and the choices made once for all its tiles. The helpers below copy what their loops read
 * into locals, so a store through a float pointer never makes the compiler reload a field. */
struct attn_unit {
    int64_t b, g, t0, nr, nq, kb;
    float *kt, *krow, *vt, *s, *mrow, *M, *S, *acc, *dummy;
    /* Few queries (decoding): the key tile stays row-major and each score is a dot product;
     * transposing the tile for the blocked scores would cost as much as the scores. */
    bool few;
    /* Fewer queries than a register block (decoding without grouped heads): F16 keys and
     * values are read in place, converted in the registers, and each query takes its own
     * values rather than a block of QB of which most would be empty. */
    bool direct_k, direct_v;
    bool capped;
    float pre; /* the factor of a raw score: the scale, over the softcap where there is one */
};

/* Up to QB queries of the unit against one tile of keys. */
struct attn_block {
    int64_t q0;       /* the block's first query in the unit */
    const float *qp[QB];
    float *y[QB];     /* each query's weighted values (the scratch row for a missing query) */
    int64_t vis[QB];  /* keys of the tile each query sees; 0 for a missing query */
};

/* Carves the unit's buffers out of scratch and starts every query's running state empty. */
BP_CPU_INLINE void attn_unit_begin(const struct attn *a, struct attn_unit *u, int64_t b,
                                   int64_t g, int64_t t0, int64_t t1, float *scratch)
{
    const bp_tensor *k = a->k, *v = a->v;
    const int64_t D = a->D, Dv = a->Dv, nq = a->G * (t1 - t0);
    u->b = b;
    u->g = g;
    u->t0 = t0;
    u->nr = t1 - t0;
    u->nq = nq;
    u->kb = k->ne[3] == 1 ? 0 : b;
    u->kt = scratch;
    u->krow = u->kt + ATTN_TILE * D;
    u->vt = u->krow + D;
    u->s = u->vt + ATTN_TILE * Dv;
    u->mrow = u->s + QB * ATTN_TILE;
    u->M = u->mrow + ATTN_TILE;
    u->S = u->M + nq;
    u->acc = u->S + nq;
    u->dummy = u->acc + nq * Dv;
    for (int64_t qi = 0; qi < nq; qi++) {
        u->M[qi] = -INFINITY;
        u->S[qi] = 0.0f;
    }
    memset(u->acc, 0, (size_t)(nq * Dv) * sizeof(float));
    u->few = nq < 2 * QB;
#if defined(ATTN_DIRECT_F16)
    u->direct_k = u->few && k->type == BP_TYPE_F16;
    u->direct_v = nq < QB && v->type == BP_TYPE_F16;
#else
    (void)v;
    u->direct_k = false;
    u->direct_v = false;
#endif
    u->capped = a->softcap > 0.0f;
    u->pre = u->capped ? a->scale / a->softcap : a->scale;
}

/* Converts keys j0..j0+nk-1 and their values to f32 (those not read in place): keys row-major
 * for few queries, else transposed and padded with zeros to a multiple of KC. */
BP_CPU_INLINE void attn_load_tile(const struct attn *a, const struct attn_unit *u, int64_t j0,
                                  int64_t nk)
{
    const bp_tensor *k = a->k, *v = a->v;
    const int64_t D = a->D, Dv = a->Dv, g = u->g, kb = u->kb;
    const bool few = u->few, direct_k = u->direct_k, direct_v = u->direct_v;
    float *const kt = u->kt, *const krow = u->krow, *const vt = u->vt;
    const int64_t padded = (nk + KC - 1) / KC * KC;
    for (int64_t jj = 0; jj < padded && !(direct_k && direct_v); jj++) {
        if (jj < nk && !direct_k)
            bp_cpu_to_float(k->type, bp_cpu_row(k, j0 + jj, g, kb), few ? kt + jj * D : krow, D);
        if (jj < nk && !direct_v)
            bp_cpu_to_float(v->type, bp_cpu_row(v, j0 + jj, g, kb), vt + jj * Dv, Dv);
        for (int64_t d = 0; !few && d < D; d++)
            kt[d * ATTN_TILE + jj] = jj < nk ? krow[d] : 0.0f;
    }
}

/* Fills in the block of queries q0.. against the tile of nk keys from j0; false when none of
 * them sees any key of the tile. */
BP_CPU_INLINE bool attn_block_begin(const struct attn *a, const struct attn_unit *u,
                                    struct attn_block *blk, int64_t q0, int64_t j0, int64_t nk)
{
    const int64_t nq = u->nq, nr = u->nr;
    blk->q0 = q0;
    for (int r = 0; r < QB; r++) {
        const int64_t qi = q0 + r < nq ? q0 + r : q0;
        const int64_t hh = qi / nr, i = u->t0 + qi % nr;
        blk->qp[r] = bp_cpu_row(a->q, i, u->g * a->G + hh, u->b);
        blk->y[r] = q0 + r < nq ? u->acc + qi * a->Dv : u->dummy;
        blk->vis[r] = q0 + r < nq ? nk : 0;
        if (a->causal && a->KV - a->T + i + 1 - j0 < blk->vis[r])
            blk->vis[r] = a->KV - a->T + i + 1 - j0 > 0 ? a->KV - a->T + i + 1 - j0 : 0;
    }
    return blk->vis[0] != 0 || blk->vis[1] != 0 || blk->vis[2] != 0 || blk->vis[3] != 0;
}

/* The block's raw scores, query r's in s[r * ATTN_TILE ...]. */
BP_CPU_INLINE void attn_block_scores(const struct attn *a, const struct attn_unit *u,
                                     const struct attn_block *blk, int64_t j0, int64_t nk)
{
    const int64_t D = a->D;
    float *const s = u->s;
    if (u->direct_k) {
#if defined(ATTN_DIRECT_F16)
        const bp_tensor *k = a->k;
        const int64_t g = u->g, kb = u->kb;
        for (int r = 0; r < QB; r++)
            for (int64_t jj = 0; jj < blk->vis[r]; jj++)
                s[r * ATTN_TILE + jj] = dot_f16(blk->qp[r], bp_cpu_row(k, j0 + jj, g, kb), D);
#else
        (void)j0;
#endif
    } else if (u->few) {
        const float *const kt = u->kt;
        for (int r = 0; r < QB; r++)
            for (int64_t jj = 0; jj < blk->vis[r]; jj++)
                s[r * ATTN_TILE + jj] = dot(blk->qp[r], kt + jj * D, D);
    } else {
        tile_scores(blk->qp, u->kt, D, nk, s);
    }
}

/* Each query's scores to weights, its running state rescaled where its maximum grows. */
BP_CPU_INLINE void attn_block_weights(const struct attn *a, const struct attn_unit *u,
                                      const struct attn_block *blk, int64_t j0, int64_t nk)
{
    const bp_tensor *mask = a->mask;
    const int64_t Dv = a->Dv, G = a->G, nr = u->nr, t0 = u->t0, g = u->g, b = u->b;
    const bool capped = u->capped;
    const float pre = u->pre, softcap = a->softcap;
    float *const s = u->s, *const mrow = u->mrow, *const M = u->M, *const S = u->S;
    for (int r = 0; r < QB; r++) {
        float *sr = s + r * ATTN_TILE;
        float *const yr = blk->y[r];
        const int64_t qi = blk->q0 + r, vis = blk->vis[r];
        float tmax = -INFINITY;
        if (vis > 0 && mask != NULL) {
            const int64_t i = t0 + qi % nr, h = g * G + qi / nr;
            bp_cpu_to_float(mask->type,
                            (const char *)bp_cpu_row(mask, i, h % mask->ne[2], b % mask->ne[3]) +
                                j0 * (int64_t)mask->nb[0],
                            mrow, vis);
        }
        for (int64_t jj = 0; jj < vis; jj++) {
            float x = sr[jj] * pre;
            if (capped)
                x = softcap * tanhf(x);
            if (mask != NULL) /* a masked key is out, whatever its score (even NaN) */
                x = mrow[jj] == -INFINITY ? -INFINITY : x + mrow[jj];
            sr[jj] = x;
            tmax = x > tmax ? x : tmax;
        }
        if (tmax == -INFINITY) { /* nothing visible: no weight anywhere */
            memset(sr, 0, (size_t)nk * sizeof(float));
            continue;
        }
        if (tmax > M[qi]) {
            const float c = expf(M[qi] - tmax); /* 0 the first time */
            S[qi] *= c;
            for (int64_t d = 0; d < Dv; d++)
                yr[d] *= c;
            M[qi] = tmax;
        }
        for (int64_t jj = 0; jj < vis; jj++)
            sr[jj] -= M[qi];
        bp_cpu_exp_inplace(sr, vis);
        float sum = 0.0f;
        for (int64_t jj = 0; jj < vis; jj++)
            sum += sr[jj];
        for (int64_t jj = vis; jj < nk; jj++)
            sr[jj] = 0.0f;
        S[qi] += sum;
    }
}

/* Adds the block's weighted values of the tile to each query's running sum. */
BP_CPU_INLINE void attn_block_values(const struct attn *a, const struct attn_unit *u,
                                     const struct attn_block *blk, int64_t j0, int64_t nk)
{
    if (u->direct_v) {
#if defined(ATTN_DIRECT_F16)
        const bp_tensor *v = a->v;
        const int64_t Dv = a->Dv, g = u->g, kb = u->kb, q0 = blk->q0, nq = u->nq;
        const float *const s = u->s;
        for (int r = 0; r < QB && q0 + r < nq; r++) /* keys it does not weigh: skipped */
            for (int64_t jj = 0; jj < blk->vis[r]; jj++)
                if (s[r * ATTN_TILE + jj] != 0.0f)
                    axpy_f16(blk->y[r], s[r * ATTN_TILE + jj], bp_cpu_row(v, j0 + jj, g, kb), Dv);
#else
        (void)j0;
#endif
    } else {
        tile_values(blk->y, u->s, u->vt, nk, a->Dv, a->mask != NULL);
    }
}

/* Each query's weighted values over its sum of weights, into the result. */
BP_CPU_INLINE void attn_unit_store(const struct attn *a, const struct attn_unit *u, int64_t t1)
{
    const int64_t G = a->G, Dv = a->Dv, nr = u->nr, t0 = u->t0, g = u->g, b = u->b;
    const float *const S = u->S, *const acc = u->acc;
    for (int64_t hh = 0; hh < G; hh++) {
        for (int64_t i = t0; i < t1; i++) {
            const int64_t qi = hh * nr + (i - t0);
            float *out = bp_cpu_row(a->dst, g * G + hh, i, b);
            const float inv = S[qi] > 0.0f ? 1.0f / S[qi] : 0.0f;
            for (int64_t d = 0; d < Dv; d++)
                out[d] = acc[qi * Dv + d] * inv;
        }
    }
}

/* One unit: sequence b, key/value head g, query rows [t0, t1). Its queries (G heads x the rows)
 * go through each tile QB at a time. The key tile is kt: transposed ([D][ATTN_TILE]) for the
 * blocked scores, row-major ([nk][D]) when there are few queries. */
static void attn_unit(const struct attn *a, int64_t b, int64_t g, int64_t t0, int64_t t1,
                      float *scratch)
{
    struct attn_unit u;
    attn_unit_begin(a, &u, b, g, t0, t1, scratch);
    /* The last key any of the unit's rows sees: causally, and where a mask ends in keys it
     * masks out (a cache padded past the filled positions) the keys after its last open one. */
    int64_t kv_end = a->causal ? a->KV - a->T + t1 : a->KV;
    if (a->mask != NULL)
        kv_end = mask_end(a, b, g, t0, t1, kv_end);
    for (int64_t j0 = 0; j0 < kv_end; j0 += ATTN_TILE) {
        const int64_t nk = kv_end - j0 < ATTN_TILE ? kv_end - j0 : ATTN_TILE;
        attn_load_tile(a, &u, j0, nk);
        for (int64_t q0 = 0; q0 < u.nq; q0 += QB) {
            struct attn_block blk;
            if (!attn_block_begin(a, &u, &blk, q0, j0, nk))
                continue;
            attn_block_scores(a, &u, &blk, j0, nk);
            attn_block_weights(a, &u, &blk, j0, nk);
            attn_block_values(a, &u, &blk, j0, nk);
        }
    }
    attn_unit_store(a, &u, t1);
}

void bp_cpu_flash_attn(bp_tensor *dst, const struct bp_cpu_params *p)
{
    struct attn a;
    attn_init(&a, dst, p->nth);
    int64_t u0, u1;
    bp_cpu_split(a.units, p->ith, p->nth, &u0, &u1);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t blk = u % a.blocks, head = u / a.blocks;
        const int64_t g = head % a.HK, b = head / a.HK;
        const int64_t t0 = blk * a.rows, t1 = t0 + a.rows < a.T ? t0 + a.rows : a.T;
        attn_unit(&a, b, g, t0, t1, p->wdata);
    }
}

bool bp_cpu_flash_attn_supported(const bp_tensor *dst)
{
    const bp_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    /* Rows read as contiguous runs: the innermost dimension of every source and the result. */
    return q->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float) &&
           k->nb[0] == bp_type_size(k->type) && v->nb[0] == bp_type_size(v->type) &&
           (mask == NULL || mask->nb[0] == bp_type_size(mask->type));
}
