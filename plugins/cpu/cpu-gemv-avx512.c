/* cpu-gemv-avx512.c - the AVX-512 build's matrix-vector kernels for Q8_0/Q4_0 weights: eight
 * rows at a time against up to four columns with VNNI (bp_cpu_dot_q8_rows8), and the
 * quantisation of the activations to Q8_0 (bp_cpu_quantize_q8_0; the portable one is in
 * cpu-gemv.c). */
#include "config.h"

#include <stdint.h>

#include "cpu-matmul.h"

#if defined(BP_CPU_HAVE_AVX512_VNNI)

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

/* Bytes ahead of the block being read that each of the eight rows is prefetched (into L1, once
 * per block: a block is at most 34 bytes, so every line is asked for). Eight streams advancing
 * 18-34 bytes per step are too slow for the hardware prefetcher to run ahead of: at M 32000,
 * K 4096 on 2 threads (weights from DRAM), Q4_0 62-79 -> 97-101 GFLOP/s and Q8_0 55 -> 89-95
 * with 128 or 256 bytes; 384 and 512 gain less, and L3-resident sizes neither gain nor lose. */
#define QROWS_PREFETCH 256
#define QROWS_SHORT 2048 /* bytes of a row up to which the next rows are prefetched instead */

/* out[c * 8 + i] = row i of the eight against column c, for nc columns (a constant in each
 * inlined copy, so the loops over columns unroll). */
BP_CPU_INLINE void qrows8_t(const enum bp_type type, const int nc, const char *row0, int64_t lda,
                            const struct bp_block_q8_0 *const y[4], const int32_t *const ysum[4],
                            int64_t nb, bool prefetch_next, float *out)
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
    /* Short rows (contiguous, as a vocabulary projection of width 576 has them) end before the
     * streams get going: the next eight rows are asked for instead, in step with these. */
    const bool next8 = nb * bs <= QROWS_SHORT && lda == nb * bs && prefetch_next;
    for (int64_t i = 0; i < nb; i++) {
        const int64_t o = i * bs;
        if (next8) {
            const char *p = row0 + 8 * lda + 8 * o;
#pragma GCC unroll 8
            for (int64_t l = 0; l < 8 * bs; l += 64)
                _mm_prefetch(p + l, _MM_HINT_T0);
        } else if (o + QROWS_PREFETCH < nb * bs) { /* never a line past the rows */
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                _mm_prefetch(row0 + r * lda + o + QROWS_PREFETCH, _MM_HINT_T0);
        }
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
void bp_cpu_dot_q8_rows8(enum bp_type type, int nc, const char *row0, int64_t lda,
                         const struct bp_block_q8_0 *const y[4], const int32_t *const ysum[4],
                         int64_t nb, bool prefetch_next, float *out)
{
#define Q4(c) qrows8_t(BP_TYPE_Q4_0, c, row0, lda, y, ysum, nb, prefetch_next, out)
#define Q8(c) qrows8_t(BP_TYPE_Q8_0, c, row0, lda, y, ysum, nb, prefetch_next, out)
    if (type == BP_TYPE_Q4_0) {
        BP_CPU_BY_COLUMNS(nc, Q4)
    } else {
        BP_CPU_BY_COLUMNS(nc, Q8)
    }
#undef Q4
#undef Q8
}

#endif

#if defined(BP_CPU_HAVE_AVX512)

/* One column of B to Q8_0 blocks, exactly as the runtime's Q8_0 conversion does it (scale
 * amax / 127 rounded to f16, quants x * (1 / scale) rounded to nearest even), and the sum of
 * each block's quants. */
void bp_cpu_quantize_q8_0(const float *x, struct bp_block_q8_0 *b, int32_t *sums, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32) {
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
    }
}

#endif
