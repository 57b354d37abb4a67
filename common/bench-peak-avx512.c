/* bench-peak-avx512.c - the AVX-512 loops of bench-peak.h: independent FMAs and wide loads
 * (compiled with -mavx512f; only called when the CPU has it). */
#include <immintrin.h>

#include "bench-peak.h"

double bench_fma_loop_avx512(long iters)
{
    __m512 acc[12];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 16 * 2;
}

double bench_read_loop_avx512(const void *p, size_t n, int passes)
{
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int r = 0; r < passes; r++) {
        const char *c = p;
        for (size_t i = 0; i < n; i += 256)
            for (int j = 0; j < 4; j++)
                acc[j] = _mm512_xor_si512(acc[j], _mm512_load_si512(c + i + 64 * j));
    }
    const __m512i s = _mm512_xor_si512(_mm512_xor_si512(acc[0], acc[1]),
                                       _mm512_xor_si512(acc[2], acc[3]));
    return (double)_mm512_reduce_add_epi32(s);
}
