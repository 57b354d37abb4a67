/* bench-alloc.c - compute-buffer size the graph allocator needs for a transformer graph,
 * against the naive sum of every intermediate tensor. Prints one result per line:
 * name, shape, threads, value, unit. Never fails on a number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/transformer.h"

static int parse(int argc, char **argv, const char *key, int def)
{
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], key) == 0)
            return atoi(argv[i + 1]);
    }
    return def;
}

int main(int argc, char **argv)
{
    struct tf_config cfg = {
        .n_layer = parse(argc, argv, "--layers", 64),
        .n_embd = parse(argc, argv, "--embd", 512),
        .n_ff = parse(argc, argv, "--ff", 1376),
        .n_head = parse(argc, argv, "--heads", 8),
        .n_vocab = parse(argc, argv, "--vocab", 32000),
        .n_tok = parse(argc, argv, "--seq", 128),
        .wtype = BP_TYPE_F32,
    };
    bp_context *wctx = bp_context_new(tf_weights_n_tensors(&cfg));
    bp_context *ctx = bp_context_new(tf_graph_n_tensors(&cfg));
    struct tf_weights w;
    struct tf_graph tg;
    if (wctx == NULL || ctx == NULL || !tf_weights_new(wctx, &cfg, &w) ||
        !tf_build(ctx, &cfg, &w, &tg)) {
        fprintf(stderr, "bench-alloc: %s\n", bp_last_error());
        return 1;
    }
    /* The weights get memory of their own first (untouched pages cost nothing), so the graph
     * allocator sees them as placed and sizes only the compute buffer. */
    bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bp_host_buffer_type());
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(&cfg) + tf_weights_n_tensors(&cfg));
    bp_buffer_type *host = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&host, 1);
    if (wbuf == NULL || g == NULL || ga == NULL || bp_graph_build_forward(g, tg.logits) != BP_OK ||
        bp_gallocr_reserve(ga, g, NULL, NULL) != BP_OK) {
        fprintf(stderr, "bench-alloc: %s\n", bp_last_error());
        return 1;
    }

    size_t naive = 0, align = bp_buffer_type_get_alignment(host);
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        bp_tensor *t = bp_graph_get_node(g, i);
        if (t->view_src == NULL)
            naive += (bp_nbytes(t) + align - 1) / align * align;
    }
    for (int i = 0; i < bp_graph_get_n_leafs(g); i++) {
        bp_tensor *t = bp_graph_get_leaf(g, i);
        if (t->buffer != wbuf)
            naive += (bp_nbytes(t) + align - 1) / align * align;
    }
    /* No allocator can go below this: the inputs live throughout, and the logits are written
     * while the normalised hidden state they are computed from is still being read. */
    size_t floor_bytes = 0;
    const bp_tensor *at_end[] = {tg.tokens, tg.pos, tg.mask, tg.logits, tg.logits->src[1]};
    for (size_t i = 0; i < sizeof(at_end) / sizeof(at_end[0]); i++)
        floor_bytes += (bp_nbytes(at_end[i]) + align - 1) / align * align;
    size_t got = bp_gallocr_get_buffer_size(ga, 0);
    char shape[160];
    snprintf(shape, sizeof(shape), "L=%d,embd=%d,ff=%d,heads=%d,seq=%d,vocab=%d", cfg.n_layer,
             cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_tok, cfg.n_vocab);
    printf("graph_nodes %s 1 %d nodes\n", shape, bp_graph_get_n_nodes(g));
    printf("nodes_per_layer %s 1 %.1f nodes\n", shape,
           (double)(bp_graph_get_n_nodes(g) - 4) / cfg.n_layer);
    printf("compute_buffer %s 1 %zu bytes\n", shape, got);
    printf("compute_buffer %s 1 %.2f MiB\n", shape, (double)got / (1 << 20));
    printf("lower_bound %s 1 %zu bytes\n", shape, floor_bytes);
    printf("naive_sum %s 1 %.2f MiB\n", shape, (double)naive / (1 << 20));
    printf("saving %s 1 %.1f x\n", shape, (double)naive / (double)got);

    bp_gallocr_free(ga);
    bp_graph_free(g);
    bp_buffer_free(wbuf);
    free(w.layers);
    bp_context_free(ctx);
    bp_context_free(wctx);
    return 0;
}
