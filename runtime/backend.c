/* backend.c - the public wrappers of the backend API: argument checks, bounds checks and the
 * defaults for optional interface members, then a call into the plugin.
 *
 * Every check a plugin would otherwise have to repeat happens here, once: a plugin's set_tensor
 * is only ever called with a placed tensor and a range inside it. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "backend-impl.h"

/* Returns ret from the calling function, with an error naming it, when handle h is NULL. */
#define CHECK_HANDLE(h, ret)                                                                   \
    do {                                                                                       \
        if ((h) == NULL) {                                                                     \
            bp__error(BP_ERR_INVALID_ARG, "%s: %s is NULL", __func__, #h);                     \
            return ret;                                                                        \
        }                                                                                      \
    } while (0)

/* A plugin call that returned NULL or failed without saying why still leaves a message. */
static void default_error(enum bp_status status, const char *fmt, const char *name)
{
    if (bp_last_status() == BP_OK)
        bp__error(status, fmt, name);
}

/* ---- Buffer types ----------------------------------------------------------------------- */

/* Whether buft's name and alignment have been checked (verify.c), whatever the verdict; false
 * only when memory ran out while checking. */
static bool buft_checked(bp_buffer_type *buft)
{
    bp__buft_usable(buft);
    return atomic_load_explicit(&buft->checked.state, memory_order_acquire) != BP__UNCHECKED;
}

/* The name as checked; "" for a type whose name was refused. */
const char *bp_buffer_type_get_name(bp_buffer_type *buft)
{
    CHECK_HANDLE(buft, "");
    return buft_checked(buft) && buft->checked.name != NULL ? buft->checked.name : "";
}

/* The alignment as checked; 1 for a type whose alignment was refused (it allocates nothing). */
size_t bp_buffer_type_get_alignment(bp_buffer_type *buft)
{
    CHECK_HANDLE(buft, 0);
    return buft_checked(buft) && buft->alignment > 0 ? buft->alignment : 1;
}

size_t bp_buffer_type_get_max_size(bp_buffer_type *buft)
{
    CHECK_HANDLE(buft, 0);
    if (!BP_HAS(struct bp_buffer_type_iface, buft->iface, get_max_size))
        return SIZE_MAX;
    size_t max = buft->iface->get_max_size(buft);
    if (max == 0)
        bp__buft_refuse(buft, "says its largest buffer is 0 bytes (get_max_size returned 0)");
    return max;
}

/* An answer smaller than the tensor would have the allocators place the next tensor inside
 * this one, and the plugin write past the end of its memory: the type is refused, and the
 * tensor's own size returned so that nothing is computed from the wrong answer. */
size_t bp_buffer_type_get_alloc_size(bp_buffer_type *buft, const bp_tensor *t)
{
    CHECK_HANDLE(buft, 0);
    CHECK_HANDLE(t, 0);
    const size_t nbytes = bp_nbytes(t);
    if (!BP_HAS(struct bp_buffer_type_iface, buft->iface, get_alloc_size))
        return nbytes;
    const size_t size = buft->iface->get_alloc_size(buft, t);
    if (size < nbytes)
        bp__buft_refuse(buft, "says %s needs %zu byte%s (get_alloc_size), less than its %zu",
                        bp__describe(t).s, size, BP_PLURAL(size), nbytes);
    return size < nbytes ? nbytes : size;
}

bool bp_buffer_type_is_host(bp_buffer_type *buft)
{
    if (buft == NULL)
        return false;
    return BP_HAS(struct bp_buffer_type_iface, buft->iface, is_host) && buft->iface->is_host(buft);
}

bp_device *bp_buffer_type_get_device(bp_buffer_type *buft)
{
    return buft ? buft->device : NULL;
}

bp_buffer *bp_buffer_type_alloc(bp_buffer_type *buft, size_t size)
{
    CHECK_HANDLE(buft, NULL);
    if (!bp__buft_usable(buft)) {
        if (buft_checked(buft))
            bp__refused_error(&buft->checked);
        return NULL;
    }
    size_t max = bp_buffer_type_get_max_size(buft);
    if (size > max)
        return bp__error_null(BP_ERR_OUT_OF_MEMORY,
                              "buffer type %s cannot allocate %zu bytes: its largest buffer is %zu "
                              "bytes",
                              bp_buffer_type_get_name(buft), size, max);
    bp_clear_error();
    bp_buffer *buf = buft->iface->alloc_buffer(buft, size);
    if (buf == NULL) {
        default_error(BP_ERR_OUT_OF_MEMORY, "buffer type %s failed to allocate a buffer",
                      bp_buffer_type_get_name(buft));
        return NULL;
    }
    /* A plugin that hands back less than was asked for would have every caller fail later
     * with a message about the wrong thing (or write past the end): say so here. */
    if (bp_buffer_get_size(buf) < size) {
        size_t got = bp_buffer_get_size(buf);
        bp_buffer_free(buf);
        return bp__error_null(BP_ERR_BACKEND,
                              "buffer type %s returned a buffer of %zu byte%s when asked for %zu",
                              bp_buffer_type_get_name(buft), got, BP_PLURAL(got), size);
    }
    enum bp_status st = bp__buffer_check_base(buf);
    if (st != BP_OK) {
        /* The plugin's free member runs next and may record errors of its own. */
        char *why = bp__strdup(bp_last_error(), "an error message");
        bp_buffer_free(buf);
        bp__error(st, "%s", why ? why : "out of memory");
        bp__free(why);
        return NULL;
    }
    return buf;
}

/* ---- Buffers ---------------------------------------------------------------------------- */

void bp_buffer_free(bp_buffer *buf)
{
    if (buf == NULL)
        return;
    if (BP_HAS(struct bp_buffer_iface, buf->iface, free_buffer))
        buf->iface->free_buffer(buf);
    bp__plugin_unref(buf->plugin);
    bp__free(buf);
}

void *bp_buffer_get_base(bp_buffer *buf)
{
    CHECK_HANDLE(buf, NULL);
    if (buf->base_checked)
        return buf->base;
    return buf->iface->get_base(buf);
}

size_t bp_buffer_get_size(bp_buffer *buf)
{
    return buf ? buf->size : 0;
}

size_t bp_buffer_get_alignment(bp_buffer *buf)
{
    CHECK_HANDLE(buf, 0);
    return bp_buffer_type_get_alignment(buf->buft);
}

bp_buffer_type *bp_buffer_get_type(bp_buffer *buf)
{
    return buf ? buf->buft : NULL;
}

bool bp_buffer_is_host(bp_buffer *buf)
{
    return buf != NULL && bp_buffer_type_is_host(buf->buft);
}

enum bp_status bp_buffer_clear(bp_buffer *buf, uint8_t value)
{
    CHECK_HANDLE(buf, BP_ERR_INVALID_ARG);
    if (buf->size == 0)
        return BP_OK;
    return buf->iface->clear(buf, value);
}

void bp_buffer_set_usage(bp_buffer *buf, enum bp_buffer_usage usage)
{
    if (buf != NULL)
        buf->usage = usage;
}

enum bp_buffer_usage bp_buffer_get_usage(bp_buffer *buf)
{
    return buf ? buf->usage : BP_BUFFER_USAGE_ANY;
}

enum bp_status bp__place_tensor(bp_buffer *buf, bp_tensor *t, void *addr)
{
    /* A type refused after this buffer was made (an allocation size too small) places
     * nothing more: the layout its answers gave cannot be trusted. */
    if (!bp__buft_usable(buf->buft))
        return buft_checked(buf->buft) ? bp__refused_error(&buf->buft->checked)
                                       : BP_ERR_OUT_OF_MEMORY;
    t->buffer = buf;
    t->data = addr;
    if (BP_HAS(struct bp_buffer_iface, buf->iface, init_tensor))
        return buf->iface->init_tensor(buf, t);
    return BP_OK;
}

enum bp_status bp_buffer_place_tensor(bp_buffer *buf, bp_tensor *t, void *addr)
{
    CHECK_HANDLE(buf, BP_ERR_INVALID_ARG);
    CHECK_HANDLE(t, BP_ERR_INVALID_ARG);
    if (t->view_src != NULL)
        return bp__error(BP_ERR_INVALID_ARG,
                         "bp_buffer_place_tensor: %s is a view; place its source and call "
                         "bp_tensor_init_view",
                         bp__describe(t).s);
    char *base = bp_buffer_get_base(buf);
    size_t align = bp_buffer_get_alignment(buf);
    size_t need = bp_buffer_type_get_alloc_size(buf->buft, t);
    uintptr_t a = (uintptr_t)addr, b = (uintptr_t)base;
    if (a < b || a - b > buf->size || need > buf->size - (a - b))
        return bp__error(BP_ERR_OUT_OF_BOUNDS,
                         "bp_buffer_place_tensor: %s (%zu bytes) does not fit in buffer %s of "
                         "%zu bytes at that address",
                         bp__describe(t).s, need, bp_buffer_type_get_name(buf->buft), buf->size);
    if (align > 1 && (a - b) % align != 0)
        return bp__error(BP_ERR_INVALID_ARG,
                         "bp_buffer_place_tensor: offset %zu for %s is not a multiple of the "
                         "buffer's alignment %zu",
                         (size_t)(a - b), bp__describe(t).s, align);
    return bp__place_tensor(buf, t, addr);
}

enum bp_status bp_tensor_init_view(bp_tensor *t)
{
    CHECK_HANDLE(t, BP_ERR_INVALID_ARG);
    if (t->view_src == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_tensor_init_view: %s is not a view",
                         bp__describe(t).s);
    if (t->view_src->buffer == NULL || t->view_src->data == NULL)
        return bp__error(BP_ERR_INVALID_ARG,
                         "bp_tensor_init_view: the source %s of view %s has no memory yet",
                         bp__describe(t->view_src).s, bp__describe(t).s);
    return bp__place_tensor(t->view_src->buffer, t, (char *)t->view_src->data + t->view_offs);
}

/* ---- Tensor data ------------------------------------------------------------------------ */

/* The tensor is placed and bytes [offset, offset + size) lie inside it. */
static enum bp_status check_range(const char *fn, const bp_tensor *t, size_t offset, size_t size)
{
    if (t == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "%s: tensor is NULL", fn);
    if (t->buffer == NULL || t->data == NULL)
        return bp__error(BP_ERR_INVALID_ARG,
                         "%s: tensor %s has no buffer; allocate it (bp_alloc_ctx_tensors or a "
                         "graph allocator) first",
                         fn, bp__describe(t).s);
    size_t end, nbytes = bp_nbytes(t);
    if (!bp__add_size(offset, size, &end) || end > nbytes)
        return bp__error(BP_ERR_OUT_OF_BOUNDS,
                         "%s: bytes [%zu, %zu + %zu) are outside tensor %s of %zu bytes", fn,
                         offset, offset, size, bp__describe(t).s, nbytes);
    return BP_OK;
}

static enum bp_status check_range_2d(const char *fn, const bp_tensor *t, const void *data,
                                     size_t offset, size_t width, size_t rows, size_t t_stride)
{
    if (data == NULL && rows > 0 && width > 0)
        return bp__error(BP_ERR_INVALID_ARG, "%s: data is NULL", fn);
    if (rows == 0 || width == 0)
        return check_range(fn, t, offset, 0);
    size_t span, last;
    if (!bp__mul_size(rows - 1, t_stride, &last) || !bp__add_size(last, width, &span))
        return bp__error(BP_ERR_OUT_OF_BOUNDS, "%s: %zu rows of stride %zu overflow", fn, rows,
                         t_stride);
    if (t_stride < width && rows > 1)
        return bp__error(BP_ERR_INVALID_ARG,
                         "%s: tensor stride %zu is smaller than the row width %zu", fn, t_stride,
                         width);
    return check_range(fn, t, offset, span);
}

enum bp_status bp_tensor_set(bp_tensor *t, const void *data, size_t offset, size_t size)
{
    enum bp_status st = check_range("bp_tensor_set", t, offset, size);
    if (st != BP_OK || size == 0)
        return st;
    if (data == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_tensor_set: data is NULL");
    return t->buffer->iface->set_tensor(t->buffer, t, data, offset, size);
}

enum bp_status bp_tensor_get(const bp_tensor *t, void *data, size_t offset, size_t size)
{
    enum bp_status st = check_range("bp_tensor_get", t, offset, size);
    if (st != BP_OK || size == 0)
        return st;
    if (data == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_tensor_get: data is NULL");
    return t->buffer->iface->get_tensor(t->buffer, t, data, offset, size);
}

enum bp_status bp_tensor_memset(bp_tensor *t, uint8_t value, size_t offset, size_t size)
{
    enum bp_status st = check_range("bp_tensor_memset", t, offset, size);
    if (st != BP_OK || size == 0)
        return st;
    return t->buffer->iface->memset_tensor(t->buffer, t, value, offset, size);
}

enum bp_status bp_tensor_set_2d(bp_tensor *t, const void *data, size_t offset, size_t width,
                                size_t rows, size_t t_stride, size_t data_stride)
{
    enum bp_status st =
        check_range_2d("bp_tensor_set_2d", t, data, offset, width, rows, t_stride);
    if (st != BP_OK || rows == 0 || width == 0)
        return st;
    bp_buffer *buf = t->buffer;
    if (BP_HAS(struct bp_buffer_iface, buf->iface, set_tensor_2d))
        return buf->iface->set_tensor_2d(buf, t, data, offset, width, rows, t_stride,
                                         data_stride);
    for (size_t i = 0; i < rows && st == BP_OK; i++)
        st = buf->iface->set_tensor(buf, t, (const char *)data + i * data_stride,
                                    offset + i * t_stride, width);
    return st;
}

enum bp_status bp_tensor_get_2d(const bp_tensor *t, void *data, size_t offset, size_t width,
                                size_t rows, size_t t_stride, size_t data_stride)
{
    enum bp_status st =
        check_range_2d("bp_tensor_get_2d", t, data, offset, width, rows, t_stride);
    if (st != BP_OK || rows == 0 || width == 0)
        return st;
    bp_buffer *buf = t->buffer;
    if (BP_HAS(struct bp_buffer_iface, buf->iface, get_tensor_2d))
        return buf->iface->get_tensor_2d(buf, t, data, offset, width, rows, t_stride,
                                         data_stride);
    for (size_t i = 0; i < rows && st == BP_OK; i++)
        st = buf->iface->get_tensor(buf, t, (char *)data + i * data_stride,
                                    offset + i * t_stride, width);
    return st;
}

enum bp_status bp_tensor_copy(const bp_tensor *src, bp_tensor *dst)
{
    enum bp_status st = check_range("bp_tensor_copy", src, 0, 0);
    if (st == BP_OK)
        st = check_range("bp_tensor_copy", dst, 0, 0);
    if (st != BP_OK)
        return st;
    size_t n = bp_nbytes(src);
    if (n != bp_nbytes(dst))
        return bp__error(BP_ERR_SHAPE, "bp_tensor_copy: %s (%zu bytes) and %s (%zu bytes) differ "
                         "in size", bp__describe(src).s, n, bp__describe(dst).s, bp_nbytes(dst));
    if (src == dst || n == 0)
        return BP_OK;
    /* Overlapping byte ranges of one buffer copy as memmove would: through a staging copy,
     * since the buffer's own set/get may copy in any order. */
    bool overlap = src->buffer == dst->buffer && (const char *)src->data < (char *)dst->data + n &&
                   (char *)dst->data < (const char *)src->data + n;
    if (overlap)
        goto staged;
    if (bp_buffer_is_host(src->buffer))
        return bp_tensor_set(dst, src->data, 0, n);
    if (bp_buffer_is_host(dst->buffer))
        return bp_tensor_get(src, dst->data, 0, n);
    if (BP_HAS(struct bp_buffer_iface, dst->buffer->iface, cpy_tensor)) {
        bp_clear_error();
        if (dst->buffer->iface->cpy_tensor(dst->buffer, src, dst))
            return BP_OK;
        if (bp_last_status() != BP_OK) /* it failed, rather than declined */
            return bp_last_status();
    }
    /* Neither side is host memory and there is no direct path: stage through the host. */
staged:;
    void *tmp = bp__malloc(n, "a host staging copy");
    if (tmp == NULL)
        return BP_ERR_OUT_OF_MEMORY;
    st = bp_tensor_get(src, tmp, 0, n);
    if (st == BP_OK)
        st = bp_tensor_set(dst, tmp, 0, n);
    bp__free(tmp);
    return st;
}

/* ---- Backends --------------------------------------------------------------------------- */

/* One thread at a time per backend (bp-backend.h). Entering marks the backend with a token of
 * the calling thread; the same thread may enter again (a plugin's call that comes back through
 * the public API), another thread is refused. Detection, not locking: a caller that shares a
 * backend between threads has a bug, and a clear error beats a corrupted queue or thread pool. */
static _Thread_local char thread_token;

static bool backend_enter(bp_backend *be, const char *fn)
{
    uintptr_t me = (uintptr_t)&thread_token, expected = 0;
    if (atomic_load_explicit(&be->owner, memory_order_relaxed) == me) {
        be->depth++;
        return true;
    }
    if (!atomic_compare_exchange_strong_explicit(&be->owner, &expected, me, memory_order_acquire,
                                                 memory_order_relaxed)) {
        bp__error(BP_ERR_BUSY,
                  "%s: backend %s is in use by another thread; a backend is used by one thread "
                  "at a time (create one backend per thread)",
                  fn, be->iface->get_name(be));
        return false;
    }
    be->depth = 1;
    return true;
}

static void backend_leave(bp_backend *be)
{
    if (--be->depth == 0)
        atomic_store_explicit(&be->owner, 0, memory_order_release);
}

#define BACKEND_ENTER(be, ret)                                                                 \
    do {                                                                                       \
        if (!backend_enter((be), __func__))                                                    \
            return (ret);                                                                      \
    } while (0)

const char *bp_backend_get_name(bp_backend *backend)
{
    CHECK_HANDLE(backend, "");
    return backend->iface->get_name(backend);
}

void bp_backend_free(bp_backend *backend)
{
    if (backend == NULL)
        return;
    /* Free waits: the plugin's free may assume nothing is queued any more (bp-plugin.h). An
     * error of the last work has nobody left to be returned to. */
    /* (bp_last_error() is left as the caller's last call set it, unless this wait fails) */
    if (BP_HAS(struct bp_backend_iface, backend->iface, synchronize)) {
        if (backend->iface->synchronize(backend) != BP_OK)
            bp_log(BP_LOG_WARN, "backend %s: queued work failed before it was freed: %s",
                   bp_backend_get_name(backend), bp_last_error());
    }
    if (BP_HAS(struct bp_backend_iface, backend->iface, free))
        backend->iface->free(backend);
    bp__plugin_unref(backend->plugin);
    bp__free(backend);
}

bp_device *bp_backend_get_device(bp_backend *backend)
{
    return backend ? backend->device : NULL;
}

bp_buffer_type *bp_backend_get_default_buffer_type(bp_backend *backend)
{
    CHECK_HANDLE(backend, NULL);
    return bp_device_get_buffer_type(backend->device);
}

bp_buffer *bp_backend_alloc_buffer(bp_backend *backend, size_t size)
{
    CHECK_HANDLE(backend, NULL);
    return bp_buffer_type_alloc(bp_backend_get_default_buffer_type(backend), size);
}

enum bp_status bp_backend_synchronize(bp_backend *backend)
{
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    if (!BP_HAS(struct bp_backend_iface, backend->iface, synchronize))
        return BP_OK;
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    enum bp_status st = backend->iface->synchronize(backend);
    if (st != BP_OK && bp_last_status() == BP_OK)
        bp__error(st, "backend %s: queued work failed (%s)", bp_backend_get_name(backend),
                  bp_strerror(st));
    backend_leave(backend);
    return st;
}

/* The wrappers below do not clear bp_last_error() first: a caller's earlier error must survive
 * a wait that succeeds (bp_sched_graph_compute synchronizes after a failed compute). A plugin
 * that fails without a sentence gets one where no older error is still recorded. */
enum bp_status bp_backend_synchronize_timeout(bp_backend *backend, int64_t timeout_ns)
{
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    if (timeout_ns < 0)
        return bp__error(BP_ERR_INVALID_ARG, "%s: timeout %lld ns is negative", __func__,
                         (long long)timeout_ns);
    /* Without a deadline-aware member the plain wait is all there is (documented). */
    if (!BP_HAS(struct bp_backend_iface, backend->iface, synchronize_timeout))
        return bp_backend_synchronize(backend);
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    enum bp_status st = backend->iface->synchronize_timeout(backend, timeout_ns);
    if (st == BP_ERR_TIMEOUT && bp_last_status() != BP_ERR_TIMEOUT)
        bp__error(st, "backend %s: queued work did not finish within %lld ns; it is still "
                  "queued (wait again, or free the backend, which waits)",
                  bp_backend_get_name(backend), (long long)timeout_ns);
    else if (st != BP_OK && bp_last_status() == BP_OK)
        bp__error(st, "backend %s: queued work failed (%s)", bp_backend_get_name(backend),
                  bp_strerror(st));
    backend_leave(backend);
    return st;
}

enum bp_status bp_backend_set_n_threads(bp_backend *backend, int n_threads)
{
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    if (n_threads < 1)
        return bp__error(BP_ERR_INVALID_ARG, "%s: %d is not a thread count (at least 1)",
                         __func__, n_threads);
    void *proc = bp_registry_get_proc_address(backend->device->reg, "bp_set_n_threads");
    if (proc == NULL)
        return bp__error(BP_ERR_UNSUPPORTED, "%s: backend %s has no thread count to set",
                         __func__, bp_backend_get_name(backend));
    bp_set_n_threads_fn fn;
    memcpy(&fn, &proc, sizeof(fn));
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    bp_clear_error();
    enum bp_status st = fn(backend, n_threads);
    if (st != BP_OK && bp_last_status() == BP_OK)
        bp__error(st, "backend %s could not use %d threads (%s)", bp_backend_get_name(backend),
                  n_threads, bp_strerror(st));
    backend_leave(backend);
    return st;
}

/* The buffer that holds t's memory: its own, or for a view not yet given one, its source's. */
static bp_buffer *memory_of(const bp_tensor *t)
{
    if (t->buffer != NULL)
        return t->buffer;
    return t->view_src != NULL ? t->view_src->buffer : NULL;
}

/* Every tensor the graph touches must have memory in a buffer the backend's device can use:
 * a plugin handed a pointer into another device's memory would read it as its own (a host
 * pointer on a GPU, a GPU pointer on the CPU) and crash. Nodes of op NONE are leafs. */
static enum bp_status check_graph_memory(bp_backend *be, bp_graph *g)
{
    /* Per compute, so kept cheap: the nodes array directly, and the buffer types already found
     * usable remembered (a graph touches very few; the last one answers almost every time). */
    bp_buffer_type *ok[4] = {NULL}, *last = NULL;
    int n_ok = 0;
    bp_tensor *const *nodes = bp__graph_nodes(g);
    const int n = bp_graph_get_n_nodes(g);
    for (int i = 0; i < n; i++) {
        const bp_tensor *node = nodes[i];
        for (int s = -1; s < BP_MAX_SRC; s++) {
            const bp_tensor *t = s < 0 ? node : node->src[s];
            if (t == NULL)
                continue;
            bp_buffer *buf = memory_of(t);
            if (buf == NULL) {
                if (t->data != NULL)
                    continue; /* placed by hand in memory of the caller's: nothing to check */
                return bp__error(BP_ERR_INVALID_ARG,
                                 "backend %s: %s %s has no memory; allocate the graph first",
                                 bp_backend_get_name(be), t == node ? "node" : "source",
                                 bp__describe(t).s);
            }
            if (buf->buft == last)
                continue;
            bool seen = false;
            for (int k = 0; k < n_ok && !seen; k++)
                seen = ok[k] == buf->buft;
            if (!seen && !bp_device_supports_buft(be->device, buf->buft))
                return bp__error(BP_ERR_UNSUPPORTED,
                                 "backend %s cannot use %s of node %s: it lives in a %s buffer, "
                                 "which device %s does not support; copy it first or let the "
                                 "scheduler do it",
                                 bp_backend_get_name(be), t == node ? "the result" : bp__describe(t).s,
                                 bp__describe(node).s, bp_buffer_type_get_name(buf->buft),
                                 bp_device_get_name(be->device));
            if (!seen && n_ok < 4)
                ok[n_ok++] = buf->buft;
            last = buf->buft;
        }
    }
    return BP_OK;
}

enum bp_status bp_backend_graph_compute_async(bp_backend *backend, bp_graph *graph)
{
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    CHECK_HANDLE(graph, BP_ERR_INVALID_ARG);
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    enum bp_status st = check_graph_memory(backend, graph);
    if (st == BP_OK) {
        bp_clear_error();
        st = backend->iface->graph_compute(backend, graph);
        if (st != BP_OK && bp_last_status() == BP_OK)
            bp__error(st, "backend %s failed to compute a graph (%s)", bp_backend_get_name(backend),
                      bp_strerror(st));
    }
    backend_leave(backend);
    return st;
}

enum bp_status bp_backend_graph_compute(bp_backend *backend, bp_graph *graph)
{
    enum bp_status st = bp_backend_graph_compute_async(backend, graph);
    if (st != BP_OK)
        return st;
    return bp_backend_synchronize(backend);
}

bool bp_backend_supports_op(bp_backend *backend, const bp_tensor *op)
{
    return backend != NULL && bp_device_supports_op(backend->device, op);
}

bool bp_backend_supports_buft(bp_backend *backend, bp_buffer_type *buft)
{
    return backend != NULL && bp_device_supports_buft(backend->device, buft);
}

bool bp_backend_offload_op(bp_backend *backend, const bp_tensor *op)
{
    return backend != NULL && bp_device_offload_op(backend->device, op);
}

enum bp_status bp_backend_tensor_set_async(bp_backend *backend, bp_tensor *t, const void *data,
                                           size_t offset, size_t size)
{
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    enum bp_status st = check_range("bp_backend_tensor_set_async", t, offset, size);
    if (st != BP_OK || size == 0)
        return st;
    if (data == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_backend_tensor_set_async: data is NULL");
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    if (BP_HAS(struct bp_backend_iface, backend->iface, set_tensor_async))
        st = backend->iface->set_tensor_async(backend, t, data, offset, size);
    else
        st = t->buffer->iface->set_tensor(t->buffer, t, data, offset, size);
    backend_leave(backend);
    return st;
}

enum bp_status bp_backend_tensor_get_async(bp_backend *backend, const bp_tensor *t, void *data,
                                           size_t offset, size_t size)
{
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    enum bp_status st = check_range("bp_backend_tensor_get_async", t, offset, size);
    if (st != BP_OK || size == 0)
        return st;
    if (data == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_backend_tensor_get_async: data is NULL");
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    if (BP_HAS(struct bp_backend_iface, backend->iface, get_tensor_async))
        st = backend->iface->get_tensor_async(backend, t, data, offset, size);
    else
        st = t->buffer->iface->get_tensor(t->buffer, t, data, offset, size);
    backend_leave(backend);
    return st;
}

enum bp_status bp_backend_tensor_copy_async(bp_backend *src_backend, bp_backend *dst_backend,
                                            const bp_tensor *src, bp_tensor *dst)
{
    CHECK_HANDLE(src_backend, BP_ERR_INVALID_ARG);
    CHECK_HANDLE(dst_backend, BP_ERR_INVALID_ARG);
    enum bp_status st = check_range("bp_backend_tensor_copy_async", src, 0, 0);
    if (st == BP_OK)
        st = check_range("bp_backend_tensor_copy_async", dst, 0, 0);
    if (st != BP_OK)
        return st;
    if (bp_nbytes(src) != bp_nbytes(dst))
        return bp_tensor_copy(src, dst); /* reports the size mismatch */
    BACKEND_ENTER(src_backend, BP_ERR_BUSY);
    if (!backend_enter(dst_backend, __func__)) {
        backend_leave(src_backend);
        return BP_ERR_BUSY;
    }
    bool queued = false;
    if (BP_HAS(struct bp_backend_iface, dst_backend->iface, cpy_tensor_async)) {
        bp_clear_error();
        queued = dst_backend->iface->cpy_tensor_async(src_backend, dst_backend, src, dst);
        if (!queued && bp_last_status() != BP_OK) { /* it failed, rather than declined */
            st = bp_last_status();
            backend_leave(dst_backend);
            backend_leave(src_backend);
            return st;
        }
    }
    if (!queued) {
        /* No queued path: finish what both backends have queued, then copy synchronously. */
        st = bp_backend_synchronize(src_backend);
        if (st == BP_OK)
            st = bp_backend_synchronize(dst_backend);
        if (st == BP_OK)
            st = bp_tensor_copy(src, dst);
    }
    backend_leave(dst_backend);
    backend_leave(src_backend);
    return st;
}

/* ---- Devices ---------------------------------------------------------------------------- */

/* A refused device (verify.c) answers "" for its name and description, and its backends and
 * buffer types are not handed out: it is not used. */
static bool device_refused(bp_device *dev)
{
    if (bp__device_usable(dev))
        return false;
    if (atomic_load_explicit(&dev->checked.state, memory_order_acquire) == BP__REFUSED)
        bp__refused_error(&dev->checked);
    return true;
}

const char *bp_device_get_name(bp_device *dev)
{
    CHECK_HANDLE(dev, "");
    return bp__device_usable(dev) ? dev->checked.name : "";
}

const char *bp_device_get_description(bp_device *dev)
{
    CHECK_HANDLE(dev, "");
    return bp__device_usable(dev) ? dev->description : "";
}

enum bp_device_type bp_device_get_type(bp_device *dev)
{
    CHECK_HANDLE(dev, BP_DEVICE_TYPE_CPU);
    return dev->iface->get_type(dev);
}

const char *bp_device_type_name(enum bp_device_type type)
{
    switch (type) {
    case BP_DEVICE_TYPE_CPU:
        return "CPU";
    case BP_DEVICE_TYPE_GPU:
        return "GPU";
    case BP_DEVICE_TYPE_ACCEL:
        return "ACCEL";
    case BP_DEVICE_TYPE_META:
        return "META";
    }
    return "INVALID";
}

void bp_device_get_memory(bp_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    if (dev != NULL)
        dev->iface->get_memory(dev, &f, &t);
    else
        bp__error(BP_ERR_INVALID_ARG, "bp_device_get_memory: dev is NULL");
    if (free_bytes)
        *free_bytes = f;
    if (total_bytes)
        *total_bytes = t;
}

void bp_device_get_props(bp_device *dev, struct bp_device_props *props)
{
    if (props == NULL)
        return;
    memset(props, 0, sizeof(*props));
    if (dev == NULL) {
        bp__error(BP_ERR_INVALID_ARG, "bp_device_get_props: dev is NULL");
        props->name = props->description = "";
        return;
    }
    props->name = bp_device_get_name(dev);
    props->description = bp_device_get_description(dev);
    bp_device_get_memory(dev, &props->memory_free, &props->memory_total);
    props->type = bp_device_get_type(dev);
    bp_device_get_caps(dev, &props->caps);
}

void bp_device_get_caps(bp_device *dev, struct bp_device_caps *caps)
{
    if (caps == NULL)
        return;
    memset(caps, 0, sizeof(*caps));
    if (dev == NULL) {
        bp__error(BP_ERR_INVALID_ARG, "bp_device_get_caps: dev is NULL");
        return;
    }
    if (BP_HAS(struct bp_device_iface, dev->iface, get_caps)) {
        dev->iface->get_caps(dev, caps);
    } else {
        caps->host_buffer = BP_HAS(struct bp_device_iface, dev->iface, get_host_buffer_type);
        caps->buffer_from_host_ptr = BP_HAS(struct bp_device_iface, dev->iface, buffer_from_host_ptr);
        caps->events = BP_HAS(struct bp_device_iface, dev->iface, event_new);
    }
}

bp_registry *bp_device_get_registry(bp_device *dev)
{
    return dev ? dev->reg : NULL;
}

bp_backend *bp_device_init_backend(bp_device *dev, const char *params)
{
    CHECK_HANDLE(dev, NULL);
    if (device_refused(dev))
        return NULL;
    bp_clear_error();
    bp_backend *be = dev->iface->init_backend(dev, params);
    if (be == NULL)
        default_error(BP_ERR_BACKEND, "device %s could not create a backend (the plugin gave no "
                      "reason)", bp_device_get_name(dev));
    return be;
}

bp_buffer_type *bp_device_get_buffer_type(bp_device *dev)
{
    CHECK_HANDLE(dev, NULL);
    if (device_refused(dev))
        return NULL;
    return dev->iface->get_buffer_type(dev);
}

bp_buffer_type *bp_device_get_host_buffer_type(bp_device *dev)
{
    CHECK_HANDLE(dev, NULL);
    if (!BP_HAS(struct bp_device_iface, dev->iface, get_host_buffer_type))
        return bp__error_null(BP_ERR_UNSUPPORTED, "device %s has no host buffer type",
                              bp_device_get_name(dev));
    return dev->iface->get_host_buffer_type(dev);
}

bp_buffer *bp_device_buffer_from_host_ptr(bp_device *dev, void *ptr, size_t size,
                                          size_t max_tensor_size)
{
    CHECK_HANDLE(dev, NULL);
    if (!BP_HAS(struct bp_device_iface, dev->iface, buffer_from_host_ptr))
        return bp__error_null(BP_ERR_UNSUPPORTED,
                              "device %s cannot use host memory as a buffer",
                              bp_device_get_name(dev));
    if (ptr == NULL && size > 0)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_device_buffer_from_host_ptr: ptr is NULL");
    return dev->iface->buffer_from_host_ptr(dev, ptr, size, max_tensor_size);
}

bool bp_device_supports_op(bp_device *dev, const bp_tensor *op)
{
    return dev != NULL && op != NULL && dev->iface->supports_op(dev, op);
}

bool bp_device_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    return dev != NULL && buft != NULL && dev->iface->supports_buft(dev, buft);
}

bool bp_device_offload_op(bp_device *dev, const bp_tensor *op)
{
    return dev != NULL && op != NULL && BP_HAS(struct bp_device_iface, dev->iface, offload_op) &&
           dev->iface->offload_op(dev, op);
}

/* ---- Events ----------------------------------------------------------------------------- */

bp_event *bp_event_new(bp_device *dev)
{
    CHECK_HANDLE(dev, NULL);
    if (!BP_HAS(struct bp_device_iface, dev->iface, event_new))
        return bp__error_null(BP_ERR_UNSUPPORTED, "device %s has no events", bp_device_get_name(dev));
    bp_event *ev = bp__calloc(1, sizeof(*ev), "an event");
    if (ev == NULL)
        return NULL;
    bp_clear_error();
    ev->handle = dev->iface->event_new(dev);
    if (ev->handle == NULL) {
        default_error(BP_ERR_BACKEND, "device %s could not create an event", bp_device_get_name(dev));
        bp__free(ev);
        return NULL;
    }
    ev->device = dev;
    ev->plugin = bp__plugin_of_device(dev);
    bp__plugin_ref(ev->plugin);
    return ev;
}

void bp_event_free(bp_event *event)
{
    if (event == NULL)
        return;
    event->device->iface->event_free(event->device, event->handle);
    bp__plugin_unref(event->plugin);
    bp__free(event);
}

enum bp_status bp_event_record(bp_event *event, bp_backend *backend)
{
    CHECK_HANDLE(event, BP_ERR_INVALID_ARG);
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    if (backend->device != event->device)
        return bp__error(BP_ERR_INVALID_ARG,
                         "bp_event_record: the event belongs to device %s, the backend to %s",
                         bp_device_get_name(event->device), bp_device_get_name(backend->device));
    if (!BP_HAS(struct bp_backend_iface, backend->iface, event_record))
        return bp__error(BP_ERR_UNSUPPORTED, "backend %s cannot record events",
                         bp_backend_get_name(backend));
    BACKEND_ENTER(backend, BP_ERR_BUSY);
    enum bp_status st = backend->iface->event_record(backend, event->handle);
    backend_leave(backend);
    return st;
}

enum bp_status bp_event_wait(bp_event *event, bp_backend *backend)
{
    CHECK_HANDLE(event, BP_ERR_INVALID_ARG);
    CHECK_HANDLE(backend, BP_ERR_INVALID_ARG);
    if (BP_HAS(struct bp_backend_iface, backend->iface, event_wait) &&
        backend->device->reg == event->device->reg) {
        BACKEND_ENTER(backend, BP_ERR_BUSY);
        enum bp_status st = backend->iface->event_wait(backend, event->handle);
        backend_leave(backend);
        return st;
    }
    /* A backend of another plugin cannot queue a wait on this event: block instead. */
    return bp_event_synchronize(event);
}

enum bp_status bp_event_synchronize(bp_event *event)
{
    CHECK_HANDLE(event, BP_ERR_INVALID_ARG);
    enum bp_status st = event->device->iface->event_synchronize(event->device, event->handle);
    if (st != BP_OK && bp_last_status() == BP_OK)
        bp__error(st, "device %s: waiting for an event failed (%s)",
                  bp_device_get_name(event->device), bp_strerror(st));
    return st;
}

enum bp_status bp_event_synchronize_timeout(bp_event *event, int64_t timeout_ns)
{
    CHECK_HANDLE(event, BP_ERR_INVALID_ARG);
    if (timeout_ns < 0)
        return bp__error(BP_ERR_INVALID_ARG, "%s: timeout %lld ns is negative", __func__,
                         (long long)timeout_ns);
    bp_device *dev = event->device;
    if (!BP_HAS(struct bp_device_iface, dev->iface, event_synchronize_timeout))
        return bp_event_synchronize(event); /* no deadline-aware wait: documented */
    enum bp_status st = dev->iface->event_synchronize_timeout(dev, event->handle, timeout_ns);
    if (st == BP_ERR_TIMEOUT && bp_last_status() != BP_ERR_TIMEOUT)
        bp__error(st, "device %s: the event did not happen within %lld ns",
                  bp_device_get_name(dev), (long long)timeout_ns);
    else if (st != BP_OK && bp_last_status() == BP_OK)
        bp__error(st, "device %s: waiting for an event failed (%s)", bp_device_get_name(dev),
                  bp_strerror(st));
    return st;
}

/* ---- Registries ------------------------------------------------------------------------- */

const char *bp_registry_get_name(bp_registry *reg)
{
    CHECK_HANDLE(reg, "");
    return bp__registry_usable(reg) ? reg->checked.name : "";
}

/* Only the devices that passed their checks count (verify.c). */
size_t bp_registry_get_device_count(bp_registry *reg)
{
    CHECK_HANDLE(reg, 0);
    return bp__registry_devices(reg, SIZE_MAX, NULL);
}

bp_device *bp_registry_get_device(bp_registry *reg, size_t index)
{
    CHECK_HANDLE(reg, NULL);
    bp_device *dev = NULL;
    size_t n = bp__registry_devices(reg, index, &dev);
    if (index >= n)
        return bp__error_null(BP_ERR_OUT_OF_BOUNDS,
                              "registry %s has %zu device%s; there is no device %zu",
                              bp_registry_get_name(reg), n, BP_PLURAL(n), index);
    return dev;
}

void *bp_registry_get_proc_address(bp_registry *reg, const char *name)
{
    CHECK_HANDLE(reg, NULL);
    CHECK_HANDLE(name, NULL);
    if (!BP_HAS(struct bp_registry_iface, reg->iface, get_proc_address))
        return NULL;
    return reg->iface->get_proc_address(reg, name);
}

void bp_registry_get_api_version(bp_registry *reg, int *major, int *minor)
{
    if (major)
        *major = reg ? reg->api_major : 0;
    if (minor)
        *minor = reg ? reg->api_minor : 0;
}
