/* status.c - status codes, the per-thread last error, version queries and BP_ASSERT. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp-impl.h"

#define BP_ERROR_MAX 1024

/* Per thread: the message of the last failure and its status. Messages that fit live in fixed
 * storage, so recording the usual error never allocates; a longer one (a deep path) goes to a
 * heap copy that grows as needed and is freed when the thread ends. Only if that allocation
 * fails is a message cut, and then it ends in "..." rather than stopping mid-word. Plain
 * malloc, not bp__malloc: a failure here must not record an error in turn. */
static _Thread_local char tls_error[BP_ERROR_MAX];
static _Thread_local char *tls_heap;
static _Thread_local size_t tls_heap_size;
static _Thread_local const char *tls_message;
static _Thread_local enum bp_status tls_status = BP_OK;

static pthread_key_t heap_key;
static pthread_once_t heap_key_once = PTHREAD_ONCE_INIT;

static void make_heap_key(void)
{
    pthread_key_create(&heap_key, free);
}

const char *bp_status_name(enum bp_status status)
{
    switch (status) {
#define BP_STATUS_NAME(name, value, text) \
    case BP_##name:                       \
        return "BP_" #name;
        BP_STATUS_MAP(BP_STATUS_NAME)
#undef BP_STATUS_NAME
    }
    return "BP_UNKNOWN_STATUS";
}

const char *bp_strerror(enum bp_status status)
{
    switch (status) {
#define BP_STATUS_TEXT(name, value, text) \
    case BP_##name:                       \
        return text;
        BP_STATUS_MAP(BP_STATUS_TEXT)
#undef BP_STATUS_TEXT
    }
    return "unknown status";
}

char *bp__escape_dup(const char *src, const char *what)
{
    size_t need = bp__escaped_size(src);
    char *dst = bp__malloc(need, what);
    if (dst != NULL)
        bp__escape_controls(dst, need, src);
    return dst;
}

/* Makes raw (already formatted) the thread's message, escaped. */
static void store_message(const char *raw)
{
    size_t need = bp__escaped_size(raw);
    if (need > sizeof(tls_error) && need > tls_heap_size) {
        pthread_once(&heap_key_once, make_heap_key);
        char *grown = realloc(tls_heap, need);
        if (grown != NULL) {
            tls_heap = grown;
            tls_heap_size = need;
            pthread_setspecific(heap_key, tls_heap);
        }
    }
    char *dst = need > sizeof(tls_error) && tls_heap_size >= need ? tls_heap : tls_error;
    bp__escape_controls(dst, dst == tls_heap ? tls_heap_size : sizeof(tls_error), raw);
    tls_message = dst;
}

enum bp_status bp__verror(enum bp_status status, const char *fmt, va_list ap)
{
    /* Formatted first (the arguments may point at the current message), then copied with
     * control characters written as C escapes: names and paths come from users and files, and
     * a newline or terminal escape in one must not break the one-line sentence (or a terminal)
     * that shows it. */
    char fixed[BP_ERROR_MAX], *raw = fixed, *big = NULL;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(fixed, sizeof(fixed), fmt, ap);
    if (n < 0) {
        snprintf(fixed, sizeof(fixed), "%s", bp_strerror(status));
    } else if ((size_t)n >= sizeof(fixed)) {
        big = malloc((size_t)n + 1);
        if (big != NULL && vsnprintf(big, (size_t)n + 1, fmt, again) == n)
            raw = big;
        else
            memcpy(fixed + sizeof(fixed) - 4, "...", 4);
    }
    va_end(again);
    store_message(raw);
    free(big);
    tls_status = status;
    /* Errors are returned to the caller, who decides whether they matter; debug logging lets
     * a user see every one of them without changing the application. */
    bp_log(BP_LOG_DEBUG, "error %s: %s", bp_status_name(status), bp_last_error());
    return status;
}

enum bp_status bp__error(enum bp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bp__verror(status, fmt, ap);
    va_end(ap);
    return status;
}

const char *bp_last_error(void)
{
    return tls_message != NULL ? tls_message : tls_error;
}

enum bp_status bp_last_status(void)
{
    return tls_status;
}

void bp_clear_error(void)
{
    tls_error[0] = '\0';
    tls_message = tls_error;
    tls_status = BP_OK;
}

const char *bp_version(void)
{
    return BP_VERSION_STRING;
}

uint32_t bp_version_hex(void)
{
    return BP_VERSION_HEX;
}

const char *bp_default_plugin_dir(void)
{
    return BP_PLUGIN_DIR;
}

void bp__assert_fail(const char *file, int line, const char *cond)
{
    fprintf(stderr, "backplane: internal error at %s:%d: assertion '%s' failed\n", file, line,
            cond);
    fflush(stderr);
    abort();
}

void *bp__error_null(enum bp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bp__verror(status, fmt, ap);
    va_end(ap);
    return NULL;
}
