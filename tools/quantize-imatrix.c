/* quantize-imatrix.c - llama.cpp's legacy importance matrix file (the .dat that llama-imatrix
 * writes with --output-format dat, and that every llama-quantize reads).
 *
 * Little-endian: int32 n_entries (at least 1); then per entry int32 name length (at least 1),
 * the name's bytes, int32 ncall, int32 nval (at least 1) and nval float32, the sums of squared
 * activations of each column over ncall calls; then optionally int32 last_call, int32 length and
 * the dataset's name. As llama-quantize does, each value is divided by ncall when ncall > 0.
 * Anything cut short, a negative count or a value that is not finite is refused.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantize.h"
#include "tool.h"

static bool read_i32(FILE *f, int32_t *v)
{
    return fread(v, sizeof(*v), 1, f) == 1;
}

/* One entry into e; a reason on failure. */
static const char *read_entry(FILE *f, struct quant_imatrix_entry *e)
{
    int32_t len, ncall, nval;
    if (!read_i32(f, &len) || len < 1 || len > 4096)
        return "a tensor name's length is missing or out of range";
    if ((e->name = calloc((size_t)len + 1, 1)) == NULL)
        return "out of memory";
    if (fread(e->name, 1, (size_t)len, f) != (size_t)len)
        return "a tensor name is cut short";
    if (!read_i32(f, &ncall) || !read_i32(f, &nval))
        return "an entry's counts are cut short";
    if (nval < 1 || nval > (1 << 26))
        return "an entry has no values or too many";
    if ((e->values = malloc((size_t)nval * sizeof(float))) == NULL)
        return "out of memory";
    if (fread(e->values, sizeof(float), (size_t)nval, f) != (size_t)nval)
        return "an entry's values are cut short";
    e->n = nval;
    for (int32_t j = 0; j < nval; j++) {
        if (!isfinite(e->values[j]))
            return "a value is not finite";
        if (ncall > 0)
            e->values[j] /= (float)ncall;
    }
    return NULL;
}

bool quant_imatrix_load(const char *path, struct quant_imatrix *im)
{
    memset(im, 0, sizeof(*im));
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "backplane quantize: cannot read imatrix file '%s': %s\n",
                tool_text(path), strerror(errno));
        return false;
    }
    int32_t n = 0;
    const char *why = NULL;
    if (!read_i32(f, &n) || n < 1 || n > (1 << 20))
        why = "it does not start with a count of entries";
    else if ((im->e = calloc((size_t)n, sizeof(*im->e))) == NULL)
        why = "out of memory";
    for (int32_t i = 0; why == NULL && i < n; i++) {
        im->n = (size_t)i + 1;
        why = read_entry(f, &im->e[i]);
    }
    fclose(f);
    if (why != NULL)
        fprintf(stderr, "backplane quantize: imatrix file '%s' is not a legacy llama.cpp "
                "importance matrix: %s\n", tool_text(path), why);
    return why == NULL;
}

void quant_imatrix_free(struct quant_imatrix *im)
{
    for (size_t i = 0; i < im->n; i++) {
        free(im->e[i].name);
        free(im->e[i].values);
    }
    free(im->e);
    memset(im, 0, sizeof(*im));
}

const struct quant_imatrix_entry *quant_imatrix_find(const struct quant_imatrix *im,
                                                     const char *name)
{
    for (size_t i = 0; i < im->n; i++)
        if (strcmp(im->e[i].name, name) == 0)
            return &im->e[i];
    return NULL;
}
