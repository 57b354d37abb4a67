/* bench-peak-avx512.c - private to bench/: a loop of independent AVX-512 FMAs (compiled with
 * -mavx512f; only called when the CPU has it). Returns the floating-point operations done. */
#include <immintrin.h>

double bench_fma_loop_avx512(long iters);

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

/* Reads n bytes (a multiple of 256) at p, passes times, with 512-bit loads; returns a value that
 * depends on every byte so that the loads stay. */
double bench_read_loop_avx512(const void *p, size_t n, int passes);

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
