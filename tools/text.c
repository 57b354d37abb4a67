/* text.c - printing text that comes from outside the tool (file names, device names and
 * descriptions) on a terminal: control characters are written as C escapes, so a name with a
 * newline or a terminal escape sequence cannot forge lines or reprogram the terminal. The
 * JSON output has its own writer (json.c). Also byte counts put side by side in a sentence. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "tool.h"

void tool_put_text(const char *s, FILE *f)
{
    static const char letters[] = "abtnvfr"; /* \a (7) .. \r (13) */
    for (const unsigned char *p = (const unsigned char *)(s ? s : "(null)"); *p; p++) {
        if (*p >= 7 && *p <= 13)
            fprintf(f, "\\%c", letters[*p - 7]);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
}

/* The unit (GiB, then MiB, each with two decimals, then exact bytes) is the first in which
 * a and b print differently, so that "needs X; has Y" never shows two equal numbers for two
 * different sizes. */
void tool_format_sizes(size_t a, size_t b, size_t c, char out[3][40])
{
    static const struct {
        double div;
        const char *unit;
    } units[] = {{1073741824.0, "GiB"}, {1048576.0, "MiB"}};
    const size_t v[3] = {a, b, c};
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
        for (int i = 0; i < 3; i++)
            snprintf(out[i], 40, "%.2f %s", v[i] / units[u].div, units[u].unit);
        if (a == b || strcmp(out[0], out[1]) != 0)
            return;
    }
    for (int i = 0; i < 3; i++)
        snprintf(out[i], 40, "%zu bytes", v[i]);
}
