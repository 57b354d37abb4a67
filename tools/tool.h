/* tool.h - private to tools/: the commands of the `backplane` tool that live in their own
 * files. Each takes the arguments after its name and returns the process exit status. */
#ifndef BP_TOOLS_TOOL_H
#define BP_TOOLS_TOOL_H

#include <backplane/backplane.h>

#include <stdbool.h>

/* backplane run (run.c) */
int cmd_run(int argc, char **argv);
/* backplane bench (bench.c) */
int cmd_bench(int argc, char **argv);

/* Backends for a device list ("CUDA0,CPU", "Meta(CPU0,CPU1),CPU"; threads > 0 is passed to CPU
 * devices), at most max. for_run: the default is every GPU, the CPU is added last when missing
 * and must be last; otherwise the default is every device. Returns how many, or -1 after
 * printing why (nothing left open). */
int tool_open_backends(const char *list, int threads, bp_backend **out, int max, bool for_run);

#endif
