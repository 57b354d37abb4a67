/* tensor.c - contexts, tensor creation, names, flags and shape queries.
 *
 * A context is one fixed array of tensor structs allocated up front: tensors never move, so
 * pointers to them stay valid for the life of the context, and running out of room is a clean
 * BP_ERR_CAPACITY instead of a reallocation that would invalidate every pointer. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "bp-impl.h"

struct bp_context {
    size_t capacity;
    size_t n_tensors;
    bp_tensor *tensors;
};

bp_context *bp_context_new(size_t max_tensors)
{
    if (max_tensors == 0)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_context_new: max_tensors must be at least 1");

    bp_context *ctx = bp__calloc(1, sizeof(*ctx), "a tensor context");
    if (ctx == NULL)
        return NULL;
    ctx->tensors = bp__calloc(max_tensors, sizeof(bp_tensor), "the tensors of a context");
    if (ctx->tensors == NULL) {
        bp__free(ctx);
        return NULL;
    }
    ctx->capacity = max_tensors;
    return ctx;
}

void bp_context_free(bp_context *ctx)
{
    if (ctx == NULL)
        return;
    bp__free(ctx->tensors);
    bp__free(ctx);
}

void bp_context_reset(bp_context *ctx)
{
    if (ctx != NULL)
        ctx->n_tensors = 0;
}

size_t bp_context_get_n_tensors(const bp_context *ctx)
{
    return ctx ? ctx->n_tensors : 0;
}

size_t bp_context_get_capacity(const bp_context *ctx)
{
    return ctx ? ctx->capacity : 0;
}

bp_tensor *bp_context_get_tensor(const bp_context *ctx, size_t i)
{
    if (ctx == NULL || i >= ctx->n_tensors)
        return NULL;
    return &ctx->tensors[i];
}

bp_tensor *bp_context_find_tensor(const bp_context *ctx, const char *name)
{
    if (ctx == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < ctx->n_tensors; i++) {
        if (strcmp(ctx->tensors[i].name, name) == 0)
            return &ctx->tensors[i];
    }
    return NULL;
}

/* Contiguous strides for shape ne. False when the byte size or any stride (including those of
 * the empty dimensions, which still multiply) exceeds BP_MAX_TENSOR_BYTES. */
static bool contiguous_strides(enum bp_type type, const int64_t ne[BP_MAX_DIMS],
                               size_t nb[BP_MAX_DIMS])
{
    nb[0] = bp_type_size(type);
    size_t row = bp_row_size(type, ne[0]);
    if (ne[0] != 0 && row == 0)
        return false;
    nb[1] = row;
    for (int i = 2; i < BP_MAX_DIMS; i++) {
        if (!bp__mul_size(nb[i - 1], (size_t)ne[i - 1], &nb[i]) || nb[i] > BP_MAX_TENSOR_BYTES)
            return false;
    }
    size_t total;
    return row <= BP_MAX_TENSOR_BYTES && bp__mul_size(nb[3], (size_t)ne[3], &total) &&
           total <= BP_MAX_TENSOR_BYTES;
}

bp_tensor *bp__new_tensor_impl(bp_context *ctx, enum bp_type type, const int64_t ne[BP_MAX_DIMS],
                               const char *op_name)
{
    if (ctx == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "%s: context is NULL", op_name);
    const struct bp_type_traits *tr = bp_type_get_traits(type);
    if (tr == NULL)
        return bp__error_null(BP_ERR_TYPE, "%s: type %d is not a backplane type", op_name,
                              (int)type);
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (ne[i] < 0)
            return bp__error_null(BP_ERR_SHAPE,
                                  "%s: dimension %d has negative size %lld", op_name, i,
                                  (long long)ne[i]);
    }
    if (ne[0] % tr->block_size != 0)
        return bp__error_null(BP_ERR_SHAPE,
                              "%s: row length %lld of a %s tensor is not a multiple of its "
                              "block size %lld",
                              op_name, (long long)ne[0], tr->name, (long long)tr->block_size);
    size_t nb[BP_MAX_DIMS];
    int64_t count, rows;
    const int64_t outer[BP_MAX_DIMS] = {1, ne[1], ne[2], ne[3]};
    /* Every count and byte size a kernel or allocator derives from the shape must fit, with
     * room for alignment padding: checked here once, so nothing downstream can wrap. */
    if (!bp__count_elements(ne, &count) || !bp__count_elements(outer, &rows) ||
        !contiguous_strides(type, ne, nb))
        return bp__error_null(BP_ERR_SHAPE,
                              "%s: a %s tensor of [%lld, %lld, %lld, %lld] elements is too "
                              "large: its bytes, a stride or its element or row count would pass "
                              "BP_MAX_TENSOR_BYTES (%zu) or 2^63",
                              op_name, tr->name, (long long)ne[0], (long long)ne[1],
                              (long long)ne[2], (long long)ne[3], (size_t)BP_MAX_TENSOR_BYTES);
    if (ctx->n_tensors >= ctx->capacity)
        return bp__error_null(BP_ERR_CAPACITY,
                              "%s: the context is full (%zu tensors); create it with a larger "
                              "max_tensors",
                              op_name, ctx->capacity);

    bp_tensor *t = &ctx->tensors[ctx->n_tensors++];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->op = BP_OP_NONE;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        t->ne[i] = ne[i];
        t->nb[i] = nb[i];
    }
    return t;
}

bp_tensor *bp__view_of(bp_context *ctx, bp_tensor *a, const char *op_name)
{
    int64_t ne[BP_MAX_DIMS] = {a->ne[0], a->ne[1], a->ne[2], a->ne[3]};
    bp_tensor *t = bp__new_tensor_impl(ctx, a->type, ne, op_name);
    if (t == NULL)
        return NULL;
    memcpy(t->nb, a->nb, sizeof(t->nb));
    t->view_src = a->view_src ? a->view_src : a;
    t->view_offs = a->view_offs;
    t->buffer = a->buffer;
    if (a->data != NULL)
        t->data = a->data;
    return t;
}

bp_tensor *bp_new_tensor(bp_context *ctx, enum bp_type type, int n_dims, const int64_t *ne)
{
    if (n_dims < 1 || n_dims > BP_MAX_DIMS)
        return bp__error_null(BP_ERR_SHAPE, "bp_new_tensor: n_dims is %d, expected 1 to %d",
                              n_dims, BP_MAX_DIMS);
    if (ne == NULL)
        return bp__error_null(BP_ERR_INVALID_ARG, "bp_new_tensor: ne is NULL");
    int64_t full[BP_MAX_DIMS] = {1, 1, 1, 1};
    for (int i = 0; i < n_dims; i++)
        full[i] = ne[i];
    return bp__new_tensor_impl(ctx, type, full, "bp_new_tensor");
}

bp_tensor *bp_new_tensor_1d(bp_context *ctx, enum bp_type type, int64_t ne0)
{
    return bp_new_tensor(ctx, type, 1, (int64_t[]){ne0});
}

bp_tensor *bp_new_tensor_2d(bp_context *ctx, enum bp_type type, int64_t ne0, int64_t ne1)
{
    return bp_new_tensor(ctx, type, 2, (int64_t[]){ne0, ne1});
}

bp_tensor *bp_new_tensor_3d(bp_context *ctx, enum bp_type type, int64_t ne0, int64_t ne1,
                            int64_t ne2)
{
    return bp_new_tensor(ctx, type, 3, (int64_t[]){ne0, ne1, ne2});
}

bp_tensor *bp_new_tensor_4d(bp_context *ctx, enum bp_type type, int64_t ne0, int64_t ne1,
                            int64_t ne2, int64_t ne3)
{
    return bp_new_tensor(ctx, type, 4, (int64_t[]){ne0, ne1, ne2, ne3});
}

/* ---- Names and flags -------------------------------------------------------------------- */

bp_tensor *bp_set_name(bp_tensor *t, const char *name)
{
    if (t == NULL)
        return NULL;
    snprintf(t->name, sizeof(t->name), "%s", name ? name : "");
    return t;
}

bp_tensor *bp_format_name(bp_tensor *t, const char *fmt, ...)
{
    if (t == NULL || fmt == NULL)
        return t;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    return t;
}

const char *bp_get_name(const bp_tensor *t)
{
    return t ? t->name : "";
}

void bp_set_input(bp_tensor *t)
{
    if (t)
        t->flags |= BP_TENSOR_FLAG_INPUT;
}

void bp_set_output(bp_tensor *t)
{
    if (t)
        t->flags |= BP_TENSOR_FLAG_OUTPUT;
}

void bp_set_param(bp_tensor *t)
{
    if (t)
        t->flags |= BP_TENSOR_FLAG_PARAM;
}

/* ---- Shape queries ---------------------------------------------------------------------- */

/* Tensors made by the library never overflow these products (creation refuses them); a
 * tensor struct filled in by hand might, and then the count saturates instead of wrapping. */
int64_t bp_nelements(const bp_tensor *t)
{
    if (t == NULL)
        return 0;
    int64_t n;
    if (t->ne[0] == 0 || t->ne[1] == 0 || t->ne[2] == 0 || t->ne[3] == 0)
        return 0;
    return bp__count_elements(t->ne, &n) ? n : INT64_MAX;
}

int64_t bp_nrows(const bp_tensor *t)
{
    if (t == NULL)
        return 0;
    const int64_t outer[BP_MAX_DIMS] = {1, t->ne[1], t->ne[2], t->ne[3]};
    int64_t n;
    if (t->ne[1] == 0 || t->ne[2] == 0 || t->ne[3] == 0)
        return 0;
    return bp__count_elements(outer, &n) ? n : INT64_MAX;
}

size_t bp_nbytes(const bp_tensor *t)
{
    if (t == NULL)
        return 0;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (t->ne[i] <= 0)
            return 0;
    }
    int64_t blck = bp_type_block_size(t->type);
    size_t n = (size_t)(t->ne[0] / blck) * t->nb[0];
    if (blck == 1)
        n = bp_type_size(t->type) + (size_t)(t->ne[0] - 1) * t->nb[0];
    for (int i = 1; i < BP_MAX_DIMS; i++)
        n += (size_t)(t->ne[i] - 1) * t->nb[i];
    return n;
}

int bp_n_dims(const bp_tensor *t)
{
    if (t == NULL)
        return 0;
    for (int i = BP_MAX_DIMS - 1; i >= 1; i--) {
        if (t->ne[i] > 1)
            return i + 1;
    }
    return 1;
}

bool bp_is_contiguous(const bp_tensor *t)
{
    if (t == NULL)
        return false;
    size_t next = bp_type_size(t->type);
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        /* A dimension of size 1 is never stepped over, so its stride does not matter. */
        if (t->ne[i] != 1 && t->nb[i] != next)
            return false;
        next *= (size_t)(i == 0 ? t->ne[0] / bp_type_block_size(t->type) : t->ne[i]);
    }
    return true;
}

bool bp_is_transposed(const bp_tensor *t)
{
    if (t == NULL)
        return false;
    return t->nb[0] > t->nb[1];
}

bool bp_is_permuted(const bp_tensor *t)
{
    if (t == NULL)
        return false;
    return t->nb[0] > t->nb[1] || t->nb[1] > t->nb[2] || t->nb[2] > t->nb[3];
}

bool bp_is_view(const bp_tensor *t)
{
    if (t == NULL)
        return false;
    return t->view_src != NULL;
}

bool bp_are_same_shape(const bp_tensor *a, const bp_tensor *b)
{
    if (a == NULL || b == NULL)
        return false;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (a->ne[i] != b->ne[i])
            return false;
    }
    return true;
}

bool bp_can_repeat(const bp_tensor *small, const bp_tensor *big)
{
    if (small == NULL || big == NULL)
        return false;
    for (int i = 0; i < BP_MAX_DIMS; i++) {
        if (small->ne[i] == 0 ? big->ne[i] != 0 : big->ne[i] % small->ne[i] != 0)
            return false;
    }
    return true;
}

const char *bp_format_shape(const bp_tensor *t, char *buf, size_t size)
{
    if (buf == NULL || size == 0)
        return buf;
    if (t == NULL)
        snprintf(buf, size, "(null)");
    else
        snprintf(buf, size, "[%lld, %lld, %lld, %lld]", (long long)t->ne[0], (long long)t->ne[1],
                 (long long)t->ne[2], (long long)t->ne[3]);
    return buf;
}

static const char *op_label(const bp_tensor *t)
{
    return t->op == BP_OP_UNARY ? bp_unary_op_name((enum bp_unary_op)t->op_params[0])
           : t->op == BP_OP_GLU ? bp_glu_op_name((enum bp_glu_op)t->op_params[0])
                                : bp_op_name(t->op);
}

const char *bp_describe_tensor(const bp_tensor *t, char *buf, size_t size)
{
    if (buf == NULL || size == 0)
        return buf;
    char shape[96];
    bp_format_shape(t, shape, sizeof(shape));
    /* The name is read up to its array's end: a struct filled in by hand may lack the NUL. */
    int name_len = t ? (int)strnlen(t->name, sizeof(t->name)) : 0;
    if (t == NULL)
        snprintf(buf, size, "(null)");
    else if (name_len > 0)
        snprintf(buf, size, "'%.*s' %s %s", name_len, t->name, bp_type_name(t->type), shape);
    else if (t->op == BP_OP_NONE)
        snprintf(buf, size, "unnamed %s %s", bp_type_name(t->type), shape);
    else
        snprintf(buf, size, "unnamed %s result %s %s", op_label(t), bp_type_name(t->type), shape);
    return buf;
}

struct bp__tdesc bp__describe(const bp_tensor *t)
{
    struct bp__tdesc d;
    bp_describe_tensor(t, d.s, sizeof(d.s));
    return d;
}

struct bp__tdesc bp__describe_in(const bp_graph *g, const bp_tensor *t)
{
    if (g == NULL || t == NULL || t->name[0] != '\0')
        return bp__describe(t);
    struct bp__tdesc d;
    char shape[96];
    bp_format_shape(t, shape, sizeof(shape));
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++)
        if (bp_graph_get_node(g, i) == t) {
            snprintf(d.s, sizeof(d.s), "#%d (%s) %s %s", i, op_label(t), bp_type_name(t->type),
                     shape);
            return d;
        }
    for (int i = 0; i < bp_graph_get_n_leafs(g); i++)
        if (bp_graph_get_leaf(g, i) == t) {
            snprintf(d.s, sizeof(d.s), "leaf #%d %s %s", i, bp_type_name(t->type), shape);
            return d;
        }
    return bp__describe(t);
}

#define N_OP_PARAMS ((int)(BP_MAX_OP_PARAMS / sizeof(int32_t)))

/* Index i of t's op parameters, or false (error set) when t is NULL or i is out of range. */
static bool op_param_index(const bp_tensor *t, int i, const char *fn)
{
    if (t == NULL) {
        bp__error(BP_ERR_INVALID_ARG, "%s: tensor is NULL", fn);
        return false;
    }
    if (i < 0 || i >= N_OP_PARAMS) {
        bp__error(BP_ERR_OUT_OF_BOUNDS, "%s: parameter index %d of %s is outside 0..%d", fn, i,
                  bp__describe(t).s, N_OP_PARAMS - 1);
        return false;
    }
    return true;
}

int32_t bp_get_op_param_i32(const bp_tensor *t, int i)
{
    return op_param_index(t, i, __func__) ? t->op_params[i] : 0;
}

float bp_get_op_param_f32(const bp_tensor *t, int i)
{
    float f = 0.0f;
    if (op_param_index(t, i, __func__))
        memcpy(&f, &t->op_params[i], sizeof(f));
    return f;
}

enum bp_unary_op bp_get_unary_op(const bp_tensor *t)
{
    return op_param_index(t, 0, __func__) ? (enum bp_unary_op)t->op_params[0] : BP_UNARY_OP_COUNT;
}

enum bp_glu_op bp_get_glu_op(const bp_tensor *t)
{
    return op_param_index(t, 0, __func__) ? (enum bp_glu_op)t->op_params[0] : BP_GLU_OP_COUNT;
}
