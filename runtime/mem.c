/* mem.c - the library's single allocation path.
 *
 * Everything the runtime allocates goes through these wrappers so that an allocation failure
 * always becomes BP_ERR_OUT_OF_MEMORY with a message naming what was being allocated, and so
 * that tests can make allocations fail on purpose. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "bp-impl.h"

void *bp__malloc(size_t size, const char *what)
{
    void *p = malloc(size ? size : 1);
    if (p == NULL)
        bp__error(BP_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", size, what);
    return p;
}

void *bp__calloc(size_t n, size_t size, const char *what)
{
    size_t total;
    if (!bp__mul_size(n, size, &total)) {
        bp__error(BP_ERR_OUT_OF_MEMORY, "allocation of %zu x %zu bytes for %s overflows", n, size,
                  what);
        return NULL;
    }
    void *p = calloc(total ? n : 1, total ? size : 1);
    if (p == NULL)
        bp__error(BP_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", total, what);
    return p;
}

void *bp__realloc(void *p, size_t size, const char *what)
{
    void *q = realloc(p, size ? size : 1);
    if (q == NULL)
        bp__error(BP_ERR_OUT_OF_MEMORY, "out of memory growing %s to %zu bytes", what, size);
    return q;
}

void bp__free(void *p)
{
    free(p);
}

char *bp__strdup(const char *s, const char *what)
{
    size_t n = strlen(s) + 1;
    char *d = bp__malloc(n, what);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}
