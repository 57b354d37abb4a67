/* cpu-gemm-bf16.c - MUL_MAT of BF16 weights under BP_MM_PRECISION_HALF: the activations are
 * rounded once to BF16 (round to nearest even) and the products taken with AVX512_BF16's
 * vdpbf16ps, two multiply-adds per lane and instruction, twice the f32 rate. The avx512 build
 * only, and only where the processor has AVX512_BF16 (asked at run time: the variant itself does
 * not require it, so these functions carry the instruction set in a target attribute).
 *
 * The blocked scheme of cpu-gemm.c with k taken in pairs. A's panels hold, for each pair
 * (k, k + 1), MR rows' two BF16 values side by side: a 32-bit word per row, which is how a BF16
 * row already stores them, so packing is a 16 x 16 transpose of words. B's panels hold NR
 * columns' pairs. Per pair, MR / 16 loads of A and NR broadcasts of B feed MR / 16 * NR
 * vdpbf16ps into an MR x NR tile of f32 sums. An odd K ends with a pair whose second value is
 * zero. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"

#if defined(BP_CPU_HAVE_AVX512)

#define MR 32
#define NR 12
#define KC 512 /* k values per block (KC / 2 pairs) */
#define MC 128
#define BF16_TARGET __attribute__((target("avx512bf16")))

bool bp_cpu_gemm_bf16_use(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0];
    return a->type == BP_TYPE_BF16 && bp_mul_mat_get_precision(dst) == BP_MM_PRECISION_HALF &&
           (bp_cpu_features() & BP_CPU_AVX512_BF16) != 0;
}

static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

void bp_cpu_gemm_bf16_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    *per_thread = (size_t)(MC * (KC / 2) + 64) * sizeof(uint32_t) + (size_t)(KC + 64) * 2;
    *shared = (size_t)(round_up(dst->ne[1], NR) * (KC / 2)) * sizeof(uint32_t);
}

/* C[MR x NR] (column stride ldc) = (accumulate ? C : 0) + A pairs . B pairs over kp pairs. */
BF16_TARGET static void micro_kernel(int64_t kp, const uint32_t *restrict ap,
                                     const uint32_t *restrict bp, float *restrict c, int64_t ldc,
                                     bool accumulate)
{
    __m512 acc0[NR], acc1[NR];
#pragma GCC unroll 12
    for (int j = 0; j < NR; j++) {
        acc0[j] = accumulate ? _mm512_loadu_ps(c + j * ldc) : _mm512_setzero_ps();
        acc1[j] = accumulate ? _mm512_loadu_ps(c + j * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kp; k++) {
        const __m512bh a0 = (__m512bh)_mm512_load_si512(ap + k * MR);
        const __m512bh a1 = (__m512bh)_mm512_load_si512(ap + k * MR + 16);
#pragma GCC unroll 12
        for (int j = 0; j < NR; j++) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)bp[k * NR + j]);
            acc0[j] = _mm512_dpbf16_ps(acc0[j], a0, b);
            acc1[j] = _mm512_dpbf16_ps(acc1[j], a1, b);
        }
    }
#pragma GCC unroll 12
    for (int j = 0; j < NR; j++) {
        _mm512_storeu_ps(c + j * ldc, acc0[j]);
        _mm512_storeu_ps(c + j * ldc + 16, acc1[j]);
    }
}

/* B columns [n0, n0 + nc) x k [k0, k0 + kc) as BF16 pairs, panels of NR columns (zero past nc
 * and past kc). tmp holds one column's kc + 1 BF16 values. */
BF16_TARGET static void pack_b(const bp_tensor *b, const char *bbase, int64_t n0, int64_t nc,
                               int64_t k0, int64_t kc, uint32_t *restrict out,
                               uint16_t *restrict tmp)
{
    const int64_t kp = (kc + 1) / 2;
    for (int64_t p = 0; p < nc; p += NR) {
        uint32_t *panel = out + p * kp;
        for (int64_t j = 0; j < NR; j++) {
            if (p + j >= nc) {
                for (int64_t k = 0; k < kp; k++)
                    panel[k * NR + j] = 0;
                continue;
            }
            const float *src = (const float *)(bbase + (n0 + p + j) * (int64_t)b->nb[1]) + k0;
            int64_t k = 0;
            for (; k + 16 <= kc; k += 16)
                _mm256_storeu_si256((__m256i *)(tmp + k),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + k)));
            if (k < kc) {
                const __mmask16 m = (__mmask16)((1u << (kc - k)) - 1u);
                _mm256_storeu_si256((__m256i *)(tmp + k),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + k)));
            }
            tmp[kc] = 0; /* the second half of an odd K's last pair */
            const uint32_t *pairs = (const uint32_t *)tmp;
            for (int64_t q = 0; q < kp; q++)
                panel[q * NR + j] = pairs[q];
        }
    }
}

/* A rows [m0, m0 + mc) x k [k0, k0 + kc) (BF16, read in place) into panels of MR rows of pairs:
 * panel p holds, for each pair, MR consecutive 32-bit words (rows past mc are zero). */
BF16_TARGET static void pack_a(const bp_tensor *a, const char *abase, int64_t m0, int64_t mc,
                               int64_t k0, int64_t kc, uint32_t *restrict out)
{
    static const uint32_t zeros[KC / 2];
    const int64_t kp = (kc + 1) / 2, full = kc / 2; /* pairs, whole pairs */
    for (int64_t p = 0; p < mc; p += MR) {
        uint32_t *panel = out + p * kp;
        for (int h = 0; h < MR / 16; h++) {
            const uint32_t *rows[16];
            for (int i = 0; i < 16; i++) {
                const int64_t m = p + h * 16 + i;
                rows[i] = m < mc ? (const uint32_t *)(abase + (m0 + m) * (int64_t)a->nb[1] +
                                                      k0 * (int64_t)sizeof(uint16_t))
                                 : zeros;
            }
            for (int64_t q = 0; q < full; q += 16) {
                const int64_t n = full - q < 16 ? full - q : 16;
                const __mmask16 mask = (__mmask16)((1u << n) - 1u);
                __m512 v[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    v[i] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(mask, rows[i] + q));
                bp_cpu_transpose16(v);
                if (n == 16) {
#pragma GCC unroll 16
                    for (int c = 0; c < 16; c++)
                        _mm512_store_ps((float *)(panel + (q + c) * MR + h * 16), v[c]);
                } else {
                    _Alignas(64) float buf[16 * 16];
#pragma GCC unroll 16
                    for (int c = 0; c < 16; c++)
                        _mm512_store_ps(buf + 16 * c, v[c]);
                    for (int64_t c = 0; c < n; c++)
                        memcpy(panel + (q + c) * MR + h * 16, buf + 16 * c, 64);
                }
            }
            if (kp > full) /* odd K: the last value alone, its pair's second half zero */
                for (int i = 0; i < 16; i++)
                    panel[full * MR + h * 16 + i] =
                        rows[i] == zeros ? 0 : ((const uint16_t *)rows[i])[kc - 1];
        }
    }
}

BF16_TARGET void bp_cpu_gemm_bf16_batch(bp_tensor *dst, const char *abase, const char *bbase,
                                        char *cbase, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1], K = a->ne[0];
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const int64_t Np = round_up(N, NR);
    uint32_t *apack = p->wdata, *bpack = p->wshared;
    uint16_t *tmp = (uint16_t *)(apack + MC * (KC / 2) + 64);

    int64_t pm0, pm1;
    bp_cpu_split((M + MR - 1) / MR, p->ith, p->nth, &pm0, &pm1);
    const int64_t m_begin = pm0 * MR, m_end = pm1 * MR < M ? pm1 * MR : M;

    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC, kp = (kc + 1) / 2;
        int64_t q0, q1;
        bp_cpu_split(Np / NR, p->ith, p->nth, &q0, &q1);
        for (int64_t q = q0; q < q1; q++) {
            const int64_t n0 = q * NR, nc = N - n0 < NR ? N - n0 : NR;
            pack_b(b, bbase, n0, nc, k0, kc, bpack + n0 * kp, tmp);
        }
        bp_cpu_pool_barrier(p->pool);

        for (int64_t mc0 = m_begin; mc0 < m_end; mc0 += MC) {
            const int64_t mc = m_end - mc0 < MC ? m_end - mc0 : MC;
            pack_a(a, abase, mc0, mc, k0, kc, apack);
            for (int64_t n0 = 0; n0 < N; n0 += NR) {
                const uint32_t *bpanel = bpack + n0 * kp;
                const int64_t nc = N - n0 < NR ? N - n0 : NR;
                for (int64_t i0 = 0; i0 < mc; i0 += MR) {
                    const int64_t mr = mc - i0 < MR ? mc - i0 : MR;
                    float *c = (float *)cbase + (mc0 + i0) + n0 * ldc;
                    if (mr == MR && nc == NR) {
                        micro_kernel(kp, apack + i0 * kp, bpanel, c, ldc, k0 > 0);
                    } else {
                        float edge[NR * MR];
                        bp_cpu_edge_in(edge, MR, c, ldc, mr, nc, k0 > 0);
                        micro_kernel(kp, apack + i0 * kp, bpanel, edge, MR, k0 > 0);
                        bp_cpu_edge_out(c, ldc, edge, MR, mr, nc);
                    }
                }
            }
        }
        bp_cpu_pool_barrier(p->pool); /* bpack is rewritten for the next block or batch */
    }
}

/* ---- Few columns: dot-product tiles on rows in place ---------------------------------------
 *
 * For N up to DOT_MAX_N, packing A costs more than it saves: each weight feeds only N products.
 * Both operands are K-contiguous, so vdpbf16ps can take their pairs as they lie: B's columns
 * are rounded once to BF16 (zero-padded to a multiple of 32 values, shared by all threads),
 * and each DR x DC tile of dot products loads DR rows' and DC columns' 32 values per step for
 * DR * DC instructions, summed across lanes at the end. A row's last partial step is a masked
 * load, so nothing past a row is read. */

#define DOT_MAX_N 48
#define DR_MAX 8 /* most rows per tile */
#define DC 4     /* most columns per tile */

bool bp_cpu_dot_bf16_use(const bp_tensor *dst)
{
    return dst->ne[1] <= DOT_MAX_N && bp_cpu_gemm_bf16_use(dst);
}

static int64_t padded_k(int64_t K)
{
    return round_up(K, 32);
}

void bp_cpu_dot_bf16_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    *per_thread = 0;
    *shared = (size_t)(dst->ne[1] * padded_k(dst->src[0]->ne[0])) * sizeof(uint16_t) + 64;
}

/* An NR x NC tile: the NC columns' vectors stay in registers for the step, each row's vector is
 * loaded once and feeds NC instructions (NR * NC accumulators + NC + 1 registers). */
#define DEFINE_BF16_DOT_TILE(NAME, NR, NC)                                                     \
    BF16_TARGET static void NAME(const uint16_t *const a[], const uint16_t *b, int64_t ldb,     \
                                 int64_t K, float out[][DC])                                   \
    {                                                                                          \
        __m512 acc[NR][NC];                                                                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++)                                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                               \
                acc[r][c] = _mm512_setzero_ps();                                               \
        for (int64_t k = 0; k < K; k += 32) {                                                  \
            const __mmask32 m = K - k >= 32 ? ~(__mmask32)0                                    \
                                            : (__mmask32)((1u << (K - k)) - 1u);               \
            __m512bh vb[NC];                                                                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                               \
                vb[c] = (__m512bh)_mm512_load_si512(b + c * ldb + k);                          \
            _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++) {                             \
                const __m512bh va = (__m512bh)_mm512_maskz_loadu_epi16(m, a[r] + k);           \
                _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                           \
                    acc[r][c] = _mm512_dpbf16_ps(acc[r][c], va, vb[c]);                        \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < NR; r++)                                   \
            _Pragma("GCC unroll 4") for (int c = 0; c < NC; c++)                               \
                out[r][c] = _mm512_reduce_add_ps(acc[r][c]);                                   \
    }
/* One or two columns take eight rows (more rows in flight stream weights faster), four
 * columns six. */
DEFINE_BF16_DOT_TILE(bf16_tile_8x1, 8, 1)
DEFINE_BF16_DOT_TILE(bf16_tile_8x2, 8, 2)
DEFINE_BF16_DOT_TILE(bf16_tile_6x1, 6, 1)
DEFINE_BF16_DOT_TILE(bf16_tile_6x2, 6, 2)
DEFINE_BF16_DOT_TILE(bf16_tile_6x4, 6, 4)

BF16_TARGET void bp_cpu_dot_bf16_batch(bp_tensor *dst, const char *abase, const char *bbase,
                                       char *cbase, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1], K = a->ne[0], Kp = padded_k(K);
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    uint16_t *bq = (uint16_t *)(((uintptr_t)p->wshared + 63) & ~(uintptr_t)63);

    int64_t n0, n1;
    bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
    for (int64_t n = n0; n < n1; n++) {
        const float *src = (const float *)(bbase + n * (int64_t)b->nb[1]);
        uint16_t *out = bq + n * Kp;
        for (int64_t k = 0; k < Kp; k += 16) {
            const int64_t left = K - k;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff
                                : left <= 0 ? (__mmask16)0
                                            : (__mmask16)((1u << left) - 1u);
            _mm256_store_si256((__m256i *)(out + k),
                               (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + k)));
        }
    }
    bp_cpu_pool_barrier(p->pool);

    const int64_t dr = N >= DC ? 6 : 8; /* rows per tile, the same for the whole node */
    int64_t g0, g1;
    bp_cpu_split((M + dr - 1) / dr, p->ith, p->nth, &g0, &g1);
    const int64_t m_end = g1 * dr < M ? g1 * dr : M;
    for (int64_t m = g0 * dr; m < m_end; m += dr) {
        const int64_t rows = m_end - m < dr ? m_end - m : dr;
        const uint16_t *ar[DR_MAX];
        for (int64_t r = 0; r < dr; r++) /* a short tile repeats its last row */
            ar[r] = (const uint16_t *)(abase + (m + (r < rows ? r : rows - 1)) *
                                                   (int64_t)a->nb[1]);
        for (int64_t n = 0; n < N;) {
            const int nc = N - n >= DC ? DC : N - n >= 2 ? 2 : 1;
            const uint16_t *bn = bq + n * Kp;
            float out[DR_MAX][DC];
            if (nc == 4)
                bf16_tile_6x4(ar, bn, Kp, K, out);
            else if (dr == 8)
                (nc == 2 ? bf16_tile_8x2 : bf16_tile_8x1)(ar, bn, Kp, K, out);
            else
                (nc == 2 ? bf16_tile_6x2 : bf16_tile_6x1)(ar, bn, Kp, K, out);
            for (int c = 0; c < nc; c++)
                for (int64_t r = 0; r < rows; r++)
                    ((float *)cbase)[(n + c) * ldc + m + r] = out[r][c];
            n += nc;
        }
    }
    /* The next batch rewrites bq: no thread may still be reading it. */
    bp_cpu_pool_barrier(p->pool);
}

#endif /* BP_CPU_HAVE_AVX512 */
