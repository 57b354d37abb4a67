/* quantize-plan.c - the type each tensor gets in `backplane quantize`: llama.cpp's file types
 * and its rules per tensor.
 *
 * The rules are those of llama_tensor_get_type in llama.cpp's src/llama-quant.cpp (the version
 * vendored in llama-cpp-python 0.3.36, commit 0c1e570, whose llama-quantize wrote the
 * requantizations listed in the models' manifest.tsv; this code gives the same type counts for
 * each of them), restricted to the file types whose tensor types backplane has: no IQ1/IQ2/IQ3
 * types, so none of the rules of the IQ* file types below IQ4_NL. What they do:
 *
 * - Only weight matrices are quantised (names ending in "weight", at least two dimensions, not
 *   a norm, not a router "ffn_gate_inp", not a few tiny tensors of other architectures); the
 *   others keep their type.
 * - output.weight, and token_embd.weight when the model has no output.weight (tied
 *   embeddings), get Q6_K (Q8_0 for a Q8_0 file, or when its rows do not fit the base type).
 * - attn_v (and attn_qkv, attn_kv_b) get more bits in some mixes, counted in the order
 *   llama.cpp visits the tensors (by layer, then by name: i_attention_wv), ffn_down likewise by
 *   its own count, and attn_output by the mix alone.
 * - A type whose blocks do not divide the rows (k-quants and IQ4_XS need rows that are
 *   multiples of 256) falls back: Q2_K and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to
 *   Q8_0, IQ4_XS to IQ4_NL, and to F16 when even those blocks of 32 do not fit.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "quantize.h"
#include "tool.h"

/* LLAMA_FTYPE_* of llama.h. */
enum {
    FT_ALL_F32 = 0,
    FT_F16 = 1,
    FT_Q4_0 = 2,
    FT_Q4_1 = 3,
    FT_Q8_0 = 7,
    FT_Q5_0 = 8,
    FT_Q5_1 = 9,
    FT_Q2_K = 10,
    FT_Q3_K_S = 11,
    FT_Q3_K_M = 12,
    FT_Q3_K_L = 13,
    FT_Q4_K_S = 14,
    FT_Q4_K_M = 15,
    FT_Q5_K_S = 16,
    FT_Q5_K_M = 17,
    FT_Q6_K = 18,
    FT_IQ4_NL = 25,
    FT_IQ4_XS = 30,
    FT_BF16 = 32,
};

/* As llama-quantize lists them, Q3_K, Q4_K and Q5_K being its aliases of the _M mixes. */
static const struct quant_ftype ftypes[] = {
    {"Q4_0", FT_Q4_0, BP_TYPE_Q4_0},       {"Q4_1", FT_Q4_1, BP_TYPE_Q4_1},
    {"Q5_0", FT_Q5_0, BP_TYPE_Q5_0},       {"Q5_1", FT_Q5_1, BP_TYPE_Q5_1},
    {"Q8_0", FT_Q8_0, BP_TYPE_Q8_0},       {"Q2_K", FT_Q2_K, BP_TYPE_Q2_K},
    {"Q3_K_S", FT_Q3_K_S, BP_TYPE_Q3_K},   {"Q3_K_M", FT_Q3_K_M, BP_TYPE_Q3_K},
    {"Q3_K_L", FT_Q3_K_L, BP_TYPE_Q3_K},   {"Q4_K_S", FT_Q4_K_S, BP_TYPE_Q4_K},
    {"Q4_K_M", FT_Q4_K_M, BP_TYPE_Q4_K},   {"Q5_K_S", FT_Q5_K_S, BP_TYPE_Q5_K},
    {"Q5_K_M", FT_Q5_K_M, BP_TYPE_Q5_K},   {"Q6_K", FT_Q6_K, BP_TYPE_Q6_K},
    {"IQ4_NL", FT_IQ4_NL, BP_TYPE_IQ4_NL}, {"IQ4_XS", FT_IQ4_XS, BP_TYPE_IQ4_XS},
    {"F16", FT_F16, BP_TYPE_F16},          {"BF16", FT_BF16, BP_TYPE_BF16},
    {"F32", FT_ALL_F32, BP_TYPE_F32},      {"Q3_K", FT_Q3_K_M, BP_TYPE_Q3_K},
    {"Q4_K", FT_Q4_K_M, BP_TYPE_Q4_K},     {"Q5_K", FT_Q5_K_M, BP_TYPE_Q5_K},
};

const struct quant_ftype *quant_ftype_find(const char *name)
{
    for (size_t i = 0; i < sizeof(ftypes) / sizeof(ftypes[0]); i++)
        if (strcasecmp(ftypes[i].name, name) == 0)
            return &ftypes[i];
    return NULL;
}

const char *quant_ftype_names(void)
{
    return "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M (Q3_K), Q3_K_L, Q4_K_S, "
           "Q4_K_M (Q4_K), Q5_K_S, Q5_K_M (Q5_K), Q6_K, IQ4_NL, IQ4_XS, F16, BF16, F32";
}

/* ---- Which tensors are quantised -------------------------------------------------------- */

enum category {
    CAT_TOKEN_EMBD,
    CAT_ATTN_Q,
    CAT_ATTN_V, /* attn_v, attn_qkv and attn_kv_b share its counter */
    CAT_ATTN_K,
    CAT_ATTN_QKV,
    CAT_ATTN_KV_B,
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
    CAT_OUTPUT,
    CAT_OTHER
};

static bool has(const char *name, const char *part)
{
    return strstr(name, part) != NULL;
}

/* In llama.cpp's order of tests: the first that matches decides. */
static enum category category_of(const char *name)
{
    if (strcmp(name, "output.weight") == 0)
        return CAT_OUTPUT;
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "per_layer_token_embd.weight") == 0)
        return CAT_TOKEN_EMBD;
    static const struct {
        const char *part;
        enum category cat;
    } parts[] = {
        {"attn_qkv.weight", CAT_ATTN_QKV},       {"attn_kv_b.weight", CAT_ATTN_KV_B},
        {"attn_v.weight", CAT_ATTN_V},           {"attn_k.weight", CAT_ATTN_K},
        {"attn_q.weight", CAT_ATTN_Q},           {"attn_output.weight", CAT_ATTN_OUTPUT},
        {"ffn_up", CAT_FFN_UP},                  {"ffn_gate", CAT_FFN_GATE},
        {"ffn_down", CAT_FFN_DOWN},
    };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        if (has(name, parts[i].part))
            return parts[i].cat;
    return CAT_OTHER;
}

static bool is_attn_v(enum category c)
{
    return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B;
}

/* ggml_n_dims: the dimensions up to the last above 1. */
static int n_dims(const int64_t ne[4])
{
    int n = 4;
    while (n > 1 && ne[n - 1] == 1)
        n--;
    return n;
}

/* llama.cpp's tensor_allows_quantization, with its quantize_output_tensor on. */
static bool allows_quantization(const struct quant_item *it)
{
    static const char *const never[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
        "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
        "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
        "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
        "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
        "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
        ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
        ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
    };
    const size_t len = strlen(it->name);
    if (n_dims(it->ne) < 2 || len < 6 || strcmp(it->name + len - 6, "weight") != 0)
        return false;
    if (strcmp(it->name, "position_embd.weight") == 0 || strcmp(it->name, "token_types.weight") == 0)
        return false;
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        if (has(it->name, never[i]))
            return false;
    return true;
}

/* ---- The rules ---------------------------------------------------------------------------- */

struct state {
    const struct quant_ftype *ft;
    const struct quant_model *m;
    bool has_imatrix, tied;
    int n_attention_wv, i_attention_wv, i_ffn_down;
};

/* Layers 0 to n/8, the last eighth and every third between get more bits. */
static bool use_more_bits(int i_layer, int n_layers)
{
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

static enum bp_type output_rule(const struct state *s, const struct quant_item *it,
                                enum bp_type t)
{
    if (s->m->falcon || it->ne[0] % bp_type_block_size(t) != 0)
        return BP_TYPE_Q8_0;
    return t != BP_TYPE_Q8_0 ? BP_TYPE_Q6_K : t;
}

static enum bp_type attn_v_rule(struct state *s, enum bp_type t)
{
    const int ft = s->ft->ftype, gqa = s->m->n_gqa;
    if (ft == FT_Q2_K)
        t = gqa >= 4 ? BP_TYPE_Q4_K : BP_TYPE_Q3_K;
    else if (ft == FT_Q3_K_M)
        t = s->i_attention_wv < 2 ? BP_TYPE_Q5_K : BP_TYPE_Q4_K;
    else if (ft == FT_Q3_K_L)
        t = BP_TYPE_Q5_K;
    else if ((ft == FT_IQ4_NL || ft == FT_IQ4_XS) && gqa >= 4)
        t = BP_TYPE_Q5_K;
    else if ((ft == FT_Q4_K_M || ft == FT_Q5_K_M) &&
             use_more_bits(s->i_attention_wv, s->n_attention_wv))
        t = BP_TYPE_Q6_K;
    else if (ft == FT_Q4_K_S && s->i_attention_wv < 4)
        t = BP_TYPE_Q5_K;
    /* In a 70B llama eight heads share attn_v: more bits cost little there. */
    if (s->m->is_70b && (t == BP_TYPE_Q3_K || t == BP_TYPE_Q4_K))
        t = BP_TYPE_Q5_K;
    if (s->m->n_expert == 8)
        t = BP_TYPE_Q8_0;
    s->i_attention_wv++;
    return t;
}

/* The layer of an ffn tensor: its rank among its kind, or (with experts, which llama.cpp does
 * not find in layer order) the number in its name. -1 after a message. */
static int ffn_layer(const struct state *s, const struct quant_item *it, int counter)
{
    if (s->m->n_expert <= 1)
        return counter;
    int layer = -1;
    if (sscanf(it->name, "blk.%d.", &layer) != 1 || layer < 0 || layer >= s->m->n_layer) {
        fprintf(stderr, "backplane quantize: cannot tell the layer of tensor '%s' (the model "
                "has %d layers)\n", tool_text(it->name), s->m->n_layer);
        return -1;
    }
    return layer;
}

static enum bp_type ffn_down_rule(struct state *s, int i, enum bp_type t)
{
    const int ft = s->ft->ftype, n = s->m->n_layer;
    const bool falcon = s->m->falcon;
    if (ft == FT_Q2_K)
        t = BP_TYPE_Q3_K;
    else if (ft == FT_Q3_K_M)
        t = i < n / 16                            ? BP_TYPE_Q5_K
            : !falcon || use_more_bits(i, n)      ? BP_TYPE_Q4_K
                                                  : BP_TYPE_Q3_K;
    else if (ft == FT_Q3_K_L)
        t = falcon ? BP_TYPE_Q4_K : BP_TYPE_Q5_K;
    else if (ft == FT_Q4_K_M) {
        if (falcon)
            t = i < n / 16 ? BP_TYPE_Q6_K : use_more_bits(i, n) ? BP_TYPE_Q5_K : BP_TYPE_Q4_K;
        else if (use_more_bits(i, n))
            t = BP_TYPE_Q6_K;
    } else if (i < n / 8 && (ft == FT_IQ4_NL || ft == FT_IQ4_XS) && !s->has_imatrix)
        t = BP_TYPE_Q5_K;
    else if (ft == FT_Q5_K_M && use_more_bits(i, n))
        t = BP_TYPE_Q6_K;
    else if (ft == FT_Q4_K_S && !falcon && i < n / 8)
        t = BP_TYPE_Q5_K;
    else if ((ft == FT_Q4_0 || ft == FT_Q5_0) && s->has_imatrix && i < n / 8)
        /* llama.cpp guards the first ffn_down layers, with an imatrix only, so that a file
         * without one comes out as it always did. */
        t = ft == FT_Q4_0 ? BP_TYPE_Q4_1 : BP_TYPE_Q5_1;
    s->i_ffn_down++;
    return t;
}

static enum bp_type attn_output_rule(const struct state *s, enum bp_type t)
{
    const int ft = s->ft->ftype;
    if (s->m->falcon)
        return ft == FT_Q3_K_L ? BP_TYPE_Q4_K : t;
    if (s->m->n_expert == 8) {
        const bool more = ft == FT_Q2_K || ft == FT_Q3_K_S || ft == FT_Q3_K_M ||
                          ft == FT_IQ4_NL || ft == FT_Q4_K_S || ft == FT_Q4_K_M ||
                          ft == FT_IQ4_XS;
        return more ? BP_TYPE_Q5_K : t;
    }
    return ft == FT_Q2_K     ? BP_TYPE_Q3_K
           : ft == FT_Q3_K_M ? BP_TYPE_Q4_K
           : ft == FT_Q3_K_L ? BP_TYPE_Q5_K
                             : t;
}

/* llama_tensor_get_type_impl for one tensor; BP_TYPE_COUNT after a message. */
static enum bp_type rule(struct state *s, const struct quant_item *it, enum bp_type t)
{
    const enum category c = category_of(it->name);
    if (c == CAT_OUTPUT || (s->tied && c == CAT_TOKEN_EMBD))
        return output_rule(s, it, t);
    if (c == CAT_TOKEN_EMBD)
        return t;
    /* attn_qkv and attn_kv_b take attn_v's rule: llama.cpp tests for them first, so that its
     * later branch for attn_qkv alone is never reached. */
    if (is_attn_v(c))
        return attn_v_rule(s, t);
    if (c == CAT_ATTN_K)
        return s->m->n_expert == 8 ? BP_TYPE_Q8_0 : t;
    if (c == CAT_FFN_DOWN) {
        const int layer = ffn_layer(s, it, s->i_ffn_down);
        return layer < 0 ? BP_TYPE_COUNT : ffn_down_rule(s, layer, t);
    }
    if (c == CAT_ATTN_OUTPUT)
        return attn_output_rule(s, t);
    return t;
}

/* tensor_type_fallback: a type whose blocks fit rows of ne0; BP_TYPE_COUNT after a message. */
static enum bp_type fallback(const struct quant_item *it, enum bp_type t)
{
    const int64_t ne0 = it->ne[0];
    if (ne0 % bp_type_block_size(t) == 0)
        return t;
    enum bp_type f;
    switch (t) {
    case BP_TYPE_Q2_K:
    case BP_TYPE_Q3_K: f = BP_TYPE_Q4_0; break;
    case BP_TYPE_Q4_K: f = BP_TYPE_Q5_0; break;
    case BP_TYPE_Q5_K: f = BP_TYPE_Q5_1; break;
    case BP_TYPE_Q6_K: f = BP_TYPE_Q8_0; break;
    case BP_TYPE_IQ4_XS: f = BP_TYPE_IQ4_NL; break;
    default:
        fprintf(stderr, "backplane quantize: tensor '%s' has rows of %lld elements, which %s "
                "(blocks of %lld) cannot hold, and no other type stands in for %s\n",
                tool_text(it->name), (long long)ne0, bp_type_name(t),
                (long long)bp_type_block_size(t), bp_type_name(t));
        return BP_TYPE_COUNT;
    }
    return ne0 % bp_type_block_size(f) == 0 ? f : BP_TYPE_F16;
}

/* ---- The plan ----------------------------------------------------------------------------- */

/* llama.cpp visits the tensors by layer ("blk.N.", -1 for the others), then by name. */
static int layer_of(const char *name)
{
    int layer = -1;
    return sscanf(name, "blk.%d.", &layer) == 1 ? layer : -1;
}

static const struct quant_item *sort_items;

static int by_layer_then_name(const void *a, const void *b)
{
    const struct quant_item *x = &sort_items[*(const size_t *)a];
    const struct quant_item *y = &sort_items[*(const size_t *)b];
    const int lx = layer_of(x->name), ly = layer_of(y->name);
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The type of one tensor; false after a message. */
static bool plan_one(struct state *s, struct quant_item *it, bool pure)
{
    it->to = it->wanted = it->from;
    it->quantize = allows_quantization(it);
    if (!it->quantize)
        return true;
    enum bp_type t = s->ft->base;
    const struct bp_type_traits *tr = bp_type_get_traits(t);
    if (tr->is_quantized) {
        if (!pure && (t = rule(s, it, t)) == BP_TYPE_COUNT)
            return false;
        it->wanted = t;
        if ((t = fallback(it, t)) == BP_TYPE_COUNT)
            return false;
    }
    it->wanted = tr->is_quantized ? it->wanted : t;
    it->to = t;
    return true;
}

bool quant_plan(const struct quant_ftype *ft, const struct quant_model *m, struct quant_item *items,
                size_t n, bool pure, bool has_imatrix)
{
    struct state s = {.ft = ft, .m = m, .has_imatrix = has_imatrix, .tied = true};
    for (size_t i = 0; i < n; i++) {
        const enum category c = category_of(items[i].name);
        s.n_attention_wv += is_attn_v(c);
        if (c == CAT_OUTPUT)
            s.tied = false;
    }
    size_t *order = malloc((n ? n : 1) * sizeof(*order));
    if (order == NULL) {
        fprintf(stderr, "backplane quantize: out of memory\n");
        return false;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    sort_items = items;
    qsort(order, n, sizeof(*order), by_layer_then_name);
    bool ok = true;
    for (size_t k = 0; k < n && ok; k++)
        ok = plan_one(&s, &items[order[k]], pure);
    free(order);
    return ok;
}
