/* args.c - strict parsing of the `backplane` tool's numeric options: the whole argument must be
 * the number, in range, or the command stops with a message naming the option and the range. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

/* strtoll and friends skip leading white space and take a sign; an option value must be
 * digits only (with a '-' where negative values make sense), so check the first character. */
static bool starts_like_number(const char *text, bool allow_minus)
{
    const char c = text[0];
    return (c >= '0' && c <= '9') || (allow_minus && c == '-' && text[1] >= '0' && text[1] <= '9');
}

bool tool_parse_int(const char *cmd, const char *opt, const char *text, long long min,
                    long long max, long long *out)
{
    char *end = NULL;
    long long v = 0;
    bool ok = starts_like_number(text, min < 0);
    if (ok) {
        errno = 0;
        v = strtoll(text, &end, 10);
        ok = errno == 0 && *end == '\0' && v >= min && v <= max;
    }
    if (!ok) {
        fprintf(stderr, "%s: %s needs a whole number from %lld to %lld, not '%s'\n", cmd, opt, min,
                max, tool_text(text));
        return false;
    }
    *out = v;
    return true;
}

bool tool_parse_u64(const char *cmd, const char *opt, const char *text, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v = 0;
    /* strtoull("-1") is ULLONG_MAX: the digit check keeps a sign out. */
    bool ok = starts_like_number(text, false);
    if (ok) {
        errno = 0;
        v = strtoull(text, &end, 10);
        ok = errno == 0 && *end == '\0';
    }
    if (!ok) {
        fprintf(stderr, "%s: %s needs a whole number from 0 to %llu, not '%s'\n", cmd, opt,
                (unsigned long long)UINT64_MAX, tool_text(text));
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool tool_parse_seconds(const char *cmd, const char *opt, const char *text, double max,
                        double *out)
{
    char *end = NULL;
    double v = 0.0;
    bool ok = starts_like_number(text, false) || (text[0] == '.' && text[1] >= '0' &&
                                                  text[1] <= '9');
    if (ok) {
        errno = 0;
        v = strtod(text, &end);
        ok = errno == 0 && *end == '\0' && isfinite(v) && v > 0.0 && v <= max;
    }
    if (!ok) {
        fprintf(stderr, "%s: %s needs a number of seconds above 0 and at most %g, not '%s'\n", cmd,
                opt, max, tool_text(text));
        return false;
    }
    *out = v;
    return true;
}

int tool_parse_int_list(const char *cmd, const char *opt, const char *text, long long min,
                        long long max, long long *out, int max_n)
{
    int n = 0;
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (n == max_n || len == 0 || len >= sizeof(item)) {
            fprintf(stderr, "%s: %s needs 1 to %d comma-separated whole numbers from %lld to "
                    "%lld, not '%s'\n", cmd, opt, max_n, min, max, tool_text(text));
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (!tool_parse_int(cmd, opt, item, min, max, &out[n]))
            return -1;
        for (int j = 0; j < n; j++)
            if (out[j] == out[n]) {
                fprintf(stderr, "%s: %s names %lld twice: '%s'\n", cmd, opt, out[n],
                        tool_text(text));
                return -1;
            }
        n++;
        if (comma == NULL)
            return n;
        p = comma + 1;
    }
}

int tool_bad_arg(const char *cmd, const char *arg)
{
    if (arg[0] == '-' && arg[1] != '\0')
        fprintf(stderr, "%s: unknown option '%s'\n", cmd, tool_text(arg));
    else
        fprintf(stderr, "%s: unexpected argument '%s'\n", cmd, tool_text(arg));
    return 2;
}

int tool_no_value(const char *cmd, const char *opt)
{
    fprintf(stderr, "%s: %s needs a value\n", cmd, tool_text(opt));
    return 2;
}

bool tool_check_list(const char *cmd, const char *opt, const char *text)
{
    if (*text == '\0') {
        fprintf(stderr, "%s: %s is empty\n", cmd, opt);
        return false;
    }
    for (const char *p = text;; p++) {
        const size_t len = strcspn(p, ",");
        if (len == 0) {
            fprintf(stderr, "%s: %s has an empty entry (an extra comma?): '%s'\n", cmd, opt,
                    tool_text(text));
            return false;
        }
        for (const char *q = text; q < p; q += strcspn(q, ",") + 1) {
            if (strcspn(q, ",") != len || strncmp(q, p, len) != 0)
                continue;
            char *item = strndup(p, len);
            fprintf(stderr, "%s: %s names '%s' twice: '%s'\n", cmd, opt,
                    tool_text(item ? item : "?"), tool_text(text));
            free(item);
            return false;
        }
        p += len;
        if (*p == '\0')
            return true;
    }
}
