/* cpu-unpack32.h - the blocks of 32 of Q4_1, Q5_0, Q5_1 and IQ4_NL as 32 bytes in element order
 * (the low nibbles are elements 0-15, the high ones 16-31, the fifth bits from qh, IQ4_NL's
 * indices looked up in its table with a byte shuffle): unsigned for Q4_1 and Q5_1, signed for
 * Q5_0 (q - 16) and IQ4_NL. Shared by the dot products (cpu-quants32.c) and the conversions to
 * floats (cpu-convert.c); AVX2 and AVX-512 builds only. */
#ifndef BP_CPU_UNPACK32_H
#define BP_CPU_UNPACK32_H

#include <stdint.h>
#include <string.h>

#include "cpu-impl.h"

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

#endif
