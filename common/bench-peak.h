/* bench-peak.h - private to common/: the ISA-specific inner loops behind bench_fma_peak and
 * bench_read, each in a file compiled for its instruction set (bench-peak-avx512.c with
 * -mavx512f, bench-peak-avx2.c with -mavx2 -mfma) and called only when the CPU has it. */
#ifndef BP_COMMON_BENCH_PEAK_H
#define BP_COMMON_BENCH_PEAK_H

#include <stddef.h>

/* iters rounds of 12 independent FMA chains; returns the floating-point operations done. */
double bench_fma_loop_avx512(long iters);
double bench_fma_loop_avx2(long iters);

/* Reads n bytes at p (64-byte aligned; a multiple of 256 for AVX-512, 128 for AVX2), passes
 * times, with the widest loads; returns a value that depends on every byte so that the loads
 * stay. */
double bench_read_loop_avx512(const void *p, size_t n, int passes);
double bench_read_loop_avx2(const void *p, size_t n, int passes);

#endif
