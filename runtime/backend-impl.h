/* backend-impl.h - private to runtime/: the layout of the backend objects behind the opaque
 * handles of bp-backend.h. Plugins never see these; they go through bp-plugin.h. */
#ifndef BACKPLANE_BACKEND_IMPL_H
#define BACKPLANE_BACKEND_IMPL_H

#include <stdatomic.h>

#include <backplane/bp-plugin.h>

#include "bp-impl.h"

struct bp_plugin;

struct bp_registry {
    const struct bp_registry_iface *iface;
    void *context;
    struct bp_plugin *plugin; /* the loaded plugin it came from; NULL when made in-process */
    int api_major;
    int api_minor;
    bp_device **devices; /* made with bp_device_new for this registry, freed with it */
    size_t n_devices;
    size_t cap_devices;
};

struct bp_device {
    const struct bp_device_iface *iface;
    void *context;
    bp_registry *reg;
    bp_buffer_type **bufts; /* made with bp_buffer_type_new for this device, freed with it */
    size_t n_bufts;
    size_t cap_bufts;
};

struct bp_buffer_type {
    const struct bp_buffer_type_iface *iface;
    void *context;
    bp_device *device;
};

struct bp_buffer {
    const struct bp_buffer_iface *iface;
    void *context;
    struct bp_plugin *plugin; /* holds a reference while the buffer lives */
    bp_buffer_type *buft;
    size_t size;
    enum bp_buffer_usage usage;
};

struct bp_backend {
    const struct bp_backend_iface *iface;
    void *context;
    struct bp_plugin *plugin; /* holds a reference while the backend lives */
    bp_device *device;
    /* The thread inside a call on this backend (a per-thread token; 0: none) and how deeply it
     * has entered (only that thread touches depth). A second thread is refused with BP_ERR_BUSY
     * instead of racing the plugin's state (backend.c, backend_enter). */
    _Atomic uintptr_t owner;
    int depth;
};

struct bp_event {
    struct bp_plugin *plugin; /* holds a reference while the event lives */
    bp_device *device;
    void *handle;
};

#define BP_HAS(T, iface, m) BP_IFACE_HAS(T, iface, m)

/* Reference counting of loaded plugins (loader.c): objects that run plugin code take a
 * reference when made and drop it when freed, so a plugin in use cannot be unloaded. NULL (an
 * in-process registry) is ignored. */
struct bp_plugin *bp__plugin_of_device(bp_device *dev);
void bp__plugin_ref(struct bp_plugin *p);
void bp__plugin_unref(struct bp_plugin *p);
/* Copies up to max loaded registries, in load order, into out (running discovery first if it
 * has not run); returns how many are loaded. */
size_t bp__registry_snapshot(bp_registry **out, size_t max);

/* Places t at addr in buf without the public bounds checks (the allocators have done them). */
enum bp_status bp__place_tensor(bp_buffer *buf, bp_tensor *t, void *addr);

#endif
