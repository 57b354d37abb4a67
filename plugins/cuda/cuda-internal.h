/* cuda-internal.h - private to plugins/cuda/: what the C files of the CUDA plugin share (the
 * objects behind its handles, error helpers, and the entry points of each file). The interface
 * to the nvcc-compiled kernels is cuda-impl.h. */
#ifndef BP_CUDA_INTERNAL_H
#define BP_CUDA_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#ifdef BP_HAVE_NCCL
#include <nccl.h>
#endif

#include <backplane/bp-comm.h>
#include <backplane/bp-plugin.h>

#include "cuda-impl.h"

_Static_assert((int)CU_F32 == (int)BP_TYPE_F32 && (int)CU_F16 == (int)BP_TYPE_F16 &&
                   (int)CU_BF16 == (int)BP_TYPE_BF16 && (int)CU_I32 == (int)BP_TYPE_I32 &&
                   (int)CU_Q8_0 == (int)BP_TYPE_Q8_0 && (int)CU_Q4_0 == (int)BP_TYPE_Q4_0,
               "cuda-impl.h type codes follow enum bp_type");
_Static_assert((int)CU_NEG == (int)BP_UNARY_OP_NEG && (int)CU_SQRT == (int)BP_UNARY_OP_SQRT &&
                   (int)CU_SQRT + 1 == (int)BP_UNARY_OP_COUNT,
               "cuda-impl.h unary codes follow enum bp_unary_op");

#define CUDA_MAX_DEVICES 16
#define CUDA_ALIGNMENT 256
/* Products with at most this many columns run the matrix-vector kernel instead of cuBLAS. */
#define CUDA_MATVEC_MAX_N 4

struct cuda_device {
    int id;
    char name[16];
    char description[320];
    size_t total_memory;
    bp_device *dev;
    bp_buffer_type *buft;      /* device memory */
    bp_buffer_type *host_buft; /* pinned host memory */
};

struct cuda_registry {
    bp_registry *reg;
    int n;
    struct cuda_device devices[CUDA_MAX_DEVICES];
    char note[256]; /* why there are no devices, for the load report */
};

extern struct cuda_registry *bp_cuda_registry; /* one per process: the plugin is loaded once */

struct cuda_backend {
    struct cuda_device *cd;
    cudaStream_t stream;
    cublasHandle_t blas;
    int *err_host; /* mapped pinned flag the kernels set (CU_ERR_*), read after synchronising */
    int *err_dev;
    void *scratch; /* GEMM inputs converted to F16/BF16 */
    size_t scratch_size;
};

enum bp_status bp_cuda_fail(cudaError_t e, const char *who, const char *what);
enum bp_status bp_cuda_blas_fail(cublasStatus_t e, const char *who, const char *what);

static inline struct cuda_device *bp_cuda_device_of_buft(bp_buffer_type *buft)
{
    for (int i = 0; bp_cuda_registry != NULL && i < bp_cuda_registry->n; i++)
        if (bp_cuda_registry->devices[i].buft == buft)
            return &bp_cuda_registry->devices[i];
    return NULL;
}

static inline bool bp_cuda_is_tensor(const bp_tensor *t)
{
    return t->buffer != NULL && bp_cuda_device_of_buft(bp_buffer_get_type(t->buffer)) != NULL;
}

static inline bool contiguous(const bp_tensor *t)
{
    return bp_is_contiguous(t);
}

/* cuda-buffers.c: device memory and pinned host memory. */
extern const struct bp_buffer_type_iface bp_cuda_buft_iface;
extern const struct bp_buffer_type_iface bp_cuda_host_buft_iface;
/* A direct copy that failed in CUDA: logs why and clears CUDA's record; returns false. */
bool bp_cuda_copy_failed(cudaError_t e, const char *who, const char *what);

/* cuda-compute.c: which ops run here, and running a graph on a backend's stream. */
bool bp_cuda_float_type(enum bp_type t);
bool bp_cuda_supports(const bp_tensor *op);
enum bp_status bp_cuda_graph_compute(bp_backend *be, bp_graph *g);

/* cuda-plugin.c */
bool bp_cuda_is_backend(bp_backend *be);

#ifdef BP_HAVE_NCCL
/* cuda-comm.c: the bp_comm_* proc addresses over NCCL. */
bp_comm *bp_cuda_comm_init(bp_backend *const *backends, int n);
enum bp_status bp_cuda_comm_allreduce(bp_comm *c, bp_tensor *const *tensors, int n);
void bp_cuda_comm_free(bp_comm *c);
#endif

#endif
