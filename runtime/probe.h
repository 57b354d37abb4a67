/* probe.h - private to runtime/: opening and initialising a plugin file in a forked child
 * before the process itself does (probe.c), and the cache of its verdicts. Used by loader.c. */
#ifndef BACKPLANE_PROBE_H
#define BACKPLANE_PROBE_H

#include <stdbool.h>
#include <sys/stat.h>

#include <backplane/bp-plugin.h>

/* Whether probing is asked for (BP_PLUGIN_PROBE=1, read with secure_getenv). */
bool bp__probing(void);

/* Decides in the probe child whether the plugin's init is run: the loader's own checks on the
 * descriptor d (which may be NULL), in the order of the real load, given its argument. */
typedef bool bp__probe_check_fn(const struct bp_plugin_descriptor *d, const void *arg);

/* Probes the plugin file open as fdpath ("/proc/self/fd/<n>", inherited by the child; path is
 * what the report and the cache call it, st its identity): a child dlopens it, runs check and,
 * when that passes, the file's init. True when the child came back normally (or could not
 * even open the file: the real dlopen reports that) or the cache says it did; otherwise false
 * with *why (heap; NULL when memory ran out) saying what happened to it. */
bool bp__probe(const char *path, const char *fdpath, const struct stat *st,
               bp__probe_check_fn *check, const void *arg, char **why);

#endif
