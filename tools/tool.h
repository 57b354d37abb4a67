/* tool.h - private to tools/: the commands of the `backplane` tool that live in their own
 * files, each taking the arguments after its name and returning the process exit status, and
 * the helpers they share (devices.c, args.c, text.c). */
#ifndef BP_TOOLS_TOOL_H
#define BP_TOOLS_TOOL_H

#include <backplane/backplane.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>

/* backplane run (run.c) */
int cmd_run(int argc, char **argv);
/* backplane bench (bench.c) */
int cmd_bench(int argc, char **argv);
/* backplane conformance (conformance.c) */
int cmd_conformance(int argc, char **argv);
/* backplane quantize (quantize.c) */
int cmd_quantize(int argc, char **argv);

/* With devices on other processes (DEVICE@RANK in devices: one of several processes started
 * by mpirun), this process's rank and in *n_ranks how many there are; else 0 of 1 (ranks.c). */
int tool_process_rank(const char *devices, int *n_ranks);
/* With devices on other processes, every rank meets here, telling the others its state (ok):
 * false when this rank or another failed (printed, naming the rank); else ok (ranks.c). */
bool tool_sync_ranks(const char *devices, bool ok);

/* Writes s to f escaped (control characters as C escapes, "\n"; C1 controls and bytes that are
 * not UTF-8 as "\x1b"): for names, paths, option values and messages that come from outside
 * the tool, printed as text (text.c). */
void tool_put_text(const char *s, FILE *f);
/* s escaped the same way, for a printf argument: one of four per-thread buffers used in turn
 * (so one call may show up to four), cut with "..." past 2 KiB; NULL shows as "(null)". */
const char *tool_text(const char *s);

/* A file the tool writes, named by opt ("--dot") of cmd: created (0666 less the umask) or
 * emptied, without blocking; a FIFO that nothing reads, a directory, a socket or a block device
 * is refused; regular files and streams are written. The stream, or NULL after printing "<cmd>: cannot write <opt> file '<path>': <why>"
 * (files.c). */
FILE *tool_open_output(const char *cmd, const char *opt, const char *path);

/* Writes a, b and c as "0.13 GiB", or in MiB ("131.50 MiB") or exact bytes when a and b would
 * otherwise print the same although they differ (text.c). */
void tool_format_sizes(size_t a, size_t b, size_t c, char out[3][40]);

/* How a "Meta(A,B,...)" device stores the weights: fn and user go to bp_meta_device_new. */
struct tool_meta_split {
    bp_meta_split_fn fn;
    void *user;
};

/* Backends for a device list ("CUDA0,CPU", "Meta(CPU0,CPU1),CPU"; threads > 0 is passed to CPU
 * devices), at most max, into out (devices.c). for_run: the default is every GPU, the CPU is
 * added last when missing and must be last; otherwise the default is every device. split
 * (optional): how meta devices store weights; NULL leaves them to the meta plugin's policy.
 * Returns how many (the caller frees each with bp_backend_free), or after printing why (nothing
 * left open) TOOL_BAD_LIST when the list itself is wrong (an empty name, unbalanced parentheses,
 * too many names, a device named twice, a meta name of the wrong form, for run a CPU device
 * before another: exit status 2), else -1
 * (a device that cannot be opened). */
#define TOOL_BAD_LIST (-2)
int tool_open_backends(const char *list, int threads, bp_backend **out, int max, bool for_run,
                       const struct tool_meta_split *split);

/* Strict parsing of numeric option values (args.c). The whole of text must be the number and
 * lie in the range; otherwise each prints "<cmd>: <opt> needs ..., not '<text>'" on stderr and
 * returns false (the list parser -1), and the caller exits with status 2. */
bool tool_parse_int(const char *cmd, const char *opt, const char *text, long long min,
                    long long max, long long *out);
bool tool_parse_u64(const char *cmd, const char *opt, const char *text, uint64_t *out);
/* A duration in seconds: finite, above 0, at most max. */
bool tool_parse_seconds(const char *cmd, const char *opt, const char *text, double max,
                        double *out);
/* "1,8,32": 1 to max_n distinct whole numbers in [min, max]; their count. */
int tool_parse_int_list(const char *cmd, const char *opt, const char *text, long long min,
                        long long max, long long *out, int max_n);

/* What a command does not understand, each said on stderr; both return 2, the exit status.
 * tool_bad_arg: "<cmd>: unknown option '-x'" or "<cmd>: unexpected argument 'x'" (arg is not an
 * option); tool_no_value: "<cmd>: <opt> needs a value" (the last argument). */
int tool_bad_arg(const char *cmd, const char *arg);
int tool_no_value(const char *cmd, const char *opt);
/* A comma-separated list of names: not empty, no empty entry, no entry twice; else false after
 * saying which on stderr (args.c). */
bool tool_check_list(const char *cmd, const char *opt, const char *text);

#endif
