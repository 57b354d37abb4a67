/* bench-cuda.c - the CUDA device in bench-matmul and bench-ops (`--device CUDA0`), each figure
 * beside the same work done by calling CUDA directly in the same run: cuBLAS GEMM on the same
 * device pointers for MUL_MAT (the same GEMMs the precision contract asks of the plugin, and
 * the single rounded GEMM for comparison), cudaMemcpy for the bandwidth of element-wise ops. Built only
 * where configure found CUDA; the peers are linked into the benchmarks, never into the plugin's
 * users. Times are host wall-clock around a computation that ends with a synchronisation, the
 * same for the plugin and the peer. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <backplane/backplane.h>

#include "bench-cuda.h"
#include "../common/bench-util.h"

#define MAX_RUNS 200

/* Median seconds of fn(arg) over at least min_time (3 to MAX_RUNS runs), after a warm-up. */
static double time_median(int (*fn)(void *), void *arg, double min_time)
{
    double t[MAX_RUNS];
    int n = 0;
    if (fn(arg) != 0)
        return -1.0;
    double start = bench_now();
    while (n < MAX_RUNS && (n < 3 || bench_now() - start < min_time)) {
        double t0 = bench_now();
        if (fn(arg) != 0)
            return -1.0;
        t[n++] = bench_now() - t0;
    }
    return bench_median(t, n);
}

struct graph_job {
    bp_backend *be;
    bp_graph *g;
};

static int run_graph(void *p)
{
    struct graph_job *j = p;
    return bp_backend_graph_compute(j->be, j->g) == BP_OK ? 0 : -1;
}

/* The peer: the same GEMMs the plugin's precision contract asks for, called directly on operands
 * prepared outside the timing (one f32 GEMM for F32 weights; W.xhi + W.xlo for BF16; Whi.xhi +
 * Whi.xlo + Wlo.xhi for F16, all BF16 tensor-core GEMMs), or, as a second figure, the one GEMM
 * on activations rounded to the weights' type (what a library without that contract does). */
struct gemm_job {
    cublasHandle_t h;
    int M, N, K;
    int n; /* GEMMs, accumulated into c */
    const void *a[3], *b[3];
    void *c;
    cudaDataType_t ta, tb;
};

static int run_gemm(void *p)
{
    struct gemm_job *j = p;
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < j->n; i++) {
        if (cublasGemmEx(j->h, CUBLAS_OP_T, CUBLAS_OP_N, j->M, j->N, j->K, &one, j->a[i], j->ta,
                         j->K, j->b[i], j->tb, j->K, i == 0 ? &zero : &one, j->c, CUDA_R_32F, j->M,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            return -1;
    }
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

struct copy_job {
    void *dst;
    const void *src;
    size_t bytes;
};

static int run_copy(void *p)
{
    struct copy_job *j = p;
    if (cudaMemcpy(j->dst, j->src, j->bytes, cudaMemcpyDeviceToDevice) != cudaSuccess)
        return -1;
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
}

static bp_backend *cuda_backend(const char *device)
{
    bp_backend *be = bp_backend_init_by_name(device, NULL);
    if (be == NULL)
        printf("# %s: not available (%s): skipped\n", device, bp_last_error());
    else
        printf("# device: %s (%s)\n", device, bp_device_get_description(bp_backend_get_device(be)));
    return be;
}

int bench_cuda_matmul(const char *device, long M, long N, long K, double min_time)
{
    bp_backend *be = cuda_backend(device);
    if (be == NULL)
        return 0;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench: cublasCreate failed\n");
        bp_backend_free(be);
        return 1;
    }
    static const enum bp_type types[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_BF16};
    for (int ti = 0; ti < 3; ti++) {
        const enum bp_type wt = types[ti];
        const bool f32 = wt == BP_TYPE_F32;
        const enum bp_type pt = f32 ? BP_TYPE_F32 : BP_TYPE_BF16; /* the peer's GEMM operands */
        bp_context *ctx = bp_context_new(16);
        bp_tensor *w = bp_new_tensor_2d(ctx, wt, K, M);
        bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, N);
        bp_tensor *w_hi = bp_new_tensor_2d(ctx, pt, K, M), *w_lo = bp_new_tensor_2d(ctx, pt, K, M);
        bp_tensor *x_hi = bp_new_tensor_2d(ctx, pt, K, N), *x_lo = bp_new_tensor_2d(ctx, pt, K, N);
        bp_tensor *xw = bp_new_tensor_2d(ctx, wt, K, N); /* x rounded to the weights' type */
        bp_tensor *y = bp_mul_mat(ctx, w, x);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        if (buf == NULL) {
            fprintf(stderr, "bench: %s\n", bp_last_error());
            bp_context_free(ctx);
            break;
        }
        bench_fill(w, 1);
        bench_fill(x, 2);
        bench_fill(w_hi, 1);
        bench_fill(w_lo, 3);
        bench_fill(x_hi, 2);
        bench_fill(x_lo, 4);
        bench_fill(xw, 2);
        bp_graph *g = bp_graph_new(4);
        bp_graph_build_forward(g, y);
        struct graph_job gj = {be, g};
        const double t = time_median(run_graph, &gj, min_time);
        const cudaDataType_t ct = f32 ? CUDA_R_32F : CUDA_R_16BF;
        struct gemm_job pj = {h, (int)M, (int)N, (int)K, 1, {w->data}, {x->data}, y->data, ct, ct};
        if (wt == BP_TYPE_BF16)
            pj = (struct gemm_job){h, (int)M, (int)N, (int)K, 2, {w->data, w->data},
                                   {x_hi->data, x_lo->data}, y->data, ct, ct};
        else if (wt == BP_TYPE_F16)
            pj = (struct gemm_job){h, (int)M, (int)N, (int)K, 3,
                                   {w_hi->data, w_hi->data, w_lo->data},
                                   {x_hi->data, x_lo->data, x_hi->data}, y->data, ct, ct};
        const double tp = time_median(run_gemm, &pj, min_time);
        const cudaDataType_t rt = f32 ? CUDA_R_32F : wt == BP_TYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
        struct gemm_job rj = {h, (int)M, (int)N, (int)K, 1, {w->data}, {xw->data}, y->data, rt, rt};
        const double tr = f32 ? -1.0 : time_median(run_gemm, &rj, min_time);
        char shape[96];
        snprintf(shape, sizeof(shape), "M=%ld,K=%ld,N=%ld", M, K, N);
        const double flops = 2.0 * M * N * K;
        if (t > 0)
            printf("mul_mat_%s_%s %s - %.1f GFLOP/s\n", bp_type_name(wt), device, shape,
                   flops / t * 1e-9);
        if (tp > 0) {
            printf("cublas_same_work_%s %s - %.1f GFLOP/s (%d GEMM%s)\n", bp_type_name(wt), shape,
                   flops / tp * 1e-9, pj.n, pj.n > 1 ? "s" : "");
            if (t > 0)
                printf("ratio_vs_cublas_%s %s - %.2f x\n", bp_type_name(wt), shape, tp / t);
        }
        if (tr > 0) {
            printf("cublas_rounded_%s %s - %.1f GFLOP/s (one GEMM, activations rounded to %s)\n",
                   bp_type_name(wt), shape, flops / tr * 1e-9, bp_type_name(wt));
            if (t > 0)
                printf("ratio_vs_rounded_%s %s - %.2f x\n", bp_type_name(wt), shape, tr / t);
        }
        fflush(stdout);
        bp_graph_free(g);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
    cublasDestroy(h);
    bp_backend_free(be);
    return 0;
}

/* Weights of any quantised type: random bytes, every byte below 0x40 so that each fp16 scale is
 * finite (the values do not matter to the time, but NaN would hide nothing here either). */
static void fill_blocks(bp_tensor *t, unsigned seed)
{
    const size_t n = bp_nbytes(t);
    unsigned char *raw = malloc(n);
    for (size_t i = 0; i < n && raw != NULL; i++) {
        seed = seed * 1103515245u + 12345u;
        raw[i] = (unsigned char)((seed >> 16) & 0x3f);
    }
    if (raw != NULL)
        bp_tensor_set(t, raw, 0, n);
    free(raw);
}

/* One product per quantised weight type at M x K x N, as a Markdown table (for
 * docs/performance.md): time, the weights' effective read bandwidth, and the time against
 * Q4_0's (the first row). */
int bench_cuda_matvec_quant(const char *device, long M, long N, long K, double min_time)
{
    static const enum bp_type types[] = {
        BP_TYPE_Q4_0, BP_TYPE_Q8_0, BP_TYPE_Q4_1, BP_TYPE_Q5_0, BP_TYPE_Q5_1, BP_TYPE_Q2_K,
        BP_TYPE_Q3_K, BP_TYPE_Q4_K, BP_TYPE_Q5_K, BP_TYPE_Q6_K, BP_TYPE_IQ4_NL, BP_TYPE_IQ4_XS};
    bp_backend *be = cuda_backend(device);
    if (be == NULL)
        return 0;
    printf("| type (%s, M=%ld K=%ld N=%ld) | bits/weight | time (us) | weights GB/s | vs q4_0 |\n",
           device, M, K, N);
    printf("|---|---|---|---|---|\n");
    double t_q4_0 = -1.0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const enum bp_type wt = types[ti];
        bp_context *ctx = bp_context_new(4);
        bp_tensor *w = bp_new_tensor_2d(ctx, wt, K, M);
        bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, N);
        bp_tensor *y = bp_mul_mat(ctx, w, x);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        bp_graph *g = bp_graph_new(4);
        if (buf == NULL || bp_graph_build_forward(g, y) != BP_OK ||
            !bp_backend_supports_op(be, y)) {
            printf("| %s | - | not run: %s | | |\n", bp_type_name(wt),
                   buf == NULL ? bp_last_error() : "not supported");
        } else {
            fill_blocks(w, 1u + (unsigned)ti);
            bench_fill(x, 2);
            struct graph_job gj = {be, g};
            const double t = time_median(run_graph, &gj, min_time);
            const struct bp_type_traits *tr = bp_type_get_traits(wt);
            if (ti == 0)
                t_q4_0 = t;
            if (t > 0)
                printf("| %s | %.2f | %.1f | %.0f | %.2f x |\n", bp_type_name(wt),
                       8.0 * (double)tr->type_size / (double)tr->block_size, t * 1e6,
                       (double)bp_nbytes(w) / t * 1e-9, t_q4_0 > 0 ? t / t_q4_0 : 0.0);
            else
                printf("| %s | - | failed: %s | | |\n", bp_type_name(wt), bp_last_error());
        }
        fflush(stdout);
        bp_graph_free(g);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
    bp_backend_free(be);
    return 0;
}

int bench_cuda_ops(const char *device, long n, double min_time)
{
    bp_backend *be = cuda_backend(device);
    if (be == NULL)
        return 0;
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, n);
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, n);
    bp_tensor *ops[3] = {bp_add(ctx, a, b), bp_scale(ctx, a, 0.5f), bp_silu(ctx, a)};
    static const char *const names[3] = {"add", "scale", "silu"};
    static const int streams[3] = {3, 2, 2}; /* arrays read + written */
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    if (buf == NULL) {
        fprintf(stderr, "bench: %s\n", bp_last_error());
        bp_context_free(ctx);
        bp_backend_free(be);
        return 1;
    }
    bp_buffer_clear(buf, 0);
    const size_t bytes = (size_t)n * sizeof(float);
    char shape[64];
    snprintf(shape, sizeof(shape), "n=%ld", n);
    struct copy_job cj = {b->data, a->data, bytes};
    const double tc = time_median(run_copy, &cj, min_time);
    if (tc > 0)
        printf("cudaMemcpy_d2d %s - %.1f GB/s\n", shape, 2.0 * bytes / tc * 1e-9);
    for (int i = 0; i < 3; i++) {
        bp_graph *g = bp_graph_new(4);
        bp_graph_build_forward(g, ops[i]);
        struct graph_job gj = {be, g};
        const double t = time_median(run_graph, &gj, min_time);
        if (t > 0) {
            const double bw = streams[i] * (double)bytes / t * 1e-9;
            printf("%s_%s %s - %.1f GB/s\n", names[i], device, shape, bw);
            if (tc > 0)
                printf("ratio_vs_memcpy_%s %s - %.2f x\n", names[i], shape,
                       bw / (2.0 * bytes / tc * 1e-9));
        }
        bp_graph_free(g);
    }
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(be);
    return 0;
}
