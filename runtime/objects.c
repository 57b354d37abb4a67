/* objects.c - constructors and destructors of the backend objects that plugins create.
 *
 * A plugin hands the runtime an interface struct and a context pointer; the runtime checks the
 * interface once, here, so that the wrappers in backend.c can rely on every required member
 * being present. Ownership is a tree: a registry owns the devices made for it, a device owns
 * the buffer types made for it. Buffers and backends belong to whoever asked for them. */
#include "config.h"

#include <stdarg.h>
#include <string.h>

#include "backend-impl.h"

enum bp_status bp_set_error(enum bp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bp__verror(status, fmt, ap);
    va_end(ap);
    return status;
}

static bool member_ok(size_t struct_size, size_t off, size_t sz, const void *fn)
{
    return struct_size >= off + sz && fn != NULL;
}

#define MEMBER_OK(T, iface, m) member_ok((iface)->struct_size, offsetof(T, m), sizeof((iface)->m), \
                                         (const void *)(iface)->m)

#define CHECK_MEMBER(T, what, iface, m)                                                        \
    do {                                                                                       \
        if (!MEMBER_OK(T, iface, m))                                                           \
            return bp__error_null(BP_ERR_ABI,                                                  \
                                  "%s interface (struct_size %zu) lacks the required member "  \
                                  "%s",                                                        \
                                  what, (iface)->struct_size, #m);                             \
    } while (0)

static bool append_ptr(void ***list, size_t *n, size_t *cap, void *p, const char *what)
{
    if (!bp__grow((void **)list, cap, *n + 1, sizeof(void *), what))
        return false;
    (*list)[(*n)++] = p;
    return true;
}

bp_registry *bp_registry_new_versioned(const struct bp_registry_iface *iface, int api_major,
                                       int api_minor, void *context)
{
    if (iface == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_registry_new: interface is NULL");
    if (api_major != BP_PLUGIN_API_MAJOR || api_minor > BP_PLUGIN_API_MINOR || api_minor < 0)
        return bp__error_null(BP_ERR_ABI,
                              "bp_registry_new: plugin API %d.%d is not compatible with the "
                              "runtime's %d.%d",
                              api_major, api_minor, BP_PLUGIN_API_MAJOR, BP_PLUGIN_API_MINOR);
    CHECK_MEMBER(struct bp_registry_iface, "registry", iface, get_name);
    CHECK_MEMBER(struct bp_registry_iface, "registry", iface, get_device_count);
    CHECK_MEMBER(struct bp_registry_iface, "registry", iface, get_device);
    bp_registry *reg = bp__calloc(1, sizeof(*reg), "a registry");
    if (reg == NULL)
        return NULL;
    reg->iface = iface;
    reg->context = context;
    reg->api_major = api_major;
    reg->api_minor = api_minor;
    return reg;
}

void bp_registry_free(bp_registry *reg)
{
    if (reg == NULL)
        return;
    /* Devices first: their free members may still use the registry's context. */
    for (size_t i = reg->n_devices; i-- > 0;) {
        bp_device *dev = reg->devices[i];
        for (size_t j = dev->n_bufts; j-- > 0;)
            bp_buffer_type_free(dev->bufts[j]);
        bp__free(dev->bufts);
        if (MEMBER_OK(struct bp_device_iface, dev->iface, free))
            dev->iface->free(dev);
        bp__checked_free(&dev->checked);
        bp__free(dev->description);
        bp__free(dev);
    }
    bp__free(reg->devices);
    if (MEMBER_OK(struct bp_registry_iface, reg->iface, free))
        reg->iface->free(reg);
    bp__checked_free(&reg->checked);
    bp__free(reg);
}

bp_device *bp_device_new(bp_registry *reg, const struct bp_device_iface *iface, void *context)
{
    if (reg == NULL || iface == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_device_new: registry and interface must not "
                              "be NULL");
    CHECK_MEMBER(struct bp_device_iface, "device", iface, get_name);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, get_description);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, get_memory);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, get_type);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, init_backend);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, get_buffer_type);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, supports_op);
    CHECK_MEMBER(struct bp_device_iface, "device", iface, supports_buft);
    /* Events come as a set or not at all. */
    bool ev_new = MEMBER_OK(struct bp_device_iface, iface, event_new);
    if (ev_new && (!MEMBER_OK(struct bp_device_iface, iface, event_free) ||
                   !MEMBER_OK(struct bp_device_iface, iface, event_synchronize)))
        return bp__error_null(BP_ERR_ABI, "device interface has event_new but lacks event_free or "
                              "event_synchronize");
    bp_device *dev = bp__calloc(1, sizeof(*dev), "a device");
    if (dev == NULL)
        return NULL;
    dev->iface = iface;
    dev->context = context;
    dev->reg = reg;
    dev->index = reg->n_devices;
    if (!append_ptr((void ***)&reg->devices, &reg->n_devices, &reg->cap_devices, dev,
                    "a registry's device list")) {
        bp__free(dev);
        return NULL;
    }
    return dev;
}

bp_buffer_type *bp_buffer_type_new(bp_device *dev, const struct bp_buffer_type_iface *iface,
                                   void *context)
{
    if (iface == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_buffer_type_new: interface is NULL");
    CHECK_MEMBER(struct bp_buffer_type_iface, "buffer type", iface, get_name);
    CHECK_MEMBER(struct bp_buffer_type_iface, "buffer type", iface, alloc_buffer);
    CHECK_MEMBER(struct bp_buffer_type_iface, "buffer type", iface, get_alignment);
    bp_buffer_type *buft = bp__calloc(1, sizeof(*buft), "a buffer type");
    if (buft == NULL)
        return NULL;
    buft->iface = iface;
    buft->context = context;
    buft->device = dev;
    if (dev != NULL &&
        !append_ptr((void ***)&dev->bufts, &dev->n_bufts, &dev->cap_bufts, buft,
                    "a device's buffer types")) {
        bp__free(buft);
        return NULL;
    }
    return buft;
}

void bp_buffer_type_free(bp_buffer_type *buft)
{
    if (buft == NULL || buft == bp_host_buffer_type() || buft == bp_file_buffer_type())
        return; /* the runtime's own, static */
    if (MEMBER_OK(struct bp_buffer_type_iface, buft->iface, free))
        buft->iface->free(buft);
    bp__checked_free(&buft->checked);
    bp__free(buft);
}

bp_buffer *bp_buffer_new(bp_buffer_type *buft, const struct bp_buffer_iface *iface, void *context,
                         size_t size)
{
    if (buft == NULL || iface == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_buffer_new: buffer type and interface must "
                              "not be NULL");
    CHECK_MEMBER(struct bp_buffer_iface, "buffer", iface, get_base);
    CHECK_MEMBER(struct bp_buffer_iface, "buffer", iface, memset_tensor);
    CHECK_MEMBER(struct bp_buffer_iface, "buffer", iface, set_tensor);
    CHECK_MEMBER(struct bp_buffer_iface, "buffer", iface, get_tensor);
    CHECK_MEMBER(struct bp_buffer_iface, "buffer", iface, clear);
    bp_buffer *buf = bp__calloc(1, sizeof(*buf), "a buffer");
    if (buf == NULL)
        return NULL;
    buf->iface = iface;
    buf->context = context;
    buf->plugin = bp__plugin_of_device(buft->device);
    bp__plugin_ref(buf->plugin);
    buf->buft = buft;
    buf->size = size;
    buf->usage = BP_BUFFER_USAGE_ANY;
    return buf;
}

bp_backend *bp_backend_new(bp_device *dev, const struct bp_backend_iface *iface, void *context)
{
    if (dev == NULL || iface == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_backend_new: device and interface must not "
                              "be NULL");
    CHECK_MEMBER(struct bp_backend_iface, "backend", iface, get_name);
    CHECK_MEMBER(struct bp_backend_iface, "backend", iface, graph_compute);
    bp_backend *be = bp__calloc(1, sizeof(*be), "a backend");
    if (be == NULL)
        return NULL;
    be->iface = iface;
    be->context = context;
    be->device = dev;
    be->plugin = bp__plugin_of_device(dev);
    bp__plugin_ref(be->plugin);
    return be;
}

void *bp_registry_get_context(bp_registry *reg)
{
    return reg ? reg->context : NULL;
}

void *bp_device_get_context(bp_device *dev)
{
    return dev ? dev->context : NULL;
}

void *bp_buffer_type_get_context(bp_buffer_type *buft)
{
    return buft ? buft->context : NULL;
}

void *bp_buffer_get_context(bp_buffer *buf)
{
    return buf ? buf->context : NULL;
}

void *bp_backend_get_context(bp_backend *backend)
{
    return backend ? backend->context : NULL;
}
