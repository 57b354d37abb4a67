/* test-status.c - status codes, per-thread last error, logging, version. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <backplane/bp-plugin.h>

#include "test-util.h"

START_TEST(test_status_names_and_texts)
{
    ck_assert_str_eq(bp_status_name(BP_OK), "BP_OK");
    ck_assert_str_eq(bp_status_name(BP_ERR_SHAPE), "BP_ERR_SHAPE");
    ck_assert_str_eq(bp_status_name(BP_ERR_BUSY), "BP_ERR_BUSY");
    ck_assert_str_eq(bp_strerror(BP_ERR_OUT_OF_MEMORY), "out of memory");
    ck_assert_str_eq(bp_status_name((enum bp_status)12345), "BP_UNKNOWN_STATUS");
    ck_assert_str_eq(bp_strerror((enum bp_status)-999), "unknown status");
    /* Every code in the table has a distinct name and a non-empty text. */
#define CHECK_ROW(name, value, text)                                                          \
    ck_assert_str_eq(bp_status_name(BP_##name), "BP_" #name);                                 \
    ck_assert_str_eq(bp_strerror(BP_##name), text);                                           \
    ck_assert_int_eq((int)BP_##name, value);
    BP_STATUS_MAP(CHECK_ROW)
#undef CHECK_ROW
}
END_TEST

START_TEST(test_error_is_set_and_cleared)
{
    bp_clear_error();
    ck_assert_str_eq(bp_last_error(), "");
    ck_assert_int_eq(bp_last_status(), BP_OK);
    ck_assert_ptr_null(bp_context_new(0));
    ck_assert_int_eq(bp_last_status(), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "max_tensors"));
    bp_clear_error();
    ck_assert_str_eq(bp_last_error(), "");
}
END_TEST

static void *thread_fails(void *arg)
{
    (void)arg;
    bp_clear_error();
    enum bp_type t;
    enum bp_status st = bp_type_from_name("no-such-type", &t);
    static char copy[256];
    snprintf(copy, sizeof(copy), "%d|%s", (int)st, bp_last_error());
    return copy;
}

START_TEST(test_error_is_per_thread)
{
    bp_clear_error();
    ck_assert_ptr_null(bp_context_new(0));
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, thread_fails, NULL), 0);
    void *res;
    ck_assert_int_eq(pthread_join(th, &res), 0);
    ck_assert_ptr_nonnull(strstr((const char *)res, "no-such-type"));
    /* This thread still sees its own error, not the other thread's. */
    ck_assert_int_eq(bp_last_status(), BP_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "max_tensors"));
}
END_TEST

struct log_capture {
    int count;
    enum bp_log_level last_level;
    char last[256];
};

static void capture(enum bp_log_level level, const char *msg, void *user)
{
    struct log_capture *c = user;
    c->count++;
    c->last_level = level;
    snprintf(c->last, sizeof(c->last), "%s", msg);
}

/* A message is kept whole however long it is (a deep plugin path), and control characters in
 * it come back as C escapes, one printable line. */
START_TEST(test_long_messages_whole_and_escaped)
{
    size_t n = 20000;
    char *path = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        path[i] = i % 64 == 0 ? '/' : 'a' + (char)(i % 26);
    path[n] = '\0';
    ck_assert_int_eq(bp_set_error(BP_ERR_IO, "cannot open %s: end", path), BP_ERR_IO);
    ck_assert_uint_eq(strlen(bp_last_error()), strlen("cannot open ") + n + strlen(": end"));
    ck_assert_ptr_nonnull(strstr(bp_last_error(), path));
    /* The previous message as an argument of the next (a common way to add context). */
    ck_assert_int_eq(bp_set_error(BP_ERR_IO, "again: %s", bp_last_error()), BP_ERR_IO);
    ck_assert_uint_eq(strlen(bp_last_error()), strlen("again: cannot open ") + n + strlen(": end"));
    /* Escapes, short and long. */
    bp_set_error(BP_ERR_INVALID_ARG, "name 'a\nb\x1b[0m\x7f' done");
    ck_assert_str_eq(bp_last_error(), "name 'a\\nb\\x1b[0m\\x7f' done");
    path[100] = '\n';
    bp_set_error(BP_ERR_INVALID_ARG, "%s", path);
    ck_assert_uint_eq(strlen(bp_last_error()), n + 1);
    ck_assert_ptr_null(strchr(bp_last_error(), '\n'));
    bp_clear_error();
    ck_assert_str_eq(bp_last_error(), "");
    free(path);
}
END_TEST

START_TEST(test_log_callback_and_level)
{
    struct log_capture c = {0};
    bp_log_set_callback(capture, &c);
    bp_log_set_level(BP_LOG_INFO);
    bp_log(BP_LOG_DEBUG, "hidden %d", 1);
    ck_assert_int_eq(c.count, 0);
    bp_log(BP_LOG_WARN, "shown %d\n", 2);
    ck_assert_int_eq(c.count, 1);
    ck_assert_int_eq(c.last_level, BP_LOG_WARN);
    ck_assert_str_eq(c.last, "shown 2"); /* trailing newline stripped */

    /* At debug level every recorded error is logged too. */
    bp_log_set_level(BP_LOG_DEBUG);
    ck_assert_ptr_null(bp_context_new(0));
    ck_assert_int_eq(c.count, 2);
    ck_assert_ptr_nonnull(strstr(c.last, "max_tensors"));

    bp_log_set_level(BP_LOG_NONE);
    bp_log(BP_LOG_ERROR, "silenced");
    ck_assert_int_eq(c.count, 2);
    bp_log_set_level((enum bp_log_level)99); /* clamped */
    ck_assert_int_eq(bp_log_get_level(), BP_LOG_NONE);
    bp_log_set_callback(NULL, NULL);
}
END_TEST

/* The level is read from the environment once per process, so each case runs in a fresh
 * process: this program re-executed with --level-probe, which exits with the level it saw.
 * That holds whether or not Check forks and whatever earlier tests did in this process. */
static const char *self_path;

static int level_seen_with_env(const char *value)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("BP_LOG_LEVEL", value, 1);
        execl(self_path, self_path, "--level-probe", (char *)NULL);
        _exit(99);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

START_TEST(test_log_level_from_env)
{
    ck_assert_int_eq(level_seen_with_env("ERROR"), BP_LOG_ERROR);
    ck_assert_int_eq(level_seen_with_env("debug"), BP_LOG_DEBUG);
    ck_assert_int_eq(level_seen_with_env("0"), BP_LOG_DEBUG);
    ck_assert_int_eq(level_seen_with_env("4"), BP_LOG_NONE);
    ck_assert_int_eq(level_seen_with_env("warning"), BP_LOG_WARN);
    ck_assert_int_eq(level_seen_with_env("loud"), BP_LOG_WARN); /* bad value: default kept */
    ck_assert_int_eq(level_seen_with_env(""), BP_LOG_WARN);
}
END_TEST

START_TEST(test_version)
{
    ck_assert_str_eq(bp_version(), BP_VERSION_STRING);
    ck_assert_uint_eq(bp_version_hex(), BP_VERSION_HEX);
    char buf[32];
    snprintf(buf, sizeof(buf), "%d.%d.%d", BP_VERSION_MAJOR, BP_VERSION_MINOR, BP_VERSION_PATCH);
    ck_assert_str_eq(buf, BP_VERSION_STRING);
    ck_assert_int_gt((int)strlen(bp_default_plugin_dir()), 0);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--level-probe") == 0)
        return (int)bp_log_get_level();
    self_path = argv[0];
    Suite *s = suite_create("status");
    BP_TCASE(s, test_status_names_and_texts, 10);
    BP_TCASE(s, test_error_is_set_and_cleared, 10);
    BP_TCASE(s, test_error_is_per_thread, 10);
    BP_TCASE(s, test_long_messages_whole_and_escaped, 10);
    BP_TCASE(s, test_log_callback_and_level, 10);
    BP_TCASE(s, test_log_level_from_env, 10);
    BP_TCASE(s, test_version, 10);
    return bp_test_run(s);
}
