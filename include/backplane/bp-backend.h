/* bp-backend.h - buffer types, buffers, backends, devices, registries and events: the user side
 * of the backend API. Plugin authors implement these objects through bp-plugin.h.
 *
 * Threads. What may be used from several threads at once, and what may not:
 * - Discovery and loading (bp_plugin_load_all, and every lookup that runs it) happen once and
 *   are thread-safe. Registries, devices and buffer types are read-only afterwards: any
 *   thread may query them (names, properties, supports_op, buffer types) at any time.
 * - A backend is used by one thread at a time: graph compute, synchronize and the async
 *   set/get/copy. A call that enters a backend while another thread's call on it is still in
 *   progress is refused with BP_ERR_BUSY and a sentence in bp_last_error(), not a crash; wait
 *   or use a backend per thread. Different backends may run on different threads at the same
 *   time, also over the same buffers of weights as long as nobody writes them.
 * - A scheduler (bp_sched, bp-sched.h) is used by one thread at a time, with the same
 *   BP_ERR_BUSY refusal.
 * - Contexts, graphs, tensors and buffers' contents are plain data and not synchronised: one
 *   thread writes them at a time, and nobody reads while one writes.
 * - bp_last_error() is per thread. The log callback may be called from any thread, also from
 *   several at once.
 * - Unloading a plugin (bp_plugin_unload) must not race with any use of that plugin's
 *   registries, devices, buffers or backends: it refuses while objects hold the plugin, but a
 *   call in progress on another thread is the caller's to finish first. */
#ifndef BACKPLANE_BP_BACKEND_H
#define BACKPLANE_BP_BACKEND_H

#include <backplane/bp-graph.h>
#include <backplane/bp-tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_buffer_type bp_buffer_type;
typedef struct bp_buffer bp_buffer;
typedef struct bp_backend bp_backend;
typedef struct bp_device bp_device;
typedef struct bp_registry bp_registry;
typedef struct bp_event bp_event;

/* What a buffer holds; schedulers use it to keep ops next to their weights. */
enum bp_buffer_usage {
    BP_BUFFER_USAGE_ANY = 0,
    BP_BUFFER_USAGE_WEIGHTS = 1,
    BP_BUFFER_USAGE_COMPUTE = 2,
};

enum bp_device_type {
    BP_DEVICE_TYPE_CPU = 0,
    BP_DEVICE_TYPE_GPU = 1,
    BP_DEVICE_TYPE_ACCEL = 2,
    BP_DEVICE_TYPE_META = 3,
};

struct bp_device_caps {
    /* async set/get/copy and graph compute may return before the work is done (bp-plugin.h,
     * "Asynchronous devices", has the rules every such device keeps) */
    bool async;
    bool host_buffer;          /* offers a pinned host buffer type */
    bool buffer_from_host_ptr; /* can wrap user memory as a buffer */
    bool events;               /* event record/wait/synchronize */
};

struct bp_device_props {
    const char *name;
    const char *description;
    size_t memory_free;
    size_t memory_total;
    enum bp_device_type type;
    struct bp_device_caps caps;
};

/* ---- Buffer types ----------------------------------------------------------------------- */

BP_API const char *bp_buffer_type_get_name(bp_buffer_type *buft);
BP_API size_t bp_buffer_type_get_alignment(bp_buffer_type *buft);
/* Largest single buffer; SIZE_MAX when the type sets no limit. */
BP_API size_t bp_buffer_type_get_max_size(bp_buffer_type *buft);
/* Bytes this buffer type needs for t (at least bp_nbytes(t); some types pad). */
BP_API size_t bp_buffer_type_get_alloc_size(bp_buffer_type *buft, const bp_tensor *t);
BP_API bool bp_buffer_type_is_host(bp_buffer_type *buft);
/* The device this type belongs to; NULL for the runtime's host buffer type. */
BP_API bp_device *bp_buffer_type_get_device(bp_buffer_type *buft);
/* A new buffer of size bytes (0 is valid). Caller frees with bp_buffer_free. */
BP_API bp_buffer *bp_buffer_type_alloc(bp_buffer_type *buft, size_t size);

/* The runtime's own host-memory buffer type (64-byte aligned). Static; never freed. */
BP_API bp_buffer_type *bp_host_buffer_type(void);
/* Wraps size bytes of caller memory at ptr (aligned to at least 64 bytes when tensors will be
 * placed in it by the allocators) as a host buffer. The memory stays the caller's: freeing the
 * buffer does not free it. Caller frees the buffer with bp_buffer_free. */
BP_API bp_buffer *bp_buffer_from_host_ptr(void *ptr, size_t size);
/* A read-only buffer of size bytes that stay in the file at path from byte offset on (the
 * "File" buffer type, bp_file_buffer_type): place tensors in it with bp_buffer_place_tensor at
 * bp_buffer_get_base(buf) + their offset, and they are read with pread when asked for
 * (bp_tensor_get, or a scheduler copying them, or only the experts a MUL_MAT_ID uses, to the
 * backend that needs them); nothing maps the file, and no device computes on it in place.
 * Writes are refused (BP_ERR_UNSUPPORTED). A read after the file changed on disk (its size or
 * modification time; a file replaced under the same name is not seen: the buffer keeps reading
 * the one it opened) or that meets its end fails with BP_ERR_IO and the reason. NULL with an
 * error when the file cannot be opened (BP_ERR_IO; the open never blocks, and a FIFO, socket,
 * device or directory is refused with what it is) or is shorter than offset + size
 * (BP_ERR_OUT_OF_BOUNDS). */
BP_API bp_buffer *bp_buffer_from_file(const char *path, uint64_t offset, size_t size);
BP_API bp_buffer_type *bp_file_buffer_type(void);

/* ---- Buffers ---------------------------------------------------------------------------- */

BP_API void bp_buffer_free(bp_buffer *buf); /* NULL: no-op */
/* The address tensor data in buf is placed from (tensor data = base + offset). For a host
 * buffer (bp_buffer_is_host) that is host memory; for any other buffer it is an address in the
 * plugin's own space (a device pointer, a meta device's reserved range) that the caller may
 * compute offsets with but must not dereference: use bp_tensor_set/get for the data. */
BP_API void *bp_buffer_get_base(bp_buffer *buf);
BP_API size_t bp_buffer_get_size(bp_buffer *buf);
BP_API size_t bp_buffer_get_alignment(bp_buffer *buf);
BP_API bp_buffer_type *bp_buffer_get_type(bp_buffer *buf);
BP_API bool bp_buffer_is_host(bp_buffer *buf);
/* Sets every byte of the buffer to value. */
BP_API enum bp_status bp_buffer_clear(bp_buffer *buf, uint8_t value);
BP_API void bp_buffer_set_usage(bp_buffer *buf, enum bp_buffer_usage usage);
BP_API enum bp_buffer_usage bp_buffer_get_usage(bp_buffer *buf);
/* Places t (not a view) at addr inside buf: addr must be aligned and t must fit. Used by the
 * allocators; views are placed with bp_tensor_init_view once their source has memory. */
BP_API enum bp_status bp_buffer_place_tensor(bp_buffer *buf, bp_tensor *t, void *addr);
/* Gives view t the memory of its view_src (which must already be placed). */
BP_API enum bp_status bp_tensor_init_view(bp_tensor *t);

/* ---- Tensor data ------------------------------------------------------------------------ *
 * offset and size are bytes within the tensor's data (which must be contiguous for these
 * calls to mean what they say: bytes [offset, offset + size) of bp_nbytes(t)). A tensor
 * without a buffer, or a range outside the tensor, is an error and nothing is copied. */
BP_API enum bp_status bp_tensor_set(bp_tensor *t, const void *data, size_t offset, size_t size);
BP_API enum bp_status bp_tensor_get(const bp_tensor *t, void *data, size_t offset, size_t size);
BP_API enum bp_status bp_tensor_memset(bp_tensor *t, uint8_t value, size_t offset, size_t size);
/* 2-D strided copies: `rows` pieces of `width` bytes; piece i is at offset + i * t_stride in the
 * tensor and at i * data_stride in data. */
BP_API enum bp_status bp_tensor_set_2d(bp_tensor *t, const void *data, size_t offset, size_t width,
                                       size_t rows, size_t t_stride, size_t data_stride);
BP_API enum bp_status bp_tensor_get_2d(const bp_tensor *t, void *data, size_t offset, size_t width,
                                       size_t rows, size_t t_stride, size_t data_stride);
/* Copies all of src into dst (same byte size, both placed): directly when dst's buffer can
 * copy from src's, through host memory otherwise. The bytes are copied as they lie (strides
 * are not interpreted). When src and dst overlap in one buffer the result is as memmove's: dst
 * ends up holding src's old bytes. (The CPY op, by contrast, refuses overlapping operands when
 * the graph is built.) */
BP_API enum bp_status bp_tensor_copy(const bp_tensor *src, bp_tensor *dst);

/* ---- Backends --------------------------------------------------------------------------- */

BP_API const char *bp_backend_get_name(bp_backend *backend);
/* Waits for the backend's queued work first (an error it meets is logged, as nobody is left to
 * return it to), then frees it. NULL: no-op. */
BP_API void bp_backend_free(bp_backend *backend);
BP_API bp_device *bp_backend_get_device(bp_backend *backend);
BP_API bp_buffer_type *bp_backend_get_default_buffer_type(bp_backend *backend);
BP_API bp_buffer *bp_backend_alloc_buffer(bp_backend *backend, size_t size);
/* Waits until every queued operation of the backend has finished. Returns the first error
 * that queued work met since the previous synchronize (with its sentence in bp_last_error()),
 * once: the error is then cleared, and the next synchronize returns BP_OK unless new work
 * failed. */
BP_API enum bp_status bp_backend_synchronize(bp_backend *backend);
/* bp_backend_synchronize that waits at most timeout_ns nanoseconds (>= 0; 0 only looks).
 * BP_ERR_TIMEOUT, with a sentence, when the deadline passes first: the work is still queued
 * and nothing was reported or cleared; the caller may wait again (with or without a deadline),
 * or free the backend, which waits for it. A backend whose plugin has no deadline-aware wait
 * (plugin API 1.0, or no synchronize_timeout member) is waited for without one: the deadline
 * cannot be kept, and the call returns whatever the plain wait returns. */
BP_API enum bp_status bp_backend_synchronize_timeout(bp_backend *backend, int64_t timeout_ns);
/* The number of threads the backend computes with (n >= 1). BP_ERR_UNSUPPORTED, with a
 * sentence, for a backend without threads (its registry offers no "bp_set_n_threads" proc
 * address); BP_ERR_BUSY while another thread is inside the backend. */
BP_API enum bp_status bp_backend_set_n_threads(bp_backend *backend, int n_threads);
/* Queues the graph (returns before it finishes on asynchronous backends: props.caps.async).
 * Until the backend's next synchronize (one that does not time out) has returned, the graph,
 * every tensor it reaches and their memory stay alive and unchanged: the backend may still
 * read them. Plain bp_tensor_set/get/copy on tensors in the device's own (not host) buffers
 * wait for the queued work first, so a bp_tensor_get of a result after this call sees it;
 * tensors in host memory (bp_buffer_is_host) are not waited for. Errors of the queued work
 * are reported by that synchronize... */
BP_API enum bp_status bp_backend_graph_compute_async(bp_backend *backend, bp_graph *graph);
/* ...or computes it and waits. */
BP_API enum bp_status bp_backend_graph_compute(bp_backend *backend, bp_graph *graph);
BP_API bool bp_backend_supports_op(bp_backend *backend, const bp_tensor *op);
BP_API bool bp_backend_supports_buft(bp_backend *backend, bp_buffer_type *buft);
/* Whether the backend wants to run op even though its weights live elsewhere. */
BP_API bool bp_backend_offload_op(bp_backend *backend, const bp_tensor *op);
/* Queued variants of set/get/copy; synchronous fallback on backends without async support.
 * The caller keeps data (and for a copy, src) valid and unchanged until dst's backend's next
 * bp_backend_synchronize returns; get_async's data holds the bytes only then. */
BP_API enum bp_status bp_backend_tensor_set_async(bp_backend *backend, bp_tensor *t,
                                                  const void *data, size_t offset, size_t size);
BP_API enum bp_status bp_backend_tensor_get_async(bp_backend *backend, const bp_tensor *t,
                                                  void *data, size_t offset, size_t size);
BP_API enum bp_status bp_backend_tensor_copy_async(bp_backend *src_backend,
                                                   bp_backend *dst_backend, const bp_tensor *src,
                                                   bp_tensor *dst);

/* ---- Devices ---------------------------------------------------------------------------- */

BP_API const char *bp_device_get_name(bp_device *dev);
BP_API const char *bp_device_get_description(bp_device *dev);
BP_API enum bp_device_type bp_device_get_type(bp_device *dev);
BP_API const char *bp_device_type_name(enum bp_device_type type);
BP_API void bp_device_get_memory(bp_device *dev, size_t *free_bytes, size_t *total_bytes);
/* Everything about the device; the memory figures may cost a query of the device (for a GPU,
 * starting its runtime). */
BP_API void bp_device_get_props(bp_device *dev, struct bp_device_props *props);
/* Only what the device can do (props.caps), without touching the device: cheap enough for a
 * scheduler deciding where buffers go. All false for a NULL dev (and bp_last_error() says so). */
BP_API void bp_device_get_caps(bp_device *dev, struct bp_device_caps *caps);
BP_API bp_registry *bp_device_get_registry(bp_device *dev);
/* A backend on dev; params is "key=value,key=value" or NULL. Caller frees with bp_backend_free. */
BP_API bp_backend *bp_device_init_backend(bp_device *dev, const char *params);
BP_API bp_buffer_type *bp_device_get_buffer_type(bp_device *dev);
/* A pinned host buffer type of the device, NULL (with an error) when it has none. */
BP_API bp_buffer_type *bp_device_get_host_buffer_type(bp_device *dev);
/* Caller memory wrapped as a buffer of the device; NULL when unsupported. */
BP_API bp_buffer *bp_device_buffer_from_host_ptr(bp_device *dev, void *ptr, size_t size,
                                                 size_t max_tensor_size);
BP_API bool bp_device_supports_op(bp_device *dev, const bp_tensor *op);
BP_API bool bp_device_supports_buft(bp_device *dev, bp_buffer_type *buft);
BP_API bool bp_device_offload_op(bp_device *dev, const bp_tensor *op);

/* ---- Events ----------------------------------------------------------------------------- */

/* NULL (with an error) when the device has no events. Caller frees with bp_event_free. */
BP_API bp_event *bp_event_new(bp_device *dev);
BP_API void bp_event_free(bp_event *event);
/* Marks the point in backend's queue that event stands for: the work queued so far. Recording
 * again moves the mark. The backend must be of the event's device. */
BP_API enum bp_status bp_event_record(bp_event *event, bp_backend *backend);
/* Makes backend's later work wait until the event's latest record (as of this call) has
 * happened; an event never recorded is no wait. A backend of the same plugin queues the wait
 * and returns; a backend of another plugin (the CPU's, say) cannot, and the caller blocks here
 * instead, as bp_event_synchronize. */
BP_API enum bp_status bp_event_wait(bp_event *event, bp_backend *backend);
/* Blocks the caller until the event has happened. */
BP_API enum bp_status bp_event_synchronize(bp_event *event);
/* bp_event_synchronize that waits at most timeout_ns nanoseconds (>= 0): BP_ERR_TIMEOUT, with
 * a sentence, when the deadline passes first (the event is unchanged; wait again or free it).
 * On a device without a deadline-aware event wait it waits without one, as
 * bp_backend_synchronize_timeout does. */
BP_API enum bp_status bp_event_synchronize_timeout(bp_event *event, int64_t timeout_ns);

/* ---- Registries ------------------------------------------------------------------------- */

BP_API const char *bp_registry_get_name(bp_registry *reg);
/* Only the devices whose answers passed the runtime's checks (bp-plugin.h) are counted and
 * handed out; a refused device's name and description are "". */
BP_API size_t bp_registry_get_device_count(bp_registry *reg);
BP_API bp_device *bp_registry_get_device(bp_registry *reg, size_t index);
/* A named optional feature ("bp_comm_init", "bp_cpu_repack_buffer_type", ...); NULL, without
 * an error being recorded, when the registry does not have it. Convert it to the documented
 * function pointer type; ISO C has no conversion from void * to a function pointer (a
 * -Wpedantic warning), so code that must compile cleanly copies the bytes instead:
 *     bp_comm_init_fn fn;
 *     void *p = bp_registry_get_proc_address(reg, "bp_comm_init");
 *     if (p != NULL)
 *         memcpy(&fn, &p, sizeof(fn));
 * as bp_meta_device_new in bp-meta.h does (POSIX guarantees the representations agree). Each
 * plugin's extras are declared in its own header (bp-cpu.h, bp-comm.h, bp-meta.h). */
BP_API void *bp_registry_get_proc_address(bp_registry *reg, const char *name);
BP_API void bp_registry_get_api_version(bp_registry *reg, int *major, int *minor);

/* ---- Plugins ---------------------------------------------------------------------------- *
 * Discovery looks at every file named backplane-<name>[-<variant>].so in each directory of
 * BP_PLUGIN_PATH (colon-separated; ignored in setuid/setgid processes), then in the configured
 * plugin directory (bp_default_plugin_dir(), or BP_PLUGIN_SYSTEM_PATH when set; empty = none).
 * BP_PLUGINS_ONLY / BP_PLUGINS_DISABLE (comma-separated <name>s) filter before anything is
 * opened. For each <name> the variant with the highest non-zero score is loaded. Every file and
 * directory considered gets a record in the load report. The lookups below run discovery once
 * (thread-safe) if it has not run yet. */

typedef struct bp_plugin bp_plugin;

enum bp_plugin_status {
    BP_PLUGIN_LOADED = 0,       /* in use */
    BP_PLUGIN_NOT_SELECTED = 1, /* a better variant (or an earlier file of the name) won */
    BP_PLUGIN_CANNOT_RUN = 2,   /* score 0 or CPU features missing */
    BP_PLUGIN_FILTERED = 3,     /* BP_PLUGINS_ONLY / BP_PLUGINS_DISABLE: never opened */
    BP_PLUGIN_REFUSED = 4,      /* unsafe permissions or owner, not a regular file, bad name;
                                 * or, beside a loaded plugin's record, one of its devices whose
                                 * answers break bp-plugin.h (a NULL name, ...): not used */
    BP_PLUGIN_FAILED = 5,       /* dlopen, entry point, ABI, init or duplicate-name failure */
    BP_PLUGIN_UNLOADED = 6,     /* was loaded, then unloaded */
};

struct bp_plugin_record {
    const char *path;    /* file or directory, its exact bytes (escape before printing) */
    const char *name;    /* <name> from the file name ("" for a directory) */
    const char *variant; /* <variant> or "" */
    int score;           /* -1 when never asked */
    enum bp_plugin_status status;
    const char *message; /* why (one sentence), or what was loaded; control chars escaped */
};

BP_API const char *bp_plugin_status_name(enum bp_plugin_status status);

/* Runs discovery once; later calls return the first result. BP_OK even when some plugins were
 * refused: the report says why. */
BP_API enum bp_status bp_plugin_load_all(void);
/* Considers the plugins of one directory (the environment filters still apply). */
BP_API enum bp_status bp_plugin_load_all_from(const char *dir);
/* Loads one file, whether or not its directory is on the search path; path must be absolute
 * (a relative one is BP_ERR_INVALID_ARG) and every directory on it passes the same checks as a
 * plugin directory. NULL with an error (and a report record) when it cannot be loaded. Owned by
 * the runtime. */
BP_API bp_plugin *bp_plugin_load(const char *path);
/* BP_ERR_BUSY while a buffer, backend or event of the plugin is alive; otherwise frees its
 * registry and devices (their pointers become invalid) and closes the shared object. The
 * handle itself stays valid (name, variant and path still answer; the registry is NULL), so
 * unloading it again is BP_ERR_INVALID_ARG with its path, never a use after free. */
BP_API enum bp_status bp_plugin_unload(bp_plugin *plugin);
BP_API size_t bp_plugin_count(void);
BP_API bp_plugin *bp_plugin_get(size_t index);
BP_API bp_plugin *bp_plugin_by_name(const char *name); /* case-insensitive <name> */
BP_API const char *bp_plugin_get_name(bp_plugin *plugin);
BP_API const char *bp_plugin_get_variant(bp_plugin *plugin);
BP_API const char *bp_plugin_get_path(bp_plugin *plugin);
BP_API bp_registry *bp_plugin_get_registry(bp_plugin *plugin);
/* Buffers, backends and events currently holding the plugin. */
BP_API int bp_plugin_get_refcount(bp_plugin *plugin);

/* The load report: one record per file or directory considered, in order. A record stays
 * valid for the life of the process. */
BP_API size_t bp_plugin_report_count(void);
BP_API const struct bp_plugin_record *bp_plugin_report_get(size_t index);

/* ---- Selection by name ------------------------------------------------------------------ */

BP_API size_t bp_registry_count(void);
BP_API bp_registry *bp_registry_get(size_t index);
/* Case-insensitive; NULL with an error listing the registries that exist. */
BP_API bp_registry *bp_registry_by_name(const char *name);
/* All devices of all registries, in load order. */
BP_API size_t bp_device_count(void);
BP_API bp_device *bp_device_get(size_t index);
/* Case-insensitive; NULL with an error listing the devices that exist. "NAME0" also names a
 * device called "NAME" that is the only device of its registry (the CPU plugin calls its one
 * device "CPU", and "CPU0" then finds it), so one name works on machines with one device or
 * several. */
BP_API bp_device *bp_device_by_name(const char *name);
/* The first device of that type, NULL with an error when there is none. */
BP_API bp_device *bp_device_by_type(enum bp_device_type type);
/* A backend on the device (or first device of the registry) called name: "CPU", "CUDA0",
 * "Meta(CPU0,CPU1)"; device names as bp_device_by_name takes them ("CPU0" for a lone "CPU").
 * Caller frees with bp_backend_free. */
BP_API bp_backend *bp_backend_init_by_name(const char *name, const char *params);
BP_API bp_backend *bp_backend_init_by_type(enum bp_device_type type, const char *params);
/* The first GPU, else the first accelerator, else the first CPU device. */
BP_API bp_backend *bp_backend_init_best(void);

#ifdef __cplusplus
}
#endif

#endif
