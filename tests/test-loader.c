/* test-loader.c - plugin discovery, the refusal rules, variants and scores, CPU features,
 * filters, selection by name, explicit loading and safe unload, using the test plugins of
 * tests/plugins/ (see plugin.c). Each test runs in its own process (Check's fork mode), so each
 * sees discovery run once, with the environment it set up. */
#define _GNU_SOURCE /* dlinfo */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
        ck_assert_plugins(r_ != NULL, "no record for %s", file);                               \
        ck_assert_plugins(r_->status == (st), "%s: status '%s', expected '%s' (%s)", file,     \
                          bp_plugin_status_name(r_->status), bp_plugin_status_name(st),        \
                          r_->message);                                                        \
        ck_assert_msg(strstr(r_->message, (needle)) != NULL, "%s: message '%s' lacks '%s'",    \
                      file, r_->message, (needle));                                            \
    } while (0)

/* The verdict on a directory of the current user's, writable by the user's primary group
 * (mode 775): root's own directories may not be; a user's may be when the group is the user's
 * private one (Debian's umask 002), and are refused with that reason when it is not
 * (test_private_group_writable tests both with chosen groups). */
#define ck_assert_group_verdict(file)                                                          \
    do {                                                                                       \
        const struct bp_plugin_record *g_ = record_for(file);                                  \
        if (geteuid() == 0)                                                                    \
            ck_assert_record(file, BP_PLUGIN_REFUSED,                                          \
                             "writable by its group (mode 775), which a root-owned");          \
        else if (g_ != NULL && g_->status == BP_PLUGIN_REFUSED)                                \
            ck_assert_record(file, BP_PLUGIN_REFUSED, "which is not the owner's private group"); \
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
    ck_assert_str_eq(bp_plugin_get_variant(bp_plugin_by_name("MULTI")), "b");
    ck_assert_str_eq(bp_plugin_get_variant(bp_plugin_by_name("isa")), avx2 ? "avx2" : "base");
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
    ck_assert_str_eq(bp_backend_get_name(be), "GOOD1");
    bp_backend_free(be);
    be = bp_backend_init_by_name("multi", "threads=1"); /* a registry: its first device */
    ck_assert_ptr_nonnull(be);
    ck_assert_str_eq(bp_backend_get_name(be), "MULTI0");
    bp_backend_free(be);

    ck_assert_rejected(bp_backend_init_by_name("CUDA7", NULL), BP_ERR_NOT_FOUND, "GOOD0, GOOD1");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "registries: Good"));
    ck_assert_rejected(bp_backend_init_by_name("Meta(GOOD0,GOOD1)", NULL), BP_ERR_NOT_FOUND,
                       "no loaded plugin provides one");
    ck_assert_rejected(bp_device_by_name("nope"), BP_ERR_NOT_FOUND, "devices: GOOD0");
    ck_assert_rejected(bp_registry_by_name("nope"), BP_ERR_NOT_FOUND, "registries: Good");
    ck_assert_rejected(bp_backend_init_by_name(NULL, NULL), BP_ERR_INVALID_ARG, "NULL");

    ck_assert_str_eq(bp_registry_get_name(bp_registry_by_name("GOOD")), "Good");
    ck_assert_str_eq(bp_device_get_name(bp_device_by_name("Good0")), "GOOD0");
    ck_assert_str_eq(bp_device_get_name(bp_device_by_type(BP_DEVICE_TYPE_ACCEL)), "GOOD0");
    ck_assert_rejected(bp_backend_init_by_type(BP_DEVICE_TYPE_GPU, NULL), BP_ERR_NOT_FOUND,
                       "no device of type GPU");
    be = bp_backend_init_best(); /* no GPU here: the first accelerator */
    ck_assert_str_eq(bp_backend_get_name(be), "GOOD0");
    bp_backend_free(be);
    ck_assert_uint_ge(bp_device_count(), 4);
    ck_assert_str_eq(bp_device_get_name(bp_device_get(1)), "GOOD1");
    ck_assert_rejected(bp_device_get(99), BP_ERR_OUT_OF_BOUNDS, "no device 99");
    ck_assert_rejected(bp_registry_get(99), BP_ERR_OUT_OF_BOUNDS, "no registry 99");
}
END_TEST

START_TEST(test_no_plugins_at_all)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    ck_assert_uint_eq(bp_device_count(), 0);
    ck_assert_rejected(bp_backend_init_best(), BP_ERR_NOT_FOUND,
                       "no plugin is loaded: no plugin file was found on the search path");
}
END_TEST


START_TEST(test_unload_waits_for_users)
{
    use_test_plugins();
    bp_plugin *p = bp_plugin_by_name("good");
    ck_assert_ptr_nonnull(p);
    ck_assert_str_eq(bp_plugin_get_name(p), "good");
    ck_assert_ptr_nonnull(strstr(bp_plugin_get_path(p), "backplane-good.so"));
    bp_backend *be = bp_backend_init_by_name("GOOD0", NULL);
    bp_buffer *buf = bp_backend_alloc_buffer(be, 1024);
    bp_event *ev = bp_event_new(bp_backend_get_device(be));
    ck_assert_int_eq(bp_plugin_get_refcount(p), 3);
    ck_assert_int_eq(bp_plugin_unload(p), BP_ERR_BUSY);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "still in use by 3"));
    bp_buffer_free(buf);
    bp_event_free(ev);
    ck_assert_int_eq(bp_plugin_get_refcount(p), 1);
    ck_assert_int_eq(bp_plugin_unload(p), BP_ERR_BUSY);
    bp_backend_free(be);
    ck_assert_int_eq(bp_plugin_get_refcount(p), 0);
    size_t before = bp_registry_count();
    ck_assert_int_eq(bp_plugin_unload(p), BP_OK);
    ck_assert_uint_eq(bp_registry_count(), before - 1);
    ck_assert_ptr_null(bp_plugin_by_name("good"));
    ck_assert(!is_mapped("backplane-good.so"));
    ck_assert_record("backplane-good.so", BP_PLUGIN_UNLOADED, "Good");
    ck_assert_int_eq(bp_plugin_unload(NULL), BP_ERR_INVALID_ARG);
    /* The handle outlives the unload: a second unload is an error naming it, not a use after
     * free (ASan and valgrind watch this), and its queries still answer. */
    bp_clear_error();
    ck_assert_int_eq(bp_plugin_unload(p), BP_ERR_INVALID_ARG);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "unloaded already");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "backplane-good.so"));
    ck_assert_str_eq(bp_plugin_get_name(p), "good");
    ck_assert_ptr_null(bp_plugin_get_registry(p));
    ck_assert_error_has(BP_ERR_INVALID_ARG, "has been unloaded");
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
    ck_assert_uint_eq(bp_registry_get_device_count(bp_plugin_get_registry(p)), 2);
    ck_assert_rejected(bp_plugin_load(path), BP_ERR_PLUGIN, "already loaded");
    snprintf(path, sizeof(path), "%s/backplane-badabi.so", plugin_dir());
    ck_assert_rejected(bp_plugin_load(path), BP_ERR_PLUGIN, "plugin API 2.0");
    snprintf(path, sizeof(path), "%s/backplane-zero.so", plugin_dir());
    ck_assert_rejected(bp_plugin_load(path), BP_ERR_PLUGIN, "score is 0");
    ck_assert_rejected(bp_plugin_load("/nonexistent/backplane-x.so"), BP_ERR_PLUGIN,
                       "does not exist");
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

/* Nothing loaded because everything was refused: the error names the first refusal, not only
 * that nothing is loaded. */
START_TEST(test_no_plugins_says_why)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/bp-loader-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_root));
    char d[512];
    make_dir(d, sizeof(d), "open", 0755);
    good_into(d, "backplane-good.so", 0757);
    setenv("BP_PLUGIN_PATH", d, 1);
    ck_assert_uint_eq(bp_device_count(), 0);
    ck_assert_rejected(bp_backend_init_best(), BP_ERR_NOT_FOUND,
                       "no plugin is loaded: 1 refused or failed, the first ");
    ck_assert_error_has(BP_ERR_NOT_FOUND, "open/backplane-good.so: the file is writable by others "
                                          "(mode 757)");
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

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
    ck_assert_group_verdict("group-writable");

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
                         "foreign-link/backplane-good.so is owned by uid 12345");
        ck_assert_record("foreign-link/backplane-good.so", BP_PLUGIN_REFUSED, "symbolic link");

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

/* ---- Group-writable by a private group (needs root: the test takes other accounts) ---------- */

/* A non-root account whose primary group is private by the rule (no other account's primary
 * group, no listed member but the account), found in the passwd and group databases; and a
 * group that is the primary group of two accounts or more. False when there is none. */
static bool find_accounts(uid_t *uid, gid_t *private_gid, gid_t *shared_gid)
{
    enum { MAX = 1024 };
    static uid_t uids[MAX];
    static gid_t gids[MAX];
    static char names[MAX][64];
    size_t n = 0;
    setpwent();
    for (struct passwd *pw; (pw = getpwent()) != NULL && n < MAX; n++) {
        uids[n] = pw->pw_uid;
        gids[n] = pw->pw_gid;
        snprintf(names[n], sizeof(names[n]), "%s", pw->pw_name);
    }
    endpwent();
    bool have_private = false, have_shared = false;
    for (size_t i = 0; i < n; i++) {
        size_t same = 0;
        for (size_t j = 0; j < n; j++)
            same += gids[j] == gids[i];
        struct group *gr = getgrgid(gids[i]);
        if (same >= 2 && gids[i] != 0 && !have_shared) {
            *shared_gid = gids[i];
            have_shared = true;
        }
        if (same == 1 && uids[i] != 0 && gr != NULL && !have_private &&
            (gr->gr_mem[0] == NULL ||
             (strcmp(gr->gr_mem[0], names[i]) == 0 && gr->gr_mem[1] == NULL))) {
            *uid = uids[i];
            *private_gid = gids[i];
            have_private = true;
        }
    }
    return have_private && have_shared;
}

/* dir/backplane-good.so, made by root and given to uid:gid with mode 775, as a developer's
 * build under umask 002 leaves it. */
static void give_away(const char *dir, uid_t uid, gid_t gid)
{
    char p[1024];
    good_into(dir, "backplane-good.so", 0775);
    snprintf(p, sizeof(p), "%s/backplane-good.so", dir);
    ck_assert_int_eq(chown(dir, uid, gid), 0);
    ck_assert_int_eq(chown(p, uid, gid), 0);
    ck_assert_int_eq(chmod(dir, 0775), 0);
    ck_assert_int_eq(chmod(p, 0775), 0);
}

/* In a child running as uid:gid, loads dir and exits 0 when the good plugin's record has the
 * status and the needle (else prints the record and exits 1). */
static int load_as(const char *dir, uid_t uid, gid_t gid, enum bp_plugin_status status,
                   const char *needle)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
            _exit(2);
        bp_plugin_load_all_from(dir);
        for (size_t i = 0; i < bp_plugin_report_count(); i++) {
            const struct bp_plugin_record *r = bp_plugin_report_get(i);
            if (r->status == status && strstr(r->message, needle) != NULL)
                _exit(0);
            fprintf(stderr, "%s: %s: %s\n", r->path, bp_plugin_status_name(r->status),
                    r->message);
        }
        _exit(1);
    }
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128;
}

/* umask 002 with a private group (Debian, Ubuntu): the user's plugin directory and file are
 * group-writable, and accepted; by a group other accounts have, refused with the reason. */
START_TEST(test_private_group_writable)
{
    uid_t uid = 0;
    gid_t mine = 0, shared = 0;
    if (geteuid() != 0 || !find_accounts(&uid, &mine, &shared)) {
        fprintf(stderr, "test_private_group_writable: needs root and accounts with a private "
                "and a shared primary group; the rule itself is tested in test-runtime-util\n");
        return;
    }
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/bp-loader-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_root));
    ck_assert_int_eq(chmod(tmp_root, 0755), 0);
    char d[512];
    make_dir(d, sizeof(d), "private", 0775);
    give_away(d, uid, mine);
    int private_result = load_as(d, uid, mine, BP_PLUGIN_LOADED, "registry 'Good'");
    make_dir(d, sizeof(d), "shared", 0775);
    give_away(d, uid, shared);
    int shared_result = load_as(d, uid, mine, BP_PLUGIN_REFUSED,
                                "is writable by its group (mode 775), which is not the owner's "
                                "private group (group ");
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_root);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(private_result == 0, "a private group's directory was refused (uid %u, gid %u)",
                  (unsigned)uid, (unsigned)mine);
    ck_assert_msg(shared_result == 0, "a shared group's directory was not refused (gid %u)",
                  (unsigned)shared);
}
END_TEST

static void new_tmp_root(void)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    snprintf(tmp_root, sizeof(tmp_root), "/tmp/bp-loader-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_root));
}

static void remove_tmp_root(void)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s'; rm -rf '%s'", tmp_root, tmp_root);
    ck_assert_int_eq(system(cmd), 0);
}

/* A copy of the good plugin, cut after n bytes. */
static void truncated_good(const char *to, off_t n)
{
    char from[4096];
    snprintf(from, sizeof(from), "%s/backplane-good.so", plugin_dir());
    copy_file(from, to, 0755);
    ck_assert_int_eq(truncate(to, n), 0);
}

/* A truncated or corrupt file is refused from its ELF headers, before dlopen could map past its
 * end (a SIGBUS in the dynamic loader, which would end this test), without probing. */
START_TEST(test_truncated_plugin_refused)
{
    new_tmp_root();
    unsetenv("BP_PLUGIN_PROBE");
    char d[512], p[1024];
    make_dir(d, sizeof(d), "cut", 0755);
    snprintf(p, sizeof(p), "%s/backplane-good.so", d);
    truncated_good(p, 1000);
    ck_assert_rejected(bp_plugin_load(p), BP_ERR_PLUGIN, "truncated or corrupt");
    ck_assert_msg(strstr(bp_last_error(), "(PT_LOAD)") != NULL, "%s", bp_last_error());
    ck_assert_msg(strstr(bp_last_error(), "of a 1000-byte file") != NULL, "%s", bp_last_error());

    truncated_good(p, 40); /* less than an ELF header */
    ck_assert_rejected(bp_plugin_load(p), BP_ERR_PLUGIN, "less than an ELF header");

    /* Whole file, program headers said to lie far beyond its end. */
    truncated_good(p, 1 << 20);
    int fd = open(p, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ElfW(Off) far = (ElfW(Off))1 << 40;
    ck_assert_int_eq(pwrite(fd, &far, sizeof(far), offsetof(ElfW(Ehdr), e_phoff)),
                     (ssize_t)sizeof(far));
    close(fd);
    ck_assert_rejected(bp_plugin_load(p), BP_ERR_PLUGIN, "program headers");

    /* An absurd program header count. */
    truncated_good(p, 1 << 20);
    fd = open(p, O_RDWR);
    uint16_t many = 0xffff;
    ck_assert_int_eq(pwrite(fd, &many, sizeof(many), offsetof(ElfW(Ehdr), e_phnum)),
                     (ssize_t)sizeof(many));
    close(fd);
    ck_assert_rejected(bp_plugin_load(p), BP_ERR_PLUGIN, "65535 program headers");

    /* Discovery records the same reason and goes on. */
    make_dir(d, sizeof(d), "cut-dir", 0755);
    snprintf(p, sizeof(p), "%s/backplane-good.so", d);
    truncated_good(p, 1000);
    load_dir(d);
    ck_assert_record("cut-dir/backplane-good.so", BP_PLUGIN_REFUSED, "truncated or corrupt");
    ck_assert(!is_mapped("backplane-good.so"));
    remove_tmp_root();
}
END_TEST

/* Every directory from the root down is checked, including those a symbolic link leads
 * through; a safe directory under an unsafe one is refused. */
START_TEST(test_whole_path_checked)
{
    new_tmp_root();
    char open_dir[512], d[1024], p[2048], target[2048];
    make_dir(open_dir, sizeof(open_dir), "open", 0777); /* writable by all, not sticky */
    snprintf(d, sizeof(d), "%s/safe", open_dir);
    ck_assert_int_eq(mkdir(d, 0755), 0);
    good_into(d, "backplane-good.so", 0755);
    load_dir(d);
    snprintf(p, sizeof(p), "the directory %s is writable by others (mode 777)", open_dir);
    ck_assert_record("open/safe", BP_PLUGIN_REFUSED, p);
    ck_assert_ptr_null(record_for("open/safe/backplane-good.so"));
    snprintf(target, sizeof(target), "%s/backplane-good.so", d);
    ck_assert_rejected(bp_plugin_load(target), BP_ERR_PLUGIN, "writable by others");
    ck_assert_record("open/safe/backplane-good.so", BP_PLUGIN_REFUSED, p);
    ck_assert(!is_mapped("backplane-good.so"));

    /* A symbolic link from a safe directory to a plugin in the unsafe one. */
    make_dir(d, sizeof(d), "links", 0755);
    snprintf(p, sizeof(p), "%s/backplane-good.so", d);
    ck_assert_int_eq(symlink(target, p), 0);
    load_dir(d);
    snprintf(p, sizeof(p), "the directory %s is writable by others", open_dir);
    ck_assert_record("links/backplane-good.so", BP_PLUGIN_REFUSED, p);

    /* A plugin directory reached through a symbolic link into the unsafe one. */
    snprintf(d, sizeof(d), "%s/dirlink", tmp_root);
    snprintf(p, sizeof(p), "%s/safe", open_dir);
    ck_assert_int_eq(symlink(p, d), 0);
    load_dir(d);
    snprintf(p, sizeof(p), "the directory %s is writable by others", open_dir);
    ck_assert_record("dirlink", BP_PLUGIN_REFUSED, p);

    /* A group-writable parent. */
    make_dir(d, sizeof(d), "group", 0775);
    snprintf(d + strlen(d), sizeof(d) - strlen(d), "/safe");
    ck_assert_int_eq(mkdir(d, 0755), 0);
    good_into(d, "backplane-good.so", 0755);
    load_dir(d);
    ck_assert_group_verdict("group/safe");

    /* A sound path still loads, and so does one with "." and ".." in it. */
    make_dir(d, sizeof(d), "fine", 0755);
    good_into(d, "backplane-good.so", 0755);
    ck_assert_int_eq(bp_plugin_load_all_from(d), BP_OK);
    ck_assert_ptr_nonnull(bp_plugin_by_name("good"));
    ck_assert_int_eq(bp_plugin_unload(bp_plugin_by_name("good")), BP_OK);
    snprintf(p, sizeof(p), "%s/./fine/../fine/backplane-good.so", tmp_root);
    ck_assert_ptr_nonnull(bp_plugin_load(p));
    ck_assert_int_eq(bp_plugin_unload(bp_plugin_by_name("good")), BP_OK);

    if (geteuid() == 0) { /* only root can give a directory away (CI runs as root) */
        make_dir(d, sizeof(d), "foreign", 0755);
        ck_assert_int_eq(chown(d, 12345, 12345), 0);
        snprintf(d + strlen(d), sizeof(d) - strlen(d), "/safe");
        ck_assert_int_eq(mkdir(d, 0755), 0);
        good_into(d, "backplane-good.so", 0755);
        load_dir(d);
        ck_assert_record("foreign/safe", BP_PLUGIN_REFUSED, "foreign is owned by uid 12345");

        /* Root-owned and sticky, like /tmp, is a sound component. */
        make_dir(d, sizeof(d), "sticky", 01777);
        snprintf(d + strlen(d), sizeof(d) - strlen(d), "/safe");
        ck_assert_int_eq(mkdir(d, 0755), 0);
        good_into(d, "backplane-good.so", 0755);
        load_dir(d);
        ck_assert_record("sticky/safe/backplane-good.so", BP_PLUGIN_UNLOADED, "Good");
    }
    remove_tmp_root();
}
END_TEST

/* The file that was checked is the file that is loaded: the swap plugin's init, run first in
 * the probe child (between the checks and the real dlopen), renames a copy of the good plugin
 * over its own file. Loaded by path, that copy would be mapped (and refused for its
 * descriptor); loaded through the descriptor the checks used, the swap plugin is. */
START_TEST(test_checked_file_is_loaded)
{
    new_tmp_root();
    char d[512], from[1024], to[1024], cache[1024];
    make_dir(d, sizeof(d), "swap", 0755);
    snprintf(from, sizeof(from), "%s/backplane-swap.so", getenv("BP_TEST_CRASH_PLUGIN_DIR"));
    snprintf(to, sizeof(to), "%s/backplane-swap.so", d);
    copy_file(from, to, 0755);
    good_into(d, "impostor.so", 0755);
    snprintf(from, sizeof(from), "%s/impostor.so", d);
    snprintf(cache, sizeof(cache), "%s/probe-cache", tmp_root);
    setenv("BP_TEST_SWAP_FROM", from, 1);
    setenv("BP_TEST_SWAP_TO", to, 1);
    setenv("BP_PLUGIN_PROBE", "1", 1);
    setenv("BP_PLUGIN_PROBE_CACHE", cache, 1);
    bp_plugin *p = bp_plugin_load(to);
    ck_assert_msg(p != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_registry_get_name(bp_plugin_get_registry(p)), "Swap");
    /* The swap did happen: the impostor now sits at the plugin's path. */
    ck_assert_int_ne(access(from, F_OK), 0);
    unsetenv("BP_PLUGIN_PROBE");
    ck_assert_int_eq(bp_plugin_unload(p), BP_OK);
    ck_assert_rejected(bp_plugin_load(to), BP_ERR_PLUGIN, "descriptor says name 'good'");
    remove_tmp_root();
}
END_TEST

/* Loading through /proc/self/fd/N: an object still known to the dynamic loader by a name of
 * that form after its descriptor was closed (here the application's own dlopen keeps the good
 * plugin mapped after the loader let go of it) must not be taken for the next plugin that
 * gets the same descriptor number. */
START_TEST(test_stale_descriptor_name)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    char good[4096], multi[4096];
    snprintf(good, sizeof(good), "%s/backplane-good.so", plugin_dir());
    snprintf(multi, sizeof(multi), "%s/backplane-multi-a.so", plugin_dir());
    bp_plugin *p = bp_plugin_load(good);
    ck_assert_ptr_nonnull(p);
    void *keep = dlopen(good, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(keep);
    struct link_map *lm = NULL;
    ck_assert_int_eq(dlinfo(keep, RTLD_DI_LINKMAP, &lm), 0);
    int n = -1;
    ck_assert_int_eq(sscanf(lm->l_name, "/proc/self/fd/%d", &n), 1);
    ck_assert_int_eq(bp_plugin_unload(p), BP_OK);
    ck_assert_int_eq(fcntl(n, F_GETFD), -1); /* the loader closed it */
    bp_plugin *m = bp_plugin_load(multi);
    ck_assert_msg(m != NULL, "%s", bp_last_error());
    ck_assert_str_eq(bp_registry_get_name(bp_plugin_get_registry(m)), "Multi");
    dlclose(keep);
}
END_TEST

/* A bare or relative name is refused: dlopen would look for it in LD_LIBRARY_PATH and the
 * like, not in the current directory the checks would have looked at. */
START_TEST(test_relative_plugin_path_refused)
{
    setenv("BP_PLUGIN_PATH", "", 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    ck_assert_int_eq(chdir(plugin_dir()), 0);
    ck_assert_rejected(bp_plugin_load("backplane-good.so"), BP_ERR_INVALID_ARG,
                       "not an absolute path");
    ck_assert_rejected(bp_plugin_load("./backplane-good.so"), BP_ERR_INVALID_ARG,
                       "relative paths are refused");
    ck_assert_record("./backplane-good.so", BP_PLUGIN_REFUSED, "not an absolute path");
    ck_assert_uint_eq(bp_plugin_count(), 0);
    ck_assert(!is_mapped("backplane-good.so"));
}
END_TEST

static char log_seen[8192];

static void keep_log(enum bp_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    size_t used = strlen(log_seen);
    snprintf(log_seen + used, sizeof(log_seen) - used, "%s\n", msg);
}

/* A FIFO as the probe cache must neither hang discovery nor be used. */
START_TEST(test_probe_cache_must_be_regular)
{
    new_tmp_root();
    char fifo[512], path[4096];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmp_root);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    setenv("BP_PLUGIN_PROBE", "1", 1);
    setenv("BP_PLUGIN_PROBE_CACHE", fifo, 1);
    bp_log_set_level(BP_LOG_WARN);
    bp_log_set_callback(keep_log, NULL);
    snprintf(path, sizeof(path), "%s/backplane-good.so", plugin_dir());
    ck_assert_ptr_nonnull(bp_plugin_load(path)); /* probed (without a cache), then loaded */
    ck_assert_msg(strstr(log_seen, "is not a regular file") != NULL, "log: %s", log_seen);
    struct stat st;
    ck_assert_int_eq(stat(fifo, &st), 0);
    ck_assert(S_ISFIFO(st.st_mode));
    bp_log_set_callback(NULL, NULL);
    unsetenv("BP_PLUGIN_PROBE");
    remove_tmp_root();
}
END_TEST

START_TEST(test_relative_system_path_reported)
{
    setenv("BP_PLUGIN_PATH", plugin_dir(), 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "relative/system", 1);
    bp_plugin_load_all();
    ck_assert_record("relative/system", BP_PLUGIN_REFUSED,
                     "BP_PLUGIN_SYSTEM_PATH is a relative directory and is ignored");
    ck_assert_ptr_nonnull(bp_plugin_by_name("good"));
}
END_TEST

/* Makes tmp_root/<long chain of directories> (longer than PATH_MAX in all) with the good
 * plugin in it; returns the path. */
static char *long_dir(void)
{
    static char path[8192];
    char comp[201];
    memset(comp, 'd', 200);
    comp[200] = '\0';
    int fd = open(tmp_root, O_RDONLY | O_DIRECTORY);
    snprintf(path, sizeof(path), "%s", tmp_root);
    for (int i = 0; i < 25; i++) { /* 25 x 201 bytes: past PATH_MAX (4096) */
        ck_assert_int_eq(mkdirat(fd, comp, 0755), 0);
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY);
        ck_assert_int_ge(next, 0);
        close(fd);
        fd = next;
        snprintf(path + strlen(path), sizeof(path) - strlen(path), "/%s", comp);
    }
    char from[4096];
    snprintf(from, sizeof(from), "%s/backplane-good.so", plugin_dir());
    int in = open(from, O_RDONLY), out = openat(fd, "backplane-good.so", O_WRONLY | O_CREAT, 0755);
    ck_assert_int_ge(out, 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        ck_assert_int_eq(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
    close(fd);
    ck_assert_uint_gt(strlen(path), 4096);
    return path;
}

/* No path or name is cut at a fixed buffer size: a plugin deeper than PATH_MAX loads, its
 * report shows the whole path, and a long <name> gets its real verdict. */
START_TEST(test_long_paths_and_names)
{
    new_tmp_root();
    const char *dir = long_dir();
    char *file = malloc(strlen(dir) + 32);
    sprintf(file, "%s/backplane-good.so", dir);
    ck_assert_int_eq(bp_plugin_load_all_from(dir), BP_OK);
    bp_plugin *p = bp_plugin_by_name("good");
    ck_assert_ptr_nonnull(p);
    /* (Check cannot carry messages this long: compare, then assert on the outcome.) */
    ck_assert_msg(strcmp(bp_plugin_get_path(p), file) == 0, "the plugin's path was cut");
    const struct bp_plugin_record *r = record_for(file);
    ck_assert_msg(r != NULL && r->status == BP_PLUGIN_LOADED, "no record of the load");
    /* Report messages carry the whole path too. */
    bp_clear_error();
    ck_assert_ptr_null(bp_plugin_load(file));
    ck_assert_int_eq(bp_last_status(), BP_ERR_PLUGIN);
    r = bp_plugin_report_get(bp_plugin_report_count() - 1);
    const char *m = strstr(r->message, "already loaded from ");
    ck_assert_msg(m != NULL && strcmp(m + 20, file) == 0, "the message's path was cut");
    ck_assert_int_eq(bp_plugin_unload(p), BP_OK);
    p = bp_plugin_load(file);
    ck_assert_msg(p != NULL, "loading by the long path failed (status %d)", bp_last_status());
    free(file);

    char d[512], name[128], want[512];
    make_dir(d, sizeof(d), "names", 0755);
    memset(want, 'n', 100);
    want[100] = '\0';
    snprintf(name, sizeof(name), "backplane-%.100s.so", want);
    good_into(d, name, 0755);
    ck_assert_int_eq(bp_plugin_load_all_from(d), BP_OK);
    snprintf(want + 100, sizeof(want) - 100, "' and ''");
    ck_assert_record(name, BP_PLUGIN_FAILED, "descriptor says name 'good'");
    ck_assert_record(name, BP_PLUGIN_FAILED, want);
    remove_tmp_root();
}
END_TEST

/* BP_CPU_DISABLE is read whole, however long. */
START_TEST(test_cpu_disable_long_list)
{
    char list[2048] = "";
    for (int i = 0; i < 60; i++)
        strcat(list, "sse4_2, ");
    for (int bit = 0; bit < 64; bit++) {
        const char *name = bp_cpu_feature_name(1ull << bit);
        if (name != NULL)
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s,", name);
    }
    ck_assert_uint_gt(strlen(list), 256);
    setenv("BP_CPU_DISABLE", list, 1);
    ck_assert_uint_eq(bp_cpu_features(), 0);
}
END_TEST

/* A registry that exists without devices says so, with its plugin's own reason. */
/* A meta name when the meta plugin did not load says why it did not, not "is it installed?". */
START_TEST(test_meta_name_without_meta_plugin)
{
    setenv("BP_PLUGIN_PATH", getenv("BP_TEST_META_PLUGIN_DIR"), 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    setenv("BP_PLUGINS_DISABLE", "meta", 1);
    ck_assert_rejected(bp_backend_init_by_name("Meta(CPU0,CPU1)", NULL), BP_ERR_NOT_FOUND,
                       "but the meta plugin");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "backplane-meta.so was not loaded"));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "BP_PLUGINS_DISABLE"));
    ck_assert_ptr_null(strstr(bp_last_error(), "installed"));
    unsetenv("BP_PLUGINS_DISABLE");
}
END_TEST

START_TEST(test_empty_registry_says_why)
{
    setenv("BP_PLUGIN_PATH", plugin_dir(), 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", "", 1);
    char path[4096];
    snprintf(path, sizeof(path), "%s/backplane-empty.so", getenv("BP_TEST_CRASH_PLUGIN_DIR"));
    bp_plugin *p = bp_plugin_load(path);
    ck_assert_msg(p != NULL, "%s", bp_last_error());
    ck_assert_record("backplane-empty.so", BP_PLUGIN_LOADED,
                     "registry 'Empty' with 0 devices: test accelerator: configured with no "
                     "devices");
    ck_assert_rejected(bp_backend_init_by_name("EMPTY", NULL), BP_ERR_NOT_FOUND,
                       "registry 'Empty' exists but has no devices: test accelerator: "
                       "configured with no devices");
    ck_assert_ptr_null(strstr(bp_last_error(), "no device or registry is named"));
    /* Other lookups that find nothing say why this registry has nothing to offer. */
    ck_assert_rejected(bp_backend_init_by_name("nope", NULL), BP_ERR_NOT_FOUND,
                       "registry 'Empty' has no devices: test accelerator");
    ck_assert_rejected(bp_device_by_type(BP_DEVICE_TYPE_GPU), BP_ERR_NOT_FOUND,
                       "registry 'Empty' has no devices: test accelerator");
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "no device of type GPU"));
    ck_assert_str_eq(bp_registry_get_name(bp_registry_by_name("empty")), "Empty");
}
END_TEST

/* The same directory named twice (or reached by another path) is searched once, and the same
 * file reached from two directories is considered once: nothing loses to itself. */
START_TEST(test_same_directory_searched_once)
{
    new_tmp_root();
    char link[512], alias[512], env[16384], rec[4096];
    snprintf(link, sizeof(link), "%s/plugins", tmp_root);
    ck_assert_int_eq(symlink(plugin_dir(), link), 0);
    make_dir(alias, sizeof(alias), "alias", 0755);
    snprintf(rec, sizeof(rec), "%s/backplane-good.so", alias);
    char target[4096];
    snprintf(target, sizeof(target), "%s/backplane-good.so", plugin_dir());
    ck_assert_int_eq(symlink(target, rec), 0);
    snprintf(env, sizeof(env), "%s:%s/.:%s:%s", plugin_dir(), plugin_dir(), link, alias);
    setenv("BP_PLUGIN_PATH", env, 1);
    setenv("BP_PLUGIN_SYSTEM_PATH", plugin_dir(), 1);
    bp_plugin_load_all();
    snprintf(env, sizeof(env), "%s/.", plugin_dir());
    ck_assert_record(env, BP_PLUGIN_NOT_SELECTED, "same directory as");
    ck_assert_record(link, BP_PLUGIN_NOT_SELECTED, "same directory as");
    ck_assert_record(rec, BP_PLUGIN_NOT_SELECTED, "the same file as");
    /* One record for each plugin of the real directory (record_for fails on two). */
    snprintf(rec, sizeof(rec), "%s/backplane-good.so", plugin_dir());
    ck_assert_record(rec, BP_PLUGIN_LOADED, "registry 'Good'");
    snprintf(rec, sizeof(rec), "%s/backplane-multi-a.so", plugin_dir());
    ck_assert_record(rec, BP_PLUGIN_NOT_SELECTED, "multi-b.so (score 30)");
    size_t n = 0;
    for (size_t i = 0; i < bp_plugin_report_count(); i++)
        n += strcmp(bp_plugin_report_get(i)->path, plugin_dir()) == 0;
    ck_assert_uint_eq(n, 1); /* the system directory, the same again, is recorded once */
    remove_tmp_root();
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
    BP_TCASE(s, test_no_plugins_says_why, 10);
    BP_TCASE(s, test_unload_waits_for_users, 30);
    BP_TCASE(s, test_explicit_load, 30);
    BP_TCASE(s, test_refusals, 60);
    BP_TCASE(s, test_private_group_writable, 60);
    BP_TCASE(s, test_probe_refuses_crashing_init, 60);
    BP_TCASE(s, test_relative_path_entries_ignored, 30);
    BP_TCASE(s, test_concurrent_discovery_runs_once, 30);
    BP_TCASE(s, test_truncated_plugin_refused, 30);
    BP_TCASE(s, test_whole_path_checked, 60);
    BP_TCASE(s, test_checked_file_is_loaded, 30);
    BP_TCASE(s, test_stale_descriptor_name, 30);
    BP_TCASE(s, test_relative_plugin_path_refused, 30);
    BP_TCASE(s, test_probe_cache_must_be_regular, 20);
    BP_TCASE(s, test_relative_system_path_reported, 30);
    BP_TCASE(s, test_long_paths_and_names, 30);
    BP_TCASE(s, test_cpu_disable_long_list, 10);
    BP_TCASE(s, test_empty_registry_says_why, 30);
    BP_TCASE(s, test_meta_name_without_meta_plugin, 30);
    BP_TCASE(s, test_same_directory_searched_once, 30);
    return bp_test_run(s);
}
