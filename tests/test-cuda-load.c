/* test-cuda-load.c - the CUDA plugin on any machine it is built on, GPU or not: it loads
 * cleanly, reports why it has no devices when there is no GPU, and a copy whose CUDA library
 * cannot be found is reported with the dynamic loader's message while other plugins still load.
 * (The GPU itself is tested by test-cuda.c, which skips without one.) */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test-util.h"

static char cuda_so[4096];

static void find_plugin(void)
{
    snprintf(cuda_so, sizeof(cuda_so), "%s/backplane-cuda.so", getenv("BP_TEST_CUDA_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
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

/* Copies the plugin with one of its DT_NEEDED names changed to a library that does not exist
 * (same length, so the ELF stays valid), as on a machine with the plugin but without CUDA. */
START_TEST(test_missing_cuda_library)
{
    find_plugin();
    FILE *f = fopen(cuda_so, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *bytes = malloc((size_t)size);
    ck_assert_int_eq(fread(bytes, 1, (size_t)size, f), (size_t)size);
    fclose(f);
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
    ck_assert_msg(changed != NULL, "no CUDA library name found in %s", cuda_so);
    char dir[] = "/tmp/bp-cuda-missing-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[4200];
    snprintf(path, sizeof(path), "%s/backplane-cuda.so", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, bytes, (size_t)size), size);
    close(fd);
    free(bytes);

    bp_clear_error();
    ck_assert_ptr_null(bp_plugin_load(path));
    ck_assert_msg(strstr(bp_last_error(), changed) != NULL && strstr(bp_last_error(), ".so.9"),
                  "the error does not name the missing library: %s", bp_last_error());
    /* Discovery over the same directory goes on to the CPU plugin. */
    char search[8400];
    snprintf(search, sizeof(search), "%s:%s", dir, getenv("BP_TEST_CPU_PLUGIN_DIR"));
    setenv("BP_PLUGIN_PATH", search, 1);
    ck_assert_int_eq(bp_plugin_load_all(), BP_OK);
    ck_assert_ptr_nonnull(bp_device_by_name("CPU"));
    ck_assert_ptr_null(bp_registry_by_name("CUDA"));
    unlink(path);
    rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda-load");
    BP_TCASE(s, test_loads_and_reports, 60);
    BP_TCASE(s, test_missing_cuda_library, 60);
    return bp_test_run(s);
}
