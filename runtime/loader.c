/* loader.c - plugin discovery, loading, the load report and safe unload.
 *
 * Search order: every directory of BP_PLUGIN_PATH (colon-separated, read with secure_getenv so
 * a setuid or otherwise elevated process ignores it; relative entries are refused, so the
 * current directory is never searched), then the system directory (BP_PLUGIN_SYSTEM_PATH when
 * set, for tests and relocated installs, else the configured plugin directory).
 *
 * Every file named backplane-<name>[-<variant>].so is a candidate; there is no list of known
 * names. Candidates are grouped by <name>. For each group, BP_PLUGINS_ONLY / BP_PLUGINS_DISABLE
 * decide first, before anything is opened. Then each file is checked (owner, permissions,
 * regular file, ELF magic), opened, and its descriptor checked (size, API version, name,
 * variant, CPU features) before any of its code runs; then its score function, if any, is
 * asked. The highest non-zero score is initialised; if its init fails, the next best is tried.
 * Each file and refused directory gets one record in the report, kept for the life of the
 * process, so `backplane list` can say why something is missing.
 *
 * Buffers, backends and events of a plugin hold a reference on it; unload is refused while any
 * are alive. Discovery runs once (pthread_once); explicit loads and unloads take a mutex.
 *
 * Probing (BP_PLUGIN_PROBE=1): before a file is opened in this process, a forked child opens
 * it and runs its init; a child killed by a signal (or that exits on its own, or takes longer
 * than a minute) gets the file refused with the reason, and the process goes on. Verdicts are
 * cached by path, size and modification time in BP_PLUGIN_PROBE_CACHE (default
 * $XDG_CACHE_HOME/backplane/probe-cache, else ~/.cache/backplane/probe-cache), so each plugin
 * file is probed once. Probe early: the child of a process with other threads may only do
 * what is safe after fork, and dlopen and plugin init are not guaranteed to be. */
#include "config.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend-impl.h"

struct bp_plugin {
    char *path;
    char *name;
    char *variant;
    void *handle;
    bp_registry *reg;
    atomic_int refs;
    struct bp_plugin_record *record;
};

/* A record and the strings it points to, in one allocation-free-able unit. */
struct record {
    struct bp_plugin_record pub;
    char *strings; /* path, name, variant, message back to back */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct bp_plugin **plugins;
static size_t n_plugins;
static struct record **records;
static size_t n_records;

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
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    bp_log(status == BP_PLUGIN_LOADED ? BP_LOG_INFO
           : status == BP_PLUGIN_FAILED || status == BP_PLUGIN_REFUSED ? BP_LOG_WARN
                                                                         : BP_LOG_INFO,
           "plugin %s: %s: %s", path, bp_plugin_status_name(status), msg);

    size_t lp = strlen(path) + 1, ln = strlen(name) + 1, lv = strlen(variant) + 1,
           lm = strlen(msg) + 1;
    struct record *r = bp__calloc(1, sizeof(*r), "a plugin report record");
    char *s = r ? bp__malloc(lp + ln + lv + lm, "a plugin report record") : NULL;
    struct record **grown = s ? bp__realloc(records, (n_records + 1) * sizeof(*records),
                                            "the plugin report") : NULL;
    if (grown == NULL) {
        bp__free(s);
        bp__free(r);
        return NULL;
    }
    records = grown;
    r->strings = s;
    r->pub.path = memcpy(s, path, lp);
    r->pub.name = memcpy(s + lp, name, ln);
    r->pub.variant = memcpy(s + lp + ln, variant, lv);
    r->pub.message = memcpy(s + lp + ln + lv, msg, lm);
    r->pub.score = score;
    r->pub.status = status;
    records[n_records++] = r;
    return &r->pub;
}

/* ---- Candidates ------------------------------------------------------------------------- */

struct candidate {
    char path[PATH_MAX];
    char name[64];
    char variant[64];
    void *handle;
    const struct bp_plugin_descriptor *desc;
    int score;
    bool viable;
};

static bool name_chars(const char *s, size_t n)
{
    if (n == 0 || n >= 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

/* backplane-<name>[-<variant>].so -> name, variant. */
static bool parse_file_name(const char *file, char *name, char *variant)
{
    static const char prefix[] = "backplane-", suffix[] = ".so";
    size_t len = strlen(file), lp = sizeof(prefix) - 1, ls = sizeof(suffix) - 1;
    if (len <= lp + ls || strncmp(file, prefix, lp) != 0 || strcmp(file + len - ls, suffix) != 0)
        return false;
    const char *body = file + lp;
    size_t blen = len - lp - ls;
    const char *dash = memchr(body, '-', blen);
    size_t nlen = dash ? (size_t)(dash - body) : blen;
    size_t vlen = dash ? blen - nlen - 1 : 0;
    if (!name_chars(body, nlen) || (dash && !name_chars(dash + 1, vlen)))
        return false;
    memcpy(name, body, nlen);
    name[nlen] = '\0';
    memcpy(variant, dash ? dash + 1 : "", vlen);
    variant[vlen] = '\0';
    return true;
}

/* Owner root or us; not writable by group or others unless root-owned and sticky. */
static bool safe_owner_and_mode(const struct stat *st, const char *what, char *why, size_t n)
{
    if (st->st_uid != 0 && st->st_uid != geteuid()) {
        snprintf(why, n, "%s is owned by uid %u, neither root nor the current user", what,
                 (unsigned)st->st_uid);
        return false;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_uid == 0 && (st->st_mode & S_ISVTX))) {
        snprintf(why, n, "%s is writable by %s (mode %03o)", what,
                 (st->st_mode & S_IWOTH) ? "others" : "its group", (unsigned)(st->st_mode & 0777));
        return false;
    }
    return true;
}

static bool file_is_safe(const char *path, char *why, size_t n)
{
    struct stat lst, st;
    if (lstat(path, &lst) != 0 || stat(path, &st) != 0) {
        snprintf(why, n, "cannot stat the file: %s", strerror(errno));
        return false;
    }
    /* A link's own mode is always 777 and means nothing; who made it does. */
    if (S_ISLNK(lst.st_mode) && lst.st_uid != 0 && lst.st_uid != geteuid()) {
        snprintf(why, n, "the symbolic link is owned by uid %u, neither root nor the current "
                 "user", (unsigned)lst.st_uid);
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "not a regular file");
        return false;
    }
    if (!safe_owner_and_mode(&st, "the file", why, n))
        return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    unsigned char magic[4] = {0};
    ssize_t got = fd >= 0 ? read(fd, magic, sizeof(magic)) : -1;
    if (fd >= 0)
        close(fd);
    if (got != 4 || memcmp(magic, "\x7f" "ELF", 4) != 0) {
        snprintf(why, n, "not an ELF shared object");
        return false;
    }
    return true;
}

static bool dir_is_safe(const char *dir, char *why, size_t n)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(why, n, "cannot open the directory: %s", strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, n, "not a directory");
        return false;
    }
    return safe_owner_and_mode(&st, "the directory", why, n);
}

static void missing_features(uint64_t missing, char *out, size_t n)
{
    out[0] = '\0';
    for (int bit = 0; bit < 64; bit++) {
        if (((missing >> bit) & 1) == 0)
            continue;
        const char *fname = bp_cpu_feature_name(1ull << bit);
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%s%s", used ? ", " : "", fname ? fname : "unknown");
    }
}

/* Why the descriptor d of candidate c cannot be used (in buf when it needs formatting), or NULL.
 * The probe child runs exactly this too, so a descriptor whose fields point nowhere crashes
 * the child, not the process. */
static const char *descriptor_problem(const struct bp_plugin_descriptor *d,
                                      const struct candidate *c, char *buf, size_t n)
{
    const size_t min_size = offsetof(struct bp_plugin_descriptor, score);
    if (d == NULL)
        return "it has no entry point '" BP_PLUGIN_SYMBOL "' (not a backplane plugin?)";
    if (d->struct_size < min_size) {
        snprintf(buf, n, "its descriptor is %zu bytes, less than the %zu every version has",
                 d->struct_size, min_size);
        return buf;
    }
    if (d->api_major != BP_PLUGIN_API_MAJOR || d->api_minor > BP_PLUGIN_API_MINOR) {
        snprintf(buf, n, "it was built for plugin API %d.%d; this runtime has %d.%d (same major "
                 "and an equal or older minor needed)", d->api_major, d->api_minor,
                 BP_PLUGIN_API_MAJOR, BP_PLUGIN_API_MINOR);
        return buf;
    }
    if (d->name == NULL || strcmp(d->name, c->name) != 0 || d->variant == NULL ||
        strcmp(d->variant, c->variant) != 0) {
        snprintf(buf, n, "its descriptor says name '%s' variant '%s', but the file name says "
                 "'%s' and '%s'", d->name ? d->name : "(null)",
                 d->variant ? d->variant : "(null)", c->name, c->variant);
        return buf;
    }
    if (d->init == NULL)
        return "its descriptor has no init function";
    return NULL;
}

/* Its score (1 without a score function); asked only of a usable descriptor. */
static int descriptor_score(const struct bp_plugin_descriptor *d)
{
    if (d->struct_size >= offsetof(struct bp_plugin_descriptor, score) + sizeof(d->score) &&
        d->score != NULL)
        return d->score();
    return 1;
}

/* ---- Probing in a child process ---------------------------------------------------------- */

static bool probe_cache_path(char *out, size_t n)
{
    const char *p = secure_getenv("BP_PLUGIN_PROBE_CACHE");
    if (p != NULL && p[0] != '\0') {
        snprintf(out, n, "%s", p);
        return true;
    }
    const char *xdg = secure_getenv("XDG_CACHE_HOME"), *home = secure_getenv("HOME");
    if (xdg != NULL && xdg[0] == '/')
        snprintf(out, n, "%s/backplane/probe-cache", xdg);
    else if (home != NULL && home[0] == '/')
        snprintf(out, n, "%s/.cache/backplane/probe-cache", home);
    else
        return false;
    return true;
}

/* The cached verdict for st (a line "<size> <mtime s> <mtime ns> <verdict> <path>"), or false. */
static bool probe_cached(const char *cache, const char *path, const struct stat *st, char *verdict,
                         size_t n)
{
    FILE *f = fopen(cache, "r");
    if (f == NULL)
        return false;
    char line[PATH_MAX + 256];
    bool found = false;
    while (fgets(line, sizeof(line), f) != NULL) {
        long long size, sec, nsec;
        char v[64];
        int used = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%lld %lld %lld %63s %n", &size, &sec, &nsec, v, &used) != 4 || used == 0)
            continue;
        if (strcmp(line + used, path) == 0 && size == (long long)st->st_size &&
            sec == (long long)st->st_mtim.tv_sec && nsec == (long long)st->st_mtim.tv_nsec) {
            snprintf(verdict, n, "%s", v); /* the last line for the file wins */
            found = true;
        }
    }
    fclose(f);
    return found;
}

static void probe_remember(const char *cache, const char *path, const struct stat *st,
                           const char *verdict)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", cache);
    char *slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        char *parent = strrchr(dir, '/');
        if (parent != NULL && parent != dir) { /* .../.cache/backplane: make both levels */
            *parent = '\0';
            mkdir(dir, 0700);
            *parent = '/';
        }
        mkdir(dir, 0700);
    }
    FILE *f = fopen(cache, "a");
    if (f == NULL) {
        bp_log(BP_LOG_WARN, "plugin probe: cannot write the verdict cache %s: %s", cache,
               strerror(errno));
        return;
    }
    fprintf(f, "%lld %lld %lld %s %s\n", (long long)st->st_size, (long long)st->st_mtim.tv_sec,
            (long long)st->st_mtim.tv_nsec, verdict, path);
    fclose(f);
}

/* Sanitizer runtimes, when the program is built with one: its death callbacks (a fuzzer's crash
 * reporter, for instance) belong to the application and must not run in the probe child. */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

/* Opens and initialises path in a child process. True when the child came back normally (or
 * could not even open the file: the real dlopen reports that); otherwise why says what
 * happened to it. */
static bool probe(const struct candidate *c, char *why, size_t n)
{
    const char *path = c->path;
    struct stat st;
    if (stat(path, &st) != 0)
        return true; /* the checks after this say what is wrong */
    char cache[PATH_MAX], verdict[64] = "";
    const bool have_cache = probe_cache_path(cache, sizeof(cache));
    bool cached = have_cache && probe_cached(cache, path, &st, verdict, sizeof(verdict));
    if (!cached) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            bp_log(BP_LOG_WARN, "plugin probe: fork failed (%s); loading %s unprobed",
                   strerror(errno), path);
            return true;
        }
        if (pid == 0) {
            const struct rlimit no_core = {0, 0}; /* a crashing probe leaves no core file */
            setrlimit(RLIMIT_CORE, &no_core);
            /* and dies of the signal: the host's crash handlers (crash reporters, sanitizers,
             * fuzzers) must not treat the probe's crash as the application's */
            static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};
            for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
                signal(fatal[i], SIG_DFL);
            if (__sanitizer_set_death_callback != NULL)
                __sanitizer_set_death_callback(NULL);
            alarm(60);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h == NULL)
                _exit(0);
            const struct bp_plugin_descriptor *d = dlsym(h, BP_PLUGIN_SYMBOL);
            /* what the real load runs, in its order: the same descriptor checks (they read
             * the same strings), features, score, init; and every path ends with dlclose,
             * which runs the file's finalisers */
            char buf[512];
            if (descriptor_problem(d, c, buf, sizeof(buf)) == NULL &&
                (d->cpu_features & ~bp_cpu_features()) == 0 && descriptor_score(d) > 0) {
                bp_registry *reg = d->init();
                if (reg != NULL) /* tidy, for leak checkers that watch the child (valgrind) */
                    bp_registry_free(reg);
            }
            dlclose(h);
            _exit(0);
        }
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (WIFSIGNALED(status))
            snprintf(verdict, sizeof(verdict), "signal:%d", WTERMSIG(status));
        else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
            snprintf(verdict, sizeof(verdict), "exit:%d", WEXITSTATUS(status));
        else
            snprintf(verdict, sizeof(verdict), "ok");
        if (have_cache)
            probe_remember(cache, path, &st, verdict);
    }
    if (strcmp(verdict, "ok") == 0)
        return true;
    int code = 0;
    const char *src = cached ? " (cached verdict; touch the file to probe it again)" : "";
    if (sscanf(verdict, "signal:%d", &code) == 1)
        snprintf(why, n, "the probe crashed: opening and initialising it in a child process "
                 "ended with signal %d (%s)%s", code,
                 code == SIGALRM ? "no answer within a minute" : strsignal(code), src);
    else if (sscanf(verdict, "exit:%d", &code) == 1)
        snprintf(why, n, "the probe exited: opening and initialising it in a child process "
                 "ended the process with status %d%s", code, src);
    else
        snprintf(why, n, "the probe verdict '%s' is not understood%s", verdict, src);
    return false;
}

static bool probing(void)
{
    const char *p = secure_getenv("BP_PLUGIN_PROBE");
    return p != NULL && strcmp(p, "1") == 0;
}

/* Everything before init: file checks, dlopen, descriptor checks, CPU features, score. Records
 * the refusal and closes the handle when the candidate cannot be used. */
static bool prepare(struct candidate *c)
{
    char why[512];
    c->viable = false;
    c->score = -1;
    if (!file_is_safe(c->path, why, sizeof(why))) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_REFUSED, "%s", why);
        return false;
    }
    if (probing() && !probe(c, why, sizeof(why))) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_REFUSED, "%s", why);
        return false;
    }
    dlerror();
    c->handle = dlopen(c->path, RTLD_NOW | RTLD_LOCAL);
    if (c->handle == NULL) {
        const char *err = dlerror();
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_FAILED, "dlopen failed: %s",
                   err ? err : "unknown error");
        return false;
    }
    const struct bp_plugin_descriptor *d = dlsym(c->handle, BP_PLUGIN_SYMBOL);
    char buf[512];
    const char *fail = descriptor_problem(d, c, buf, sizeof(buf));
    if (fail != NULL) {
        add_record(c->path, c->name, c->variant, -1, BP_PLUGIN_FAILED, "%s", fail);
        dlclose(c->handle);
        c->handle = NULL;
        return false;
    }
    uint64_t missing = d->cpu_features & ~bp_cpu_features();
    if (missing != 0) {
        missing_features(missing, buf, sizeof(buf));
        add_record(c->path, c->name, c->variant, 0, BP_PLUGIN_CANNOT_RUN,
                   "it needs CPU features this machine or its OS does not provide: %s", buf);
        dlclose(c->handle);
        c->handle = NULL;
        return false;
    }
    c->desc = d;
    c->score = descriptor_score(d);
    if (c->score <= 0) {
        add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_CANNOT_RUN,
                   "its score is %d: it cannot run on this machine", c->score);
        dlclose(c->handle);
        c->handle = NULL;
        return false;
    }
    c->viable = true;
    return true;
}

static struct bp_plugin *find_loaded_name(const char *name)
{
    for (size_t i = 0; i < n_plugins; i++) {
        if (strcasecmp(plugins[i]->name, name) == 0)
            return plugins[i];
    }
    return NULL;
}

/* init, duplicate registry check, bookkeeping. Consumes the handle either way. */
static struct bp_plugin *finish_load(struct candidate *c)
{
    bp_clear_error();
    bp_registry *reg = c->desc->init();
    if (reg == NULL) {
        add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_FAILED,
                   "its init returned no registry: %s",
                   bp_last_error()[0] ? bp_last_error() : "no reason given");
        dlclose(c->handle);
        return NULL;
    }
    const char *rname = bp_registry_name(reg);
    for (size_t i = 0; i < n_plugins; i++) {
        if (strcasecmp(bp_registry_name(plugins[i]->reg), rname) == 0) {
            add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_FAILED,
                       "its registry name '%s' is already provided by %s", rname,
                       plugins[i]->path);
            bp_registry_free(reg);
            dlclose(c->handle);
            return NULL;
        }
    }
    struct bp_plugin *p = bp__calloc(1, sizeof(*p), "a plugin");
    struct bp_plugin **grown =
        p ? bp__realloc(plugins, (n_plugins + 1) * sizeof(*plugins), "the plugin list") : NULL;
    if (p)
        p->path = bp__strdup(c->path, "a plugin path");
    if (p)
        p->name = bp__strdup(c->name, "a plugin name");
    if (p)
        p->variant = bp__strdup(c->variant, "a plugin variant");
    if (grown == NULL || p->path == NULL || p->name == NULL || p->variant == NULL) {
        if (grown)
            plugins = grown;
        if (p) {
            bp__free(p->path);
            bp__free(p->name);
            bp__free(p->variant);
        }
        bp__free(p);
        add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_FAILED,
                   "out of memory while registering it");
        bp_registry_free(reg);
        dlclose(c->handle);
        return NULL;
    }
    plugins = grown;
    p->handle = c->handle;
    p->reg = reg;
    atomic_init(&p->refs, 0);
    reg->plugin = p;
    plugins[n_plugins++] = p;
    size_t nd = bp_registry_device_count(reg);
    /* A registry may say why it has no devices (e.g. CUDA without a driver). */
    const char *(*note_fn)(void) =
        (const char *(*)(void))bp_registry_get_proc_address(reg, "bp_registry_note");
    const char *note = note_fn != NULL ? note_fn() : NULL;
    p->record = add_record(c->path, c->name, c->variant, c->score, BP_PLUGIN_LOADED,
                           "registry '%s' with %zu device%s%s%s", rname, nd, nd == 1 ? "" : "s",
                           note != NULL && note[0] != '\0' ? ": " : "",
                           note != NULL ? note : "");
    return p;
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

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the candidates of one directory (lock held). */
static void scan_dir(const char *dir, struct candidate **cands, size_t *n, size_t *cap)
{
    char why[512];
    if (!dir_is_safe(dir, why, sizeof(why))) {
        if (errno == ENOENT)
            bp_log(BP_LOG_INFO, "plugin directory %s does not exist", dir);
        else
            add_record(dir, "", "", -1, BP_PLUGIN_REFUSED, "%s", why);
        return;
    }
    DIR *d = opendir(dir);
    if (d == NULL) {
        add_record(dir, "", "", -1, BP_PLUGIN_REFUSED, "cannot read the directory: %s",
                   strerror(errno));
        return;
    }
    char **names = NULL;
    size_t nn = 0;
    bool incomplete = false;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "backplane-", 10) != 0)
            continue;
        char **grown = bp__realloc(names, (nn + 1) * sizeof(*names), "a directory listing");
        char *copy = grown ? bp__strdup(e->d_name, "a file name") : NULL;
        if (grown)
            names = grown;
        if (copy == NULL) {
            incomplete = true;
            break;
        }
        names[nn++] = copy;
    }
    closedir(d);
    if (incomplete)
        bp_log(BP_LOG_ERROR, "plugin directory %s: out of memory while listing it; plugins after "
               "the first %zu were not considered", dir, nn);
    if (nn > 1)
        qsort(names, nn, sizeof(*names), cmp_str);
    for (size_t i = 0; i < nn; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        size_t len = strlen(names[i]);
        bool so = len > 3 && strcmp(names[i] + len - 3, ".so") == 0;
        struct candidate c = {0};
        if (!so) {
            /* backplane-*.so.1, backups and the like are not plugins: ignore them quietly. */
        } else if (!parse_file_name(names[i], c.name, c.variant)) {
            add_record(path, "", "", -1, BP_PLUGIN_REFUSED,
                       "the file name does not match backplane-<name>[-<variant>].so with "
                       "<name> and <variant> made of letters, digits and '_'");
        } else {
            if (*n == *cap) {
                size_t nc = *cap ? 2 * *cap : 16;
                struct candidate *grown = bp__realloc(*cands, nc * sizeof(**cands),
                                                      "plugin candidates");
                if (grown == NULL)
                    break;
                *cands = grown;
                *cap = nc;
            }
            snprintf(c.path, sizeof(c.path), "%s", path);
            (*cands)[(*n)++] = c;
        }
    }
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
                prepare(&c[j]);
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
                    dlclose(c[j].handle);
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
    struct candidate *cands = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&lock);
    const char *env = secure_getenv("BP_PLUGIN_PATH");
    if (env != NULL) {
        char *copy = bp__strdup(env, "BP_PLUGIN_PATH");
        for (char *save = NULL, *dir = copy ? strtok_r(copy, ":", &save) : NULL; dir;
             dir = strtok_r(NULL, ":", &save)) {
            if (dir[0] != '/')
                add_record(dir, "", "", -1, BP_PLUGIN_REFUSED,
                           "relative directories in BP_PLUGIN_PATH are ignored (the current "
                           "directory is never searched)");
            else
                scan_dir(dir, &cands, &n, &cap);
        }
        bp__free(copy);
    }
    const char *sys = secure_getenv("BP_PLUGIN_SYSTEM_PATH");
    if (sys == NULL)
        sys = bp_default_plugin_dir();
    if (sys[0] == '/')
        scan_dir(sys, &cands, &n, &cap);
    load_candidates(cands, n);
    pthread_mutex_unlock(&lock);
    bp__free(cands);
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
    struct candidate *cands = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&lock);
    scan_dir(dir, &cands, &n, &cap);
    load_candidates(cands, n);
    pthread_mutex_unlock(&lock);
    bp__free(cands);
    return BP_OK;
}

bp_plugin *bp_plugin_load(const char *path)
{
    if (path == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_plugin_load: path is NULL");
    struct candidate c = {0};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    pthread_mutex_lock(&lock);
    struct bp_plugin *p = NULL;
    struct bp_plugin_record *rec = NULL;
    if (strlen(path) >= sizeof(c.path) || !parse_file_name(base, c.name, c.variant)) {
        rec = add_record(path, "", "", -1, BP_PLUGIN_REFUSED,
                         "the file name does not match backplane-<name>[-<variant>].so");
    } else if ((p = find_loaded_name(c.name)) != NULL) {
        rec = add_record(path, c.name, c.variant, -1, BP_PLUGIN_NOT_SELECTED,
                         "a plugin named '%s' is already loaded from %s", c.name, p->path);
        p = NULL;
    } else {
        snprintf(c.path, sizeof(c.path), "%s", path);
        if (prepare(&c))
            p = finish_load(&c);
        rec = p ? NULL : (n_records ? &records[n_records - 1]->pub : NULL);
    }
    pthread_mutex_unlock(&lock);
    if (p == NULL)
        bp__error(BP_ERR_PLUGIN, "cannot load plugin %s: %s", path,
                  rec ? rec->message : "out of memory");
    return p;
}

enum bp_status bp_plugin_unload(bp_plugin *p)
{
    if (p == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_plugin_unload: plugin is NULL");
    pthread_mutex_lock(&lock);
    int refs = atomic_load(&p->refs);
    if (refs > 0) {
        pthread_mutex_unlock(&lock);
        return bp__error(BP_ERR_BUSY,
                         "plugin %s is still in use by %d buffer%s, backend%s or event%s; free "
                         "them first",
                         p->path, refs, refs == 1 ? "" : "s", refs == 1 ? "" : "s",
                         refs == 1 ? "" : "s");
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
    /* The registry's free members are plugin code: free it before closing the object. */
    bp_registry_free(p->reg);
    dlclose(p->handle);
    bp__free(p->path);
    bp__free(p->name);
    bp__free(p->variant);
    bp__free(p);
    pthread_mutex_unlock(&lock);
    return BP_OK;
}

/* At exit: close what is idle and free the report, so leak checkers see a clean process. Busy
 * plugins stay mapped: their objects may still be freed by other destructors. */
__attribute__((destructor)) static void loader_fini(void)
{
    pthread_mutex_lock(&lock);
    for (size_t i = n_plugins; i-- > 0;) {
        struct bp_plugin *p = plugins[i];
        if (atomic_load(&p->refs) != 0)
            continue;
        bp_registry_free(p->reg);
        dlclose(p->handle);
        bp__free(p->path);
        bp__free(p->name);
        bp__free(p->variant);
        bp__free(p);
        memmove(&plugins[i], &plugins[i + 1], (n_plugins - i - 1) * sizeof(*plugins));
        n_plugins--;
    }
    if (n_plugins == 0) {
        bp__free(plugins);
        plugins = NULL;
        for (size_t i = 0; i < n_records; i++) {
            bp__free(records[i]->strings);
            bp__free(records[i]);
        }
        bp__free(records);
        records = NULL;
        n_records = 0;
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

const char *bp_plugin_name(bp_plugin *p)
{
    return p ? p->name : "";
}

const char *bp_plugin_variant(bp_plugin *p)
{
    return p ? p->variant : "";
}

const char *bp_plugin_path(bp_plugin *p)
{
    return p ? p->path : "";
}

bp_registry *bp_plugin_get_registry(bp_plugin *p)
{
    return p ? p->reg : NULL;
}

int bp_plugin_refcount(bp_plugin *p)
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
