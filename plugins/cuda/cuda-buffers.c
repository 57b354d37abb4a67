/* cuda-buffers.c - the CUDA plugin's buffers (implementation library): device memory, and
 * pinned host memory for fast copies. The buffer types themselves (names, alignment) are the
 * plugin's, in cuda-plugin.c. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

/* ---- Device buffers ------------------------------------------------------------------------ */

struct cuda_buf {
    struct cuda_device *cd;
    void *ptr;
};

static void cbuf_free(bp_buffer *buf)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaSetDevice(b->cd->id);
    cudaFree(b->ptr);
    free(b);
}

static void *cbuf_base(bp_buffer *buf)
{
    return ((struct cuda_buf *)bp_buffer_get_context(buf))->ptr;
}

static enum bp_status cbuf_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemset((char *)t->data + off, v, n);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, b->cd->name, "cudaMemset");
}

static enum bp_status cbuf_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy((char *)t->data + off, d, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, b->cd->name, "copy to the device");
}

static enum bp_status cbuf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy(d, (const char *)t->data + off, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, b->cd->name, "copy from the device");
}

static enum bp_status cbuf_set_2d(bp_buffer *buf, bp_tensor *t, const void *d, size_t off,
                                  size_t width, size_t rows, size_t t_stride, size_t d_stride)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy2D((char *)t->data + off, t_stride, d, d_stride, width, rows,
                         cudaMemcpyHostToDevice);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, b->cd->name, "2-D copy to the device");
}

static enum bp_status cbuf_get_2d(bp_buffer *buf, const bp_tensor *t, void *d, size_t off,
                                  size_t width, size_t rows, size_t t_stride, size_t d_stride)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy2D(d, d_stride, (const char *)t->data + off, t_stride, width, rows,
                         cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, b->cd->name, "2-D copy from the device");
}

/* Device to device (any of our GPUs, through unified addressing) or host to device. */
/* A direct copy that failed in CUDA (not one this path does not handle): the error is
 * recorded here, where it happened, with CUDA's message (and CUDA's record of it cleared), and
 * false after an error tells the runtime the copy failed rather than was declined. */
bool bp_cuda_copy_failed(cudaError_t e, const char *who, const char *what)
{
    bp_cuda_fail(e, who, what);
    return false;
}

static bool cbuf_cpy(bp_buffer *buf, const bp_tensor *src, bp_tensor *dst)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    if (!contiguous(src) || !contiguous(dst) || src->buffer == NULL ||
        (!bp_cuda_is_tensor(src) && !bp_buffer_is_host(src->buffer)))
        return false;
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemcpy(dst->data, src->data, bp_nbytes(src), cudaMemcpyDefault);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? true : bp_cuda_copy_failed(e, b->cd->name, "a direct copy");
}

static enum bp_status cbuf_clear(bp_buffer *buf, uint8_t v)
{
    struct cuda_buf *b = bp_buffer_get_context(buf);
    cudaError_t e = cudaSetDevice(b->cd->id);
    if (e == cudaSuccess)
        e = cudaMemset(b->ptr, v, bp_buffer_get_size(buf));
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? BP_OK : bp_cuda_fail(e, b->cd->name, "cudaMemset");
}

static const struct bp_buffer_iface cuda_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = cbuf_free,
    .get_base = cbuf_base,
    .memset_tensor = cbuf_memset,
    .set_tensor = cbuf_set,
    .get_tensor = cbuf_get,
    .cpy_tensor = cbuf_cpy,
    .clear = cbuf_clear,
    .set_tensor_2d = cbuf_set_2d,
    .get_tensor_2d = cbuf_get_2d,
};

bp_buffer *bp_cuda_alloc_buffer(bp_buffer_type *buft, struct cuda_device *cd, size_t size)
{
    struct cuda_buf *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "%s: out of memory", cd->name);
        return NULL;
    }
    b->cd = cd;
    cudaError_t e = cudaSetDevice(cd->id);
    if (e == cudaSuccess)
        e = cudaMalloc(&b->ptr, size > 0 ? size : 1); /* a real address even for empty buffers */
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* reported here, not at the next launch */
        free(b);
        bp_set_error(e == cudaErrorMemoryAllocation ? BP_ERR_OUT_OF_MEMORY : BP_ERR_BACKEND,
                     "%s: cannot allocate %zu bytes of device memory: %s", cd->name, size,
                     cudaGetErrorString(e));
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &cuda_buffer_iface, b, size);
    if (buf == NULL) {
        cudaFree(b->ptr);
        free(b);
    }
    return buf;
}

/* ---- Pinned host buffers ------------------------------------------------------------------- */

struct host_buf {
    void *ptr;
    size_t size;
};

static void hbuf_free(bp_buffer *buf)
{
    struct host_buf *h = bp_buffer_get_context(buf);
    cudaFreeHost(h->ptr);
    free(h);
}

static void *hbuf_base(bp_buffer *buf)
{
    return ((struct host_buf *)bp_buffer_get_context(buf))->ptr;
}

static enum bp_status hbuf_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    (void)buf;
    memset((char *)t->data + off, v, n);
    return BP_OK;
}

static enum bp_status hbuf_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    (void)buf;
    memcpy((char *)t->data + off, d, n);
    return BP_OK;
}

static enum bp_status hbuf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    (void)buf;
    memcpy(d, (const char *)t->data + off, n);
    return BP_OK;
}

static enum bp_status hbuf_clear(bp_buffer *buf, uint8_t v)
{
    struct host_buf *h = bp_buffer_get_context(buf);
    memset(h->ptr, v, h->size);
    return BP_OK;
}

static const struct bp_buffer_iface host_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = hbuf_free,
    .get_base = hbuf_base,
    .memset_tensor = hbuf_memset,
    .set_tensor = hbuf_set,
    .get_tensor = hbuf_get,
    .clear = hbuf_clear,
};

bp_buffer *bp_cuda_alloc_host_buffer(bp_buffer_type *buft, size_t size)
{
    struct host_buf *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA_Host: out of memory");
        return NULL;
    }
    h->size = size;
    cudaError_t e = cudaMallocHost(&h->ptr, size > 0 ? size : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* reported here, not at the next launch */
        free(h);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA_Host: cannot allocate %zu bytes of pinned "
                     "host memory: %s", size, cudaGetErrorString(e));
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &host_buffer_iface, h, size);
    if (buf == NULL) {
        cudaFreeHost(h->ptr);
        free(h);
    }
    return buf;
}
