/* select.c - finding registries and devices by name or type, and backends by name string.
 *
 * Names compare case-insensitively. "Meta(A,B,...)" names are handed to whichever registry
 * offers the proc address "bp_meta_init_by_name" (the meta plugin); everything else is a device
 * name ("CUDA0") or a registry name ("CPU", meaning its first device). An unknown name is an
 * error that lists the names that do exist, so a typo is obvious. */
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
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS, "there are %zu registries; there is no "
                              "registry %zu", n, index);
    return regs[index];
}

/* "A, B, C" of every registry or device name, for error messages. */
static void list_names(bool devices, char *out, size_t size)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count();
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t nd = devices ? bp_registry_device_count(regs[i]) : 1;
        for (size_t j = 0; j < nd; j++) {
            const char *name = devices ? bp_device_name(regs[i]->iface->get_device(regs[i], j))
                                       : bp_registry_name(regs[i]);
            size_t used = strlen(out);
            snprintf(out + used, size - used, "%s%s", used ? ", " : "", name);
        }
    }
    if (out[0] == '\0')
        snprintf(out, size, n == 0 ? "none (no plugin is loaded; see `backplane list`)"
                                   : "none (the loaded plugins found no devices; see "
                                     "`backplane list`)");
}

bp_registry *bp_registry_by_name(const char *name)
{
    if (name == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_registry_by_name: name is NULL");
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count();
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(bp_registry_name(regs[i]), name) == 0)
            return regs[i];
    }
    char names[512];
    list_names(false, names, sizeof(names));
    return bp__error_null(BP_ERR_NOT_FOUND, "no registry is named '%s'; registries: %s", name,
                          names);
}

size_t bp_device_count(void)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count(), total = 0;
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++)
        total += bp_registry_device_count(regs[i]);
    return total;
}

bp_device *bp_device_get(size_t index)
{
    bp_registry *regs[MAX_REGISTRIES];
    size_t n = bp_registry_count(), at = index;
    bp__registry_snapshot(regs, MAX_REGISTRIES);
    for (size_t i = 0; i < n; i++) {
        size_t nd = bp_registry_device_count(regs[i]);
        if (at < nd)
            return bp_registry_get_device(regs[i], at);
        at -= nd;
    }
    return bp__error_null(BP_ERR_OUT_OF_BOUNDS, "there are %zu devices; there is no device %zu",
                          bp_device_count(), index);
}

static bp_device *find_device(const char *name)
{
    size_t n = bp_device_count();
    for (size_t i = 0; i < n; i++) {
        bp_device *d = bp_device_get(i);
        if (d != NULL && strcasecmp(bp_device_name(d), name) == 0)
            return d;
    }
    return NULL;
}

bp_device *bp_device_by_name(const char *name)
{
    if (name == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_device_by_name: name is NULL");
    bp_device *d = find_device(name);
    if (d != NULL)
        return d;
    char names[512];
    list_names(true, names, sizeof(names));
    return bp__error_null(BP_ERR_NOT_FOUND, "no device is named '%s'; devices: %s", name, names);
}

bp_device *bp_device_by_type(enum bp_device_type type)
{
    size_t n = bp_device_count();
    for (size_t i = 0; i < n; i++) {
        bp_device *d = bp_device_get(i);
        if (d != NULL && bp_device_get_type(d) == type)
            return d;
    }
    return bp__error_null(BP_ERR_NOT_FOUND, "no device of type %s is available",
                          bp_device_type_name(type));
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
    bp_device *d = find_device(name);
    if (d == NULL) {
        bp_registry *regs[MAX_REGISTRIES];
        size_t n = bp_registry_count();
        bp__registry_snapshot(regs, MAX_REGISTRIES);
        for (size_t i = 0; i < n && d == NULL; i++) {
            if (strcasecmp(bp_registry_name(regs[i]), name) == 0 &&
                bp_registry_device_count(regs[i]) > 0)
                d = bp_registry_get_device(regs[i], 0);
        }
    }
    if (d == NULL) {
        char devs[512], regs_s[256];
        list_names(true, devs, sizeof(devs));
        list_names(false, regs_s, sizeof(regs_s));
        return bp__error_null(BP_ERR_NOT_FOUND,
                              "no device or registry is named '%s'; devices: %s; registries: %s",
                              name, devs, regs_s);
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
    char names[512];
    list_names(true, names, sizeof(names));
    return bp__error_null(BP_ERR_NOT_FOUND, "no GPU, accelerator or CPU device is available; "
                          "devices: %s", names);
}
