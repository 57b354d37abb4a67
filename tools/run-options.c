/* run-options.c - the command line of `backplane run`: the usage, reading each option, and
 * the checks that options make against each other (run.h). */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "run.h"
#include "tool.h"

/* Whether name is one of the KV cache's types: f16, and llama.cpp's quantised cache types. */
static bool kv_type_name(const char *name)
{
    static const char *const names[] = {"f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i]) == 0)
            return true;
    return false;
}

static void run_usage(FILE *f)
{
    fprintf(f, "usage: backplane run [--model tiny|small|base|moe] [--wtype TYPE]\n"
               "                     [--gguf FILE] [--tokens ID,ID,...] [--ctx N]\n"
               "                     [--flash-attn on|off|auto]\n"
               "                     [--kv-type f16|q8_0|q4_0|q4_1|q5_0|q5_1|iq4_nl]\n"
               "                     [--logits FILE] [--precision full|half]\n"
               "                     [-d DEVICES] [-p PROMPT_TOKENS] [-n GEN_TOKENS]\n"
               "                     [-t THREADS]\n"
               "                     [--seed N] [--repeat N] [--check] [--json] [--dot FILE]\n"
               "                     [--no-repack]\n"
               "                     [--experts-on DEVICE] [--expert-copies used|all]\n"
               "                     [--expert-cache N] [--expert-prefetch on|off]\n"
               "                     [--no-expert-stream]\n"
               "       backplane run --model M [--wtype T] [--seed N] --save-gguf FILE\n"
               "\n"
               "  --wtype     the seeded model's weight type: f32 (default), f16, bf16, q8_0,\n"
               "              q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl,\n"
               "              iq4_xs;\n"
               "              rows a k-quant's blocks of 256 do not divide fall back as in\n"
               "              llama.cpp (q4_K to q5_0, q5_K to q5_1, q6_K to q8_0, q2_K and q3_K\n"
               "              to q4_0, iq4_xs to iq4_nl)\n"
               "  --gguf FILE the model of a llama-architecture GGUF file (llama, mistral,\n"
               "              qwen2) instead of a seeded one; its weights keep their types\n"
               "  --tokens    the prompt as token ids (no tokenizer); default: -p ids drawn from\n"
               "              the seed\n"
               "  --ctx N     positions the KV cache holds (default: the model's context, at\n"
               "              most 4096 for a file)\n"
               "  --save-gguf write the seeded model as a llama GGUF file and exit\n"
               "  --kv-type   the KV cache's type: f16 (default), or q8_0, q4_0, q4_1, q5_0,\n"
               "              q5_1, iq4_nl (these need fused attention)\n"
               "  --repeat N  one warm-up pass of prompt and generation, then N timed passes:\n"
               "              the speeds reported are their medians (default: one cold pass;\n"
               "              the 'load:' line shows load time, first pass and peak RSS)\n"
               "  --logits FILE write the logits that chose each generated token to FILE:\n"
               "              n_gen x n_vocab little-endian f32, step by step\n"
               "  --flash-attn attention as one fused op (default auto: where the device\n"
               "              holding the KV cache runs it)\n"
               "  -d DEVICES  comma-separated backends, e.g. CPU, CUDA0,CPU or\n"
               "              \"Meta(CPU0,CPU1)\";\n"
               "              weights live on the first that can multiply, the embedding table\n"
               "              and KV cache there too when it runs their ops (else on the first\n"
               "              that does); one CPU backend finishes every graph: named, it\n"
               "              must come last, else it is added (default: every GPU, then CPU)\n"
               "  --check     also run on the CPU alone; compare the logits (NMSE within the\n"
               "              weight type's bound, else exit status 1) and the generated tokens\n"
               "  --no-repack weights on a CPU device (or a meta device's CPU parts) stay in\n"
               "              host memory as they are (default: the CPU's CPU_REPACK buffer\n"
               "              type where the CPU variant stores their type row-interleaved:\n"
               "              Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, IQ4_XS\n"
               "              with AVX-512 VNNI, Q4_0 with AVX2)\n"
               "  --precision half lets the products of BF16/F16 weights round the activations\n"
               "              to 16 bits, as ggml does (BP_MM_PRECISION_HALF); full (default)\n"
               "              keeps at least 16 significant bits on every device\n"
               "  --experts-on DEVICE where a model's stacked expert matrices live (one of -d;\n"
               "              default: with the weights); a device that asks for MUL_MAT_ID\n"
               "              runs it anyway, the scheduler copying the experts over; 'file'\n"
               "              leaves them in the --gguf file, read with pread as used\n"
               "  --expert-copies used (default) copies only the experts the router chose;\n"
               "              all copies the whole stacked tensors\n"
               "  --expert-cache N keep N experts of each stacked tensor on the device that\n"
               "              runs MUL_MAT_ID and copy the ones it holds from there (0: none)\n"
               "  --expert-prefetch on (default with a cache) predicts each next layer's\n"
               "              experts (its router on this layer's MLP input) and loads them\n"
               "              into the cache on a copy thread while this layer computes\n"
               "  --no-expert-stream copy whole stacked experts, as any other weight: no\n"
               "              used-expert copies, no cache, no prefetch\n");
}

const char run_cmd[] = "backplane run";

/* An option whose value is one word of a fixed set: 1 taken, 0 not such an option, 2 after a
 * message (v is not one of its words). */
static int take_choice(const char *a, const char *v, struct run_opts *o)
{
    if (strcmp(a, "--flash-attn") == 0) {
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0 && strcmp(v, "auto") != 0) {
            fprintf(stderr, "%s: --flash-attn takes on, off or auto, not '%s'\n", run_cmd,
                    tool_text(v));
            return 2;
        }
        o->flash_attn = strcmp(v, "on") == 0 ? 1 : strcmp(v, "off") == 0 ? 0 : -1;
    } else if (strcmp(a, "--kv-type") == 0) {
        if (!kv_type_name(v)) {
            fprintf(stderr, "%s: --kv-type takes f16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl, "
                    "not '%s'\n", run_cmd, tool_text(v));
            return 2;
        }
        o->kv_type = v;
    } else if (strcmp(a, "--precision") == 0) {
        if (strcmp(v, "full") != 0 && strcmp(v, "half") != 0) {
            fprintf(stderr, "%s: --precision takes full or half, not '%s'\n", run_cmd,
                    tool_text(v));
            return 2;
        }
        o->half = strcmp(v, "half") == 0;
    } else if (strcmp(a, "--expert-prefetch") == 0) {
        if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0) {
            fprintf(stderr, "%s: --expert-prefetch is on or off, not '%s'\n", run_cmd,
                    tool_text(v));
            return 2;
        }
        o->expert_prefetch = strcmp(v, "on") == 0;
    } else if (strcmp(a, "--expert-copies") == 0) {
        if (strcmp(v, "used") != 0 && strcmp(v, "all") != 0) {
            fprintf(stderr, "%s: --expert-copies is used or all, not '%s'\n", run_cmd,
                    tool_text(v));
            return 2;
        }
        o->expert_copies_all = strcmp(v, "all") == 0;
        o->expert_copies_given = true;
    } else if (strcmp(a, "--model") == 0) {
        if ((o->cfg = model_config_by_name(v)) == NULL) {
            fprintf(stderr, "%s: no model '%s'; models: %s\n", run_cmd, tool_text(v),
                    model_config_names());
            return 2;
        }
        o->model_given = true;
    } else if (strcmp(a, "--wtype") == 0) {
        if (bp_type_from_name(v, &o->wtype) != BP_OK || !run_is_weight_type(o->wtype)) {
            fprintf(stderr, "%s: '%s' is not a weight type (f32, f16, bf16, q8_0, q4_0, q4_1, "
                    "q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs)\n", run_cmd,
                    tool_text(v));
            return 2;
        }
        o->wtype_given = true;
    } else {
        return 0;
    }
    return 1;
}

/* An option whose value is a number, a file or a list: 1 taken, 0 not such an option, 2 after a
 * message. */
static int take_value(const char *a, const char *v, struct run_opts *o)
{
    long long num = 0;
    const char **text = strcmp(a, "--gguf") == 0        ? &o->gguf_path
                        : strcmp(a, "--save-gguf") == 0 ? &o->save_gguf
                        : strcmp(a, "--tokens") == 0    ? &o->tokens_arg
                        : strcmp(a, "--logits") == 0    ? &o->logits_path
                        : strcmp(a, "--dot") == 0       ? &o->dot
                        : strcmp(a, "--experts-on") == 0 ? &o->experts_on
                        : strcmp(a, "-d") == 0 || strcmp(a, "--devices") == 0 ? &o->devices
                                                                              : NULL;
    if (text != NULL) {
        *text = v;
    } else if (strcmp(a, "--ctx") == 0) {
        if (!tool_parse_int(run_cmd, a, v, 1, 1 << 20, &num))
            return 2;
        o->n_ctx = (int)num;
    } else if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0) {
        /* int: the model's positions are int; the context is checked by check_run_opts, once
         * the model is known. */
        if (!tool_parse_int(run_cmd, a, v, 1, INT_MAX, &num))
            return 2;
        o->n_prompt = (int)num;
        o->prompt_given = true;
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "--gen") == 0) {
        if (!tool_parse_int(run_cmd, a, v, 1, INT_MAX, &num))
            return 2;
        o->n_gen = (int)num;
    } else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0) {
        /* 0: the CPU plugin's default; its upper limit is 1024 */
        if (!tool_parse_int(run_cmd, a, v, 0, 1024, &num))
            return 2;
        o->threads = (int)num;
    } else if (strcmp(a, "--expert-cache") == 0) {
        if (!tool_parse_int(run_cmd, a, v, 0, 4096, &num))
            return 2;
        o->expert_cache = (int)num;
        o->expert_cache_given = true;
    } else if (strcmp(a, "--seed") == 0) {
        if (!tool_parse_u64(run_cmd, a, v, &o->seed))
            return 2;
    } else if (strcmp(a, "--repeat") == 0) {
        if (!tool_parse_int(run_cmd, a, v, 1, 1000, &num))
            return 2;
        o->repeat = (int)num;
    } else {
        return 0;
    }
    return 1;
}

/* A flag (an option without a value): true when a is one. */
static bool take_flag(const char *a, struct run_opts *o)
{
    if (strcmp(a, "--check") == 0) {
        o->check = true;
    } else if (strcmp(a, "--json") == 0) {
        o->json = true;
    } else if (strcmp(a, "--no-repack") == 0) {
        o->no_repack = true;
        setenv("BP_META_NO_REPACK", "1", 1); /* and a meta device's parts' slices */
    } else if (strcmp(a, "--no-expert-stream") == 0) {
        o->no_expert_stream = true;
    } else {
        return false;
    }
    return true;
}

/* Whether a is an option that takes a value (take_choice and take_value know them all). */
static bool takes_value(const char *a)
{
    static const char *const names[] = {
        "--model", "--wtype", "--gguf", "--save-gguf", "--tokens", "--flash-attn", "--kv-type",
        "--precision", "--logits", "--ctx", "-d", "--devices", "-p", "--prompt", "-n", "--gen",
        "-t", "--threads", "--expert-cache", "--seed", "--repeat", "--dot", "--experts-on",
        "--expert-prefetch", "--expert-copies"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(a, names[i]) == 0)
            return true;
    return false;
}

/* The options into o. -1 to go on, else the exit status (0 after --help, 2 after a message). */
int run_parse_args(int argc, char **argv, struct run_opts *o)
{
    static const char *const save_opts[] = {"--model", "--wtype", "--seed", "--save-gguf"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            run_usage(stdout);
            return 0;
        }
        if (!take_flag(a, o)) {
            /* The value is the next argument as it is ("-p -1" is a bad count, not an option). */
            if (i + 1 == argc)
                return takes_value(a) ? tool_no_value(run_cmd, a) : tool_bad_arg(run_cmd, a);
            int st = take_choice(a, argv[i + 1], o);
            if (st == 0)
                st = take_value(a, argv[i + 1], o);
            if (st == 0)
                return tool_bad_arg(run_cmd, a);
            if (st == 2)
                return 2;
            i++;
        }
        bool saves = false;
        for (size_t k = 0; k < sizeof(save_opts) / sizeof(save_opts[0]); k++)
            saves |= strcmp(a, save_opts[k]) == 0;
        if (!saves && o->run_only == NULL)
            o->run_only = a;
    }
    return -1;
}

/* The ids of --tokens into o->tokens, each below the model's vocabulary size; also -p. The
 * count, or -1 after a message. */
static int parse_tokens(struct run_opts *o)
{
    const char *p = o->tokens_arg;
    int n = 1;
    for (const char *c = p; *c; c++)
        n += *c == ',';
    o->tokens = malloc((size_t)n * sizeof(int32_t));
    if (o->tokens == NULL) {
        fprintf(stderr, "%s: out of memory\n", run_cmd);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        const long long v = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
        if (v < 0)
            end = (char *)p;
        if (end == p || errno != 0 || (*end != ',' && *end != '\0') || v < 0 ||
            v >= o->cfg->n_vocab) {
            char *item = strndup(p, strcspn(p, ","));
            fprintf(stderr, "%s: --tokens: token %d ('%s') is not an id in [0, %d) of '%s'\n",
                    run_cmd, i + 1, tool_text(item ? item : "?"), o->cfg->n_vocab,
                    tool_text(o->cfg->name));
            free(item);
            return -1;
        }
        o->tokens[i] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    o->n_prompt = n;
    return n;
}

/* The expert options fit the model and each other. -1 to go on, else 2 after a message. */
static int check_expert_opts(struct run_opts *o)
{
    if (o->experts_on != NULL && strcasecmp(o->experts_on, "file") == 0 && o->gguf == NULL) {
        fprintf(stderr, "%s: --experts-on file leaves the experts in the --gguf file; give one\n",
                run_cmd);
        return 2;
    }
    if ((o->experts_on != NULL || o->expert_cache_given || o->expert_copies_given ||
         o->expert_prefetch >= 0 || o->no_expert_stream) &&
        o->cfg->n_expert == 0) {
        fprintf(stderr, "%s: %s applies to a model with experts; '%s' has none\n", run_cmd,
                o->experts_on != NULL    ? "--experts-on"
                : o->expert_cache_given  ? "--expert-cache"
                : o->expert_copies_given ? "--expert-copies"
                : o->no_expert_stream    ? "--no-expert-stream"
                                         : "--expert-prefetch",
                tool_text(o->cfg->name));
        return 2;
    }
    if (o->no_expert_stream && ((o->expert_copies_given && !o->expert_copies_all) ||
                                o->expert_cache > 0 || o->expert_prefetch == 1)) {
        fprintf(stderr, "%s: --no-expert-stream copies whole stacked experts, without a cache or "
                "prefetch; it does not go with %s\n", run_cmd,
                o->expert_cache > 0 ? "--expert-cache" : o->expert_prefetch == 1
                ? "--expert-prefetch on" : "--expert-copies used");
        return 2;
    }
    if (o->no_expert_stream)
        o->expert_copies_all = true;
    if (o->expert_copies_all && o->expert_cache > 0 && !o->no_expert_stream) {
        fprintf(stderr, "%s: --expert-cache keeps the experts that used-expert copies bring; it "
                "does not go with --expert-copies all\n", run_cmd);
        return 2;
    }
    if (o->expert_prefetch == 1 && (o->expert_cache == 0 || o->expert_copies_all)) {
        fprintf(stderr, "%s: --expert-prefetch on loads predicted experts into the expert cache: "
                "give --expert-cache N (and not --expert-copies all)\n", run_cmd);
        return 2;
    }
    return -1;
}

/* Whether two output paths name one regular file: the same text, or an existing file under two
 * names (a link, "./x" and "x"). Streams such as /dev/null may take both. */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0)
        return strcmp(a, b) == 0;
    return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The options fit together and the --dot file can be written (it is opened here, before the
 * model runs, so that a path that cannot be written fails at once). -1 to go on, else the exit
 * status after a message. */
int run_check_opts(struct run_opts *o)
{
    if (o->save_gguf != NULL && o->gguf_path == NULL && o->run_only != NULL) {
        fprintf(stderr, "%s: --save-gguf writes the model and exits: %s does not apply (it "
                "takes --model, --wtype and --seed)\n", run_cmd, o->run_only);
        return 2;
    }
    if (o->gguf_path != NULL && (o->save_gguf != NULL || o->wtype_given || o->model_given)) {
        fprintf(stderr, "%s: --gguf serves the file's model as it is: --%s does not apply\n",
                run_cmd, o->save_gguf != NULL ? "save-gguf" : o->wtype_given ? "wtype" : "model");
        return 2;
    }
    if (o->tokens_arg != NULL && o->prompt_given) {
        fprintf(stderr, "%s: --tokens is the prompt: -p does not apply\n", run_cmd);
        return 2;
    }
    if (o->gguf_path != NULL) {
        o->gguf = bp_gguf_open(o->gguf_path);
        enum bp_type wtype;
        if (o->gguf == NULL ||
            model_gguf_config(o->gguf, &o->file_cfg, o->file_name, sizeof(o->file_name), &wtype) !=
                BP_OK) {
            fprintf(stderr, "%s: %s: %s\n", run_cmd, tool_text(o->gguf_path),
                    tool_text(bp_last_error()));
            return 1;
        }
        o->cfg = &o->file_cfg;
        o->wtype = wtype;
    }
    if (o->n_ctx > 0 || o->kv_type != NULL) {
        if (o->cfg != &o->file_cfg) {
            o->file_cfg = *o->cfg;
            o->cfg = &o->file_cfg;
        }
        if (o->n_ctx > 0)
            o->file_cfg.n_ctx = o->n_ctx;
        if (o->kv_type != NULL)
            bp_type_from_name(o->kv_type, &o->file_cfg.kv_type); /* checked: kv_type_name */
    }
    if (o->cfg->kv_type != BP_TYPE_F16 && (o->cfg->n_embd / o->cfg->n_head) % 32 != 0) {
        fprintf(stderr, "%s: --kv-type %s needs heads of a multiple of 32 values; '%s' has "
                "%d\n", run_cmd, bp_type_name(o->cfg->kv_type), tool_text(o->cfg->name),
                o->cfg->n_embd / o->cfg->n_head);
        return 2;
    }
    const int experts = check_expert_opts(o);
    if (experts >= 0)
        return experts;
    if (o->cfg->kv_type != BP_TYPE_F16 && o->flash_attn == 0) {
        fprintf(stderr, "%s: --kv-type %s needs --flash-attn on or auto\n", run_cmd,
                bp_type_name(o->cfg->kv_type));
        return 2;
    }
    if (o->tokens_arg != NULL && (o->n_tokens = parse_tokens(o)) < 0)
        return 2;
    /* Both are in 1..INT_MAX here, so the test is written without a sum that could overflow:
     * -p + -n - 1 <= n_ctx. */
    const int n_ctx = o->cfg->n_ctx;
    if (o->n_prompt > n_ctx || o->n_gen > n_ctx - o->n_prompt + 1) {
        fprintf(stderr, "%s: -p %d and -n %d do not fit the context of '%s': -p + -n - 1 must be "
                "at most %d\n", run_cmd, o->n_prompt, o->n_gen, tool_text(o->cfg->name), n_ctx);
        return 2;
    }
    if (o->dot != NULL && o->n_gen < 2) {
        fprintf(stderr, "%s: --dot writes the graph of a generation step: it needs -n 2 or more\n",
                run_cmd);
        return 2;
    }
    if (o->dot != NULL && o->logits_path != NULL && same_file(o->dot, o->logits_path)) {
        fprintf(stderr, "%s: --dot and --logits name the same file '%s': one would overwrite "
                "the other\n", run_cmd, tool_text(o->logits_path));
        return 2;
    }
    if (o->dot != NULL && (o->dot_file = tool_open_output(run_cmd, "--dot", o->dot)) == NULL)
        return 1;
    return -1;
}
