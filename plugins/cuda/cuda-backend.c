/* cuda-backend.c - the CUDA plugin's implementation library: backends (a stream, a cuBLAS
 * handle and an error flag each), events, memory queries, and the table the plugin loads it
 * for (bp_cuda_impl_open, the library's only exported symbol).
 *
 * Nothing here exits or aborts: every CUDA, cuBLAS and NCCL failure becomes a bp_status with the
 * library's own error string in bp_last_error().
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

/* ---- Backend ----------------------------------------------------------------------- */

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
        return bp_set_error(BP_ERR_OUT_OF_BOUNDS, "%s: a GET_ROWS, SET_ROWS or MUL_MAT_ID id was "
                            "out of range (those rows were left as zero, not written, or "
                            "undefined)", cb->cd->name);
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
    cudaFree(cb->moe_dev);
    free(cb->moe_host);
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
    /* The copy runs on the source's stream, after the work queued there that writes src and
     * before any later work there that overwrites it; the destination's stream first lets it
     * wait for the work already queued on the destination (which may still read dst), and then
     * waits for the copy before its own next work. */
    cudaEvent_t dst_done = NULL, copied = NULL;
    cudaError_t e = cudaSetDevice(db->cd->id);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&dst_done, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventRecord(dst_done, db->stream);
    if (e == cudaSuccess)
        e = cudaSetDevice(sb->cd->id);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(sb->stream, dst_done, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst->data, src->data, bp_nbytes(src), cudaMemcpyDefault, sb->stream);
    if (e == cudaSuccess)
        e = cudaEventRecord(copied, sb->stream);
    if (e == cudaSuccess)
        e = cudaSetDevice(db->cd->id);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(db->stream, copied, 0);
    /* Events are destroyed once the work recorded in them completes. */
    if (dst_done != NULL)
        cudaEventDestroy(dst_done);
    if (copied != NULL)
        cudaEventDestroy(copied);
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

static bp_backend *impl_init_backend(bp_device *dev, struct cuda_device *cd)
{
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

/* ---- Device memory and events ------------------------------------------------------------- */

static enum bp_status impl_get_memory(struct cuda_device *cd, size_t *free_bytes, size_t *total)
{
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(free_bytes, total);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, cd->name, "cudaMemGetInfo");
}

static void *impl_event_new(struct cuda_device *cd)
{
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

static void impl_event_free(void *event)
{
    cudaEventDestroy((cudaEvent_t)event);
}

static enum bp_status impl_event_sync(struct cuda_device *cd, void *event)
{
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)event);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, cd->name, "cudaEventSynchronize");
}

/* ---- The table ----------------------------------------------------------------------------- */

static void impl_close(void)
{
    bp_cuda_registry = NULL;
}

static const struct bp_cuda_impl impl = {
    .close = impl_close,
    .init_backend = impl_init_backend,
    .get_memory = impl_get_memory,
    .alloc_buffer = bp_cuda_alloc_buffer,
    .alloc_host_buffer = bp_cuda_alloc_host_buffer,
    .event_new = impl_event_new,
    .event_free = impl_event_free,
    .event_synchronize = impl_event_sync,
#ifdef BP_HAVE_NCCL
    .comm_init = bp_cuda_comm_init,
    .comm_allreduce = bp_cuda_comm_allreduce,
    .comm_free = bp_cuda_comm_free,
    .comm_unique_id = bp_cuda_comm_unique_id,
    .comm_init_rank = bp_cuda_comm_init_rank,
#endif
};

/* Exported (the library's only symbol); declared here for -Wmissing-prototypes. */
BP_API const struct bp_cuda_impl *bp_cuda_impl_open(int abi, struct cuda_registry *reg);

const struct bp_cuda_impl *bp_cuda_impl_open(int abi, struct cuda_registry *reg)
{
    if (abi != BP_CUDA_IMPL_ABI || reg == NULL) {
        bp_set_error(BP_ERR_PLUGIN, "CUDA: the implementation library " BP_CUDA_IMPL_FILE
                     " speaks interface %d, the plugin %d: they come from different builds "
                     "(install them together)", BP_CUDA_IMPL_ABI, abi);
        return NULL;
    }
    bp_cuda_registry = reg;
    return &impl;
}
