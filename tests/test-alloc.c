/* test-alloc.c - the linear allocator, bp_alloc_ctx_tensors and the graph allocator, with a
 * property test over hundreds of random graphs: no tensor is written while another tensor that
 * is still needed overlaps it, and every output has the value it has when nothing is shared. */
#include <stdlib.h>

#include "../common/ref.h"
#include "test-device.h"
#include "test-util.h"

START_TEST(test_linear_allocator)
{
    bp_context *ctx = bp_context_new(8);
    bp_buffer *buf = bp_buffer_type_alloc(bp_host_buffer_type(), 256);
    struct bp_tallocr ta = bp_tallocr_init(buf);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 3); /* 12 bytes */
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, 20);
    bp_tensor *c = bp_new_tensor_1d(ctx, BP_TYPE_F32, 30);
    ck_assert_int_eq(bp_tallocr_alloc(&ta, a), BP_OK);
    ck_assert_int_eq(bp_tallocr_alloc(&ta, b), BP_OK);
    char *base = bp_buffer_get_base(buf);
    ck_assert_ptr_eq(a->data, base);
    ck_assert_ptr_eq(b->data, base + 64); /* aligned past a */
    ck_assert_int_eq(bp_tallocr_alloc(&ta, c), BP_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "needs 120 bytes at offset 192"));
    ck_assert_ptr_null(c->data);
    ck_assert_int_eq(bp_tallocr_alloc(&ta, bp_view_1d(ctx, a, 1, 0)), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tallocr_alloc(NULL, a), BP_ERR_INVALID_ARG);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_alloc_ctx_tensors)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 3);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 5, 7);
    bp_tensor *v = bp_view_1d(ctx, x, 5, 20);
    bp_tensor *t = bp_transpose(ctx, x);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(buf);
    char *base = bp_buffer_get_base(buf);
    ck_assert_ptr_eq(w->buffer, buf);
    ck_assert_ptr_eq(x->buffer, buf);
    /* Distinct, aligned, inside the buffer, not overlapping. */
    ck_assert_uint_eq(((char *)w->data - base) % 64, 0);
    ck_assert_uint_eq(((char *)x->data - base) % 64, 0);
    ck_assert((char *)x->data >= (char *)w->data + bp_nbytes(w) ||
              (char *)w->data >= (char *)x->data + bp_nbytes(x));
    ck_assert_uint_le((size_t)((char *)x->data - base) + bp_nbytes(x), bp_buffer_get_size(buf));
    ck_assert_ptr_eq(v->data, (char *)x->data + 20);
    ck_assert_ptr_eq(t->data, x->data);
    ck_assert_ptr_eq(t->buffer, buf);

    /* Everything already placed: a zero-sized buffer, nothing moves. */
    void *before = x->data;
    bp_buffer *empty = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(empty);
    ck_assert_uint_eq(bp_buffer_get_size(empty), 0);
    ck_assert_ptr_eq(x->data, before);
    bp_buffer_free(empty);
    bp_buffer_free(buf);

    /* Larger than the buffer type allows: a clear error, no tensor left pointing anywhere. */
    bp_registry *reg = test_device_registry_new(1024);
    bp_context *big = bp_context_new(4);
    bp_tensor *h = bp_new_tensor_1d(big, BP_TYPE_F32, 1000);
    ck_assert_rejected(bp_alloc_ctx_tensors(big, bp_device_get_buffer_type(bp_registry_get_device(reg, 0))),
                       BP_ERR_OUT_OF_MEMORY, "largest buffer is 1024 bytes");
    ck_assert_ptr_null(h->data);
    ck_assert_rejected(bp_alloc_ctx_tensors(NULL, bp_host_buffer_type()), BP_ERR_INVALID_ARG, "NULL");
    bp_context_free(big);
    bp_registry_free(reg);
    bp_context_free(ctx);
}
END_TEST

static bool overlaps(const bp_tensor *a, const bp_tensor *b)
{
    const char *a0 = a->data, *b0 = b->data;
    size_t na = bp_nbytes(a), nb = bp_nbytes(b);
    return na && nb && a0 < b0 + nb && b0 < a0 + na;
}

START_TEST(test_gallocr_reuse_inplace_and_pinning)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *x = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_F32, 256), "x"); /* 1 KiB each */
    bp_set_input(x);
    bp_tensor *a = bp_exp(ctx, x);
    bp_tensor *b = bp_relu(ctx, a);   /* a's last user: may take a's memory */
    bp_tensor *c = bp_neg(ctx, b);    /* b has two users: not in place */
    bp_tensor *d = bp_add(ctx, c, b);
    bp_set_output(c);                 /* c must survive, so d cannot reuse it */
    bp_tensor *e = bp_sqr(ctx, d);
    bp_graph *g = bp_graph_new(16);
    ck_assert_int_eq(bp_graph_build_forward(g, e), BP_OK);

    bp_buffer_type *h = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&h, 1);
    ck_assert_uint_eq(bp_gallocr_get_buffer_size(ga, 0), 0);
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, NULL, NULL), BP_OK);
    ck_assert_ptr_eq(b->data, a->data);  /* in place */
    ck_assert_ptr_ne(c->data, b->data);  /* b still needed by d */
    ck_assert_ptr_eq(d->data, b->data);  /* b's last user, c is an output */
    ck_assert_ptr_eq(e->data, d->data);
    ck_assert(!overlaps(x, a));          /* the input is never reused */
    ck_assert(!overlaps(c, d));
    /* x, a(=b=d=e) and c: three blocks instead of six. */
    ck_assert_uint_eq(bp_gallocr_get_buffer_size(ga, 0), 3 * 1024);
    ck_assert_int_eq(bp_gallocr_get_n_reallocs(ga), 0);

    /* Computing through the placement gives the reference values. */
    float xv[256];
    for (int i = 0; i < 256; i++)
        xv[i] = (float)(i % 17) / 8.0f - 1.0f;
    ck_assert_int_eq(bp_tensor_set(x, xv, 0, sizeof(xv)), BP_OK);
    ck_assert(ref_compute_graph(g));
    for (int i = 0; i < 256; i++) {
        double bb = exp(xv[i]), cc = -bb, dd = cc + bb;
        ck_assert_double_eq_tol(((float *)c->data)[i], cc, 1e-5);
        ck_assert_double_eq_tol(((float *)e->data)[i], dd * dd, 1e-6);
    }
    bp_gallocr_free(ga);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

/* A view keeps its source alive until the view's own consumers have run. */
START_TEST(test_gallocr_views_keep_source_alive)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 4);
    bp_tensor *a = bp_exp(ctx, x);
    bp_tensor *v = bp_view_1d(ctx, a, 64, 64 * 4 * 2); /* row 2 of a */
    bp_graph *g = bp_graph_new(32);
    ck_assert_int_eq(bp_graph_build_forward(g, v), BP_OK); /* a and v come first */
    bp_tensor *b = bp_neg(ctx, x);                         /* computed while v is pending */
    bp_tensor *c = bp_sqr(ctx, b);
    bp_tensor *w = bp_add(ctx, c, v);
    ck_assert_int_eq(bp_graph_build_forward(g, w), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 5);
    bp_buffer_type *h = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&h, 1);
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, NULL, NULL), BP_OK);
    ck_assert_ptr_eq(v->data, (char *)a->data + 512);
    ck_assert(!overlaps(a, b));
    ck_assert(!overlaps(a, c));
    ck_assert(!overlaps(a, w));
    ck_assert_ptr_eq(c->data, b->data); /* in place, away from a */

    /* Without the pending view, a's memory is free again once v's consumer has run. */
    bp_context *c2 = bp_context_new(32);
    bp_tensor *x2 = bp_new_tensor_2d(c2, BP_TYPE_F32, 64, 4);
    bp_tensor *a2 = bp_exp(c2, x2);
    bp_tensor *s2 = bp_sum_rows(c2, bp_view_1d(c2, a2, 64, 0));
    bp_graph *g2 = bp_graph_new(32);
    ck_assert_int_eq(bp_graph_build_forward(g2, s2), BP_OK);
    bp_tensor *b2 = bp_neg(c2, x2);
    ck_assert_int_eq(bp_graph_build_forward(g2, bp_add(c2, b2, s2)), BP_OK);
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g2, NULL, NULL), BP_OK);
    ck_assert_ptr_eq(b2->data, a2->data);
    bp_graph_free(g2);
    bp_context_free(c2);

    bp_gallocr_free(ga);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

static bp_graph *chain_graph(bp_context *ctx, int64_t n, int len)
{
    bp_tensor *t = bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, n);
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 32);
    for (int i = 0; i < len; i++)
        t = bp_silu(ctx, bp_mul_mat(ctx, w, t));
    bp_graph *g = bp_graph_new(4 * (size_t)len + 4);
    bp_graph_build_forward(g, t);
    return g;
}

START_TEST(test_gallocr_reserve_then_smaller_graphs)
{
    bp_buffer_type *h = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&h, 1);
    bp_context *wc = bp_context_new(64);
    bp_graph *worst = chain_graph(wc, 128, 6);
    ck_assert_int_eq(bp_gallocr_reserve(ga, worst, NULL, NULL), BP_OK);
    size_t reserved = bp_gallocr_get_buffer_size(ga, 0);
    ck_assert_uint_gt(reserved, 0);
    /* Far below the naive sum of every intermediate (12 of 16 KiB plus the leafs). */
    ck_assert_uint_lt(reserved, 6 * 2 * 128 * 32 * 4);
    for (int64_t n = 1; n <= 128; n += 9) {
        bp_context *c = bp_context_new(64);
        bp_graph *g = chain_graph(c, n, 6);
        ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, NULL, NULL), BP_OK);
        ck_assert_int_eq(bp_gallocr_get_n_reallocs(ga), 0);
        ck_assert_uint_eq(bp_gallocr_get_buffer_size(ga, 0), reserved);
        bp_graph_free(g);
        bp_context_free(c);
    }
    /* A bigger graph than reserved grows the buffer and says so. */
    bp_context *c = bp_context_new(64);
    bp_graph *g = chain_graph(c, 512, 6);
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, NULL, NULL), BP_OK);
    ck_assert_int_eq(bp_gallocr_get_n_reallocs(ga), 1);
    ck_assert_uint_gt(bp_gallocr_get_buffer_size(ga, 0), reserved);
    bp_graph_free(g);
    bp_context_free(c);
    /* The one-buffer-type shortcuts plan exactly as the general calls do. */
    bp_gallocr *g1 = bp_gallocr_new_1(h);
    ck_assert_ptr_nonnull(g1);
    ck_assert_int_eq(bp_gallocr_reserve_1(g1, worst), BP_OK);
    ck_assert_uint_eq(bp_gallocr_get_buffer_size(g1, 0), reserved);
    ck_assert_int_eq(bp_gallocr_alloc_graph_1(g1, worst), BP_OK);
    ck_assert_int_eq(bp_gallocr_get_n_reallocs(g1), 0);
    bp_gallocr_free(g1);
    ck_assert_rejected(bp_gallocr_new_1(NULL), BP_ERR_INVALID_ARG, "buffer type 0 is NULL");
    ck_assert_rejected(bp_alloc_ctx_tensors_for_backend(wc, NULL), BP_ERR_INVALID_ARG,
                       "bp_alloc_ctx_tensors_for_backend: backend is NULL");
    bp_graph_free(worst);
    bp_context_free(wc);
    bp_gallocr_free(ga);
}
END_TEST

/* Tensors at the size limit: the allocators' sums and alignment must not wrap. Two live
 * 2^62-byte tensors need more than any plan can address; the plan says so instead of wrapping
 * into a small buffer. */
START_TEST(test_alloc_sizes_never_wrap)
{
    bp_buffer_type *h = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&h, 1);
    bp_context *ctx = bp_context_new(8);
    int64_t n = (int64_t)(BP_MAX_TENSOR_BYTES / 4);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, n), *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, n);
    bp_graph *g = bp_graph_new(8);
    bp_graph_build_forward(g, bp_add(ctx, a, b));
    bp_clear_error();
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, NULL, NULL), BP_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "the plan would pass"));
    ck_assert_ptr_null(a->data);
    /* The same tensors through bp_alloc_ctx_tensors: the total is refused, not wrapped. */
    bp_context *c2 = bp_context_new(8);
    for (int i = 0; i < 5; i++)
        ck_assert_ptr_nonnull(bp_new_tensor_1d(c2, BP_TYPE_F32, n));
    ck_assert_rejected(bp_alloc_ctx_tensors(c2, h), BP_ERR_OUT_OF_MEMORY, "more than SIZE_MAX");
    /* The linear allocator refuses a tensor whose end would wrap. */
    bp_buffer *buf = bp_buffer_type_alloc(h, 64);
    struct bp_tallocr ta = bp_tallocr_init(buf);
    ck_assert_int_eq(bp_tallocr_alloc(&ta, bp_context_get_tensor(c2, 0)), BP_ERR_OUT_OF_MEMORY);
    bp_buffer_free(buf);
    bp_context_free(c2);
    bp_graph_free(g);
    bp_context_free(ctx);
    bp_gallocr_free(ga);
}
END_TEST

START_TEST(test_gallocr_errors)
{
    ck_assert_rejected(bp_gallocr_new(NULL, 1), BP_ERR_INVALID_ARG, "at least one");
    bp_buffer_type *none[1] = {NULL};
    ck_assert_rejected(bp_gallocr_new(none, 1), BP_ERR_INVALID_ARG, "buffer type 0 is NULL");
    bp_buffer_type *h = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&h, 1);
    bp_context *ctx = bp_context_new(8);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, bp_neg(ctx, x));
    int bad[1] = {3};
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, bad, NULL), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "is placed in buffer type 3, but the allocator "
                                 "has 1 buffer type (0 to 0)"));
    bad[0] = -1;
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, bad, NULL), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "node 0, unnamed NEG result f32 [4, 1, 1, 1], "
                                 "is placed in no buffer type"));
    ck_assert_ptr_null(strstr(bp_last_error(), "buffer type id"));
    ck_assert_int_eq(bp_gallocr_reserve(ga, g, NULL, bad), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_gallocr_reserve(NULL, g, NULL, NULL), BP_ERR_INVALID_ARG);
    /* A graph view whose sources lie outside it and have no memory. */
    bp_graph *g2 = bp_graph_new(4);
    bp_graph_build_forward(g2, bp_exp(ctx, bp_neg(ctx, x)));
    bp_graph *tail = bp_graph_view(g2, 1, 2);
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, tail, NULL, NULL), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "not in the graph"));
    /* Growing beyond a buffer type's limit fails cleanly. */
    bp_registry *reg = test_device_registry_new(512);
    bp_buffer_type *small = bp_device_get_buffer_type(bp_registry_get_device(reg, 0));
    bp_gallocr *gs = bp_gallocr_new(&small, 1);
    bp_context *c2 = bp_context_new(4);
    bp_graph *g3 = bp_graph_new(4);
    bp_graph_build_forward(g3, bp_neg(c2, bp_new_tensor_1d(c2, BP_TYPE_F32, 1000)));
    ck_assert_int_eq(bp_gallocr_reserve(gs, g3, NULL, NULL), BP_ERR_OUT_OF_MEMORY);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "largest buffer"));
    bp_graph_free(g3);
    bp_context_free(c2);
    bp_gallocr_free(gs);
    bp_registry_free(reg);
    bp_graph_free(tail);
    bp_graph_free(g2);
    bp_graph_free(g);
    bp_context_free(ctx);
    bp_gallocr_free(ga);
    bp_gallocr_free(NULL);
}
END_TEST

/* ---- Property test ----------------------------------------------------------------------- */

struct rng {
    uint64_t s;
};

static uint32_t rnd(struct rng *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

static int64_t rdim(struct rng *r)
{
    return 1 + rnd(r) % 6;
}

/* Builds the same random graph for the same seed; returns its last tensor. */
static bp_tensor *random_graph(bp_context *ctx, uint64_t seed)
{
    struct rng r = {seed * 2654435761u + 1};
    bp_tensor *pool[96];
    int n = 0;
    int n_leafs = 2 + (int)(rnd(&r) % 3);
    for (int i = 0; i < n_leafs; i++) {
        pool[n] = bp_new_tensor_3d(ctx, BP_TYPE_F32, rdim(&r), rdim(&r), 1 + rnd(&r) % 2);
        if (rnd(&r) % 2)
            bp_set_input(pool[n]);
        n++;
    }
    static const enum bp_unary_op unary[] = {BP_UNARY_OP_NEG, BP_UNARY_OP_ABS, BP_UNARY_OP_RELU,
                                             BP_UNARY_OP_SILU, BP_UNARY_OP_TANH, BP_UNARY_OP_SQR};
    int n_ops = 8 + (int)(rnd(&r) % 32);
    bp_tensor *t = pool[n - 1];
    for (int k = 0; k < n_ops && n < 90; k++) {
        bp_tensor *a = pool[rnd(&r) % (uint32_t)n];
        switch (rnd(&r) % 10) {
        case 0:
        case 1:
            t = bp_unary(ctx, a, unary[rnd(&r) % 6]);
            break;
        case 2:
            t = bp_scale(ctx, a, 0.5f + (float)(rnd(&r) % 4));
            break;
        case 3:
        case 4: {
            bp_tensor *b = pool[rnd(&r) % (uint32_t)n];
            if (!bp_can_repeat(b, a))
                b = bp_new_tensor_1d(ctx, BP_TYPE_F32, a->ne[0]);
            t = (rnd(&r) % 2 ? bp_add : rnd(&r) % 2 ? bp_sub : bp_mul)(ctx, a, b);
            break;
        }
        case 5:
            t = bp_mul_mat(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, a->ne[0], rdim(&r)), a);
            break;
        case 6:
            t = bp_cont(ctx, bp_transpose(ctx, a));
            break;
        case 7:
            t = bp_is_contiguous(a) ? bp_neg(ctx, bp_reshape_1d(ctx, a, bp_nelements(a)))
                                    : bp_cont(ctx, a);
            break;
        case 8:
            t = a->ne[1] >= 2 && bp_is_contiguous(a)
                    ? bp_relu(ctx, bp_view_2d(ctx, a, a->ne[0], a->ne[1] - 1, a->nb[1], a->nb[1]))
                    : bp_sqr(ctx, a);
            break;
        default:
            t = rnd(&r) % 3 == 0 ? bp_sum_rows(ctx, a)
                : rnd(&r) % 2      ? bp_soft_max(ctx, a)
                                   : bp_rms_norm(ctx, a, 1e-5f);
            break;
        }
        ck_assert_ptr_nonnull(t);
        if (rnd(&r) % 7 == 0)
            bp_set_output(t);
        pool[n++] = t;
    }
    bp_set_output(t);
    return t;
}

static void fill_leafs(bp_graph *g, uint64_t seed)
{
    struct rng r = {seed ^ 0x9e3779b97f4a7c15ull};
    for (int i = 0; i < bp_graph_get_n_leafs(g); i++) {
        bp_tensor *l = bp_graph_get_leaf(g, i);
        int64_t n = bp_nelements(l);
        float *v = malloc((size_t)n * sizeof(float));
        for (int64_t j = 0; j < n; j++)
            v[j] = (float)(rnd(&r) % 2001) / 1000.0f - 1.0f;
        ck_assert_int_eq(bp_tensor_set(l, v, 0, (size_t)n * sizeof(float)), BP_OK);
        free(v);
    }
}

static bool reads_memory_of(const bp_tensor *node, const bp_tensor *owner)
{
    for (int s = 0; s < BP_MAX_SRC; s++) {
        const bp_tensor *src = node->src[s];
        if (src != NULL && (src == owner || src->view_src == owner))
            return true;
    }
    return false;
}

/* Before node i is computed, nothing that is still needed after it may overlap what it writes;
 * a source it reads may overlap only as the exact in-place target of an element-wise op. */
static void check_no_live_overlap(bp_graph *g, int i)
{
    bp_tensor *node = bp_graph_get_node(g, i);
    if (node->view_src != NULL)
        return;
    for (int j = -bp_graph_get_n_leafs(g); j < i; j++) {
        bp_tensor *u = j < 0 ? bp_graph_get_leaf(g, -j - 1) : bp_graph_get_node(g, j);
        if (u->view_src != NULL || u->buffer != node->buffer || !overlaps(u, node))
            continue;
        bool needed = u->op == BP_OP_NONE ||
                      (u->flags & (BP_TENSOR_FLAG_INPUT | BP_TENSOR_FLAG_OUTPUT));
        for (int k = i + 1; k < bp_graph_get_n_nodes(g) && !needed; k++)
            needed = reads_memory_of(bp_graph_get_node(g, k), u);
        ck_assert_msg(!needed, "node %d (%s) overwrites %s, which is still needed", i,
                      bp_op_name(node->op), j < 0 ? "a leaf" : bp_op_name(u->op));
        if (reads_memory_of(node, u))
            ck_assert_msg(u->data == node->data && bp_nbytes(u) == bp_nbytes(node),
                          "node %d (%s) partly overlaps its own source", i, bp_op_name(node->op));
    }
}

START_TEST(test_gallocr_random_graphs)
{
    bp_registry *reg = test_device_registry_new(0);
    bp_buffer_type *bufts[2] = {bp_host_buffer_type(),
                                bp_device_get_buffer_type(bp_registry_get_device(reg, 0))};
    int graphs = 0, shared = 0;
    for (uint64_t seed = 1; seed <= 300; seed++) {
        bp_context *ca = bp_context_new(512), *cb = bp_context_new(512);
        bp_tensor *ta = random_graph(ca, seed), *tb = random_graph(cb, seed);
        bp_graph *ga_graph = bp_graph_new(512), *gb = bp_graph_new(512);
        ck_assert_int_eq(bp_graph_build_forward(ga_graph, ta), BP_OK);
        ck_assert_int_eq(bp_graph_build_forward(gb, tb), BP_OK);
        ck_assert_int_eq(bp_graph_get_n_nodes(ga_graph), bp_graph_get_n_nodes(gb));

        /* Half the graphs spread their tensors over two buffer types at random. */
        int nn = bp_graph_get_n_nodes(ga_graph), nl = bp_graph_get_n_leafs(ga_graph);
        int *node_ids = calloc((size_t)nn + 1, sizeof(int)), *leaf_ids = calloc((size_t)nl + 1, sizeof(int));
        struct rng r = {seed};
        for (int i = 0; seed % 2 == 0 && i < nn; i++)
            node_ids[i] = (int)(rnd(&r) % 2);
        for (int i = 0; seed % 2 == 0 && i < nl; i++)
            leaf_ids[i] = (int)(rnd(&r) % 2);

        bp_gallocr *ga = bp_gallocr_new(bufts, 2);
        ck_assert_int_eq(bp_gallocr_alloc_graph(ga, ga_graph, node_ids, leaf_ids), BP_OK);
        bp_buffer *naive = bp_alloc_ctx_tensors(cb, bp_host_buffer_type());
        ck_assert_ptr_nonnull(naive);
        fill_leafs(ga_graph, seed);
        fill_leafs(gb, seed);

        for (int i = 0; i < nn; i++) {
            bp_tensor *node = bp_graph_get_node(ga_graph, i);
            ck_assert_ptr_nonnull(node->data);
            if (node->view_src == NULL)
                ck_assert_ptr_eq(bp_buffer_get_type(node->buffer), bufts[node_ids[i]]);
            /* Inside its buffer. */
            char *base = bp_buffer_get_base(node->buffer);
            ck_assert((char *)node->data >= base &&
                      (char *)node->data + bp_nbytes(node) <= base + bp_buffer_get_size(node->buffer));
            check_no_live_overlap(ga_graph, i);
            ck_assert(ref_compute_node(node));
            ck_assert(ref_compute_node(bp_graph_get_node(gb, i)));
        }
        /* Every output matches the unshared computation bit for bit. */
        for (int i = 0; i < nn; i++) {
            bp_tensor *x = bp_graph_get_node(ga_graph, i), *y = bp_graph_get_node(gb, i);
            if (!(x->flags & BP_TENSOR_FLAG_OUTPUT))
                continue;
            ck_assert_msg(memcmp(x->data, y->data, bp_nbytes(x)) == 0,
                          "seed %llu: output node %d (%s) differs", (unsigned long long)seed, i,
                          bp_op_name(x->op));
        }
        size_t total = bp_gallocr_get_buffer_size(ga, 0) + bp_gallocr_get_buffer_size(ga, 1);
        if (total < bp_buffer_get_size(naive))
            shared++;
        graphs++;

        bp_buffer_free(naive);
        bp_gallocr_free(ga);
        free(node_ids);
        free(leaf_ids);
        bp_graph_free(ga_graph);
        bp_graph_free(gb);
        bp_context_free(ca);
        bp_context_free(cb);
    }
    ck_assert_int_eq(graphs, 300);
    /* The allocator actually shares memory in most graphs (not a vacuous pass). */
    ck_assert_int_gt(shared, 150);
    bp_registry_free(reg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("alloc");
    BP_TCASE(s, test_linear_allocator, 10);
    BP_TCASE(s, test_alloc_ctx_tensors, 10);
    BP_TCASE(s, test_gallocr_reuse_inplace_and_pinning, 10);
    BP_TCASE(s, test_gallocr_views_keep_source_alive, 10);
    BP_TCASE(s, test_gallocr_reserve_then_smaller_graphs, 20);
    BP_TCASE(s, test_gallocr_errors, 10);
    BP_TCASE(s, test_alloc_sizes_never_wrap, 10);
    BP_TCASE(s, test_gallocr_random_graphs, 120);
    return bp_test_run(s);
}
