/* text.c - printing text that comes from outside the tool (file names, device names and
 * descriptions) on a terminal: control characters are written as C escapes, so a name with a
 * newline or a terminal escape sequence cannot forge lines or reprogram the terminal. The
 * JSON output has its own writer (json.c). */
#include "config.h"

#include <stdio.h>

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
