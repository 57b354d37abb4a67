/* cuda-compute.c - running a graph on a backend's stream: cuBLAS (or the matrix-vector kernel)
 * for MUL_MAT, the kernels of cuda-kernels.cu for the rest. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

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
        return e == 0 ? BP_OK : bp_cuda_fail((cudaError_t)e, who, "the MUL_MAT kernel");
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
                    return bp_cuda_fail((cudaError_t)e, who, "dequantising MUL_MAT weights");
                pa = cb->scratch;
                lda = K;
            }
            if (conv_b >= 0) {
                void *out = (char *)cb->scratch + a_bytes;
                int e = bp_cu_convert(out, conv_b, cu(b), i2, i3, s);
                if (e != 0)
                    return bp_cuda_fail((cudaError_t)e, who, "converting MUL_MAT activations");
                pb = out;
                ldb = K;
                tb = conv_b == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
            }
            cublasStatus_t bs = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N,
                                             (int)K, &one, pa, ta, (int)lda, pb, tb, (int)ldb,
                                             &zero, pc, CUDA_R_32F, (int)(d->nb[1] / 4),
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (bs != CUBLAS_STATUS_SUCCESS)
                return bp_cuda_blas_fail(bs, who, "cublasGemmEx");
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

enum bp_status bp_cuda_graph_compute(bp_backend *be, bp_graph *g)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e != cudaSuccess)
        return bp_cuda_fail(e, cb->cd->name, "cudaSetDevice");
    const int n = bp_graph_get_n_nodes(g);
    for (int i = 0; i < n; i++) {
        bp_tensor *node = bp_graph_get_node(g, i);
        char desc[BP_TENSOR_DESC_SIZE];
        if (!bp_cuda_supports(node))
            return bp_set_error(BP_ERR_UNSUPPORTED, "%s: %s node %s is not supported on this "
                                "device", cb->cd->name, bp_op_name(node->op),
                                bp_describe_tensor(node, desc, sizeof(desc)));
        enum bp_status st = compute_node(cb, node);
        if (st != BP_OK)
            return st;
    }
    return BP_OK;
}
