/* cuda-internal.h - private to plugins/cuda/: what the C files of the CUDA plugin share (the
 * objects behind its handles, error helpers, and the entry points of each file). The interface
 * to the nvcc-compiled kernels is cuda-impl.h.
 *
 * The plugin is two shared objects. backplane-cuda.so (cuda-plugin.c, cuda-ops.c,
 * cuda-driver.c) is what the loader loads: registry, devices, buffer types and op support,
 * found through the driver API, linking no CUDA library. libbackplane-cuda-impl.so (cuda-backend.c,
 * cuda-buffers.c, cuda-compute.c, cuda-comm.c, the kernels) links cudart, cuBLAS and NCCL and is
 * loaded from beside the plugin the first time a backend, buffer, event or communicator is made
 * (struct bp_cuda_impl below). So a process that only discovers devices never maps the CUDA
 * libraries, which cost about 220 MB and 0.1 s to load. */
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
_Static_assert((int)CU_Q4_1 == (int)BP_TYPE_Q4_1 && (int)CU_Q5_0 == (int)BP_TYPE_Q5_0 &&
                   (int)CU_Q5_1 == (int)BP_TYPE_Q5_1 && (int)CU_Q2_K == (int)BP_TYPE_Q2_K &&
                   (int)CU_Q3_K == (int)BP_TYPE_Q3_K && (int)CU_Q4_K == (int)BP_TYPE_Q4_K &&
                   (int)CU_Q5_K == (int)BP_TYPE_Q5_K && (int)CU_Q6_K == (int)BP_TYPE_Q6_K &&
                   (int)CU_IQ4_NL == (int)BP_TYPE_IQ4_NL && (int)CU_IQ4_XS == (int)BP_TYPE_IQ4_XS,
               "cuda-impl.h codes of the quantised weight types follow enum bp_type");
_Static_assert((int)CU_NEG == (int)BP_UNARY_OP_NEG && (int)CU_SQRT == (int)BP_UNARY_OP_SQRT &&
                   (int)CU_GELU_ERF == (int)BP_UNARY_OP_GELU_ERF &&
                   (int)CU_GELU_ERF + 1 == (int)BP_UNARY_OP_COUNT,
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

struct bp_cuda_impl;

struct cuda_registry {
    bp_registry *reg;
    int n;
    struct cuda_device devices[CUDA_MAX_DEVICES];
    char note[256];   /* why there are no devices, for the load report */
    char *dir;        /* the plugin's directory, where the implementation library lies */
    void *impl_lib;   /* the implementation library's handle, once loaded */
    const struct bp_cuda_impl *impl;
};

/* One per process (the plugin is loaded once), in each of the two objects: the plugin's, and the
 * implementation library's copy of the same pointer, set by its open function. */
extern struct cuda_registry *bp_cuda_registry;

struct cuda_backend {
    struct cuda_device *cd;
    cudaStream_t stream;
    cublasHandle_t blas;
    int *err_host; /* mapped pinned flag the kernels set (CU_ERR_*), read after synchronising */
    int *err_dev;
    void *scratch; /* GEMM inputs converted to F16/BF16 */
    size_t scratch_size;
    /* MUL_MAT_ID: the ids and the pair lists on the host, the lists, gathered activations and
     * products on the device */
    void *moe_host;
    size_t moe_host_size;
    void *moe_dev;
    size_t moe_dev_size;
};

/* ---- Between the plugin and its implementation library ---------------------------------- */

#define BP_CUDA_IMPL_FILE "libbackplane-cuda-impl.so"
#define BP_CUDA_IMPL_OPEN "bp_cuda_impl_open"
/* Raised whenever struct bp_cuda_impl or struct cuda_registry/cuda_device change. */
#define BP_CUDA_IMPL_ABI 3

/* What the implementation library does for the plugin. The layout is the same in every build
 * (a plugin built with NCCL may meet a library built without it, or the other way round); every
 * member is set except the comm members, which are NULL in a library built without NCCL. */
struct bp_cuda_impl {
    /* The plugin's registry is going away: the library forgets it. */
    void (*close)(void);
    bp_backend *(*init_backend)(bp_device *dev, struct cuda_device *cd);
    /* Free and total bytes; BP_OK or the CUDA error. */
    enum bp_status (*get_memory)(struct cuda_device *cd, size_t *free, size_t *total);
    bp_buffer *(*alloc_buffer)(bp_buffer_type *buft, struct cuda_device *cd, size_t size);
    bp_buffer *(*alloc_host_buffer)(bp_buffer_type *buft, size_t size);
    void *(*event_new)(struct cuda_device *cd);
    void (*event_free)(void *event);
    enum bp_status (*event_synchronize)(struct cuda_device *cd, void *event);
    bp_comm *(*comm_init)(bp_backend *const *backends, int n);
    enum bp_status (*comm_allreduce)(bp_comm *c, bp_tensor *const *tensors, int n);
    void (*comm_free)(bp_comm *c);
    enum bp_status (*comm_unique_id)(void *id, size_t *size);
    bp_comm *(*comm_init_rank)(const void *id, size_t size, bp_backend *const *backends, int n);
};

/* The one symbol the implementation library exports: its table for this registry, or NULL
 * after bp_set_error when abi is not its own (a stale file beside a newer plugin). */
typedef const struct bp_cuda_impl *(*bp_cuda_impl_open_fn)(int abi, struct cuda_registry *reg);

/* cuda-plugin.c: the implementation, loaded on first use; NULL after bp_set_error naming who. */
const struct bp_cuda_impl *bp_cuda_impl_get(const char *who);

/* ---- Implementation library --------------------------------------------------------------- */

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
bp_buffer *bp_cuda_alloc_buffer(bp_buffer_type *buft, struct cuda_device *cd, size_t size);
bp_buffer *bp_cuda_alloc_host_buffer(bp_buffer_type *buft, size_t size);
/* A direct copy that failed in CUDA: records the error (bp_cuda_fail); returns false, which
 * after an error means "failed" to the runtime, not "cannot". */
bool bp_cuda_copy_failed(cudaError_t e, const char *who, const char *what);

/* cuda-ops.c (in both objects): which ops run here. */
bool bp_cuda_float_type(enum bp_type t);
bool bp_cuda_supports(const bp_tensor *op);

/* cuda-compute.c: running a graph on a backend's stream. */
enum bp_status bp_cuda_graph_compute(bp_backend *be, bp_graph *g);

/* cuda-backend.c */
bool bp_cuda_is_backend(bp_backend *be);

#ifdef BP_HAVE_NCCL
/* cuda-comm.c: the bp_comm_* proc addresses over NCCL. */
bp_comm *bp_cuda_comm_init(bp_backend *const *backends, int n);
enum bp_status bp_cuda_comm_allreduce(bp_comm *c, bp_tensor *const *tensors, int n);
void bp_cuda_comm_free(bp_comm *c);
enum bp_status bp_cuda_comm_unique_id(void *id, size_t *size);
bp_comm *bp_cuda_comm_init_rank(const void *id, size_t size, bp_backend *const *backends, int n);
#endif

#endif
