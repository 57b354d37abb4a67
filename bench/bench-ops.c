/* bench-ops.c - per-node dispatch cost of the CPU backend: a graph of ~1,800 tiny ops (the
 * shape of token-by-token generation, where ops are too small to amortise anything), timed
 * with 1 and 2 threads. One result per line: name, shape, threads, value, unit.
 *
 *   bench-ops [--nodes 1800] [--width 16] [--threads 1,2] [--reps 200] [--busy]
 *   bench-ops --device CUDA0 [--n 67108864] [--min-time 1.0]
 *
 * --busy measures every thread count twice: quiet, then with one busy process beside it (a
 * child spinning on a core, started here and killed after the measurement, at most a minute),
 * as on a shared machine: the contention figures of docs/cpu.md.
 *
 * With a CUDA device it measures instead the bandwidth of large element-wise ops beside
 * cudaMemcpy (bench-cuda.c). */
#include "config.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <backplane/backplane.h>

#include "../common/bench-util.h"

#ifdef BP_BENCH_CUDA
#include "bench-cuda.h"
#endif

#ifndef BP_BENCH_CPU_DIR
#define BP_BENCH_CPU_DIR ""
#endif
#ifndef BP_BENCH_CUDA_DIR
#define BP_BENCH_CUDA_DIR ""
#endif

/* A child process spinning until killed (or for at most a minute): the competing load. */
static pid_t start_busy(void)
{
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        for (volatile unsigned long x = 0;; x++) {
        }
    }
    return pid;
}

static void stop_busy(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

/* The median time of one graph compute on a CPU backend with `threads`, after a warm-up. */
static double time_graph(bp_graph *g, const char *threads, int reps)
{
    char params[32];
    snprintf(params, sizeof(params), "threads=%s", threads);
    bp_backend *be = bp_backend_init_by_name("CPU", params);
    if (be == NULL) {
        fprintf(stderr, "bench-ops: %s\n", bp_last_error());
        exit(1);
    }
    for (int i = 0; i < 10; i++)
        bp_backend_graph_compute(be, g);
    double *times = malloc((size_t)reps * sizeof(double));
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        bp_backend_graph_compute(be, g);
        times[r] = bench_now() - t0;
    }
    const double med = bench_median(times, reps);
    free(times);
    bp_backend_free(be);
    return med;
}

int main(int argc, char **argv)
{
    const int n_nodes = atoi(bench_arg(argc, argv, "--nodes", "1800"));
    const int width = atoi(bench_arg(argc, argv, "--width", "16"));
    const int reps = atoi(bench_arg(argc, argv, "--reps", "200"));
    const char *threads = bench_arg(argc, argv, "--threads", "1,2");
    const char *device = bench_arg(argc, argv, "--device", "CPU");

    if (strncmp(device, "CUDA", 4) == 0) {
#ifdef BP_BENCH_CUDA
        if (bp_device_by_name(device) == NULL)
            bench_load_plugins(BP_BENCH_CUDA_DIR);
        return bench_cuda_ops(device, atol(bench_arg(argc, argv, "--n", "67108864")),
                              atof(bench_arg(argc, argv, "--min-time", "1.0")));
#else
        printf("# %s: this build has no CUDA: skipped\n", device);
        return 0;
#endif
    }

    if (bp_device_by_name("CPU") == NULL)
        bench_load_plugins(BP_BENCH_CPU_DIR);
    bp_context *ctx = bp_context_new((size_t)n_nodes + 8);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, width);
    bp_tensor *y = bp_new_tensor_1d(ctx, BP_TYPE_F32, width);
    bp_tensor *t = x;
    /* A mix of the small ops a decoder step is made of. */
    for (int i = 0; i < n_nodes; i++) {
        switch (i % 4) {
        case 0:
            t = bp_add(ctx, t, y);
            break;
        case 1:
            t = bp_mul(ctx, t, y);
            break;
        case 2:
            t = bp_scale(ctx, t, 0.5f);
            break;
        default:
            t = bp_silu(ctx, t);
            break;
        }
    }
    bp_graph *g = bp_graph_new((size_t)n_nodes + 8);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    if (g == NULL || buf == NULL || bp_graph_build_forward(g, t) != BP_OK) {
        fprintf(stderr, "bench-ops: %s\n", bp_last_error());
        return 1;
    }
    bp_buffer_clear(buf, 0);

    const bool busy = bench_flag(argc, argv, "--busy");
    char tb[64];
    snprintf(tb, sizeof(tb), "%s", threads);
    for (char *save = NULL, *tn = strtok_r(tb, ",", &save); tn; tn = strtok_r(NULL, ",", &save)) {
        const double med = time_graph(g, tn, reps);
        printf("dispatch nodes=%d,width=%d %s %.3f us/node\n", bp_graph_get_n_nodes(g), width, tn,
               med / bp_graph_get_n_nodes(g) * 1e6);
        printf("graph nodes=%d,width=%d %s %.1f us\n", bp_graph_get_n_nodes(g), width, tn, med * 1e6);
        if (busy) {
            fflush(stdout);
            const pid_t pid = start_busy();
            const double b = time_graph(g, tn, reps);
            stop_busy(pid);
            printf("graph_beside_busy nodes=%d,width=%d %s %.1f us (%.2fx quiet)\n",
                   bp_graph_get_n_nodes(g), width, tn, b * 1e6, b / med);
        }
        fflush(stdout);
    }
    bp_buffer_free(buf);
    bp_graph_free(g);
    bp_context_free(ctx);
    return 0;
}
