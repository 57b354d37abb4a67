/* backend-impl.h - private to runtime/: the layout of the backend objects behind the opaque
 * handles of bp-backend.h. Plugins never see these; they go through bp-plugin.h. */
#ifndef BACKPLANE_BACKEND_IMPL_H
#define BACKPLANE_BACKEND_IMPL_H

#include <stdatomic.h>

#include <backplane/bp-plugin.h>

#include "bp-impl.h"

struct bp_plugin;

/* What the runtime has checked of a plugin object's answers (verify.c): state goes once from
 * unchecked to usable or refused (never back), and name and refusal are written before it
 * changes, so a reader that sees the state may read them without a lock. */
enum bp__check_state { BP__UNCHECKED = 0, BP__USABLE = 1, BP__REFUSED = 2 };
struct bp__checked {
    _Atomic int state;
    char *name;    /* the checked name (a copy; NULL until checked, or when it was refused) */
    char *refusal; /* when refused: the sentence that says why (names the plugin) */
};

struct bp_registry {
    const struct bp_registry_iface *iface;
    void *context;
    struct bp_plugin *plugin; /* the loaded plugin it came from; NULL when made in-process */
    int api_major;
    int api_minor;
    bp_device **devices; /* made with bp_device_new for this registry, freed with it */
    size_t n_devices;
    size_t cap_devices;
    struct bp__checked checked; /* its name (verify.c) */
};

struct bp_device {
    const struct bp_device_iface *iface;
    void *context;
    bp_registry *reg;
    size_t index;           /* its place among the devices made for reg */
    bp_buffer_type **bufts; /* made with bp_buffer_type_new for this device, freed with it */
    size_t n_bufts;
    size_t cap_bufts;
    struct bp__checked checked; /* its name and description (verify.c) */
    char *description;
};

struct bp_buffer_type {
    const struct bp_buffer_type_iface *iface;
    void *context;
    bp_device *device;
    struct bp__checked checked; /* its name and alignment (verify.c) */
    size_t alignment;
};

struct bp_buffer {
    const struct bp_buffer_iface *iface;
    void *context;
    struct bp_plugin *plugin; /* holds a reference while the buffer lives */
    bp_buffer_type *buft;
    size_t size;
    enum bp_buffer_usage usage;
    bool base_checked; /* base holds get_base's answer, checked when the buffer was made */
    void *base;
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

/* ---- Checks of plugin answers (verify.c) --------------------------------------------------
 * Every answer the runtime relies on is checked once, where it first crosses into the runtime:
 * names and descriptions (non-NULL, printable UTF-8, bounded), alignments (a power of two up to
 * BP__MAX_ALIGNMENT), a buffer's base (not NULL, aligned, no wrap), largest buffer sizes (not
 * 0) and allocation sizes (at least the tensor's bytes). An object whose answer breaks the
 * contract is refused, with a sentence naming its plugin and the answer; the rest of the plugin
 * and every other plugin go on. */
#define BP__NAME_MAX 127
#define BP__DESCRIPTION_MAX 1023
#define BP__MAX_ALIGNMENT ((size_t)1 << 20)

/* Whether reg's name passed (checked on first use); a refused registry has no usable name. */
bool bp__registry_usable(bp_registry *reg);
/* Whether dev's name and description passed (checked on first use). */
bool bp__device_usable(bp_device *dev);
/* Whether buft's name, alignment and largest size passed (checked on first use) and no later
 * answer (an allocation size) has broken the contract since. */
bool bp__buft_usable(bp_buffer_type *buft);
/* Refuses buft from now on with the sentence fmt... (prefixed with its owner); returns
 * BP_ERR_BACKEND after recording the sentence as the error. */
enum bp_status bp__buft_refuse(bp_buffer_type *buft, const char *fmt, ...) BP_PRINTF(2, 3);
/* The error for using a refused object: its refusal sentence as BP_ERR_BACKEND. */
enum bp_status bp__refused_error(const struct bp__checked *c);
/* The devices the registry's plugin offers that pass the checks (get_device answers that are
 * NULL or not made for reg are passed over): with index < count, the index-th of them; the
 * count is returned and *out set when found. */
size_t bp__registry_devices(bp_registry *reg, size_t index, bp_device **out);
/* Calls fn with each refusal sentence among reg's devices (for the load report). */
void bp__registry_refusals(bp_registry *reg, void (*fn)(void *arg, const char *sentence),
                           void *arg);
/* Checks the base of buf, just made by its type's alloc_buffer, and keeps it; BP_OK, or the
 * error (buf is then the caller's to free). */
enum bp_status bp__buffer_check_base(bp_buffer *buf);
/* Frees what the checks kept for an object. */
void bp__checked_free(struct bp__checked *c);
/* "plugin 'name'" of a loaded plugin (loader.c), for messages. */
const char *bp__plugin_name(const struct bp_plugin *p);

/* Places t at addr in buf without the public bounds checks (the allocators have done them). */
enum bp_status bp__place_tensor(bp_buffer *buf, bp_tensor *t, void *addr);

#endif
