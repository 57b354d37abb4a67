/* test-conformance-cpu.c - every conformance case on the CPU plugin, once per build variant
 * this machine can run (x86_64, avx2, avx512), with 2 and 3 threads (3 splits rows unevenly).
 *
 * A plugin loads once per process, so each variant runs in a child process of its own; a
 * variant the CPU cannot run is reported as not tested (and the run fails if none can run). */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/conformance.h"
#include "test-util.h"

static bp_backend *backend;
static int n_threads = 2;

static void setup(void)
{
    char params[32];
    snprintf(params, sizeof(params), "threads=%d", n_threads);
    backend = bp_backend_init_by_name("CPU", params);
    ck_assert_msg(backend != NULL, "no CPU backend: %s", bp_last_error());
}

static void teardown(void)
{
    bp_backend_free(backend);
}

START_TEST(test_case)
{
    const struct conf_case *c = &conf_cases[_i];
    char first[512];
    /* The CPU plugin claims every case: an unsupported one is a failure too. */
    const int failed = conf_run_variants(backend, c, first, sizeof(first));
    ck_assert_msg(failed == 0, "%s: %d of %d variants failed; first: %s", c->name, failed,
                  c->n_variants, first);
}
END_TEST

START_TEST(test_supports_op_is_exact)
{
    /* Things the CPU kernels do not do must be declined, not attempted. */
    bp_context *ctx = bp_context_new(16);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 4);
    bp_tensor *bt = bp_transpose(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 8)); /* nb0 != 4 */
    ck_assert(bp_backend_supports_op(backend, bp_add(ctx, a, a)));
    ck_assert(!bp_backend_supports_op(backend, bp_mul_mat(ctx, a, bt)));
    ck_assert(!bp_backend_supports_op(backend, bp_add_inplace(ctx, bt, bt)));
    bp_tensor *q = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 2);
    ck_assert(!bp_backend_supports_op(backend,
                                      bp_cpy(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 32, 4), q)));
    /* The activation types are no weights: no kernel multiplies Q8_1 or Q8_K rows. */
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 256, 3);
    ck_assert(!bp_backend_supports_op(backend,
                                      bp_mul_mat(ctx, bp_new_tensor_2d(ctx, BP_TYPE_Q8_1, 256, 4), x)));
    ck_assert(!bp_backend_supports_op(backend,
                                      bp_mul_mat(ctx, bp_new_tensor_2d(ctx, BP_TYPE_Q8_K, 256, 4), x)));
    ck_assert(bp_backend_supports_op(backend,
                                     bp_mul_mat(ctx, bp_new_tensor_2d(ctx, BP_TYPE_IQ4_NL, 256, 4), x)));
    bp_context_free(ctx);
}
END_TEST

static int run_variant(const char *path, bool no_amx)
{
    if (no_amx)
        setenv("BP_CPU_AMX", "0", 1);
    bp_plugin *p = bp_plugin_load(path);
    if (p == NULL) {
        printf("variant %s: not loaded here (%s)\n", path, bp_last_error());
        return 77;
    }
    bp_device *dev = bp_device_by_name("CPU");
    printf("variant %s%s: %s\n", path, no_amx ? " with BP_CPU_AMX=0" : "",
           dev ? bp_device_get_description(dev) : "no CPU device");
    int failed = 0;
    for (int t = 2; t <= 3; t++) {
        n_threads = t;
        char name[64];
        snprintf(name, sizeof(name), "conformance-cpu-%s%s-%dt", bp_plugin_get_variant(p),
                 no_amx ? "-noamx" : "", t);
        Suite *s = suite_create(name);
        TCase *tc = tcase_create("cases");
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_loop_test(tc, test_case, 0, conf_n_cases);
        tcase_add_test(tc, test_supports_op_is_exact);
        suite_add_tcase(s, tc);
        if (bp_test_run(s) != EXIT_SUCCESS)
            failed = 1;
    }
    return failed;
}

int main(void)
{
    const char *dir = getenv("BP_TEST_CPU_PLUGIN_DIR");
    if (dir == NULL) {
        fprintf(stderr, "BP_TEST_CPU_PLUGIN_DIR is not set (run through make check)\n");
        return 99;
    }
    /* The avx512 variant runs twice: with its AMX kernels where the CPU has them, and with
     * them turned off (BP_CPU_AMX=0), so that both paths are tested on an AMX machine. */
    static const struct {
        const char *file;
        bool no_amx;
    } variants[] = {{"backplane-cpu-x86_64.so", false}, {"backplane-cpu-avx2.so", false},
                    {"backplane-cpu-avx512.so", false}, {"backplane-cpu-avx512.so", true},
                    {"backplane-cpu.so", false}};
    int ran = 0, failed = 0;
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, variants[i].file);
        if (access(path, R_OK) != 0)
            continue;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0)
            _exit(run_variant(path, variants[i].no_amx));
        int status = 0;
        waitpid(pid, &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        if (code == 77)
            continue;
        ran++;
        failed += code != 0;
    }
    printf("CPU variants tested: %d, failed: %d\n", ran, failed);
    if (ran == 0)
        return 1; /* nothing ran: that is a failure, not a pass */
    return failed ? 1 : 0;
}
