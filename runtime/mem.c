/* mem.c - the library's single allocation path.
 *
 * Everything the runtime allocates goes through these wrappers so that an allocation failure
 * always becomes BP_ERR_OUT_OF_MEMORY with a message naming what was being allocated, and so
 * that tests can make allocations fail on purpose. Arrays that are appended to grow through
 * bp__grow, one overflow-checked doubling policy for the whole runtime.
 *
 * Fault injection (configure --enable-fault-injection, the default for development builds;
 * packages are built without it): with BP_FAIL_ALLOC_AFTER=N in the environment, allocation
 * number N (counting from 0, every wrapper below and the host buffers of host.c) fails as if
 * memory were exhausted, once, and a warning is logged. tests/test-faults.c walks N over every
 * allocation of a whole load-build-schedule-compute sequence. */
#include "config.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp-impl.h"

#ifdef BP_FAULT_INJECTION
static atomic_long fail_after = -2; /* -2: environment not read yet, -1: off */
static atomic_long n_allocs;

bool bp__fault(size_t size, const char *what)
{
    long after = atomic_load_explicit(&fail_after, memory_order_relaxed);
    if (after == -2) {
        const char *e = getenv("BP_FAIL_ALLOC_AFTER");
        long v = -1;
        if (e != NULL && e[0] != '\0') {
            char *end = NULL;
            v = strtol(e, &end, 10);
            if (*end != '\0' || v < 0)
                v = -1;
        }
        atomic_compare_exchange_strong(&fail_after, &after, v);
        after = atomic_load(&fail_after);
    }
    if (after < 0)
        return false;
    if (atomic_fetch_add(&n_allocs, 1) != after)
        return false;
    bp_log(BP_LOG_WARN, "fault injection: failing allocation %ld (%zu bytes for %s)", after, size,
           what);
    return true;
}
#else
bool bp__fault(size_t size, const char *what)
{
    (void)size;
    (void)what;
    return false;
}
#endif

void *bp__malloc(size_t size, const char *what)
{
    void *p = bp__fault(size, what) ? NULL : malloc(size ? size : 1);
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
    void *p = bp__fault(total, what) ? NULL : calloc(total ? n : 1, total ? size : 1);
    if (p == NULL)
        bp__error(BP_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", total, what);
    return p;
}

void *bp__realloc(void *p, size_t size, const char *what)
{
    void *q = bp__fault(size, what) ? NULL : realloc(p, size ? size : 1);
    if (q == NULL)
        bp__error(BP_ERR_OUT_OF_MEMORY, "out of memory growing %s to %zu bytes", what, size);
    return q;
}

bool bp__grow(void **p, size_t *cap, size_t need, size_t elem, const char *what)
{
    if (need <= *cap)
        return true;
    size_t bytes;
    if (!bp__mul_size(need, elem, &bytes)) {
        bp__error(BP_ERR_OUT_OF_MEMORY, "growing %s to %zu x %zu bytes overflows", what, need,
                  elem);
        return false;
    }
    /* Double, but never past what fits: near the limit, exactly what is needed. */
    size_t n = *cap ? *cap : 8;
    while (n < need && n <= SIZE_MAX / 2)
        n *= 2;
    if (n < need || !bp__mul_size(n, elem, &bytes))
        n = need;
    void *q = bp__realloc(*p, n * elem, what);
    if (q == NULL)
        return false;
    *p = q;
    *cap = n;
    return true;
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

char *bp__vasprintf(const char *what, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *s = NULL;
    if (n < 0)
        bp__error(BP_ERR_INVALID_ARG, "cannot format %s", what);
    else if ((s = bp__malloc((size_t)n + 1, what)) != NULL)
        vsnprintf(s, (size_t)n + 1, fmt, again);
    va_end(again);
    return s;
}

char *bp__asprintf(const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = bp__vasprintf(what, fmt, ap);
    va_end(ap);
    return s;
}

char *bp__strcat_printf(char *s, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *more = bp__vasprintf(what, fmt, ap);
    va_end(ap);
    size_t ls = s != NULL ? strlen(s) : 0, lm = more != NULL ? strlen(more) : 0;
    char *out = more != NULL ? bp__realloc(s, ls + lm + 1, what) : NULL;
    if (out == NULL) {
        bp__free(s);
        bp__free(more);
        return NULL;
    }
    memcpy(out + ls, more, lm + 1);
    bp__free(more);
    return out;
}
