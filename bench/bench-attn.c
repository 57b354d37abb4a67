/* bench-attn.c - attention on the CPU backend: FLASH_ATTN_EXT against the unfused form
 * backplane run builds without it (MUL_MAT of K and q, SOFT_MAX with a causal mask, the values
 * transposed, MUL_MAT), over the same F16 KV cache, in interleaved pairs. One line per case:
 *
 *   attn T=1 KV=4096 H=32/8 D=128 threads=2 fused 1.23 ms unfused 2.34 ms ratio 1.90 (pairs 15)
 *
 * ratio is the median over pairs of unfused / fused time (above 1: the fused op is faster).
 * The two results are compared (NMSE) before timing: a wrong fused result is an error.
 *
 *   bench-attn [--kv 512,4096] [--tokens 1,128] [--threads 1,2] [--heads 32] [--kv-heads 8]
 *              [--head-dim 128] [--min-time 1.0] */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

#include "../common/bench-util.h"

#ifndef BP_BENCH_CPU_DIR
#define BP_BENCH_CPU_DIR ""
#endif

struct attn_case {
    int64_t T, KV, H, HK, D;
};

/* The graphs of one case over shared leafs: q [D, H, T] (as a decoder makes it), the cache
 * [D * HK, KV] for keys and for values, the causal mask. */
struct attn_graphs {
    bp_context *ctx;
    bp_buffer *buf;
    bp_tensor *mask, *fused, *unfused;
    bp_graph *gf, *gu;
};

static bool build(const struct attn_case *c, struct attn_graphs *g)
{
    memset(g, 0, sizeof(*g));
    g->ctx = bp_context_new(32);
    if (g->ctx == NULL)
        return false;
    bp_context *ctx = g->ctx;
    const float scale = 1.0f / sqrtf((float)c->D);
    bp_tensor *q3 = bp_new_tensor_3d(ctx, BP_TYPE_F32, c->D, c->H, c->T);
    bp_tensor *kc = bp_new_tensor_2d(ctx, BP_TYPE_F16, c->D * c->HK, c->KV);
    bp_tensor *vc = bp_new_tensor_2d(ctx, BP_TYPE_F16, c->D * c->HK, c->KV);
    g->mask = bp_new_tensor_2d(ctx, BP_TYPE_F16, c->KV, c->T);
    if (!q3 || !kc || !vc || !g->mask)
        return false;
    bp_tensor *q = bp_permute(ctx, q3, 0, 2, 1, 3); /* [D, T, H] */
    bp_tensor *K = bp_view_3d(ctx, kc, c->D, c->KV, c->HK, kc->nb[1], (size_t)c->D * kc->nb[0], 0);
    bp_tensor *V = bp_view_3d(ctx, vc, c->D, c->KV, c->HK, vc->nb[1], (size_t)c->D * vc->nb[0], 0);
    g->fused = bp_flash_attn_ext(ctx, q, K, V, NULL, scale, 0.0f, BP_ATTN_CAUSAL);
    bp_tensor *kq = bp_soft_max_ext(ctx, bp_mul_mat(ctx, K, q), g->mask, scale);
    bp_tensor *vt = bp_cont(ctx, bp_permute(ctx, V, 1, 0, 2, 3));
    bp_tensor *kqv = bp_permute(ctx, bp_mul_mat(ctx, vt, kq), 0, 2, 1, 3);
    g->unfused = bp_cont(ctx, kqv); /* [D, H, T] like the fused result */
    g->gf = bp_graph_new(64);
    g->gu = bp_graph_new(64);
    if (!g->fused || !g->unfused || !g->gf || !g->gu ||
        bp_graph_build_forward(g->gf, g->fused) != BP_OK ||
        bp_graph_build_forward(g->gu, g->unfused) != BP_OK)
        return false;
    g->buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    if (g->buf == NULL)
        return false;
    bench_fill(q3, 1);
    bench_fill(kc, 2);
    bench_fill(vc, 3);
    uint16_t *m = malloc((size_t)(c->KV * c->T) * sizeof(uint16_t));
    if (m == NULL)
        return false;
    for (int64_t i = 0; i < c->T; i++)
        for (int64_t j = 0; j < c->KV; j++)
            m[i * c->KV + j] = bp_fp32_to_fp16(j <= c->KV - c->T + i ? 0.0f : -INFINITY);
    const enum bp_status st = bp_tensor_set(g->mask, m, 0, (size_t)(c->KV * c->T) * 2);
    free(m);
    return st == BP_OK;
}

static void release(struct attn_graphs *g)
{
    bp_graph_free(g->gf);
    bp_graph_free(g->gu);
    bp_buffer_free(g->buf);
    bp_context_free(g->ctx);
}

static double nmse(const bp_tensor *x, const bp_tensor *ref)
{
    const float *a = x->data, *b = ref->data;
    double e = 0, n = 0;
    for (int64_t i = 0; i < bp_nelements(ref); i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        n += (double)b[i] * b[i];
    }
    return n > 0 ? e / n : e;
}

static double timed(bp_backend *be, bp_graph *g)
{
    const double t0 = bench_now();
    if (bp_backend_graph_compute(be, g) != BP_OK) {
        fprintf(stderr, "bench-attn: %s\n", bp_last_error());
        exit(1);
    }
    return bench_now() - t0;
}

static int run_case(const struct attn_case *c, int threads, double min_time)
{
    char params[32];
    snprintf(params, sizeof(params), "threads=%d", threads);
    bp_backend *be = bp_backend_init_by_name("CPU", params);
    struct attn_graphs g;
    if (be == NULL || !build(c, &g)) {
        fprintf(stderr, "bench-attn: %s\n", bp_last_error());
        return 1;
    }
    timed(be, g.gf);
    timed(be, g.gu);
    const double err = nmse(g.fused, g.unfused);
    if (!(err < 1e-6)) {
        fprintf(stderr, "bench-attn: T=%lld KV=%lld: fused and unfused results differ (NMSE %g)\n",
                (long long)c->T, (long long)c->KV, err);
        return 1;
    }
    enum { MAX_PAIRS = 200 };
    double tf[MAX_PAIRS], tu[MAX_PAIRS], ratio[MAX_PAIRS];
    int n = 0;
    const double start = bench_now();
    while (n < MAX_PAIRS && (n < 5 || bench_now() - start < min_time)) {
        /* Alternate which goes first, so neither always meets the other's cache state. */
        if (n % 2 == 0) {
            tf[n] = timed(be, g.gf);
            tu[n] = timed(be, g.gu);
        } else {
            tu[n] = timed(be, g.gu);
            tf[n] = timed(be, g.gf);
        }
        ratio[n] = tu[n] / tf[n];
        n++;
    }
    printf("attn T=%lld KV=%lld H=%lld/%lld D=%lld threads=%d fused %.3f ms unfused %.3f ms "
           "ratio %.2f (pairs %d)\n",
           (long long)c->T, (long long)c->KV, (long long)c->H, (long long)c->HK, (long long)c->D,
           threads, bench_median(tf, n) * 1e3, bench_median(tu, n) * 1e3, bench_median(ratio, n),
           n);
    fflush(stdout);
    release(&g);
    bp_backend_free(be);
    return 0;
}

int main(int argc, char **argv)
{
    long kv[8], tokens[8], threads[8];
    const int nkv = bench_parse_list(bench_arg(argc, argv, "--kv", "512,4096"), kv, 8);
    const int nt = bench_parse_list(bench_arg(argc, argv, "--tokens", "1,128"), tokens, 8);
    const int nth = bench_parse_list(bench_arg(argc, argv, "--threads", "1,2"), threads, 8);
    const int64_t H = atol(bench_arg(argc, argv, "--heads", "32"));
    const int64_t HK = atol(bench_arg(argc, argv, "--kv-heads", "8"));
    const int64_t D = atol(bench_arg(argc, argv, "--head-dim", "128"));
    const double min_time = atof(bench_arg(argc, argv, "--min-time", "1.0"));
    if (nkv < 1 || nt < 1 || nth < 1 || H < 1 || HK < 1 || H % HK != 0 || D < 1) {
        fprintf(stderr, "bench-attn: bad arguments (see the header of bench/bench-attn.c)\n");
        return 2;
    }
    if (bp_device_by_name("CPU") == NULL)
        bench_load_plugins(BP_BENCH_CPU_DIR);
    printf("# bench-attn: F16 KV cache, causal; ratio = unfused / fused time, median of "
           "interleaved pairs\n");
    for (int a = 0; a < nkv; a++)
        for (int b = 0; b < nt; b++)
            for (int t = 0; t < nth; t++) {
                if (tokens[b] > kv[a])
                    continue;
                const struct attn_case c = {tokens[b], kv[a], H, HK, D};
                if (run_case(&c, (int)threads[t], min_time) != 0)
                    return 1;
            }
    return 0;
}
