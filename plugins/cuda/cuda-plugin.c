/* cuda-plugin.c - the CUDA plugin: registry "CUDA", one device per GPU ("CUDA0", ...) found
 * through the driver API, device and pinned host buffer types, op support, and NCCL collectives
 * (bp_comm_*) when built with NCCL.
 *
 * This object links no CUDA library. Backends, buffers, events and communicators are made by
 * the implementation library (libbackplane-cuda-impl.so, beside the plugin), loaded here the first
 * time one is asked for; see cuda-internal.h. A machine without a GPU or driver gives a registry
 * with no devices, the reason in the load report (bp_registry_note), and never loads it. */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda-internal.h"

struct cuda_registry *bp_cuda_registry;

/* ---- The implementation library ------------------------------------------------------------ */

static pthread_mutex_t impl_lock = PTHREAD_MUTEX_INITIALIZER;

/* dlsym into a function pointer without a cast ISO C lacks. */
static bp_cuda_impl_open_fn impl_open_symbol(void *lib)
{
    bp_cuda_impl_open_fn fn;
    void *p = dlsym(lib, BP_CUDA_IMPL_OPEN);
    memcpy(&fn, &p, sizeof(fn));
    return p != NULL ? fn : NULL;
}

/* Whether an object is already loaded under the name fdpath (one opened through a descriptor
 * whose number has since been reused): dlopen would return it instead of reading our file. */
static bool fd_name_taken(const char *fdpath)
{
    void *h = dlopen(fdpath, RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL)
        return false;
    struct link_map *lm = NULL;
    const bool taken = dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL && lm->l_name != NULL &&
                       strcmp(lm->l_name, fdpath) == 0;
    dlclose(h);
    return taken;
}

/* Opens the library beside the plugin, checked as the loader checks plugins: a regular file,
 * not a link, owned by root or by us, writable by nobody else; then loaded through the
 * descriptor that was checked (/proc/self/fd/N), as the runtime's loader does. NODELETE: cudart
 * and cuBLAS register exit handlers and are not made to be unloaded. So the library stays mapped
 * for the life of the process, known by the name /proc/self/fd/N, and the descriptor stays open
 * as long: were N reused, a later dlopen of /proc/self/fd/N (ours after a reload of the plugin,
 * or the loader's) would be handed this library instead of the file it checked. For the same
 * reason a number that already names a loaded object is not used. */
static void *impl_dlopen(const char *who, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        bp_set_error(BP_ERR_PLUGIN, "%s: cannot open the CUDA implementation library %s: %s "
                     "(it is installed beside the plugin)", who, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    const char *bad = NULL;
    if (fstat(fd, &st) != 0)
        bad = "it cannot be examined";
    else if (!S_ISREG(st.st_mode))
        bad = "it is not a regular file";
    else if (st.st_uid != 0 && st.st_uid != geteuid())
        bad = "it is owned by another user";
    else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        bad = "it is writable by group or others";
    char fdpath[32];
    enum { MAX_TRIES = 8 };
    int set_aside[MAX_TRIES], n_aside = 0;
    while (bad == NULL) {
        snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
        if (!fd_name_taken(fdpath))
            break;
        const int fresh = n_aside < MAX_TRIES ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
        if (fresh < 0)
            bad = "no descriptor name for it is free of already loaded objects";
        else {
            set_aside[n_aside++] = fd; /* kept open so that the next number differs */
            fd = fresh;
        }
    }
    for (int i = 0; i < n_aside; i++)
        close(set_aside[i]);
    void *lib = NULL;
    if (bad == NULL) {
        lib = dlopen(fdpath, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (lib == NULL) {
            const char *why = dlerror();
            bp_set_error(BP_ERR_PLUGIN, "%s: cannot load the CUDA implementation library %s: %s",
                         who, path, why != NULL ? why : "unknown error");
        }
    } else {
        bp_set_error(BP_ERR_PLUGIN, "%s: refusing the CUDA implementation library %s: %s", who,
                     path, bad);
    }
    /* Loaded as fdpath: the descriptor now belongs to the mapping. Loaded before (the same file
     * under an earlier name, after a reload of the plugin) or not at all: it is not needed. */
    struct link_map *lm = NULL;
    if (lib == NULL || dlinfo(lib, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL ||
        lm->l_name == NULL || strcmp(lm->l_name, fdpath) != 0)
        close(fd);
    return lib;
}

const struct bp_cuda_impl *bp_cuda_impl_get(const char *who)
{
    struct cuda_registry *c = bp_cuda_registry;
    if (c == NULL) {
        bp_set_error(BP_ERR_PLUGIN, "%s: the CUDA plugin is not initialised", who);
        return NULL;
    }
    pthread_mutex_lock(&impl_lock);
    const struct bp_cuda_impl *impl = c->impl;
    if (impl == NULL) {
        char *path = NULL;
        size_t len = strlen(c->dir) + sizeof("/" BP_CUDA_IMPL_FILE);
        if ((path = malloc(len)) == NULL) {
            bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", who);
        } else {
            snprintf(path, len, "%s/" BP_CUDA_IMPL_FILE, c->dir);
            void *lib = impl_dlopen(who, path);
            bp_cuda_impl_open_fn open_fn = lib != NULL ? impl_open_symbol(lib) : NULL;
            if (lib != NULL && open_fn == NULL)
                bp_set_error(BP_ERR_PLUGIN, "%s: %s has no %s: it is not the CUDA plugin's "
                             "implementation library", who, path, BP_CUDA_IMPL_OPEN);
            if (open_fn != NULL)
                impl = open_fn(BP_CUDA_IMPL_ABI, c);
            if (impl != NULL) {
                c->impl_lib = lib;
                c->impl = impl;
                bp_log(BP_LOG_INFO, "CUDA plugin: loaded %s", path);
            } else if (lib != NULL) {
                dlclose(lib);
            }
            free(path);
        }
    }
    pthread_mutex_unlock(&impl_lock);
    return impl;
}

/* ---- Device ------------------------------------------------------------------------------------ */

static const char *cdev_name(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->name;
}

static const char *cdev_desc(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->description;
}

static void cdev_memory(bp_device *dev, size_t *f, size_t *t)
{
    /* Free memory needs the runtime; without it, or if it fails, the total from discovery. */
    struct cuda_device *cd = bp_device_get_context(dev);
    const struct bp_cuda_impl *impl = bp_cuda_impl_get(cd->name);
    if (impl == NULL || impl->get_memory(cd, f, t) != BP_OK) {
        *f = 0;
        *t = cd->total_memory;
    }
}

static bp_backend *cdev_init_backend(bp_device *dev, const char *params)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    if (params != NULL && params[0] != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, "%s: unknown backend parameters '%s' (the CUDA backend "
                     "takes none)", cd->name, params);
        return NULL;
    }
    const struct bp_cuda_impl *impl = bp_cuda_impl_get(cd->name);
    return impl != NULL ? impl->init_backend(dev, cd) : NULL;
}

static enum bp_device_type cdev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_GPU;
}

static void cdev_caps(bp_device *dev, struct bp_device_caps *caps)
{
    (void)dev;
    caps->async = true;
    caps->host_buffer = true;
    caps->buffer_from_host_ptr = false;
    caps->events = true;
}

static bp_buffer_type *cdev_buft(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->buft;
}

static bp_buffer_type *cdev_host_buft(bp_device *dev)
{
    return ((struct cuda_device *)bp_device_get_context(dev))->host_buft;
}

static bool cdev_supports_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    return bp_cuda_supports(op);
}

static bool cdev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    return buft == ((struct cuda_device *)bp_device_get_context(dev))->buft;
}

static void *cdev_event_new(bp_device *dev)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    const struct bp_cuda_impl *impl = bp_cuda_impl_get(cd->name);
    return impl != NULL ? impl->event_new(cd) : NULL;
}

/* An event exists only once the implementation is loaded. */
static void cdev_event_free(bp_device *dev, void *event)
{
    (void)dev;
    bp_cuda_registry->impl->event_free(event);
}

static enum bp_status cdev_event_sync(bp_device *dev, void *event)
{
    return bp_cuda_registry->impl->event_synchronize(bp_device_get_context(dev), event);
}

static const struct bp_device_iface cuda_device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = cdev_name,
    .get_description = cdev_desc,
    .get_memory = cdev_memory,
    .get_type = cdev_type,
    .get_caps = cdev_caps,
    .init_backend = cdev_init_backend,
    .get_buffer_type = cdev_buft,
    .get_host_buffer_type = cdev_host_buft,
    .supports_op = cdev_supports_op,
    .supports_buft = cdev_supports_buft,
    .event_new = cdev_event_new,
    .event_free = cdev_event_free,
    .event_synchronize = cdev_event_sync,
};

/* ---- Buffer types --------------------------------------------------------------------------- */

static const char *cbuft_name(bp_buffer_type *buft)
{
    return ((struct cuda_device *)bp_buffer_type_get_context(buft))->name;
}

static bp_buffer *cbuft_alloc(bp_buffer_type *buft, size_t size)
{
    struct cuda_device *cd = bp_buffer_type_get_context(buft);
    const struct bp_cuda_impl *impl = bp_cuda_impl_get(cd->name);
    return impl != NULL ? impl->alloc_buffer(buft, cd, size) : NULL;
}

static size_t cbuft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return CUDA_ALIGNMENT;
}

static size_t cbuft_max_size(bp_buffer_type *buft)
{
    return ((struct cuda_device *)bp_buffer_type_get_context(buft))->total_memory;
}

static const struct bp_buffer_type_iface cuda_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = cbuft_name,
    .alloc_buffer = cbuft_alloc,
    .get_alignment = cbuft_alignment,
    .get_max_size = cbuft_max_size,
};

static const char *hbuft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "CUDA_Host";
}

static bp_buffer *hbuft_alloc(bp_buffer_type *buft, size_t size)
{
    const struct bp_cuda_impl *impl = bp_cuda_impl_get("CUDA_Host");
    return impl != NULL ? impl->alloc_host_buffer(buft, size) : NULL;
}

static size_t hbuft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return 64;
}

static bool hbuft_is_host(bp_buffer_type *buft)
{
    (void)buft;
    return true;
}

static const struct bp_buffer_type_iface cuda_host_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = hbuft_name,
    .alloc_buffer = hbuft_alloc,
    .get_alignment = hbuft_alignment,
    .is_host = hbuft_is_host,
};

/* ---- Registry ---------------------------------------------------------------------------------- */

static const char *creg_name(bp_registry *reg)
{
    (void)reg;
    return "CUDA";
}

static size_t creg_count(bp_registry *reg)
{
    (void)reg;
    return (size_t)bp_cuda_registry->n;
}

static bp_device *creg_device(bp_registry *reg, size_t i)
{
    (void)reg;
    return bp_cuda_registry->devices[i].dev;
}

static const char *cuda_note(void)
{
    return bp_cuda_registry != NULL ? bp_cuda_registry->note : "";
}

#ifdef BP_HAVE_NCCL
static bp_comm *comm_init(bp_backend *const *backends, int n)
{
    const struct bp_cuda_impl *impl = bp_cuda_impl_get("CUDA");
    if (impl != NULL && impl->comm_init == NULL) {
        bp_set_error(BP_ERR_UNSUPPORTED, "CUDA: the implementation library was built without "
                     "NCCL: no collectives (install the one built with this plugin)");
        return NULL;
    }
    return impl != NULL ? impl->comm_init(backends, n) : NULL;
}

/* A communicator exists only once the implementation is loaded. */
static enum bp_status comm_allreduce(bp_comm *c, bp_tensor *const *tensors, int n)
{
    return bp_cuda_registry->impl->comm_allreduce(c, tensors, n);
}

static void comm_free(bp_comm *c)
{
    if (c != NULL)
        bp_cuda_registry->impl->comm_free(c);
}

static enum bp_status comm_unique_id(void *id, size_t *size)
{
    const struct bp_cuda_impl *impl = bp_cuda_impl_get("CUDA");
    if (impl != NULL && impl->comm_unique_id == NULL)
        return bp_set_error(BP_ERR_UNSUPPORTED, "CUDA: the implementation library was built "
                            "without NCCL: no collectives");
    return impl != NULL ? impl->comm_unique_id(id, size) : bp_last_status();
}

static bp_comm *comm_init_rank(const void *id, size_t size, bp_backend *const *backends, int n)
{
    const struct bp_cuda_impl *impl = bp_cuda_impl_get("CUDA");
    if (impl != NULL && impl->comm_init_rank == NULL) {
        bp_set_error(BP_ERR_UNSUPPORTED, "CUDA: the implementation library was built without "
                     "NCCL: no collectives");
        return NULL;
    }
    return impl != NULL ? impl->comm_init_rank(id, size, backends, n) : NULL;
}
#endif

/* Proc address "bp_cuda_load_runtime": loads the implementation library (and with it cudart,
 * cuBLAS and NCCL) now rather than at the first backend or buffer, without touching a GPU. */
static enum bp_status load_runtime(void)
{
    return bp_cuda_impl_get("CUDA") != NULL ? BP_OK : bp_last_status();
}

static void *creg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    if (strcmp(name, "bp_cuda_load_runtime") == 0)
        return (void *)load_runtime;
    if (strcmp(name, "bp_registry_note") == 0)
        return (void *)cuda_note;
#ifdef BP_HAVE_NCCL
    if (strcmp(name, "bp_comm_init") == 0)
        return (void *)comm_init;
    if (strcmp(name, "bp_comm_allreduce") == 0)
        return (void *)comm_allreduce;
    if (strcmp(name, "bp_comm_free") == 0)
        return (void *)comm_free;
    if (strcmp(name, "bp_comm_unique_id") == 0)
        return (void *)comm_unique_id;
    if (strcmp(name, "bp_comm_init_rank") == 0)
        return (void *)comm_init_rank;
#endif
    return NULL;
}

static void creg_free(bp_registry *reg)
{
    (void)reg;
    if (bp_cuda_registry->impl != NULL)
        bp_cuda_registry->impl->close();
    if (bp_cuda_registry->impl_lib != NULL)
        dlclose(bp_cuda_registry->impl_lib); /* stays mapped: opened NODELETE */
    free(bp_cuda_registry->dir);
    free(bp_cuda_registry);
    bp_cuda_registry = NULL;
}

static const struct bp_registry_iface cuda_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = creg_name,
    .get_device_count = creg_count,
    .get_device = creg_device,
    .get_proc_address = creg_proc,
    .free = creg_free,
};

static bp_registry *cuda_plugin_init(void)
{
    if (bp_cuda_registry != NULL) {
        bp_set_error(BP_ERR_BUSY, "CUDA: the plugin is already initialised");
        return NULL;
    }
    struct cuda_registry *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA: out of memory");
        return NULL;
    }
    const char *dir = bp_plugin_init_dir();
    c->dir = strdup(dir != NULL ? dir : ".");
    if (c->dir == NULL) {
        free(c);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA: out of memory");
        return NULL;
    }
    /* The driver API, not cudart: the runtime starts with the first backend or buffer. */
    struct bp_cuda_gpu gpus[CUDA_MAX_DEVICES];
    const int count = bp_cuda_enumerate(gpus, CUDA_MAX_DEVICES, c->note, sizeof(c->note));
    for (int i = 0; i < count; i++) {
        struct cuda_device *d = &c->devices[c->n];
        d->id = gpus[i].ordinal;
        d->total_memory = gpus[i].total_memory;
        snprintf(d->name, sizeof(d->name), "CUDA%d", gpus[i].ordinal);
        snprintf(d->description, sizeof(d->description), "%.255s (compute capability %d.%d, %.1f GiB)",
                 gpus[i].name, gpus[i].major, gpus[i].minor,
                 (double)gpus[i].total_memory / (1 << 30));
        c->n++;
    }
    bp_cuda_registry = c;
    c->reg = bp_registry_new(&cuda_registry_iface, c);
    if (c->reg == NULL) {
        free(c->dir);
        free(c);
        bp_cuda_registry = NULL;
        return NULL;
    }
    for (int i = 0; i < c->n; i++) {
        struct cuda_device *d = &c->devices[i];
        d->dev = bp_device_new(c->reg, &cuda_device_iface, d);
        if (d->dev != NULL)
            d->buft = bp_buffer_type_new(d->dev, &cuda_buft_iface, d);
        if (d->buft != NULL)
            d->host_buft = bp_buffer_type_new(d->dev, &cuda_host_buft_iface, d);
        if (d->host_buft == NULL) {
            bp_registry_free(c->reg); /* frees c through creg_free */
            return NULL;
        }
    }
    if (c->n == 0)
        bp_log(BP_LOG_INFO, "CUDA plugin: %s", c->note);
    return c->reg;
}

BP_PLUGIN_DEFINE("cuda", "", 0, cuda_plugin_init, NULL);
