/* test-sched.c - the scheduler over the test accelerator (the backplane-accel test plugin, built
 * from tests/plugins/plugin.c: its own non-host buffer type, async copies, events, a partial op
 * set) and the CPU: every scheduled result must equal the same graph computed on the CPU
 * alone. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "test-device.h"
#include "test-util.h"
#include "tf-model.h"

static bp_backend *accel, *cpu;

static void setup(void)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_ACCEL_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    accel = bp_backend_init_by_name("ACCEL0", NULL);
    cpu = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_plugins(accel && cpu, "backends: %s", bp_last_error());
}

static void teardown(void)
{
    bp_backend_free(accel);
    bp_backend_free(cpu);
}

static const struct tf_config tiny = {.n_layer = 2, .n_embd = 32, .n_ff = 48, .n_head = 4,
                                      .n_vocab = 50, .n_tok = 5, .wtype = BP_TYPE_F32};

/* The forward graph of cfg over model m, in a fresh context (*ctx, caller frees both). */
static bp_graph *build_graph(const struct model *m, const struct tf_config *cfg, bp_context **ctx,
                             struct tf_graph *tg)
{
    *ctx = bp_context_new(tf_graph_n_tensors(cfg));
    ck_assert(tf_build(*ctx, cfg, &m->w, tg));
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(cfg) + tf_weights_n_tensors(cfg));
    ck_assert_int_eq(bp_graph_build_forward(g, tg->logits), BP_OK);
    return g;
}

/* Logits of one forward pass through a scheduler over `backends`. */
static float *run(bp_backend *const *backends, int n, bool parallel, bp_buffer_type *wbuft,
                  const struct tf_config *cfg, int salt, int *n_splits)
{
    struct model m;
    model_init(&m, cfg, wbuft);
    bp_context *ctx;
    struct tf_graph tg;
    bp_graph *g = build_graph(&m, cfg, &ctx, &tg);
    bp_sched *s = bp_sched_new(backends, NULL, n, 4096, parallel);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    set_inputs(&tg, cfg, salt);
    ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
    if (n_splits) {
        *n_splits = bp_sched_get_n_splits(s);
        /* every split names one of our backends; together they cover at most the graph */
        int covered = 0;
        for (int i = 0; i < *n_splits; i++) {
            int nodes = -1, inputs = -1;
            bp_backend *be = bp_sched_get_split_backend(s, i, &nodes, &inputs);
            ck_assert(be == backends[0] || (n > 1 && be == backends[1]));
            ck_assert(nodes > 0 && inputs >= 0);
            covered += nodes;
        }
        ck_assert_int_le(covered, bp_graph_get_n_nodes(g));
        ck_assert_ptr_null(bp_sched_get_split_backend(s, *n_splits, NULL, NULL));
        ck_assert_int_eq(bp_last_status(), BP_ERR_OUT_OF_BOUNDS);
    }
    const size_t bytes = bp_nbytes(tg.logits);
    float *out = malloc(bytes);
    ck_assert_int_eq(bp_tensor_get(tg.logits, out, 0, bytes), BP_OK);
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    return out;
}

static void assert_close(const float *x, const float *ref, int64_t n)
{
    assert_close_nmse(x, ref, n, 1e-9);
}

#define N_LOGITS(cfg) ((int64_t)(cfg).n_vocab * (cfg).n_tok)

START_TEST(test_weights_on_accelerator)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    int splits = 0;
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, 0, NULL);
    float *got = run(both, 2, false, bp_backend_get_default_buffer_type(accel), &tiny, 0, &splits);
    assert_close(got, ref, N_LOGITS(tiny));
    ck_assert_int_gt(splits, 2); /* rope, get_rows and silu run on the CPU */
    free(ref);
    free(got);
}
END_TEST

/* Weights of every type (converted from the same floats by their type's conversion) give the
 * same logits through the accelerator and the CPU as on the CPU alone, within a bound per
 * type: the CPU multiplies quantised weights by activations it quantises to Q8_0, the test
 * accelerator by float activations. Half-precision weights are multiplied by float
 * activations on both sides, summed in another order (the CPU's vector kernels, whose width
 * depends on the machine, against the accelerator's plain loops): float rounding, an NMSE of
 * 5e-12 measured on an AVX-512 machine, far below the 1e-6 or more that rounding the
 * activations to half precision would give. */
START_TEST(test_weights_of_every_type)
{
    static const struct {
        enum bp_type type;
        double max_nmse;
    } types[] = {{BP_TYPE_F16, 1e-10}, {BP_TYPE_BF16, 1e-10}, {BP_TYPE_Q8_0, 3e-4},
                 {BP_TYPE_Q4_0, 3e-4}};
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        struct tf_config cfg = tiny;
        cfg.wtype = types[i].type;
        cfg.n_ff = 64; /* rows of quantised weights are whole blocks of 32 */
        float *ref = run(alone, 1, false, bp_host_buffer_type(), &cfg, 0, NULL);
        float *got = run(both, 2, false, bp_backend_get_default_buffer_type(accel), &cfg, 0, NULL);
        assert_close_nmse(got, ref, N_LOGITS(cfg), types[i].max_nmse);
        free(ref);
        free(got);
    }
}
END_TEST

/* With no buffer types given, the CPU computes in the accelerator's host buffer type (pinned
 * memory on a GPU); one given explicitly is kept; results are the same either way. */
START_TEST(test_cpu_computes_in_host_buffer)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    bp_sched *s = bp_sched_new(both, NULL, 2, 64, false);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_buffer_type_get_name(bp_sched_get_buffer_type(s, cpu)), "TestAccel_Host");
    ck_assert_ptr_eq(bp_sched_get_buffer_type(s, accel), bp_backend_get_default_buffer_type(accel));
    ck_assert_ptr_eq(bp_sched_get_buffer_type(s, cpu),
                     bp_device_get_host_buffer_type(bp_backend_get_device(accel)));
    bp_sched_free(s);

    bp_buffer_type *explicit_bufts[2] = {NULL, bp_backend_get_default_buffer_type(cpu)};
    s = bp_sched_new(both, explicit_bufts, 2, 64, false);
    ck_assert_ptr_eq(bp_sched_get_buffer_type(s, cpu), bp_backend_get_default_buffer_type(cpu));
    bp_sched_free(s);

    s = bp_sched_new(alone, NULL, 1, 64, false);
    ck_assert_ptr_eq(bp_sched_get_buffer_type(s, cpu), bp_backend_get_default_buffer_type(cpu));
    ck_assert_ptr_null(bp_sched_get_buffer_type(s, accel));
    ck_assert_int_eq(bp_last_status(), BP_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "ACCEL0"));
    bp_sched_free(s);
    ck_assert_ptr_null(bp_sched_get_buffer_type(NULL, cpu));
    ck_assert_int_eq(bp_last_status(), BP_ERR_INVALID_ARG);

    /* The whole model through the host buffer type, in both directions of copies. */
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, 2, NULL);
    float *got = run(both, 2, true, bp_backend_get_default_buffer_type(accel), &tiny, 2, NULL);
    assert_close(got, ref, N_LOGITS(tiny));
    free(got);

    /* Pinned memory that cannot be had: the CPU goes back to its default buffer type and the
     * results are the same. */
    int (*fail_host_buffers)(int) = (int (*)(int))bp_registry_get_proc_address(
        bp_device_get_registry(bp_backend_get_device(accel)), "test_device_fail_host_buffers");
    ck_assert_ptr_nonnull(fail_host_buffers);
    fail_host_buffers(1000);
    got = run(both, 2, true, bp_backend_get_default_buffer_type(accel), &tiny, 2, NULL);
    ck_assert_int_lt(fail_host_buffers(0), 1000); /* pinning was tried, and given up */
    assert_close(got, ref, N_LOGITS(tiny));
    free(ref);
    free(got);
}
END_TEST

/* A device whose own compute buffer cannot be had (its buffers hold at most 300 bytes, the
 * graph needs two 256-byte results at once there): the error names that buffer, its type and
 * size, and the CPU keeps computing in the pinned host memory, which was not at fault. */
START_TEST(test_device_buffer_oom_keeps_pinned)
{
    test_device_set_host_buffer(true);
    bp_registry *reg = test_device_registry_new(300);
    test_device_set_host_buffer(false);
    bp_backend *small = bp_device_init_backend(bp_registry_get_device(reg, 0), NULL);
    ck_assert_msg(small != NULL, "%s", bp_last_error());
    bp_backend *both[2] = {small, cpu};
    bp_sched *s = bp_sched_new(both, NULL, 2, 64, false);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_buffer_type_get_name(bp_sched_get_buffer_type(s, cpu)), "TestAccel_Host");

    bp_context *wx = bp_context_new(1), *wy = bp_context_new(1), *ctx = bp_context_new(8);
    bp_tensor *x = bp_new_tensor_1d(wx, BP_TYPE_F32, 64);
    bp_tensor *y = bp_new_tensor_1d(wy, BP_TYPE_F32, 64);
    bp_buffer *bx = bp_alloc_ctx_tensors(wx, bp_backend_get_default_buffer_type(small));
    bp_buffer *by = bp_alloc_ctx_tensors(wy, bp_backend_get_default_buffer_type(small));
    ck_assert(bx != NULL && by != NULL);
    bp_tensor *z = bp_add(ctx, x, y);
    bp_tensor *out = bp_add(ctx, bp_mul(ctx, z, x), z); /* z lives while mul's result is made */
    bp_graph *g = bp_graph_new(16);
    ck_assert_int_eq(bp_graph_build_forward(g, out), BP_OK);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_ERR_OUT_OF_MEMORY);
    ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "compute buffer of backend ACCEL0 (buffer type "
                        "TestAccel, 512 bytes)");
    ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "its largest buffer is 300 bytes");
    ck_assert_str_eq(bp_buffer_type_get_name(bp_sched_get_buffer_type(s, cpu)), "TestAccel_Host");

    bp_graph_free(g);
    bp_sched_free(s);
    bp_buffer_free(bx);
    bp_buffer_free(by);
    bp_context_free(ctx);
    bp_context_free(wx);
    bp_context_free(wy);
    bp_backend_free(small);
    bp_registry_free(reg);
}
END_TEST

START_TEST(test_weights_on_cpu)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, 1, NULL);
    float *got = run(both, 2, false, bp_host_buffer_type(), &tiny, 1, NULL);
    assert_close(got, ref, N_LOGITS(tiny));
    free(ref);
    free(got);
}
END_TEST

START_TEST(test_parallel_evaluations)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    struct model m;
    model_init(&m, &tiny, bp_backend_get_default_buffer_type(accel));
    bp_sched *s = bp_sched_new(both, NULL, 2, 4096, true);
    ck_assert_int_eq(bp_sched_get_n_copies(s), BP_SCHED_MAX_COPIES);
    for (int round = 0; round < 6; round++) { /* more rounds than copies: they rotate */
        bp_context *ctx;
        struct tf_graph tg;
        bp_graph *g = build_graph(&m, &tiny, &ctx, &tg);
        ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
        set_inputs(&tg, &tiny, round);
        ck_assert_int_eq(bp_sched_graph_compute_async(s, g), BP_OK);
        ck_assert_int_eq(bp_sched_synchronize(s), BP_OK);
        float got[50 * 5];
        bp_tensor_get(tg.logits, got, 0, sizeof(got));
        float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, round, NULL);
        assert_close(got, ref, N_LOGITS(tiny));
        free(ref);
        bp_graph_free(g);
        bp_context_free(ctx);
    }
    bp_sched_free(s);
    model_free(&m);
}
END_TEST

START_TEST(test_pins_and_queries)
{
    bp_backend *both[2] = {accel, cpu};
    struct model m;
    model_init(&m, &tiny, bp_backend_get_default_buffer_type(accel));
    bp_context *ctx;
    struct tf_graph tg;
    bp_graph *g = build_graph(&m, &tiny, &ctx, &tg);
    bp_sched *s = bp_sched_new(both, NULL, 2, 4096, false);

    /* First node after get_rows is the rms_norm the accelerator could run. */
    bp_tensor *norm = NULL, *rope = NULL, *mm = NULL;
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        bp_tensor *t = bp_graph_get_node(g, i);
        if (!norm && t->op == BP_OP_RMS_NORM)
            norm = t;
        if (!rope && t->op == BP_OP_ROPE)
            rope = t;
        if (!mm && t->op == BP_OP_MUL_MAT)
            mm = t;
    }
    ck_assert_int_eq(bp_sched_set_tensor_backend(s, norm, cpu), BP_OK);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, norm), cpu);
    ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, rope), cpu);  /* accelerator cannot */
    ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, mm), accel);  /* its weights are there */
    ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, tg.tokens), cpu); /* graph input */
    ck_assert_uint_gt(bp_sched_get_buffer_size(s, accel), 0);
    ck_assert_uint_gt(bp_sched_get_buffer_size(s, cpu), 0);
    ck_assert_int_eq(bp_sched_get_n_backends(s), 2);
    ck_assert_ptr_eq(bp_sched_get_backend(s, 1), cpu);
    set_inputs(&tg, &tiny, 2);
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
    float got[50 * 5];
    bp_tensor_get(tg.logits, got, 0, sizeof(got));
    bp_backend *alone[1] = {cpu};
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, 2, NULL);
    assert_close(got, ref, N_LOGITS(tiny));
    free(ref);
    /* Sources are the user's again after compute (copies were only swapped in meanwhile). */
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++)
        for (int k = 0; k < BP_MAX_SRC; k++) {
            const bp_tensor *src = bp_graph_get_node(g, i)->src[k];
            ck_assert(src == NULL || strchr(src->name, '#') == NULL);
        }

    ck_assert_int_eq(bp_sched_set_tensor_backend(s, norm, NULL), BP_ERR_INVALID_ARG);
    bp_backend *stranger = bp_backend_init_by_name("CPU", "threads=1");
    ck_assert_int_eq(bp_sched_set_tensor_backend(s, norm, stranger), BP_ERR_INVALID_ARG);
    bp_backend_free(stranger);
    bp_sched_reset(s);
    ck_assert_ptr_null(bp_sched_get_tensor_backend(s, norm));

    FILE *f = tmpfile();
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    ck_assert_int_eq(bp_sched_dump_dot(s, g, f), BP_OK);
    rewind(f);
    char buf[65536];
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    buf[len] = '\0';
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "digraph backplane"));
    ck_assert_ptr_nonnull(strstr(buf, "cluster_1"));
    ck_assert_ptr_nonnull(strstr(buf, "ACCEL0"));
    ck_assert_ptr_nonnull(strstr(buf, "copy of"));
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK); /* computes the allocated graph */

    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
}
END_TEST

struct observer {
    int asked;
    int stop_at;
    int seen;
};

static bool observe(bp_tensor *t, bool ask, void *user)
{
    struct observer *o = user;
    (void)t;
    if (ask) {
        o->asked++;
        return o->asked % 3 == 0; /* look at every third node */
    }
    return ++o->seen < o->stop_at;
}

START_TEST(test_eval_callback_stops_early)
{
    bp_backend *both[2] = {accel, cpu};
    struct model m;
    model_init(&m, &tiny, bp_backend_get_default_buffer_type(accel));
    bp_context *ctx;
    struct tf_graph tg;
    bp_graph *g = build_graph(&m, &tiny, &ctx, &tg);
    bp_sched *s = bp_sched_new(both, NULL, 2, 4096, false);
    struct observer o = {0, 4, 0};
    bp_sched_set_eval_callback(s, observe, &o);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    set_inputs(&tg, &tiny, 3);
    ck_assert_int_eq(bp_tensor_memset(tg.logits, 0x7f, 0, bp_nbytes(tg.logits)), BP_OK);
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
    ck_assert_int_eq(o.seen, 4);
    ck_assert_int_eq(o.asked, 12); /* stopped at the fourth observed node */
    uint32_t word;
    bp_tensor_get(tg.logits, &word, 0, 4);
    ck_assert_uint_eq(word, 0x7f7f7f7fu); /* the logits were never computed */

    /* Observing everything without stopping gives the full result. */
    struct observer all = {0, 1 << 30, 0};
    bp_sched_set_eval_callback(s, observe, &all);
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
    ck_assert_int_eq(all.asked, bp_graph_get_n_nodes(g));
    float got[50 * 5];
    bp_tensor_get(tg.logits, got, 0, sizeof(got));
    bp_backend *alone[1] = {cpu};
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, 3, NULL);
    assert_close(got, ref, N_LOGITS(tiny));
    free(ref);
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
}
END_TEST

START_TEST(test_graph_larger_than_reserved)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    struct tf_config small = tiny, big = tiny;
    small.n_tok = 2;
    big.n_tok = 9;
    struct model m;
    model_init(&m, &tiny, bp_backend_get_default_buffer_type(accel));
    bp_sched *s = bp_sched_new(both, NULL, 2, 4096, false);
    for (int pass = 0; pass < 2; pass++) {
        const struct tf_config *cfg = pass ? &big : &small;
        bp_context *ctx;
        struct tf_graph tg;
        bp_graph *g = build_graph(&m, cfg, &ctx, &tg);
        if (pass == 0) {
            ck_assert_int_eq(bp_sched_reserve(s, g), BP_OK);
        } else {
            size_t before = bp_sched_get_buffer_size(s, cpu);
            ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
            ck_assert_uint_gt(bp_sched_get_buffer_size(s, cpu), before);
            set_inputs(&tg, cfg, 4);
            ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
            float *got = malloc(bp_nbytes(tg.logits));
            bp_tensor_get(tg.logits, got, 0, bp_nbytes(tg.logits));
            float *ref = run(alone, 1, false, bp_host_buffer_type(), cfg, 4, NULL);
            assert_close(got, ref, N_LOGITS(big));
            free(got);
            free(ref);
        }
        bp_graph_free(g);
        bp_context_free(ctx);
    }
    bp_sched_free(s);
    model_free(&m);
}
END_TEST

/* 40 CPU-only results feed one run of accelerator adds: more inputs than one split may hold. */
static float *many_inputs(bp_backend *const *backends, int n, int *n_splits)
{
    enum { K = 40 };
    bp_context *ctx = bp_context_new(4 * K + 8);
    bp_tensor *x[K], *acc = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_set_input(acc);
    bp_graph *g = bp_graph_new(4 * K + 8);
    for (int i = 0; i < K; i++) {
        bp_tensor *l = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
        bp_set_input(l);
        x[i] = bp_silu(ctx, l); /* the accelerator cannot run silu */
        bp_graph_build_forward(g, x[i]);
    }
    bp_sched *s = bp_sched_new(backends, NULL, n, 1024, false);
    bp_tensor *t = acc;
    for (int i = 0; i < K; i++) {
        t = bp_add(ctx, t, x[i]);
        if (n > 1)
            bp_sched_set_tensor_backend(s, t, backends[0]);
    }
    bp_graph_build_forward(g, t);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    float v[16];
    for (int j = 0; j < 16; j++)
        v[j] = (float)j / 16.0f;
    bp_tensor_set(acc, v, 0, sizeof(v));
    for (size_t i = 0; i < bp_context_get_n_tensors(ctx); i++) {
        bp_tensor *l = bp_context_get_tensor(ctx, i);
        if (l->op == BP_OP_NONE && l != acc) {
            for (int j = 0; j < 16; j++)
                v[j] = (float)((i * 5 + (size_t)j) % 9) / 4.0f - 1.0f;
            bp_tensor_set(l, v, 0, sizeof(v));
        }
    }
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
    *n_splits = bp_sched_get_n_splits(s);
    float *out = malloc(sizeof(v));
    bp_tensor_get(t, out, 0, sizeof(v));
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    return out;
}

/* Computing the same graph again and again keeps one split per backend run, and the same
 * answer, on one backend and on two. */
START_TEST(test_repeated_compute_same_graph)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    bp_backend *const *sets[2] = {alone, both};
    float first[50 * 5];
    for (int k = 0; k < 2; k++) {
        struct model m;
        model_init(&m, &tiny, bp_host_buffer_type());
        bp_context *ctx;
        struct tf_graph tg;
        bp_graph *g = build_graph(&m, &tiny, &ctx, &tg);
        bp_sched *s = bp_sched_new(sets[k], NULL, k + 1, 4096, false);
        int splits = -1;
        for (int round = 0; round < 3; round++) {
            ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
            set_inputs(&tg, &tiny, 5);
            ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
            if (round == 0)
                splits = bp_sched_get_n_splits(s);
            ck_assert_int_eq(bp_sched_get_n_splits(s), splits);
            float got[50 * 5];
            bp_tensor_get(tg.logits, got, 0, sizeof(got));
            if (k == 0 && round == 0)
                memcpy(first, got, sizeof(got));
            else
                assert_close(got, first, N_LOGITS(tiny));
        }
        if (k == 0)
            ck_assert_int_eq(splits, 1);
        bp_sched_free(s);
        bp_graph_free(g);
        bp_context_free(ctx);
        model_free(&m);
    }
}
END_TEST

/* Two products pinned to the accelerator are listed first, then two ROPEs (which it refuses) on
 * the CPU, each reading a reshape of one product. A view never starts a split, so the second
 * reshape (placed with its product, on the accelerator) is listed inside the CPU's split: the
 * CPU must not be handed it (its memory is the accelerator's; the backend refuses such graphs),
 * and the result must equal the CPU's alone. */
static void foreign_view_run(bp_backend *const *backends, int n, float *out)
{
    bp_context *ctx = bp_context_new(32);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 16, 6);
    bp_tensor *pos = bp_new_tensor_1d(ctx, BP_TYPE_I32, 6);
    bp_set_input(x);
    bp_set_input(pos);
    bp_tensor *a = bp_mul(ctx, x, x), *b = bp_scale(ctx, x, 3.0f);
    bp_tensor *qa = bp_rope(ctx, bp_reshape_3d(ctx, a, 4, 4, 6), pos, 4, BP_ROPE_NEOX, 1e4f, 1.0f);
    bp_tensor *qb = bp_rope(ctx, bp_reshape_3d(ctx, b, 4, 4, 6), pos, 4, BP_ROPE_NEOX, 1e4f, 1.0f);
    bp_tensor *y = bp_add(ctx, qa, qb);
    ck_assert_ptr_nonnull(y);
    bp_set_output(y);
    bp_graph *g = bp_graph_new(32);
    ck_assert_int_eq(bp_graph_build_forward(g, a), BP_OK); /* the products first */
    ck_assert_int_eq(bp_graph_build_forward(g, b), BP_OK);
    ck_assert_int_eq(bp_graph_build_forward(g, y), BP_OK);
    bp_sched *s = bp_sched_new(backends, NULL, n, 64, false);
    ck_assert_ptr_nonnull(s);
    if (n > 1) {
        ck_assert_int_eq(bp_sched_set_tensor_backend(s, a, backends[0]), BP_OK);
        ck_assert_int_eq(bp_sched_set_tensor_backend(s, b, backends[0]), BP_OK);
    }
    ck_assert_msg(bp_sched_alloc_graph(s, g) == BP_OK, "%s", bp_last_error());
    float xv[16 * 6];
    int32_t pv[6];
    for (int i = 0; i < 16 * 6; i++)
        xv[i] = (float)(i % 11) * 0.25f - 1.0f;
    for (int i = 0; i < 6; i++)
        pv[i] = 3 * i;
    ck_assert_int_eq(bp_tensor_set(x, xv, 0, sizeof(xv)), BP_OK);
    ck_assert_int_eq(bp_tensor_set(pos, pv, 0, sizeof(pv)), BP_OK);
    ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
    if (n > 1)
        ck_assert_int_ge(bp_sched_get_n_splits(s), 2);
    ck_assert_int_eq(bp_tensor_get(y, out, 0, 16 * 6 * sizeof(float)), BP_OK);
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
}

START_TEST(test_foreign_view_inside_a_split)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    float got[16 * 6], ref[16 * 6];
    foreign_view_run(alone, 1, ref);
    foreign_view_run(both, 2, got);
    assert_close(got, ref, 16 * 6);
}
END_TEST

/* A graph computed again unchanged, with new input values and without bp_sched_alloc_graph,
 * reuses its split and allocation (the accelerator's input copies included): every result must
 * equal the same inputs computed on the CPU alone. */
START_TEST(test_recompute_unchanged_graph)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    float *ref[3];
    for (int salt = 0; salt < 3; salt++)
        ref[salt] = run(alone, 1, false, bp_host_buffer_type(), &tiny, salt + 7, NULL);
    struct model m;
    model_init(&m, &tiny, bp_host_buffer_type());
    bp_context *ctx;
    struct tf_graph tg;
    bp_graph *g = build_graph(&m, &tiny, &ctx, &tg);
    bp_sched *s = bp_sched_new(both, NULL, 2, 4096, false);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    const int splits = bp_sched_get_n_splits(s);
    ck_assert_int_gt(splits, 1);
    for (int round = 0; round < 6; round++) {
        set_inputs(&tg, &tiny, round % 3 + 7);
        ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
        ck_assert_int_eq(bp_sched_get_n_splits(s), splits);
        float got[50 * 5];
        ck_assert_int_eq(bp_tensor_get(tg.logits, got, 0, sizeof(got)), BP_OK);
        assert_close(got, ref[round % 3], N_LOGITS(tiny));
    }

    /* Marking an intermediate node as an output changes the graph: its memory must no longer be
     * handed on to later nodes. Allocated again (inputs are set after that), the node holds its
     * value afterwards: the same node of a fresh graph on the CPU alone. */
    const int mid = bp_graph_get_n_nodes(g) / 2;
    bp_tensor *t = bp_graph_get_node(g, mid);
    bp_set_output(t);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    set_inputs(&tg, &tiny, 7);
    ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
    const size_t tb = bp_nbytes(t);
    float *tv = malloc(tb), *tr = malloc(tb);
    ck_assert_int_eq(bp_tensor_get(t, tv, 0, tb), BP_OK);
    bp_context *ctx2;
    struct tf_graph tg2;
    bp_graph *g2 = build_graph(&m, &tiny, &ctx2, &tg2);
    bp_tensor *t2 = bp_graph_get_node(g2, mid);
    ck_assert_int_eq(t2->op, t->op);
    bp_set_output(t2);
    bp_sched *s2 = bp_sched_new(alone, NULL, 1, 4096, false);
    ck_assert_int_eq(bp_sched_alloc_graph(s2, g2), BP_OK);
    set_inputs(&tg2, &tiny, 7);
    ck_assert_int_eq(bp_sched_graph_compute(s2, g2), BP_OK);
    ck_assert_int_eq(bp_tensor_get(t2, tr, 0, tb), BP_OK);
    assert_close(tv, tr, (int64_t)(tb / sizeof(float)));
    free(tv);
    free(tr);
    bp_sched_free(s2);
    bp_graph_free(g2);
    bp_context_free(ctx2);

    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    for (int i = 0; i < 3; i++)
        free(ref[i]);
}
END_TEST

/* A node computed once lives in memory the scheduler placed; pinning it to another backend
 * afterwards (or splitting anew) must place it again, not treat that memory as the caller's. */
START_TEST(test_pin_after_compute)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &tiny, 9, NULL);
    struct model m;
    model_init(&m, &tiny, bp_host_buffer_type());
    bp_context *ctx;
    struct tf_graph tg;
    bp_graph *g = build_graph(&m, &tiny, &ctx, &tg);
    bp_sched *s = bp_sched_new(both, NULL, 2, 4096, false);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    set_inputs(&tg, &tiny, 9);
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);
    /* Every node the accelerator ran, pinned to the CPU now; then back to no pins. */
    for (int round = 0; round < 2; round++) {
        if (round == 0) {
            int pinned = 0;
            for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
                bp_tensor *t = bp_graph_get_node(g, i);
                if (bp_sched_get_tensor_backend(s, t) == accel && t->op == BP_OP_MUL_MAT) {
                    ck_assert_int_eq(bp_sched_set_tensor_backend(s, t, cpu), BP_OK);
                    pinned++;
                }
            }
            ck_assert_int_gt(pinned, 0);
        } else {
            bp_sched_reset(s);
        }
        ck_assert_msg(bp_sched_alloc_graph(s, g) == BP_OK, "round %d: %s", round, bp_last_error());
        set_inputs(&tg, &tiny, 9);
        ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
        float got[50 * 5];
        ck_assert_int_eq(bp_tensor_get(tg.logits, got, 0, sizeof(got)), BP_OK);
        assert_close(got, ref, N_LOGITS(tiny));
    }
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    free(ref);
}
END_TEST

/* A mixture-of-experts layer with its weights in host memory: the router (MUL_MAT, TOP_K) runs on
 * the CPU, MUL_MAT_ID on the accelerator (it asks for it), and the scheduler copies only the
 * experts the router chose, in runs with up to 512 bytes of padding after each; turned off, the
 * whole stacked tensor. Results equal the CPU alone's either way. */
struct moe_case {
    bp_context *wctx, *ctx;
    bp_buffer *wbuf;
    bp_tensor *router, *exps, *x, *ids, *y;
    bp_graph *g;
};

enum { MOE_K = 64, MOE_M = 24, MOE_E = 8, MOE_U = 2, MOE_T = 2 };

/* c's graph made (again, after a source of its nodes changed). */
static void moe_rebuild(struct moe_case *c)
{
    bp_graph_free(c->g);
    c->g = bp_graph_new(32);
    ck_assert_int_eq(bp_graph_build_forward(c->g, c->y), BP_OK);
    ck_assert_int_eq(bp_graph_build_forward(c->g, c->ids), BP_OK);
}

/* The case with experts of type t in buffers of type bt (the router stays F32). */
static void moe_case_new_in(struct moe_case *c, enum bp_type t, bp_buffer_type *bt)
{
    c->wctx = bp_context_new(4);
    c->router = bp_new_tensor_2d(c->wctx, BP_TYPE_F32, MOE_K, MOE_E);
    c->exps = bp_new_tensor_3d(c->wctx, t, MOE_K, MOE_M, MOE_E);
    c->wbuf = bp_alloc_ctx_tensors(c->wctx, bt);
    ck_assert_ptr_nonnull(c->wbuf);
    bp_buffer_set_usage(c->wbuf, BP_BUFFER_USAGE_WEIGHTS);
    float *v = malloc((size_t)bp_nelements(c->exps) * sizeof(float));
    for (int64_t i = 0; i < bp_nelements(c->exps); i++)
        v[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    void *q = malloc(bp_nbytes(c->exps));
    bp_type_get_traits(t)->from_float(v, q, bp_nelements(c->exps));
    ck_assert_int_eq(bp_tensor_set(c->exps, q, 0, bp_nbytes(c->exps)), BP_OK);
    free(q);
    for (int64_t i = 0; i < bp_nelements(c->router); i++)
        v[i] = (float)((i * 53) % 97) / 48.0f - 1.0f;
    ck_assert_int_eq(bp_tensor_set(c->router, v, 0, bp_nbytes(c->router)), BP_OK);
    free(v);
    c->ctx = bp_context_new(16);
    c->x = bp_new_tensor_2d(c->ctx, BP_TYPE_F32, MOE_K, MOE_T);
    bp_set_input(c->x);
    bp_tensor *logits = bp_mul_mat(c->ctx, c->router, c->x);       /* [E, T] */
    c->ids = bp_top_k(c->ctx, logits, MOE_U);                       /* [U, T] */
    bp_tensor *x3 = bp_reshape_3d(c->ctx, c->x, MOE_K, 1, MOE_T);
    c->y = bp_mul_mat_id(c->ctx, c->exps, x3, c->ids);             /* [M, U, T] */
    c->y = bp_scale(c->ctx, c->y, 0.5f);
    bp_set_output(c->y);
    bp_set_output(c->ids);
    c->g = NULL;
    moe_rebuild(c);
}

static void moe_case_new(struct moe_case *c)
{
    moe_case_new_in(c, BP_TYPE_F32, bp_host_buffer_type());
}

static void moe_case_free(struct moe_case *c)
{
    bp_graph_free(c->g);
    bp_context_free(c->ctx);
    bp_buffer_free(c->wbuf);
    bp_context_free(c->wctx);
}

/* Computes the case through s with inputs from salt; y and ids out. */
static void moe_compute(struct moe_case *c, bp_sched *s, int salt, float *y, int32_t *ids)
{
    ck_assert_int_eq(bp_sched_alloc_graph(s, c->g), BP_OK);
    float xv[MOE_K * MOE_T];
    for (int i = 0; i < MOE_K * MOE_T; i++)
        xv[i] = (float)(((i + 1) * (salt + 3)) % 29) / 14.0f - 1.0f;
    ck_assert_int_eq(bp_tensor_set(c->x, xv, 0, sizeof(xv)), BP_OK);
    ck_assert_msg(bp_sched_graph_compute(s, c->g) == BP_OK, "%s", bp_last_error());
    ck_assert_int_eq(bp_tensor_get(c->y, y, 0, bp_nbytes(c->y)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(c->ids, ids, 0, bp_nbytes(c->ids)), BP_OK);
}

/* The same case through s1 (the reference; ref_case) and s2 (c), inputs from salt: the ids
 * agree and the results are within nmse of the reference's. ids receives the ids. */
static void moe_compare(struct moe_case *ref_case, bp_sched *s1, struct moe_case *c, bp_sched *s2,
                        int salt, double nmse, int32_t ids[MOE_U * MOE_T])
{
    float ref[MOE_M * MOE_U * MOE_T], got[MOE_M * MOE_U * MOE_T];
    int32_t ids2[MOE_U * MOE_T];
    moe_compute(ref_case, s1, salt, ref, ids);
    moe_compute(c, s2, salt, got, ids2);
    ck_assert_mem_eq(ids2, ids, sizeof(ids2));
    assert_close_nmse(got, ref, MOE_M * MOE_U * MOE_T, nmse);
}

START_TEST(test_used_experts_copied)
{
    struct moe_case c1, c; /* the same case twice: a graph belongs to one scheduler */
    moe_case_new(&c1);
    moe_case_new(&c);
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    bp_sched *s1 = bp_sched_new(alone, NULL, 1, 64, false);
    bp_sched *s2 = bp_sched_new(both, NULL, 2, 64, false);
    ck_assert_ptr_nonnull(s1);
    ck_assert_ptr_nonnull(s2);
    const size_t stride = (size_t)MOE_K * MOE_M * sizeof(float), whole = stride * MOE_E;
    for (int salt = 0; salt < 6; salt++) {
        int32_t ids[MOE_U * MOE_T];
        const bool used_only = salt % 2 == 0;
        ck_assert_int_eq(bp_sched_set_used_experts(s2, used_only), BP_OK);
        moe_compare(&c1, s1, &c, s2, salt, 1e-12, ids);
        size_t eb = 1, ew = 1;
        ck_assert_uint_eq(bp_sched_get_copied_bytes(s1, &eb, &ew), 0); /* one backend: none */
        ck_assert_uint_eq(eb, 0);
        ck_assert_ptr_eq(bp_sched_get_tensor_backend(s2, c.y->src[0]), accel);
        /* What the used experts take: runs of consecutive ones, 512 bytes after each run
         * unless it ends with the last expert. */
        bool used[MOE_E] = {false};
        for (int i = 0; i < MOE_U * MOE_T; i++)
            used[ids[i]] = true;
        size_t want = 0;
        for (int e = 0; e < MOE_E; e++)
            if (used[e])
                want += stride + ((e + 1 < MOE_E && !used[e + 1]) ? 512 : 0);
        const size_t total = bp_sched_get_copied_bytes(s2, &eb, &ew);
        ck_assert_uint_eq(ew, whole);
        ck_assert_uint_eq(eb, used_only ? want : whole);
        ck_assert_uint_lt(want, whole);
        ck_assert_uint_ge(total, eb + (size_t)MOE_K * MOE_T * sizeof(float)); /* and x, ids */
    }
    ck_assert_int_eq(bp_sched_set_used_experts(NULL, true), BP_ERR_INVALID_ARG);
    bp_sched_free(s1);
    bp_sched_free(s2);
    moe_case_free(&c);
    moe_case_free(&c1);
}
END_TEST

/* Q8_0 experts in the CPU's CPU_REPACK buffer (stored repacked, read in whole blocks), MUL_MAT_ID
 * on the accelerator: the used experts, padding in whole rows, come over unpacked, and the
 * results equal the CPU alone's. */
START_TEST(test_used_experts_from_repacked)
{
    bp_device *dev = bp_backend_get_device(cpu);
    bp_cpu_repack_buffer_type_fn get = (bp_cpu_repack_buffer_type_fn)bp_registry_get_proc_address(
        bp_device_get_registry(dev), "bp_cpu_repack_buffer_type");
    ck_assert_ptr_nonnull(get);
    struct moe_case c1, c;
    moe_case_new_in(&c1, BP_TYPE_Q8_0, get(dev));
    moe_case_new_in(&c, BP_TYPE_Q8_0, get(dev));
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    bp_sched *s1 = bp_sched_new(alone, NULL, 1, 64, false), *s2 = bp_sched_new(both, NULL, 2, 64,
                                                                                 false);
    for (int salt = 0; salt < 3; salt++) {
        int32_t ids[MOE_U * MOE_T];
        /* the CPU quantises the activations to Q8_0, the accelerator's reference does not */
        moe_compare(&c1, s1, &c, s2, salt, 2e-4, ids);
        ck_assert_ptr_eq(bp_sched_get_tensor_backend(s2, c.y->src[0]), accel);
        size_t eb = 0, ew = 0;
        bp_sched_get_copied_bytes(s2, &eb, &ew);
        ck_assert_uint_gt(eb, 0);
        ck_assert_uint_lt(eb, ew);
    }
    bp_sched_free(s1);
    bp_sched_free(s2);
    moe_case_free(&c);
    moe_case_free(&c1);
}
END_TEST

/* An expert cache of three slots on the accelerator: a compute whose experts it holds copies them
 * within the device (hits), others from the host (misses, then cached); results equal the CPU
 * alone's every time. */
START_TEST(test_expert_cache)
{
    struct moe_case c1, c;
    moe_case_new(&c1);
    moe_case_new(&c);
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    bp_sched *s1 = bp_sched_new(alone, NULL, 1, 64, false);
    bp_sched *s2 = bp_sched_new(both, NULL, 2, 64, false);
    ck_assert_int_eq(bp_sched_set_expert_cache(s2, 3), BP_OK);
    ck_assert_int_eq(bp_sched_set_expert_cache(s2, -1), BP_ERR_INVALID_ARG);
    const size_t stride = (size_t)MOE_K * MOE_M * sizeof(float);
    uint64_t total_hits = 0;
    static const int salts[] = {0, 0, 1, 1, 0, 2, 2, 1};
    for (size_t r = 0; r < sizeof(salts) / sizeof(salts[0]); r++) {
        int32_t ids[MOE_U * MOE_T];
        moe_compare(&c1, s1, &c, s2, salts[r], 1e-12, ids);
        bool used[MOE_E] = {false};
        int n_used = 0;
        for (int i = 0; i < MOE_U * MOE_T; i++)
            if (!used[ids[i]])
                used[ids[i]] = true, n_used++;
        struct bp_sched_expert_stats st;
        ck_assert_int_eq(bp_sched_get_expert_stats(s2, &st), BP_OK);
        ck_assert_uint_eq(st.hits + st.misses, (uint64_t)n_used);
        ck_assert_uint_eq(st.bytes_from_cache, st.hits * stride);
        ck_assert_uint_ge(st.bytes_from_source, st.misses * stride);
        ck_assert_uint_le(st.bytes_from_source, st.misses * stride + (size_t)n_used * 1024);
        if (r > 0 && salts[r] == salts[r - 1] && n_used <= 3)
            ck_assert_uint_eq(st.hits, (uint64_t)n_used); /* the same experts again: all held */
        total_hits += st.hits;
    }
    ck_assert_uint_gt(total_hits, 0);
    ck_assert_int_eq(bp_sched_set_expert_cache(s2, 0), BP_OK); /* off: every expert a miss */
    float got[MOE_M * MOE_U * MOE_T];
    int32_t ids[MOE_U * MOE_T];
    moe_compute(&c, s2, 0, got, ids);
    struct bp_sched_expert_stats st;
    ck_assert_int_eq(bp_sched_get_expert_stats(s2, &st), BP_OK);
    ck_assert_uint_eq(st.hits, 0);
    ck_assert_uint_gt(st.misses, 0);
    ck_assert_int_eq(bp_sched_get_expert_stats(NULL, &st), BP_ERR_INVALID_ARG);
    bp_sched_free(s1);
    bp_sched_free(s2);
    moe_case_free(&c);
    moe_case_free(&c1);
}
END_TEST

/* Experts that stay in a file (bp_buffer_from_file): the CPU computes MUL_MAT_ID with only the
 * used experts read from the file each compute; the same results as from memory. When the file
 * shrinks the compute fails with a sentence, nothing crashes, and the buffer refuses writes. */
START_TEST(test_experts_from_a_file)
{
    struct moe_case c1, c;
    moe_case_new(&c1);
    moe_case_new(&c);
    const size_t bytes = bp_nbytes(c.exps);
    float *ev = malloc(bytes);
    ck_assert_int_eq(bp_tensor_get(c.exps, ev, 0, bytes), BP_OK);
    char path[] = "/tmp/bp-test-experts-XXXXXX";
    const int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char pad[100] = {0}; /* the experts from byte 100 on */
    ck_assert_int_eq(write(fd, pad, sizeof(pad)), (ssize_t)sizeof(pad));
    ck_assert_int_eq(write(fd, ev, bytes), (ssize_t)bytes);
    close(fd);
    /* A stacked tensor of the file, described in a context of its own, placed in the buffer. */
    bp_context *fctx = bp_context_new(1);
    bp_tensor *fexps = bp_new_tensor_3d(fctx, BP_TYPE_F32, MOE_K, MOE_M, MOE_E);
    bp_buffer *fbuf = bp_buffer_from_file(path, sizeof(pad), bytes);
    ck_assert_msg(fbuf != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_buffer_type_get_name(bp_buffer_get_type(fbuf)), "File");
    ck_assert(!bp_buffer_is_host(fbuf));
    ck_assert_int_eq(bp_buffer_place_tensor(fbuf, fexps, bp_buffer_get_base(fbuf)), BP_OK);
    bp_buffer_set_usage(fbuf, BP_BUFFER_USAGE_WEIGHTS);
    ck_assert_int_eq(bp_tensor_set(fexps, ev, 0, 4), BP_ERR_UNSUPPORTED);
    ck_assert_error_has(BP_ERR_UNSUPPORTED, "read-only");
    c.y->src[0]->src[0] = fexps; /* the product (under the SCALE) reads the file's experts */
    moe_rebuild(&c);
    bp_backend *alone[1] = {cpu};
    bp_sched *s1 = bp_sched_new(alone, NULL, 1, 64, false), *s2 = bp_sched_new(alone, NULL, 1, 64,
                                                                                 false);
    for (int salt = 0; salt < 3; salt++) {
        int32_t ids[MOE_U * MOE_T];
        moe_compare(&c1, s1, &c, s2, salt, 1e-12, ids);
        size_t eb = 0, ew = 0;
        bp_sched_get_copied_bytes(s2, &eb, &ew);
        ck_assert_uint_eq(ew, bytes);
        ck_assert_uint_lt(eb, ew); /* only the used experts were read */
    }
    /* The experts through a view of the file's tensor: the view is read through its copy. */
    c.y->src[0]->src[0] = bp_view_3d(c.ctx, fexps, MOE_K, MOE_M, MOE_E, fexps->nb[1],
                                     fexps->nb[2], 0);
    moe_rebuild(&c);
    int32_t vids[MOE_U * MOE_T];
    moe_compare(&c1, s1, &c, s2, 5, 1e-12, vids);
    ck_assert_int_eq(truncate(path, 1000), 0);
    ck_assert_int_eq(bp_sched_alloc_graph(s2, c.g), BP_OK);
    ck_assert_int_eq(bp_sched_graph_compute(s2, c.g), BP_ERR_IO);
    ck_assert_error_has(BP_ERR_IO, "changed on disk");
    ck_assert_ptr_null(bp_buffer_from_file(path, 0, bytes)); /* now too short */
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "are not all in it");
    ck_assert_ptr_null(bp_buffer_from_file("/nonexistent/experts", 0, 4));
    ck_assert_error_has(BP_ERR_IO, "cannot open");
    unlink(path);
    bp_sched_free(s1);
    bp_sched_free(s2);
    bp_buffer_free(fbuf);
    bp_context_free(fctx);
    free(ev);
    moe_case_free(&c);
    moe_case_free(&c1);
}
END_TEST

/* Ids computed on the backend of MUL_MAT_ID itself (here a CONT pinned there) would not be known
 * when the split's inputs are copied: the scheduler cuts a split before the product, so only
 * the used experts come, and every compute follows the ids of its own inputs. */
START_TEST(test_ids_made_in_the_split)
{
    struct moe_case c;
    moe_case_new(&c);
    bp_tensor *idin = bp_new_tensor_2d(c.ctx, BP_TYPE_I32, MOE_U, MOE_T);
    bp_set_input(idin);
    bp_tensor *ids = bp_cont(c.ctx, idin);
    bp_tensor *x3 = bp_reshape_3d(c.ctx, c.x, MOE_K, 1, MOE_T);
    bp_tensor *y = bp_mul_mat_id(c.ctx, c.exps, x3, ids);
    bp_set_output(y);
    bp_graph *g = bp_graph_new(16);
    ck_assert_int_eq(bp_graph_build_forward(g, y), BP_OK);
    bp_backend *both[2] = {accel, cpu};
    bp_sched *s = bp_sched_new(both, NULL, 2, 64, false);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(bp_sched_set_tensor_backend(s, ids, accel), BP_OK);
    float xv[MOE_K * MOE_T], ev[MOE_K * MOE_M * MOE_E];
    for (int i = 0; i < MOE_K * MOE_T; i++)
        xv[i] = (float)(i % 13) / 6.0f - 1.0f;
    ck_assert_int_eq(bp_tensor_get(c.exps, ev, 0, sizeof(ev)), BP_OK);
    for (int round = 0; round < 3; round++) {
        const int32_t iv[MOE_U * MOE_T] = {round, 7 - round, 3 + round, 2};
        ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
        ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, ids), accel);
        ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, y), accel);
        ck_assert_int_eq(bp_tensor_set(c.x, xv, 0, sizeof(xv)), BP_OK);
        ck_assert_int_eq(bp_tensor_set(idin, iv, 0, sizeof(iv)), BP_OK);
        ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
        float got[MOE_M * MOE_U * MOE_T];
        ck_assert_int_eq(bp_tensor_get(y, got, 0, sizeof(got)), BP_OK);
        for (int t = 0; t < MOE_T; t++)
            for (int u = 0; u < MOE_U; u++)
                for (int m = 0; m < MOE_M; m++) {
                    double r = 0;
                    for (int k = 0; k < MOE_K; k++)
                        r += (double)ev[(iv[t * MOE_U + u] * MOE_M + m) * MOE_K + k] *
                             xv[t * MOE_K + k];
                    ck_assert_double_eq_tol(got[(t * MOE_U + u) * MOE_M + m], r, 1e-4);
                }
        size_t eb = 0, ew = 0;
        bp_sched_get_copied_bytes(s, &eb, &ew);
        /* the split was cut before the product, so the ids were known: the used experts */
        ck_assert_uint_eq(ew, (size_t)MOE_K * MOE_M * MOE_E * sizeof(float));
        ck_assert_uint_lt(eb, ew);
        ck_assert_uint_gt(eb, 0);
    }
    bp_sched_free(s);
    bp_graph_free(g);
    moe_case_free(&c);
}
END_TEST

/* Two layers of experts over the same activations: the second layer's ids come from a router
 * computed after the first layer's product, and pred, made before it, predicts them exactly
 * (the same router on the same input). */
struct moe2 {
    bp_context *wctx, *ctx;
    bp_buffer *wbuf;
    bp_tensor *r1, *r2, *e1, *e2, *x, *pred, *ids1, *ids2, *y;
    bp_graph *g;
};

static void moe2_fill(bp_tensor *t, int mul, int mod)
{
    const int64_t n = bp_nelements(t);
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)((i * mul) % mod) / (float)(mod / 2) - 1.0f;
    ck_assert_int_eq(bp_tensor_set(t, v, 0, (size_t)n * sizeof(float)), BP_OK);
    free(v);
}

/* The layers, the second layer's experts e2 (NULL: a stack of its own, in host memory). */
static void moe2_new(struct moe2 *m, bp_tensor *e2)
{
    m->wctx = bp_context_new(4);
    m->r1 = bp_new_tensor_2d(m->wctx, BP_TYPE_F32, MOE_K, MOE_E);
    m->r2 = bp_new_tensor_2d(m->wctx, BP_TYPE_F32, MOE_K, MOE_E);
    m->e1 = bp_new_tensor_3d(m->wctx, BP_TYPE_F32, MOE_K, MOE_M, MOE_E);
    m->e2 = e2 != NULL ? e2 : bp_new_tensor_3d(m->wctx, BP_TYPE_F32, MOE_K, MOE_M, MOE_E);
    m->wbuf = bp_alloc_ctx_tensors(m->wctx, bp_host_buffer_type());
    ck_assert_ptr_nonnull(m->wbuf);
    bp_buffer_set_usage(m->wbuf, BP_BUFFER_USAGE_WEIGHTS);
    moe2_fill(m->r1, 53, 97);
    moe2_fill(m->r2, 31, 89);
    moe2_fill(m->e1, 37, 101);
    if (e2 == NULL)
        moe2_fill(m->e2, 41, 103);
    m->ctx = bp_context_new(32);
    m->x = bp_new_tensor_2d(m->ctx, BP_TYPE_F32, MOE_K, MOE_T);
    bp_set_input(m->x);
    bp_tensor *x3 = bp_reshape_3d(m->ctx, m->x, MOE_K, 1, MOE_T);
    m->g = bp_graph_new(64);
    m->pred = bp_top_k(m->ctx, bp_mul_mat(m->ctx, m->r2, m->x), MOE_U);
    bp_set_output(m->pred);
    ck_assert_int_eq(bp_graph_build_forward(m->g, m->pred), BP_OK);
    m->ids1 = bp_top_k(m->ctx, bp_mul_mat(m->ctx, m->r1, m->x), MOE_U);
    bp_tensor *y1 = bp_mul_mat_id(m->ctx, m->e1, x3, m->ids1);
    ck_assert_int_eq(bp_graph_build_forward(m->g, y1), BP_OK);
    m->ids2 = bp_top_k(m->ctx, bp_mul_mat(m->ctx, m->r2, m->x), MOE_U);
    bp_set_output(m->ids1);
    bp_set_output(m->ids2);
    m->y = bp_add(m->ctx, y1, bp_mul_mat_id(m->ctx, m->e2, x3, m->ids2));
    bp_set_output(m->y);
    ck_assert_int_eq(bp_graph_build_forward(m->g, m->y), BP_OK);
}

static void moe2_free(struct moe2 *m)
{
    bp_graph_free(m->g);
    bp_context_free(m->ctx);
    bp_buffer_free(m->wbuf);
    bp_context_free(m->wctx);
}

/* Computes m through s with inputs from salt; the status, and y when it is BP_OK. */
static enum bp_status moe2_compute(struct moe2 *m, bp_sched *s, int salt, float *y)
{
    ck_assert_int_eq(bp_sched_alloc_graph(s, m->g), BP_OK);
    float xv[MOE_K * MOE_T];
    for (int i = 0; i < MOE_K * MOE_T; i++)
        xv[i] = (float)(((i + 1) * (salt + 5)) % 31) / 15.0f - 1.0f;
    ck_assert_int_eq(bp_tensor_set(m->x, xv, 0, sizeof(xv)), BP_OK);
    enum bp_status st = bp_sched_graph_compute(s, m->g);
    if (st == BP_OK)
        ck_assert_int_eq(bp_tensor_get(m->y, y, 0, bp_nbytes(m->y)), BP_OK);
    return st;
}

/* The distinct experts t (ids) names. */
static int distinct_ids(const bp_tensor *t)
{
    int32_t v[MOE_U * MOE_T];
    bool seen[MOE_E] = {false};
    int n = 0;
    ck_assert_int_eq(bp_tensor_get(t, v, 0, sizeof(v)), BP_OK);
    for (int i = 0; i < MOE_U * MOE_T; i++)
        if (!seen[v[i]])
            seen[v[i]] = true, n++;
    return n;
}

/* Prefetch: with the second layer's experts predicted exactly, the copy thread loads them
 * into the accelerator's cache while the first layer computes, and the second product finds
 * every one there; a wrong prediction changes nothing but copies; a prediction whose ids are
 * not in the graph, or without a cache, does nothing; bad predictions are refused. */
START_TEST(test_expert_prefetch)
{
    struct moe2 ref, m;
    moe2_new(&ref, NULL);
    moe2_new(&m, NULL);
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    bp_sched *s1 = bp_sched_new(alone, NULL, 1, 64, false);
    bp_sched *s2 = bp_sched_new(both, NULL, 2, 64, false);
    ck_assert_int_eq(bp_sched_set_expert_cache(s2, 4), BP_OK);
    ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, m.pred), BP_OK);
    const size_t stride = (size_t)MOE_K * MOE_M * sizeof(float);
    float want[MOE_M * MOE_U * MOE_T], got[MOE_M * MOE_U * MOE_T];
    for (int salt = 0; salt < 6; salt++) {
        ck_assert_int_eq(moe2_compute(&ref, s1, salt, want), BP_OK);
        ck_assert_msg(moe2_compute(&m, s2, salt, got) == BP_OK, "%s", bp_last_error());
        assert_close_nmse(got, want, MOE_M * MOE_U * MOE_T, 1e-12);
        ck_assert_ptr_eq(bp_sched_get_tensor_backend(s2, m.y), accel);
        struct bp_sched_expert_stats st;
        ck_assert_int_eq(bp_sched_get_expert_stats(s2, &st), BP_OK);
        const int n1 = distinct_ids(m.ids1), n2 = distinct_ids(m.ids2);
        ck_assert_uint_eq(st.hits + st.misses, (uint64_t)(n1 + n2));
        ck_assert_uint_eq(st.bytes_prefetched, st.prefetched * stride);
        ck_assert_uint_eq(st.prefetch_hits, st.prefetched); /* exact: every one used */
        if (salt == 0) { /* empty caches: the first layer's all misses, the second's loaded */
            ck_assert_uint_eq(st.misses, (uint64_t)n1);
            ck_assert_uint_eq(st.prefetched, (uint64_t)n2);
        }
        ck_assert(st.copy_seconds >= 0 && st.wait_seconds >= 0 && st.prefetch_seconds >= 0);
        if (st.prefetched > 0)
            ck_assert(st.prefetch_seconds > 0);
    }
    /* A wrong prediction (the first layer's ids): the same results. */
    ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, m.ids1), BP_OK);
    for (int salt = 6; salt < 9; salt++) {
        ck_assert_int_eq(moe2_compute(&ref, s1, salt, want), BP_OK);
        ck_assert_int_eq(moe2_compute(&m, s2, salt, got), BP_OK);
        assert_close_nmse(got, want, MOE_M * MOE_U * MOE_T, 1e-12);
        struct bp_sched_expert_stats st;
        bp_sched_get_expert_stats(s2, &st);
        ck_assert_uint_le(st.prefetch_hits, st.prefetched);
    }
    /* Ids not in the graph, a removed prediction, no cache: nothing prefetched. */
    bp_context *other = bp_context_new(1);
    bp_tensor *stray = bp_new_tensor_2d(other, BP_TYPE_I32, MOE_U, MOE_T);
    for (int round = 0; round < 3; round++) {
        if (round == 0)
            ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, stray), BP_OK);
        else if (round == 1)
            ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, NULL), BP_OK);
        else {
            ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, m.pred), BP_OK);
            ck_assert_int_eq(bp_sched_set_expert_cache(s2, 0), BP_OK);
        }
        ck_assert_int_eq(moe2_compute(&ref, s1, round, want), BP_OK);
        ck_assert_int_eq(moe2_compute(&m, s2, round, got), BP_OK);
        assert_close_nmse(got, want, MOE_M * MOE_U * MOE_T, 1e-12);
        struct bp_sched_expert_stats st;
        bp_sched_get_expert_stats(s2, &st);
        ck_assert_uint_eq(st.prefetched, 0);
        ck_assert_uint_eq(st.prefetch_hits, 0);
    }
    /* Refused: ids that are not I32, experts that are not a stack, no scheduler. */
    ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, m.x), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "contiguous I32");
    /* A tensor without a name is described, not left as an empty quote. */
    ck_assert_error_has(BP_ERR_INVALID_ARG, "the ids unnamed f32 [");
    ck_assert_int_eq(bp_sched_predict_experts(s2, m.r2, m.pred), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "not a stack of experts");
    ck_assert_int_eq(bp_sched_predict_experts(NULL, m.e2, m.pred), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_sched_predict_experts(s2, NULL, m.pred), BP_ERR_INVALID_ARG);
    bp_context_free(other);
    bp_sched_free(s1);
    bp_sched_free(s2);
    moe2_free(&m);
    moe2_free(&ref);
}
END_TEST

/* The second layer's experts in a file, prefetched by the copy thread, with caches of 2 slots
 * (fewer than the experts a compute uses: copies into the split's copy) and 4 (read in place):
 * the same results as from memory; when the file shrinks, the copy thread's failures leave
 * their slots empty and the compute itself reports the file's change, with nothing crashing
 * (also when a used expert's load failed and every slot is needed). Then a queued compute is
 * followed by emptying the caches and freeing the scheduler: nothing of theirs is read after. */
START_TEST(test_prefetch_from_a_file)
{
    for (int slots = 2; slots <= 4; slots += 2) {
        struct moe2 ref, m;
        moe2_new(&ref, NULL);
        const size_t bytes = bp_nbytes(ref.e2);
        float *ev = malloc(bytes);
        ck_assert_int_eq(bp_tensor_get(ref.e2, ev, 0, bytes), BP_OK);
        char path[] = "/tmp/bp-test-prefetch-XXXXXX";
        const int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, ev, bytes), (ssize_t)bytes);
        close(fd);
        bp_context *fctx = bp_context_new(1);
        bp_tensor *fe = bp_new_tensor_3d(fctx, BP_TYPE_F32, MOE_K, MOE_M, MOE_E);
        bp_buffer *fbuf = bp_buffer_from_file(path, 0, bytes);
        ck_assert_ptr_nonnull(fbuf);
        ck_assert_int_eq(bp_buffer_place_tensor(fbuf, fe, bp_buffer_get_base(fbuf)), BP_OK);
        bp_buffer_set_usage(fbuf, BP_BUFFER_USAGE_WEIGHTS);
        moe2_new(&m, fe);
        bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
        bp_sched *s1 = bp_sched_new(alone, NULL, 1, 64, false);
        bp_sched *s2 = bp_sched_new(both, NULL, 2, 64, false);
        ck_assert_int_eq(bp_sched_set_expert_cache(s2, slots), BP_OK);
        ck_assert_int_eq(bp_sched_predict_experts(s2, m.e2, m.pred), BP_OK);
        float want[MOE_M * MOE_U * MOE_T], got[MOE_M * MOE_U * MOE_T];
        uint64_t prefetched = 0;
        for (int salt = 0; salt < 4; salt++) {
            ck_assert_int_eq(moe2_compute(&ref, s1, salt, want), BP_OK);
            ck_assert_msg(moe2_compute(&m, s2, salt, got) == BP_OK, "%s", bp_last_error());
            assert_close_nmse(got, want, MOE_M * MOE_U * MOE_T, 1e-12);
            struct bp_sched_expert_stats st;
            bp_sched_get_expert_stats(s2, &st);
            prefetched += st.prefetched;
        }
        ck_assert_uint_gt(prefetched, 0);
        ck_assert_int_eq(truncate(path, 100), 0);
        for (int salt = 10; salt < 16; salt++) /* new experts each time: read from the file */
            ck_assert_int_eq(moe2_compute(&m, s2, salt, got), BP_ERR_IO);
        ck_assert_error_has(BP_ERR_IO, "changed on disk");
        ck_assert_int_eq(bp_sched_alloc_graph(s2, m.g), BP_OK);
        bp_sched_graph_compute_async(s2, m.g); /* (fails the same way; queued work or not) */
        ck_assert_int_eq(bp_sched_set_expert_cache(s2, 0), BP_OK);
        unlink(path);
        bp_sched_free(s1);
        bp_sched_free(s2);
        moe2_free(&m);
        moe2_free(&ref);
        bp_buffer_free(fbuf);
        bp_context_free(fctx);
        free(ev);
    }
}
END_TEST

START_TEST(test_more_inputs_than_a_split_holds)
{
    bp_backend *both[2] = {accel, cpu}, *alone[1] = {cpu};
    int splits_both = 0, splits_alone = 0;
    float *got = many_inputs(both, 2, &splits_both);
    float *ref = many_inputs(alone, 1, &splits_alone);
    ck_assert_int_eq(splits_alone, 1);
    ck_assert_int_ge(splits_both, 3); /* the silu run, then the adds cut in two */
    assert_close(got, ref, 16);
    free(got);
    free(ref);
}
END_TEST

/* A node runs only where it is supported. SET_ROWS into a cache in the accelerator's memory
 * (which the accelerator cannot run and the CPU cannot write) is refused with the reason, a
 * cache in host memory is updated by the CPU, and a pin to a backend that cannot run the op
 * is refused. */
START_TEST(test_destination_must_be_supported)
{
    bp_backend *bes[2] = {accel, cpu};
    for (int on_accel = 1; on_accel >= 0; on_accel--) {
        bp_context *kctx = bp_context_new(2), *ctx = bp_context_new(16);
        bp_tensor *cache = bp_new_tensor_2d(kctx, BP_TYPE_F16, 8, 6);
        bp_set_name(cache, "cache_k");
        bp_buffer *kbuf = bp_alloc_ctx_tensors(kctx, bp_backend_get_default_buffer_type(
                                                         on_accel ? accel : cpu));
        ck_assert_ptr_nonnull(kbuf);
        ck_assert_int_eq(bp_buffer_clear(kbuf, 0), BP_OK);
        bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 2);
        bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
        bp_set_input(x);
        bp_set_input(ids);
        bp_tensor *w = bp_set_rows(ctx, cache, bp_scale(ctx, x, 2.0f), ids);
        bp_graph *g = bp_graph_new(16);
        ck_assert_int_eq(bp_graph_build_forward(g, w), BP_OK);
        bp_sched *s = bp_sched_new(bes, NULL, 2, 64, false);
        bp_clear_error();
        enum bp_status st = bp_sched_alloc_graph(s, g);
        if (on_accel) {
            ck_assert_int_eq(st, BP_ERR_UNSUPPORTED);
            ck_assert_error_has(BP_ERR_UNSUPPORTED, "SET_ROWS node");
            ck_assert_ptr_nonnull(strstr(bp_last_error(), "writes into its TestAccel buffer, "
                                                          "which only ACCEL0 can use"));
            ck_assert_ptr_nonnull(strstr(bp_last_error(), "CPU can run it but not use that memory"));
            ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_ERR_UNSUPPORTED);
        } else {
            ck_assert_msg(st == BP_OK, "%s", bp_last_error());
            const float xv[16] = {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8};
            const int32_t iv[2] = {4, 1};
            ck_assert_int_eq(bp_tensor_set(x, xv, 0, sizeof(xv)), BP_OK);
            ck_assert_int_eq(bp_tensor_set(ids, iv, 0, sizeof(iv)), BP_OK);
            ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
            ck_assert_ptr_eq(bp_sched_get_tensor_backend(s, w), cpu);
            uint16_t row[8];
            ck_assert_int_eq(bp_tensor_get(cache, row, 4 * sizeof(row), sizeof(row)), BP_OK);
            for (int i = 0; i < 8; i++)
                ck_assert(bp_fp16_to_fp32(row[i]) == 2.0f * xv[i]);
            /* Pinning the update to the accelerator, which has no SET_ROWS, is refused. */
            ck_assert_int_eq(bp_sched_set_tensor_backend(s, w, accel), BP_OK);
            ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_ERR_UNSUPPORTED);
            ck_assert_error_has(BP_ERR_UNSUPPORTED, "is pinned to backend ACCEL0, which does not "
                                                    "support it");
        }
        bp_sched_free(s);
        bp_graph_free(g);
        bp_buffer_free(kbuf);
        bp_context_free(ctx);
        bp_context_free(kctx);
    }
}
END_TEST

START_TEST(test_errors)
{
    bp_backend *wrong[2] = {cpu, accel};
    ck_assert_rejected(bp_sched_new(wrong, NULL, 2, 64, false), BP_ERR_INVALID_ARG,
                       "last backend must be a CPU backend");
    bp_backend *many[17];
    for (int i = 0; i < 17; i++)
        many[i] = cpu;
    ck_assert_rejected(bp_sched_new(many, NULL, 17, 64, false), BP_ERR_INVALID_ARG, "at most 16");
    ck_assert_rejected(bp_sched_new(NULL, NULL, 0, 64, false), BP_ERR_INVALID_ARG, "at least one");
    bp_buffer_type *bad[1] = {bp_backend_get_default_buffer_type(accel)};
    bp_backend *one[1] = {cpu};
    ck_assert_rejected(bp_sched_new(one, bad, 1, 64, false), BP_ERR_INVALID_ARG, "cannot use");

    /* An op no backend runs: the CPU declines a transposed activation matrix. */
    bp_sched *s = bp_sched_new(one, NULL, 1, 64, false);
    bp_context *ctx = bp_context_new(8);
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 3);
    bp_tensor *x = bp_transpose(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 2, 4));
    bp_tensor *y = bp_set_name(bp_mul_mat(ctx, w, x), "odd");
    bp_graph *g = bp_graph_new(8);
    bp_graph_build_forward(g, y);
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "no backend (CPU) supports MUL_MAT"));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "'odd'"));
    /* A graph larger than the scheduler was made for. */
    bp_sched *small = bp_sched_new(one, NULL, 1, 1, false);
    bp_graph *g2 = bp_graph_new(8);
    bp_graph_build_forward(g2, bp_neg(ctx, bp_neg(ctx, w)));
    ck_assert_int_eq(bp_sched_graph_compute(small, g2), BP_ERR_CAPACITY);
    bp_sched_free(small);
    bp_graph_free(g2);
    bp_graph_free(g);
    bp_context_free(ctx);
    bp_sched_free(s);
    bp_sched_free(NULL);
    ck_assert_int_eq(bp_sched_graph_compute(NULL, NULL), BP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(test_debug_output)
{
    setenv("BP_SCHED_DEBUG", "2", 1);
    char path[] = "/tmp/bp-sched-debug-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    bp_backend *both[2] = {accel, cpu};
    float *got = run(both, 2, false, bp_backend_get_default_buffer_type(accel), &tiny, 0, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    free(got);
    char buf[1 << 16];
    FILE *f = fopen(path, "r");
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    buf[len] = '\0';
    fclose(f);
    close(fd);
    unlink(path);
    ck_assert_ptr_nonnull(strstr(buf, "split 0 on"));
    ck_assert_ptr_nonnull(strstr(buf, "its weights are there"));
    ck_assert_ptr_nonnull(strstr(buf, "expanded from a neighbour (accelerators)"));
    ck_assert_ptr_nonnull(strstr(buf, "its view source is there"));
    ck_assert_ptr_nonnull(strstr(buf, "ROPE       CPU")); /* the accelerator cannot rope */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sched");
    const struct {
        const TTest *fn;
        const char *name;
    } tests[] = {
        {test_weights_on_accelerator, "weights_on_accelerator"},
        {test_weights_on_cpu, "weights_on_cpu"},
        {test_cpu_computes_in_host_buffer, "cpu_in_host_buffer"},
        {test_device_buffer_oom_keeps_pinned, "device_buffer_oom_keeps_pinned"},
        {test_weights_of_every_type, "weights_of_every_type"},
        {test_parallel_evaluations, "parallel"},
        {test_pins_and_queries, "pins_and_queries"},
        {test_eval_callback_stops_early, "eval_callback"},
        {test_graph_larger_than_reserved, "larger_than_reserved"},
        {test_repeated_compute_same_graph, "repeated_compute"},
        {test_more_inputs_than_a_split_holds, "many_split_inputs"},
        {test_used_experts_copied, "used_experts_copied"},
        {test_ids_made_in_the_split, "ids_made_in_the_split"},
        {test_experts_from_a_file, "experts_from_a_file"},
        {test_expert_cache, "expert_cache"},
        {test_expert_prefetch, "expert_prefetch"},
        {test_prefetch_from_a_file, "prefetch_from_a_file"},
        {test_used_experts_from_repacked, "used_experts_from_repacked"},
        {test_foreign_view_inside_a_split, "foreign_view_inside_a_split"},
        {test_recompute_unchanged_graph, "recompute_unchanged"},
        {test_pin_after_compute, "pin_after_compute"},
        {test_destination_must_be_supported, "destination_supported"},
        {test_errors, "errors"},
        {test_debug_output, "debug_output"},
    };
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, tests[i].fn);
        suite_add_tcase(s, tc);
    }
    return bp_test_run(s);
}
