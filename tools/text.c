/* text.c - printing text that comes from outside the tool (file names, device, plugin and
 * tensor names, option values, error sentences) on a terminal, escaped by the runtime's rule
 * (runtime/escape.c): control characters as C escapes, C1 controls and bytes that are not
 * UTF-8 as "\xNN", so a name cannot forge lines or reprogram the terminal. The JSON output has
 * its own writer (json.c). Also byte counts put side by side in a sentence. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "../runtime/escape.h"
#include "tool.h"

void tool_put_text(const char *s, FILE *f)
{
    for (const char *p = s ? s : "(null)"; *p != '\0';) {
        char piece[BP__ESCAPE_STEP_MAX];
        size_t len;
        p += bp__escape_step(p, piece, &len);
        fwrite(piece, 1, len, f);
    }
}

/* A few buffers in turn, so that one printf can show several escaped strings; per thread, so
 * that threads cannot overwrite each other's. */
#define TEXT_SLOTS 4
#define TEXT_SIZE 2048

const char *tool_text(const char *s)
{
    static _Thread_local char slots[TEXT_SLOTS][TEXT_SIZE];
    static _Thread_local int next;
    char *out = slots[next];
    next = (next + 1) % TEXT_SLOTS;
    bp__escape_controls(out, TEXT_SIZE, s ? s : "(null)");
    return out;
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
