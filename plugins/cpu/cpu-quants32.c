/* cpu-quants32.c - the weight types with blocks of 32 beyond Q8_0/Q4_0: Q4_1 and Q5_1 (scale and
 * minimum, activations as Q8_1), Q5_0 and IQ4_NL (scale only, activations as Q8_0). For each,
 * the activations' quantiser and the dot product of a weight row with a quantised column
 * (cpu-qtypes.h).
 *
 * Every block's integer dot product is exact; only the block scales are floats. A block of
 * weights is unpacked to 32 bytes in element order (the low nibbles are elements 0-15, the high
 * nibbles 16-31, the fifth bits from qh, IQ4_NL's indices looked up in its table with a byte
 * shuffle), then multiplied with the activation block's 32 bytes:
 *
 *   Q4_1, Q5_1  unsigned values u (0-15, 0-31): d_w d_y sum(u y) + m_w s_y, where s_y (Q8_1's
 *               second half) is d_y sum(y), so the minimum costs one product per block
 *   Q5_0        signed values q - 16 (the missing fifth bit turns the nibble into q | 0xf0)
 *   IQ4_NL      signed table values (-127..113)
 *
 * Bodies: AVX-512 (one block per 256-bit register with VNNI's vpdpbusd and the fifth bits from
 * a mask register), AVX2 (vpmaddubsw + vpmaddwd, the fifth bits by a shuffle and a compare), and
 * portable C for the other builds (the x86_64 baseline has no byte shuffle and no byte
 * products). The activation quantisers round like the
 * runtime's (scale amax / 127, quants rounded to nearest even); Q8_0's is the plugin's own
 * (bp_cpu_quantize_q8_0). */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"
#include "cpu-qtypes.h"
#include "cpu-unpack32.h"

static uint16_t float_to_half(float f)
{
#if defined(BP_CPU_HAVE_F16C)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return bp_fp32_to_fp16(f);
#endif
}

/* ---- Activations ------------------------------------------------------------------------- */

static void quantize_q8_0(const float *x, void *y, int64_t k)
{
    int32_t sums[64]; /* the sums are for other kernels; these dot products do not use them */
    struct bp_block_q8_0 *b = y;
    const int64_t nb = k / 32;
    for (int64_t i = 0; i < nb; i += 64)
        bp_cpu_quantize_q8_0(x + i * 32, b + i, sums, nb - i < 64 ? nb - i : 64);
}

/* Q8_1: d = amax / 127, quants x / d rounded to nearest even, s = d times their sum (both f16):
 * the runtime's rule. */
static void quantize_q8_1(const float *x, void *y, int64_t k)
{
    struct bp_block_q8_1 *b = y;
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
#if defined(BP_CPU_HAVE_AVX512)
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)b[i].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(b[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#elif defined(BP_CPU_HAVE_AVX2)
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        const int32_t sum = (int32_t)bp_cpu_hsum256(_mm256_cvtepi32_ps(s)); /* |sum| <= 4064 */
        /* Packing works within 128-bit lanes; the permutation puts the eight dwords back in
         * order. */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)b[i].qs,
                            _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) {
            b[i].qs[j] = (int8_t)lrintf(x[j] * id);
            sum += b[i].qs[j];
        }
#endif
        b[i].d = float_to_half(d);
        b[i].s = float_to_half((float)sum * d);
    }
}

/* ---- Portable bodies ----------------------------------------------------------------------- */

#if !defined(BP_CPU_HAVE_AVX2)
/* A block's fifth bits as bytes of 16 or 0, four at a time: n * 0x00204081 puts bit j of a
 * nibble n at bit 8j (no two shifted copies overlap for 4 bits). Taking each bit with a shift by
 * its index inside the dot product's loop kept that loop scalar (Q5_0 and Q5_1 at 4096^2,
 * N = 1, 2 threads, x86_64 variant: 4 GFLOP/s; 6.5-7.4 with bytes made first, against 28 for
 * Q4_1). */
static void bit5_bytes(const uint8_t qh[4], uint8_t h[32])
{
    for (int k = 0; k < 8; k++) {
        const uint32_t n = (uint32_t)(qh[k / 2] >> (4 * (k % 2))) & 0xf;
        const uint32_t v = ((n * 0x00204081u) & 0x01010101u) << 4;
        memcpy(h + 4 * k, &v, 4);
    }
}

static float dot_q4_1_c(int64_t k, const void *w, const void *y)
{
    const struct bp_block_q4_1 *x = w;
    const struct bp_block_q8_1 *q = y;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / 32; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += (x[i].qs[j] & 0x0f) * q[i].qs[j] + (x[i].qs[j] >> 4) * q[i].qs[j + 16];
        sum += bp_cpu_half_to_float(x[i].d) * bp_cpu_half_to_float(q[i].d) * (float)s +
               bp_cpu_half_to_float(x[i].m) * bp_cpu_half_to_float(q[i].s);
    }
    return sum;
}

static float dot_q5_0_c(int64_t k, const void *w, const void *y)
{
    const struct bp_block_q5_0 *x = w;
    const struct bp_block_q8_0 *q = y;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / 32; i++) {
        uint8_t h[32];
        bit5_bytes(x[i].qh, h);
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += (((x[i].qs[j] & 0x0f) | h[j]) - 16) * q[i].qs[j] +
                 (((x[i].qs[j] >> 4) | h[j + 16]) - 16) * q[i].qs[j + 16];
        sum += bp_cpu_half_to_float(x[i].d) * bp_cpu_half_to_float(q[i].d) * (float)s;
    }
    return sum;
}

static float dot_q5_1_c(int64_t k, const void *w, const void *y)
{
    const struct bp_block_q5_1 *x = w;
    const struct bp_block_q8_1 *q = y;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / 32; i++) {
        uint8_t h[32];
        bit5_bytes(x[i].qh, h);
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ((x[i].qs[j] & 0x0f) | h[j]) * q[i].qs[j] +
                 ((x[i].qs[j] >> 4) | h[j + 16]) * q[i].qs[j + 16];
        sum += bp_cpu_half_to_float(x[i].d) * bp_cpu_half_to_float(q[i].d) * (float)s +
               bp_cpu_half_to_float(x[i].m) * bp_cpu_half_to_float(q[i].s);
    }
    return sum;
}

static float dot_iq4_nl_c(int64_t k, const void *w, const void *y)
{
    const struct bp_block_iq4_nl *x = w;
    const struct bp_block_q8_0 *q = y;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / 32; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += iq4nl_values[x[i].qs[j] & 0x0f] * q[i].qs[j] +
                 iq4nl_values[x[i].qs[j] >> 4] * q[i].qs[j + 16];
        sum += bp_cpu_half_to_float(x[i].d) * bp_cpu_half_to_float(q[i].d) * (float)s;
    }
    return sum;
}

static const struct bp_cpu_qtype qtypes[4] = {
    {BP_TYPE_Q8_1, quantize_q8_1, dot_q4_1_c},
    {BP_TYPE_Q8_0, quantize_q8_0, dot_q5_0_c},
    {BP_TYPE_Q8_1, quantize_q8_1, dot_q5_1_c},
    {BP_TYPE_Q8_0, quantize_q8_0, dot_iq4_nl_c},
};
#endif

/* ---- AVX2 and AVX-512 -----------------------------------------------------------------------
 *
 * One block per 256-bit register in both. The AVX-512 builds' body differs where AVX-512 has
 * better instructions for it: the fifth bits become bytes with vpmovm2b (BW/VL) instead of a
 * shuffle and a compare, and the byte products are VNNI's 256-bit vpdpbusd instead of vpmaddubsw
 * + vpmaddwd. A 512-bit form (two blocks joined per register, signs moved with a byte mask) was
 * slower on the AMD EPYC this was measured on (4096^2, N = 1, 2 threads: Q4_1 95 against 120
 * GFLOP/s, Q5_0 75 against 88, Q5_1 80 against 101): joining the blocks costs more than the
 * wider products save, where 512-bit operations run as two 256-bit halves. */

#if defined(BP_CPU_HAVE_AVX2)
BP_CPU_INLINE bool signed_type(const enum bp_type t)
{
    return t == BP_TYPE_Q5_0 || t == BP_TYPE_IQ4_NL;
}

/* Unsigned bytes u times signed bytes y, summed in eight int32 lanes. */
BP_CPU_INLINE __m256i dot_u8i8(__m256i u, __m256i y)
{
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
#endif
}

/* A block's integer dot product, weights as unpack_block gives them. */
BP_CPU_INLINE __m256i dot_block256(const enum bp_type t, __m256i x, __m256i y)
{
    if (signed_type(t)) /* |x| <= 127, so |x| fits the unsigned side */
        return dot_u8i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return dot_u8i8(x, y);
}

BP_CPU_INLINE bool has_min(const enum bp_type t)
{
    return t == BP_TYPE_Q4_1 || t == BP_TYPE_Q5_1;
}

/* The quants of activation block i. */
BP_CPU_INLINE const int8_t *y_qs(const enum bp_type t, const void *y, int64_t i)
{
    return has_min(t) ? ((const struct bp_block_q8_1 *)y)[i].qs
                      : ((const struct bp_block_q8_0 *)y)[i].qs;
}

/* Block i's two scale products at once: lane 0 d_w d_y, lane 1 (types with a minimum) m_w s_y.
 * Every block here starts with its f16 scale, followed by the minimum (Q4_1, Q5_1) or the
 * scaled sum (Q8_1); both pairs convert in one instruction. */
BP_CPU_INLINE __m128 scale_pair(const enum bp_type t, const void *w, const void *y, int64_t i)
{
    const size_t ws = t == BP_TYPE_Q4_1   ? sizeof(struct bp_block_q4_1)
                      : t == BP_TYPE_Q5_0 ? sizeof(struct bp_block_q5_0)
                      : t == BP_TYPE_Q5_1 ? sizeof(struct bp_block_q5_1)
                                          : sizeof(struct bp_block_iq4_nl);
    const size_t ys = has_min(t) ? sizeof(struct bp_block_q8_1) : sizeof(struct bp_block_q8_0);
    const __m128 a = _mm_cvtph_ps(_mm_cvtsi32_si128((int)load_u32((const uint8_t *)w + i * ws)));
    const __m128 b = _mm_cvtph_ps(_mm_cvtsi32_si128((int)load_u32((const uint8_t *)y + i * ys)));
    return _mm_mul_ps(a, b);
}

/* Blocks [i0, nb) of one row, one block per step, two chains in flight; the minimums' products
 * gather in lane 1 of mins. */
BP_CPU_INLINE float dot_avx2(const enum bp_type t, int64_t i0, int64_t nb, const void *w,
                             const void *y)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 mins = _mm_setzero_ps();
    int64_t i = i0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i s0 = dot_block256(t, unpack_block(t, w, i),
                                        _mm256_loadu_si256((const __m256i *)y_qs(t, y, i)));
        const __m256i s1 = dot_block256(t, unpack_block(t, w, i + 1),
                                        _mm256_loadu_si256((const __m256i *)y_qs(t, y, i + 1)));
        const __m128 p0 = scale_pair(t, w, y, i), p1 = scale_pair(t, w, y, i + 1);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_broadcastss_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_broadcastss_ps(p1), acc1);
        if (has_min(t))
            mins = _mm_add_ps(mins, _mm_add_ps(p0, p1));
    }
    for (; i < nb; i++) {
        const __m256i s0 = dot_block256(t, unpack_block(t, w, i),
                                        _mm256_loadu_si256((const __m256i *)y_qs(t, y, i)));
        const __m128 p0 = scale_pair(t, w, y, i);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_broadcastss_ps(p0), acc0);
        if (has_min(t))
            mins = _mm_add_ps(mins, p0);
    }
    const float m = has_min(t) ? _mm_cvtss_f32(_mm_shuffle_ps(mins, mins, 1)) : 0.0f;
    return bp_cpu_hsum256(_mm256_add_ps(acc0, acc1)) + m;
}
#endif

#if defined(BP_CPU_HAVE_AVX2)
#define DOT_BODY(t, k, w, y) dot_avx2(t, 0, (k) / 32, w, y)
static float dot_q4_1_v(int64_t k, const void *w, const void *y)
{
    return DOT_BODY(BP_TYPE_Q4_1, k, w, y);
}

static float dot_q5_0_v(int64_t k, const void *w, const void *y)
{
    return DOT_BODY(BP_TYPE_Q5_0, k, w, y);
}

static float dot_q5_1_v(int64_t k, const void *w, const void *y)
{
    return DOT_BODY(BP_TYPE_Q5_1, k, w, y);
}

static float dot_iq4_nl_v(int64_t k, const void *w, const void *y)
{
    return DOT_BODY(BP_TYPE_IQ4_NL, k, w, y);
}
#undef DOT_BODY

static const struct bp_cpu_qtype qtypes[4] = {
    {BP_TYPE_Q8_1, quantize_q8_1, dot_q4_1_v},
    {BP_TYPE_Q8_0, quantize_q8_0, dot_q5_0_v},
    {BP_TYPE_Q8_1, quantize_q8_1, dot_q5_1_v},
    {BP_TYPE_Q8_0, quantize_q8_0, dot_iq4_nl_v},
};
#endif

const struct bp_cpu_qtype *bp_cpu_qtype32(enum bp_type t)
{
    switch (t) {
    case BP_TYPE_Q4_1:
        return &qtypes[0];
    case BP_TYPE_Q5_0:
        return &qtypes[1];
    case BP_TYPE_Q5_1:
        return &qtypes[2];
    case BP_TYPE_IQ4_NL:
        return &qtypes[3];
    default:
        return NULL;
    }
}
