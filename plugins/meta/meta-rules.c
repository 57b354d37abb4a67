/* meta-rules.c - the split-state rules: which state a node's result has and which states its
 * sources must be in, from the op, the shapes and the sources' states alone.
 *
 * A state is MIRRORED (every part holds all of it), SPLIT on an axis with a size per part, or
 * PARTIAL (every part holds a summand). Each op family has one rule function below; it either
 * fills the decision (the rule applies) or returns why it cannot use the sources' states, and
 * the node is then computed whole from MIRRORED sources, which is always correct. The functions
 * are pure: no device, no buffer, no allocation, no error state (docs/meta.md, "States"). */
#include "config.h"

#include <stddef.h>

#include "meta-rules.h"

static const struct bp_meta_split MIRROR = {.state = BP_META_MIRRORED};
static const struct bp_meta_split PARTIAL = {.state = BP_META_PARTIAL};

bool bp_meta_same_state(const struct bp_meta_split *a, const struct bp_meta_split *b, int n)
{
    if (a->state != b->state)
        return false;
    if (a->state != BP_META_SPLIT)
        return true;
    if (a->axis != b->axis)
        return false;
    for (int p = 0; p < n; p++) {
        if (a->sizes[p] != b->sizes[p])
            return false;
    }
    return true;
}

int64_t bp_meta_split_start(const struct bp_meta_split *s, int p)
{
    int64_t o = 0;
    for (int q = 0; q < p; q++)
        o += s->sizes[q];
    return o;
}

static bool is_split(const struct bp_meta_split *s)
{
    return s->state == BP_META_SPLIT;
}

static struct bp_meta_split split_on(const struct bp_meta_split *like, int axis)
{
    struct bp_meta_split s = *like;
    s.state = BP_META_SPLIT;
    s.axis = axis;
    return s;
}

/* An even split of ne over n parts in units of the largest power of two <= 64 that still gives
 * every part a unit (keeps attention heads whole for the usual head sizes); whole blocks (of 32
 * or 256) for a quantised row axis. */
static struct bp_meta_split even_split(const bp_tensor *t, int axis, int n)
{
    struct bp_meta_split s = {.state = BP_META_SPLIT, .axis = axis};
    const int64_t ne = t->ne[axis];
    int64_t g = 64;
    while (g > 1 && (ne % g != 0 || ne / g < n))
        g /= 2;
    /* Both g and the block sizes (32, 256 for the super-block types) are powers of two. */
    const int64_t blk = bp_type_block_size(t->type);
    if (axis == 0 && blk > 1)
        g = g < blk ? blk : g;
    const int64_t units = ne / g, rest = ne - units * g;
    for (int p = 0; p < n; p++)
        s.sizes[p] = (units / n + (p < units % n ? 1 : 0)) * g;
    s.sizes[n - 1] += rest;
    return s;
}

/* Source k's state, MIRRORED when the node has no source k. */
static struct bp_meta_split src_state(const struct bp_meta_rule_in *in, int k)
{
    return in->node->src[k] != NULL ? in->src[k] : MIRROR;
}

/* Source 0 (and the result) in the state source 0 is in. */
static const char *pass_through(struct bp_meta_decision *d, const struct bp_meta_split *sa)
{
    d->want[0] = *sa;
    d->out = *sa;
    return NULL;
}

/* ---- Views and copies -------------------------------------------------------------------- */

/* PERMUTE, TRANSPOSE: the split follows the axes. */
static const char *permute_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *node = in->node;
    const struct bp_meta_split sa = src_state(in, 0);
    pass_through(d, &sa);
    if (is_split(&sa))
        d->out.axis = node->op == BP_OP_TRANSPOSE ? (sa.axis < 2 ? 1 - sa.axis : sa.axis)
                                                  : bp_get_op_param_i32(node, sa.axis);
    return NULL;
}

/* VIEW: a view that takes whole rows of an activation split on axis 0 (each row of the view
 * is a row of the source, same width and element stride: the last token's row of a prompt,
 * say) keeps the split, each part viewing the rows of its own slice. Any other view, and any
 * view of a weight, is computed whole. Contiguous views only, so that converting the result
 * later is like converting any tensor split on axis 0. */
static const char *view_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *node = in->node, *a = node->src[0];
    const struct bp_meta_split sa = src_state(in, 0);
    if (!is_split(&sa) || sa.axis != 0)
        return "a view keeps only a split on axis 0";
    if (in->src0_weight) /* (a weight's split may be how it is stored: packed per part) */
        return "a view of a weight is computed whole";
    const bp_tensor *owner = a->view_src != NULL ? a->view_src : a;
    const size_t a_offs = a->view_src != NULL ? a->view_offs : 0;
    if (node->view_src != owner || node->view_offs < a_offs)
        return "the view is not inside its source";
    const size_t offs = node->view_offs - a_offs, row = a->nb[1];
    bool rows = node->ne[0] == a->ne[0] && node->nb[0] == a->nb[0] && node->type == a->type &&
                row >= (size_t)a->ne[0] * a->nb[0] / (size_t)bp_type_block_size(a->type) &&
                row > 0 && offs % row == 0 && bp_is_contiguous(node);
    for (int i = 1; i < 4 && rows; i++)
        rows = node->ne[i] == 1 || node->nb[i] % row == 0;
    if (!rows)
        return "the view does not take whole rows of its source";
    d->want[0] = sa;
    d->out = sa;
    return NULL;
}

/* Where split s of `from` (logical shape) lands in `to` when the same elements are laid out in
 * to's shape: the axis of `to` that ends where the split axis ends, with the sizes scaled. False
 * when there is none, or a slice would cut through an inner axis of `to` (half a head). */
static bool map_reshape(const bp_tensor *from, const bp_tensor *to, const struct bp_meta_split *s,
                        int n, struct bp_meta_split *out)
{
    int64_t inner = 1;
    for (int i = 0; i < s->axis; i++)
        inner *= from->ne[i];
    const int64_t span = inner * from->ne[s->axis];
    int64_t tin = 1;
    for (int b = 0; b < 4; b++) {
        const int64_t tspan = tin * to->ne[b];
        if (tspan == span && to->ne[b] > 0) {
            /* Axis b ends where the split axis ends; sizes scale by inner / tin. */
            struct bp_meta_split m = split_on(s, b);
            for (int p = 0; p < n; p++) {
                const int64_t elems = s->sizes[p] * inner;
                if (elems % tin != 0)
                    return false;
                m.sizes[p] = elems / tin;
            }
            *out = m;
            return true;
        }
        tin = tspan;
    }
    return false;
}

/* RESHAPE, CONT, DUP: a split moves to the axis of the new shape on which the same elements
 * end. */
static const char *reshape_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *a = in->node->src[0];
    const struct bp_meta_split sa = src_state(in, 0);
    if (!is_split(&sa) || bp_are_same_shape(a, in->node))
        return pass_through(d, &sa);
    if (!map_reshape(a, in->node, &sa, in->n, &d->out))
        return "a slice of the split would cut through an axis of the new shape";
    d->want[0] = sa;
    return NULL;
}

/* SCALE: every state is kept (a product with a constant is linear and element-wise). */
static const char *scale_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const struct bp_meta_split sa = src_state(in, 0);
    return pass_through(d, &sa);
}

/* ---- Element-wise and row-wise ops ------------------------------------------------------- */

/* UNARY, CLAMP, RMS_NORM, NORM, L2_NORM, ARGSORT, TOP_K, GLU of one source: kept when the split
 * is not on the row axis 0 (UNARY, CLAMP: any axis, they are element-wise); partial sums are
 * added up first (these ops are not linear). */
static const char *rowwise_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const struct bp_meta_split sa = src_state(in, 0);
    const bool elementwise = in->node->op == BP_OP_UNARY || in->node->op == BP_OP_CLAMP;
    if (is_split(&sa) && (elementwise || sa.axis >= 1))
        return pass_through(d, &sa);
    if (sa.state == BP_META_PARTIAL)
        return "the op is not linear: partial sums are added up first";
    return "the op works on whole rows (axis 0), which the split cuts";
}

/* SOFT_MAX: kept per head (axes 2 and 3) when the mask does not vary along them. */
static const char *soft_max_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *mask = in->node->src[1];
    const struct bp_meta_split sa = src_state(in, 0);
    if (!is_split(&sa) || sa.axis < 2)
        return "SOFT_MAX keeps only a split on axis 2 or 3 (per head)";
    if (mask != NULL && (mask->ne[2] != 1 || mask->ne[3] != 1))
        return "the mask of SOFT_MAX varies along the split axis";
    const char *why = pass_through(d, &sa);
    if (why == NULL && in->node->src[2] != NULL && sa.axis == 2) {
        d->want[2] = sa; /* one sink per head: the parts' heads */
        d->want[2].axis = 0;
    }
    return why;
}

/* ROPE: kept on axes 1 (heads) and 3; the positions stay MIRRORED. */
static const char *rope_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const struct bp_meta_split sa = src_state(in, 0);
    if (!is_split(&sa) || (sa.axis != 1 && sa.axis != 3))
        return "ROPE keeps only a split on axis 1 (heads) or 3";
    return pass_through(d, &sa);
}

/* ADD, SUB, MUL, DIV, GLU of two sources: kept when the other source has the same split, is
 * the same shape (then sliced alike) or broadcasts along the split axis; PARTIAL + PARTIAL stays
 * PARTIAL for ADD and SUB. */
static const char *binary_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *node = in->node, *a = node->src[0], *b = node->src[1];
    const struct bp_meta_split sa = src_state(in, 0), sb = src_state(in, 1);
    if (node->op == BP_OP_GLU && b == NULL)
        return rowwise_rule(in, d);
    if (sa.state == BP_META_PARTIAL && sb.state == BP_META_PARTIAL &&
        (node->op == BP_OP_ADD || node->op == BP_OP_SUB) && bp_are_same_shape(a, b)) {
        d->want[0] = sa;
        d->want[1] = sb;
        d->out = sa;
        return NULL;
    }
    if (is_split(&sa)) {
        const int ax = sa.axis;
        if (bp_meta_same_state(&sa, &sb, in->n)) {
            d->want[0] = d->want[1] = sa;
            d->out = sa;
            return NULL;
        }
        if (b->ne[ax] == 1)
            return pass_through(d, &sa); /* b broadcast along the split: whole on every part */
        if (b->ne[ax] == a->ne[ax]) {
            d->want[0] = d->want[1] = sa;
            d->out = sa;
            return NULL;
        }
        return "the second source neither matches nor broadcasts along the split axis";
    }
    if (is_split(&sb) && a->ne[sb.axis] == b->ne[sb.axis]) {
        d->want[0] = d->want[1] = sb;
        d->out = sb;
        return NULL;
    }
    return "no binary rule fits these states: partial sums are added up, splits gathered";
}

/* ---- Products ---------------------------------------------------------------------------- */

/* The parts of a product along M, K and N, with a weight or activations as src[0]. */
/* The two ways of a product by weights, shared by MUL_MAT and MUL_MAT_ID: src[0] split along M
 * (its rows) gives the result split along M (column-parallel); src[1] split along K, with
 * src[0] split alike or a weight stored whole (sliced like the activations, in whole blocks),
 * gives PARTIAL sums (row-parallel). */
static bool column_parallel(const struct bp_meta_split *sa, const struct bp_meta_split *sb,
                            struct bp_meta_decision *d)
{
    if (!is_split(sa) || sa->axis != 1 || sb->state == BP_META_PARTIAL)
        return false;
    d->want[0] = *sa;
    d->out = split_on(sa, 0);
    return true;
}

static bool row_parallel(const bp_tensor *a, const struct bp_meta_split *sa,
                         const struct bp_meta_split *sb, bool whole_weight_ok, int n,
                         struct bp_meta_decision *d)
{
    if (!is_split(sb) || sb->axis != 0 ||
        !((sa->state == BP_META_MIRRORED && whole_weight_ok) || bp_meta_same_state(sa, sb, n)))
        return false;
    for (int p = 0; p < n; p++)
        if (sb->sizes[p] % bp_type_block_size(a->type) != 0)
            return false;
    d->want[0] = d->want[1] = *sb;
    d->out = PARTIAL;
    return true;
}

/* The default for a weight stored whole: column-parallel, split evenly. */
static bool even_columns(const bp_tensor *a, const struct bp_meta_split *sa,
                         const struct bp_meta_split *sb, int n, struct bp_meta_decision *d)
{
    if (sa->state != BP_META_MIRRORED || sb->state == BP_META_PARTIAL)
        return false;
    d->want[0] = even_split(a, 1, n);
    d->out = split_on(&d->want[0], 0);
    return true;
}

/* MUL_MAT_ID: the same two ways, every expert alike (the split axes of [K, M, n_expert] are
 * MUL_MAT's). The ids and any other source stay whole. Experts split across parts (expert
 * parallelism) are not a rule: an id would then name an expert some parts do not hold. */
static const char *matmul_id_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *a = in->node->src[0];
    const struct bp_meta_split sa = src_state(in, 0), sb = src_state(in, 1);
    if (src_state(in, 2).state == BP_META_PARTIAL)
        return "the expert ids are partial sums";
    if (column_parallel(&sa, &sb, d) || row_parallel(a, &sa, &sb, in->src0_weight, in->n, d) ||
        (in->src0_weight && even_columns(a, &sa, &sb, in->n, d)))
        return NULL;
    return "no expert product rule fits these states";
}

static const char *matmul_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *a = in->node->src[0], *b = in->node->src[1];
    const struct bp_meta_split sa = src_state(in, 0), sb = src_state(in, 1);
    const int n = in->n;
    const bool w = in->src0_weight && a->ne[2] == 1 && a->ne[3] == 1;
    if (column_parallel(&sa, &sb, d) || (w && row_parallel(a, &sa, &sb, true, n, d)))
        return NULL;
    if (is_split(&sa) && sa.axis == 0 && bp_meta_same_state(&sa, &sb, n)) {
        d->want[0] = d->want[1] = sa;
        d->out = PARTIAL;
        return NULL;
    }
    /* A batch axis (2 or 3, attention heads) split on either side, both sides alike. */
    for (int ax = 2; ax <= 3; ax++) {
        if (a->ne[ax] != b->ne[ax])
            continue;
        if (is_split(&sb) && sb.axis == ax &&
            (sa.state == BP_META_MIRRORED || bp_meta_same_state(&sa, &sb, n))) {
            d->want[0] = d->want[1] = sb;
            d->out = sb;
            return NULL;
        }
        if (is_split(&sa) && sa.axis == ax && sb.state == BP_META_MIRRORED) {
            d->want[0] = d->want[1] = sa;
            d->out = sa;
            return NULL;
        }
    }
    /* src[1] split along N: each part computes its columns of the result. */
    if (is_split(&sb) && sb.axis == 1) {
        d->want[1] = sb;
        d->out = sb;
        return NULL;
    }
    /* The default policy for a weight stored whole. */
    if (w && even_columns(a, &sa, &sb, n, d))
        return NULL;
    return "no product rule fits these states";
}

/* ---- Attention ---------------------------------------------------------------------------- */

/* FLASH_ATTN_EXT: split by heads. Query heads split on axis 2 in whole groups of G = n_head /
 * n_head_kv, keys and values split on axis 2 by the same groups (sizes / G), the mask whole (it
 * may not vary by head); the result [Dv, n_head, n_tok] is split on its axis 1 alike. A side
 * that arrives MIRRORED is sliced to match the other. */
static const char *attn_rule(const struct bp_meta_rule_in *in, struct bp_meta_decision *d)
{
    const bp_tensor *node = in->node, *q = node->src[0], *k = node->src[1], *mask = node->src[3];
    const struct bp_meta_split sq = src_state(in, 0), sk = src_state(in, 1), sv = src_state(in, 2);
    const int64_t G = k->ne[2] > 0 ? q->ne[2] / k->ne[2] : 0;
    if (G < 1 || (mask != NULL && (mask->ne[2] != 1 || mask->ne[3] != 1)) ||
        (mask != NULL && src_state(in, 3).state != BP_META_MIRRORED))
        return "FLASH_ATTN_EXT splits by heads only with a mask that is the same for every head";
    struct bp_meta_split heads, kv_heads;
    if (is_split(&sq) && sq.axis == 2) {
        heads = sq;
        kv_heads = sq;
        for (int p = 0; p < in->n; p++) {
            if (sq.sizes[p] % G != 0)
                return "the query heads are not split in whole groups of the key/value heads";
            kv_heads.sizes[p] = sq.sizes[p] / G;
        }
    } else if (sq.state == BP_META_MIRRORED && is_split(&sk) && sk.axis == 2) {
        kv_heads = sk;
        heads = sk;
        for (int p = 0; p < in->n; p++)
            heads.sizes[p] = sk.sizes[p] * G;
    } else {
        return "FLASH_ATTN_EXT keeps only a split by heads (axis 2 of q, k and v)";
    }
    const struct bp_meta_split *kv[2] = {&sk, &sv};
    for (int i = 0; i < 2; i++)
        if (kv[i]->state != BP_META_MIRRORED && !bp_meta_same_state(kv[i], &kv_heads, in->n))
            return "keys or values are split other than by the query heads' groups";
    d->want[0] = heads;
    d->want[1] = d->want[2] = kv_heads;
    d->out = split_on(&heads, 1);
    return NULL;
}

/* ---- The table --------------------------------------------------------------------------- */

/* Why in cannot be decided, or NULL. */
static const char *check_input(const struct bp_meta_rule_in *in)
{
    if (in->node == NULL)
        return "no node";
    if (in->n < 1 || in->n > BP_META_MAX_DEVICES)
        return "the number of parts is not 1..BP_META_MAX_DEVICES";
    for (int k = 0; k < BP_MAX_SRC; k++) {
        const struct bp_meta_split *s = &in->src[k];
        if (in->node->src[k] == NULL)
            continue;
        if (s->state != BP_META_MIRRORED && s->state != BP_META_SPLIT &&
            s->state != BP_META_PARTIAL)
            return "a source's state is not MIRRORED, SPLIT or PARTIAL";
        if (s->state == BP_META_SPLIT && (s->axis < 0 || s->axis > 3))
            return "a source is split on an axis that is not 0..3";
    }
    return NULL;
}

/* A rule fills d and returns NULL when it applies, else why it cannot (d is then reset). */
typedef const char *rule_fn(const struct bp_meta_rule_in *in, struct bp_meta_decision *d);

/* The rule of node's op, or NULL when the op has none (or lacks a source its rule reads). */
static rule_fn *rule_of(const bp_tensor *node)
{
    const bool binary = node->src[0] != NULL && node->src[1] != NULL;
    switch (node->op) {
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return node->src[0] ? permute_rule : NULL;
    case BP_OP_VIEW:
        return node->src[0] ? view_rule : NULL;
    case BP_OP_RESHAPE:
    case BP_OP_CONT:
    case BP_OP_DUP:
        return node->src[0] ? reshape_rule : NULL;
    case BP_OP_SCALE:
        return node->src[0] ? scale_rule : NULL;
    case BP_OP_UNARY:
    case BP_OP_CLAMP:
    case BP_OP_RMS_NORM:
    case BP_OP_NORM:
    case BP_OP_L2_NORM:
    case BP_OP_ARGSORT:
    case BP_OP_TOP_K:
        return node->src[0] ? rowwise_rule : NULL;
    case BP_OP_SOFT_MAX:
        return node->src[0] ? soft_max_rule : NULL;
    case BP_OP_ROPE:
        return node->src[0] ? rope_rule : NULL;
    case BP_OP_GLU:
        return node->src[0] ? binary_rule : NULL;
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
        return binary ? binary_rule : NULL;
    case BP_OP_MUL_MAT:
        return binary ? matmul_rule : NULL;
    case BP_OP_MUL_MAT_ID:
        return binary && node->src[2] ? matmul_id_rule : NULL;
    case BP_OP_FLASH_ATTN_EXT:
        return node->src[0] && node->src[1] && node->src[2] ? attn_rule : NULL;
    default:
        return NULL;
    }
}

enum bp_meta_verdict bp_meta_rules_decide(const struct bp_meta_rule_in *in,
                                          struct bp_meta_decision *d)
{
    d->verdict = BP_META_RULE_APPLIES;
    d->reason = NULL;
    d->out = MIRROR;
    for (int k = 0; k < BP_MAX_SRC; k++)
        d->want[k] = MIRROR;
    const char *bad = check_input(in);
    if (bad != NULL) {
        d->verdict = BP_META_RULE_INVALID;
        d->reason = bad;
        return d->verdict;
    }
    rule_fn *rule = rule_of(in->node);
    const char *why = rule != NULL ? rule(in, d) : "the op has no split rule: it is computed whole";
    if (why == NULL)
        return d->verdict;
    /* Computed whole. That is a fallback only when some source arrives in another state. */
    d->out = MIRROR;
    for (int k = 0; k < BP_MAX_SRC; k++) {
        d->want[k] = MIRROR;
        if (in->node->src[k] != NULL && in->src[k].state != BP_META_MIRRORED) {
            d->verdict = BP_META_RULE_FALLBACK;
            d->reason = why;
        }
    }
    return d->verdict;
}

bool bp_meta_rules_ask_policy(const struct bp_meta_rule_in *in)
{
    const bp_tensor *a = in->node->src[0];
    const bool stacked = in->node->op == BP_OP_MUL_MAT_ID; /* [K, M, n_expert] */
    return (in->node->op == BP_OP_MUL_MAT || stacked) && a != NULL && in->src0_weight &&
           (a->ne[2] == 1 || stacked) && a->ne[3] == 1 && in->src[0].state == BP_META_MIRRORED;
}
