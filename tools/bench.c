/* bench.c - `backplane bench`: matmul and element-wise benchmarks like those of bench/ on the
 * devices the user picks, through the public API only, next to the machine's limits (FMA peak
 * and a STREAM-style triad, measured in the same run). One result per line: name, shape,
 * device, value, unit.
 *
 *   backplane bench [-d DEVICES] [--types f32,f16,bf16,q8_0,q4_0,q4_1,...] [--M 4096] [--K 4096]
 *                   [--N 1,32] [-t THREADS] [--min-time 0.5] [--no-limits]
 *
 * A type name ending in _repack (q4_0_repack, q4_k_repack, ...) puts the weights in the device's
 * CPU_REPACK buffer type, where the device has one (the CPU's); elsewhere the line says it was
 * skipped. The timing and the limits come from common/bench-util.c. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../common/bench-util.h"
#include "tool.h"

#define MAX_RUNS 1000

static double median_compute(bp_backend *be, bp_graph *g, double min_time)
{
    double t[MAX_RUNS];
    int n = 0;
    if (bp_backend_graph_compute(be, g) != BP_OK)
        return -1.0;
    const double start = bench_now();
    while (n < MAX_RUNS && (n < 3 || bench_now() - start < min_time)) {
        const double t0 = bench_now();
        if (bp_backend_graph_compute(be, g) != BP_OK)
            return -1.0;
        t[n++] = bench_now() - t0;
    }
    return bench_median(t, n);
}

/* name: the weight type's name, with "_repack" when the weights live in CPU_REPACK. */
static void bench_matmul(bp_backend *be, const char *name, enum bp_type wt, bool repack, long M,
                         long K, long N, double min_time)
{
    const char *dev = tool_text(bp_backend_get_name(be));
    bp_buffer_type *wbt = repack ? bench_repack_buft(be) : bp_backend_get_default_buffer_type(be);
    if (wbt == NULL) {
        printf("# mul_mat_%s on %s: no CPU_REPACK buffer type, skipped\n", name, dev);
        return;
    }
    bp_context *ctx = bp_context_new(4), *wctx = bp_context_new(1);
    bp_tensor *w = bp_new_tensor_2d(wctx, wt, K, M);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, N);
    bp_tensor *y = bp_mul_mat(ctx, w, x);
    const bool supported = bp_backend_supports_op(be, y); /* asked before allocating */
    bp_buffer *wbuf = supported ? bp_alloc_ctx_tensors(wctx, wbt) : NULL;
    bp_buffer *buf = wbuf ? bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be)) : NULL;
    if (buf == NULL) {
        printf("# mul_mat_%s on %s: %s\n", name, dev,
               supported ? tool_text(bp_last_error()) : "not supported, skipped");
        bp_buffer_free(buf);
        bp_buffer_free(wbuf);
        bp_context_free(ctx);
        bp_context_free(wctx);
        return;
    }
    bench_fill(w, 1);
    bench_fill(x, 2);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    const double t = median_compute(be, g, min_time);
    if (t > 0) {
        printf("mul_mat_%s M=%ld,K=%ld,N=%ld %s %.1f GFLOP/s\n", name, M, K, N, dev,
               2.0 * M * N * K / t * 1e-9);
        if (N == 1)
            printf("mul_mat_%s_weight_bw M=%ld,K=%ld,N=1 %s %.1f GB/s\n", name, M, K, dev,
                   (double)bp_nbytes(w) / t * 1e-9);
    } else {
        printf("# mul_mat_%s on %s failed: %s\n", name, dev, tool_text(bp_last_error()));
    }
    fflush(stdout);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_buffer_free(wbuf);
    bp_context_free(ctx);
    bp_context_free(wctx);
}

static void bench_add(bp_backend *be, long n, double min_time)
{
    const char *dev = tool_text(bp_backend_get_name(be));
    bp_context *ctx = bp_context_new(4);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, n);
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, n);
    bp_tensor *c = bp_add(ctx, a, b);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    if (buf == NULL || !bp_backend_supports_op(be, c)) {
        printf("# add on %s: %s\n", dev, buf ? "not supported, skipped" : tool_text(bp_last_error()));
        bp_buffer_free(buf);
        bp_context_free(ctx);
        return;
    }
    bp_buffer_clear(buf, 0);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, c);
    const double t = median_compute(be, g, min_time);
    if (t > 0)
        printf("add n=%ld %s %.1f GB/s\n", n, dev, 3.0 * (double)n * sizeof(float) / t * 1e-9);
    fflush(stdout);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}

/* Limits of the options: sizes a tensor and its byte count can take with room to spare (a
 * size the device cannot hold is then an allocation error, reported per line). */
#define BENCH_MAX_DIM (1LL << 24)
#define BENCH_MAX_N 8

static void bench_usage(FILE *f)
{
    fprintf(f, "usage: backplane bench [-d DEVICES] [--types LIST] [--M N] [--K N] [--N LIST]\n"
               "                       [-t N] [--min-time SECONDS] [--no-limits]\n"
               "\n"
               "Measures matmul (GFLOP/s, and weight bandwidth at N = 1) and an element-wise add\n"
               "(GB/s) on each device, beside the machine's FMA peak and triad bandwidth, then\n"
               "the process's peak resident size.\n"
               "\n"
               "  -d DEVICES     comma-separated devices (default: every device)\n"
               "  --types LIST   weight types, each once: f32, f16, bf16, q8_0, q4_0, q4_1,\n"
               "                 q5_0, q5_1, q2_k..q6_k, iq4_nl, iq4_xs (any type the\n"
               "                 runtime can quantise to), and\n"
               "                 any of them with _repack (q4_0_repack, q4_k_repack) for\n"
               "                 the CPU's CPU_REPACK buffer type\n"
               "                 (default: f32,f16,bf16,q8_0,q4_0)\n"
               "  --M N, --K N   weight rows and columns (default 4096; K a multiple of the\n"
               "                 types' blocks)\n"
               "  --N LIST       activation columns, up to 8 distinct numbers (default: 1,32)\n"
               "  -t N           threads of CPU devices (default: the CPU plugin's)\n"
               "  --min-time S   seconds to repeat each measurement for (default 0.5)\n"
               "  --no-limits    skip the FMA peak and triad measurements\n");
}

/* The options into the arguments; -1 to go on, else the exit status. */
struct bench_opts {
    const char *devices, *types;
    long long M, K, threads, Ns[BENCH_MAX_N];
    int nN;
    double min_time;
    bool limits;
};

static int parse_bench_args(int argc, char **argv, struct bench_opts *o)
{
    static const char cmd[] = "backplane bench";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (strcmp(a, "--no-limits") == 0) {
            o->limits = false;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bench_usage(stdout);
            return 0;
        }
        const bool known = strcmp(a, "-d") == 0 || strcmp(a, "--types") == 0 ||
                           strcmp(a, "--M") == 0 || strcmp(a, "--K") == 0 ||
                           strcmp(a, "--N") == 0 || strcmp(a, "-t") == 0 ||
                           strcmp(a, "--min-time") == 0;
        if (!known)
            return tool_bad_arg(cmd, a);
        if (v == NULL)
            return tool_no_value(cmd, a);
        if (strcmp(a, "-d") == 0)
            o->devices = v;
        else if (strcmp(a, "--types") == 0)
            ok = tool_check_list(cmd, a, v), o->types = v;
        else if (strcmp(a, "--M") == 0)
            ok = tool_parse_int(cmd, a, v, 1, BENCH_MAX_DIM, &o->M);
        else if (strcmp(a, "--K") == 0)
            ok = tool_parse_int(cmd, a, v, 32, BENCH_MAX_DIM, &o->K);
        else if (strcmp(a, "--N") == 0)
            ok = (o->nN = tool_parse_int_list(cmd, a, v, 1, BENCH_MAX_DIM, o->Ns, BENCH_MAX_N)) > 0;
        else if (strcmp(a, "-t") == 0)
            ok = tool_parse_int(cmd, a, v, 0, 1024, &o->threads); /* the CPU plugin's limit */
        else
            ok = tool_parse_seconds(cmd, a, v, 3600.0, &o->min_time);
        if (!ok)
            return 2;
        i++;
    }
    return -1;
}

int cmd_bench(int argc, char **argv)
{
    static const char cmd[] = "backplane bench";
    struct bench_opts o = {.types = "f32,f16,bf16,q8_0,q4_0", .M = 4096, .K = 4096, .Ns = {1, 32},
                           .nN = 2, .min_time = 0.5, .limits = true};
    const int st = parse_bench_args(argc, argv, &o);
    if (st >= 0)
        return st;
    const char *devices = o.devices, *types = o.types;
    const long long M = o.M, K = o.K, threads = o.threads, *Ns = o.Ns;
    const int nN = o.nN;
    const double min_time = o.min_time;
    const bool limits = o.limits;
    /* Every type name is checked before anything runs. */
    char tb[128];
    if (snprintf(tb, sizeof(tb), "%s", types) >= (int)sizeof(tb)) {
        fprintf(stderr, "%s: --types list too long\n", cmd);
        return 2;
    }
    for (char *save = NULL, *tn = strtok_r(tb, ",", &save); tn; tn = strtok_r(NULL, ",", &save)) {
        enum bp_type t;
        bool repack;
        if (!bench_weight_type(tn, &t, &repack)) {
            fprintf(stderr, "%s: '%s' in --types is not a weight type the runtime can quantise "
                    "to (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k to q6_k, iq4_nl, "
                    "iq4_xs, q4_0_repack, q8_0_repack)\n", cmd, tool_text(tn));
            return 2;
        }
        if (K % bp_type_block_size(t) != 0) {
            fprintf(stderr, "%s: --K needs a multiple of %lld for %s (its block size), not %lld\n",
                    cmd, (long long)bp_type_block_size(t), tn, K);
            return 2;
        }
    }
    bp_plugin_load_all();
    bp_backend *be[8];
    const int nb = tool_open_backends(devices, (int)threads, be, 8, false, NULL);
    if (nb < 0)
        return nb == TOOL_BAD_LIST ? 2 : 1;
    if (limits) {
        const int t = threads > 0 ? (int)threads : 1;
        printf("fma_peak - host %.1f GFLOP/s (%d thread%s)\n", bench_fma_peak(t), t,
               t == 1 ? "" : "s");
        printf("triad 3x256MiB host %.1f GB/s (%d thread%s)\n", bench_triad(t), t,
               t == 1 ? "" : "s");
    }
    for (int i = 0; i < nb; i++) {
        printf("# device: %s (%s)\n", tool_text(bp_backend_get_name(be[i])),
               tool_text(bp_device_get_description(bp_backend_get_device(be[i]))));
        snprintf(tb, sizeof(tb), "%s", types); /* strtok_r above cut it */
        for (char *save = NULL, *tn = strtok_r(tb, ",", &save); tn;
             tn = strtok_r(NULL, ",", &save)) {
            enum bp_type t;
            bool repack;
            if (!bench_weight_type(tn, &t, &repack))
                continue; /* cannot happen: checked above */
            for (int k = 0; k < nN; k++)
                bench_matmul(be[i], tn, t, repack, (long)M, (long)K, (long)Ns[k], min_time);
        }
        bench_add(be[i], 16L << 20, min_time);
    }
    struct rusage ru; /* the weights, activations and buffers of every measurement above */
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        printf("peak_rss host %.1f MiB\n", (double)ru.ru_maxrss / 1024.0); /* Linux: KiB */
    for (int i = 0; i < nb; i++)
        bp_backend_free(be[i]);
    return 0;
}
