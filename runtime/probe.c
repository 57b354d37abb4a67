/* probe.c - probing a plugin file in a forked child before the process opens it, and the
 * cache of the verdicts.
 *
 * Probing (BP_PLUGIN_PROBE=1): before a file is opened in this process, a forked child opens
 * it and runs its init; a child killed by a signal (or that exits on its own, or takes longer
 * than a minute) gets the file refused with the reason, and the process goes on. Verdicts are
 * cached by path, size and modification time in BP_PLUGIN_PROBE_CACHE (default
 * $XDG_CACHE_HOME/backplane/probe-cache, else ~/.cache/backplane/probe-cache), so each plugin
 * file is probed once. Probe early: the child of a process with other threads may only do
 * what is safe after fork, and dlopen and plugin init are not guaranteed to be. */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bp-impl.h"
#include "probe.h"

static char *probe_cache_path(void)
{
    const char *p = secure_getenv("BP_PLUGIN_PROBE_CACHE");
    if (p != NULL && p[0] != '\0')
        return bp__strdup(p, "the probe cache path");
    const char *xdg = secure_getenv("XDG_CACHE_HOME"), *home = secure_getenv("HOME");
    if (xdg != NULL && xdg[0] == '/')
        return bp__asprintf("the probe cache path", "%s/backplane/probe-cache", xdg);
    if (home != NULL && home[0] == '/')
        return bp__asprintf("the probe cache path", "%s/.cache/backplane/probe-cache", home);
    return NULL;
}

/* The cache as a stream, or NULL. Opened non-blocking and used only when it is a regular file:
 * a FIFO or device named by BP_PLUGIN_PROBE_CACHE must not hang or feed discovery. */
static FILE *open_cache(const char *cache, bool append)
{
    int flags = append ? O_WRONLY | O_APPEND | O_CREAT : O_RDONLY;
    int fd = open(cache, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600);
    struct stat st;
    if (fd < 0) {
        if (append || errno != ENOENT)
            bp_log(BP_LOG_WARN, "plugin probe: cannot %s the verdict cache %s: %s",
                   append ? "write" : "read", cache, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        bp_log(BP_LOG_WARN, "plugin probe: the verdict cache %s is not a regular file; probing "
               "without it", cache);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, append ? "a" : "r");
    if (f == NULL)
        close(fd);
    return f;
}

/* The cached verdict for st (a line "<size> <mtime s> <mtime ns> <verdict> <path>"), or false. */
static bool probe_cached(const char *cache, const char *path, const struct stat *st, char *verdict,
                         size_t n)
{
    FILE *f = open_cache(cache, false);
    if (f == NULL)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (getline(&line, &cap, f) >= 0) {
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
    free(line); /* getline's buffer comes from malloc */
    fclose(f);
    return found;
}

static void probe_remember(const char *cache, const char *path, const struct stat *st,
                           const char *verdict)
{
    char *dir = bp__strdup(cache, "the probe cache path");
    char *slash = dir ? strrchr(dir, '/') : NULL;
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
    bp__free(dir);
    FILE *f = open_cache(cache, true);
    if (f == NULL)
        return;
    fprintf(f, "%lld %lld %lld %s %s\n", (long long)st->st_size, (long long)st->st_mtim.tv_sec,
            (long long)st->st_mtim.tv_nsec, verdict, path);
    fclose(f);
}

/* Sanitizer runtimes, when the program is built with one: its death callbacks (a fuzzer's crash
 * reporter, for instance) belong to the application and must not run in the probe child. */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

/* The probe child: loads the inherited descriptor, runs what the real load runs and exits. A
 * crash ends it by the signal, which is the verdict. */
static void __attribute__((noreturn)) probe_child(const char *fdpath, bp__probe_check_fn *check,
                                                  const void *arg)
{
    const struct rlimit no_core = {0, 0}; /* a crashing probe leaves no core file */
    setrlimit(RLIMIT_CORE, &no_core);
    /* and dies of the signal: the host's crash handlers (crash reporters, sanitizers, fuzzers)
     * must not treat the probe's crash as the application's */
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP};
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
        signal(fatal[i], SIG_DFL);
    if (__sanitizer_set_death_callback != NULL)
        __sanitizer_set_death_callback(NULL);
    alarm(60);
    /* the inherited descriptor: the child loads the file the parent checked */
    void *h = dlopen(fdpath, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        _exit(0);
    /* what the real load runs, in its order: the loader's checks, then init; and every path
     * ends with dlclose, which runs the file's finalisers */
    const struct bp_plugin_descriptor *d = dlsym(h, BP_PLUGIN_SYMBOL);
    if (check(d, arg)) {
        bp_registry *reg = d->init();
        if (reg != NULL) /* tidy, for leak checkers that watch the child (valgrind) */
            bp_registry_free(reg);
    }
    dlclose(h);
    _exit(0);
}

/* Runs the probe child for fdpath and writes its verdict ("ok", "signal:N", "exit:N"). False
 * when no child could be started. cache is the parent's, freed in the child only to keep leak
 * checkers that watch the child quiet. */
static bool run_probe(const char *path, const char *fdpath, bp__probe_check_fn *check,
                      const void *arg, char *cache, char *verdict, size_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        bp_log(BP_LOG_WARN, "plugin probe: fork failed (%s); loading %s unprobed",
               strerror(errno), path);
        return false;
    }
    if (pid == 0) {
        bp__free(cache);
        probe_child(fdpath, check, arg);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFSIGNALED(status))
        snprintf(verdict, n, "signal:%d", WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        snprintf(verdict, n, "exit:%d", WEXITSTATUS(status));
    else
        snprintf(verdict, n, "ok");
    return true;
}

/* The refusal a verdict other than "ok" stands for (heap). */
static char *verdict_reason(const char *verdict, bool cached)
{
    int code = 0;
    const char *src = cached ? " (cached verdict; touch the file to probe it again)" : "";
    if (sscanf(verdict, "signal:%d", &code) == 1)
        return bp__asprintf("a probe verdict", "the probe crashed: opening and initialising it "
                            "in a child process ended with signal %d (%s)%s", code,
                            code == SIGALRM ? "no answer within a minute" : strsignal(code), src);
    if (sscanf(verdict, "exit:%d", &code) == 1)
        return bp__asprintf("a probe verdict", "the probe exited: opening and initialising it "
                            "in a child process ended the process with status %d%s", code, src);
    return bp__asprintf("a probe verdict", "the probe verdict '%s' is not understood%s", verdict,
                        src);
}

/* Declared in probe.h. */
bool bp__probe(const char *path, const char *fdpath, const struct stat *st,
               bp__probe_check_fn *check, const void *arg, char **why)
{
    char *cache = probe_cache_path(), verdict[64] = "";
    bool cached = cache != NULL && probe_cached(cache, path, st, verdict, sizeof(verdict));
    if (!cached) {
        if (!run_probe(path, fdpath, check, arg, cache, verdict, sizeof(verdict))) {
            bp__free(cache);
            return true;
        }
        if (cache != NULL)
            probe_remember(cache, path, st, verdict);
    }
    bp__free(cache);
    if (strcmp(verdict, "ok") == 0)
        return true;
    *why = verdict_reason(verdict, cached);
    return false;
}

/* Declared in probe.h. */
bool bp__probing(void)
{
    const char *p = secure_getenv("BP_PLUGIN_PROBE");
    return p != NULL && strcmp(p, "1") == 0;
}
