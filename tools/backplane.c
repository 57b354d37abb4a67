/* backplane.c - the `backplane` command-line tool: version, list (grown by later features). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: backplane <command>\n"
               "\n"
               "commands:\n"
               "  version   print the library version\n"
               "  list      list the types, ops and plugin directories the runtime knows\n"
               "  help      print this message\n");
}

static int cmd_version(void)
{
    printf("backplane %s (library %s, built against %s)\n", BP_VERSION_STRING, bp_version(),
           BP_VERSION_STRING);
    return bp_version_hex() == BP_VERSION_HEX ? 0 : 1;
}

static int cmd_list(void)
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

    /* The loader (a later part) searches BP_PLUGIN_PATH first, then the configured directory. */
    printf("plugin search path:\n");
    const char *env = getenv("BP_PLUGIN_PATH");
    if (env != NULL && env[0] != '\0')
        printf("  %s (BP_PLUGIN_PATH)\n", env);
    printf("  %s (configured)\n", bp_default_plugin_dir());
    printf("devices: none (the plugin loader is not part of this build yet)\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0)
        return cmd_version();
    if (strcmp(argv[1], "list") == 0)
        return cmd_list();
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "backplane: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
