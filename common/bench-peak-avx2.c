/* bench-peak-avx2.c - the AVX2 loops of bench-peak.h: independent FMAs and 256-bit loads
 * (compiled with -mavx2 -mfma; only called when the CPU has them). */
#include <immintrin.h>

#include "bench-peak.h"

double bench_fma_loop_avx2(long iters)
{
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    }
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, acc[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    volatile float sink = v[0];
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}

double bench_read_loop_avx2(const void *p, size_t n, int passes)
{
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (int r = 0; r < passes; r++) {
        const char *c = p;
        for (size_t i = 0; i < n; i += 128)
            for (int j = 0; j < 4; j++)
                acc[j] = _mm256_xor_si256(acc[j], _mm256_load_si256((const __m256i *)(c + i + 32 * j)));
    }
    const __m256i s = _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]),
                                       _mm256_xor_si256(acc[2], acc[3]));
    return (double)_mm256_extract_epi32(s, 0) + (double)_mm256_extract_epi32(s, 7);
}
