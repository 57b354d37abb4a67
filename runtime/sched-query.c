/* sched-query.c - the scheduler's queries and controls: pins, what it assigned and split,
 * buffer sizes and types, the counters of its copies, the expert copies' switches, and the
 * DOT picture of a split graph. The state is sched-impl.h's. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "sched-impl.h"

/* ---- Queries and control ----------------------------------------------------------------- */

enum bp_status bp_sched_set_tensor_backend(bp_sched *s, bp_tensor *t, bp_backend *be)
{
    if (s == NULL || t == NULL || be == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_set_tensor_backend: arguments must not be "
                         "NULL");
    int b = bp__sched_backend_index(s, be);
    if (b < 0)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_set_tensor_backend: backend %s is not one "
                         "of the scheduler's", bp_backend_get_name(be));
    for (int i = 0; i < s->n_pins; i++) {
        if (s->pins[i].t == t) {
            s->pins[i].backend = b;
            s->allocated = NULL;
            s->kept = NULL;
            return BP_OK;
        }
    }
    if (!bp__grow((void **)&s->pins, &s->cap_pins, (size_t)s->n_pins + 1, sizeof(*s->pins),
                  "pins"))
        return BP_ERR_OUT_OF_MEMORY;
    s->pins[s->n_pins++] = (struct pin){t, b};
    s->allocated = NULL;
    s->kept = NULL;
    return BP_OK;
}

bp_backend *bp_sched_get_tensor_backend(bp_sched *s, const bp_tensor *t)
{
    if (s == NULL || t == NULL || !bp__sched_known(s, t))
        return NULL;
    int b = bp__sched_info(s, t)->backend;
    return b >= 0 ? s->backends[b] : NULL;
}

int bp_sched_get_n_backends(bp_sched *s)
{
    return s ? s->n_backends : 0;
}

bp_backend *bp_sched_get_backend(bp_sched *s, int i)
{
    return s && i >= 0 && i < s->n_backends ? s->backends[i] : NULL;
}

int bp_sched_get_n_splits(bp_sched *s)
{
    return s ? s->n_splits : 0;
}

bp_backend *bp_sched_get_split_backend(bp_sched *s, int i, int *n_nodes, int *n_inputs)
{
    if (s == NULL || i < 0 || i >= s->n_splits)
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS, "bp_sched_get_split_backend: split %d of %d",
                              i, s ? s->n_splits : 0);
    const struct split *sp = &s->splits[i];
    if (n_nodes != NULL)
        *n_nodes = sp->i1 - sp->i0;
    if (n_inputs != NULL)
        *n_inputs = sp->n_inputs;
    return s->backends[sp->backend];
}

size_t bp_sched_get_copied_bytes(bp_sched *s, size_t *expert_bytes, size_t *expert_bytes_whole)
{
    if (s == NULL)
        bp__error(BP_ERR_INVALID_ARG, "bp_sched_get_copied_bytes: the scheduler is NULL");
    if (expert_bytes != NULL)
        *expert_bytes = s ? s->expert_bytes_copied : 0;
    if (expert_bytes_whole != NULL)
        *expert_bytes_whole = s ? s->expert_bytes_total : 0;
    return s ? s->copied_bytes : 0;
}

enum bp_status bp_sched_set_expert_cache(bp_sched *s, int slots)
{
    if (s == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_set_expert_cache: the scheduler is NULL");
    if (slots < 0)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_set_expert_cache: %d slots; give 0 (no "
                         "cache) or more", slots);
    if (!bp__sched_enter(s, __func__))
        return BP_ERR_BUSY;
    enum bp_status st = BP_OK;
    if (s->expert_caches == NULL && slots > 0 &&
        (s->expert_caches = bp__expert_caches_new()) == NULL)
        st = BP_ERR_OUT_OF_MEMORY;
    if (st == BP_OK) {
        bp__sched_quiet(s); /* a product may still be reading a cache in place */
        bp__expert_caches_clear(s->expert_caches);
        s->expert_slots = slots;
    }
    bp__sched_leave(s);
    return st;
}

enum bp_status bp_sched_get_expert_stats(bp_sched *s, struct bp_sched_expert_stats *stats)
{
    if (s == NULL || stats == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_get_expert_stats: the scheduler and "
                         "stats must not be NULL");
    *stats = s->expert_stats;
    return BP_OK;
}

enum bp_status bp_sched_predict_experts(bp_sched *s, const bp_tensor *experts,
                                        const bp_tensor *ids)
{
    if (s == NULL || experts == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_predict_experts: the scheduler and the "
                         "experts must not be NULL");
    if (ids != NULL && (ids->type != BP_TYPE_I32 || !bp_is_contiguous(ids)))
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_predict_experts: the ids %s are %s%s; a "
                         "prediction takes contiguous I32 expert ids", bp__describe(ids).s,
                         bp_is_contiguous(ids) ? "" : "a non-contiguous ", bp_type_name(ids->type));
    if (experts->ne[2] < 2 || experts->ne[3] != 1)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_predict_experts: %s is not a stack of "
                         "experts [K, M, n_expert, 1]", bp__describe(experts).s);
    if (!bp__sched_enter(s, __func__))
        return BP_ERR_BUSY;
    int i = 0;
    while (i < s->n_preds && s->preds[i].experts != experts)
        i++;
    enum bp_status st = BP_OK;
    if (ids == NULL) { /* removed */
        if (i < s->n_preds)
            s->preds[i] = s->preds[--s->n_preds];
    } else if (i < s->n_preds) {
        s->preds[i].ids = ids;
        s->preds[i].gen = 0; /* its splits are found again */
    } else if (!bp__grow((void **)&s->preds, &s->cap_preds, (size_t)s->n_preds + 1,
                         sizeof(*s->preds), "the scheduler's expert predictions")) {
        st = bp_last_status();
    } else {
        s->preds[s->n_preds++] = (struct prediction){experts, ids, false, 0, -1, -1};
    }
    bp__sched_leave(s);
    return st;
}

enum bp_status bp_sched_set_used_experts(bp_sched *s, bool on)
{
    if (s == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_set_used_experts: the scheduler is NULL");
    s->used_experts = on;
    return BP_OK;
}

int bp_sched_get_n_copies(bp_sched *s)
{
    return s ? s->n_copies : 0;
}

size_t bp_sched_get_buffer_size(bp_sched *s, bp_backend *be)
{
    int b = s ? bp__sched_backend_index(s, be) : -1;
    return b >= 0 ? bp_gallocr_get_buffer_size(s->galloc, b) : 0;
}

bp_buffer_type *bp_sched_get_buffer_type(bp_sched *s, bp_backend *be)
{
    if (s == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_sched_get_buffer_type: scheduler is NULL");
    int b = bp__sched_backend_index(s, be);
    if (b < 0)
        return bp__error_null(BP_ERR_NOT_FOUND, "bp_sched_get_buffer_type: %s is not one of the "
                              "scheduler's backends", be ? bp_backend_get_name(be) : "NULL");
    return s->bufts[b];
}

void bp_sched_set_eval_callback(bp_sched *s, bp_sched_eval_fn fn, void *user_data)
{
    if (s == NULL)
        return;
    s->eval_fn = fn;
    s->eval_user = user_data;
}

enum bp_status bp_sched_dump_dot(bp_sched *s, bp_graph *g, FILE *out)
{
    static const char *const colors[] = {"lightblue", "palegreen", "khaki", "lightpink",
                                         "lightsalmon", "plum", "lightcyan", "wheat"};
    if (s == NULL || g == NULL || out == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_sched_dump_dot: arguments must not be NULL");
    fprintf(out, "digraph backplane {\n  rankdir=TB;\n  node [style=filled, shape=ellipse];\n");
    for (int i = 0; i < s->n_splits; i++) {
        struct split *sp = &s->splits[i];
        fprintf(out, "  subgraph cluster_%d {\n    label=\"split %d: %s\";\n", i, i,
                bp_backend_get_name(s->backends[sp->backend]));
        for (int k = sp->i0; k < sp->i1 && k < bp_graph_get_n_nodes(g); k++) {
            const bp_tensor *n = bp_graph_get_node(g, k);
            int b = bp__sched_known(s, n) ? bp__sched_info(s, n)->backend : -1;
            fprintf(out, "    n%p [label=\"%d %s\\n%s\", fillcolor=%s];\n", (const void *)n, k,
                    bp_op_name(n->op), n->name, b >= 0 ? colors[b % 8] : "white");
        }
        for (int j = 0; j < sp->n_inputs; j++)
            fprintf(out, "    c%d_%p [label=\"copy of %s\", shape=box, fillcolor=%s];\n", i,
                    (const void *)sp->inputs[j], sp->inputs[j]->name,
                    colors[sp->backend % 8]);
        fprintf(out, "  }\n");
    }
    for (int k = 0; k < bp_graph_get_n_nodes(g); k++) {
        const bp_tensor *n = bp_graph_get_node(g, k);
        for (int j = 0; j < BP_MAX_SRC; j++) {
            const bp_tensor *src = n->src[j];
            if (src == NULL)
                continue;
            /* Sources swapped for copies point at the copy box of their split. */
            const bp_tensor *orig = src;
            for (int q = 0; q < s->n_subst; q++) {
                if (s->subst[q].node == n && s->subst[q].slot == j)
                    orig = s->subst[q].orig;
            }
            if (orig != src) {
                int split = 0;
                while (split < s->n_splits && !(k >= s->splits[split].i0 && k < s->splits[split].i1))
                    split++;
                fprintf(out, "  c%d_%p -> n%p;\n  n%p -> c%d_%p [style=dashed];\n", split,
                        (const void *)orig, (const void *)n, (const void *)orig, split,
                        (const void *)orig);
            } else if (src->op != BP_OP_NONE) {
                fprintf(out, "  n%p -> n%p;\n", (const void *)src, (const void *)n);
            }
        }
    }
    fprintf(out, "}\n");
    return ferror(out) ? bp__error(BP_ERR_IO, "bp_sched_dump_dot: write failed") : BP_OK;
}
