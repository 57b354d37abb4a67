/* test-runtime-util.c - the runtime's internal helpers: array growth (bp__grow in mem.c), the
 * pointer map (ptrmap.c), the escaping of outside text (escape.c), the description of tensors
 * by their place in a graph (bp__describe_in, tensor.c) and the private-group rule of the
 * plugin path checks (bp__group_not_private in plugin-file.c).
 *
 * These helpers are hidden inside the library, so this program is built from their source
 * files (and the error and log files they report through) instead of linking libbackplane. */
#include "config.h"

#include <limits.h>
#include <stdint.h>

#include "test-util.h"
#include "../runtime/bp-impl.h"
#include "../runtime/plugin-file.h"
#include "../runtime/ptrmap.h"

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
/* Each test runs in its own process (fork mode), so allocation 1 is this test's second. The
 * fault counter is per process: with CK_FORK=no (as under valgrind) there is nothing to test. */
START_TEST(test_grow_out_of_memory)
{
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode != NULL && strcmp(fork_mode, "no") == 0)
        return;
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

/* ---- Pointer map ---------------------------------------------------------------------------- */

/* Distinct keys that are never dereferenced. */
static const void *key(size_t i)
{
    static char keys[1 << 16];
    return &keys[i];
}

START_TEST(test_ptrmap_insert_and_lookup)
{
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 16, "a test map"));
    ck_assert_uint_eq(bp__ptrmap_size(&m), 16);
    ck_assert_uint_eq(bp__ptrmap_limit(&m), 12);
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(1)));
    bool added;
    int *v = bp__ptrmap_put(&m, key(1), 7, &added);
    ck_assert_ptr_nonnull(v);
    ck_assert(added);
    ck_assert_int_eq(*v, 7);
    /* A second put finds the entry and keeps its value. */
    v = bp__ptrmap_put(&m, key(1), 99, &added);
    ck_assert(!added);
    ck_assert_int_eq(*v, 7);
    /* The value is stored in the map: writes through the pointer stick. */
    (*v)++;
    ck_assert_int_eq(*bp__ptrmap_get(&m, key(1)), 8);
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(2)));
    ck_assert_uint_eq(m.used, 1);
    bp__ptrmap_close(&m);
    ck_assert_ptr_null(m.slots);
    /* A closed (zeroed) map answers lookups and refuses puts without crashing. */
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(1)));
    ck_assert_ptr_null(bp__ptrmap_put(&m, key(1), 0, &added));
    ck_assert(!added);
    bp__ptrmap_close(&m);
}
END_TEST

START_TEST(test_ptrmap_refuses_beyond_limit)
{
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 8, "a test map"));
    bool added;
    for (size_t i = 0; i < bp__ptrmap_limit(&m); i++)
        ck_assert_ptr_nonnull(bp__ptrmap_put(&m, key(i), (int)i, &added));
    ck_assert_ptr_null(bp__ptrmap_put(&m, key(100), 0, &added));
    ck_assert(!added);
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(100)));
    /* Keys already in still answer, and the refused one was not added. */
    ck_assert_ptr_nonnull(bp__ptrmap_put(&m, key(0), 5, &added));
    ck_assert_uint_eq(m.used, bp__ptrmap_limit(&m));
    bp__ptrmap_close(&m);
}
END_TEST

START_TEST(test_ptrmap_growth_keeps_entries)
{
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 4, "a test map"));
    bool added;
    size_t n = 0;
    for (size_t round = 0; round < 10; round++) {
        /* Fill to the limit, then grow and go on. */
        while (m.used < bp__ptrmap_limit(&m)) {
            ck_assert_ptr_nonnull(bp__ptrmap_put(&m, key(n), (int)n * 2, &added));
            n++;
        }
        size_t before = bp__ptrmap_size(&m);
        ck_assert(bp__ptrmap_reserve(&m, 2 * before, "a test map"));
        ck_assert_uint_eq(bp__ptrmap_size(&m), 2 * before);
        ck_assert_uint_eq(m.used, n);
        for (size_t i = 0; i < n; i++) {
            int *v = bp__ptrmap_get(&m, key(i));
            ck_assert_ptr_nonnull(v);
            ck_assert_int_eq(*v, (int)i * 2);
        }
    }
    /* Asking for fewer slots than it has changes nothing. */
    size_t size = bp__ptrmap_size(&m);
    ck_assert(bp__ptrmap_reserve(&m, 3, "a test map"));
    ck_assert_uint_eq(bp__ptrmap_size(&m), size);
    bp__ptrmap_close(&m);
}
END_TEST

START_TEST(test_ptrmap_clear)
{
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 64, "a test map"));
    bool added;
    for (int round = 0; round < 100; round++) {
        for (size_t i = 0; i < 40; i++) {
            int *v = bp__ptrmap_put(&m, key(i + (size_t)round), round, &added);
            ck_assert(added);
            ck_assert_int_eq(*v, round);
        }
        ck_assert_uint_eq(m.used, 40);
        bp__ptrmap_clear(&m);
        ck_assert_uint_eq(m.used, 0);
        for (size_t i = 0; i < 41; i++)
            ck_assert_ptr_null(bp__ptrmap_get(&m, key(i + (size_t)round)));
    }
    bp__ptrmap_close(&m);
}
END_TEST

/* Clearing when the generation counter wraps must still forget every old entry. */
START_TEST(test_ptrmap_clear_wraps)
{
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 16, "a test map"));
    bool added;
    m.gen = UINT_MAX - 1;
    ck_assert_ptr_nonnull(bp__ptrmap_put(&m, key(1), 1, &added));
    bp__ptrmap_clear(&m);
    ck_assert_uint_eq(m.gen, UINT_MAX);
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(1)));
    ck_assert_ptr_nonnull(bp__ptrmap_put(&m, key(2), 2, &added));
    bp__ptrmap_clear(&m); /* wraps: slots are wiped, the generation starts at 1 again */
    ck_assert_uint_eq(m.gen, 1);
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(1)));
    ck_assert_ptr_null(bp__ptrmap_get(&m, key(2)));
    for (unsigned g = 0; g < 3; g++) {
        ck_assert_ptr_null(bp__ptrmap_get(&m, key(2)));
        bp__ptrmap_clear(&m);
    }
    bp__ptrmap_close(&m);
}
END_TEST

START_TEST(test_ptrmap_many_keys)
{
    enum { N = 50000 };
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 4 * N, "a test map"));
    bool added;
    for (size_t i = 0; i < N; i++)
        ck_assert_ptr_nonnull(bp__ptrmap_put(&m, key(i), (int)i, &added));
    ck_assert_uint_eq(m.used, N);
    for (size_t i = 0; i < N; i++)
        ck_assert_int_eq(*bp__ptrmap_get(&m, key(i)), (int)i);
    /* Pointers next to the keys are not in the map. */
    for (size_t i = N; i < N + 1000; i++)
        ck_assert_ptr_null(bp__ptrmap_get(&m, key(i)));
    bp__ptrmap_close(&m);
}
END_TEST

/* Keys that all hash to the last slot probe past each other, around the end of the table,
 * and all stay reachable. */
START_TEST(test_ptrmap_collisions)
{
    enum { N_KEYS = 1 << 16 };
    struct bp__ptrmap m;
    ck_assert(bp__ptrmap_init(&m, 64, "a test map"));
    const void *same[20];
    size_t n = 0;
    for (size_t i = 0; i < N_KEYS && n < 20; i++) {
        if ((bp__ptrmap_hash(key(i)) & m.mask) == m.mask)
            same[n++] = key(i);
    }
    ck_assert_uint_eq(n, 20);
    bool added;
    for (size_t i = 0; i < n; i++)
        ck_assert_ptr_nonnull(bp__ptrmap_put(&m, same[i], (int)i, &added));
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(*bp__ptrmap_get(&m, same[i]), (int)i);
    /* The run of colliding keys wrapped: slot 0 holds one of them. */
    ck_assert_uint_eq(m.slots[0].gen, m.gen);
    ck_assert_ptr_eq(m.slots[0].key, same[1]);
    bp__ptrmap_clear(&m);
    for (size_t i = 0; i < n; i++)
        ck_assert_ptr_null(bp__ptrmap_get(&m, same[i]));
    bp__ptrmap_close(&m);
}
END_TEST

/* The one escaping rule: printable ASCII and well-formed UTF-8 as they are; \a..\r as C
 * escapes; other controls, DEL, C1 controls and every byte of ill-formed UTF-8 as \xNN. */
START_TEST(test_escape_rule)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"plain ~", "plain ~"},
        {"a\nb\tc\r", "a\\nb\\tc\\r"},
        {"\x1b[31mred\x7f", "\\x1b[31mred\\x7f"},
        {"\x01\x1f", "\\x01\\x1f"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"\xc2\x9b" "2J", "\\xc2\\x9b2J"},             /* a C1 CSI */
        {"\xc2\xa0", "\xc2\xa0"},                      /* U+00A0 is a character */
        {"\xff\xfe", "\\xff\\xfe"},                    /* never UTF-8 */
        {"\xc0\xaf", "\\xc0\\xaf"},                    /* an overlong '/' */
        {"\xed\xa0\x80", "\\xed\\xa0\\x80"},           /* a surrogate */
        {"\xe2\x82", "\\xe2\\x82"},                    /* cut short */
        {"\xe2\x82x", "\\xe2\\x82x"},
        {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},  /* above U+10FFFF */
        {"\x80", "\\x80"},                             /* a stray continuation */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[64];
        const size_t n = bp__escape_controls(out, sizeof(out), cases[i].in);
        ck_assert_str_eq(out, cases[i].want);
        ck_assert_uint_eq(n, strlen(cases[i].want));
        ck_assert_uint_eq(bp__escaped_size(cases[i].in), strlen(cases[i].want) + 1);
    }
    /* Cut short: "..." after whole pieces only, never inside an escape or a character. */
    char small[10];
    bp__escape_controls(small, sizeof(small), "ab\x1b\x1b\x1b");
    ck_assert_str_eq(small, "ab\\x1b...");
    bp__escape_controls(small, sizeof(small), "abcd\xe2\x82\xac\xe2\x82\xac");
    ck_assert_str_eq(small, "abcd...");
    bp__escape_controls(small, sizeof(small), "abcdefghijk");
    ck_assert_str_eq(small, "abcdef...");
    char exact[6];
    ck_assert_uint_eq(bp__escape_controls(exact, sizeof(exact), "a\x1b"), 5);
    ck_assert_str_eq(exact, "a\\x1b");
}
END_TEST

/* Unnamed tensors are named by their place in the graph: "#index (op)" for a node, "leaf #index"
 * for a leaf; a named one, or one outside the graph, as bp__describe says. */
START_TEST(test_describe_in_graph)
{
    bp_context *ctx = bp_context_new(8);
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 3);
    bp_tensor *b = bp_set_name(bp_new_tensor_2d(ctx, BP_TYPE_F32, 4, 3), "b");
    bp_tensor *sum = bp_add(ctx, a, b);
    bp_tensor *out = bp_neg(ctx, sum);
    bp_tensor *stray = bp_new_tensor_1d(ctx, BP_TYPE_I32, 2);
    bp_graph *g = bp_graph_new(8);
    ck_assert_int_eq(bp_graph_build_forward(g, out), BP_OK);
    ck_assert_str_eq(bp__describe_in(g, sum).s, "#0 (ADD) f32 [4, 3, 1, 1]");
    ck_assert_str_eq(bp__describe_in(g, out).s, "#1 (NEG) f32 [4, 3, 1, 1]");
    ck_assert_str_eq(bp__describe_in(g, a).s, "leaf #0 f32 [4, 3, 1, 1]");
    ck_assert_str_eq(bp__describe_in(g, b).s, "'b' f32 [4, 3, 1, 1]");
    ck_assert_str_eq(bp__describe_in(g, stray).s, "unnamed i32 [2, 1, 1, 1]");
    ck_assert_str_eq(bp__describe_in(NULL, sum).s, "unnamed ADD result f32 [4, 3, 1, 1]");
    bp_graph_free(g);
    bp_context_free(ctx);
}
END_TEST

/* ---- The private-group rule (OpenSSH's, as Debian patches it) -------------------------------- */

/* The verdict for owner 1000 ("dev") on a group with these members and primary accounts: NULL
 * (private) or the phrase, which must contain needle. */
static void check_group(const char *const *members, const uid_t *primary, size_t n,
                        const char *needle)
{
    char *why = bp__group_not_private(1000, "dev", members, primary, n);
    if (needle == NULL) {
        ck_assert_msg(why == NULL, "refused: %s", why ? why : "");
    } else {
        ck_assert_msg(why != NULL, "accepted; expected '%s'", needle);
        ck_assert_msg(strstr(why, needle) != NULL, "'%s' lacks '%s'", why, needle);
    }
    bp__free(why);
}

/* Debian's user private group: the owner's primary group, nobody else's, no listed members. */
START_TEST(test_private_group_accepted)
{
    const uid_t only_owner[] = {1000};
    const char *const none[] = {NULL};
    const char *const owner_listed[] = {"dev", NULL};
    check_group(none, only_owner, 1, NULL);
    check_group(NULL, only_owner, 1, NULL);
    /* Listed as its one member (and primary of nobody, or of the owner only). */
    check_group(owner_listed, NULL, 0, NULL);
    check_group(owner_listed, only_owner, 1, NULL);
}
END_TEST

START_TEST(test_shared_group_refused)
{
    const uid_t owner_and_other[] = {1000, 1001};
    const uid_t other[] = {1001};
    const char *const none[] = {NULL};
    const char *const another[] = {"eve", NULL};
    const char *const owner_and_another[] = {"dev", "eve", NULL};
    check_group(none, owner_and_other, 2, "primary group of uid 1001");
    check_group(none, other, 1, "primary group of uid 1001");
    check_group(another, NULL, 0, "the member eve");
    check_group(owner_and_another, NULL, 0, "the member eve");
    /* No members at all: a group for setgid programs, not a user's. */
    check_group(none, NULL, 0, "no members");
    /* An owner without a passwd entry cannot be told from a listed member of that name. */
    char *why = bp__group_not_private(1000, NULL, (const char *const[]){"dev", NULL}, NULL, 0);
    ck_assert_ptr_nonnull(why);
    bp__free(why);
}
END_TEST

static Suite *runtime_util_suite(void)
{
    Suite *s = suite_create("runtime-util");
    BP_TCASE(s, test_grow_keeps_contents, 10);
    BP_TCASE(s, test_escape_rule, 10);
    BP_TCASE(s, test_describe_in_graph, 10);
    BP_TCASE(s, test_grow_doubles, 10);
    BP_TCASE(s, test_grow_refuses_overflow, 10);
#ifdef BP_FAULT_INJECTION
    BP_TCASE(s, test_grow_out_of_memory, 10);
#endif
    BP_TCASE(s, test_ptrmap_insert_and_lookup, 10);
    BP_TCASE(s, test_ptrmap_refuses_beyond_limit, 10);
    BP_TCASE(s, test_ptrmap_growth_keeps_entries, 10);
    BP_TCASE(s, test_ptrmap_clear, 10);
    BP_TCASE(s, test_ptrmap_clear_wraps, 10);
    BP_TCASE(s, test_ptrmap_many_keys, 30);
    BP_TCASE(s, test_ptrmap_collisions, 10);
    BP_TCASE(s, test_private_group_accepted, 10);
    BP_TCASE(s, test_shared_group_refused, 10);
    return s;
}

int main(void)
{
    return bp_test_run(runtime_util_suite());
}
