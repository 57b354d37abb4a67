/* test-runtime-util.c - the runtime's internal helpers: array growth (bp__grow in mem.c).
 *
 * These helpers are hidden inside the library, so this program is built from their source
 * files (and the error and log files they report through) instead of linking libbackplane. */
#include "config.h"

#include <stdint.h>

#include "test-util.h"
#include "../runtime/bp-impl.h"

START_TEST(test_grow_keeps_contents)
{
    int *a = NULL;
    size_t cap = 0;
    for (size_t n = 0; n < 1000; n++) {
        ck_assert(bp__grow((void **)&a, &cap, n + 1, sizeof(*a), "a test array"));
        ck_assert_uint_ge(cap, n + 1);
        a[n] = (int)n * 3;
    }
    for (size_t n = 0; n < 1000; n++)
        ck_assert_int_eq(a[n], (int)n * 3);
    bp__free(a);
}
END_TEST

START_TEST(test_grow_doubles)
{
    char *a = NULL;
    size_t cap = 0;
    ck_assert(bp__grow((void **)&a, &cap, 1, 1, "a test array"));
    ck_assert_uint_eq(cap, 8);
    ck_assert(bp__grow((void **)&a, &cap, 9, 1, "a test array"));
    ck_assert_uint_eq(cap, 16);
    ck_assert(bp__grow((void **)&a, &cap, 100, 1, "a test array"));
    ck_assert_uint_eq(cap, 128);
    /* Enough room already: nothing changes. */
    char *same = a;
    ck_assert(bp__grow((void **)&a, &cap, 50, 1, "a test array"));
    ck_assert_ptr_eq(a, same);
    ck_assert_uint_eq(cap, 128);
    bp__free(a);
}
END_TEST

START_TEST(test_grow_refuses_overflow)
{
    int *a = NULL;
    size_t cap = 0;
    ck_assert(bp__grow((void **)&a, &cap, 4, sizeof(*a), "a test array"));
    a[3] = 42;
    int *before = a;
    bp_clear_error();
    ck_assert(!bp__grow((void **)&a, &cap, SIZE_MAX / 2, sizeof(*a), "the overflowing array"));
    ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "the overflowing array");
    ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "overflows");
    /* The array and its capacity are as they were. */
    ck_assert_ptr_eq(a, before);
    ck_assert_uint_eq(cap, 8);
    ck_assert_int_eq(a[3], 42);
    bp__free(a);
}
END_TEST

#ifdef BP_FAULT_INJECTION
/* Each test runs in its own process (fork mode), so allocation 1 is this test's second. */
START_TEST(test_grow_out_of_memory)
{
    setenv("BP_FAIL_ALLOC_AFTER", "1", 1);
    char *a = NULL;
    size_t cap = 0;
    ck_assert(bp__grow((void **)&a, &cap, 1, 1, "a test array"));
    a[0] = 'x';
    bp_clear_error();
    ck_assert(!bp__grow((void **)&a, &cap, 9, 1, "the failing array"));
    ck_assert_error_has(BP_ERR_OUT_OF_MEMORY, "the failing array");
    ck_assert_uint_eq(cap, 8);
    ck_assert_int_eq(a[0], 'x');
    bp__free(a);
}
END_TEST
#endif

static Suite *runtime_util_suite(void)
{
    Suite *s = suite_create("runtime-util");
    BP_TCASE(s, test_grow_keeps_contents, 10);
    BP_TCASE(s, test_grow_doubles, 10);
    BP_TCASE(s, test_grow_refuses_overflow, 10);
#ifdef BP_FAULT_INJECTION
    BP_TCASE(s, test_grow_out_of_memory, 10);
#endif
    return s;
}

int main(void)
{
    return bp_test_run(runtime_util_suite());
}
