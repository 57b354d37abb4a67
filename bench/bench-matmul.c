/* bench-matmul.c - MUL_MAT throughput of the CPU plugin for every weight type, against OpenBLAS
 * on the same f32 shapes in the same run, with the machine's FMA peak and triad bandwidth as the
 * limits. One result per line: name, shape, threads, value, unit. Never fails on a number.
 *
 *   bench-matmul [--types f32,f16,bf16,q8_0,q4_0,q8_0_repack,q4_0_repack] [--M 4096]
 *                [--K 4096,14336] [--N 1,8,32,512] [--threads 1,2] [--min-time 1.0] [--no-peer]
 *                [--no-limits] [--no-dram]
 *   bench-matmul --device CUDA0 [--M 4096] [--K 4096] [--N 4096] [--min-time 1.0]
 *   bench-matmul --device CUDA0 --quant [--M 4096] [--K 4096] [--N 1] [--min-time 1.0]
 *
 * With --quant the CUDA device runs one product per quantised weight type (Q4_0 first, then
 * Q8_0, Q4_1 ... IQ4_XS) and prints a Markdown table: time, the weights' read bandwidth, and
 * the time against Q4_0's.
 * A type name ending in _repack puts the weights in the CPU's CPU_REPACK buffer type (the types
 * it stores row-interleaved; the others stay plain there);
 * one ending in _half (bf16_half, f16_half) computes under BP_MM_PRECISION_HALF.
 * --no-limits skips the FMA peak, triad and read-bandwidth measurements (quick comparisons
 * only). For N = 1 the benchmark prints the weights' effective bandwidth and, measured right
 * after, the read bandwidth of a working set of the same size (read_bw): the ceiling for that
 * product, which stays in L3 at K = 4096, and the fraction of it the product reached
 * (bw_fraction). Unless --M or --K is given (or --no-dram), N = 1 also runs at three shapes past
 * a 32 MiB L3: M 32000 K 2048 (a vocabulary projection) and M 14336 K 4096 (a large MLP), where
 * Q4_0's weights (37 and 33 MB) still partly fit, and M 32000 K 4096, where every type's do not.
 * bench/plot-roofline draws a run's figures against its FMA peak and read bandwidth. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

#include "../common/bench-util.h"

#ifdef BP_BENCH_CUDA
#include "bench-cuda.h"
#endif

#ifdef BP_HAVE_OPENBLAS
#include <cblas.h>
#endif

#ifndef BP_BENCH_CPU_DIR
#define BP_BENCH_CPU_DIR ""
#endif
#ifndef BP_BENCH_CUDA_DIR
#define BP_BENCH_CUDA_DIR ""
#endif

/* Median seconds of one compute, repeated for at least min_time (3 to BENCH_MAX_RUNS runs). */
#define BENCH_MAX_RUNS 2000
static double time_graph(bp_backend *be, bp_graph *g, double min_time)
{
    double t[BENCH_MAX_RUNS];
    int n = 0;
    double start = bench_now();
    bp_backend_graph_compute(be, g); /* warm-up */
    start = bench_now();
    while (n < BENCH_MAX_RUNS && (n < 3 || bench_now() - start < min_time)) {
        double t0 = bench_now();
        bp_backend_graph_compute(be, g);
        t[n++] = bench_now() - t0;
    }
    return bench_median(t, n);
}

#ifdef BP_HAVE_OPENBLAS
static double time_openblas(const float *a, const float *b, float *c, long M, long N, long K,
                            double min_time)
{
    double t[BENCH_MAX_RUNS];
    int n = 0;
    for (int warm = 0; warm < 1; warm++) {
        if (N == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)M, (int)K, 1.0f, a, (int)K, b, 1, 0.0f,
                        c, 1);
        else
            cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a,
                        (int)K, b, (int)K, 0.0f, c, (int)M);
    }
    double start = bench_now();
    while (n < BENCH_MAX_RUNS && (n < 3 || bench_now() - start < min_time)) {
        double t0 = bench_now();
        if (N == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)M, (int)K, 1.0f, a, (int)K, b, 1, 0.0f,
                        c, 1);
        else
            cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, a,
                        (int)K, b, (int)K, 0.0f, c, (int)M);
        t[n++] = bench_now() - t0;
    }
    return bench_median(t, n);
}
#endif

/* The shapes, thread counts and switches of one invocation. */
struct matmul_opts {
    long Ms[4], Ks[4], Ns[8], Ts[8];
    int nM, nK, nN, nT;
    double min_time;
    bool peer;   /* OpenBLAS beside the f32 products (where built with it) */
    bool limits; /* the FMA peak, triad and read-bandwidth limits */
};

typedef enum bp_status (*set_threads_fn)(bp_backend *, int);

/* y = w x for the first N columns of x, at every thread count: throughput, and for N = 1 the
 * weights' bandwidth with the read-bandwidth limit of a working set of their size. */
static void bench_product(bp_backend *be, set_threads_fn set_threads, const struct matmul_opts *o,
                          const char *tn, bool half, bp_tensor *w, bp_tensor *x, long N)
{
    const long M = w->ne[1], K = w->ne[0];
    bp_context *ctx = bp_context_new(4);
    bp_tensor *xn = bp_view_2d(ctx, x, K, N, x->nb[1], 0);
    bp_tensor *y = bp_mul_mat(ctx, w, xn);
    if (half)
        bp_mul_mat_set_precision(y, BP_MM_PRECISION_HALF);
    bp_buffer *ybuf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    char shape[96];
    snprintf(shape, sizeof(shape), "M=%ld,K=%ld,N=%ld", M, K, N);
    for (int ti = 0; ti < o->nT; ti++) {
        const long T = o->Ts[ti];
        set_threads(be, (int)T);
        double t = time_graph(be, g, o->min_time);
        printf("mul_mat_%s %s %ld %.1f GFLOP/s\n", tn, shape, T, 2.0 * M * N * K / t * 1e-9);
        if (N == 1) {
            printf("mul_mat_%s_weight_bw %s %ld %.1f GB/s\n", tn, shape, T,
                   (double)bp_nbytes(w) / t * 1e-9);
            /* The limit for this working set: the weights read over and over. */
            if (o->limits) {
                const double rb = bench_read(bp_nbytes(w), (int)T);
                printf("read_bw %zuB %ld %.1f GB/s\n", bp_nbytes(w), T, rb);
                printf("mul_mat_%s_bw_fraction %s %ld %.2f of read_bw\n", tn, shape, T,
                       (double)bp_nbytes(w) / t * 1e-9 / rb);
            }
        }
#ifdef BP_HAVE_OPENBLAS
        if (o->peer && w->type == BP_TYPE_F32) {
            openblas_set_num_threads((int)T);
            double tb = time_openblas(w->data, xn->data, y->data, M, N, K, o->min_time);
            printf("openblas_%s %s %ld %.1f GFLOP/s\n", N == 1 ? "sgemv" : "sgemm", shape, T,
                   2.0 * M * N * K / tb * 1e-9);
            printf("ratio_vs_openblas %s %ld %.2f x\n", shape, T, tb / t);
        }
#endif
        fflush(stdout);
    }
    bp_graph_free(g);
    bp_buffer_free(ybuf);
    bp_context_free(ctx);
}

/* M x K weights of type `type` in wbt and an f32 input of the widest N, filled once, then every
 * N. 0, or 1 after printing why the buffers could not be made. */
static int bench_shape(bp_backend *be, set_threads_fn set_threads, const struct matmul_opts *o,
                       const char *tn, bool half, enum bp_type type, bp_buffer_type *wbt, long M,
                       long K)
{
    long maxN = 0;
    for (int ni = 0; ni < o->nN; ni++)
        maxN = o->Ns[ni] > maxN ? o->Ns[ni] : maxN;
    bp_context *wctx = bp_context_new(2), *xctx = bp_context_new(1);
    bp_tensor *w = bp_new_tensor_2d(wctx, type, K, M);
    bp_tensor *x = bp_new_tensor_2d(xctx, BP_TYPE_F32, K, maxN);
    bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, wbt);
    bp_buffer *xbuf = bp_alloc_ctx_tensors(xctx, bp_host_buffer_type());
    const int status = wbuf == NULL || xbuf == NULL;
    if (status != 0) {
        fprintf(stderr, "bench-matmul: %s\n", bp_last_error());
    } else {
        bench_fill(w, 1);
        bench_fill(x, 2);
        for (int ni = 0; ni < o->nN; ni++)
            bench_product(be, set_threads, o, tn, half, w, x, o->Ns[ni]);
    }
    bp_buffer_free(xbuf);
    bp_buffer_free(wbuf);
    bp_context_free(xctx);
    bp_context_free(wctx);
    return status;
}

/* Every shape for each weight type of the comma-separated list `types`; names that are not
 * weight types, and repacked types without CPU_REPACK, are skipped with a message. */
static int bench_types(bp_backend *be, const struct matmul_opts *o, const char *types)
{
    set_threads_fn set_threads = bp_backend_set_n_threads;
    char tbuf[128];
    snprintf(tbuf, sizeof(tbuf), "%s", types);
    for (char *save = NULL, *tn = strtok_r(tbuf, ",", &save); tn; tn = strtok_r(NULL, ",", &save)) {
        enum bp_type type;
        bool repack;
        /* "_half": the product under BP_MM_PRECISION_HALF (bf16_half, f16_half). */
        char base[64];
        snprintf(base, sizeof(base), "%s", tn);
        const size_t len = strlen(base);
        const bool half = len > 5 && strcmp(base + len - 5, "_half") == 0;
        if (half)
            base[len - 5] = '\0';
        if (!bench_weight_type(base, &type, &repack)) {
            fprintf(stderr, "bench-matmul: '%s' is not a weight type\n", tn);
            continue;
        }
        bp_buffer_type *wbt = repack ? bench_repack_buft(be) : bp_host_buffer_type();
        if (wbt == NULL) {
            fprintf(stderr, "bench-matmul: %s: no CPU_REPACK buffer type\n", tn);
            continue;
        }
        for (int mi = 0; mi < o->nM; mi++)
            for (int ki = 0; ki < o->nK; ki++)
                if (bench_shape(be, set_threads, o, tn, half, type, wbt, o->Ms[mi], o->Ks[ki]) !=
                    0)
                    return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct matmul_opts o;
    o.nM = bench_parse_list(bench_arg(argc, argv, "--M", "4096"), o.Ms, 4);
    o.nK = bench_parse_list(bench_arg(argc, argv, "--K", "4096,14336"), o.Ks, 4);
    o.nN = bench_parse_list(bench_arg(argc, argv, "--N", "1,8,32,512"), o.Ns, 8);
    o.nT = bench_parse_list(bench_arg(argc, argv, "--threads", "1,2"), o.Ts, 8);
    o.min_time = atof(bench_arg(argc, argv, "--min-time", "1.0"));
    o.peer = !bench_flag(argc, argv, "--no-peer");
    o.limits = !bench_flag(argc, argv, "--no-limits");
    const char *types = bench_arg(argc, argv, "--types",
                                  "f32,f16,bf16,q8_0,q4_0,q8_0_repack,q4_0_repack");
    const char *device = bench_arg(argc, argv, "--device", "CPU");

    if (strncmp(device, "CUDA", 4) == 0) {
#ifdef BP_BENCH_CUDA
        if (bp_device_by_name(device) == NULL)
            bench_load_plugins(BP_BENCH_CUDA_DIR);
        if (bench_flag(argc, argv, "--quant"))
            return bench_cuda_matvec_quant(device, atol(bench_arg(argc, argv, "--M", "4096")),
                                           atol(bench_arg(argc, argv, "--N", "1")),
                                           atol(bench_arg(argc, argv, "--K", "4096")), o.min_time);
        return bench_cuda_matmul(device, atol(bench_arg(argc, argv, "--M", "4096")),
                                 atol(bench_arg(argc, argv, "--N", "4096")),
                                 atol(bench_arg(argc, argv, "--K", "4096")), o.min_time);
#else
        printf("# %s: this build has no CUDA: skipped\n", device);
        return 0;
#endif
    }

    if (bp_device_by_name("CPU") == NULL)
        bench_load_plugins(BP_BENCH_CPU_DIR);
    bp_backend *be = bp_backend_init_by_name("CPU", NULL);
    if (be == NULL) {
        fprintf(stderr, "bench-matmul: %s\n", bp_last_error());
        return 1;
    }
    printf("# device: %s\n", bp_device_get_description(bp_backend_get_device(be)));
    for (int ti = 0; ti < o.nT && o.limits; ti++) {
        printf("fma_peak - %ld %.1f GFLOP/s\n", o.Ts[ti], bench_fma_peak((int)o.Ts[ti]));
        printf("triad 3x256MiB %ld %.1f GB/s\n", o.Ts[ti], bench_triad((int)o.Ts[ti]));
    }
    fflush(stdout);
    int status = bench_types(be, &o, types);
    /* Matrix-vector products whose weights stream from DRAM, as every real model's token
     * generation does (the default shapes above fit the L3 at K = 4096): N = 1 at the shapes of
     * a vocabulary projection and of a large MLP, unless the shapes were chosen by hand. */
    bool has_n1 = false;
    for (int ni = 0; ni < o.nN; ni++)
        has_n1 = has_n1 || o.Ns[ni] == 1;
    if (status == 0 && has_n1 && !bench_flag(argc, argv, "--no-dram") &&
        strcmp(bench_arg(argc, argv, "--M", ""), "") == 0 &&
        strcmp(bench_arg(argc, argv, "--K", ""), "") == 0) {
        struct matmul_opts d = o;
        static const long shapes[3][2] = {{32000, 2048}, {14336, 4096}, {32000, 4096}};
        d.nN = 1;
        d.Ns[0] = 1;
        d.nM = d.nK = 1;
        for (int s = 0; s < 3 && status == 0; s++) {
            d.Ms[0] = shapes[s][0];
            d.Ks[0] = shapes[s][1];
            status = bench_types(be, &d, types);
        }
    }
    bp_backend_free(be);
    return status;
}
