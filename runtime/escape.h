/* escape.h - private to the runtime and tools/: text from outside the program (names, paths,
 * option values, plugin messages) made safe to print on a terminal (escape.c). */
#ifndef BP_RUNTIME_ESCAPE_H
#define BP_RUNTIME_ESCAPE_H

#include <stddef.h>

/* Room for the printable form of one step of bp__escape_step, its NUL included. */
#define BP__ESCAPE_STEP_MAX 9

/* The printable form of the text at src (not at its NUL) into out (BP__ESCAPE_STEP_MAX bytes,
 * NUL-terminated, its length in *out_len); returns how many bytes of src it stands for. A
 * well-formed UTF-8 character other than a control stays as it is; the controls \a to \r
 * become C escapes ("\n"), any other byte below 0x20, DEL, the C1 controls (U+0080 to U+009F,
 * which some terminals obey) and every byte that is not part of well-formed UTF-8 become
 * "\xNN", one per byte. So no escaped text can move the cursor, start a terminal sequence or
 * forge a line. */
size_t bp__escape_step(const char *src, char *out, size_t *out_len);

/* Copies src into dst (size bytes) escaped as bp__escape_step says, so text from users, files
 * and plugins stays one printable line; a copy that does not fit ends in "..." (never inside an
 * escape or a character). Returns the length written. */
size_t bp__escape_controls(char *dst, size_t size, const char *src);

/* Bytes bp__escape_controls needs for all of src, its NUL included. */
size_t bp__escaped_size(const char *src);

#endif
