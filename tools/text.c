/* text.c - printing text that comes from outside the tool (file names, device, plugin and
 * tensor names, option values, error sentences) on a terminal, escaped by the runtime's rule
 * (runtime/escape.c): control characters as C escapes, C1 controls and bytes that are not
 * UTF-8 as "\xNN", so a name cannot forge lines or reprogram the terminal. The JSON output has
 * its own writer (json.c). */
#include "config.h"

#include <stdio.h>

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
