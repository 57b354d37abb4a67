/* loader.c - plugin discovery, loading, the load report and safe unload.
 *
 * Search order: every directory of BP_PLUGIN_PATH (colon-separated, read with secure_getenv so
 * a setuid or otherwise elevated process ignores it; relative entries are refused, so the
 * current directory is never searched), then the system directory (BP_PLUGIN_SYSTEM_PATH when
 * set, for tests and relocated installs, else the configured plugin directory).
 *
 * Every file named backplane-<name>[-<variant>].so is a candidate; there is no list of known
 * names. Candidates are grouped by <name>. For each group, BP_PLUGINS_ONLY / BP_PLUGINS_DISABLE
 * decide first, before anything is opened. Then each file is opened once, after every directory
 * from the root down to it was checked (plugin-file.c), checked on that descriptor (owner,
 * permissions, regular file, ELF and program headers), dlopened through /proc/self/fd, and its
 * descriptor checked (size, API version, name, variant, CPU features) before any of its code
 * runs; then its score function, if any, is asked. The highest non-zero score is initialised;
 * if its init fails, the next best is tried.
 * Each file and refused directory gets one record in the report, kept for the life of the
 * process, so `backplane list` can say why something is missing.
 *
 * Buffers, backends and events of a plugin hold a reference on it; unload is refused while any
 * are alive. Discovery runs once (pthread_once); explicit loads and unloads take a mutex.
 *
 * With BP_PLUGIN_PROBE=1, a forked child opens and initialises each file before this process
 * does, and a file whose child crashes is refused (probe.c). */
#include "config.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend-impl.h"
#include "plugin-file.h"
#include "probe.h"

struct bp_plugin {
    char *path;
    char *name;
    char *variant;
    void *handle;
    int fd; /* the file dlopen mapped, open while it is loaded (see choose_fd_name) */
    bp_registry *reg;
    atomic_int refs;
    struct bp_plugin_record *record;
    bool unloaded; /* kept as a tombstone after bp_plugin_unload (see there) */
};

/* A record and the strings it points to, in one allocation-free-able unit. */
struct record {
    struct bp_plugin_record pub;
    char *strings; /* path, name, variant, message back to back */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct bp_plugin **plugins;
static size_t n_plugins, cap_plugins;
/* Plugins unloaded by bp_plugin_unload: their code is gone, their handles stay valid until the
 * library is unloaded, so a stale handle is an error with a name rather than a freed pointer. */
static struct bp_plugin **tombstones;
static size_t n_tombstones, cap_tombstones;
static struct record **records;
static size_t n_records, cap_records;

static pthread_once_t discovery_once = PTHREAD_ONCE_INIT;
static enum bp_status discovery_status = BP_OK;

const char *bp_plugin_status_name(enum bp_plugin_status status)
{
    switch (status) {
    case BP_PLUGIN_LOADED:
        return "loaded";
    case BP_PLUGIN_NOT_SELECTED:
        return "not selected";
    case BP_PLUGIN_CANNOT_RUN:
        return "cannot run here";
    case BP_PLUGIN_FILTERED:
        return "filtered";
    case BP_PLUGIN_REFUSED:
        return "refused";
    case BP_PLUGIN_FAILED:
        return "failed";
    case BP_PLUGIN_UNLOADED:
        return "unloaded";
    }
    return "invalid";
}

/* Appends a record (lock held). Out of memory only loses the record, never the load. */
static struct bp_plugin_record *add_record(const char *path, const char *name,
                                           const char *variant, int score,
                                           enum bp_plugin_status status, const char *fmt, ...)
    BP_PRINTF(6, 7);

static struct bp_plugin_record *add_record(const char *path, const char *name,
                                           const char *variant, int score,
                                           enum bp_plugin_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *raw = bp__vasprintf("a plugin report record", fmt, ap);
    va_end(ap);
    /* The message is display text: file names in it have their control characters escaped,
     * as in every error message. The record's path stays the exact bytes. */
    char *msg = raw ? bp__escape_dup(raw, "a plugin report record") : NULL;
    bp__free(raw);
    if (msg == NULL)
        return NULL;
    bp_log(status == BP_PLUGIN_LOADED ? BP_LOG_INFO
           : status == BP_PLUGIN_FAILED || status == BP_PLUGIN_REFUSED ? BP_LOG_WARN
                                                                         : BP_LOG_INFO,
           "plugin %s: %s: %s", path, bp_plugin_status_name(status), msg);

    size_t lp = strlen(path) + 1, ln = strlen(name) + 1, lv = strlen(variant) + 1,
           lm = strlen(msg) + 1;
    struct record *r = bp__calloc(1, sizeof(*r), "a plugin report record");
    char *s = r ? bp__malloc(lp + ln + lv + lm, "a plugin report record") : NULL;
    if (s == NULL ||
        !bp__grow((void **)&records, &cap_records, n_records + 1, sizeof(*records),
                  "the plugin report")) {
        bp__free(msg);
        bp__free(s);
        bp__free(r);
        return NULL;
    }
    r->strings = s;
    r->pub.path = memcpy(s, path, lp);
    r->pub.name = memcpy(s + lp, name, ln);
    r->pub.variant = memcpy(s + lp + ln, variant, lv);
    r->pub.message = memcpy(s + lp + ln + lv, msg, lm);
    r->pub.score = score;
    r->pub.status = status;
    records[n_records++] = r;
    bp__free(msg);
    return &r->pub;
}

/* A reason built on the heap, or this when memory ran out while building it. */
static const char *reason(const char *why)
{
    return why != NULL ? why : "out of memory while checking it";
}

/* ---- Candidates ------------------------------------------------------------------------- */

struct candidate {
    char *path;          /* as the report shows it: the directory as given, then the entry */
    const char *entry;   /* the file's name in its directory (points into path) */
    char *name;          /* <name> and <variant> from the file name */
    char *variant;
    int dirfd;           /* the checked directory (borrowed from the search) */
    const char *dirpath; /* its resolved path (borrowed) */
    int fd;              /* the plugin file, opened once and checked; -1 until then */
    char fdpath[32];     /* "/proc/self/fd/<fd>": what dlopen and the probe open */
    bool have_id;        /* dev/ino hold the file's identity */
    dev_t dev;
    ino_t ino;
    void *handle;
    const struct bp_plugin_descriptor *desc;
    int score;
    bool viable;
};

static void candidate_close(struct candidate *c)
{
    if (c->handle != NULL)
        dlclose(c->handle);
    c->handle = NULL;
    /* After dlclose: the object was known to the dynamic loader by this descriptor's name. */
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static void candidate_free(struct candidate *c)
{
    candidate_close(c);
    bp__free(c->path);
    bp__free(c->name);
    bp__free(c->variant);
}

static bool name_chars(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

/* backplane-<name>[-<variant>].so -> name, variant (heap). False when the name does not match
 * (*oom tells an allocation failure apart). */
static bool parse_file_name(const char *file, char **name, char **variant, bool *oom)
{
    static const char prefix[] = "backplane-", suffix[] = ".so";
    size_t len = strlen(file), lp = sizeof(prefix) - 1, ls = sizeof(suffix) - 1;
    *oom = false;
    if (len <= lp + ls || strncmp(file, prefix, lp) != 0 || strcmp(file + len - ls, suffix) != 0)
        return false;
    const char *body = file + lp;
    size_t blen = len - lp - ls;
    const char *dash = memchr(body, '-', blen);
    size_t nlen = dash ? (size_t)(dash - body) : blen;
    size_t vlen = dash ? blen - nlen - 1 : 0;
    if (!name_chars(body, nlen) || (dash && !name_chars(dash + 1, vlen)))
        return false;
    *name = bp__asprintf("a plugin name", "%.*s", (int)nlen, body);
    *variant = bp__asprintf("a plugin variant", "%.*s", (int)vlen, dash ? dash + 1 : "");
    if (*name == NULL || *variant == NULL) {
        bp__free(*name);
        bp__free(*variant);
        *name = *variant = NULL;
        *oom = true;
        return false;
    }
    return true;
}

static char *missing_features(uint64_t missing)
{
    char *out = bp__strdup("", "a feature list");
    for (int bit = 0; bit < 64 && out != NULL; bit++) {
        if (((missing >> bit) & 1) == 0)
            continue;
        const char *fname = bp_cpu_feature_name(1ull << bit);
        out = bp__strcat_printf(out, "a feature list", "%s%s", out[0] ? ", " : "",
                                fname ? fname : "unknown");
    }
    return out;
}

/* Whether the descriptor d of candidate c can be used; if not, *why says why (heap; NULL when
 * memory ran out). The probe child runs exactly this too, so a descriptor whose fields point
 * nowhere crashes the child, not the process. */
static bool descriptor_ok(const struct bp_plugin_descriptor *d, const struct candidate *c,
                          char **why)
{
    const size_t min_size = offsetof(struct bp_plugin_descriptor, score);
    *why = NULL;
    if (d == NULL)
        *why = bp__strdup("it has no entry point '" BP_PLUGIN_SYMBOL "' (not a backplane "
                          "plugin?)", "a plugin check");
    else if (d->struct_size < min_size)
        *why = bp__asprintf("a plugin check", "its descriptor is %zu bytes, less than the %zu "
                            "every version has", d->struct_size, min_size);
    else if (d->api_major != BP_PLUGIN_API_MAJOR || d->api_minor > BP_PLUGIN_API_MINOR)
        *why = bp__asprintf("a plugin check", "it was built for plugin API %d.%d; this runtime "
                            "has %d.%d (same major and an equal or older minor needed)",
                            d->api_major, d->api_minor, BP_PLUGIN_API_MAJOR,
                            BP_PLUGIN_API_MINOR);
    else if (d->name == NULL || strcmp(d->name, c->name) != 0 || d->variant == NULL ||
             strcmp(d->variant, c->variant) != 0)
        *why = bp__asprintf("a plugin check", "its descriptor says name '%s' variant '%s', but "
                            "the file name says '%s' and '%s'", d->name ? d->name : "(null)",
                            d->variant ? d->variant : "(null)", c->name, c->variant);
    else if (d->init == NULL)
        *why = bp__strdup("its descriptor has no init function", "a plugin check");
    else
        return true;
    return false;
}

/* Its score (1 without a score function); asked only of a usable descriptor. */
static int descriptor_score(const struct bp_plugin_descriptor *d)
{
    if (d->struct_size >= offsetof(struct bp_plugin_descriptor, score) + sizeof(d->score) &&
        d->score != NULL)
        return d->score();
    return 1;
}

/* ---- Loading through the descriptor -------------------------------------------------------- *
 * dlopen("/proc/self/fd/N") maps the very file the checks ran on, whatever has become of its
 * name since. Two consequences. The descriptor stays open as long as the object is loaded:
 * glibc finds an already loaded object by name before it opens anything, so a number reused
 * while an object is still known as /proc/self/fd/N would be taken for that object. And for
 * the same reason a name already in use (an object that outlived a descriptor someone else
 * closed) is not used: the file is given a fresh number instead. */

static bool fd_name_taken(const char *fdpath)
{
    void *h = dlopen(fdpath, RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL)
        return false;
    struct link_map *lm = NULL;
    bool taken = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name != NULL &&
                 strcmp(lm->l_name, fdpath) == 0;
    dlclose(h);
    return taken;
}

/* Sets c->fdpath to a name no loaded object has, moving c->fd to a new number if needed. */
static bool choose_fd_name(struct candidate *c, char **why)
{
    enum { MAX_TRIES = 8 };
    int set_aside[MAX_TRIES];
    size_t n = 0;
    bool ok = false;
    for (;;) {
        snprintf(c->fdpath, sizeof(c->fdpath), "/proc/self/fd/%d", c->fd);
        struct stat st;
        if (stat(c->fdpath, &st) != 0 || st.st_dev != c->dev || st.st_ino != c->ino) {
            *why = bp__asprintf("a plugin check", "cannot reach its open file as %s, which the "
                                "loader opens it through (is /proc mounted?)", c->fdpath);
            break;
        }
        if (!fd_name_taken(c->fdpath)) {
            ok = true;
            break;
        }
        int fresh = n < MAX_TRIES ? fcntl(c->fd, F_DUPFD_CLOEXEC, 0) : -1;
        if (fresh < 0) {
            *why = bp__asprintf("a plugin check", "cannot find a descriptor name for it that no "
                                "loaded object already has");
            break;
        }
        set_aside[n++] = c->fd; /* kept open so the next number differs */
        c->fd = fresh;
    }
    for (size_t i = 0; i < n; i++)
        close(set_aside[i]);
    return ok;
}

/* dlerror's text with the descriptor name replaced by the path the user knows. */
static char *dl_message(const char *err, const struct candidate *c)
{
    char *out = bp__strdup("", "a dlopen message");
    size_t lf = strlen(c->fdpath);
    while (out != NULL && *err) {
        const char *hit = strstr(err, c->fdpath);
        size_t n = hit ? (size_t)(hit - err) : strlen(err);
        out = bp__strcat_printf(out, "a dlopen message", "%.*s%s", (int)n, err,
                                hit ? c->path : "");
        err += n + (hit ? lf : 0);
    }
    return out;
}

/* What the probe child checks before it runs init: what the real load checks, in its order
 * (the same descriptor checks read the same strings), then CPU features and score. */
static bool probe_check(const struct bp_plugin_descriptor *d, const void *arg)
{
    const struct candidate *c = arg;
    char *problem = NULL;
    bool ok = descriptor_ok(d, c, &problem) && (d->cpu_features & ~bp_cpu_features()) == 0 &&
              descriptor_score(d) > 0;
    bp__free(problem);
    return ok;
}

/* The earlier candidate of the group that is the same file as c, or NULL. */
static const struct candidate *same_file(const struct candidate *c, const struct candidate *group,
                                         size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (&group[k] != c && group[k].have_id && group[k].dev == c->dev &&
            group[k].ino == c->ino && strcasecmp(group[k].name, c->name) == 0)
            return &group[k];
    }
    return NULL;
}

/* Everything before init: open and check the file, dlopen, descriptor checks, CPU features,
 * score. group[0..n) are the candidates considered before c. Records the refusal and closes
 * the file when the candidate cannot be used. */
static bool prepare(struct candidate *c, const struct candidate *group, size_t n)
{
    char *why = NULL;
    int err = 0;
    bool bad = false;
    struct stat st;
    c->viable = false;
    c->score = -1;
    c->fd = bp__walk(c->dirfd, c->dirpath, c->entry, BP_WALK_FILE, &st, NULL, &why, &err);
    if (c->fd < 0) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_REFUSED, "%s", reason(why));
        goto refused;
    }
    c->have_id = true;
    c->dev = st.st_dev;
    c->ino = st.st_ino;
    const struct candidate *twin = same_file(c, group, n);
    if (twin != NULL) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_NOT_SELECTED,
                   "it is the same file as %s, considered already", twin->path);
        goto refused;
    }
    if ((why = bp__elf_problem(c->fd, st.st_size, &bad)) != NULL || bad ||
        !choose_fd_name(c, &why) ||
        (bp__probing() && !bp__probe(c->path, c->fdpath, &st, probe_check, c, &why))) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_REFUSED, "%s", reason(why));
        goto refused;
    }
    dlerror();
    c->handle = dlopen(c->fdpath, RTLD_NOW | RTLD_LOCAL);
    if (c->handle == NULL) {
        const char *err_text = dlerror();
        why = dl_message(err_text ? err_text : "unknown error", c);
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_FAILED, "dlopen failed: %s",
                   reason(why));
        goto refused;
    }
    const struct bp_plugin_descriptor *d = dlsym(c->handle, BP_PLUGIN_SYMBOL);
    if (!descriptor_ok(d, c, &why)) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_FAILED, "%s", reason(why));
        goto refused;
    }
    uint64_t missing = d->cpu_features & ~bp_cpu_features();
    if (missing != 0) {
        why = missing_features(missing);
        add_record(c->path, c->name, c->variant, 0, BP_PLUGIN_CANNOT_RUN,
                   "it needs CPU features this machine or its OS does not provide: %s",
                   reason(why));
        goto refused;
    }
    c->desc = d;
    c->score = descriptor_score(d);
    if (c->score <= 0) {
        add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_CANNOT_RUN,
                   "its score is %d: it cannot run on this machine", c->score);
        goto refused;
    }
    c->viable = true;
    return true;
refused:
    bp__free(why);
    candidate_close(c);
    return false;
}

static struct bp_plugin *find_loaded_name(const char *name)
{
    for (size_t i = 0; i < n_plugins; i++) {
        if (strcasecmp(plugins[i]->name, name) == 0)
            return plugins[i];
    }
    return NULL;
}

/* The directory of the plugin whose init is running on this thread (bp_plugin_init_dir). */
static _Thread_local const char *init_dir;

const char *bp_plugin_init_dir(void)
{
    return init_dir;
}

/* Frees the strings and struct of a plugin that holds no registry or object. */
static void plugin_free_record(struct bp_plugin *p)
{
    bp__free(p->path);
    bp__free(p->name);
    bp__free(p->variant);
    bp__free(p);
}

/* A new plugin record for c (not yet in the list); NULL when memory ran out. */
static struct bp_plugin *plugin_new(const struct candidate *c)
{
    struct bp_plugin *p = bp__calloc(1, sizeof(*p), "a plugin");
    if (p == NULL)
        return NULL;
    p->path = bp__strdup(c->path, "a plugin path");
    p->name = bp__strdup(c->name, "a plugin name");
    p->variant = bp__strdup(c->variant, "a plugin variant");
    if (p->path == NULL || p->name == NULL || p->variant == NULL) {
        plugin_free_record(p);
        return NULL;
    }
    return p;
}

const char *bp__plugin_name(const struct bp_plugin *p)
{
    return p->name;
}

/* Why the registry reg (of p, not yet listed) cannot be used: its name is not text, or another
 * plugin's registry has it. A sentence (heap), or NULL when it can be; *oom when memory ran
 * out. */
static char *registry_problem(bp_registry *reg, bool *oom)
{
    *oom = false;
    if (!bp__registry_usable(reg)) {
        const int state = atomic_load(&reg->checked.state);
        *oom = state != BP__REFUSED;
        return *oom ? NULL : bp__strdup(reg->checked.refusal, "a plugin check");
    }
    const char *rname = bp_registry_get_name(reg);
    for (size_t i = 0; i < n_plugins; i++) {
        if (strcasecmp(bp_registry_get_name(plugins[i]->reg), rname) == 0) {
            char *why = bp__asprintf("a plugin check", "its registry name '%s' is already "
                                     "provided by %s", rname, plugins[i]->path);
            *oom = why == NULL;
            return why;
        }
    }
    return NULL;
}

/* Adds a record of a refused device of the plugin being loaded (the arg). */
static void record_refusal(void *arg, const char *sentence)
{
    const struct candidate *c = arg;
    add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_REFUSED, "%s", sentence);
}

/* init, the checks of its registry (name, duplicate, devices), bookkeeping. Consumes the
 * handle and descriptor either way. */
static struct bp_plugin *finish_load(struct candidate *c)
{
    bp_clear_error();
    init_dir = c->dirpath;
    bp_registry *reg = c->desc->init();
    init_dir = NULL;
    if (reg == NULL) {
        add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_FAILED,
                   "its init returned no registry: %s",
                   bp_last_error()[0] ? bp_last_error() : "no reason given");
        candidate_close(c);
        return NULL;
    }
    /* The plugin exists before its checks so that their sentences can name it. */
    struct bp_plugin *p = plugin_new(c);
    reg->plugin = p;
    bool oom = p == NULL;
    char *why = p != NULL ? registry_problem(reg, &oom) : NULL;
    if (oom || why != NULL ||
        !bp__grow((void **)&plugins, &cap_plugins, n_plugins + 1, sizeof(*plugins),
                  "the plugin list")) {
        add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_FAILED, "%s",
                   why != NULL ? why : "out of memory while registering it");
        bp__free(why);
        reg->plugin = NULL;
        bp_registry_free(reg);
        if (p != NULL)
            plugin_free_record(p);
        candidate_close(c);
        return NULL;
    }
    p->handle = c->handle;
    p->fd = c->fd;
    c->handle = NULL;
    c->fd = -1;
    p->reg = reg;
    atomic_init(&p->refs, 0);
    plugins[n_plugins++] = p;
    size_t nd = bp_registry_get_device_count(reg);
    /* A registry may say why it has no devices (e.g. CUDA without a driver). */
    const char *(*note_fn)(void) =
        (const char *(*)(void))bp_registry_get_proc_address(reg, "bp_registry_note");
    const char *note = note_fn != NULL ? note_fn() : NULL;
    p->record = add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_LOADED,
                           "registry '%s' with %zu device%s%s%s", bp_registry_get_name(reg), nd,
                           nd == 1 ? "" : "s", note != NULL && note[0] != '\0' ? ": " : "",
                           note != NULL ? note : "");
    /* Devices whose answers break the plugin API are left out of the count above; each gets a
     * record of its own, so `backplane list` says why it is missing. */
    bp__registry_refusals(reg, record_refusal, c);
    return p;
}

/* Frees a loaded plugin: registry (plugin code), then the object, then its descriptor. */
static void plugin_free(struct bp_plugin *p)
{
    bp_registry_free(p->reg);
    dlclose(p->handle);
    close(p->fd);
    plugin_free_record(p);
}

/* ---- Filters ---------------------------------------------------------------------------- */

static bool list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ')
            e++;
        if ((size_t)(e - p) == n && strncasecmp(p, name, n) == 0)
            return true;
        p = e;
    }
    return false;
}

/* NULL when name may load; else the reason. */
static const char *filtered(const char *name)
{
    const char *only = getenv("BP_PLUGINS_ONLY");
    const char *off = getenv("BP_PLUGINS_DISABLE");
    if (off && list_has(off, name))
        return "disabled by BP_PLUGINS_DISABLE";
    if (only && *only && !list_has(only, name))
        return "not named in BP_PLUGINS_ONLY";
    return NULL;
}

/* ---- Discovery -------------------------------------------------------------------------- */

/* The directories searched so far (open and checked) and the candidates found in them. */
struct search {
    struct search_dir {
        int fd;
        char *path; /* resolved */
        const char *given;
        dev_t dev;
        ino_t ino;
    } *dirs;
    size_t n_dirs, cap_dirs;
    struct candidate *cands;
    size_t n, cap;
};

static void search_free(struct search *s)
{
    for (size_t i = 0; i < s->n; i++)
        candidate_free(&s->cands[i]);
    for (size_t i = 0; i < s->n_dirs; i++) {
        close(s->dirs[i].fd);
        bp__free(s->dirs[i].path);
    }
    bp__free(s->cands);
    bp__free(s->dirs);
}

/* Opens and checks dir (the whole path) and adds it to the search; its index, or -1 when it
 * is refused (recorded under rec: the directory, or the file an explicit load asked for),
 * missing (only logged) or, with dedup, the same directory as one searched already. */
static ssize_t add_dir(struct search *s, const char *dir, const char *rec, const char *name,
                       const char *variant, bool dedup)
{
    char *why = NULL, *resolved = NULL;
    int err = 0;
    struct stat st;
    int fd = bp__walk(-1, NULL, dir, BP_WALK_DIR, &st, &resolved, &why, &err);
    if (fd < 0) {
        if (err == ENOENT)
            bp_log(BP_LOG_INFO, "plugin directory %s does not exist", dir);
        else
            add_record(rec, name, variant, -1, BP_PLUGIN_REFUSED, "%s", reason(why));
        bp__free(why);
        return -1;
    }
    for (size_t i = 0; dedup && i < s->n_dirs; i++) {
        if (s->dirs[i].dev == st.st_dev && s->dirs[i].ino == st.st_ino) {
            add_record(dir, "", "", -1, BP_PLUGIN_NOT_SELECTED,
                       "it is the same directory as %s, which is searched already",
                       s->dirs[i].given);
            close(fd);
            bp__free(resolved);
            return -1;
        }
    }
    if (!bp__grow((void **)&s->dirs, &s->cap_dirs, s->n_dirs + 1, sizeof(*s->dirs),
                  "the plugin directories")) {
        add_record(rec, name, variant, -1, BP_PLUGIN_FAILED, "out of memory while searching it");
        close(fd);
        bp__free(resolved);
        return -1;
    }
    s->dirs[s->n_dirs] = (struct search_dir){fd, resolved, dir, st.st_dev, st.st_ino};
    return (ssize_t)s->n_dirs++;
}

/* Adds the candidate dir/entry (lock held); false when memory ran out. */
static bool add_candidate(struct search *s, size_t di, const char *dir, const char *entry)
{
    struct candidate c = {.dirfd = s->dirs[di].fd, .dirpath = s->dirs[di].path, .fd = -1};
    bool oom = false;
    c.path = bp__asprintf("a plugin path", "%s%s%s", dir,
                          dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", entry);
    if (c.path == NULL)
        return false;
    c.entry = c.path + strlen(c.path) - strlen(entry);
    if (!parse_file_name(entry, &c.name, &c.variant, &oom)) {
        if (!oom)
            add_record(c.path, "", "", -1, BP_PLUGIN_REFUSED,
                       "the file name does not match backplane-<name>[-<variant>].so with "
                       "<name> and <variant> made of letters, digits and '_'");
        bp__free(c.path);
        return !oom;
    }
    if (!bp__grow((void **)&s->cands, &s->cap, s->n + 1, sizeof(*s->cands),
                  "plugin candidates")) {
        candidate_free(&c);
        return false;
    }
    s->cands[s->n++] = c;
    return true;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the candidates of one directory (lock held). */
static void scan_dir(struct search *s, const char *dir, bool dedup)
{
    ssize_t di = add_dir(s, dir, dir, "", "", dedup);
    if (di < 0)
        return;
    /* A descriptor of its own for reading: the search keeps the checked one for lookups. */
    int rfd = openat(s->dirs[di].fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = rfd >= 0 ? fdopendir(rfd) : NULL;
    if (d == NULL) {
        add_record(dir, "", "", -1, BP_PLUGIN_REFUSED, "cannot read the directory: %s",
                   strerror(errno));
        if (rfd >= 0)
            close(rfd);
        return;
    }
    char **names = NULL;
    size_t nn = 0, cap = 0;
    bool incomplete = false;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "backplane-", 10) != 0)
            continue;
        char *copy = bp__grow((void **)&names, &cap, nn + 1, sizeof(*names),
                              "a directory listing")
                         ? bp__strdup(e->d_name, "a file name")
                         : NULL;
        if (copy == NULL) {
            incomplete = true;
            break;
        }
        names[nn++] = copy;
    }
    closedir(d);
    if (nn > 1)
        qsort(names, nn, sizeof(*names), cmp_str);
    for (size_t i = 0; i < nn && !incomplete; i++) {
        size_t len = strlen(names[i]);
        /* backplane-*.so.1, backups and the like are not plugins: ignore them quietly. */
        if (len > 3 && strcmp(names[i] + len - 3, ".so") == 0 &&
            !add_candidate(s, (size_t)di, dir, names[i]))
            incomplete = true;
    }
    if (incomplete)
        bp_log(BP_LOG_ERROR, "plugin directory %s: out of memory while listing it; some of its "
               "plugins were not considered", dir);
    for (size_t i = 0; i < nn; i++)
        bp__free(names[i]);
    bp__free(names);
}

/* Loads the best of each <name> among the candidates (lock held). */
static void load_candidates(struct candidate *c, size_t n)
{
    bool *done = bp__calloc(n + 1, sizeof(bool), "plugin candidates");
    if (done == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        /* The group of every candidate with this name, in search order. */
        const char *name = c[i].name;
        const char *why = filtered(name);
        struct bp_plugin *already = find_loaded_name(name);
        for (size_t j = i; j < n; j++) {
            if (done[j] || strcasecmp(c[j].name, name) != 0)
                continue;
            if (why != NULL) {
                add_record(c[j].path, c[j].name, c[j].variant, -1, BP_PLUGIN_FILTERED, "%s", why);
                done[j] = true;
            } else if (already != NULL) {
                add_record(c[j].path, c[j].name, c[j].variant, -1, BP_PLUGIN_NOT_SELECTED,
                           "a plugin named '%s' is already loaded from %s", name, already->path);
                done[j] = true;
            } else {
                prepare(&c[j], &c[i], j - i);
            }
        }
        /* Best score first; the earlier file wins a tie. Fall back if init fails. */
        for (;;) {
            ssize_t best = -1;
            for (size_t j = i; j < n; j++) {
                if (!done[j] && c[j].viable && strcasecmp(c[j].name, name) == 0 &&
                    (best < 0 || c[j].score > c[best].score))
                    best = (ssize_t)j;
            }
            if (best < 0)
                break;
            done[best] = true;
            c[best].viable = false;
            struct bp_plugin *p = finish_load(&c[best]);
            if (p == NULL)
                continue;
            for (size_t j = i; j < n; j++) {
                if (!done[j] && c[j].viable && strcasecmp(c[j].name, name) == 0) {
                    add_record(c[j].path, c[j].name, c[j].variant, c[j].score,
                               BP_PLUGIN_NOT_SELECTED, "%s (score %d) was chosen instead",
                               p->path, c[best].score);
                    candidate_close(&c[j]);
                    c[j].viable = false;
                    done[j] = true;
                }
            }
            break;
        }
        for (size_t j = i; j < n; j++) {
            if (strcasecmp(c[j].name, name) == 0)
                done[j] = true;
        }
    }
    bp__free(done);
}

static void discover(void)
{
    struct search s = {0};
    pthread_mutex_lock(&lock);
    const char *env = secure_getenv("BP_PLUGIN_PATH");
    char *copy = env != NULL ? bp__strdup(env, "BP_PLUGIN_PATH") : NULL;
    if (env != NULL && copy == NULL)
        add_record(env, "", "", -1, BP_PLUGIN_FAILED, "out of memory while reading "
                   "BP_PLUGIN_PATH; its directories were not searched");
    for (char *save = NULL, *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir;
         dir = strtok_r(NULL, ":", &save)) {
        if (dir[0] != '/')
            add_record(dir, "", "", -1, BP_PLUGIN_REFUSED,
                       "relative directories in BP_PLUGIN_PATH are ignored (the current "
                       "directory is never searched)");
        else
            scan_dir(&s, dir, true);
    }
    const char *sys = secure_getenv("BP_PLUGIN_SYSTEM_PATH");
    const bool from_env = sys != NULL;
    if (sys == NULL)
        sys = bp_default_plugin_dir();
    if (sys[0] == '/')
        scan_dir(&s, sys, true);
    else if (sys[0] != '\0') /* empty means no system directory, on purpose */
        add_record(sys, "", "", -1, BP_PLUGIN_REFUSED, "%s is a relative directory and is "
                   "ignored (the current directory is never searched)",
                   from_env ? "BP_PLUGIN_SYSTEM_PATH" : "the configured plugin directory");
    load_candidates(s.cands, s.n);
    /* The directory strings point into copy. */
    search_free(&s);
    bp__free(copy);
    pthread_mutex_unlock(&lock);
}

enum bp_status bp_plugin_load_all(void)
{
    pthread_once(&discovery_once, discover);
    return discovery_status;
}

enum bp_status bp_plugin_load_all_from(const char *dir)
{
    if (dir == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_plugin_load_all_from: dir is NULL");
    if (dir[0] != '/')
        return bp__error(BP_ERR_INVALID_ARG, "bp_plugin_load_all_from: '%s' is not an absolute "
                         "path", dir);
    struct search s = {0};
    pthread_mutex_lock(&lock);
    scan_dir(&s, dir, false);
    load_candidates(s.cands, s.n);
    search_free(&s);
    pthread_mutex_unlock(&lock);
    return BP_OK;
}

bp_plugin *bp_plugin_load(const char *path)
{
    if (path == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_plugin_load: path is NULL");
    if (path[0] != '/') {
        /* A bare name would be looked up by dlopen in LD_LIBRARY_PATH and the like, not
         * where the checks looked: only the file at an absolute path is loaded. */
        pthread_mutex_lock(&lock);
        add_record(path, "", "", -1, BP_PLUGIN_REFUSED, "not an absolute path (relative paths "
                   "are refused)");
        pthread_mutex_unlock(&lock);
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_plugin_load: '%s' is not an absolute "
                              "path; relative paths are refused", path);
    }
    const char *base = strrchr(path, '/') + 1;
    char *dir = bp__asprintf("a plugin directory", "%.*s", (int)(base - path), path);
    if (dir == NULL)
        return NULL;
    struct search s = {0};
    struct bp_plugin *p = NULL;
    struct bp_plugin_record *rec = NULL;
    char *name = NULL, *variant = NULL;
    bool oom = false;
    pthread_mutex_lock(&lock);
    if (!parse_file_name(base, &name, &variant, &oom)) {
        if (!oom)
            rec = add_record(path, "", "", -1, BP_PLUGIN_REFUSED,
                             "the file name does not match backplane-<name>[-<variant>].so");
    } else if ((p = find_loaded_name(name)) != NULL) {
        rec = add_record(path, name, variant, -1, BP_PLUGIN_NOT_SELECTED,
                         "a plugin named '%s' is already loaded from %s", name, p->path);
        p = NULL;
    } else {
        size_t before = n_records;
        ssize_t di = add_dir(&s, dir, path, name, variant, false);
        if (di < 0 && n_records == before) /* a missing directory is only logged by add_dir */
            add_record(path, name, variant, -1, BP_PLUGIN_REFUSED, "its directory %s does not "
                       "exist", dir);
        if (di >= 0 && add_candidate(&s, (size_t)di, dir, base) && s.n == 1 &&
            prepare(&s.cands[0], NULL, 0))
            p = finish_load(&s.cands[0]);
        rec = p == NULL && n_records > before ? &records[n_records - 1]->pub : NULL;
    }
    pthread_mutex_unlock(&lock);
    if (p == NULL)
        bp__error(BP_ERR_PLUGIN, "cannot load plugin %s: %s", path,
                  rec ? rec->message : "out of memory");
    search_free(&s);
    bp__free(name);
    bp__free(variant);
    bp__free(dir);
    return p;
}

enum bp_status bp_plugin_unload(bp_plugin *p)
{
    if (p == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_plugin_unload: plugin is NULL");
    pthread_mutex_lock(&lock);
    if (p->unloaded) {
        pthread_mutex_unlock(&lock);
        return bp__error(BP_ERR_INVALID_ARG, "bp_plugin_unload: plugin %s was unloaded already",
                         p->path);
    }
    int refs = atomic_load(&p->refs);
    if (refs > 0) {
        pthread_mutex_unlock(&lock);
        return bp__error(BP_ERR_BUSY,
                         "plugin %s is still in use by %d buffer%s, backend%s or event%s; free "
                         "them first",
                         p->path, refs, BP_PLURAL(refs), BP_PLURAL(refs), BP_PLURAL(refs));
    }
    /* Room for the tombstone first, so that running out of memory changes nothing. */
    if (!bp__grow((void **)&tombstones, &cap_tombstones, n_tombstones + 1, sizeof(*tombstones),
                  "the unloaded plugins")) {
        pthread_mutex_unlock(&lock);
        return BP_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n_plugins; i++) {
        if (plugins[i] == p) {
            memmove(&plugins[i], &plugins[i + 1], (n_plugins - i - 1) * sizeof(*plugins));
            n_plugins--;
            break;
        }
    }
    if (p->record != NULL)
        p->record->status = BP_PLUGIN_UNLOADED;
    /* The registry's free members are plugin code: free it before closing the object. The
     * names stay for the tombstone's queries. */
    bp_registry_free(p->reg);
    dlclose(p->handle);
    close(p->fd);
    p->reg = NULL;
    p->handle = NULL;
    p->fd = -1;
    p->unloaded = true;
    tombstones[n_tombstones++] = p;
    pthread_mutex_unlock(&lock);
    return BP_OK;
}

__attribute__((destructor)) static void loader_fini(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = n_plugins; i-- > 0;) {
        struct bp_plugin *p = plugins[i];
        if (atomic_load(&p->refs) != 0)
            continue;
        plugin_free(p);
        memmove(&plugins[i], &plugins[i + 1], (n_plugins - i - 1) * sizeof(*plugins));
        n_plugins--;
    }
    for (size_t i = 0; i < n_tombstones; i++) {
        bp__free(tombstones[i]->path);
        bp__free(tombstones[i]->name);
        bp__free(tombstones[i]->variant);
        bp__free(tombstones[i]);
    }
    bp__free(tombstones);
    tombstones = NULL;
    n_tombstones = cap_tombstones = 0;
    if (n_plugins == 0) {
        bp__free(plugins);
        plugins = NULL;
        cap_plugins = 0;
        for (size_t i = 0; i < n_records; i++) {
            bp__free(records[i]->strings);
            bp__free(records[i]);
        }
        bp__free(records);
        records = NULL;
        n_records = cap_records = 0;
    }
    pthread_mutex_unlock(&lock);
}

/* ---- Queries ---------------------------------------------------------------------------- */

size_t bp_plugin_count(void)
{
    bp_plugin_load_all();
    pthread_mutex_lock(&lock);
    size_t n = n_plugins;
    pthread_mutex_unlock(&lock);
    return n;
}

bp_plugin *bp_plugin_get(size_t index)
{
    bp_plugin_load_all();
    pthread_mutex_lock(&lock);
    bp_plugin *p = index < n_plugins ? plugins[index] : NULL;
    pthread_mutex_unlock(&lock);
    if (p == NULL)
        bp__error(BP_ERR_OUT_OF_BOUNDS, "there is no plugin %zu", index);
    return p;
}

bp_plugin *bp_plugin_by_name(const char *name)
{
    if (name == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_plugin_by_name: name is NULL");
    bp_plugin_load_all();
    pthread_mutex_lock(&lock);
    bp_plugin *p = find_loaded_name(name);
    pthread_mutex_unlock(&lock);
    if (p == NULL)
        bp__error(BP_ERR_NOT_FOUND, "no plugin named '%s' is loaded", name);
    return p;
}

const char *bp_plugin_get_name(bp_plugin *p)
{
    return p ? p->name : "";
}

const char *bp_plugin_get_variant(bp_plugin *p)
{
    return p ? p->variant : "";
}

const char *bp_plugin_get_path(bp_plugin *p)
{
    return p ? p->path : "";
}

bp_registry *bp_plugin_get_registry(bp_plugin *p)
{
    if (p != NULL && p->unloaded)
        return bp__error_null(BP_ERR_INVALID_ARG, "plugin %s has been unloaded", p->path);
    return p ? p->reg : NULL;
}

int bp_plugin_get_refcount(bp_plugin *p)
{
    return p ? atomic_load(&p->refs) : 0;
}

size_t bp_plugin_report_count(void)
{
    pthread_mutex_lock(&lock);
    size_t n = n_records;
    pthread_mutex_unlock(&lock);
    return n;
}

const struct bp_plugin_record *bp_plugin_report_get(size_t index)
{
    pthread_mutex_lock(&lock);
    const struct bp_plugin_record *r = index < n_records ? &records[index]->pub : NULL;
    pthread_mutex_unlock(&lock);
    return r;
}

struct bp_plugin *bp__plugin_of_device(bp_device *dev)
{
    return dev && dev->reg ? dev->reg->plugin : NULL;
}

void bp__plugin_ref(struct bp_plugin *p)
{
    if (p)
        atomic_fetch_add(&p->refs, 1);
}

void bp__plugin_unref(struct bp_plugin *p)
{
    if (p)
        atomic_fetch_sub(&p->refs, 1);
}

/* Registries in load order, for select.c (lock taken here). */
size_t bp__registry_snapshot(bp_registry **out, size_t max)
{
    bp_plugin_load_all();
    pthread_mutex_lock(&lock);
    size_t n = n_plugins < max ? n_plugins : max;
    for (size_t i = 0; i < n; i++)
        out[i] = plugins[i]->reg;
    size_t total = n_plugins;
    pthread_mutex_unlock(&lock);
    return total;
}
