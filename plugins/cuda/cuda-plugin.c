/* cuda-plugin.c - the CUDA plugin: registry "CUDA", one device per GPU ("CUDA0", ...), device
 * and pinned host buffer types, backends with a stream and a cuBLAS handle each, events, and
 * NCCL collectives (bp_comm_*) when built with NCCL.
 *
 * Nothing here exits or aborts: every CUDA, cuBLAS and NCCL failure becomes a bp_status with the
 * library's own error string in bp_last_error(). A machine without a GPU or driver gives a
 * registry with no devices, and the reason is in the load report (bp_registry_note).
 *
 * Ordering: backend streams are ordinary (blocking) streams, so the synchronous buffer
 * functions, which use the legacy default stream, are ordered with every backend's work. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

struct cuda_registry *bp_cuda_registry;

enum bp_status bp_cuda_fail(cudaError_t e, const char *who, const char *what)
{
    /* The error is reported here, at the call that failed: clear CUDA's record of it, or the
     * next kernel launch's check (cudaGetLastError) would blame itself for it. */
    (void)cudaGetLastError();
    return bp_set_error(e == cudaErrorMemoryAllocation ? BP_ERR_OUT_OF_MEMORY : BP_ERR_BACKEND,
                        "%s: %s failed: %s", who, what, cudaGetErrorString(e));
}

enum bp_status bp_cuda_blas_fail(cublasStatus_t e, const char *who, const char *what)
{
    return bp_set_error(e == CUBLAS_STATUS_ALLOC_FAILED ? BP_ERR_OUT_OF_MEMORY : BP_ERR_BACKEND,
                        "%s: %s failed: %s", who, what, cublasGetStatusString(e));
}

/* ---- Backend: the rest ----------------------------------------------------------------------- */

static const char *cbe_name(bp_backend *be)
{
    return ((struct cuda_backend *)bp_backend_get_context(be))->cd->name;
}

static enum bp_status cbe_sync(bp_backend *be)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cb->stream);
    if (e != cudaSuccess)
        return bp_cuda_fail(e, cb->cd->name, "synchronising the stream");
    const int flag = *(volatile int *)cb->err_host;
    if (flag != CU_ERR_NONE) {
        *(volatile int *)cb->err_host = CU_ERR_NONE;
        return bp_set_error(BP_ERR_OUT_OF_BOUNDS, "%s: a GET_ROWS or SET_ROWS row id was out of "
                            "range (those rows were left as zero or not written)", cb->cd->name);
    }
    return BP_OK;
}

static void cbe_free(bp_backend *be)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaSetDevice(cb->cd->id);
    cudaStreamSynchronize(cb->stream);
    cublasDestroy(cb->blas);
    cudaStreamDestroy(cb->stream);
    cudaFree(cb->scratch);
    cudaFreeHost(cb->err_host);
    free(cb);
}

static enum bp_status cbe_set_async(bp_backend *be, bp_tensor *t, const void *d, size_t off,
                                    size_t n)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync((char *)t->data + off, d, n, cudaMemcpyHostToDevice, cb->stream);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, cb->cd->name, "asynchronous copy to the device");
}

static enum bp_status cbe_get_async(bp_backend *be, const bp_tensor *t, void *d, size_t off,
                                    size_t n)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d, (const char *)t->data + off, n, cudaMemcpyDeviceToHost, cb->stream);
    return e == cudaSuccess ? BP_OK
                            : bp_cuda_fail(e, cb->cd->name, "asynchronous copy from the device");
}

static const struct bp_backend_iface cuda_backend_iface;

bool bp_cuda_is_backend(bp_backend *be)
{
    return bp_cuda_registry != NULL && bp_device_get_registry(bp_backend_get_device(be)) == bp_cuda_registry->reg;
}

/* Device to device between two of our backends: dst's stream waits for src's, then copies. */
static bool cbe_cpy_async(bp_backend *src_be, bp_backend *dst_be, const bp_tensor *src,
                          bp_tensor *dst)
{
    if (!bp_cuda_is_backend(src_be) || !bp_cuda_is_backend(dst_be) || !bp_cuda_is_tensor(src) ||
        !bp_cuda_is_tensor(dst) || !contiguous(src) || !contiguous(dst))
        return false;
    struct cuda_backend *sb = bp_backend_get_context(src_be), *db = bp_backend_get_context(dst_be);
    cudaEvent_t ev;
    cudaError_t e = cudaSetDevice(sb->cd->id);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return bp_cuda_copy_failed(e, db->cd->name, "a queued copy");
    e = cudaEventRecord(ev, sb->stream);
    if (e == cudaSuccess)
        e = cudaSetDevice(db->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(db->stream, ev, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst->data, src->data, bp_nbytes(src), cudaMemcpyDefault, db->stream);
    cudaEventDestroy(ev); /* destroyed once the work recorded in it completes */
    return e == cudaSuccess ? true : bp_cuda_copy_failed(e, db->cd->name, "a queued copy");
}

static enum bp_status cbe_event_record(bp_backend *be, void *event)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaEventRecord((cudaEvent_t)event, cb->stream);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, cb->cd->name, "cudaEventRecord");
}

static enum bp_status cbe_event_wait(bp_backend *be, void *event)
{
    struct cuda_backend *cb = bp_backend_get_context(be);
    cudaError_t e = cudaSetDevice(cb->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(cb->stream, (cudaEvent_t)event, 0);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, cb->cd->name, "cudaStreamWaitEvent");
}

static const struct bp_backend_iface cuda_backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = cbe_name,
    .free = cbe_free,
    .set_tensor_async = cbe_set_async,
    .get_tensor_async = cbe_get_async,
    .cpy_tensor_async = cbe_cpy_async,
    .synchronize = cbe_sync,
    .graph_compute = bp_cuda_graph_compute,
    .event_record = cbe_event_record,
    .event_wait = cbe_event_wait,
};

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
    struct cuda_device *cd = bp_device_get_context(dev);
    size_t fr = 0, tot = cd->total_memory;
    if (cudaSetDevice(cd->id) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        fr = 0;
        tot = cd->total_memory;
    }
    *f = fr;
    *t = tot;
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

static bp_backend *cdev_init_backend(bp_device *dev, const char *params)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    if (params != NULL && params[0] != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, "%s: unknown backend parameters '%s' (the CUDA backend "
                     "takes none)", cd->name, params);
        return NULL;
    }
    struct cuda_backend *cb = calloc(1, sizeof(*cb));
    if (cb == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", cd->name);
        return NULL;
    }
    cb->cd = cd;
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaStreamCreate(&cb->stream);
    if (e != cudaSuccess) {
        bp_cuda_fail(e, cd->name, "creating a stream");
        free(cb);
        return NULL;
    }
    e = cudaHostAlloc((void **)&cb->err_host, sizeof(int), cudaHostAllocMapped);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer((void **)&cb->err_dev, cb->err_host, 0);
    if (e != cudaSuccess) {
        bp_cuda_fail(e, cd->name, "allocating the error flag");
        if (cb->err_host != NULL)
            cudaFreeHost(cb->err_host);
        cudaStreamDestroy(cb->stream);
        free(cb);
        return NULL;
    }
    *cb->err_host = CU_ERR_NONE;
    cublasStatus_t bs = cublasCreate(&cb->blas);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(cb->blas, cb->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        bp_cuda_blas_fail(bs, cd->name, "creating the cuBLAS handle");
        if (cb->blas != NULL)
            cublasDestroy(cb->blas);
        cudaFreeHost(cb->err_host);
        cudaStreamDestroy(cb->stream);
        free(cb);
        return NULL;
    }
    bp_backend *be = bp_backend_new(dev, &cuda_backend_iface, cb);
    if (be == NULL) {
        cublasDestroy(cb->blas);
        cudaFreeHost(cb->err_host);
        cudaStreamDestroy(cb->stream);
        free(cb);
    }
    return be;
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
    cudaEvent_t ev;
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        bp_cuda_fail(e, cd->name, "cudaEventCreate");
        return NULL;
    }
    return ev;
}

static void cdev_event_free(bp_device *dev, void *event)
{
    (void)dev;
    cudaEventDestroy((cudaEvent_t)event);
}

static enum bp_status cdev_event_sync(bp_device *dev, void *event)
{
    struct cuda_device *cd = bp_device_get_context(dev);
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, cd->name, "cudaEventSynchronize");
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

static void *creg_proc(bp_registry *reg, const char *name)
{
    (void)reg;
    if (strcmp(name, "bp_registry_note") == 0)
        return (void *)cuda_note;
#ifdef BP_HAVE_NCCL
    if (strcmp(name, "bp_comm_init") == 0)
        return (void *)bp_cuda_comm_init;
    if (strcmp(name, "bp_comm_allreduce") == 0)
        return (void *)bp_cuda_comm_allreduce;
    if (strcmp(name, "bp_comm_free") == 0)
        return (void *)bp_cuda_comm_free;
#endif
    return NULL;
}

static void creg_free(bp_registry *reg)
{
    (void)reg;
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
        free(c);
        bp_cuda_registry = NULL;
        return NULL;
    }
    for (int i = 0; i < c->n; i++) {
        struct cuda_device *d = &c->devices[i];
        d->dev = bp_device_new(c->reg, &cuda_device_iface, d);
        if (d->dev != NULL)
            d->buft = bp_buffer_type_new(d->dev, &bp_cuda_buft_iface, d);
        if (d->buft != NULL)
            d->host_buft = bp_buffer_type_new(d->dev, &bp_cuda_host_buft_iface, d);
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
