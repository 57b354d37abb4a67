/* host.c - the runtime's own host-memory buffer type and buffers over caller memory.
 *
 * Host buffers are plain aligned allocations, so every tensor operation is a memcpy/memset on
 * tensor->data. A zero-sized buffer still gets one aligned block so that its base is a valid,
 * unique address. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "backend-impl.h"

#define BP_HOST_ALIGNMENT 64

static void *host_get_base(bp_buffer *buf)
{
    return buf->context;
}

static void host_free_owned(bp_buffer *buf)
{
    free(buf->context);
}

static enum bp_status host_memset(bp_buffer *buf, bp_tensor *t, uint8_t value, size_t offset,
                                  size_t size)
{
    (void)buf;
    memset((char *)t->data + offset, value, size);
    return BP_OK;
}

static enum bp_status host_set(bp_buffer *buf, bp_tensor *t, const void *data, size_t offset,
                               size_t size)
{
    (void)buf;
    memmove((char *)t->data + offset, data, size); /* data may point into this buffer */
    return BP_OK;
}

static enum bp_status host_get(bp_buffer *buf, const bp_tensor *t, void *data, size_t offset,
                               size_t size)
{
    (void)buf;
    memmove(data, (const char *)t->data + offset, size);
    return BP_OK;
}

static bool host_cpy(bp_buffer *buf, const bp_tensor *src, bp_tensor *dst)
{
    (void)buf;
    if (!bp_buffer_is_host(src->buffer))
        return false;
    memmove(dst->data, src->data, bp_nbytes(src));
    return true;
}

static enum bp_status host_clear(bp_buffer *buf, uint8_t value)
{
    memset(buf->context, value, buf->size);
    return BP_OK;
}

static const struct bp_buffer_iface host_owned_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = host_free_owned,
    .get_base = host_get_base,
    .memset_tensor = host_memset,
    .set_tensor = host_set,
    .get_tensor = host_get,
    .cpy_tensor = host_cpy,
    .clear = host_clear,
};

/* Caller memory: the same operations, but freeing the buffer leaves the memory alone. */
static const struct bp_buffer_iface host_ptr_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .get_base = host_get_base,
    .memset_tensor = host_memset,
    .set_tensor = host_set,
    .get_tensor = host_get,
    .cpy_tensor = host_cpy,
    .clear = host_clear,
};

static const char *host_buft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "Host";
}

static size_t host_buft_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return BP_HOST_ALIGNMENT;
}

static bool host_buft_is_host(bp_buffer_type *buft)
{
    (void)buft;
    return true;
}

static bp_buffer *host_buft_alloc(bp_buffer_type *buft, size_t size)
{
    size_t rounded;
    if (!bp__add_size(size, BP_HOST_ALIGNMENT - 1, &rounded))
        return bp__error_null(BP_ERR_OUT_OF_MEMORY, "host buffer of %zu bytes is too large", size);
    rounded &= ~(size_t)(BP_HOST_ALIGNMENT - 1);
    if (rounded == 0)
        rounded = BP_HOST_ALIGNMENT;
    void *mem = bp__fault(rounded, "a host buffer") ? NULL
                                                     : aligned_alloc(BP_HOST_ALIGNMENT, rounded);
    if (mem == NULL)
        return bp__error_null(BP_ERR_OUT_OF_MEMORY,
                              "out of memory allocating a host buffer of %zu bytes", size);
    bp_buffer *buf = bp_buffer_new(buft, &host_owned_iface, mem, size);
    if (buf == NULL)
        free(mem);
    return buf;
}

static const struct bp_buffer_type_iface host_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = host_buft_name,
    .alloc_buffer = host_buft_alloc,
    .get_alignment = host_buft_alignment,
    .is_host = host_buft_is_host,
};

static struct bp_buffer_type host_buft = {
    .iface = &host_buft_iface,
    .context = NULL,
    .device = NULL,
};

bp_buffer_type *bp_host_buffer_type(void)
{
    return &host_buft;
}

bp_buffer *bp_buffer_from_host_ptr(void *ptr, size_t size)
{
    if (ptr == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_buffer_from_host_ptr: ptr is NULL");
    return bp_buffer_new(&host_buft, &host_ptr_iface, ptr, size);
}
