/* test-util.h - private to tests/: helpers shared by the Check suites. */
#ifndef BP_TEST_UTIL_H
#define BP_TEST_UTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

/* The call returned NULL (or failed) and the error message mentions `needle`. */
#define ck_assert_error_has(status, needle)                                                    \
    do {                                                                                       \
        ck_assert_int_eq(bp_last_status(), (status));                                          \
        ck_assert_msg(strstr(bp_last_error(), (needle)) != NULL,                               \
                      "error message '%s' does not mention '%s'", bp_last_error(), (needle));  \
    } while (0)

#define ck_assert_rejected(expr, status, needle)                                               \
    do {                                                                                       \
        bp_clear_error();                                                                      \
        ck_assert_ptr_null((expr));                                                            \
        ck_assert_error_has((status), (needle));                                               \
    } while (0)

static inline void ck_assert_shape(const bp_tensor *t, long long n0, long long n1, long long n2,
                                   long long n3)
{
    ck_assert_ptr_nonnull(t);
    ck_assert_msg(t->ne[0] == n0 && t->ne[1] == n1 && t->ne[2] == n2 && t->ne[3] == n3,
                  "shape is [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld, %lld]",
                  (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                  (long long)t->ne[3], n0, n1, n2, n3);
}

/* The loader's load report, one record a line on stderr (what `backplane list` shows), so that a
 * test that finds no plugin or device says why instead of only that. */
static inline void bp_test_print_report(void)
{
    const size_t n = bp_plugin_report_count();
    fprintf(stderr, "plugin load report (%zu record%s):\n", n, n == 1 ? "" : "s");
    for (size_t i = 0; i < n; i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        fprintf(stderr, "  %s %s: %s\n", bp_plugin_status_name(r->status), r->path, r->message);
    }
}

/* Fails the test, printing the load report first, unless cond holds. */
#define ck_assert_plugins(cond, ...)                                                           \
    do {                                                                                       \
        if (!(cond))                                                                           \
            bp_test_print_report();                                                            \
        ck_assert_msg((cond), __VA_ARGS__);                                                    \
    } while (0)

/* Runs a suite in fork mode (Check's default) and prints the summary line. */
static inline int bp_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* Adds a test case with one test and a per-case timeout in seconds. */
#define BP_TCASE(suite, fn, timeout)                                                           \
    do {                                                                                       \
        TCase *tc_ = tcase_create(#fn);                                                        \
        tcase_set_timeout(tc_, (timeout));                                                     \
        tcase_add_test(tc_, fn);                                                               \
        suite_add_tcase((suite), tc_);                                                         \
    } while (0)

#endif
