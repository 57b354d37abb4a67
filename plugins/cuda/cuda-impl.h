/* cuda-impl.h - private to plugins/cuda: what the C side (cuda-plugin.c) and the kernels
 * (cuda-kernels.cu, compiled by nvcc as C++) share. Plain C types only, so that both compilers
 * read it the same way. Every launcher queues its work on the given stream and returns the
 * cudaError_t of the launch (0 when queued). */
#ifndef BP_CUDA_IMPL_H
#define BP_CUDA_IMPL_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Type codes, equal to enum bp_type (checked in cuda-internal.h). The quantised weight types
 * are decoded in cuda-quants.cuh. */
enum { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2, CU_I32 = 3, CU_Q8_0 = 4, CU_Q4_0 = 5, CU_Q4_1 = 6,
       CU_Q5_0 = 7, CU_Q5_1 = 8, CU_Q2_K = 10, CU_Q3_K = 11, CU_Q4_K = 12, CU_Q5_K = 13,
       CU_Q6_K = 14, CU_IQ4_NL = 16, CU_IQ4_XS = 17 };

/* A tensor as the kernels see it: device address, type, shape and byte strides. */
struct cu_t {
    char *data;
    int type;
    int64_t ne[4];
    int64_t nb[4];
};

/* Ops the launchers take, in the runtime's terms. */
enum { CU_ADD, CU_SUB, CU_MUL, CU_DIV };
/* Unary codes are enum bp_unary_op; CU_SCALE multiplies by the parameter. */
enum { CU_NEG, CU_ABS, CU_RELU, CU_GELU, CU_SILU, CU_SIGMOID, CU_TANH, CU_EXP, CU_SQR, CU_SQRT,
       CU_GELU_ERF, CU_CLAMP = 99,
       CU_SCALE = 100 };

/* Error codes the kernels leave in the backend's device flag (read at synchronisation). */
enum { CU_ERR_NONE = 0, CU_ERR_ROW_ID = 1 };

int bp_cu_binary(int op, struct cu_t d, struct cu_t a, struct cu_t b, cudaStream_t s);
int bp_cu_unary(int op, float param, struct cu_t d, struct cu_t a, cudaStream_t s);
/* The same with two parameters (CU_CLAMP: lo, hi). */
int bp_cu_unary2(int op, float p, float q, struct cu_t d, struct cu_t a, cudaStream_t s);
/* d and a have the same number of elements, walked in logical order (i0 fastest). */
int bp_cu_copy(struct cu_t d, struct cu_t a, cudaStream_t s);
/* Row-wise ops, one block per row of a (d may be a's memory): SUM_ROWS or, with mean set,
 * MEAN; ARGMAX; NORM or, with rms set, RMS_NORM; SOFT_MAX, whose mask may be NULL. */
int bp_cu_sum_rows(int mean, struct cu_t d, struct cu_t a, cudaStream_t s);
int bp_cu_argmax(struct cu_t d, struct cu_t a, cudaStream_t s);
/* ARGSORT (d as long as a's rows) and TOP_K (d shorter: the first d.ne[0] of the descending
 * order); rows of at most BP_CUDA_SORT_MAX values. */
#define BP_CUDA_SORT_MAX 8192
int bp_cu_sort_rows(int desc, struct cu_t d, struct cu_t a, cudaStream_t s);
/* mode 0 NORM, 1 RMS_NORM, 2 L2_NORM. */
int bp_cu_norm(int mode, float eps, struct cu_t d, struct cu_t a, cudaStream_t s);
int bp_cu_soft_max(float scale, struct cu_t d, struct cu_t a, const struct cu_t *mask,
                   const struct cu_t *sinks,
                   cudaStream_t s);
/* YaRN's parameters of a ROPE node (op_params 4..7): ext 0 and mag 1 without it. */
struct cu_yarn {
    float ext, mag, lo, hi;
};
int bp_cu_rope(struct cu_t d, struct cu_t x, struct cu_t pos, int n_dims, int mode,
               float freq_base, float freq_scale, struct cu_yarn y, cudaStream_t s);
int bp_cu_get_rows(struct cu_t d, struct cu_t a, struct cu_t ids, int *err, cudaStream_t s);
int bp_cu_set_rows(struct cu_t d, struct cu_t src, struct cu_t ids, int *err, cudaStream_t s);
int bp_cu_concat(struct cu_t d, struct cu_t a, struct cu_t b, int dim, cudaStream_t s);
/* FLASH_ATTN_EXT: d [Dv, H, T, B] from q, k, v and mask (NULL: none); D and Dv at most
 * BP_CUDA_ATTN_MAX_D. */
#define BP_CUDA_ATTN_MAX_D 256
int bp_cu_flash_attn(struct cu_t d, struct cu_t q, struct cu_t k, struct cu_t v,
                     const struct cu_t *mask, float scale, float softcap, int causal,
                     cudaStream_t s);
/* b may be NULL: then a holds gate and up side by side along dimension 0. */
int bp_cu_glu(int glu_op, struct cu_t d, struct cu_t a, const struct cu_t *b, cudaStream_t s);
/* dst = a^T b for few columns of b: one warp per row of a, any weight type (F32, F16, BF16 and
 * every quantised type of cuda-quants.cuh), batches broadcast like MUL_MAT. */
int bp_cu_matvec(struct cu_t d, struct cu_t a, struct cu_t b, cudaStream_t s);
/* Every row of a (any type; all ne[1] * ne[2] * ne[3] rows in order) converted to a dense
 * row-major matrix of type out_type (CU_F32, CU_F16 or CU_BF16) with ne[0] elements per row:
 * the GEMM inputs. */
int bp_cu_convert(void *out, int out_type, struct cu_t a, cudaStream_t s);
/* The same rows split into two dense BF16 matrices, hi = bf16(x) and lo = bf16(x - hi): 16
 * significant bits for tensor-core GEMMs that must not round the values to 8 (lo is 0 where hi
 * is not finite). fin, unless NULL, receives hi with every non-finite value replaced by 0: the
 * partner of the other operand's lo in a cross term, so that lo = 0 never meets an infinity
 * (0 * inf would turn an infinite product into NaN). */
int bp_cu_split_bf16(void *hi, void *lo, void *fin, struct cu_t a, cudaStream_t s);

/* A GPU as the driver API describes it (cuda-driver.c). */
struct bp_cuda_gpu {
    int ordinal;
    char name[256];
    size_t total_memory;
    int major, minor; /* compute capability */
};

/* Up to max GPUs, found through the driver API loaded with dlopen, without starting the CUDA
 * runtime; 0 with the reason in why when there are none (no driver, no GPU, cuInit failed). */
int bp_cuda_enumerate(struct bp_cuda_gpu *out, int max, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif
