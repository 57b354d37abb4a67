/* devices.c - opening the backends a `backplane` command names with -d.
 *
 * The list is comma-separated at the outer level only, so "Meta(CPU0,CPU1),CPU" names two
 * backends; spaces around a name are dropped and every name is a heap copy, so no length limit
 * cuts a long name short. A name is a device ("CPU0") or a registry ("CPU": its first device).
 * "Meta(A,B,...)" is a meta device over the named parts; given a split function it stores the
 * weights split across them, else the meta plugin opens it by name (and explains what is wrong
 * with it). A thread count goes to CPU devices, and to meta devices whose parts are all CPUs. */
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <backplane/bp-plugin.h> /* bp_set_error */

#include "tool.h"

#define MAX_NAMES 8

/* Device names cut from a -d list or a "Meta(...)" name, each a heap copy of its own. */
struct name_list {
    char *name[MAX_NAMES];
    int n;
};

static void names_free(struct name_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->name[i]);
    l->n = 0;
}

enum split_error {
    SPLIT_EMPTY = -1,    /* an empty name: ",,", a leading or trailing comma */
    SPLIT_TOO_MANY = -2, /* more than max names */
    SPLIT_PARENS = -3,   /* unbalanced parentheses */
    SPLIT_NO_MEMORY = -4,
};

/* Splits the len bytes at list at commas outside parentheses, trimming spaces around each
 * name; the number of names, or a split_error (out is then empty). */
static int split_devices(const char *list, size_t len, struct name_list *out, int max)
{
    out->n = 0;
    int depth = 0, err = 0;
    const char *start = list, *end = list + len;
    for (const char *p = list; err == 0; p++) {
        if (p < end && *p == '(')
            depth++;
        else if (p < end && *p == ')' && --depth < 0)
            err = SPLIT_PARENS;
        if (err != 0 || (p < end && !(*p == ',' && depth == 0)))
            continue;
        const char *a = start, *b = p;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (p == end && depth != 0)
            err = SPLIT_PARENS;
        else if (a == b)
            err = SPLIT_EMPTY;
        else if (out->n == max)
            err = SPLIT_TOO_MANY;
        else if ((out->name[out->n] = strndup(a, (size_t)(b - a))) == NULL)
            err = SPLIT_NO_MEMORY;
        else
            out->n++;
        if (p == end)
            break;
        start = p + 1;
    }
    if (err != 0)
        names_free(out);
    return err != 0 ? err : out->n;
}

static const char *split_error_text(int err)
{
    switch (err) {
    case SPLIT_EMPTY:
        return "a name is empty (an extra comma?)";
    case SPLIT_TOO_MANY:
        return "too many names";
    case SPLIT_PARENS:
        return "its parentheses do not match";
    default:
        return "out of memory";
    }
}

static bool is_cpu(bp_backend *be)
{
    return bp_device_get_type(bp_backend_get_device(be)) == BP_DEVICE_TYPE_CPU;
}

/* A device by name, or the first device of a registry of that name ("CPU" when the CPU plugin
 * has several devices); NULL with the lookup's error. */
static bp_device *find_device(const char *name)
{
    bp_device *dev = bp_device_by_name(name);
    if (dev != NULL)
        return dev;
    char *err = strdup(bp_last_error());
    bp_registry *reg = bp_registry_by_name(name);
    if (reg != NULL && bp_registry_get_device_count(reg) > 0) {
        free(err);
        return bp_registry_get_device(reg, 0);
    }
    bp_set_error(BP_ERR_NOT_FOUND, "%s", err ? err : "no such device (and out of memory)");
    free(err);
    return NULL;
}

static bool is_meta_name(const char *name)
{
    return strncasecmp(name, "Meta(", 5) == 0;
}

/* The part names of "Meta(A,B,...)" into parts; their count, or a negative number when name is
 * not of that form (the meta plugin then says what is wrong with it). */
static int meta_part_names(const char *name, struct name_list *parts)
{
    parts->n = 0;
    const size_t len = strlen(name);
    if (!is_meta_name(name) || len < 7 || name[len - 1] != ')')
        return -1;
    return split_devices(name + 5, len - 6, parts, MAX_NAMES);
}

/* Every part of "Meta(A,B,...)" is a CPU device (so a thread count applies to all of them). */
static bool meta_all_cpu(const char *name)
{
    struct name_list parts;
    const int n = meta_part_names(name, &parts);
    bool all = n > 0;
    for (int i = 0; i < n && all; i++) {
        char *at = strrchr(parts.name[i], '@'); /* DEVICE@RANK: a device of that name */
        if (at != NULL)
            *at = '\0';
        bp_device *d = bp_device_by_name(parts.name[i]);
        all = d != NULL && bp_device_get_type(d) == BP_DEVICE_TYPE_CPU;
    }
    names_free(&parts);
    return all;
}

/* "Meta(A,B,...)": a meta device over the named devices that stores the weights as split
 * decides, so that each device holds its share only. Without split, the meta plugin opens it. */
static bp_backend *open_meta(const char *name, const char *params,
                             const struct tool_meta_split *split)
{
    struct name_list names;
    const int n = meta_part_names(name, &names);
    if (n < 1 || split == NULL || strchr(name + 5, '(') != NULL) { /* (a nested meta name) */
        names_free(&names);
        return bp_backend_init_by_name(name, params); /* let the meta plugin explain */
    }
    if (strchr(name, '@') != NULL) { /* parts on other processes: the plugin reads the name */
        names_free(&names);
        bp_registry *reg = bp_registry_by_name("Meta");
        void *proc = reg ? bp_registry_get_proc_address(reg, "bp_meta_device_by_name") : NULL;
        bp_meta_device_by_name_fn by_name;
        if (proc == NULL)
            return bp_backend_init_by_name(name, params); /* let the loader explain */
        memcpy(&by_name, &proc, sizeof(by_name));
        bp_device *d = by_name(name, split->fn, split->user);
        return d != NULL ? bp_device_init_backend(d, params) : NULL;
    }
    bp_device *parts[MAX_NAMES];
    bool found = true;
    for (int i = 0; i < n && found; i++)
        found = (parts[i] = find_device(names.name[i])) != NULL;
    names_free(&names);
    if (!found)
        return NULL;
    bp_device *d = bp_meta_device_new(parts, n, split->fn, split->user);
    return d != NULL ? bp_device_init_backend(d, params) : NULL;
}

static bp_backend *open_backend(const char *name, int threads,
                                const struct tool_meta_split *split)
{
    char params[32];
    snprintf(params, sizeof(params), "threads=%d", threads);
    if (is_meta_name(name))
        return open_meta(name, threads > 0 && meta_all_cpu(name) ? params : NULL, split);
    bp_device *dev = find_device(name);
    if (dev == NULL)
        return NULL;
    const bool cpu = bp_device_get_type(dev) == BP_DEVICE_TYPE_CPU;
    return bp_device_init_backend(dev, threads > 0 && cpu ? params : NULL);
}

/* The names of the devices used when -d is not given: every GPU for run, else every device;
 * at most room. False after printing why (names is then empty). */
static bool default_names(struct name_list *names, int room, bool for_run)
{
    for (size_t i = 0; i < bp_device_count() && names->n < room; i++) {
        bp_device *d = bp_device_get(i);
        if (for_run && bp_device_get_type(d) != BP_DEVICE_TYPE_GPU)
            continue;
        if ((names->name[names->n] = strdup(bp_device_get_name(d))) == NULL) {
            fprintf(stderr, "backplane: out of memory\n");
            names_free(names);
            return false;
        }
        names->n++;
    }
    return true;
}

/* The names of list, or of the default devices when list is NULL. False after printing why. */
static bool list_names(const char *list, struct name_list *names, int room, bool for_run)
{
    if (list == NULL)
        return default_names(names, room, for_run);
    const int err = split_devices(list, strlen(list), names, room);
    if (err < 0) {
        fprintf(stderr, "backplane: cannot read the device list '%s': %s (at most %d "
                "comma-separated names)\n", tool_text(list), split_error_text(err), room);
        return false;
    }
    return true;
}

/* Two names of one device ("CPU,CPU", or "CPU" and "CPU0") would give it two backends that
 * compete for it: true after saying so when out[i] shares its device with an earlier one. */
static bool named_twice(bp_backend *const *out, char *const *name, int i)
{
    bp_device *dev = bp_backend_get_device(out[i]);
    for (int j = 0; j < i; j++) {
        if (bp_backend_get_device(out[j]) != dev)
            continue;
        if (strcmp(name[j], name[i]) == 0)
            fprintf(stderr, "backplane: -d lists the device '%s' twice\n", tool_text(name[i]));
        else
            fprintf(stderr, "backplane: -d lists the device '%s' twice (as '%s' and '%s')\n",
                    tool_text(bp_device_get_name(dev)), tool_text(name[j]), tool_text(name[i]));
        return true;
    }
    return false;
}

/* Opens every named backend into out (*nb counts what is open, also on failure). Duplicates are
 * refused before any rule about the order of the list, and so is a meta name of the wrong form
 * (an empty part, a nested meta device, a part listed twice: what the meta plugin refuses as an
 * invalid argument): *bad is then true, a usage error rather than a device that is missing.
 * False after printing why. */
static bool open_named(const struct name_list *names, int threads,
                       const struct tool_meta_split *split, bp_backend **out, int *nb, bool *bad)
{
    for (int i = 0; i < names->n; i++) {
        bp_backend *be = open_backend(names->name[i], threads, split);
        if (be == NULL) {
            *bad = is_meta_name(names->name[i]) && bp_last_status() == BP_ERR_INVALID_ARG;
            fprintf(stderr, "backplane: device '%s': %s\n", tool_text(names->name[i]),
                    tool_text(bp_last_error()));
            return false;
        }
        out[(*nb)++] = be;
        if ((*bad = named_twice(out, names->name, i)))
            return false;
    }
    return true;
}

/* For run: a CPU backend in the list must be the last one (else *bad: the list is wrong), and
 * one is added when there is none, so that the scheduler can finish any graph. False after
 * printing why. */
static bool cpu_last(const struct name_list *names, int threads, bp_backend **out, int *nb,
                     bool *bad)
{
    bool have_cpu = false;
    for (int i = 0; i < *nb; i++) {
        if (!is_cpu(out[i]))
            continue;
        have_cpu = true;
        if (i != *nb - 1) {
            fprintf(stderr, "backplane run: the CPU device '%s' must come last in -d (one CPU "
                    "device finishes every graph)\n", tool_text(names->name[i]));
            *bad = true;
            return false;
        }
    }
    if (have_cpu)
        return true;
    bp_backend *cpu = open_backend("CPU", threads, NULL);
    if (cpu == NULL) {
        fprintf(stderr, "backplane run: no CPU backend to finish the graph with: %s\n",
                tool_text(bp_last_error()));
        return false;
    }
    out[(*nb)++] = cpu;
    return true;
}

int tool_open_backends(const char *list, int threads, bp_backend **out, int max, bool for_run,
                       const struct tool_meta_split *split)
{
    struct name_list names = {.n = 0};
    if (max > MAX_NAMES)
        max = MAX_NAMES;
    const int room = for_run ? max - 1 : max; /* run keeps a place for the CPU */
    if (!list_names(list, &names, room, for_run))
        return TOOL_BAD_LIST;
    int nb = 0;
    bool bad = false;
    const bool ok = open_named(&names, threads, split, out, &nb, &bad) &&
                    (!for_run || cpu_last(&names, threads, out, &nb, &bad));
    names_free(&names);
    if (!ok) {
        for (int i = 0; i < nb; i++)
            bp_backend_free(out[i]);
        return bad ? TOOL_BAD_LIST : -1;
    }
    if (nb == 0)
        fprintf(stderr, "backplane: no devices (see `backplane list`)\n");
    return nb > 0 ? nb : -1;
}
