/* bench-sched.c - scheduler overhead on the transformer-shaped graph with tiny tensors: the
 * time to split and allocate a graph, and to compute it through the scheduler against
 * computing the same graph on the backend directly. Graphs are rebuilt every iteration, as an
 * inference loop does, and also reused. One result per line: name, shape, threads, value, unit.
 *
 *   bench-sched [--layers 16,64] [--iters 200] [--threads 1] [--backends 1,2] */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

#include "../common/bench-util.h"
#include "../common/transformer.h"

#ifndef BP_BENCH_CPU_DIR
#define BP_BENCH_CPU_DIR ""
#endif
#ifndef BP_BENCH_ACCEL_DIR
#define BP_BENCH_ACCEL_DIR ""
#endif

static struct tf_config config(int layers)
{
    return (struct tf_config){.n_layer = layers, .n_embd = 16, .n_ff = 32, .n_head = 2,
                              .n_vocab = 32, .n_tok = 1, .wtype = BP_TYPE_F32};
}

static bp_graph *build(const struct tf_config *cfg, const struct tf_weights *w, bp_context *ctx,
                       struct tf_graph *tg)
{
    if (!tf_build(ctx, cfg, w, tg))
        return NULL;
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(cfg) + tf_weights_n_tensors(cfg));
    if (g != NULL)
        bp_graph_build_forward(g, tg->logits);
    return g;
}

static void inputs(const struct tf_graph *tg)
{
    int32_t zero = 0;
    uint16_t m = 0;
    bp_tensor_set(tg->tokens, &zero, 0, 4);
    bp_tensor_set(tg->pos, &zero, 0, 4);
    bp_tensor_set(tg->mask, &m, 0, 2);
}

static void bench(bp_backend *const *backends, int nb, int layers, int iters)
{
    const struct tf_config cfg = config(layers);
    bp_context *wctx = bp_context_new(tf_weights_n_tensors(&cfg));
    struct tf_weights w;
    tf_weights_new(wctx, &cfg, &w);
    bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bp_backend_get_default_buffer_type(backends[0]));
    bp_buffer_clear(wbuf, 0);
    bp_buffer_set_usage(wbuf, BP_BUFFER_USAGE_WEIGHTS);
    bp_sched *s = bp_sched_new(backends, NULL, nb, 8192, false);
    char shape[64];
    snprintf(shape, sizeof(shape), "L=%d,backends=%d", layers, nb);

    double *t_split = malloc((size_t)iters * sizeof(double));
    double *t_comp = malloc((size_t)iters * sizeof(double));
    double *t_build = malloc((size_t)iters * sizeof(double));
    int n_nodes = 0, n_splits = 0;
    /* Rebuilt every iteration. */
    for (int it = 0; it < iters; it++) {
        double t0 = bench_now();
        bp_context *ctx = bp_context_new(tf_graph_n_tensors(&cfg));
        struct tf_graph tg;
        bp_graph *g = build(&cfg, &w, ctx, &tg);
        double t1 = bench_now();
        bp_sched_alloc_graph(s, g);
        double t2 = bench_now();
        inputs(&tg);
        double t3 = bench_now();
        bp_sched_graph_compute(s, g);
        double t4 = bench_now();
        t_build[it] = t1 - t0;
        t_split[it] = t2 - t1;
        t_comp[it] = t4 - t3;
        n_nodes = bp_graph_get_n_nodes(g);
        n_splits = bp_sched_get_n_splits(s);
        bp_graph_free(g);
        bp_context_free(ctx);
    }
    double build_us = bench_median(t_build, iters) * 1e6;
    double split_us = bench_median(t_split, iters) * 1e6;
    double comp_us = bench_median(t_comp, iters) * 1e6;
    printf("graph_nodes %s - %d nodes\n", shape, n_nodes);
    printf("splits %s - %d splits\n", shape, n_splits);
    printf("build_graph %s - %.1f us\n", shape, build_us);
    printf("split_alloc %s - %.1f us\n", shape, split_us);
    printf("split_alloc_per_node %s - %.3f us/node\n", shape, split_us / n_nodes);
    printf("compute_sched_rebuilt %s - %.1f us\n", shape, comp_us);

    /* Reused graph: split + allocate + compute every iteration on the same graph object. */
    bp_context *ctx = bp_context_new(tf_graph_n_tensors(&cfg));
    struct tf_graph tg;
    bp_graph *g = build(&cfg, &w, ctx, &tg);
    for (int it = 0; it < iters; it++) {
        double t1 = bench_now();
        bp_sched_alloc_graph(s, g);
        double t2 = bench_now();
        inputs(&tg);
        double t3 = bench_now();
        bp_sched_graph_compute(s, g);
        double t4 = bench_now();
        t_split[it] = t2 - t1;
        t_comp[it] = t4 - t3;
    }
    split_us = bench_median(t_split, iters) * 1e6;
    comp_us = bench_median(t_comp, iters) * 1e6;
    printf("split_alloc_reused %s - %.3f us/node\n", shape, split_us / n_nodes);
    printf("compute_sched_reused %s - %.1f us\n", shape, comp_us);

    /* Computed again unchanged without bp_sched_alloc_graph (new input values only): the
     * scheduler keeps the split and allocation and adds its fingerprint check and the source
     * swaps (what an inference loop that keeps its graph pays per token). */
    for (int it = 0; it < iters; it++) {
        inputs(&tg);
        double t3 = bench_now();
        bp_sched_graph_compute(s, g);
        t_comp[it] = bench_now() - t3;
    }
    const double recomp_us = bench_median(t_comp, iters) * 1e6;
    printf("compute_sched_recomputed %s - %.1f us\n", shape, recomp_us);
    printf("split_alloc_saved_per_node %s - %.3f us/node\n", shape,
           (split_us + comp_us - recomp_us) / n_nodes);

    /* The same graph on the first backend directly (graph allocator, no scheduler). */
    if (nb == 1) {
        bp_buffer_type *bt = bp_backend_get_default_buffer_type(backends[0]);
        bp_gallocr *ga = bp_gallocr_new(&bt, 1);
        bp_gallocr_alloc_graph(ga, g, NULL, NULL);
        inputs(&tg);
        for (int it = 0; it < iters; it++) {
            double t3 = bench_now();
            bp_backend_graph_compute(backends[0], g);
            t_comp[it] = bench_now() - t3;
        }
        double direct_us = bench_median(t_comp, iters) * 1e6;
        printf("compute_direct %s - %.1f us\n", shape, direct_us);
        printf("compute_sched_vs_direct %s - %.2f x\n", shape, comp_us / direct_us);
        printf("recompute_overhead_per_node %s - %.3f us/node\n", shape,
               (recomp_us - direct_us) / n_nodes);
        bp_gallocr_free(ga);
    }
    bp_graph_free(g);
    bp_context_free(ctx);
    free(t_split);
    free(t_comp);
    free(t_build);
    bp_sched_free(s);
    bp_buffer_free(wbuf);
    free(w.layers);
    bp_context_free(wctx);
}

int main(int argc, char **argv)
{
    const int iters = atoi(bench_arg(argc, argv, "--iters", "200"));
    const char *layers = bench_arg(argc, argv, "--layers", "16,64");
    const char *which = bench_arg(argc, argv, "--backends", "1,2");
    char params[32];
    snprintf(params, sizeof(params), "threads=%s", bench_arg(argc, argv, "--threads", "1"));
    if (BP_BENCH_CPU_DIR[0])
        bp_plugin_load_all_from(BP_BENCH_CPU_DIR);
    if (BP_BENCH_ACCEL_DIR[0])
        bp_plugin_load_all_from(BP_BENCH_ACCEL_DIR); /* the test accelerator, if built */
    bp_backend *cpu = bp_backend_init_by_name("CPU", params);
    if (cpu == NULL) {
        fprintf(stderr, "bench-sched: %s\n", bp_last_error());
        return 1;
    }
    bp_backend *accel = bp_device_by_name("ACCEL0") ? bp_backend_init_by_name("ACCEL0", NULL)
                                                     : NULL;
    char lb[64];
    snprintf(lb, sizeof(lb), "%s", layers);
    for (char *save = NULL, *l = strtok_r(lb, ",", &save); l; l = strtok_r(NULL, ",", &save)) {
        bp_backend *one[1] = {cpu};
        if (strchr(which, '1'))
            bench(one, 1, atoi(l), iters);
        if (accel != NULL && strchr(which, '2')) {
            bp_backend *two[2] = {accel, cpu};
            bench(two, 2, atoi(l), iters / 4 > 10 ? iters / 4 : 10);
        }
    }
    bp_backend_free(accel);
    bp_backend_free(cpu);
    return 0;
}
