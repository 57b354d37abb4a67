/* test-conformance-meta.c - every conformance case on meta devices over the CPU plugin's devices
 * (BP_CPU_DEVICES=3): Meta(CPU0,CPU1) and Meta(CPU0,CPU1,CPU2), so that each op's split rule,
 * its fallbacks and the gathers and sums of results are checked against the reference like any
 * backend's kernels. */
#include "../common/conformance.h"
#include "test-util.h"

static bp_backend *backend;
static const char *meta_name = "Meta(CPU0,CPU1)";

static void setup(void)
{
    char path[8192];
    snprintf(path, sizeof(path), "%s:%s", getenv("BP_TEST_CPU_PLUGIN_DIR"),
             getenv("BP_TEST_META_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    setenv("BP_CPU_DEVICES", "3", 1);
    backend = bp_backend_init_by_name(meta_name, "threads=1");
    ck_assert_plugins(backend != NULL, "%s: %s", meta_name, bp_last_error());
}

static void teardown(void)
{
    bp_backend_free(backend);
}

START_TEST(test_case)
{
    const struct conf_case *c = &conf_cases[_i];
    char first[512];
    const int failed = conf_run_variants(backend, c, first, sizeof(first));
    ck_assert_msg(failed == 0, "%s on %s: %d of %d variants failed; first: %s", c->name,
                  meta_name, failed, c->n_variants, first);
}
END_TEST

static Suite *suite(const char *name)
{
    meta_name = name;
    Suite *s = suite_create(name);
    TCase *tc = tcase_create("cases");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_case, 0, conf_n_cases);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = bp_test_run(suite("Meta(CPU0,CPU1)")) != EXIT_SUCCESS;
    failed |= bp_test_run(suite("Meta(CPU0,CPU1,CPU2)")) != EXIT_SUCCESS;
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
