/* test-tensor.c - contexts, tensor creation, names, queries and the view/copy builders. */
#include <stdint.h>

#include "test-util.h"

START_TEST(test_context_capacity)
{
    bp_context *ctx = bp_context_new(3);
    ck_assert_ptr_nonnull(ctx);
    ck_assert_uint_eq(bp_context_get_capacity(ctx), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_ptr_nonnull(bp_new_tensor_1d(ctx, BP_TYPE_F32, 4));
    ck_assert_uint_eq(bp_context_get_n_tensors(ctx), 3);
    ck_assert_rejected(bp_new_tensor_1d(ctx, BP_TYPE_F32, 4), BP_ERR_CAPACITY, "full (3 tensors)");
    /* A builder that needs a new tensor fails the same way, without touching its sources. */
    bp_tensor *a = bp_context_get_tensor(ctx, 0);
    ck_assert_rejected(bp_add(ctx, a, a), BP_ERR_CAPACITY, "bp_add");
    ck_assert_rejected(bp_transpose(ctx, a), BP_ERR_CAPACITY, "bp_transpose");
    ck_assert_uint_eq(bp_context_get_n_tensors(ctx), 3);
    ck_assert_ptr_null(bp_context_get_tensor(ctx, 3));
    bp_context_free(ctx);

    ck_assert_rejected(bp_context_new(0), BP_ERR_INVALID_ARG, "max_tensors");
    ck_assert_rejected(bp_context_new(SIZE_MAX / 2), BP_ERR_OUT_OF_MEMORY, "tensors of a context");
    bp_context_free(NULL); /* no-op */
}
END_TEST

START_TEST(test_new_tensor_strides)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *t = bp_new_tensor_4d(ctx, BP_TYPE_F32, 5, 3, 2, 7);
    ck_assert_shape(t, 5, 3, 2, 7);
    ck_assert_uint_eq(t->nb[0], 4);
    ck_assert_uint_eq(t->nb[1], 20);
    ck_assert_uint_eq(t->nb[2], 60);
    ck_assert_uint_eq(t->nb[3], 120);
    ck_assert_int_eq(bp_nelements(t), 210);
    ck_assert_int_eq(bp_nrows(t), 42);
    ck_assert_uint_eq(bp_nbytes(t), 840);
    ck_assert_int_eq(bp_n_dims(t), 4);
    ck_assert(bp_is_contiguous(t));
    ck_assert(!bp_is_view(t));
    ck_assert_int_eq(t->op, BP_OP_NONE);
    ck_assert_ptr_null(t->data);
    ck_assert_ptr_null(t->buffer);

    bp_tensor *q = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 3);
    ck_assert_uint_eq(q->nb[0], 18);
    ck_assert_uint_eq(q->nb[1], 36);
    ck_assert_uint_eq(q->nb[2], 108);
    ck_assert_uint_eq(bp_nbytes(q), 108);
    ck_assert_int_eq(bp_n_dims(q), 2);

    bp_tensor *v = bp_new_tensor_1d(ctx, BP_TYPE_F16, 9);
    ck_assert_shape(v, 9, 1, 1, 1);
    ck_assert_int_eq(bp_n_dims(v), 1);
    ck_assert_uint_eq(bp_nbytes(v), 18);

    bp_tensor *z = bp_new_tensor_2d(ctx, BP_TYPE_F32, 0, 5); /* zero-sized is valid */
    ck_assert_ptr_nonnull(z);
    ck_assert_int_eq(bp_nelements(z), 0);
    ck_assert_uint_eq(bp_nbytes(z), 0);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_new_tensor_rejects)
{
    bp_context *ctx = bp_context_new(8);
    ck_assert_rejected(bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, -1), BP_ERR_SHAPE, "negative");
    ck_assert_rejected(bp_new_tensor_1d(ctx, BP_TYPE_Q8_0, 33), BP_ERR_SHAPE, "block size 32");
    ck_assert_rejected(bp_new_tensor_1d(ctx, (enum bp_type)42, 4), BP_ERR_TYPE, "42");
    ck_assert_rejected(bp_new_tensor(ctx, BP_TYPE_F32, 0, (int64_t[]){1}), BP_ERR_SHAPE, "n_dims");
    ck_assert_rejected(bp_new_tensor(ctx, BP_TYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}),
                       BP_ERR_SHAPE, "n_dims");
    ck_assert_rejected(bp_new_tensor(ctx, BP_TYPE_F32, 2, NULL), BP_ERR_INVALID_ARG, "ne");
    ck_assert_rejected(bp_new_tensor_4d(ctx, BP_TYPE_F32, INT64_MAX / 2, 4, 4, 4), BP_ERR_SHAPE,
                       "too large");
    ck_assert_rejected(bp_new_tensor_1d(NULL, BP_TYPE_F32, 4), BP_ERR_INVALID_ARG, "context");
    ck_assert_rejected(bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 16, 2), BP_ERR_SHAPE, "block size");
    ck_assert_rejected(bp_new_tensor_3d(ctx, BP_TYPE_F32, 1, -2, 1), BP_ERR_SHAPE, "dimension 1");
    ck_assert_rejected(bp_new_tensor_4d(ctx, BP_TYPE_F32, 1, 1, 1, -3), BP_ERR_SHAPE, "dimension 3");
    ck_assert_uint_eq(bp_context_get_n_tensors(ctx), 0);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_names_flags_lookup)
{
    bp_context *ctx = bp_context_new(4);
    bp_tensor *t = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_F32, 2), "weights");
    ck_assert_str_eq(bp_get_name(t), "weights");
    bp_format_name(t, "layer.%d.%s", 3, "wq");
    ck_assert_str_eq(t->name, "layer.3.wq");
    char long_name[200];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[199] = '\0';
    bp_set_name(t, long_name);
    ck_assert_uint_eq(strlen(t->name), BP_MAX_NAME - 1);
    bp_set_name(t, "w");
    ck_assert_ptr_eq(bp_context_find_tensor(ctx, "w"), t);
    ck_assert_ptr_null(bp_context_find_tensor(ctx, "missing"));

    bp_set_input(t);
    bp_set_output(t);
    ck_assert_uint_eq(t->flags, BP_TENSOR_FLAG_INPUT | BP_TENSOR_FLAG_OUTPUT);
    bp_set_param(t);
    ck_assert(t->flags & BP_TENSOR_FLAG_PARAM);
    bp_set_input(NULL); /* tolerated */
    ck_assert_ptr_null(bp_set_name(NULL, "x"));
    ck_assert_str_eq(bp_get_name(NULL), "");
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_shape_queries)
{
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 3, 2);
    bp_tensor *b = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 1, 2);
    bp_tensor *c = bp_new_tensor_3d(ctx, BP_TYPE_F32, 3, 3, 2);
    ck_assert(bp_can_repeat(b, a));
    ck_assert(!bp_can_repeat(a, b));
    ck_assert(!bp_can_repeat(c, a));
    ck_assert(!bp_are_same_shape(a, b));
    ck_assert(bp_are_same_shape(a, a));
    char buf[96];
    ck_assert_str_eq(bp_format_shape(a, buf, sizeof(buf)), "[4, 3, 2, 1]");
    bp_tensor *t = bp_transpose(ctx, a);
    ck_assert(bp_is_transposed(t));
    ck_assert(bp_is_permuted(t));
    ck_assert(!bp_is_contiguous(t));
    ck_assert_int_eq(bp_nelements(NULL), 0);
    ck_assert(!bp_is_contiguous(NULL));
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_reshape)
{
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F32, 6, 4), "a");
    bp_tensor *r = bp_reshape_3d(ctx, a, 2, 3, 4);
    ck_assert_shape(r, 2, 3, 4, 1);
    ck_assert_uint_eq(r->nb[1], 8);
    ck_assert_uint_eq(r->nb[2], 24);
    ck_assert_ptr_eq(r->view_src, a);
    ck_assert_int_eq(r->op, BP_OP_RESHAPE);
    ck_assert_ptr_eq(r->src[0], a);
    ck_assert_str_eq(r->name, "a (reshaped)");
    bp_tensor *r1 = bp_reshape_1d(ctx, r, 24);
    ck_assert_ptr_eq(r1->view_src, a); /* always the owner, never a view */

    ck_assert_rejected(bp_reshape_2d(ctx, a, 5, 5), BP_ERR_SHAPE, "24 elements");
    bp_tensor *t = bp_transpose(ctx, a);
    ck_assert_rejected(bp_reshape_1d(ctx, t, 24), BP_ERR_SHAPE, "not contiguous");
    ck_assert_rejected(bp_reshape_2d(ctx, a, -6, -4), BP_ERR_SHAPE, "negative");
    ck_assert_rejected(bp_reshape(ctx, a, 7, (int64_t[]){24}), BP_ERR_SHAPE, "n_dims");
    ck_assert_rejected(bp_reshape_3d(ctx, a, 2, 2, 2), BP_ERR_SHAPE, "8 elements");
    ck_assert_rejected(bp_reshape_4d(ctx, a, 2, 2, 2, 4), BP_ERR_SHAPE, "32 elements");
    ck_assert_rejected(bp_reshape_1d(ctx, NULL, 24), BP_ERR_INVALID_ARG, "NULL");
    bp_tensor *q = bp_new_tensor_2d(ctx, BP_TYPE_Q8_0, 64, 2);
    ck_assert_rejected(bp_reshape_2d(ctx, q, 16, 8), BP_ERR_SHAPE, "block size");
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_views)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *a = bp_new_tensor_3d(ctx, BP_TYPE_F32, 8, 4, 3); /* 384 bytes */
    /* Row 2 of matrix 1, columns 3..7. */
    bp_tensor *v = bp_view_1d(ctx, a, 5, a->nb[2] + 2 * a->nb[1] + 3 * 4);
    ck_assert_shape(v, 5, 1, 1, 1);
    ck_assert_uint_eq(v->view_offs, 32 * 4 + 2 * 32 + 12);
    ck_assert_int_eq(v->op, BP_OP_VIEW);
    /* Every other column of the last two rows of each matrix: a strided 3-D view. */
    bp_tensor *v3 = bp_view_3d(ctx, a, 4, 2, 3, a->nb[1], a->nb[2], 2 * a->nb[1]);
    ck_assert_shape(v3, 4, 2, 3, 1);
    ck_assert_uint_eq(v3->nb[1], 32);
    ck_assert_uint_eq(v3->nb[2], 128);
    /* A view of a view accumulates offsets and points at the owner. */
    bp_tensor *vv = bp_view_1d(ctx, v3, 2, 8);
    ck_assert_ptr_eq(vv->view_src, a);
    ck_assert_uint_eq(vv->view_offs, 2 * 32 + 8);
    /* The last valid element exactly. */
    ck_assert_ptr_nonnull(bp_view_1d(ctx, a, 1, 383 - 3));
    bp_tensor *v4 = bp_view_4d(ctx, a, 2, 2, 2, 2, 32, 128, 8, 0);
    ck_assert_uint_eq(v4->nb[3], 8);

    size_t before = bp_context_get_n_tensors(ctx);
    ck_assert_rejected(bp_view_1d(ctx, a, 1, 384), BP_ERR_OUT_OF_BOUNDS, "past the end");
    ck_assert_rejected(bp_view_2d(ctx, a, 8, 13, a->nb[1], 0), BP_ERR_OUT_OF_BOUNDS, "384 bytes");
    ck_assert_rejected(bp_view_1d(ctx, v3, 8, 3 * 128 - 16), BP_ERR_OUT_OF_BOUNDS, "past the end");
    ck_assert_rejected(bp_view_2d(ctx, a, 2, INT64_MAX / 4, (size_t)1 << 40, 0), BP_ERR_OUT_OF_BOUNDS,
                       "past the end");
    ck_assert_rejected(bp_view_1d(ctx, a, 4, 2), BP_ERR_INVALID_ARG, "element size");
    ck_assert_rejected(bp_view_2d(ctx, a, 2, 2, 6, 0), BP_ERR_INVALID_ARG, "stride");
    ck_assert_rejected(bp_view_1d(ctx, a, -1, 0), BP_ERR_SHAPE, "negative");
    ck_assert_rejected(bp_view_1d(ctx, NULL, 1, 0), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_rejected(bp_view_3d(ctx, a, 8, 4, 4, a->nb[1], a->nb[2], 0), BP_ERR_OUT_OF_BOUNDS,
                       "past the end");
    ck_assert_rejected(bp_view_4d(ctx, a, 8, 4, 3, 2, a->nb[1], a->nb[2], 8, 0),
                       BP_ERR_OUT_OF_BOUNDS, "past the end");
    ck_assert_uint_eq(bp_context_get_n_tensors(ctx), before); /* refused views use no slot */
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_permute_and_transpose)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *a = bp_new_tensor_4d(ctx, BP_TYPE_F32, 2, 3, 5, 7);
    bp_tensor *p = bp_permute(ctx, a, 2, 0, 3, 1); /* axis i of a becomes axis p_i */
    ck_assert_shape(p, 3, 7, 2, 5);
    ck_assert_uint_eq(p->nb[0], a->nb[1]);
    ck_assert_uint_eq(p->nb[1], a->nb[3]);
    ck_assert_uint_eq(p->nb[2], a->nb[0]);
    ck_assert_uint_eq(p->nb[3], a->nb[2]);
    ck_assert_ptr_eq(p->view_src, a);
    ck_assert_int_eq(p->op, BP_OP_PERMUTE);
    /* Permuting back with the inverse gives a's strides. */
    bp_tensor *back = bp_permute(ctx, p, 1, 3, 0, 2);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(back->ne[i], a->ne[i]);
        ck_assert_uint_eq(back->nb[i], a->nb[i]);
    }
    ck_assert(bp_is_contiguous(back));
    bp_tensor *t = bp_transpose(ctx, a);
    ck_assert_shape(t, 3, 2, 5, 7);
    ck_assert_uint_eq(t->nb[0], 8);
    ck_assert_uint_eq(t->nb[1], 4);

    ck_assert_rejected(bp_permute(ctx, a, 0, 0, 1, 2), BP_ERR_INVALID_ARG, "not a permutation");
    ck_assert_rejected(bp_permute(ctx, a, 0, 1, 2, 4), BP_ERR_INVALID_ARG, "not a permutation");
    bp_tensor *q = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 32, 2);
    ck_assert_rejected(bp_permute(ctx, q, 1, 0, 2, 3), BP_ERR_TYPE, "quantised");
    ck_assert_ptr_nonnull(bp_permute(ctx, q, 0, 2, 1, 3)); /* rows stay whole: fine */
    ck_assert_rejected(bp_transpose(ctx, q), BP_ERR_TYPE, "quantised");
    ck_assert_rejected(bp_transpose(ctx, NULL), BP_ERR_INVALID_ARG, "NULL");
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_copies)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *a = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F32, 6, 4), "a");
    bp_tensor *d = bp_dup(ctx, a);
    ck_assert_shape(d, 6, 4, 1, 1);
    ck_assert_int_eq(d->op, BP_OP_DUP);
    ck_assert(!bp_is_view(d));

    bp_tensor *h = bp_new_tensor_3d(ctx, BP_TYPE_F16, 4, 3, 2);
    bp_tensor *c = bp_cpy(ctx, a, h); /* same element count, other type and shape */
    ck_assert_int_eq(c->op, BP_OP_CPY);
    ck_assert_int_eq(c->type, BP_TYPE_F16);
    ck_assert_ptr_eq(c->view_src, h);
    ck_assert_ptr_eq(c->src[0], a);
    ck_assert_ptr_eq(c->src[1], h);

    bp_tensor *t = bp_transpose(ctx, a);
    bp_tensor *k = bp_cont(ctx, t);
    ck_assert_shape(k, 4, 6, 1, 1);
    ck_assert(bp_is_contiguous(k));
    ck_assert_int_eq(k->op, BP_OP_CONT);
    ck_assert_shape(bp_cont_4d(ctx, t, 2, 2, 3, 2), 2, 2, 3, 2);

    bp_tensor *small = bp_new_tensor_1d(ctx, BP_TYPE_F32, 5);
    ck_assert_rejected(bp_cpy(ctx, a, small), BP_ERR_SHAPE, "24 elements");
    ck_assert_rejected(bp_cpy(ctx, NULL, small), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_rejected(bp_cont_4d(ctx, a, 5, 5, 1, 1), BP_ERR_SHAPE, "element counts");
    ck_assert_rejected(bp_cont(ctx, NULL), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_rejected(bp_dup(ctx, NULL), BP_ERR_INVALID_ARG, "NULL");
    bp_context_free(ctx);
}
END_TEST

/* Sizes derived from a shape never wrap: anything past BP_MAX_TENSOR_BYTES, or whose element
 * or row count does not fit in int64_t, is refused when it is made. */
START_TEST(test_size_limits)
{
    bp_context *ctx = bp_context_new(32);
    /* 3 * 715827883 * 2147483647 * 4 bytes is 2^64 - 4: it fits in size_t but not with padding. */
    ck_assert_rejected(bp_new_tensor_3d(ctx, BP_TYPE_F32, 3, 715827883, 2147483647), BP_ERR_SHAPE,
                       "BP_MAX_TENSOR_BYTES");
    /* No elements, but a row count that overflows int64_t. */
    ck_assert_rejected(bp_new_tensor_4d(ctx, BP_TYPE_F32, 0, INT64_MAX, INT64_MAX, 1),
                       BP_ERR_SHAPE, "too large");
    /* The largest allowed size is accepted, one element more is not. */
    int64_t max_f32 = (int64_t)(BP_MAX_TENSOR_BYTES / 4);
    ck_assert_ptr_nonnull(bp_new_tensor_1d(ctx, BP_TYPE_F32, max_f32));
    ck_assert_rejected(bp_new_tensor_1d(ctx, BP_TYPE_F32, max_f32 + 1), BP_ERR_SHAPE,
                       "BP_MAX_TENSOR_BYTES");
    ck_assert_uint_eq(bp_context_get_n_tensors(ctx), 1);
    /* Empty rows are fine as long as the row count itself fits. */
    ck_assert_ptr_nonnull(bp_new_tensor_2d(ctx, BP_TYPE_F32, 0, INT64_MAX));
    /* Empty, but two later sizes multiply past 2^63: a slice or loop bound would wrap. */
    ck_assert_rejected(bp_new_tensor_4d(ctx, BP_TYPE_F32, 1, 0, (int64_t)1 << 40,
                                        (int64_t)1 << 40),
                       BP_ERR_SHAPE, "too large");
    bp_tensor *e = bp_new_tensor_4d(ctx, BP_TYPE_F32, 1, 0, (int64_t)1 << 20, 3);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(bp_nelements(e), 0);
    ck_assert_int_eq(bp_nrows(e), 0);
    ck_assert_uint_eq(bp_nbytes(e), 0);

    /* Builders whose result extent is a sum check it before making the tensor. */
    bp_tensor *big = bp_new_tensor_1d(ctx, BP_TYPE_F32, max_f32);
    ck_assert_rejected(bp_concat(ctx, big, big, 0), BP_ERR_SHAPE, "BP_MAX_TENSOR_BYTES");
    bp_tensor *c1 = bp_new_tensor_4d(ctx, BP_TYPE_F32, 0, 1, 1, INT64_MAX);
    ck_assert_ptr_nonnull(c1);
    ck_assert_rejected(bp_concat(ctx, c1, c1, 3), BP_ERR_SHAPE, "too long in dimension 3");

    /* Queries on a struct filled in by hand saturate instead of overflowing. */
    bp_tensor hand = {.type = BP_TYPE_F32, .ne = {0, INT64_MAX, INT64_MAX, 1}};
    ck_assert_int_eq(bp_nrows(&hand), INT64_MAX);
    hand.ne[0] = INT64_MAX;
    ck_assert_int_eq(bp_nelements(&hand), INT64_MAX);

    /* A reshape to a count that overflows says so instead of printing a bogus count. */
    bp_tensor *v = bp_new_tensor_1d(ctx, BP_TYPE_F32, 8);
    ck_assert_rejected(bp_reshape_4d(ctx, v, INT64_MAX, INT64_MAX, 2, 1), BP_ERR_SHAPE,
                       "do not fit in 64 bits");
    ck_assert(strstr(bp_last_error(), "-1") == NULL);
    /* A view offset that wraps names the offset asked for, not the wrapped one. */
    bp_tensor *w = bp_view_1d(ctx, v, 4, 16);
    ck_assert_rejected(bp_view_1d(ctx, w, 1, SIZE_MAX - 15), BP_ERR_OUT_OF_BOUNDS,
                       "does not fit in size_t");
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_op_params_checked)
{
    bp_context *ctx = bp_context_new(4);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *r = bp_unary(ctx, a, BP_UNARY_OP_GELU);
    ck_assert_int_eq(bp_get_unary_op(r), BP_UNARY_OP_GELU);
    bp_clear_error();
    ck_assert_int_eq(bp_get_op_param_i32(NULL, 0), 0);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "tensor is NULL");
    bp_clear_error();
    ck_assert_int_eq(bp_get_op_param_i32(r, -1), 0);
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "index -1");
    bp_clear_error();
    ck_assert_int_eq(bp_get_op_param_i32(r, BP_MAX_OP_PARAMS / 4), 0);
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "outside 0..15");
    bp_clear_error();
    ck_assert(bp_get_op_param_f32(r, 1000) == 0.0f);
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "index 1000");
    bp_clear_error();
    ck_assert_int_eq(bp_get_unary_op(NULL), BP_UNARY_OP_COUNT);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "bp_get_unary_op");
    ck_assert_int_eq(bp_get_glu_op(NULL), BP_GLU_OP_COUNT);
    bp_context_free(ctx);
}
END_TEST

/* Copies whose source and destination share bytes are refused when the graph is built. */
START_TEST(test_overlapping_copies_refused)
{
    bp_context *ctx = bp_context_new(16);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_tensor *lo = bp_view_1d(ctx, a, 8, 0), *mid = bp_view_1d(ctx, a, 8, 16),
              *hi = bp_view_1d(ctx, a, 8, 32);
    ck_assert_rejected(bp_cpy(ctx, lo, mid), BP_ERR_INVALID_ARG, "overlap");
    ck_assert_rejected(bp_cpy(ctx, a, bp_reshape_2d(ctx, a, 4, 4)), BP_ERR_INVALID_ARG,
                       "overlap");
    ck_assert_ptr_nonnull(bp_cpy(ctx, lo, hi)); /* disjoint halves are fine */
    bp_tensor *rows = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 4);
    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
    ck_assert_rejected(bp_set_rows(ctx, rows, bp_view_2d(ctx, rows, 4, 2, 16, 0), ids),
                       BP_ERR_INVALID_ARG, "overlap");
    bp_context_free(ctx);
}
END_TEST

/* Messages name unnamed tensors by op, type and shape, and never echo control characters. */
START_TEST(test_descriptions_and_escapes)
{
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 3);
    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 5, 3);
    char buf[BP_TENSOR_DESC_SIZE];
    ck_assert_str_eq(bp_describe_tensor(a, buf, sizeof(buf)), "unnamed f32 [4, 3, 1, 1]");
    bp_tensor *s = bp_scale(ctx, a, 2.0f);
    ck_assert_str_eq(bp_describe_tensor(s, buf, sizeof(buf)),
                     "unnamed SCALE result f32 [4, 3, 1, 1]");
    ck_assert_str_eq(bp_describe_tensor(NULL, buf, sizeof(buf)), "(null)");
    bp_set_name(a, "evil\nname\x1b[31m\t");
    ck_assert_rejected(bp_add(ctx, b, a), BP_ERR_SHAPE, "'evil\\nname\\x1b[31m\\t' f32");
    ck_assert(strchr(bp_last_error(), '\n') == NULL && strchr(bp_last_error(), '\x1b') == NULL);
    bp_context_free(ctx);
}
END_TEST

/* The public structs are part of the ABI: catch accidental layout changes. */
START_TEST(test_abi_layout)
{
    ck_assert_uint_eq(sizeof(struct bp_block_q8_0), 34);
    ck_assert_uint_eq(sizeof(struct bp_block_q4_0), 18);
#if UINTPTR_MAX == 0xffffffffffffffffu
    ck_assert_uint_eq(offsetof(struct bp_tensor, type), 0);
    ck_assert_uint_eq(offsetof(struct bp_tensor, ne), 8);
    ck_assert_uint_eq(offsetof(struct bp_tensor, nb), 40);
    ck_assert_uint_eq(offsetof(struct bp_tensor, op_params), 72);
    ck_assert_uint_eq(offsetof(struct bp_tensor, flags), 136);
    ck_assert_uint_eq(offsetof(struct bp_tensor, src), 144);
    ck_assert_uint_eq(offsetof(struct bp_tensor, view_src), 176);
    ck_assert_uint_eq(offsetof(struct bp_tensor, data), 200);
    ck_assert_uint_eq(offsetof(struct bp_tensor, name), 216);
    ck_assert_uint_eq(sizeof(struct bp_tensor), 280);
#endif
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor");
    BP_TCASE(s, test_context_capacity, 10);
    BP_TCASE(s, test_new_tensor_strides, 10);
    BP_TCASE(s, test_new_tensor_rejects, 10);
    BP_TCASE(s, test_names_flags_lookup, 10);
    BP_TCASE(s, test_shape_queries, 10);
    BP_TCASE(s, test_reshape, 10);
    BP_TCASE(s, test_views, 10);
    BP_TCASE(s, test_permute_and_transpose, 10);
    BP_TCASE(s, test_copies, 10);
    BP_TCASE(s, test_size_limits, 10);
    BP_TCASE(s, test_op_params_checked, 10);
    BP_TCASE(s, test_overlapping_copies_refused, 10);
    BP_TCASE(s, test_descriptions_and_escapes, 10);
    BP_TCASE(s, test_abi_layout, 10);
    return bp_test_run(s);
}
