/* test-faults.c - every allocation the runtime makes while loading the CPU and accelerator
 * plugins, building a transformer graph, scheduling it over both and computing it is made to
 * fail in turn (BP_FAIL_ALLOC_AFTER=N, N = 0, 1, 2, ...: runtime/mem.c). Each N runs in a child
 * process of its own, which must either finish with the right logits or stop at a call that
 * returned an error status with a message - never crash, never report success with a wrong
 * result. In the ASan build, LeakSanitizer checks at each child's exit that the failure path
 * freed everything. The walk ends at the first N past the sequence's last allocation.
 *
 * Without fault injection compiled in (--disable-fault-injection) it exits 77. */
#include "config.h"

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test-util.h"
#include "tf-model.h"

#define MAX_N 20000

enum outcome { DONE = 0, FAILED_CLEANLY = 1, WRONG = 2 };

static bool injected;
static char injected_msg[256];

static void on_log(enum bp_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    if (strncmp(msg, "fault injection:", 16) == 0) {
        injected = true;
        snprintf(injected_msg, sizeof(injected_msg), "%s", msg);
    }
}

static const struct tf_config cfg = {.n_layer = 2, .n_embd = 32, .n_ff = 64, .n_head = 4,
                                     .n_vocab = 40, .n_tok = 4, .wtype = BP_TYPE_Q8_0};
#define N_LOGITS (40 * 4)

/* A failed call must have left a status and a sentence. */
static enum outcome failed(const char *what)
{
    if (bp_last_status() == BP_OK || bp_last_error()[0] == '\0') {
        fprintf(stderr, "%s failed without an error status or message\n", what);
        return WRONG;
    }
    return FAILED_CLEANLY;
}

/* Everything below fails softly: returns where the first error surfaced, freeing what exists. */
static enum outcome scenario(float *logits)
{
    enum outcome r = DONE;
    bp_backend *be[2] = {NULL, NULL};
    bp_context *wctx = NULL, *ctx = NULL;
    bp_buffer *wbuf = NULL;
    bp_graph *g = NULL;
    bp_sched *s = NULL;
    struct tf_weights w = {0};
    struct tf_graph tg;

    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_ACCEL_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    if (bp_plugin_load_all() != BP_OK) {
        r = failed("bp_plugin_load_all");
        goto out;
    }
    be[0] = bp_backend_init_by_name("ACCEL0", NULL);
    if (be[0] == NULL) {
        r = failed("bp_backend_init_by_name(ACCEL0)");
        goto out;
    }
    be[1] = bp_backend_init_by_name("CPU", "threads=2");
    if (be[1] == NULL) {
        r = failed("bp_backend_init_by_name(CPU)");
        goto out;
    }
    wctx = bp_context_new(tf_weights_n_tensors(&cfg));
    if (wctx == NULL || !tf_weights_new(wctx, &cfg, &w)) {
        r = failed("describing the weights");
        goto out;
    }
    wbuf = bp_alloc_ctx_tensors(wctx, bp_backend_get_default_buffer_type(be[0]));
    if (wbuf == NULL) {
        r = failed("bp_alloc_ctx_tensors");
        goto out;
    }
    bp_buffer_set_usage(wbuf, BP_BUFFER_USAGE_WEIGHTS);
    /* fill the weights deterministically */
    for (size_t i = 0; i < bp_context_get_n_tensors(wctx); i++) {
        bp_tensor *t = bp_context_get_tensor(wctx, i);
        const int64_t n0 = t->ne[0];
        float row[256];
        char conv[1024];
        for (int64_t rr = 0; rr < bp_nrows(t); rr++) {
            for (int64_t k = 0; k < n0; k++)
                row[k] = (float)((int)((i * 31 + (size_t)(rr * 7 + k * 13)) % 17) - 8) / 16.0f;
            bp_type_get_traits(t->type)->from_float(row, conv, n0);
            if (bp_tensor_set(t, conv, (size_t)rr * t->nb[1], bp_row_size(t->type, n0)) != BP_OK) {
                r = failed("bp_tensor_set");
                goto out;
            }
        }
    }
    ctx = bp_context_new(tf_graph_n_tensors(&cfg));
    if (ctx == NULL || !tf_build(ctx, &cfg, &w, &tg)) {
        r = failed("building the graph");
        goto out;
    }
    g = bp_graph_new(tf_graph_n_tensors(&cfg) + tf_weights_n_tensors(&cfg));
    if (g == NULL || bp_graph_build_forward(g, tg.logits) != BP_OK) {
        r = failed("bp_graph_build_forward");
        goto out;
    }
    s = bp_sched_new(be, NULL, 2, 1024, false);
    if (s == NULL) {
        r = failed("bp_sched_new");
        goto out;
    }
    if (bp_sched_alloc_graph(s, g) != BP_OK) {
        r = failed("bp_sched_alloc_graph");
        goto out;
    }
    int32_t tok[4] = {1, 7, 3, 30}, pos[4] = {0, 1, 2, 3};
    uint16_t mask[16];
    for (int i = 0; i < 16; i++)
        mask[i] = bp_fp32_to_fp16(i % 4 <= i / 4 ? 0.0f : -INFINITY);
    if (bp_tensor_set(tg.tokens, tok, 0, sizeof(tok)) != BP_OK ||
        bp_tensor_set(tg.pos, pos, 0, sizeof(pos)) != BP_OK ||
        bp_tensor_set(tg.mask, mask, 0, sizeof(mask)) != BP_OK) {
        r = failed("setting the inputs");
        goto out;
    }
    if (bp_sched_graph_compute(s, g) != BP_OK) {
        r = failed("bp_sched_graph_compute");
        goto out;
    }
    if (bp_tensor_get(tg.logits, logits, 0, N_LOGITS * sizeof(float)) != BP_OK) {
        r = failed("bp_tensor_get");
        goto out;
    }
out:
    bp_sched_free(s);
    bp_graph_free(g);
    bp_context_free(ctx);
    bp_buffer_free(wbuf);
    bp_context_free(wctx);
    free(w.layers);
    bp_backend_free(be[0]);
    bp_backend_free(be[1]);
    return r;
}

/* Runs the scenario in a child with BP_FAIL_ALLOC_AFTER=n (-1: none). Child exit codes: the
 * outcome, plus 8 when the injected failure happened. */
static int run_child(long n, const float *expect, float *got)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (n >= 0) {
            char v[32];
            snprintf(v, sizeof(v), "%ld", n);
            setenv("BP_FAIL_ALLOC_AFTER", v, 1);
        }
        bp_log_set_callback(on_log, NULL);
        bp_log_set_level(BP_LOG_WARN);
        float logits[N_LOGITS];
        enum outcome r = scenario(logits);
        if (r == DONE && expect != NULL) {
            for (int i = 0; i < N_LOGITS; i++)
                if (fabsf(logits[i] - expect[i]) > 1e-5f * (1.0f + fabsf(expect[i])))
                    r = WRONG;
        }
        if (r == DONE && expect == NULL && /* the baseline run reports its logits */
            write(fds[1], logits, sizeof(logits)) != (ssize_t)sizeof(logits))
            r = WRONG;
        close(fds[1]);
        if (injected && getenv("BP_TEST_VERBOSE") != NULL)
            fprintf(stderr, "%s: %s\n", r == DONE ? "absorbed" : "stopped", injected_msg);
        _exit((int)r + (injected ? 8 : 0));
    }
    close(fds[1]);
    if (got != NULL && read(fds[0], got, N_LOGITS * sizeof(float)) != N_LOGITS * sizeof(float))
        got[0] = NAN;
    close(fds[0]);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    if (WIFSIGNALED(st)) {
        fprintf(stderr, "BP_FAIL_ALLOC_AFTER=%ld: killed by signal %d\n", n, WTERMSIG(st));
        return -1;
    }
    return WEXITSTATUS(st);
}

int main(void)
{
#ifndef BP_FAULT_INJECTION
    printf("SKIP: built with --disable-fault-injection\n");
    return 77;
#else
    float expect[N_LOGITS];
    int rc = run_child(-1, NULL, expect);
    if (rc != DONE || isnan(expect[0])) {
        fprintf(stderr, "the scenario fails without any injected fault (exit %d, %g)\n", rc,
                expect[0]);
        return 1;
    }
    long n = 0, clean = 0, survived = 0;
    for (; n < MAX_N; n++) {
        rc = run_child(n, expect, NULL);
        if (rc == DONE) /* the injection never fired: past the last allocation */
            break;
        if (rc == FAILED_CLEANLY + 8) {
            clean++;
        } else if (rc == DONE + 8) {
            survived++; /* the failure was handled and the result is still right */
        } else {
            fprintf(stderr, "BP_FAIL_ALLOC_AFTER=%ld: child exit %d (outcome %d, injected %s)\n",
                    n, rc, rc & 7, rc & 8 ? "yes" : "no");
            printf("0 passed, 1 failed\n");
            return 1;
        }
    }
    if (n == MAX_N) {
        fprintf(stderr, "more than %d allocations: raise MAX_N\n", MAX_N);
        return 1;
    }
    printf("fault injection: %ld allocations, each failed once: %ld stopped with an error "
           "status and message, %ld were absorbed with the result still right; no crash\n", n,
           clean, survived);
    printf("%ld passed, 0 failed\n", n);
    return 0;
#endif
}
