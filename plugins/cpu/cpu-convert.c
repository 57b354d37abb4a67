/* cpu-convert.c - rows of any weight type to f32, with the vector instructions of this build
 * variant (F16C for halves, shifts for bfloat16, widening byte conversions for Q8_0/Q4_0). The
 * runtime's converters are portable scalar code; these are the fast path every kernel uses
 * (packing A for GEMM, matrix-vector rows, gathering sources). Results are bit-identical. The
 * blocks of 32 of Q4_1, Q5_0, Q5_1 and IQ4_NL convert here too in AVX2 and AVX-512 builds
 * (cpu-unpack32.h), and so do Q4_K and Q6_K, the k-quants of the mixes people use most; the
 * other quantised types go through the runtime's own converters, and every quantiser is the
 * runtime's. */
#include "config.h"

#include <string.h>

#include "cpu-impl.h"
#include "cpu-unpack32.h"

static void f16_row(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
#if defined(BP_CPU_HAVE_AVX512)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
#elif defined(BP_CPU_HAVE_F16C)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#elif defined(BP_CPU_HAVE_SSE2)
    /* Whole rows convert faster with integer operations than through the table (f16 4096^2
     * N = 512 on the baseline: 88 against 58 GFLOP/s); four values inside a dot-product tile
     * the other way round (cpu-gemv.c). */
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(y + i, bp_cpu_half4_sse2(x + i));
#endif
    for (; i < n; i++)
        y[i] = bp_cpu_half_to_float(x[i]);
}

static void bf16_row(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
#if defined(BP_CPU_HAVE_AVX512)
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
#elif defined(BP_CPU_HAVE_AVX2)
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
#endif
    for (; i < n; i++) {
        uint32_t b = (uint32_t)x[i] << 16;
        memcpy(&y[i], &b, 4);
    }
}

static void q8_0_row(const struct bp_block_q8_0 *b, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = bp_cpu_half_to_float(b[i].d);
#if defined(BP_CPU_HAVE_AVX512)
        const __m512 vd = _mm512_set1_ps(d);
        for (int j = 0; j < 32; j += 16) {
            __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[i].qs + j)));
            _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_cvtepi32_ps(v), vd));
        }
#elif defined(BP_CPU_HAVE_AVX2)
        const __m256 vd = _mm256_set1_ps(d);
        for (int j = 0; j < 32; j += 8) {
            __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_cvtepi32_ps(v), vd));
        }
#else
        for (int j = 0; j < 32; j++)
            y[j] = d * (float)b[i].qs[j];
#endif
    }
}

static void q4_0_row(const struct bp_block_q4_0 *b, float *y, int64_t n)
{
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const float d = bp_cpu_half_to_float(b[i].d);
#if defined(BP_CPU_HAVE_AVX512)
        const __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f)),
                                        _mm_set1_epi8(8));
        const __m512 vd = _mm512_set1_ps(d);
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), vd));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), vd));
#else
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
#endif
    }
}

#if defined(BP_CPU_HAVE_AVX2)
/* Q4_1, Q5_0, Q5_1 and IQ4_NL: each block unpacked to 32 bytes (cpu-unpack32.h), widened,
 * times the scale, plus the minimum where the type has one: the runtime's two roundings. */
static void blocks32_row(enum bp_type t, const void *w, float *y, int64_t n)
{
    const bool min = t == BP_TYPE_Q4_1 || t == BP_TYPE_Q5_1, sgn = !min;
    const size_t bs = bp_type_size(t);
    for (int64_t i = 0; i < n / 32; i++, y += 32) {
        const uint8_t *b = (const uint8_t *)w + (size_t)i * bs;
        uint16_t h[2]; /* every one of these blocks starts with d, then m where it has one */
        memcpy(h, b, sizeof(h));
        const float d = bp_cpu_half_to_float(h[0]), m = min ? bp_cpu_half_to_float(h[1]) : 0.0f;
        const __m256i q = unpack_block(t, w, i);
        const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
#if defined(BP_CPU_HAVE_AVX512)
        const __m512 vd = _mm512_set1_ps(d), vm = _mm512_set1_ps(m);
        const __m128i half[2] = {q0, q1};
        for (int j = 0; j < 2; j++) {
            const __m512i v = sgn ? _mm512_cvtepi8_epi32(half[j]) : _mm512_cvtepu8_epi32(half[j]);
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), vd);
            _mm512_storeu_ps(y + 16 * j, min ? _mm512_add_ps(f, vm) : f);
        }
#else
        const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
        const __m128i part[4] = {q0, _mm_srli_si128(q0, 8), q1, _mm_srli_si128(q1, 8)};
        for (int j = 0; j < 4; j++) {
            const __m256i v = sgn ? _mm256_cvtepi8_epi32(part[j]) : _mm256_cvtepu8_epi32(part[j]);
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), vd);
            _mm256_storeu_ps(y + 8 * j, min ? _mm256_add_ps(f, vm) : f);
        }
#endif
    }
}
#endif

#if defined(BP_CPU_HAVE_AVX2)
/* 16 bytes (signed or not) times d, minus m where sub: the runtime's roundings, one per
 * operation, in the same order. */
BP_CPU_INLINE void bytes16_row(__m128i v, bool sgn, float d, bool sub, float m, float *y)
{
#if defined(BP_CPU_HAVE_AVX512)
    const __m512i w = sgn ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(w), _mm512_set1_ps(d));
    _mm512_storeu_ps(y, sub ? _mm512_sub_ps(f, _mm512_set1_ps(m)) : f);
#else
    const __m128i part[2] = {v, _mm_srli_si128(v, 8)};
    for (int j = 0; j < 2; j++) {
        const __m256i w = sgn ? _mm256_cvtepi8_epi32(part[j]) : _mm256_cvtepu8_epi32(part[j]);
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(d));
        _mm256_storeu_ps(y + 8 * j, sub ? _mm256_sub_ps(f, _mm256_set1_ps(m)) : f);
    }
#endif
}

/* Q4_K: per 32 values, scale d * s and minimum dmin * m (6-bit s and m packed in 12 bytes: j < 4
 * the low 6 bits of bytes j and j + 4; j >= 4 the nibbles of byte j + 4 with the top 2 bits of
 * bytes j - 4 and j), each value d s q - dmin m, as the runtime rounds it. */
static void q4_k_row(const struct bp_block_q4_k *b, float *y, int64_t n)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < n / BP_QK_K; i++, y += BP_QK_K) {
        const float d = bp_cpu_half_to_float(b[i].d), dmin = bp_cpu_half_to_float(b[i].dmin);
        const uint8_t *sc = b[i].scales;
        for (int j = 0; j < 8; j++) {
            const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
            const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * (j / 2)));
            const __m256i v = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, lo4);
            const float dj = d * (float)s, mj = dmin * (float)m;
            bytes16_row(_mm256_castsi256_si128(v), false, dj, true, mj, y + 32 * j);
            bytes16_row(_mm256_extracti128_si256(v, 1), false, dj, true, mj, y + 32 * j + 16);
        }
    }
}

/* Q6_K: in each half of 128 values, value l of quarter u takes the low or high nibbles of ql
 * (bytes l or l + 32) and bits 2u, 2u + 1 of qh[l], minus 32, times d * scale (one per 16). */
static void q6_k_row(const struct bp_block_q6_k *b, float *y, int64_t n)
{
    const __m256i lo4 = _mm256_set1_epi8(0x0f), lo2 = _mm256_set1_epi8(0x03);
    for (int64_t i = 0; i < n / BP_QK_K; i++) {
        const float d = bp_cpu_half_to_float(b[i].d);
        for (int h = 0; h < 2; h++, y += 128) {
            const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const int8_t *sc = b[i].scales + 8 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            for (int u = 0; u < 4; u++) {
                const __m256i l = u % 2 ? l1 : l0;
                const __m256i nib = _mm256_and_si256(u >= 2 ? _mm256_srli_epi16(l, 4) : l, lo4);
                const __m256i top = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * u), lo2);
                const __m256i q = _mm256_sub_epi8(
                    _mm256_or_si256(nib, _mm256_slli_epi16(top, 4)), _mm256_set1_epi8(32));
                bytes16_row(_mm256_castsi256_si128(q), true, d * (float)sc[2 * u], false, 0.0f,
                            y + 32 * u);
                bytes16_row(_mm256_extracti128_si256(q, 1), true, d * (float)sc[2 * u + 1], false,
                            0.0f, y + 32 * u + 16);
            }
        }
    }
}
#endif

#if !defined(BP_CPU_HAVE_F16C)
float bp_cpu_half_table[65536];

void bp_cpu_half_table_init(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        bp_cpu_half_table[h] = bp_fp16_to_fp32((uint16_t)h);
}
#endif

void bp_cpu_to_float(enum bp_type type, const void *src, float *dst, int64_t n)
{
    switch (type) {
    case BP_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case BP_TYPE_F16:
        f16_row(src, dst, n);
        break;
    case BP_TYPE_BF16:
        bf16_row(src, dst, n);
        break;
    case BP_TYPE_Q8_0:
        q8_0_row(src, dst, n);
        break;
    case BP_TYPE_Q4_0:
        q4_0_row(src, dst, n);
        break;
#if defined(BP_CPU_HAVE_AVX2)
    case BP_TYPE_Q4_1:
    case BP_TYPE_Q5_0:
    case BP_TYPE_Q5_1:
    case BP_TYPE_IQ4_NL:
        blocks32_row(type, src, dst, n);
        break;
    case BP_TYPE_Q4_K:
        q4_k_row(src, dst, n);
        break;
    case BP_TYPE_Q6_K:
        q6_k_row(src, dst, n);
        break;
#endif
    default:
        bp_type_get_traits(type)->to_float(src, dst, n);
        break;
    }
}

bool bp_cpu_can_from_float(enum bp_type type)
{
    const struct bp_type_traits *tr = bp_type_get_traits(type);
    return tr != NULL && (!tr->is_quantized || tr->from_float != NULL);
}

void bp_cpu_from_float(enum bp_type type, const float *src, void *dst, int64_t n)
{
    if (type == BP_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    if (type != BP_TYPE_F16) {
        const bp_from_float_fn q = bp_type_get_traits(type)->from_float;
        if (q != NULL)
            q(src, dst, n);
        return;
    }
    uint16_t *h = dst;
    int64_t i = 0;
#if defined(BP_CPU_HAVE_F16C)
    /* Round to nearest even, like the runtime; a chunk with a NaN goes the runtime's way, so
     * NaN payloads come out the same too. */
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(src + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
            for (int j = 0; j < 8; j++)
                h[i + j] = bp_fp32_to_fp16(src[i + j]);
            continue;
        }
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++)
        h[i] = bp_fp32_to_fp16(src[i]);
}
