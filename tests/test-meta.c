/* test-meta.c - the meta plugin over the CPU plugin's devices (BP_CPU_DEVICES=3): a transformer
 * forward pass on Meta(CPU0,CPU1) and Meta(CPU0,CPU1,CPU2) must equal the same graph on one
 * CPU backend, with even, uneven and empty slices, with and without the CPU collectives, and
 * inside a scheduler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/bp-meta.h>

#include "test-util.h"
#include "tf-model.h"

static bp_backend *cpu;

static void setup(void)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_META_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    setenv("BP_CPU_DEVICES", "3", 1);
    cpu = bp_backend_init_by_name("CPU0", "threads=1");
    ck_assert_plugins(cpu != NULL, "%s", bp_last_error());
}

static void teardown(void)
{
    bp_backend_free(cpu);
}

static const struct tf_config tiny = {.n_layer = 2, .n_embd = 48, .n_ff = 96, .n_head = 6,
                                      .n_vocab = 40, .n_tok = 5, .wtype = BP_TYPE_F32};

/* Logits of one forward pass with weights and activations in be's buffers (sched: through a
 * scheduler over be and the CPU instead). */
static float *run(bp_backend *be, const struct tf_config *cfg, bool sched)
{
    bp_buffer_type *buft = bp_backend_get_default_buffer_type(be);
    struct model m;
    model_init(&m, cfg, buft);
    bp_context *ctx = bp_context_new(tf_graph_n_tensors(cfg));
    struct tf_graph tg;
    ck_assert(tf_build(ctx, cfg, &m.w, &tg));
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(cfg) + tf_weights_n_tensors(cfg));
    ck_assert_int_eq(bp_graph_build_forward(g, tg.logits), BP_OK);
    bp_sched *s = NULL;
    bp_buffer *abuf = NULL;
    if (sched) {
        bp_backend *bes[2] = {be, cpu};
        s = bp_sched_new(bes, NULL, 2, 4096, false);
        ck_assert_msg(s != NULL, "%s", bp_last_error());
        ck_assert_msg(bp_sched_alloc_graph(s, g) == BP_OK, "%s", bp_last_error());
    } else {
        abuf = bp_alloc_ctx_tensors(ctx, buft);
        ck_assert_msg(abuf != NULL, "%s", bp_last_error());
    }
    set_inputs(&tg, cfg, 0);
    enum bp_status st = s ? bp_sched_graph_compute(s, g) : bp_backend_graph_compute(be, g);
    ck_assert_msg(st == BP_OK, "%s", bp_last_error());
    const size_t bytes = bp_nbytes(tg.logits);
    float *out = malloc(bytes);
    ck_assert_int_eq(bp_tensor_get(tg.logits, out, 0, bytes), BP_OK);
    bp_sched_free(s);
    bp_buffer_free(abuf);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    return out;
}

static void check_against_cpu(bp_backend *meta, const struct tf_config *cfg, bool sched)
{
    float *ref = run(cpu, cfg, false);
    float *got = run(meta, cfg, sched);
    assert_close_nmse(got, ref, (int64_t)cfg->n_vocab * cfg->n_tok, 1e-10);
    free(ref);
    free(got);
}

static bp_backend *meta_by_name(const char *name)
{
    bp_backend *b = bp_backend_init_by_name(name, "threads=1");
    ck_assert_msg(b != NULL, "%s: %s", name, bp_last_error());
    return b;
}

START_TEST(test_two_devices)
{
    bp_backend *m = meta_by_name("Meta(CPU0,CPU1)");
    ck_assert_str_eq(bp_device_get_name(bp_backend_get_device(m)), "Meta(CPU0,CPU1)");
    check_against_cpu(m, &tiny, false);
    bp_backend_free(m);
}
END_TEST

START_TEST(test_three_devices)
{
    bp_backend *m = meta_by_name("Meta(CPU0, CPU1, CPU2)");
    check_against_cpu(m, &tiny, false);
    /* one token: decoding shapes */
    struct tf_config one = tiny;
    one.n_tok = 1;
    check_against_cpu(m, &one, false);
    bp_backend_free(m);
}
END_TEST

START_TEST(test_generic_fallback)
{
    setenv("BP_META_NO_COMM", "1", 1);
    bp_backend *m = meta_by_name("Meta(CPU0,CPU1,CPU2)");
    check_against_cpu(m, &tiny, false);
    bp_backend_free(m);
    unsetenv("BP_META_NO_COMM");
}
END_TEST

/* 3:1 over the output rows (axis 1 of the weight), or all on the first device. */
static bool uneven(const bp_tensor *w, int n, struct bp_meta_split *out, void *user)
{
    const int mode = *(const int *)user;
    memset(out, 0, sizeof(*out));
    out->state = BP_META_SPLIT;
    out->axis = 1;
    const int64_t rows = w->ne[1];
    if (mode == 0) {
        out->sizes[0] = rows * 3 / 4;
        out->sizes[1] = rows - out->sizes[0];
    } else {
        out->sizes[0] = rows;
        for (int p = 1; p < n; p++)
            out->sizes[p] = 0;
    }
    return true;
}

START_TEST(test_uneven_and_empty_slices)
{
    bp_device *parts[3] = {bp_device_by_name("CPU0"), bp_device_by_name("CPU1"),
                           bp_device_by_name("CPU2")};
    ck_assert(parts[0] && parts[1] && parts[2]);
    static int mode0 = 0, mode1 = 1;
    bp_device *d = bp_meta_device_new(parts, 2, uneven, &mode0);
    ck_assert_msg(d != NULL, "%s", bp_last_error());
    bp_backend *m = bp_device_init_backend(d, "threads=1");
    ck_assert_msg(m != NULL, "%s", bp_last_error());
    check_against_cpu(m, &tiny, false);
    bp_backend_free(m);

    d = bp_meta_device_new(parts, 3, uneven, &mode1);
    ck_assert_msg(d != NULL, "%s", bp_last_error());
    m = bp_device_init_backend(d, "threads=1");
    ck_assert_msg(m != NULL, "%s", bp_last_error());
    check_against_cpu(m, &tiny, false);
    bp_backend_free(m);
}
END_TEST

/* Megatron by name and shape: attention q/k/v and the MLP's gate/up ([n_embd, n_ff]) split on
 * their output rows, the attention output and the MLP's down ([n_ff, n_embd]) on their input
 * columns; embeddings, the output projection and norms stay whole. */
static bool megatron(const bp_tensor *w, int n, struct bp_meta_split *out, void *user)
{
    (void)user;
    const bool named_rows = strstr(w->name, ".wq") || strstr(w->name, ".wk") ||
                            strstr(w->name, ".wv");
    const bool gate_up = w->name[0] == '\0' && w->ne[0] == 48 && w->ne[1] == 96;
    const bool down = w->name[0] == '\0' && w->ne[0] == 96 && w->ne[1] == 48;
    const bool cols = strstr(w->name, ".wo") != NULL || down;
    if (!named_rows && !gate_up && !cols)
        return false;
    memset(out, 0, sizeof(*out));
    out->state = BP_META_SPLIT;
    out->axis = cols ? 0 : 1;
    /* halves: 24 of 48 is three whole heads of 8 */
    const int64_t ne = w->ne[out->axis];
    for (int p = 0; p < n; p++)
        out->sizes[p] = ne / n;
    out->sizes[n - 1] += ne % n;
    return true;
}

/* Weights the callback splits are stored as slices: each part holds about half the model, a
 * transformer computes the same, and the weights read back (and compute) whole. */
START_TEST(test_weights_stored_as_slices)
{
    bp_device *parts[2] = {bp_device_by_name("CPU0"), bp_device_by_name("CPU1")};
    bp_device *d = bp_meta_device_new(parts, 2, megatron, NULL);
    ck_assert_msg(d != NULL, "%s", bp_last_error());
    bp_backend *m = bp_device_init_backend(d, "threads=1");
    ck_assert_msg(m != NULL, "%s", bp_last_error());
    check_against_cpu(m, &tiny, false);

    bp_meta_buffer_part_bytes_fn part_bytes = (bp_meta_buffer_part_bytes_fn)
        bp_registry_get_proc_address(bp_registry_by_name("Meta"), "bp_meta_buffer_part_bytes");
    ck_assert_ptr_nonnull(part_bytes);
    struct model mod;
    model_init(&mod, &tiny, bp_backend_get_default_buffer_type(m));
    const size_t full = bp_buffer_get_size(mod.wbuf);
    const size_t b0 = part_bytes(mod.wbuf, 0), b1 = part_bytes(mod.wbuf, 1);
    /* 46,080 of 50,160 floats are split matrices: each part holds 27,120 floats, 54 % */
    ck_assert_msg(b0 < full * 6 / 10 && b1 < full * 6 / 10, "parts hold %zu and %zu of %zu bytes",
                  b0, b1, full);
    ck_assert_msg(b0 + b1 > full, "the whole tensors are on both parts");
    model_free(&mod);

    /* One column-split weight: set whole, read whole, computed on whole where a graph needs it;
     * and written in rows, as loaders do. */
    bp_context *wctx = bp_context_new(2);
    bp_tensor *w = bp_new_tensor_2d(wctx, BP_TYPE_F32, 96, 48); /* a down projection */
    bp_buffer *wb = bp_alloc_ctx_tensors(wctx, bp_backend_get_default_buffer_type(m));
    bp_buffer_set_usage(wb, BP_BUFFER_USAGE_WEIGHTS);
    static float in[96 * 48], out[96 * 48];
    for (int i = 0; i < 96 * 48; i++)
        in[i] = (float)(i % 97) - 48.0f;
    for (int r = 0; r < 48; r++)
        ck_assert_int_eq(bp_tensor_set(w, in + r * 96, (size_t)r * w->nb[1], w->nb[1]), BP_OK);
    ck_assert_uint_eq(part_bytes(wb, 0), 48 * 48 * 4);
    ck_assert_int_eq(bp_tensor_get(w, out, 0, sizeof(out)), BP_OK);
    ck_assert_mem_eq(in, out, sizeof(in));
    bp_clear_error();
    ck_assert_int_eq(bp_tensor_set(w, in, 4, 8), BP_ERR_INVALID_ARG); /* not whole rows */
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "whole rows"));
    bp_context *ctx = bp_context_new(4);
    bp_tensor *y = bp_scale(ctx, w, 2.0f); /* wants it whole: a copy for the computation */
    bp_buffer *yb = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(m));
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    ck_assert_msg(bp_backend_graph_compute(m, g) == BP_OK, "%s", bp_last_error());
    ck_assert_int_eq(bp_tensor_get(y, out, 0, sizeof(out)), BP_OK);
    for (int i = 0; i < 96 * 48; i++)
        ck_assert(out[i] == 2.0f * in[i]);
    ck_assert_int_eq(bp_tensor_get(w, out, 0, sizeof(out)), BP_OK); /* still in slices */
    ck_assert_mem_eq(in, out, sizeof(in));
    ck_assert_uint_eq(part_bytes(wb, 1), 48 * 48 * 4);
    bp_graph_free(g);
    bp_buffer_free(yb);
    bp_context_free(ctx);
    /* A view into the sliced weight (rows 8.. of it) is no part's slice: refused with the
     * reason, for computations, reads and writes alike; the weight itself is untouched. */
    ctx = bp_context_new(4);
    bp_tensor *v = bp_view_2d(ctx, w, 96, 8, w->nb[1], 8 * w->nb[1]);
    y = bp_scale(ctx, v, 2.0f);
    yb = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(m));
    g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    ck_assert_int_eq(bp_backend_graph_compute(m, g), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "stores in slices"));
    ck_assert_int_eq(bp_tensor_get(v, out, 0, bp_nbytes(v)), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "a read of"));
    ck_assert_int_eq(bp_tensor_set(v, in, 0, bp_nbytes(v)), BP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "a write of"));
    ck_assert_int_eq(bp_tensor_get(w, out, 0, sizeof(out)), BP_OK);
    ck_assert_mem_eq(in, out, sizeof(in));
    bp_graph_free(g);
    bp_buffer_free(yb);
    bp_context_free(ctx);

    /* A Q8_0 slice (rows of "blk.0.wq") lives in the part's repacked layout where the CPU
     * variant has one: it reads back as written, and an op other than a product of it either
     * computes right (plain layout) or is refused with the reason, never run on the
     * interleaved bytes. */
    bp_context *qctx = bp_context_new(1);
    bp_tensor *q = bp_set_name(bp_new_tensor_2d(qctx, BP_TYPE_Q8_0, 64, 48), "blk.0.wq");
    bp_buffer *qb = bp_alloc_ctx_tensors(qctx, bp_backend_get_default_buffer_type(m));
    bp_buffer_set_usage(qb, BP_BUFFER_USAGE_WEIGHTS);
    static char qin[48 * 68], qout[48 * 68];
    for (size_t i = 0; i < sizeof(qin); i++)
        qin[i] = (char)(i % 68 < 2 ? (i % 68 ? 0x20 : 0x00) : (int)(i * 7 % 251) - 125);
    ck_assert_int_eq(bp_tensor_set(q, qin, 0, sizeof(qin)), BP_OK);
    ck_assert_uint_lt(part_bytes(qb, 0), sizeof(qin));
    ck_assert_int_eq(bp_tensor_get(q, qout, 0, sizeof(qout)), BP_OK);
    ck_assert_mem_eq(qin, qout, sizeof(qin));
    ctx = bp_context_new(4);
    y = bp_cont(ctx, q);
    yb = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(m));
    g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    const enum bp_status cst = bp_backend_graph_compute(m, g);
    if (cst == BP_OK) {
        ck_assert_int_eq(bp_tensor_get(y, qout, 0, sizeof(qout)), BP_OK);
        ck_assert_mem_eq(qin, qout, sizeof(qin));
    } else {
        ck_assert_int_eq(cst, BP_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(bp_last_error(), "layout of its own"));
    }
    bp_graph_free(g);
    bp_buffer_free(yb);
    bp_context_free(ctx);
    bp_buffer_free(qb);
    bp_context_free(qctx);

    /* A Q4_K slice, whose repacked layout (where the variant has it) widens its scales: it
     * reads back as written, and after a clear of its buffer as the value. */
    bp_context *kctx = bp_context_new(1);
    bp_tensor *kq = bp_set_name(bp_new_tensor_2d(kctx, BP_TYPE_Q4_K, 256, 48), "blk.0.wq");
    bp_buffer *kb = bp_alloc_ctx_tensors(kctx, bp_backend_get_default_buffer_type(m));
    bp_buffer_set_usage(kb, BP_BUFFER_USAGE_WEIGHTS);
    static unsigned char kin[48 * 144], kout[48 * 144];
    for (size_t i = 0; i < sizeof(kin); i++)
        kin[i] = (unsigned char)(i * 37 % 251);
    ck_assert_int_eq(bp_tensor_set(kq, kin, 0, sizeof(kin)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(kq, kout, 0, sizeof(kout)), BP_OK);
    ck_assert_mem_eq(kin, kout, sizeof(kin));
    ck_assert_int_eq(bp_buffer_clear(kb, 0xc3), BP_OK);
    ck_assert_int_eq(bp_tensor_get(kq, kout, 0, sizeof(kout)), BP_OK);
    for (size_t i = 0; i < sizeof(kout); i++)
        ck_assert_uint_eq(kout[i], 0xc3);
    bp_buffer_free(kb);
    bp_context_free(kctx);
    bp_buffer_free(wb);
    bp_context_free(wctx);
    bp_backend_free(m);
}
END_TEST

START_TEST(test_in_scheduler)
{
    bp_backend *m = meta_by_name("Meta(CPU1,CPU2)");
    check_against_cpu(m, &tiny, true);
    bp_backend_free(m);
}
END_TEST

START_TEST(test_tensor_roundtrip)
{
    bp_backend *m = meta_by_name("Meta(CPU0,CPU1)");
    bp_context *ctx = bp_context_new(4);
    bp_tensor *t = bp_new_tensor_2d(ctx, BP_TYPE_F32, 7, 5);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(m));
    ck_assert_ptr_nonnull(buf);
    float in[35], out[35];
    for (int i = 0; i < 35; i++)
        in[i] = (float)i * 0.5f - 3.0f;
    ck_assert_int_eq(bp_tensor_set(t, in, 0, sizeof(in)), BP_OK);
    ck_assert_int_eq(bp_tensor_get(t, out, 0, sizeof(out)), BP_OK);
    ck_assert_mem_eq(in, out, sizeof(in));
    /* a sub-range */
    memset(out, 0, sizeof(out));
    ck_assert_int_eq(bp_tensor_get(t, out, 12, 20), BP_OK);
    ck_assert_mem_eq(in + 3, out, 20);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(m);
}
END_TEST

START_TEST(test_device_identity_and_props)
{
    bp_device *parts[2] = {bp_device_by_name("CPU0"), bp_device_by_name("CPU1")};
    bp_device *a = bp_meta_device_new(parts, 2, NULL, NULL);
    bp_device *b = bp_meta_device_new(parts, 2, NULL, NULL);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_eq(a, b);
    bp_backend *m = meta_by_name("meta(CPU0,CPU1)");
    ck_assert_ptr_eq(bp_backend_get_device(m), a);
    bp_device *swapped[2] = {parts[1], parts[0]};
    ck_assert_ptr_ne(bp_meta_device_new(swapped, 2, NULL, NULL), a);
    /* memory is the sum of the parts */
    size_t f0, t0, f1, t1, fm, tm;
    bp_device_get_memory(parts[0], &f0, &t0);
    bp_device_get_memory(parts[1], &f1, &t1);
    bp_device_get_memory(a, &fm, &tm);
    ck_assert_uint_eq(tm, t0 + t1);
    ck_assert_int_eq(bp_device_get_type(a), BP_DEVICE_TYPE_META);
    /* a meta device is not a part of another */
    bp_device *nested[2] = {a, parts[0]};
    ck_assert_ptr_null(bp_meta_device_new(nested, 2, NULL, NULL));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "meta device"));
    bp_backend_free(m);
}
END_TEST

START_TEST(test_errors)
{
    ck_assert_ptr_null(bp_backend_init_by_name("Meta(CPU0,NOPE7)", NULL));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "NOPE7"));
    ck_assert_ptr_null(bp_backend_init_by_name("Meta(CPU0", NULL));
    ck_assert(strlen(bp_last_error()) > 0);
    bp_device *none[1] = {NULL};
    ck_assert_ptr_null(bp_meta_device_new(none, 0, NULL, NULL));
    ck_assert(strlen(bp_last_error()) > 0);

    /* a graph whose tensors live elsewhere is refused, not computed */
    bp_backend *m = meta_by_name("Meta(CPU0,CPU1)");
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *b = bp_add(ctx, a, a);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type());
    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, b), BP_OK);
    ck_assert_int_ne(bp_backend_graph_compute(m, g), BP_OK);
    ck_assert(strlen(bp_last_error()) > 0);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(m);
}
END_TEST

/* The answer a test wants the split callback to give, changeable between calls. */
struct answer {
    bool decline; /* return false: the default policy */
    int state, axis;
    int64_t sizes[2];
};

static bool scripted(const bp_tensor *w, int n, struct bp_meta_split *out, void *user)
{
    const struct answer *a = user;
    (void)w;
    (void)n;
    if (a->decline)
        return false;
    out->state = (enum bp_meta_state)a->state;
    out->axis = a->axis;
    out->sizes[0] = a->sizes[0];
    out->sizes[1] = a->sizes[1];
    return true;
}

/* Writes a weight of `type` [ne0, ne1] named "w" into a fresh weights buffer of d; the status
 * of the write, where the callback is asked how to store it. */
static enum bp_status store_weight(bp_device *d, enum bp_type type, int64_t ne0, int64_t ne1,
                                   bp_context **ctx, bp_buffer **buf, bp_tensor **w)
{
    *ctx = bp_context_new(2);
    *w = bp_new_tensor_2d(*ctx, type, ne0, ne1);
    bp_set_name(*w, "w");
    *buf = bp_alloc_ctx_tensors(*ctx, bp_device_get_buffer_type(d));
    ck_assert_msg(*buf != NULL, "%s", bp_last_error());
    bp_buffer_set_usage(*buf, BP_BUFFER_USAGE_WEIGHTS);
    void *zero = calloc(1, bp_nbytes(*w));
    bp_clear_error();
    enum bp_status st = bp_tensor_set(*w, zero, 0, bp_nbytes(*w));
    free(zero);
    return st;
}

/* An answer the callback gives for a weight is checked before the weight is stored: 55+48 for
 * 96 rows, a negative size, an axis that does not exist, PARTIAL, and part of a Q4_0 block are
 * refused with a message naming the weight, the axis and the sizes; good answers still work. */
START_TEST(test_split_answers_checked_when_stored)
{
    bp_device *parts[2] = {bp_device_by_name("CPU0"), bp_device_by_name("CPU1")};
    static struct answer ans;
    bp_device *d = bp_meta_device_new(parts, 2, scripted, &ans);
    ck_assert_msg(d != NULL, "%s", bp_last_error());
    static const struct {
        enum bp_type type;
        int state, axis;
        int64_t s0, s1;
        const char *needles[4];
    } bad[] = {
        {BP_TYPE_F32, BP_META_SPLIT, 1, 55, 48, {"'w'", "sizes 55+48 on axis 1", "sum to 103",
                                                 "ne[1] = 96"}},
        {BP_TYPE_F32, BP_META_SPLIT, 1, 100, -4, {"'w'", "sizes 100+-4 on axis 1", "negative",
                                                  "part 1"}},
        {BP_TYPE_F32, BP_META_SPLIT, 1, 0, 95, {"'w'", "sum to 95", "ne[1] = 96",
                                                "f32 [48, 96, 1, 1]"}},
        {BP_TYPE_F32, BP_META_SPLIT, 4, 48, 48, {"'w'", "axis 4", "0..3", "invalid"}},
        {BP_TYPE_F32, BP_META_SPLIT, -1, 48, 48, {"'w'", "axis -1", "0..3", "invalid"}},
        {BP_TYPE_F32, BP_META_PARTIAL, 1, 48, 48, {"'w'", "PARTIAL", "state 2", "invalid"}},
        {BP_TYPE_F32, 7, 1, 48, 48, {"'w'", "state 7", "BP_META_SPLIT", "invalid"}},
        {BP_TYPE_Q4_0, BP_META_SPLIT, 0, 16, 48, {"'w'", "q4_0 [64, 96, 1, 1]",
                                                  "sizes 16+48 on axis 0", "whole blocks of 32"}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ans = (struct answer){false, bad[i].state, bad[i].axis, {bad[i].s0, bad[i].s1}};
        bp_context *ctx;
        bp_buffer *buf;
        bp_tensor *w;
        const int64_t ne0 = bad[i].type == BP_TYPE_Q4_0 ? 64 : 48;
        ck_assert_int_eq(store_weight(d, bad[i].type, ne0, 96, &ctx, &buf, &w),
                         BP_ERR_INVALID_ARG);
        for (int k = 0; k < 4; k++)
            ck_assert_msg(strstr(bp_last_error(), bad[i].needles[k]) != NULL,
                          "case %zu: '%s' does not mention '%s'", i, bp_last_error(),
                          bad[i].needles[k]);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }

    /* Good answers: whole blocks of Q4_0 columns, rows with an empty part, MIRRORED. */
    bp_meta_buffer_part_bytes_fn part_bytes = (bp_meta_buffer_part_bytes_fn)
        bp_registry_get_proc_address(bp_registry_by_name("Meta"), "bp_meta_buffer_part_bytes");
    static const struct answer good[] = {
        {false, BP_META_SPLIT, 0, {32, 32}},
        {false, BP_META_SPLIT, 1, {96, 0}},
        {false, BP_META_MIRRORED, 0, {0, 0}},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ans = good[i];
        bp_context *ctx;
        bp_buffer *buf;
        bp_tensor *w;
        ck_assert_msg(store_weight(d, BP_TYPE_Q4_0, 64, 96, &ctx, &buf, &w) == BP_OK,
                      "case %zu: %s", i, bp_last_error());
        const size_t whole = bp_nbytes(w);
        const size_t expect0 = i == 0 ? whole / 2 : whole, expect1 = i == 0 ? whole / 2
                                                                 : i == 1 ? 0 : whole;
        ck_assert_uint_eq(part_bytes(buf, 0), expect0);
        ck_assert_uint_eq(part_bytes(buf, 1), expect1);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
}
END_TEST

/* The callback is asked again when a product uses a weight stored whole: a bad answer then
 * fails the computation (it used to be computed with slices that overran the weight). */
START_TEST(test_split_answers_checked_when_computed)
{
    bp_device *parts[2] = {bp_device_by_name("CPU0"), bp_device_by_name("CPU1")};
    static struct answer ans = {.decline = true};
    bp_device *d = bp_meta_device_new(parts, 2, scripted, &ans);
    ck_assert_msg(d != NULL, "%s", bp_last_error());
    bp_backend *m = bp_device_init_backend(d, "threads=1");
    ck_assert_msg(m != NULL, "%s", bp_last_error());
    bp_context *wctx;
    bp_buffer *wbuf;
    bp_tensor *w;
    ck_assert_int_eq(store_weight(d, BP_TYPE_F32, 48, 96, &wctx, &wbuf, &w), BP_OK);

    bp_context *ctx = bp_context_new(4);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 48, 3);
    bp_tensor *y = bp_mul_mat(ctx, w, x);
    bp_buffer *abuf = bp_alloc_ctx_tensors(ctx, bp_device_get_buffer_type(d));
    ck_assert_ptr_nonnull(abuf);
    static float xs[48 * 3];
    ck_assert_int_eq(bp_tensor_set(x, xs, 0, sizeof(xs)), BP_OK);
    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, y), BP_OK);

    ans = (struct answer){false, BP_META_SPLIT, 1, {55, 48}};
    bp_clear_error();
    ck_assert_int_eq(bp_backend_graph_compute(m, g), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "sizes 55+48 on axis 1 sum to 103, not to ne[1] = 96");
    ck_assert_error_has(BP_ERR_INVALID_ARG, "'w'");
    ans = (struct answer){false, BP_META_SPLIT, 9, {48, 48}};
    ck_assert_int_eq(bp_backend_graph_compute(m, g), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "axis 9");
    /* a good answer computes */
    ans = (struct answer){false, BP_META_SPLIT, 1, {50, 46}};
    ck_assert_msg(bp_backend_graph_compute(m, g) == BP_OK, "%s", bp_last_error());

    bp_graph_free(g);
    bp_buffer_free(abuf);
    bp_context_free(ctx);
    bp_buffer_free(wbuf);
    bp_context_free(wctx);
    bp_backend_free(m);
}
END_TEST

/* Meta names are parsed whole, with no length limit: nothing past 256 bytes is dropped, and
 * empty items, junk after ')', nesting and a device listed twice are errors. */
START_TEST(test_name_parsing)
{
    char *name = malloc(1024);
    /* 300 spaces: the device after them is still looked up (it used to be cut off) */
    snprintf(name, 1024, "Meta(CPU0,%300sNOPE0)", "");
    ck_assert_rejected(bp_backend_init_by_name(name, NULL), BP_ERR_NOT_FOUND, "'NOPE0'");
    snprintf(name, 1024, "Meta(CPU0,%300sCPU1 )", "");
    bp_backend *m = bp_backend_init_by_name(name, "threads=1");
    ck_assert_msg(m != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_device_get_name(bp_backend_get_device(m)), "Meta(CPU0,CPU1)");
    bp_backend_free(m);
    /* 300 commas: empty items (they used to hide the rest of the name) */
    memcpy(name, "Meta(CPU0", 9);
    memset(name + 9, ',', 300);
    strcpy(name + 309, "NOPE0)");
    ck_assert_rejected(bp_backend_init_by_name(name, NULL), BP_ERR_INVALID_ARG, "device 2 of");
    ck_assert_error_has(BP_ERR_INVALID_ARG, "is empty");
    free(name);

    static const struct {
        const char *name, *needle;
    } bad[] = {
        {"Meta(CPU0,CPU1)junk", "'junk' after the closing parenthesis"},
        {"Meta(CPU0,CPU1) ", "' ' after the closing parenthesis"},
        {"Meta(CPU0,CPU1))", "')' after the closing parenthesis"},
        {"Meta(CPU0,,CPU1)", "device 2 of 'Meta(CPU0,,CPU1)' is empty"},
        {"Meta(,CPU0)", "device 1 of 'Meta(,CPU0)' is empty"},
        {"Meta(CPU0,)", "device 2 of 'Meta(CPU0,)' is empty"},
        {"Meta( , CPU0)", "is empty"},
        {"Meta()", "'Meta()' names no devices"},
        {"Meta(  )", "names no devices"},
        {"Meta(CPU0", "no closing parenthesis"},
        {"Meta(CPU0,CPU0)", "device 'CPU0' is listed twice (parts 0 and 1)"},
        {"Meta(CPU0,CPU1,cpu0)", "device 'CPU0' is listed twice (parts 0 and 2)"},
        {"Meta(Meta(CPU0),CPU1)", "cannot be a part of another"},
        {"Meta(CPU0,CPU1,CPU2,CPU0,CPU1,CPU2,CPU0,CPU1,CPU2,CPU0,CPU1,CPU2,CPU0,CPU1,CPU2,CPU0,"
         "CPU1)", "more than 16 devices"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_rejected(bp_backend_init_by_name(bad[i].name, NULL), BP_ERR_INVALID_ARG,
                           bad[i].needle);
    /* The proc address itself, called directly */
    typedef bp_backend *(*init_by_name_fn)(const char *, const char *);
    init_by_name_fn init = (init_by_name_fn)bp_registry_get_proc_address(
        bp_registry_by_name("Meta"), "bp_meta_init_by_name");
    ck_assert_ptr_nonnull(init);
    ck_assert_rejected(init(NULL, NULL), BP_ERR_INVALID_ARG, "name is NULL");
    ck_assert_rejected(init("CPU0", NULL), BP_ERR_INVALID_ARG, "not of the form Meta(A,B,...)");
}
END_TEST

static size_t devices_named(const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < bp_device_count(); i++)
        n += strcmp(bp_device_get_name(bp_device_get(i)), name) == 0;
    return n;
}

/* Counts the weights it is asked about (user: an int); keeps the default policy. */
static bool counting(const bp_tensor *w, int n, struct bp_meta_split *out, void *user)
{
    (void)w;
    (void)n;
    (void)out;
    (*(int *)user)++;
    return false;
}

/* Writes one weight through a buffer of d; the weight is asked about when it is first written. */
static void write_weight(bp_device *d)
{
    bp_context *c = bp_context_new(1);
    bp_tensor *w = bp_new_tensor_2d(c, BP_TYPE_F32, 32, 8);
    bp_buffer *b = bp_alloc_ctx_tensors(c, bp_device_get_buffer_type(d));
    ck_assert_msg(b != NULL, "%s", bp_last_error());
    bp_buffer_set_usage(b, BP_BUFFER_USAGE_WEIGHTS);
    static const float zeros[32 * 8];
    ck_assert_int_eq(bp_tensor_set(w, zeros, 0, sizeof(zeros)), BP_OK);
    bp_buffer_free(b);
    bp_context_free(c);
}

/* Meta devices are keyed by (parts in order, callback, user data), as ggml keys them: the same
 * key gives the same device, whichever way it is asked for; another callback or user data gives
 * another device over the same parts, of the same name, with its own policy. No callback is the
 * default policy, the one names make. */
START_TEST(test_one_device_per_policy)
{
    bp_device *parts[2] = {bp_device_by_name("CPU0"), bp_device_by_name("CPU1")};
    static int count0 = 0, count1 = 0;
    bp_device *d = bp_meta_device_new(parts, 2, counting, &count0);
    ck_assert_msg(d != NULL, "%s", bp_last_error());
    ck_assert_ptr_eq(bp_meta_device_new(parts, 2, counting, &count0), d);
    bp_device *dflt = bp_meta_device_new(parts, 2, NULL, NULL);
    ck_assert_msg(dflt != NULL, "%s", bp_last_error());
    ck_assert_ptr_ne(dflt, d);
    static int ignored;
    ck_assert_ptr_eq(bp_meta_device_new(parts, 2, NULL, &ignored), dflt); /* no callback */
    bp_backend *m = meta_by_name("META(cpu0, cpu1)");
    ck_assert_ptr_eq(bp_backend_get_device(m), dflt);
    bp_backend_free(m);
    bp_device *other_user = bp_meta_device_new(parts, 2, counting, &count1);
    bp_device *other_fn = bp_meta_device_new(parts, 2, megatron, &count0);
    ck_assert_msg(other_user != NULL && other_fn != NULL, "%s", bp_last_error());
    ck_assert_ptr_ne(other_user, d);
    ck_assert_ptr_ne(other_user, dflt);
    ck_assert_ptr_ne(other_fn, d);
    ck_assert_ptr_ne(other_fn, other_user);
    ck_assert_ptr_eq(bp_meta_device_new(parts, 2, counting, &count1), other_user);
    ck_assert_uint_eq(devices_named("Meta(CPU0,CPU1)"), 4);
    ck_assert_str_eq(bp_device_get_name(other_user), "Meta(CPU0,CPU1)");

    /* Each device stores its weights by its own policy: only its callback is asked. */
    write_weight(d);
    ck_assert_int_eq(count0, 1);
    ck_assert_int_eq(count1, 0);
    write_weight(other_user);
    ck_assert_int_eq(count0, 1);
    ck_assert_int_eq(count1, 1);
    write_weight(dflt);
    ck_assert_int_eq(count0 + count1, 2);

    /* Made by name first (the default policy): a callback makes another device beside it. */
    bp_device *pair[2] = {parts[1], bp_device_by_name("CPU2")};
    m = meta_by_name("Meta(CPU1,CPU2)");
    ck_assert_ptr_eq(bp_meta_device_new(pair, 2, NULL, NULL), bp_backend_get_device(m));
    bp_device *with_policy = bp_meta_device_new(pair, 2, megatron, NULL);
    ck_assert_msg(with_policy != NULL, "%s", bp_last_error());
    ck_assert_ptr_ne(with_policy, bp_backend_get_device(m));
    ck_assert_uint_eq(devices_named("Meta(CPU1,CPU2)"), 2);
    bp_backend_free(m);
    /* The same parts in another order are another device. */
    bp_device *swapped[2] = {parts[1], parts[0]};
    bp_device *s = bp_meta_device_new(swapped, 2, NULL, NULL);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_device_get_name(s), "Meta(CPU1,CPU0)");
}
END_TEST

/* Every argument of the public entry points is checked, and the message says which. */
START_TEST(test_arguments_checked)
{
    bp_device *cpu0 = bp_device_by_name("CPU0"), *cpu1 = bp_device_by_name("CPU1");
    ck_assert_rejected(bp_meta_device_new(NULL, 2, NULL, NULL), BP_ERR_INVALID_ARG,
                       "the device array is NULL");
    bp_device *with_null[2] = {cpu0, NULL};
    ck_assert_rejected(bp_meta_device_new(with_null, 2, NULL, NULL), BP_ERR_INVALID_ARG,
                       "device 1 of 2 is NULL");
    bp_device *parts[17];
    for (int i = 0; i < 17; i++)
        parts[i] = cpu0;
    ck_assert_rejected(bp_meta_device_new(parts, 0, NULL, NULL), BP_ERR_INVALID_ARG,
                       "need 1 to 16 devices, got 0");
    ck_assert_rejected(bp_meta_device_new(parts, 17, NULL, NULL), BP_ERR_INVALID_ARG,
                       "need 1 to 16 devices, got 17");
    ck_assert_rejected(bp_meta_device_new(parts, 2, NULL, NULL), BP_ERR_INVALID_ARG,
                       "device 'CPU0' is listed twice (parts 0 and 1)");
    bp_device *pair[2] = {cpu0, cpu1};
    bp_device *md = bp_meta_device_new(pair, 2, NULL, NULL);
    ck_assert_ptr_nonnull(md);
    bp_device *nested[2] = {cpu1, md};
    ck_assert_rejected(bp_meta_device_new(nested, 2, NULL, NULL), BP_ERR_INVALID_ARG,
                       "device 1 ('Meta(CPU0,CPU1)') is itself a meta device");

    bp_registry *reg = bp_registry_by_name("Meta");
    bp_meta_backend_stats_fn stats =
        (bp_meta_backend_stats_fn)bp_registry_get_proc_address(reg, "bp_meta_backend_stats");
    bp_meta_buffer_part_bytes_fn part_bytes = (bp_meta_buffer_part_bytes_fn)
        bp_registry_get_proc_address(reg, "bp_meta_buffer_part_bytes");
    ck_assert(stats != NULL && part_bytes != NULL);
    bp_clear_error();
    ck_assert_int_eq(stats(NULL, NULL, NULL), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "backend is NULL");
    ck_assert_int_eq(stats(cpu, NULL, NULL), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "is not a meta backend");
    bp_clear_error();
    ck_assert_uint_eq(part_bytes(NULL, 0), 0);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "buffer is NULL");
    bp_buffer *hb = bp_buffer_type_alloc(bp_host_buffer_type(), 64);
    ck_assert_uint_eq(part_bytes(hb, 0), 0);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "not a meta device's buffer");
    bp_buffer_free(hb);
    bp_buffer *mbuf = bp_buffer_type_alloc(bp_device_get_buffer_type(md), 64);
    ck_assert_ptr_nonnull(mbuf);
    ck_assert_uint_eq(part_bytes(mbuf, 2), 0);
    ck_assert_error_has(BP_ERR_OUT_OF_BOUNDS, "part 2 of 'Meta(CPU0,CPU1)' is not in 0..1");
    bp_buffer_free(mbuf);
}
END_TEST

/* Without the scheduler, a graph whose tensors live in memory the backend cannot use is
 * refused before the plugin runs: a CPU0 tensor on the meta backend, a meta tensor on CPU0. */
START_TEST(test_foreign_memory_refused)
{
    bp_backend *meta = bp_backend_init_by_name("Meta(CPU0,CPU1)", NULL);
    ck_assert_msg(meta != NULL, "%s", bp_last_error());
    for (int on_meta = 0; on_meta < 2; on_meta++) {
        bp_backend *holder = on_meta ? meta : cpu, *runner = on_meta ? cpu : meta;
        bp_context *c = bp_context_new(8);
        bp_tensor *a = bp_new_tensor_2d(c, BP_TYPE_F32, 8, 4);
        bp_tensor *y = bp_scale(c, a, 2.0f);
        bp_buffer *buf = bp_alloc_ctx_tensors(c, bp_backend_get_default_buffer_type(holder));
        ck_assert_ptr_nonnull(buf);
        bp_graph *g = bp_graph_new(4);
        bp_graph_build_forward(g, y);
        bp_clear_error();
        ck_assert_int_eq(bp_backend_graph_compute(runner, g), BP_ERR_UNSUPPORTED);
        ck_assert_error_has(BP_ERR_UNSUPPORTED, "does not support");
        ck_assert_ptr_nonnull(strstr(bp_last_error(), bp_backend_get_name(runner)));
        ck_assert_int_eq(bp_backend_graph_compute(holder, g), BP_OK);
        bp_graph_free(g);
        bp_buffer_free(buf);
        bp_context_free(c);
    }
    bp_backend_free(meta);
}
END_TEST

static Suite *meta_suite(void)
{
    Suite *s = suite_create("meta");
    TCase *tc = tcase_create("meta");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_two_devices);
    tcase_add_test(tc, test_three_devices);
    tcase_add_test(tc, test_generic_fallback);
    tcase_add_test(tc, test_uneven_and_empty_slices);
    tcase_add_test(tc, test_in_scheduler);
    tcase_add_test(tc, test_weights_stored_as_slices);
    tcase_add_test(tc, test_tensor_roundtrip);
    tcase_add_test(tc, test_device_identity_and_props);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_split_answers_checked_when_stored);
    tcase_add_test(tc, test_split_answers_checked_when_computed);
    tcase_add_test(tc, test_name_parsing);
    tcase_add_test(tc, test_one_device_per_policy);
    tcase_add_test(tc, test_arguments_checked);
    tcase_add_test(tc, test_foreign_memory_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return bp_test_run(meta_suite());
}
