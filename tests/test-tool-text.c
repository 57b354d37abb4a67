/* test-tool-text.c - the tool's text helpers (tools/text.c): sizes put side by side in a
 * sentence print in a unit that tells them apart, and names from outside are escaped. */
#include "../tools/tool.h"
#include "test-util.h"

/* Two sizes 0.13 GiB each at two decimals, but 2 MiB apart: MiB shows the difference. */
START_TEST(test_sizes_close_in_gib_print_in_mib)
{
    char out[3][40];
    tool_format_sizes(140509184, 138412032, 268435456, out); /* 134, 132 and 256 MiB */
    ck_assert_str_eq(out[0], "134.00 MiB");
    ck_assert_str_eq(out[1], "132.00 MiB");
    ck_assert_str_eq(out[2], "256.00 MiB");
}
END_TEST

/* Sizes equal even in MiB at two decimals are written in exact bytes. */
START_TEST(test_sizes_close_in_mib_print_in_bytes)
{
    char out[3][40];
    tool_format_sizes(1048577, 1048576, 2097152, out);
    ck_assert_str_eq(out[0], "1048577 bytes");
    ck_assert_str_eq(out[1], "1048576 bytes");
    ck_assert_str_eq(out[2], "2097152 bytes");
}
END_TEST

/* Sizes far apart (and equal ones) keep GiB. */
START_TEST(test_sizes_far_apart_print_in_gib)
{
    char out[3][40];
    tool_format_sizes(3221225472, 1073741824, 2147483648, out);
    ck_assert_str_eq(out[0], "3.00 GiB");
    ck_assert_str_eq(out[1], "1.00 GiB");
    ck_assert_str_eq(out[2], "2.00 GiB");
    tool_format_sizes(1073741824, 1073741824, 1073741824, out);
    ck_assert_str_eq(out[0], "1.00 GiB");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tool-text");
    BP_TCASE(s, test_sizes_close_in_gib_print_in_mib, 10);
    BP_TCASE(s, test_sizes_close_in_mib_print_in_bytes, 10);
    BP_TCASE(s, test_sizes_far_apart_print_in_gib, 10);
    return bp_test_run(s);
}
