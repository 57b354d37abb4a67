/* run-report.c - what `backplane run` prints about a run: the text report and the JSON object
 * (run.h). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "json.h"
#include "run.h"
#include "tool.h"

/* A field of the result that may have failed to copy: "?" for NULL. */
const char *run_or_unknown(const char *s)
{
    return s != NULL ? s : "?";
}

/* run_or_unknown(s) escaped, for text output (text.c). */
const char *run_shown(const char *s)
{
    return tool_text(run_or_unknown(s));
}

static double mib(size_t b)
{
    return (double)b / 1048576.0;
}

/* The "experts:" line of the report, without its newline. */
static void print_experts(const struct run_opts *o, const struct run_result *r)
{
    const struct model_config *c = o->cfg;
    printf("experts:    %d per layer, %d used per token; %.2f MiB %s %s (%s)", c->n_expert,
           c->n_expert_used, mib(r->expert_bytes), r->experts_on < 0 ? "in" : "on",
           r->experts_on < 0 ? "the file" : run_shown(r->names[r->experts_on]),
           tool_text(r->expert_buft));
    for (int p = 0; p < r->n_weight_parts && r->experts_on == r->weights_on; p++)
        printf("%s%.2f", p == 0 ? "; per part: " : " + ", mib(r->expert_part_bytes[p]));
    if (r->n_weight_parts > 0 && r->experts_on == r->weights_on)
        printf(" MiB");
    if (o->n_gen > 1 && r->gen_expert_whole > 0)
        printf("; copied per generated token: %.3f MiB of experts (%s; whole tensors: %.3f "
               "MiB), %.3f MiB in all", r->gen_expert_copied / (o->n_gen - 1) / 1048576.0,
               o->no_expert_stream    ? "--no-expert-stream"
               : o->expert_copies_all ? "--expert-copies all"
                                      : "the ones used",
               r->gen_expert_whole / (o->n_gen - 1) / 1048576.0,
               r->gen_copied / (o->n_gen - 1) / 1048576.0);
    if (o->expert_cache > 0 && r->gen_hits + r->gen_misses > 0)
        printf("; cache of %d per tensor: %.0f hits, %.0f misses (%.1f%% hits)",
               o->expert_cache, r->gen_hits, r->gen_misses,
               100.0 * r->gen_hits / (r->gen_hits + r->gen_misses));
    if (r->prefetch && o->n_gen > 1)
        printf("; prefetch: %.0f experts loaded ahead (%.3f MiB per generated token of "
               "those copied), %.0f of them used; per generated token %.3f ms copying, "
               "%.3f ms waiting, %.3f ms prefetching alongside", r->gen_prefetched,
               r->gen_prefetch_bytes / (o->n_gen - 1) / 1048576.0, r->gen_prefetch_hits,
               1e3 * r->gen_copy_s / (o->n_gen - 1),
               1e3 * r->gen_wait_s / (o->n_gen - 1), 1e3 * r->gen_prefetch_s / (o->n_gen - 1));
    else if (o->n_gen > 1 && r->gen_expert_whole > 0)
        printf("; %.3f ms per generated token copying experts",
               1e3 * r->gen_copy_s / (o->n_gen - 1));
}

void run_print_text(const struct run_opts *o, const struct run_result *r)
{
    const struct model_config *c = o->cfg;
    printf("model:      ");
    tool_put_text(c->name, stdout);
    printf(" (%d layers, n_embd %d, n_ff %d, %d heads", c->n_layer, c->n_embd, c->n_ff, c->n_head);
    if (c->n_head_kv != c->n_head)
        printf(" (%d for keys and values)", c->n_head_kv);
    printf(", vocab %d; %.1f M parameters), %s weights, ", c->n_vocab,
           (double)model_n_params(c) / 1e6, bp_type_name(o->wtype));
    if (o->gguf_path != NULL) {
        printf("from ");
        tool_put_text(o->gguf_path, stdout);
        printf("\n");
    } else {
        printf("seed %llu\n", (unsigned long long)o->seed);
    }
    for (int i = 0; i < r->n_backends; i++) {
        printf("%-11s ", i == 0 ? "devices:" : "");
        tool_put_text(run_or_unknown(r->names[i]), stdout);
        printf(": ");
        tool_put_text(run_or_unknown(r->descriptions[i]), stdout);
        printf("\n%-11s (plugin ", "");
        tool_put_text(run_or_unknown(r->plugins[i]), stdout);
        printf(")\n");
    }
    if (r->kv_on == r->weights_on && r->embd_on == r->weights_on)
        printf("buffers:    weights %.2f MiB and KV cache %.2f MiB on %s (%s)",
               mib(r->weight_bytes), mib(r->kv_bytes), run_shown(r->names[r->weights_on]),
               tool_text(r->weight_buft));
    else
        printf("buffers:    weights %.2f MiB on %s (%s), token embedding on %s, KV cache %.2f MiB "
               "on %s", mib(r->weight_bytes), run_shown(r->names[r->weights_on]), tool_text(r->weight_buft),
               run_shown(r->names[r->embd_on]), mib(r->kv_bytes), run_shown(r->names[r->kv_on]));
    for (int p = 0; p < r->n_weight_parts; p++)
        printf("%s%.2f", p == 0 ? "; weights per part: " : " + ", mib(r->weight_part_bytes[p]));
    if (r->n_weight_parts > 0)
        printf(" MiB");
    for (int i = 0; i < r->n_backends; i++)
        printf("; compute %s %.2f MiB", run_shown(r->names[i]), mib(r->compute_bytes[i]));
    printf("\n");
    if (c->n_expert > 0) {
        print_experts(o, r);
        printf("\n");
    }
    if (r->gen_reduced > 0 && o->n_gen > 1)
        printf("all-reduce: %.1f KiB per generated token%s\n",
               r->gen_reduced / (o->n_gen - 1) / 1024.0,
               r->n_ranks > 1 ? " between the processes (gathers across them included)" : "");
    printf("attention:  %s, %s KV cache\n",
           r->flash_attn ? "fused (FLASH_ATTN_EXT)" : "MUL_MAT, SOFT_MAX, MUL_MAT",
           bp_type_name(o->cfg->kv_type));
    if (o->half)
        printf("products:   half precision (activations of BF16/F16 products may be rounded "
               "to 16 bits)\n");
    printf("load:       %.1f ms loading the weights; first prompt pass %.1f ms; peak RSS %.1f MiB\n",
           r->load_seconds * 1e3, r->first_prompt_seconds * 1e3, mib(r->peak_rss));
    printf("prompt:     %d tokens in one graph, %d split%s, %.1f tokens/s (%.1f ms%s)\n",
           o->n_prompt, r->prompt_splits, r->prompt_splits == 1 ? "" : "s",
           o->n_prompt / r->prompt_seconds, r->prompt_seconds * 1e3,
           o->repeat > 0 ? ", median of the passes after the warm-up" : ", cold");
    if (o->n_gen > 1) {
        printf("generation: %d tokens, %d split%s per graph:", o->n_gen - 1, r->gen_splits,
               r->gen_splits == 1 ? "" : "s");
        for (int i = 0; i < r->n_gen_split_info; i++)
            printf(" %s %d nodes%s", tool_text(r->gen_split[i].backend), r->gen_split[i].nodes,
                   i + 1 < r->n_gen_split_info ? "," : "");
        if (r->gen_splits > r->n_gen_split_info)
            printf(", ...");
        printf("\n            %.1f tokens/s (median %.2f ms per token); %d of %d graphs "
               "reused\n", 1.0 / r->gen_median_seconds, r->gen_median_seconds * 1e3,
               r->gen_reused, o->n_gen - 1);
    }
    printf("tokens:    ");
    for (int i = 0; i < o->n_gen; i++)
        printf(" %d", r->tokens[i]);
    printf("\n");
}

/* What --check found against the run on the CPU alone. */


void run_print_json(const struct run_opts *o, const struct run_result *r,
                       const struct run_check *check)
{
    const struct model_config *c = o->cfg;
    struct json_writer w;
    json_init(&w, stdout, 1);
    json_begin_object(&w);
    json_member_string(&w, "model", c->name);
    json_member_int(&w, "parameters", (long long)model_n_params(c));
    json_member_string(&w, "wtype", bp_type_name(o->wtype));
    if (o->gguf_path != NULL)
        json_member_string(&w, "gguf", o->gguf_path);
    else
        json_member_uint(&w, "seed", (unsigned long long)o->seed);
    json_member_int(&w, "layers", c->n_layer);
    json_member_int(&w, "heads", c->n_head);
    json_member_int(&w, "kv_heads", c->n_head_kv);
    json_member_string(&w, "weights_on", run_or_unknown(r->names[r->weights_on]));
    json_member_string(&w, "embedding_on", run_or_unknown(r->names[r->embd_on]));
    json_member_string(&w, "kv_cache_on", run_or_unknown(r->names[r->kv_on]));
    json_member_bool(&w, "flash_attn", r->flash_attn);
    json_member_string(&w, "matmul_precision", o->half ? "half" : "full");
    json_member_string(&w, "kv_type", bp_type_name(o->cfg->kv_type));
    json_key(&w, "devices");
    json_begin_array(&w);
    for (int i = 0; i < r->n_backends; i++) {
        json_begin_object(&w);
        json_member_string(&w, "name", run_or_unknown(r->names[i]));
        json_member_string(&w, "plugin", run_or_unknown(r->plugins[i]));
        json_member_uint(&w, "compute_bytes", r->compute_bytes[i]);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_member_uint(&w, "weight_bytes", r->weight_bytes);
    json_member_uint(&w, "kv_bytes", r->kv_bytes);
    json_member_string(&w, "weight_buffer_type", r->weight_buft);
    if (c->n_expert > 0) {
        const int steps = o->n_gen > 1 ? o->n_gen - 1 : 1;
        json_member_int(&w, "experts", c->n_expert);
        json_member_int(&w, "experts_used", c->n_expert_used);
        json_member_string(&w, "experts_on",
                           r->experts_on < 0 ? "file" : run_shown(r->names[r->experts_on]));
        json_member_uint(&w, "expert_bytes", r->expert_bytes);
        json_member_string(&w, "expert_copies", o->expert_copies_all ? "all" : "used");
        json_member_double(&w, "expert_bytes_copied_per_token", r->gen_expert_copied / steps, 10);
        json_member_double(&w, "expert_bytes_whole_per_token", r->gen_expert_whole / steps, 10);
        json_member_double(&w, "bytes_copied_per_token", r->gen_copied / steps, 10);
        json_member_int(&w, "expert_cache", o->expert_cache);
        json_member_double(&w, "expert_cache_hits", r->gen_hits, 10);
        json_member_double(&w, "expert_cache_misses", r->gen_misses, 10);
        json_member_bool(&w, "expert_prefetch", r->prefetch);
        json_member_double(&w, "experts_prefetched", r->gen_prefetched, 10);
        json_member_double(&w, "experts_prefetch_hits", r->gen_prefetch_hits, 10);
        json_member_double(&w, "expert_bytes_prefetched_per_token", r->gen_prefetch_bytes / steps,
                           10);
        json_member_double(&w, "expert_copy_seconds_per_token", r->gen_copy_s / steps, 10);
        json_member_double(&w, "expert_wait_seconds_per_token", r->gen_wait_s / steps, 10);
        json_member_double(&w, "expert_prefetch_seconds_per_token", r->gen_prefetch_s / steps,
                           10);
    }
    json_member_int(&w, "ranks", r->n_ranks > 0 ? r->n_ranks : 1);
    json_member_double(&w, "bytes_allreduced_per_token",
                       r->gen_reduced / (o->n_gen > 1 ? o->n_gen - 1 : 1), 10);
    json_member_int(&w, "repeat", o->repeat);
    json_member_double(&w, "load_seconds", r->load_seconds, 10);
    json_member_double(&w, "first_prompt_seconds", r->first_prompt_seconds, 10);
    json_member_uint(&w, "peak_rss_bytes", r->peak_rss);
    json_member_int(&w, "prompt_tokens", o->n_prompt);
    json_member_int(&w, "prompt_splits", r->prompt_splits);
    json_member_double(&w, "prompt_tokens_per_s", o->n_prompt / r->prompt_seconds, 10);
    json_member_int(&w, "generated_tokens", o->n_gen);
    json_member_int(&w, "generation_splits", r->gen_splits);
    json_member_int(&w, "generation_graphs_reused", r->gen_reused);
    json_member_double(&w, "generation_tokens_per_s",
                       o->n_gen > 1 ? 1.0 / r->gen_median_seconds : 0.0, 10);
    json_key(&w, "tokens");
    json_begin_array(&w);
    for (int i = 0; i < o->n_gen; i++)
        json_int(&w, r->tokens[i]);
    json_end_array(&w);
    if (check != NULL) {
        json_key(&w, "check");
        json_begin_object(&w);
        json_member_bool(&w, "tokens_agree", check->agree);
        json_member_int(&w, "first_differing_step", check->first_diff);
        json_member_int(&w, "steps_compared", check->compared);
        json_member_double(&w, "max_logit_diff", check->max_diff, 6);
        json_member_double(&w, "logit_nmse", check->nmse, 6);
        json_member_double(&w, "nmse_bound", check->bound, 6);
        json_member_bool(&w, "pass", check->pass);
        json_end_object(&w);
    }
    json_end_object(&w);
    json_finish(&w);
}

/* The --check line of the text report. */
void run_print_check(const struct run_check *c)
{
    char tokens[64];
    if (c->agree)
        snprintf(tokens, sizeof(tokens), "tokens agree");
    else
        snprintf(tokens, sizeof(tokens), "tokens differ from step %d%s", c->first_diff,
                 c->pass ? " (a near tie)" : "");
    printf("check:      on CPU alone: %s; largest logit difference %.3g over %d step%s; "
           "NMSE %.3g (bound %.0e): %s\n", tokens, c->max_diff, c->compared,
           c->compared == 1 ? "" : "s", c->nmse, c->bound, c->pass ? "pass" : "FAIL");
}

