/* test-cuda.c - the CUDA plugin on a GPU: every conformance case on CUDA0 against the reference,
 * buffers and copies (including device to device and 2-D strided), the pinned host buffer type,
 * events, out-of-range row ids, the scheduler with CUDA0 and the CPU, Meta(CUDA0) (with NCCL
 * where built), and every quantised weight type against the runtime's dequantizers. Without a
 * GPU it prints why and exits 77 (SKIP): never a pass. */
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/conformance.h"
#include "test-util.h"
#include "tf-model.h"

static bp_backend *gpu, *cpu;

static void setup(void)
{
    gpu = bp_backend_init_by_name("CUDA0", NULL);
    cpu = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_msg(gpu && cpu, "backends: %s", bp_last_error());
}

static void teardown(void)
{
    bp_backend_free(gpu);
    bp_backend_free(cpu);
}

START_TEST(test_case)
{
    const struct conf_case *c = &conf_cases[_i];
    char first[512];
    const int failed = conf_run_variants(gpu, c, first, sizeof(first));
    ck_assert_msg(failed == 0, "%s: %d of %d variants failed; first: %s", c->name, failed,
                  c->n_variants, first);
}
END_TEST

START_TEST(test_device)
{
    bp_device *d = bp_backend_get_device(gpu);
    struct bp_device_props p;
    bp_device_get_props(d, &p);
    ck_assert_str_eq(p.name, "CUDA0");
    ck_assert_int_eq(p.type, BP_DEVICE_TYPE_GPU);
    ck_assert(p.memory_total > 0 && p.memory_free <= p.memory_total);
    ck_assert(p.caps.async && p.caps.events && p.caps.host_buffer);
    printf("CUDA0: %s, %.1f of %.1f GiB free\n", p.description, p.memory_free / 1073741824.0,
           p.memory_total / 1073741824.0);
    ck_assert_ptr_null(bp_backend_init_by_name("CUDA0", "threads=4")); /* takes no params */
}
END_TEST

START_TEST(test_buffers_and_copies)
{
    bp_buffer_type *bt = bp_backend_get_default_buffer_type(gpu);
    ck_assert(!bp_buffer_type_is_host(bt));
    ck_assert_int_eq(bp_buffer_type_get_alignment(bt) % 256, 0);
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 37, 11);
    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 37, 11);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bt);
    ck_assert_ptr_nonnull(buf);
    float in[37 * 11], out[37 * 11];
    for (int i = 0; i < 37 * 11; i++)
        in[i] = (float)i * 0.5f - 3.0f;
    ck_assert_int_eq(bp_tensor_set(a, in, 0, sizeof(in)), BP_OK);
    ck_assert_int_eq(bp_tensor_copy(a, b), BP_OK); /* device to device */
    memset(out, 0, sizeof(out));
    ck_assert_int_eq(bp_tensor_get(b, out, 0, sizeof(out)), BP_OK);
    ck_assert_mem_eq(in, out, sizeof(in));
    /* partial set and get at an offset */
    ck_assert_int_eq(bp_tensor_set(a, in + 5, 40, 7 * sizeof(float)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(a, out, 40, 7 * sizeof(float)), BP_OK);
    ck_assert_mem_eq(out, in + 5, 7 * sizeof(float));
    /* memset and clear */
    ck_assert_int_eq(bp_tensor_memset(b, 0, 0, bp_nbytes(b)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(b, out, 0, sizeof(out)), BP_OK);
    for (int i = 0; i < 37 * 11; i++)
        ck_assert(out[i] == 0.0f);
    ck_assert_int_eq(bp_buffer_clear(buf, 0xff), BP_OK);
    ck_assert_int_eq(bp_tensor_get(a, out, 0, 4), BP_OK);
    uint32_t bits;
    memcpy(&bits, out, 4);
    ck_assert_uint_eq(bits, 0xffffffffu);
    /* host to device through the pinned host buffer type, which the CPU backend accepts */
    bp_buffer_type *ht = bp_device_get_host_buffer_type(bp_backend_get_device(gpu));
    ck_assert_ptr_nonnull(ht);
    ck_assert(bp_buffer_type_is_host(ht));
    ck_assert(bp_device_supports_buft(bp_backend_get_device(cpu), ht));
    bp_context *hctx = bp_context_new(2);
    bp_tensor *h = bp_new_tensor_2d(hctx, BP_TYPE_F32, 37, 11);
    bp_buffer *hbuf = bp_alloc_ctx_tensors(hctx, ht);
    ck_assert_ptr_nonnull(hbuf);
    memcpy(h->data, in, sizeof(in));
    ck_assert_int_eq(bp_tensor_copy(h, b), BP_OK);
    ck_assert_int_eq(bp_tensor_get(b, out, 0, sizeof(out)), BP_OK);
    ck_assert_mem_eq(in, out, sizeof(in));
    bp_buffer_free(hbuf);
    bp_context_free(hctx);
    /* a 2-D strided view: every other row */
    bp_tensor *v = bp_view_2d(ctx, a, 37, 5, 2 * a->nb[1], 0);
    float rows[37 * 5];
    for (int i = 0; i < 37 * 5; i++)
        rows[i] = (float)(i % 97);
    ck_assert_int_eq(bp_tensor_set_2d(v, rows, 0, 37 * 4, 5, v->nb[1], 37 * 4), BP_OK);
    float back[37 * 5];
    ck_assert_int_eq(bp_tensor_get_2d(v, back, 0, 37 * 4, 5, v->nb[1], 37 * 4), BP_OK);
    ck_assert_mem_eq(rows, back, sizeof(rows));
    ck_assert_int_eq(bp_tensor_get(a, out, 0, sizeof(out)), BP_OK); /* rows 0, 2, 4, ... of a */
    for (int r = 0; r < 5; r++)
        ck_assert_mem_eq(out + 2 * r * 37, rows + r * 37, 37 * sizeof(float));
    bp_buffer_free(buf);
    bp_context_free(ctx);
    /* more memory than the device has: a clear error, not a crash */
    bp_clear_error();
    ck_assert_ptr_null(bp_buffer_type_alloc(bt, (size_t)1 << 62));
    ck_assert(bp_last_status() == BP_ERR_OUT_OF_MEMORY || bp_last_status() == BP_ERR_INVALID_ARG);
}
END_TEST

START_TEST(test_async_and_events)
{
    bp_context *ctx = bp_context_new(4);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 1 << 20);
    bp_tensor *y = bp_scale(ctx, x, 2.0f);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(gpu));
    ck_assert_ptr_nonnull(buf);
    float *in = malloc(sizeof(float) << 20), *out = malloc(sizeof(float) << 20);
    for (int i = 0; i < 1 << 20; i++)
        in[i] = (float)(i % 1000);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    bp_event *ev = bp_event_new(bp_backend_get_device(gpu));
    ck_assert_ptr_nonnull(ev);
    ck_assert_int_eq(bp_backend_tensor_set_async(gpu, x, in, 0, sizeof(float) << 20), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute_async(gpu, g), BP_OK);
    ck_assert_int_eq(bp_event_record(ev, gpu), BP_OK);
    ck_assert_int_eq(bp_event_synchronize(ev), BP_OK);
    ck_assert_int_eq(bp_backend_tensor_get_async(gpu, y, out, 0, sizeof(float) << 20), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize(gpu), BP_OK);
    for (int i = 0; i < 1 << 20; i++)
        ck_assert(out[i] == 2.0f * in[i]);
    bp_event_free(ev);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    free(in);
    free(out);
}
END_TEST

START_TEST(test_row_id_out_of_range)
{
    bp_context *ctx = bp_context_new(4);
    bp_tensor *table = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 4);
    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
    bp_tensor *rows = bp_get_rows(ctx, table, ids);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(gpu));
    int32_t bad[2] = {1, 9};
    bp_tensor_set(ids, bad, 0, sizeof(bad));
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, rows);
    ck_assert_int_eq(bp_backend_graph_compute_async(gpu, g), BP_OK); /* queued */
    ck_assert_int_eq(bp_backend_synchronize(gpu), BP_ERR_OUT_OF_BOUNDS);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "row id"));
    ck_assert_int_eq(bp_backend_synchronize(gpu), BP_OK); /* reported once */
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}
END_TEST

static const struct tf_config tiny = {.n_layer = 2, .n_embd = 64, .n_ff = 96, .n_head = 4,
                                      .n_vocab = 50, .n_tok = 5, .wtype = BP_TYPE_F32};

static float *run_model(bp_backend *const *backends, int n, bp_buffer_type *wbuft,
                        const struct tf_config *cfg)
{
    struct model m;
    model_init(&m, cfg, wbuft);
    bp_context *ctx = bp_context_new(tf_graph_n_tensors(cfg));
    struct tf_graph tg;
    ck_assert(tf_build(ctx, cfg, &m.w, &tg));
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(cfg) + tf_weights_n_tensors(cfg));
    ck_assert_int_eq(bp_graph_build_forward(g, tg.logits), BP_OK);
    bp_sched *s = bp_sched_new(backends, NULL, n, 4096, false);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    set_inputs(&tg, cfg, 0);
    ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
    const size_t bytes = bp_nbytes(tg.logits);
    float *out = malloc(bytes);
    ck_assert_int_eq(bp_tensor_get(tg.logits, out, 0, bytes), BP_OK);
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    return out;
}

START_TEST(test_scheduler_with_cpu)
{
    static const enum bp_type wtypes[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_Q8_0};
    for (int t = 0; t < 3; t++) {
        struct tf_config cfg = tiny;
        cfg.wtype = wtypes[t];
        bp_backend *both[2] = {gpu, cpu}, *alone[1] = {cpu};
        float *ref = run_model(alone, 1, bp_host_buffer_type(), &cfg);
        float *got = run_model(both, 2, bp_backend_get_default_buffer_type(gpu), &cfg);
        assert_close_nmse(got, ref, (int64_t)cfg.n_vocab * cfg.n_tok, 1e-5);
        free(ref);
        free(got);
    }
}
END_TEST

START_TEST(test_meta_over_cuda)
{
    bp_backend *meta = bp_backend_init_by_name("Meta(CUDA0)", NULL);
    ck_assert_msg(meta != NULL, "%s", bp_last_error());
    bp_backend *both[2] = {meta, cpu}, *alone[1] = {cpu};
    float *ref = run_model(alone, 1, bp_host_buffer_type(), &tiny);
    float *got = run_model(both, 2, bp_backend_get_default_buffer_type(meta), &tiny);
    assert_close_nmse(got, ref, (int64_t)tiny.n_vocab * tiny.n_tok, 1e-5);
    free(ref);
    free(got);
    bp_backend_free(meta);
}
END_TEST

START_TEST(test_nccl_allreduce)
{
    bp_registry *reg = bp_registry_by_name("CUDA");
    bp_comm_init_fn init = (bp_comm_init_fn)bp_registry_get_proc_address(reg, "bp_comm_init");
    bp_comm_allreduce_fn red =
        (bp_comm_allreduce_fn)bp_registry_get_proc_address(reg, "bp_comm_allreduce");
    bp_comm_free_fn fr = (bp_comm_free_fn)bp_registry_get_proc_address(reg, "bp_comm_free");
    if (init == NULL) {
        printf("built without NCCL: no collectives to test\n");
        return;
    }
    bp_comm *c = init(&gpu, 1); /* one GPU here: a single-rank all-reduce is the identity */
    ck_assert_msg(c != NULL, "%s", bp_last_error());
    bp_context *ctx = bp_context_new(2);
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 1000);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(gpu));
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (float)i;
    bp_tensor_set(t, in, 0, sizeof(in));
    ck_assert_int_eq(red(c, &t, 1), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize(gpu), BP_OK);
    bp_tensor_get(t, out, 0, sizeof(out));
    ck_assert_mem_eq(in, out, sizeof(in));
    bp_backend *twice[2] = {gpu, gpu};
    ck_assert_ptr_null(init(twice, 2)); /* one backend per GPU */
    fr(c);
    bp_buffer_free(buf);
    bp_context_free(ctx);
}
END_TEST

/* ---- Quantised weight types --------------------------------------------------------------
 * Every weight type the plugin decodes, against the runtime's dequantizers (to_float): random
 * blocks (every bit pattern of the packed values; finite fp16 scales, 2^-6 to 2^1, of both
 * signs) through GET_ROWS, MUL_MAT with 1 column (the matrix-vector kernel), 7 and 64 (the
 * dequantize-and-cuBLAS path) and MUL_MAT_ID, compared with products in double. A block decoded
 * wrongly anywhere moves the NMSE far above the bounds. */
struct wtype {
    enum bp_type type;
    size_t half_at[2]; /* the fp16 fields of a block */
    int n_halves;
};

#define WT1(T, S) {T, {offsetof(struct S, d)}, 1}
#define WT2(T, S, M) {T, {offsetof(struct S, d), offsetof(struct S, M)}, 2}
static const struct wtype wtypes_q[] = {
    WT1(BP_TYPE_Q8_0, bp_block_q8_0),       WT1(BP_TYPE_Q4_0, bp_block_q4_0),
    WT2(BP_TYPE_Q4_1, bp_block_q4_1, m),    WT1(BP_TYPE_Q5_0, bp_block_q5_0),
    WT2(BP_TYPE_Q5_1, bp_block_q5_1, m),    WT2(BP_TYPE_Q2_K, bp_block_q2_k, dmin),
    WT1(BP_TYPE_Q3_K, bp_block_q3_k),       WT2(BP_TYPE_Q4_K, bp_block_q4_k, dmin),
    WT2(BP_TYPE_Q5_K, bp_block_q5_k, dmin), WT1(BP_TYPE_Q6_K, bp_block_q6_k),
    WT1(BP_TYPE_IQ4_NL, bp_block_iq4_nl),   WT1(BP_TYPE_IQ4_XS, bp_block_iq4_xs),
};

static uint32_t wt_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

/* Random blocks of type w into t (contiguous) on the device; returns the values as the
 * runtime's to_float reads them (caller frees). */
static float *fill_blocks(bp_tensor *t, const struct wtype *w, uint64_t *rng)
{
    const struct bp_type_traits *tr = bp_type_get_traits(w->type);
    const size_t bytes = bp_nbytes(t), nblocks = bytes / tr->type_size;
    uint8_t *raw = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        raw[i] = (uint8_t)wt_next(rng);
    for (size_t b = 0; b < nblocks; b++)
        for (int h = 0; h < w->n_halves; h++) {
            const uint32_t r = wt_next(rng);
            const uint16_t v = (uint16_t)((r & 1) << 15 | (9 + (r >> 1) % 8) << 10 | (r >> 8 & 0x3ff));
            memcpy(raw + b * tr->type_size + w->half_at[h], &v, sizeof(v));
        }
    float *out = malloc((size_t)bp_nelements(t) * sizeof(float));
    tr->to_float(raw, out, bp_nelements(t));
    ck_assert_int_eq(bp_tensor_set(t, raw, 0, bytes), BP_OK);
    free(raw);
    return out;
}

static float *fill_floats(bp_tensor *t, uint64_t *rng)
{
    const int64_t n = bp_nelements(t);
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)(wt_next(rng) % 2001) / 1000.0f - 1.0f;
    ck_assert_int_eq(bp_tensor_set(t, v, 0, (size_t)n * sizeof(float)), BP_OK);
    return v;
}

/* r[m, n] = sum_k w[m K + k] x[n K + k], in double, for a [K, M] weight and a [K, N] input. */
static float *ref_product(const float *w, const float *x, int64_t K, int64_t M, int64_t N)
{
    float *r = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t m = 0; m < M; m++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (double)w[m * K + k] * (double)x[n * K + k];
            r[n * M + m] = (float)s;
        }
    return r;
}

static float *read_back(const bp_tensor *t)
{
    float *v = malloc(bp_nbytes(t));
    ck_assert_int_eq(bp_tensor_get(t, v, 0, bp_nbytes(t)), BP_OK);
    return v;
}

START_TEST(test_weight_type)
{
    const struct wtype *w = &wtypes_q[_i];
    const char *name = bp_type_name(w->type);
    enum { K = 512, M = 40, E = 3, U = 2, T = 5, NR = 6 };
    static const int64_t cols[3] = {1, 7, 64};
    uint64_t rng = 0x5eedull + (uint64_t)_i;
    bp_context *ctx = bp_context_new(32);
    bp_tensor *a = bp_new_tensor_2d(ctx, w->type, K, M);
    bp_tensor *as = bp_new_tensor_3d(ctx, w->type, K, M, E);
    bp_tensor *rid = bp_new_tensor_1d(ctx, BP_TYPE_I32, NR);
    bp_tensor *xid = bp_new_tensor_3d(ctx, BP_TYPE_F32, K, U, T);
    bp_tensor *eid = bp_new_tensor_2d(ctx, BP_TYPE_I32, U, T);
    bp_tensor *x[3], *p[3];
    bp_graph *g = bp_graph_new(64);
    bp_tensor *rows = bp_get_rows(ctx, a, rid), *pid = bp_mul_mat_id(ctx, as, xid, eid);
    ck_assert_msg(rows && pid, "%s: %s", name, bp_last_error());
    for (int c = 0; c < 3; c++) {
        x[c] = bp_new_tensor_2d(ctx, BP_TYPE_F32, K, cols[c]);
        p[c] = bp_mul_mat(ctx, a, x[c]);
        ck_assert_int_eq(bp_graph_build_forward(g, p[c]), BP_OK);
    }
    ck_assert_int_eq(bp_graph_build_forward(g, rows), BP_OK);
    ck_assert_int_eq(bp_graph_build_forward(g, pid), BP_OK);
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++)
        ck_assert_msg(bp_backend_supports_op(gpu, bp_graph_get_node(g, i)),
                      "%s: CUDA0 declines node %d", name, i);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(gpu));
    ck_assert_ptr_nonnull(buf);
    float *wa = fill_blocks(a, w, &rng), *was = fill_blocks(as, w, &rng);
    float *xs[3], *xi = fill_floats(xid, &rng);
    for (int c = 0; c < 3; c++)
        xs[c] = fill_floats(x[c], &rng);
    int32_t rids[NR] = {39, 0, 17, 17, 5, 38}, eids[U * T];
    for (int j = 0; j < U * T; j++)
        eids[j] = (int32_t)(wt_next(&rng) % E);
    bp_tensor_set(rid, rids, 0, sizeof(rids));
    bp_tensor_set(eid, eids, 0, sizeof(eids));
    ck_assert_msg(bp_backend_graph_compute(gpu, g) == BP_OK, "%s: %s", name, bp_last_error());

    float *got = read_back(rows), *want = malloc(sizeof(float) * K * NR);
    for (int r = 0; r < NR; r++)
        memcpy(want + r * K, wa + rids[r] * K, sizeof(float) * K);
    assert_close_nmse(got, want, K * NR, 1e-12);
    free(got);
    free(want);
    for (int c = 0; c < 3; c++) {
        got = read_back(p[c]);
        want = ref_product(wa, xs[c], K, M, cols[c]);
        assert_close_nmse(got, want, M * cols[c], 1e-7);
        free(got);
        free(want);
        free(xs[c]);
    }
    got = read_back(pid);
    for (int j = 0; j < U * T; j++) {
        want = ref_product(was + (int64_t)eids[j] * K * M, xi + (int64_t)j * K, K, M, 1);
        assert_close_nmse(got + (int64_t)j * M, want, M, 1e-7);
        free(want);
    }
    free(got);
    free(wa);
    free(was);
    free(xi);
    bp_buffer_free(buf);
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

/* Whether there is a GPU to test on, asked in a throwaway child: CUDA cannot be used in a
 * process forked after it was initialised, and Check forks every test from this process, so
 * this one must never load the CUDA plugin itself. Returns true, or false with the reason. */
static bool gpu_available(char *why, size_t size)
{
    int fds[2];
    snprintf(why, size, "could not ask a child process");
    if (pipe(fds) != 0)
        return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return false;
    }
    if (pid == 0) {
        close(fds[0]);
        bp_plugin_load_all();
        bp_registry *reg = bp_registry_by_name("CUDA");
        const bool have = reg != NULL && bp_registry_get_device_count(reg) > 0;
        const char *msg = "the CUDA plugin did not load";
        for (size_t i = 0; i < bp_plugin_report_count(); i++)
            if (strstr(bp_plugin_report_get(i)->path, "backplane-cuda") != NULL)
                msg = bp_plugin_report_get(i)->message;
        if (write(fds[1], msg, strlen(msg)) < 0)
            _exit(2);
        _exit(have ? 0 : 1);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], why, size - 1);
    why[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s:%s", getenv("BP_TEST_CUDA_PLUGIN_DIR"),
             getenv("BP_TEST_CPU_PLUGIN_DIR"), getenv("BP_TEST_META_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    char why[1024];
    if (!gpu_available(why, sizeof(why))) {
        printf("SKIP: no GPU to test on (%s)\n", why);
        return 77;
    }
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("conformance");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_case, 0, conf_n_cases);
    suite_add_tcase(s, tc);
    TCase *t2 = tcase_create("device");
    tcase_add_checked_fixture(t2, setup, teardown);
    tcase_set_timeout(t2, 120);
    tcase_add_test(t2, test_device);
    tcase_add_test(t2, test_buffers_and_copies);
    tcase_add_test(t2, test_async_and_events);
    tcase_add_test(t2, test_row_id_out_of_range);
    tcase_add_test(t2, test_scheduler_with_cpu);
    tcase_add_test(t2, test_meta_over_cuda);
    tcase_add_test(t2, test_nccl_allreduce);
    suite_add_tcase(s, t2);
    TCase *t3 = tcase_create("weight types");
    tcase_add_checked_fixture(t3, setup, teardown);
    tcase_set_timeout(t3, 120);
    tcase_add_loop_test(t3, test_weight_type, 0, (int)(sizeof(wtypes_q) / sizeof(wtypes_q[0])));
    suite_add_tcase(s, t3);
    return bp_test_run(s);
}
