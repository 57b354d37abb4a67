/* bp-plugin.h - what a plugin author implements: the interface structs and the constructors
 * that wrap a plugin's implementation into runtime objects.
 *
 * Every interface struct begins with its own size (set it to sizeof the struct as compiled
 * against this header). The runtime never reads a member that lies beyond the size the plugin
 * declared, so a plugin built against an older, shorter struct keeps working: members it does
 * not have count as "not supported". Members marked optional may also be NULL; the runtime
 * supplies the default written next to them. The runtime owns the objects it returns from the
 * constructors below and calls the interface's free member (when present) to let the plugin
 * release its context.
 *
 * The runtime checks the answers it relies on, once, where they first reach it, and refuses
 * the object that breaks a rule below, with a sentence naming the plugin and the answer (in
 * the error, and for devices in the load report): names are non-empty printable UTF-8 of at
 * most 127 bytes (descriptions may be empty, at most 1023); an alignment is a power of two
 * from 1 to 1 MiB; get_max_size is not 0; get_alloc_size is at least bp_nbytes (a smaller answer
 * refuses the buffer type from then on); a new buffer's base is not NULL (unless its size is
 * 0), is aligned and does not wrap. Names, descriptions and alignments are kept as first
 * checked. A refused device is left out of its registry's devices; the rest of the plugin and
 * every other plugin keep working.
 *
 * Threads (the user's rules are in bp-backend.h): the runtime never runs two calls of one
 * backend's members at once, but registry, device and buffer type members may be called from
 * several threads at the same time, and so may buffer members that read (get_tensor, also from
 * two backends sharing weights). A buffer's members are never called twice at once where one
 * writes, but different buffers of one device may be written from two threads at once, and a
 * buffer may be written while the device's backend computes with other buffers (the
 * scheduler's copy thread fills expert caches so). Keep them free of unsynchronised writes to
 * shared state.
 *
 * Asynchronous devices (caps.async; a worker thread, a stream or a queue behind the backend).
 * The contract below is what the runtime, the scheduler and applications rely on; an
 * asynchronous plugin keeps all of it, and examples/example-async-plugin.c is one that does.
 * - Queued work. graph_compute, set/get_tensor_async, cpy_tensor_async and event_record/wait
 *   may return before the work is done; the backend's work then runs in the order it was
 *   queued. A status returned by one of them is about queueing (bad arguments, an op it cannot
 *   run): nothing was queued.
 * - What graph_compute may keep. When it returns before the work is done, the plugin may keep
 *   the graph pointer and read the graph and every tensor it reaches (nodes, sources, views'
 *   sources: type, shape, strides, op, op params, data, buffer, flags) from its worker until
 *   the backend's next synchronize that is not a timeout has returned. The application keeps
 *   them alive and unchanged until then (bp-backend.h says so to users; the scheduler does),
 *   and does not write the memory of any tensor the graph writes or reads. A plugin that wants
 *   more freedom copies what it needs before returning.
 * - Plain calls (a buffer's set/get/memset/clear/cpy_tensor members, which back bp_tensor_set,
 *   bp_tensor_get, bp_tensor_copy, bp_buffer_clear) on a buffer that is not host memory are
 *   ordered after all work already queued on the device's backends: the member waits for that
 *   work (as CUDA's blocking streams do with the legacy default stream), then does its part and
 *   returns when done. So bp_tensor_get after bp_backend_graph_compute_async returns the
 *   result, whatever the device. They need not wait for work queued after they began (by
 *   another thread), and they never report the worker's errors (synchronize does). Memory of
 *   host buffers (is_host) is read and written directly by the runtime and by other backends,
 *   without any member being called: nothing can order that, and an application synchronizes
 *   the backend before touching tensors in such memory that queued work uses.
 * - set_tensor_async reads data, and get_tensor_async writes it, at any time until the next
 *   synchronize returns. cpy_tensor_async (called on dst's backend) reads src later, in
 *   dst_backend's queue order. src's memory stays allocated until dst_backend's next
 *   synchronize, but nothing stops other work from writing it once the call has returned (the
 *   scheduler reuses compute memory, and a synchronous CPU backend writes at once). So queue a
 *   copy only where the plugin's own queues order it: src complete before the read (work of
 *   src_backend waited for, by queue order or an event) and the read before any later write of
 *   src (src_backend's later work queued behind it). Otherwise decline (false, no error): the
 *   runtime then synchronizes both backends and copies through the plain members.
 * - Events. event_record marks the point in the backend's queue reached by the work queued so
 *   far; the event "happens" when the worker gets there. Recording again moves the mark (a
 *   new point; waits already queued keep the one they saw). event_wait, called with a backend
 *   of the same registry (another backend of the device or of another device of the plugin),
 *   makes that backend's later work wait until the most recent record of the event, as of the
 *   call, has happened; waiting on an event that was never recorded waits for nothing (as
 *   CUDA). The runtime turns a wait by a backend of another plugin into event_synchronize.
 *   event_synchronize blocks until the latest record has happened (at once for an event never
 *   recorded). event_free may come while a record or wait of the event is still queued: the
 *   plugin keeps what the worker needs until the worker is done with it.
 * - Errors of the worker. A failure while running queued work is recorded by the plugin and
 *   returned by the backend's next synchronize (or synchronize_timeout that does not time out),
 *   with its sentence set through bp_set_error, exactly once: that synchronize clears it, and
 *   the next one returns BP_OK unless new work failed. When several queued items fail, the
 *   first failure is reported. Work queued after a failed item still runs (events still
 *   happen, so nothing waits forever); its results are undefined. Queueing calls do not report
 *   a pending worker error.
 * - Deadlines. synchronize_timeout and event_synchronize_timeout (optional, plugin API 1.1)
 *   wait at most timeout_ns nanoseconds (0: only look) and return BP_ERR_TIMEOUT, with the work
 *   still queued and nothing else changed, when the deadline passes first. Without them the
 *   runtime waits with synchronize / event_synchronize and cannot keep a deadline.
 * - free (of a backend) is called only after the runtime has synchronized the backend (its
 *   error, if any, is logged and dropped); the plugin then stops its worker.
 * - caps.async promises that the async members, graph_compute and events may return before
 *   their work is done and that the rules above hold; it does not promise overlap of copies
 *   and compute. A device without it is treated as synchronous: every member is done when it
 *   returns (synchronize then has nothing to wait for).
 * - init_tensor (optional) is called on the placing thread when a tensor or a view is placed
 *   in the buffer (the allocators, bp_buffer_place_tensor, bp_tensor_init_view), after its
 *   buffer and data are set and before any data moves. It may prepare state of the plugin's own
 *   for the tensor; it does not change the tensor's fields, and an error from it fails the
 *   placement. It is not ordered with queued work, so it does not touch memory that queued
 *   work may be using. */
#ifndef BACKPLANE_BP_PLUGIN_H
#define BACKPLANE_BP_PLUGIN_H

#include <backplane/bp-backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin API version a plugin is compiled against. A plugin needs the same major version
 * as the runtime and a minor version no newer than the runtime's. */
#define BP_PLUGIN_API_MAJOR 1
#define BP_PLUGIN_API_MINOR 1 /* 1.1: synchronize_timeout, event_synchronize_timeout */

/* True when iface (a pointer to an interface struct of type T) declares member m and sets it. */
#define BP_IFACE_HAS(T, iface, m)                                                              \
    ((iface)->struct_size >= offsetof(T, m) + sizeof(((T *)0)->m) && (iface)->m != NULL)

struct bp_buffer_type_iface {
    size_t struct_size;
    const char *(*get_name)(bp_buffer_type *buft);
    /* Returns a buffer made with bp_buffer_new, or NULL after bp_set_error. */
    bp_buffer *(*alloc_buffer)(bp_buffer_type *buft, size_t size);
    size_t (*get_alignment)(bp_buffer_type *buft);
    size_t (*get_max_size)(bp_buffer_type *buft);                        /* optional: SIZE_MAX */
    size_t (*get_alloc_size)(bp_buffer_type *buft, const bp_tensor *t); /* optional: bp_nbytes */
    bool (*is_host)(bp_buffer_type *buft);                               /* optional: false */
    void (*free)(bp_buffer_type *buft);                                  /* optional */
};

/* Offsets and sizes are bytes within the tensor's data; the runtime has checked the bounds.
 * Required: get_base, memset_tensor, set_tensor, get_tensor and clear (bp_buffer_new refuses an
 * interface without them); every other member is optional. */
struct bp_buffer_iface {
    size_t struct_size;
    void (*free_buffer)(bp_buffer *buf); /* optional: releases the context */
    /* The address tensors are placed from: a tensor's data is base + its offset, inside
     * [base, base + size). Not NULL and aligned to the buffer type's alignment. For host memory
     * it is that memory; for any other buffer it is an address in the plugin's own space (a
     * device pointer, or a reserved range the plugin maps to its storage) that the runtime only
     * computes with and compares, never dereferences; the data moves through the members
     * below. */
    void *(*get_base)(bp_buffer *buf);
    enum bp_status (*init_tensor)(bp_buffer *buf, bp_tensor *t); /* optional */
    enum bp_status (*memset_tensor)(bp_buffer *buf, bp_tensor *t, uint8_t value, size_t offset,
                                    size_t size);
    enum bp_status (*set_tensor)(bp_buffer *buf, bp_tensor *t, const void *data, size_t offset,
                                 size_t size);
    enum bp_status (*get_tensor)(bp_buffer *buf, const bp_tensor *t, void *data, size_t offset,
                                 size_t size);
    /* optional: copy src (in any buffer) into dst (in buf) directly. false without recording
     * an error: this path cannot, and the runtime copies through host memory; false after
     * bp_set_error: the copy failed, and the runtime returns that error. */
    bool (*cpy_tensor)(bp_buffer *buf, const bp_tensor *src, bp_tensor *dst);
    enum bp_status (*clear)(bp_buffer *buf, uint8_t value);
    /* optional: strided copies; the runtime loops over rows otherwise. */
    enum bp_status (*set_tensor_2d)(bp_buffer *buf, bp_tensor *t, const void *data, size_t offset,
                                    size_t width, size_t rows, size_t t_stride,
                                    size_t data_stride);
    enum bp_status (*get_tensor_2d)(bp_buffer *buf, const bp_tensor *t, void *data, size_t offset,
                                    size_t width, size_t rows, size_t t_stride,
                                    size_t data_stride);
};

/* In-place contract. The graph allocator may place a node at exactly the memory of a source
 * with the same type, shape and strides when that node is the source's last consumer: any
 * same-shaped source of ADD, SUB, MUL, DIV and two-tensor GLU; src[0] of SCALE, UNARY, NORM,
 * RMS_NORM, SOFT_MAX and ROPE. Kernels for these ops must give the right result when dst and
 * that source are the same memory (read an element, or a whole row for the row-wise ops,
 * before writing it). */
struct bp_backend_iface {
    size_t struct_size;
    const char *(*get_name)(bp_backend *backend);
    void (*free)(bp_backend *backend); /* optional: releases the context */
    /* optional: synchronous set/get/copy are used instead. Lifetimes: see "Asynchronous
     * devices" above. */
    enum bp_status (*set_tensor_async)(bp_backend *backend, bp_tensor *t, const void *data,
                                       size_t offset, size_t size);
    enum bp_status (*get_tensor_async)(bp_backend *backend, const bp_tensor *t, void *data,
                                       size_t offset, size_t size);
    /* optional: queue a copy from src to dst (dst on this backend). false without recording an
     * error: it cannot, and the runtime copies synchronously; false after bp_set_error: the copy
     * failed, and the runtime returns that error. */
    bool (*cpy_tensor_async)(bp_backend *src_backend, bp_backend *dst_backend,
                             const bp_tensor *src, bp_tensor *dst);
    /* optional: nothing to wait for. Waits for all queued work, then returns (and clears) the
     * first error the worker met since the last synchronize. */
    enum bp_status (*synchronize)(bp_backend *backend);
    /* Queues (or runs) every node of the graph; the tensors are placed in buffers the
     * backend's device supports. A plugin that queues may keep the graph until the next
     * synchronize (above). */
    enum bp_status (*graph_compute)(bp_backend *backend, bp_graph *graph);
    /* optional, required for devices that have events */
    enum bp_status (*event_record)(bp_backend *backend, void *event);
    enum bp_status (*event_wait)(bp_backend *backend, void *event);
    /* optional (API 1.1; members are only ever appended here): synchronize with a deadline of
     * timeout_ns >= 0 nanoseconds; BP_ERR_TIMEOUT, the work still queued, when it passes. */
    enum bp_status (*synchronize_timeout)(bp_backend *backend, int64_t timeout_ns);
};

struct bp_device_iface {
    size_t struct_size;
    const char *(*get_name)(bp_device *dev);
    const char *(*get_description)(bp_device *dev);
    void (*get_memory)(bp_device *dev, size_t *free_bytes, size_t *total_bytes);
    enum bp_device_type (*get_type)(bp_device *dev);
    /* optional: {async = false, and the others from which members are present} */
    void (*get_caps)(bp_device *dev, struct bp_device_caps *caps);
    /* Returns a backend made with bp_backend_new, or NULL after bp_set_error. */
    bp_backend *(*init_backend)(bp_device *dev, const char *params);
    bp_buffer_type *(*get_buffer_type)(bp_device *dev);
    bp_buffer_type *(*get_host_buffer_type)(bp_device *dev); /* optional */
    bp_buffer *(*buffer_from_host_ptr)(bp_device *dev, void *ptr, size_t size,
                                       size_t max_tensor_size); /* optional */
    bool (*supports_op)(bp_device *dev, const bp_tensor *op);
    bool (*supports_buft)(bp_device *dev, bp_buffer_type *buft);
    bool (*offload_op)(bp_device *dev, const bp_tensor *op); /* optional: false */
    /* optional: events are opaque plugin pointers */
    void *(*event_new)(bp_device *dev);
    void (*event_free)(bp_device *dev, void *event);
    enum bp_status (*event_synchronize)(bp_device *dev, void *event);
    void (*free)(bp_device *dev); /* optional: releases the context */
    /* optional (API 1.1, appended): event_synchronize with a deadline of timeout_ns >= 0
     * nanoseconds; BP_ERR_TIMEOUT when it passes first. */
    enum bp_status (*event_synchronize_timeout)(bp_device *dev, void *event, int64_t timeout_ns);
};

struct bp_registry_iface {
    size_t struct_size;
    const char *(*get_name)(bp_registry *reg);
    size_t (*get_device_count)(bp_registry *reg);
    bp_device *(*get_device)(bp_registry *reg, size_t index);
    void *(*get_proc_address)(bp_registry *reg, const char *name); /* optional: none */
    void (*free)(bp_registry *reg); /* optional: releases the context */
};

/* Proc addresses the runtime itself asks a registry for (besides the collectives of
 * bp-comm.h): "bp_set_n_threads", of this type, backs bp_backend_set_n_threads for a plugin
 * whose backends compute with threads. The runtime calls it with the backend already entered
 * (one thread at a time) and n >= 1; the plugin returns BP_OK or a status after bp_set_error. */
typedef enum bp_status (*bp_set_n_threads_fn)(bp_backend *backend, int n_threads);
/* "bp_registry_note", of this type: a short note about the registry, meant to say why it has no
 * devices ("no usable GPU: no CUDA driver (...)"). The loader asks once the registry is made and
 * appends it to the plugin's load-report record ("registry 'CUDA' with 0 devices: <note>"); the
 * device and registry lookups (bp_backend_init_by_name and the like) add it to their error for
 * a registry without devices. The string is the plugin's and stays valid while the plugin is
 * loaded; NULL or "" means nothing to say. */
typedef const char *(*bp_registry_note_fn)(void);

/* Constructors. Each checks the interface (struct size, required members) and returns NULL
 * with an error naming what is missing. Objects made for a device or registry are freed with
 * it: the registry frees its devices, a device its buffer types. */
BP_API bp_registry *bp_registry_new_versioned(const struct bp_registry_iface *iface,
                                              int api_major, int api_minor, void *context);
#define bp_registry_new(iface, context)                                                        \
    bp_registry_new_versioned((iface), BP_PLUGIN_API_MAJOR, BP_PLUGIN_API_MINOR, (context))
/* Frees the registry, its devices and their buffer types (for plugin init failure paths and
 * the loader). */
BP_API void bp_registry_free(bp_registry *reg);
BP_API bp_device *bp_device_new(bp_registry *reg, const struct bp_device_iface *iface,
                                void *context);
/* dev may be NULL for a buffer type that belongs to no device; the caller then frees it with
 * bp_buffer_type_free. */
BP_API bp_buffer_type *bp_buffer_type_new(bp_device *dev, const struct bp_buffer_type_iface *iface,
                                          void *context);
BP_API void bp_buffer_type_free(bp_buffer_type *buft);
/* For a buffer type's alloc_buffer: the user frees it with bp_buffer_free (which calls
 * free_buffer). On failure (NULL: an interface without a required member, out of memory) it
 * does not take ownership of context and calls nothing of iface: the caller still owns the
 * context and releases it. iface must stay valid for the life of the buffer (a static
 * struct). */
BP_API bp_buffer *bp_buffer_new(bp_buffer_type *buft, const struct bp_buffer_iface *iface,
                                void *context, size_t size);
/* For a device's init_backend: the user frees it with bp_backend_free (which calls free). As
 * with bp_buffer_new, on failure the context stays the caller's. Every constructor above
 * behaves the same way: NULL means nothing was taken over. */
BP_API bp_backend *bp_backend_new(bp_device *dev, const struct bp_backend_iface *iface,
                                  void *context);

BP_API void *bp_registry_get_context(bp_registry *reg);
BP_API void *bp_device_get_context(bp_device *dev);
BP_API void *bp_buffer_type_get_context(bp_buffer_type *buft);
BP_API void *bp_buffer_get_context(bp_buffer *buf);
BP_API void *bp_backend_get_context(bp_backend *backend);

/* ---- The plugin descriptor ----------------------------------------------------------------
 * Each plugin shared object (backplane-<name>[-<variant>].so) exports one constant descriptor
 * under the symbol name BP_PLUGIN_SYMBOL. The loader reads and checks it (size, API version,
 * name, variant, CPU features) before it runs any code of the plugin; only then does it call
 * score (if present) and, for the chosen variant, init. */

/* Instruction-set features a plugin variant may require. The runtime checks them with CPUID and
 * the OS-enabled state (XCR0); names as in /proc/cpuinfo. */
#define BP_CPU_FEATURE_MAP(X)                               \
    X(SSE4_2, 0, "sse4_2")                                  \
    X(AVX, 1, "avx")                                        \
    X(AVX2, 2, "avx2")                                      \
    X(FMA, 3, "fma")                                        \
    X(F16C, 4, "f16c")                                      \
    X(AVX512F, 5, "avx512f")                                \
    X(AVX512BW, 6, "avx512bw")                              \
    X(AVX512DQ, 7, "avx512dq")                              \
    X(AVX512VL, 8, "avx512vl")                              \
    X(AVX512_VNNI, 9, "avx512_vnni")                        \
    X(AVX512_BF16, 10, "avx512_bf16")                       \
    X(AVX_VNNI, 11, "avx_vnni")                             \
    X(AMX_TILE, 12, "amx_tile")                             \
    X(AMX_INT8, 13, "amx_int8")                             \
    X(AMX_BF16, 14, "amx_bf16")                             \
    X(AMX_FP16, 15, "amx_fp16")

enum bp_cpu_feature {
#define BP_CPU_FEATURE_ENUM(name, bit, text) BP_CPU_##name = 1ull << (bit),
    BP_CPU_FEATURE_MAP(BP_CPU_FEATURE_ENUM)
#undef BP_CPU_FEATURE_ENUM
};

/* The features this process may use: what CPUID reports and the OS has enabled, minus any named
 * in the environment variable BP_CPU_DISABLE (comma-separated names, for testing variants). */
BP_API uint64_t bp_cpu_features(void);
/* "avx2" for BP_CPU_AVX2 (one bit); NULL otherwise. */
BP_API const char *bp_cpu_feature_name(uint64_t feature);

struct bp_plugin_descriptor {
    size_t struct_size;
    int api_major;
    int api_minor;
    const char *name;     /* the <name> of its file name: [A-Za-z0-9_]+ */
    const char *variant;  /* the <variant>, or "" */
    uint64_t cpu_features; /* BP_CPU_* bits it needs */
    bp_registry *(*init)(void);
    /* optional: 0 = cannot run on this machine, higher = better; default 1 */
    int (*score)(void);
};

#define BP_PLUGIN_SYMBOL "bp_plugin_descriptor"

/* Defines the descriptor of a plugin. Use once, at file scope, in one source of the plugin. */
#define BP_PLUGIN_DEFINE(name_, variant_, features_, init_, score_)   \
    BP_API const struct bp_plugin_descriptor bp_plugin_descriptor = { \
        .struct_size = sizeof(struct bp_plugin_descriptor),           \
        .api_major = BP_PLUGIN_API_MAJOR,                             \
        .api_minor = BP_PLUGIN_API_MINOR,                             \
        .name = (name_),                                              \
        .variant = (variant_),                                        \
        .cpu_features = (features_),                                  \
        .init = (init_),                                              \
        .score = (score_),                                            \
    }

/* While a plugin's init function runs, on the thread that runs it: the resolved absolute path
 * of the directory its file was loaded from, a directory the loader has checked as it checks
 * every plugin directory (owner and permissions of each component). NULL at any other time.
 * For plugins that load companion files from beside themselves (an implementation library,
 * kernel binaries): copy what you need during init. The file itself was opened through
 * /proc/self/fd, so dladdr cannot tell it. */
BP_API const char *bp_plugin_init_dir(void);

/* Records an error for bp_last_error() from plugin code; returns status. */
BP_API enum bp_status bp_set_error(enum bp_status status, const char *fmt, ...) BP_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif
