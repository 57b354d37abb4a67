/* test-async.c - the asynchronous-plugin contract of bp-plugin.h, over the asynchronous example
 * plugin (examples/example-async-plugin.c, device ASYNC0) and the CPU: plain calls ordered after
 * queued work, events across two backends and across plugins, deadlines that pass while a
 * worker is held busy, worker errors reported once, free waiting, and the scheduler over ASYNC0
 * giving the CPU's results. The plugin's test hooks hold a worker and inject a failure. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <backplane/bp-plugin.h>

#include "test-util.h"
#include "tf-model.h"

#define N 1000

/* expr returns status, and bp_last_error() mentions needle. */
#define ASSERT_FAILS(expr, status, needle)                                                     \
    do {                                                                                       \
        ck_assert_int_eq((expr), (status));                                                    \
        ck_assert_error_has((status), (needle));                                               \
    } while (0)

static bp_backend *a, *b, *cpu;
static void (*hold)(bp_backend *be, bool on);
static void (*fail_next)(bp_backend *be);

static void setup(void)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_ASYNC_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    a = bp_backend_init_by_name("ASYNC0", NULL);
    b = bp_backend_init_by_name("ASYNC0", NULL);
    cpu = bp_backend_init_by_name("CPU", "threads=2");
    ck_assert_msg(a && b && cpu, "backends: %s", bp_last_error());
    bp_registry *reg = bp_device_get_registry(bp_backend_get_device(a));
    void *p = bp_registry_get_proc_address(reg, "example_async_hold");
    void *q = bp_registry_get_proc_address(reg, "example_async_fail_next");
    ck_assert(p != NULL && q != NULL);
    memcpy(&hold, &p, sizeof(p));
    memcpy(&fail_next, &q, sizeof(q));
}

static void teardown(void)
{
    bp_backend_free(a);
    bp_backend_free(b);
    bp_backend_free(cpu);
}

/* x, y (inputs) and out = (x + y) * 2 in one context, placed in buft; x[i] = i, y[i] = 1. */
struct prog {
    bp_context *ctx;
    bp_buffer *buf;
    bp_tensor *x, *y, *out;
    bp_graph *g;
};

static void prog_init(struct prog *p, bp_buffer_type *buft)
{
    p->ctx = bp_context_new(8);
    p->x = bp_new_tensor_1d(p->ctx, BP_TYPE_F32, N);
    p->y = bp_new_tensor_1d(p->ctx, BP_TYPE_F32, N);
    p->out = bp_scale(p->ctx, bp_add(p->ctx, p->x, p->y), 2.0f);
    p->buf = bp_alloc_ctx_tensors(p->ctx, buft);
    ck_assert_msg(p->buf != NULL, "%s", bp_last_error());
    p->g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(p->g, p->out), BP_OK);
    float x[N], y[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = 1.0f;
    }
    ck_assert_int_eq(bp_tensor_set(p->x, x, 0, sizeof(x)), BP_OK);
    ck_assert_int_eq(bp_tensor_set(p->y, y, 0, sizeof(y)), BP_OK);
}

static void prog_free(struct prog *p)
{
    bp_graph_free(p->g);
    bp_buffer_free(p->buf);
    bp_context_free(p->ctx);
}

/* out (read with plain bp_tensor_get) is (x + y) * 2 elementwise, y = 1 as prog_init set it
 * and x[i] = x_scale * i + x_add. */
static void assert_result(const bp_tensor *out, float x_scale, float x_add)
{
    float got[N];
    ck_assert_int_eq(bp_tensor_get(out, got, 0, sizeof(got)), BP_OK);
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == ((float)i * x_scale + x_add + 1.0f) * 2.0f, "element %d is %g", i,
                      (double)got[i]);
}

/* Releases the worker of backend arg after 100 ms (so that the caller is blocked by then). */
static void *release_later(void *arg)
{
    usleep(100 * 1000);
    hold(arg, false);
    return NULL;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

START_TEST(test_caps_and_version)
{
    struct bp_device_caps caps;
    bp_device_get_caps(bp_backend_get_device(a), &caps);
    ck_assert(caps.async && caps.events && !caps.host_buffer);
    int major = 0, minor = 0;
    bp_registry_get_api_version(bp_device_get_registry(bp_backend_get_device(a)), &major, &minor);
    ck_assert_int_eq(major, BP_PLUGIN_API_MAJOR);
    ck_assert_int_eq(minor, 1);
    ck_assert_int_eq(BP_PLUGIN_API_MINOR, 1);
}
END_TEST

/* A plain get after an asynchronous compute waits for it: the worker is held while the get is
 * made and released 100 ms later, and the get still returns the result. */
START_TEST(test_plain_get_waits_for_queued_work)
{
    struct prog p;
    prog_init(&p, bp_backend_get_default_buffer_type(a));
    hold(a, true);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, release_later, a), 0);
    const double t0 = now_s();
    assert_result(p.out, 1.0f, 0.0f);
    ck_assert_double_ge(now_s() - t0, 0.05); /* it did wait */
    pthread_join(t, NULL);
    ck_assert_int_eq(bp_backend_synchronize(a), BP_OK);
    prog_free(&p);
}
END_TEST

/* A deadline that passes while the worker is held: BP_ERR_TIMEOUT with a sentence, the work
 * still queued; waiting again after the release succeeds and the result is there. */
START_TEST(test_synchronize_deadline)
{
    struct prog p;
    prog_init(&p, bp_backend_get_default_buffer_type(a));
    hold(a, true);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    const double t0 = now_s();
    ck_assert_int_eq(bp_backend_synchronize_timeout(a, 30 * 1000 * 1000), BP_ERR_TIMEOUT);
    ck_assert_double_ge(now_s() - t0, 0.025);
    ck_assert_error_has(BP_ERR_TIMEOUT, "ASYNC0");
    ck_assert_int_eq(bp_backend_synchronize_timeout(a, 0), BP_ERR_TIMEOUT); /* only looks */
    hold(a, false);
    ck_assert_msg(bp_backend_synchronize_timeout(a, 10LL * 1000 * 1000 * 1000) == BP_OK, "%s",
                  bp_last_error());
    assert_result(p.out, 1.0f, 0.0f);
    ck_assert_int_eq(bp_backend_synchronize_timeout(a, 0), BP_OK); /* nothing left */
    prog_free(&p);
}
END_TEST

/* Arguments, and a backend without a deadline-aware wait (the CPU): waited for as before. */
START_TEST(test_deadline_arguments)
{
    ASSERT_FAILS(bp_backend_synchronize_timeout(a, -1), BP_ERR_INVALID_ARG, "negative");
    ASSERT_FAILS(bp_backend_synchronize_timeout(NULL, 0), BP_ERR_INVALID_ARG, "NULL");
    ASSERT_FAILS(bp_event_synchronize_timeout(NULL, 0), BP_ERR_INVALID_ARG, "NULL");
    ck_assert_int_eq(bp_backend_synchronize_timeout(cpu, 0), BP_OK);
    bp_event *ev = bp_event_new(bp_backend_get_device(a));
    ck_assert_ptr_nonnull(ev);
    ASSERT_FAILS(bp_event_synchronize_timeout(ev, -5), BP_ERR_INVALID_ARG, "negative");
    ck_assert_int_eq(bp_event_synchronize_timeout(ev, 0), BP_OK); /* never recorded */
    bp_event_free(ev);
}
END_TEST

/* Recorded on ASYNC backend a, waited for by the CPU backend (another plugin: the caller
 * blocks), then by the caller with a deadline: it passes while a is held, and once a is
 * released the event happens and the CPU computes with a's result. */
START_TEST(test_event_async_to_cpu)
{
    struct prog p, q;
    prog_init(&p, bp_backend_get_default_buffer_type(a));
    prog_init(&q, bp_backend_get_default_buffer_type(cpu));
    bp_event *ev = bp_event_new(bp_backend_get_device(a));
    ck_assert_ptr_nonnull(ev);
    hold(a, true);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    ck_assert_int_eq(bp_event_record(ev, a), BP_OK);
    ck_assert_int_eq(bp_event_synchronize_timeout(ev, 20 * 1000 * 1000), BP_ERR_TIMEOUT);
    ck_assert_error_has(BP_ERR_TIMEOUT, "event");
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, release_later, a), 0);
    ck_assert_int_eq(bp_event_wait(ev, cpu), BP_OK); /* blocks until the release */
    pthread_join(t, NULL);
    ck_assert_int_eq(bp_event_synchronize_timeout(ev, 0), BP_OK);
    /* The CPU's x becomes a's result ((i + 1) * 2); its out is then ((2i + 2) + 1) * 2. */
    float r[N];
    ck_assert_int_eq(bp_tensor_get(p.out, r, 0, sizeof(r)), BP_OK);
    ck_assert_int_eq(bp_tensor_set(q.x, r, 0, sizeof(r)), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute(cpu, q.g), BP_OK);
    float got[N];
    ck_assert_int_eq(bp_tensor_get(q.out, got, 0, sizeof(got)), BP_OK);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(got[i], ((float)(i + 1) * 2.0f + 1.0f) * 2.0f);
    ck_assert_int_eq(bp_backend_synchronize_timeout(a, 1000LL * 1000 * 1000), BP_OK);
    bp_event_free(ev);
    prog_free(&q);
    prog_free(&p);
}
END_TEST

/* Two ASYNC backends: b's compute waits (queued, the caller goes on) for an event a records
 * after computing its input. While a is held, b's deadline passes; after, b sees a's result. */
START_TEST(test_event_between_async_backends)
{
    struct prog p, q;
    bp_buffer_type *buft = bp_backend_get_default_buffer_type(a);
    prog_init(&p, buft);
    prog_init(&q, buft);
    /* q's x is p's out: a view of it would do too; a queued copy keeps the graphs apart */
    bp_event *ev = bp_event_new(bp_backend_get_device(a));
    hold(a, true);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    ck_assert_int_eq(bp_event_record(ev, a), BP_OK);
    ck_assert_int_eq(bp_event_wait(ev, b), BP_OK); /* queued on b: returns at once */
    ck_assert_int_eq(bp_backend_tensor_copy_async(b, b, p.out, q.x), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute_async(b, q.g), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize_timeout(b, 20 * 1000 * 1000), BP_ERR_TIMEOUT);
    bp_event_free(ev); /* while b's wait on it is still queued */
    hold(a, false);
    ck_assert_int_eq(bp_backend_synchronize_timeout(b, 10LL * 1000 * 1000 * 1000), BP_OK);
    assert_result(q.out, 2.0f, 2.0f); /* q.x = p.out = (i + 1) * 2 */
    prog_free(&q);
    prog_free(&p);
}
END_TEST

/* A failure in the worker: the compute call itself succeeds (it only queued), the next
 * synchronize returns the error with the plugin's sentence, once; the one after is BP_OK. The
 * same through the deadline-aware wait, and an unsupported op is refused when queued. */
START_TEST(test_worker_error_reported_once)
{
    struct prog p;
    prog_init(&p, bp_backend_get_default_buffer_type(a));
    fail_next(a);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK); /* runs after the failure */
    ck_assert_int_eq(bp_backend_synchronize(a), BP_ERR_BACKEND);
    ck_assert_error_has(BP_ERR_BACKEND, "ASYNC0: a queued graph failed");
    ck_assert_int_eq(bp_backend_synchronize(a), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize(a), BP_OK);
    assert_result(p.out, 1.0f, 0.0f); /* the second graph ran */

    fail_next(a);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize_timeout(a, 10LL * 1000 * 1000 * 1000),
                     BP_ERR_BACKEND);
    ck_assert_int_eq(bp_backend_synchronize_timeout(a, 0), BP_OK);

    /* bp_backend_graph_compute (compute and wait) reports it at once */
    fail_next(a);
    ck_assert_int_eq(bp_backend_graph_compute(a, p.g), BP_ERR_BACKEND);
    ck_assert_int_eq(bp_backend_synchronize(a), BP_OK);

    bp_context *ctx = bp_context_new(4);
    bp_tensor *x = bp_new_tensor_1d(ctx, BP_TYPE_F32, 4);
    bp_tensor *e = bp_exp(ctx, x);
    bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(a));
    bp_graph *g = bp_graph_new(4);
    ck_assert_int_eq(bp_graph_build_forward(g, e), BP_OK);
    ASSERT_FAILS(bp_backend_graph_compute_async(a, g), BP_ERR_UNSUPPORTED, "not supported");
    ck_assert_int_eq(bp_backend_synchronize(a), BP_OK); /* nothing was queued */
    bp_graph_free(g);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    prog_free(&p);
}
END_TEST

/* Freeing a backend with work queued (held, released later by another thread) waits for it. */
START_TEST(test_free_waits)
{
    struct prog p;
    prog_init(&p, bp_backend_get_default_buffer_type(a));
    hold(a, true);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, release_later, a), 0);
    bp_backend_free(a);
    a = NULL;
    pthread_join(t, NULL);
    assert_result(p.out, 1.0f, 0.0f);
    prog_free(&p);
}
END_TEST

/* Async set and get: data is read and written by the worker, in order, before synchronize. */
START_TEST(test_async_set_get)
{
    struct prog p;
    prog_init(&p, bp_backend_get_default_buffer_type(a));
    float x[N], got[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(3 * i);
    ck_assert_int_eq(bp_backend_tensor_set_async(a, p.x, x, 0, sizeof(x)), BP_OK);
    ck_assert_int_eq(bp_backend_graph_compute_async(a, p.g), BP_OK);
    ck_assert_int_eq(bp_backend_tensor_get_async(a, p.out, got, 0, sizeof(got)), BP_OK);
    ck_assert_int_eq(bp_backend_synchronize(a), BP_OK);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(got[i], ((float)(3 * i) + 1.0f) * 2.0f);
    prog_free(&p);
}
END_TEST

static const struct tf_config tiny = {.n_layer = 2, .n_embd = 32, .n_ff = 48, .n_head = 4,
                                      .n_vocab = 50, .n_tok = 5, .wtype = BP_TYPE_F32};

/* Logits of one forward pass of the tiny transformer through a scheduler over backends. */
static float *run(bp_backend *const *backends, int n, bool parallel, bp_buffer_type *wbuft,
                  int *n_splits)
{
    struct model m;
    model_init(&m, &tiny, wbuft);
    bp_context *ctx = bp_context_new(tf_graph_n_tensors(&tiny));
    struct tf_graph tg;
    ck_assert(tf_build(ctx, &tiny, &m.w, &tg));
    bp_graph *g = bp_graph_new(tf_graph_n_tensors(&tiny) + tf_weights_n_tensors(&tiny));
    ck_assert_int_eq(bp_graph_build_forward(g, tg.logits), BP_OK);
    bp_sched *s = bp_sched_new(backends, NULL, n, 4096, parallel);
    ck_assert_msg(s != NULL, "%s", bp_last_error());
    ck_assert_int_eq(bp_sched_alloc_graph(s, g), BP_OK);
    set_inputs(&tg, &tiny, 0);
    ck_assert_msg(bp_sched_graph_compute(s, g) == BP_OK, "%s", bp_last_error());
    *n_splits = bp_sched_get_n_splits(s);
    const size_t bytes = bp_nbytes(tg.logits);
    float *out = malloc(bytes);
    ck_assert_int_eq(bp_tensor_get(tg.logits, out, 0, bytes), BP_OK);
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    model_free(&m);
    return out;
}

/* The scheduler over ASYNC0 and the CPU (the element-wise ops on ASYNC0, the rest on the CPU,
 * copies and events between them) computes what the CPU alone computes, with weights on
 * either side, and with parallel copy sets. */
START_TEST(test_sched_matches_cpu)
{
    bp_backend *both[2] = {a, cpu}, *alone[1] = {cpu};
    const int64_t n = (int64_t)tiny.n_vocab * tiny.n_tok;
    int splits = 0;
    float *ref = run(alone, 1, false, bp_host_buffer_type(), &splits);
    bp_buffer_type *wbufts[2] = {bp_backend_get_default_buffer_type(a), bp_host_buffer_type()};
    for (int w = 0; w < 2; w++)
        for (int par = 0; par < 2; par++) {
            float *got = run(both, 2, par, wbufts[w], &splits);
            if (w == 0)
                ck_assert_int_gt(splits, 1); /* both backends had work */
            assert_close_nmse(got, ref, n, 1e-9);
            free(got);
        }
    free(ref);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("async");
    TCase *tc = tcase_create("contract");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_caps_and_version);
    tcase_add_test(tc, test_plain_get_waits_for_queued_work);
    tcase_add_test(tc, test_synchronize_deadline);
    tcase_add_test(tc, test_deadline_arguments);
    tcase_add_test(tc, test_event_async_to_cpu);
    tcase_add_test(tc, test_event_between_async_backends);
    tcase_add_test(tc, test_worker_error_reported_once);
    tcase_add_test(tc, test_free_waits);
    tcase_add_test(tc, test_async_set_get);
    tcase_add_test(tc, test_sched_matches_cpu);
    suite_add_tcase(s, tc);
    return bp_test_run(s);
}
