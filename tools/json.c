/* json.c - the JSON writer of the `backplane` tool (the escaping rules are in json.h). */
#include "config.h"

#include <assert.h>
#include <math.h>

#include "json.h"

void json_init(struct json_writer *w, FILE *f, int pretty_depth)
{
    w->f = f;
    w->depth = 0;
    w->pretty_depth = pretty_depth;
    w->has_members[0] = false;
    w->after_key = false;
}

/* Starts a value or key: the comma after the previous member and, in a pretty container, the
 * line break and indentation. A value right after its key needs neither. */
static void separate(struct json_writer *w)
{
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->depth == 0)
        return;
    const bool had = w->has_members[w->depth - 1];
    w->has_members[w->depth - 1] = true;
    if (w->depth <= w->pretty_depth)
        fprintf(w->f, "%s\n%*s", had ? "," : "", 2 * w->depth, "");
    else if (had)
        fputs(", ", w->f);
}

static void begin(struct json_writer *w, char open)
{
    separate(w);
    assert(w->depth < JSON_MAX_DEPTH);
    fputc(open, w->f);
    w->has_members[w->depth++] = false;
}

static void end(struct json_writer *w, char close)
{
    assert(w->depth > 0 && !w->after_key);
    const bool had = w->has_members[--w->depth];
    if (had && w->depth < w->pretty_depth)
        fprintf(w->f, "\n%*s", 2 * w->depth, "");
    fputc(close, w->f);
}

void json_begin_object(struct json_writer *w)
{
    begin(w, '{');
}

void json_end_object(struct json_writer *w)
{
    end(w, '}');
}

void json_begin_array(struct json_writer *w)
{
    begin(w, '[');
}

void json_end_array(struct json_writer *w)
{
    end(w, ']');
}

/* Length of the valid UTF-8 sequence at p (1 to 4), or 0 when there is none; then *skip is
 * the length of the maximal subpart of a sequence there (the bytes that could still have begun
 * a valid one, at least 1), which becomes one U+FFFD as Unicode recommends. Continuation bytes
 * are 0x80..0xBF, so the terminating NUL always ends the checks. */
static int utf8_sequence(const unsigned char *p, int *skip)
{
    const unsigned char b = p[0];
    unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
    int len;
    *skip = 1;
    if (b < 0x80)
        return 1;
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
        return 0; /* 0x80..0xC1 (stray continuation, overlong lead) and 0xF5..0xFF */
    }
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < len; i++) {
        if (p[i] < 0x80 || p[i] > 0xBF) {
            *skip = i;
            return 0;
        }
    }
    return len;
}

static void write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        const unsigned char c = *p;
        int skip;
        const int len = utf8_sequence(p, &skip);
        if (len == 0) {
            fputs("\\ufffd", f);
            p += skip;
            continue;
        }
        if (len > 1) {
            fwrite(p, 1, (size_t)len, f);
        } else if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c == '\t') {
            fputs("\\t", f);
        } else if (c == '\r') {
            fputs("\\r", f);
        } else if (c == '\b') {
            fputs("\\b", f);
        } else if (c == '\f') {
            fputs("\\f", f);
        } else if (c < 0x20 || c == 0x7F) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
        p += len;
    }
    fputc('"', f);
}

void json_key(struct json_writer *w, const char *key)
{
    assert(w->depth > 0 && !w->after_key);
    separate(w);
    write_string(w->f, key);
    fputs(": ", w->f);
    w->after_key = true;
}

void json_string(struct json_writer *w, const char *s)
{
    separate(w);
    if (s == NULL)
        fputs("null", w->f);
    else
        write_string(w->f, s);
}

void json_int(struct json_writer *w, long long v)
{
    separate(w);
    fprintf(w->f, "%lld", v);
}

void json_uint(struct json_writer *w, unsigned long long v)
{
    separate(w);
    fprintf(w->f, "%llu", v);
}

void json_double(struct json_writer *w, double v, int digits)
{
    separate(w);
    if (isfinite(v))
        fprintf(w->f, "%.*g", digits, v);
    else
        fputs("null", w->f); /* JSON has no Inf or NaN */
}

void json_bool(struct json_writer *w, bool v)
{
    separate(w);
    fputs(v ? "true" : "false", w->f);
}

void json_finish(struct json_writer *w)
{
    assert(w->depth == 0);
    fputc('\n', w->f);
}

void json_member_string(struct json_writer *w, const char *key, const char *s)
{
    json_key(w, key);
    json_string(w, s);
}

void json_member_int(struct json_writer *w, const char *key, long long v)
{
    json_key(w, key);
    json_int(w, v);
}

void json_member_uint(struct json_writer *w, const char *key, unsigned long long v)
{
    json_key(w, key);
    json_uint(w, v);
}

void json_member_double(struct json_writer *w, const char *key, double v, int digits)
{
    json_key(w, key);
    json_double(w, v, digits);
}

void json_member_bool(struct json_writer *w, const char *key, bool v)
{
    json_key(w, key);
    json_bool(w, v);
}
