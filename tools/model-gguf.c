/* model-gguf.c - the decoder of model.c from and to GGUF files: llama-architecture models
 * (llama, mistral, qwen2) as llama.cpp's converters write them.
 *
 * Reading: the hyper-parameters come from the "<arch>.*" metadata, the tensors by their GGUF
 * names, each in its own type; every disagreement between metadata and tensors is refused with
 * a sentence naming both. Writing: our seeded models as a "llama" file with the metadata
 * llama.cpp needs (and a placeholder vocabulary of the right size: the tokenizer is not ours).
 *
 * Rope. llama's rope (BP_ROPE_NORMAL) rotates pairs of adjacent values (2j, 2j+1) of each head;
 * NeoX's (qwen2, our seeded models) pairs j and j + D/2, at the same frequency. A model written
 * for one computes the same with the other when the rows of wq and wk (and their biases) are
 * reordered within each head, as llama.cpp's HF converter does for llama: file row 2j+s of a
 * head is row s*D/2 + j of ours. The dot products of q and k are then over the same pairs, in
 * another order. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <backplane/bp-plugin.h> /* bp_set_error */

#include "model.h"

/* The architectures served: how their rope pairs values, and whether q, k and v have biases. */
struct arch {
    const char *name;
    int rope_mode;
};

static const struct arch archs[] = {
    {"llama", BP_ROPE_NORMAL},
    {"mistral", BP_ROPE_NORMAL},
    {"qwen2", BP_ROPE_NEOX},
};

/* The KV cache holds at most this many positions, whatever context the model was trained for
 * (131072 positions of a 7B model's cache would be 64 GiB). */
#define GGUF_MAX_CTX 4096

/* ---- Metadata -------------------------------------------------------------------------------- */

/* "<arch>.<key>" as an integer in [lo, hi]: dflt when absent and not required. */
static enum bp_status get_int(const bp_gguf *g, const char *arch, const char *key, bool required,
                              int64_t dflt, int64_t lo, int64_t hi, int64_t *out)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    const int64_t i = bp_gguf_find_key(g, full);
    if (i < 0) {
        if (required)
            return bp_set_error(BP_ERR_INVALID_ARG, "the model's metadata has no %s", full);
        *out = dflt;
        return BP_OK;
    }
    int64_t v;
    enum bp_status st = bp_gguf_get_int(g, i, &v);
    if (st != BP_OK)
        return st;
    if (v < lo || v > hi)
        return bp_set_error(BP_ERR_INVALID_ARG, "the model's %s is %lld; it must be in [%lld, "
                            "%lld]", full, (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return BP_OK;
}

/* "<arch>.<key>" as a finite float in (0, hi]: dflt when absent. */
static enum bp_status get_float(const bp_gguf *g, const char *arch, const char *key, double dflt,
                                double hi, double *out)
{
    char full[128];
    snprintf(full, sizeof(full), "%s.%s", arch, key);
    const int64_t i = bp_gguf_find_key(g, full);
    if (i < 0) {
        *out = dflt;
        return BP_OK;
    }
    double v;
    enum bp_status st = bp_gguf_get_float(g, i, &v);
    if (st != BP_OK)
        return st;
    if (!(v > 0.0 && v <= hi))
        return bp_set_error(BP_ERR_INVALID_ARG, "the model's %s is %g; it must be in (0, %g]",
                            full, v, hi);
    *out = v;
    return BP_OK;
}

/* A string value, or NULL when absent (or not a string: BP_ERR_TYPE in *st). */
static const char *get_str(const bp_gguf *g, const char *key, enum bp_status *st)
{
    const int64_t i = bp_gguf_find_key(g, key);
    const char *v = NULL;
    if (i >= 0)
        *st = bp_gguf_get_str(g, i, &v, NULL);
    return v;
}

/* YaRN's parameters into cfg, the defaults llama.cpp takes where the file has none. */
static enum bp_status yarn_params(const bp_gguf *g, const char *arch, int64_t n_ctx,
                                  struct model_config *cfg)
{
    double ext, attn, fast, slow, log_mul;
    int64_t orig;
    enum bp_status st;
    char key[128];
    snprintf(key, sizeof(key), "%s.rope.scaling.yarn_attn_factor", arch);
    const bool yarn_attn = bp_gguf_find_key(g, key) >= 0;
    if ((st = get_float(g, arch, "rope.scaling.yarn_log_multiplier", 1.0, 1e6, &log_mul)) !=
        BP_OK)
        return st;
    snprintf(key, sizeof(key), "%s.rope.scaling.yarn_log_multiplier", arch);
    if (bp_gguf_find_key(g, key) >= 0)
        return bp_set_error(BP_ERR_UNSUPPORTED, "the model's YaRN has a log multiplier "
                            "(%s = %g), which backplane run does not implement", key, log_mul);
    if ((st = get_float(g, arch, "rope.scaling.yarn_ext_factor", 1.0, 1.0, &ext)) != BP_OK ||
        (st = get_float(g, arch,
                        yarn_attn ? "rope.scaling.yarn_attn_factor" : "rope.scaling.attn_factor",
                        1.0, 1e3, &attn)) != BP_OK ||
        (st = get_float(g, arch, "rope.scaling.yarn_beta_fast", 32.0, 1e6, &fast)) != BP_OK ||
        (st = get_float(g, arch, "rope.scaling.yarn_beta_slow", 1.0, 1e6, &slow)) != BP_OK ||
        (st = get_int(g, arch, "rope.scaling.original_context_length", false, n_ctx, 1,
                      INT32_MAX, &orig)) != BP_OK)
        return st;
    cfg->yarn_ext_factor = (float)ext;
    cfg->yarn_attn_factor = (float)attn;
    cfg->yarn_beta_fast = (float)fast;
    cfg->yarn_beta_slow = (float)slow;
    cfg->yarn_n_ctx_orig = (int)orig;
    return BP_OK;
}

/* The rope scaling factor (1 when none), and whether it is YaRN's; kinds other than linear and
 * YaRN are refused. */
static enum bp_status rope_scaling(const bp_gguf *g, const char *arch, double *factor,
                                   bool *yarn)
{
    char key[128];
    enum bp_status st = BP_OK;
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    const char *type = get_str(g, key, &st);
    if (st != BP_OK)
        return st;
    if (type != NULL && strcmp(type, "none") != 0 && strcmp(type, "linear") != 0 &&
        strcmp(type, "yarn") != 0)
        return bp_set_error(BP_ERR_UNSUPPORTED, "the model's rope scaling is '%s'; backplane run "
                            "serves 'none', 'linear' and 'yarn'", type);
    *factor = 1.0;
    *yarn = type != NULL && strcmp(type, "yarn") == 0;
    if (type != NULL && strcmp(type, "none") == 0)
        return BP_OK;
    snprintf(key, sizeof(key), "%s.rope.scaling.factor", arch);
    if (bp_gguf_find_key(g, key) >= 0)
        return get_float(g, arch, "rope.scaling.factor", 1.0, 1e6, factor);
    return get_float(g, arch, "rope.scale_linear", 1.0, 1e6, factor); /* older files */
}

static const struct arch *arch_of(const bp_gguf *g, enum bp_status *st)
{
    *st = BP_OK;
    const char *name = get_str(g, "general.architecture", st);
    if (*st != BP_OK)
        return NULL;
    if (name == NULL) {
        *st = bp_set_error(BP_ERR_INVALID_ARG, "the file has no general.architecture");
        return NULL;
    }
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        if (strcmp(name, archs[i].name) == 0)
            return &archs[i];
    *st = bp_set_error(BP_ERR_UNSUPPORTED, "the model's architecture is '%.64s'; backplane run "
                       "serves llama, mistral and qwen2", name);
    return NULL;
}

/* The tensor called name: its index, info filled in; -1 when absent. A type backplane does not
 * compute with is an error (in *st) naming the tensor and the type. */
static int64_t tensor(const bp_gguf *g, const char *name, struct bp_gguf_tensor *info,
                      enum bp_status *st)
{
    const int64_t i = bp_gguf_find_tensor(g, name);
    if (i >= 0)
        *st = bp_gguf_get_tensor(g, i, info);
    return i;
}

enum bp_status model_gguf_config(const bp_gguf *g, struct model_config *cfg, char *name,
                                 size_t name_size, enum bp_type *wtype)
{
    enum bp_status st;
    const struct arch *a = arch_of(g, &st);
    if (a == NULL)
        return st;
    const char *an = a->name;
    int64_t layers = 0, embd = 0, ff = 0, heads = 0, heads_kv = 0, ctx = 0, rope_dims = 0;
    double base = 0, eps = 0, factor = 1;
    bool yarn = false;
    if ((st = get_int(g, an, "block_count", true, 0, 1, 4096, &layers)) != BP_OK ||
        (st = get_int(g, an, "embedding_length", true, 0, 1, 1 << 20, &embd)) != BP_OK ||
        (st = get_int(g, an, "feed_forward_length", true, 0, 1, 1 << 22, &ff)) != BP_OK ||
        (st = get_int(g, an, "attention.head_count", true, 0, 1, 4096, &heads)) != BP_OK ||
        (st = get_int(g, an, "attention.head_count_kv", false, heads, 1, heads, &heads_kv)) !=
            BP_OK ||
        (st = get_int(g, an, "context_length", false, GGUF_MAX_CTX, 1, INT32_MAX, &ctx)) != BP_OK ||
        (st = get_float(g, an, "rope.freq_base", 10000.0, 1e12, &base)) != BP_OK ||
        (st = get_float(g, an, "attention.layer_norm_rms_epsilon", 1e-5, 1.0, &eps)) != BP_OK ||
        (st = rope_scaling(g, an, &factor, &yarn)) != BP_OK)
        return st;
    if (embd % heads != 0)
        return bp_set_error(BP_ERR_INVALID_ARG, "the model's %lld heads do not divide its "
                            "embedding length %lld", (long long)heads, (long long)embd);
    if (heads % heads_kv != 0)
        return bp_set_error(BP_ERR_INVALID_ARG, "the model's %lld key/value heads do not divide "
                            "its %lld heads", (long long)heads_kv, (long long)heads);
    const int64_t D = embd / heads;
    if ((st = get_int(g, an, "rope.dimension_count", false, D, 2, D, &rope_dims)) != BP_OK)
        return st;
    if (rope_dims % 2 != 0)
        return bp_set_error(BP_ERR_INVALID_ARG, "the model's rope.dimension_count %lld is odd",
                            (long long)rope_dims);

    struct bp_gguf_tensor emb, q;
    st = BP_OK;
    if (tensor(g, "token_embd.weight", &emb, &st) < 0 && st == BP_OK)
        return bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor token_embd.weight");
    if (st == BP_OK && tensor(g, "blk.0.attn_q.weight", &q, &st) < 0 && st == BP_OK)
        return bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor blk.0.attn_q.weight");
    if (st != BP_OK)
        return st;
    if (emb.n_dims != 2 || emb.ne[0] != embd || emb.ne[1] < 1 || emb.ne[1] > INT32_MAX)
        return bp_set_error(BP_ERR_SHAPE, "token_embd.weight is [%lld, %lld]; the metadata asks "
                            "for [%lld, n_vocab]", (long long)emb.ne[0], (long long)emb.ne[1],
                            (long long)embd);
    int64_t vocab;
    if ((st = get_int(g, an, "vocab_size", false, emb.ne[1], emb.ne[1], emb.ne[1], &vocab)) !=
        BP_OK)
        return st;

    const char *gname = get_str(g, "general.name", &st);
    if (st != BP_OK)
        return st;
    snprintf(name, name_size, "%s", gname != NULL && gname[0] != '\0' ? gname : an);
    for (char *c = name; *c; c++) /* a name for one line of a report */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    *cfg = (struct model_config){
        .name = name,
        .n_layer = (int)layers,
        .n_embd = (int)embd,
        .n_ff = (int)ff,
        .n_head = (int)heads,
        .n_vocab = (int)vocab,
        .n_ctx = (int)(ctx < GGUF_MAX_CTX ? ctx : GGUF_MAX_CTX),
        .n_head_kv = (int)heads_kv,
        .rope_mode = a->rope_mode,
        .rope_dims = (int)rope_dims,
        .rope_base = (float)base,
        .rope_scale = (float)(1.0 / factor),
        .norm_eps = (float)eps,
        .kv_type = BP_TYPE_F16,
    };
    if (yarn && (st = yarn_params(g, an, ctx, cfg)) != BP_OK)
        return st;
    /* Mixture of experts (Mixtral: llama with expert_count). */
    int64_t experts = 0, used = 0;
    if ((st = get_int(g, an, "expert_count", false, 0, 0, 4096, &experts)) != BP_OK ||
        (experts > 0 &&
         (st = get_int(g, an, "expert_used_count", true, 0, 1, experts, &used)) != BP_OK))
        return st;
    cfg->n_expert = (int)experts;
    cfg->n_expert_used = (int)used;
    *wtype = q.type;
    return BP_OK;
}

/* ---- Tensors ------------------------------------------------------------------------------------ */

/* The tensor the file calls "<fmt % il>", described in ctx with the file's type after checking
 * its shape is [ne0, ne1] (ne1 = 0: one dimension); NULL after bp_set_error. Absent and
 * optional: NULL with *absent set and no error. */
static bp_tensor *from_file(const bp_gguf *g, bp_context *ctx, int64_t ne0, int64_t ne1,
                            bool optional, bool *absent, const char *fmt, int il)
{
    char name[96];
    snprintf(name, sizeof(name), fmt, il);
    struct bp_gguf_tensor info;
    enum bp_status st = BP_OK;
    if (absent != NULL)
        *absent = false;
    if (tensor(g, name, &info, &st) < 0) {
        if (optional) {
            *absent = true;
            return NULL;
        }
        bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor %s", name);
        return NULL;
    }
    if (st != BP_OK)
        return NULL;
    const int want_dims = ne1 > 0 ? 2 : 1;
    if (info.n_dims > want_dims || info.ne[0] != ne0 || info.ne[1] != (ne1 > 0 ? ne1 : 1)) {
        if (ne1 > 0)
            bp_set_error(BP_ERR_SHAPE, "tensor %s is [%lld, %lld, %lld]; the metadata asks for "
                         "[%lld, %lld]", name, (long long)info.ne[0], (long long)info.ne[1],
                         (long long)info.ne[2], (long long)ne0, (long long)ne1);
        else
            bp_set_error(BP_ERR_SHAPE, "tensor %s is [%lld, %lld]; the metadata asks for [%lld]",
                         name, (long long)info.ne[0], (long long)info.ne[1], (long long)ne0);
        return NULL;
    }
    bp_tensor *t = ne1 > 0 ? bp_new_tensor_2d(ctx, info.type, ne0, ne1)
                           : bp_new_tensor_1d(ctx, info.type, ne0);
    return t != NULL ? bp_set_name(t, name) : NULL;
}

/* The stacked expert tensor "<fmt % il>" [ne0, ne1, ne2], as from_file; NULL after bp_set_error. */
static bp_tensor *experts_from_file(const bp_gguf *g, bp_context *ctx, int64_t ne0, int64_t ne1,
                                    int64_t ne2, const char *fmt, int il)
{
    char name[96];
    snprintf(name, sizeof(name), fmt, il);
    struct bp_gguf_tensor info;
    enum bp_status st = BP_OK;
    if (tensor(g, name, &info, &st) < 0) {
        if (st == BP_OK)
            bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor %s", name);
        return NULL;
    }
    if (info.n_dims > 3 || info.ne[0] != ne0 || info.ne[1] != ne1 || info.ne[2] != ne2) {
        bp_set_error(BP_ERR_SHAPE, "tensor %s is [%lld, %lld, %lld]; the metadata asks for "
                     "[%lld, %lld, %lld]", name, (long long)info.ne[0], (long long)info.ne[1],
                     (long long)info.ne[2], (long long)ne0, (long long)ne1, (long long)ne2);
        return NULL;
    }
    bp_tensor *t = bp_new_tensor_3d(ctx, info.type, ne0, ne1, ne2);
    return t != NULL ? bp_set_name(t, name) : NULL;
}

/* Norms are multiplied into f32 activations: they must be f32. */
static bool f32_vector(bp_tensor *t)
{
    if (t->type == BP_TYPE_F32)
        return true;
    bp_set_error(BP_ERR_UNSUPPORTED, "tensor %s is %s; backplane run needs it f32", t->name,
                 bp_type_name(t->type));
    return false;
}

static bool describe_from_file(struct model *m, const bp_gguf *g, bool *tied)
{
    const struct model_config *c = &m->cfg;
    const int64_t E = c->n_embd, F = c->n_ff, EK = (int64_t)E / c->n_head * c->n_head_kv;
    bp_context *w = m->wctx, *x = m->xctx;
    m->tok_embd = from_file(g, m->ectx, E, c->n_vocab, false, NULL, "token_embd.weight", 0);
    m->out_norm = from_file(g, w, E, 0, false, NULL, "output_norm.weight", 0);
    if (m->tok_embd == NULL || m->out_norm == NULL || !f32_vector(m->out_norm))
        return false;
    m->output = from_file(g, w, E, c->n_vocab, true, tied, "output.weight", 0);
    if (*tied) { /* the output projection is the embedding table (tied weights) */
        m->output = bp_new_tensor_2d(w, m->tok_embd->type, E, c->n_vocab);
        if (m->output != NULL)
            bp_set_name(m->output, "output.weight");
    }
    if (m->output == NULL)
        return false;
    for (int il = 0; il < c->n_layer; il++) {
        struct model_layer *l = &m->layers[il];
        bool no_bq, no_bk, no_bv;
        if ((l->attn_norm = from_file(g, w, E, 0, false, NULL, "blk.%d.attn_norm.weight", il)) ==
                NULL ||
            !f32_vector(l->attn_norm) ||
            (l->wq = from_file(g, w, E, E, false, NULL, "blk.%d.attn_q.weight", il)) == NULL ||
            (l->wk = from_file(g, w, E, EK, false, NULL, "blk.%d.attn_k.weight", il)) == NULL ||
            (l->wv = from_file(g, w, E, EK, false, NULL, "blk.%d.attn_v.weight", il)) == NULL ||
            (l->wo = from_file(g, w, E, E, false, NULL, "blk.%d.attn_output.weight", il)) ==
                NULL ||
            (l->ffn_norm = from_file(g, w, E, 0, false, NULL, "blk.%d.ffn_norm.weight", il)) ==
                NULL ||
            !f32_vector(l->ffn_norm))
            return false;
        const int64_t X = c->n_expert;
        if (X > 0 &&
            ((l->ffn_gate_inp = from_file(g, w, E, X, false, NULL, "blk.%d.ffn_gate_inp.weight",
                                          il)) == NULL ||
             (l->ffn_gate_exps = experts_from_file(g, x, E, F, X, "blk.%d.ffn_gate_exps.weight",
                                                   il)) == NULL ||
             (l->ffn_up_exps = experts_from_file(g, x, E, F, X, "blk.%d.ffn_up_exps.weight",
                                                 il)) == NULL ||
             (l->ffn_down_exps = experts_from_file(g, x, F, E, X, "blk.%d.ffn_down_exps.weight",
                                                   il)) == NULL))
            return false;
        if (X == 0 &&
            ((l->w_gate = from_file(g, w, E, F, false, NULL, "blk.%d.ffn_gate.weight", il)) ==
                 NULL ||
             (l->w_up = from_file(g, w, E, F, false, NULL, "blk.%d.ffn_up.weight", il)) == NULL ||
             (l->w_down = from_file(g, w, F, E, false, NULL, "blk.%d.ffn_down.weight", il)) ==
                 NULL))
            return false;
        if (il == 0)
            m->wtype = l->wq->type;
        l->bq = from_file(g, w, E, 0, true, &no_bq, "blk.%d.attn_q.bias", il);
        l->bk = from_file(g, w, EK, 0, true, &no_bk, "blk.%d.attn_k.bias", il);
        l->bv = from_file(g, w, EK, 0, true, &no_bv, "blk.%d.attn_v.bias", il);
        if ((!no_bq && l->bq == NULL) || (!no_bk && l->bk == NULL) || (!no_bv && l->bv == NULL))
            return false;
        if (no_bq != no_bk || no_bk != no_bv) {
            bp_set_error(BP_ERR_INVALID_ARG, "layer %d has biases for some of q, k and v but not "
                         "all three", il);
            return false;
        }
        if ((l->bq != NULL && !f32_vector(l->bq)) || (l->bk != NULL && !f32_vector(l->bk)) ||
            (l->bv != NULL && !f32_vector(l->bv)))
            return false;
        char kn[64], vn[64];
        snprintf(kn, sizeof(kn), "blk.%d.cache_k", il);
        snprintf(vn, sizeof(vn), "blk.%d.cache_v", il);
        l->k_cache = bp_set_name(bp_new_tensor_2d(m->kvctx, c->kv_type, EK, c->n_ctx), kn);
        l->v_cache = bp_set_name(bp_new_tensor_2d(m->kvctx, c->kv_type, EK, c->n_ctx), vn);
        if (l->k_cache == NULL || l->v_cache == NULL)
            return false;
    }
    return true;
}

/* Lets the pages of the mapping that lie wholly inside [p, p + n) leave memory once their bytes
 * are copied: a repacked or device copy beside the mapped original would otherwise count twice
 * in the resident size. The mapping is private and read-only, so a later read of those bytes
 * (a tensor used twice, the tied output) faults them in from the file again. Advice only: a
 * failure changes nothing. */
static void release_pages(const void *p, size_t n)
{
    const long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0)
        return;
    const uintptr_t lo = ((uintptr_t)p + (uintptr_t)ps - 1) / (uintptr_t)ps * (uintptr_t)ps;
    const uintptr_t hi = ((uintptr_t)p + n) / (uintptr_t)ps * (uintptr_t)ps;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* The file's bytes of tensor `from` (by name) into t; their pages of the mapping then leave
 * memory (release_pages). */
static enum bp_status load_tensor(const bp_gguf *g, bp_tensor *t, const char *from)
{
    struct bp_gguf_tensor info;
    const int64_t i = bp_gguf_find_tensor(g, from);
    enum bp_status st = i >= 0 ? bp_gguf_get_tensor(g, i, &info)
                               : bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor %s", from);
    if (st != BP_OK)
        return st;
    if (info.size != bp_nbytes(t))
        return bp_set_error(BP_ERR_SHAPE, "tensor %s holds %zu bytes; %s needs %zu", from,
                            info.size, t->name, bp_nbytes(t));
    st = bp_tensor_set(t, info.data, 0, info.size);
    if (st == BP_OK)
        release_pages(info.data, info.size);
    return st;
}

size_t model_gguf_weight_bytes(const bp_gguf *g)
{
    size_t total = 0;
    for (int64_t i = 0; i < bp_gguf_get_n_tensors(g); i++) {
        struct bp_gguf_tensor info = {0};
        if (bp_gguf_get_tensor(g, i, &info) == BP_OK || info.name != NULL) {
            total += info.size;
            if (strcmp(info.name, "token_embd.weight") == 0 &&
                bp_gguf_find_tensor(g, "output.weight") < 0)
                total += info.size;
        }
    }
    return total;
}

/* Every tensor of the file is one the model uses: a file with more (llama 3's rope_freqs, a
 * vision tower, ...) is a model this decoder would compute wrongly. */
static enum bp_status all_tensors_used(const struct model *m, const bp_gguf *g)
{
    for (int64_t i = 0; i < bp_gguf_get_n_tensors(g); i++) {
        struct bp_gguf_tensor info = {0};
        enum bp_status st = bp_gguf_get_tensor(g, i, &info);
        if (st != BP_OK && info.name == NULL)
            return st;
        bool used = strcmp(info.name, m->tok_embd->name) == 0;
        for (size_t j = 0; !used && j < bp_context_get_n_tensors(m->wctx); j++)
            used = strcmp(info.name, bp_context_get_tensor(m->wctx, j)->name) == 0;
        for (size_t j = 0; !used && m->xctx != NULL && j < bp_context_get_n_tensors(m->xctx); j++)
            used = strcmp(info.name, bp_context_get_tensor(m->xctx, j)->name) == 0;
        if (!used)
            return bp_set_error(BP_ERR_UNSUPPORTED, "the file holds tensor %s, which this "
                                "decoder has no use for: the model is not one it computes "
                                "correctly", info.name);
    }
    return BP_OK;
}

/* The weights used where they lie in the file's mapping, without a copy: when they and the
 * embedding table go to the host buffer type (the CPU; not its repacked layout) and every tensor
 * of the file is 64-byte aligned, as that buffer type requires (files written with
 * general.alignment 64, as --save-gguf does; GGUF's default 32 leaves about half of them
 * unaligned). The mapping is read-only: nothing writes weights. False: copy them instead. */
static bool in_place(struct model *m, const bp_gguf *g, const struct model_placement *where,
                     bool tied, enum bp_status *st)
{
    bp_buffer_type *host = bp_host_buffer_type();
    *st = BP_OK;
    const bool file_experts = where->experts_file != NULL && m->xctx != NULL;
    if (where->weights != host || where->embedding != host ||
        (where->experts != NULL && where->experts != host && !file_experts))
        return false;
    const char *base = NULL;
    size_t end = 0;
    for (int64_t i = 0; i < bp_gguf_get_n_tensors(g); i++) {
        struct bp_gguf_tensor info = {0};
        if (bp_gguf_get_tensor(g, i, &info) != BP_OK || (uintptr_t)info.data % 64 != 0)
            return false;
        base = (const char *)info.data - info.offset; /* the start of the mapped file */
        end = info.offset + info.size > end ? info.offset + info.size : end;
    }
    if (base == NULL || (uintptr_t)base % 64 != 0)
        return false;
    m->wbuf = bp_buffer_from_host_ptr((void *)base, end);
    if (m->wbuf == NULL) {
        *st = bp_last_status();
        return true;
    }
    bp_buffer_set_usage(m->wbuf, BP_BUFFER_USAGE_WEIGHTS);
    /* The embedding table first, then every tensor of the weights' context and the experts'. */
    const size_t nw = bp_context_get_n_tensors(m->wctx);
    const size_t nx = m->xctx != NULL && !file_experts ? bp_context_get_n_tensors(m->xctx) : 0;
    for (size_t j = 0; *st == BP_OK && j <= nw + nx; j++) {
        bp_tensor *t = j == 0    ? m->tok_embd
                       : j <= nw ? bp_context_get_tensor(m->wctx, j - 1)
                                 : bp_context_get_tensor(m->xctx, j - 1 - nw);
        const char *from = t == m->output && tied ? "token_embd.weight" : t->name;
        struct bp_gguf_tensor info;
        const int64_t i = bp_gguf_find_tensor(g, from);
        *st = i >= 0 ? bp_gguf_get_tensor(g, i, &info)
                     : bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor %s", from);
        if (*st == BP_OK && info.size != bp_nbytes(t))
            *st = bp_set_error(BP_ERR_SHAPE, "tensor %s holds %zu bytes; %s needs %zu", from,
                               info.size, t->name, bp_nbytes(t));
        if (*st == BP_OK) {
            bp_set_param(t);
            *st = bp_buffer_place_tensor(m->wbuf, t, (void *)info.data);
        }
    }
    if (*st == BP_OK) {
        m->kvbuf = bp_alloc_ctx_tensors(m->kvctx, where->kv);
        *st = m->kvbuf != NULL ? bp_buffer_clear(m->kvbuf, 0) : bp_last_status();
    }
    m->weights_in_place = *st == BP_OK;
    return true;
}

/* The embedding table used where it lies in the file's mapping when the weights are copied
 * (repacked, or to another device) but the table goes to a host buffer type (the CPU's, plain
 * or CPU_REPACK, which keeps a GET_ROWS table as it is) and is 64-byte aligned: GET_ROWS touches only the rows of the tokens seen, so the table costs memory by the
 * page as it is used, not a whole copy (with tied output weights, a second one beside the
 * output's). False, with *st BP_OK, when it does not apply; m->ebuf holds it when it does. */
static bool embedding_in_place(struct model *m, const bp_gguf *g,
                               const struct model_placement *where, enum bp_status *st)
{
    struct bp_gguf_tensor info;
    const int64_t i = bp_gguf_find_tensor(g, "token_embd.weight");
    if (!bp_buffer_type_is_host(where->embedding) || i < 0 ||
        bp_gguf_get_tensor(g, i, &info) != BP_OK || (uintptr_t)info.data % 64 != 0 ||
        info.size != bp_nbytes(m->tok_embd))
        return false;
    m->ebuf = bp_buffer_from_host_ptr((void *)info.data, info.size);
    if (m->ebuf == NULL) {
        *st = bp_last_status();
        return false;
    }
    bp_set_param(m->tok_embd);
    *st = bp_buffer_place_tensor(m->ebuf, m->tok_embd, (void *)info.data);
    return *st == BP_OK;
}

/* The stacked experts left in the file at path: a File buffer over it (read with pread when the
 * scheduler copies the experts a product uses), each tensor at its offset in the file. */
static enum bp_status experts_in_file(struct model *m, const bp_gguf *g, const char *path)
{
    uint64_t end = 0;
    for (int64_t i = 0; i < bp_gguf_get_n_tensors(g); i++) {
        struct bp_gguf_tensor info;
        if (bp_gguf_get_tensor(g, i, &info) == BP_OK && info.offset + info.size > end)
            end = info.offset + info.size;
    }
    m->xbuf = bp_buffer_from_file(path, 0, (size_t)end);
    if (m->xbuf == NULL)
        return bp_last_status();
    bp_buffer_set_usage(m->xbuf, BP_BUFFER_USAGE_WEIGHTS);
    char *base = bp_buffer_get_base(m->xbuf);
    enum bp_status st = BP_OK;
    for (size_t j = 0; st == BP_OK && j < bp_context_get_n_tensors(m->xctx); j++) {
        bp_tensor *t = bp_context_get_tensor(m->xctx, j);
        struct bp_gguf_tensor info;
        const int64_t i = bp_gguf_find_tensor(g, t->name);
        st = i >= 0 ? bp_gguf_get_tensor(g, i, &info)
                    : bp_set_error(BP_ERR_INVALID_ARG, "the file has no tensor %s", t->name);
        if (st == BP_OK && info.size != bp_nbytes(t))
            st = bp_set_error(BP_ERR_SHAPE, "tensor %s holds %zu bytes; it needs %zu", t->name,
                              info.size, bp_nbytes(t));
        if (st == BP_OK) {
            bp_set_param(t);
            st = bp_buffer_place_tensor(m->xbuf, t, base + info.offset);
        }
    }
    return st;
}

enum bp_status model_init_gguf(struct model *m, const bp_gguf *g, const struct model_config *cfg,
                               const struct model_placement *where)
{
    enum bp_status st = model_prepare(m, cfg);
    if (st != BP_OK)
        return st;
    bool tied = false;
    st = describe_from_file(m, g, &tied) ? BP_OK : bp_last_status();
    if (st == BP_OK)
        st = all_tensors_used(m, g);
    const bool file_experts = where->experts_file != NULL && m->xctx != NULL;
    if (st == BP_OK && in_place(m, g, where, tied, &st)) {
        if (st == BP_OK && file_experts) /* the experts stay in the file, the rest mapped */
            st = experts_in_file(m, g, where->experts_file);
        if (st != BP_OK)
            model_free(m);
        return st;
    }
    if (st == BP_OK && file_experts)
        st = experts_in_file(m, g, where->experts_file);
    const bool embd_mapped = st == BP_OK && embedding_in_place(m, g, where, &st);
    if (st == BP_OK)
        st = model_allocate(m, where);
    if (st == BP_OK && !embd_mapped)
        st = load_tensor(g, m->tok_embd, "token_embd.weight");
    if (st == BP_OK)
        st = load_tensor(g, m->output, tied ? "token_embd.weight" : "output.weight");
    for (size_t i = 0; st == BP_OK && i < bp_context_get_n_tensors(m->wctx); i++) {
        bp_tensor *t = bp_context_get_tensor(m->wctx, i);
        if (t != m->output)
            st = load_tensor(g, t, t->name);
    }
    for (size_t i = 0; st == BP_OK && m->xctx && !file_experts &&
                       i < bp_context_get_n_tensors(m->xctx);
         i++) {
        bp_tensor *t = bp_context_get_tensor(m->xctx, i);
        st = load_tensor(g, t, t->name);
    }
    if (st != BP_OK)
        model_free(m);
    return st;
}

/* ---- Writing -------------------------------------------------------------------------------------- */

/* Reorders the rows of t (n_head heads of head_dim rows each; a vector counts as rows of one
 * element) between NeoX's order and llama's within the first rot rows of each head (the rotated
 * ones; the rest keep their place): to_llama moves row s*rot/2 + j of a head to row 2j + s, the
 * other direction moves it back. */
static enum bp_status reorder_heads(bp_tensor *t, int n_head, int head_dim, int rot,
                                    bool to_llama)
{
    const bool vector = t->ne[1] == 1;
    const size_t row = vector ? bp_type_size(t->type) : t->nb[1];
    const size_t bytes = bp_nbytes(t);
    char *from = malloc(bytes), *to = malloc(bytes);
    enum bp_status st = from != NULL && to != NULL
                            ? bp_tensor_get(t, from, 0, bytes)
                            : bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory reordering %s",
                                           t->name);
    const int half = rot / 2;
    if (st == BP_OK)
        memcpy(to, from, bytes); /* the rows beyond the rotated ones stay */
    for (int h = 0; st == BP_OK && h < n_head; h++) {
        for (int j = 0; j < half; j++) {
            for (int s = 0; s < 2; s++) {
                const size_t neox = (size_t)h * head_dim + (size_t)s * half + j;
                const size_t llama = (size_t)h * head_dim + 2 * (size_t)j + s;
                const size_t dst = to_llama ? llama : neox, src = to_llama ? neox : llama;
                memcpy(to + dst * row, from + src * row, row);
            }
        }
    }
    if (st == BP_OK)
        st = bp_tensor_set(t, to, 0, bytes);
    free(from);
    free(to);
    return st;
}

/* The q and k weights (and biases) of layer il, reordered for llama's rope or back; on failure
 * the layer is left as it was. */
static enum bp_status reorder_layer(const struct model *m, int il, bool to_llama)
{
    const struct model_config *c = &m->cfg;
    const int D = c->n_embd / c->n_head, rot = c->rope_dims > 0 ? c->rope_dims : D;
    const struct model_layer *l = &m->layers[il];
    bp_tensor *const t[4] = {l->wq, l->wk, l->bq, l->bk};
    const int heads[4] = {c->n_head, c->n_head_kv, c->n_head, c->n_head_kv};
    enum bp_status st = BP_OK;
    int done = 0;
    for (; done < 4 && st == BP_OK; done++)
        if (t[done] != NULL)
            st = reorder_heads(t[done], heads[done], D, rot, to_llama);
    if (st != BP_OK) /* the one that failed is unchanged; put the others back */
        for (int i = done - 2; i >= 0; i--)
            if (t[i] != NULL)
                (void)reorder_heads(t[i], heads[i], D, rot, !to_llama);
    return st;
}

/* Every layer reordered; on failure the layers done are put back. */
static enum bp_status reorder_qk(const struct model *m, bool to_llama)
{
    for (int il = 0; il < m->cfg.n_layer; il++) {
        const enum bp_status st = reorder_layer(m, il, to_llama);
        if (st != BP_OK) {
            const enum bp_status err = bp_last_status();
            char why[512];
            snprintf(why, sizeof(why), "%s", bp_last_error());
            while (il-- > 0)
                (void)reorder_layer(m, il, !to_llama);
            return bp_set_error(err, "%s", why);
        }
    }
    return BP_OK;
}

/* The metadata llama.cpp needs to load the file, its vocabulary a placeholder of n_vocab tokens
 * (<unk>, <s>, </s>, then <t3>, <t4>, ...): ids are what `backplane run --tokens` takes. */
static enum bp_status add_metadata(bp_gguf_writer *w, const struct model *m)
{
    const struct model_config *c = &m->cfg;
    char name[96];
    snprintf(name, sizeof(name), "backplane %s", c->name);
    enum bp_status st = BP_OK;
#define SET(call)                                                                                \
    do {                                                                                         \
        if (st == BP_OK)                                                                         \
            st = (call);                                                                         \
    } while (0)
    SET(bp_gguf_writer_set_str(w, "general.architecture", "llama"));
    SET(bp_gguf_writer_set_u32(w, "general.alignment", 64)); /* used in place on a CPU */
    SET(bp_gguf_writer_set_str(w, "general.name", name));
    SET(bp_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->n_ctx));
    SET(bp_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->n_embd));
    SET(bp_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layer));
    SET(bp_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->n_ff));
    SET(bp_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_head));
    SET(bp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv));
    if (c->n_expert > 0) {
        SET(bp_gguf_writer_set_u32(w, "llama.expert_count", (uint32_t)c->n_expert));
        SET(bp_gguf_writer_set_u32(w, "llama.expert_used_count", (uint32_t)c->n_expert_used));
    }
    SET(bp_gguf_writer_set_u32(w, "llama.rope.dimension_count",
                               (uint32_t)(c->rope_dims > 0 ? c->rope_dims : c->n_embd / c->n_head)));
    SET(bp_gguf_writer_set_f32(w, "llama.rope.freq_base", c->rope_base));
    if (c->yarn_ext_factor > 0.0f) {
        SET(bp_gguf_writer_set_str(w, "llama.rope.scaling.type", "yarn"));
        SET(bp_gguf_writer_set_f32(w, "llama.rope.scaling.factor", 1.0f / c->rope_scale));
        SET(bp_gguf_writer_set_u32(w, "llama.rope.scaling.original_context_length",
                                   (uint32_t)c->yarn_n_ctx_orig));
        SET(bp_gguf_writer_set_f32(w, "llama.rope.scaling.yarn_attn_factor", c->yarn_attn_factor));
        SET(bp_gguf_writer_set_f32(w, "llama.rope.scaling.yarn_ext_factor", c->yarn_ext_factor));
        SET(bp_gguf_writer_set_f32(w, "llama.rope.scaling.yarn_beta_fast", c->yarn_beta_fast));
        SET(bp_gguf_writer_set_f32(w, "llama.rope.scaling.yarn_beta_slow", c->yarn_beta_slow));
    } else if (c->rope_scale != 1.0f) {
        SET(bp_gguf_writer_set_str(w, "llama.rope.scaling.type", "linear"));
        SET(bp_gguf_writer_set_f32(w, "llama.rope.scaling.factor", 1.0f / c->rope_scale));
    }
    SET(bp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps));
    SET(bp_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)c->n_vocab));
    SET(bp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    SET(bp_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    SET(bp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
    SET(bp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
    if (st != BP_OK)
        return st;
#undef SET
    const size_t n = (size_t)c->n_vocab;
    char **tokens = calloc(n, sizeof(*tokens));
    float *scores = calloc(n, sizeof(*scores));
    int32_t *types = calloc(n, sizeof(*types));
    char *text = malloc(n * 16);
    if (tokens == NULL || scores == NULL || types == NULL || text == NULL) {
        st = bp_set_error(BP_ERR_OUT_OF_MEMORY, "out of memory writing the vocabulary");
    } else {
        for (size_t i = 0; i < n; i++) {
            static const char *const special[3] = {"<unk>", "<s>", "</s>"};
            tokens[i] = text + i * 16;
            if (i < 3)
                snprintf(tokens[i], 16, "%s", special[i]);
            else
                snprintf(tokens[i], 16, "<t%u>", (unsigned)i); /* n_vocab is an int */
            types[i] = i == 0 ? 2 : i < 3 ? 3 : 1; /* unknown, control, normal */
            scores[i] = -(float)i;
        }
        st = bp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                        n);
        if (st == BP_OK)
            st = bp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, n);
        if (st == BP_OK)
            st = bp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, n);
    }
    free(tokens);
    free(scores);
    free(types);
    free(text);
    return st;
}

static enum bp_status add_tensors(bp_gguf_writer *w, const struct model *m)
{
    char name[96];
    enum bp_status st = bp_gguf_writer_add_tensor(w, "token_embd.weight", m->tok_embd);
    if (st == BP_OK)
        st = bp_gguf_writer_add_tensor(w, "output_norm.weight", m->out_norm);
    if (st == BP_OK)
        st = bp_gguf_writer_add_tensor(w, "output.weight", m->output);
    for (int il = 0; il < m->cfg.n_layer && st == BP_OK; il++) {
        const struct model_layer *l = &m->layers[il];
        const struct {
            const char *what;
            bp_tensor *t;
        } parts[] = {
            {"attn_norm.weight", l->attn_norm}, {"attn_q.weight", l->wq},
            {"attn_k.weight", l->wk},           {"attn_v.weight", l->wv},
            {"attn_q.bias", l->bq},             {"attn_k.bias", l->bk},
            {"attn_v.bias", l->bv},             {"attn_output.weight", l->wo},
            {"ffn_norm.weight", l->ffn_norm},   {"ffn_gate.weight", l->w_gate},
            {"ffn_up.weight", l->w_up},         {"ffn_down.weight", l->w_down},
            {"ffn_gate_inp.weight", l->ffn_gate_inp},   {"ffn_gate_exps.weight", l->ffn_gate_exps},
            {"ffn_up_exps.weight", l->ffn_up_exps},     {"ffn_down_exps.weight", l->ffn_down_exps},
        };
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]) && st == BP_OK; i++) {
            if (parts[i].t == NULL)
                continue;
            snprintf(name, sizeof(name), "blk.%d.%s", il, parts[i].what);
            st = bp_gguf_writer_add_tensor(w, name, parts[i].t);
        }
    }
    return st;
}

enum bp_status model_save_gguf(const struct model *m, const char *path)
{
    if (m->weights_in_place && m->cfg.rope_mode == BP_ROPE_NEOX)
        return bp_set_error(BP_ERR_UNSUPPORTED, "model '%s': its weights are the read-only "
                            "mapping of its file, which saving would reorder in place",
                            m->cfg.name);
    bp_gguf_writer *w = bp_gguf_writer_new();
    if (w == NULL)
        return bp_last_status();
    const bool reorder = m->cfg.rope_mode == BP_ROPE_NEOX;
    enum bp_status st = add_metadata(w, m);
    if (st == BP_OK)
        st = add_tensors(w, m);
    /* The writer reads the tensors when it writes: reordered in place for the file, then put
     * back so that the model stays usable. */
    if (st == BP_OK && reorder)
        st = reorder_qk(m, true);
    if (st == BP_OK) {
        st = bp_gguf_writer_write(w, path);
        if (reorder) {
            const enum bp_status back = reorder_qk(m, false);
            if (st == BP_OK)
                st = back;
        }
    }
    bp_gguf_writer_free(w);
    return st;
}
