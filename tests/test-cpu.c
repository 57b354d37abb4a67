/* test-cpu.c - the CPU plugin as a plugin: discovery of its variants, the device, backend
 * parameters, the thread-count proc address, events, and a graph through the graph allocator. */
#include <math.h>
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
    ck_assert_plugins(p != NULL, "%s", bp_last_error());
    const uint64_t f = bp_cpu_features();
    const char *want = "";
    if (access(bp_plugin_get_path(p), R_OK) == 0 && strstr(bp_plugin_get_path(p), "backplane-cpu.so"))
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
    ck_assert_str_eq(bp_plugin_get_variant(p), want);
    ck_assert_ptr_nonnull(strstr(bp_device_get_description(bp_device_by_name("cpu")), "kernels"));
}
END_TEST

START_TEST(test_variant_masked_by_cpu_disable)
{
    use_cpu_plugin();
    setenv("BP_CPU_DISABLE", "avx512f,avx2", 1);
    bp_plugin *p = bp_plugin_by_name("cpu");
    ck_assert_plugins(p != NULL, "%s", bp_last_error());
    if (strstr(bp_plugin_get_path(p), "backplane-cpu.so") == NULL)
        ck_assert_str_eq(bp_plugin_get_variant(p), "x86_64");
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
    /* "CPU0" names the lone "CPU", for devices and backends alike; "CPU1" names nothing */
    ck_assert_ptr_eq(bp_device_by_name("cpu0"), d);
    bp_backend *be = bp_backend_init_by_name("CPU0", NULL);
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    ck_assert_ptr_eq(bp_backend_get_device(be), d);
    bp_backend_free(be);
    ck_assert_ptr_null(bp_backend_init_by_name("CPU1", NULL));
    ck_assert_int_eq(bp_last_status(), BP_ERR_NOT_FOUND);
}
END_TEST

START_TEST(test_backend_params)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("cpu", "threads=3");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_backend_free(be);
    ck_assert_rejected(bp_backend_init_by_name("CPU", "threads=0"), BP_ERR_INVALID_ARG,
                       "'threads=0'");
    ck_assert_rejected(bp_backend_init_by_name("CPU", "threads=two"), BP_ERR_INVALID_ARG,
                       "thread count");
    ck_assert_rejected(bp_backend_init_by_name("CPU", "fast=1"), BP_ERR_INVALID_ARG,
                       "unknown backend parameter 'fast=1'");
    be = bp_backend_init_by_name("CPU", "");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_backend_free(be);
}
END_TEST

/* Parameters are parsed whole, however long: an item past 256 bytes is still read (it used to
 * be cut off with everything after it), and empty items, a key given twice and anything but
 * digits in a count are errors. */
START_TEST(test_backend_params_parsed_whole)
{
    use_cpu_plugin();
    char *params = malloc(1024);
    snprintf(params, 1024, "%300sthreads=2%300s", "", "");
    bp_backend *be = bp_backend_init_by_name("CPU", params);
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_backend_free(be);
    snprintf(params, 1024, "threads=2,%300sbogus=1", "");
    ck_assert_rejected(bp_backend_init_by_name("CPU", params), BP_ERR_INVALID_ARG,
                       "unknown backend parameter 'bogus=1'");
    /* 300 commas before an unknown key: empty items, not a silently shorter string */
    memcpy(params, "threads=2", 9);
    memset(params + 9, ',', 300);
    strcpy(params + 309, "bogus=1");
    ck_assert_rejected(bp_backend_init_by_name("CPU", params), BP_ERR_INVALID_ARG,
                       "backend parameter 2 is empty");
    free(params);

    static const struct {
        const char *params, *needle;
    } bad[] = {
        {",threads=2", "backend parameter 1 is empty"},
        {"threads=2,", "backend parameter 2 is empty"},
        {"threads=2,,", "backend parameter 2 is empty"},
        {" ", "backend parameter 1 is empty"},
        {"threads=2,threads=3", "'threads' is given twice"},
        {"threads=2junk", "'threads=2junk' is not a thread count"},
        {"threads=+2", "'threads=+2' is not a thread count"},
        {"threads= 2", "'threads= 2' is not a thread count"},
        {"threads=", "'threads=' is not a thread count"},
        {"threads=1025", "'threads=1025' is not a thread count in 1..1024"},
        {"threads=99999999999999999999", "is not a thread count"},
        {"threads", "unknown backend parameter 'threads'"},
        {"threadsx=2", "unknown backend parameter 'threadsx=2'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_rejected(bp_backend_init_by_name("CPU", bad[i].params), BP_ERR_INVALID_ARG,
                           bad[i].needle);
    be = bp_backend_init_by_name("CPU", " threads=1 ");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_backend_free(be);
}
END_TEST

typedef enum bp_status (*set_threads_fn)(bp_backend *, int);

/* The same graph gives the same answer with 1, 2, 5 and 7 threads set through
 * bp_backend_set_n_threads, which the CPU plugin backs (more threads than rows included). */
START_TEST(test_set_n_threads)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=1");
    set_threads_fn set = bp_backend_set_n_threads;
    ck_assert_ptr_nonnull(bp_registry_get_proc_address(bp_registry_by_name("CPU"),
                                                       "bp_set_n_threads"));
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

/* ARGMAX follows the reference on rows with NaN (skipped, also at index 0), -inf and ties. */
START_TEST(test_argmax_nan_and_ties)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    bp_context *ctx = bp_context_new(4);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 5);
    bp_tensor *r = bp_argmax(ctx, a);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    const float inf = INFINITY, nan = NAN;
    const float v[20] = {nan, 1, 3, 2,          /* NaN first: 2 */
                         nan, nan, nan, nan,    /* nothing: 0 */
                         -inf, -inf, 5, -inf,   /* 2 */
                         1, 7, 7, 1,            /* first of a tie: 1 */
                         -inf, -inf, -inf, -inf}; /* nothing above -inf: 0 */
    const int32_t want[5] = {2, 0, 2, 1, 0};
    int32_t got[5];
    ck_assert_int_eq(bp_tensor_set(a, v, 0, sizeof(v)), BP_OK);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, r);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
    ck_assert_int_eq(bp_tensor_get(r, got, 0, sizeof(got)), BP_OK);
    for (int i = 0; i < 5; i++)
        ck_assert_msg(got[i] == want[i], "row %d: %d, want %d", i, got[i], want[i]);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(be);
}
END_TEST

/* Ids out of range fail the compute with a sentence naming the node, and read nothing outside
 * the table (under ASan/valgrind a wild read would show): GET_ROWS, SET_ROWS and MUL_MAT_ID,
 * whose valid slots still get their products. */
START_TEST(test_ids_out_of_range)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    bp_context *ctx = bp_context_new(16);
    bp_tensor *table = bp_new_tensor_2d(ctx, BP_TYPE_F32, 3, 4);
    bp_tensor *rid = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
    bp_tensor *rows = bp_get_rows(ctx, table, rid);
    bp_tensor *as = bp_new_tensor_3d(ctx, BP_TYPE_F32, 2, 3, 4); /* 4 experts of 3 x 2 */
    bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, 2, 1, 2);  /* 2 tokens, shared by slots */
    bp_tensor *eid = bp_new_tensor_2d(ctx, BP_TYPE_I32, 2, 2);   /* 2 slots per token */
    bp_tensor *y = bp_mul_mat_id(ctx, as, x, eid);
    ck_assert_ptr_nonnull(y);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(buf);
    float tv[12], av[24], xv[4] = {1, 2, -1, 0.5f};
    for (int i = 0; i < 12; i++)
        tv[i] = (float)i;
    for (int i = 0; i < 24; i++)
        av[i] = (float)(i % 7) - 3.0f;
    ck_assert_int_eq(bp_tensor_set(table, tv, 0, sizeof(tv)), BP_OK);
    ck_assert_int_eq(bp_tensor_set(as, av, 0, sizeof(av)), BP_OK);
    ck_assert_int_eq(bp_tensor_set(x, xv, 0, sizeof(xv)), BP_OK);

    const int32_t bad_rows[2] = {1, 4};
    ck_assert_int_eq(bp_tensor_set(rid, bad_rows, 0, sizeof(bad_rows)), BP_OK);
    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, rows), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "GET_ROWS");
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "a row id in src[1] is outside 0..3; those result rows are NaN");
    const int32_t good_rows[2] = {1, 3};
    ck_assert_int_eq(bp_tensor_set(rid, good_rows, 0, sizeof(good_rows)), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK); /* the failure did not stick */
    bp_graph_free(g);

    /* Token 0 uses experts 3 and 4 (out of range), token 1 experts -1 and 0. */
    const int32_t ids[4] = {3, 4, -1, 0};
    ck_assert_int_eq(bp_tensor_set(eid, ids, 0, sizeof(ids)), BP_OK);
    g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, y), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "MUL_MAT_ID");
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "an expert id in src[2] is outside 0..3");
    float out[12];
    ck_assert_int_eq(bp_tensor_get(y, out, 0, sizeof(out)), BP_OK);
    for (int m = 0; m < 3; m++) { /* the valid slots: (u 0, t 0) expert 3, (u 1, t 1) expert 0 */
        const float e3 = av[18 + 2 * m] * xv[0] + av[18 + 2 * m + 1] * xv[1];
        const float e0 = av[2 * m] * xv[2] + av[2 * m + 1] * xv[3];
        ck_assert_float_eq_tol(out[m], e3, 1e-6f);
        ck_assert_float_eq_tol(out[9 + m], e0, 1e-6f);
    }
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
    ck_assert_int_eq(bp_event_wait(ev, be), BP_OK);
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
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
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
    ck_assert_uint_eq(bp_registry_get_device_count(bp_registry_by_name("CPU")), 3);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "CPU%d", i);
        bp_device *d = bp_device_by_name(name);
        ck_assert_ptr_nonnull(d);
        ck_assert_ptr_nonnull(strstr(bp_device_get_description(d), "of 3"));
    }
    bp_backend *be = bp_backend_init_by_name("cpu2", NULL);
    ck_assert_str_eq(bp_backend_get_name(be), "CPU2");
    bp_backend_free(be);
    be = bp_backend_init_by_name("CPU", NULL); /* the registry: its first device */
    ck_assert_str_eq(bp_backend_get_name(be), "CPU0");
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

/* Variant i's CPU backend with two threads: 0 the best this machine runs, 1 the avx2 variant,
 * 2 the baseline (BP_CPU_DISABLE, unset again by variant_done). */
static const char *const variant_disable[] = {"", "avx512f", "avx512f,avx2"};

static bp_backend *variant_backend(int i)
{
    use_cpu_plugin();
    if (variant_disable[i][0])
        setenv("BP_CPU_DISABLE", variant_disable[i], 1);
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    return be;
}

static void variant_done(bp_backend *be)
{
    bp_backend_free(be);
    unsetenv("BP_CPU_DISABLE");
}

/* ---- CPU_REPACK: weights stored row-interleaved ---------------------------------------------
 * Run once per kernel and type: the best variant with AMX (where the machine has it), the avx512
 * variant without (its VNNI kernel, and from 32 columns the 8-bit GEMM for the types other than
 * Q4_0 and Q8_0), the avx2 variant (its own kernel for Q4_0; the other types stay plain) and the
 * baseline (which repacks nothing: the buffer type holds plain rows). */
static const char *const repack_configs[][2] = {
    {"", ""}, {"BP_CPU_AMX", "0"}, {"BP_CPU_DISABLE", "avx512f"}, {"BP_CPU_DISABLE", "avx512f,avx2"}};
#define N_REPACK_CONFIGS 4
static const enum bp_type repack_types[] = {BP_TYPE_Q4_0, BP_TYPE_Q8_0, BP_TYPE_IQ4_NL,
                                            BP_TYPE_Q5_0, BP_TYPE_Q4_1, BP_TYPE_Q5_1};

/* n random blocks of type (Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1, Q5_1) at b: scales (and minimums) of
 * varied magnitude and sign, every quant value (Q8_0 includes -128). */
static void random_blocks(enum bp_type type, void *b, int64_t n, unsigned *seed)
{
    const size_t bs = bp_type_size(type);
    for (int64_t i = 0; i < n; i++) {
        uint8_t *blk = (uint8_t *)b + (size_t)i * bs;
        const uint16_t d = bp_fp32_to_fp16((float)(1 + rand_r(seed) % 13) / 64.0f *
                                           (rand_r(seed) % 2 ? 1.0f : -1.0f));
        memcpy(blk, &d, 2);
        for (size_t j = 2; j < bs; j++)
            blk[j] = (uint8_t)(rand_r(seed) & 0xff);
        if (type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1) { /* a minimum of varied sign too */
            const uint16_t m = bp_fp32_to_fp16((float)(rand_r(seed) % 17 - 8) / 16.0f);
            memcpy(blk + 2, &m, 2);
        }
    }
}

/* Element k of a row of plain blocks of type, as the format defines it. */
static double block_value(enum bp_type type, const void *row, int64_t k)
{
    const uint8_t *b = (const uint8_t *)row + (size_t)(k / 32) * bp_type_size(type);
    const int j = (int)(k % 32);
    uint16_t d;
    memcpy(&d, b, 2);
    /* IQ4_NL's values, from ggml's block format. */
    static const int iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
    const int nib = j < 16 ? (b[2 + j] & 0x0f) : (b[2 + j - 16] >> 4);
    int q;
    if (type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1) { /* d, m, (qh,) nibbles: d q + m */
        uint16_t m;
        memcpy(&m, b + 2, 2);
        const int o = type == BP_TYPE_Q4_1 ? 4 : 8;
        q = j < 16 ? (b[o + j] & 0x0f) : (b[o + j - 16] >> 4);
        if (type == BP_TYPE_Q5_1)
            q |= ((b[4 + j / 8] >> (j % 8)) & 1) << 4;
        return (double)bp_fp16_to_fp32(d) * q + (double)bp_fp16_to_fp32(m);
    }
    if (type == BP_TYPE_Q5_0) { /* d, then qh (bit j: value j's fifth bit), then the nibbles */
        const int n5 = j < 16 ? (b[6 + j] & 0x0f) : (b[6 + j - 16] >> 4);
        q = (n5 | (((b[2 + j / 8] >> (j % 8)) & 1) << 4)) - 16;
    } else if (type == BP_TYPE_Q4_0)
        q = nib - 8;
    else if (type == BP_TYPE_IQ4_NL)
        q = iq4nl[nib];
    else
        q = (int8_t)b[2 + j];
    return (double)bp_fp16_to_fp32(d) * q;
}

static bp_buffer_type *repack_buft(bp_backend *be)
{
    bp_device *dev = bp_backend_get_device(be);
    bp_cpu_repack_buffer_type_fn get = (bp_cpu_repack_buffer_type_fn)bp_registry_get_proc_address(
        bp_device_get_registry(dev), "bp_cpu_repack_buffer_type");
    ck_assert_ptr_nonnull(get);
    bp_buffer_type *bt = get(dev);
    ck_assert_ptr_nonnull(bt);
    return bt;
}

/* Loop test i's CPU backend: the CPU variant its configuration selects (repack_configs) with
 * two threads, and the weight type it tests. */
static bp_backend *repack_backend(int i, enum bp_type *type)
{
    const char *const *config = repack_configs[i % N_REPACK_CONFIGS];
    *type = repack_types[i / N_REPACK_CONFIGS];
    use_cpu_plugin();
    if (config[0][0])
        setenv(config[0], config[1], 1);
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    printf("repack %s: %s%s%s\n", bp_type_name(*type),
           bp_device_get_description(bp_backend_get_device(be)), config[0][0] ? " with " : "",
           config[0]);
    return be;
}

/* MUL_MAT and GET_ROWS with repacked weights against the definition of the type (double sums of
 * the activation as given: the kernel quantises it to Q8_0, hence the conformance tolerance), and
 * against the same product with the weights in host memory. */
/* MUL_MAT_ID over stacked experts [K, M, E] in CPU_REPACK (each expert's rows whole groups of
 * the layout) against the definition of the type, the activations shared by a token's slots as
 * a Mixtral layer has them, with one token (one column per expert) and with many (groups of
 * several columns, up to the broadcast kernel's widths); the bytes come back as they went in. */
START_TEST(test_repack_mul_mat_id)
{
    enum bp_type type;
    bp_backend *be = repack_backend(_i, &type);
    const size_t bs = bp_type_size(type);
    bp_buffer_type *bt = repack_buft(be);
    enum { K = 256, M = 704, E = 8, U = 2, nblk = K / 32 };
    /* 136 tokens: every first slot is expert 0, which then has 136 columns (the 8-bit GEMMs on
     * a repacked expert's slice). */
    static const int64_t ts[] = {1, 3, 8, 16, 32, 40, 136};
    unsigned seed = 11;
    for (size_t ti = 0; ti < sizeof(ts) / sizeof(ts[0]); ti++) {
        const int64_t T = ts[ti];
        bp_context *wctx = bp_context_new(2), *ctx = bp_context_new(16);
        bp_tensor *as = bp_new_tensor_3d(wctx, type, K, M, E);
        bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, K, 1, T);
        bp_tensor *ids = bp_new_tensor_2d(ctx, BP_TYPE_I32, U, T);
        bp_tensor *y = bp_mul_mat_id(ctx, as, x, ids);
        ck_assert_ptr_nonnull(y);
        bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bt);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        ck_assert_ptr_nonnull(wbuf);
        ck_assert_ptr_nonnull(buf);
        const size_t wbytes = (size_t)(E * M * nblk) * bs;
        ck_assert_uint_eq(bp_nbytes(as), wbytes);
        uint8_t *w = malloc(wbytes), *back = malloc(wbytes);
        random_blocks(type, w, E * M * nblk, &seed);
        ck_assert_int_eq(bp_tensor_set(as, w, 0, wbytes), BP_OK);
        ck_assert_int_eq(bp_tensor_get(as, back, 0, wbytes), BP_OK);
        ck_assert(memcmp(w, back, wbytes) == 0);
        float *xv = malloc((size_t)(K * U * T) * sizeof(float));
        for (int64_t i = 0; i < K * T; i++)
            xv[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
        ck_assert_int_eq(bp_tensor_set(x, xv, 0, bp_nbytes(x)), BP_OK);
        int32_t *iv = malloc((size_t)(U * T) * sizeof(int32_t));
        for (int64_t t = 0; t < T; t++) { /* a token's experts differ, as top-k gives them */
            iv[t * U] = T == 136 ? 0 : (int32_t)(rand_r(&seed) % E);
            iv[t * U + 1] = (iv[t * U] + 1 + (int32_t)(rand_r(&seed) % (E - 1))) % E;
        }
        ck_assert_int_eq(bp_tensor_set(ids, iv, 0, bp_nbytes(ids)), BP_OK);
        ck_assert(bp_backend_supports_op(be, y));
        bp_graph *g = bp_graph_new(8);
        bp_graph_build_forward(g, y);
        ck_assert_msg(bp_backend_graph_compute(be, g) == BP_OK, "%s", bp_last_error());
        bp_graph_free(g);
        float *got = malloc((size_t)(M * U * T) * sizeof(float));
        ck_assert_int_eq(bp_tensor_get(y, got, 0, bp_nbytes(y)), BP_OK);
        double err = 0, ref2 = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t u = 0; u < U; u++)
                for (int64_t m = 0; m < M; m++) {
                    const uint8_t *row = w + (size_t)((iv[t * U + u] * M + m) * nblk) * bs;
                    double r = 0;
                    for (int64_t k = 0; k < K; k++)
                        r += block_value(type, row, k) * xv[t * K + k];
                    const double gv = got[(t * U + u) * M + m];
                    err += (gv - r) * (gv - r);
                    ref2 += r * r;
                }
        ck_assert_msg(err <= 2e-4 * ref2, "%s T %lld: NMSE %g", bp_type_name(type), (long long)T,
                      err / ref2);
        /* MUL_MAT of the stacked tensor (a batched product) reads one matrix per batch: where
         * it is stored repacked the CPU declines it, in supports_op and when asked to compute it
         * anyway, rather than read matrix 0 for every batch; where it computes it, the result
         * is each expert's. */
        bp_tensor *xb = bp_new_tensor_3d(ctx, BP_TYPE_F32, K, 1, E);
        bp_tensor *mm = bp_mul_mat(ctx, as, xb);
        bp_buffer *buf2 = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        float xe[K * E];
        for (int64_t i = 0; i < K * E; i++)
            xe[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
        ck_assert_int_eq(bp_tensor_set(xb, xe, 0, sizeof(xe)), BP_OK);
        bp_graph *g2 = bp_graph_new(8);
        bp_graph_build_forward(g2, mm);
        const bool claimed = bp_backend_supports_op(be, mm);
        const enum bp_status mst = bp_backend_graph_compute(be, g2);
        bp_graph_free(g2);
        ck_assert_int_eq(mst, claimed ? BP_OK : BP_ERR_UNSUPPORTED);
        if (mst == BP_OK) {
            float mv[M * E];
            ck_assert_int_eq(bp_tensor_get(mm, mv, 0, sizeof(mv)), BP_OK);
            double e2 = 0, r2 = 0;
            for (int64_t ex = 0; ex < E; ex++)
                for (int64_t m = 0; m < M; m++) {
                    const uint8_t *row = w + (size_t)((ex * M + m) * nblk) * bs;
                    double r = 0;
                    for (int64_t k = 0; k < K; k++)
                        r += block_value(type, row, k) * xe[ex * K + k];
                    e2 += (mv[ex * M + m] - r) * (mv[ex * M + m] - r);
                    r2 += r * r;
                }
            ck_assert_msg(e2 <= 2e-4 * r2, "batched MUL_MAT of stacked %s: NMSE %g",
                          bp_type_name(type), e2 / r2);
        }
        bp_buffer_free(buf2);
        free(w);
        free(back);
        free(xv);
        free(iv);
        free(got);
        bp_buffer_free(buf);
        bp_buffer_free(wbuf);
        bp_context_free(ctx);
        bp_context_free(wctx);
    }
    bp_backend_free(be);
    unsetenv(repack_configs[_i % N_REPACK_CONFIGS][0]);
}
END_TEST

START_TEST(test_repack_mul_mat)
{
    enum bp_type type;
    bp_backend *be = repack_backend(_i, &type);
    const size_t bs = bp_type_size(type);
    bp_buffer_type *bt = repack_buft(be);
    ck_assert_str_eq(bp_buffer_type_get_name(bt), "CPU_REPACK");
    ck_assert(!bp_buffer_type_is_host(bt));
    ck_assert(bp_backend_supports_buft(be, bt));

    /* N = 96 (past the broadcast kernel's columns) and 130 (the repacked types other than Q4_0
     * and Q8_0 leave the repacked kernel for AMX or the 8-bit GEMM from 32) in a second pass, so the first
     * draws the same data as before. */
    static const int64_t ks[] = {32, 96, 544}, ms[] = {1, 7, 8, 37, 64},
                         ns[] = {1, 3, 5, 8, 17, 64, 96, 130};
    unsigned seed = 7;
    for (size_t pass = 0; pass < 2; pass++)
        for (size_t ki = 0; ki < 3; ki++)
            for (size_t mi = 0; mi < 5; mi++)
                for (size_t ni = pass ? 6 : 0; ni < (pass ? 8u : 6u); ni++) {
                    const int64_t K = ks[ki], M = ms[mi], N = ns[ni], nblk = K / 32;
                    bp_context *wctx = bp_context_new(4), *ctx = bp_context_new(16);
                    bp_tensor *a = bp_new_tensor_2d(wctx, type, K, M);
                    bp_tensor *ah = bp_new_tensor_2d(ctx, type, K, M);
                    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, N);
                    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 3);
                    bp_tensor *c = bp_mul_mat(ctx, a, b), *ch = bp_mul_mat(ctx, ah, b);
                    bp_tensor *rows = bp_get_rows(ctx, a, ids);
                    ck_assert_ptr_nonnull(rows);
                    bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bt);
                    bp_buffer *buf =
                        bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
                    ck_assert_ptr_nonnull(wbuf);
                    ck_assert_ptr_nonnull(buf);

                    const size_t wbytes = (size_t)(M * nblk) * bs;
                    uint8_t *w = malloc(wbytes), *back = malloc(wbytes);
                    random_blocks(type, w, M * nblk, &seed);
                    ck_assert_int_eq(bp_tensor_set(a, w, 0, wbytes), BP_OK);
                    ck_assert_int_eq(bp_tensor_set(ah, w, 0, wbytes), BP_OK);
                    ck_assert_int_eq(bp_tensor_get(a, back, 0, wbytes), BP_OK);
                    ck_assert(memcmp(w, back, wbytes) == 0);
                    float *x = malloc((size_t)(K * N) * sizeof(float));
                    for (int64_t i = 0; i < K * N; i++)
                        x[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
                    bp_tensor_set(b, x, 0, (size_t)(K * N) * sizeof(float));
                    const int32_t id[3] = {(int32_t)(M - 1), 0, (int32_t)(M / 2)};
                    bp_tensor_set(ids, id, 0, sizeof(id));

                    for (int op = 0; op < 3; op++) {
                        bp_tensor *t = op == 0 ? c : op == 1 ? ch : rows;
                        ck_assert(bp_backend_supports_op(be, t));
                        bp_graph *g = bp_graph_new(8);
                        bp_graph_build_forward(g, t);
                        ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
                        bp_graph_free(g);
                    }
                    float *got = malloc((size_t)(M * N) * sizeof(float));
                    float *host = malloc((size_t)(M * N) * sizeof(float));
                    bp_tensor_get(c, got, 0, (size_t)(M * N) * sizeof(float));
                    bp_tensor_get(ch, host, 0, (size_t)(M * N) * sizeof(float));
                    const bool mins = type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1;
                    double err = 0, ref2 = 0, diff = 0;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t m = 0; m < M; m++) {
                            double r = 0, mag = 0;
                            for (int64_t k = 0; k < K; k++) {
                                const double p =
                                    block_value(type, w + (size_t)(m * nblk) * bs, k) *
                                    x[n * K + k];
                                r += p;
                                mag += fabs(p);
                            }
                            const double gv = got[n * M + m];
                            err += (gv - r) * (gv - r);
                            /* A minimum adds to every product a term whose rounding with the
                             * 8-bit activations does not shrink when the terms cancel: the
                             * error is measured against the terms' size there. */
                            ref2 += mins ? mag * mag / (double)K : r * r;
                            diff += (gv - host[n * M + m]) * (gv - host[n * M + m]);
                        }
                    /* Below 16 columns the host weights take the same integer sums; from 16,
                     * other kernels (AMX, the 8-bit GEMM, f32 products). */
                    /* Random bytes give IQ4_NL and Q5_0 their widest values everywhere, so one
                     * row's few products carry the activations' rounding at up to 3.4e-4 (the
                     * host weights' kernels too, within 1e-9 of these). */
                    const double bound =
                        type == BP_TYPE_IQ4_NL || type == BP_TYPE_Q5_0 ? 4e-4 : 2e-4;
                    /* Q4_1/Q5_1's dot products take the activations' sums rounded to f16 (Q8_1),
                     * the repacked kernel in f32. */
                    ck_assert_msg(err <= bound * ref2 &&
                                      (N >= 16 || diff <= (mins ? 1e-6 : 1e-9) * ref2),
                                  "%s K %lld M %lld N %lld: NMSE %g against the definition, %g "
                                  "against host weights", bp_type_name(type), (long long)K,
                                  (long long)M, (long long)N, err / ref2, diff / ref2);
                    float *rv = malloc((size_t)(3 * K) * sizeof(float));
                    bp_tensor_get(rows, rv, 0, (size_t)(3 * K) * sizeof(float));
                    for (int i = 0; i < 3; i++)
                        for (int64_t k = 0; k < K; k++)
                            ck_assert_msg(rv[i * K + k] ==
                                              (float)block_value(
                                                  type, w + (size_t)(id[i] * nblk) * bs, k),
                                          "get_rows: row %d element %lld", id[i], (long long)k);
                    free(rv);
                    free(got);
                    free(host);
                    free(x);
                    free(back);
                    free(w);
                    bp_buffer_free(buf);
                    bp_buffer_free(wbuf);
                    bp_context_free(ctx);
                    bp_context_free(wctx);
                }
    bp_backend_free(be);
}
END_TEST

/* Valgrind's CPU has no AVX-512 (so the AVX-512 kernels do not run under it) and runs the
 * products about fifty times slower: there, the small shapes only. */
static bool under_valgrind(void)
{
    const char *preload = getenv("LD_PRELOAD");
    return preload != NULL && strstr(preload, "vgpreload") != NULL;
}

/* Q4_K, Q5_K and IQ4_XS in CPU_REPACK (stored as sub-blocks of 32 with their super-block's
 * scales beside, where the variant repacks them): every bit of random blocks comes back as it
 * went in, through set and get, memset and clear; MUL_MAT against the runtime's dequantiser in
 * double, at widths that take the layout's kernel (1-17 columns) and the 8-bit GEMM or AMX
 * reading the layout (40, 130); GET_ROWS bit for bit. Under valgrind, the narrow products only. */
static const enum bp_type repack_super_types[] = {BP_TYPE_Q4_K, BP_TYPE_Q5_K, BP_TYPE_IQ4_XS};

START_TEST(test_repack_superblocks)
{
    const enum bp_type type = repack_super_types[_i / N_REPACK_CONFIGS];
    const char *const *config = repack_configs[_i % N_REPACK_CONFIGS];
    use_cpu_plugin();
    if (config[0][0])
        setenv(config[0], config[1], 1);
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_buffer_type *bt = repack_buft(be);
    const struct bp_type_traits *tr = bp_type_get_traits(type);
    const size_t bs = bp_type_size(type);
    static const int64_t ks[] = {256, 768}, ms[] = {1, 7, 37}, ns[] = {1, 3, 17, 40, 130};
    const size_t n_ns = under_valgrind() ? 2u : sizeof(ns) / sizeof(ns[0]);
    unsigned seed = 23;
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t mi = 0; mi < 3; mi++)
            for (size_t ni = 0; ni < n_ns; ni++) {
                const int64_t K = ks[ki], M = ms[mi], N = ns[ni], nblk = K / 256;
                bp_context *wctx = bp_context_new(2), *ctx = bp_context_new(8);
                bp_tensor *a = bp_new_tensor_2d(wctx, type, K, M);
                bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, N);
                bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
                bp_tensor *c = bp_mul_mat(ctx, a, b), *rows = bp_get_rows(ctx, a, ids);
                bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bt);
                bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
                ck_assert_ptr_nonnull(wbuf);
                ck_assert_ptr_nonnull(buf);
                const size_t wbytes = (size_t)(M * nblk) * bs;
                uint8_t *w = malloc(wbytes), *back = malloc(wbytes);
                for (size_t i = 0; i < wbytes; i++)
                    w[i] = (uint8_t)(rand_r(&seed) & 0xff);
                for (int64_t i = 0; i < M * nblk; i++) { /* finite d (and dmin) of both signs */
                    for (int h = 0; h < (type == BP_TYPE_IQ4_XS ? 1 : 2); h++) {
                        const uint16_t d = bp_fp32_to_fp16((float)(1 + rand_r(&seed) % 13) /
                                                           512.0f * (rand_r(&seed) % 2 ? 1 : -1));
                        memcpy(w + (size_t)i * bs + 2 * h, &d, 2);
                    }
                }
                ck_assert_int_eq(bp_tensor_set(a, w, 0, wbytes), BP_OK);
                ck_assert_int_eq(bp_tensor_get(a, back, 0, wbytes), BP_OK);
                ck_assert(memcmp(w, back, wbytes) == 0);
                float *wf = malloc((size_t)(K * M) * sizeof(float));
                float *x = malloc((size_t)(K * N) * sizeof(float));
                float *got = malloc((size_t)(M * N) * sizeof(float));
                tr->to_float(w, wf, K * M);
                for (int64_t i = 0; i < K * N; i++)
                    x[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
                ck_assert_int_eq(bp_tensor_set(b, x, 0, bp_nbytes(b)), BP_OK);
                const int32_t id[2] = {(int32_t)(M - 1), 0};
                ck_assert_int_eq(bp_tensor_set(ids, id, 0, sizeof(id)), BP_OK);
                for (int op = 0; op < 2; op++) {
                    bp_tensor *t = op ? rows : c;
                    ck_assert(bp_backend_supports_op(be, t));
                    bp_graph *g = bp_graph_new(4);
                    bp_graph_build_forward(g, t);
                    ck_assert_msg(bp_backend_graph_compute(be, g) == BP_OK, "%s",
                                  bp_last_error());
                    bp_graph_free(g);
                }
                ck_assert_int_eq(bp_tensor_get(c, got, 0, bp_nbytes(c)), BP_OK);
                double err = 0, ref2 = 0;
                for (int64_t n = 0; n < N; n++)
                    for (int64_t m = 0; m < M; m++) {
                        double r = 0, mag = 0;
                        for (int64_t k = 0; k < K; k++) {
                            const double pr = (double)wf[m * K + k] * x[n * K + k];
                            r += pr;
                            mag += fabs(pr);
                        }
                        err += (got[n * M + m] - r) * (got[n * M + m] - r);
                        /* as for Q4_1: the minimums' terms do not shrink when products cancel */
                        ref2 += mag * mag / (double)K;
                    }
                ck_assert_msg(err <= 4e-4 * ref2, "%s K %lld M %lld N %lld: NMSE %g",
                              bp_type_name(type), (long long)K, (long long)M, (long long)N,
                              err / ref2);
                float rv[2 * 768];
                ck_assert_int_eq(bp_tensor_get(rows, rv, 0, bp_nbytes(rows)), BP_OK);
                for (int i = 0; i < 2; i++)
                    ck_assert(memcmp(rv + i * K, wf + id[i] * K, (size_t)K * sizeof(float)) == 0);
                /* memset of the second row's blocks, then a clear of the whole buffer */
                if (M > 1) {
                    ck_assert_int_eq(bp_tensor_memset(a, 0x5a, (size_t)nblk * bs,
                                                      (size_t)nblk * bs), BP_OK);
                    ck_assert_int_eq(bp_tensor_get(a, back, 0, wbytes), BP_OK);
                    for (size_t i = 0; i < wbytes; i++)
                        ck_assert_uint_eq(back[i], i >= (size_t)nblk * bs &&
                                                           i < 2 * (size_t)nblk * bs ? 0x5a : w[i]);
                }
                ck_assert_int_eq(bp_buffer_clear(wbuf, 0xc3), BP_OK);
                ck_assert_int_eq(bp_tensor_get(a, back, 0, wbytes), BP_OK);
                for (size_t i = 0; i < wbytes; i++)
                    ck_assert_uint_eq(back[i], 0xc3);
                free(w);
                free(back);
                free(wf);
                free(x);
                free(got);
                bp_buffer_free(buf);
                bp_buffer_free(wbuf);
                bp_context_free(ctx);
                bp_context_free(wctx);
            }
    /* Memory that held a Q4_K tensor and then another one: a clear fills the new one's bytes,
     * not the old one's blocks. */
    bp_buffer *pb = bp_buffer_type_alloc(bt, 8 * 192); /* Q5_K: 180 bytes a row */
    ck_assert_ptr_nonnull(pb);
    bp_context *pctx = bp_context_new(2);
    bp_tensor *old = bp_new_tensor_2d(pctx, type, 256, 8);
    bp_tensor *now = bp_new_tensor_1d(pctx, BP_TYPE_F32, 256);
    ck_assert_int_eq(bp_buffer_place_tensor(pb, old, bp_buffer_get_base(pb)), BP_OK);
    ck_assert_int_eq(bp_buffer_place_tensor(pb, now, bp_buffer_get_base(pb)), BP_OK);
    ck_assert_int_eq(bp_buffer_clear(pb, 0x3c), BP_OK);
    uint8_t fb[256 * 4];
    ck_assert_int_eq(bp_tensor_get(now, fb, 0, sizeof(fb)), BP_OK);
    for (size_t i = 0; i < sizeof(fb); i++)
        ck_assert_uint_eq(fb[i], 0x3c);
    bp_context_free(pctx);
    bp_buffer_free(pb);
    bp_backend_free(be);
    if (config[0][0])
        unsetenv(config[0]);
}
END_TEST

/* "bp_cpu_repack_type" answers, per variant, whether a type is stored row-interleaved: exactly
 * the tensors whose copy the CPU then refuses (nothing but MUL_MAT and GET_ROWS reads them). */
START_TEST(test_repack_type)
{
    bp_backend *be = variant_backend(_i);
    bp_device *dev = bp_backend_get_device(be);
    bp_cpu_repack_type_fn stores = (bp_cpu_repack_type_fn)bp_registry_get_proc_address(
        bp_device_get_registry(dev), "bp_cpu_repack_type");
    ck_assert_ptr_nonnull(stores);
    bp_clear_error();
    ck_assert(!stores(NULL, BP_TYPE_Q4_0));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "not a CPU device");
    bp_buffer_type *bt = repack_buft(be);
    int interleaved = 0;
    for (int ti = 0; ti < BP_TYPE_COUNT; ti++) {
        const enum bp_type t = (enum bp_type)ti;
        if (t == BP_TYPE_I32)
            continue;
        bp_context *wctx = bp_context_new(2), *ctx = bp_context_new(4);
        bp_tensor *w = bp_new_tensor_2d(wctx, t, 256, 8);
        bp_tensor *cp = bp_cpy(ctx, w, bp_new_tensor_2d(ctx, t, 256, 8));
        bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bt);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        ck_assert_ptr_nonnull(wbuf);
        ck_assert_ptr_nonnull(buf);
        const bool s = stores(dev, t);
        interleaved += s;
        ck_assert_msg(s == !bp_backend_supports_op(be, cp), "%s on %s: stored %s, copy %s",
                      bp_type_name(t), bp_device_get_description(dev),
                      s ? "interleaved" : "plain",
                      bp_backend_supports_op(be, cp) ? "supported" : "refused");
        bp_buffer_free(buf);
        bp_buffer_free(wbuf);
        bp_context_free(ctx);
        bp_context_free(wctx);
    }
    /* The baseline repacks nothing; the avx2 variant Q4_0; the best one at least that. */
    ck_assert_int_eq(stores(dev, BP_TYPE_F32), false);
    if (_i == 2)
        ck_assert_int_eq(interleaved, 0);
    else
        ck_assert(stores(dev, BP_TYPE_Q4_0));
    variant_done(be);
}
END_TEST

/* Block-wise writes, memset, tensors stored as they are, and what is refused with a reason. */
START_TEST(test_repack_buffer)
{
    use_cpu_plugin();
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_buffer_type *bt = repack_buft(be);
    bp_cpu_repack_buffer_type_fn get = (bp_cpu_repack_buffer_type_fn)bp_registry_get_proc_address(
        bp_device_get_registry(bp_backend_get_device(be)), "bp_cpu_repack_buffer_type");
    bp_clear_error();
    ck_assert_ptr_null(get(NULL));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "not a CPU device");

    bp_context *wctx = bp_context_new(8), *ctx = bp_context_new(16);
    bp_tensor *a = bp_new_tensor_2d(wctx, BP_TYPE_Q4_0, 64, 11);
    bp_set_name(a, "w");
    bp_tensor *f = bp_new_tensor_2d(wctx, BP_TYPE_F32, 5, 3);
    bp_tensor *a3 = bp_new_tensor_3d(wctx, BP_TYPE_Q4_0, 32, 2, 2); /* 3-D: stored as it is */
    bp_tensor *y = bp_new_tensor_2d(ctx, BP_TYPE_F32, 5, 3);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 2);
    bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bt);
    ck_assert_ptr_nonnull(wbuf);
    /* Eleven rows take two groups of eight. */
    ck_assert_uint_eq(bp_buffer_type_get_alloc_size(bt, a), 16 * 2 * sizeof(struct bp_block_q4_0));

    struct bp_block_q4_0 w[22], back[22];
    unsigned seed = 3;
    random_blocks(BP_TYPE_Q4_0, w, 22, &seed);
    ck_assert_int_eq(bp_tensor_set(a, w, 0, sizeof(w)), BP_OK);
    random_blocks(BP_TYPE_Q4_0, w + 5, 3, &seed); /* blocks 5-7 again, alone */
    ck_assert_int_eq(bp_tensor_set(a, w + 5, 5 * sizeof(w[0]), 3 * sizeof(w[0])), BP_OK);
    ck_assert_int_eq(bp_tensor_get(a, back, 0, sizeof(back)), BP_OK);
    ck_assert(memcmp(w, back, sizeof(w)) == 0);
    ck_assert_int_eq(bp_tensor_get(a, back, 7 * sizeof(w[0]), 2 * sizeof(w[0])), BP_OK);
    ck_assert(memcmp(w + 7, back, 2 * sizeof(w[0])) == 0);
    ck_assert_int_eq(bp_tensor_set(a, w, 5, sizeof(w[0])), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "whole q4_0 blocks of 18 bytes");
    ck_assert_int_eq(bp_tensor_get(a, back, 0, 20), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tensor_memset(a, 0x5a, 3, 18), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_tensor_memset(a, 0x5a, 18, 36), BP_OK);
    ck_assert_int_eq(bp_tensor_get(a, back, 0, sizeof(back)), BP_OK);
    ck_assert(memcmp(w, back, 18) == 0 && memcmp(w + 3, back + 3, 19 * sizeof(w[0])) == 0);
    for (size_t i = 18; i < 54; i++)
        ck_assert_uint_eq(((const uint8_t *)back)[i], 0x5a);

    /* An F32 tensor (and a 3-D Q4_0 one) in the same buffer is plain memory for every op. */
    const float fv[15] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    float fb[15];
    ck_assert_int_eq(bp_tensor_set(f, fv + 1, 4, sizeof(fv) - 4), BP_OK);
    ck_assert_int_eq(bp_tensor_set(f, fv, 0, 4), BP_OK);
    ck_assert_int_eq(bp_tensor_get(f, fb, 0, sizeof(fb)), BP_OK);
    ck_assert(memcmp(fv, fb, sizeof(fv)) == 0);
    ck_assert_int_eq(bp_tensor_set(a3, w, 1, 3), BP_OK); /* not repacked: any byte range */
    bp_tensor *sum = bp_add(ctx, f, y);
    bp_tensor *mm3 = bp_mul_mat(ctx, a3, bp_reshape_3d(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 4), 32, 2, 2));
    ck_assert(bp_backend_supports_op(be, sum));
    ck_assert(bp_backend_supports_op(be, mm3));

    /* Views of repacked data and other ops on it are refused; the scheduler copies instead. */
    bp_tensor *rows2 = bp_view_2d(ctx, a, 64, 2, a->nb[1], 0);
    bp_tensor *cp = bp_cpy(ctx, a, bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 11));
    bp_tensor *mmv = bp_mul_mat(ctx, rows2, bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 1));
    bp_tensor *mmt = bp_mul_mat(ctx, x, bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 1));
    ck_assert_ptr_nonnull(cp);
    ck_assert_ptr_nonnull(mmv);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    ck_assert_ptr_nonnull(buf);
    ck_assert(!bp_backend_supports_op(be, rows2));
    ck_assert(!bp_backend_supports_op(be, cp));
    ck_assert(!bp_backend_supports_op(be, mmv));
    ck_assert(bp_backend_supports_op(be, mmt));
    ck_assert_int_eq(bp_tensor_get(rows2, back, 0, 2 * sizeof(w[0])), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "view of a repacked");
    /* A weight written through a copy from host memory arrives in whole blocks, repacked. */
    bp_tensor *src = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 11);
    bp_buffer *sbuf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    ck_assert_ptr_nonnull(sbuf);
    bp_tensor_set(src, w, 0, sizeof(w));
    ck_assert_int_eq(bp_tensor_copy(src, a), BP_OK);
    ck_assert_int_eq(bp_tensor_get(a, back, 0, sizeof(back)), BP_OK);
    ck_assert(memcmp(w, back, sizeof(w)) == 0);

    /* Through the scheduler: the product of the weights runs; one of a view of them is refused
     * with a reason (no other backend is there to take a copy). */
    bp_context *gctx = bp_context_new(8);
    bp_tensor *gx = bp_new_tensor_2d(gctx, BP_TYPE_F32, 64, 3);
    bp_set_input(gx);
    bp_tensor *gy = bp_mul_mat(gctx, a, gx);
    bp_tensor *gv = bp_mul_mat(gctx, bp_view_2d(gctx, a, 64, 2, a->nb[1], 0), gx);
    bp_backend *only[1] = {be};
    bp_sched *sch = bp_sched_new(only, NULL, 1, 64, false);
    ck_assert_ptr_nonnull(sch);
    bp_graph *g = bp_graph_new(16);
    bp_graph_build_forward(g, gy);
    ck_assert_int_eq(bp_sched_alloc_graph(sch, g), BP_OK);
    float xs[64 * 3], ys[11 * 3];
    for (int i = 0; i < 64 * 3; i++)
        xs[i] = (float)(i % 7) - 3.0f;
    bp_tensor_set(gx, xs, 0, sizeof(xs));
    ck_assert_int_eq(bp_sched_graph_compute(sch, g), BP_OK);
    bp_tensor_get(gy, ys, 0, sizeof(ys));
    for (int n = 0; n < 3; n++)
        for (int m = 0; m < 11; m++) {
            double r = 0, mag = 0; /* the activation is quantised: 1 % of the terms' size */
            for (int k = 0; k < 64; k++) {
                r += block_value(BP_TYPE_Q4_0, w + 2 * m, k) * xs[n * 64 + k];
                mag += fabs(block_value(BP_TYPE_Q4_0, w + 2 * m, k) * xs[n * 64 + k]);
            }
            ck_assert_msg(fabs(ys[n * 11 + m] - r) <= 0.01 * mag + 1e-6, "[%d, %d]: %g, not %g",
                          m, n, (double)ys[n * 11 + m], r);
        }
    bp_graph_free(g);
    bp_sched_reset(sch);
    g = bp_graph_new(16);
    bp_graph_build_forward(g, gv);
    bp_clear_error();
    ck_assert_int_eq(bp_sched_alloc_graph(sch, g), BP_ERR_UNSUPPORTED);
    ck_assert_error_has(BP_ERR_UNSUPPORTED, "no backend (CPU) supports");
    bp_graph_free(g);
    bp_sched_free(sch);
    bp_context_free(gctx);

    bp_buffer_free(sbuf);
    bp_buffer_free(buf);
    bp_buffer_free(wbuf);
    bp_context_free(ctx);
    bp_context_free(wctx);
    bp_backend_free(be);
}
END_TEST

/* Every F16 bit pattern converted to f32 by the CPU (a CPY node), in each variant's own way
 * (F16C, or integer SSE2 operations in the baseline), equals the runtime's scalar conversion:
 * bit for bit, NaNs as NaNs. */
START_TEST(test_every_half_converts_exactly)
{
    bp_backend *be = variant_backend(_i);
    bp_context *ctx = bp_context_new(4);
    bp_tensor *h = bp_new_tensor_1d(ctx, BP_TYPE_F16, 65536);
    bp_tensor *f = bp_cpy(ctx, h, bp_new_tensor_1d(ctx, BP_TYPE_F32, 65536));
    ck_assert_ptr_nonnull(f);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
    ck_assert_ptr_nonnull(buf);
    uint16_t *bits = malloc(65536 * sizeof(uint16_t));
    float *got = malloc(65536 * sizeof(float));
    for (int i = 0; i < 65536; i++)
        bits[i] = (uint16_t)i;
    ck_assert_int_eq(bp_tensor_set(h, bits, 0, 65536 * sizeof(uint16_t)), BP_OK);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, f);
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
    ck_assert_int_eq(bp_tensor_get(f, got, 0, 65536 * sizeof(float)), BP_OK);
    int wrong = 0, first = -1;
    for (int i = 0; i < 65536; i++) {
        const float want = bp_fp16_to_fp32((uint16_t)i);
        const bool ok = isnan(want) ? isnan(got[i]) : memcmp(&want, &got[i], 4) == 0;
        if (!ok && first < 0)
            first = i;
        wrong += !ok;
    }
    ck_assert_msg(wrong == 0, "%s: %d halves convert wrongly, the first 0x%04x",
                  bp_device_get_description(bp_backend_get_device(be)), wrong, (unsigned)first);
    bp_graph_free(g);
    free(bits);
    free(got);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    variant_done(be);
}
END_TEST

/* MUL_MAT of every weight type that the 8-bit kernels take (cpu-amx.c, cpu-gemm-int8.c), with
 * the best variant and again without AMX (where the machine has none, both runs are the same),
 * on shapes that cross every blocking edge of those kernels: K past one K block and not a
 * multiple of it, more rows than a thread's block, more columns than one column block, and small
 * odd ones. Weights from the runtime's quantiser, the reference from the runtime's dequantiser
 * in double; the activations are quantised to 8 bits, hence the tolerance. */

/* Every third column, then the last one. */
static int64_t next_column(int64_t n, int64_t N)
{
    return n + 3 < N || n == N - 1 ? n + 3 : N - 1;
}

static const enum bp_type tile_types[] = {
    BP_TYPE_Q8_0, BP_TYPE_Q4_0, BP_TYPE_Q4_1, BP_TYPE_Q5_0, BP_TYPE_Q5_1,  BP_TYPE_IQ4_NL,
    BP_TYPE_Q2_K, BP_TYPE_Q3_K, BP_TYPE_Q4_K, BP_TYPE_Q5_K, BP_TYPE_Q6_K, BP_TYPE_IQ4_XS};

START_TEST(test_int8_tiles_mul_mat)
{
    const enum bp_type type = tile_types[_i / 2];
    if (_i % 2)
        setenv("BP_CPU_AMX", "0", 1);
    bp_backend *be = variant_backend(0);
    static const int64_t shapes[][3] = {{256, 33, 16}, {768, 7, 17}, {1280, 600, 530}};
    unsigned seed = 11;
    for (size_t si = 0; si < (under_valgrind() ? 2u : sizeof(shapes) / sizeof(shapes[0])); si++) {
        const int64_t K = shapes[si][0], M = shapes[si][1], N = shapes[si][2];
        bp_context *ctx = bp_context_new(4);
        bp_tensor *a = bp_new_tensor_2d(ctx, type, K, M);
        bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, N);
        bp_tensor *c = bp_mul_mat(ctx, a, b);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        ck_assert_ptr_nonnull(buf);
        float *wf = malloc((size_t)(K * M) * sizeof(float));
        float *x = malloc((size_t)(K * N) * sizeof(float));
        float *got = malloc((size_t)(M * N) * sizeof(float));
        void *w = malloc(bp_nbytes(a));
        for (int64_t i = 0; i < K * M; i++) /* rows of different magnitude and offset */
            wf[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f * (float)(1 + (i / K) % 5) +
                    (float)((i / K) % 3) * 0.25f;
        for (int64_t i = 0; i < K * N; i++)
            x[i] = (float)(rand_r(&seed) % 2001 - 1000) / 1000.0f;
        ck_assert_uint_eq(bp_quantize_rows(type, wf, w, M, K, NULL), bp_nbytes(a));
        ck_assert_int_eq(bp_tensor_set(a, w, 0, bp_nbytes(a)), BP_OK);
        ck_assert_int_eq(bp_tensor_set(b, x, 0, bp_nbytes(b)), BP_OK);
        bp_graph *g = bp_graph_new(4);
        bp_graph_build_forward(g, c);
        ck_assert_msg(bp_backend_graph_compute(be, g) == BP_OK, "%s", bp_last_error());
        ck_assert_int_eq(bp_tensor_get(c, got, 0, bp_nbytes(c)), BP_OK);
        bp_type_get_traits(type)->to_float(w, wf, K * M); /* the weights as stored */
        double err = 0, ref2 = 0;
        /* Every row against every third column and the last (the reference is the slow part). */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n = next_column(n, N)) {
                double r = 0;
                for (int64_t k = 0; k < K; k++)
                    r += (double)wf[m * K + k] * x[n * K + k];
                err += (got[n * M + m] - r) * (got[n * M + m] - r);
                ref2 += r * r;
            }
        ck_assert_msg(err <= 2e-4 * ref2, "%s K %lld M %lld N %lld%s: NMSE %g",
                      bp_type_name(type), (long long)K, (long long)M, (long long)N,
                      _i % 2 ? " without AMX" : "", err / ref2);
        free(w);
        free(got);
        free(x);
        free(wf);
        bp_graph_free(g);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
    variant_done(be);
    unsetenv("BP_CPU_AMX");
}
END_TEST

/* Rows of every weight type converted to f32 by the CPU (GET_ROWS, which takes each variant's
 * vector conversions) equal the runtime's own converter bit for bit, on random bytes (scales
 * that are Inf or NaN included: NaN matches any NaN), in each variant. */
START_TEST(test_every_type_converts_exactly)
{
    bp_backend *be = variant_backend(_i);
    enum { K = 512, ROWS = 6 };
    unsigned seed = 5;
    for (int ti = 0; ti < BP_TYPE_COUNT; ti++) {
        const enum bp_type t = (enum bp_type)ti;
        const struct bp_type_traits *tr = bp_type_get_traits(t);
        if (t == BP_TYPE_I32 || t == BP_TYPE_F32 || tr->to_float == NULL)
            continue;
        bp_context *ctx = bp_context_new(4);
        bp_tensor *a = bp_new_tensor_2d(ctx, t, K, ROWS);
        bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, ROWS);
        bp_tensor *r = bp_get_rows(ctx, a, ids);
        ck_assert_ptr_nonnull(r);
        bp_graph *g = bp_graph_new(4);
        bp_graph_build_forward(g, r);
        const bool supported = bp_backend_supports_op(be, r);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        ck_assert_ptr_nonnull(buf);
        const size_t bytes = bp_nbytes(a);
        uint8_t *w = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            w[i] = (uint8_t)(rand_r(&seed) >> 4);
        int32_t iv[ROWS];
        for (int i = 0; i < ROWS; i++)
            iv[i] = ROWS - 1 - i;
        ck_assert_int_eq(bp_tensor_set(a, w, 0, bytes), BP_OK);
        ck_assert_int_eq(bp_tensor_set(ids, iv, 0, sizeof(iv)), BP_OK);
        if (supported) {
            ck_assert_msg(bp_backend_graph_compute(be, g) == BP_OK, "%s", bp_last_error());
            float *got = malloc((size_t)K * ROWS * sizeof(float));
            float *want = malloc((size_t)K * sizeof(float));
            ck_assert_int_eq(bp_tensor_get(r, got, 0, (size_t)K * ROWS * sizeof(float)), BP_OK);
            for (int i = 0; i < ROWS; i++) {
                tr->to_float(w + (size_t)iv[i] * a->nb[1], want, K);
                for (int k = 0; k < K; k++) {
                    const float gv = got[i * K + k];
                    ck_assert_msg(isnan(want[k]) ? isnan(gv) : memcmp(&want[k], &gv, 4) == 0,
                                  "%s on %s: row %d element %d is %a, the runtime's %a",
                                  bp_type_name(t),
                                  bp_device_get_description(bp_backend_get_device(be)), iv[i],
                                  k, (double)gv, (double)want[k]);
                }
            }
            free(got);
            free(want);
        }
        free(w);
        bp_graph_free(g);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
    variant_done(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cpu");
    TCase *halves = tcase_create("test_every_half_converts_exactly");
    tcase_add_loop_test(halves, test_every_half_converts_exactly, 0, 3);
    tcase_add_loop_test(halves, test_every_type_converts_exactly, 0, 3);
    suite_add_tcase(s, halves);
    BP_TCASE(s, test_best_variant_loads, 30);
    BP_TCASE(s, test_variant_masked_by_cpu_disable, 30);
    BP_TCASE(s, test_device, 30);
    BP_TCASE(s, test_backend_params, 30);
    BP_TCASE(s, test_backend_params_parsed_whole, 30);
    BP_TCASE(s, test_set_n_threads, 30);
    BP_TCASE(s, test_events_and_unsupported_graph, 30);
    BP_TCASE(s, test_argmax_nan_and_ties, 30);
    BP_TCASE(s, test_ids_out_of_range, 30);
    BP_TCASE(s, test_mul_mat_empty_k, 60);
    BP_TCASE(s, test_graph_allocator_and_threads_agree, 60);
    BP_TCASE(s, test_several_devices, 30);
    BP_TCASE(s, test_bad_device_count, 30);
    BP_TCASE(s, test_allreduce, 30);
    BP_TCASE(s, test_repack_buffer, 30);
    TCase *rtype = tcase_create("test_repack_type");
    tcase_add_loop_test(rtype, test_repack_type, 0, 3);
    suite_add_tcase(s, rtype);
    TCase *tc = tcase_create("test_repack_mul_mat");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_repack_mul_mat, 0,
                        N_REPACK_CONFIGS * (int)(sizeof(repack_types) / sizeof(repack_types[0])));
    tcase_add_loop_test(tc, test_repack_mul_mat_id, 0,
                        N_REPACK_CONFIGS * (int)(sizeof(repack_types) / sizeof(repack_types[0])));
    tcase_add_loop_test(tc, test_repack_superblocks, 0,
                        N_REPACK_CONFIGS * (int)(sizeof(repack_super_types) /
                                                 sizeof(repack_super_types[0])));
    suite_add_tcase(s, tc);
    TCase *tiles = tcase_create("test_int8_tiles_mul_mat");
    tcase_set_timeout(tiles, 120);
    tcase_add_loop_test(tiles, test_int8_tiles_mul_mat, 0,
                        2 * (int)(sizeof(tile_types) / sizeof(tile_types[0])));
    suite_add_tcase(s, tiles);
    return bp_test_run(s);
}
