/* backplane.c - the `backplane` command-line tool.
 *
 *   backplane version         library version
 *   backplane list [--json]   every plugin file considered and why, and every device
 *   backplane ops             the types and ops the runtime knows
 *   backplane run [...]       serve a transformer on chosen devices (run.c)
 *   backplane bench [...]     matmul and element-wise benchmarks on chosen devices (bench.c)
 *   backplane conformance     every op case on chosen devices against the reference
 *                             (conformance.c)
 *   backplane quantize [...]  a GGUF model in another weight type or llama.cpp mix
 *                             (quantize.c)
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

#include "json.h"
#include "tool.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: backplane <command>\n"
               "\n"
               "commands:\n"
               "  version        print the library version\n"
               "  list [--json]  list every plugin considered (and why it did or did not load)\n"
               "                 and every device\n"
               "  ops            list the element types and ops the runtime knows\n"
               "  run [options]  serve a transformer (tiny, small, base, moe, or a GGUF file) on\n"
               "                 chosen devices: a prompt, then greedy generation\n"
               "                 (backplane run --help)\n"
               "  bench [opts]   matmul and element-wise throughput on chosen devices (-d LIST,\n"
               "                 --types, --M, --K, --N, -t, --min-time) beside the machine's\n"
               "                 FMA peak and triad bandwidth; --types q4_0_repack (or\n"
               "                 q4_k_repack, any type with _repack) puts the weights in the\n"
               "                 CPU's CPU_REPACK buffer type\n"
               "                 (backplane bench --help)\n"
               "  conformance [DEVICE...] [--ops LIST] [--json]\n"
               "                 run every op case (op, type, shape) on the devices and compare\n"
               "                 with the reference implementation\n"
               "                 (backplane conformance --help)\n"
               "  quantize [options] IN.gguf OUT.gguf TYPE\n"
               "                 write a GGUF model again in another weight type or one of\n"
               "                 llama.cpp's mixes (Q4_K_M...) (backplane quantize --help)\n"
               "  help           print this message\n"
               "\n"
               "Every command takes -h or --help. What a command does not understand (an unknown\n"
               "option, an extra argument, an empty or repeated list entry) stops it with exit\n"
               "status 2 and its usage line on stderr.\n"
               "\n"
               "environment: BP_PLUGIN_PATH, BP_PLUGINS_ONLY, BP_PLUGINS_DISABLE,\n"
               "BP_CPU_DISABLE, BP_LOG_LEVEL and others (backplane(1), README.md)\n");
}

/* For the commands that take no arguments: -1 to go on, else the exit status (0 after -h). */
static int no_args(const char *cmd, const char *synopsis, int argc, char **argv)
{
    if (argc == 0)
        return -1;
    if (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
        printf("usage: %s\n", synopsis); /* (what follows is not read, as in every command) */
        return 0;
    }
    return tool_bad_arg(cmd, argv[0]);
}

static int cmd_version(int argc, char **argv)
{
    const int st = no_args("backplane version", "backplane version", argc, argv);
    if (st >= 0)
        return st;
    printf("backplane %s (library %s)\n", BP_VERSION_STRING, bp_version());
    return bp_version_hex() == BP_VERSION_HEX ? 0 : 1;
}

/* Whether dev multiplies weights of type t: supports_op on MUL_MAT of a 256 x 8 matrix of t by
 * one f32 column (rows of 256 fit every type's blocks). */
static bool multiplies(bp_device *dev, bp_context *ctx, enum bp_type t)
{
    bp_tensor *w = bp_new_tensor_2d(ctx, t, 256, 8);
    bp_tensor *x = bp_new_tensor_2d(ctx, BP_TYPE_F32, 256, 1);
    bp_tensor *mm = w != NULL && x != NULL ? bp_mul_mat(ctx, w, x) : NULL;
    return mm != NULL && bp_device_supports_op(dev, mm);
}

/* The weight types dev multiplies (every type but i32 asked), into ok[t]. */
static void mul_mat_types(bp_device *dev, bool ok[BP_TYPE_COUNT])
{
    bp_context *ctx = bp_context_new(4);
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        ok[t] = false;
        if (ctx == NULL || t == BP_TYPE_I32)
            continue;
        ok[t] = multiplies(dev, ctx, (enum bp_type)t);
        bp_context_reset(ctx);
    }
    bp_context_free(ctx);
}

/* "  mul_mat: f32 f16 ..." for a device of the listings. */
static void print_mul_mat_types(bp_device *dev, const char *indent)
{
    bool ok[BP_TYPE_COUNT];
    mul_mat_types(dev, ok);
    printf("%smul_mat:", indent);
    for (int t = 0; t < BP_TYPE_COUNT; t++)
        if (ok[t])
            printf(" %s", bp_type_name((enum bp_type)t));
    printf("\n");
}

static int cmd_ops(int argc, char **argv)
{
    const int st = no_args("backplane ops", "backplane ops", argc, argv);
    if (st >= 0)
        return st;
    printf("types:\n");
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        const struct bp_type_traits *tr = bp_type_get_traits((enum bp_type)t);
        printf("  %-6s block %3lld  %3zu bytes/block%s\n", tr->name, (long long)tr->block_size,
               tr->type_size, tr->is_quantized ? "  quantised" : "");
    }
    printf("ops:\n ");
    for (int op = 0; op < BP_OP_COUNT; op++)
        printf(" %s", bp_op_name((enum bp_op)op));
    printf("\nunary ops:\n ");
    for (int op = 0; op < BP_UNARY_OP_COUNT; op++)
        printf(" %s", bp_unary_op_name((enum bp_unary_op)op));
    printf("\nweight types each device multiplies (MUL_MAT):\n");
    bp_plugin_load_all();
    for (size_t i = 0; i < bp_device_count(); i++) {
        printf("  ");
        tool_put_text(bp_device_get_name(bp_device_get(i)), stdout);
        print_mul_mat_types(bp_device_get(i), "\n    ");
    }
    return 0;
}

static void caps_string(const struct bp_device_caps *c, char *out, size_t n)
{
    snprintf(out, n, "%s%s%s%s", c->async ? "async " : "", c->host_buffer ? "host-buffer " : "",
             c->buffer_from_host_ptr ? "host-ptr " : "", c->events ? "events " : "");
    size_t len = strlen(out);
    if (len > 0)
        out[len - 1] = '\0';
    else
        snprintf(out, n, "-");
}

static void list_text(void)
{
    const char *env = getenv("BP_PLUGIN_PATH");
    printf("plugin search path:\n");
    if (env != NULL && env[0] != '\0') {
        printf("  ");
        tool_put_text(env, stdout);
        printf(" (BP_PLUGIN_PATH)\n");
    }
    const char *sys = getenv("BP_PLUGIN_SYSTEM_PATH");
    printf("  ");
    tool_put_text(sys ? (sys[0] ? sys : "(none)") : bp_default_plugin_dir(), stdout);
    printf(" (%s)\n", sys ? "BP_PLUGIN_SYSTEM_PATH" : "configured");

    size_t nr = bp_plugin_report_count();
    printf("\nplugins considered: %zu\n", nr);
    for (size_t i = 0; i < nr; i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        char score[16] = "-";
        if (r->score >= 0)
            snprintf(score, sizeof(score), "%d", r->score);
        printf("  %-16s ", bp_plugin_status_name(r->status));
        tool_put_text(r->path, stdout);
        printf("\n  %-16s name ", "");
        tool_put_text(r->name[0] ? r->name : "-", stdout);
        printf("%s", r->variant[0] ? ", variant " : "");
        tool_put_text(r->variant, stdout);
        printf(", score %s: %s\n", score, tool_text(r->message));
    }

    size_t nd = bp_device_count();
    printf("\ndevices: %zu\n", nd);
    for (size_t i = 0; i < nd; i++) {
        struct bp_device_props p;
        bp_device_get_props(bp_device_get(i), &p);
        char caps[64];
        caps_string(&p.caps, caps, sizeof(caps));
        printf("  ");
        tool_put_text(p.name, stdout);
        printf("%*s %-5s ", (int)(strlen(p.name) < 10 ? 10 - strlen(p.name) : 0), "",
               bp_device_type_name(p.type));
        tool_put_text(p.description, stdout);
        printf("\n");
        printf("  %-10s memory %.1f of %.1f MiB free, caps: %s, registry %s\n", "",
               (double)p.memory_free / (1 << 20), (double)p.memory_total / (1 << 20), caps,
               tool_text(bp_registry_get_name(bp_device_get_registry(bp_device_get(i)))));
        print_mul_mat_types(bp_device_get(i), "             ");
    }
}

static void list_json(void)
{
    struct json_writer w;
    json_init(&w, stdout, 2);
    json_begin_object(&w);
    json_member_string(&w, "version", bp_version());
    json_key(&w, "plugins");
    json_begin_array(&w);
    const size_t nr = bp_plugin_report_count();
    for (size_t i = 0; i < nr; i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        json_begin_object(&w);
        json_member_string(&w, "path", r->path);
        json_member_string(&w, "name", r->name);
        json_member_string(&w, "variant", r->variant);
        json_member_int(&w, "score", r->score);
        json_member_string(&w, "status", bp_plugin_status_name(r->status));
        json_member_string(&w, "message", r->message);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_key(&w, "devices");
    json_begin_array(&w);
    const size_t nd = bp_device_count();
    for (size_t i = 0; i < nd; i++) {
        struct bp_device_props p;
        bp_device *d = bp_device_get(i);
        bp_device_get_props(d, &p);
        json_begin_object(&w);
        json_member_string(&w, "name", p.name);
        json_member_string(&w, "description", p.description);
        json_member_string(&w, "type", bp_device_type_name(p.type));
        json_member_string(&w, "registry", bp_registry_get_name(bp_device_get_registry(d)));
        json_member_uint(&w, "memory_free", p.memory_free);
        json_member_uint(&w, "memory_total", p.memory_total);
        json_key(&w, "caps");
        json_begin_object(&w);
        json_member_bool(&w, "async", p.caps.async);
        json_member_bool(&w, "host_buffer", p.caps.host_buffer);
        json_member_bool(&w, "buffer_from_host_ptr", p.caps.buffer_from_host_ptr);
        json_member_bool(&w, "events", p.caps.events);
        json_end_object(&w);
        bool ok[BP_TYPE_COUNT];
        mul_mat_types(d, ok);
        json_key(&w, "mul_mat_types");
        json_begin_array(&w);
        for (int t = 0; t < BP_TYPE_COUNT; t++)
            if (ok[t])
                json_string(&w, bp_type_name((enum bp_type)t));
        json_end_array(&w);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_end_object(&w);
    json_finish(&w);
}

static int cmd_list(int argc, char **argv)
{
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: backplane list [--json]\n");
            return 0;
        } else {
            return tool_bad_arg("backplane list", argv[i]);
        }
    }
    bp_plugin_load_all();
    if (json)
        list_json();
    else
        list_text();
    return 0;
}

static int cmd_help(int argc, char **argv)
{
    const int st = no_args("backplane help", "backplane help", argc, argv);
    if (st >= 0)
        return st;
    usage(stdout);
    return 0;
}

/* Every command, with the usage line printed on stderr when it refuses its arguments (exit
 * status 2): the command's own message says what it did not understand. */
static const struct command {
    const char *name, *alias;
    int (*fn)(int argc, char **argv); /* the arguments after the command's name */
    const char *synopsis;
} commands[] = {
    {"version", "--version", cmd_version, "backplane version"},
    {"list", NULL, cmd_list, "backplane list [--json]"},
    {"ops", NULL, cmd_ops, "backplane ops"},
    {"run", NULL, cmd_run, "backplane run [OPTIONS] (backplane run --help lists them)"},
    {"bench", NULL, cmd_bench,
     "backplane bench [-d DEVICES] [--types LIST] [--M N] [--K N] [--N LIST] [-t N]\n"
     "                       [--min-time SECONDS] [--no-limits] (backplane bench --help)"},
    {"conformance", NULL, cmd_conformance,
     "backplane conformance [DEVICE...] [--ops LIST] [-t N] [--json] [--list]\n"
     "                       (backplane conformance --help)"},
    {"quantize", NULL, cmd_quantize,
     "backplane quantize [--imatrix FILE] [--pure] [--dry-run] [-t N] IN.gguf OUT.gguf TYPE\n"
     "                       (backplane quantize --help)"},
    {"help", "--help", cmd_help, "backplane help"},
};

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const struct command *c = &commands[i];
        if (strcmp(argv[1], c->name) != 0 && (c->alias == NULL || strcmp(argv[1], c->alias) != 0))
            continue;
        const int status = c->fn(argc - 2, argv + 2);
        if (status == 2)
            fprintf(stderr, "usage: %s\n", c->synopsis);
        return status;
    }
    fprintf(stderr, "backplane: unknown command '%s'\n", tool_text(argv[1]));
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    /* A file size limit (ulimit -f) makes a write fail with EFBIG, reported with exit 1 and the
     * old file kept by --save-gguf, instead of killing the tool with SIGXFSZ half-way (and
     * leaving the temporary file behind). */
    signal(SIGXFSZ, SIG_IGN);
    int status = dispatch(argc, argv);
    /* Output that did not reach its file (a full disk, a closed pipe) is a failure too: a
     * script must not take a truncated listing or JSON document for the whole. */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "backplane: cannot write the output%s%s\n", errno ? ": " : "",
                errno ? strerror(errno) : "");
        if (status == 0)
            status = 1;
    }
    return status;
}
