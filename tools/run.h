/* run.h - `backplane run`, in three files by job: run.c does the run (devices, placement,
 * loading, prompt, generation, --check), run-options.c reads and checks the command line,
 * run-report.c prints what a run produced as text or JSON. */
#ifndef BP_TOOL_RUN_H
#define BP_TOOL_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <backplane/backplane.h>

#include "model.h"

#define MAX_BACKENDS 8

struct run_opts {
    const struct model_config *cfg;
    enum bp_type wtype;
    bool wtype_given, model_given, prompt_given;
    const char *gguf_path; /* --gguf FILE: the model from it */
    bp_gguf *gguf;
    struct model_config file_cfg; /* the file's configuration (cfg points here) */
    char file_name[128];          /* its name, file_cfg.name */
    const char *tokens_arg;       /* --tokens 1,2,3: the prompt */
    int32_t *tokens;
    int n_tokens;
    const char *save_gguf; /* --save-gguf FILE: write the model there instead of running it */
    int n_ctx;             /* --ctx N, else 0: the model's */
    int flash_attn;        /* --flash-attn: 1 on, 0 off, -1 auto (where the KV cache's device
                            * runs FLASH_ATTN_EXT) */
    const char *logits_path; /* --logits FILE: the logits of every generated step, raw f32 */
    const char *kv_type;     /* --kv-type f16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl, else NULL: f16 */
    const char *devices; /* NULL: the best present */
    int n_prompt, n_gen, threads;
    int repeat; /* --repeat N: N timed passes after one warm-up pass, medians (0: one cold pass) */
    uint64_t seed;
    bool check, json;
    bool no_repack; /* keep weights on a CPU device in its default buffer type (no CPU_REPACK) */
    bool half;      /* --precision half: products may round activations to 16 bits */
    const char *experts_on; /* --experts-on DEVICE: the stacked experts' device (NULL: with the
                             * weights) */
    bool expert_copies_all; /* --expert-copies all: copy whole stacked experts between devices */
    int expert_cache;       /* --expert-cache N: experts cached per stacked tensor on the device
                             * that runs MUL_MAT_ID (0: none) */
    bool expert_cache_given, expert_copies_given;
    int expert_prefetch; /* --expert-prefetch on|off: predict each next layer's experts and load
                          * them into the cache meanwhile (-1: on with a cache) */
    bool no_expert_stream; /* --no-expert-stream: whole stacked experts, no cache, no prefetch */
    const char *dot; /* --dot FILE, opened by cmd_run as dot_file before anything runs */
    FILE *dot_file;
    const char *run_only; /* the first option given that only a run takes (not --save-gguf) */
};

struct split_info {
    char backend[64];
    int nodes;
};

/* What one run produced. */
struct run_result {
    int n_backends;
    /* Heap copies (NULL when memory ran out; printed as "?"): no length limit cuts a Meta(...)
     * name or a deep plugin path short. */
    char *names[MAX_BACKENDS];
    char *descriptions[MAX_BACKENDS];
    char *plugins[MAX_BACKENDS]; /* file of the plugin that provides the device */
    size_t compute_bytes[MAX_BACKENDS];
    size_t weight_bytes, kv_bytes;
    char weight_buft[64];
    int weights_on; /* index of the backend that holds the weights */
    int experts_on; /* ... the stacked experts (a model with experts) */
    size_t expert_bytes;
    size_t expert_part_bytes[MAX_BACKENDS]; /* experts on a meta device: what each part holds */
    char expert_buft[64];
    /* Bytes the scheduler copied between devices over the generation steps: in all, of stacked
     * experts, and what those experts would have taken whole. */
    double gen_copied, gen_expert_copied, gen_expert_whole;
    double gen_hits, gen_misses; /* used experts copied from the cache, from their source */
    /* Prefetch over the generation steps: experts loaded ahead, of the used ones those found
     * because of it, and seconds the computing thread copied experts, waited for the copy
     * thread, and the copy thread copied. */
    bool prefetch; /* next layers' experts predicted and prefetched */
    /* Bytes the meta backends all-reduced (and gathered across processes) over the generation
     * steps, and how many processes the run spans (1 without DEVICE@RANK parts). */
    double gen_reduced;
    int n_ranks;
    double gen_prefetched, gen_prefetch_hits, gen_prefetch_bytes, gen_copy_s, gen_wait_s,
        gen_prefetch_s;
    int embd_on, kv_on; /* ... the token embedding table, the KV cache */
    bool flash_attn;    /* attention as FLASH_ATTN_EXT */
    size_t weight_part_bytes[MAX_BACKENDS]; /* weights on a meta device: what each part holds */
    int n_weight_parts;
    int prompt_splits, gen_splits;
    int gen_reused; /* generation steps that computed the previous step's graph again */
    struct split_info gen_split[16];
    int n_gen_split_info;
    double prompt_seconds, gen_median_seconds;
    /* Seconds loading the weights (reading the file or filling the seeded model), the first
     * (cold) prompt pass, and the process's peak resident size after the run, in bytes. */
    double load_seconds, first_prompt_seconds;
    size_t peak_rss;
    int32_t *tokens;  /* n_gen generated ids */
    float *logits;    /* n_gen x n_vocab: logits that chose each token */
};


/* What --check found, comparing the run's logits with the CPU's alone. */
struct run_check {
    bool agree;      /* the same tokens */
    int first_diff;  /* the first step whose tokens differ (when !agree) */
    double max_diff; /* the largest logit difference over the steps compared */
    double nmse;     /* normalised mean squared error of the logits compared */
    double bound;    /* what nmse may be for the check to pass */
    bool pass;
    int compared;
};

/* ---- run.c ------------------------------------------------------------------------------ */

/* Whether t is a type a model's weights may have (not the activation-only Q8_1 and Q8_K). */
bool run_is_weight_type(enum bp_type t);

/* ---- run-options.c --------------------------------------------------------------------- */

extern const char run_cmd[]; /* "backplane run", the prefix of every message */

/* The command line into o: -1 to go on, else the exit status (after the usage or a message). */
int run_parse_args(int argc, char **argv, struct run_opts *o);
/* Checks the options against each other and opens what they name (the GGUF file, the --dot
 * file); -1 to go on, else the exit status after a message. */
int run_check_opts(struct run_opts *o);

/* ---- run-report.c ---------------------------------------------------------------------- */

const char *run_or_unknown(const char *s);
const char *run_shown(const char *s);
void run_print_text(const struct run_opts *o, const struct run_result *r);
/* check: NULL without --check. */
void run_print_json(const struct run_opts *o, const struct run_result *r,
                    const struct run_check *check);
void run_print_check(const struct run_check *c);

#endif
