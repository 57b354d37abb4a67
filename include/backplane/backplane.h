/* backplane.h - umbrella header: the whole public API of libbackplane. A plugin author also
 * includes <backplane/bp-plugin.h>, the interface a plugin implements. */
#ifndef BACKPLANE_H
#define BACKPLANE_H

#include <backplane/bp-core.h>
#include <backplane/bp-tensor.h>
#include <backplane/bp-graph.h>
#include <backplane/bp-backend.h>
#include <backplane/bp-alloc.h>
#include <backplane/bp-sched.h>
#include <backplane/bp-comm.h>
#include <backplane/bp-cpu.h>
#include <backplane/bp-meta.h>
#include <backplane/bp-gguf.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin directory this library was configured with (./configure --with-plugindir). */
BP_API const char *bp_default_plugin_dir(void);

#ifdef __cplusplus
}
#endif

#endif
