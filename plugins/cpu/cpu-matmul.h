/* cpu-matmul.h - private to plugins/cpu/: what the MUL_MAT driver (cpu-matmul.c) and its
 * kernels (cpu-gemm.c, cpu-gemv*.c) share.
 *
 * Each strategy has a *_work_size, the scratch it needs per thread and shared by all threads,
 * and a *_batch that computes one batch (2-D slice) of MUL_MAT node dst: abase, bbase and cbase
 * are the slice's first bytes in src[0], src[1] and dst. Every thread of the pool calls *_batch
 * with its own p (p->wdata, p->wshared sized by *_work_size); the kernels meet at barriers of
 * their own, so all threads must call the same one. */
#ifndef BP_CPU_MATMUL_H
#define BP_CPU_MATMUL_H

#include <string.h>

#include "cpu-impl.h"

/* ---- Packed GEMM and broadcast kernel (cpu-gemm.c) ------------------------------------------ */

/* Edge tiles of the packed GEMMs (cpu-gemm.c, cpu-gemm-bf16.c): a micro-kernel always writes a
 * full mr_full x nr_full tile, so a ragged one (mr rows, nc columns of C at c, column stride
 * ldc) is computed into edge (column stride mr_full) and copied back. In: the part of C the
 * tile accumulates onto (only when accumulate); out: the valid part. */
BP_CPU_INLINE void bp_cpu_edge_in(float *edge, int64_t mr_full, const float *c, int64_t ldc,
                                  int64_t mr, int64_t nc, bool accumulate)
{
    for (int64_t j = 0; j < nc && accumulate; j++)
        memcpy(edge + j * mr_full, c + j * ldc, (size_t)mr * sizeof(float));
}

BP_CPU_INLINE void bp_cpu_edge_out(float *c, int64_t ldc, const float *edge, int64_t mr_full,
                                   int64_t mr, int64_t nc)
{
    for (int64_t j = 0; j < nc; j++)
        memcpy(c + j * ldc, edge + j * mr_full, (size_t)mr * sizeof(float));
}

void bp_cpu_gemm_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
void bp_cpu_gemm_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                       const struct bp_cpu_params *p);

#if defined(BP_CPU_HAVE_AVX2)
void bp_cpu_bcast_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
void bp_cpu_bcast_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p);
#endif

#if defined(BP_CPU_HAVE_AVX512)
/* BF16 weights under BP_MM_PRECISION_HALF on a processor with AVX512_BF16 (cpu-gemm-bf16.c):
 * whether dst qualifies, and the kernel. */
bool bp_cpu_gemm_bf16_use(const bp_tensor *dst);
void bp_cpu_gemm_bf16_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
void bp_cpu_gemm_bf16_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                            const struct bp_cpu_params *p);
/* The same permission for few columns (N up to 48, any N >= 1): dot-product tiles on A's rows
 * in place. */
bool bp_cpu_dot_bf16_use(const bp_tensor *dst);
void bp_cpu_dot_bf16_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
void bp_cpu_dot_bf16_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                           const struct bp_cpu_params *p);
#endif

#if defined(BP_CPU_HAVE_AVX512_VNNI)
/* Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K to Q6_K and IQ4_XS weights from 16 columns (repacked ones from
 * 128):
 * integer dot products of unpacked 16-row strips with B quantised to Q8_0 (cpu-gemm-int8.c). */
bool bp_cpu_gemm_int8_use(const bp_tensor *dst);
void bp_cpu_gemm_int8_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
void bp_cpu_gemm_int8_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                            const struct bp_cpu_params *p);
#endif

/* ---- Matrix-vector products (cpu-gemv.c) ---------------------------------------------------- */

/* One size for all the batches below. */
void bp_cpu_gemv_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
/* F32, F16 and BF16 weights. */
void bp_cpu_gemv_float_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                             const struct bp_cpu_params *p);
/* Q8_0 and Q4_0 weights. */
void bp_cpu_gemv_quant_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                             const struct bp_cpu_params *p);
/* Repacked Q8_0 and Q4_0 weights (a 2-D tensor: no abase): cpu-repack.c's kernel. Builds
 * without one repack nothing (cpu-repack.c, repacked_type). */
#if defined(BP_CPU_REPACK_KERNEL)
void bp_cpu_gemv_repack_batch(bp_tensor *dst, const char *bbase, char *cbase,
                              const struct bp_cpu_params *p);
#endif

/* ---- Weight types with a bp_cpu_qtype entry (cpu-qtypes.c): Q4_1, Q5_0, Q5_1, IQ4_NL and the
 * super-block types, any N: B quantised to the type's activation type, then dot products. ---- */
void bp_cpu_qtype_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
void bp_cpu_qtype_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p);

/* ---- Kernels per instruction set (cpu-gemv-avx2.c, cpu-gemv-avx512.c) ----------------------- */

/* out[c] = row xrow of Q8_0/Q4_0 weights (nb blocks) . column y[c] (Q8_0), for nc (1-4)
 * columns: cpu-gemv-avx2.c in vector builds, cpu-gemv.c otherwise. */
void bp_cpu_dot_q8_cols(enum bp_type type, const void *xrow, const struct bp_block_q8_0 *const y[4],
                        int nc, int64_t nb, float out[4]);

#if defined(BP_CPU_HAVE_AVX512_VNNI)
/* out[c * 8 + i] = row i of the eight at row0 (lda bytes apart; 7 * lda must fit 32 bits) .
 * column y[c], for nc (1-4) columns; ysum[c]: the sums of column c's block quants.
 * prefetch_next: the eight rows after these are read next (short rows ask for them early). */
void bp_cpu_dot_q8_rows8(enum bp_type type, int nc, const char *row0, int64_t lda,
                         const struct bp_block_q8_0 *const y[4], const int32_t *const ysum[4],
                         int64_t nb, bool prefetch_next, float *out);
#endif

#if defined(BP_CPU_HAVE_AVX2)
/* The sum of v's eight floats. */
BP_CPU_INLINE float bp_cpu_hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#endif
