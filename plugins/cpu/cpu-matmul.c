/* cpu-matmul.c - MUL_MAT on the CPU: dst[m, n] = sum_k a[k, m] * b[k, n].
 *
 * Three strategies, chosen per node by N (the number of activation columns):
 *
 * Broadcast (16 <= N <= BCAST_MAX_N, vector builds): B is small, so it is packed (transposed)
 * and A is read in place; see the comment above bcast_kernel.
 *
 * Packed GEMM (larger N): the classic blocked scheme. For each K block, every
 * thread packs the whole B block into column panels of NR (shared, one copy), then packs its
 * own rows of A into row panels of MR (converting F16/BF16 and dequantising Q8_0/Q4_0 to f32 on
 * the way, so every weight type reaches the same micro-kernel), and the micro-kernel keeps an
 * MR x NR tile of C in registers: per k, MR/16 vector loads of A and NR broadcasts of B feed
 * MR/16 * NR fused multiply-adds. Panels are contiguous, so the loads stream from L1/L2.
 *
 * Dot products (N < 16, matrix-vector): each thread walks its rows of A exactly once and
 * multiplies each against every column of B (which stays in L1): F32/F16/BF16 with f32 FMAs,
 * Q8_0/Q4_0 against B quantised on the fly to Q8_0 (by all threads, before a barrier) with
 * 8-bit integer dot products. This streams the weights once, which is what bounds N = 1.
 *
 * AMX (avx512 build, cpu-amx.c): where the CPU and kernel allow, BF16, F16 and Q8_0/Q4_0
 * weights with enough columns go to tile kernels instead (bp_cpu_amx_use decides).
 *
 * Each build variant compiles this file with its own ISA flags; the #if blocks choose the
 * widest code the variant may use. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu-impl.h"

#if defined(BP_CPU_HAVE_AVX512)
#define MR 32
#define NR 12
#elif defined(BP_CPU_HAVE_AVX2)
#define MR 16
#define NR 6
#else
#define MR 8
#define NR 4
#endif

#define KC 512   /* K block: B micro-panel (KC x NR, 24 KiB) stays in L1; C is swept K / KC times */
#define MC 128   /* rows of A packed at a time (MC x KC in L2) */
#define BP_CPU_GEMM_MIN_N 16 /* below this, dot-product tiles (no packing) */

/* ---- Micro-kernel ----------------------------------------------------------------------- */

/* C[MR x NR] (column stride ldc) = (accumulate ? C : 0) + Apanel[KC x MR] * Bpanel[KC x NR]. */
static void micro_kernel(int64_t kc, const float *restrict ap, const float *restrict bp,
                         float *restrict c, int64_t ldc, bool accumulate)
{
#if defined(BP_CPU_HAVE_AVX512)
    __m512 acc0[NR], acc1[NR];
#pragma GCC unroll 12
    for (int j = 0; j < NR; j++) {
        acc0[j] = accumulate ? _mm512_loadu_ps(c + j * ldc) : _mm512_setzero_ps();
        acc1[j] = accumulate ? _mm512_loadu_ps(c + j * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m512 a0 = _mm512_load_ps(ap + k * MR), a1 = _mm512_load_ps(ap + k * MR + 16);
#pragma GCC unroll 12
        for (int j = 0; j < NR; j++) {
            const __m512 b = _mm512_set1_ps(bp[k * NR + j]);
            acc0[j] = _mm512_fmadd_ps(a0, b, acc0[j]);
            acc1[j] = _mm512_fmadd_ps(a1, b, acc1[j]);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < NR; j++) {
        _mm512_storeu_ps(c + j * ldc, acc0[j]);
        _mm512_storeu_ps(c + j * ldc + 16, acc1[j]);
    }
#elif defined(BP_CPU_HAVE_AVX2)
    __m256 acc0[NR], acc1[NR];
#pragma GCC unroll 6
    for (int j = 0; j < NR; j++) {
        acc0[j] = accumulate ? _mm256_loadu_ps(c + j * ldc) : _mm256_setzero_ps();
        acc1[j] = accumulate ? _mm256_loadu_ps(c + j * ldc + 8) : _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m256 a0 = _mm256_load_ps(ap + k * MR), a1 = _mm256_load_ps(ap + k * MR + 8);
#pragma GCC unroll 6
        for (int j = 0; j < NR; j++) {
            const __m256 b = _mm256_broadcast_ss(bp + k * NR + j);
            acc0[j] = _mm256_fmadd_ps(a0, b, acc0[j]);
            acc1[j] = _mm256_fmadd_ps(a1, b, acc1[j]);
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < NR; j++) {
        _mm256_storeu_ps(c + j * ldc, acc0[j]);
        _mm256_storeu_ps(c + j * ldc + 8, acc1[j]);
    }
#else
    float acc[NR][MR];
    for (int j = 0; j < NR; j++)
        for (int i = 0; i < MR; i++)
            acc[j][i] = accumulate ? c[j * ldc + i] : 0.0f;
    for (int64_t k = 0; k < kc; k++)
        for (int j = 0; j < NR; j++)
            for (int i = 0; i < MR; i++)
                acc[j][i] += ap[k * MR + i] * bp[k * NR + j];
    for (int j = 0; j < NR; j++)
        for (int i = 0; i < MR; i++)
            c[j * ldc + i] = acc[j][i];
#endif
}

/* ---- Packing ---------------------------------------------------------------------------- */

#if !defined(BP_CPU_HAVE_AVX512)
/* A rows [m0, m0 + mc) x k [k0, k0 + kc) into panels of MR rows: panel p holds, for each k, MR
 * consecutive floats (rows past mc are zero). tmp holds one converted row segment. */
static void pack_a(const bp_tensor *a, const char *abase, int64_t m0, int64_t mc, int64_t k0,
                   int64_t kc, float *restrict out, float *restrict tmp)
{
    const size_t row_bytes_per_block = bp_type_size(a->type);
    const int64_t blck = bp_type_block_size(a->type);
    for (int64_t p = 0; p < mc; p += MR) {
        float *panel = out + p * kc;
        const int64_t rows = mc - p < MR ? mc - p : MR;
        for (int64_t i = 0; i < rows; i++) {
            const char *row = abase + (m0 + p + i) * (int64_t)a->nb[1];
            const float *src;
            if (a->type == BP_TYPE_F32) {
                src = (const float *)row + k0;
            } else {
                bp_cpu_to_float(a->type, row + k0 / blck * (int64_t)row_bytes_per_block, tmp, kc);
                src = tmp;
            }
            for (int64_t k = 0; k < kc; k++)
                panel[k * MR + i] = src[k];
        }
        for (int64_t i = rows; i < MR; i++)
            for (int64_t k = 0; k < kc; k++)
                panel[k * MR + i] = 0.0f;
    }
}
#endif

/* B columns [n0, n0 + nc) x k [k0, k0 + kc) into panels of NR columns (zero past nc). */
static void pack_b(const bp_tensor *b, const char *bbase, int64_t n0, int64_t nc, int64_t k0,
                   int64_t kc, float *restrict out)
{
    for (int64_t p = 0; p < nc; p += NR) {
        float *panel = out + p * kc;
        const int64_t cols = nc - p < NR ? nc - p : NR;
        for (int64_t j = 0; j < cols; j++) {
            const float *src = (const float *)(bbase + (n0 + p + j) * (int64_t)b->nb[1]) + k0;
            for (int64_t k = 0; k < kc; k++)
                panel[k * NR + j] = src[k];
        }
        for (int64_t j = cols; j < NR; j++)
            for (int64_t k = 0; k < kc; k++)
                panel[k * NR + j] = 0.0f;
    }
}

#if defined(BP_CPU_HAVE_AVX512)
/* pack_a with 16 x 16 register transposes: rows are read as vectors along k and written as
 * vectors along m, instead of one scalar store per element. tmp holds 16 converted rows. */
static void pack_a_fast(const bp_tensor *a, const char *abase, int64_t m0, int64_t mc, int64_t k0,
                        int64_t kc, float *restrict out, float *restrict tmp)
{
    static const float zeros[KC];
    const size_t bsz = bp_type_size(a->type);
    const int64_t blck = bp_type_block_size(a->type);
    for (int64_t p = 0; p < mc; p += MR) {
        float *panel = out + p * kc;
        for (int h = 0; h < MR / 16; h++) {
            const float *rows[16];
            for (int i = 0; i < 16; i++) {
                const int64_t m = p + h * 16 + i;
                if (m >= mc) {
                    rows[i] = zeros;
                    continue;
                }
                const char *row = abase + (m0 + m) * (int64_t)a->nb[1];
                if (a->type == BP_TYPE_F32) {
                    rows[i] = (const float *)row + k0;
                } else {
                    bp_cpu_to_float(a->type, row + k0 / blck * (int64_t)bsz, tmp + i * KC, kc);
                    rows[i] = tmp + i * KC;
                }
            }
            int64_t k = 0;
            for (; k + 16 <= kc; k += 16) {
                __m512 v[16];
                for (int i = 0; i < 16; i++)
                    v[i] = _mm512_loadu_ps(rows[i] + k);
                bp_cpu_transpose16(v);
                for (int c = 0; c < 16; c++)
                    _mm512_store_ps(panel + (k + c) * MR + h * 16, v[c]);
            }
            for (; k < kc; k++)
                for (int i = 0; i < 16; i++)
                    panel[k * MR + h * 16 + i] = rows[i][k];
        }
    }
}
#endif

static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* ---- Packed GEMM driver ----------------------------------------------------------------- */

static void gemm_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                       const struct bp_cpu_params *p, float *bpack, float *apack, float *tmp)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1], K = a->ne[0];
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const int64_t Np = round_up(N, NR);

    /* Rows of this thread: whole MR panels, as even as possible. */
    int64_t pm0, pm1;
    bp_cpu_split((M + MR - 1) / MR, p->ith, p->nth, &pm0, &pm1);
    const int64_t m_begin = pm0 * MR, m_end = pm1 * MR < M ? pm1 * MR : M;

    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        /* Everyone packs a share of B's panels, then waits for the rest. */
        int64_t q0, q1;
        bp_cpu_split(Np / NR, p->ith, p->nth, &q0, &q1);
        for (int64_t q = q0; q < q1; q++) {
            int64_t n0 = q * NR, nc = N - n0 < NR ? N - n0 : NR;
            pack_b(b, bbase, n0, nc, k0, kc, bpack + n0 * kc);
        }
        bp_cpu_pool_barrier(p->pool);

        for (int64_t mc0 = m_begin; mc0 < m_end; mc0 += MC) {
            const int64_t mc = m_end - mc0 < MC ? m_end - mc0 : MC;
#if defined(BP_CPU_HAVE_AVX512)
            pack_a_fast(a, abase, mc0, mc, k0, kc, apack, tmp);
#else
            pack_a(a, abase, mc0, mc, k0, kc, apack, tmp);
#endif
            for (int64_t n0 = 0; n0 < N; n0 += NR) {
                const float *bpanel = bpack + n0 * kc;
                const int64_t nc = N - n0 < NR ? N - n0 : NR;
                for (int64_t i0 = 0; i0 < mc; i0 += MR) {
                    const int64_t mr = mc - i0 < MR ? mc - i0 : MR;
                    float *c = (float *)cbase + (mc0 + i0) + n0 * ldc;
                    if (mr == MR && nc == NR) {
                        micro_kernel(kc, apack + i0 * kc, bpanel, c, ldc, k0 > 0);
                    } else {
                        /* Edge tile: compute into a full tile, copy back the valid part. */
                        float edge[NR * MR];
                        for (int64_t j = 0; j < nc && k0 > 0; j++)
                            memcpy(edge + j * MR, c + j * ldc, (size_t)mr * sizeof(float));
                        micro_kernel(kc, apack + i0 * kc, bpanel, edge, MR, k0 > 0);
                        for (int64_t j = 0; j < nc; j++)
                            memcpy(c + j * ldc, edge + j * MR, (size_t)mr * sizeof(float));
                    }
                }
            }
        }
        /* B's panels are rewritten for the next K block only after everyone is done. */
        bp_cpu_pool_barrier(p->pool);
    }
}

/* ---- Broadcast path (medium N) ----------------------------------------------------------
 * For 16 <= N <= BCAST_MAX_N, packing A into MR panels costs about as much as the product. Here
 * B (small) is packed instead, transposed so each k holds BN consecutive columns, and A is read
 * in its own row-major layout: per k, BM scalars of A (one from each of BM rows) are broadcast
 * against BN/VW vectors of B. A is converted to f32 in KC-long chunks when it is not f32, and
 * is streamed exactly once per column chunk. */
#if defined(BP_CPU_HAVE_AVX2)
#if defined(BP_CPU_HAVE_AVX512)
#define BVW 16
typedef __m512 bvf;
#define BV_LOAD(p) _mm512_loadu_ps(p)
#define BV_STORE(p, v) _mm512_storeu_ps(p, v)
#define BV_SET1(x) _mm512_set1_ps(x)
#define BV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#else
#define BVW 8
typedef __m256 bvf;
#define BV_LOAD(p) _mm256_loadu_ps(p)
#define BV_STORE(p, v) _mm256_storeu_ps(p, v)
#define BV_SET1(x) _mm256_set1_ps(x)
#define BV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#endif
#define HAVE_BCAST 1
#define BM 12          /* rows of A per block */
#define BN (2 * BVW)   /* columns of B per chunk: two vectors */
#define BCAST_MAX_N 48
#define BKC 256 /* K chunk: the B panel (BKC x BN floats, 32 KiB) stays in L1 */

/* out[BM][BN] += A rows (chunk of kc, row stride lda floats) x bpanel (kc x BN). */
static void bcast_kernel(const float *restrict a, int64_t lda, const float *restrict bpanel,
                         int64_t kc, float *restrict out)
{
    bvf acc[BM][2];
    for (int r = 0; r < BM; r++) {
        acc[r][0] = BV_LOAD(out + r * BN);
        acc[r][1] = BV_LOAD(out + r * BN + BVW);
    }
    for (int64_t k = 0; k < kc; k++) {
        const bvf b0 = BV_LOAD(bpanel + k * BN), b1 = BV_LOAD(bpanel + k * BN + BVW);
#pragma GCC unroll 12
        for (int r = 0; r < BM; r++) {
            const bvf x = BV_SET1(a[r * lda + k]);
            acc[r][0] = BV_FMA(x, b0, acc[r][0]);
            acc[r][1] = BV_FMA(x, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < BM; r++) {
        BV_STORE(out + r * BN, acc[r][0]);
        BV_STORE(out + r * BN + BVW, acc[r][1]);
    }
}

/* The same for a last chunk of at most BVW columns: one vector per row, half the work of the
 * two-vector kernel on zero padding. */
static void bcast_kernel1(const float *restrict a, int64_t lda, const float *restrict bpanel,
                          int64_t kc, float *restrict out)
{
    bvf acc[BM];
    for (int r = 0; r < BM; r++)
        acc[r] = BV_LOAD(out + r * BN);
    for (int64_t k = 0; k < kc; k++) {
        const bvf b0 = BV_LOAD(bpanel + k * BN);
#pragma GCC unroll 12
        for (int r = 0; r < BM; r++)
            acc[r] = BV_FMA(BV_SET1(a[r * lda + k]), b0, acc[r]);
    }
    for (int r = 0; r < BM; r++)
        BV_STORE(out + r * BN, acc[r]);
}

static void bcast_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p, float *bpack, float *tmp)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1], K = a->ne[0];
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const int64_t nchunks = (N + BN - 1) / BN;

    /* B transposed into column chunks: bpack[chunk][k][BN], zero past N. Split over k. */
    int64_t k0, k1;
    bp_cpu_split(K, p->ith, p->nth, &k0, &k1);
    for (int64_t c = 0; c < nchunks; c++)
        for (int64_t k = k0; k < k1; k++) {
            float *dstp = bpack + (c * K + k) * BN;
            for (int64_t j = 0; j < BN; j++) {
                const int64_t n = c * BN + j;
                dstp[j] = n < N ? ((const float *)(bbase + n * (int64_t)b->nb[1]))[k] : 0.0f;
            }
        }
    bp_cpu_pool_barrier(p->pool);

    int64_t bm0, bm1;
    bp_cpu_split((M + BM - 1) / BM, p->ith, p->nth, &bm0, &bm1);
    float *out = tmp;                        /* nchunks x BM x BN accumulators */
    float *achunk = tmp + nchunks * BM * BN; /* BM x BKC converted rows */
    /* f32 rows are read where they are (when the row stride is whole floats); other types,
     * and the rows missing from a short last block, go through achunk. */
    const bool direct = a->type == BP_TYPE_F32 && a->nb[1] % sizeof(float) == 0;
    for (int64_t blk = bm0; blk < bm1; blk++) {
        const int64_t m = blk * BM, rows = M - m < BM ? M - m : BM;
        memset(out, 0, (size_t)(nchunks * BM * BN) * sizeof(float));
        for (int64_t kk = 0; kk < K; kk += BKC) {
            const int64_t kc = K - kk < BKC ? K - kk : BKC;
            const float *arows = achunk;
            int64_t lda = BKC;
            if (direct && rows == BM) {
                arows = (const float *)(abase + m * (int64_t)a->nb[1]) + kk;
                lda = (int64_t)(a->nb[1] / sizeof(float));
            } else {
                /* Rows as f32 (missing rows of a short block are zero). */
                for (int64_t r = 0; r < BM; r++) {
                    float *dstr = achunk + r * BKC;
                    if (r >= rows) {
                        memset(dstr, 0, (size_t)kc * sizeof(float));
                        continue;
                    }
                    const char *row = abase + (m + r) * (int64_t)a->nb[1];
                    const int64_t blck = bp_type_block_size(a->type);
                    bp_cpu_to_float(a->type, row + kk / blck * (int64_t)bp_type_size(a->type),
                                    dstr, kc);
                }
            }
            for (int64_t c = 0; c < nchunks; c++) {
                if (N - c * BN <= BVW) /* the columns past N in this chunk are padding */
                    bcast_kernel1(arows, lda, bpack + (c * K + kk) * BN, kc, out + c * BM * BN);
                else
                    bcast_kernel(arows, lda, bpack + (c * K + kk) * BN, kc, out + c * BM * BN);
            }
        }
        for (int64_t c = 0; c < nchunks; c++)
            for (int64_t j = 0; j < BN && c * BN + j < N; j++)
                for (int64_t r = 0; r < rows; r++)
                    ((float *)cbase)[(c * BN + j) * ldc + m + r] = out[c * BM * BN + r * BN + j];
    }
    bp_cpu_pool_barrier(p->pool); /* bpack is rewritten for the next batch */
}
#endif

/* ---- Dot-product path ------------------------------------------------------------------- */

#if defined(BP_CPU_HAVE_AVX512)
BP_CPU_INLINE float hsum512(__m512 v)
{
    return _mm512_reduce_add_ps(v);
}
#endif
#if defined(BP_CPU_HAVE_AVX2)
BP_CPU_INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#define RD 8 /* rows of A per dot-product step (tiles of 8 or 4 rows) */
#define CD 4 /* most columns of B per dot-product tile */

/* Loads 16 (AVX-512) or 8 (AVX2) elements of an A row of type T as f32. */
#if defined(BP_CPU_HAVE_AVX512)
#define VW 16
typedef __m512 vf;
#define VZERO() _mm512_setzero_ps()
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VHSUM(v) hsum512(v)
#define LOAD_F32(p, k) _mm512_loadu_ps((const float *)(p) + (k))
#define LOAD_F16(p, k) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(p) + (k))))
#define LOAD_BF16(p, k)                                                                        \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                                     \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(p) + (k)))), 16))
#elif defined(BP_CPU_HAVE_AVX2)
#define VW 8
typedef __m256 vf;
#define VZERO() _mm256_setzero_ps()
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VHSUM(v) hsum256(v)
#define LOAD_F32(p, k) _mm256_loadu_ps((const float *)(p) + (k))
#define LOAD_F16(p, k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (k))))
#define LOAD_BF16(p, k)                                                                        \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                     \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (k)))), 16))
#endif

static float scalar_a(enum bp_type t, const void *p, int64_t k)
{
    if (t == BP_TYPE_F32)
        return ((const float *)p)[k];
    uint16_t h = ((const uint16_t *)p)[k];
    if (t == BP_TYPE_F16)
        return bp_fp16_to_fp32(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* out[r][c] = dot(a[r], b[c]) over K for an NR x NC tile, A in its own type (converted in
 * registers), B f32. Each loaded vector of A feeds NC products and each vector of B feeds NR.
 * One column takes eight rows at a time: with four, a single thread read an L3-resident f32
 * matrix at 0.4-0.95x OpenBLAS's sgemv speed, with eight at 0.95-0.99x (four alternating
 * runs, M = K = 4096, 2 threads); more rows in flight keep more of the memory system busy.
 * Four columns keep four rows (eight would need all 32 registers for accumulators). The loops
 * over rows and columns must be unrolled for the accumulators to live in registers: GCC -O2
 * did not on its own, and the tiles ran at about 20 GFLOP/s per thread whatever N was. */
#ifdef VW
#define DEFINE_DOT_TILE(NAME, LOAD, NR, NC)                                                    \
    static void NAME(const void *const a[], const float *const b[], int64_t K,                 \
                     float out[][CD])                                                          \
    {                                                                                          \
        vf acc[NR][NC];                                                                        \
        _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++)                                                           \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                                                       \
                acc[r][c] = VZERO();                                                           \
        int64_t k = 0;                                                                         \
        for (; k + VW <= K; k += VW) {                                                         \
            vf vb[NC];                                                                         \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                                                       \
                vb[c] = LOAD_F32(b[c], k);                                                     \
            _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++) {                                                     \
                const vf va = LOAD(a[r], k);                                                   \
                _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                                                   \
                    acc[r][c] = VFMA(va, vb[c], acc[r][c]);                                    \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++)                                                           \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                                                       \
                out[r][c] = VHSUM(acc[r][c]);                                                  \
        (void)k;                                                                               \
    }
/* Rows per tile of two and four columns: the accumulators, B's vectors and one A vector must
 * fit the register file (32 zmm; 16 ymm on AVX2). */
#if defined(BP_CPU_HAVE_AVX512)
#define NR2 8
#define NR4 4
#else
#define NR2 4
#define NR4 2
#endif
DEFINE_DOT_TILE(tile_f32_1, LOAD_F32, 8, 1)
DEFINE_DOT_TILE(tile_f32_2, LOAD_F32, NR2, 2)
DEFINE_DOT_TILE(tile_f32_4, LOAD_F32, NR4, 4)
DEFINE_DOT_TILE(tile_f16_1, LOAD_F16, 8, 1)
DEFINE_DOT_TILE(tile_f16_2, LOAD_F16, NR2, 2)
DEFINE_DOT_TILE(tile_f16_4, LOAD_F16, NR4, 4)
DEFINE_DOT_TILE(tile_bf16_1, LOAD_BF16, 8, 1)
DEFINE_DOT_TILE(tile_bf16_2, LOAD_BF16, NR2, 2)
DEFINE_DOT_TILE(tile_bf16_4, LOAD_BF16, NR4, 4)
#endif

static void dot_tile(enum bp_type t, const void *const a[RD], const float *const b[CD], int nc,
                     int64_t K, float out[RD][CD])
{
    int64_t k0 = 0;
#ifdef VW
    typedef void (*tile_fn)(const void *const[], const float *const[], int64_t, float[][CD]);
    static const tile_fn fns[3][3] = {{tile_f32_1, tile_f32_2, tile_f32_4},
                                      {tile_f16_1, tile_f16_2, tile_f16_4},
                                      {tile_bf16_1, tile_bf16_2, tile_bf16_4}};
    static const int rows[3] = {8, NR2, NR4};
    const int ti = t == BP_TYPE_F32 ? 0 : t == BP_TYPE_F16 ? 1 : 2;
    const int ci = nc == 1 ? 0 : nc == 2 ? 1 : 2;
    for (int r = 0; r < RD; r += rows[ci])
        fns[ti][ci](a + r, b, K, out + r);
    k0 = K / VW * VW;
#else
    for (int r = 0; r < RD; r++)
        for (int c = 0; c < nc; c++)
            out[r][c] = 0.0f;
#endif
    for (int64_t k = k0; k < K; k++)
        for (int r = 0; r < RD; r++) {
            const float x = scalar_a(t, a[r], k);
            for (int c = 0; c < nc; c++)
                out[r][c] += x * b[c][k];
        }
}

/* dst[m, n] for rows [m0, m1) and every n, A rows of f32/f16/bf16. A short tile repeats its
 * last row and drops the extra results. */
static void dot_rows_float(const bp_tensor *a, const char *abase, const bp_tensor *b,
                           const char *bbase, char *cbase, int64_t ldc, int64_t m0, int64_t m1,
                           int64_t N)
{
    const int64_t K = a->ne[0];
    for (int64_t m = m0; m < m1; m += RD) {
        const int64_t rows = m1 - m < RD ? m1 - m : RD;
        const void *ar[RD];
        for (int64_t r = 0; r < RD; r++)
            ar[r] = abase + (m + (r < rows ? r : rows - 1)) * (int64_t)a->nb[1];
        for (int64_t n = 0; n < N;) {
            const int nc = N - n >= 4 ? 4 : N - n >= 2 ? 2 : 1;
            const float *bc[CD];
            for (int c = 0; c < nc; c++)
                bc[c] = (const float *)(bbase + (n + c) * (int64_t)b->nb[1]);
            float out[RD][CD];
            dot_tile(a->type, ar, bc, nc, K, out);
            for (int c = 0; c < nc; c++)
                for (int64_t r = 0; r < rows; r++)
                    ((float *)cbase)[(n + c) * ldc + m + r] = out[r][c];
            n += nc;
        }
    }
}

#if defined(BP_CPU_HAVE_AVX2)
/* 32 signed bytes of x times 32 signed bytes of y, summed in eight int32 lanes. */
BP_CPU_INLINE __m256i dot_i8x32(__m256i vx, __m256i vy)
{
    /* Both instructions multiply unsigned by signed bytes: move x's sign onto y. */
    const __m256i ax = _mm256_sign_epi8(vx, vx), sy = _mm256_sign_epi8(vy, vx);
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
#endif
}

BP_CPU_INLINE __m256i load_q4(const struct bp_block_q4_0 *b)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f));
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
}
#endif

#if defined(BP_CPU_HAVE_AVX2)
BP_CPU_INLINE __m256i load_a_block(enum bp_type type, const void *xrow, int64_t i)
{
    if (type == BP_TYPE_Q8_0)
        return _mm256_loadu_si256((const __m256i *)((const struct bp_block_q8_0 *)xrow)[i].qs);
    return load_q4((const struct bp_block_q4_0 *)xrow + i);
}

BP_CPU_INLINE float a_scale(enum bp_type type, const void *xrow, int64_t i)
{
    return bp_cpu_half_to_float(type == BP_TYPE_Q8_0 ? ((const struct bp_block_q8_0 *)xrow)[i].d
                                              : ((const struct bp_block_q4_0 *)xrow)[i].d);
}

/* out[c] = sum over blocks of d_x d_y (q_x . q_y) for nc <= 4 columns of B (Q8_0): each block
 * of A is loaded (and for Q4_0 unpacked) once for all columns. Two blocks per step keep two
 * independent chains in flight. Inlined with a constant nc (below), so that the loops over
 * columns unroll and the accumulators stay in registers. */
BP_CPU_INLINE void dot_quant_cols_n(enum bp_type type, const void *xrow,
                                    const struct bp_block_q8_0 *const y[4], const int nc,
                                    int64_t nb, float out[4])
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i x0 = load_a_block(type, xrow, i), x1 = load_a_block(type, xrow, i + 1);
        const float d0 = a_scale(type, xrow, i), d1 = a_scale(type, xrow, i + 1);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const __m256i s0 = dot_i8x32(x0, _mm256_loadu_si256((const __m256i *)y[c][i].qs));
            const __m256i s1 = dot_i8x32(x1, _mm256_loadu_si256((const __m256i *)y[c][i + 1].qs));
            acc[c][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0),
                                        _mm256_set1_ps(d0 * bp_cpu_half_to_float(y[c][i].d)), acc[c][0]);
            acc[c][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1),
                                        _mm256_set1_ps(d1 * bp_cpu_half_to_float(y[c][i + 1].d)),
                                        acc[c][1]);
        }
    }
    for (; i < nb; i++) {
        const __m256i x0 = load_a_block(type, xrow, i);
        const float d0 = a_scale(type, xrow, i);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const __m256i s0 = dot_i8x32(x0, _mm256_loadu_si256((const __m256i *)y[c][i].qs));
            acc[c][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0),
                                        _mm256_set1_ps(d0 * bp_cpu_half_to_float(y[c][i].d)), acc[c][0]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++)
        out[c] = hsum256(_mm256_add_ps(acc[c][0], acc[c][1]));
}
static void dot_quant_cols(enum bp_type type, const void *xrow, const struct bp_block_q8_0 *const y[4],
                           int nc, int64_t nb, float out[4])
{
    switch (nc) {
    case 1:
        dot_quant_cols_n(type, xrow, y, 1, nb, out);
        break;
    case 2:
        dot_quant_cols_n(type, xrow, y, 2, nb, out);
        break;
    case 3:
        dot_quant_cols_n(type, xrow, y, 3, nb, out);
        break;
    default:
        dot_quant_cols_n(type, xrow, y, 4, nb, out);
        break;
    }
}
#else
static void dot_quant_cols(enum bp_type type, const void *xrow, const struct bp_block_q8_0 *const y[4],
                           int nc, int64_t nb, float out[4])
{
    for (int c = 0; c < nc; c++) {
        float sum = 0.0f;
        for (int64_t i = 0; i < nb; i++) {
            int32_t s = 0;
            float d;
            if (type == BP_TYPE_Q8_0) {
                const struct bp_block_q8_0 *x = (const struct bp_block_q8_0 *)xrow + i;
                for (int j = 0; j < 32; j++)
                    s += x->qs[j] * y[c][i].qs[j];
                d = bp_cpu_half_to_float(x->d);
            } else {
                const struct bp_block_q4_0 *x = (const struct bp_block_q4_0 *)xrow + i;
                for (int j = 0; j < 16; j++)
                    s += ((x->qs[j] & 0x0f) - 8) * y[c][i].qs[j] +
                         ((x->qs[j] >> 4) - 8) * y[c][i].qs[j + 16];
                d = bp_cpu_half_to_float(x->d);
            }
            sum += d * bp_cpu_half_to_float(y[c][i].d) * (float)s;
        }
        out[c] = sum;
    }
}
#endif

#if defined(BP_CPU_HAVE_AVX512_VNNI)
#define HAVE_QROWS8 1
/* Eight rows of quantised A against up to four Q8_0 columns of B, with VNNI (vpdpbusd:
 * unsigned bytes times signed bytes, four at a time into each 32-bit lane). The weights are
 * made unsigned: a Q4_0 nibble is q + 8, a Q8_0 byte x ^ 0x80 is x + 128, so each block's dot
 * product comes out too large by c sum(y) (c = 8 or 128); ysum holds sum(y) per block,
 * computed once per column, and the correction starts the accumulation.
 *
 * One 512-bit register holds the same 16 bytes of a block for four rows, one row per 128-bit
 * lane (loaded with masked broadcasts: a load and a blend each, no shuffles), against those 16
 * bytes of y broadcast to every lane; the two halves of the block go into the same lanes, so
 * each row ends a block with four partial sums in its own lane. Those partials share the row's
 * scale, so they are scaled and accumulated where they are and added up once at the end, and
 * the eight rows' block scales are gathered (vpgatherdd) in the loop: no staging pass and no
 * per-block reduction. Each block of the eight rows is loaded once for all columns. The
 * gather needs 7 * lda to fit a 32-bit index. */
static int64_t qblock_size(enum bp_type type)
{
    return type == BP_TYPE_Q4_0 ? (int64_t)sizeof(struct bp_block_q4_0)
                                : (int64_t)sizeof(struct bp_block_q8_0);
}

/* 16 bytes at p in four rows lda apart (lda3 = 3 lda), one row per 128-bit lane. Addressing
 * from one pointer keeps the row pointers out of registers the loop needs. */
BP_CPU_INLINE __m512i qrows8_load4(const char *p, int64_t lda, int64_t lda3)
{
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_mask_broadcast_i32x4(v, 0x00f0, _mm_loadu_si128((const __m128i *)(p + lda)));
    v = _mm512_mask_broadcast_i32x4(v, 0x0f00, _mm_loadu_si128((const __m128i *)(p + 2 * lda)));
    return _mm512_mask_broadcast_i32x4(v, 0xf000, _mm_loadu_si128((const __m128i *)(p + lda3)));
}

/* One block (starting at p) of four rows as unsigned bytes: its low and high 16 values. */
BP_CPU_INLINE void qrows8_unsigned4(const enum bp_type type, const char *p, int64_t lda,
                                    int64_t lda3, __m512i *lo, __m512i *hi)
{
    if (type == BP_TYPE_Q4_0) {
        const __m512i q = qrows8_load4(p + 2, lda, lda3), m = _mm512_set1_epi8(0x0f);
        *lo = _mm512_and_si512(q, m);
        *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m);
    } else {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        *lo = _mm512_xor_si512(qrows8_load4(p + 2, lda, lda3), flip);
        *hi = _mm512_xor_si512(qrows8_load4(p + 18, lda, lda3), flip);
    }
}

/* out[c * 8 + i] = row i of the eight against column c, for nc columns (a constant in each
 * inlined copy, so the loops over columns unroll). */
BP_CPU_INLINE void qrows8_t(const enum bp_type type, const int nc, const char *row0, int64_t lda,
                            const struct bp_block_q8_0 *const y[4], const int32_t *const ysum[4],
                            int64_t nb, float *out)
{
    const int64_t bs = qblock_size(type);
    const int32_t c = type == BP_TYPE_Q4_0 ? 8 : 128;
    const int64_t lda3 = 3 * lda;
    const __m256i gidx =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)lda));
    const __m512i e0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i e1 = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int64_t o = i * bs;
        __m512i lo0, hi0, lo1, hi1;
        qrows8_unsigned4(type, row0 + o, lda, lda3, &lo0, &hi0);           /* rows 0-3 */
        qrows8_unsigned4(type, row0 + 4 * lda + o, lda, lda3, &lo1, &hi1); /* rows 4-7 */
        /* The scales: the first 4 bytes of each row's block (the f16 scale is the low half). */
        const __m256i g = _mm256_i32gather_epi32((const int *)(row0 + o), gidx, 1);
        const __m256 dw = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const struct bp_block_q8_0 *yb = y[j] + i;
            const __m512i ylo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)yb->qs));
            const __m512i yhi =
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(yb->qs + 16)));
            const __m512i corr = _mm512_maskz_set1_epi32(0x1111, -ysum[j][i] * c);
            const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo0, ylo), hi0, yhi);
            const __m512i b = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo1, ylo), hi1, yhi);
            const __m512 dz =
                _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(_cvtsh_ss(yb->d))));
            acc[j][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_permutexvar_ps(e0, dz),
                                        acc[j][0]);
            acc[j][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), _mm512_permutexvar_ps(e1, dz),
                                        acc[j][1]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        float t0[16], t1[16];
        _mm512_storeu_ps(t0, acc[j][0]);
        _mm512_storeu_ps(t1, acc[j][1]);
        for (int k = 0; k < 4; k++) {
            out[j * 8 + k] = (t0[4 * k] + t0[4 * k + 1]) + (t0[4 * k + 2] + t0[4 * k + 3]);
            out[j * 8 + 4 + k] = (t1[4 * k] + t1[4 * k + 1]) + (t1[4 * k + 2] + t1[4 * k + 3]);
        }
    }
}

/* One loop per weight type and column count. */
static void qrows8(enum bp_type type, int nc, const char *row0, int64_t lda,
                   const struct bp_block_q8_0 *const y[4], const int32_t *const ysum[4],
                   int64_t nb, float *out)
{
#define Q4(c) qrows8_t(BP_TYPE_Q4_0, c, row0, lda, y, ysum, nb, out)
#define Q8(c) qrows8_t(BP_TYPE_Q8_0, c, row0, lda, y, ysum, nb, out)
    if (type == BP_TYPE_Q4_0) {
        BP_CPU_BY_COLUMNS(nc, Q4)
    } else {
        BP_CPU_BY_COLUMNS(nc, Q8)
    }
#undef Q4
#undef Q8
}
#endif

/* One column of B to Q8_0 blocks, exactly as the runtime's Q8_0 conversion does it (scale
 * amax / 127 rounded to f16, quants x * (1 / scale) rounded to nearest even), and the sum of
 * each block's quants. */
void bp_cpu_quantize_q8_0(const float *x, struct bp_block_q8_0 *b, int32_t *sums, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32) {
#if defined(BP_CPU_HAVE_AVX512)
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)b[i].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(b[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
        sums[i] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = bp_fp32_to_fp16(d);
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) {
            b[i].qs[j] = (int8_t)lrintf(x[j] * id);
            sum += b[i].qs[j];
        }
        sums[i] = sum;
#endif
    }
}

/* dst[m, n] for rows [m0, m1): quantised A against B already quantised to Q8_0 (bq; ysum: the
 * sum of each block's quants). */
static void dot_rows_quant(const bp_tensor *a, const char *abase, const struct bp_block_q8_0 *bq,
                           const int32_t *ysum, char *cbase, int64_t ldc, int64_t m0, int64_t m1,
                           int64_t N)
{
    const int64_t nb = a->ne[0] / 32;
    (void)ysum;
#ifdef HAVE_QROWS8
    const int64_t lda = (int64_t)a->nb[1];
    if (7 * lda <= INT32_MAX) {
        for (; m0 + 8 <= m1; m0 += 8)
            for (int64_t n = 0; n < N; n += 4) {
                const int nc = N - n < 4 ? (int)(N - n) : 4;
                const struct bp_block_q8_0 *y[4];
                const int32_t *ys[4];
                for (int c = 0; c < 4; c++) {
                    y[c] = bq + (n + (c < nc ? c : 0)) * nb;
                    ys[c] = ysum + (n + (c < nc ? c : 0)) * nb;
                }
                float out[32];
                qrows8(a->type, nc, abase + m0 * lda, lda, y, ys, nb, out);
                for (int c = 0; c < nc; c++)
                    memcpy((float *)cbase + (n + c) * ldc + m0, out + c * 8, 8 * sizeof(float));
            }
    }
#endif
    for (int64_t m = m0; m < m1; m++) {
        const char *row = abase + m * (int64_t)a->nb[1];
        for (int64_t n = 0; n < N; n += 4) {
            const int nc = N - n < 4 ? (int)(N - n) : 4;
            const struct bp_block_q8_0 *y[4];
            for (int c = 0; c < 4; c++)
                y[c] = bq + (n + (c < nc ? c : 0)) * nb;
            float out[4];
            dot_quant_cols(a->type, row, y, nc, nb, out);
            for (int c = 0; c < nc; c++)
                ((float *)cbase)[(n + c) * ldc + m] = out[c];
        }
    }
}

/* ---- Driver ----------------------------------------------------------------------------- */

/* Repacked weights (cpu-repack.c) take neither the GEMM nor the broadcast kernel: they have
 * their own, or AMX. */
static bool use_gemm(const bp_tensor *dst)
{
    return dst->ne[1] >= BP_CPU_GEMM_MIN_N && bp_cpu_repacked_base(dst->src[0]) == NULL;
}

#ifdef HAVE_BCAST
static bool use_bcast(const bp_tensor *dst)
{
    return dst->ne[1] >= 16 && dst->ne[1] <= BCAST_MAX_N &&
           bp_cpu_repacked_base(dst->src[0]) == NULL;
}
#endif

static bool quantized(enum bp_type t)
{
    return t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0;
}

/* The block sums of B's quantised columns follow the blocks, 64-byte aligned. */
static size_t ysum_offset(int64_t N, int64_t nb)
{
    return ((size_t)(N * nb) * sizeof(struct bp_block_q8_0) + 63) & ~(size_t)63;
}

bool bp_cpu_mul_mat_supported(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    /* Rows of A and B contiguous along K, and C contiguous along M. */
    return a->type != BP_TYPE_I32 && b->type == BP_TYPE_F32 && dst->type == BP_TYPE_F32 &&
           a->nb[0] == bp_type_size(a->type) && b->nb[0] == sizeof(float) &&
           dst->nb[0] == sizeof(float);
}

void bp_cpu_mul_mat_work_size(const bp_tensor *dst, int nth, size_t *per_thread, size_t *shared)
{
    const int64_t K = dst->src[0]->ne[0], N = dst->ne[1];
    (void)nth;
#if defined(BP_CPU_HAVE_AMX)
    if (bp_cpu_amx_use(dst)) {
        bp_cpu_amx_work_size(dst, per_thread, shared);
        return;
    }
#endif
#ifdef HAVE_BCAST
    if (use_bcast(dst)) {
        const int64_t nchunks = (N + BN - 1) / BN;
        *per_thread = (size_t)(nchunks * BM * BN + BM * BKC + 64) * sizeof(float);
        *shared = (size_t)(nchunks * K * BN) * sizeof(float);
        return;
    }
#endif
    if (use_gemm(dst)) {
        *per_thread = (size_t)(MC * KC + 16 * KC + 64) * sizeof(float);
        *shared = (size_t)(round_up(N, NR) * KC) * sizeof(float);
    } else {
        *per_thread = (size_t)(RD * K + 64) * sizeof(float);
        /* B quantised to Q8_0, one batch at a time: blocks, block sums and block scales. */
        *shared = quantized(dst->src[0]->type)
                      ? ysum_offset(N, (K + 31) / 32) + (size_t)(N * ((K + 31) / 32)) *
                                                              (sizeof(int32_t) + sizeof(float))
                      : 0;
    }
}

void bp_cpu_mul_mat(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const bool repacked = bp_cpu_repacked_base(a) != NULL;
    const bool gemm = use_gemm(dst);
#ifdef HAVE_BCAST
    const bool bcast = use_bcast(dst);
#endif
#if defined(BP_CPU_HAVE_AMX)
    const bool amx = bp_cpu_amx_use(dst);
#endif
    float *tmp = p->wdata;

    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++) {
            const char *abase = (const char *)a->data + (i2 / r2) * (int64_t)a->nb[2] +
                                (i3 / r3) * (int64_t)a->nb[3];
            const char *bbase = (const char *)b->data + i2 * (int64_t)b->nb[2] +
                                i3 * (int64_t)b->nb[3];
            char *cbase = (char *)dst->data + i2 * (int64_t)dst->nb[2] + i3 * (int64_t)dst->nb[3];
            if (M == 0 || N == 0)
                continue;
            if (a->ne[0] == 0) { /* empty sums: every kernel below assumes some K */
                int64_t n0, n1;
                bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
                for (int64_t n = n0; n < n1; n++)
                    memset(cbase + n * (int64_t)dst->nb[1], 0, (size_t)M * sizeof(float));
                continue;
            }
#if defined(BP_CPU_HAVE_AMX)
            if (amx) {
                bp_cpu_amx_mul_mat(dst, abase, bbase, cbase, p);
                continue;
            }
#endif
#ifdef HAVE_BCAST
            if (bcast) {
                bcast_batch(dst, abase, bbase, cbase, p, p->wshared, tmp);
                continue;
            }
#endif
            if (gemm) {
                float *apack = tmp + 16 * KC; /* after 16 converted rows; 64-byte aligned */
                gemm_batch(dst, abase, bbase, cbase, p, p->wshared, apack, tmp);
                continue;
            }
            int64_t m0, m1;
            if (!quantized(a->type)) {
                bp_cpu_split(M, p->ith, p->nth, &m0, &m1);
                dot_rows_float(a, abase, b, bbase, cbase, ldc, m0, m1, N);
                continue;
            }
            /* Quantise B's columns (shared by all threads), then integer dot products. */
            struct bp_block_q8_0 *bq = p->wshared;
            const int64_t nb = a->ne[0] / 32;
            int32_t *ysum = (int32_t *)((char *)bq + ysum_offset(N, nb));
            int64_t n0, n1;
            bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
            for (int64_t n = n0; n < n1; n++)
                bp_cpu_quantize_q8_0((const float *)(bbase + n * (int64_t)b->nb[1]), bq + n * nb,
                             ysum + n * nb, nb);
            /* Rows in groups of eight, so that every thread can use the eight-row kernel. */
            bp_cpu_split((M + 7) / 8, p->ith, p->nth, &m0, &m1);
            if (repacked) {
#ifdef BP_CPU_REPACK_KERNEL
                float *yd = (float *)(ysum + N * nb);
                const int32_t corr = bp_cpu_repack_ycorr(a->type);
                for (int64_t i = n0 * nb; i < n1 * nb; i++) {
                    ysum[i] *= corr; /* per lane: the weights' offset, two lanes per row */
                    yd[i] = bp_cpu_half_to_float(bq[i].d);
                }
                bp_cpu_pool_barrier(p->pool);
                bp_cpu_repack_mul_mat(a, bq, ysum, yd, (float *)cbase, ldc, m0, m1, N);
#else
                /* Eight rows at a time back in the Q4_0 layout (this thread's scratch), then the
                 * ordinary kernels. */
                void *rows8 = p->wdata;
                bp_cpu_pool_barrier(p->pool);
                for (int64_t g = m0; g < m1; g++) {
                    const int rows = M - g * 8 < 8 ? (int)(M - g * 8) : 8;
                    bp_cpu_repack_unpack_group(a, g, rows, rows8);
                    dot_rows_quant(a, (const char *)rows8, bq, ysum,
                                   cbase + g * 8 * (int64_t)sizeof(float), ldc, 0, rows, N);
                }
#endif
                bp_cpu_pool_barrier(p->pool);
                continue;
            }
            m0 *= 8;
            m1 = m1 * 8 < M ? m1 * 8 : M;
            bp_cpu_pool_barrier(p->pool);
            dot_rows_quant(a, abase, bq, ysum, cbase, ldc, m0, m1, N);
            bp_cpu_pool_barrier(p->pool); /* bq is rewritten for the next batch */
        }
    }
}
