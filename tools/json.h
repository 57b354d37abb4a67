/* json.h - private to tools/: the one JSON writer of the `backplane` tool.
 *
 * Every JSON document the tool prints goes through it, so that strings from outside the tool
 * (plugin file names, messages, device descriptions) can never break the document:
 * - '"' and '\' are escaped, control characters (U+0000..U+001F and U+007F) become \n, \t, \r,
 *   \b, \f or \u00XX;
 * - valid UTF-8 is copied as it is; bytes that do not form valid UTF-8 (stray continuation
 *   bytes, truncated or overlong sequences, surrogates, values above U+10FFFF, bytes
 *   0xF5..0xFF) become U+FFFD (written \ufffd), one per maximal subpart as Unicode recommends
 *   (the same count as Python's and browsers' decoders: a lone 0xFF is one, a sequence cut
 *   short such as E2 82 is one). The output is therefore always valid UTF-8 and valid JSON
 *   (RFC 8259), at the cost of the exact bytes of a file name that is not UTF-8;
 * - numbers that are not finite (a rate over zero seconds) are written as null.
 * Commas and the ": " after keys are placed by the writer. Containers opened at a depth below
 * `pretty_depth` put each member on its own line; deeper ones stay on one line. */
#ifndef BP_TOOLS_JSON_H
#define BP_TOOLS_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

struct json_writer {
    FILE *f;
    int depth;
    int pretty_depth;
    bool has_members[JSON_MAX_DEPTH]; /* per open container: a member was written */
    bool after_key;                   /* the next value completes "key": */
};

void json_init(struct json_writer *w, FILE *f, int pretty_depth);
/* Containers; nesting deeper than JSON_MAX_DEPTH is a programming error (asserted). */
void json_begin_object(struct json_writer *w);
void json_end_object(struct json_writer *w);
void json_begin_array(struct json_writer *w);
void json_end_array(struct json_writer *w);
/* The key of the next member of the current object. */
void json_key(struct json_writer *w, const char *key);
/* Values. json_string(w, NULL) writes null. */
void json_string(struct json_writer *w, const char *s);
void json_int(struct json_writer *w, long long v);
void json_uint(struct json_writer *w, unsigned long long v);
/* %.*g with `digits` significant digits; null when v is not finite. */
void json_double(struct json_writer *w, double v, int digits);
void json_bool(struct json_writer *w, bool v);
/* Ends the document with a newline. */
void json_finish(struct json_writer *w);

/* Shorthands for a member of the current object. */
void json_member_string(struct json_writer *w, const char *key, const char *s);
void json_member_int(struct json_writer *w, const char *key, long long v);
void json_member_uint(struct json_writer *w, const char *key, unsigned long long v);
void json_member_double(struct json_writer *w, const char *key, double v, int digits);
void json_member_bool(struct json_writer *w, const char *key, bool v);

#endif
