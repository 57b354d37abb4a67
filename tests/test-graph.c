/* test-graph.c - graph building order, leafs and nodes, use counts, capacity, views. */
#include "test-util.h"

/* Position of t among the graph's nodes, -1 when it is not a node. */
static int node_index(const bp_graph *g, const bp_tensor *t)
{
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        if (bp_graph_get_node(g, i) == t)
            return i;
    }
    return -1;
}

/* Every node comes after each of its sources that is a node. */
static void assert_topological(const bp_graph *g)
{
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        bp_tensor *n = bp_graph_get_node(g, i);
        for (int s = 0; s < BP_MAX_SRC; s++) {
            if (n->src[s] == NULL)
                continue;
            ck_assert(bp_graph_contains(g, n->src[s]));
            if (n->src[s]->op != BP_OP_NONE)
                ck_assert_int_lt(node_index(g, n->src[s]), i);
        }
    }
}

START_TEST(test_build_order_and_leafs)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *w = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 4), "w");
    bp_tensor *x = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 2), "x");
    bp_tensor *b = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_F32, 4), "b");
    bp_tensor *y = bp_mul_mat(ctx, w, x);
    bp_tensor *z = bp_add(ctx, y, b);
    bp_tensor *out = bp_set_name(bp_silu(ctx, z), "out");

    bp_graph *g = bp_graph_new(16);
    ck_assert_int_eq(bp_graph_build_forward(g, out), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 3);
    ck_assert_int_eq(bp_graph_get_n_leafs(g), 3);
    ck_assert_ptr_eq(bp_graph_get_node(g, 0), y);
    ck_assert_ptr_eq(bp_graph_get_node(g, 1), z);
    ck_assert_ptr_eq(bp_graph_get_node(g, 2), out);
    ck_assert_ptr_eq(bp_graph_get_node(g, -1), out);
    ck_assert_ptr_null(bp_graph_get_node(g, 3));
    ck_assert_ptr_null(bp_graph_get_node(g, -4));
    ck_assert_ptr_eq(bp_graph_get_leaf(g, 0), w);
    ck_assert_ptr_eq(bp_graph_get_leaf(g, 1), x);
    ck_assert_ptr_eq(bp_graph_get_leaf(g, 2), b);
    ck_assert_ptr_eq(bp_graph_find(g, "x"), x);
    ck_assert_ptr_eq(bp_graph_find(g, "out"), out);
    ck_assert_ptr_null(bp_graph_find(g, "nope"));
    ck_assert_uint_eq(bp_graph_get_capacity(g), 16);

    /* Building the same output again adds nothing. */
    ck_assert_int_eq(bp_graph_build_forward(g, out), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 3);
    assert_topological(g);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

/* A diamond: each tensor once, use counts count every source slot. */
START_TEST(test_diamond_and_use_counts)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *a = bp_exp(ctx, x);
    bp_tensor *b = bp_neg(ctx, x);
    bp_tensor *c = bp_mul(ctx, a, b);
    bp_tensor *d = bp_add(ctx, c, a);
    bp_tensor *e = bp_mul(ctx, d, d); /* the same source twice */

    bp_graph *g = bp_graph_new(16);
    ck_assert_int_eq(bp_graph_build_forward(g, e), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 5);
    ck_assert_int_eq(bp_graph_get_n_leafs(g), 1);
    assert_topological(g);
    ck_assert_int_eq(bp_graph_get_use_count(g, x), 2);
    ck_assert_int_eq(bp_graph_get_use_count(g, a), 2);
    ck_assert_int_eq(bp_graph_get_use_count(g, b), 1);
    ck_assert_int_eq(bp_graph_get_use_count(g, d), 2);
    ck_assert_int_eq(bp_graph_get_use_count(g, e), 0);
    bp_tensor *other = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    ck_assert_int_eq(bp_graph_get_use_count(g, other), 0);
    ck_assert(!bp_graph_contains(g, other));
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

/* Several outputs share a prefix; a view's source chain is part of the graph. */
START_TEST(test_multiple_outputs_and_views)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *cache = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 16);
    bp_tensor *k = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 2);
    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
    bp_tensor *store = bp_set_rows(ctx, cache, k, ids);
    bp_tensor *window = bp_view_2d(ctx, store, 8, 4, cache->nb[1], 0);
    bp_tensor *sum = bp_sum_rows(ctx, window);
    bp_tensor *other = bp_scale(ctx, k, 2.0f);

    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, sum), BP_OK);
    ck_assert_int_eq(bp_graph_build_forward(g, other), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 4); /* set_rows, view, sum_rows, scale */
    ck_assert_int_eq(bp_graph_get_n_leafs(g), 3);
    ck_assert_int_lt(node_index(g, store), node_index(g, window));
    ck_assert_int_eq(node_index(g, other), 3);
    ck_assert_int_eq(bp_graph_get_use_count(g, k), 2);
    assert_topological(g);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_capacity_error_leaves_graph_unchanged)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *t = x;
    for (int i = 0; i < 5; i++)
        t = bp_relu(ctx, t);
    bp_tensor *small = bp_sqr(ctx, x);

    bp_graph *g = bp_graph_new(4);
    ck_assert_int_eq(bp_graph_build_forward(g, small), BP_OK);
    ck_assert_int_eq(bp_graph_build_forward(g, t), BP_ERR_CAPACITY);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "graph is full"));
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 1);
    ck_assert_int_eq(bp_graph_get_n_leafs(g), 1);
    ck_assert(!bp_graph_contains(g, t));
    ck_assert_int_eq(bp_graph_get_use_count(g, x), 1);
    /* Still usable after the failure. */
    bp_tensor *more = bp_sqrt(ctx, small);
    ck_assert_int_eq(bp_graph_build_forward(g, more), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 2);
    ck_assert_int_eq(bp_graph_get_use_count(g, small), 1);

    /* Too many leafs fails the same way. */
    bp_graph *g2 = bp_graph_new(2);
    bp_tensor *c = bp_concat(ctx, bp_concat(ctx, x, bp_new_tensor_1d(ctx, BP_TYPE_F32, 4), 0),
                             bp_new_tensor_1d(ctx, BP_TYPE_F32, 4), 0);
    ck_assert_int_eq(bp_graph_build_forward(g2, c), BP_ERR_CAPACITY);
    ck_assert_int_eq(bp_graph_get_n_nodes(g2), 0);
    ck_assert_int_eq(bp_graph_get_n_leafs(g2), 0);
    bp_graph_free(g2);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

/* A chain far deeper than any recursive walk could take on a small stack. */
START_TEST(test_deep_chain)
{
    enum { DEPTH = 100000 };
    bp_context *ctx = bp_context_new(DEPTH + 1);
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 1);
    for (int i = 0; i < DEPTH; i++)
        t = bp_neg(ctx, t);
    bp_graph *g = bp_graph_new(DEPTH);
    ck_assert_int_eq(bp_graph_build_forward(g, t), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), DEPTH);
    ck_assert_ptr_eq(bp_graph_get_node(g, -1), t);
    ck_assert_ptr_eq(bp_graph_get_node(g, 0)->src[0], bp_graph_get_leaf(g, 0));
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_graph_view_and_reset)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *a = bp_exp(ctx, x);
    bp_tensor *b = bp_neg(ctx, a);
    bp_tensor *c = bp_add(ctx, b, a);
    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, c), BP_OK);

    bp_graph *v = bp_graph_view(g, 1, 3);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(bp_graph_get_n_nodes(v), 2);
    ck_assert_ptr_eq(bp_graph_get_node(v, 0), b);
    ck_assert_ptr_eq(bp_graph_get_node(v, 1), c);
    ck_assert_int_eq(bp_graph_get_n_leafs(v), 1);
    ck_assert_int_eq(bp_graph_get_use_count(v, b), 1);
    ck_assert_int_eq(bp_graph_get_use_count(v, a), 0); /* a is outside the view */
    ck_assert(!bp_graph_contains(v, a));
    bp_graph_free(v);

    bp_graph *empty = bp_graph_view(g, 2, 2);
    ck_assert_int_eq(bp_graph_get_n_nodes(empty), 0);
    bp_graph_free(empty);
    ck_assert_rejected(bp_graph_view(g, 2, 4), BP_ERR_OUT_OF_BOUNDS, "[2, 4)");
    ck_assert_rejected(bp_graph_view(g, -1, 2), BP_ERR_OUT_OF_BOUNDS, "3 nodes");
    ck_assert_rejected(bp_graph_view(NULL, 0, 0), BP_ERR_INVALID_ARG, "NULL");

    bp_graph_reset(g);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 0);
    ck_assert_int_eq(bp_graph_get_n_leafs(g), 0);
    ck_assert(!bp_graph_contains(g, c));
    ck_assert_int_eq(bp_graph_build_forward(g, c), BP_OK);
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 3);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_graph_rejects_bad_input)
{
    ck_assert_rejected(bp_graph_new(0), BP_ERR_INVALID_ARG, "capacity 0");
    ck_assert_rejected(bp_graph_new((size_t)1 << 40), BP_ERR_INVALID_ARG, "out of range");
    bp_graph *g = bp_graph_new(4);
    bp_clear_error();
    ck_assert_int_eq(bp_graph_build_forward(g, NULL), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_graph_build_forward(NULL, NULL), BP_ERR_INVALID_ARG);

    /* A tensor whose op field was corrupted by the caller is refused, not followed. */
    bp_context *ctx = bp_context_new(4);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *y = bp_neg(ctx, x);
    y->op = (enum bp_op)999;
    ck_assert_int_eq(bp_graph_build_forward(g, y), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "invalid op 999"));
    ck_assert_int_eq(bp_graph_get_n_nodes(g), 0);
    ck_assert_int_eq(bp_graph_get_n_leafs(g), 0);

    ck_assert_int_eq(bp_graph_get_n_nodes(NULL), 0);
    ck_assert_ptr_null(bp_graph_get_node(NULL, 0));
    bp_graph_free(NULL);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("graph");
    BP_TCASE(s, test_build_order_and_leafs, 10);
    BP_TCASE(s, test_diamond_and_use_counts, 10);
    BP_TCASE(s, test_multiple_outputs_and_views, 10);
    BP_TCASE(s, test_capacity_error_leaves_graph_unchanged, 10);
    BP_TCASE(s, test_deep_chain, 60);
    BP_TCASE(s, test_graph_view_and_reset, 10);
    BP_TCASE(s, test_graph_rejects_bad_input, 10);
    return bp_test_run(s);
}
