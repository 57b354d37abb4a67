/* test-meta-rules.c - the meta plugin's split-state rules (plugins/meta/meta-rules.c), walked
 * op by op without any device: nodes are built in a context (no buffers), told the states their
 * sources are in, and the result's state and the states wanted of the sources are checked. */
#include "meta-rules.h"
#include "test-util.h"

static bp_context *ctx;

static void setup(void)
{
    ctx = bp_context_new(64);
    ck_assert_ptr_nonnull(ctx);
}

static void teardown(void)
{
    bp_context_free(ctx);
}

static const struct bp_meta_split MIRRORED = {.state = BP_META_MIRRORED};
static const struct bp_meta_split PARTIAL = {.state = BP_META_PARTIAL};

/* A split on `axis` over two parts. */
static struct bp_meta_split split2(int axis, int64_t s0, int64_t s1)
{
    return (struct bp_meta_split){.state = BP_META_SPLIT, .axis = axis, .sizes = {s0, s1}};
}

static struct bp_meta_split split3(int axis, int64_t s0, int64_t s1, int64_t s2)
{
    return (struct bp_meta_split){.state = BP_META_SPLIT, .axis = axis, .sizes = {s0, s1, s2}};
}

/* The rules' decision for node with its first two sources in states s0 and s1 over n parts. */
static struct bp_meta_decision decide_n(const bp_tensor *node, int n, struct bp_meta_split s0,
                                        struct bp_meta_split s1, bool weight)
{
    ck_assert_ptr_nonnull(node);
    struct bp_meta_rule_in in = {.node = node, .n = n, .src = {s0, s1}, .src0_weight = weight};
    struct bp_meta_decision d;
    const enum bp_meta_verdict v = bp_meta_rules_decide(&in, &d);
    ck_assert_int_eq(v, d.verdict);
    ck_assert_msg((d.reason == NULL) == (v == BP_META_RULE_APPLIES), "reason '%s' with verdict %d",
                  d.reason ? d.reason : "(none)", (int)v);
    return d;
}

static struct bp_meta_decision decide(const bp_tensor *node, struct bp_meta_split s0,
                                      struct bp_meta_split s1)
{
    return decide_n(node, 2, s0, s1, false);
}

#define assert_state(got, want, n)                                                             \
    ck_assert_msg(bp_meta_same_state(&(got), &(want), (n)),                                    \
                  "state %d axis %d sizes %lld,%lld,%lld; expected state %d axis %d sizes "     \
                  "%lld,%lld,%lld", (int)(got).state, (got).axis, (long long)(got).sizes[0],    \
                  (long long)(got).sizes[1], (long long)(got).sizes[2], (int)(want).state,     \
                  (want).axis, (long long)(want).sizes[0], (long long)(want).sizes[1],         \
                  (long long)(want).sizes[2])

/* The rule applied: result `out`, sources wanted in w0 and w1. */
static void assert_applies(const struct bp_meta_decision *d, struct bp_meta_split out,
                           struct bp_meta_split w0, struct bp_meta_split w1, int n)
{
    ck_assert_msg(d->verdict == BP_META_RULE_APPLIES, "falls back: %s", d->reason);
    assert_state(d->out, out, n);
    assert_state(d->want[0], w0, n);
    assert_state(d->want[1], w1, n);
}

/* No rule could use the sources' states: everything MIRRORED, with a reason. */
static void assert_fallback(const struct bp_meta_decision *d)
{
    ck_assert_int_eq(d->verdict, BP_META_RULE_FALLBACK);
    ck_assert_ptr_nonnull(d->reason);
    for (int k = 0; k < BP_MAX_SRC; k++)
        ck_assert_int_eq(d->want[k].state, BP_META_MIRRORED);
    ck_assert_int_eq(d->out.state, BP_META_MIRRORED);
}

/* ---- Unary, SCALE, copies ---------------------------------------------------------------- */

START_TEST(test_unary_keeps_any_split)
{
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    bp_tensor *y = bp_silu(ctx, x);
    for (int axis = 0; axis < 2; axis++) {
        const struct bp_meta_split s = split2(axis, axis ? 2 : 4, 4);
        struct bp_meta_decision d = decide(y, s, MIRRORED);
        assert_applies(&d, s, s, MIRRORED, 2);
    }
    struct bp_meta_decision d = decide(y, MIRRORED, MIRRORED);
    assert_applies(&d, MIRRORED, MIRRORED, MIRRORED, 2);
    d = decide(y, PARTIAL, MIRRORED); /* not linear: the sums are added up first */
    assert_fallback(&d);
}
END_TEST

START_TEST(test_scale_keeps_every_state)
{
    bp_tensor *y = bp_scale(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6), 0.5f);
    const struct bp_meta_split states[] = {MIRRORED, PARTIAL, split2(0, 3, 5), split2(1, 6, 0)};
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        struct bp_meta_decision d = decide(y, states[i], MIRRORED);
        assert_applies(&d, states[i], states[i], MIRRORED, 2);
    }
}
END_TEST

START_TEST(test_copies)
{
    bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 6, 5);
    const struct bp_meta_split s = split2(1, 2, 4);
    /* CONT and DUP to the same shape keep the state */
    struct bp_meta_decision d = decide(bp_cont(ctx, x), s, MIRRORED);
    assert_applies(&d, s, s, MIRRORED, 2);
    d = decide(bp_dup(ctx, x), PARTIAL, MIRRORED);
    assert_applies(&d, PARTIAL, PARTIAL, MIRRORED, 2);
    /* CPY has no split rule: its sources are gathered and every part copies all of it */
    bp_tensor *dst = bp_new_tensor_3d(ctx, BP_TYPE_F16, 4, 6, 5);
    d = decide(bp_cpy(ctx, x, dst), s, MIRRORED);
    assert_fallback(&d);
    d = decide(bp_cpy(ctx, x, dst), MIRRORED, MIRRORED);
    assert_applies(&d, MIRRORED, MIRRORED, MIRRORED, 2);
}
END_TEST

/* ---- Binary ops -------------------------------------------------------------------------- */

START_TEST(test_binary_equal_states)
{
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    bp_tensor *ops[] = {bp_add(ctx, a, b), bp_sub(ctx, a, b), bp_mul(ctx, a, b),
                        bp_div(ctx, a, b), bp_glu(ctx, a, b, BP_GLU_OP_SWIGLU)};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        for (int axis = 0; axis < 2; axis++) {
            const struct bp_meta_split s = split2(axis, 3, axis ? 3 : 5);
            struct bp_meta_decision d = decide(ops[i], s, s);
            assert_applies(&d, s, s, s, 2);
        }
        struct bp_meta_decision d = decide(ops[i], MIRRORED, MIRRORED);
        assert_applies(&d, MIRRORED, MIRRORED, MIRRORED, 2);
    }
}
END_TEST

START_TEST(test_binary_split_meets_whole)
{
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    const struct bp_meta_split s = split2(1, 2, 4);
    /* broadcast along the split: b stays whole on every part */
    bp_tensor *bias = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 1);
    struct bp_meta_decision d = decide(bp_add(ctx, a, bias), s, MIRRORED);
    assert_applies(&d, s, s, MIRRORED, 2);
    /* b of the same shape, MIRRORED: sliced like a */
    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    d = decide(bp_mul(ctx, a, b), s, MIRRORED);
    assert_applies(&d, s, s, s, 2);
    /* the split on the second source: a sliced like it */
    d = decide(bp_mul(ctx, a, b), MIRRORED, s);
    assert_applies(&d, s, s, s, 2);
    /* b neither matches nor broadcasts along the split (3 rows against 6) */
    bp_tensor *odd = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 3);
    d = decide(bp_add(ctx, a, odd), s, MIRRORED);
    assert_fallback(&d);
}
END_TEST

START_TEST(test_binary_partial_sums)
{
    bp_tensor *a = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    bp_tensor *b = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    /* ADD and SUB of two summands are the summands of the result */
    struct bp_meta_decision d = decide(bp_add(ctx, a, b), PARTIAL, PARTIAL);
    assert_applies(&d, PARTIAL, PARTIAL, PARTIAL, 2);
    d = decide(bp_sub(ctx, a, b), PARTIAL, PARTIAL);
    assert_applies(&d, PARTIAL, PARTIAL, PARTIAL, 2);
    /* MUL is not: both are all-reduced first */
    d = decide(bp_mul(ctx, a, b), PARTIAL, PARTIAL);
    assert_fallback(&d);
    /* PARTIAL + MIRRORED (a residual): the partial side is all-reduced first */
    d = decide(bp_add(ctx, a, b), PARTIAL, MIRRORED);
    assert_fallback(&d);
    d = decide(bp_add(ctx, a, b), MIRRORED, PARTIAL);
    assert_fallback(&d);
    /* PARTIAL + PARTIAL of other shapes (a broadcast) is not a sum of summands either */
    bp_tensor *row = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 1);
    d = decide(bp_add(ctx, a, row), PARTIAL, PARTIAL);
    assert_fallback(&d);
}
END_TEST

START_TEST(test_glu_of_one_source)
{
    bp_tensor *y = bp_glu(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 16, 6), NULL,
                          BP_GLU_OP_SWIGLU);
    const struct bp_meta_split rows = split2(1, 2, 4);
    struct bp_meta_decision d = decide(y, rows, MIRRORED);
    assert_applies(&d, rows, rows, MIRRORED, 2);
    /* gate and value are the two halves of a row: a split on axis 0 would separate them */
    d = decide(y, split2(0, 8, 8), MIRRORED);
    assert_fallback(&d);
}
END_TEST

/* ---- Products ---------------------------------------------------------------------------- */

START_TEST(test_mul_mat_column_parallel)
{
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6); /* [K, M] */
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 5); /* [K, N] */
    bp_tensor *y = bp_mul_mat(ctx, w, x);                    /* [M, N] */
    /* the weight split along M (its rows) gives the result split along M */
    struct bp_meta_decision d = decide_n(y, 2, split2(1, 2, 4), MIRRORED, true);
    assert_applies(&d, split2(0, 2, 4), split2(1, 2, 4), MIRRORED, 2);
    /* a weight stored whole, activations whole: the default policy splits M evenly */
    d = decide_n(y, 2, MIRRORED, MIRRORED, true);
    assert_applies(&d, split2(0, 4, 2), split2(1, 4, 2), MIRRORED, 2);
    bp_tensor *big = bp_mul_mat(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 96), x);
    d = decide_n(big, 3, MIRRORED, MIRRORED, true);
    assert_applies(&d, split3(0, 32, 32, 32), split3(1, 32, 32, 32), MIRRORED, 3);
    /* ... which the user's policy is asked about first */
    struct bp_meta_rule_in in = {.node = y, .n = 2, .src = {MIRRORED, MIRRORED},
                                 .src0_weight = true};
    ck_assert(bp_meta_rules_ask_policy(&in));
    in.src[0] = split2(1, 3, 3);
    ck_assert(!bp_meta_rules_ask_policy(&in)); /* already split */
    in.src[0] = MIRRORED;
    in.src0_weight = false;
    ck_assert(!bp_meta_rules_ask_policy(&in)); /* activations */
    in.node = bp_add(ctx, w, w);
    in.src0_weight = true;
    ck_assert(!bp_meta_rules_ask_policy(&in)); /* not a product */
}
END_TEST

START_TEST(test_mul_mat_row_parallel)
{
    bp_tensor *w = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 5);
    bp_tensor *y = bp_mul_mat(ctx, w, x);
    const struct bp_meta_split k = split2(0, 2, 6);
    /* activations split along K: the weight is sliced the same way, the result is PARTIAL */
    struct bp_meta_decision d = decide_n(y, 2, MIRRORED, k, true);
    assert_applies(&d, PARTIAL, k, k, 2);
    d = decide_n(y, 2, k, k, true);
    assert_applies(&d, PARTIAL, k, k, 2);
    /* two activations split along K alike */
    d = decide_n(y, 2, k, k, false);
    assert_applies(&d, PARTIAL, k, k, 2);
    /* a Q4_0 weight is sliced only in whole blocks of 32 */
    bp_tensor *q = bp_new_tensor_2d(ctx, BP_TYPE_Q4_0, 64, 6);
    bp_tensor *xq = bp_new_tensor_2d(ctx, BP_TYPE_F32, 64, 5);
    d = decide_n(bp_mul_mat(ctx, q, xq), 2, MIRRORED, split2(0, 32, 32), true);
    assert_applies(&d, PARTIAL, split2(0, 32, 32), split2(0, 32, 32), 2);
    d = decide_n(bp_mul_mat(ctx, q, xq), 2, MIRRORED, split2(0, 16, 48), true);
    ck_assert_int_ne(d.out.state, BP_META_PARTIAL); /* the default policy instead */
    /* a super-block weight (Q4_K) only in whole blocks of 256 */
    bp_tensor *qk = bp_new_tensor_2d(ctx, BP_TYPE_Q4_K, 512, 6);
    bp_tensor *xk = bp_new_tensor_2d(ctx, BP_TYPE_F32, 512, 5);
    d = decide_n(bp_mul_mat(ctx, qk, xk), 2, MIRRORED, split2(0, 256, 256), true);
    assert_applies(&d, PARTIAL, split2(0, 256, 256), split2(0, 256, 256), 2);
    d = decide_n(bp_mul_mat(ctx, qk, xk), 2, MIRRORED, split2(0, 128, 384), true);
    ck_assert_int_ne(d.out.state, BP_META_PARTIAL);
    /* a product of partial sums: added up first */
    d = decide_n(y, 2, MIRRORED, PARTIAL, false);
    assert_fallback(&d);
}
END_TEST

/* MUL_MAT_ID: the experts' rows split give the result split along M; the experts and the
 * activations split along K give partial sums; ids stay whole; experts stored whole take the
 * default even split of their rows, and the split policy is asked first. */
START_TEST(test_mul_mat_id)
{
    bp_tensor *as = bp_new_tensor_3d(ctx, BP_TYPE_Q8_0, 64, 6, 4); /* [K, M, n_expert] */
    bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, 64, 1, 5);   /* [K, 1, T] */
    bp_tensor *ids = bp_new_tensor_2d(ctx, BP_TYPE_I32, 2, 5);     /* [U, T] */
    bp_tensor *y = bp_mul_mat_id(ctx, as, x, ids);                 /* [M, U, T] */
    ck_assert_ptr_nonnull(y);
    struct bp_meta_decision d = decide_n(y, 2, split2(1, 2, 4), MIRRORED, true);
    assert_applies(&d, split2(0, 2, 4), split2(1, 2, 4), MIRRORED, 2);
    ck_assert_int_eq(d.want[2].state, BP_META_MIRRORED);
    const struct bp_meta_split k = split2(0, 32, 32);
    d = decide_n(y, 2, MIRRORED, k, true);
    assert_applies(&d, PARTIAL, k, k, 2);
    d = decide_n(y, 2, k, k, false);
    assert_applies(&d, PARTIAL, k, k, 2);
    d = decide_n(y, 2, MIRRORED, split2(0, 16, 48), true); /* not whole blocks: rows instead */
    assert_applies(&d, split2(0, 4, 2), split2(1, 4, 2), MIRRORED, 2);
    d = decide_n(y, 2, MIRRORED, MIRRORED, true);
    assert_applies(&d, split2(0, 4, 2), split2(1, 4, 2), MIRRORED, 2);
    struct bp_meta_rule_in in = {.node = y, .n = 2, .src = {MIRRORED, MIRRORED, MIRRORED},
                                 .src0_weight = true};
    ck_assert(bp_meta_rules_ask_policy(&in));
    /* experts split across parts is no rule; activations that are partial sums neither */
    d = decide_n(y, 2, split2(2, 2, 2), MIRRORED, true);
    assert_fallback(&d);
    d = decide_n(y, 2, MIRRORED, PARTIAL, false);
    assert_fallback(&d);
}
END_TEST

START_TEST(test_mul_mat_batch_axes)
{
    /* attention: k [head_dim, T, heads] . q [head_dim, T, heads], split per head */
    bp_tensor *k = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 5, 6);
    bp_tensor *q = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 5, 6);
    bp_tensor *kq = bp_mul_mat(ctx, k, q);
    const struct bp_meta_split heads = split2(2, 2, 4);
    struct bp_meta_decision d = decide(kq, heads, heads);
    assert_applies(&d, heads, heads, heads, 2);
    d = decide(kq, MIRRORED, heads);
    assert_applies(&d, heads, heads, heads, 2);
    d = decide(kq, heads, MIRRORED);
    assert_applies(&d, heads, heads, heads, 2);
    /* split along N of the second source: each part computes its columns */
    const struct bp_meta_split cols = split2(1, 2, 3);
    d = decide(kq, MIRRORED, cols);
    assert_applies(&d, cols, MIRRORED, cols, 2);
    /* both whole, activations: whole */
    d = decide(kq, MIRRORED, MIRRORED);
    assert_applies(&d, MIRRORED, MIRRORED, MIRRORED, 2);
    /* heads split differently on the two sides: gathered */
    d = decide(kq, heads, split2(2, 3, 3));
    assert_fallback(&d);
}
END_TEST

/* ---- Row-wise ops ------------------------------------------------------------------------ */

START_TEST(test_rowwise_ops_refuse_axis_0)
{
    bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, 8, 6, 5);
    const struct bp_meta_split cols = split2(0, 4, 4), rows = split2(1, 2, 4);
    bp_tensor *norms[] = {bp_rms_norm(ctx, x, 1e-5f), bp_norm(ctx, x, 1e-5f)};
    for (size_t i = 0; i < 2; i++) {
        struct bp_meta_decision d = decide(norms[i], cols, MIRRORED);
        assert_fallback(&d);
        d = decide(norms[i], rows, MIRRORED);
        assert_applies(&d, rows, rows, MIRRORED, 2);
        d = decide(norms[i], PARTIAL, MIRRORED);
        assert_fallback(&d);
    }
    /* SUM_ROWS, MEAN and ARGMAX have no split rule: any split is gathered */
    bp_tensor *reductions[] = {bp_sum_rows(ctx, x), bp_mean(ctx, x), bp_argmax(ctx, x)};
    for (size_t i = 0; i < 3; i++) {
        struct bp_meta_decision d = decide(reductions[i], cols, MIRRORED);
        assert_fallback(&d);
        d = decide(reductions[i], rows, MIRRORED);
        assert_fallback(&d);
    }
}
END_TEST

START_TEST(test_soft_max_per_head)
{
    bp_tensor *kq = bp_new_tensor_3d(ctx, BP_TYPE_F32, 5, 5, 6); /* [T, T, heads] */
    bp_tensor *mask = bp_new_tensor_2d(ctx, BP_TYPE_F32, 5, 5);
    const struct bp_meta_split heads = split2(2, 3, 3);
    struct bp_meta_decision d = decide(bp_soft_max_ext(ctx, kq, mask, 0.5f), heads, MIRRORED);
    assert_applies(&d, heads, heads, MIRRORED, 2);
    d = decide(bp_soft_max(ctx, kq), heads, MIRRORED);
    assert_applies(&d, heads, heads, MIRRORED, 2);
    /* a mask that differs per head would have to be split too: gathered instead */
    bp_tensor *mask3 = bp_new_tensor_3d(ctx, BP_TYPE_F32, 5, 5, 6);
    d = decide(bp_soft_max_ext(ctx, kq, mask3, 0.5f), heads, MIRRORED);
    assert_fallback(&d);
    /* splits on the row (0) or query (1) axis */
    d = decide(bp_soft_max(ctx, kq), split2(0, 2, 3), MIRRORED);
    assert_fallback(&d);
    d = decide(bp_soft_max(ctx, kq), split2(1, 2, 3), MIRRORED);
    assert_fallback(&d);
    /* sinks, one per head, are sliced with the heads */
    bp_tensor *s = bp_soft_max_ext(ctx, kq, mask, 0.5f);
    ck_assert_int_eq(bp_soft_max_add_sinks(s, bp_new_tensor_1d(ctx, BP_TYPE_F32, 6)), BP_OK);
    struct bp_meta_rule_in in = {.node = s, .n = 2, .src = {heads, MIRRORED, MIRRORED}};
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_APPLIES);
    const struct bp_meta_split sink_parts = split2(0, 3, 3);
    assert_state(d.want[2], sink_parts, 2);
    assert_state(d.out, heads, 2);
}
END_TEST

/* The rules' decision for an attention node with q, k and v in the given states. */
static struct bp_meta_decision decide_attn(const bp_tensor *node, struct bp_meta_split sq,
                                           struct bp_meta_split sk, struct bp_meta_split sv)
{
    struct bp_meta_rule_in in = {.node = node, .n = 2, .src = {sq, sk, sv, MIRRORED}};
    struct bp_meta_decision d;
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), d.verdict);
    return d;
}

START_TEST(test_attention_per_head)
{
    /* 8 query heads, 2 key/value heads: groups of 4 */
    bp_tensor *q = bp_new_tensor_3d(ctx, BP_TYPE_F32, 16, 5, 8);
    bp_tensor *k = bp_new_tensor_3d(ctx, BP_TYPE_F16, 16, 9, 2);
    bp_tensor *v = bp_new_tensor_3d(ctx, BP_TYPE_F16, 16, 9, 2);
    bp_tensor *mask = bp_new_tensor_2d(ctx, BP_TYPE_F16, 9, 5);
    bp_tensor *a = bp_flash_attn_ext(ctx, q, k, v, mask, 0.25f, 0.0f, 0);
    const struct bp_meta_split qh = split2(2, 4, 4), kh = split2(2, 1, 1), out = split2(1, 4, 4);
    struct bp_meta_decision d = decide_attn(a, qh, kh, kh);
    ck_assert_int_eq(d.verdict, BP_META_RULE_APPLIES);
    assert_state(d.out, out, 2);
    assert_state(d.want[0], qh, 2);
    assert_state(d.want[1], kh, 2);
    assert_state(d.want[2], kh, 2);
    assert_state(d.want[3], MIRRORED, 2);
    /* keys and values stored whole are sliced to the query's groups, and the other way round */
    d = decide_attn(a, qh, MIRRORED, MIRRORED);
    ck_assert_int_eq(d.verdict, BP_META_RULE_APPLIES);
    assert_state(d.want[1], kh, 2);
    d = decide_attn(a, MIRRORED, kh, kh);
    ck_assert_int_eq(d.verdict, BP_META_RULE_APPLIES);
    assert_state(d.want[0], qh, 2);
    assert_state(d.out, out, 2);
    /* query heads split across a group, keys split otherwise, other axes: computed whole */
    d = decide_attn(a, split2(2, 2, 6), MIRRORED, MIRRORED);
    ck_assert_int_eq(d.verdict, BP_META_RULE_FALLBACK);
    d = decide_attn(a, qh, split2(2, 2, 0), kh);
    ck_assert_int_eq(d.verdict, BP_META_RULE_FALLBACK);
    d = decide_attn(a, split2(1, 2, 3), MIRRORED, MIRRORED);
    ck_assert_int_eq(d.verdict, BP_META_RULE_FALLBACK);
    ck_assert_ptr_nonnull(strstr(d.reason, "by heads"));
    /* a mask that varies by head is not split: computed whole */
    bp_tensor *mask8 = bp_new_tensor_3d(ctx, BP_TYPE_F16, 9, 5, 8);
    d = decide_attn(bp_flash_attn_ext(ctx, q, k, v, mask8, 0.25f, 0.0f, 0), qh, kh, kh);
    ck_assert_int_eq(d.verdict, BP_META_RULE_FALLBACK);
}
END_TEST

START_TEST(test_rope_per_head)
{
    bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 6, 5); /* [head_dim, heads, T] */
    bp_tensor *pos = bp_new_tensor_1d(ctx, BP_TYPE_I32, 5);
    bp_tensor *y = bp_rope(ctx, x, pos, 4, BP_ROPE_NEOX, 10000.0f, 1.0f);
    const struct bp_meta_split heads = split2(1, 2, 4);
    struct bp_meta_decision d = decide(y, heads, MIRRORED);
    assert_applies(&d, heads, heads, MIRRORED, 2);
    /* a split through the rotated pairs, or along the tokens (positions differ) */
    d = decide(y, split2(0, 2, 2), MIRRORED);
    assert_fallback(&d);
    d = decide(y, split2(2, 2, 3), MIRRORED);
    assert_fallback(&d);
}
END_TEST

/* ---- Views and shapes -------------------------------------------------------------------- */

START_TEST(test_reshape_maps_the_axis)
{
    bp_tensor *heads = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 6, 5); /* [head_dim, heads, T] */
    bp_tensor *flat = bp_new_tensor_2d(ctx, BP_TYPE_F32, 24, 5);    /* [n_embd, T] */
    /* heads 2 + 4 are columns 8 + 16 of the merged axis */
    struct bp_meta_decision d = decide(bp_reshape_2d(ctx, heads, 24, 5), split2(1, 2, 4), MIRRORED);
    assert_applies(&d, split2(0, 8, 16), split2(1, 2, 4), MIRRORED, 2);
    d = decide(bp_reshape_3d(ctx, flat, 4, 6, 5), split2(0, 8, 16), MIRRORED);
    assert_applies(&d, split2(1, 2, 4), split2(0, 8, 16), MIRRORED, 2);
    /* a split on an outer axis keeps its sizes */
    d = decide(bp_reshape_2d(ctx, heads, 24, 5), split2(2, 2, 3), MIRRORED);
    assert_applies(&d, split2(1, 2, 3), split2(2, 2, 3), MIRRORED, 2);
    /* 10 + 14 columns would cut a head of 4 in half */
    d = decide(bp_reshape_3d(ctx, flat, 4, 6, 5), split2(0, 10, 14), MIRRORED);
    assert_fallback(&d);
    /* CONT to another shape follows the same mapping */
    d = decide(bp_cont_4d(ctx, heads, 24, 5, 1, 1), split2(1, 2, 4), MIRRORED);
    assert_applies(&d, split2(0, 8, 16), split2(1, 2, 4), MIRRORED, 2);
    /* states other than SPLIT pass through */
    d = decide(bp_reshape_2d(ctx, heads, 24, 5), PARTIAL, MIRRORED);
    assert_applies(&d, PARTIAL, PARTIAL, MIRRORED, 2);
}
END_TEST

START_TEST(test_permute_and_transpose_map_the_axis)
{
    bp_tensor *x = bp_new_tensor_3d(ctx, BP_TYPE_F32, 4, 6, 5);
    const struct bp_meta_split s = split2(1, 2, 4);
    struct bp_meta_decision d = decide(bp_permute(ctx, x, 0, 2, 1, 3), s, MIRRORED);
    assert_applies(&d, split2(2, 2, 4), s, MIRRORED, 2);
    d = decide(bp_transpose(ctx, x), s, MIRRORED);
    assert_applies(&d, split2(0, 2, 4), s, MIRRORED, 2);
    d = decide(bp_transpose(ctx, x), split2(2, 2, 3), MIRRORED);
    assert_applies(&d, split2(2, 2, 3), split2(2, 2, 3), MIRRORED, 2);
    d = decide(bp_permute(ctx, x, 1, 0, 2, 3), PARTIAL, MIRRORED);
    assert_applies(&d, PARTIAL, PARTIAL, MIRRORED, 2);
}
END_TEST

START_TEST(test_view_and_get_rows)
{
    /* A view of whole rows of a source split on axis 0 keeps the split: the last row of a
     * prompt's activations, a block of rows, a row of a view (offsets relative to the source) */
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    const struct bp_meta_split cols = split2(0, 3, 5);
    struct bp_meta_decision d = decide(bp_view_2d(ctx, x, 8, 1, x->nb[1], 5 * x->nb[1]), cols,
                                       MIRRORED);
    assert_applies(&d, cols, cols, MIRRORED, 2);
    d = decide(bp_view_2d(ctx, x, 8, 3, x->nb[1], 2 * x->nb[1]), cols, MIRRORED);
    assert_applies(&d, cols, cols, MIRRORED, 2);
    bp_tensor *rows = bp_view_2d(ctx, x, 8, 4, x->nb[1], x->nb[1]);
    d = decide(bp_view_1d(ctx, rows, 8, 2 * rows->nb[1]), cols, MIRRORED);
    assert_applies(&d, cols, cols, MIRRORED, 2);
    /* Anything else is computed whole: part of a row, an offset inside a row, a split on
     * another axis, strided rows (not contiguous), another source's memory */
    d = decide(bp_view_2d(ctx, x, 4, 6, x->nb[1], 0), cols, MIRRORED);
    assert_fallback(&d);
    d = decide(bp_view_1d(ctx, x, 8, 4 * sizeof(float)), cols, MIRRORED);
    assert_fallback(&d);
    d = decide(bp_view_2d(ctx, x, 8, 3, x->nb[1], 0), split2(1, 3, 3), MIRRORED);
    assert_fallback(&d);
    d = decide(bp_view_2d(ctx, x, 8, 3, 2 * x->nb[1], 0), cols, MIRRORED);
    assert_fallback(&d);
    /* A view of a weight: its split may be how it is stored, packed per part */
    d = decide_n(bp_view_2d(ctx, x, 8, 1, x->nb[1], 5 * x->nb[1]), 2, cols, MIRRORED, true);
    assert_fallback(&d);
    bp_tensor *y = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6);
    bp_tensor *vy = bp_view_1d(ctx, y, 8, 0);
    vy->src[0] = x; /* (a node whose source is not what it views) */
    d = decide(vy, cols, MIRRORED);
    assert_fallback(&d);
    /* GET_ROWS of a table split on axis 0 (embedding columns): gathered, looked up whole */
    bp_tensor *table = bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 40);
    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 5);
    d = decide(bp_get_rows(ctx, table, ids), split2(0, 4, 4), MIRRORED);
    assert_fallback(&d);
    d = decide(bp_get_rows(ctx, table, ids), MIRRORED, MIRRORED);
    assert_applies(&d, MIRRORED, MIRRORED, MIRRORED, 2);
}
END_TEST

/* ---- Input and helpers ------------------------------------------------------------------- */

START_TEST(test_invalid_input)
{
    bp_tensor *y = bp_silu(ctx, bp_new_tensor_2d(ctx, BP_TYPE_F32, 8, 6));
    struct bp_meta_rule_in in = {.node = y, .n = 0, .src = {MIRRORED}};
    struct bp_meta_decision d;
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_INVALID);
    ck_assert_ptr_nonnull(strstr(d.reason, "parts"));
    in.n = BP_META_MAX_DEVICES + 1;
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_INVALID);
    in.n = 2;
    in.src[0].state = (enum bp_meta_state)7;
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_INVALID);
    ck_assert_ptr_nonnull(strstr(d.reason, "state"));
    in.src[0] = split2(4, 4, 4);
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_INVALID);
    ck_assert_ptr_nonnull(strstr(d.reason, "axis"));
    in.node = NULL;
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_INVALID);
    /* absent sources are not read */
    in.node = y;
    in.src[0] = MIRRORED;
    in.src[1].state = (enum bp_meta_state)7;
    ck_assert_int_eq(bp_meta_rules_decide(&in, &d), BP_META_RULE_APPLIES);
}
END_TEST

START_TEST(test_state_helpers)
{
    const struct bp_meta_split s = split3(1, 2, 0, 5);
    ck_assert_int_eq(bp_meta_split_start(&s, 0), 0);
    ck_assert_int_eq(bp_meta_split_start(&s, 2), 2);
    ck_assert_int_eq(bp_meta_split_start(&s, 3), 7);
    ck_assert(bp_meta_same_state(&s, &s, 3));
    struct bp_meta_split t = s;
    t.sizes[2] = 4;
    ck_assert(!bp_meta_same_state(&s, &t, 3));
    ck_assert(bp_meta_same_state(&s, &t, 2)); /* sizes from n on are not compared */
    t = s;
    t.axis = 0;
    ck_assert(!bp_meta_same_state(&s, &t, 3));
    ck_assert(!bp_meta_same_state(&s, &MIRRORED, 3));
    struct bp_meta_split m = MIRRORED;
    m.axis = 3; /* only a split's axis and sizes count */
    ck_assert(bp_meta_same_state(&m, &MIRRORED, 3));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("meta-rules");
    TCase *tc = tcase_create("rules");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_unary_keeps_any_split);
    tcase_add_test(tc, test_scale_keeps_every_state);
    tcase_add_test(tc, test_copies);
    tcase_add_test(tc, test_binary_equal_states);
    tcase_add_test(tc, test_binary_split_meets_whole);
    tcase_add_test(tc, test_binary_partial_sums);
    tcase_add_test(tc, test_glu_of_one_source);
    tcase_add_test(tc, test_mul_mat_column_parallel);
    tcase_add_test(tc, test_mul_mat_row_parallel);
    tcase_add_test(tc, test_mul_mat_id);
    tcase_add_test(tc, test_mul_mat_batch_axes);
    tcase_add_test(tc, test_rowwise_ops_refuse_axis_0);
    tcase_add_test(tc, test_soft_max_per_head);
    tcase_add_test(tc, test_attention_per_head);
    tcase_add_test(tc, test_rope_per_head);
    tcase_add_test(tc, test_reshape_maps_the_axis);
    tcase_add_test(tc, test_permute_and_transpose_map_the_axis);
    tcase_add_test(tc, test_view_and_get_rows);
    tcase_add_test(tc, test_invalid_input);
    tcase_add_test(tc, test_state_helpers);
    suite_add_tcase(s, tc);
    return bp_test_run(s);
}
