/* cpu-gemv.c - MUL_MAT for fewer than 16 activation columns (matrix-vector products): each
 * thread walks its rows of A exactly once and multiplies each against every column of B (which
 * stays in L1). This streams the weights once, which is what bounds N = 1.
 *
 * F32/F16/BF16 weights: dot-product tiles (eight rows by one column, or fewer rows by two or
 * four) with f32 FMAs, converting halves in registers; one body serves AVX2 and AVX-512 through
 * the V* and LOAD_ macros, and the portable build takes the scalar tail for everything.
 *
 * Q8_0/Q4_0 weights: B is quantised to Q8_0 by all threads (before a barrier), then 8-bit
 * integer dot products: eight rows at a time with AVX512-VNNI (cpu-gemv-avx512.c), then one row
 * against up to four columns (cpu-gemv-avx2.c, or the portable version here). Repacked weights
 * (cpu-repack.c) go to that file's kernel, or are unpacked eight rows at a time. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"

/* ---- F32, F16 and BF16 weights --------------------------------------------------------- */

#if defined(BP_CPU_HAVE_AVX512)
BP_CPU_INLINE float hsum512(__m512 v)
{
    return _mm512_reduce_add_ps(v);
}
#endif

#define RD 8 /* rows of A per dot-product step (tiles of 8 or 4 rows) */
#define CD 4 /* most columns of B per dot-product tile */
#ifndef PF_TILES
#define PF_TILES 16
#define PF_LOCALITY 2
#define PF_ROW_MAX 3072
#endif

/* Loads 16 (AVX-512), 8 (AVX2) or 4 (SSE2) elements of an A row of type T as f32. */
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
#define VHSUM(v) bp_cpu_hsum256(v)
#define LOAD_F32(p, k) _mm256_loadu_ps((const float *)(p) + (k))
#define LOAD_F16(p, k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (k))))
#define LOAD_BF16(p, k)                                                                        \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                     \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)(p) + (k)))), 16))
#elif defined(BP_CPU_HAVE_SSE2)
/* The baseline: 128-bit SSE2, multiply then add (no FMA). Four F16 values at a time come from
 * the plugin's half table: 22 GFLOP/s at 4096^2 N = 1 against 10 with bp_cpu_half4_sse2's
 * integer conversion, which whole rows use instead (cpu-convert.c). */
BP_CPU_INLINE __m128 half4_table(const uint16_t *p)
{
    /* lanes in order: p[0] lowest */
    return _mm_setr_ps(bp_cpu_half_table[p[0]], bp_cpu_half_table[p[1]], bp_cpu_half_table[p[2]],
                       bp_cpu_half_table[p[3]]);
}

BP_CPU_INLINE float sse2_hsum(__m128 v)
{
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
    return _mm_cvtss_f32(v);
}

#define VW 4
typedef __m128 vf;
#define VZERO() _mm_setzero_ps()
#define VFMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#define VHSUM(v) sse2_hsum(v)
#define LOAD_F32(p, k) _mm_loadu_ps((const float *)(p) + (k))
#define LOAD_F16(p, k) half4_table((const uint16_t *)(p) + (k))
#define LOAD_BF16(p, k)                                                                        \
    _mm_castsi128_ps(_mm_unpacklo_epi16(                                                       \
        _mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)((const uint16_t *)(p) + (k)))))
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
    /* This thread's rows as one run of bytes, when they are contiguous and short: rows of at
     * most PF_ROW_MAX bytes (a small model's K = 512 is 1 KiB of f16) give the hardware
     * prefetcher streams too short to learn, so the run is fetched PF_TILES tiles ahead of the
     * tile being computed, into L2. On an AMD EPYC (2 threads), f16 M 49152 K 576 N = 1 (a
     * 56 MB vocabulary projection from DRAM) reached 0.44 of the read bandwidth with two tiles
     * ahead into L1, 0.59 with four, 0.76 with eight into L2, 0.87 with sixteen, 0.90 with 32;
     * the small f16 model's generation went from 370-440 to 495-520 tokens/s (two tiles into L1
     * to sixteen into L2), SmolLM2's F16 file from 0.71 to 0.82 of llama-bench's tg32. Longer
     * rows stream well on their own: with this prefetch, K = 4096 f16 at N = 1 fell from about
     * 0.85 to 0.5-0.72 of the read bandwidth, K = 2048 (4 KiB rows) from 0.83-0.90 to
     * 0.76-0.84; 3 KiB rows (K = 1408 f16) gain or lose nothing. */
    const int64_t row_bytes = (int64_t)a->nb[1];
    const bool stream = N == 1 && row_bytes <= PF_ROW_MAX &&
                        row_bytes == K * (int64_t)bp_type_size(a->type);
    const int64_t run_end = m1 * row_bytes; /* byte offsets from abase: no pointer past it */
    for (int64_t m = m0; m < m1; m += RD) {
        const int64_t rows = m1 - m < RD ? m1 - m : RD;
        if (stream) {
            const int64_t o0 = (m + PF_TILES * RD) * row_bytes;
            const int64_t o1 = o0 + RD * row_bytes < run_end ? o0 + RD * row_bytes : run_end;
            for (int64_t o = o0; o < o1; o += 64)
                __builtin_prefetch(abase + o, 0, PF_LOCALITY);
        }
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

/* ---- Q8_0 and Q4_0 weights --------------------------------------------------------------- */

#if !defined(BP_CPU_HAVE_AVX2)
/* Block by block in plain C (which the compiler vectorises as far as it can). */
static void dot_q8_cols_scalar(enum bp_type type, const void *xrow,
                               const struct bp_block_q8_0 *const y[4], int nc, int64_t nb,
                               float out[4])
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

#if !defined(BP_CPU_HAVE_SSE2)
void bp_cpu_dot_q8_cols(enum bp_type type, const void *xrow, const struct bp_block_q8_0 *const y[4],
                        int nc, int64_t nb, float out[4])
{
    dot_q8_cols_scalar(type, xrow, y, nc, nb, out);
}
#endif
#endif

#if !defined(BP_CPU_HAVE_AVX2) && defined(BP_CPU_HAVE_SSE2)
/* The sum of a[i] * b[i] over 16 signed bytes, as four 32-bit lanes: SSE2 has no byte products,
 * so both are widened to 16 bits (sign from a compare) and multiplied in pairs. */
BP_CPU_INLINE __m128i dot16_i8(__m128i a, __m128i b)
{
    const __m128i z = _mm_setzero_si128();
    const __m128i sa = _mm_cmpgt_epi8(z, a), sb = _mm_cmpgt_epi8(z, b);
    return _mm_add_epi32(_mm_madd_epi16(_mm_unpacklo_epi8(a, sa), _mm_unpacklo_epi8(b, sb)),
                         _mm_madd_epi16(_mm_unpackhi_epi8(a, sa), _mm_unpackhi_epi8(b, sb)));
}

/* The baseline's integer dot products: four blocks at a time, their eight scales (weights and
 * each column) converted together, each block's sum widened to f32 and scaled into a vector
 * accumulator per column. */
void bp_cpu_dot_q8_cols(enum bp_type type, const void *xrow, const struct bp_block_q8_0 *const y[4],
                        int nc, int64_t nb, float out[4])
{
    /* One column: the plain loop is faster (19 against 26 GFLOP/s, 4096^2, 2 threads); the
     * vector form pays for its scale conversions and widening once per block for every column,
     * and wins from two columns on (N = 8: 26 -> 50). */
    if (nc == 1) {
        dot_q8_cols_scalar(type, xrow, y, nc, nb, out);
        return;
    }
    const size_t bs = bp_type_size(type);
    const __m128i low = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    for (int64_t i = 0; i < nb; i += 4) {
        const int nbk = nb - i < 4 ? (int)(nb - i) : 4;
        uint16_t xd[4] = {0}, yd[4][4] = {{0}};
        for (int k = 0; k < nbk; k++) {
            memcpy(&xd[k], (const char *)xrow + (size_t)(i + k) * bs, 2);
            for (int c = 0; c < nc; c++)
                yd[c][k] = y[c][i + k].d;
        }
        const __m128 dx = bp_cpu_half4_sse2(xd);
        float scale[4][4];
        for (int c = 0; c < nc; c++)
            _mm_storeu_ps(scale[c], _mm_mul_ps(dx, bp_cpu_half4_sse2(yd[c])));
        for (int k = 0; k < nbk; k++) {
            const char *xb = (const char *)xrow + (size_t)(i + k) * bs + 2;
            __m128i x0, x1;
            if (type == BP_TYPE_Q8_0) {
                x0 = _mm_loadu_si128((const __m128i *)xb);
                x1 = _mm_loadu_si128((const __m128i *)(xb + 16));
            } else { /* Q4_0: low nibbles are values 0-15, high nibbles 16-31, both less 8 */
                const __m128i q = _mm_loadu_si128((const __m128i *)xb);
                x0 = _mm_sub_epi8(_mm_and_si128(q, low), eight);
                x1 = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), low), eight);
            }
            for (int c = 0; c < nc; c++) {
                const int8_t *yq = y[c][i + k].qs;
                const __m128i s = _mm_add_epi32(
                    dot16_i8(x0, _mm_loadu_si128((const __m128i *)yq)),
                    dot16_i8(x1, _mm_loadu_si128((const __m128i *)(yq + 16))));
                acc[c] = _mm_add_ps(acc[c], _mm_mul_ps(_mm_cvtepi32_ps(s),
                                                       _mm_set1_ps(scale[c][k])));
            }
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = sse2_hsum(acc[c]);
}
#endif

#if !defined(BP_CPU_HAVE_AVX512)
/* One column of B to Q8_0 blocks, exactly as the runtime's Q8_0 conversion does it (scale
 * amax / 127 rounded to f16, quants x * (1 / scale) rounded to nearest even), and the sum of
 * each block's quants. */
void bp_cpu_quantize_q8_0(const float *x, struct bp_block_q8_0 *b, int32_t *sums, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32) {
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
    }
}
#endif

/* dst[m, n] for rows [m0, m1): quantised A against B already quantised to Q8_0 (bq; ysum: the
 * sum of each block's quants). */
static void dot_rows_quant(const bp_tensor *a, const char *abase, const struct bp_block_q8_0 *bq,
                           const int32_t *ysum, char *cbase, int64_t ldc, int64_t m0, int64_t m1,
                           int64_t N)
{
    const int64_t nb = a->ne[0] / 32;
    (void)ysum;
#if defined(BP_CPU_HAVE_AVX512_VNNI)
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
                bp_cpu_dot_q8_rows8(a->type, nc, abase + m0 * lda, lda, y, ys, nb,
                                    m0 + 16 <= m1, out);
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
            bp_cpu_dot_q8_cols(a->type, row, y, nc, nb, out);
            for (int c = 0; c < nc; c++)
                ((float *)cbase)[(n + c) * ldc + m] = out[c];
        }
    }
}

/* ---- Batches ------------------------------------------------------------------------------- */

static bool quantized(enum bp_type t)
{
    return t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0;
}

/* The block sums of B's quantised columns follow the blocks, 64-byte aligned. */
static size_t ysum_offset(int64_t N, int64_t nb)
{
    return ((size_t)(N * nb) * sizeof(struct bp_block_q8_0) + 63) & ~(size_t)63;
}

static int64_t ldc_of(const bp_tensor *dst)
{
    return (int64_t)(dst->nb[1] / sizeof(float));
}

void bp_cpu_gemv_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    const int64_t K = dst->src[0]->ne[0], N = dst->ne[1];
    *per_thread = (size_t)(RD * K + 64) * sizeof(float);
    /* B quantised to Q8_0, one batch at a time: blocks, block sums and block scales (Q8_0 and
     * Q4_0 weights, and every repacked type). */
    *shared = quantized(dst->src[0]->type) || bp_cpu_repacked_base(dst->src[0]) != NULL
                  ? ysum_offset(N, (K + 31) / 32) + (size_t)(N * ((K + 31) / 32)) *
                                                          (sizeof(int32_t) + sizeof(float))
                  : 0;
}

void bp_cpu_gemv_float_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                             const struct bp_cpu_params *p)
{
    int64_t m0, m1;
    bp_cpu_split(dst->ne[0], p->ith, p->nth, &m0, &m1);
    dot_rows_float(dst->src[0], abase, dst->src[1], bbase, cbase, ldc_of(dst), m0, m1, dst->ne[1]);
}

/* B's columns as Q8_0 in the shared scratch: blocks (bq), the sum of each block's quants (ysum),
 * nb blocks per column. Each thread quantises its share, columns [n0, n1); the others' are
 * there after the next barrier. */
struct q8_columns {
    struct bp_block_q8_0 *bq;
    int32_t *ysum;
    int64_t nb, n0, n1;
};

static struct q8_columns quantize_columns(const bp_tensor *dst, const char *bbase,
                                          const struct bp_cpu_params *p)
{
    const bp_tensor *b = dst->src[1];
    const int64_t N = dst->ne[1];
    struct q8_columns q;
    q.bq = p->wshared;
    q.nb = dst->src[0]->ne[0] / 32;
    q.ysum = (int32_t *)((char *)q.bq + ysum_offset(N, q.nb));
    bp_cpu_split(N, p->ith, p->nth, &q.n0, &q.n1);
    for (int64_t n = q.n0; n < q.n1; n++)
        bp_cpu_quantize_q8_0((const float *)(bbase + n * (int64_t)b->nb[1]), q.bq + n * q.nb,
                             q.ysum + n * q.nb, q.nb);
    return q;
}

void bp_cpu_gemv_quant_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                             const struct bp_cpu_params *p)
{
    const int64_t M = dst->ne[0];
    const struct q8_columns q = quantize_columns(dst, bbase, p);
    /* Rows in groups of eight, so that every thread can use the eight-row kernel. */
    int64_t m0, m1;
    bp_cpu_split((M + 7) / 8, p->ith, p->nth, &m0, &m1);
    m0 *= 8;
    m1 = m1 * 8 < M ? m1 * 8 : M;
    bp_cpu_pool_barrier(p->pool);
    dot_rows_quant(dst->src[0], abase, q.bq, q.ysum, cbase, ldc_of(dst), m0, m1, dst->ne[1]);
    bp_cpu_pool_barrier(p->pool); /* bq is rewritten for the next batch */
}

#if defined(BP_CPU_REPACK_KERNEL)
void bp_cpu_gemv_repack_batch(bp_tensor *dst, const char *bbase, char *cbase,
                              const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0];
    const int64_t N = dst->ne[1];
    const struct q8_columns q = quantize_columns(dst, bbase, p);
    float *yd = (float *)(q.ysum + N * q.nb);
    const int32_t corr = bp_cpu_repack_ycorr(a->type);
    for (int64_t i = q.n0 * q.nb; i < q.n1 * q.nb; i++) {
        q.ysum[i] *= corr; /* per lane: the weights' offset, two lanes per row */
        yd[i] = bp_cpu_half_to_float(q.bq[i].d);
    }
    int64_t g0, g1; /* groups of eight rows */
    bp_cpu_split((dst->ne[0] + 7) / 8, p->ith, p->nth, &g0, &g1);
    bp_cpu_pool_barrier(p->pool);
    bp_cpu_repack_mul_mat(a, q.bq, q.ysum, yd, (float *)cbase, ldc_of(dst), g0, g1, N);
    bp_cpu_pool_barrier(p->pool);
}
#endif
