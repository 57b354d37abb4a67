/* bench-cuda.h - private to bench/: the CUDA parts of bench-matmul and bench-ops. */
#ifndef BP_BENCH_CUDA_H
#define BP_BENCH_CUDA_H

/* MUL_MAT with F32, F16 and BF16 weights (M x K) times N f32 columns on device, beside
 * cublasGemmEx on the same pointers. Prints a skip line and returns 0 without the device. */
int bench_cuda_matmul(const char *device, long M, long N, long K, double min_time);
/* ADD, SCALE and SILU over n floats on device, as bandwidth, beside cudaMemcpy. */
/* MUL_MAT of every quantised weight type at M x K x N (default 4096 x 4096 x 1), as a Markdown
 * table against Q4_0's time. */
int bench_cuda_matvec_quant(const char *device, long M, long N, long K, double min_time);
int bench_cuda_ops(const char *device, long n, double min_time);

#endif
