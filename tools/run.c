/* run.c - `backplane run`: serves the decoder of model.c on any mix of plugins' devices through
 * the scheduler: a batched prompt, then greedy generation one token at a time.
 *
 * The devices come from -d (devices.c; "Meta(CPU0,CPU1)" stores the matrices split as
 * model_meta_split says). The weights go to the first device that multiplies by them; the token
 * embedding table and the KV cache stay with them when that device also runs GET_ROWS of the
 * weights and SET_ROWS into the cache, else they go to the first device that does (a
 * destination is never copied to where its op runs). The scheduler runs each op on the first
 * device that can and on the CPU (always last) otherwise. --check runs the same model on the
 * CPU alone and compares logits and tokens.
 *
 * One run (run_once) goes through phases, each a function that prints why it fails: open the
 * devices, place the weights, the embedding table and the KV cache, load the model, build the
 * scheduler, run the prompt, generate. The command line is read in run-options.c and the report
 * printed by run-report.c (run.h). */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <backplane/bp-cpu.h>
#include <backplane/bp-meta.h>

#include "../common/bench-util.h" /* bench_now, bench_median */

#include "run.h"
#include "tool.h"


static void result_free(struct run_result *r)
{
    for (int i = 0; i < MAX_BACKENDS; i++) {
        free(r->names[i]);
        free(r->descriptions[i]);
        free(r->plugins[i]);
    }
    free(r->tokens);
    free(r->logits);
}

static char *dup_text(const char *s)
{
    return strdup(s != NULL ? s : "?");
}

/* The ops the model's long-lived tensors take part in, as each device is asked about them:
 * a tensor lives where the op that needs it in place runs. */
enum model_op {
    OP_MUL_MAT,  /* by the weights (type t) */
    OP_GET_ROWS, /* of the token embedding table (type t) */
    OP_SET_ROWS, /* into the KV cache (type t, its destination) */
    OP_MUL_MAT_ID, /* by stacked expert weights (type t) */
};

static bool runs_op(bp_backend *be, enum model_op op, enum bp_type t, int64_t n_embd)
{
    bp_context *ctx = bp_context_new(8);
    if (ctx == NULL)
        return false;
    bp_tensor *w = bp_new_tensor_2d(ctx, t, n_embd, 8);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, n_embd, 1);
    bp_tensor *ids = bp_new_tensor_1d(ctx, BP_TYPE_I32, 1);
    bp_tensor *r = NULL;
    if (w && x && ids)
        r = op == OP_MUL_MAT    ? bp_mul_mat(ctx, w, x)
            : op == OP_GET_ROWS ? bp_get_rows(ctx, w, ids)
            : op == OP_SET_ROWS ? bp_set_rows(ctx, w, x, ids)
                                : bp_mul_mat_id(ctx, bp_reshape_3d(ctx, w, n_embd, 4, 2),
                                                bp_reshape_3d(ctx, x, n_embd, 1, 1),
                                                bp_reshape_2d(ctx, ids, 1, 1));
    bool ok = r != NULL && bp_backend_supports_op(be, r);
    bp_context_free(ctx);
    return ok;
}

/* The first backend from `from` on, preferring `prefer`, that runs op on type t; -1: none. */
static int first_running(bp_backend **be, int nb, int prefer, enum model_op op, enum bp_type t,
                         int64_t n_embd)
{
    if (prefer >= 0 && runs_op(be[prefer], op, t, n_embd))
        return prefer;
    for (int i = 0; i < nb; i++)
        if (runs_op(be[i], op, t, n_embd))
            return i;
    return -1;
}

/* The types a model's weights may have (the activation-only Q8_1 and Q8_K, and I32, are not). */
static const enum bp_type weight_types[] = {
    BP_TYPE_F32,  BP_TYPE_F16,  BP_TYPE_BF16, BP_TYPE_Q8_0, BP_TYPE_Q4_0,   BP_TYPE_Q4_1,
    BP_TYPE_Q5_0, BP_TYPE_Q5_1, BP_TYPE_Q2_K, BP_TYPE_Q3_K, BP_TYPE_Q4_K,   BP_TYPE_Q5_K,
    BP_TYPE_Q6_K, BP_TYPE_IQ4_NL, BP_TYPE_IQ4_XS};

bool run_is_weight_type(enum bp_type t)
{
    for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++)
        if (weight_types[i] == t)
            return true;
    return false;
}

/* The type of the weight matrices with rows of ne0: a file's weight type, or the seeded model's
 * --wtype with its fallback for rows its blocks do not divide. */
static enum bp_type row_type(const struct run_opts *o, int64_t ne0)
{
    return o->gguf != NULL ? o->wtype : model_row_type(o->wtype, ne0);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* A progress line on stderr (a terminal) once the run has taken more than a second. */
static void progress(bool show, double started, const char *what, int done, int total)
{
    if (!show || bench_now() - started < 1.0)
        return;
    fprintf(stderr, "\r%s %d/%d", what, done, total);
    if (done == total)
        fprintf(stderr, "\r%*s\r", 40, "");
    fflush(stderr);
}

/* One step through the scheduler; the logits of its last token go to out. st is the previous
 * step (empty at first): when its graph is also this step's (model_step_reuse), it is computed
 * again as it is, without building, splitting or allocating (*reused true); otherwise st is
 * rebuilt. On failure st is emptied. */
static enum bp_status step(bp_sched *s, const struct model *m, int n_tok, int pos0,
                           const int32_t *tokens, float *out, struct model_step *st, bool *reused)
{
    enum bp_status rc = BP_OK;
    *reused = model_step_reuse(st, m, n_tok, pos0);
    if (!*reused) {
        model_step_free(st);
        rc = model_step_build(m, n_tok, pos0, st);
        if (rc != BP_OK)
            return rc;
        bp_sched_reset(s);
        for (int il = 0; st->pred != NULL && il < m->cfg.n_layer && rc == BP_OK; il++) {
            const struct model_layer *l = &m->layers[il];
            if (st->pred[il] == NULL)
                continue;
            rc = bp_sched_predict_experts(s, l->ffn_gate_exps, st->pred[il]);
            if (rc == BP_OK)
                rc = bp_sched_predict_experts(s, l->ffn_up_exps, st->pred[il]);
            if (rc == BP_OK)
                rc = bp_sched_predict_experts(s, l->ffn_down_exps, st->pred[il]);
        }
        if (rc == BP_OK)
            rc = bp_sched_alloc_graph(s, st->graph);
    }
    if (rc == BP_OK)
        rc = model_step_inputs(st, tokens);
    if (rc == BP_OK)
        rc = bp_sched_graph_compute(s, st->graph);
    if (rc == BP_OK)
        rc = bp_tensor_get(st->logits, out, 0, (size_t)m->cfg.n_vocab * sizeof(float));
    if (rc != BP_OK)
        model_step_free(st);
    return rc;
}

/* The file of the loaded plugin whose registry reg is; "?" for an in-process registry. */
static const char *plugin_of(bp_registry *reg)
{
    for (size_t i = 0; i < bp_plugin_count(); i++) {
        bp_plugin *p = bp_plugin_get(i);
        if (bp_plugin_get_registry(p) == reg)
            return bp_plugin_get_path(p);
    }
    return "?";
}


/* ---- One run, phase by phase ----------------------------------------------------------------- */

/* What the phases of one run share. Each phase returns false after printing why it failed;
 * close_run frees whatever the phases that ran have made. */
struct run {
    const struct run_opts *o;
    const struct model_config *cfg;
    struct run_result *r;
    bool quiet; /* the --check run on the CPU alone: no --dot */
    bool show;  /* progress on stderr, a terminal */
    double started;
    bp_backend *be[MAX_BACKENDS];
    int nb;
    bp_buffer_type *wbuft; /* the weights' buffer type */
    struct model m;
    bp_sched *s;
    int32_t *prompt; /* n_prompt token ids */
    double *times;   /* seconds of each generation step after the first token */
    struct model_step st; /* the last step's graph, reused by the next where it can be */
};

/* Opens the backends of the device list (NULL: the default ones). 0, or the exit status after
 * printing why: 2 for a list that is wrong in itself, else 1. */
static int open_devices(struct run *run, const char *devices)
{
    const struct tool_meta_split split = {model_meta_split, (void *)run->cfg};
    run->nb = tool_open_backends(devices, run->o->threads, run->be, MAX_BACKENDS, true, &split);
    if (run->nb < 0) {
        const int status = run->nb == TOOL_BAD_LIST ? 2 : 1;
        run->nb = 0;
        return status;
    }
    return 0;
}

/* Names, descriptions and plugin files of the open backends, for the report. */
static void record_devices(struct run *run)
{
    struct run_result *r = run->r;
    r->n_backends = run->nb;
    for (int i = 0; i < run->nb; i++) {
        bp_device *d = bp_backend_get_device(run->be[i]);
        r->names[i] = dup_text(bp_backend_get_name(run->be[i]));
        r->descriptions[i] = dup_text(bp_device_get_description(d));
        r->plugins[i] = dup_text(plugin_of(bp_device_get_registry(d)));
    }
}

/* The weights go to the first device that multiplies at all (a device without MUL_MAT, like
 * the example plugin, only takes the other ops); it must run this weight type. */
static bool place_weights(struct run *run)
{
    const int64_t n_embd = run->cfg->n_embd;
    int w = 0;
    char can[128] = "";
    for (; w < run->nb; w++) {
        can[0] = '\0';
        for (size_t t = 0; t < sizeof(weight_types) / sizeof(weight_types[0]); t++)
            if (runs_op(run->be[w], OP_MUL_MAT, model_row_type(weight_types[t], n_embd), n_embd))
                snprintf(can + strlen(can), sizeof(can) - strlen(can), "%s%s", can[0] ? ", " : "",
                         bp_type_name(weight_types[t]));
        if (can[0] != '\0')
            break;
    }
    const int64_t n_ff = run->cfg->n_ff;
    if (w == run->nb || !runs_op(run->be[w], OP_MUL_MAT, row_type(run->o, n_embd), n_embd) ||
        (n_ff > 0 && !runs_op(run->be[w], OP_MUL_MAT, row_type(run->o, n_ff), n_ff))) {
        fprintf(stderr, "backplane run: %s cannot run %s weights; it can run: %s\n",
                run_shown(run->r->names[w < run->nb ? w : 0]), bp_type_name(run->o->wtype),
                can[0] ? can : "none of them");
        return false;
    }
    run->r->weights_on = w;
    return true;
}

/* The type of the token embedding table: a file's own, else the weight type. */
static enum bp_type embedding_type(const struct run_opts *o)
{
    struct bp_gguf_tensor info;
    const int64_t i = o->gguf != NULL ? bp_gguf_find_tensor(o->gguf, "token_embd.weight") : -1;
    return i >= 0 && bp_gguf_get_tensor(o->gguf, i, &info) == BP_OK ? info.type
                                                                    : row_type(o, o->cfg->n_embd);
}

/* The stacked experts: with the weights, or on --experts-on's device (not in the --check run
 * on the CPU alone, which keeps them with the weights). */
static bool place_experts(struct run *run)
{
    struct run_result *r = run->r;
    r->experts_on = r->weights_on;
    if (run->o->experts_on == NULL)
        return true;
    if (strcasecmp(run->o->experts_on, "file") == 0) { /* left in the --gguf file (the --check */
        r->experts_on = -1;                             /* run too: the same layout) */
        return true;
    }
    if (run->quiet)
        return true;
    for (int i = 0; i < run->nb; i++)
        if (r->names[i] != NULL && strcasecmp(r->names[i], run->o->experts_on) == 0) {
            r->experts_on = i;
            return true;
        }
    fprintf(stderr, "backplane run: --experts-on names '%s', which is not one of the devices "
            "of this run:", tool_text(run->o->experts_on));
    for (int i = 0; i < run->nb; i++)
        fprintf(stderr, "%s %s", i ? "," : "", run_shown(r->names[i]));
    fprintf(stderr, "\n");
    return false;
}

/* The products of a model's experts (MUL_MAT_ID) run where the stacked experts live or, copied
 * over, on the weights' device: one of the two must run them. */
static bool experts_runnable(struct run *run)
{
    const struct run_result *r = run->r;
    const int w = r->weights_on, e = r->experts_on;
    const enum bp_type t = row_type(run->o, run->cfg->n_embd);
    if (run->cfg->n_expert == 0 || runs_op(run->be[w], OP_MUL_MAT_ID, t, run->cfg->n_embd) ||
        (e >= 0 && e != w && runs_op(run->be[e], OP_MUL_MAT_ID, t, run->cfg->n_embd)))
        return true;
    if (e >= 0 && e != w)
        fprintf(stderr, "backplane run: neither %s (the weights) nor %s (--experts-on) can run "
                "MUL_MAT_ID of %s weights, which the model's experts need\n", run_shown(r->names[w]),
                run_shown(r->names[e]), bp_type_name(t));
    else
        fprintf(stderr, "backplane run: %s cannot run MUL_MAT_ID of %s weights, which the "
                "model's experts need; --experts-on can put them on a device that does\n",
                run_shown(r->names[w]), bp_type_name(t));
    return false;
}

/* The embedding table and the KV cache stay with the weights when that device also runs their
 * ops (GET_ROWS of the weight type, SET_ROWS into the f16 cache), else they go to the first
 * device that does: a node's destination cannot be copied to where it runs. */
static bool place_embedding_and_kv(struct run *run)
{
    struct run_result *r = run->r;
    const int w = r->weights_on;
    r->embd_on = first_running(run->be, run->nb, w, OP_GET_ROWS, embedding_type(run->o),
                               run->cfg->n_embd);
    r->kv_on = first_running(run->be, run->nb, w, OP_SET_ROWS, run->cfg->kv_type, run->cfg->n_embd);
    if (r->embd_on < 0 || r->kv_on < 0) {
        fprintf(stderr, "backplane run: none of the devices runs %s\n",
                r->embd_on < 0 ? "GET_ROWS of the weight type (the token embedding)"
                               : "SET_ROWS into the KV cache's type");
        return false;
    }
    return true;
}

/* Bytes of the model's weights. */
static size_t weight_bytes(const struct run_opts *o)
{
    return o->gguf != NULL ? model_gguf_weight_bytes(o->gguf) : model_weight_bytes(o->cfg, o->wtype);
}

/* Bytes of the model's stacked experts: a file's "*_exps.weight" tensors, or the seeded ones. */
static size_t expert_bytes(const struct run_opts *o)
{
    if (o->gguf == NULL)
        return model_expert_bytes(o->cfg, o->wtype);
    size_t sum = 0;
    for (int64_t i = 0; i < bp_gguf_get_n_tensors(o->gguf); i++) {
        struct bp_gguf_tensor info;
        if (bp_gguf_get_tensor(o->gguf, i, &info) == BP_OK && strstr(info.name, "_exps.") != NULL)
            sum += info.size;
    }
    return sum;
}

/* Whether be runs the model's fused attention: F32 queries over the cache. */
static bool runs_flash_attn(bp_backend *be, const struct model_config *c)
{
    bp_context *ctx = bp_context_new(8);
    if (ctx == NULL)
        return false;
    const int64_t D = c->n_embd / c->n_head;
    bp_tensor *q = bp_new_tensor_3d(ctx, BP_TYPE_F32, D, 2, c->n_head);
    bp_tensor *k = bp_new_tensor_3d(ctx, c->kv_type, D, 4, c->n_head_kv);
    bp_tensor *v = bp_new_tensor_3d(ctx, c->kv_type, D, 4, c->n_head_kv);
    bp_tensor *a = q && k && v ? bp_flash_attn_ext(ctx, q, k, v, NULL, 1.0f, 0.0f, BP_ATTN_CAUSAL)
                               : NULL;
    const bool ok = a != NULL && bp_backend_supports_op(be, a);
    bp_context_free(ctx);
    return ok;
}

/* --flash-attn: on, off, or (auto) on where the device holding the KV cache runs it, so that
 * attention stays with its cache. */
static bool choose_attention(struct run *run)
{
    struct run_result *r = run->r;
    const bool can = runs_flash_attn(run->be[r->kv_on], run->cfg);
    if ((run->o->flash_attn == 1 || run->cfg->kv_type != BP_TYPE_F16) && !can) {
        fprintf(stderr, "backplane run: %s: %s, which holds the KV cache, does not run "
                "FLASH_ATTN_EXT for this model\n",
                run->o->flash_attn == 1 ? "--flash-attn on" : "a quantised KV cache",
                run_shown(r->names[r->kv_on]));
        return false;
    }
    r->flash_attn = can && run->o->flash_attn != 0;
    return true;
}

/* The weights (and the KV cache when it goes there too) fit the weights' device, where the
 * device reports its memory. */
static bool check_memory(struct run *run)
{
    const struct model_config *cfg = run->cfg;
    const struct run_result *r = run->r;
    const int w = r->weights_on;
    size_t mem_free = 0, mem_total = 0;
    bp_device_get_memory(bp_backend_get_device(run->be[w]), &mem_free, &mem_total);
    size_t need = weight_bytes(run->o) + (r->kv_on == w ? model_kv_bytes(cfg) : 0);
    if (r->experts_on != w) /* the stacked experts live elsewhere (or stay in the file) */
        need -= expert_bytes(run->o);
    if (mem_total > 0 && need > mem_free) {
        char sz[3][40];
        tool_format_sizes(need, mem_free, mem_total, sz);
        fprintf(stderr, "backplane run: model '%s' with %s weights needs %s for weights "
                "and KV cache; %s has %s free of %s\n", cfg->name, bp_type_name(run->o->wtype),
                sz[0], run_shown(r->names[w]), sz[1], sz[2]);
        return false;
    }
    return true;
}

/* The weights' device's default buffer type, or the CPU's CPU_REPACK where the loaded CPU
 * variant stores the weights' type row-interleaved and multiplies it faster so (unless
 * --no-repack): the device's proc addresses "bp_cpu_repack_type" and
 * "bp_cpu_repack_buffer_type" say (bp-cpu.h). */
static bp_buffer_type *weight_buffer_type(const struct run *run)
{
    bp_backend *be = run->be[run->r->weights_on];
    bp_device *dev = bp_backend_get_device(be);
    bp_registry *reg = bp_device_get_registry(dev);
    bp_cpu_repack_type_fn stores =
        (bp_cpu_repack_type_fn)bp_registry_get_proc_address(reg, "bp_cpu_repack_type");
    bp_cpu_repack_buffer_type_fn get = (bp_cpu_repack_buffer_type_fn)bp_registry_get_proc_address(
        reg, "bp_cpu_repack_buffer_type");
    if (!run->o->no_repack && stores != NULL && get != NULL && stores(dev, run->o->wtype)) {
        bp_buffer_type *rbt = get(dev);
        if (rbt != NULL)
            return rbt;
    }
    return bp_backend_get_default_buffer_type(be);
}

/* Sizes of the model's buffers for the report; on a meta device, also what each part holds. */
static void record_model_buffers(struct run *run)
{
    struct run_result *r = run->r;
    r->weight_bytes = bp_buffer_get_size(run->m.wbuf) +
                      (run->m.ebuf != NULL ? bp_buffer_get_size(run->m.ebuf) : 0);
    bp_registry *reg = bp_device_get_registry(bp_backend_get_device(run->be[r->weights_on]));
    bp_meta_buffer_part_bytes_fn part_bytes = (bp_meta_buffer_part_bytes_fn)
        bp_registry_get_proc_address(reg, "bp_meta_buffer_part_bytes");
    for (int p = 0; part_bytes != NULL && p < MAX_BACKENDS; p++) {
        r->weight_part_bytes[p] = part_bytes(run->m.wbuf, p);
        if (r->weight_part_bytes[p] > 0)
            r->n_weight_parts = p + 1;
        if (run->m.xbuf != NULL && r->experts_on == r->weights_on)
            r->expert_part_bytes[p] = part_bytes(run->m.xbuf, p);
    }
    r->kv_bytes = bp_buffer_get_size(run->m.kvbuf);
    if (run->m.xbuf != NULL) {
        r->expert_bytes = 0; /* the tensors' (a File buffer spans its whole file) */
        for (size_t i = 0; i < bp_context_get_n_tensors(run->m.xctx); i++)
            r->expert_bytes += bp_nbytes(bp_context_get_tensor(run->m.xctx, i));
        snprintf(r->expert_buft, sizeof(r->expert_buft), "%s%s",
                 bp_buffer_type_get_name(bp_buffer_get_type(run->m.xbuf)),
                 run->m.weights_in_place && r->experts_on >= 0 ? ", in place in the mapped file"
                                                               : "");
    }
    snprintf(r->weight_buft, sizeof(r->weight_buft), "%s%s", bp_buffer_type_get_name(run->wbuft),
             run->m.weights_in_place ? ", in place in the mapped file" : "");
}

/* Allocates and fills the model where the placement phases put its parts. */
static bool load_model(struct run *run)
{
    const struct model_config *cfg = run->cfg;
    const struct run_opts *o = run->o;
    const struct run_result *r = run->r;
    const int w = r->weights_on;
    run->wbuft = weight_buffer_type(run);
    if (run->show && weight_bytes(o) > (64u << 20)) /* takes a while */
        fprintf(stderr, "loading %s (%s weights) on %s...", tool_text(cfg->name), bp_type_name(o->wtype),
                run_shown(r->names[w]));
    /* The embedding table goes with the weights, except on a CPU, whose CPU_REPACK type would
     * keep a GET_ROWS table plain anyway: its default type there, a host one, which lets a
     * file's table be used from the mapping (model-gguf.c). */
    const bool embd_cpu = bp_device_get_type(bp_backend_get_device(run->be[r->embd_on])) ==
                          BP_DEVICE_TYPE_CPU;
    const struct model_placement where = {
        .weights = run->wbuft,
        .embedding = r->embd_on == w && !embd_cpu
                         ? run->wbuft
                         : bp_backend_get_default_buffer_type(run->be[r->embd_on]),
        .kv = bp_backend_get_default_buffer_type(run->be[r->kv_on]),
        .experts = r->experts_on == w ? run->wbuft
                   : r->experts_on < 0
                       ? NULL
                       : bp_backend_get_default_buffer_type(run->be[r->experts_on]),
        .experts_file = r->experts_on < 0 ? o->gguf_path : NULL,
    };
    const enum bp_status st = o->gguf != NULL ? model_init_gguf(&run->m, o->gguf, cfg, &where)
                                              : model_init(&run->m, cfg, o->wtype, &where, o->seed);
    if (st != BP_OK) {
        fprintf(stderr, "%sbackplane run: cannot load model '%s' on %s: %s\n",
                run->show ? "\n" : "", tool_text(cfg->name), run_shown(r->names[w]), tool_text(bp_last_error()));
        return false;
    }
    if (run->show)
        fprintf(stderr, "\r%*s\r", 60, "");
    run->m.flash_attn = r->flash_attn;
    run->m.half_precision = o->half;
    /* As many experts predicted as the cache holds (at least those used): the copy thread
     * fills the slots this layer leaves free with the most likely ones. Only where experts
     * are copied at all: kept on another device than the weights, or left in the file. */
    if (o->expert_prefetch != 0 && o->expert_cache > 0 && !o->expert_copies_all &&
        run->cfg->n_expert > 0 && run->r->experts_on != run->r->weights_on)
        run->m.predict_experts = o->expert_cache > run->cfg->n_expert_used
                                     ? o->expert_cache
                                     : run->cfg->n_expert_used;
    run->r->prefetch = run->m.predict_experts > 0;
    record_model_buffers(run);
    return true;
}

/* The scheduler over the open backends, and the arrays the prompt and generation fill. */
static bool new_scheduler(struct run *run)
{
    const struct run_opts *o = run->o;
    struct run_result *r = run->r;
    run->s = bp_sched_new(run->be, NULL, run->nb, 128 + 64 * (size_t)run->cfg->n_layer, false);
    if (run->s != NULL) {
        bp_sched_set_used_experts(run->s, !o->expert_copies_all);
        if (bp_sched_set_expert_cache(run->s, o->expert_cache) != BP_OK) {
            fprintf(stderr, "backplane run: %s\n", tool_text(bp_last_error()));
            return false;
        }
    }
    run->prompt = malloc((size_t)o->n_prompt * sizeof(int32_t));
    r->tokens = malloc((size_t)o->n_gen * sizeof(int32_t));
    r->logits = malloc((size_t)o->n_gen * (size_t)run->cfg->n_vocab * sizeof(float));
    run->times = malloc((size_t)o->n_gen * sizeof(double));
    if (run->s == NULL || run->prompt == NULL || r->tokens == NULL || r->logits == NULL ||
        run->times == NULL) {
        fprintf(stderr, "backplane run: %s\n",
                run->s == NULL ? tool_text(bp_last_error()) : "out of memory");
        return false;
    }
    return true;
}

/* The prompt: the --tokens ids, else n_prompt token ids from a xorshift generator started from
 * the seed, computed in one graph; its last logits choose the first token. */
static bool run_prompt(struct run *run)
{
    const struct run_opts *o = run->o;
    const int n_vocab = run->cfg->n_vocab;
    struct run_result *r = run->r;
    uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 12345;
    for (int i = 0; i < o->n_prompt; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        run->prompt[i] = o->tokens != NULL ? o->tokens[i] : (int32_t)(x % (uint64_t)n_vocab);
    }
    const double t0 = bench_now();
    bool reused;
    if (step(run->s, &run->m, o->n_prompt, 0, run->prompt, r->logits, &run->st, &reused) !=
        BP_OK) {
        fprintf(stderr, "backplane run: prompt: %s\n", tool_text(bp_last_error()));
        return false;
    }
    r->prompt_seconds = bench_now() - t0;
    r->prompt_splits = bp_sched_get_n_splits(run->s);
    r->tokens[0] = argmax(r->logits, n_vocab);
    return true;
}

/* After the last generation step, whose graph is keep: how the scheduler split it, for the
 * report, and the graph to the --dot file. Frees keep. */
static bool record_last_step(struct run *run, struct model_step *keep)
{
    struct run_result *r = run->r;
    r->gen_splits = bp_sched_get_n_splits(run->s);
    for (int k = 0; k < r->gen_splits && r->n_gen_split_info < 16; k++) {
        int nodes = 0;
        bp_backend *sb = bp_sched_get_split_backend(run->s, k, &nodes, NULL);
        struct split_info *si = &r->gen_split[r->n_gen_split_info++];
        snprintf(si->backend, sizeof(si->backend), "%s", sb ? bp_backend_get_name(sb) : "?");
        si->nodes = nodes;
    }
    bool ok = true;
    if (run->o->dot_file != NULL && !run->quiet &&
        bp_sched_dump_dot(run->s, keep->graph, run->o->dot_file) != BP_OK) {
        fprintf(stderr, "backplane run: cannot write the graph to %s: %s\n", tool_text(run->o->dot),
                tool_text(bp_last_error()));
        ok = false;
    }
    model_step_free(keep);
    return ok;
}

/* Greedy generation, one token per graph, each step timed; the median step time for the
 * report. */
/* Bytes the run's meta backends have all-reduced so far. */
static double reduced_bytes(const struct run *run)
{
    double sum = 0;
    for (int b = 0; b < run->nb; b++) {
        bp_registry *reg = bp_device_get_registry(bp_backend_get_device(run->be[b]));
        void *proc = bp_registry_get_proc_address(reg, "bp_meta_backend_reduced_bytes");
        bp_meta_backend_reduced_bytes_fn fn;
        if (proc == NULL)
            continue;
        memcpy(&fn, &proc, sizeof(fn));
        sum += (double)fn(run->be[b]);
    }
    return sum;
}

static bool generate(struct run *run)
{
    const struct run_opts *o = run->o;
    const int n_vocab = run->cfg->n_vocab;
    struct run_result *r = run->r;
    const double reduced0 = reduced_bytes(run);
    for (int i = 1; i < o->n_gen; i++) {
        const bool last = i == o->n_gen - 1;
        float *logits = r->logits + (size_t)i * n_vocab;
        const double t0 = bench_now();
        bool reused;
        if (step(run->s, &run->m, 1, o->n_prompt + i - 1, &r->tokens[i - 1], logits, &run->st,
                 &reused) != BP_OK) {
            fprintf(stderr, "%sbackplane run: generating token %d: %s\n", run->show ? "\n" : "",
                    i + 1, tool_text(bp_last_error()));
            return false;
        }
        run->times[i - 1] = bench_now() - t0;
        r->gen_reused += reused;
        size_t eb = 0, ew = 0;
        r->gen_copied += (double)bp_sched_get_copied_bytes(run->s, &eb, &ew);
        r->gen_expert_copied += (double)eb;
        r->gen_expert_whole += (double)ew;
        struct bp_sched_expert_stats xs;
        if (bp_sched_get_expert_stats(run->s, &xs) == BP_OK) {
            r->gen_hits += (double)xs.hits;
            r->gen_misses += (double)xs.misses;
            r->gen_prefetched += (double)xs.prefetched;
            r->gen_prefetch_hits += (double)xs.prefetch_hits;
            r->gen_prefetch_bytes += (double)xs.bytes_prefetched;
            r->gen_copy_s += xs.copy_seconds;
            r->gen_wait_s += xs.wait_seconds;
            r->gen_prefetch_s += xs.prefetch_seconds;
        }
        r->tokens[i] = argmax(logits, n_vocab);
        progress(run->show, run->started, "generating", i + 1, o->n_gen);
        if (last && !record_last_step(run, &run->st))
            return false;
    }
    if (o->n_gen > 1)
        r->gen_median_seconds = bench_median(run->times, o->n_gen - 1);
    r->gen_reduced = reduced_bytes(run) - reduced0;
    return true;
}

/* What one pass adds up: zero before each, so that the report counts the last one. */
static void reset_pass(struct run_result *r)
{
    r->gen_copied = r->gen_expert_copied = r->gen_expert_whole = 0;
    r->gen_hits = r->gen_misses = r->gen_reduced = 0;
    r->gen_prefetched = r->gen_prefetch_hits = r->gen_prefetch_bytes = 0;
    r->gen_copy_s = r->gen_wait_s = r->gen_prefetch_s = 0;
    r->gen_reused = 0;
    r->n_gen_split_info = 0;
}

/* The prompt and the generation: once, cold; with --repeat N once to warm up (its prompt time
 * is the report's first-touch figure) and N times more, each from position 0 with the same
 * prompt. The times reported are the medians of the N passes, the counts those of the last; a
 * pass that generates other tokens than the first is an error (the model is deterministic). */
static bool run_passes(struct run *run)
{
    const struct run_opts *o = run->o;
    struct run_result *r = run->r;
    const int passes = o->repeat > 0 && !run->quiet ? o->repeat + 1 : 1;
    double *pt = malloc((size_t)passes * sizeof(double));
    double *gt = malloc((size_t)passes * sizeof(double));
    int32_t *first = malloc((size_t)o->n_gen * sizeof(int32_t));
    bool ok = pt != NULL && gt != NULL && first != NULL;
    if (!ok)
        fprintf(stderr, "backplane run: out of memory\n");
    for (int k = 0; ok && k < passes; k++) {
        reset_pass(r);
        ok = run_prompt(run) && generate(run);
        if (!ok)
            break;
        pt[k] = r->prompt_seconds;
        gt[k] = r->gen_median_seconds;
        if (k == 0) {
            r->first_prompt_seconds = r->prompt_seconds;
            memcpy(first, r->tokens, (size_t)o->n_gen * sizeof(int32_t));
        } else if (memcmp(first, r->tokens, (size_t)o->n_gen * sizeof(int32_t)) != 0) {
            fprintf(stderr, "backplane run: pass %d generated other tokens than the first\n",
                    k + 1);
            ok = false;
        }
    }
    if (ok && passes > 1) {
        r->prompt_seconds = bench_median(pt + 1, passes - 1);
        r->gen_median_seconds = bench_median(gt + 1, passes - 1);
    }
    free(pt);
    free(gt);
    free(first);
    return ok;
}

static void close_run(struct run *run)
{
    free(run->prompt);
    free(run->times);
    model_step_free(&run->st);
    bp_sched_free(run->s);
    if (run->m.wctx != NULL)
        model_free(&run->m);
    for (int i = 0; i < run->nb; i++)
        bp_backend_free(run->be[i]);
}

/* Whether a run's repackable weights in buffer type `buft` are in the CPU's repacked layout:
 * CPU_REPACK itself, or a meta device over CPU devices only, whose parts store their slices
 * so unless BP_META_NO_REPACK=1 (a meta device with other parts is taken as plain). */
static bool repacked_weights(const char *buft)
{
    if (strncmp(buft, "CPU_REPACK", 10) == 0)
        return true;
    const char *off = getenv("BP_META_NO_REPACK");
    if (strncmp(buft, "Meta(", 5) != 0 || (off != NULL && off[0] == '1'))
        return false;
    for (const char *p = buft + 5; *p != '\0' && *p != ')'; p += strcspn(p, ",)")) {
        if (*p == ',')
            p++;
        if (strncmp(p, "CPU", 3) != 0)
            return false;
    }
    return true;
}

/* One run of the model on devices (quiet: the --check run, which writes no --dot); r is filled
 * (and freed by the caller with result_free, also on failure). 0, or the exit status after
 * printing why (2: a device list that is wrong in itself). */
static int run_once(const struct run_opts *o, const char *devices, struct run_result *r,
                    bool quiet)
{
    memset(r, 0, sizeof(*r));
    struct run run = {.o = o, .cfg = o->cfg, .r = r, .quiet = quiet};
    const int opened = open_devices(&run, devices);
    if (opened != 0)
        return opened;
    run.show = !quiet && !o->json && isatty(2);
    run.started = bench_now();
    record_devices(&run);
    bool ok = place_weights(&run) && place_experts(&run) && experts_runnable(&run) &&
              place_embedding_and_kv(&run) && choose_attention(&run) && check_memory(&run);
    const double t0 = bench_now();
    ok = ok && load_model(&run);
    r->load_seconds = bench_now() - t0;
    ok = ok && new_scheduler(&run);
    ok = tool_sync_ranks(devices, ok) && run_passes(&run);
    for (int i = 0; ok && i < run.nb; i++)
        r->compute_bytes[i] = bp_sched_get_buffer_size(run.s, run.be[i]);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        r->peak_rss = (size_t)ru.ru_maxrss * 1024; /* Linux counts kibibytes */
    close_run(&run);
    return ok ? 0 : 1;
}


/* The run on the devices asked for; the --dot file is closed after it, and a failed write
 * fails the run. 0, or 1 after printing why. */
static int run_main(struct run_opts *o, struct run_result *r)
{
    int ran = run_once(o, o->devices, r, false);
    if (o->dot_file != NULL) {
        const bool bad = ferror(o->dot_file) != 0;
        if (fclose(o->dot_file) != 0 || bad) {
            if (ran == 0)
                fprintf(stderr, "%s: cannot write --dot file '%s'\n", run_cmd, tool_text(o->dot));
            ran = 1;
        }
        o->dot_file = NULL;
    }
    return ran;
}

/* How far the logits of a run may be from the CPU's, by weight type (docs/user-guide.md). A whole
 * model's logits, not one product: measured against the test accelerator (reference kernels),
 * NMSE 1e-9 for f16/bf16 and 2e-4 for q8_0 on the tiny model, where the CPU quantises the
 * activations to Q8_0 and other devices need not. The bounds leave a factor of ten or more for
 * other devices' order of summation and are far below what a wrong result gives (NMSE near 1);
 * the precision of each op is the conformance suite's to check, against tighter bounds. */
static double check_bound(const struct run_opts *o)
{
    /* Half precision rounds every product's activations to 16 bits on the devices that take
     * the permission (the CPU with AVX512_BF16) and not on others. */
    const bool half = o->half && (o->wtype == BP_TYPE_BF16 || o->wtype == BP_TYPE_F16);
    /* A quantised KV cache: keys and values a split product left 1e-7 apart can round to other
     * levels (IQ4_NL's scale search even picks another scale), which the logits show. */
    const bool qkv = o->kv_type != NULL && strcmp(o->kv_type, "f16") != 0;
    return bp_type_get_traits(o->wtype)->is_quantized || half || qkv ? 2e-3 : 1e-6;
}

/* Logits are comparable while both runs have seen the same tokens: steps are compared up to
 * and including the first whose tokens differ. The check passes when the logits compared are
 * within the bound: the tokens then agree, or first differ where the CPU's two best logits are
 * closer than the runs' difference (a near tie), after which the runs see different inputs. */
static struct run_check compare_runs(const struct run_opts *o, const struct run_result *r,
                                     const struct run_result *ref)
{
    struct run_check c = {.agree = true, .first_diff = -1, .bound = check_bound(o)};
    double err = 0.0, norm = 0.0;
    for (int i = 0; i < o->n_gen; i++) {
        const float *a = r->logits + (size_t)i * o->cfg->n_vocab;
        const float *b = ref->logits + (size_t)i * o->cfg->n_vocab;
        for (int k = 0; k < o->cfg->n_vocab; k++) {
            const double d = (double)a[k] - (double)b[k];
            c.max_diff = fmax(c.max_diff, fabs(d));
            err += d * d;
            norm += (double)b[k] * b[k];
        }
        c.compared++;
        if (r->tokens[i] != ref->tokens[i]) {
            c.agree = false;
            c.first_diff = i;
            break;
        }
    }
    c.nmse = norm > 0.0 ? err / norm : err;
    c.pass = c.nmse <= c.bound; /* false for NaN */
    return c;
}

/* --logits: the n_gen x n_vocab logits of the run, raw f32. */
static bool write_logits(const struct run_opts *o, const struct run_result *r)
{
    FILE *f = tool_open_output(run_cmd, "--logits", o->logits_path);
    if (f == NULL)
        return false;
    const size_t n = (size_t)o->n_gen * (size_t)o->cfg->n_vocab;
    errno = 0;
    bool ok = fwrite(r->logits, sizeof(float), n, f) == n;
    int err = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok)
        fprintf(stderr, "%s: cannot write --logits file '%s': %s\n", run_cmd,
                tool_text(o->logits_path), strerror(err ? err : EIO));
    return ok;
}

/* --save-gguf: the seeded model, made in host memory, written as a GGUF file. */
static int save_model(const struct run_opts *o)
{
    struct model m;
    bp_buffer_type *host = bp_host_buffer_type();
    const struct model_placement where = {host, host, host, NULL, NULL};
    enum bp_status st = model_init(&m, o->cfg, o->wtype, &where, o->seed);
    if (st == BP_OK) {
        st = model_save_gguf(&m, o->save_gguf);
        model_free(&m);
    }
    if (st != BP_OK) {
        fprintf(stderr, "%s: cannot write '%s': %s\n", run_cmd, tool_text(o->save_gguf),
                tool_text(bp_last_error()));
        return 1;
    }
    printf("wrote %s: model %s (%s weights, seed %llu) as a llama GGUF file\n",
           tool_text(o->save_gguf), tool_text(o->cfg->name), bp_type_name(o->wtype), (unsigned long long)o->seed);
    return 0;
}

static int run_cmd_main(struct run_opts *o);

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {.cfg = model_config_by_name("tiny"), .wtype = BP_TYPE_F32,
                         .n_prompt = 32, .n_gen = 16, .seed = 1, .flash_attn = -1,
                         .expert_prefetch = -1};
    int status = run_parse_args(argc, argv, &o);
    if (status < 0)
        status = run_check_opts(&o);
    if (status < 0)
        status = o.save_gguf != NULL ? save_model(&o) : run_cmd_main(&o);
    if (o.dot_file != NULL)
        fclose(o.dot_file);
    bp_gguf_close(o.gguf);
    free(o.tokens);
    return status;
}

static int run_cmd_main(struct run_opts *o_)
{
    struct run_opts o = *o_;
    o_->dot_file = NULL; /* run_main closes it */
    bp_plugin_load_all();
    /* Every process of an mpirun runs the same; the report is rank 0's, the others' errors
     * still go to stderr. */
    int n_ranks;
    if (tool_process_rank(o.devices, &n_ranks) != 0 && freopen("/dev/null", "w", stdout) == NULL)
        return 1;

    struct run_result r, ref;
    const int ran = run_main(&o, &r);
    if (ran != 0) {
        result_free(&r);
        return ran;
    }
    r.n_ranks = n_ranks;
    struct run_check c = {.agree = true, .pass = true};
    if (o.check) {
        /* The reference keeps the CPU_REPACK layout only when the run under test used it (a
         * meta device's parts store repackable slices in it unless --no-repack): the two
         * layouts quantise the activations at different points, which a mixture of experts'
         * router can turn into another expert on a near tie. */
        struct run_opts ro = o;
        ro.no_repack = o.no_repack || !repacked_weights(r.weight_buft);
        const int ref_ran = run_once(&ro, "CPU", &ref, true);
        if (ref_ran == 0)
            c = compare_runs(&o, &r, &ref);
        result_free(&ref);
        if (ref_ran != 0) {
            result_free(&r);
            return 1;
        }
    }
    if (o.logits_path != NULL && !write_logits(&o, &r)) {
        result_free(&r);
        return 1;
    }
    if (o.json) {
        run_print_json(&o, &r, o.check ? &c : NULL);
    } else {
        run_print_text(&o, &r);
        if (o.check)
            run_print_check(&c);
    }
    result_free(&r);
    return c.pass ? 0 : 1;
}
