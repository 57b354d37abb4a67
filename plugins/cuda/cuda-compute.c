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
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* reported here, not blamed on the next launch */
        cb->scratch = NULL;
        return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scratch "
                            "memory for MUL_MAT: %s", cb->cd->name, size, cudaGetErrorString(e));
    }
    cb->scratch_size = size;
    return BP_OK;
}

/* ---- MUL_MAT through cuBLAS ----------------------------------------------------------------
 * The precision contract (docs/decisions.md, "Precision of MUL_MAT"), the same on every device:
 * products with F32, F16 and BF16 weights keep single precision in the activations; they are
 * never rounded to 16 bits. So:
 *  - F32 weights: one f32 GEMM (no TF32).
 *  - BF16 weights: the activations are split into two BF16 matrices, hi = bf16(x) and
 *    lo = bf16(x - hi), and two tensor-core GEMMs accumulate W hi + W lo in f32 (16 significant
 *    bits of x instead of 8: NMSE about 1e-11 against a double reference).
 *  - F16 and quantised weights: the weights are split the same way (exact for F16; 16 bits of
 *    the dequantised value for the quantised types), and three GEMMs accumulate
 *    Whi xhi + Whi xlo + Wlo xhi.
 *    The last term takes xhi with non-finite values set to 0: Wlo is 0 for most weights, and
 *    0 * inf would make the product of an infinite activation NaN instead of infinite.
 * Batches are strided-batched GEMMs, weights broadcast over batches with a zero stride, and every
 * converted operand is made once per node, each at a 256-byte aligned offset of the scratch. */

/* One operand of the GEMMs: base address, element type, leading dimension and the element
 * strides between its dimension-2 and dimension-3 slices. */
struct operand {
    const char *data;
    cudaDataType_t type;
    int64_t elsize;
    int64_t ld, s2, s3;
};

/* The tensor itself, when cuBLAS can read it in place: rows contiguous and every stride a whole
 * number of elements. */
static bool in_place(const bp_tensor *t, int64_t elsize)
{
    return (int64_t)t->nb[0] == elsize && t->nb[1] % elsize == 0 && t->nb[2] % elsize == 0 &&
           t->nb[3] % elsize == 0;
}

static struct operand operand_of(const bp_tensor *t, cudaDataType_t type, int64_t elsize)
{
    return (struct operand){(const char *)t->data, type, elsize, (int64_t)t->nb[1] / elsize,
                            (int64_t)t->nb[2] / elsize, (int64_t)t->nb[3] / elsize};
}

/* A dense copy in scratch: rows of ne[0] elements, slices one after another. */
static struct operand dense_operand(const bp_tensor *t, void *mem, cudaDataType_t type,
                                    int64_t elsize)
{
    const int64_t slice = t->ne[0] * t->ne[1];
    return (struct operand){mem, type, elsize, t->ne[0], slice, slice * t->ne[2]};
}

static size_t align_up(size_t n)
{
    return (n + CUDA_ALIGNMENT - 1) / CUDA_ALIGNMENT * CUDA_ALIGNMENT;
}

/* C (+)= A^T B over every batch of d, broadcasting A like MUL_MAT: strided-batched GEMMs, one
 * per dimension-3 index and, where A is broadcast over groups of dimension-2 slices, one per
 * group. */
static enum bp_status gemm_batches(struct cuda_backend *cb, bp_tensor *d, const bp_tensor *a,
                                   const struct operand *A, const struct operand *B, float beta)
{
    const int64_t M = d->ne[0], N = d->ne[1], K = a->ne[0];
    const int64_t na2 = a->ne[2], nd2 = d->ne[2];
    const int64_t r2 = nd2 / na2, r3 = d->ne[3] / a->ne[3];
    const int64_t ldc = (int64_t)d->nb[1] / 4, c2 = (int64_t)d->nb[2] / 4, c3 = (int64_t)d->nb[3] / 4;
    const float one = 1.0f;
    /* One call over all of dimension 2 when A steps with it or is shared by all of it;
     * otherwise one call per slice of A, over the r2 slices of B and C it serves. */
    const bool whole = r2 == 1 || na2 == 1;
    const int64_t calls = whole ? 1 : na2, batch = whole ? nd2 : r2;
    const int64_t sa = r2 == 1 ? A->s2 : 0;
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++) {
        for (int64_t j = 0; j < calls; j++) {
            const char *pa = A->data + ((i3 / r3) * A->s3 + (whole ? 0 : j * A->s2)) * A->elsize;
            const int64_t i2 = whole ? 0 : j * r2;
            const char *pb = B->data + (i3 * B->s3 + i2 * B->s2) * B->elsize;
            char *pc = (char *)d->data + (i3 * c3 + i2 * c2) * 4;
            cublasStatus_t st = cublasGemmStridedBatchedEx(
                cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N, (int)K, &one, pa, A->type,
                (int)A->ld, sa, pb, B->type, (int)B->ld, B->s2, &beta, pc, CUDA_R_32F, (int)ldc,
                c2, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS)
                return bp_cuda_blas_fail(st, cb->cd->name, "cublasGemmStridedBatchedEx");
        }
    }
    return BP_OK;
}

/* cuBLAS takes int sizes and leading dimensions. */
static bool fits_int(const bp_tensor *d, const bp_tensor *a, const bp_tensor *b)
{
    const int64_t lim = 0x7fffffff;
    return d->ne[0] <= lim && d->ne[1] <= lim && a->ne[0] <= lim && d->ne[2] <= lim &&
           (int64_t)(a->nb[1] / 2) <= lim && (int64_t)(b->nb[1] / 2) <= lim &&
           (int64_t)(d->nb[1] / 4) <= lim;
}

static enum bp_status mul_mat(struct cuda_backend *cb, bp_tensor *d)
{
    const bp_tensor *a = d->src[0], *b = d->src[1];
    const int64_t M = d->ne[0], N = d->ne[1], K = a->ne[0];
    cudaStream_t s = cb->stream;
    const char *who = cb->cd->name;
    if (M == 0 || N == 0)
        return BP_OK;
    if (N <= CUDA_MATVEC_MAX_N || K == 0 || !in_place(d, 4) || !fits_int(d, a, b)) {
        int e = bp_cu_matvec(cu(d), cu(a), cu(b), s);
        return e == 0 ? BP_OK : bp_cuda_fail((cudaError_t)e, who, "the MUL_MAT kernel");
    }
    const bool f32 = a->type == BP_TYPE_F32, bf16 = a->type == BP_TYPE_BF16;
    const bool split_a = !f32 && !bf16;
    const bool a_here = f32 ? in_place(a, 4) : bf16 ? in_place(a, 2) : false;
    const bool b_here = f32 && in_place(b, 4);
    const int64_t ea = f32 ? 4 : 2, eb = f32 ? 4 : 2;
    const size_t a_bytes = a_here ? 0 : align_up((size_t)bp_nelements(a) * (size_t)ea);
    const size_t b_bytes = b_here ? 0 : align_up((size_t)bp_nelements(b) * (size_t)eb);
    /* scratch: [A (hi)] [A lo] [B (hi)] [B lo] [B hi, finite values only] */
    const size_t need = a_bytes * (split_a ? 2 : 1) + b_bytes * (f32 ? 1 : split_a ? 3 : 2);
    enum bp_status st = scratch_reserve(cb, need);
    if (st != BP_OK)
        return st;
    char *mem = cb->scratch;
    char *a_hi = mem, *a_lo = a_hi + a_bytes;
    char *b_hi = a_lo + (split_a ? a_bytes : 0), *b_lo = b_hi + b_bytes, *b_fin = b_lo + b_bytes;
    const cudaDataType_t t16 = CUDA_R_16BF, t32 = CUDA_R_32F;
    struct operand A = {0}, Alo = {0}, B = {0}, Blo = {0}, Bfin = {0};
    int e = 0;
    if (a_here) {
        A = operand_of(a, f32 ? t32 : t16, ea);
    } else if (split_a) {
        A = dense_operand(a, a_hi, t16, 2);
        Alo = dense_operand(a, a_lo, t16, 2);
        e = bp_cu_split_bf16(a_hi, a_lo, NULL, cu(a), s);
    } else {
        A = dense_operand(a, a_hi, f32 ? t32 : t16, ea);
        e = bp_cu_convert(a_hi, f32 ? CU_F32 : CU_BF16, cu(a), s);
    }
    if (e != 0)
        return bp_cuda_fail((cudaError_t)e, who, "converting MUL_MAT weights");
    if (b_here) {
        B = operand_of(b, t32, 4);
    } else if (f32) {
        B = dense_operand(b, b_hi, t32, 4);
        e = bp_cu_convert(b_hi, CU_F32, cu(b), s);
    } else {
        B = dense_operand(b, b_hi, t16, 2);
        Blo = dense_operand(b, b_lo, t16, 2);
        Bfin = dense_operand(b, b_fin, t16, 2);
        e = bp_cu_split_bf16(b_hi, b_lo, split_a ? b_fin : NULL, cu(b), s);
    }
    if (e != 0)
        return bp_cuda_fail((cudaError_t)e, who, "converting MUL_MAT activations");
    st = gemm_batches(cb, d, a, &A, &B, 0.0f);
    if (st == BP_OK && !f32)
        st = gemm_batches(cb, d, a, &A, &Blo, 1.0f);
    if (st == BP_OK && split_a)
        st = gemm_batches(cb, d, a, &Alo, &Bfin, 1.0f);
    return st;
}

/* ---- MUL_MAT_ID ---------------------------------------------------------------------------
 * The ids come to the host (the stream waits for the router), which groups the (slot, token)
 * pairs by expert as the CPU does; each pair's activation row is gathered into one dense matrix
 * in expert order (GET_ROWS' kernel), each expert with pairs runs MUL_MAT's path on its slice
 * of the stacked weights (the matrix-vector kernel for few columns, the split-precision GEMMs
 * otherwise: the same precision contract), and the products go to their places (SET_ROWS'
 * kernel). An id out of range joins no group and raises the backend's error flag. */

static enum bp_status moe_reserve(struct cuda_backend *cb, size_t host, size_t dev)
{
    if (host > cb->moe_host_size) {
        void *h = realloc(cb->moe_host, host);
        if (h == NULL)
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes of "
                                "MUL_MAT_ID lists", cb->cd->name, host);
        cb->moe_host = h;
        cb->moe_host_size = host;
    }
    if (dev > cb->moe_dev_size) {
        if (cb->moe_dev != NULL)
            cudaFree(cb->moe_dev); /* waits for the work still using it */
        cb->moe_dev = NULL;
        cb->moe_dev_size = 0;
        cudaError_t e = cudaMalloc(&cb->moe_dev, dev);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            cb->moe_dev = NULL;
            return bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scratch "
                                "memory for MUL_MAT_ID: %s", cb->cd->name, dev,
                                cudaGetErrorString(e));
        }
        cb->moe_dev_size = dev;
    }
    return BP_OK;
}

/* A contiguous 2-D cu_t of rows of ne0 values of type at data. */
static struct cu_t dense2(void *data, int type, int64_t ne0, int64_t ne1, int64_t esz)
{
    struct cu_t c = {.data = data, .type = type};
    c.ne[0] = ne0, c.ne[1] = ne1, c.ne[2] = c.ne[3] = 1;
    c.nb[0] = esz, c.nb[1] = ne0 * esz, c.nb[2] = c.nb[3] = ne0 * ne1 * esz;
    return c;
}

/* t as a contiguous 2-D tensor of shape [ne0, ne1] (no sources). */
static void dense_tensor(bp_tensor *t, enum bp_type type, void *data, int64_t ne0, int64_t ne1,
                         size_t row_bytes)
{
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = t->ne[3] = 1;
    t->nb[0] = bp_type_size(type);
    t->nb[1] = row_bytes;
    t->nb[2] = t->nb[3] = row_bytes * (size_t)(ne1 > 0 ? ne1 : 1);
    t->data = data;
}

static enum bp_status mul_mat_id(struct cuda_backend *cb, bp_tensor *d)
{
    const bp_tensor *as = d->src[0], *b = d->src[1], *ids = d->src[2];
    const int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2];
    const int64_t U = d->ne[1], T = d->ne[2], P = U * T, B1 = b->ne[1];
    cudaStream_t s = cb->stream;
    const char *who = cb->cd->name;
    if (P == 0 || M == 0)
        return BP_OK;
    const size_t lists = align_up((size_t)P * sizeof(int32_t));
    enum bp_status st = moe_reserve(cb, (size_t)(E + 1) * sizeof(int64_t) +
                                            3 * (size_t)P * sizeof(int32_t),
                                    2 * lists + align_up((size_t)(P * K) * sizeof(float)) +
                                        align_up((size_t)(P * M) * sizeof(float)));
    if (st != BP_OK)
        return st;
    int64_t *start = cb->moe_host; /* first: 8-byte aligned */
    int32_t *id_h = (int32_t *)(start + E + 1), *brow_h = id_h + P, *drow_h = brow_h + P;
    char *dev = cb->moe_dev;
    int32_t *brow_d = (int32_t *)dev, *drow_d = (int32_t *)(dev + lists);
    float *bg = (float *)(dev + 2 * lists);
    float *cg = (float *)(dev + 2 * lists + align_up((size_t)(P * K) * sizeof(float)));

    cudaError_t e = cudaMemcpyAsync(id_h, ids->data, (size_t)P * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
        return bp_cuda_fail(e, who, "reading the MUL_MAT_ID ids");
    for (int64_t x = 0; x <= E; x++)
        start[x] = 0;
    for (int64_t j = 0; j < P; j++) {
        if (id_h[j] >= 0 && id_h[j] < E)
            start[id_h[j] + 1]++;
        else
            *(volatile int *)cb->err_host = CU_ERR_ROW_ID; /* reported at synchronisation */
    }
    for (int64_t x = 0; x < E; x++)
        start[x + 1] += start[x];
    int64_t n_ok = 0;
    for (int64_t x = 0; x < E; x++) /* rows of b and of d, pair by pair in expert order */
        for (int64_t j = 0; j < P; j++)
            if (id_h[j] == x) {
                brow_h[n_ok] = (int32_t)((j % U) % B1 + B1 * (j / U));
                drow_h[n_ok++] = (int32_t)j;
            }
    if (n_ok == 0)
        return BP_OK;
    /* From pageable memory: the copies have taken the lists when they return. */
    e = cudaMemcpyAsync(brow_d, brow_h, (size_t)n_ok * sizeof(int32_t), cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(drow_d, drow_h, (size_t)n_ok * sizeof(int32_t),
                            cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess)
        return bp_cuda_fail(e, who, "copying the MUL_MAT_ID lists");
    /* b and d as matrices of rows: one row stride across slots and tokens (rows_of_pairs). */
    struct cu_t bt = dense2(b->data, CU_F32, K, B1 * T, 4), dt = dense2(d->data, CU_F32, M, P, 4);
    bt.nb[1] = (int64_t)b->nb[1];
    bt.nb[2] = bt.nb[3] = bt.nb[1] * B1 * T;
    dt.nb[1] = (int64_t)d->nb[1];
    dt.nb[2] = dt.nb[3] = dt.nb[1] * P;
    int k = bp_cu_get_rows(dense2(bg, CU_F32, K, n_ok, 4), bt, dense2(brow_d, CU_I32, n_ok, 1, 4),
                           cb->err_dev, s);
    if (k != 0)
        return bp_cuda_fail((cudaError_t)k, who, "gathering MUL_MAT_ID activations");
    for (int64_t x = 0; x < E && st == BP_OK; x++) {
        const int64_t n = start[x + 1] - start[x];
        if (n == 0)
            continue;
        bp_tensor a, bx, c;
        dense_tensor(&a, as->type, (char *)as->data + x * (int64_t)as->nb[2], K, M, as->nb[1]);
        dense_tensor(&bx, BP_TYPE_F32, bg + start[x] * K, K, n, (size_t)K * sizeof(float));
        dense_tensor(&c, BP_TYPE_F32, cg + start[x] * M, M, n, (size_t)M * sizeof(float));
        c.op = BP_OP_MUL_MAT;
        c.src[0] = &a;
        c.src[1] = &bx;
        st = mul_mat(cb, &c);
    }
    if (st != BP_OK)
        return st;
    k = bp_cu_set_rows(dt, dense2(cg, CU_F32, M, n_ok, 4), dense2(drow_d, CU_I32, n_ok, 1, 4),
                       cb->err_dev, s);
    return k == 0 ? BP_OK : bp_cuda_fail((cudaError_t)k, who, "placing MUL_MAT_ID products");
}

/* Copies, row gathers and scatters, and element-wise arithmetic: launches n's kernel on the
 * backend's stream and sets *e to the launch's status (a cudaError_t, 0 on success); false,
 * launching nothing, when n's op is none of these. */
static bool launch_elementwise(struct cuda_backend *cb, const bp_tensor *n, int *e)
{
    cudaStream_t s = cb->stream;
    const bp_tensor *a = n->src[0], *b = n->src[1];
    switch (n->op) {
    case BP_OP_DUP:
    case BP_OP_CONT:
        *e = bp_cu_copy(cu(n), cu(a), s);
        return true;
    case BP_OP_CPY: /* the node is the destination (b's memory) */
        *e = bp_cu_copy(cu(n), cu(a), s);
        return true;
    case BP_OP_GET_ROWS:
        *e = bp_cu_get_rows(cu(n), cu(a), cu(b), cb->err_dev, s);
        return true;
    case BP_OP_SET_ROWS:
        *e = bp_cu_set_rows(cu(n), cu(b), cu(n->src[2]), cb->err_dev, s);
        return true;
    case BP_OP_ADD:
        *e = bp_cu_binary(CU_ADD, cu(n), cu(a), cu(b), s);
        return true;
    case BP_OP_SUB:
        *e = bp_cu_binary(CU_SUB, cu(n), cu(a), cu(b), s);
        return true;
    case BP_OP_MUL:
        *e = bp_cu_binary(CU_MUL, cu(n), cu(a), cu(b), s);
        return true;
    case BP_OP_DIV:
        *e = bp_cu_binary(CU_DIV, cu(n), cu(a), cu(b), s);
        return true;
    case BP_OP_SCALE:
        *e = bp_cu_unary(CU_SCALE, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        return true;
    case BP_OP_UNARY:
        *e = bp_cu_unary(bp_get_op_param_i32(n, 0), 0.0f, cu(n), cu(a), s);
        return true;
    case BP_OP_CLAMP:
        *e = bp_cu_unary2(CU_CLAMP, bp_get_op_param_f32(n, 0), bp_get_op_param_f32(n, 1), cu(n),
                          cu(a), s);
        return true;
    default:
        return false;
    }
}

/* Row reductions, sorts and norms, as launch_elementwise. */
static bool launch_rows(struct cuda_backend *cb, const bp_tensor *n, int *e)
{
    cudaStream_t s = cb->stream;
    const bp_tensor *a = n->src[0];
    switch (n->op) {
    case BP_OP_SUM_ROWS:
        *e = bp_cu_sum_rows(0, cu(n), cu(a), s);
        return true;
    case BP_OP_MEAN:
        *e = bp_cu_sum_rows(1, cu(n), cu(a), s);
        return true;
    case BP_OP_ARGMAX:
        *e = bp_cu_argmax(cu(n), cu(a), s);
        return true;
    case BP_OP_NORM:
        *e = bp_cu_norm(0, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        return true;
    case BP_OP_RMS_NORM:
        *e = bp_cu_norm(1, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        return true;
    case BP_OP_ARGSORT:
    case BP_OP_TOP_K:
        *e = bp_cu_sort_rows(n->op == BP_OP_TOP_K || bp_get_op_param_i32(n, 0) == BP_SORT_DESC,
                             cu(n), cu(a), s);
        return true;
    case BP_OP_L2_NORM:
        *e = bp_cu_norm(2, bp_get_op_param_f32(n, 0), cu(n), cu(a), s);
        return true;
    default:
        return false;
    }
}

/* Softmax, attention, rotary embedding, concatenation and gated units (the ops with optional
 * sources or many parameters), as launch_elementwise. */
static bool launch_composite(struct cuda_backend *cb, const bp_tensor *n, int *e)
{
    cudaStream_t s = cb->stream;
    const bp_tensor *a = n->src[0], *b = n->src[1];
    switch (n->op) {
    case BP_OP_SOFT_MAX: {
        struct cu_t m = b ? cu(b) : cu(a);
        const bp_tensor *sk = n->src[2];
        struct cu_t sc = sk ? cu(sk) : cu(a);
        *e = bp_cu_soft_max(bp_get_op_param_f32(n, 0), cu(n), cu(a), b ? &m : NULL,
                            sk ? &sc : NULL, s);
        return true;
    }
    case BP_OP_FLASH_ATTN_EXT: {
        const bp_tensor *mk = n->src[3];
        struct cu_t m = mk ? cu(mk) : cu(a);
        *e = bp_cu_flash_attn(cu(n), cu(a), cu(b), cu(n->src[2]), mk ? &m : NULL,
                              bp_get_op_param_f32(n, 0), bp_get_op_param_f32(n, 1),
                              (bp_get_op_param_i32(n, 2) & BP_ATTN_CAUSAL) != 0, s);
        return true;
    }
    case BP_OP_ROPE:
        *e = bp_cu_rope(cu(n), cu(a), cu(b), bp_get_op_param_i32(n, 0), bp_get_op_param_i32(n, 1),
                        bp_get_op_param_f32(n, 2), bp_get_op_param_f32(n, 3),
                        (struct cu_yarn){bp_get_op_param_f32(n, 4), bp_get_op_param_f32(n, 5),
                                         bp_get_op_param_f32(n, 6), bp_get_op_param_f32(n, 7)},
                        s);
        return true;
    case BP_OP_CONCAT:
        *e = bp_cu_concat(cu(n), cu(a), cu(b), bp_get_op_param_i32(n, 0), s);
        return true;
    case BP_OP_GLU: {
        struct cu_t ub = b ? cu(b) : cu(a);
        *e = bp_cu_glu((int)bp_get_glu_op(n), cu(n), cu(a), b ? &ub : NULL, s);
        return true;
    }
    default:
        return false;
    }
}

static enum bp_status compute_node(struct cuda_backend *cb, bp_tensor *n)
{
    char desc[BP_TENSOR_DESC_SIZE];
    int e = 0;
    switch (n->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return BP_OK;
    case BP_OP_MUL_MAT:
        return mul_mat(cb, n);
    case BP_OP_MUL_MAT_ID:
        return mul_mat_id(cb, n);
    default:
        break;
    }
    if (!launch_elementwise(cb, n, &e) && !launch_rows(cb, n, &e) &&
        !launch_composite(cb, n, &e))
        return bp_set_error(BP_ERR_UNSUPPORTED, "%s: no kernel for %s node %s", cb->cd->name,
                            bp_op_name(n->op), bp_describe_tensor(n, desc, sizeof(desc)));
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
