/* test-conformance-async.c - the conformance cases on the asynchronous example plugin's device
 * (ASYNC0, examples/example-async-plugin.c): every variant it claims (supports_op) must match
 * the reference, computed through its queue and read back with plain bp_tensor_get (which waits
 * for the queued work), and it must claim the element-wise cases it was written for. */
#include <string.h>

#include "../common/conformance.h"
#include "test-util.h"

static bp_backend *backend;

static void setup(void)
{
    setenv("BP_PLUGIN_PATH", getenv("BP_TEST_ASYNC_PLUGIN_DIR"), 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    backend = bp_backend_init_by_name("ASYNC0", NULL);
    ck_assert_msg(backend != NULL, "ASYNC0: %s", bp_last_error());
}

static void teardown(void)
{
    bp_backend_free(backend);
}

/* The cases the plugin computes (ADD, MUL and SCALE of f32): at least one variant each. */
static bool claimed(const char *name)
{
    return strcmp(name, "add") == 0 || strcmp(name, "mul") == 0 || strcmp(name, "scale") == 0;
}

START_TEST(test_case)
{
    const struct conf_case *c = &conf_cases[_i];
    int passed = 0;
    for (int v = 0; v < c->n_variants; v++) {
        bool unsupported = false;
        char why[512];
        const bool ok = conf_run(backend, c, v, &unsupported, why, sizeof(why));
        ck_assert_msg(ok || unsupported, "%s on ASYNC0: %s", c->name, why);
        passed += ok;
    }
    if (claimed(c->name))
        ck_assert_msg(passed > 0, "%s: ASYNC0 ran none of %d variants", c->name, c->n_variants);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("conformance-async");
    TCase *tc = tcase_create("cases");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_case, 0, conf_n_cases);
    suite_add_tcase(s, tc);
    return bp_test_run(s);
}
