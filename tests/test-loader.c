/* test-loader.c - plugin discovery, the refusal rules, variants and scores, CPU features,
 * filters, selection by name, explicit loading and safe unload, using the test plugins of
 * tests/plugins/ (see plugin.c). Each test runs in its own process (Check's fork mode), so each
 * sees discovery run once, with the environment it set up. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <backplane/bp-plugin.h>

#include "test-util.h"

static const char *plugin_dir(void)
{
    const char *d = getenv("BP_TEST_PLUGIN_DIR");
    ck_assert_msg(d != NULL, "BP_TEST_PLUGIN_DIR is not set (run through make check)");
    return d;
}

static void use_test_plugins(void)
{
    setenv("BP_PLUGIN_PATH", plugin_dir(), 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
}

/* The record whose path ends in file, NULL when there is none; fails on duplicates. */
static const struct bp_plugin_record *record_for(const char *file)
{
    const struct bp_plugin_record *found = NULL;
    size_t lf = strlen(file);
    for (size_t i = 0; i < bp_plugin_report_count(); i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        size_t lp = strlen(r->path);
        if (lp >= lf && strcmp(r->path + lp - lf, file) == 0 &&
            (lp == lf || r->path[lp - lf - 1] == '/')) {
            ck_assert_msg(found == NULL, "two records for %s", file);
            found = r;
        }
    }
    return found;
}

#define ck_assert_record(file, st, needle)                                                     \
    do {                                                                                       \
        const struct bp_plugin_record *r_ = record_for(file);                                  \
        ck_assert_msg(r_ != NULL, "no record for %s", file);                                   \
        ck_assert_msg(r_->status == (st), "%s: status '%s', expected '%s' (%s)", file,         \
                      bp_plugin_status_name(r_->status), bp_plugin_status_name(st),            \
                      r_->message);                                                            \
        ck_assert_msg(strstr(r_->message, (needle)) != NULL, "%s: message '%s' lacks '%s'",    \
                      file, r_->message, (needle));                                            \
    } while (0)

/* Whether the dynamic loader has the file mapped (without loading it). */
static bool is_mapped(const char *file)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", plugin_dir(), file);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h != NULL)
        dlclose(h);
    return h != NULL;
}

START_TEST(test_discovery_and_report)
{
    use_test_plugins();
    ck_assert_int_eq(bp_plugin_load_all(), BP_OK);
    bool avx2 = (bp_cpu_features() & (BP_CPU_AVX2 | BP_CPU_FMA)) == (BP_CPU_AVX2 | BP_CPU_FMA);
    bool amx_fp16 = (bp_cpu_features() & BP_CPU_AMX_FP16) != 0;

    ck_assert_record("backplane-good.so", BP_PLUGIN_LOADED, "registry 'Good' with 2 devices");
    ck_assert_int_eq(record_for("backplane-good.so")->score, 5);
    ck_assert_record("backplane-multi-b.so", BP_PLUGIN_LOADED, "registry 'Multi'");
    ck_assert_record("backplane-multi-a.so", BP_PLUGIN_NOT_SELECTED, "multi-b.so (score 30)");
    ck_assert_record("backplane-multi-c.so", BP_PLUGIN_NOT_SELECTED, "was chosen instead");
    ck_assert_int_eq(record_for("backplane-multi-c.so")->score, 20);
    ck_assert_record("backplane-badabi.so", BP_PLUGIN_FAILED, "plugin API 2.0");
    ck_assert_record("backplane-noentry.so", BP_PLUGIN_FAILED, "no entry point");
    ck_assert_record("backplane-initnull.so", BP_PLUGIN_FAILED,
                     "init returned no registry: initnull: no devices today");
    ck_assert_record("backplane-zero.so", BP_PLUGIN_CANNOT_RUN, "score is 0");
    ck_assert_record("backplane-needslib.so", BP_PLUGIN_FAILED, "libbpmissing.so");
    ck_assert_record("backplane-needslib.so", BP_PLUGIN_FAILED, "dlopen failed");
    ck_assert_record("backplane-zdupe.so", BP_PLUGIN_FAILED,
                     "registry name 'Good' is already provided");
    if (amx_fp16)
        ck_assert_record("backplane-cpufeat.so", BP_PLUGIN_LOADED, "CpuFeat");
    else
        ck_assert_record("backplane-cpufeat.so", BP_PLUGIN_CANNOT_RUN, "amx_fp16");
    if (avx2) {
        ck_assert_record("backplane-isa-avx2.so", BP_PLUGIN_LOADED, "Isa");
        ck_assert_record("backplane-isa-base.so", BP_PLUGIN_NOT_SELECTED, "isa-avx2.so");
    } else {
        ck_assert_record("backplane-isa-avx2.so", BP_PLUGIN_CANNOT_RUN, "avx2");
        ck_assert_record("backplane-isa-base.so", BP_PLUGIN_LOADED, "Isa");
    }

    /* Loaded: good, multi (variant b), isa, and cpufeat only where the CPU has amx_fp16. */
    ck_assert_uint_eq(bp_plugin_count(), 3 + amx_fp16);
    ck_assert_uint_eq(bp_registry_count(), 3 + amx_fp16);
    ck_assert_str_eq(bp_plugin_variant(bp_plugin_by_name("MULTI")), "b");
    ck_assert_str_eq(bp_plugin_variant(bp_plugin_by_name("isa")), avx2 ? "avx2" : "base");
    /* Refused and losing files are closed again. */
    ck_assert(is_mapped("backplane-good.so"));
    ck_assert(!is_mapped("backplane-multi-a.so"));
    ck_assert(!is_mapped("backplane-badabi.so"));
    ck_assert(!is_mapped("backplane-zero.so"));
    ck_assert(!is_mapped("backplane-zdupe.so"));
    /* Discovery ran once: asking again changes nothing. */
    size_t n = bp_plugin_report_count();
    ck_assert_int_eq(bp_plugin_load_all(), BP_OK);
    ck_assert_uint_eq(bp_plugin_report_count(), n);
}
END_TEST

START_TEST(test_cpu_disable_picks_lower_variant)
{
    use_test_plugins();
    setenv("BP_CPU_DISABLE", "avx2", 1);
    ck_assert_uint_eq(bp_cpu_features() & BP_CPU_AVX2, 0);
    bp_plugin_load_all();
    ck_assert_record("backplane-isa-avx2.so", BP_PLUGIN_CANNOT_RUN, "avx2");
    ck_assert_record("backplane-isa-base.so", BP_PLUGIN_LOADED, "Isa");
    ck_assert(!is_mapped("backplane-isa-avx2.so"));
}
END_TEST

/* The runtime never claims a feature the kernel does not report (that would let a variant run
 * an illegal instruction), and on real hardware the two agree feature by feature. Under
 * valgrind the CPU is valgrind's emulation, which lacks AVX-512: only the first half holds. */
START_TEST(test_cpu_features_match_kernel)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return; /* not Linux: nothing independent to compare with */
    char line[8192], flags[8192] = "";
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "flags", 5) == 0) {
            snprintf(flags, sizeof(flags), " %s ", strchr(line, ':') + 2);
            break;
        }
    }
    fclose(f);
    char *nl = strchr(flags, '\n');
    if (nl)
        *nl = ' ';
    uint64_t have = bp_cpu_features();
    const char *preload = getenv("LD_PRELOAD");
    bool under_valgrind = preload != NULL && strstr(preload, "vgpreload") != NULL;
    for (int bit = 0; bit < 16; bit++) {
        const char *name = bp_cpu_feature_name(1ull << bit);
        ck_assert_ptr_nonnull(name);
        char needle[64];
        snprintf(needle, sizeof(needle), " %s ", name);
        bool kernel = strstr(flags, needle) != NULL;
        bool runtime = (have >> bit) & 1;
        ck_assert_msg(kernel || !runtime, "%s: the runtime claims it, the kernel does not", name);
        ck_assert_msg(under_valgrind || kernel == runtime, "%s: kernel says %d, runtime says %d",
                      name, kernel, runtime);
    }
    ck_assert_ptr_null(bp_cpu_feature_name(3));
}
END_TEST

START_TEST(test_filter_only)
{
    use_test_plugins();
    setenv("BP_PLUGINS_ONLY", "good, multi", 1);
    bp_plugin_load_all();
    ck_assert_uint_eq(bp_plugin_count(), 2);
    ck_assert_record("backplane-good.so", BP_PLUGIN_LOADED, "Good");
    ck_assert_record("backplane-multi-b.so", BP_PLUGIN_LOADED, "Multi");
    ck_assert_record("backplane-needslib.so", BP_PLUGIN_FILTERED, "BP_PLUGINS_ONLY");
    ck_assert_record("backplane-badabi.so", BP_PLUGIN_FILTERED, "BP_PLUGINS_ONLY");
    ck_assert_int_eq(record_for("backplane-badabi.so")->score, -1);
    /* Filtered plugins are never even opened. */
    ck_assert(!is_mapped("backplane-badabi.so"));
    ck_assert(!is_mapped("backplane-isa-base.so"));
}
END_TEST

START_TEST(test_filter_disable)
{
    use_test_plugins();
    setenv("BP_PLUGINS_DISABLE", "MULTI,zdupe", 1);
    bp_plugin_load_all();
    ck_assert_record("backplane-multi-a.so", BP_PLUGIN_FILTERED, "BP_PLUGINS_DISABLE");
    ck_assert_record("backplane-multi-b.so", BP_PLUGIN_FILTERED, "BP_PLUGINS_DISABLE");
    ck_assert_record("backplane-zdupe.so", BP_PLUGIN_FILTERED, "BP_PLUGINS_DISABLE");
    ck_assert_record("backplane-good.so", BP_PLUGIN_LOADED, "Good");
    ck_assert_ptr_null(bp_plugin_by_name("multi"));
    ck_assert(!is_mapped("backplane-multi-b.so"));
}
END_TEST

START_TEST(test_selection_by_name)
{
    use_test_plugins();
    bp_backend *be = bp_backend_init_by_name("good1", NULL); /* case-insensitive */
    ck_assert_ptr_nonnull(be);
    ck_assert_str_eq(bp_backend_name(be), "GOOD1");
    bp_backend_free(be);
    be = bp_backend_init_by_name("multi", "threads=1"); /* a registry: its first device */
    ck_assert_ptr_nonnull(be);
    ck_assert_str_eq(bp_backend_name(be), "MULTI0");
    bp_backend_free(be);

    ck_assert_rejected(bp_backend_init_by_name("CUDA7", NULL), BP_ERR_NOT_FOUND, "GOOD0, GOOD1");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "registries: Good"));
    ck_assert_rejected(bp_backend_init_by_name("Meta(GOOD0,GOOD1)", NULL), BP_ERR_NOT_FOUND,
                       "no loaded plugin provides one");
    ck_assert_rejected(bp_device_by_name("nope"), BP_ERR_NOT_FOUND, "devices: GOOD0");
    ck_assert_rejected(bp_registry_by_name("nope"), BP_ERR_NOT_FOUND, "registries: Good");
    ck_assert_rejected(bp_backend_init_by_name(NULL, NULL), BP_ERR_INVALID_ARG, "NULL");

    ck_assert_str_eq(bp_registry_name(bp_registry_by_name("GOOD")), "Good");
    ck_assert_str_eq(bp_device_name(bp_device_by_name("Good0")), "GOOD0");
    ck_assert_str_eq(bp_device_name(bp_device_by_type(BP_DEVICE_TYPE_ACCEL)), "GOOD0");
    ck_assert_rejected(bp_backend_init_by_type(BP_DEVICE_TYPE_GPU, NULL), BP_ERR_NOT_FOUND,
                       "no device of type GPU");
    be = bp_backend_init_best(); /* no GPU here: the first accelerator */
    ck_assert_str_eq(bp_backend_name(be), "GOOD0");
    bp_backend_free(be);
    ck_assert_uint_ge(bp_device_count(), 4);
    ck_assert_str_eq(bp_device_name(bp_device_get(1)), "GOOD1");
    ck_assert_rejected(bp_device_get(99), BP_ERR_OUT_OF_BOUNDS, "no device 99");
    ck_assert_rejected(bp_registry_get(99), BP_ERR_OUT_OF_BOUNDS, "no registry 99");
}
END_TEST

START_TEST(test_no_plugins_at_all)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    ck_assert_uint_eq(bp_device_count(), 0);
    ck_assert_rejected(bp_backend_init_best(), BP_ERR_NOT_FOUND, "no plugin is loaded");
}
END_TEST

START_TEST(test_unload_waits_for_users)
{
    use_test_plugins();
    bp_plugin *p = bp_plugin_by_name("good");
    ck_assert_ptr_nonnull(p);
    ck_assert_str_eq(bp_plugin_name(p), "good");
    ck_assert_ptr_nonnull(strstr(bp_plugin_path(p), "backplane-good.so"));
    bp_backend *be = bp_backend_init_by_name("GOOD0", NULL);
    bp_buffer *buf = bp_backend_alloc_buffer(be, 1024);
    bp_event *ev = bp_event_new(bp_backend_get_device(be));
    ck_assert_int_eq(bp_plugin_refcount(p), 3);
    ck_assert_int_eq(bp_plugin_unload(p), BP_ERR_BUSY);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "still in use by 3"));
    bp_buffer_free(buf);
    bp_event_free(ev);
    ck_assert_int_eq(bp_plugin_refcount(p), 1);
    ck_assert_int_eq(bp_plugin_unload(p), BP_ERR_BUSY);
    bp_backend_free(be);
    ck_assert_int_eq(bp_plugin_refcount(p), 0);
    size_t before = bp_registry_count();
    ck_assert_int_eq(bp_plugin_unload(p), BP_OK);
    ck_assert_uint_eq(bp_registry_count(), before - 1);
    ck_assert_ptr_null(bp_plugin_by_name("good"));
    ck_assert(!is_mapped("backplane-good.so"));
    ck_assert_record("backplane-good.so", BP_PLUGIN_UNLOADED, "Good");
    ck_assert_int_eq(bp_plugin_unload(NULL), BP_ERR_INVALID_ARG);
    /* And it can be loaded again. */
    char path[4096];
    snprintf(path, sizeof(path), "%s/backplane-good.so", plugin_dir());
    ck_assert_ptr_nonnull(bp_plugin_load(path));
}
END_TEST

START_TEST(test_explicit_load)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    ck_assert_uint_eq(bp_plugin_count(), 0);
    char path[4096];
    snprintf(path, sizeof(path), "%s/backplane-good.so", plugin_dir());
    bp_plugin *p = bp_plugin_load(path);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(bp_registry_device_count(bp_plugin_get_registry(p)), 2);
    ck_assert_rejected(bp_plugin_load(path), BP_ERR_PLUGIN, "already loaded");
    snprintf(path, sizeof(path), "%s/backplane-badabi.so", plugin_dir());
    ck_assert_rejected(bp_plugin_load(path), BP_ERR_PLUGIN, "plugin API 2.0");
    snprintf(path, sizeof(path), "%s/backplane-zero.so", plugin_dir());
    ck_assert_rejected(bp_plugin_load(path), BP_ERR_PLUGIN, "score is 0");
    ck_assert_rejected(bp_plugin_load("/nonexistent/backplane-x.so"), BP_ERR_PLUGIN, "cannot stat");
    ck_assert_rejected(bp_plugin_load("/tmp/libfoo.so"), BP_ERR_PLUGIN, "does not match");
    ck_assert_rejected(bp_plugin_load(NULL), BP_ERR_INVALID_ARG, "NULL");

    /* The rest of the directory on request. */
    ck_assert_int_eq(bp_plugin_load_all_from(plugin_dir()), BP_OK);
    ck_assert_ptr_nonnull(bp_plugin_by_name("multi"));
    ck_assert_record("backplane-zdupe.so", BP_PLUGIN_FAILED, "already provided");
    ck_assert_int_eq(bp_plugin_load_all_from("relative/dir"), BP_ERR_INVALID_ARG);
    ck_assert_int_eq(bp_plugin_load_all_from(NULL), BP_ERR_INVALID_ARG);
}
END_TEST

/* ---- Permissions and file checks ---------------------------------------------------------- */

static void copy_file(const char *from, const char *to, mode_t mode)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(in, 0);
    ck_assert_int_ge(out, 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        ck_assert_int_eq(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
    ck_assert_int_eq(chmod(to, mode), 0);
}

static char tmp_root[256];

static void make_dir(char *out, size_t n, const char *name, mode_t mode)
{
    snprintf(out, n, "%s/%s", tmp_root, name);
    ck_assert_int_eq(mkdir(out, 0700), 0);
    ck_assert_int_eq(chmod(out, mode), 0);
}

static void good_into(const char *dir, const char *as, mode_t mode)
{
    char from[4096], to[4096];
    snprintf(from, sizeof(from), "%s/backplane-good.so", plugin_dir());
    snprintf(to, sizeof(to), "%s/%s", dir, as);
    copy_file(from, to, mode);
}

/* Loads dir; if the good plugin loaded, unloads it so the next directory can load it again. */
static void load_dir(const char *dir)
{
    ck_assert_int_eq(bp_plugin_load_all_from(dir), BP_OK);
    bp_plugin *p = bp_plugin_by_name("good");
    if (p != NULL)
        ck_assert_int_eq(bp_plugin_unload(p), BP_OK);
}

START_TEST(test_refusals)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/bp-loader-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_root));
    char d[512], p[1024];

    make_dir(d, sizeof(d), "world-writable", 0777);
    good_into(d, "backplane-good.so", 0755);
    load_dir(d);
    ck_assert_record("world-writable", BP_PLUGIN_REFUSED, "writable by others (mode 777)");
    ck_assert_ptr_null(record_for("world-writable/backplane-good.so")); /* never looked at */

    make_dir(d, sizeof(d), "group-writable", 0775);
    load_dir(d);
    ck_assert_record("group-writable", BP_PLUGIN_REFUSED, "writable by its group");

    make_dir(d, sizeof(d), "file-writable", 0755);
    good_into(d, "backplane-good.so", 0666);
    load_dir(d);
    ck_assert_record("file-writable/backplane-good.so", BP_PLUGIN_REFUSED,
                     "the file is writable by others");

    make_dir(d, sizeof(d), "odd-files", 0755);
    snprintf(p, sizeof(p), "%s/backplane-dir.so", d);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/backplane-text.so", d);
    FILE *f = fopen(p, "w");
    fputs("not a shared object\n", f);
    fclose(f);
    good_into(d, "backplane-two-dash-es.so", 0755);
    good_into(d, "backplane-good.so.1", 0755); /* not the pattern: ignored quietly */
    load_dir(d);
    ck_assert_record("odd-files/backplane-dir.so", BP_PLUGIN_REFUSED, "not a regular file");
    ck_assert_record("odd-files/backplane-text.so", BP_PLUGIN_REFUSED, "not an ELF");
    ck_assert_record("odd-files/backplane-two-dash-es.so", BP_PLUGIN_REFUSED, "does not match");
    ck_assert_ptr_null(record_for("odd-files/backplane-good.so.1"));

    /* A symlink to a safe plugin is fine; the descriptor must match the link's name. */
    make_dir(d, sizeof(d), "links", 0755);
    char target[4096];
    snprintf(target, sizeof(target), "%s/backplane-good.so", plugin_dir());
    snprintf(p, sizeof(p), "%s/backplane-good.so", d);
    ck_assert_int_eq(symlink(target, p), 0);
    snprintf(p, sizeof(p), "%s/backplane-other.so", d);
    ck_assert_int_eq(symlink(target, p), 0);
    load_dir(d);
    /* (load_dir unloads the good plugin again, so "loaded" shows as "unloaded" here.) */
    ck_assert_record("links/backplane-good.so", BP_PLUGIN_UNLOADED, "Good");
    ck_assert_record("links/backplane-other.so", BP_PLUGIN_FAILED, "descriptor says name 'good'");

    /* Ownership: only root can give a file away, so this part needs root (CI runs as root). */
    if (geteuid() == 0) {
        make_dir(d, sizeof(d), "foreign", 0755);
        good_into(d, "backplane-good.so", 0755);
        snprintf(p, sizeof(p), "%s/backplane-good.so", d);
        ck_assert_int_eq(chown(p, 12345, 12345), 0);
        load_dir(d);
        ck_assert_record("foreign/backplane-good.so", BP_PLUGIN_REFUSED, "owned by uid 12345");

        make_dir(d, sizeof(d), "foreign-link", 0755);
        snprintf(p, sizeof(p), "%s/backplane-good.so", d);
        ck_assert_int_eq(symlink(target, p), 0);
        ck_assert_int_eq(lchown(p, 12345, 12345), 0);
        load_dir(d);
        ck_assert_record("foreign-link/backplane-good.so", BP_PLUGIN_REFUSED,
                         "the symbolic link is owned by uid 12345");

        make_dir(d, sizeof(d), "sticky", 01777); /* like /tmp: root-owned and sticky is fine */
        good_into(d, "backplane-good.so", 0755);
        load_dir(d);
        ck_assert_record("sticky/backplane-good.so", BP_PLUGIN_UNLOADED, "Good");
    }

    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* BP_PLUGIN_PROBE=1: a plugin whose init crashes is refused with the reason instead of taking
 * the process down; good plugins still load; the verdict is cached by path, size and mtime. */
START_TEST(test_probe_refuses_crashing_init)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    char cache[] = "/tmp/bp-probe-cache-XXXXXX";
    int fd = mkstemp(cache);
    ck_assert_int_ge(fd, 0);
    close(fd);
    setenv("BP_PLUGIN_PROBE", "1", 1);
    setenv("BP_PLUGIN_PROBE_CACHE", cache, 1);
    const char *crash_dir = getenv("BP_TEST_CRASH_PLUGIN_DIR");
    ck_assert_ptr_nonnull(crash_dir);
    bp_plugin_load_all_from(crash_dir);
    ck_assert_record("backplane-crashinit.so", BP_PLUGIN_REFUSED, "ended with signal 11");
    ck_assert_ptr_null(bp_registry_by_name("Crashinit"));
    bp_plugin_load_all_from(plugin_dir()); /* the process is alive and goes on */
    ck_assert_ptr_nonnull(bp_device_by_name("GOOD0"));

    FILE *f = fopen(cache, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    bool crash = false, good = false;
    while (fgets(line, sizeof(line), f) != NULL) {
        crash |= strstr(line, " signal:11 ") && strstr(line, "backplane-crashinit.so");
        good |= strstr(line, " ok ") && strstr(line, "/backplane-good.so");
    }
    fclose(f);
    ck_assert_msg(crash && good, "verdicts missing from the cache");

    /* The second time the cached verdict decides, without another child. */
    char path[4096];
    snprintf(path, sizeof(path), "%s/backplane-crashinit.so", crash_dir);
    ck_assert_ptr_null(bp_plugin_load(path));
    ck_assert_msg(strstr(bp_last_error(), "cached verdict") != NULL, "%s", bp_last_error());
    unsetenv("BP_PLUGIN_PROBE");
    unlink(cache);
}
END_TEST

START_TEST(test_relative_path_entries_ignored)
{
    char path[4096];
    snprintf(path, sizeof(path), "relative/plugins::.:%s", plugin_dir());
    setenv("BP_PLUGIN_PATH", path, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    bp_plugin_load_all();
    ck_assert_record("relative/plugins", BP_PLUGIN_REFUSED, "current directory is never searched");
    ck_assert_record(".", BP_PLUGIN_REFUSED, "relative");
    ck_assert_ptr_nonnull(bp_plugin_by_name("good"));
}
END_TEST

static void *count_devices(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)bp_device_count();
}

START_TEST(test_concurrent_discovery_runs_once)
{
    use_test_plugins();
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, count_devices, NULL), 0);
    uintptr_t first = 0;
    for (int i = 0; i < 8; i++) {
        void *res;
        pthread_join(th[i], &res);
        if (i == 0)
            first = (uintptr_t)res;
        ck_assert_uint_eq((uintptr_t)res, first);
    }
    ck_assert_uint_ge(first, 4);
    (void)record_for("backplane-good.so"); /* fails on a second record for the same file */
    (void)record_for("backplane-multi-a.so");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loader");
    BP_TCASE(s, test_discovery_and_report, 30);
    BP_TCASE(s, test_cpu_disable_picks_lower_variant, 30);
    BP_TCASE(s, test_cpu_features_match_kernel, 10);
    BP_TCASE(s, test_filter_only, 30);
    BP_TCASE(s, test_filter_disable, 30);
    BP_TCASE(s, test_selection_by_name, 30);
    BP_TCASE(s, test_no_plugins_at_all, 10);
    BP_TCASE(s, test_unload_waits_for_users, 30);
    BP_TCASE(s, test_explicit_load, 30);
    BP_TCASE(s, test_refusals, 60);
    BP_TCASE(s, test_probe_refuses_crashing_init, 60);
    BP_TCASE(s, test_relative_path_entries_ignored, 30);
    BP_TCASE(s, test_concurrent_discovery_runs_once, 30);
    return bp_test_run(s);
}
