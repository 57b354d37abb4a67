/* cuda-plugin.c - the CUDA plugin: registry "CUDA", one device per GPU ("CUDA0", ...), device
 * and pinned host buffer types, backends with a stream and a cuBLAS handle each, events, and
 * NCCL collectives (bp_comm_*) when built with NCCL.
 *
 * Nothing here exits or aborts: every CUDA, cuBLAS and NCCL failure becomes a bp_status with the
 * library's own error string in bp_last_error(). A machine without a GPU or driver gives a
 * registry with no devices, and the reason is in the load report (bp_registry_note).
 *
 * Ordering: backend streams are ordinary (blocking) streams, so the synchronous buffer
 * functions, which use the legacy default stream, are ordered with every backend's work. */
#include "config.h"

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

static struct cuda_registry *the_cuda; /* one per process: the plugin is loaded once */

struct cuda_backend {
    struct cuda_device *cd;
    cudaStream_t stream;
    cublasHandle_t blas;
    int *err_host; /* mapped pinned flag the kernels set (CU_ERR_*), read after synchronising */
    int *err_dev;
    void *scratch; /* GEMM inputs converted to F16/BF16 */
    size_t scratch_size;
};

static enum bp_status cuda_fail(cudaError_t e, const char *who, const char *what)
{
    /* The error is reported here, at the call that failed: clear CUDA's record of it, or the
     * next kernel launch's check (cudaGetLastError) would blame itself for it. */
    (void)cudaGetLastError();
    return bp_set_error(e == cudaErrorMemoryAllocation ? BP_ERR_OUT_OF_MEMORY : BP_ERR_BACKEND,
                        "%s: %s failed: %s", who, what, cudaGetErrorString(e));
}

static enum bp_status blas_fail(cublasStatus_t e, const char *who, const char *what)
{
    return bp_set_error(e == CUBLAS_STATUS_ALLOC_FAILED ? BP_ERR_OUT_OF_MEMORY : BP_ERR_BACKEND,
                        "%s: %s failed: %s", who, what, cublasGetStatusString(e));
}

static struct cuda_device *device_of_buft(bp_buffer_type *buft)
{
    for (int i = 0; the_cuda != NULL && i < the_cuda->n; i++)
        if (the_cuda->devices[i].buft == buft)
            return &the_cuda->devices[i];
    return NULL;
}

static bool is_cuda_tensor(const bp_tensor *t)
{
    return t->buffer != NULL && device_of_buft(bp_buffer_get_type(t->buffer)) != NULL;
}

static bool contiguous(const bp_tensor *t)
{
    return bp_is_contiguous(t);
}

/* ---- Device buffers ------------------------------------------------------------------------ */

struct cuda_buf {
    struct cuda_device *cd;
    void *ptr;
};

static void cbuf_free(bp_buffer *buf)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaSetDevice(b->cd->id);
    cudaFree(b->ptr);
    free(b);
}

static void *cbuf_base(bp_buffer *buf)
{
    return ((struct cuda_buf *)bp_buffer_get_context(buf))->ptr;
}

static enum bp_status cbuf_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemset((char *)t->data + off, v, n);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, b->cd->name, "cudaMemset");
}

static enum bp_status cbuf_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy((char *)t->data + off, d, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, b->cd->name, "copy to the device");
}

static enum bp_status cbuf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy(d, (const char *)t->data + off, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, b->cd->name, "copy from the device");
}

static enum bp_status cbuf_set_2d(bp_buffer *buf, bp_tensor *t, const void *d, size_t off,
                                  size_t width, size_t rows, size_t t_stride, size_t d_stride)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy2D((char *)t->data + off, t_stride, d, d_stride, width, rows,
                         cudaMemcpyHostToDevice);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, b->cd->name, "2-D copy to the device");
}

static enum bp_status cbuf_get_2d(bp_buffer *buf, const bp_tensor *t, void *d, size_t off,
                                  size_t width, size_t rows, size_t t_stride, size_t d_stride)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy2D(d, d_stride, (const char *)t->data + off, t_stride, width, rows,
                         cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, b->cd->name, "2-D copy from the device");
}

/* Device to device (any of our GPUs, through unified addressing) or host to device. */
/* A direct copy that failed in CUDA (not one this path does not handle): the interface can
 * only answer "not done", after which the runtime copies through host memory and reports any
 * error there; so the CUDA message is logged here, where it happened, and CUDA's record of it
 * cleared, so that it is not blamed on a later call. */
static bool copy_failed(cudaError_t e, const char *who, const char *what)
{
    bp_log(BP_LOG_WARN, "%s: %s failed: %s; copying through host memory instead", who, what,
           cudaGetErrorString(e));
    (void)cudaGetLastError();
    return false;
}

static bool cbuf_cpy(bp_buffer *buf, const bp_tensor *src, bp_tensor *dst)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    if (!contiguous(src) || !contiguous(dst) || src->buffer == NULL ||
        (!is_cuda_tensor(src) && !bp_buffer_is_host(src->buffer)))
        return false;
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy(dst->data, src->data, bp_nbytes(src), cudaMemcpyDefault);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? true : copy_failed(e, b->cd->name, "a direct copy");
}

static enum bp_status cbuf_clear(bp_buffer *buf, uint8_t v)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemset(b->ptr, v, bp_buffer_get_size(buf));
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, b->cd->name, "cudaMemset");
}

static const struct bp_buffer_iface cuda_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = cbuf_free,
    .get_base = cbuf_base,
    .memset_tensor = cbuf_memset,
    .set_tensor = cbuf_set,
    .get_tensor = cbuf_get,
    .cpy_tensor = cbuf_cpy,
    .clear = cbuf_clear,
    .set_tensor_2d = cbuf_set_2d,
    .get_tensor_2d = cbuf_get_2d,
};

static const char *cbuft_name(bp_buffer_type *buft)
{
    return ((struct cuda_device *)bp_buffer_type_get_context(buft))->name;
}

static bp_buffer *cbuft_alloc(bp_buffer_type *buft, size_t size)
{
    struct cuda_device *cd = bp_buffer_type_get_context(buft);
    struct cuda_buf *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", cd->name);
        return NULL;
    }
    b->cd = cd;
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->ptr, size > 0 ? size : 1); /* a real address even for empty buffers */
    if (e != cudaSuccess) {
        free(b);
        bp_set_error(e == cudaErrorMemoryAllocation ? BP_ERR_OUT_OF_MEMORY : BP_ERR_BACKEND,
                     "%s: cannot allocate %zu bytes of device memory: %s", cd->name, size,
                     cudaGetErrorString(e));
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &cuda_buffer_iface, b, size);
    if (buf == NULL) {
        cudaFree(b->ptr);
        free(b);
    }
    return buf;
}

static size_t cbuft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return CUDA_ALIGNMENT;
}

static size_t cbuft_max_size(bp_buffer_type *buft)
{
    return ((struct cuda_device *)bp_buffer_type_get_context(buft))->total_memory;
}

static const struct bp_buffer_type_iface cuda_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = cbuft_name,
    .alloc_buffer = cbuft_alloc,
    .get_alignment = cbuft_alignment,
    .get_max_size = cbuft_max_size,
};

/* ---- Pinned host buffers ------------------------------------------------------------------- */

struct host_buf {
    void *ptr;
    size_t size;
};

static void hbuf_free(bp_buffer *buf)
{
    struct host_buf *h = bp_buffer_get_context(buf);
    cudaFreeHost(h->ptr);
    free(h);
}

static void *hbuf_base(bp_buffer *buf)
{
    return ((struct host_buf *)bp_buffer_get_context(buf))->ptr;
}

static enum bp_status hbuf_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    (void)buf;
    memset((char *)t->data + off, v, n);
    return BP_OK;
}

static enum bp_status hbuf_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    (void)buf;
    memcpy((char *)t->data + off, d, n);
    return BP_OK;
}

static enum bp_status hbuf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    (void)buf;
    memcpy(d, (const char *)t->data + off, n);
    return BP_OK;
}

static enum bp_status hbuf_clear(bp_buffer *buf, uint8_t v)
{
    struct host_buf *h = bp_buffer_get_context(buf);
    memset(h->ptr, v, h->size);
    return BP_OK;
}

static const struct bp_buffer_iface host_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = hbuf_free,
    .get_base = hbuf_base,
    .memset_tensor = hbuf_memset,
    .set_tensor = hbuf_set,
    .get_tensor = hbuf_get,
    .clear = hbuf_clear,
};

static const char *hbuft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "CUDA_Host";
}

static bp_buffer *hbuft_alloc(bp_buffer_type *buft, size_t size)
{
    struct host_buf *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA_Host: out of memory");
        return NULL;
    }
    h->size = size;
    cudaError_t e = cudaMallocHost(&h->ptr, size > 0 ? size : 1);
    if (e != cudaSuccess) {
        free(h);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA_Host: cannot allocate %zu bytes of pinned "
                     "host memory: %s", size, cudaGetErrorString(e));
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &host_buffer_iface, h, size);
    if (buf == NULL) {
        cudaFreeHost(h->ptr);
        free(h);
    }
    return buf;
}

static size_t hbuft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return 64;
}

static bool hbuft_is_host(bp_buffer_type *buft)
{
    (void)buft;
    return true;
}

static const struct bp_buffer_type_iface host_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = hbuft_name,
    .alloc_buffer = hbuft_alloc,
    .get_alignment = hbuft_alignment,
    .is_host = hbuft_is_host,
};

/* ---- Op support ------------------------------------------------------------------------------ */

static bool float_type(enum bp_type t)
{
    return t == BP_TYPE_F32 || t == BP_TYPE_F16 || t == BP_TYPE_BF16;
}

static bool quant_type(enum bp_type t)
{
    return t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0;
}

/* Rows stored as whole contiguous blocks (how the quantised kernels address them). */
static bool rows_of_blocks(const bp_tensor *t)
{
    return t->nb[0] == bp_type_size(t->type);
}

/* DUP, CONT and CPY (the node is the destination): between float types in any layout, I32 to
 * I32, from a quantised source with whole-block rows, and into a quantised destination with
 * whole-block rows. */
static bool copy_supported(const bp_tensor *dst, const bp_tensor *src)
{
    if (dst->type == BP_TYPE_I32 || src->type == BP_TYPE_I32)
        return dst->type == src->type;
    const bool src_ok = float_type(src->type) || (quant_type(src->type) && rows_of_blocks(src));
    const bool dst_ok = float_type(dst->type) || (quant_type(dst->type) && rows_of_blocks(dst));
    return src_ok && dst_ok;
}

/* Exactly what graph_compute below implements. */
static bool cuda_supports(const bp_tensor *op)
{
    const bp_tensor *a = op->src[0], *b = op->src[1];
    switch (op->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true;
    case BP_OP_DUP:
    case BP_OP_CONT:
    case BP_OP_CPY:
        return copy_supported(op, a);
    case BP_OP_GET_ROWS:
        return float_type(op->type) && b->type == BP_TYPE_I32 &&
               (float_type(a->type) ||
                (quant_type(a->type) && a->nb[0] == bp_type_size(a->type)));
    case BP_OP_SET_ROWS:
        return (float_type(op->type) || (quant_type(op->type) && rows_of_blocks(op))) &&
               float_type(b->type) && op->src[2]->type == BP_TYPE_I32;
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
    case BP_OP_CONCAT:
        return float_type(op->type) && float_type(a->type) && float_type(b->type);
    case BP_OP_SCALE:
    case BP_OP_UNARY:
    case BP_OP_SUM_ROWS:
    case BP_OP_MEAN:
    case BP_OP_NORM:
    case BP_OP_RMS_NORM:
        return float_type(op->type) && float_type(a->type);
    case BP_OP_ARGMAX:
        return float_type(a->type);
    case BP_OP_SOFT_MAX:
        return float_type(op->type) && float_type(a->type) && (b == NULL || float_type(b->type));
    case BP_OP_GLU:
        return float_type(op->type) && float_type(a->type) && (b == NULL || float_type(b->type));
    case BP_OP_ROPE: {
        const int n_dims = bp_get_op_param_i32(op, 0), mode = bp_get_op_param_i32(op, 1);
        return float_type(op->type) && float_type(a->type) && b->type == BP_TYPE_I32 &&
               n_dims > 0 && n_dims % 2 == 0 && n_dims <= a->ne[0] &&
               (mode == BP_ROPE_NORMAL || mode == BP_ROPE_NEOX);
    }
    case BP_OP_MUL_MAT:
        return op->type == BP_TYPE_F32 && b->type == BP_TYPE_F32 &&
               (float_type(a->type) || quant_type(a->type)) &&
               a->nb[0] == bp_type_size(a->type);
    default:
        return false;
    }
}

/* ---- Backend: graph compute ------------------------------------------------------------------ */

static struct cu_t cu(const bp_tensor *t)
{
    struct cu_t c = {.data = t->data, .type = (int)t->type};
    for (int i = 0; i < 4; i++) {
        c.ne[i] = t->ne[i];
        c.nb[i] = (int64_t)t->nb[i];
    }
    return c;
}

static enum bp_status scratch_reserve(struct cuda_backend *cb, size_t size)
{
    if (size <= cb->scratch_size)
        return BP_OK;
    /* cudaFree waits for the work still using the old scratch. */
    if (cb->scratch != NULL)
        cudaFree(cb->scratch);
    cb->scratch = NULL;
    cb->scratch_size = 0;
    cudaError_t e = cudaMalloc(&cb->scratch, size);
    if (e != cudaSuccess)
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scratch "
                            "memory for MUL_MAT: %s", cb->cd->name, size, cudaGetErrorString(e));
    cb->scratch_size = size;
    return BP_OK;
}

/* Rows contiguous and the row stride a whole number of elements: what cuBLAS can read. */
static bool gemm_layout(const bp_tensor *t, size_t elsize)
{
    return t->nb[0] == elsize && t->nb[1] % elsize == 0;
}

static enum bp_status mul_mat(struct cuda_backend *cb, bp_tensor *d)
{
    const bp_tensor *a = d->src[0], *b = d->src[1];
    const int64_t M = d->ne[0], N = d->ne[1], K = a->ne[0];
    cudaStream_t s = cb->stream;
    const char *who = cb->cd->name;
    if (M == 0 || N == 0)
        return BP_OK;
    const bool dense_out = gemm_layout(d, 4) && gemm_layout(b, 4);
    if (N <= CUDA_MATVEC_MAX_N || K == 0 || !dense_out) {
        int e = bp_cu_matvec(cu(d), cu(a), cu(b), s);
        return e == 0 ? BP_OK : cuda_fail((cudaError_t)e, who, "the MUL_MAT kernel");
    }
    /* cuBLAS (column-major): C[M x N] = A^T B with A stored as K x M (ld = row stride of the
     * weights), B as K x N, C as M x N. F32 weights multiply as they are; F16/BF16 weights
     * meet B converted to their type (tensor cores, f32 accumulation); Q8_0/Q4_0 weights are
     * dequantised to F16 first. */
    cudaDataType_t ta = CUDA_R_32F;
    int conv_a = -1, conv_b = -1;
    size_t need = 0;
    if (a->type == BP_TYPE_F32 && gemm_layout(a, 4)) {
        ta = CUDA_R_32F;
    } else if (a->type == BP_TYPE_F16 && gemm_layout(a, 2)) {
        ta = CUDA_R_16F;
        conv_b = CU_F16;
    } else if (a->type == BP_TYPE_BF16 && gemm_layout(a, 2)) {
        ta = CUDA_R_16BF;
        conv_b = CU_BF16;
    } else {
        ta = a->type == BP_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        conv_a = a->type == BP_TYPE_BF16 ? CU_BF16 : CU_F16;
        conv_b = conv_a;
        need += (size_t)(M * K) * 2;
    }
    const size_t a_bytes = need;
    if (conv_b >= 0)
        need += (size_t)(K * N) * 2;
    enum bp_status st = scratch_reserve(cb, need);
    if (st != BP_OK)
        return st;
    const float one = 1.0f, zero = 0.0f;
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < d->ne[2]; i2++) {
            const void *pa = (const char *)a->data + (i2 / r2) * (int64_t)a->nb[2] +
                             (i3 / r3) * (int64_t)a->nb[3];
            const void *pb = (const char *)b->data + i2 * (int64_t)b->nb[2] + i3 * (int64_t)b->nb[3];
            void *pc = (char *)d->data + i2 * (int64_t)d->nb[2] + i3 * (int64_t)d->nb[3];
            int64_t lda = (int64_t)(a->nb[1] / bp_type_size(a->type));
            int64_t ldb = (int64_t)(b->nb[1] / 4);
            cudaDataType_t tb = CUDA_R_32F;
            if (conv_a >= 0) {
                int e = bp_cu_convert(cb->scratch, conv_a, cu(a), i2 / r2, i3 / r3, s);
                if (e != 0)
                    return cuda_fail((cudaError_t)e, who, "dequantising MUL_MAT weights");
                pa = cb->scratch;
                lda = K;
            }
            if (conv_b >= 0) {
                void *out = (char *)cb->scratch + a_bytes;
                int e = bp_cu_convert(out, conv_b, cu(b), i2, i3, s);
                if (e != 0)
                    return cuda_fail((cudaError_t)e, who, "converting MUL_MAT activations");
                pb = out;
                ldb = K;
                tb = conv_b == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
            }
            cublasStatus_t bs = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N,
                                             (int)K, &one, pa, ta, (int)lda, pb, tb, (int)ldb,
                                             &zero, pc, CUDA_R_32F, (int)(d->nb[1] / 4),
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (bs != CUBLAS_STATUS_SUCCESS)
                return blas_fail(bs, who, "cublasGemmEx");
        }
    }
    return BP_OK;
}

static enum bp_status compute_node(struct cuda_backend *cb, bp_tensor *n)
{
    cudaStream_t s = cb->stream;
    const bp_tensor *a = n->src[0], *b = n->src[1];
    int e = 0;
    char desc[BP_TENSOR_DESC_SIZE];
    switch (n->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return BP_OK;
    case BP_OP_DUP:
    case BP_OP_CONT:
        e = bp_cu_copy(cu(n), cu(a), s);
        break;
    case BP_OP_CPY: /* the node is the destination (b's memory) */
        e = bp_cu_copy(cu(n), cu(a), s);
        break;
    case BP_OP_GET_ROWS:
        e = bp_cu_get_rows(cu(n), cu(a), cu(b), cb->err_dev, s);
        break;
    case BP_OP_SET_ROWS:
        e = bp_cu_set_rows(cu(n), cu(b), cu(n->src[2]), cb->err_dev, s);
        break;
    case BP_OP_ADD:
        e = bp_cu_binary(CU_ADD, cu(n), cu(a), cu(b), s);
        break;
    case BP_OP_SUB:
        e = bp_cu_binary(CU_SUB, cu(n), cu(a), cu(b), s);
        break;
    case BP_OP_MUL:
        e = bp_cu_binary(CU_MUL, cu(n), cu(a), cu(b), s);
        break;
    case BP_OP_DIV:
        e = bp_cu_binary(CU_DIV, cu(n), cu(a), cu(b), s);
        break;
    case BP_OP_SCALE:
        e = bp_cu_unary(CU_SCALE, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        break;
    case BP_OP_UNARY:
        e = bp_cu_unary(bp_get_op_param_i32(n, 0), 0.0f, cu(n), cu(a), s);
        break;
    case BP_OP_SUM_ROWS:
        e = bp_cu_sum_rows(0, cu(n), cu(a), s);
        break;
    case BP_OP_MEAN:
        e = bp_cu_sum_rows(1, cu(n), cu(a), s);
        break;
    case BP_OP_ARGMAX:
        e = bp_cu_argmax(cu(n), cu(a), s);
        break;
    case BP_OP_NORM:
        e = bp_cu_norm(0, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        break;
    case BP_OP_RMS_NORM:
        e = bp_cu_norm(1, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        break;
    case BP_OP_SOFT_MAX: {
        struct cu_t m = b ? cu(b) : cu(a);
        e = bp_cu_soft_max(bp_get_op_param_f32(n, 0), cu(n), cu(a), b ? &m : NULL, s);
        break;
    }
    case BP_OP_ROPE:
        e = bp_cu_rope(cu(n), cu(a), cu(b), bp_get_op_param_i32(n, 0), bp_get_op_param_i32(n, 1),
                       bp_get_op_param_f32(n, 2), bp_get_op_param_f32(n, 3), s);
        break;
    case BP_OP_CONCAT:
        e = bp_cu_concat(cu(n), cu(a), cu(b), bp_get_op_param_i32(n, 0), s);
        break;
    case BP_OP_GLU: {
        struct cu_t ub = b ? cu(b) : cu(a);
        e = bp_cu_glu(bp_get_glu_op(n) == BP_GLU_OP_SWIGLU, cu(n), cu(a), b ? &ub : NULL, s);
        break;
    }
    case BP_OP_MUL_MAT:
        return mul_mat(cb, n);
    default:
        return bp_set_error(BP_ERR_UNSUPPORTED, "%s: no kernel for %s node %s", cb->cd->name,
                            bp_op_name(n->op), bp_describe_tensor(n, desc, sizeof(desc)));
    }
    if (e != 0)
        return bp_set_error(BP_ERR_BACKEND, "%s: launching %s node %s failed: %s", cb->cd->name,
                            bp_op_name(n->op), bp_describe_tensor(n, desc, sizeof(desc)),
                            cudaGetErrorString((cudaError_t)e));
    return BP_OK;
}

static enum bp_status cbe_compute(bp_backend *be, bp_graph *g)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e != cudaSuccess)
        return cuda_fail(e, cb->cd->name, "cudaSetDevice");
    const int n = bp_graph_get_n_nodes(g);
    for (int i = 0; i < n; i++) {
        bp_tensor *node = bp_graph_get_node(g, i);
        char desc[BP_TENSOR_DESC_SIZE];
        if (!cuda_supports(node))
            return bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s node %s is not supported on this "
                                "device", cb->cd->name, bp_op_name(node->op),
                                bp_describe_tensor(node, desc, sizeof(desc)));
        enum bp_status st = compute_node(cb, node);
        if (st != BP_OK)
            return st;
    }
    return BP_OK;
}

/* ---- Backend: the rest ----------------------------------------------------------------------- */

static const char *cbe_name(bp_backend *be)
{
    return ((struct cuda_backend *)bp_backend_get_context(be))->cd->name;
}

static enum bp_status cbe_sync(bp_backend *be)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cb->stream);
    if (e != cudaSuccess)
        return cuda_fail(e, cb->cd->name, "synchronising the stream");
    const int flag = *(volatile int *)cb->err_host;
    if (flag != CU_ERR_NONE) {
        *(volatile int *)cb->err_host = CU_ERR_NONE;
        return bp_set_error(BP_ERR_OUT_OF_BOUNDS, "%s: a GET_ROWS or SET_ROWS row id was out of "
                            "range (those rows were left as zero or not written)", cb->cd->name);
    }
    return BP_OK;
}

static void cbe_free(bp_backend *be)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaSetDevice(cb->cd->id);
    cudaStreamSynchronize(cb->stream);
    cublasDestroy(cb->blas);
    cudaStreamDestroy(cb->stream);
    cudaFree(cb->scratch);
    cudaFreeHost(cb->err_host);
    free(cb);
}

static enum bp_status cbe_set_async(bp_backend *be, bp_tensor *t, const void *d, size_t off,
                                    size_t n)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync((char *)t->data + off, d, n, cudaMemcpyHostToDevice, cb->stream);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, cb->cd->name, "asynchronous copy to the device");
}

static enum bp_status cbe_get_async(bp_backend *be, const bp_tensor *t, void *d, size_t off,
                                    size_t n)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d, (const char *)t->data + off, n, cudaMemcpyDeviceToHost, cb->stream);
    return e == cudaSuccess ? BP_OK
                            : cuda_fail(e, cb->cd->name, "asynchronous copy from the device");
}

static const struct bp_backend_iface cuda_backend_iface;

static bool is_cuda_backend(bp_backend *be)
{
    return the_cuda != NULL && bp_device_get_registry(bp_backend_get_device(be)) == the_cuda->reg;
}

/* Device to device between two of our backends: dst's stream waits for src's, then copies. */
static bool cbe_cpy_async(bp_backend *src_be, bp_backend *dst_be, const bp_tensor *src,
                          bp_tensor *dst)
{
    if (!is_cuda_backend(src_be) || !is_cuda_backend(dst_be) || !is_cuda_tensor(src) ||
        !is_cuda_tensor(dst) || !contiguous(src) || !contiguous(dst))
        return false;
    struct cuda_backend *sb = bp_backend_get_context(src_be), *db = bp_backend_get_context(dst_be);
    cudaEvent_t ev;
    cudaError_t e = cudaSetDevice(sb->cd->id);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return copy_failed(e, db->cd->name, "a queued copy");
    e = cudaEventRecord(ev, sb->stream);
    if (e == cudaSuccess)
        e = cudaSetDevice(db->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(db->stream, ev, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst->data, src->data, bp_nbytes(src), cudaMemcpyDefault, db->stream);
    cudaEventDestroy(ev); /* destroyed once the work recorded in it completes */
    return e == cudaSuccess ? true : copy_failed(e, db->cd->name, "a queued copy");
}

static enum bp_status cbe_event_record(bp_backend *be, void *event)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaEventRecord((cudaEvent_t)event, cb->stream);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, cb->cd->name, "cudaEventRecord");
}

static enum bp_status cbe_event_wait(bp_backend *be, void *event)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(cb->stream, (cudaEvent_t)event, 0);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, cb->cd->name, "cudaStreamWaitEvent");
}

static const struct bp_backend_iface cuda_backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = cbe_name,
    .free = cbe_free,
    .set_tensor_async = cbe_set_async,
    .get_tensor_async = cbe_get_async,
    .cpy_tensor_async = cbe_cpy_async,
    .synchronize = cbe_sync,
    .graph_compute = cbe_compute,
    .event_record = cbe_event_record,
    .event_wait = cbe_event_wait,
};

/* ---- Device ------------------------------------------------------------------------------------ */

static const char *cdev_name(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->name;
}

static const char *cdev_desc(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->description;
}

static void cdev_memory(bp_device *dev, size_t *f, size_t *t)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    size_t fr = 0, tot = cd->total_memory;
    if (cudaSetDevice(cd->id) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        fr = 0;
        tot = cd->total_memory;
    }
    *f = fr;
    *t = tot;
}

static enum bp_device_type cdev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_GPU;
}

static void cdev_caps(bp_device *dev, struct bp_device_caps *caps)
{
    (void)dev;
    caps->async = true;
    caps->host_buffer = true;
    caps->buffer_from_host_ptr = false;
    caps->events = true;
}

static bp_backend *cdev_init_backend(bp_device *dev, const char *params)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    if (params != NULL && params[0] != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, "%s: unknown backend parameters '%s' (the CUDA backend "
                     "takes none)", cd->name, params);
        return NULL;
    }
    struct cuda_backend *cb = calloc(1, sizeof(*cb));
    if (cb == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", cd->name);
        return NULL;
    }
    cb->cd = cd;
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaStreamCreate(&cb->stream);
    if (e != cudaSuccess) {
        cuda_fail(e, cd->name, "creating a stream");
        free(cb);
        return NULL;
    }
    e = cudaHostAlloc((void **)&cb->err_host, sizeof(int), cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer((void **)&cb->err_dev, cb->err_host, 0);
    if (e != cudaSuccess) {
        cuda_fail(e, cd->name, "allocating the error flag");
        if (cb->err_host != NULL)
            cudaFreeHost(cb->err_host);
        cudaStreamDestroy(cb->stream);
        free(cb);
        return NULL;
    }
    *cb->err_host = CU_ERR_NONE;
    cublasStatus_t bs = cublasCreate(&cb->blas);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(cb->blas, cb->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        blas_fail(bs, cd->name, "creating the cuBLAS handle");
        if (cb->blas != NULL)
            cublasDestroy(cb->blas);
        cudaFreeHost(cb->err_host);
        cudaStreamDestroy(cb->stream);
        free(cb);
        return NULL;
    }
    bp_backend *be = bp_backend_new(dev, &cuda_backend_iface, cb);
    if (be == NULL) {
        cublasDestroy(cb->blas);
        cudaFreeHost(cb->err_host);
        cudaStreamDestroy(cb->stream);
        free(cb);
    }
    return be;
}

static bp_buffer_type *cdev_buft(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->buft;
}

static bp_buffer_type *cdev_host_buft(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->host_buft;
}

static bool cdev_supports_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    return cuda_supports(op);
}

static bool cdev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    return buft == ((struct cuda_device *)bp_device_get_context(dev))->buft;
}

static void *cdev_event_new(bp_device *dev)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    cudaEvent_t ev;
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        cuda_fail(e, cd->name, "cudaEventCreate");
        return NULL;
    }
    return ev;
}

static void cdev_event_free(bp_device *dev, void *event)
{
    (void)dev;
    cudaEventDestroy((cudaEvent_t)event);
}

static enum bp_status cdev_event_sync(bp_device *dev, void *event)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);
    return e == cudaSuccess ? BP_OK : cuda_fail(e, cd->name, "cudaEventSynchronize");
}

static const struct bp_device_iface cuda_device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = cdev_name,
    .get_description = cdev_desc,
    .get_memory = cdev_memory,
    .get_type = cdev_type,
    .get_caps = cdev_caps,
    .init_backend = cdev_init_backend,
    .get_buffer_type = cdev_buft,
    .get_host_buffer_type = cdev_host_buft,
    .supports_op = cdev_supports_op,
    .supports_buft = cdev_supports_buft,
    .event_new = cdev_event_new,
    .event_free = cdev_event_free,
    .event_synchronize = cdev_event_sync,
};

/* ---- Collectives (NCCL) ------------------------------------------------------------------------ */

#ifdef BP_HAVE_NCCL
struct bp_comm {
    int n;
    ncclComm_t comms[CUDA_MAX_DEVICES];
    struct cuda_backend *backends[CUDA_MAX_DEVICES];
};

static bp_comm *cuda_comm_init(bp_backend *const *backends, int n)
{
    if (n < 1 || n > CUDA_MAX_DEVICES) {
        bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init takes 1 to %d backends, not %d",
                     CUDA_MAX_DEVICES, n);
        return NULL;
    }
    int devs[CUDA_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        if (backends[i] == NULL || !is_cuda_backend(backends[i])) {
            bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init: backend %d is not a CUDA "
                         "backend", i);
            return NULL;
        }
        devs[i] = ((struct cuda_backend *)bp_backend_get_context(backends[i]))->cd->id;
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i]) {
                bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init: GPU %d appears twice; NCCL "
                             "needs one backend per GPU", devs[i]);
                return NULL;
            }
    }
    bp_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA: out of memory");
        return NULL;
    }
    c->n = n;
    for (int i = 0; i < n; i++)
        c->backends[i] = bp_backend_get_context(backends[i]);
    ncclResult_t r = ncclCommInitAll(c->comms, n, devs);
    if (r != ncclSuccess) {
        bp_set_error(BP_ERR_BACKEND, "CUDA: ncclCommInitAll over %d GPUs failed: %s", n,
                     ncclGetErrorString(r));
        free(c);
        return NULL;
    }
    return c;
}

/* Sums tensors[i] (on backend i) in place, queued on each backend's stream as one NCCL group. */
static enum bp_status cuda_comm_allreduce(bp_comm *c, bp_tensor *const *tensors, int n)
{
    if (c == NULL || n != c->n)
        return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_allreduce: %d tensors for a "
                            "communicator of %d", n, c ? c->n : 0);
    ncclDataType_t type = ncclFloat32;
    char desc[BP_TENSOR_DESC_SIZE];
    for (int i = 0; i < n; i++) {
        const bp_tensor *t = tensors[i];
        if (!contiguous(t) || !is_cuda_tensor(t) || !float_type(t->type) ||
            bp_nelements(t) != bp_nelements(tensors[0]) || t->type != tensors[0]->type)
            return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_allreduce: %s must be a "
                                "contiguous F32/F16/BF16 tensor in GPU memory, like the others",
                                bp_describe_tensor(t, desc, sizeof(desc)));
    }
    type = tensors[0]->type == BP_TYPE_F16 ? ncclFloat16
         : tensors[0]->type == BP_TYPE_BF16 ? ncclBfloat16 : ncclFloat32;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        cudaError_t e = cudaSetDevice(c->backends[i]->cd->id);
        if (e != cudaSuccess) {
            (void)ncclGroupEnd();
            return cuda_fail(e, c->backends[i]->cd->name, "cudaSetDevice for the all-reduce");
        }
        r = ncclAllReduce(tensors[i]->data, tensors[i]->data, (size_t)bp_nelements(tensors[i]),
                          type, ncclSum, c->comms[i], c->backends[i]->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    return r == ncclSuccess ? BP_OK
                            : bp_set_error(BP_ERR_BACKEND, "CUDA: ncclAllReduce failed: %s",
                                           ncclGetErrorString(r));
}

static void cuda_comm_free(bp_comm *c)
{
    if (c == NULL)
        return;
    /* An all-reduce may still be queued on the backends' streams: let it finish before its
     * communicators go. Errors cannot be returned from here; they are logged. */
    for (int i = 0; i < c->n; i++) {
        cudaError_t e = cudaSetDevice(c->backends[i]->cd->id);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(c->backends[i]->stream);
        if (e != cudaSuccess) {
            bp_log(BP_LOG_WARN, "CUDA: %s: waiting for the stream before freeing its "
                   "communicator failed: %s", c->backends[i]->cd->name, cudaGetErrorString(e));
            (void)cudaGetLastError();
        }
        ncclCommDestroy(c->comms[i]);
    }
    free(c);
}
#endif

/* ---- Registry ---------------------------------------------------------------------------------- */

static const char *creg_name(bp_registry *reg)
{
    (void)reg;
    return "CUDA";
}

static size_t creg_count(bp_registry *reg)
{
    (void)reg;
    return (size_t)the_cuda->n;
}

static bp_device *creg_device(bp_registry *reg, size_t i)
{
    (void)reg;
    return the_cuda->devices[i].dev;
}

static const char *cuda_note(void)
{
    return the_cuda != NULL ? the_cuda->note : "";
}

static void *creg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    if (strcmp(name, "bp_registry_note") == 0)
        return (void *)cuda_note;
#ifdef BP_HAVE_NCCL
    if (strcmp(name, "bp_comm_init") == 0)
        return (void *)cuda_comm_init;
    if (strcmp(name, "bp_comm_allreduce") == 0)
        return (void *)cuda_comm_allreduce;
    if (strcmp(name, "bp_comm_free") == 0)
        return (void *)cuda_comm_free;
#endif
    return NULL;
}

static void creg_free(bp_registry *reg)
{
    (void)reg;
    free(the_cuda);
    the_cuda = NULL;
}

static const struct bp_registry_iface cuda_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = creg_name,
    .get_device_count = creg_count,
    .get_device = creg_device,
    .get_proc_address = creg_proc,
    .free = creg_free,
};

static bp_registry *cuda_plugin_init(void)
{
    if (the_cuda != NULL) {
        bp_set_error(BP_ERR_BUSY, "CUDA: the plugin is already initialised");
        return NULL;
    }
    struct cuda_registry *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA: out of memory");
        return NULL;
    }
    /* The driver API, not cudart: the runtime starts with the first backend or buffer. */
    struct bp_cuda_gpu gpus[CUDA_MAX_DEVICES];
    const int count = bp_cuda_enumerate(gpus, CUDA_MAX_DEVICES, c->note, sizeof(c->note));
    for (int i = 0; i < count; i++) {
        struct cuda_device *d = &c->devices[c->n];
        d->id = gpus[i].ordinal;
        d->total_memory = gpus[i].total_memory;
        snprintf(d->name, sizeof(d->name), "CUDA%d", gpus[i].ordinal);
        snprintf(d->description, sizeof(d->description), "%.255s (compute capability %d.%d, %.1f GiB)",
                 gpus[i].name, gpus[i].major, gpus[i].minor,
                 (double)gpus[i].total_memory / (1 << 30));
        c->n++;
    }
    the_cuda = c;
    c->reg = bp_registry_new(&cuda_registry_iface, c);
    if (c->reg == NULL) {
        free(c);
        the_cuda = NULL;
        return NULL;
    }
    for (int i = 0; i < c->n; i++) {
        struct cuda_device *d = &c->devices[i];
        d->dev = bp_device_new(c->reg, &cuda_device_iface, d);
        if (d->dev != NULL)
            d->buft = bp_buffer_type_new(d->dev, &cuda_buft_iface, d);
        if (d->buft != NULL)
            d->host_buft = bp_buffer_type_new(d->dev, &host_buft_iface, d);
        if (d->host_buft == NULL) {
            bp_registry_free(c->reg); /* frees c through creg_free */
            return NULL;
        }
    }
    if (c->n == 0)
        bp_log(BP_LOG_INFO, "CUDA plugin: %s", c->note);
    return c->reg;
}

BP_PLUGIN_DEFINE("cuda", "", 0, cuda_plugin_init, NULL);
