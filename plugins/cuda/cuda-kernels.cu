/* cuda-kernels.cu - the CUDA plugin's kernels and their launchers (see cuda-impl.h).
 *
 * Most kernels index tensors through their byte strides, so that broadcast sources, permuted
 * and other non-contiguous views work without copies; elements are read and written through
 * ld()/st(), which convert F16 and BF16 to and from f32. Row-wise ops run one block per row
 * with a shared-memory reduction; MUL_MAT with one or a few columns runs one warp per row of
 * the weights (matvec) and larger products go to cuBLAS (cuda-plugin.c), with bp_cu_convert
 * preparing F16/BF16 copies of its inputs. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda-impl.h"
#include "cuda-quants.cuh"

#define THREADS 256

static __device__ __forceinline__ float ld(const char *p, int type)
{
    switch (type) {
    case CU_F16: return __half2float(*(const __half *)p);
    case CU_BF16: return __bfloat162float(*(const __nv_bfloat16 *)p);
    case CU_I32: return (float)*(const int32_t *)p;
    default: return *(const float *)p;
    }
}

static __device__ __forceinline__ void st(char *p, int type, float v)
{
    switch (type) {
    case CU_F16: *(__half *)p = __float2half_rn(v); break;
    case CU_BF16: *(__nv_bfloat16 *)p = __float2bfloat16_rn(v); break;
    case CU_I32: *(int32_t *)p = (int32_t)rintf(v); break;
    default: *(float *)p = v; break;
    }
}

static __device__ __forceinline__ char *at(const cu_t &t, int64_t i0, int64_t i1, int64_t i2,
                                           int64_t i3)
{
    return t.data + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

static __device__ __forceinline__ void unravel(const cu_t &t, int64_t i, int64_t idx[4])
{
    idx[0] = i % t.ne[0];
    i /= t.ne[0];
    idx[1] = i % t.ne[1];
    i /= t.ne[1];
    idx[2] = i % t.ne[2];
    idx[3] = i / t.ne[2];
}

static int64_t nelements(const cu_t &t)
{
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}

static int64_t nrows(const cu_t &t)
{
    return t.ne[1] * t.ne[2] * t.ne[3];
}

static int blocks_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    return (int)(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

static int launched(void)
{
    return (int)cudaGetLastError();
}

/* Quantised rows: element k of the row starting at row (cuda-quants.cuh decodes every type). */
static __device__ __forceinline__ float ld_q(const char *row, int type, int64_t k)
{
    return bpq_get(row, type, k);
}

static __device__ __forceinline__ float ld_row(const char *row, int type, int64_t nb0, int64_t k)
{
    if (bpq_is_quant(type))
        return ld_q(row, type, k);
    return ld(row + k * nb0, type);
}

/* ---- Element-wise ---------------------------------------------------------------------- */

__global__ void k_binary(int op, cu_t d, cu_t a, cu_t b, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t x[4];
        unravel(d, i, x);
        const float u = ld(at(a, x[0], x[1], x[2], x[3]), a.type);
        const float v = ld(at(b, x[0] % b.ne[0], x[1] % b.ne[1], x[2] % b.ne[2], x[3] % b.ne[3]),
                           b.type);
        const float r = op == CU_ADD ? u + v : op == CU_SUB ? u - v : op == CU_MUL ? u * v : u / v;
        st(at(d, x[0], x[1], x[2], x[3]), d.type, r);
    }
}

static __device__ __forceinline__ float unary(int op, float x, float p, float q = 0.0f)
{
    switch (op) {
    case CU_NEG: return -x;
    case CU_ABS: return fabsf(x);
    case CU_RELU: return x > 0.0f ? x : 0.0f;
    case CU_GELU: /* x sigmoid(2z) = 0.5 x (1 + tanh z), without cancellation for z << 0 */
        return x / (1.0f + expf(-1.5957691216f * (x + 0.044715f * x * x * x)));
    case CU_SILU: return x / (1.0f + expf(-x));
    case CU_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case CU_CLAMP: return x < p ? p : x > q ? q : x; /* NaN fails both tests: kept */
    case CU_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case CU_TANH: return tanhf(x);
    case CU_EXP: return expf(x);
    case CU_SQR: return x * x;
    case CU_SQRT: return sqrtf(x);
    default: return x * p; /* CU_SCALE */
    }
}

__global__ void k_unary(int op, float p, float q, cu_t d, cu_t a, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t x[4];
        unravel(d, i, x);
        st(at(d, x[0], x[1], x[2], x[3]), d.type,
           unary(op, ld(at(a, x[0], x[1], x[2], x[3]), a.type), p, q));
    }
}

static __device__ __forceinline__ bool is_quant(int type)
{
    return bpq_is_quant(type);
}

/* Element-wise copy in logical order; the source may be quantised (rows of whole blocks), and
 * I32 to I32 is copied exactly. */
__global__ void k_copy(cu_t d, cu_t a, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t x[4], y[4];
        unravel(d, i, x);
        unravel(a, i, y);
        char *dp = at(d, x[0], x[1], x[2], x[3]);
        if (d.type == CU_I32 && a.type == CU_I32) {
            *(int32_t *)dp = *(const int32_t *)at(a, y[0], y[1], y[2], y[3]);
            continue;
        }
        const float v = is_quant(a.type) ? ld_q(at(a, 0, y[1], y[2], y[3]), a.type, y[0])
                                         : ld(at(a, y[0], y[1], y[2], y[3]), a.type);
        st(dp, d.type, v);
    }
}

/* One block of 32 values to Q8_0 or Q4_0, exactly as the runtime's conversions do it. */
static __device__ void quantize_block(const float *x, char *out, int type)
{
    if (type == CU_Q8_0) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        *(__half *)out = __float2half_rn(dd);
        for (int j = 0; j < 32; j++)
            ((int8_t *)(out + 2))[j] = (int8_t)rintf(x[j] * id);
        return;
    }
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    }
    const float dd = mx / -8.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    *(__half *)out = __float2half_rn(dd);
    for (int j = 0; j < 16; j++) {
        int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
        q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
        q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
        ((uint8_t *)(out + 2))[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static __device__ __forceinline__ int block_bytes(int type)
{
    return type == CU_Q8_0 ? 34 : 18;
}

/* Copy into a quantised destination: one thread per destination block, the 32 source values
 * taken in logical order (any source layout and float type). */
__global__ void k_copy_to_quant(cu_t d, cu_t a, int64_t nblocks)
{
    const int64_t bpr = d.ne[0] / 32;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblocks;
         b += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = b / bpr, j0 = (b % bpr) * 32;
        int64_t r = row;
        const int64_t i1 = r % d.ne[1];
        r /= d.ne[1];
        const int64_t i2 = r % d.ne[2], i3 = r / d.ne[2];
        float x[32];
        for (int j = 0; j < 32; j++) {
            int64_t y[4];
            unravel(a, row * d.ne[0] + j0 + j, y);
            x[j] = is_quant(a.type) ? ld_q(at(a, 0, y[1], y[2], y[3]), a.type, y[0])
                                    : ld(at(a, y[0], y[1], y[2], y[3]), a.type);
        }
        quantize_block(x, at(d, 0, i1, i2, i3) + (j0 / 32) * block_bytes(d.type), d.type);
    }
}

/* glu_op: enum bp_glu_op (0 SWIGLU, 1 GEGLU, 2 GEGLU_ERF). */
__global__ void k_glu(int glu_op, cu_t d, cu_t a, cu_t b, int has_b, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t x[4];
        unravel(d, i, x);
        const float g = ld(at(a, x[0], x[1], x[2], x[3]), a.type);
        const float u = has_b ? ld(at(b, x[0], x[1], x[2], x[3]), b.type)
                              : ld(at(a, x[0] + d.ne[0], x[1], x[2], x[3]), a.type);
        st(at(d, x[0], x[1], x[2], x[3]), d.type, unary(glu_op == 0 ? CU_SILU : glu_op == 1 ? CU_GELU : CU_GELU_ERF, g, 0) * u);
    }
}

__global__ void k_concat(cu_t d, cu_t a, cu_t b, int dim, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t x[4];
        unravel(d, i, x);
        const int64_t o[4] = {x[0], x[1], x[2], x[3]};
        float v;
        if (x[dim] < a.ne[dim]) {
            v = ld(at(a, x[0], x[1], x[2], x[3]), a.type);
        } else {
            x[dim] -= a.ne[dim];
            v = ld(at(b, x[0], x[1], x[2], x[3]), b.type);
        }
        st(at(d, o[0], o[1], o[2], o[3]), d.type, v);
    }
}

/* ---- Element-wise fast paths ----------------------------------------------------------------
 * The general kernels above unravel every index (4-7 64-bit divisions per element). Most
 * element-wise nodes are contiguous: the same shape throughout (no index arithmetic at all), or a
 * second operand broadcast by rows (a bias, a norm weight: one unravel per row). */

static __device__ __forceinline__ float binary(int op, float u, float v)
{
    return op == CU_ADD ? u + v : op == CU_SUB ? u - v : op == CU_MUL ? u * v : u / v;
}

static __host__ __device__ __forceinline__ int64_t elsize(int type)
{
    return type == CU_F16 || type == CU_BF16 ? 2 : 4;
}

/* d, a and b contiguous with the same number of elements. All-F32 nodes skip the type switch. */
template <int OP>
__global__ void k_binary_f32_flat(float *d, const float *a, const float *b, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = binary(OP, a[i], b[i]);
}

__global__ void k_binary_flat(int op, cu_t d, cu_t a, cu_t b, int64_t n)
{
    const int64_t ds = elsize(d.type), as = elsize(a.type), bs = elsize(b.type);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(d.data + i * ds, d.type, binary(op, ld(a.data + i * as, a.type), ld(b.data + i * bs, b.type)));
}

/* d and a contiguous; b's rows contiguous, ne[0] equal to d's, broadcast over rows: one block
 * per row (grid-stride), one unravel per row. */
__global__ void k_binary_rows(int op, cu_t d, cu_t a, cu_t b, int64_t rows)
{
    const int64_t ne0 = d.ne[0], ds = elsize(d.type), as = elsize(a.type), bs = elsize(b.type);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t i1 = r % d.ne[1], i23 = r / d.ne[1];
        const int64_t i2 = i23 % d.ne[2], i3 = i23 / d.ne[2];
        const char *brow = at(b, 0, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
        const char *arow = a.data + r * ne0 * as;
        char *drow = d.data + r * ne0 * ds;
        for (int64_t i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x)
            st(drow + i0 * ds, d.type, binary(op, ld(arow + i0 * as, a.type), ld(brow + i0 * bs, b.type)));
    }
}

__global__ void k_unary_flat(int op, float p, float q, cu_t d, cu_t a, int64_t n)
{
    const int64_t ds = elsize(d.type), as = elsize(a.type);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(d.data + i * ds, d.type, unary(op, ld(a.data + i * as, a.type), p, q));
}

/* Dense in the logical order, elements of the tensor's type (float types only here). */
static bool dense(const cu_t &t)
{
    int64_t expect = elsize(t.type);
    for (int i = 0; i < 4; i++) {
        if (t.ne[i] != 1 && t.nb[i] != expect)
            return false;
        expect *= t.ne[i];
    }
    return true;
}

static int row_blocks(int64_t rows)
{
    return (int)(rows < 65535 * 32 ? (rows > 0 ? rows : 1) : 65535 * 32);
}

extern "C" int bp_cu_binary(int op, cu_t d, cu_t a, cu_t b, cudaStream_t s)
{
    const int64_t n = nelements(d);
    if (n == 0)
        return 0;
    const bool flat = dense(d) && dense(a);
    if (flat && dense(b) && nelements(b) == n) {
        if (d.type == CU_F32 && a.type == CU_F32 && b.type == CU_F32) {
            float *dp = (float *)d.data;
            const float *ap = (const float *)a.data, *bp = (const float *)b.data;
            switch (op) {
            case CU_ADD: k_binary_f32_flat<CU_ADD><<<blocks_for(n), THREADS, 0, s>>>(dp, ap, bp, n); break;
            case CU_SUB: k_binary_f32_flat<CU_SUB><<<blocks_for(n), THREADS, 0, s>>>(dp, ap, bp, n); break;
            case CU_MUL: k_binary_f32_flat<CU_MUL><<<blocks_for(n), THREADS, 0, s>>>(dp, ap, bp, n); break;
            default: k_binary_f32_flat<CU_DIV><<<blocks_for(n), THREADS, 0, s>>>(dp, ap, bp, n); break;
            }
        } else {
            k_binary_flat<<<blocks_for(n), THREADS, 0, s>>>(op, d, a, b, n);
        }
    } else if (flat && b.ne[0] == d.ne[0] && (b.ne[0] == 1 || b.nb[0] == elsize(b.type))) {
        const int64_t rows = nrows(d);
        k_binary_rows<<<row_blocks(rows), THREADS, 0, s>>>(op, d, a, b, rows);
    } else {
        k_binary<<<blocks_for(n), THREADS, 0, s>>>(op, d, a, b, n);
    }
    return launched();
}

extern "C" int bp_cu_unary2(int op, float p, float q, cu_t d, cu_t a, cudaStream_t s)
{
    const int64_t n = nelements(d);
    if (n == 0)
        return 0;
    if (dense(d) && dense(a))
        k_unary_flat<<<blocks_for(n), THREADS, 0, s>>>(op, p, q, d, a, n);
    else
        k_unary<<<blocks_for(n), THREADS, 0, s>>>(op, p, q, d, a, n);
    return launched();
}

extern "C" int bp_cu_unary(int op, float p, cu_t d, cu_t a, cudaStream_t s)
{
    return bp_cu_unary2(op, p, 0.0f, d, a, s);
}

extern "C" int bp_cu_copy(cu_t d, cu_t a, cudaStream_t s)
{
    const int64_t n = nelements(d);
    if (n == 0)
        return 0;
    if (d.type == CU_Q8_0 || d.type == CU_Q4_0) {
        const int64_t nb = n / 32;
        k_copy_to_quant<<<blocks_for(nb), THREADS, 0, s>>>(d, a, nb);
    } else {
        k_copy<<<blocks_for(n), THREADS, 0, s>>>(d, a, n);
    }
    return launched();
}

extern "C" int bp_cu_glu(int glu_op, cu_t d, cu_t a, const cu_t *b, cudaStream_t s)
{
    const int64_t n = nelements(d);
    k_glu<<<blocks_for(n), THREADS, 0, s>>>(glu_op, d, a, b ? *b : a, b != NULL, n);
    return launched();
}

extern "C" int bp_cu_concat(cu_t d, cu_t a, cu_t b, int dim, cudaStream_t s)
{
    const int64_t n = nelements(d);
    k_concat<<<blocks_for(n), THREADS, 0, s>>>(d, a, b, dim, n);
    return launched();
}

/* ---- Row-wise ---------------------------------------------------------------------------- */

/* Sum over the block; every thread gets the result. red has THREADS / 32 slots. */
static __device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* red may still be read from a previous reduction */
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        r += red[w];
    return r;
}

static __device__ float block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        r = fmaxf(r, red[w]);
    return r;
}

/* The row of a this block handles (blockIdx.x = i1 + ne1 (i2 + ne2 i3)); d has the same rows. */
struct row_pos {
    int64_t i1, i2, i3;
};

static __device__ __forceinline__ row_pos block_row(const cu_t &a)
{
    int64_t r = blockIdx.x;
    row_pos p;
    p.i1 = r % a.ne[1];
    r /= a.ne[1];
    p.i2 = r % a.ne[2];
    p.i3 = r / a.ne[2];
    return p;
}

/* The row-wise kernels run one block per row of a. Every element of a row is read before any
 * is written, so d may be a's memory (in-place). */

/* SUM_ROWS, or MEAN when mean is set: one value per row. */
__global__ void k_sum_rows(int mean, cu_t d, cu_t a)
{
    __shared__ float red[THREADS / 32];
    const row_pos p = block_row(a);
    const int64_t n = a.ne[0];
    const char *row = at(a, 0, p.i1, p.i2, p.i3);
    float s = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
        s += ld(row + k * a.nb[0], a.type);
    s = block_sum(s, red);
    if (threadIdx.x == 0)
        st(at(d, 0, p.i1, p.i2, p.i3), d.type, mean && n > 0 ? s / (float)n : s);
}

/* ARGMAX: the index of the row's largest element, the first of equal ones. */
__global__ void k_argmax_rows(cu_t d, cu_t a)
{
    __shared__ int arg_s[THREADS];
    __shared__ float argv_s[THREADS];
    const row_pos p = block_row(a);
    const int64_t n = a.ne[0];
    const char *row = at(a, 0, p.i1, p.i2, p.i3);
    /* Only values above -inf are candidates: NaN never compares greater, so it is skipped
     * wherever it is (also at index 0), and a row with no candidate gives 0, as the
     * reference and the CPU do. */
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const float v = ld(row + k * a.nb[0], a.type);
        if (v > best) {
            best = v;
            bi = (int)k;
        }
    }
    argv_s[threadIdx.x] = best;
    arg_s[threadIdx.x] = bi;
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    float bv = -INFINITY;
    int b = 0;
    bool any = false;
    for (int t = 0; t < (int)blockDim.x; t++) {
        if (arg_s[t] == 0x7fffffff)
            continue;
        /* the first maximum wins, as in the reference */
        if (!any || argv_s[t] > bv || (argv_s[t] == bv && arg_s[t] < b)) {
            bv = argv_s[t];
            b = arg_s[t];
            any = true;
        }
    }
    st(at(d, 0, p.i1, p.i2, p.i3), d.type, (float)b);
}

/* RMS_NORM when rms is set (x / sqrt(mean(x^2) + eps)), else NORM ((x - mean) / sqrt(var +
 * eps)). */
/* mode: 0 NORM, 1 RMS_NORM, 2 L2_NORM. */
__global__ void k_norm_rows(int mode, float eps, cu_t d, cu_t a)
{
    __shared__ float red[THREADS / 32];
    const row_pos p = block_row(a);
    const int64_t n = a.ne[0];
    const char *row = at(a, 0, p.i1, p.i2, p.i3);
    char *out = at(d, 0, p.i1, p.i2, p.i3);
    float s = 0.0f, sq = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const float v = ld(row + k * a.nb[0], a.type);
        s += v;
        sq += v * v;
    }
    s = block_sum(s, red);
    sq = block_sum(sq, red);
    float mean = 0.0f, scale;
    if (mode == 1) {
        scale = rsqrtf(sq / (float)n + eps);
    } else if (mode == 2) {
        scale = 1.0f / fmaxf(sqrtf(sq), eps);
    } else {
        mean = s / (float)n;
        float var = 0.0f;
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
            const float v = ld(row + k * a.nb[0], a.type) - mean;
            var += v * v;
        }
        var = block_sum(var, red);
        scale = rsqrtf(var / (float)n + eps);
    }
    __syncthreads(); /* every thread has read the row before any writes (in-place) */
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
        st(out + k * d.nb[0], d.type, (ld(row + k * a.nb[0], a.type) - mean) * scale);
}

/* SOFT_MAX: scale, add the mask (when has_mask; broadcast over dimensions 2 and 3), normalise.
 * A row that is all -inf becomes all 0. */
__global__ void k_soft_max_rows(float scale, cu_t d, cu_t a, cu_t mask, int has_mask,
                                cu_t sinks, int has_sinks)
{
    __shared__ float red[THREADS / 32];
    const row_pos p = block_row(a);
    const int64_t n = a.ne[0];
    const char *row = at(a, 0, p.i1, p.i2, p.i3);
    char *out = at(d, 0, p.i1, p.i2, p.i3);
    const char *mrow = has_mask ? at(mask, 0, p.i1, p.i2 % mask.ne[2], p.i3 % mask.ne[3]) : NULL;
    float mx = -INFINITY;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(row + k * a.nb[0], a.type) * scale;
        if (mrow)
            v += ld(mrow + k * mask.nb[0], mask.type);
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, red);
    const float sink = has_sinks ? ld(at(sinks, p.i2, 0, 0, 0), sinks.type) : -INFINITY;
    mx = fmaxf(mx, sink);
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(row + k * a.nb[0], a.type) * scale;
        if (mrow)
            v += ld(mrow + k * mask.nb[0], mask.type);
        sum += mx == -INFINITY ? 0.0f : expf(v - mx);
    }
    sum = block_sum(sum, red);
    if (has_sinks && mx != -INFINITY)
        sum += expf(sink - mx);
    __syncthreads();
    /* Each thread rewrites only elements it read itself above, so in-place is safe. */
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(row + k * a.nb[0], a.type) * scale;
        if (mrow)
            v += ld(mrow + k * mask.nb[0], mask.type);
        const float e = mx == -INFINITY ? 0.0f : expf(v - mx);
        st(out + k * d.nb[0], d.type, sum > 0.0f ? e / sum : 0.0f);
    }
}

/* ARGSORT and TOP_K, one block per row: each element's rank is the number of elements that
 * sort before it (by value, NaN last, ties by index), counted by its thread; the element is
 * written at its rank when that is among the first d.ne[0]. Quadratic in the row length, so
 * supports_op takes rows up to BP_CUDA_SORT_MAX (router scores; longer rows, such as a whole
 * vocabulary, go to the CPU). */
static __device__ __forceinline__ bool sorts_before(float x, int64_t i, float y, int64_t j,
                                                    int desc)
{
    if (isnan(x) || isnan(y))
        return isnan(x) != isnan(y) ? !isnan(x) : i < j;
    if (x != y)
        return desc ? x > y : x < y;
    return i < j;
}

__global__ void k_sort_rows(cu_t d, cu_t a, int desc)
{
    const row_pos p = block_row(a);
    const int64_t n = a.ne[0];
    const char *row = at(a, 0, p.i1, p.i2, p.i3);
    char *out = at(d, 0, p.i1, p.i2, p.i3);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = ld(row + i * a.nb[0], a.type);
        int64_t rank = 0;
        for (int64_t j = 0; j < n; j++)
            rank += j != i && sorts_before(ld(row + j * a.nb[0], a.type), j, x, i, desc);
        if (rank < d.ne[0])
            *(int32_t *)(out + rank * d.nb[0]) = (int32_t)i;
    }
}

/* The grid of a one-block-per-row launch over a, in *rows (0: nothing to launch); an error when
 * a has more rows than a grid dimension holds. */
static int row_grid(const cu_t &a, unsigned *rows)
{
    const int64_t n = nrows(a);
    *rows = 0;
    if (n > 0x7fffffffLL)
        return (int)cudaErrorInvalidConfiguration;
    *rows = (unsigned)n;
    return 0;
}

extern "C" int bp_cu_sum_rows(int mean, cu_t d, cu_t a, cudaStream_t s)
{
    unsigned rows;
    const int e = row_grid(a, &rows);
    if (e != 0 || rows == 0)
        return e;
    k_sum_rows<<<rows, THREADS, 0, s>>>(mean, d, a);
    return launched();
}

extern "C" int bp_cu_argmax(cu_t d, cu_t a, cudaStream_t s)
{
    unsigned rows;
    const int e = row_grid(a, &rows);
    if (e != 0 || rows == 0)
        return e;
    k_argmax_rows<<<rows, THREADS, 0, s>>>(d, a);
    return launched();
}

extern "C" int bp_cu_norm(int mode, float eps, cu_t d, cu_t a, cudaStream_t s)
{
    unsigned rows;
    const int e = row_grid(a, &rows);
    if (e != 0 || rows == 0)
        return e;
    k_norm_rows<<<rows, THREADS, 0, s>>>(mode, eps, d, a);
    return launched();
}

extern "C" int bp_cu_sort_rows(int desc, cu_t d, cu_t a, cudaStream_t s)
{
    unsigned rows;
    const int e = row_grid(a, &rows);
    if (e != 0 || rows == 0)
        return e;
    k_sort_rows<<<rows, THREADS, 0, s>>>(d, a, desc);
    return launched();
}

extern "C" int bp_cu_soft_max(float scale, cu_t d, cu_t a, const cu_t *mask, const cu_t *sinks,
                              cudaStream_t s)
{
    unsigned rows;
    const int e = row_grid(a, &rows);
    if (e != 0 || rows == 0)
        return e;
    k_soft_max_rows<<<rows, THREADS, 0, s>>>(scale, d, a, mask ? *mask : a, mask != NULL,
                                             sinks ? *sinks : a, sinks != NULL);
    return launched();
}

/* ---- RoPE -------------------------------------------------------------------------------- */

/* One thread per rotated pair or passed-through element of a row: a pair is read whole before
 * either of its elements is written, so in-place is correct. */
__global__ void k_rope(cu_t d, cu_t x, cu_t pos, int n_dims, int neox, float base, float fscale,
                       cu_yarn y, int64_t units, int64_t n)
{
    const int half = n_dims / 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t u = i % units;
        int64_t r = i / units;
        const int64_t i1 = r % x.ne[1];
        r /= x.ne[1];
        const int64_t i2 = r % x.ne[2], i3 = r / x.ne[2];
        if (u >= half) { /* beyond n_dims: copied */
            const int64_t i0 = n_dims + (u - half);
            st(at(d, i0, i1, i2, i3), d.type, ld(at(x, i0, i1, i2, i3), x.type));
            continue;
        }
        const int pair = (int)u;
        const int64_t j0 = neox ? pair : 2 * pair, j1 = neox ? pair + half : 2 * pair + 1;
        const float p = ld(at(pos, i2, 0, 0, 0), pos.type);
        const float ramp = ((float)pair - y.lo) / fmaxf(0.001f, y.hi - y.lo);
        const float mix = y.ext * (1.0f - fminf(1.0f, fmaxf(0.0f, ramp)));
        const float theta =
            p * powf(base, -2.0f * (float)pair / (float)n_dims) * (fscale * (1.0f - mix) + mix);
        float sn, cs;
        sincosf(theta, &sn, &cs);
        sn *= y.mag;
        cs *= y.mag;
        const float v0 = ld(at(x, j0, i1, i2, i3), x.type);
        const float v1 = ld(at(x, j1, i1, i2, i3), x.type);
        st(at(d, j0, i1, i2, i3), d.type, v0 * cs - v1 * sn);
        st(at(d, j1, i1, i2, i3), d.type, v0 * sn + v1 * cs);
    }
}

extern "C" int bp_cu_rope(cu_t d, cu_t x, cu_t pos, int n_dims, int mode, float base,
                          float fscale, cu_yarn y, cudaStream_t s)
{
    const int64_t units = n_dims / 2 + (x.ne[0] - n_dims);
    const int64_t n = units * nrows(x);
    if (n == 0)
        return 0;
    k_rope<<<blocks_for(n), THREADS, 0, s>>>(d, x, pos, n_dims, mode == 2, base, fscale, y, units,
                                             n);
    return launched();
}

/* ---- GET_ROWS, SET_ROWS ------------------------------------------------------------------ */

__global__ void k_get_rows(cu_t d, cu_t a, cu_t ids, int *err, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e[4];
        unravel(d, i, e);
        const int64_t id = *(const int32_t *)at(ids, e[1], e[2], e[3], 0);
        if (id < 0 || id >= a.ne[1]) {
            atomicExch(err, CU_ERR_ROW_ID);
            st(at(d, e[0], e[1], e[2], e[3]), d.type, 0.0f);
            continue;
        }
        const char *row = a.data + id * a.nb[1] + e[2] * a.nb[2] + e[3] * a.nb[3];
        st(at(d, e[0], e[1], e[2], e[3]), d.type, ld_row(row, a.type, a.nb[0], e[0]));
    }
}

__global__ void k_set_rows(cu_t d, cu_t src, cu_t ids, int *err, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e[4];
        unravel(src, i, e);
        const int64_t id = *(const int32_t *)at(ids, e[1], e[2] % ids.ne[1], e[3] % ids.ne[2], 0);
        if (id < 0 || id >= d.ne[1]) {
            atomicExch(err, CU_ERR_ROW_ID);
            continue;
        }
        st(at(d, e[0], id, e[2], e[3]), d.type, ld(at(src, e[0], e[1], e[2], e[3]), src.type));
    }
}

extern "C" int bp_cu_get_rows(cu_t d, cu_t a, cu_t ids, int *err, cudaStream_t s)
{
    const int64_t n = nelements(d);
    k_get_rows<<<blocks_for(n), THREADS, 0, s>>>(d, a, ids, err, n);
    return launched();
}

/* SET_ROWS into a quantised destination: one thread per (source row, block). */
__global__ void k_set_rows_quant(cu_t d, cu_t src, cu_t ids, int *err, int64_t nblocks)
{
    const int64_t bpr = src.ne[0] / 32;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblocks;
         b += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = b / bpr;
        const int64_t blk = b % bpr;
        const int64_t i1 = r % src.ne[1];
        r /= src.ne[1];
        const int64_t i2 = r % src.ne[2], i3 = r / src.ne[2];
        const int64_t id = *(const int32_t *)at(ids, i1, i2 % ids.ne[1], i3 % ids.ne[2], 0);
        if (id < 0 || id >= d.ne[1]) {
            atomicExch(err, CU_ERR_ROW_ID);
            continue;
        }
        float x[32];
        for (int j = 0; j < 32; j++)
            x[j] = ld(at(src, blk * 32 + j, i1, i2, i3), src.type);
        quantize_block(x, at(d, 0, id, i2, i3) + blk * block_bytes(d.type), d.type);
    }
}

extern "C" int bp_cu_set_rows(cu_t d, cu_t src, cu_t ids, int *err, cudaStream_t s)
{
    const int64_t n = nelements(src);
    if (n == 0)
        return 0;
    if (d.type == CU_Q8_0 || d.type == CU_Q4_0) {
        const int64_t nb = n / 32;
        k_set_rows_quant<<<blocks_for(nb), THREADS, 0, s>>>(d, src, ids, err, nb);
    } else {
        k_set_rows<<<blocks_for(n), THREADS, 0, s>>>(d, src, ids, err, n);
    }
    return launched();
}

/* ---- Matrix-vector and GEMM input conversion ---------------------------------------------- */

/* One warp per (row m of a, column n of b, batch); lanes stride over K. */
__global__ void k_matvec(cu_t d, cu_t a, cu_t b, int64_t total)
{
    const int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= total)
        return;
    int64_t e[4];
    int64_t r = w;
    e[0] = r % d.ne[0];
    r /= d.ne[0];
    e[1] = r % d.ne[1];
    r /= d.ne[1];
    e[2] = r % d.ne[2];
    e[3] = r / d.ne[2];
    const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
    const char *arow = a.data + e[0] * a.nb[1] + (e[2] / r2) * a.nb[2] + (e[3] / r3) * a.nb[3];
    const char *brow = at(b, 0, e[1], e[2], e[3]);
    const int64_t K = a.ne[0];
    float s = 0.0f;
    if (a.type == CU_Q8_0 || a.type == CU_Q4_0) {
        /* each lane takes whole blocks: one scale load per 32 elements */
        const int64_t nb = K / 32;
        for (int64_t blk = lane; blk < nb; blk += 32) {
            float part = 0.0f;
            if (a.type == CU_Q8_0) {
                const char *q = arow + blk * 34;
                const int8_t *qs = (const int8_t *)(q + 2);
                for (int j = 0; j < 32; j++)
                    part += (float)qs[j] * ld(brow + (blk * 32 + j) * b.nb[0], b.type);
                s += __half2float(*(const __half *)q) * part;
            } else {
                const char *q = arow + blk * 18;
                const uint8_t *qs = (const uint8_t *)(q + 2);
                for (int j = 0; j < 16; j++) {
                    part += (float)((qs[j] & 0x0f) - 8) * ld(brow + (blk * 32 + j) * b.nb[0], b.type);
                    part += (float)((qs[j] >> 4) - 8) * ld(brow + (blk * 32 + j + 16) * b.nb[0], b.type);
                }
                s += __half2float(*(const __half *)q) * part;
            }
        }
    } else {
        for (int64_t k = lane; k < K; k += 32)
            s += ld(arow + k * a.nb[0], a.type) * ld(brow + k * b.nb[0], b.type);
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0)
        st(at(d, e[0], e[1], e[2], e[3]), d.type, s);
}

/* The other quantised weight types (Q4_1 ... IQ4_XS): one warp per (row m of a, group of up to
 * MV_COLS columns of b, batch). Each lane decodes 8 weights at a time (bpq_dot_lane in
 * cuda-quants.cuh; neighbouring lanes take neighbouring groups of a block) and applies them to
 * every column of its group, so the weights are read once per MV_COLS columns. b is F32
 * (supports_op). */
#define MV_COLS BPQ_DOT_COLS

template <int TYPE>
__global__ void k_matvec_q(cu_t d, cu_t a, cu_t b, int64_t total)
{
    const int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= total)
        return;
    const int64_t ncg = (d.ne[1] + MV_COLS - 1) / MV_COLS;
    int64_t r = w;
    const int64_t m = r % d.ne[0];
    r /= d.ne[0];
    const int64_t n0 = (r % ncg) * MV_COLS;
    r /= ncg;
    const int64_t e2 = r % d.ne[2], e3 = r / d.ne[2];
    const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
    const uint8_t *arow = (const uint8_t *)(a.data + m * a.nb[1] + (e2 / r2) * a.nb[2] +
                                            (e3 / r3) * a.nb[3]);
    const char *bcol = at(b, 0, n0, e2, e3);
    const int nc = d.ne[1] - n0 < MV_COLS ? (int)(d.ne[1] - n0) : MV_COLS;
    float acc[MV_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
    bpq_dot_lane(arow, TYPE, a.ne[0], bcol, b.nb[0], b.nb[1], nc, lane, acc);
#pragma unroll
    for (int c = 0; c < MV_COLS; c++) {
        float v = acc[c];
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && c < nc)
            st(at(d, m, n0 + c, e2, e3), d.type, v);
    }
}

/* Launches k_matvec_q for the type of a; false for a type it does not take. */
static bool matvec_quant(cu_t d, cu_t a, cu_t b, cudaStream_t s, int *err)
{
    const int64_t total = d.ne[0] * ((d.ne[1] + MV_COLS - 1) / MV_COLS) * d.ne[2] * d.ne[3];
    const int64_t blocks = (total * 32 + THREADS - 1) / THREADS;
    if (blocks > 0x7fffffffLL) {
        *err = (int)cudaErrorInvalidConfiguration;
        return true;
    }
    const unsigned g = (unsigned)(blocks > 0 ? blocks : 1);
    switch (a.type) {
    case CU_Q4_1: k_matvec_q<CU_Q4_1><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q5_0: k_matvec_q<CU_Q5_0><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q5_1: k_matvec_q<CU_Q5_1><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q2_K: k_matvec_q<CU_Q2_K><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q3_K: k_matvec_q<CU_Q3_K><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q4_K: k_matvec_q<CU_Q4_K><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q5_K: k_matvec_q<CU_Q5_K><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_Q6_K: k_matvec_q<CU_Q6_K><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_IQ4_NL: k_matvec_q<CU_IQ4_NL><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    case CU_IQ4_XS: k_matvec_q<CU_IQ4_XS><<<g, THREADS, 0, s>>>(d, a, b, total); break;
    default: return false;
    }
    *err = launched();
    return true;
}

extern "C" int bp_cu_matvec(cu_t d, cu_t a, cu_t b, cudaStream_t s)
{
    const int64_t total = nelements(d);
    if (total == 0)
        return 0;
    int err = 0;
    if (matvec_quant(d, a, b, s, &err))
        return err;
    const int64_t threads = total * 32;
    const int64_t blocks = (threads + THREADS - 1) / THREADS;
    if (blocks > 0x7fffffffLL)
        return (int)cudaErrorInvalidConfiguration;
    k_matvec<<<(unsigned)blocks, THREADS, 0, s>>>(d, a, b, total);
    return launched();
}

/* Every row of a (all ne[1] * ne[2] * ne[3] of them, in order) to a dense row-major matrix of
 * ne[0] elements per row: one block per row (grid-stride), one unravel per row. With lo NULL,
 * out (hi) receives the values in out_type; with lo set, out_type is CU_BF16 and each value x is
 * split into hi = bf16(x) and lo = bf16(x - hi), so hi + lo carries 16 significant bits (lo is 0
 * where hi is not finite: x - hi would be NaN); fin, unless NULL, receives hi with non-finite
 * values replaced by 0, for the cross term whose other operand is a lo. */
__global__ void k_convert_rows(char *hi, char *lo, char *fin, int out_type, cu_t a, int64_t rows)
{
    const int64_t K = a.ne[0], osz = elsize(out_type);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t i1 = r % a.ne[1], i23 = r / a.ne[1];
        const char *row = at(a, 0, i1, i23 % a.ne[2], i23 / a.ne[2]);
        char *oh = hi + r * K * osz;
        for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
            const float x = ld_row(row, a.type, a.nb[0], k);
            if (lo == NULL) {
                st(oh + k * osz, out_type, x);
                continue;
            }
            const __nv_bfloat16 h = __float2bfloat16_rn(x);
            const float hf = __bfloat162float(h);
            ((__nv_bfloat16 *)oh)[k] = h;
            ((__nv_bfloat16 *)(lo + r * K * 2))[k] = __float2bfloat16_rn(isfinite(hf) ? x - hf : 0.0f);
            if (fin != NULL)
                ((__nv_bfloat16 *)(fin + r * K * 2))[k] = isfinite(hf) ? h : __float2bfloat16_rn(0.0f);
        }
    }
}

extern "C" int bp_cu_convert(void *out, int out_type, cu_t a, cudaStream_t s)
{
    const int64_t rows = nrows(a);
    if (rows == 0 || a.ne[0] == 0)
        return 0;
    k_convert_rows<<<row_blocks(rows), THREADS, 0, s>>>((char *)out, NULL, NULL, out_type, a,
                                                         rows);
    return launched();
}

extern "C" int bp_cu_split_bf16(void *hi, void *lo, void *fin, cu_t a, cudaStream_t s)
{
    const int64_t rows = nrows(a);
    if (rows == 0 || a.ne[0] == 0)
        return 0;
    k_convert_rows<<<row_blocks(rows), THREADS, 0, s>>>((char *)hi, (char *)lo, (char *)fin, CU_BF16,
                                                         a, rows);
    return launched();
}

/* ---- Attention ---------------------------------------------------------------------------- */

/* FLASH_ATTN_EXT, one warp per query row (row i, head h, sequence b): each lane holds every
 * 32nd element of q and of the running weighted sum of values; for each visible key the lanes'
 * partial dot products are summed across the warp and lane 0's total taken by all (so every
 * lane makes the same decisions), then the online softmax updates the running maximum M, sum S
 * and values. Keys a causal row cannot see are not read. Up to FA_MAX_D elements per row. */
#define FA_MAX_D 256
#define FA_WARPS 4

__global__ void k_flash_attn(cu_t d, cu_t q, cu_t k, cu_t v, cu_t mask, int has_mask,
                             float scale, float softcap, int causal, int64_t n_rows)
{
    const int lane = threadIdx.x % 32;
    const int64_t row = blockIdx.x * (int64_t)FA_WARPS + threadIdx.x / 32;
    if (row >= n_rows)
        return;
    const int64_t T = q.ne[1], H = q.ne[2], D = q.ne[0], Dv = v.ne[0], KV = k.ne[1];
    const int64_t i = row % T, h = (row / T) % H, b = row / (T * H);
    const int64_t g = h / (H / k.ne[2]), kb = k.ne[3] == 1 ? 0 : b;
    float qr[FA_MAX_D / 32], acc[FA_MAX_D / 32];
#pragma unroll
    for (int c = 0; c < FA_MAX_D / 32; c++) {
        const int64_t e = lane + 32 * c;
        qr[c] = e < D ? ld(at(q, e, i, h, b), q.type) : 0.0f;
        acc[c] = 0.0f;
    }
    const int64_t kv_end = causal ? KV - T + i + 1 : KV;
    const bool capped = softcap > 0.0f;
    const float pre = capped ? scale / softcap : scale;
    const char *mrow = has_mask ? at(mask, 0, i, h % mask.ne[2], b % mask.ne[3]) : NULL;
    float M = -INFINITY, S = 0.0f;
    for (int64_t j = 0; j < kv_end; j++) {
        /* A masked key is skipped before it is read: an unwritten cache slot may hold anything. */
        const float mv = mrow != NULL ? ld(mrow + j * mask.nb[0], mask.type) : 0.0f;
        if (mv == -INFINITY)
            continue;
        const char *kr = at(k, 0, j, g, kb);
        float part = 0.0f;
#pragma unroll
        for (int c = 0; c < FA_MAX_D / 32; c++) {
            const int64_t e = lane + 32 * c;
            if (e < D)
                part += qr[c] * ld_row(kr, k.type, k.nb[0], e);
        }
        for (int o = 16; o > 0; o >>= 1)
            part += __shfl_xor_sync(0xffffffffu, part, o);
        float x = __shfl_sync(0xffffffffu, part, 0) * pre;
        if (capped)
            x = softcap * tanhf(x);
        x += mv;
        if (x == -INFINITY)
            continue;
        if (x > M) {
            const float c = expf(M - x); /* 0 the first time */
            S *= c;
#pragma unroll
            for (int cc = 0; cc < FA_MAX_D / 32; cc++)
                acc[cc] *= c;
            M = x;
        }
        const float w = expf(x - M);
        S += w;
        const char *vr = at(v, 0, j, g, kb);
#pragma unroll
        for (int c = 0; c < FA_MAX_D / 32; c++) {
            const int64_t e = lane + 32 * c;
            if (e < Dv)
                acc[c] += w * ld_row(vr, v.type, v.nb[0], e);
        }
    }
    const float inv = S > 0.0f ? 1.0f / S : 0.0f;
#pragma unroll
    for (int c = 0; c < FA_MAX_D / 32; c++) {
        const int64_t e = lane + 32 * c;
        if (e < Dv)
            st(at(d, e, h, i, b), d.type, acc[c] * inv);
    }
}

extern "C" int bp_cu_flash_attn(cu_t d, cu_t q, cu_t k, cu_t v, const cu_t *mask, float scale,
                                float softcap, int causal, cudaStream_t s)
{
    const int64_t rows = q.ne[1] * q.ne[2] * q.ne[3];
    if (rows == 0)
        return 0;
    if (q.ne[0] > FA_MAX_D || v.ne[0] > FA_MAX_D)
        return (int)cudaErrorInvalidValue;
    const int64_t blocks = (rows + FA_WARPS - 1) / FA_WARPS;
    if (blocks > 0x7fffffffLL)
        return (int)cudaErrorInvalidConfiguration;
    k_flash_attn<<<(unsigned)blocks, 32 * FA_WARPS, 0, s>>>(d, q, k, v, mask ? *mask : q,
                                                            mask != NULL, scale, softcap, causal,
                                                            rows);
    return launched();
}
