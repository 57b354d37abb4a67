/* example-plugin.c - a complete backplane plugin in one file: registry "Example" with one device
 * "EXAMPLE0" that computes ADD, MUL and SCALE on f32 tensors in host memory. The scheduler runs
 * those ops here and everything else on the CPU, so it can serve a whole model
 * (`backplane run -d EXAMPLE0`). docs/user-guide.md walks through it.
 *
 * Build it like any plugin (a shared object named backplane-<name>.so that links libbackplane):
 *   cc -shared -fPIC -o backplane-example.so example-plugin.c $(pkg-config --cflags --libs backplane)
 * and drop it into a directory on BP_PLUGIN_PATH (or the configured plugin directory). */
#include <stdlib.h>
#include <string.h>

#include <backplane/bp-plugin.h>

/* ---- The kernels ------------------------------------------------------------------------- */

/* Element i of t, for f32 tensors whose dimension 0 is contiguous. */
static float *at(const bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (float *)((char *)t->data + i0 * 4 + i1 * (int64_t)t->nb[1] + i2 * (int64_t)t->nb[2] +
                     i3 * (int64_t)t->nb[3]);
}

/* dst = a (op) b, where b is broadcast over a (its sizes divide a's); or dst = a * scale. */
static void compute(bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const float scale = dst->op == BP_OP_SCALE ? bp_get_op_param_f32(dst, 0) : 0.0f;
    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < dst->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < dst->ne[0]; i0++) {
                    const float x = *at(a, i0, i1, i2, i3);
                    float r;
                    if (dst->op == BP_OP_SCALE) {
                        r = x * scale;
                    } else {
                        const float y = *at(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2],
                                            i3 % b->ne[3]);
                        r = dst->op == BP_OP_ADD ? x + y : x * y;
                    }
                    *at(dst, i0, i1, i2, i3) = r; /* in place is fine: element by element */
                }
}

/* Exactly what compute() does: anything else is declined and runs elsewhere. */
static bool supported(const bp_tensor *op)
{
    switch (op->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true; /* views compute nothing */
    case BP_OP_ADD:
    case BP_OP_MUL:
    case BP_OP_SCALE:
        for (int s = 0; s < (op->op == BP_OP_SCALE ? 1 : 2); s++)
            if (op->src[s]->type != BP_TYPE_F32 || op->src[s]->nb[0] != sizeof(float))
                return false;
        return op->type == BP_TYPE_F32 && op->nb[0] == sizeof(float);
    default:
        return false;
    }
}

/* ---- The backend: runs a graph's nodes in order -------------------------------------------- */

static const char *be_name(bp_backend *be)
{
    (void)be;
    return "EXAMPLE0";
}

static enum bp_status be_compute(bp_backend *be, bp_graph *g)
{
    (void)be;
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        bp_tensor *node = bp_graph_get_node(g, i);
        if (!supported(node)) /* the scheduler never sends these; a direct caller might */
            return bp_set_error(BP_ERR_UNSUPPORTED, "EXAMPLE0: %s ('%s') is not supported",
                                bp_op_name(node->op), node->name);
        if (node->op == BP_OP_ADD || node->op == BP_OP_MUL || node->op == BP_OP_SCALE)
            compute(node);
    }
    return BP_OK;
}

static const struct bp_backend_iface backend_iface = {
    .struct_size = sizeof(struct bp_backend_iface),
    .get_name = be_name,
    .graph_compute = be_compute, /* synchronous: no async members, no events */
};

/* ---- The device ---------------------------------------------------------------------------- */

static const char *dev_name(bp_device *dev)
{
    (void)dev;
    return "EXAMPLE0";
}

static const char *dev_description(bp_device *dev)
{
    (void)dev;
    return "example plugin: ADD, MUL and SCALE in plain C";
}

static void dev_memory(bp_device *dev, size_t *free_bytes, size_t *total_bytes)
{
    (void)dev;
    *free_bytes = *total_bytes = 0; /* host memory: no device limit to report */
}

static enum bp_device_type dev_type(bp_device *dev)
{
    (void)dev;
    return BP_DEVICE_TYPE_ACCEL;
}

static bp_backend *dev_init_backend(bp_device *dev, const char *params)
{
    if (params != NULL && params[0] != '\0') {
        bp_set_error(BP_ERR_INVALID_ARG, "EXAMPLE0: it takes no parameters, not '%s'", params);
        return NULL;
    }
    return bp_backend_new(dev, &backend_iface, NULL);
}

/* Tensors live in ordinary host memory: the runtime's host buffer type. */
static bp_buffer_type *dev_buffer_type(bp_device *dev)
{
    (void)dev;
    return bp_host_buffer_type();
}

static bool dev_supports_op(bp_device *dev, const bp_tensor *op)
{
    (void)dev;
    return supported(op);
}

static bool dev_supports_buft(bp_device *dev, bp_buffer_type *buft)
{
    (void)dev;
    return bp_buffer_type_is_host(buft);
}

static const struct bp_device_iface device_iface = {
    .struct_size = sizeof(struct bp_device_iface),
    .get_name = dev_name,
    .get_description = dev_description,
    .get_memory = dev_memory,
    .get_type = dev_type,
    .init_backend = dev_init_backend,
    .get_buffer_type = dev_buffer_type,
    .supports_op = dev_supports_op,
    .supports_buft = dev_supports_buft,
};

/* ---- The registry and the descriptor the loader looks for ------------------------------------ */

static bp_device *the_device;

static const char *reg_name(bp_registry *reg)
{
    (void)reg;
    return "Example";
}

static size_t reg_device_count(bp_registry *reg)
{
    (void)reg;
    return 1;
}

static bp_device *reg_device(bp_registry *reg, size_t index)
{
    (void)reg;
    (void)index;
    return the_device;
}

static const struct bp_registry_iface registry_iface = {
    .struct_size = sizeof(struct bp_registry_iface),
    .get_name = reg_name,
    .get_device_count = reg_device_count,
    .get_device = reg_device,
};

/* Called once when the loader has checked the descriptor: describe, do not start work yet. */
static bp_registry *example_init(void)
{
    bp_registry *reg = bp_registry_new(&registry_iface, NULL);
    if (reg == NULL)
        return NULL;
    the_device = bp_device_new(reg, &device_iface, NULL);
    if (the_device == NULL) {
        bp_registry_free(reg);
        return NULL;
    }
    return reg;
}

/* name (matches the file name backplane-example.so), variant, CPU features needed, init, score */
BP_PLUGIN_DEFINE("example", "", 0, example_init, NULL);
