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
