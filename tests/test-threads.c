/* test-threads.c - two threads, each with its own CPU backend (two worker threads each) and its
 * own scheduler, compute the same transformer over one shared set of weights, many times, and
 * every result equals the one computed alone beforehand. Built normally it checks the results;
 * built with --enable-tsan (tools/dev.sh check does) ThreadSanitizer checks that nothing races. */
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <time.h>

#include "test-device.h"
#include "test-util.h"
#include "tf-model.h"

#define ITERATIONS 25

static const struct tf_config cfg = {.n_layer = 2, .n_embd = 32, .n_ff = 64, .n_head = 4,
                                     .n_vocab = 40, .n_tok = 5, .wtype = BP_TYPE_F32};
#define N_LOGITS (40 * 5)

struct worker {
    const struct model *m;
    const float *expect;
    int salt; /* which inputs: each thread its own */
    int mismatches;
    char error[256];
};

/* The logits of one forward pass of m on a fresh backend and scheduler, repeated `times`. */
static int run_passes(const struct model *m, int salt, int times, const float *expect, float *out,
                      char *error, size_t error_size)
{
    int mismatches = 0;
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    if (be == NULL) {
        snprintf(error, error_size, "backend: %s", bp_last_error());
        return -1;
    }
    bp_sched *s = bp_sched_new(&be, NULL, 1, 1024, false);
    for (int it = 0; it < times && s != NULL; it++) {
        bp_context *ctx = bp_context_new(tf_graph_n_tensors(&cfg));
        struct tf_graph tg;
        bp_graph *g = bp_graph_new(tf_graph_n_tensors(&cfg) + tf_weights_n_tensors(&cfg));
        if (!tf_build(ctx, &cfg, &m->w, &tg) || bp_graph_build_forward(g, tg.logits) != BP_OK ||
            bp_sched_alloc_graph(s, g) != BP_OK) {
            snprintf(error, error_size, "graph: %s", bp_last_error());
            mismatches = -1;
        } else {
            set_inputs(&tg, &cfg, salt);
            float got[N_LOGITS];
            if (bp_sched_graph_compute(s, g) != BP_OK ||
                bp_tensor_get(tg.logits, got, 0, sizeof(got)) != BP_OK) {
                snprintf(error, error_size, "compute: %s", bp_last_error());
                mismatches = -1;
            } else if (expect != NULL && memcmp(got, expect, sizeof(got)) != 0) {
                mismatches++;
            } else if (out != NULL) {
                memcpy(out, got, sizeof(got));
            }
        }
        bp_graph_free(g);
        bp_context_free(ctx);
        bp_sched_reset(s);
        if (mismatches < 0)
            break;
    }
    bp_sched_free(s);
    bp_backend_free(be);
    return mismatches;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    w->mismatches = run_passes(w->m, w->salt, ITERATIONS, w->expect, NULL, w->error,
                               sizeof(w->error));
    return NULL;
}

START_TEST(test_two_threads_share_weights)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s", getenv("BP_TEST_CPU_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    struct model m;
    model_init(&m, &cfg, bp_host_buffer_type());
    float expect[2][N_LOGITS];
    char error[256] = "";
    for (int t = 0; t < 2; t++)
        ck_assert_msg(run_passes(&m, t, 1, NULL, expect[t], error, sizeof(error)) == 0, "%s",
                      error);
    ck_assert(memcmp(expect[0], expect[1], sizeof(expect[0])) != 0); /* different inputs */
    struct worker w[2];
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        w[t] = (struct worker){.m = &m, .expect = expect[t], .salt = t};
        ck_assert_int_eq(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
    }
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++)
        ck_assert_msg(w[t].mismatches == 0, "thread %d: %d of %d results differ %s", t,
                      w[t].mismatches, ITERATIONS, w[t].error);
    model_free(&m);
}
END_TEST

/* ---- One backend, two threads: the second is refused, never let in ---------------------- */

struct hold {
    sem_t inside, release;
};

static void hold_inside(void *arg)
{
    struct hold *h = arg;
    sem_post(&h->inside);
    sem_wait(&h->release);
}

struct computer {
    bp_backend *be;
    bp_graph *g;
    enum bp_status st;
};

static void *compute_main(void *arg)
{
    struct computer *c = arg;
    c->st = bp_backend_graph_compute(c->be, c->g);
    return NULL;
}

START_TEST(test_busy_backend_refused)
{
    bp_registry *reg = test_device_registry_new(0);
    bp_device *dev = bp_registry_get_device(reg, 0);
    bp_backend *be = bp_device_init_backend(dev, NULL);
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *y = bp_neg(ctx, a);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_device_get_buffer_type(dev));
    ck_assert_ptr_nonnull(buf);
    const float in[4] = {1, 2, 3, 4};
    ck_assert_int_eq(bp_tensor_set(a, in, 0, sizeof(in)), BP_OK);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, y);

    struct hold h;
    sem_init(&h.inside, 0, 0);
    sem_init(&h.release, 0, 0);
    test_device_set_compute_hook(hold_inside, &h);
    struct computer c = {be, g, BP_ERR_BACKEND};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, compute_main, &c), 0);
    sem_wait(&h.inside); /* the other thread is now inside the backend */

    float out[4];
    bp_clear_error();
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_ERR_BUSY);
    ck_assert_error_has(BP_ERR_BUSY, "in use by another thread");
    ck_assert_int_eq(bp_backend_synchronize(be), BP_ERR_BUSY);
    ck_assert_int_eq(bp_backend_tensor_get_async(be, y, out, 0, sizeof(out)), BP_ERR_BUSY);
    ck_assert_int_eq(bp_backend_tensor_set_async(be, a, in, 0, sizeof(in)), BP_ERR_BUSY);
    ck_assert_int_eq(bp_backend_tensor_copy_async(be, be, a, y), BP_ERR_BUSY);
    ck_assert_int_eq(test_device_stats.computes, 0); /* the refused call never reached it */

    sem_post(&h.release);
    pthread_join(th, NULL);
    test_device_set_compute_hook(NULL, NULL);
    ck_assert_int_eq(c.st, BP_OK);
    /* Once the other thread is out, this one may use the backend. */
    ck_assert_int_eq(bp_backend_graph_compute(be, g), BP_OK);
    ck_assert_int_eq(bp_backend_tensor_get_async(be, y, out, 0, sizeof(out)), BP_OK);
    for (int i = 0; i < 4; i++)
        ck_assert(out[i] == -in[i]);

    sem_destroy(&h.inside);
    sem_destroy(&h.release);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(be);
    bp_registry_free(reg);
}
END_TEST

struct sched_computer {
    bp_sched *s;
    bp_graph *g;
    enum bp_status st;
};

static void *sched_compute_main(void *arg)
{
    struct sched_computer *c = arg;
    c->st = bp_sched_graph_compute(c->s, c->g);
    return NULL;
}

START_TEST(test_busy_scheduler_refused)
{
    bp_registry *reg = test_device_registry_new(0);
    setenv("BP_PLUGIN_PATH", getenv("BP_TEST_CPU_PLUGIN_DIR"), 1);
    bp_backend *bes[2] = {bp_device_init_backend(bp_registry_get_device(reg, 0), NULL),
                          bp_backend_init_by_name("CPU", NULL)};
    ck_assert_ptr_nonnull(bes[1]);
    bp_sched *s = bp_sched_new(bes, NULL, 2, 64, false);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    /* A weight in the accelerator's memory pins the op to it. */
    bp_context *wctx = bp_context_new(2), *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_1d(wctx, BP_TYPE_F32, 4);
    bp_buffer *wbuf = bp_alloc_ctx_tensors(wctx, bp_backend_get_default_buffer_type(bes[0]));
    ck_assert_ptr_nonnull(wbuf);
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, bp_neg(ctx, a));
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);

    struct hold h;
    sem_init(&h.inside, 0, 0);
    sem_init(&h.release, 0, 0);
    test_device_set_compute_hook(hold_inside, &h);
    struct sched_computer c = {s, g, BP_ERR_BACKEND};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, sched_compute_main, &c), 0);
    sem_wait(&h.inside);
    bp_clear_error();
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_ERR_BUSY);
    ck_assert_error_has(BP_ERR_BUSY, "scheduler is in use by another thread");
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_ERR_BUSY);
    ck_assert_int_eq(bp_sched_synchronize(s), BP_ERR_BUSY);
    sem_post(&h.release);
    pthread_join(th, NULL);
    test_device_set_compute_hook(NULL, NULL);
    ck_assert_int_eq(c.st, BP_OK);
    ck_assert_int_eq(bp_sched_graph_compute(s, g), BP_OK);

    sem_destroy(&h.inside);
    sem_destroy(&h.release);
    bp_graph_free(g);
    bp_context_free(ctx);
    bp_buffer_free(wbuf);
    bp_context_free(wctx);
    bp_sched_free(s);
    bp_backend_free(bes[0]);
    bp_backend_free(bes[1]);
    bp_registry_free(reg);
}
END_TEST

/* Two threads hammering one CPU backend with their own graphs: each call either computes the
 * right answer or is refused with BP_ERR_BUSY; nothing crashes, hangs or races (TSan). */
struct hammer {
    bp_backend *be;
    int ok, busy, wrong, other;
};

static void *hammer_main(void *arg)
{
    struct hammer *hm = arg;
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 64);
    bp_tensor *y = bp_mul_mat(ctx, a, a);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(hm->be));
    bp_graph *g = bp_graph_new(4);
    bp_graph_build_forward(g, y);
    float *in = malloc(64 * 64 * sizeof(float)), *out = malloc(64 * 64 * sizeof(float));
    for (int i = 0; i < 64 * 64; i++)
        in[i] = (float)(i % 7) - 3.0f;
    bp_tensor_set(a, in, 0, 64 * 64 * sizeof(float));
    /* Until 50 products were computed: a refused call is retried, as a caller would. */
    for (long attempt = 0; hm->ok < 50 && attempt < 10000000; attempt++) {
        enum bp_status st = bp_backend_graph_compute(hm->be, g);
        if (st == BP_ERR_BUSY) {
            hm->busy++;
            sched_yield();
            continue;
        }
        if (st != BP_OK || bp_tensor_get(y, out, 0, 64 * 64 * sizeof(float)) != BP_OK) {
            hm->other++;
            continue;
        }
        /* y[m, n] = sum_k a[k, m] a[k, n]: check the diagonal. */
        for (int m = 0; m < 64; m++) {
            double d = 0;
            for (int k = 0; k < 64; k++)
                d += (double)in[m * 64 + k] * in[m * 64 + k];
            if (out[m * 64 + m] != (float)d)
                hm->wrong++;
        }
        hm->ok++;
    }
    free(in);
    free(out);
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    return NULL;
}

START_TEST(test_shared_cpu_backend_never_crashes)
{
    setenv("BP_PLUGIN_PATH", getenv("BP_TEST_CPU_PLUGIN_DIR"), 1);
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    /* The thread count is also a proc address that goes to the plugin directly: while the two
     * threads compute, this one keeps changing it, and each change either happens between
     * graphs or is refused with BP_ERR_BUSY. */
    bp_set_n_threads_fn set_threads;
    void *fn = bp_registry_get_proc_address(bp_device_get_registry(bp_backend_get_device(be)),
                                            "bp_set_n_threads");
    ck_assert_ptr_nonnull(fn);
    memcpy(&set_threads, &fn, sizeof(set_threads));
    struct hammer hm[2] = {{.be = be}, {.be = be}};
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        ck_assert_int_eq(pthread_create(&th[t], NULL, hammer_main, &hm[t]), 0);
    int changes = 0, refused = 0, other = 0;
    for (int i = 0; i < 100; i++) {
        enum bp_status st = set_threads(be, 1 + i % 2);
        changes += st == BP_OK;
        refused += st == BP_ERR_BUSY;
        other += st != BP_OK && st != BP_ERR_BUSY;
        nanosleep(&(struct timespec){0, 200000}, NULL);
    }
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    ck_assert_int_eq(other, 0);
    ck_assert_int_eq(changes + refused, 100);
    for (int t = 0; t < 2; t++) {
        ck_assert_int_eq(hm[t].wrong, 0);
        ck_assert_int_eq(hm[t].other, 0);
        ck_assert_int_eq(hm[t].ok, 50);
    }
    bp_backend_free(be);
}
END_TEST

/* Two backends of one meta device, made by name from two threads at once, computing their own
 * graphs at the same time: one device results, the shared state table stays consistent, and
 * each result is right (TSan-clean). */
struct meta_worker {
    bp_device *dev;
    int wrong;
    char error[256];
};

static void *meta_main(void *arg)
{
    struct meta_worker *w = arg;
    bp_backend *be = bp_backend_init_by_name("Meta(CPU0,CPU1)", "threads=1");
    if (be == NULL) {
        snprintf(w->error, sizeof(w->error), "%s", bp_last_error());
        return NULL;
    }
    w->dev = bp_backend_get_device(be);
    for (int it = 0; it < 20; it++) {
        bp_context *ctx = bp_context_new(8);
        bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 16);
        bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 3);
        bp_tensor *y = bp_scale(ctx, bp_mul_mat(ctx, a, x), 0.5f);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(be));
        bp_graph *g = bp_graph_new(8);
        bp_graph_build_forward(g, y);
        float av[32 * 16], xv[32 * 3], out[16 * 3];
        for (int i = 0; i < 32 * 16; i++)
            av[i] = (float)((i * 7 + it) % 5) - 2.0f;
        for (int i = 0; i < 32 * 3; i++)
            xv[i] = (float)((i * 3 + it) % 4) - 1.5f;
        if (buf == NULL || bp_tensor_set(a, av, 0, sizeof(av)) != BP_OK ||
            bp_tensor_set(x, xv, 0, sizeof(xv)) != BP_OK ||
            bp_backend_graph_compute(be, g) != BP_OK ||
            bp_tensor_get(y, out, 0, sizeof(out)) != BP_OK) {
            snprintf(w->error, sizeof(w->error), "%s", bp_last_error());
            w->wrong++;
        } else {
            for (int n = 0; n < 3; n++)
                for (int m = 0; m < 16; m++) {
                    double d = 0;
                    for (int k = 0; k < 32; k++)
                        d += (double)av[m * 32 + k] * xv[n * 32 + k];
                    w->wrong += out[n * 16 + m] != (float)(0.5 * d);
                }
        }
        bp_graph_free(g);
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
    bp_backend_free(be);
    return NULL;
}

START_TEST(test_one_meta_device_two_threads)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_META_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_CPU_DEVICES", "2", 1);
    ck_assert_int_eq(bp_plugin_load_all(), BP_OK);
    struct meta_worker w[2] = {{0}};
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        ck_assert_int_eq(pthread_create(&th[t], NULL, meta_main, &w[t]), 0);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++)
        ck_assert_msg(w[t].dev != NULL && w[t].wrong == 0, "thread %d: %d wrong: %s", t,
                      w[t].wrong, w[t].error);
    ck_assert_ptr_eq(w[0].dev, w[1].dev); /* one name, one device */
}
END_TEST

/* ---- Threads run on past independent nodes and meet where memory is shared --------------
 * Each layer of this graph transposes h (every thread then reads rows that others wrote), has
 * nodes that only read the result (which the CPU's threads may run without meeting in between)
 * and nodes that read what the layer just wrote; the scheduler's allocator reuses memory freed
 * by earlier nodes, so a missing meeting shows up as a wrong value (read before another thread
 * wrote it, or overwritten while read), and under TSan as a race. Four threads on any machine;
 * every result must equal the scalar reference bit for bit (each layer transposes twice). */
#define WIDE 65536
#define MEET_COLS 64
#define MEET_LAYERS 6

static bp_tensor *meet_graph(bp_context *ctx, bp_tensor *h)
{
    for (int l = 0; l < MEET_LAYERS; l++) {
        /* Threads split nodes by rows: a transpose makes each read every thread's rows. */
        bp_tensor *ht = bp_cont(ctx, bp_transpose(ctx, h));
        bp_tensor *a = bp_neg(ctx, ht), *b = bp_sqr(ctx, ht), *c = bp_scale(ctx, ht, 0.5f);
        /* The allocator gives the second and third transposes memory that the first (or the
         * second) still reads on other threads: a write after a read. */
        bp_tensor *at = bp_cont(ctx, bp_transpose(ctx, a));
        bp_tensor *bt = bp_cont(ctx, bp_transpose(ctx, b));
        bp_tensor *ct = bp_cont(ctx, bp_transpose(ctx, c));
        h = bp_add(ctx, bp_add(ctx, at, bt), ct);
    }
    return h;
}

static void meet_reference(float *h)
{
    for (int l = 0; l < MEET_LAYERS; l++)
        for (int i = 0; i < WIDE; i++) {
            const float a = -h[i], b = h[i] * h[i], c = h[i] * 0.5f;
            h[i] = (a + b) + c;
        }
}

START_TEST(test_node_meetings)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s", getenv("BP_TEST_CPU_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_CPU_ADAPTIVE", "0", 1); /* all four threads in every run, never one alone */
    bp_backend *be = bp_backend_init_by_name("CPU", "threads=4");
    ck_assert_plugins(be != NULL, "%s", bp_last_error());
    bp_sched *s = bp_sched_new(&be, NULL, 1, 256, false);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    float *x = malloc(WIDE * sizeof(float)), *expect = malloc(WIDE * sizeof(float));
    float *got = malloc(WIDE * sizeof(float));
    ck_assert(x != NULL && expect != NULL && got != NULL);
    for (int i = 0; i < WIDE; i++)
        x[i] = (float)(i % 97) / 97.0f - 0.5f;
    memcpy(expect, x, WIDE * sizeof(float));
    meet_reference(expect);
    int wrong_runs = 0;
    for (int it = 0; it < 20; it++) {
        bp_context *ctx = bp_context_new(20 * MEET_LAYERS + 4);
        bp_tensor *in = bp_new_tensor_2d(ctx, BP_TYPE_F32, MEET_COLS, WIDE / MEET_COLS);
        bp_set_input(in);
        bp_tensor *out = meet_graph(ctx, in);
        ck_assert_msg(out != NULL, "%s", bp_last_error());
        bp_set_output(out);
        bp_graph *g = bp_graph_new(20 * MEET_LAYERS + 4);
        ck_assert_int_eq(bp_graph_build_forward(g, out), BP_OK);
        ck_assert_msg(bp_sched_alloc_graph(s, g) == BP_OK, "%s", bp_last_error());
        ck_assert_int_eq(bp_tensor_set(in, x, 0, WIDE * sizeof(float)), BP_OK);
        ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
        ck_assert_int_eq(bp_tensor_get(out, got, 0, WIDE * sizeof(float)), BP_OK);
        wrong_runs += memcmp(got, expect, WIDE * sizeof(float)) != 0;
        bp_graph_free(g);
        bp_context_free(ctx);
        bp_sched_reset(s);
    }
    ck_assert_msg(wrong_runs == 0, "%d of 20 runs differ from the reference", wrong_runs);
    free(x);
    free(expect);
    free(got);
    bp_sched_free(s);
    bp_backend_free(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("threads");
    BP_TCASE(s, test_two_threads_share_weights, 300);
    BP_TCASE(s, test_busy_backend_refused, 30);
    BP_TCASE(s, test_busy_scheduler_refused, 30);
    BP_TCASE(s, test_one_meta_device_two_threads, 60);
    BP_TCASE(s, test_shared_cpu_backend_never_crashes, 120);
    BP_TCASE(s, test_node_meetings, 60);
    return bp_test_run(s);
}
