/* test-backend-api.c - the backend API wrappers: host buffers, tensor data access and its
 * bounds, copies, devices, backends, events, registries and the interface size rules. */
#include <stdlib.h>

#include "../common/ref.h"
#include "test-device.h"
#include "test-util.h"

static bp_context *ctx;
static bp_registry *reg;
static bp_device *accel;

static void setup(void)
{
    memset(&test_device_stats, 0, sizeof(test_device_stats));
    ctx = bp_context_new(64);
    reg = test_device_registry_new(1u << 20);
    ck_assert_ptr_nonnull(reg);
    accel = bp_registry_get_device(reg, 0);
}

static void teardown(void)
{
    bp_context_free(ctx);
    bp_registry_free(reg);
}

START_TEST(test_host_buffer_type)
{
    bp_buffer_type *h = bp_host_buffer_type();
    ck_assert_str_eq(bp_buffer_type_get_name(h), "Host");
    ck_assert_uint_ge(bp_buffer_type_get_alignment(h), 64);
    ck_assert_uint_eq(bp_buffer_type_get_max_size(h), SIZE_MAX);
    ck_assert(bp_buffer_type_is_host(h));
    ck_assert_ptr_null(bp_buffer_type_get_device(h));

    bp_buffer *z = bp_buffer_type_alloc(h, 0); /* zero-sized buffers are valid */
    ck_assert_ptr_nonnull(z);
    ck_assert_uint_eq(bp_buffer_get_size(z), 0);
    ck_assert_ptr_nonnull(bp_buffer_get_base(z));
    ck_assert_int_eq(bp_buffer_clear(z, 7), BP_OK);
    bp_buffer_free(z);

    bp_buffer *b = bp_buffer_type_alloc(h, 1000);
    ck_assert_uint_eq((uintptr_t)bp_buffer_get_base(b) % 64, 0);
    ck_assert(bp_buffer_is_host(b));
    ck_assert_ptr_eq(bp_buffer_get_type(b), h);
    ck_assert_int_eq(bp_buffer_get_usage(b), BP_BUFFER_USAGE_ANY);
    bp_buffer_set_usage(b, BP_BUFFER_USAGE_WEIGHTS);
    ck_assert_int_eq(bp_buffer_get_usage(b), BP_BUFFER_USAGE_WEIGHTS);
    ck_assert_int_eq(bp_buffer_clear(b, 0xab), BP_OK);
    for (int i = 0; i < 1000; i++)
        ck_assert_uint_eq(((unsigned char *)bp_buffer_get_base(b))[i], 0xab);
    bp_buffer_free(b);
    bp_buffer_free(NULL);

    ck_assert_rejected(bp_buffer_type_alloc(h, SIZE_MAX - 8), BP_ERR_OUT_OF_MEMORY, "too large");
    ck_assert_rejected(bp_buffer_type_alloc(NULL, 8), BP_ERR_INVALID_ARG, "NULL");
}
END_TEST

START_TEST(test_set_get_memset_bounds)
{
    bp_tensor *t = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F32, 5, 3), "t");
    bp_tensor *loose = bp_set_name(bp_new_tensor_1d(ctx, BP_TYPE_F32, 4), "loose");
    float v[15], back[15];
    for (int i = 0; i < 15; i++)
        v[i] = (float)i * 1.5f;
    bp_clear_error();
    ck_assert_int_eq(bp_tensor_set(loose, v, 0, 16), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "'loose'"));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "has no buffer"));

    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(bp_tensor_set(t, v, 0, sizeof(v)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(t, back, 0, sizeof(back)), BP_OK);
    ck_assert_mem_eq(v, back, sizeof(v));
    ck_assert_int_eq(bp_tensor_set(t, v, 8, 12), BP_OK); /* a piece in the middle */
    ck_assert_int_eq(bp_tensor_get(t, back, 8, 12), BP_OK);
    ck_assert_mem_eq(back, v, 12);

    /* Out of bounds by one byte, by overflow, and a NULL tensor: errors, nothing written. */
    float canary = 0.0f;
    ck_assert_int_eq(bp_tensor_set(loose, &canary, 0, 4), BP_OK);
    ck_assert_int_eq(bp_tensor_set(t, v, 4, sizeof(v)), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "outside tensor 't'"));
    ck_assert_int_eq(bp_tensor_get(t, back, 60, 1), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_tensor_set(t, v, SIZE_MAX, 2), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_tensor_memset(t, 0, 1, 60), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_tensor_set(NULL, v, 0, 4), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tensor_set(t, NULL, 0, 4), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tensor_get(t, NULL, 0, 4), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tensor_set(t, NULL, 0, 0), BP_OK); /* empty range */
    float l;
    ck_assert_int_eq(bp_tensor_get(loose, &l, 0, 4), BP_OK);
    ck_assert(l == 0.0f); /* the neighbour was not touched */

    ck_assert_int_eq(bp_tensor_set(t, v, 0, sizeof(v)), BP_OK);
    ck_assert_int_eq(bp_tensor_memset(t, 0, 4, 8), BP_OK);
    ck_assert_int_eq(bp_tensor_get(t, back, 0, sizeof(back)), BP_OK);
    ck_assert(back[0] == v[0] && back[1] == 0.0f && back[2] == 0.0f && back[3] == v[3]);
    bp_buffer_free(buf);
}
END_TEST

START_TEST(test_strided_2d)
{
    bp_tensor *m = bp_new_tensor_2d(ctx, BP_TYPE_F32, 6, 4); /* rows of 24 bytes */
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    float zero[24] = {0};
    ck_assert_int_eq(bp_tensor_set(m, zero, 0, sizeof(zero)), BP_OK);
    /* Columns 2..4 of rows 1..3 from a packed 3x3 source. */
    float src[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    ck_assert_int_eq(bp_tensor_set_2d(m, src, 1 * 24 + 2 * 4, 12, 3, 24, 12), BP_OK);
    float all[24];
    ck_assert_int_eq(bp_tensor_get(m, all, 0, sizeof(all)), BP_OK);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 6; c++) {
            float want = (r >= 1 && c >= 2 && c <= 4) ? src[(r - 1) * 3 + (c - 2)] : 0.0f;
            ck_assert_float_eq(all[r * 6 + c], want);
        }
    float out[6] = {0};
    ck_assert_int_eq(bp_tensor_get_2d(m, out, 2 * 24 + 3 * 4, 8, 2, 24, 12), BP_OK);
    ck_assert_float_eq(out[0], 5.0f);
    ck_assert_float_eq(out[1], 6.0f);
    ck_assert_float_eq(out[3], 8.0f);

    ck_assert_int_eq(bp_tensor_set_2d(m, src, 3 * 24, 12, 2, 24, 12), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_tensor_get_2d(m, out, 0, 12, 2, 8, 12), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tensor_set_2d(m, src, 0, 4, SIZE_MAX, SIZE_MAX, 4), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_tensor_set_2d(m, src, 0, 0, 0, 0, 0), BP_OK);
    bp_buffer_free(buf);
}
END_TEST

START_TEST(test_buffer_from_host_ptr)
{
    float *mem = aligned_alloc(64, 256);
    for (int i = 0; i < 64; i++)
        mem[i] = (float)i;
    bp_buffer *buf = bp_buffer_from_host_ptr(mem, 256);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_eq(bp_buffer_get_base(buf), mem);
    ck_assert(bp_buffer_is_host(buf));
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 8);
    ck_assert_int_eq(bp_buffer_place_tensor(buf, t, mem + 16), BP_OK);
    float v;
    ck_assert_int_eq(bp_tensor_get(t, &v, 4, 4), BP_OK);
    ck_assert_float_eq(v, 17.0f);
    bp_buffer_free(buf); /* must not free mem */
    mem[0] = 1.0f;
    free(mem);
    ck_assert_rejected(bp_buffer_from_host_ptr(NULL, 16), BP_ERR_INVALID_ARG, "ptr is NULL");
}
END_TEST

START_TEST(test_place_tensor_and_views)
{
    bp_buffer *buf = bp_buffer_type_alloc(bp_host_buffer_type(), 256);
    char *base = bp_buffer_get_base(buf);
    bp_tensor *t = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 4); /* 128 bytes */
    bp_tensor *v = bp_view_1d(ctx, t, 4, 32);
    ck_assert_int_eq(bp_tensor_init_view(v), BP_ERR_INVALID_ARG); /* source not placed */
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "no memory yet"));
    ck_assert_int_eq(bp_buffer_place_tensor(buf, t, base + 192), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_buffer_place_tensor(buf, t, base + 8), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "alignment"));
    ck_assert_int_eq(bp_buffer_place_tensor(buf, t, base - 64), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_int_eq(bp_buffer_place_tensor(buf, v, base), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_buffer_place_tensor(buf, t, base + 128), BP_OK);
    ck_assert_int_eq(bp_tensor_init_view(v), BP_OK);
    ck_assert_ptr_eq(v->data, base + 128 + 32);
    ck_assert_ptr_eq(v->buffer, buf);
    ck_assert_int_eq(bp_tensor_init_view(t), BP_ERR_INVALID_ARG); /* not a view */
    bp_buffer_free(buf);
}
END_TEST

START_TEST(test_copies_between_buffers)
{
    bp_context *c2 = bp_context_new(8);
    bp_tensor *h1 = bp_new_tensor_1d(ctx, BP_TYPE_F32, 40);
    bp_tensor *h2 = bp_new_tensor_1d(ctx, BP_TYPE_F32, 40);
    bp_tensor *a1 = bp_new_tensor_1d(c2, BP_TYPE_F32, 40);
    bp_tensor *a2 = bp_new_tensor_1d(c2, BP_TYPE_F32, 40);
    bp_tensor *odd = bp_new_tensor_1d(c2, BP_TYPE_F32, 39);
    bp_buffer *hb = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    bp_buffer *ab = bp_alloc_ctx_tensors(c2, bp_device_get_buffer_type(accel));
    ck_assert(!bp_buffer_is_host(ab));
    float v[40], back[40];
    for (int i = 0; i < 40; i++)
        v[i] = (float)i - 20.0f;
    ck_assert_int_eq(bp_tensor_set(h1, v, 0, sizeof(v)), BP_OK);

    ck_assert_int_eq(bp_tensor_copy(h1, a1), BP_OK); /* host -> device: a set */
    ck_assert_int_eq(bp_tensor_copy(a1, a2), BP_OK); /* device -> device: direct */
    ck_assert_int_eq(test_device_stats.cpy_calls, 1);
    ck_assert_int_eq(bp_tensor_copy(a2, h2), BP_OK); /* device -> host: a get */
    ck_assert_int_eq(bp_tensor_get(h2, back, 0, sizeof(back)), BP_OK);
    ck_assert_mem_eq(v, back, sizeof(v));
    ck_assert_int_eq(bp_tensor_copy(h1, h1), BP_OK);
    /* A direct copy that fails (rather than declines) is an error, with the plugin's words, and
     * no copy through the host hides it. */
    int gets0 = test_device_stats.get_calls;
    test_device_fail_copies(1);
    ck_assert_int_eq(bp_tensor_copy(a1, a2), BP_ERR_BACKEND);
    ck_assert_str_eq(bp_last_error(), "TestAccel: the direct copy failed (injected)");
    ck_assert_int_eq(test_device_stats.get_calls, gets0);
    ck_assert_int_eq(bp_tensor_copy(a1, a2), BP_OK);
    ck_assert_int_eq(bp_tensor_copy(a1, odd), BP_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "differ in size"));
    ck_assert_int_eq(bp_tensor_copy(NULL, a1), BP_ERR_INVALID_ARG);

    /* Two devices of different registries have no direct path: staged through the host. */
    bp_registry *other = test_device_registry_new(0);
    bp_context *c3 = bp_context_new(2);
    bp_tensor *o1 = bp_new_tensor_1d(c3, BP_TYPE_F32, 40);
    bp_buffer *ob = bp_alloc_ctx_tensors(c3, bp_device_get_buffer_type(bp_registry_get_device(other, 0)));
    int gets = test_device_stats.get_calls, sets = test_device_stats.set_calls;
    ck_assert_int_eq(bp_tensor_copy(a1, o1), BP_OK);
    ck_assert_int_eq(test_device_stats.get_calls, gets + 1);
    ck_assert_int_eq(test_device_stats.set_calls, sets + 1);
    ck_assert_int_eq(bp_tensor_get(o1, back, 0, sizeof(back)), BP_OK);
    ck_assert_mem_eq(v, back, sizeof(v));

    bp_buffer_free(ob);
    bp_context_free(c3);
    bp_registry_free(other);
    bp_buffer_free(ab);
    bp_buffer_free(hb);
    bp_context_free(c2);
}
END_TEST

START_TEST(test_device_and_registry)
{
    ck_assert_str_eq(bp_registry_get_name(reg), "TestAccel");
    ck_assert_uint_eq(bp_registry_get_device_count(reg), 1);
    ck_assert_ptr_eq(bp_device_get_registry(accel), reg);
    ck_assert_rejected(bp_registry_get_device(reg, 1), BP_ERR_OUT_OF_BOUNDS, "no device 1");
    int major, minor;
    bp_registry_get_api_version(reg, &major, &minor);
    ck_assert_int_eq(major, BP_PLUGIN_API_MAJOR);
    ck_assert_int_eq(minor, BP_PLUGIN_API_MINOR);
    int (*answer)(void) = (int (*)(void))bp_registry_get_proc_address(reg, "test_device_answer");
    ck_assert_ptr_nonnull(answer);
    ck_assert_int_eq(answer(), 42);
    ck_assert_ptr_null(bp_registry_get_proc_address(reg, "bp_comm_init"));

    ck_assert_str_eq(bp_device_get_name(accel), "ACCEL0");
    ck_assert_str_eq(bp_device_get_description(accel), "backplane test accelerator");
    ck_assert_int_eq(bp_device_get_type(accel), BP_DEVICE_TYPE_ACCEL);
    ck_assert_str_eq(bp_device_type_name(BP_DEVICE_TYPE_META), "META");
    size_t f, t;
    bp_device_get_memory(accel, &f, &t);
    ck_assert_uint_eq(f, 3u << 20);
    ck_assert_uint_eq(t, 4u << 20);
    struct bp_device_props p;
    bp_device_get_props(accel, &p);
    ck_assert_str_eq(p.name, "ACCEL0");
    ck_assert_int_eq(p.type, BP_DEVICE_TYPE_ACCEL);
    ck_assert(p.caps.events);
    ck_assert(!p.caps.host_buffer);
    ck_assert(!p.caps.buffer_from_host_ptr);
    ck_assert(!p.caps.async);
    struct bp_device_caps caps = {.async = true};
    bp_device_get_caps(accel, &caps);
    ck_assert_mem_eq(&caps, &p.caps, sizeof(caps));
    bp_device_get_caps(NULL, &caps);
    ck_assert_int_eq(bp_last_status(), BP_ERR_INVALID_ARG);
    ck_assert(!caps.events && !caps.host_buffer && !caps.async && !caps.buffer_from_host_ptr);
    bp_device_get_caps(accel, NULL); /* nothing to fill */
    ck_assert_rejected(bp_device_get_host_buffer_type(accel), BP_ERR_UNSUPPORTED, "ACCEL0");
    ck_assert_rejected(bp_device_buffer_from_host_ptr(accel, &f, 8, 8), BP_ERR_UNSUPPORTED,
                       "ACCEL0");

    bp_buffer_type *buft = bp_device_get_buffer_type(accel);
    ck_assert_str_eq(bp_buffer_type_get_name(buft), "TestAccel");
    ck_assert_ptr_eq(bp_buffer_type_get_device(buft), accel);
    ck_assert_uint_eq(bp_buffer_type_get_max_size(buft), 1u << 20);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 3);
    ck_assert_uint_eq(bp_buffer_type_get_alloc_size(buft, x), 256);
    ck_assert_uint_eq(bp_buffer_type_get_alloc_size(bp_host_buffer_type(), x), 12);
    ck_assert_rejected(bp_buffer_type_alloc(buft, (1u << 20) + 1), BP_ERR_OUT_OF_MEMORY,
                       "largest buffer is 1048576 bytes");
}
END_TEST

START_TEST(test_backend_compute_and_async)
{
    bp_backend *be = bp_device_init_backend(accel, "threads=2");
    ck_assert_ptr_nonnull(be);
    ck_assert_str_eq(bp_backend_get_name(be), "ACCEL0");
    ck_assert_ptr_eq(bp_backend_get_device(be), accel);
    ck_assert_ptr_eq(bp_backend_get_default_buffer_type(be), bp_device_get_buffer_type(accel));
    ck_assert(bp_backend_supports_buft(be, bp_device_get_buffer_type(accel)));
    ck_assert(!bp_backend_supports_buft(be, bp_host_buffer_type()));

    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 3);
    bp_tensor *b = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *y = bp_silu(ctx, bp_add(ctx, a, b));
    bp_tensor *pos = bp_new_tensor_1d(ctx, BP_TYPE_I32, 1);
    bp_tensor *r = bp_rope(ctx, bp_reshape_3d(ctx, a, 4, 3, 1), pos, 4, BP_ROPE_NORMAL, 1e4f, 1);
    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 1);
    bp_tensor *rows = bp_get_rows(ctx, a, ids);
    ck_assert(bp_backend_supports_op(be, y));
    ck_assert(!bp_backend_supports_op(be, r));
    ck_assert(!bp_backend_offload_op(be, y)); /* optional member absent: false */

    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_device_get_buffer_type(accel));
    float av[12], bv[4] = {1, -1, 0.5f, 2}, out[12];
    for (int i = 0; i < 12; i++)
        av[i] = (float)i / 4.0f - 1.0f;
    ck_assert_int_eq(bp_backend_tensor_set_async(be, a, av, 0, sizeof(av)), BP_OK);
    ck_assert_int_eq(bp_backend_tensor_set_async(be, b, bv, 0, sizeof(bv)), BP_OK);
    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, y), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
    ck_assert_int_eq(test_device_stats.computes, 1);
    ck_assert_int_ge(test_device_stats.syncs, 1);
    ck_assert_int_eq(bp_backend_tensor_get_async(be, y, out, 0, sizeof(out)), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize(be), BP_OK);
    for (int i = 0; i < 12; i++) {
        double x = (double)av[i] + bv[i % 4];
        ck_assert_double_eq_tol(out[i], x / (1 + exp(-x)), 1e-6);
    }
    ck_assert_int_eq(bp_backend_tensor_set_async(be, a, av, 4, sizeof(av)), BP_ERR_OUT_OF_BOUNDS);

    /* Asynchronous copies between backends without a queued path fall back to a sync copy. */
    ck_assert_int_eq(bp_backend_tensor_copy_async(be, be, a, y), BP_OK);
    ck_assert_int_eq(bp_backend_tensor_get_async(be, y, out, 0, sizeof(out)), BP_OK);
    ck_assert_mem_eq(out, av, sizeof(av));
    /* One that fails is reported as it failed, not retried synchronously. */
    int copies = test_device_stats.cpy_calls, gets = test_device_stats.get_calls;
    test_device_fail_copies(1);
    ck_assert_int_eq(bp_backend_tensor_copy_async(be, be, a, y), BP_ERR_BACKEND);
    ck_assert_str_eq(bp_last_error(), "TestAccel: the queued copy failed (injected)");
    ck_assert_int_eq(test_device_stats.cpy_calls, copies);
    ck_assert_int_eq(test_device_stats.get_calls, gets);
    /* and the backends are usable afterwards */
    ck_assert_int_eq(bp_backend_tensor_copy_async(be, be, a, y), BP_OK);

    /* A graph the backend fails on reports the plugin's own error. */
    int32_t bad_id = 99;
    ck_assert_int_eq(bp_tensor_set(ids, &bad_id, 0, sizeof(bad_id)), BP_OK);
    bp_graph *g2 = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g2, rows), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(be, g2), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "TestAccel"));
    bp_graph_free(g2);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_backend_free(be);
    ck_assert_int_eq(test_device_stats.backends_freed, 1);
    bp_backend_free(NULL);

    ck_assert_rejected(bp_device_init_backend(accel, "fail"), BP_ERR_BACKEND,
                       "could not create a backend");

    /* A backend without threads, and a count that is none. */
    bp_backend *be2 = bp_device_init_backend(accel, NULL);
    bp_clear_error();
    ck_assert_int_eq(bp_backend_set_n_threads(be2, 2), BP_ERR_UNSUPPORTED);
    ck_assert_error_has(BP_ERR_UNSUPPORTED, "backend ACCEL0 has no thread count to set");
    ck_assert_int_eq(bp_backend_set_n_threads(be2, 0), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_backend_set_n_threads(NULL, 2), BP_ERR_INVALID_ARG);
    bp_buffer *b2 = bp_alloc_ctx_tensors_for_backend(ctx, be2);
    ck_assert_ptr_nonnull(b2);
    ck_assert_ptr_eq(bp_buffer_get_type(b2), bp_device_get_buffer_type(accel));
    bp_buffer_free(b2);
    bp_backend_free(be2);
}
END_TEST

/* bp_tensor_copy between overlapping ranges of one buffer copies as memmove does, on host
 * memory and through a device buffer's interface alike. */
START_TEST(test_copy_overlapping_ranges)
{
    for (int dev = 0; dev < 2; dev++) {
        bp_context *c = bp_context_new(8);
        bp_tensor *t = bp_new_tensor_1d(c, BP_TYPE_F32, 8);
        bp_buffer *buf = bp_alloc_ctx_tensors(c, dev ? bp_device_get_buffer_type(accel)
                                                     : bp_host_buffer_type());
        float v[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[8];
        ck_assert_int_eq(bp_tensor_set(t, v, 0, sizeof(v)), BP_OK);
        bp_tensor *lo = bp_view_1d(c, t, 6, 0), *hi = bp_view_1d(c, t, 6, 2 * sizeof(float));
        ck_assert_int_eq(bp_tensor_copy(lo, hi), BP_OK); /* forward overlap */
        ck_assert_int_eq(bp_tensor_get(t, out, 0, sizeof(out)), BP_OK);
        const float want[8] = {0, 1, 0, 1, 2, 3, 4, 5};
        ck_assert_mem_eq(out, want, sizeof(want));
        ck_assert_int_eq(bp_tensor_copy(hi, lo), BP_OK); /* backward overlap */
        ck_assert_int_eq(bp_tensor_get(t, out, 0, sizeof(out)), BP_OK);
        const float want2[8] = {0, 1, 2, 3, 4, 5, 4, 5};
        ck_assert_mem_eq(out, want2, sizeof(want2));
        bp_buffer_free(buf);
        bp_context_free(c);
    }
}
END_TEST

/* A backend is never handed tensors in memory its device cannot use, nor tensors without
 * memory: the graph is refused with a sentence before any plugin code runs. */
START_TEST(test_compute_checks_memory)
{
    bp_backend *be = bp_device_init_backend(accel, NULL);
    bp_context *hctx = bp_context_new(8), *actx = bp_context_new(8);
    bp_tensor *h = bp_new_tensor_1d(hctx, BP_TYPE_F32, 4);
    bp_set_name(h, "host_x");
    bp_tensor *a = bp_new_tensor_1d(actx, BP_TYPE_F32, 4);
    bp_buffer *hbuf = bp_alloc_ctx_tensors(hctx, bp_host_buffer_type());
    bp_buffer *abuf = bp_alloc_ctx_tensors(actx, bp_device_get_buffer_type(accel));
    ck_assert_ptr_nonnull(hbuf);
    ck_assert_ptr_nonnull(abuf);

    /* A source in host memory, the result in the device's: refused, naming both. */
    bp_context *gctx = bp_context_new(8);
    bp_graph *g = bp_graph_new(8);
    bp_tensor *y = bp_add(gctx, a, h);
    bp_graph_build_forward(g, y);
    y->buffer = abuf; /* placed by hand, so only the source is wrong */
    y->data = a->data;
    bp_clear_error();
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_ERR_UNSUPPORTED);
    ck_assert_error_has(BP_ERR_UNSUPPORTED, "'host_x' f32 [4, 1, 1, 1]");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "which device ACCEL0 does not support"));
    ck_assert_int_eq(test_device_stats.computes, 0);

    /* A node without memory. */
    bp_graph *g2 = bp_graph_new(8);
    bp_graph_build_forward(g2, bp_neg(gctx, a));
    ck_assert_int_eq(bp_backend_graph_compute(be, g2), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "unnamed NEG result f32 [4, 1, 1, 1] has no memory");
    ck_assert_int_eq(test_device_stats.computes, 0);

    bp_graph_free(g2);
    bp_graph_free(g);
    bp_context_free(gctx);
    bp_buffer_free(hbuf);
    bp_buffer_free(abuf);
    bp_context_free(hctx);
    bp_context_free(actx);
    bp_backend_free(be);
    ck_assert_int_eq(bp_backend_graph_compute(NULL, NULL), BP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(test_events)
{
    bp_backend *be = bp_device_init_backend(accel, NULL);
    bp_event *ev = bp_event_new(accel);
    ck_assert_ptr_nonnull(ev);
    ck_assert_int_eq(bp_event_synchronize(ev), BP_ERR_BACKEND); /* never recorded */
    ck_assert_int_eq(bp_event_record(ev, be), BP_OK);
    ck_assert_int_eq(bp_event_wait(ev, be), BP_OK);
    ck_assert_int_eq(bp_event_synchronize(ev), BP_OK);
    ck_assert_int_eq(test_device_stats.events_recorded, 1);
    ck_assert_int_eq(test_device_stats.events_waited, 1);

    /* A backend of another device cannot record this device's event. */
    bp_registry *other = test_device_registry_new(0);
    bp_backend *be2 = bp_device_init_backend(bp_registry_get_device(other, 0), NULL);
    ck_assert_int_eq(bp_event_record(ev, be2), BP_ERR_INVALID_ARG);
    /* ...but can wait on it: the runtime blocks on the event instead. */
    ck_assert_int_eq(bp_event_wait(ev, be2), BP_OK);
    ck_assert_int_eq(test_device_stats.events_waited, 1);
    bp_backend_free(be2);
    bp_registry_free(other);

    bp_event_free(ev);
    bp_event_free(NULL);
    bp_backend_free(be);
    ck_assert_int_eq(bp_event_record(NULL, NULL), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_event_synchronize(NULL), BP_ERR_INVALID_ARG);
}
END_TEST

/* A buffer type whose plugin hands back half of what was asked for. */
static const char *short_name(bp_buffer_type *b) { (void)b; return "Short"; }
static size_t short_align(bp_buffer_type *b) { (void)b; return 16; }
static bp_buffer *short_alloc(bp_buffer_type *b, size_t size)
{
    (void)b;
    return bp_buffer_type_alloc(bp_host_buffer_type(), size / 2);
}

START_TEST(test_short_buffers_refused)
{
    static const struct bp_buffer_type_iface iface = {
        .struct_size = sizeof(iface),
        .get_name = short_name,
        .alloc_buffer = short_alloc,
        .get_alignment = short_align,
    };
    bp_buffer_type *bt = bp_buffer_type_new(accel, &iface, NULL);
    ck_assert_ptr_nonnull(bt);
    ck_assert_rejected(bp_buffer_type_alloc(bt, 1000), BP_ERR_BACKEND,
                       "buffer type Short returned a buffer of 500 bytes when asked for 1000");
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 100);
    ck_assert_ptr_nonnull(t);
    ck_assert_rejected(bp_alloc_ctx_tensors(ctx, bt), BP_ERR_BACKEND, "returned a buffer of 200");
    ck_assert_ptr_null(t->data);
    ck_assert_rejected(bp_registry_get_device(reg, 5), BP_ERR_OUT_OF_BOUNDS,
                       "registry TestAccel has 1 device; there is no device 5");
}
END_TEST

/* ---- Interface size rules ---------------------------------------------------------------- */

static const char *old_name(bp_device *d) { (void)d; return "OLD0"; }
static const char *old_desc(bp_device *d) { (void)d; return "a plugin built against an older API"; }
static void old_memory(bp_device *d, size_t *f, size_t *t) { (void)d; *f = *t = 0; }
static enum bp_device_type old_type(bp_device *d) { (void)d; return BP_DEVICE_TYPE_CPU; }
static bp_backend *old_init(bp_device *d, const char *p) { (void)d; (void)p; return NULL; }
static bp_buffer_type *old_buft(bp_device *d) { (void)d; return bp_host_buffer_type(); }
static bool old_supports(bp_device *d, const bp_tensor *t) { (void)d; (void)t; return true; }
static bool old_supports_buft(bp_device *d, bp_buffer_type *b) { (void)d; (void)b; return true; }
/* Beyond the declared size: the runtime must never call these. */
static bool never_offload(bp_device *d, const bp_tensor *t)
{
    (void)d;
    (void)t;
    ck_abort_msg("offload_op lies beyond struct_size and must not be called");
    return true;
}
static void *never_event(bp_device *d)
{
    (void)d;
    ck_abort_msg("event_new lies beyond struct_size and must not be called");
    return NULL;
}

static const char *reg_name_fn(bp_registry *r) { (void)r; return "Old"; }
static size_t reg_count_fn(bp_registry *r) { (void)r; return 0; }
static bp_device *reg_dev_fn(bp_registry *r, size_t i) { (void)r; (void)i; return NULL; }

START_TEST(test_struct_size_rules)
{
    static const struct bp_registry_iface ri = {
        .struct_size = sizeof(struct bp_registry_iface),
        .get_name = reg_name_fn, .get_device_count = reg_count_fn, .get_device = reg_dev_fn,
    };
    bp_registry *r = bp_registry_new(&ri, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_null(bp_registry_get_proc_address(r, "x")); /* optional member absent */

    /* Declared as ending just before offload_op: everything after it is "not supported". */
    struct bp_device_iface di = {
        .struct_size = offsetof(struct bp_device_iface, offload_op),
        .get_name = old_name, .get_description = old_desc, .get_memory = old_memory,
        .get_type = old_type, .init_backend = old_init, .get_buffer_type = old_buft,
        .supports_op = old_supports, .supports_buft = old_supports_buft,
        .offload_op = never_offload, .event_new = never_event,
    };
    bp_device *d = bp_device_new(r, &di, NULL);
    ck_assert_ptr_nonnull(d);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 2);
    ck_assert(!bp_device_offload_op(d, x));
    ck_assert_rejected(bp_event_new(d), BP_ERR_UNSUPPORTED, "OLD0");
    struct bp_device_props p;
    bp_device_get_props(d, &p);
    ck_assert(!p.caps.events);
    ck_assert_rejected(bp_device_init_backend(d, NULL), BP_ERR_BACKEND, "OLD0");

    /* A struct too short for a required member is refused, naming it. */
    struct bp_device_iface shorter = di;
    shorter.struct_size = offsetof(struct bp_device_iface, supports_op);
    ck_assert_rejected(bp_device_new(r, &shorter, NULL), BP_ERR_ABI, "supports_op");
    struct bp_device_iface missing = di;
    missing.get_buffer_type = NULL;
    ck_assert_rejected(bp_device_new(r, &missing, NULL), BP_ERR_ABI, "get_buffer_type");
    struct bp_device_iface half_events = di;
    half_events.struct_size = sizeof(half_events);
    half_events.offload_op = NULL;
    half_events.event_new = never_event;
    ck_assert_rejected(bp_device_new(r, &half_events, NULL), BP_ERR_ABI, "event_free");
    bp_registry_free(r);

    /* API versions: same major required, newer minor refused. */
    ck_assert_rejected(bp_registry_new_versioned(&ri, BP_PLUGIN_API_MAJOR + 1, 0, NULL),
                       BP_ERR_ABI, "not compatible");
    ck_assert_rejected(bp_registry_new_versioned(&ri, BP_PLUGIN_API_MAJOR, BP_PLUGIN_API_MINOR + 1,
                                                 NULL),
                       BP_ERR_ABI, "not compatible");
    struct bp_registry_iface tiny = {.struct_size = sizeof(size_t), .get_name = reg_name_fn};
    ck_assert_rejected(bp_registry_new(&tiny, NULL), BP_ERR_ABI, "get_name");
    ck_assert_rejected(bp_registry_new(NULL, NULL), BP_ERR_INVALID_ARG, "NULL");
    struct bp_buffer_type_iface bti = {.struct_size = sizeof(bti)};
    ck_assert_rejected(bp_buffer_type_new(NULL, &bti, NULL), BP_ERR_ABI, "get_name");
    struct bp_buffer_iface bi = {.struct_size = sizeof(bi)};
    ck_assert_rejected(bp_buffer_new(bp_host_buffer_type(), &bi, NULL, 0), BP_ERR_ABI, "get_base");
    struct bp_backend_iface bei = {.struct_size = sizeof(bei)};
    ck_assert_rejected(bp_backend_new(accel, &bei, NULL), BP_ERR_ABI, "get_name");
}
END_TEST

/* A backend of a plugin built against plugin API 1.0: its struct ends before
 * synchronize_timeout, so a deadline is waited for with its plain synchronize (the member past
 * the declared size is never called), and bp_backend_free synchronizes before its free. */
static int old_syncs, syncs_seen_by_free;

static const char *old_be_name(bp_backend *be)
{
    (void)be;
    return "OLDBE";
}

static enum bp_status old_be_sync(bp_backend *be)
{
    (void)be;
    old_syncs++;
    return BP_OK;
}

static enum bp_status never_sync_timeout(bp_backend *be, int64_t timeout_ns)
{
    (void)be;
    (void)timeout_ns;
    return BP_ERR_TIMEOUT;
}

static enum bp_status old_be_compute(bp_backend *be, bp_graph *g)
{
    (void)be;
    (void)g;
    return BP_OK;
}

static void old_be_free(bp_backend *be)
{
    (void)be;
    syncs_seen_by_free = old_syncs;
}

START_TEST(test_deadline_on_an_old_plugin)
{
    static const struct bp_backend_iface bei = {
        .struct_size = offsetof(struct bp_backend_iface, synchronize_timeout),
        .get_name = old_be_name, .free = old_be_free, .synchronize = old_be_sync,
        .graph_compute = old_be_compute, .synchronize_timeout = never_sync_timeout,
    };
    old_syncs = 0;
    bp_backend *be = bp_backend_new(accel, &bei, NULL);
    ck_assert_ptr_nonnull(be);
    ck_assert_int_eq(bp_backend_synchronize_timeout(be, 0), BP_OK);
    ck_assert_int_eq(old_syncs, 1);
    bp_backend_free(be);
    ck_assert_int_eq(syncs_seen_by_free, 2);
}
END_TEST

START_TEST(test_null_handles)
{
    bp_clear_error();
    ck_assert_str_eq(bp_buffer_type_get_name(NULL), "");
    ck_assert_int_eq(bp_last_status(), BP_ERR_INVALID_ARG);
    ck_assert_uint_eq(bp_buffer_type_get_alignment(NULL), 0);
    ck_assert(!bp_buffer_type_is_host(NULL));
    ck_assert_ptr_null(bp_buffer_get_base(NULL));
    ck_assert_uint_eq(bp_buffer_get_size(NULL), 0);
    ck_assert_int_eq(bp_buffer_clear(NULL, 0), BP_ERR_INVALID_ARG);
    ck_assert_str_eq(bp_backend_get_name(NULL), "");
    ck_assert_int_eq(bp_backend_synchronize(NULL), BP_ERR_INVALID_ARG);
    ck_assert(!bp_backend_supports_op(NULL, NULL));
    ck_assert_str_eq(bp_device_get_name(NULL), "");
    ck_assert_ptr_null(bp_device_init_backend(NULL, NULL));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "dev is NULL"));
    ck_assert_ptr_null(bp_event_new(NULL));
    ck_assert_str_eq(bp_registry_get_name(NULL), "");
    ck_assert_uint_eq(bp_registry_get_device_count(NULL), 0);
    ck_assert_ptr_null(bp_registry_get_proc_address(reg, NULL));
    ck_assert_int_eq(bp_tensor_copy(NULL, NULL), BP_ERR_INVALID_ARG);
    size_t f = 1, t = 1;
    bp_device_get_memory(NULL, &f, &t);
    ck_assert_uint_eq(f + t, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend-api");
    const struct {
        const TTest *fn;
        const char *name;
    } tests[] = {
        {test_host_buffer_type, "host_buffer_type"},
        {test_set_get_memset_bounds, "set_get_bounds"},
        {test_strided_2d, "strided_2d"},
        {test_buffer_from_host_ptr, "from_host_ptr"},
        {test_place_tensor_and_views, "place_and_views"},
        {test_copies_between_buffers, "copies"},
        {test_device_and_registry, "device_registry"},
        {test_backend_compute_and_async, "backend"},
        {test_compute_checks_memory, "compute_memory"},
        {test_copy_overlapping_ranges, "copy_overlap"},
        {test_short_buffers_refused, "short_buffers"},
        {test_events, "events"},
        {test_struct_size_rules, "struct_size"},
        {test_deadline_on_an_old_plugin, "deadline_on_an_old_plugin"},
        {test_null_handles, "null_handles"},
    };
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 20);
        tcase_add_test(tc, tests[i].fn);
        suite_add_tcase(s, tc);
    }
    return bp_test_run(s);
}
