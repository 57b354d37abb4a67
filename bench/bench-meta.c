/* bench-meta.c - tensor parallelism on CPU devices: an MLP-heavy transformer layer computed on
 * Meta(CPU0,CPU1) with one thread per device against one CPU device with two threads, in the
 * same run. Reports the median step time of each, their throughput ratio and the share of the
 * meta step spent in all-reduces. Passes alternate between the two. One result per line: name,
 * shape, threads, value, unit.
 *
 *   bench-meta [--shapes 512x2048x8,1024x4096x32,2048x8192x64] [--iters 15] */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>
#include <backplane/bp-meta.h>

#include "../common/bench-util.h"
#include "../common/transformer.h"

#ifndef BP_BENCH_CPU_DIR
#define BP_BENCH_CPU_DIR ""
#endif
#ifndef BP_BENCH_META_DIR
#define BP_BENCH_META_DIR ""
#endif

/* One forward pass of a config with weights and activations in one backend's buffers. */
struct prepared {
    bp_backend *be;
    bp_context *wctx, *ctx;
    struct tf_weights w;
    bp_buffer *wbuf, *abuf;
    bp_graph *g;
};

static void release(struct prepared *p)
{
    bp_graph_free(p->g);
    bp_buffer_free(p->abuf);
    bp_context_free(p->ctx);
    bp_buffer_free(p->wbuf);
    free(p->w.layers);
    bp_context_free(p->wctx);
}

static bool prepare(struct prepared *p, bp_backend *be, const struct tf_config *cfg)
{
    memset(p, 0, sizeof(*p));
    p->be = be;
    bp_buffer_type *buft = bp_backend_get_default_buffer_type(be);
    struct tf_graph tg;
    p->wctx = bp_context_new(tf_weights_n_tensors(cfg));
    p->ctx = bp_context_new(tf_graph_n_tensors(cfg));
    if (p->wctx == NULL || p->ctx == NULL || !tf_weights_new(p->wctx, cfg, &p->w) ||
        !tf_build(p->ctx, cfg, &p->w, &tg))
        goto fail;
    p->wbuf = bp_alloc_ctx_tensors(p->wctx, buft);
    p->abuf = bp_alloc_ctx_tensors(p->ctx, buft);
    p->g = bp_graph_new(tf_graph_n_tensors(cfg) + tf_weights_n_tensors(cfg));
    if (p->wbuf == NULL || p->abuf == NULL || p->g == NULL ||
        bp_graph_build_forward(p->g, tg.logits) != BP_OK)
        goto fail;
    bp_buffer_set_usage(p->wbuf, BP_BUFFER_USAGE_WEIGHTS);
    /* Small values keep the activations finite; the figures do not depend on them. */
    for (size_t i = 0; i < bp_context_get_n_tensors(p->wctx); i++) {
        bp_tensor *wt = bp_context_get_tensor(p->wctx, i);
        const size_t n = (size_t)bp_nelements(wt);
        float *v = malloc(n * sizeof(float));
        if (v == NULL)
            goto fail;
        for (size_t j = 0; j < n; j++)
            v[j] = (float)((j * 2654435761u) % 1000) * 1e-5f - 0.005f;
        bp_tensor_set(wt, v, 0, n * sizeof(float));
        free(v);
    }
    int32_t tok[4096];
    for (int i = 0; i < cfg->n_tok; i++)
        tok[i] = i % cfg->n_vocab;
    bp_buffer_clear(p->abuf, 0); /* an all-zero mask: every token sees every token */
    bp_tensor_set(tg.tokens, tok, 0, (size_t)cfg->n_tok * 4);
    bp_tensor_set(tg.pos, tok, 0, (size_t)cfg->n_tok * 4);
    if (bp_backend_graph_compute(be, p->g) != BP_OK) /* warm-up */
        goto fail;
    return true;
fail:
    fprintf(stderr, "bench-meta: %s: %s\n", bp_backend_get_name(be), bp_last_error());
    release(p);
    return false;
}

static double timed(struct prepared *p)
{
    const double t0 = bench_now();
    bp_backend_graph_compute(p->be, p->g);
    return bench_now() - t0;
}

int main(int argc, char **argv)
{
    const int iters = atoi(bench_arg(argc, argv, "--iters", "15"));
    char shapes[256];
    snprintf(shapes, sizeof(shapes), "%s",
             bench_arg(argc, argv, "--shapes", "512x2048x8,1024x4096x32,2048x8192x64"));
    setenv("BP_CPU_DEVICES", "2", 0);
    if (BP_BENCH_CPU_DIR[0])
        bp_plugin_load_all_from(BP_BENCH_CPU_DIR);
    if (BP_BENCH_META_DIR[0])
        bp_plugin_load_all_from(BP_BENCH_META_DIR);
    bp_backend *one = bp_backend_init_by_name("CPU0", "threads=2");
    bp_backend *meta = bp_backend_init_by_name("Meta(CPU0,CPU1)", "threads=1");
    bp_registry *reg = bp_registry_by_name("Meta");
    bp_meta_backend_stats_fn stats =
        reg ? (bp_meta_backend_stats_fn)bp_registry_get_proc_address(reg, "bp_meta_backend_stats")
            : NULL;
    if (one == NULL || meta == NULL || stats == NULL) {
        fprintf(stderr, "bench-meta: %s\n", bp_last_error());
        bp_backend_free(one);
        bp_backend_free(meta);
        return 1;
    }
    for (char *save = NULL, *s = strtok_r(shapes, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        int embd = 0, ff = 0, tok = 0;
        if (sscanf(s, "%dx%dx%d", &embd, &ff, &tok) != 3 || embd < 64 || ff < 1 || tok < 1 ||
            tok > 4096) {
            fprintf(stderr, "bench-meta: bad shape '%s' (n_embd x n_ff x n_tok)\n", s);
            continue;
        }
        const struct tf_config cfg = {.n_layer = 1, .n_embd = embd, .n_ff = ff,
                                      .n_head = embd / 64, .n_vocab = 256, .n_tok = tok,
                                      .wtype = BP_TYPE_F32};
        struct prepared single, split;
        if (!prepare(&single, one, &cfg))
            continue;
        if (!prepare(&split, meta, &cfg)) {
            release(&single);
            continue;
        }
        /* Alternating passes, so that a change in the machine's load hits both alike. */
        double *ts = malloc((size_t)iters * sizeof(double)), *tm = malloc((size_t)iters * sizeof(double));
        double *ratio = malloc((size_t)iters * sizeof(double));
        int r0 = 0, r1 = 0;
        double s0 = 0, s1 = 0;
        stats(meta, &r0, &s0);
        for (int it = 0; ts && tm && ratio && it < iters; it++) {
            ts[it] = timed(&single);
            tm[it] = timed(&split);
            ratio[it] = ts[it] / tm[it];
        }
        stats(meta, &r1, &s1);
        release(&split);
        release(&single);
        if (ts == NULL || tm == NULL || ratio == NULL) {
            free(ts);
            free(tm);
            free(ratio);
            continue;
        }
        double reduce_total = s1 - s0, meta_total = 0;
        for (int it = 0; it < iters; it++)
            meta_total += tm[it];
        const double t1 = bench_median(ts, iters), tmed = bench_median(tm, iters);
        const double rmed = bench_median(ratio, iters), share = reduce_total / meta_total;
        free(ts);
        free(tm);
        free(ratio);
        char shape[96];
        snprintf(shape, sizeof(shape), "embd=%d,ff=%d,tok=%d,vocab=256,f32", embd, ff, tok);
        printf("cpu0_2threads %s 2 %.3f ms\n", shape, t1 * 1e3);
        printf("meta_cpu0_cpu1_1thread_each %s 2 %.3f ms\n", shape, tmed * 1e3);
        printf("meta_vs_single_throughput %s 2 %.2f x (median of per-pass ratios)\n", shape, rmed);
        printf("meta_allreduces_per_step %s 2 %d\n", shape, (r1 - r0) / iters);
        printf("meta_allreduce_share %s 2 %.1f %%\n", shape, share * 100);
        fflush(stdout);
    }
    bp_backend_free(meta);
    bp_backend_free(one);
    return 0;
}
