/* tool.h - private to tools/: the commands of the `backplane` tool that live in their own
 * files. Each takes the arguments after its name and returns the process exit status. */
#ifndef BP_TOOLS_TOOL_H
#define BP_TOOLS_TOOL_H

#include <backplane/backplane.h>

/* backplane run (run.c) */
int cmd_run(int argc, char **argv);

#endif
