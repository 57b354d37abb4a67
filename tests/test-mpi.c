/* test-mpi.c - the mpi plugin's collectives across processes. Run by tests/test-mpi.sh under
 * `mpirun -np 2`: every rank runs the same tests (SPMD), in one process each (Check's fork mode
 * would start MPI in a child per test). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <backplane/backplane.h>
#include <backplane/bp-comm.h>
#include <backplane/bp-meta.h>
#include <backplane/bp-plugin.h> /* bp_set_error, to fail as a plugin would */

#include "test-util.h"
#include "tf-model.h"

static bp_backend *cpu, *cpu2;
static bp_comm_world_fn world;
static bp_comm_init_ranks_fn init_ranks;
static bp_comm_init_fn init_local;
static bp_comm_allreduce_fn allreduce;
static bp_comm_allreduce_checked_fn allreduce_checked;
static bp_comm_free_fn comm_free;
static int rank, n_ranks;

static void setup(void)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_MPI_PLUGIN_DIR"), getenv("BP_TEST_META_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    setenv("BP_CPU_DEVICES", "2", 1);
    cpu = bp_backend_init_by_name("CPU0", "threads=1");
    cpu2 = bp_backend_init_by_name("CPU1", "threads=1");
    ck_assert_plugins(cpu != NULL && cpu2 != NULL, "%s", bp_last_error());
    bp_registry *reg = bp_registry_by_name("MPI");
    ck_assert_msg(reg != NULL, "%s", bp_last_error());
    world = (bp_comm_world_fn)bp_registry_get_proc_address(reg, "bp_comm_world");
    init_ranks = (bp_comm_init_ranks_fn)bp_registry_get_proc_address(reg, "bp_comm_init_ranks");
    init_local = (bp_comm_init_fn)bp_registry_get_proc_address(reg, "bp_comm_init");
    allreduce = (bp_comm_allreduce_fn)bp_registry_get_proc_address(reg, "bp_comm_allreduce");
    allreduce_checked = (bp_comm_allreduce_checked_fn)bp_registry_get_proc_address(
        reg, "bp_comm_allreduce_checked");
    comm_free = (bp_comm_free_fn)bp_registry_get_proc_address(reg, "bp_comm_free");
    ck_assert(world && init_ranks && init_local && allreduce && allreduce_checked && comm_free);
    ck_assert_int_eq(world(&rank, &n_ranks), BP_OK);
}

static void teardown(void)
{
    bp_backend_free(cpu2);
    bp_backend_free(cpu);
}

/* One member per rank, each on its CPU backend. */
static bp_comm *one_per_rank(double timeout)
{
    struct bp_comm_member m[8];
    for (int r = 0; r < n_ranks; r++)
        m[r] = (struct bp_comm_member){r, r == rank ? cpu : NULL};
    bp_comm *c = init_ranks(m, n_ranks, BP_OK, timeout);
    ck_assert_msg(c != NULL, "%s", bp_last_error());
    return c;
}

/* Member m's value at element i: distinct per member and element, exact in BF16. */
static float value(int m, int64_t i)
{
    return (float)((i * 7 + m * 3) % 64 - 32) / 4.0f;
}

START_TEST(test_world)
{
    ck_assert_int_ge(n_ranks, 2);
    ck_assert_int_ge(rank, 0);
    ck_assert_int_lt(rank, n_ranks);
    ck_assert_int_eq(world(NULL, &n_ranks), BP_ERR_INVALID_ARG);
}
END_TEST

/* Every type and odd sizes, one member per rank: each rank's tensor holds the sum of every
 * member's values afterwards. */
START_TEST(test_allreduce_types_and_sizes)
{
    bp_comm *c = one_per_rank(30);
    static const enum bp_type types[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_BF16};
    static const int64_t sizes[] = {1, 7, 1000, 65537, (1 << 20) + 3};
    for (size_t ti = 0; ti < 3; ti++) {
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            const int64_t n = sizes[si];
            bp_context *ctx = bp_context_new(1);
            bp_tensor *t = bp_new_tensor_1d(ctx, types[ti], n);
            bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu));
            float *v = malloc((size_t)n * sizeof(float));
            void *raw = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++)
                v[i] = value(rank, i);
            bp_type_get_traits(types[ti])->from_float(v, raw, n);
            ck_assert_int_eq(bp_tensor_set(t, raw, 0, bp_nbytes(t)), BP_OK);
            bp_tensor *ts[8] = {NULL};
            ts[rank] = t;
            ck_assert_msg(allreduce(c, ts, n_ranks) == BP_OK, "%s", bp_last_error());
            ck_assert_int_eq(bp_tensor_get(t, raw, 0, bp_nbytes(t)), BP_OK);
            bp_type_get_traits(types[ti])->to_float(raw, v, n);
            for (int64_t i = 0; i < n; i++) {
                float want = 0;
                for (int r = 0; r < n_ranks; r++)
                    want += value(r, i);
                ck_assert_msg(v[i] == want, "%s n=%lld [%lld]: %g, want %g",
                              bp_type_name(types[ti]), (long long)n, (long long)i, v[i], want);
            }
            free(raw);
            free(v);
            bp_buffer_free(buf);
            bp_context_free(ctx);
        }
    }
    /* I32: integer sums, exact */
    bp_context *ctx = bp_context_new(1);
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_I32, 100003);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu));
    int32_t *iv = malloc(100003 * sizeof(int32_t));
    for (int i = 0; i < 100003; i++)
        iv[i] = (i % 1000) * 1000003 + rank;
    bp_tensor_set(t, iv, 0, bp_nbytes(t));
    bp_tensor *ts[8] = {NULL};
    ts[rank] = t;
    ck_assert_msg(allreduce(c, ts, n_ranks) == BP_OK, "%s", bp_last_error());
    bp_tensor_get(t, iv, 0, bp_nbytes(t));
    for (int i = 0; i < 100003; i++) { /* sums of I32 wrap, as two's complement adds do */
        const uint32_t want = (uint32_t)n_ranks * (uint32_t)((i % 1000) * 1000003) +
                              (uint32_t)(n_ranks * (n_ranks - 1) / 2);
        ck_assert_int_eq(iv[i], (int32_t)want);
    }
    free(iv);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    comm_free(c);
}
END_TEST

/* Two members on rank 0 and one on each other rank: rank 0 sums its two first. */
START_TEST(test_several_members_on_a_rank)
{
    struct bp_comm_member m[9];
    int n = 0;
    m[n++] = (struct bp_comm_member){0, rank == 0 ? cpu : NULL};
    m[n++] = (struct bp_comm_member){0, rank == 0 ? cpu2 : NULL};
    for (int r = 1; r < n_ranks; r++)
        m[n++] = (struct bp_comm_member){r, r == rank ? cpu : NULL};
    bp_comm *c = init_ranks(m, n, BP_OK, 30);
    ck_assert_msg(c != NULL, "%s", bp_last_error());
    bp_context *ctx = bp_context_new(2);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 33, 3);
    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 33, 3);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu));
    float va[99], vb[99];
    for (int i = 0; i < 99; i++) {
        va[i] = value(rank == 0 ? 0 : rank + 1, i);
        vb[i] = value(1, i);
    }
    bp_tensor_set(a, va, 0, sizeof(va));
    bp_tensor_set(b, vb, 0, sizeof(vb));
    bp_tensor *ts[9] = {NULL};
    if (rank == 0) {
        ts[0] = a;
        ts[1] = b;
    } else {
        ts[rank + 1] = a;
    }
    ck_assert_msg(allreduce(c, ts, n) == BP_OK, "%s", bp_last_error());
    for (int k = 0; k < (rank == 0 ? 2 : 1); k++) {
        float got[99];
        bp_tensor_get(k == 0 ? a : b, got, 0, sizeof(got));
        for (int i = 0; i < 99; i++) {
            float want = 0;
            for (int mm = 0; mm < n; mm++)
                want += value(mm, i);
            ck_assert_float_eq(got[i], want);
        }
    }
    bp_buffer_free(buf);
    bp_context_free(ctx);
    comm_free(c);
}
END_TEST

/* A rank that failed before setting up still calls: every rank returns NULL, the others
 * naming it, the failing one keeping its own error. */
START_TEST(test_rank_failing_during_setup)
{
    struct bp_comm_member m[8];
    for (int r = 0; r < n_ranks; r++)
        m[r] = (struct bp_comm_member){r, r == rank ? cpu : NULL};
    enum bp_status mine = BP_OK;
    if (rank == 1) /* as if its device were missing */
        mine = bp_set_error(BP_ERR_NOT_FOUND, "no device is named 'CUDA0'");
    bp_comm *c = init_ranks(m, n_ranks, mine, 30);
    ck_assert_ptr_null(c);
    if (rank == 1) {
        ck_assert_error_has(BP_ERR_NOT_FOUND, "CUDA0");
    } else {
        ck_assert_error_has(BP_ERR_REMOTE, "rank 1 failed");
        ck_assert_error_has(BP_ERR_REMOTE, "BP_ERR_NOT_FOUND");
    }
    /* and afterwards a communicator is made as usual */
    comm_free(one_per_rank(30));
}
END_TEST

/* A rank that fails between collectives joins the next one as failed: every rank gets an error
 * there, the others naming it; the communicator goes on working. Bad tensors count as such a
 * failure. */
START_TEST(test_rank_failing_before_an_allreduce)
{
    bp_comm *c = one_per_rank(30);
    bp_context *ctx = bp_context_new(2);
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 32);
    bp_tensor *q = bp_new_tensor_1d(ctx, BP_TYPE_Q8_0, 32); /* as many values, another type */
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu));
    ck_assert_int_eq(bp_buffer_clear(buf, 0), BP_OK);
    bp_tensor *ts[8] = {NULL};
    ts[rank] = t;
    enum bp_status mine = rank == 1 ? BP_ERR_OUT_OF_MEMORY : BP_OK;
    if (rank == 1)
        bp_set_error(mine, "out of memory for the KV cache");
    enum bp_status st = allreduce_checked(c, ts, n_ranks, mine);
    if (rank == 1) {
        ck_assert_int_eq(st, BP_ERR_OUT_OF_MEMORY);
        ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "KV cache");
    } else {
        ck_assert_int_eq(st, BP_ERR_REMOTE);
        ck_assert_error_has(BP_ERR_REMOTE, "rank 1 failed (BP_ERR_OUT_OF_MEMORY)");
    }
    /* Q8_0 on rank 0 only: rank 0 fails with the type, the others hear of rank 0. */
    ts[rank] = rank == 0 ? q : t;
    st = allreduce(c, ts, n_ranks);
    if (rank == 0) {
        ck_assert_int_eq(st, BP_ERR_TYPE);
        ck_assert_error_has(BP_ERR_TYPE, "F32, F16, BF16 or I32");
    } else {
        ck_assert_int_eq(st, BP_ERR_REMOTE);
        ck_assert_error_has(BP_ERR_REMOTE, "rank 0 failed (BP_ERR_TYPE)");
    }
    /* One more value on the last rank: every rank refuses, naming a rank that differs, nothing
     * is summed, and the communicator goes on. Small sums, large ones, and counts on both sides
     * of the small sums' limit (16384 values, 32768 between two ranks), where one rank's sum
     * is small and the other's large. Then as many values of another type alike. */
    const bool odd_one = rank == n_ranks - 1;
    char want[64];
    snprintf(want, sizeof(want), "rank %d sums another number or type", odd_one ? 0 : n_ranks - 1);
    static const int64_t counts[] = {7, 200000, 16384, 32768};
    for (int k = 0; k < 8; k++) {
        const int64_t count = counts[k % 4] + (k < 4 && odd_one ? 1 : 0);
        bp_context *c2 = bp_context_new(1);
        bp_tensor *u = bp_new_tensor_1d(c2, k >= 4 && odd_one ? BP_TYPE_F16 : BP_TYPE_F32,
                                        count);
        bp_buffer *b2 = bp_alloc_ctx_tensors(c2, bp_backend_get_default_buffer_type(cpu));
        bp_buffer_clear(b2, 0);
        ts[rank] = u;
        ck_assert_int_eq(allreduce(c, ts, n_ranks), BP_ERR_INVALID_ARG);
        ck_assert_msg(strstr(bp_last_error(), want) != NULL, "count %lld: '%s' does not say '%s'",
                      (long long)count, bp_last_error(), want);
        bp_buffer_free(b2);
        bp_context_free(c2);
    }
    /* The last rank has no tensor for its member (or no tensor and a failed status): it
     * still takes part, as a failed one, so the others hear of it at this call instead of
     * pairing with its next one; then a sum works as usual. */
    for (int failed = 0; failed < 2; failed++) {
        ts[rank] = odd_one ? NULL : t;
        const enum bp_status own = odd_one && failed ? BP_ERR_OUT_OF_MEMORY : BP_OK;
        if (own != BP_OK)
            bp_set_error(own, "out of memory for the activations");
        const enum bp_status got = allreduce_checked(c, ts, n_ranks, own);
        if (odd_one && failed) {
            ck_assert_int_eq(got, BP_ERR_OUT_OF_MEMORY);
            ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "activations");
        } else if (odd_one) {
            ck_assert_int_eq(got, BP_ERR_INVALID_ARG);
            ck_assert_error_has(BP_ERR_INVALID_ARG, "tensor is NULL");
        } else {
            char failed_rank[64];
            snprintf(failed_rank, sizeof(failed_rank), "rank %d failed", n_ranks - 1);
            ck_assert_int_eq(got, BP_ERR_REMOTE);
            ck_assert_error_has(BP_ERR_REMOTE, failed_rank);
        }
    }
    ts[rank] = t; /* still working */
    float one[32];
    for (int i = 0; i < 32; i++)
        one[i] = 1.0f;
    bp_tensor_set(t, one, 0, sizeof(one));
    ck_assert_msg(allreduce(c, ts, n_ranks) == BP_OK, "%s", bp_last_error());
    bp_tensor_get(t, one, 0, sizeof(one));
    ck_assert_float_eq(one[31], (float)n_ranks);
    /* Arguments refused on every rank alike. */
    ck_assert_int_eq(allreduce(c, ts, n_ranks + 1), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "tensors for a communicator of");
    ck_assert_int_eq(allreduce(NULL, ts, n_ranks), BP_ERR_INVALID_ARG);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    comm_free(c);
}
END_TEST

START_TEST(test_members_checked)
{
    struct bp_comm_member m[2] = {{0, rank == 0 ? cpu : NULL}, {n_ranks, NULL}};
    ck_assert_ptr_null(init_ranks(m, 2, BP_OK, 1));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "the ranks are 0 to");
    m[1] = (struct bp_comm_member){1, cpu}; /* a backend for a member of another rank */
    m[0].backend = cpu;
    ck_assert_ptr_null(init_ranks(m, 2, BP_OK, 1));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "is on another rank but has a backend");
    m[0].backend = NULL; /* and none for a member of this rank */
    m[1].backend = NULL;
    ck_assert_ptr_null(init_ranks(m, 2, BP_OK, 1));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "is on this rank but has no backend");
    ck_assert_ptr_null(init_ranks(m, 0, BP_OK, 1));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "need 1 to 64 members");
    /* The members in another order on each rank: refused on every rank, no wait. */
    struct bp_comm_member o[2] = {{rank, cpu}, {1 - rank, NULL}};
    ck_assert_ptr_null(init_ranks(o, 2, BP_OK, 5));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "passed other members");
    /* All members on this rank: a communicator of one rank, bp_comm_init's form. */
    bp_backend *both[2] = {cpu, cpu2};
    bp_comm *c = init_local(both, 2);
    ck_assert_msg(c != NULL, "%s", bp_last_error());
    comm_free(c);
}
END_TEST

/* A rank that comes too late: the all-reduce gives up after the timeout with the ranks named,
 * and the communicator refuses what follows; then a rank that never comes to the setup. Last:
 * the late collectives are left to finish in the background. */
START_TEST(test_timeouts)
{
    bp_comm *c = one_per_rank(0.5);
    bp_context *ctx = bp_context_new(1);
    bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, 16);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu));
    bp_buffer_clear(buf, 0);
    bp_tensor *ts[8] = {NULL};
    ts[rank] = t;
    if (rank == 1)
        sleep(2);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    enum bp_status st = allreduce(c, ts, n_ranks);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rank == 0) {
        ck_assert_int_eq(st, BP_ERR_TIMEOUT);
        ck_assert_error_has(BP_ERR_TIMEOUT, "did not complete within 0.5 s");
        ck_assert_error_has(BP_ERR_TIMEOUT, "over ranks 0, 1");
        ck_assert_error_has(BP_ERR_TIMEOUT, "(waiting for rank 1)");
        ck_assert(took < 1.5);
        ck_assert_int_eq(allreduce(c, ts, n_ranks), BP_ERR_TIMEOUT);
        ck_assert_error_has(BP_ERR_TIMEOUT, "takes no more");
    } else {
        ck_assert_int_eq(st, BP_OK); /* rank 0's started collective was still there */
    }
    comm_free(c);
    /* The setup: rank 1 does not come. */
    if (rank == 0) {
        struct bp_comm_member m[2] = {{0, cpu}, {1, NULL}};
        ck_assert_ptr_null(init_ranks(m, 2, BP_OK, 0.5));
        ck_assert_error_has(BP_ERR_TIMEOUT, "rank(s) 1 did not arrive within 0.5 s");
    }
    bp_buffer_free(buf);
    bp_context_free(ctx);
}
END_TEST

/* ---- A meta device over parts on both ranks ------------------------------------------------ */

static const struct tf_config tiny = {.n_layer = 2, .n_embd = 48, .n_ff = 96, .n_head = 6,
                                      .n_vocab = 40, .n_tok = 5, .wtype = BP_TYPE_F32};

/* Logits of one forward pass of cfg with weights and activations in be's buffers; with
 * bad_token, this rank's first token is out of the vocabulary (its GET_ROWS fails). */
static float *forward_with(bp_backend *be, const struct tf_config *cfg, bool bad_token,
                           enum bp_status *status)
{
    bp_buffer_type *buft = bp_backend_get_default_buffer_type(be);
    struct model m;
    model_init(&m, cfg, buft);
    bp_context *ctx = bp_context_new(tf_graph_n_tensors(cfg));
    struct tf_graph tg;
    ck_assert(tf_build(ctx, cfg, &m.w, &tg));
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(cfg) + tf_weights_n_tensors(cfg));
    ck_assert_int_eq(bp_graph_build_forward(g, tg.logits), BP_OK);
    bp_buffer *abuf = bp_alloc_ctx_tensors(ctx, buft);
    ck_assert_msg(abuf != NULL, "%s", bp_last_error());
    set_inputs(&tg, cfg, 0);
    const int32_t bad = cfg->n_vocab + 5;
    if (bad_token)
        ck_assert_int_eq(bp_tensor_set(tg.tokens, &bad, 0, sizeof(bad)), BP_OK);
    *status = bp_backend_graph_compute(be, g);
    float *out = NULL;
    if (*status == BP_OK) {
        out = malloc(bp_nbytes(tg.logits));
        ck_assert_int_eq(bp_tensor_get(tg.logits, out, 0, bp_nbytes(tg.logits)), BP_OK);
    }
    bp_buffer_free(abuf);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    return out;
}

static float *forward(bp_backend *be, const struct tf_config *cfg, enum bp_status *status)
{
    return forward_with(be, cfg, false, status);
}

/* The model over Meta(CPU0@0,CPU0@1) on every rank: each rank holds half of the split weights
 * and the logits equal the CPU alone's; quantised weights and F16 ones too. */
START_TEST(test_meta_across_ranks)
{
    bp_backend *meta = bp_backend_init_by_name("Meta(CPU0@0,CPU0@1)", NULL);
    ck_assert_msg(meta != NULL, "%s", bp_last_error());
    static const enum bp_type wtypes[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_Q8_0};
    for (size_t i = 0; i < 3; i++) {
        struct tf_config cfg = tiny;
        cfg.wtype = wtypes[i];
        if (cfg.wtype == BP_TYPE_Q8_0)
            cfg.n_embd = 64, cfg.n_ff = 128, cfg.n_head = 4;
        enum bp_status st;
        float *ref = forward(cpu, &cfg, &st);
        float *got = forward(meta, &cfg, &st);
        ck_assert_msg(st == BP_OK, "%s", bp_last_error());
        assert_close_nmse(got, ref, (int64_t)cfg.n_vocab * cfg.n_tok,
                          cfg.wtype == BP_TYPE_F32 ? 1e-10 : 1e-5);
        free(ref);
        free(got);
    }
    bp_registry *reg = bp_registry_by_name("Meta");
    bp_meta_backend_reduced_bytes_fn reduced;
    void *proc = bp_registry_get_proc_address(reg, "bp_meta_backend_reduced_bytes");
    ck_assert_ptr_nonnull(proc);
    memcpy(&reduced, &proc, sizeof(reduced));
    ck_assert_uint_gt(reduced(meta), 0);
    /* Rank 1's computation fails half-way (a token outside the vocabulary on its side): every
     * rank returns an error at the next collective, rank 0 naming rank 1; then the device
     * computes as before. */
    enum bp_status st;
    free(forward_with(meta, &tiny, rank == 1, &st));
    if (rank == 1) {
        ck_assert_int_eq(st, BP_ERR_OUT_OF_BOUNDS);
    } else {
        ck_assert_int_eq(st, BP_ERR_REMOTE);
        ck_assert_error_has(BP_ERR_REMOTE, "rank 1 failed (BP_ERR_OUT_OF_BOUNDS)");
    }
    float *ref = forward(cpu, &tiny, &st), *got = forward(meta, &tiny, &st);
    ck_assert_msg(st == BP_OK, "%s", bp_last_error());
    assert_close_nmse(got, ref, (int64_t)tiny.n_vocab * tiny.n_tok, 1e-10);
    free(ref);
    free(got);
    bp_backend_free(meta);
}
END_TEST

/* Names across processes: a rank out of range, a part listed twice, and the failure of one
 * rank's device, which every rank hears about (no rank waits). */
START_TEST(test_meta_setup_errors)
{
    ck_assert_ptr_null(bp_backend_init_by_name("Meta(CPU0@0,CPU0@7)", NULL));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "part 1 is on rank 7, but the program runs as 2");
    ck_assert_ptr_null(bp_backend_init_by_name("Meta(CPU0@0,CPU0@x)", NULL));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "is not DEVICE@RANK");
    /* rank 1 names a device it does not have */
    ck_assert_ptr_null(bp_backend_init_by_name(rank == 1 ? "Meta(CPU0@0,NOPE@1)"
                                                         : "Meta(CPU0@0,NOPE@1)", NULL));
    if (rank == 1)
        ck_assert_error_has(BP_ERR_NOT_FOUND, "no device is named 'NOPE'");
    else
        ck_assert_error_has(BP_ERR_REMOTE, "rank 1 failed");
}
END_TEST

/* Run as `test-mpi` under 2 ranks: every test. `test-mpi --any-ranks` under any number: the
 * collectives' tests, which hold for every rank count (3 ranks take the recursive doubling's
 * fold, which 2 do not). */
int main(int argc, char **argv)
{
    const bool any = argc > 1 && strcmp(argv[1], "--any-ranks") == 0;
    Suite *s = suite_create("mpi");
    TCase *tc = tcase_create("mpi");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_world);
    tcase_add_test(tc, test_allreduce_types_and_sizes);
    tcase_add_test(tc, test_several_members_on_a_rank);
    tcase_add_test(tc, test_rank_failing_during_setup);
    tcase_add_test(tc, test_rank_failing_before_an_allreduce);
    if (!any) {
        tcase_add_test(tc, test_members_checked);
        tcase_add_test(tc, test_meta_across_ranks);
        tcase_add_test(tc, test_meta_setup_errors);
        tcase_add_test(tc, test_timeouts);
    }
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* one MPI process per rank */
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    /* A failure on one rank leaves the others waiting in a collective: end them all. */
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
