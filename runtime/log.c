/* log.c - logging through one settable callback, level from BP_LOG_LEVEL.
 *
 * The level and callback are process-wide and may be read from any thread while another sets
 * them, so they are atomics; the callback and its user data are swapped together under a
 * mutex so a message never pairs a new callback with old user data. */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bp-impl.h"

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static _Atomic int log_level = BP_LOG_WARN;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static bp_log_fn log_fn;
static void *log_user;

static void log_level_from_env(void)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "none"};
    const char *env = getenv("BP_LOG_LEVEL");
    if (env == NULL || env[0] == '\0')
        return;
    for (int i = 0; i <= BP_LOG_NONE; i++) {
        if (strcasecmp(env, names[i]) == 0 || (env[0] == '0' + i && env[1] == '\0')) {
            atomic_store(&log_level, i);
            return;
        }
    }
    if (strcasecmp(env, "warning") == 0) {
        atomic_store(&log_level, BP_LOG_WARN);
        return;
    }
    char shown[64]; /* a user's value: escaped, and cut short with "..." past this */
    bp__escape_controls(shown, sizeof(shown), env);
    fprintf(stderr, "backplane: ignoring BP_LOG_LEVEL='%s': expected debug, info, warn, error, "
                    "none or 0-4\n", shown);
}

void bp_log_set_level(enum bp_log_level level)
{
    pthread_once(&level_once, log_level_from_env);
    if (level < BP_LOG_DEBUG)
        level = BP_LOG_DEBUG;
    if (level > BP_LOG_NONE)
        level = BP_LOG_NONE;
    atomic_store(&log_level, (int)level);
}

enum bp_log_level bp_log_get_level(void)
{
    pthread_once(&level_once, log_level_from_env);
    return (enum bp_log_level)atomic_load(&log_level);
}

void bp_log_set_callback(bp_log_fn fn, void *user_data)
{
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user_data;
    pthread_mutex_unlock(&log_lock);
}

static void log_to_stderr(enum bp_log_level level, const char *msg)
{
    static const char *const tags[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "backplane %s: %s\n", tags[level], msg);
}

void bp_log(enum bp_log_level level, const char *fmt, ...)
{
    if (level < BP_LOG_DEBUG || level >= BP_LOG_NONE || (int)level < (int)bp_log_get_level())
        return;

    char raw[1024], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    /* One line per message: a trailing newline from the caller would double up, and any other
     * control character (from a name or path in the message) is written as a C escape. */
    size_t len = strlen(raw);
    while (len > 0 && raw[len - 1] == '\n')
        raw[--len] = '\0';
    bp__escape_controls(msg, sizeof(msg), raw);

    pthread_mutex_lock(&log_lock);
    bp_log_fn fn = log_fn;
    void *user = log_user;
    pthread_mutex_unlock(&log_lock);

    if (fn != NULL)
        fn(level, msg, user);
    else
        log_to_stderr(level, msg);
}
