/* conformance.c - `backplane conformance`: the conformance suite of the source tree
 * (common/conformance-cases.c, every (op, type, shape) case against the double-precision
 * reference of common/ref.c) run on any device a loaded plugin offers, a third-party plugin's
 * included, as an installed command.
 *
 *   backplane conformance [DEVICE...] [--ops LIST] [-t N] [--json] [--list]
 *
 * A case a device declines (supports_op false) is "not supported", which is not a failure: a
 * device need not run every op, but every op it claims must match the reference. A case it
 * claims and gets wrong, or that fails to compute, is a failure; the exit status is then 1. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/conformance.h"
#include "json.h"
#include "tool.h"

#define MAX_DEVICES 8

static const char conf_cmd[] = "backplane conformance";

static void conf_usage(FILE *f)
{
    fprintf(f, "usage: backplane conformance [DEVICE...] [--ops LIST] [-t N] [--json] [--list]\n"
               "\n"
               "Runs every conformance case (op, type, shape) on each device and compares the\n"
               "result with the reference implementation, within the case's NMSE bound\n"
               "(docs/conformance.md). Cases a device does not support are reported, not failed.\n"
               "\n"
               "  DEVICE     a device or registry name (CPU, CUDA0, \"Meta(CPU0,CPU1)\", a\n"
               "             plugin's device); default: every device of every loaded plugin\n"
               "  --ops LIST comma-separated case names, or their families (mul_mat runs every\n"
               "             mul_mat_* case); --list prints them\n"
               "  -t N       threads of CPU devices\n"
               "  --json     one JSON object: per device, per case, passed/failed/not supported\n"
               "  --list     print the cases (those --ops selects) with their variants and\n"
               "             bounds, and run nothing (with --json: one JSON object)\n"
               "exit status: 0 every supported case passed, 1 a case failed, 2 bad arguments\n");
}

/* Whether case `name` is selected by the comma-separated list (NULL: all): an entry equal to
 * the name, or a family whose name and an underscore start it. */
static bool selected(const char *list, const char *name)
{
    if (list == NULL)
        return true;
    const size_t n = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const size_t len = strcspn(p, ",");
        if (len > 0 && len <= n && strncmp(p, name, len) == 0 && (len == n || name[len] == '_'))
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

/* Every entry of the list names some case; else a message and false. */
static bool list_valid(const char *list)
{
    if (*list == '\0') {
        fprintf(stderr, "%s: --ops is empty: name cases or families (--list)\n", conf_cmd);
        return false;
    }
    if (!tool_check_list(conf_cmd, "--ops", list))
        return false;
    for (const char *p = list; *p != '\0';) {
        const size_t len = strcspn(p, ",");
        bool found = false;
        for (int c = 0; c < conf_n_cases && len > 0; c++) {
            const char *name = conf_cases[c].name;
            found |= strncmp(p, name, len) == 0 && (name[len] == '\0' || name[len] == '_');
        }
        if (!found) {
            char *item = strndup(p, len);
            fprintf(stderr, "%s: --ops: '%s' names no case (backplane conformance --list)\n",
                    conf_cmd, tool_text(item ? item : "?"));
            free(item);
            return false;
        }
        p += len + (p[len] == ',');
    }
    return true;
}

struct case_result {
    int passed, failed, unsupported;
    char first[512]; /* the first failure's reason */
};

struct device_result {
    const char *name;
    int passed, failed, unsupported;
};

static void run_case(bp_backend *be, const struct conf_case *c, struct case_result *r)
{
    memset(r, 0, sizeof(*r));
    for (int v = 0; v < c->n_variants; v++) {
        bool unsupported = false;
        char why[512];
        if (conf_run(be, c, v, &unsupported, why, sizeof(why)))
            r->passed++;
        else if (unsupported)
            r->unsupported++;
        else if (r->failed++ == 0)
            snprintf(r->first, sizeof(r->first), "%s", why);
    }
}

/* Runs the selected cases on be, printing as it goes (text) or into w (json). */
static void run_device(bp_backend *be, const char *ops, struct json_writer *w,
                       struct device_result *d)
{
    d->name = bp_backend_get_name(be);
    if (w != NULL) {
        json_begin_object(w);
        json_member_string(w, "device", d->name);
        json_member_string(w, "description",
                           bp_device_get_description(bp_backend_get_device(be)));
        json_key(w, "cases");
        json_begin_array(w);
    } else {
        printf("%s (", tool_text(d->name));
        tool_put_text(bp_device_get_description(bp_backend_get_device(be)), stdout);
        printf("):\n");
    }
    for (int i = 0; i < conf_n_cases; i++) {
        const struct conf_case *c = &conf_cases[i];
        if (!selected(ops, c->name))
            continue;
        struct case_result r;
        run_case(be, c, &r);
        d->passed += r.passed;
        d->failed += r.failed;
        d->unsupported += r.unsupported;
        if (w != NULL) {
            json_begin_object(w);
            json_member_string(w, "case", c->name);
            json_member_int(w, "variants", c->n_variants);
            json_member_int(w, "passed", r.passed);
            json_member_int(w, "failed", r.failed);
            json_member_int(w, "not_supported", r.unsupported);
            json_member_double(w, "max_nmse", c->max_nmse, 3);
            if (r.failed > 0)
                json_member_string(w, "first_failure", r.first);
            json_end_object(w);
        } else {
            printf("  %-26s %s %d/%d passed", c->name, r.failed ? "FAIL" : "ok  ", r.passed,
                   c->n_variants);
            if (r.unsupported > 0)
                printf(", %d not supported", r.unsupported);
            if (r.failed > 0)
                printf(", %d FAILED: %s", r.failed, tool_text(r.first));
            printf("\n");
        }
        fflush(stdout);
    }
    if (w != NULL) {
        json_end_array(w);
        json_member_int(w, "passed", d->passed);
        json_member_int(w, "failed", d->failed);
        json_member_int(w, "not_supported", d->unsupported);
        json_end_object(w);
    } else {
        printf("%s: %d passed, %d failed, %d not supported\n", tool_text(d->name), d->passed,
               d->failed, d->unsupported);
    }
}

/* The backends of the named devices (every device when there are none) into be; their count,
 * or minus the exit status after printing why (-2: a name given twice, or not a name). */
static int open_devices(const char *const *names, int n_names, int threads, bp_backend **be)
{
    int nb = 0;
    if (n_names == 0) {
        nb = tool_open_backends(NULL, threads, be, MAX_DEVICES, false, NULL);
        return nb < 0 ? -1 : nb;
    }
    for (int i = 0; i < n_names; i++) {
        int got = tool_open_backends(names[i], threads, be + nb, 1, false, NULL);
        for (int j = 0; got > 0 && j < nb; j++) {
            if (bp_backend_get_device(be[j]) != bp_backend_get_device(be[nb]))
                continue;
            fprintf(stderr, "%s: the device '%s' is named twice\n", conf_cmd,
                    tool_text(bp_device_get_name(bp_backend_get_device(be[nb]))));
            bp_backend_free(be[nb]);
            got = TOOL_BAD_LIST;
        }
        if (got < 0) {
            for (int j = 0; j < nb; j++)
                bp_backend_free(be[j]);
            return got == TOOL_BAD_LIST ? -2 : -1;
        }
        nb += got;
    }
    if (nb == 0) {
        fprintf(stderr, "%s: no devices (see `backplane list`)\n", conf_cmd);
        return -1;
    }
    return nb;
}

/* --list: the cases --ops selects (all without it), as text or one JSON object. */
static int print_cases(const char *ops, bool json)
{
    struct json_writer w;
    if (json) {
        json_init(&w, stdout, 1);
        json_begin_object(&w);
        json_key(&w, "cases");
        json_begin_array(&w);
    }
    for (int i = 0; i < conf_n_cases; i++) {
        const struct conf_case *c = &conf_cases[i];
        if (!selected(ops, c->name))
            continue;
        if (!json) {
            printf("%-26s %d variants, NMSE <= %g\n", c->name, c->n_variants, c->max_nmse);
            continue;
        }
        json_begin_object(&w);
        json_member_string(&w, "name", c->name);
        json_member_int(&w, "variants", c->n_variants);
        json_member_double(&w, "max_nmse", c->max_nmse, 6);
        json_end_object(&w);
    }
    if (json) {
        json_end_array(&w);
        json_end_object(&w);
        json_finish(&w);
    }
    return 0; /* (main reports output that did not reach its file) */
}

int cmd_conformance(int argc, char **argv)
{
    const char *ops = NULL;
    const char *names[MAX_DEVICES];
    int n_names = 0, threads = 0;
    bool json = false, list = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long num;
        if ((strcmp(a, "--ops") == 0 || strcmp(a, "-t") == 0) && v == NULL) {
            return tool_no_value(conf_cmd, a);
        } else if (strcmp(a, "--ops") == 0) {
            ops = v;
            i++;
        } else if (strcmp(a, "-t") == 0) {
            if (!tool_parse_int(conf_cmd, a, v, 1, 1024, &num))
                return 2;
            threads = (int)num;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--list") == 0) {
            list = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            conf_usage(stdout);
            return 0;
        } else if (a[0] == '-' || a[0] == '\0') {
            return tool_bad_arg(conf_cmd, a);
        } else if (n_names == MAX_DEVICES) {
            fprintf(stderr, "%s: too many devices (at most %d), at '%s'\n", conf_cmd, MAX_DEVICES,
                    tool_text(a));
            return 2;
        } else {
            names[n_names++] = a;
        }
    }
    if (ops != NULL && !list_valid(ops))
        return 2;
    if (list && (n_names > 0 || threads > 0)) {
        fprintf(stderr, "%s: --list prints the cases and runs nothing: it takes no %s\n",
                conf_cmd, n_names > 0 ? "device names" : "-t");
        return 2;
    }
    if (list)
        return print_cases(ops, json);
    bp_plugin_load_all();

    bp_backend *be[MAX_DEVICES];
    const int nb = open_devices(names, n_names, threads, be);
    if (nb < 0)
        return -nb;

    struct json_writer w;
    if (json) {
        json_init(&w, stdout, 1);
        json_begin_object(&w);
        json_key(&w, "devices");
        json_begin_array(&w);
    }
    int failed = 0;
    for (int i = 0; i < nb; i++) {
        struct device_result d = {0};
        run_device(be[i], ops, json ? &w : NULL, &d);
        failed += d.failed;
        bp_backend_free(be[i]);
    }
    if (json) {
        json_end_array(&w);
        json_member_int(&w, "failed", failed);
        json_end_object(&w);
        json_finish(&w);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "%s: cannot write the output\n", conf_cmd);
        return 1;
    }
    return failed > 0 ? 1 : 0;
}
