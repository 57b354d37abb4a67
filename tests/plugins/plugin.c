/* plugin.c - private to tests/: one source for every loader test plugin. Each plugin in
 * Makefile.am compiles it with its own PLUGIN_* settings:
 *   PLUGIN_NAME, PLUGIN_VARIANT   what the descriptor says (must match the file name)
 *   REG_NAME, DEV_PREFIX, N_DEV   the registry it makes (the fake accelerator of test-device.c)
 *   SCORE                         what its score function returns (no score function if unset)
 *   FEATURES                      BP_CPU_* bits it requires
 *   MODE_BAD_ABI                  descriptor claims the next plugin API major
 *   MODE_NO_ENTRY                 exports no descriptor at all
 *   MODE_INIT_NULL                init fails (with a reason)
 *   MODE_MUST_NOT_INIT            init aborts: the loader must refuse the plugin before it
 *   MODE_NEEDS_LIB                init calls into libbpmissing.so, which is never installed
 *   MODE_OP_SUBSET                an accelerator with a partial op set and a host buffer
 *                                 type, like a GPU (scheduler tests); $BP_TEST_ACCEL_WRONG_OP
 *                                 names an op it then computes wrongly, $BP_TEST_ACCEL_NO_OP
 *                                 one it then declines
 *   MODE_INIT_CRASH               init dereferences a null pointer (probing tests)
 *   MODE_SWAP_ON_INIT             init renames $BP_TEST_SWAP_FROM over $BP_TEST_SWAP_TO (its own
 *                                 file, in the test that the file checked is the file loaded)
 *   MODE_LIE                      its first device breaks the plugin API in the way that
 *                                 $BP_TEST_LIE names (test_device_set_lie in test-device.h) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test-device.h"

#ifndef PLUGIN_VARIANT
#define PLUGIN_VARIANT ""
#endif
#ifndef FEATURES
#define FEATURES 0
#endif
#ifndef N_DEV
#define N_DEV 1
#endif

#ifdef MODE_NEEDS_LIB
int bp_missing_answer(void);
#endif

static bp_registry *plugin_init(void)
{
#if defined(MODE_MUST_NOT_INIT)
    abort();
#elif defined(MODE_INIT_CRASH)
    raise(SIGSEGV); /* what a null dereference would do, without the undefined behaviour */
    return NULL;
#elif defined(MODE_INIT_NULL)
    bp_set_error(BP_ERR_BACKEND, "%s: no devices today", PLUGIN_NAME);
    return NULL;
#else
#ifdef MODE_NEEDS_LIB
    if (bp_missing_answer() != 42)
        return NULL;
#endif
#ifdef MODE_OP_SUBSET
    test_device_set_op_subset(true);
    test_device_set_host_buffer(true);
    /* BP_TEST_ACCEL_WRONG_OP=MUL_MAT: a device with a broken kernel, for the tests of
     * `backplane conformance`. */
    const char *wrong = getenv("BP_TEST_ACCEL_WRONG_OP");
    for (int op = 0; wrong != NULL && op < BP_OP_COUNT; op++)
        if (strcmp(bp_op_name((enum bp_op)op), wrong) == 0)
            test_device_set_wrong_op(op);
    /* BP_TEST_ACCEL_NO_OP=MUL_MAT_ID: a device without that kernel, for `backplane run`. */
    const char *no = getenv("BP_TEST_ACCEL_NO_OP");
    for (int op = 0; no != NULL && op < BP_OP_COUNT; op++)
        if (strcmp(bp_op_name((enum bp_op)op), no) == 0)
            test_device_set_declined_op(op);
#endif
#ifdef MODE_LIE
    test_device_set_lie(getenv("BP_TEST_LIE"));
#endif
#ifdef MODE_SWAP_ON_INIT
    const char *from = getenv("BP_TEST_SWAP_FROM"), *to = getenv("BP_TEST_SWAP_TO");
    if (from != NULL && to != NULL)
        (void)rename(from, to); /* the second init (after the probe's) finds nothing to move */
#endif
    return test_device_registry_new_named(REG_NAME, DEV_PREFIX, N_DEV, 0);
#endif
}

#ifdef SCORE
static int plugin_score(void)
{
    return SCORE;
}
#define SCORE_FN plugin_score
#else
#define SCORE_FN NULL
#endif

#if defined(MODE_NO_ENTRY)
/* Exports an init function but no descriptor: the loader must not guess. */
BP_API bp_registry *(*const not_a_descriptor)(void) = plugin_init;
#elif defined(MODE_BAD_ABI)
BP_API const struct bp_plugin_descriptor bp_plugin_descriptor = {
    .struct_size = sizeof(struct bp_plugin_descriptor),
    .api_major = BP_PLUGIN_API_MAJOR + 1,
    .api_minor = 0,
    .name = PLUGIN_NAME,
    .variant = PLUGIN_VARIANT,
    .init = plugin_init,
};
#else
BP_PLUGIN_DEFINE(PLUGIN_NAME, PLUGIN_VARIANT, FEATURES, plugin_init, SCORE_FN);
#endif
