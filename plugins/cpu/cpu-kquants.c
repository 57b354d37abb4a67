/* cpu-kquants.c - the super-block weight types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against
 * activations quantised to Q8_K: the quantiser and one dot product per type.
 *
 * Every dot product is ggml's: per super-block an integer sum of the quants times the
 * activations, weighted by the integer sub-block scales, then one multiplication by the two
 * float scales; the minimums of Q2_K/Q4_K/Q5_K come off through Q8_K's sums of 16 (bsums), so
 * they cost one small multiply-add per super-block instead of work per element.
 *
 * The vector bodies make every weight an unsigned byte and multiply it with the signed Q8_K
 * bytes (vpmaddubsw: pairs into 16 bits, which cannot saturate with these ranges), then weigh the
 * pairs with the sub-block scales (vpmaddwd, or vpdpwssd where AVX512-VNNI is there). Signed
 * quants are stored with an offset (Q3_K's q + 4, Q6_K's q + 32), which is taken back once per
 * super-block through bsums: sum sc (q + c) y - c sum sc bsum. IQ4_XS's table values are signed
 * and large, so with AVX2 they go through the sign trick instead (|v| times y with v's sign; the
 * quantiser never writes -128); with VNNI they are v + 128 in vpdpbusd (32-bit sums, nothing
 * saturates), times the scale in 32 bits, and the 128s come off through bsums.
 *
 * AVX2 works 32 elements a register; the AVX-512 build 64 (two 256-bit halves of the same
 * layout side by side). The portable bodies are plain integer C. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu-qtypes.h"
#include "cpu-unpack32.h"


/* ---- Unpacking of the scales (shared by every body) ------------------------------------------ */

#if !defined(BP_CPU_HAVE_AVX2) /* (the vector bodies unpack them in registers) */

/* Q4_K's/Q5_K's 12 bytes as 8 scales (sm[0..7]) and 8 minimums (sm[8..15]), all 6-bit: scale
 * and minimum j < 4 are the low 6 bits of bytes j and j + 4; j >= 4 take their low 4 bits from
 * byte j + 4 (scale: low nibble, minimum: high nibble) and the high 2 from the top of bytes
 * j - 4 and j. */
static void k4_scales(const uint8_t *packed, uint8_t sm[16])
{
    uint32_t a, b, c, w[4];
    memcpy(&a, packed, 4);
    memcpy(&b, packed + 4, 4);
    memcpy(&c, packed + 8, 4);
    w[0] = a & 0x3f3f3f3fu;
    w[1] = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
    w[2] = b & 0x3f3f3f3fu;
    w[3] = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
    memcpy(sm, w, 16);
}

/* Q3_K's 12 bytes as its 16 scales, offset 32 still on: the low 4 bits of scale j are a nibble of
 * byte j % 8 (low for j < 8), the high 2 bits are bits 2 (j / 4) of byte 8 + j % 4. */
static void q3_k_scales(const uint8_t *packed, uint8_t s[16])
{
    uint32_t a, b, c, w[4];
    memcpy(&a, packed, 4);
    memcpy(&b, packed + 4, 4);
    memcpy(&c, packed + 8, 4);
    w[0] = (a & 0x0f0f0f0fu) | ((c & 0x03030303u) << 4);
    w[1] = (b & 0x0f0f0f0fu) | (((c >> 2) & 0x03030303u) << 4);
    w[2] = ((a >> 4) & 0x0f0f0f0fu) | (((c >> 4) & 0x03030303u) << 4);
    w[3] = ((b >> 4) & 0x0f0f0f0fu) | (((c >> 6) & 0x03030303u) << 4);
    memcpy(s, w, 16);
}

#endif

/* ---- Portable bodies --------------------------------------------------------------------------- */

#if !defined(BP_CPU_HAVE_AVX2)

/* sum of n products of unsigned quants and activations */
static int dot_u8(const uint8_t *u, const int8_t *y, int n)
{
    int s = 0;
    for (int l = 0; l < n; l++)
        s += u[l] * y[l];
    return s;
}

static float dot_q2_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q2_k *x = vw;
    const struct bp_block_q8_k *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        /* the quants one a byte first (loops the compiler can vectorise), then the sums */
        uint8_t u[BP_QK_K];
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int b = x[i].qs[32 * h + l];
                u[128 * h + l] = b & 3;
                u[128 * h + 32 + l] = (b >> 2) & 3;
                u[128 * h + 64 + l] = (b >> 4) & 3;
                u[128 * h + 96 + l] = (uint8_t)(b >> 6);
            }
        int isum = 0, summs = 0;
        for (int j = 0; j < 16; j++) {
            isum += (x[i].scales[j] & 15) * dot_u8(u + 16 * j, y[i].qs + 16 * j, 16);
            summs += y[i].bsums[j] * (x[i].scales[j] >> 4);
        }
        sum += y[i].d * bp_cpu_half_to_float(x[i].d) * (float)isum -
               y[i].d * bp_cpu_half_to_float(x[i].dmin) * (float)summs;
    }
    return sum;
}

static float dot_q3_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q3_k *x = vw;
    const struct bp_block_q8_k *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        uint8_t sc[16], u[BP_QK_K];
        q3_k_scales(x[i].scales, sc);
        /* q + 4 one a byte: the low 2 bits, and the high bit as 4 */
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int b = x[i].qs[32 * h + l], m = x[i].hmask[l] >> (4 * h);
                u[128 * h + l] = (uint8_t)((b & 3) | (m & 1) << 2);
                u[128 * h + 32 + l] = (uint8_t)(((b >> 2) & 3) | (m & 2) << 1);
                u[128 * h + 64 + l] = (uint8_t)(((b >> 4) & 3) | (m & 4));
                u[128 * h + 96 + l] = (uint8_t)((b >> 6) | (m & 8) >> 1);
            }
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += (sc[j] - 32) * (dot_u8(u + 16 * j, y[i].qs + 16 * j, 16) - 4 * y[i].bsums[j]);
        sum += y[i].d * bp_cpu_half_to_float(x[i].d) * (float)isum;
    }
    return sum;
}

/* Q4_K and Q5_K: qh is NULL for Q4_K. */
static float dot_k4(int64_t k, const uint16_t *d, const uint8_t *scales, const uint8_t *qh,
                    const uint8_t *qs, size_t stride, const struct bp_block_q8_k *y)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < k / BP_QK_K; i++, y++) {
        const size_t o = (size_t)i * stride;
        uint8_t sm[16];
        k4_scales(scales + o, sm);
        int isum = 0, summs = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + o + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            uint8_t u[32];
            for (int l = 0; l < 32; l++)
                u[l] = (q[l] >> shift) & 15;
            if (qh != NULL)
                for (int l = 0; l < 32; l++)
                    u[l] |= (uint8_t)(((qh[o + l] >> j) & 1) << 4);
            isum += sm[j] * dot_u8(u, y->qs + 32 * j, 32);
            summs += sm[8 + j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
        }
        uint16_t dd[2];
        memcpy(dd, (const char *)d + o, sizeof(dd));
        sum += y->d * bp_cpu_half_to_float(dd[0]) * (float)isum -
               y->d * bp_cpu_half_to_float(dd[1]) * (float)summs;
    }
    return sum;
}

static float dot_q4_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q4_k *x = vw;
    return dot_k4(k, &x->d, x->scales, NULL, x->qs, sizeof(*x), vy);
}

static float dot_q5_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q5_k *x = vw;
    return dot_k4(k, &x->d, x->scales, x->qh, x->qs, sizeof(*x), vy);
}

static float dot_q6_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q6_k *x = vw;
    const struct bp_block_q8_k *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        /* q + 32 one a byte: 4 bits of ql and 2 of qh */
        uint8_t u[BP_QK_K];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                u[128 * h + l] = (uint8_t)((ql[l] & 15) | (qh[l] & 3) << 4);
                u[128 * h + 32 + l] = (uint8_t)((ql[l + 32] & 15) | (qh[l] & 12) << 2);
                u[128 * h + 64 + l] = (uint8_t)((ql[l] >> 4) | (qh[l] & 48));
                u[128 * h + 96 + l] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] & 192) >> 2);
            }
        }
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += x[i].scales[j] * (dot_u8(u + 16 * j, y[i].qs + 16 * j, 16) - 32 * y[i].bsums[j]);
        sum += y[i].d * bp_cpu_half_to_float(x[i].d) * (float)isum;
    }
    return sum;
}

static float dot_iq4_xs(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_iq4_xs *x = vw;
    const struct bp_block_q8_k *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        const uint64_t ls = bp_cpu_iq4_xs_scales(&x[i]);
        int isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = x[i].qs + 16 * ib;
            const int8_t *q8 = y[i].qs + 32 * ib;
            int8_t v[32];
            for (int l = 0; l < 16; l++) {
                v[l] = iq4nl_values[q[l] & 15];
                v[l + 16] = iq4nl_values[q[l] >> 4];
            }
            int s = 0;
            for (int l = 0; l < 32; l++)
                s += v[l] * q8[l];
            isum += ((int)((ls >> (8 * ib)) & 63) - 32) * s;
        }
        sum += y[i].d * bp_cpu_half_to_float(x[i].d) * (float)isum;
    }
    return sum;
}

#endif /* portable bodies */

/* ---- AVX2 bodies (the AVX-512 build's too, with VNNI's fused multiply-adds) ------------------- */

#if defined(BP_CPU_HAVE_AVX2)

/* acc + the pairs of 16-bit products of p16 and s16 (vpmaddwd then vpaddd, fused with VNNI) */
BP_CPU_INLINE __m256i madd16_acc(__m256i acc, __m256i p16, __m256i s16)
{
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    return _mm256_dpwssd_epi32(acc, p16, s16);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, s16));
#endif
}

/* 32 unsigned quants times 32 activations, weighed by s16 (16 bits a pair), added to acc. */
BP_CPU_INLINE __m256i dot_u8_acc(__m256i acc, __m256i u, const int8_t *q8, __m256i s16)
{
    return madd16_acc(acc, _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)q8)), s16);
}

/* From s (the same eight 16-bit scales in both 128-bit lanes): scale 2p in the low lane, scale
 * 2p + 1 in the high lane, for a register holding two sub-blocks of 16. */
#define PAIR_SCALES(s, p)                                                                      \
    _mm256_shuffle_epi8((s), _mm256_set_m128i(_mm_set1_epi16((short)((4 * (p) + 3) << 8 | (4 * (p) + 2))), \
                                              _mm_set1_epi16((short)((4 * (p) + 1) << 8 | 4 * (p)))))
/* From s (eight 16-bit scales in both lanes): scale j everywhere, for a sub-block of 32. */
#define ONE_SCALE(s, j) _mm256_shuffle_epi8((s), _mm256_set1_epi16((short)((2 * (j) + 1) << 8 | 2 * (j))))

/* Sixteen 8-bit scales at p as 16-bit: the first eight in both lanes of lo, the rest in hi. */
BP_CPU_INLINE void scales16(__m128i s8, int is_signed, __m256i *lo, __m256i *hi)
{
    const __m256i s = is_signed ? _mm256_cvtepi8_epi16(s8) : _mm256_cvtepu8_epi16(s8);
    *lo = _mm256_permute4x64_epi64(s, 0x44);
    *hi = _mm256_permute4x64_epi64(s, 0xee);
}

BP_CPU_INLINE float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

BP_CPU_INLINE __m256i bsums(const struct bp_block_q8_k *y)
{
    return _mm256_loadu_si256((const __m256i *)y->bsums);
}

static float dot_q2_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q2_k *x = vw;
    const struct bp_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(15)));
        __m256i s[2];
        scales16(_mm_and_si128(sc8, _mm_set1_epi8(15)), 0, &s[0], &s[1]);
        __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q2 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            const int8_t *q8 = y[i].qs + 128 * h;
            isum = dot_u8_acc(isum, _mm256_and_si256(q2, m3), q8, PAIR_SCALES(s[h], 0));
            isum = dot_u8_acc(isum, _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3), q8 + 32,
                              PAIR_SCALES(s[h], 1));
            isum = dot_u8_acc(isum, _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3), q8 + 64,
                              PAIR_SCALES(s[h], 2));
            isum = dot_u8_acc(isum, _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3), q8 + 96,
                              PAIR_SCALES(s[h], 3));
        }
        const __m256 summs = _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums(&y[i]), mins));
        const float dall = y[i].d * bp_cpu_half_to_float(x[i].d);
        const float dmin = y[i].d * bp_cpu_half_to_float(x[i].dmin);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), summs, acc);
    }
    return hsum_ps(acc);
}

/* Bit b of every byte of v moved to bit t (0x04 or 0x10: the mask m), every other bit cleared. */
#define BIT_TO(v, b, t, m)                                                                     \
    _mm256_and_si256((b) <= (t) ? _mm256_slli_epi16((v), (t) - (b) > 0 ? (t) - (b) : 0)         \
                                : _mm256_srli_epi16((v), (b) - (t) > 0 ? (b) - (t) : 0),        \
                     (m))

static float dot_q3_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q3_k *x = vw;
    const struct bp_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        const __m128i sc8 = q3_k_scales_v(x[i].scales);
        __m256i s[2];
        scales16(sc8, 1, &s[0], &s[1]);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        /* the offset of 4 on every quant, taken off through bsums */
        __m256i isum = _mm256_slli_epi32(_mm256_madd_epi16(bsums(&y[i]), _mm256_cvtepi8_epi16(sc8)), 2);
        isum = _mm256_sub_epi32(_mm256_setzero_si256(), isum);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q3 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            const int8_t *q8 = y[i].qs + 128 * h;
            const __m256i u0 = _mm256_or_si256(_mm256_and_si256(q3, m3), BIT_TO(hm, 4 * h, 2, m4));
            const __m256i u1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q3, 2), m3),
                                               BIT_TO(hm, 4 * h + 1, 2, m4));
            const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q3, 4), m3),
                                               BIT_TO(hm, 4 * h + 2, 2, m4));
            const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q3, 6), m3),
                                               BIT_TO(hm, 4 * h + 3, 2, m4));
            isum = dot_u8_acc(isum, u0, q8, PAIR_SCALES(s[h], 0));
            isum = dot_u8_acc(isum, u1, q8 + 32, PAIR_SCALES(s[h], 1));
            isum = dot_u8_acc(isum, u2, q8 + 64, PAIR_SCALES(s[h], 2));
            isum = dot_u8_acc(isum, u3, q8 + 96, PAIR_SCALES(s[h], 3));
        }
        const float d = y[i].d * bp_cpu_half_to_float(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum_ps(acc);
}

#if defined(BP_CPU_HAVE_AVX512_VNNI)

/* From s (eight 16-bit scales in every 128-bit lane): scale a in the low 256 bits, b in the
 * high 256, for a register holding two sub-blocks of 32. */
BP_CPU_INLINE __m512i two_scales(__m512i s, int a, int b)
{
    const __m256i ma = _mm256_set1_epi16((short)((2 * a + 1) << 8 | 2 * a));
    const __m256i mb = _mm256_set1_epi16((short)((2 * b + 1) << 8 | 2 * b));
    return _mm512_shuffle_epi8(s, _mm512_inserti64x4(_mm512_castsi256_si512(ma), mb, 1));
}

/* Q4_K and Q5_K (qh NULL for Q4_K) in 512-bit registers: 64 bytes of qs hold sub-blocks 4h..4h+3
 * as [4h | 4h+2] in their low nibbles and [4h+1 | 4h+3] in their high ones; one 128-bit shuffle
 * each puts [4h | 4h+1] and [4h+2 | 4h+3] together, in the order of the activations. A fifth bit
 * is added where VPTESTMB finds it, masked. */
BP_CPU_INLINE float dot_k4(int64_t k, const uint16_t *d, const uint8_t *scales, const uint8_t *qh,
                           const uint8_t *qs, size_t stride, const struct bp_block_q8_k *y)
{
    const __m512i m15 = _mm512_set1_epi8(15), m16 = _mm512_set1_epi8(16);
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < k / BP_QK_K; i++, y++) {
        const size_t o = (size_t)i * stride;
        const __m128i sm = k4_scales_v(scales + o);
        const __m512i s = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
        const __m128i bs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums(y)),
                                          _mm256_extracti128_si256(bsums(y), 1));
        const __m128i summs = _mm_madd_epi16(bs, _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
        __m512i isum = _mm512_setzero_si512(), hb = _mm512_setzero_si512();
        if (qh != NULL)
            hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qh + o)));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i q4 = _mm512_loadu_si512(qs + o + 64 * h);
            __m512i lo = _mm512_and_si512(q4, m15);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), m15);
            if (qh != NULL) {
                const __m512i blo = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * h))),
                                                       _mm256_set1_epi8((char)(4 << (4 * h))), 1);
                const __m512i bhi = _mm512_inserti64x4(_mm512_set1_epi8((char)(2 << (4 * h))),
                                                       _mm256_set1_epi8((char)(8 << (4 * h))), 1);
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hb, blo), lo, m16);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(hb, bhi), hi, m16);
            }
            const __m512i w0 = _mm512_shuffle_i64x2(lo, hi, 0x44), w1 = _mm512_shuffle_i64x2(lo, hi, 0xee);
            const __m512i y0 = _mm512_loadu_si512(y->qs + 128 * h);
            const __m512i y1 = _mm512_loadu_si512(y->qs + 128 * h + 64);
            isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(w0, y0), two_scales(s, 4 * h, 4 * h + 1));
            isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(w1, y1),
                                       two_scales(s, 4 * h + 2, 4 * h + 3));
        }
        uint16_t dd[2];
        memcpy(dd, (const char *)d + o, sizeof(dd));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(y->d * bp_cpu_half_to_float(dd[0])),
                              _mm512_cvtepi32_ps(isum), acc);
        accm = _mm_fnmadd_ps(_mm_set1_ps(y->d * bp_cpu_half_to_float(dd[1])),
                             _mm_cvtepi32_ps(summs), accm);
    }
    return _mm512_reduce_add_ps(acc) + hsum_ps(_mm256_zextps128_ps256(accm));
}

#else

/* Q4_K and Q5_K (qh NULL for Q4_K), one super-block at a time. */
BP_CPU_INLINE float dot_k4(int64_t k, const uint16_t *d, const uint8_t *scales, const uint8_t *qh,
                           const uint8_t *qs, size_t stride, const struct bp_block_q8_k *y)
{
    const __m256i m15 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < k / BP_QK_K; i++, y++) {
        const size_t o = (size_t)i * stride;
        const __m256i s16 = _mm256_cvtepu8_epi16(k4_scales_v(scales + o));
        const __m256i s = _mm256_permute4x64_epi64(s16, 0x44);
        /* the minimums against the sums of 32 activations (pairs of bsums) */
        const __m128i bs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums(y)),
                                          _mm256_extracti128_si256(bsums(y), 1));
        const __m128i summs = _mm_madd_epi16(bs, _mm256_extracti128_si256(s16, 1));
        __m256i isum = _mm256_setzero_si256();
        __m256i hb = _mm256_setzero_si256();
        if (qh != NULL)
            hb = _mm256_loadu_si256((const __m256i *)(qh + o));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + o + 32 * j));
            __m256i lo = _mm256_and_si256(q4, m15);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m15);
            if (qh != NULL) {
                lo = _mm256_or_si256(lo, BIT_TO(hb, 2 * j, 4, m16));
                hi = _mm256_or_si256(hi, BIT_TO(hb, 2 * j + 1, 4, m16));
            }
            isum = dot_u8_acc(isum, lo, y->qs + 64 * j, ONE_SCALE(s, 2 * j));
            isum = dot_u8_acc(isum, hi, y->qs + 64 * j + 32, ONE_SCALE(s, 2 * j + 1));
        }
        uint16_t dd[2];
        memcpy(dd, (const char *)d + o, sizeof(dd));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y->d * bp_cpu_half_to_float(dd[0])),
                              _mm256_cvtepi32_ps(isum), acc);
        accm = _mm_fnmadd_ps(_mm_set1_ps(y->d * bp_cpu_half_to_float(dd[1])),
                             _mm_cvtepi32_ps(summs), accm);
    }
    return hsum_ps(_mm256_add_ps(acc, _mm256_zextps128_ps256(accm)));
}

#endif

static float dot_q4_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q4_k *x = vw;
    return dot_k4(k, &x->d, x->scales, NULL, x->qs, sizeof(*x), vy);
}

static float dot_q5_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q5_k *x = vw;
    return dot_k4(k, &x->d, x->scales, x->qh, x->qs, sizeof(*x), vy);
}

static float dot_q6_k(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_q6_k *x = vw;
    const struct bp_block_q8_k *y = vy;
    const __m256i m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(48);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        __m256i s[2];
        scales16(sc8, 1, &s[0], &s[1]);
        /* the offset of 32 on every quant, taken off through bsums */
        __m256i isum = _mm256_slli_epi32(_mm256_madd_epi16(bsums(&y[i]), _mm256_cvtepi8_epi16(sc8)), 5);
        isum = _mm256_sub_epi32(_mm256_setzero_si256(), isum);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const int8_t *q8 = y[i].qs + 128 * h;
            const __m256i u0 = _mm256_or_si256(_mm256_and_si256(l0, m15),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m48));
            const __m256i u1 = _mm256_or_si256(_mm256_and_si256(l1, m15),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m48));
            const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                                               _mm256_and_si256(qh, m48));
            const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m48));
            isum = dot_u8_acc(isum, u0, q8, PAIR_SCALES(s[h], 0));
            isum = dot_u8_acc(isum, u1, q8 + 32, PAIR_SCALES(s[h], 1));
            isum = dot_u8_acc(isum, u2, q8 + 64, PAIR_SCALES(s[h], 2));
            isum = dot_u8_acc(isum, u3, q8 + 96, PAIR_SCALES(s[h], 3));
        }
        const float d = y[i].d * bp_cpu_half_to_float(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum_ps(acc);
}

static float dot_iq4_xs(int64_t k, const void *vw, const void *vy)
{
    const struct bp_block_iq4_xs *x = vw;
    const struct bp_block_q8_k *y = vy;
    __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    values = _mm256_xor_si256(values, _mm256_set1_epi8((char)0x80)); /* v + 128 */
#endif
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / BP_QK_K; i++) {
        const __m128i ls = _mm_sub_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)bp_cpu_iq4_xs_scales(&x[i]))),
                                         _mm_set1_epi16(32));
#if defined(BP_CPU_HAVE_AVX512_VNNI)
        const __m256i s32 = _mm256_cvtepi16_epi32(ls);
        const __m128i bs = _mm_hadd_epi16(_mm256_castsi256_si128(bsums(&y[i])),
                                          _mm256_extracti128_si256(bsums(&y[i]), 1));
        __m256i isum = _mm256_zextsi128_si256(
            _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(_mm_madd_epi16(bs, ls), 7)));
#else
        const __m256i s = _mm256_set_m128i(ls, ls);
        __m256i isum = _mm256_setzero_si256();
#endif
#pragma GCC unroll 4
        for (int ib = 0; ib < 8; ib += 2) {
            /* 16 bytes a sub-block: the low nibbles are its elements 0..15, the high ones
             * 16..31; two sub-blocks a load, their halves put back in order per 128 bits */
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 16 * ib));
            const __m256i lo = _mm256_and_si256(q, m15);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m15);
            const __m256i v0 = _mm256_shuffle_epi8(values, _mm256_permute2x128_si256(lo, hi, 0x20));
            const __m256i v1 = _mm256_shuffle_epi8(values, _mm256_permute2x128_si256(lo, hi, 0x31));
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib));
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 32 * ib + 32));
#if defined(BP_CPU_HAVE_AVX512_VNNI)
            /* v + 128 unsigned, four products a 32-bit lane (no 16-bit sums to saturate), then
             * the sub-block's scale; the 128s come off below */
            const __m256i z = _mm256_setzero_si256();
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_dpbusd_epi32(z, v0, y0),
                                                             _mm256_permutevar8x32_epi32(s32, _mm256_set1_epi32(ib))));
            isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_dpbusd_epi32(z, v1, y1),
                                                             _mm256_permutevar8x32_epi32(s32, _mm256_set1_epi32(ib + 1))));
#else
            const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(v0, v0), _mm256_sign_epi8(y0, v0));
            const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(v1, v1), _mm256_sign_epi8(y1, v1));
            isum = madd16_acc(isum, p0, ONE_SCALE(s, ib));
            isum = madd16_acc(isum, p1, ONE_SCALE(s, ib + 1));
#endif
        }
        const float d = y[i].d * bp_cpu_half_to_float(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum_ps(acc);
}

#endif /* AVX2 bodies */

/* ---- The Q8_K quantiser ---------------------------------------------------------------------------
 * The runtime's rule (ggml's quantize_row_q8_K_ref), bit for bit: the value of largest magnitude
 * (the first one, on a tie) sets d = max / -127, every value is rounded to nearest (even on a
 * tie, the default rounding mode, as lrintf) and clamped at 127; bsums are the sums of 16. The
 * vector versions find the same first largest value by comparing every magnitude with the
 * maximum; NaNs are never the largest (as in the scalar loop), and a NaN product (a NaN input,
 * or an infinity times the scale -0 an infinite maximum gives) is 0, as lrintf's answer cast
 * to int is in the runtime. So no quant is ever -128. */

/* v rounded to the nearest integer, ties to even, as lrintf in the default rounding mode, for
 * |v| < 2^22: adding 1.5 * 2^23 leaves the rounded value in the low mantissa bits (no call into
 * libm per element). */
static int nearest_int(float v)
{
    const float f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* qs and bsums of one super-block from the largest magnitude and its signed value */
static void q8_k_block_c(const float *x, float amax, float max, struct bp_block_q8_k *y)
{
    float d = 0.0f;
    if (amax != 0.0f) {
        const float iscale = -127.0f / max;
        for (int j = 0; j < BP_QK_K; j++) {
            const float f = iscale * x[j]; /* |f| <= 127 (plus rounding), or NaN */
            const int v = f == f ? nearest_int(f) : 0; /* lrintf's NaN, cast to int, is 0 */
            y->qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        d = 1.0f / iscale;
    } else {
        memset(y->qs, 0, sizeof(y->qs));
    }
    for (int b = 0; b < BP_QK_K / 16; b++) {
        int s = 0;
        for (int l = 0; l < 16; l++)
            s += y->qs[16 * b + l];
        y->bsums[b] = (int16_t)s;
    }
    y->d = d;
}

#if defined(BP_CPU_HAVE_AVX512)

static void quantize_q8_k(const float *x, void *vy, int64_t k)
{
    struct bp_block_q8_k *y = vy;
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < k / BP_QK_K; i++, x += BP_QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int j = 0; j < BP_QK_K; j += 16) /* a NaN operand leaves m as it was */
            m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask), m);
        const float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            q8_k_block_c(x, 0.0f, 0.0f, &y[i]);
            continue;
        }
        int first = 0;
        for (int j = 0; j < BP_QK_K; j += 16) {
            const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_loadu_ps(x + j), abs_mask),
                                                    _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (eq != 0) {
                first = j + __builtin_ctz(eq);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m512 vs = _mm512_set1_ps(iscale);
        for (int j = 0; j < BP_QK_K; j += 16) {
            const __m512 f = _mm512_mul_ps(_mm512_loadu_ps(x + j), vs);
            /* NaN (a NaN or infinite input) quantises to 0, as in the scalar rule */
            const __m512i q32 = _mm512_cvtps_epi32(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(f, f, _CMP_ORD_Q), f));
            const __m128i q = _mm512_cvtsepi32_epi8(q32); /* never below -127: see above */
            _mm_storeu_si128((__m128i *)(y[i].qs + j), q);
            y[i].bsums[j / 16] = (int16_t)_mm512_reduce_add_epi32(q32);
        }
        y[i].d = 1.0f / iscale;
    }
}

#elif defined(BP_CPU_HAVE_AVX2)

static void quantize_q8_k(const float *x, void *vy, int64_t k)
{
    struct bp_block_q8_k *y = vy;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < k / BP_QK_K; i++, x += BP_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < BP_QK_K; j += 8) /* a NaN operand leaves m as it was */
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f) {
            q8_k_block_c(x, 0.0f, 0.0f, &y[i]);
            continue;
        }
        int first = 0;
        for (int j = 0; j < BP_QK_K; j += 8) {
            const int eq = _mm256_movemask_ps(_mm256_cmp_ps(
                _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (eq != 0) {
                first = j + __builtin_ctz((unsigned)eq);
                break;
            }
        }
        const float iscale = -127.0f / x[first];
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < BP_QK_K; j += 32) {
            __m256i q[4];
            for (int r = 0; r < 4; r++)
            {
                /* NaN (a NaN or infinite input) quantises to 0, as in the scalar rule */
                const __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * r), vs);
                q[r] = _mm256_cvtps_epi32(_mm256_and_ps(f, _mm256_cmp_ps(f, f, _CMP_ORD_Q)));
            }
            /* the packs work per 128-bit lane: the permute puts the bytes back in order */
            const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
            const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                                          _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), b);
            /* each 16-bit sum pairs two elements of the same 16 */
            const __m256i s01 = _mm256_madd_epi16(p01, _mm256_set1_epi16(1));
            const __m256i s23 = _mm256_madd_epi16(p23, _mm256_set1_epi16(1));
            const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(s01, s23), _mm256_setzero_si256());
            /* lanes: s01's sums (elements 0-3, 8-11 | 4-7, 12-15) then s23's */
            y[i].bsums[j / 16] = (int16_t)(_mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 4));
            y[i].bsums[j / 16 + 1] = (int16_t)(_mm256_extract_epi32(s, 1) + _mm256_extract_epi32(s, 5));
        }
        y[i].d = 1.0f / iscale;
    }
}

#else

static void quantize_q8_k(const float *x, void *vy, int64_t k)
{
    struct bp_block_q8_k *y = vy;
    for (int64_t i = 0; i < k / BP_QK_K; i++, x += BP_QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < BP_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        q8_k_block_c(x, amax, max, &y[i]);
    }
}

#endif

/* ---- The table ----------------------------------------------------------------------------------- */

static const struct bp_cpu_qtype qtypes[] = {
    {BP_TYPE_Q8_K, quantize_q8_k, dot_q2_k}, {BP_TYPE_Q8_K, quantize_q8_k, dot_q3_k},
    {BP_TYPE_Q8_K, quantize_q8_k, dot_q4_k}, {BP_TYPE_Q8_K, quantize_q8_k, dot_q5_k},
    {BP_TYPE_Q8_K, quantize_q8_k, dot_q6_k}, {BP_TYPE_Q8_K, quantize_q8_k, dot_iq4_xs},
};

const struct bp_cpu_qtype *bp_cpu_qtype_k(enum bp_type t)
{
    switch (t) {
    case BP_TYPE_Q2_K:
        return &qtypes[0];
    case BP_TYPE_Q3_K:
        return &qtypes[1];
    case BP_TYPE_Q4_K:
        return &qtypes[2];
    case BP_TYPE_Q5_K:
        return &qtypes[3];
    case BP_TYPE_Q6_K:
        return &qtypes[4];
    case BP_TYPE_IQ4_XS:
        return &qtypes[5];
    default:
        return NULL;
    }
}
