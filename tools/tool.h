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

/* With devices on other processes (DEVICE@RANK in devices: one of several processes started
 * by mpirun), this process's rank and in *n_ranks how many there are; else 0 of 1 (ranks.c). */
int tool_process_rank(const char *devices, int *n_ranks);
/* With devices on other processes, every rank meets here, telling the others its state (ok):
 * false when this rank or another failed (printed, naming the rank); else ok (ranks.c). */
bool tool_sync_ranks(const char *devices, bool ok);

/* Writes s to f with control characters as C escapes ("\n", "\x1b"): for names and paths
 * that come from outside the tool, printed as text (text.c). */
void tool_put_text(const char *s, FILE *f);
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
 * Returns how many (the caller frees each with bp_backend_free), or -1 after printing why
 * (nothing left open). */
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
/* "1,8,32": 1 to max_n whole numbers in [min, max]; their count. */
int tool_parse_int_list(const char *cmd, const char *opt, const char *text, long long min,
                        long long max, long long *out, int max_n);

#endif
