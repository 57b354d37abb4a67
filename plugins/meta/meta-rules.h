/* meta-rules.h - private to plugins/meta/: the split-state rules, as pure functions.
 *
 * Given one node (its op, shapes and op params, read from the tensor) and the states its sources
 * are in, the rules say which state the result has and which state each source must be brought
 * to first. They touch no device, no buffer and no memory of their own, so tests can walk the
 * whole table without a device (tests/test-meta-rules.c). */
#ifndef BP_META_RULES_H
#define BP_META_RULES_H

#include <stdbool.h>
#include <stdint.h>

#include <backplane/bp-meta.h>
#include <backplane/bp-tensor.h>

/* What the rules are told about one node. */
struct bp_meta_rule_in {
    const bp_tensor *node; /* read only: op, ne, op_params, and its sources' ne and type */
    int n;                 /* parts, 1..BP_META_MAX_DEVICES */
    /* The state each source is in now. Entries of absent sources are not read. */
    struct bp_meta_split src[BP_MAX_SRC];
    /* src[0]'s memory is a weights buffer: a MUL_MAT may pick a split for it (stored whole on
     * every part, any split of it is a free slice). */
    bool src0_weight;
};

enum bp_meta_verdict {
    BP_META_RULE_APPLIES,  /* the op's rule gave the states (some sources may still need a
                            * conversion: a slice, a gather or an all-reduce) */
    BP_META_RULE_FALLBACK, /* no rule of the op can use a source's split or partial state: every
                            * source is wanted MIRRORED and the result is MIRRORED */
    BP_META_RULE_INVALID,  /* the description is not one the rules can read */
};

struct bp_meta_decision {
    enum bp_meta_verdict verdict;
    const char *reason; /* FALLBACK, INVALID: why, a constant sentence; APPLIES: NULL */
    struct bp_meta_split out;              /* the result's state */
    struct bp_meta_split want[BP_MAX_SRC]; /* the state each source must be in (MIRRORED for
                                            * absent sources) */
};

/* Fills *d for in (docs/meta.md, "States", has the table) and returns d->verdict. */
enum bp_meta_verdict bp_meta_rules_decide(const struct bp_meta_rule_in *in,
                                          struct bp_meta_decision *d);

/* Whether a split policy may choose how in's src[0] is split: a MUL_MAT whose src[0] is a 2-D
 * weight, or a MUL_MAT_ID whose src[0] is stacked weights, that is MIRRORED. The caller asks the policy and, when it gives a split, puts that in
 * src[0] before deciding. */
bool bp_meta_rules_ask_policy(const struct bp_meta_rule_in *in);

/* Whether a and b are the same state (for SPLIT: same axis and the first n sizes). */
bool bp_meta_same_state(const struct bp_meta_split *a, const struct bp_meta_split *b, int n);

/* Where part p's slice starts on the split axis: the sum of the sizes before it. */
int64_t bp_meta_split_start(const struct bp_meta_split *s, int p);

#endif
