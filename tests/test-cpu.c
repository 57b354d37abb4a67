/* test-cpu.c - the CPU plugin as a plugin: discovery of its variants, the device, backend
 * parameters, the thread-count proc address, events, and a graph through the graph allocator. */
#include <unistd.h>

#include <backplane/bp-plugin.h>

#include "test-util.h"

static void use_cpu_plugin(void)
{
    const char *dir = getenv("BP_TEST_CPU_PLUGIN_DIR");
    ck_assert_msg(dir != NULL, "BP_TEST_CPU_PLUGIN_DIR is not set (run through make check)");
    setenv("BP_PLUGIN_PATH", dir, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
}

START_TEST(test_best_variant_loads)
{
    use_cpu_plugin();
    bp_plugin *p = bp_plugin_by_name("cpu");
    ck_assert_ptr_nonnull(p);
    const uint64_t f = bp_cpu_features();
    const char *want = "";
    if (access(bp_plugin_path(p), R_OK) == 0 && strstr(bp_plugin_path(p), "backplane-cpu.so"))
        want = ""; /* the generic build of a non-x86 machine */
    else if ((f & (BP_CPU_AVX512F | BP_CPU_AVX512BW | BP_CPU_AVX512VL | BP_CPU_AVX512DQ |
                   BP_CPU_AVX512_VNNI)) ==
             (BP_CPU_AVX512F | BP_CPU_AVX512BW | BP_CPU_AVX512VL | BP_CPU_AVX512DQ |
              BP_CPU_AVX512_VNNI) && (f & BP_CPU_AVX2))
        want = "avx512";
    else if ((f & (BP_CPU_AVX2 | BP_CPU_FMA | BP_CPU_F16C)) ==
             (BP_CPU_AVX2 | BP_CPU_FMA | BP_CPU_F16C))
        want = "avx2";
    else
        want = "x86_64";
    ck_assert_str_eq(bp_plugin_variant(p), want);
    ck_assert_ptr_nonnull(strstr(bp_device_description(bp_device_by_name("cpu")), "kernels"));
}
END_TEST

START_TEST(test_variant_masked_by_cpu_disable)
{
    use_cpu_plugin();
    setenv("BP_CPU_DISABLE", "avx512f,avx2", 1);
    bp_plugin *p = bp_plugin_by_name("cpu");
    ck_assert_ptr_nonnull(p);
    if (strstr(bp_plugin_path(p), "backplane-cpu.so") == NULL)
        ck_assert_str_eq(bp_plugin_variant(p), "x86_64");
}
END_TEST

START_TEST(test_device)
{
    use_cpu_plugin();
    bp_device *d = bp_device_by_name("CPU");
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(bp_device_get_type(d), BP_DEVICE_TYPE_CPU);
    struct bp_device_props p;
    bp_device_get_props(d, &p);
    ck_assert_uint_gt(p.memory_total, 0);
    ck_assert_uint_le(p.memory_free, p.memory_total);
    ck_assert(p.caps.events);
    ck_assert(p.caps.buffer_from_host_ptr);
    ck_assert_ptr_eq(bp_device_get_buffer_type(d), bp_host_buffer_type());
    ck_assert(bp_device_supports_buft(d, bp_host_buffer_type()));
    float mem[16] = {0};
    bp_buffer *b = bp_device_buffer_from_host_ptr(d, mem, sizeof(mem), sizeof(mem));
    ck_assert_ptr_eq(bp_buffer_get_base(b), mem);
    bp_buffer_free(b);
    bp_backend *best = bp_backend_init_best(); /* no GPU or accelerator here: the CPU */
    ck_assert_ptr_eq(bp_backend_get_device(best), d);
    bp_backend_free(best);
}
END_TEST

START_TEST(test_backend_params)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("cpu", "threads=3");
    ck_assert_ptr_nonnull(be);
    bp_backend_free(be);
    ck_assert_rejected(bp_backend_init_by_name("CPU", "threads=0"), BP_ERR_INVALID_ARG,
                       "'threads=0'");
    ck_assert_rejected(bp_backend_init_by_name("CPU", "threads=two"), BP_ERR_INVALID_ARG,
                       "thread count");
    ck_assert_rejected(bp_backend_init_by_name("CPU", "fast=1"), BP_ERR_INVALID_ARG,
                       "unknown backend parameter 'fast=1'");
    be = bp_backend_init_by_name("CPU", "");
    ck_assert_ptr_nonnull(be);
    bp_backend_free(be);
}
END_TEST

typedef enum bp_status (*set_threads_fn)(bp_backend *, int);

/* The same graph gives the same answer with 1, 2, 5 and 7 threads set through the proc
 * address (more threads than rows included). */
START_TEST(test_set_n_threads)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=1");
    set_threads_fn set = (set_threads_fn)bp_registry_get_proc_address(
        bp_registry_by_name("CPU"), "bp_cpu_set_n_threads");
    ck_assert_ptr_nonnull(set);
    bp_context *ctx = bp_context_new(16);
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 5);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 3);
    bp_tensor *y = bp_soft_max(ctx, bp_silu(ctx, bp_mul_mat(ctx, w, x)));
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    float wv[320], xv[192], first[15], out[15];
    for (int i = 0; i < 320; i++)
        wv[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < 192; i++)
        xv[i] = (float)((i * 11) % 29) / 14.0f - 1.0f;
    bp_tensor_set(w, wv, 0, sizeof(wv));
    bp_tensor_set(x, xv, 0, sizeof(xv));
    bp_graph *g = bp_graph_new(8);
    bp_graph_build_forward(g, y);
    const int counts[] = {1, 2, 5, 7};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(set(be, counts[i]), BP_OK);
        ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
        bp_tensor_get(y, i == 0 ? first : out, 0, sizeof(out));
        if (i > 0)
            ck_assert_mem_eq(out, first, sizeof(out));
    }
    ck_assert_int_eq(set(be, 0), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(set(NULL, 2), BP_ERR_INVALID_ARG);
    ck_assert_ptr_null(bp_registry_get_proc_address(bp_registry_by_name("CPU"), "nope"));
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(be);
}
END_TEST

START_TEST(test_events_and_unsupported_graph)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    bp_event *ev = bp_event_new(bp_backend_get_device(be));
    ck_assert_ptr_nonnull(ev);
    ck_assert_int_eq(bp_event_record(ev, be), BP_OK);
    ck_assert_int_eq(bp_event_wait(be, ev), BP_OK);
    ck_assert_int_eq(bp_event_synchronize(ev), BP_OK);
    bp_event_free(ev);

    /* A node the CPU declines makes compute fail with its name, not crash. */
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 4);
    bp_tensor *t = bp_set_name(bp_add_inplace(ctx, bp_transpose(ctx, a), a), "odd");
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    bp_graph *g = bp_graph_new(8);
    bp_graph_build_forward(g, t);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "'odd'"));
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(be);
}
END_TEST

/* Products over K = 0 are zero for every strategy (dot products, broadcast kernel, GEMM, AMX):
 * the result is filled with junk first so that a kernel that writes nothing is caught. */
START_TEST(test_mul_mat_empty_k)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_ptr_nonnull(be);
    static const enum bp_type types[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_BF16, BP_TYPE_Q8_0};
    static const int64_t ns[] = {3, 20, 64, 600};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
            bp_context *ctx = bp_context_new(8);
            bp_tensor *a = bp_new_tensor_2d(ctx, types[ti], 0, 40);
            bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 0, ns[ni]);
            bp_tensor *c = bp_mul_mat(ctx, a, b);
            ck_assert_ptr_nonnull(c);
            bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
            ck_assert_ptr_nonnull(buf);
            const size_t n = (size_t)(40 * ns[ni]);
            float *v = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                v[i] = 7.0f;
            bp_tensor_set(c, v, 0, n * sizeof(float));
            bp_graph *g = bp_graph_new(8);
            bp_graph_build_forward(g, c);
            ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
            bp_tensor_get(c, v, 0, n * sizeof(float));
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(v[i] == 0.0f, "%s weights, N = %lld: element %zu is %g",
                              bp_type_name(types[ti]), (long long)ns[ni], i, (double)v[i]);
            free(v);
            bp_graph_free(g);
            bp_buffer_free(buf);
            bp_context_free(ctx);
        }
    }
    bp_backend_free(be);
}
END_TEST

/* A transformer-shaped graph through the graph allocator, the same bits with 1 and 2 threads. */
START_TEST(test_graph_allocator_and_threads_agree)
{
    use_cpu_plugin();
    bp_context *ctx = bp_context_new(64);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 7);
    bp_tensor *wq = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 64);
    bp_tensor *pos = bp_new_tensor_1d(ctx, BP_TYPE_I32, 7);
    bp_set_input(x);
    bp_set_input(pos);
    bp_tensor *h = bp_rms_norm(ctx, x, 1e-5f);
    bp_tensor *q = bp_reshape_3d(ctx, bp_mul_mat(ctx, wq, h), 16, 4, 7);
    q = bp_rope(ctx, q, pos, 16, BP_ROPE_NEOX, 10000.0f, 1.0f);
    bp_tensor *kq = bp_soft_max(ctx, bp_mul_mat(ctx, bp_permute(ctx, q, 0, 2, 1, 3),
                                                bp_permute(ctx, q, 0, 2, 1, 3)));
    bp_tensor *out = bp_sum_rows(ctx, kq);
    bp_set_output(out);
    bp_graph *g = bp_graph_new(64);
    bp_graph_build_forward(g, out);
    bp_buffer_type *h_buft = bp_host_buffer_type();
    bp_gallocr *ga = bp_gallocr_new(&h_buft, 1);
    ck_assert_int_eq(bp_gallocr_alloc_graph(ga, g, NULL, NULL), BP_OK);
    float xv[448], res[2][28];
    for (int i = 0; i < 448; i++)
        xv[i] = (float)((i * 13) % 17) / 8.0f - 1.0f;
    bp_tensor_set(x, xv, 0, sizeof(xv));
    int32_t pv[7] = {0, 1, 2, 3, 4, 5, 6};
    bp_tensor_set(pos, pv, 0, sizeof(pv));
    float wf[64 * 64];
    for (int i = 0; i < 64 * 64; i++)
        wf[i] = (float)((i * 7) % 23) / 11.0f - 1.0f;
    for (int r = 0; r < 64; r++)
        bp_type_get_traits(BP_TYPE_Q4_0)->from_float(wf + r * 64, (char *)wq->data + r * wq->nb[1], 64);
    for (int t = 0; t < 2; t++) {
        char params[32];
        snprintf(params, sizeof(params), "threads=%d", t + 1);
        bp_backend *be = bp_backend_init_by_name("CPU", params);
        ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
        bp_tensor_get(out, res[t], 0, sizeof(res[t]));
        bp_backend_free(be);
    }
    ck_assert_mem_eq(res[0], res[1], sizeof(res[0]));
    for (int i = 0; i < 28; i++)
        ck_assert_double_eq_tol(res[0][i], 1.0, 1e-5); /* softmax rows sum to one */
    bp_gallocr_free(ga);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

START_TEST(test_several_devices)
{
    use_cpu_plugin();
    setenv("BP_CPU_DEVICES", "3", 1);
    ck_assert_uint_eq(bp_registry_device_count(bp_registry_by_name("CPU")), 3);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "CPU%d", i);
        bp_device *d = bp_device_by_name(name);
        ck_assert_ptr_nonnull(d);
        ck_assert_ptr_nonnull(strstr(bp_device_description(d), "of 3"));
    }
    bp_backend *be = bp_backend_init_by_name("cpu2", NULL);
    ck_assert_str_eq(bp_backend_name(be), "CPU2");
    bp_backend_free(be);
    be = bp_backend_init_by_name("CPU", NULL); /* the registry: its first device */
    ck_assert_str_eq(bp_backend_name(be), "CPU0");
    bp_backend_free(be);
}
END_TEST

START_TEST(test_bad_device_count)
{
    use_cpu_plugin();
    setenv("BP_CPU_DEVICES", "0", 1);
    ck_assert_ptr_null(bp_registry_by_name("CPU"));
    const struct bp_plugin_record *rec = NULL;
    for (size_t i = 0; i < bp_plugin_report_count(); i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        if (r->status == BP_PLUGIN_FAILED && strstr(r->message, "BP_CPU_DEVICES"))
            rec = r;
    }
    ck_assert_msg(rec != NULL, "no report record names BP_CPU_DEVICES");
}
END_TEST

/* The shared-memory all-reduce against sums computed here, on an odd element count. */
START_TEST(test_allreduce)
{
    use_cpu_plugin();
    setenv("BP_CPU_DEVICES", "3", 1);
    bp_registry *reg = bp_registry_by_name("CPU");
    bp_comm_init_fn init = (bp_comm_init_fn)bp_registry_get_proc_address(reg, "bp_comm_init");
    bp_comm_allreduce_fn reduce =
        (bp_comm_allreduce_fn)bp_registry_get_proc_address(reg, "bp_comm_allreduce");
    bp_comm_free_fn fini = (bp_comm_free_fn)bp_registry_get_proc_address(reg, "bp_comm_free");
    ck_assert(init && reduce && fini);
    bp_backend *be[3];
    for (int i = 0; i < 3; i++)
        be[i] = bp_device_init_backend(bp_registry_get_device(reg, (size_t)i), "threads=2");
    bp_comm *comm = init(be, 3);
    ck_assert_ptr_nonnull(comm);

    enum { N = 1037 };
    bp_context *ctx = bp_context_new(8);
    bp_tensor *t[3];
    for (int i = 0; i < 3; i++)
        t[i] = bp_new_tensor_2d(ctx, BP_TYPE_F32, 61, 17); /* 1,037 elements */
    bp_tensor *odd = bp_new_tensor_1d(ctx, BP_TYPE_F32, 5);
    bp_tensor *half = bp_new_tensor_2d(ctx, BP_TYPE_F16, 61, 17);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    static float v[3][N], out[N];
    for (int i = 0; i < 3; i++) {
        for (int e = 0; e < N; e++)
            v[i][e] = (float)((e * (i + 3)) % 101) / 7.0f - (float)i;
        bp_tensor_set(t[i], v[i], 0, sizeof(v[i]));
    }
    ck_assert_int_eq(reduce(comm, t, 3), BP_OK);
    for (int i = 0; i < 3; i++) {
        bp_tensor_get(t[i], out, 0, sizeof(out));
        for (int e = 0; e < N; e++)
            ck_assert_float_eq(out[e], v[0][e] + v[1][e] + v[2][e]);
    }

    bp_tensor *mixed[3] = {t[0], odd, t[2]};
    ck_assert_int_eq(reduce(comm, mixed, 3), BP_ERR_SHAPE);
    bp_tensor *typed[3] = {t[0], half, t[2]};
    ck_assert_int_eq(reduce(comm, typed, 3), BP_ERR_TYPE);
    ck_assert_int_eq(reduce(comm, t, 2), BP_ERR_INVALID_ARG);
    bp_tensor *transposed[3] = {bp_transpose(ctx, t[0]), bp_transpose(ctx, t[1]),
                                bp_transpose(ctx, t[2])};
    for (int i = 0; i < 3; i++)
        bp_tensor_init_view(transposed[i]);
    ck_assert_int_eq(reduce(comm, transposed, 3), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "contiguous"));
    bp_backend *twice[2] = {be[0], NULL};
    ck_assert_ptr_null(init(twice, 2));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "not a CPU backend"));

    fini(comm);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    for (int i = 0; i < 3; i++)
        bp_backend_free(be[i]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu");
    BP_TCASE(s, test_best_variant_loads, 30);
    BP_TCASE(s, test_variant_masked_by_cpu_disable, 30);
    BP_TCASE(s, test_device, 30);
    BP_TCASE(s, test_backend_params, 30);
    BP_TCASE(s, test_set_n_threads, 30);
    BP_TCASE(s, test_events_and_unsupported_graph, 30);
    BP_TCASE(s, test_mul_mat_empty_k, 60);
    BP_TCASE(s, test_graph_allocator_and_threads_agree, 60);
    BP_TCASE(s, test_several_devices, 30);
    BP_TCASE(s, test_bad_device_count, 30);
    BP_TCASE(s, test_allreduce, 30);
    return bp_test_run(s);
}
