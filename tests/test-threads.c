/* test-threads.c - two threads, each with its own CPU backend (two worker threads each) and its
 * own scheduler, compute the same transformer over one shared set of weights, many times, and
 * every result equals the one computed alone beforehand. Built normally it checks the results;
 * built with --enable-tsan (tools/dev.sh check does) ThreadSanitizer checks that nothing races. */
#include <pthread.h>

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

int main(void)
{
    Suite *s = suite_create("threads");
    BP_TCASE(s, test_two_threads_share_weights, 300);
    return bp_test_run(s);
}
