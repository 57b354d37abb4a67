/* bp-core.h - what every part of the API shares: export macro, status codes, errors, logging. */
#ifndef BACKPLANE_BP_CORE_H
#define BACKPLANE_BP_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <backplane/version.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a symbol as part of the ABI; the library is built with -fvisibility=hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define BP_API __attribute__((visibility("default")))
#define BP_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define BP_API
#define BP_PRINTF(fmt, args)
#endif

/*
 * Status codes. One table gives the enum, bp_status_name() and bp_strerror(), so the three can
 * never disagree. Functions that do work return one of these; functions that return an object
 * return NULL on failure. Either way bp_last_error() holds a sentence saying what was wrong.
 */
#define BP_STATUS_MAP(X)                                                              \
    X(OK, 0, "success")                                                               \
    X(ERR_INVALID_ARG, -1, "invalid argument")                                        \
    X(ERR_OUT_OF_MEMORY, -2, "out of memory")                                         \
    X(ERR_SHAPE, -3, "incompatible tensor shapes")                                    \
    X(ERR_TYPE, -4, "unsupported or mismatched tensor type")                          \
    X(ERR_CAPACITY, -5, "capacity exceeded")                                          \
    X(ERR_OUT_OF_BOUNDS, -6, "access out of bounds")                                  \
    X(ERR_NOT_FOUND, -7, "not found")                                                 \
    X(ERR_UNSUPPORTED, -8, "operation not supported")                                 \
    X(ERR_PLUGIN, -9, "plugin could not be loaded")                                   \
    X(ERR_ABI, -10, "plugin ABI mismatch")                                            \
    X(ERR_BUSY, -11, "resource is still in use")                                      \
    X(ERR_IO, -12, "input/output error")                                              \
    X(ERR_BACKEND, -13, "backend failure")                                            \
    X(ERR_TIMEOUT, -14, "timed out")                                                  \
    X(ERR_REMOTE, -15, "another process failed")

enum bp_status {
#define BP_STATUS_ENUM(name, value, text) BP_##name = (value),
    BP_STATUS_MAP(BP_STATUS_ENUM)
#undef BP_STATUS_ENUM
};

/* "BP_ERR_SHAPE" for BP_ERR_SHAPE; "BP_UNKNOWN_STATUS" for a value outside the table. */
BP_API const char *bp_status_name(enum bp_status status);
/* A short lowercase description ("incompatible tensor shapes"); static storage. */
BP_API const char *bp_strerror(enum bp_status status);

/*
 * The last error of the calling thread: one sentence naming what was wrong (the op, tensor,
 * file or plugin). Valid until the next failing call on this thread; "" when there is none.
 * Only meaningful after a call reported failure: check return values first, then read it.
 */
BP_API const char *bp_last_error(void);
/* The status that went with bp_last_error(), BP_OK when there is none. */
BP_API enum bp_status bp_last_status(void);
BP_API void bp_clear_error(void);

/* Version of the library actually loaded (compare with BP_VERSION_STRING / BP_VERSION_HEX). */
BP_API const char *bp_version(void);
BP_API uint32_t bp_version_hex(void);

/* Logging. Messages go to a callback (default: stderr) when at or above the level. The level
 * starts from the environment variable BP_LOG_LEVEL (debug, info, warn, error, none, or 0-4),
 * default warn; bp_log_set_level() overrides it. */
enum bp_log_level {
    BP_LOG_DEBUG = 0,
    BP_LOG_INFO = 1,
    BP_LOG_WARN = 2,
    BP_LOG_ERROR = 3,
    BP_LOG_NONE = 4,
};

/* msg is one line without the trailing newline, valid only during the call. */
typedef void (*bp_log_fn)(enum bp_log_level level, const char *msg, void *user_data);

/* Sets the callback for all threads; NULL restores the stderr default. */
BP_API void bp_log_set_callback(bp_log_fn fn, void *user_data);
BP_API void bp_log_set_level(enum bp_log_level level);
BP_API enum bp_log_level bp_log_get_level(void);
/* Logs through the installed callback; plugins use this too, so one callback sees everything. */
BP_API void bp_log(enum bp_log_level level, const char *fmt, ...) BP_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif
