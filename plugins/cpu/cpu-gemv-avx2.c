/* cpu-gemv-avx2.c - one row of Q8_0/Q4_0 weights against up to four Q8_0 activation columns with
 * 256-bit integer dot products (vpmaddubsw, or vpdpbusd where AVX512-VNNI is there too): the
 * AVX2 and AVX-512 builds' bp_cpu_dot_q8_cols. The portable one is in cpu-gemv.c. */
#include "config.h"

#include <stdint.h>

#include "cpu-matmul.h"

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
        out[c] = bp_cpu_hsum256(_mm256_add_ps(acc[c][0], acc[c][1]));
}

void bp_cpu_dot_q8_cols(enum bp_type type, const void *xrow, const struct bp_block_q8_0 *const y[4],
                        int nc, int64_t nb, float out[4])
{
#define COLS(c) dot_quant_cols_n(type, xrow, y, c, nb, out)
    BP_CPU_BY_COLUMNS(nc, COLS)
#undef COLS
}

#endif
