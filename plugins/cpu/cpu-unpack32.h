/* cpu-unpack32.h - the blocks of 32 of Q4_1, Q5_0, Q5_1 and IQ4_NL as 32 bytes in element order
 * (the low nibbles are elements 0-15, the high ones 16-31, the fifth bits from qh, IQ4_NL's
 * indices looked up in its table with a byte shuffle): unsigned for Q4_1 and Q5_1, signed for
 * Q5_0 (q - 16) and IQ4_NL. Shared by the dot products (cpu-quants32.c) and the conversions to
 * floats (cpu-convert.c); AVX2 and AVX-512 builds only. AVX-512 builds also unpack the
 * sub-blocks of 32 of the super-block types (Q2_K to Q6_K, IQ4_XS) with their scales, for the
 * 8-bit matrix products (cpu-amx.c, cpu-gemm-int8.c). */
#ifndef BP_CPU_UNPACK32_H
#define BP_CPU_UNPACK32_H

#include <stdint.h>
#include <string.h>

#include "cpu-impl.h"
#include "cpu-qtypes.h"

/* IQ4_NL's 16 values (ggml's kvalues_iq4nl). */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

#if defined(BP_CPU_HAVE_AVX2)
static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The 32 nibbles of qs in element order: the low ones, then the high ones. */
BP_CPU_INLINE __m256i nibbles32(const uint8_t *qs)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

/* 0xff in byte j where bit j of the 32 bits at p is set. */
BP_CPU_INLINE __m256i bits32(const uint8_t *p)
{
#if defined(BP_CPU_HAVE_AVX512)
    return _mm256_movm_epi8((__mmask32)load_u32(p));
#else
    /* Byte j takes byte j / 8 of the bits, then every bit but bit j % 8 is set. */
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)load_u32(p)), shuf);
    return _mm256_cmpeq_epi8(_mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                             _mm256_set1_epi64x(-1));
#endif
}

/* k4_scales in registers (the 12 bytes as 32-bit words a, b, c): scales then minimums, one a
 * byte. Words 0 and 2 are a and b & 0x3f; words 1 and 3 take c's low or high nibbles and the top
 * 2 bits of a or b. Scalar stores read back as a vector would stall the load. */
BP_CPU_INLINE __m128i k4_scales_v(const uint8_t *packed)
{
    int32_t c32;
    memcpy(&c32, packed + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)packed), c32, 2);
    const __m128i p = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* a c b c */
    const __m128i q = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* a a b b */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(p, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(q, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* q3_k_scales in registers, offset 32 taken off: words 0..3 take the low or high nibbles of a or
 * b and bits 0-1, 2-3, 4-5, 6-7 of c's bytes as their bits 4-5. */
BP_CPU_INLINE __m128i q3_k_scales_v(const uint8_t *packed)
{
    int32_t c32;
    memcpy(&c32, packed + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)packed), c32, 2);
    const __m128i p = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0)); /* a b a b */
    const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(p, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(
        _mm_srlv_epi32(_mm_sllv_epi32(c, _mm_setr_epi32(4, 2, 0, 0)), _mm_setr_epi32(0, 0, 0, 2)),
        _mm_set1_epi8(0x30));
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}

/* One block of weights as 32 bytes: unsigned for Q4_1 and Q5_1, signed for Q5_0 and IQ4_NL. */
BP_CPU_INLINE __m256i unpack_block(const enum bp_type t, const void *w, int64_t i)
{
    switch (t) {
    case BP_TYPE_Q4_1:
        return nibbles32(((const struct bp_block_q4_1 *)w)[i].qs);
    case BP_TYPE_Q5_0: {
        const struct bp_block_q5_0 *b = (const struct bp_block_q5_0 *)w + i;
        return _mm256_or_si256(nibbles32(b->qs),
                               _mm256_andnot_si256(bits32(b->qh), _mm256_set1_epi8((char)0xf0)));
    }
    case BP_TYPE_Q5_1: {
        const struct bp_block_q5_1 *b = (const struct bp_block_q5_1 *)w + i;
        return _mm256_or_si256(nibbles32(b->qs),
                               _mm256_and_si256(bits32(b->qh), _mm256_set1_epi8(0x10)));
    }
    default: { /* IQ4_NL */
        const __m256i tbl =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
        return _mm256_shuffle_epi8(tbl, nibbles32(((const struct bp_block_iq4_nl *)w)[i].qs));
    }
    }
}

#endif

#if defined(BP_CPU_HAVE_AVX512)
/* Block t (of 32 values) of a row of Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K or IQ4_XS: its 32
 * values q in element order (as unpack_block: unsigned for the types with a minimum, signed for
 * the others), and for the blocks of 32 d and m with value = d q + m (the super-block types
 * leave them out: bp_cpu_superblock_scales gives them for a whole super-block). */
BP_CPU_INLINE __m256i bp_cpu_unpack_q(enum bp_type type, const void *row, int64_t t, float *d,
                                       float *m)
{
    switch (type) {
    case BP_TYPE_Q4_1: {
        const struct bp_block_q4_1 *x = (const struct bp_block_q4_1 *)row + t;
        *d = bp_cpu_half_to_float(x->d);
        *m = bp_cpu_half_to_float(x->m);
        break;
    }
    case BP_TYPE_Q5_1: {
        const struct bp_block_q5_1 *x = (const struct bp_block_q5_1 *)row + t;
        *d = bp_cpu_half_to_float(x->d);
        *m = bp_cpu_half_to_float(x->m);
        break;
    }
    case BP_TYPE_Q5_0:
        *d = bp_cpu_half_to_float(((const struct bp_block_q5_0 *)row)[t].d);
        *m = 0.0f;
        break;
    case BP_TYPE_IQ4_NL:
        *d = bp_cpu_half_to_float(((const struct bp_block_iq4_nl *)row)[t].d);
        *m = 0.0f;
        break;
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K: {
        /* Sub-block j of 32 takes the low (j even) or high nibbles of qs[32 (j / 2) ...], and
         * Q5_K bit j of qh[0..31] as the fifth bit. */
        const int j = (int)(t % 8);
        const bool q5 = type == BP_TYPE_Q5_K;
        const struct bp_block_q4_k *x4 = (const struct bp_block_q4_k *)row + t / 8;
        const struct bp_block_q5_k *x5 = (const struct bp_block_q5_k *)row + t / 8;
        const uint8_t *qs = (q5 ? x5->qs : x4->qs) + 32 * (j / 2);
        const __m256i v = _mm256_loadu_si256((const __m256i *)qs);
        __m256i q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
        if (q5) {
            const __mmask32 hb = _mm256_test_epi8_mask(
                _mm256_loadu_si256((const __m256i *)x5->qh), _mm256_set1_epi8((char)(1 << j)));
            q = _mm256_or_si256(q, _mm256_maskz_mov_epi8(hb, _mm256_set1_epi8(16)));
        }
        return q;
    }
    default: { /* IQ4_XS: sub-block j's 16 bytes of nibbles, its 6-bit scale offset by 32 */
        const int j = (int)(t % 8);
        const struct bp_block_iq4_xs *x = (const struct bp_block_iq4_xs *)row + t / 8;
        const __m256i tbl =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
        return _mm256_shuffle_epi8(tbl, nibbles32(x->qs + 16 * j));
    }
    }
    return unpack_block(type, row, t);
}

/* Block t (of 32 values) of a row of Q2_K, Q3_K or Q6_K, whose scales go by 16: its 32 values q
 * unsigned in element order (bp_cpu_superblock_scales gives each half's d and m, value = d q + m).
 * In each half of a super-block (128 values), sub-block u (0-3)
 * of 32 takes bits 2u, 2u + 1 of 32 bytes of quants (Q2_K, Q3_K: qs[32 (t % 8 / 4) ...]; Q3_K's
 * third bit is bit (t % 8) of hmask[0..31], clear meaning 4 less); Q6_K takes the low (u < 2) or
 * high nibbles of ql[64 h' + 32 (u % 2) ...] and bits 2u, 2u + 1 of qh[32 h' ...] as the top
 * two. */
BP_CPU_INLINE __m256i bp_cpu_unpack_q16(enum bp_type type, const void *row, int64_t t)
{
    const int j = (int)(t % 8), half = j / 4, u = j % 4;
    const __m256i three = _mm256_set1_epi8(3);
    switch (type) {
    case BP_TYPE_Q2_K: {
        const struct bp_block_q2_k *x = (const struct bp_block_q2_k *)row + t / 8;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * half));
        return _mm256_and_si256(_mm256_srli_epi16(q, 2 * u), three);
    }
    case BP_TYPE_Q3_K: {
        const struct bp_block_q3_k *x = (const struct bp_block_q3_k *)row + t / 8;
        const __m256i q = _mm256_and_si256(
            _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * half)), 2 * u),
            three);
        const __mmask32 hb = _mm256_test_epi8_mask(_mm256_loadu_si256((const __m256i *)x->hmask),
                                                   _mm256_set1_epi8((char)(1 << j)));
        return _mm256_or_si256(q, _mm256_maskz_mov_epi8(hb, _mm256_set1_epi8(4)));
    }
    default: { /* Q6_K */
        const struct bp_block_q6_k *x = (const struct bp_block_q6_k *)row + t / 8;
        const __m256i l =
            _mm256_loadu_si256((const __m256i *)(x->ql + 64 * half + 32 * (u % 2)));
        const __m256i nib = _mm256_and_si256(u >= 2 ? _mm256_srli_epi16(l, 4) : l,
                                             _mm256_set1_epi8(0x0f));
        const __m256i top = _mm256_and_si256(
            _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * half)), 2 * u),
            three);
        return _mm256_or_si256(nib, _mm256_slli_epi16(top, 4));
    }
    }
}

/* The scales of super-block i of a row of Q2_K to Q6_K or IQ4_XS as 16 floats each: *d and *m
 * hold, per sub-block k of 16 (Q2_K, Q3_K, Q6_K; k = 2 t + h for half h of block t), d and m of
 * value = d q + m with q as bp_cpu_unpack_q16 gives it; per block t of 32 in lanes 0-7 (Q4_K,
 * Q5_K, IQ4_XS; lanes 8-15 zero), as bp_cpu_unpack_q gives q. */
BP_CPU_INLINE void bp_cpu_superblock_scales(enum bp_type type, const void *row, int64_t i,
                                            __m512 *d, __m512 *m)
{
    switch (type) {
    case BP_TYPE_Q2_K: {
        const struct bp_block_q2_k *x = (const struct bp_block_q2_k *)row + i;
        const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)x->scales));
        const __m512i lo = _mm512_and_si512(s, _mm512_set1_epi32(0xf));
        *d = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), _mm512_set1_ps(bp_cpu_half_to_float(x->d)));
        *m = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(s, 4)),
                           _mm512_set1_ps(-bp_cpu_half_to_float(x->dmin)));
        return;
    }
    case BP_TYPE_Q3_K: {
        const struct bp_block_q3_k *x = (const struct bp_block_q3_k *)row + i;
        const __m512i sc = _mm512_cvtepi8_epi32(q3_k_scales_v(x->scales));
        *d = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(bp_cpu_half_to_float(x->d)));
        *m = _mm512_mul_ps(*d, _mm512_set1_ps(-4.0f));
        return;
    }
    case BP_TYPE_Q6_K: {
        const struct bp_block_q6_k *x = (const struct bp_block_q6_k *)row + i;
        const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x->scales));
        *d = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(bp_cpu_half_to_float(x->d)));
        *m = _mm512_mul_ps(*d, _mm512_set1_ps(-32.0f));
        return;
    }
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K: {
        /* The 12 bytes as 8 scales then 8 minimums. */
        const bool q5 = type == BP_TYPE_Q5_K;
        const struct bp_block_q4_k *x4 = (const struct bp_block_q4_k *)row + i;
        const struct bp_block_q5_k *x5 = (const struct bp_block_q5_k *)row + i;
        const __m512 s =
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(k4_scales_v(q5 ? x5->scales : x4->scales)));
        const float dd = bp_cpu_half_to_float(q5 ? x5->d : x4->d);
        const float dm = bp_cpu_half_to_float(q5 ? x5->dmin : x4->dmin);
        *d = _mm512_maskz_mul_ps(0x00ff, s, _mm512_set1_ps(dd));
        /* The minimums into lanes 0-7, negated. */
        *m = _mm512_maskz_mul_ps(0x00ff, _mm512_shuffle_f32x4(s, s, 0xee), _mm512_set1_ps(-dm));
        return;
    }
    default: { /* IQ4_XS */
        const struct bp_block_iq4_xs *x = (const struct bp_block_iq4_xs *)row + i;
        const __m512i s = _mm512_sub_epi32(
            _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bp_cpu_iq4_xs_scales(x))),
            _mm512_set1_epi32(32));
        *d = _mm512_maskz_mul_ps(0x00ff, _mm512_cvtepi32_ps(s),
                                 _mm512_set1_ps(bp_cpu_half_to_float(x->d)));
        *m = _mm512_setzero_ps();
        return;
    }
    }
}
#endif

#endif
