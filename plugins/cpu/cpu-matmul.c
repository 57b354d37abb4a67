/* cpu-matmul.c - MUL_MAT on the CPU: dst[m, n] = sum_k a[k, m] * b[k, n]. This file is the
 * driver: it says which shapes and types there are kernels for, picks a strategy per node and
 * runs it over the node's batches.
 *
 * The strategy depends on N (the number of activation columns), the weights' type and layout,
 * and what this build variant may use; pick_strategy() below is the one place that decides:
 *
 *   AMX           tile kernels (cpu-amx.c), avx512 build, when the CPU and kernel allow and
 *                 the weights have enough columns for their type (bp_cpu_amx_use)
 *   DOT_BF16      N <= 48, BF16 weights under BP_MM_PRECISION_HALF, avx512 build on a CPU
 *                 with AVX512_BF16: activations rounded to BF16, vdpbf16ps dot-product tiles
 *                 on the weights' rows in place (cpu-gemm-bf16.c)
 *   GEMM_BF16     N > 48 otherwise: the same rounding, packed and blocked (cpu-gemm-bf16.c)
 *   BCAST         16 <= N <= 48, AVX2/AVX-512 builds: B packed, A read in place (cpu-gemm.c)
 *   GEMM          N >= 16 otherwise: the packed, blocked GEMM (cpu-gemm.c)
 *   GEMV_FLOAT    N < 16, F32/F16/BF16 weights: dot-product tiles (cpu-gemv.c)
 *   GEMV_QUANT    N < 16, Q8_0/Q4_0 weights: integer dot products against B quantised to Q8_0
 *   GEMV_REPACK   weights in the CPU_REPACK layout (cpu-repack.c), any N without AMX: that
 *                 file's kernel (only builds that have one repack anything)
 *
 * Every thread calls bp_cpu_mul_mat for every node and must take the same strategy, since the
 * kernels meet at barriers; pick_strategy depends on the node alone. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"

#define BP_CPU_GEMM_MIN_N 16 /* below this, dot-product tiles (no packing) */
#define BCAST_MAX_N 48       /* up to this, the broadcast kernel where there is one */

/* The strategies this build has (see the top of the file). */
enum mm_strategy {
#if defined(BP_CPU_HAVE_AMX)
    MM_AMX,
#endif
#if defined(BP_CPU_HAVE_AVX512)
    MM_GEMM_BF16,
    MM_DOT_BF16,
#endif
#if defined(BP_CPU_HAVE_AVX2)
    MM_BCAST,
#endif
    MM_GEMM,
    MM_GEMV_FLOAT,
    MM_GEMV_QUANT,
#if defined(BP_CPU_REPACK_KERNEL)
    MM_GEMV_REPACK,
#endif
};

static bool quantized(enum bp_type t)
{
    return t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0;
}

/* The strategy for node dst: the same answer for every thread, every batch and the work size.
 * Repacked weights take neither the GEMM nor the broadcast kernel: they have their own kernel, or
 * AMX (builds without such a kernel repack nothing). */
static enum mm_strategy pick_strategy(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0];
    const int64_t N = dst->ne[1];
    const bool repacked = bp_cpu_repacked_base(a) != NULL;
#if defined(BP_CPU_HAVE_AMX)
    if (bp_cpu_amx_use(dst))
        return MM_AMX;
#endif
#if defined(BP_CPU_HAVE_AVX512)
    if (bp_cpu_dot_bf16_use(dst))
        return MM_DOT_BF16;
#endif
    if (N >= BP_CPU_GEMM_MIN_N && !repacked) {
#if defined(BP_CPU_HAVE_AVX512)
        if (bp_cpu_gemm_bf16_use(dst))
            return MM_GEMM_BF16;
#endif
#if defined(BP_CPU_HAVE_AVX2)
        if (N <= BCAST_MAX_N)
            return MM_BCAST;
#endif
        return MM_GEMM;
    }
    if (!quantized(a->type))
        return MM_GEMV_FLOAT;
    if (!repacked)
        return MM_GEMV_QUANT;
#if defined(BP_CPU_REPACK_KERNEL)
    return MM_GEMV_REPACK;
#else
    return MM_GEMV_QUANT; /* unreachable: such builds repack nothing */
#endif
}

bool bp_cpu_mul_mat_supported(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    /* Rows of A and B contiguous along K, and C contiguous along M. */
    return a->type != BP_TYPE_I32 && b->type == BP_TYPE_F32 && dst->type == BP_TYPE_F32 &&
           a->nb[0] == bp_type_size(a->type) && b->nb[0] == sizeof(float) &&
           dst->nb[0] == sizeof(float);
}

void bp_cpu_mul_mat_work_size(const bp_tensor *dst, int nth, size_t *per_thread, size_t *shared)
{
    (void)nth;
    switch (pick_strategy(dst)) {
#if defined(BP_CPU_HAVE_AMX)
    case MM_AMX:
        bp_cpu_amx_work_size(dst, per_thread, shared);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX512)
    case MM_GEMM_BF16:
        bp_cpu_gemm_bf16_work_size(dst, per_thread, shared);
        break;
    case MM_DOT_BF16:
        bp_cpu_dot_bf16_work_size(dst, per_thread, shared);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX2)
    case MM_BCAST:
        bp_cpu_bcast_work_size(dst, per_thread, shared);
        break;
#endif
    case MM_GEMM:
        bp_cpu_gemm_work_size(dst, per_thread, shared);
        break;
    default: /* the matrix-vector strategies */
        bp_cpu_gemv_work_size(dst, per_thread, shared);
        break;
    }
}

/* One batch of dst with strategy s. */
static void run_batch(enum mm_strategy s, bp_tensor *dst, const char *abase, const char *bbase,
                      char *cbase, const struct bp_cpu_params *p)
{
    switch (s) {
#if defined(BP_CPU_HAVE_AMX)
    case MM_AMX:
        bp_cpu_amx_mul_mat(dst, abase, bbase, cbase, p);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX512)
    case MM_GEMM_BF16:
        bp_cpu_gemm_bf16_batch(dst, abase, bbase, cbase, p);
        break;
    case MM_DOT_BF16:
        bp_cpu_dot_bf16_batch(dst, abase, bbase, cbase, p);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX2)
    case MM_BCAST:
        bp_cpu_bcast_batch(dst, abase, bbase, cbase, p);
        break;
#endif
    case MM_GEMM:
        bp_cpu_gemm_batch(dst, abase, bbase, cbase, p);
        break;
    case MM_GEMV_FLOAT:
        bp_cpu_gemv_float_batch(dst, abase, bbase, cbase, p);
        break;
    case MM_GEMV_QUANT:
        bp_cpu_gemv_quant_batch(dst, abase, bbase, cbase, p);
        break;
#if defined(BP_CPU_REPACK_KERNEL)
    case MM_GEMV_REPACK:
        bp_cpu_gemv_repack_batch(dst, bbase, cbase, p);
        break;
#endif
    }
}

void bp_cpu_mul_mat(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const enum mm_strategy s = pick_strategy(dst);

    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++) {
            const char *abase = (const char *)a->data + (i2 / r2) * (int64_t)a->nb[2] +
                                (i3 / r3) * (int64_t)a->nb[3];
            const char *bbase = (const char *)b->data + i2 * (int64_t)b->nb[2] +
                                i3 * (int64_t)b->nb[3];
            char *cbase = (char *)dst->data + i2 * (int64_t)dst->nb[2] + i3 * (int64_t)dst->nb[3];
            if (M == 0 || N == 0)
                continue;
            if (a->ne[0] == 0) { /* empty sums: every kernel assumes some K */
                int64_t n0, n1;
                bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
                for (int64_t n = n0; n < n1; n++)
                    memset(cbase + n * (int64_t)dst->nb[1], 0, (size_t)M * sizeof(float));
                continue;
            }
            run_batch(s, dst, abase, bbase, cbase, p);
        }
    }
}
