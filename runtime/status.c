/* status.c - status codes, the per-thread last error, version queries and BP_ASSERT. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp-impl.h"

#define BP_ERROR_MAX 512

/* Per thread: the message of the last failure and its status. Fixed storage, so recording an
 * error can never itself fail for lack of memory. */
static _Thread_local char tls_error[BP_ERROR_MAX];
static _Thread_local enum bp_status tls_status = BP_OK;

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

enum bp_status bp__verror(enum bp_status status, const char *fmt, va_list ap)
{
    int n = vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
    if (n < 0)
        snprintf(tls_error, sizeof(tls_error), "%s", bp_strerror(status));
    tls_status = status;
    /* Errors are returned to the caller, who decides whether they matter; debug logging lets
     * a user see every one of them without changing the application. */
    bp_log(BP_LOG_DEBUG, "error %s: %s", bp_status_name(status), tls_error);
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
    return tls_error;
}

enum bp_status bp_last_status(void)
{
    return tls_status;
}

void bp_clear_error(void)
{
    tls_error[0] = '\0';
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
