/* cpu-gemm.c - MUL_MAT for 16 or more activation columns: the packed GEMM and the broadcast
 * kernel (pick_strategy in cpu-matmul.c chooses between them and the rest).
 *
 * Packed GEMM: the classic blocked scheme. For each K block, every thread packs the whole B
 * block into column panels of NR (shared, one copy), then packs its own rows of A into row
 * panels of MR (converting F16/BF16 and dequantising Q8_0/Q4_0 to f32 on the way, so every
 * weight type reaches the same micro-kernel), and the micro-kernel keeps an MR x NR tile of C in
 * registers: per k, MR/16 vector loads of A and NR broadcasts of B feed MR/16 * NR fused
 * multiply-adds. Panels are contiguous, so the loads stream from L1/L2. The micro-kernel comes
 * in four widths (AVX-512 32 x 12, AVX2 16 x 6, SSE2 8 x 6, portable C 8 x 4), kept side by
 * side because they are one algorithm; the AVX-512 build also packs A with register
 * transposes.
 *
 * Broadcast (medium N, AVX2 and AVX-512 builds): B is small, so it is packed (transposed) and
 * A is read in place; see the comment above bcast_kernel. One body serves both vector widths
 * through the BV_ macros. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"

#if defined(BP_CPU_HAVE_AVX512)
#define MR 32
#define NR 12
#elif defined(BP_CPU_HAVE_AVX2)
#define MR 16
#define NR 6
#elif defined(BP_CPU_HAVE_SSE2)
#define MR 8
#define NR 6
#else
#define MR 8
#define NR 4
#endif

#define KC 512   /* K block: B micro-panel (KC x NR, 24 KiB) stays in L1; C is swept K / KC times */
#define MC 128   /* rows of A packed at a time (MC x KC in L2) */

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
#elif defined(BP_CPU_HAVE_SSE2)
    /* 8 x 6: twelve accumulators, two A vectors and a broadcast in the sixteen registers. */
    __m128 acc0[NR], acc1[NR];
#pragma GCC unroll 6
    for (int j = 0; j < NR; j++) {
        acc0[j] = accumulate ? _mm_loadu_ps(c + j * ldc) : _mm_setzero_ps();
        acc1[j] = accumulate ? _mm_loadu_ps(c + j * ldc + 4) : _mm_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m128 a0 = _mm_load_ps(ap + k * MR), a1 = _mm_load_ps(ap + k * MR + 4);
#pragma GCC unroll 6
        for (int j = 0; j < NR; j++) {
            const __m128 b = _mm_set1_ps(bp[k * NR + j]);
            acc0[j] = _mm_add_ps(acc0[j], _mm_mul_ps(a0, b));
            acc1[j] = _mm_add_ps(acc1[j], _mm_mul_ps(a1, b));
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < NR; j++) {
        _mm_storeu_ps(c + j * ldc, acc0[j]);
        _mm_storeu_ps(c + j * ldc + 4, acc1[j]);
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

#if defined(BP_CPU_HAVE_AVX2) && !defined(BP_CPU_HAVE_AVX512)
/* 8 rows x 8 columns of floats transposed in registers: out[c][r] = in[r][c]. */
static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* pack_a (below) for the avx2 build: eight rows at a time converted (or read in place, f32) and
 * transposed 8 x 8 in registers instead of one scalar store per element (f16 4096^2 N = 512 on
 * the avx2 variant: the packing was a fifth of the time). tmp holds 16 converted rows. */
static void pack_a(const bp_tensor *a, const char *abase, int64_t m0, int64_t mc, int64_t k0,
                   int64_t kc, float *restrict out, float *restrict tmp)
{
    static const float zeros[KC];
    const size_t bsz = bp_type_size(a->type);
    const int64_t blck = bp_type_block_size(a->type);
    for (int64_t p = 0; p < mc; p += MR) {
        float *panel = out + p * kc;
        for (int h = 0; h < MR / 8; h++) {
            const float *rows[8];
            for (int i = 0; i < 8; i++) {
                const int64_t m = p + h * 8 + i;
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
            for (; k + 8 <= kc; k += 8) {
                __m256 v[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    v[i] = _mm256_loadu_ps(rows[i] + k);
                transpose8(v);
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++)
                    _mm256_store_ps(panel + (k + c) * MR + h * 8, v[c]);
            }
            for (; k < kc; k++)
                for (int i = 0; i < 8; i++)
                    panel[k * MR + h * 8 + i] = rows[i][k];
        }
    }
}
#elif !defined(BP_CPU_HAVE_AVX512)
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

#if defined(BP_CPU_HAVE_AVX512)
/* The first n (< 16) of 16 transposed vectors: width floats of each to out + c * stride. The
 * vectors go through a buffer, so that the callers index v with constants only and keep it in
 * registers. */
static void transpose_tail(const __m512 v[16], int64_t n, float *out, int64_t stride, int width)
{
    _Alignas(64) float buf[16 * 16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++)
        _mm512_store_ps(buf + 16 * c, v[c]);
    for (int64_t c = 0; c < n; c++)
        memcpy(out + c * stride, buf + 16 * c, (size_t)width * sizeof(float));
}
#endif

/* B columns [n0, n0 + nc) x k [k0, k0 + kc) into panels of NR columns (zero past nc). */
static void pack_b(const bp_tensor *b, const char *bbase, int64_t n0, int64_t nc, int64_t k0,
                   int64_t kc, float *restrict out)
{
#if defined(BP_CPU_HAVE_AVX512)
    /* 16 x 16 register transposes, NR = 12 of the 16 lanes stored per k. */
    static const float zeros[KC];
    for (int64_t p = 0; p < nc; p += NR) {
        float *panel = out + p * kc;
        const float *cols[16];
        for (int j = 0; j < 16; j++)
            cols[j] = j < NR && p + j < nc
                          ? (const float *)(bbase + (n0 + p + j) * (int64_t)b->nb[1]) + k0
                          : zeros;
        for (int64_t k = 0; k < kc; k += 16) {
            const int64_t n = kc - k < 16 ? kc - k : 16;
            const __mmask16 mask = (__mmask16)((1u << n) - 1u);
            __m512 v[16];
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                v[j] = _mm512_maskz_loadu_ps(mask, cols[j] + k);
            bp_cpu_transpose16(v);
            if (n == 16) {
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++)
                    _mm512_mask_storeu_ps(panel + (k + c) * NR, (__mmask16)((1u << NR) - 1u),
                                          v[c]);
            } else {
                transpose_tail(v, n, panel + k * NR, NR, NR);
            }
        }
    }
#else
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
#endif
}

#if defined(BP_CPU_HAVE_AVX512)
/* Up to 16 consecutive values of a row as floats, read in the row's own type: F32, F16 or BF16
 * (the conversions are exact); lanes outside mask are zero and not read. */
static inline __m512 load_row16(enum bp_type type, const void *row, int64_t k, __mmask16 mask)
{
    if (type == BP_TYPE_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + k));
    if (type == BP_TYPE_BF16) {
        const __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)row + k);
        const __m512i w = _mm512_cvtepu16_epi32(h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)row + k);
}

/* pack_a with 16 x 16 register transposes: rows are read as vectors along k and written as
 * vectors along m, instead of one scalar store per element. F32, F16 and BF16 rows are read in
 * place (converted in registers); quantised rows are first converted into tmp (16 rows). */
static void pack_a_fast(const bp_tensor *a, const char *abase, int64_t m0, int64_t mc, int64_t k0,
                        int64_t kc, float *restrict out, float *restrict tmp)
{
    static const float zeros[KC]; /* all-zero bits: 0.0 in every direct type */
    const size_t bsz = bp_type_size(a->type);
    const int64_t blck = bp_type_block_size(a->type);
    const bool direct = a->type == BP_TYPE_F32 || a->type == BP_TYPE_F16 ||
                        a->type == BP_TYPE_BF16;
    const enum bp_type rtype = direct ? a->type : BP_TYPE_F32; /* what rows[] point at */
    for (int64_t p = 0; p < mc; p += MR) {
        float *panel = out + p * kc;
        for (int h = 0; h < MR / 16; h++) {
            const void *rows[16]; /* each at the row's k0 */
            for (int i = 0; i < 16; i++) {
                const int64_t m = p + h * 16 + i;
                if (m >= mc) {
                    rows[i] = zeros;
                    continue;
                }
                const char *row = abase + (m0 + m) * (int64_t)a->nb[1];
                if (direct) {
                    rows[i] = row + k0 * (int64_t)bsz; /* one value per block */
                } else {
                    bp_cpu_to_float(a->type, row + k0 / blck * (int64_t)bsz, tmp + i * KC, kc);
                    rows[i] = tmp + i * KC;
                }
            }
            for (int64_t k = 0; k < kc; k += 16) {
                const int64_t n = kc - k < 16 ? kc - k : 16;
                const __mmask16 mask = (__mmask16)((1u << n) - 1u);
                __m512 v[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    v[i] = load_row16(rtype, rows[i], k, mask);
                bp_cpu_transpose16(v);
                if (n == 16) {
#pragma GCC unroll 16
                    for (int c = 0; c < 16; c++)
                        _mm512_store_ps(panel + (k + c) * MR + h * 16, v[c]);
                } else {
                    transpose_tail(v, n, panel + k * MR + h * 16, MR, 16);
                }
            }
        }
    }
}
#endif

static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* ---- Packed GEMM driver ----------------------------------------------------------------- */

/* Prefetch into L2 slice `part` of `parts` of the cache lines holding rows [m, m + rows) x k
 * [k0, k0 + kc) of A: the next block's weights are fetched from DRAM while the micro-kernel works
 * on this one, instead of stalling the packing that follows. */
static void prefetch_a(const bp_tensor *a, const char *abase, int64_t m, int64_t rows, int64_t k0,
                       int64_t kc, int64_t part, int64_t parts)
{
    const int64_t blck = bp_type_block_size(a->type), bsz = (int64_t)bp_type_size(a->type);
    const int64_t bytes = (kc + blck - 1) / blck * bsz, lines = (bytes + 63) / 64;
    const int64_t total = rows * lines;
    const int64_t first = total * part / parts, last = total * (part + 1) / parts;
    for (int64_t l = first; l < last; l++) {
        const char *row = abase + (m + l / lines) * (int64_t)a->nb[1] + k0 / blck * bsz;
        __builtin_prefetch(row + l % lines * 64, 0, 2);
    }
}

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
            /* The block packed next: the following rows, or the first rows of the next K block. */
            int64_t pm = mc0 + mc, pk = k0, pkc = kc;
            if (pm >= m_end) {
                pm = m_begin;
                pk = k0 + KC;
                pkc = K - pk < KC ? K - pk : KC;
            }
            const int64_t prow = m_end - pm < MC ? m_end - pm : MC;
            const int64_t n_steps = (N + NR - 1) / NR;
            for (int64_t n0 = 0; n0 < N; n0 += NR) {
                const float *bpanel = bpack + n0 * kc;
                const int64_t nc = N - n0 < NR ? N - n0 : NR;
                if (pk < K)
                    prefetch_a(a, abase, pm, prow, pk, pkc, n0 / NR, n_steps);
                for (int64_t i0 = 0; i0 < mc; i0 += MR) {
                    const int64_t mr = mc - i0 < MR ? mc - i0 : MR;
                    float *c = (float *)cbase + (mc0 + i0) + n0 * ldc;
                    if (mr == MR && nc == NR) {
                        micro_kernel(kc, apack + i0 * kc, bpanel, c, ldc, k0 > 0);
                    } else {
                        /* Edge tile: compute into a full tile, copy back the valid part. */
                        float edge[NR * MR];
                        bp_cpu_edge_in(edge, MR, c, ldc, mr, nc, k0 > 0);
                        micro_kernel(kc, apack + i0 * kc, bpanel, edge, MR, k0 > 0);
                        bp_cpu_edge_out(c, ldc, edge, MR, mr, nc);
                    }
                }
            }
        }
        /* B's panels are rewritten for the next K block only after everyone is done. */
        bp_cpu_pool_barrier(p->pool);
    }
}

void bp_cpu_gemm_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    *per_thread = (size_t)(MC * KC + 16 * KC + 64) * sizeof(float);
    *shared = (size_t)(round_up(dst->ne[1], NR) * KC) * sizeof(float);
}

void bp_cpu_gemm_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                       const struct bp_cpu_params *p)
{
    float *tmp = p->wdata;
    float *apack = tmp + 16 * KC; /* after 16 converted rows; 64-byte aligned */
    gemm_batch(dst, abase, bbase, cbase, p, p->wshared, apack, tmp);
}

/* ---- Broadcast path (medium N) ----------------------------------------------------------
 * For 16 <= N <= 48 (BCAST_MAX_N in cpu-matmul.c), packing A into MR panels costs about as
 * much as the product. Here B (small) is packed instead, transposed so each k holds BN
 * consecutive columns, and A is read in its own row-major layout: per k, BM scalars of A (one
 * from each of BM rows) are broadcast against BN/VW vectors of B. A is converted to f32 in
 * KC-long chunks when it is not f32, and is streamed exactly once per column chunk. */
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
#if defined(BP_CPU_HAVE_AVX512)
#define BM 12 /* rows of A per block: 24 accumulators of the 32 registers */
#else
#define BM 6 /* AVX2 has 16 registers: 12 accumulators, two of B, one broadcast */
#endif
#define BN (2 * BVW)   /* columns of B per chunk: two vectors */
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

#if defined(BP_CPU_HAVE_AVX512)
#define BMH 8 /* rows per block of the 16-bit kernel */

/* 16 values of a 16-bit row (F16 or BF16) as floats. */
static inline __m512 load_h16(const uint16_t *p, bool bf16)
{
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                : _mm512_cvtph_ps(h);
}

/* out[BMH][BN] += BMH 16-bit rows (each at its own pointer, k from 0) x bpanel (kc x BN): each
 * row's 16 next values converted in a register, then each value spread to all lanes with a
 * permute instead of a broadcast load, so no converted copy of the rows is written. kc is a
 * multiple of 16. */
static void bcast_kernel_h(const uint16_t *const *a, bool bf16, const float *restrict bpanel,
                           int64_t kc, float *restrict out)
{
    __m512 acc[BMH][2];
#pragma GCC unroll 8
    for (int r = 0; r < BMH; r++) {
        acc[r][0] = _mm512_loadu_ps(out + r * BN);
        acc[r][1] = _mm512_loadu_ps(out + r * BN + 16);
    }
    for (int64_t k = 0; k < kc; k += 16) {
        __m512 av[BMH];
#pragma GCC unroll 8
        for (int r = 0; r < BMH; r++)
            av[r] = load_h16(a[r] + k, bf16);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            const __m512 b0 = _mm512_loadu_ps(bpanel + (k + j) * BN);
            const __m512 b1 = _mm512_loadu_ps(bpanel + (k + j) * BN + 16);
            const __m512i idx = _mm512_set1_epi32(j);
#pragma GCC unroll 8
            for (int r = 0; r < BMH; r++) {
                const __m512 x = _mm512_permutexvar_ps(idx, av[r]);
                acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < BMH; r++) {
        _mm512_storeu_ps(out + r * BN, acc[r][0]);
        _mm512_storeu_ps(out + r * BN + 16, acc[r][1]);
    }
}

/* bcast_batch for F16/BF16 weights whose K is a multiple of 16: blocks of BMH rows read in place
 * by bcast_kernel_h (a short last block repeats its last row). */
static void bcast_batch_h(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                          const struct bp_cpu_params *p, float *bpack, float *tmp)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1], K = a->ne[0];
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const int64_t nchunks = (N + BN - 1) / BN;
    const bool bf16 = a->type == BP_TYPE_BF16;
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
    bp_cpu_split((M + BMH - 1) / BMH, p->ith, p->nth, &bm0, &bm1);
    float *out = tmp;
    for (int64_t blk = bm0; blk < bm1; blk++) {
        const int64_t m = blk * BMH, rows = M - m < BMH ? M - m : BMH;
        memset(out, 0, (size_t)(nchunks * BMH * BN) * sizeof(float));
        for (int64_t kk = 0; kk < K; kk += BKC) {
            const int64_t kc = K - kk < BKC ? K - kk : BKC;
            const uint16_t *ar[BMH];
            for (int64_t r = 0; r < BMH; r++)
                ar[r] = (const uint16_t *)(abase + (m + (r < rows ? r : rows - 1)) *
                                                       (int64_t)a->nb[1]) + kk;
            for (int64_t c = 0; c < nchunks; c++)
                bcast_kernel_h(ar, bf16, bpack + (c * K + kk) * BN, kc, out + c * BMH * BN);
        }
        for (int64_t c = 0; c < nchunks; c++)
            for (int64_t j = 0; j < BN && c * BN + j < N; j++)
                for (int64_t r = 0; r < rows; r++)
                    ((float *)cbase)[(c * BN + j) * ldc + m + r] = out[c * BMH * BN + r * BN + j];
    }
    bp_cpu_pool_barrier(p->pool);
}
#endif

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
void bp_cpu_bcast_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    const int64_t K = dst->src[0]->ne[0], N = dst->ne[1];
    const int64_t nchunks = (N + BN - 1) / BN;
    *per_thread = (size_t)(nchunks * BM * BN + BM * BKC + 64) * sizeof(float);
    *shared = (size_t)(nchunks * K * BN) * sizeof(float);
}

void bp_cpu_bcast_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p)
{
#if defined(BP_CPU_HAVE_AVX512)
    /* One chunk of more than 16 columns: the in-register kernel (F16 4096^2 N = 32: 317 -> 385
     * GFLOP/s, N = 24: 240 -> 290 on 2 threads). Where a chunk has 16 columns or fewer, its
     * permute per row and value costs more than the broadcast loads it saves (N = 16: 237 ->
     * 194), so those keep the converting path. */
    const bp_tensor *a = dst->src[0];
    if ((a->type == BP_TYPE_F16 || a->type == BP_TYPE_BF16) && a->ne[0] % 16 == 0 &&
        dst->ne[1] > BVW && dst->ne[1] <= BN) {
        bcast_batch_h(dst, abase, bbase, cbase, p, p->wshared, p->wdata);
        return;
    }
#endif
    bcast_batch(dst, abase, bbase, cbase, p, p->wshared, p->wdata);
}
#endif
