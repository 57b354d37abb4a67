/* select.c - finding registries and devices by name or type, and backends by name string.
 *
 * Names compare case-insensitively. "Meta(A,B,...)" names are handed to whichever registry
 * offers the proc address "bp_meta_init_by_name" (the meta plugin); everything else is a device
 * name ("CUDA0") or a registry name ("CPU", meaning its first device). An unknown name is an
 * error that lists the names that do exist, so a typo is obvious, and says why a registry that
 * exists offers no device (its plugin's bp_registry_note), so a missing driver is too. The
 * lists are built on the heap: however many and however long the names, none is cut off. */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "backend-impl.h"

#define MAX_REGISTRIES 64

/* Signature of the meta plugin's "bp_meta_init_by_name" proc address. */
typedef bp_backend *(*bp_meta_init_by_name_fn)(const char *name, const char *params);

size_t bp_registry_count(void)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp__registry_snapshot(regs, MAX_REGISTRIES);
    return n < MAX_REGISTRIES ? n : MAX_REGISTRIES;
}

bp_registry *bp_registry_get(size_t index)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count();
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    if (index >= n)
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS, "%zu registr%s loaded; there is no "
                              "registry %zu", n, n == 1 ? "y is" : "ies are", index);
    return regs[index];
}

/* Why reg has no devices: its plugin's own note (proc address "bp_registry_note"), or a pointer
 * to the load report. */
static const char *empty_reason(bp_registry *reg)
{
    const char *(*note_fn)(void) =
        (const char *(*)(void))bp_registry_get_proc_address(reg, "bp_registry_note");
    const char *note = note_fn != NULL ? note_fn() : NULL;
    return note != NULL && note[0] != '\0' ? note
                                           : "its plugin gives no reason (see `backplane list`)";
}

/* "none (no plugin is loaded: ...)" with the load report's first refusal or failure, so that
 * the error says why (a plugin directory writable by its group, a missing library) instead of
 * only that nothing loaded (heap; NULL when memory ran out). */
static char *no_plugin_reason(void)
{
    const size_t nr = bp_plugin_report_count();
    size_t bad = 0;
    const struct bp_plugin_record *first = NULL;
    for (size_t i = 0; i < nr; i++) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        if (r != NULL && (r->status == BP_PLUGIN_REFUSED || r->status == BP_PLUGIN_FAILED)) {
            first = first != NULL ? first : r;
            bad++;
        }
    }
    if (first == NULL)
        return bp__asprintf("a list of names", "none (no plugin is loaded: %s; see `backplane "
                            "list`)", nr == 0 ? "no plugin file was found on the search path"
                                              : "none was refused or failed");
    char *path = bp__escape_dup(first->path, "a list of names");
    char *s = path ? bp__asprintf("a list of names", "none (no plugin is loaded: %zu refused or "
                                  "failed, the first %s: %s; see `backplane list`)", bad, path,
                                  first->message)
                   : NULL;
    bp__free(path);
    return s;
}

/* "A, B, C" of every registry or device name, for error messages (heap; NULL when memory ran
 * out). The device list ends with why each registry without devices has none. */
static char *list_names(bool devices)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count();
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    char *out = bp__strdup("", "a list of names");
    for (size_t i = 0; i < n && out != NULL; i++) {
        size_t nd = devices ? bp_registry_get_device_count(regs[i]) : 1;
        for (size_t j = 0; j < nd && out != NULL; j++) {
            const char *name = devices ? bp_device_get_name(bp_registry_get_device(regs[i], j))
                                       : bp_registry_get_name(regs[i]);
            out = bp__strcat_printf(out, "a list of names", "%s%s", out[0] ? ", " : "", name);
        }
    }
    if (out != NULL && out[0] == '\0') {
        bp__free(out);
        out = n == 0 ? no_plugin_reason()
                     : bp__strdup("none (the loaded plugins found no devices; see `backplane "
                                  "list`)", "a list of names");
    }
    for (size_t i = 0; devices && i < n && out != NULL; i++) {
        if (bp_registry_get_device_count(regs[i]) == 0)
            out = bp__strcat_printf(out, "a list of names", "; registry '%s' has no devices: %s",
                                    bp_registry_get_name(regs[i]), empty_reason(regs[i]));
    }
    return out;
}

/* What to print when a list could not be built. */
static const char *names_or_oom(const char *names)
{
    return names != NULL ? names : "(out of memory while listing them)";
}

bp_registry *bp_registry_by_name(const char *name)
{
    if (name == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_registry_by_name: name is NULL");
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count();
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(bp_registry_get_name(regs[i]), name) == 0)
            return regs[i];
    }
    char *names = list_names(false);
    bp__error(BP_ERR_NOT_FOUND, "no registry is named '%s'; registries: %s", name,
              names_or_oom(names));
    bp__free(names);
    return NULL;
}

size_t bp_device_count(void)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count(), total = 0;
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++)
        total += bp_registry_get_device_count(regs[i]);
    return total;
}

bp_device *bp_device_get(size_t index)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count(), at = index;
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++) {
        size_t nd = bp_registry_get_device_count(regs[i]);
        if (at < nd)
            return bp_registry_get_device(regs[i], at);
        at -= nd;
    }
    size_t nd = bp_device_count();
    return bp__error_null(BP_ERR_OUT_OF_BOUNDS, "%zu device%s available; there is no device %zu",
                          nd, nd == 1 ? " is" : "s are", index);
}

static bp_device *find_device(const char *name)
{
    size_t n = bp_device_count();
    for (size_t i = 0; i < n; i++) {
        bp_device *d = bp_device_get(i);
        if (d != NULL && strcasecmp(bp_device_get_name(d), name) == 0)
            return d;
    }
    return NULL;
}

/* The device of that name, or "CPU0" for a registry's only device "CPU"; NULL (no error). */
static bp_device *device_named(const char *name)
{
    bp_device *d = find_device(name);
    if (d != NULL)
        return d;
    const size_t len = strlen(name);
    if (len >= 2 && len < 256 && name[len - 1] == '0' && name[len - 2] != '0') {
        char base[256];
        memcpy(base, name, len - 1);
        base[len - 1] = '\0';
        d = find_device(base);
        if (d != NULL && bp_registry_get_device_count(bp_device_get_registry(d)) == 1)
            return d;
    }
    return NULL;
}

bp_device *bp_device_by_name(const char *name)
{
    if (name == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_device_by_name: name is NULL");
    bp_device *d = device_named(name);
    if (d != NULL)
        return d;
    char *names = list_names(true);
    bp__error(BP_ERR_NOT_FOUND, "no device is named '%s'; devices: %s", name, names_or_oom(names));
    bp__free(names);
    return NULL;
}

bp_device *bp_device_by_type(enum bp_device_type type)
{
    size_t n = bp_device_count();
    for (size_t i = 0; i < n; i++) {
        bp_device *d = bp_device_get(i);
        if (d != NULL && bp_device_get_type(d) == type)
            return d;
    }
    char *names = list_names(true);
    bp__error(BP_ERR_NOT_FOUND, "no device of type %s is available; devices: %s",
              bp_device_type_name(type), names_or_oom(names));
    bp__free(names);
    return NULL;
}

static bp_backend *init_meta(const char *name, const char *params)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count();
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++) {
        void *fn = bp_registry_get_proc_address(regs[i], "bp_meta_init_by_name");
        if (fn != NULL)
            return ((bp_meta_init_by_name_fn)fn)(name, params);
    }
    /* Say what happened to the meta plugin, when discovery saw one: a refusal or an
     * out-of-memory during loading is the answer, not "is it installed?". */
    for (size_t i = bp_plugin_report_count(); i-- > 0;) {
        const struct bp_plugin_record *r = bp_plugin_report_get(i);
        if (r != NULL && strcasecmp(r->name, "meta") == 0 && r->status != BP_PLUGIN_LOADED)
            return bp__error_null(BP_ERR_NOT_FOUND,
                                  "'%s' names a meta device, but the meta plugin %s was not "
                                  "loaded (%s): %s",
                                  name, r->path, bp_plugin_status_name(r->status), r->message);
    }
    return bp__error_null(BP_ERR_NOT_FOUND,
                          "'%s' names a meta device, but no loaded plugin provides one (is the "
                          "meta plugin installed and enabled?)",
                          name);
}

bp_backend *bp_backend_init_by_name(const char *name, const char *params)
{
    if (name == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_backend_init_by_name: name is NULL");
    if (strchr(name, '(') != NULL)
        return init_meta(name, params);
    bp_device *d = device_named(name);
    if (d == NULL) {
        bp_registry *regs[MAX_REGISTRIES];
        size_t n = bp_registry_count();
        bp__registry_snapshot(regs, MAX_REGISTRIES);
        for (size_t i = 0; i < n; i++) {
            if (strcasecmp(bp_registry_get_name(regs[i]), name) != 0)
                continue;
            if (bp_registry_get_device_count(regs[i]) == 0)
                return bp__error_null(BP_ERR_NOT_FOUND, "registry '%s' exists but has no "
                                      "devices: %s", bp_registry_get_name(regs[i]),
                                      empty_reason(regs[i]));
            d = bp_registry_get_device(regs[i], 0);
            break;
        }
    }
    if (d == NULL) {
        char *devs = list_names(true), *regs_s = list_names(false);
        bp__error(BP_ERR_NOT_FOUND,
                  "no device or registry is named '%s'; devices: %s; registries: %s", name,
                  names_or_oom(devs), names_or_oom(regs_s));
        bp__free(devs);
        bp__free(regs_s);
        return NULL;
    }
    return bp_device_init_backend(d, params);
}

bp_backend *bp_backend_init_by_type(enum bp_device_type type, const char *params)
{
    bp_device *d = bp_device_by_type(type);
    return d ? bp_device_init_backend(d, params) : NULL;
}

bp_backend *bp_backend_init_best(void)
{
    static const enum bp_device_type order[] = {BP_DEVICE_TYPE_GPU, BP_DEVICE_TYPE_ACCEL,
                                                BP_DEVICE_TYPE_CPU};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        size_t n = bp_device_count();
        for (size_t j = 0; j < n; j++) {
            bp_device *d = bp_device_get(j);
            if (d != NULL && bp_device_get_type(d) == order[i])
                return bp_device_init_backend(d, NULL);
        }
    }
    char *names = list_names(true);
    bp__error(BP_ERR_NOT_FOUND, "no GPU, accelerator or CPU device is available; devices: %s",
              names_or_oom(names));
    bp__free(names);
    return NULL;
}
