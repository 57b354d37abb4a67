/* test-device.c - private to tests/: the fake accelerator of test-device.h. */
#include "test-device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/ref.h"

struct test_device_stats test_device_stats;
static bool op_subset;
static bool host_buffer;

void test_device_set_host_buffer(bool on)
{
    host_buffer = on;
}

void test_device_set_op_subset(bool on)
{
    op_subset = on;
}

static int declined_op = -1;

void test_device_set_declined_op(int op)
{
    declined_op = op;
}

#define MAX_DEVICES 4

struct accel;

/* One device: its name, and the buffer type made for it. */
struct accel_dev {
    struct accel *a;
    char name[32];
    bp_device *dev;
    bp_buffer_type *buft;
    bp_buffer_type *host_buft; /* "pinned" host memory, as a GPU offers */
};

struct accel {
    size_t max_buffer;
    char reg_name[32];
    bp_registry *reg;
    int n_devices;
    struct accel_dev devs[MAX_DEVICES];
};

/* ---- Lies (test_device_set_lie) ----------------------------------------------------------- */

static const char *lie;

void test_device_set_lie(const char *what)
{
    lie = what;
}

static bool lies(const char *what)
{
    return lie != NULL && strcmp(lie, what) == 0;
}

/* Whether d, the first device of its registry, tells the lie `what`. */
static bool dev_lies(const struct accel_dev *d, const char *what)
{
    return lies(what) && d == &d->a->devs[0];
}

static bool buf_lies(bp_buffer *buf, const char *what)
{
    return dev_lies(bp_buffer_type_get_context(bp_buffer_get_type(buf)), what);
}

/* ---- Buffers ---------------------------------------------------------------------------- */

static void *buf_base(bp_buffer *buf)
{
    if (buf_lies(buf, "base-null"))
        return NULL;
    if (buf_lies(buf, "base-misaligned"))
        return (char *)bp_buffer_get_context(buf) + 1;
    return bp_buffer_get_context(buf);
}

static void buf_free(bp_buffer *buf)
{
    test_device_stats.buffers_freed++;
    free(bp_buffer_get_context(buf));
}

static enum bp_status buf_memset(bp_buffer *buf, bp_tensor *t, uint8_t v, size_t off, size_t n)
{
    (void)buf;
    test_device_stats.memset_calls++;
    memset((char *)t->data + off, v, n);
    return BP_OK;
}

static enum bp_status buf_set(bp_buffer *buf, bp_tensor *t, const void *d, size_t off, size_t n)
{
    (void)buf;
    test_device_stats.set_calls++;
    memcpy((char *)t->data + off, d, n);
    return BP_OK;
}

static enum bp_status buf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    if (buf_lies(buf, "get-tensor-fails"))
        return bp_set_error(BP_ERR_BACKEND, "TestAccel: reading %zu bytes back failed "
                            "(injected)", n);
    test_device_stats.get_calls++;
    memcpy(d, (const char *)t->data + off, n);
    return BP_OK;
}

static int copies_to_fail;

void test_device_fail_copies(int n)
{
    copies_to_fail = n;
}

/* Direct copies only between buffers of this device, as a GPU's device-to-device copy. */
static bool buf_cpy(bp_buffer *buf, const bp_tensor *src, bp_tensor *dst)
{
    if (bp_buffer_get_type(src->buffer) != bp_buffer_get_type(buf))
        return false;
    if (copies_to_fail > 0) {
        copies_to_fail--;
        bp_set_error(BP_ERR_BACKEND, "TestAccel: the direct copy failed (injected)");
        return false;
    }
    test_device_stats.cpy_calls++;
    memcpy(dst->data, src->data, bp_nbytes(src));
    return true;
}

static enum bp_status buf_clear(bp_buffer *buf, uint8_t v)
{
    test_device_stats.clear_calls++;
    memset(bp_buffer_get_context(buf), v, bp_buffer_get_size(buf));
    return BP_OK;
}

static const struct bp_buffer_iface accel_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = buf_free,
    .get_base = buf_base,
    .memset_tensor = buf_memset,
    .set_tensor = buf_set,
    .get_tensor = buf_get,
    .cpy_tensor = buf_cpy,
    .clear = buf_clear,
};

static const char *buft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "TestAccel";
}

static size_t buft_alignment(bp_buffer_type *buft)
{
    const struct accel_dev *d = bp_buffer_type_get_context(buft);
    if (dev_lies(d, "align-0"))
        return 0;
    if (dev_lies(d, "align-3"))
        return 3;
    if (dev_lies(d, "align-huge"))
        return (size_t)1 << 40;
    return 128;
}

static size_t buft_max_size(bp_buffer_type *buft)
{
    struct accel_dev *d = bp_buffer_type_get_context(buft);
    if (dev_lies(d, "max-size-0"))
        return 0;
    return d->a->max_buffer ? d->a->max_buffer : SIZE_MAX;
}

/* Pads every tensor to a multiple of 256 bytes, as some devices do. */
static size_t buft_alloc_size(bp_buffer_type *buft, const bp_tensor *t)
{
    const struct accel_dev *d = bp_buffer_type_get_context(buft);
    if (dev_lies(d, "alloc-size-0"))
        return 0;
    if (dev_lies(d, "alloc-size-small"))
        return bp_nbytes(t) / 2;
    return (bp_nbytes(t) + 255) / 256 * 256;
}

static bp_buffer *buft_alloc(bp_buffer_type *buft, size_t size)
{
    void *mem = aligned_alloc(128, size ? (size + 127) / 128 * 128 : 128);
    if (mem == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "TestAccel: out of device memory");
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &accel_buffer_iface, mem, size);
    if (buf == NULL)
        free(mem);
    return buf;
}

static const struct bp_buffer_type_iface accel_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = buft_name,
    .alloc_buffer = buft_alloc,
    .get_alignment = buft_alignment,
    .get_max_size = buft_max_size,
    .get_alloc_size = buft_alloc_size,
};

/* ---- Host buffers ("pinned" memory: plain host memory that says it is host memory) ------- */

static void *hbuf_base(bp_buffer *buf)
{
    return bp_buffer_get_context(buf);
}

static void hbuf_free(bp_buffer *buf)
{
    free(bp_buffer_get_context(buf));
    test_device_stats.host_buffers_freed++;
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
    memmove((char *)t->data + off, d, n);
    return BP_OK;
}

static enum bp_status hbuf_get(bp_buffer *buf, const bp_tensor *t, void *d, size_t off, size_t n)
{
    (void)buf;
    memmove(d, (const char *)t->data + off, n);
    return BP_OK;
}

static enum bp_status hbuf_clear(bp_buffer *buf, uint8_t v)
{
    memset(bp_buffer_get_context(buf), v, bp_buffer_get_size(buf));
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

static const char *hbuft_name(bp_buffer_type *buft)
{
    (void)buft;
    return "TestAccel_Host";
}

static int host_buffers_to_fail;

int test_device_fail_host_buffers(int n)
{
    const int left = host_buffers_to_fail;
    host_buffers_to_fail = n;
    return left;
}

static bp_buffer *hbuft_alloc(bp_buffer_type *buft, size_t size)
{
    if (host_buffers_to_fail > 0) {
        host_buffers_to_fail--;
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "TestAccel_Host: cannot pin %zu bytes (injected)",
                     size);
        return NULL;
    }
    void *mem = aligned_alloc(64, size ? (size + 63) / 64 * 64 : 64);
    if (mem == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "TestAccel_Host: out of memory");
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &host_buffer_iface, mem, size);
    if (buf == NULL)
        free(mem);
    else
        test_device_stats.host_buffers_allocated++;
    return buf;
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

static const struct bp_buffer_type_iface accel_host_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = hbuft_name,
    .alloc_buffer = hbuft_alloc,
    .get_alignment = hbuft_alignment,
    .is_host = hbuft_is_host,
};

/* ---- Backend ---------------------------------------------------------------------------- */

static const char *be_name(bp_backend *be)
{
    struct accel_dev *d = bp_device_get_context(bp_backend_get_device(be));
    return d->name;
}

static void be_free(bp_backend *be)
{
    test_device_stats.backends_freed++;
    free(bp_backend_get_context(be));
}

static enum bp_status be_sync(bp_backend *be)
{
    (void)be;
    test_device_stats.syncs++;
    return BP_OK;
}

static void (*compute_hook)(void *);
static void *compute_hook_arg;

void test_device_set_compute_hook(void (*hook)(void *), void *arg)
{
    compute_hook = hook;
    compute_hook_arg = arg;
}

static int wrong_op = -1;

void test_device_set_wrong_op(int op)
{
    wrong_op = op;
}

static enum bp_status be_compute(bp_backend *be, bp_graph *g)
{
    (void)be;
    if (compute_hook != NULL)
        compute_hook(compute_hook_arg);
    test_device_stats.computes++;
    if (!ref_compute_graph(g))
        return bp_set_error(BP_ERR_UNSUPPORTED, "TestAccel: the graph has an op it cannot run");
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) { /* a broken kernel, when asked for */
        bp_tensor *n = bp_graph_get_node(g, i);
        if ((int)n->op == wrong_op && n->type == BP_TYPE_F32 && bp_nelements(n) > 0)
            *(float *)n->data += 1.0f;
    }
    return BP_OK;
}

static enum bp_status be_event_record(bp_backend *be, void *event)
{
    (void)be;
    test_device_stats.events_recorded++;
    *(int *)event = 1;
    return BP_OK;
}

static enum bp_status be_event_wait(bp_backend *be, void *event)
{
    (void)be;
    (void)event;
    test_device_stats.events_waited++;
    return BP_OK;
}

/* "Queued" transfers: this device has no queue, so they complete at once, but they go through
 * the backend's async entry points so the runtime's and scheduler's use of them is exercised. */
static enum bp_status be_set_async(bp_backend *be, bp_tensor *t, const void *d, size_t off,
                                   size_t n)
{
    (void)be;
    test_device_stats.set_calls++;
    memcpy((char *)t->data + off, d, n);
    return BP_OK;
}

static enum bp_status be_get_async(bp_backend *be, const bp_tensor *t, void *d, size_t off,
                                   size_t n)
{
    (void)be;
    test_device_stats.get_calls++;
    memcpy(d, (const char *)t->data + off, n);
    return BP_OK;
}

/* From host memory or this device into this device; anything else is the runtime's job. */
static bool be_cpy_async(bp_backend *from, bp_backend *to, const bp_tensor *src, bp_tensor *dst)
{
    (void)from;
    (void)to;
    if (!bp_buffer_is_host(src->buffer) &&
        bp_buffer_get_type(src->buffer) != bp_buffer_get_type(dst->buffer))
        return false;
    if (copies_to_fail > 0) {
        copies_to_fail--;
        bp_set_error(BP_ERR_BACKEND, "TestAccel: the queued copy failed (injected)");
        return false;
    }
    test_device_stats.cpy_calls++;
    memcpy(dst->data, src->data, bp_nbytes(src));
    return true;
}

static const struct bp_backend_iface accel_backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = be_name,
    .free = be_free,
    .set_tensor_async = be_set_async,
    .get_tensor_async = be_get_async,
    .cpy_tensor_async = be_cpy_async,
    .synchronize = be_sync,
    .graph_compute = be_compute,
    .event_record = be_event_record,
    .event_wait = be_event_wait,
};

/* ---- Device ----------------------------------------------------------------------------- */

static const char *dev_name(bp_device *dev)
{
    struct accel_dev *d = bp_device_get_context(dev);
    if (dev_lies(d, "name-null"))
        return NULL;
    if (dev_lies(d, "name-empty"))
        return "";
    if (dev_lies(d, "name-control"))
        return "LIAR\x1b[31m0";
    if (dev_lies(d, "name-utf8"))
        return "LIAR\xff" "0";
    return d->name;
}

static const char *dev_desc(bp_device *dev)
{
    if (dev_lies(bp_device_get_context(dev), "desc-null"))
        return NULL;
    return "backplane test accelerator";
}

static void dev_memory(bp_device *dev, size_t *f, size_t *t)
{
    (void)dev;
#ifdef MODE_OP_SUBSET /* the accel plugin: room for the models `backplane run` tests */
    *f = (size_t)1 << 30;
    *t = (size_t)2 << 30;
#else
    *f = 3u << 20;
    *t = 4u << 20;
#endif
}

static enum bp_device_type dev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_ACCEL;
}

/* params: "fail" makes creation fail without a reason, anything else is accepted. */
static bp_backend *dev_init_backend(bp_device *dev, const char *params)
{
    if (params != NULL && strcmp(params, "fail") == 0)
        return NULL;
    int *ctx = malloc(sizeof(int));
    bp_backend *be = bp_backend_new(dev, &accel_backend_iface, ctx);
    if (be == NULL)
        free(ctx);
    return be;
}

static bp_buffer_type *dev_buft(bp_device *dev)
{
    struct accel_dev *d = bp_device_get_context(dev);
    return d->buft;
}

static bp_buffer_type *dev_host_buft(bp_device *dev)
{
    struct accel_dev *d = bp_device_get_context(dev);
    return d->host_buft;
}

static bool dev_supports_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    if ((int)op->op == declined_op)
        return false;
    if (!op_subset)
        return op->op != BP_OP_ROPE; /* one op it says no to */
    switch (op->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true;
    case BP_OP_MUL_MAT: /* like a device without 4-bit kernels */
    case BP_OP_MUL_MAT_ID:
        return op->src[0]->type != BP_TYPE_Q4_0;
    case BP_OP_ADD:
    case BP_OP_MUL:
    case BP_OP_SCALE:
    case BP_OP_RMS_NORM:
    case BP_OP_SOFT_MAX:
    case BP_OP_CONT:
        return true;
    default:
        return false;
    }
}

/* Like a GPU: the expert products are worth running here even when the stacked weights live in
 * host memory (the scheduler then copies the experts in use). */
static bool dev_offload_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    return op->op == BP_OP_MUL_MAT_ID;
}

static bool dev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    return buft == dev_buft(dev);
}

static void *dev_event_new(bp_device *dev)
{
    (void)dev;
    return calloc(1, sizeof(int));
}

static void dev_event_free(bp_device *dev, void *event)
{
    (void)dev;
    free(event);
}

static enum bp_status dev_event_sync(bp_device *dev, void *event)
{
    (void)dev;
    return *(int *)event ? BP_OK : bp_set_error(BP_ERR_BACKEND, "TestAccel: event never recorded");
}

static const struct bp_device_iface accel_device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = dev_name,
    .get_description = dev_desc,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_buft,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
    .offload_op = dev_offload_op,
    .event_new = dev_event_new,
    .event_free = dev_event_free,
    .event_synchronize = dev_event_sync,
};

/* The same, offering the host buffer type. */
static const struct bp_device_iface accel_device_host_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = dev_name,
    .get_description = dev_desc,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_buft,
    .get_host_buffer_type = dev_host_buft,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
    .offload_op = dev_offload_op,
    .event_new = dev_event_new,
    .event_free = dev_event_free,
    .event_synchronize = dev_event_sync,
};

/* ---- Registry --------------------------------------------------------------------------- */

static const char *reg_name(bp_registry *reg)
{
    struct accel *a = bp_registry_get_context(reg);
    return lies("reg-name-null") ? NULL : a->reg_name;
}

static size_t reg_count(bp_registry *reg)
{
    struct accel *a = bp_registry_get_context(reg);
    return (size_t)a->n_devices + (lies("count-too-many") ? 5 : 0);
}

/* (The runtime never asks past the devices made for the registry, whatever the count says.) */
static bp_device *reg_device(bp_registry *reg, size_t i)
{
    struct accel *a = bp_registry_get_context(reg);
    return i == 0 && lies("device-null") ? NULL : a->devs[i].dev;
}

int test_device_answer(void)
{
    return 42;
}

/* What a registry made with no devices says about it (as the CUDA plugin does without a GPU). */
static const char *empty_note(void)
{
    return "test accelerator: configured with no devices";
}

static void *reg_proc(bp_registry *reg, const char *name)
{
    const struct accel *a = bp_registry_get_context(reg);
    if (strcmp(name, "bp_registry_note") == 0)
        return a->n_devices == 0 ? (void *)empty_note : NULL;
    if (strcmp(name, "test_device_fail_host_buffers") == 0)
        return (void *)test_device_fail_host_buffers;
    return strcmp(name, "test_device_answer") == 0 ? (void *)test_device_answer : NULL;
}

static void reg_free(bp_registry *reg)
{
    free(bp_registry_get_context(reg));
}

static const struct bp_registry_iface accel_registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = reg_name,
    .get_device_count = reg_count,
    .get_device = reg_device,
    .get_proc_address = reg_proc,
    .free = reg_free,
};

bp_registry *test_device_registry_new_named(const char *reg_name, const char *dev_prefix,
                                            int n_devices, size_t max_buffer)
{
    if (n_devices < 0 || n_devices > MAX_DEVICES)
        return NULL;
    struct accel *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    a->max_buffer = max_buffer;
    a->n_devices = n_devices;
    snprintf(a->reg_name, sizeof(a->reg_name), "%s", reg_name);
    a->reg = bp_registry_new(&accel_registry_iface, a);
    if (a->reg == NULL) {
        free(a);
        return NULL;
    }
    for (int i = 0; i < n_devices; i++) {
        struct accel_dev *d = &a->devs[i];
        d->a = a;
        snprintf(d->name, sizeof(d->name), "%s%d", dev_prefix, i);
        d->dev = bp_device_new(a->reg, host_buffer ? &accel_device_host_iface : &accel_device_iface, d);
        d->buft = d->dev ? bp_buffer_type_new(d->dev, &accel_buft_iface, d) : NULL;
        if (d->buft != NULL && host_buffer)
            d->host_buft = bp_buffer_type_new(d->dev, &accel_host_buft_iface, d);
        if (d->buft == NULL || (host_buffer && d->host_buft == NULL)) {
            bp_registry_free(a->reg); /* frees a through reg_free */
            return NULL;
        }
    }
    return a->reg;
}

bp_registry *test_device_registry_new(size_t max_buffer)
{
    return test_device_registry_new_named("TestAccel", "ACCEL", 1, max_buffer);
}
