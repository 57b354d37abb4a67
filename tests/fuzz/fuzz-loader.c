/* fuzz-loader.c - libFuzzer target for everything a hostile or broken environment hands the
 * loader and the name lookups. The first byte picks the mode:
 *   even: the rest is a plugin file (corrupted and truncated shared objects, from a seed corpus
 *         made of real plugins), written as backplane-fuzz.so in a private directory and loaded
 *         with BP_PLUGIN_PROBE=1, so that a file that crashes the dynamic linker is refused
 *         instead of killing the process;
 *   odd:  the rest is a name: a path (with "..", very long, not UTF-8) for bp_plugin_load, a
 *         device, registry, "Meta(...)" or backend-parameter string for the lookups.
 * Any crash, leak or error without a message is a finding. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <backplane/backplane.h>

static char dir[] = "/tmp/bp-fuzz-loader-XXXXXX";
static char file[sizeof(dir) + 32];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (mkdtemp(dir) == NULL)
        abort();
    snprintf(file, sizeof(file), "%s/backplane-fuzz.so", dir);
    setenv("BP_PLUGIN_PROBE", "1", 1);
    setenv("BP_PLUGIN_PROBE_CACHE", "/dev/null", 1); /* probe every input afresh */
    bp_log_set_level(BP_LOG_NONE);
    const char *cpu = getenv("BP_FUZZ_CPU_DIR");
    if (cpu != NULL) /* real devices for the lookups to find */
        bp_plugin_load_all_from(cpu);
    return 0;
}

static void expect_message(void)
{
    if (bp_last_status() != BP_OK && bp_last_error()[0] == '\0')
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] % 2 == 0) {
        FILE *f = fopen(file, "wb");
        if (f == NULL)
            abort();
        fwrite(data + 1, 1, size - 1, f);
        fclose(f);
        chmod(file, 0755);
        bp_clear_error();
        bp_plugin *p = bp_plugin_load(file);
        if (p == NULL)
            expect_message();
        else if (bp_plugin_unload(p) != BP_OK)
            expect_message();
        unlink(file);
        return 0;
    }
    char *s = malloc(size);
    memcpy(s, data + 1, size - 1);
    s[size - 1] = '\0';
    bp_clear_error();
    if (bp_plugin_load(s) == NULL)
        expect_message();
    bp_backend *be = bp_backend_init_by_name(s, NULL);
    if (be == NULL)
        expect_message();
    bp_backend_free(be);
    be = bp_backend_init_by_name("CPU", s); /* as backend parameters */
    if (be == NULL)
        expect_message();
    bp_backend_free(be);
    bp_device_by_name(s);
    bp_registry_by_name(s);
    enum bp_type t;
    bp_type_from_name(s, &t);
    free(s);
    return 0;
}
