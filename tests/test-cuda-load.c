/* test-cuda-load.c - the CUDA plugin on any machine it is built on, GPU or not: it loads
 * cleanly without mapping any CUDA library, reports why it has no devices when there is no GPU,
 * loads its implementation library (cudart, cuBLAS, NCCL) only when asked, and an
 * implementation library that is missing, unsafe, or whose CUDA library cannot be found is
 * reported with a sentence naming the file and the dynamic loader's message.
 * (The GPU itself is tested by test-cuda.c, which skips without one.) */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <backplane/bp-plugin.h>

#include "test-util.h"

static char cuda_so[4096], impl_so[4096];

static void find_plugin(void)
{
    snprintf(cuda_so, sizeof(cuda_so), "%s/backplane-cuda.so", getenv("BP_TEST_CUDA_PLUGIN_DIR"));
    snprintf(impl_so, sizeof(impl_so), "%s/libbackplane-cuda-impl.so",
             getenv("BP_TEST_CUDA_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
}

/* Whether a library whose file name starts with prefix is mapped into this process. */
static bool mapped(const char *prefix)
{
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        const char *slash = strrchr(line, '/');
        found = slash != NULL && strncmp(slash + 1, prefix, strlen(prefix)) == 0;
    }
    fclose(f);
    return found;
}

/* How many of this process's descriptors are open on the file at path. */
static int open_descriptors_of(const char *path)
{
    struct stat want;
    ck_assert_int_eq(stat(path, &want), 0);
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
            n++;
    }
    return n;
}

typedef enum bp_status (*load_runtime_fn)(void);

static load_runtime_fn load_runtime_of(bp_registry *reg)
{
    void *p = bp_registry_get_proc_address(reg, "bp_cuda_load_runtime");
    ck_assert_ptr_nonnull(p);
    load_runtime_fn fn;
    memcpy(&fn, &p, sizeof(fn));
    return fn;
}

static char *read_file(const char *path, long *size)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc((size_t)*size);
    ck_assert_ptr_nonnull(bytes);
    ck_assert_int_eq(fread(bytes, 1, (size_t)*size, f), (size_t)*size);
    fclose(f);
    return bytes;
}

static void write_file(const char *dir, const char *name, const char *bytes, long size, int mode)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0700);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, bytes, (size_t)size), size);
    ck_assert_int_eq(fchmod(fd, (mode_t)mode), 0);
    close(fd);
}

static void remove_dir(const char *dir)
{
    char path[4200];
    static const char *const names[] = {"backplane-cuda.so", "libbackplane-cuda-impl.so"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* A directory with a copy of the plugin and, when impl is not NULL, of an implementation
 * library (with the given mode); the plugin loaded from there; returns its registry. */
static bp_registry *plugin_beside(char *dir, const char *impl, long impl_size, int impl_mode)
{
    ck_assert_ptr_nonnull(mkdtemp(dir));
    long size;
    char *plugin = read_file(cuda_so, &size);
    write_file(dir, "backplane-cuda.so", plugin, size, 0755);
    free(plugin);
    if (impl != NULL)
        write_file(dir, "libbackplane-cuda-impl.so", impl, impl_size, impl_mode);
    char path[4200];
    snprintf(path, sizeof(path), "%s/backplane-cuda.so", dir);
    ck_assert_msg(bp_plugin_load(path) != NULL, "the copied plugin did not load: %s",
                  bp_last_error());
    bp_registry *reg = bp_registry_by_name("CUDA");
    ck_assert_ptr_nonnull(reg);
    return reg;
}

START_TEST(test_loads_and_reports)
{
    find_plugin();
    bp_plugin *p = bp_plugin_load(cuda_so);
    ck_assert_msg(p != NULL, "the CUDA plugin did not load: %s", bp_last_error());
    bp_registry *reg = bp_registry_by_name("cuda");
    ck_assert_ptr_nonnull(reg);
    const size_t n = bp_registry_get_device_count(reg);
    const struct bp_plugin_record *rec = NULL;
    for (size_t i = 0; i < bp_plugin_report_count(); i++)
        if (strstr(bp_plugin_report_get(i)->path, "backplane-cuda.so") != NULL)
            rec = bp_plugin_report_get(i);
    ck_assert_ptr_nonnull(rec);
    ck_assert_int_eq(rec->status, BP_PLUGIN_LOADED);
    printf("CUDA plugin: %s\n", rec->message);
    if (n == 0) {
        /* The reason is in the report, and asking for a device says which exist. */
        ck_assert_msg(strstr(rec->message, "0 devices: ") != NULL, "no reason given: %s",
                      rec->message);
        ck_assert_ptr_null(bp_backend_init_by_name("CUDA0", NULL));
        ck_assert_int_eq(bp_last_status(), BP_ERR_NOT_FOUND);
    } else {
        bp_device *d = bp_registry_get_device(reg, 0);
        ck_assert_str_eq(bp_device_get_name(d), "CUDA0");
        ck_assert_int_eq(bp_device_get_type(d), BP_DEVICE_TYPE_GPU);
    }
    /* Collectives are offered (NCCL builds) or not at all: never half. */
    void *ci = bp_registry_get_proc_address(reg, "bp_comm_init");
    void *ca = bp_registry_get_proc_address(reg, "bp_comm_allreduce");
    void *cf = bp_registry_get_proc_address(reg, "bp_comm_free");
    ck_assert((ci && ca && cf) || (!ci && !ca && !cf));
}
END_TEST

/* Discovery maps no CUDA library; they come with the implementation library, on request. */
START_TEST(test_runtime_loaded_on_demand)
{
    find_plugin();
    ck_assert_msg(bp_plugin_load(cuda_so) != NULL, "%s", bp_last_error());
    bp_registry *reg = bp_registry_by_name("CUDA");
    ck_assert_ptr_nonnull(reg);
    if (bp_registry_get_device_count(reg) == 0) {
        ck_assert(!mapped("libcudart.so"));
        ck_assert(!mapped("libcublas"));
        ck_assert(!mapped("libnccl"));
        ck_assert(!mapped("libbackplane-cuda-impl"));
    }
    ck_assert_msg(load_runtime_of(reg)() == BP_OK, "%s", bp_last_error());
    ck_assert(mapped("libbackplane-cuda-impl"));
    ck_assert(mapped("libcudart.so"));
    ck_assert(mapped("libcublas"));
    ck_assert_int_eq(load_runtime_of(reg)(), BP_OK); /* once is enough; again is a no-op */
    ck_assert_int_eq(open_descriptors_of(impl_so), 1); /* held for the mapping */

    /* The plugin unloaded and loaded again finds the library still mapped (it is never
     * unloaded) and uses it, without holding a second descriptor. */
    ck_assert_int_eq(bp_plugin_unload(bp_plugin_by_name("cuda")), BP_OK);
    ck_assert_msg(bp_plugin_load(cuda_so) != NULL, "%s", bp_last_error());
    reg = bp_registry_by_name("CUDA");
    ck_assert_ptr_nonnull(reg);
    ck_assert_msg(load_runtime_of(reg)() == BP_OK, "%s", bp_last_error());
    ck_assert_int_eq(open_descriptors_of(impl_so), 1);
}
END_TEST

START_TEST(test_runtime_missing)
{
    find_plugin();
    char dir[] = "/tmp/bp-cuda-noimpl-XXXXXX";
    bp_registry *reg = plugin_beside(dir, NULL, 0, 0);
    ck_assert_int_eq(load_runtime_of(reg)(), BP_ERR_PLUGIN);
    /* The plugin looked beside itself (bp_plugin_init_dir during its init), and only there. */
    ck_assert_msg(strstr(bp_last_error(), dir) != NULL &&
                      strstr(bp_last_error(), "libbackplane-cuda-impl.so") != NULL &&
                      strstr(bp_last_error(), "No such file") != NULL,
                  "%s", bp_last_error());
    ck_assert_ptr_null(bp_plugin_init_dir()); /* only while an init runs */
    remove_dir(dir);
}
END_TEST

START_TEST(test_runtime_unsafe)
{
    find_plugin();
    long size;
    char *impl = read_file(impl_so, &size);
    char dir[] = "/tmp/bp-cuda-unsafe-XXXXXX";
    bp_registry *reg = plugin_beside(dir, impl, size, 0777);
    ck_assert_int_eq(load_runtime_of(reg)(), BP_ERR_PLUGIN);
    ck_assert_msg(strstr(bp_last_error(), "writable by group or others") != NULL, "%s",
                  bp_last_error());
    ck_assert(!mapped("libcudart.so"));
    free(impl);
    remove_dir(dir);
}
END_TEST

START_TEST(test_runtime_not_ours)
{
    /* A shared object of the right name that is something else: the plugin's own file. */
    find_plugin();
    long size;
    char *other = read_file(cuda_so, &size);
    char dir[] = "/tmp/bp-cuda-other-XXXXXX";
    bp_registry *reg = plugin_beside(dir, other, size, 0755);
    ck_assert_int_eq(load_runtime_of(reg)(), BP_ERR_PLUGIN);
    ck_assert_msg(strstr(bp_last_error(), "bp_cuda_impl_open") != NULL, "%s", bp_last_error());
    free(other);
    remove_dir(dir);
}
END_TEST

/* Copies the implementation library with one of its DT_NEEDED names changed to a library that
 * does not exist (same length, so the ELF stays valid), as on a machine with the plugin but
 * without CUDA: the plugin still loads, and asking for the runtime names the missing library. */
START_TEST(test_missing_cuda_library)
{
    find_plugin();
    long size;
    char *bytes = read_file(impl_so, &size);
    static const char *const libs[] = {"libcublas.so.", "libcudart.so."};
    const char *changed = NULL;
    for (int l = 0; l < 2 && changed == NULL; l++) {
        const size_t len = strlen(libs[l]);
        for (long i = 0; i + (long)len + 2 < size; i++) {
            if (memcmp(bytes + i, libs[l], len) == 0 && bytes[i + len] >= '0' &&
                bytes[i + len] <= '9' && bytes[i + len + 1] >= '0' && bytes[i + len + 1] <= '9' &&
                bytes[i + len + 2] == '\0') {
                bytes[i + len] = '9'; /* libcublas.so.13 -> libcublas.so.93 */
                changed = libs[l];
                break;
            }
        }
    }
    ck_assert_msg(changed != NULL, "no CUDA library name found in %s", impl_so);
    char dir[] = "/tmp/bp-cuda-missing-XXXXXX";
    bp_registry *reg = plugin_beside(dir, bytes, size, 0755);
    free(bytes);
    bp_clear_error();
    ck_assert_int_eq(load_runtime_of(reg)(), BP_ERR_PLUGIN);
    ck_assert_msg(strstr(bp_last_error(), changed) != NULL && strstr(bp_last_error(), ".so.9") &&
                      strstr(bp_last_error(), "libbackplane-cuda-impl.so") != NULL,
                  "the error does not name the missing library: %s", bp_last_error());
    /* Every later request says the same, and nothing else broke. */
    ck_assert_int_eq(load_runtime_of(reg)(), BP_ERR_PLUGIN);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), changed));
    remove_dir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda-load");
    BP_TCASE(s, test_loads_and_reports, 60);
    BP_TCASE(s, test_runtime_loaded_on_demand, 60);
    BP_TCASE(s, test_runtime_missing, 60);
    BP_TCASE(s, test_runtime_unsafe, 60);
    BP_TCASE(s, test_runtime_not_ours, 60);
    BP_TCASE(s, test_missing_cuda_library, 60);
    return bp_test_run(s);
}
