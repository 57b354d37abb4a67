/* escape.c - one rule for printing text that comes from outside: the runtime's error messages
 * and log lines (status.c, log.c) and everything the `backplane` tool prints of a user's,
 * file's or plugin's strings (tools/text.c) escape through it, so a name holding a terminal
 * sequence or bytes that are not UTF-8 reaches the terminal as visible "\xNN" text.
 *
 * This file depends on nothing else of the runtime: the tool compiles it in as well, since
 * the library does not export its internals. */
#include "config.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "escape.h"

/* Length of the well-formed UTF-8 sequence at p (2 to 4; Unicode's table 3-7), or 0 when
 * there is none. Continuation bytes are 0x80..0xBF, so a NUL always ends the checks. */
static size_t utf8_length(const unsigned char *p)
{
    const unsigned char b = p[0];
    unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
    size_t len;
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0)
            lo = 0xA0; /* overlong below U+0800 */
        else if (b == 0xED)
            hi = 0x9F; /* U+D800..U+DFFF are surrogates, not characters */
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0)
            lo = 0x90; /* overlong below U+10000 */
        else if (b == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0; /* ASCII, a stray continuation, an overlong lead, 0xF5..0xFF */
    }
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return len;
}

size_t bp__escape_step(const char *src, char *out, size_t *out_len)
{
    static const char letters[] = "abtnvfr"; /* \a (7) .. \r (13) */
    const unsigned char *p = (const unsigned char *)src;
    if (p[0] >= 0x20 && p[0] < 0x7f) {
        out[0] = (char)p[0];
        out[1] = '\0';
        *out_len = 1;
        return 1;
    }
    if (p[0] >= 7 && p[0] <= 13) {
        out[0] = '\\';
        out[1] = letters[p[0] - 7];
        out[2] = '\0';
        *out_len = 2;
        return 1;
    }
    const size_t len = p[0] >= 0x80 ? utf8_length(p) : 0;
    if (len == 2 && p[0] == 0xC2 && p[1] <= 0x9F) { /* a C1 control: both bytes escaped */
        snprintf(out, BP__ESCAPE_STEP_MAX, "\\x%02x\\x%02x", p[0], p[1]);
        *out_len = 8;
        return 2;
    }
    if (len > 0) {
        memcpy(out, p, len);
        out[len] = '\0';
        *out_len = len;
        return len;
    }
    snprintf(out, BP__ESCAPE_STEP_MAX, "\\x%02x", p[0]);
    *out_len = 4;
    return 1;
}

size_t bp__escape_controls(char *dst, size_t size, const char *src)
{
    size_t o = 0, safe = 0; /* safe: the last end of a piece with room for "..." after it */
    bool cut = false;
    for (const char *p = src; *p != '\0';) {
        char piece[BP__ESCAPE_STEP_MAX];
        size_t len;
        const size_t used = bp__escape_step(p, piece, &len);
        if (o + len + 1 > size) {
            cut = true;
            break;
        }
        memcpy(dst + o, piece, len);
        o += len;
        p += used;
        if (o + 4 <= size)
            safe = o;
    }
    if (cut && size >= 4) {
        memcpy(dst + safe, "...", 4);
        return safe + 3;
    }
    if (size > 0)
        dst[o] = '\0';
    return o;
}

size_t bp__escaped_size(const char *src)
{
    size_t n = 1;
    for (const char *p = src; *p != '\0';) {
        char piece[BP__ESCAPE_STEP_MAX];
        size_t len;
        p += bp__escape_step(p, piece, &len);
        n += len;
    }
    return n;
}
