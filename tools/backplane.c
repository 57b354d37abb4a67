/* backplane.c - the `backplane` command-line tool.
 *
 *   backplane version         library version
 *   backplane list [--json]   every plugin file considered and why, and every device
 *   backplane ops             the types and ops the runtime knows
 *   backplane run [...]       serve a transformer on chosen devices (run.c)
 *   backplane bench [...]     matmul and element-wise benchmarks on chosen devices (bench.c)
 *   backplane conformance     every op case on chosen devices against the reference
 *                             (conformance.c)
 */
#include "config.h"

#include <errno.h>
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
               "  run [options]  serve a transformer (tiny, small or base) on chosen devices:\n"
               "                 a prompt, then greedy generation (backplane run --help)\n"
               "  bench [opts]   matmul and element-wise throughput on chosen devices (-d LIST,\n"
               "                 --types, --M, --K, --N, -t, --min-time) beside the machine's\n"
               "                 FMA peak and triad bandwidth; --types q4_0_repack or\n"
               "                 q8_0_repack puts the weights in the CPU's CPU_REPACK buffer type\n"
               "  conformance [DEVICE...] [--ops LIST] [--json]\n"
               "                 run every op case (op, type, shape) on the devices and compare\n"
               "                 with the reference implementation (backplane conformance --help)\n"
               "  help           print this message\n"
               "\n"
               "environment: BP_PLUGIN_PATH, BP_PLUGINS_ONLY, BP_PLUGINS_DISABLE, BP_CPU_DISABLE,\n"
               "BP_LOG_LEVEL (see README.md)\n");
}

static int cmd_version(void)
{
    printf("backplane %s (library %s)\n", BP_VERSION_STRING, bp_version());
    return bp_version_hex() == BP_VERSION_HEX ? 0 : 1;
}

static int cmd_ops(void)
{
    printf("types:\n");
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        const struct bp_type_traits *tr = bp_type_get_traits((enum bp_type)t);
        printf("  %-5s block %2lld  %2zu bytes/block%s\n", tr->name, (long long)tr->block_size,
               tr->type_size, tr->is_quantized ? "  quantised" : "");
    }
    printf("ops:\n ");
    for (int op = 0; op < BP_OP_COUNT; op++)
        printf(" %s", bp_op_name((enum bp_op)op));
    printf("\nunary ops:\n ");
    for (int op = 0; op < BP_UNARY_OP_COUNT; op++)
        printf(" %s", bp_unary_op_name((enum bp_unary_op)op));
    printf("\n");
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
        printf(", score %s: %s\n", score, r->message);
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
               bp_registry_get_name(bp_device_get_registry(bp_device_get(i))));
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
        json_end_object(&w);
    }
    json_end_array(&w);
    json_end_object(&w);
    json_finish(&w);
}

static int cmd_list(int argc, char **argv)
{
    bool json = false;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            fprintf(stderr, "backplane list: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    bp_plugin_load_all();
    if (json)
        list_json();
    else
        list_text();
    return 0;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0)
        return cmd_version();
    if (strcmp(argv[1], "list") == 0)
        return cmd_list(argc, argv);
    if (strcmp(argv[1], "ops") == 0)
        return cmd_ops();
    if (strcmp(argv[1], "run") == 0)
        return cmd_run(argc - 2, argv + 2);
    if (strcmp(argv[1], "bench") == 0)
        return cmd_bench(argc - 2, argv + 2);
    if (strcmp(argv[1], "conformance") == 0)
        return cmd_conformance(argc - 2, argv + 2);
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "backplane: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
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
