/* cuda-ops.c - which ops the CUDA plugin runs: exactly what cuda-compute.c implements. Built
 * into both the plugin (supports_op) and the implementation library (which checks each node
 * before it runs it); it calls no CUDA function. */
#include "config.h"

#include "cuda-internal.h"

/* ---- Op support ------------------------------------------------------------------------------ */

/* MUL_MAT_ID's activations and result: F32 rows, one stride between the rows of every token
 * (a meta device's slices of contiguous tensors qualify). */
static bool rows_of_pairs(const bp_tensor *t)
{
    return t->nb[0] == sizeof(float) && t->nb[2] == t->nb[1] * (size_t)t->ne[1] &&
           t->nb[1] % sizeof(float) == 0;
}

bool bp_cuda_float_type(enum bp_type t)
{
    return t == BP_TYPE_F32 || t == BP_TYPE_F16 || t == BP_TYPE_BF16;
}

/* The quantised types the kernels write (CPY, SET_ROWS): the quantizer in cuda-kernels.cu. */
static bool quant_type(enum bp_type t)
{
    return t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0;
}

/* The quantised weight types the kernels read (cuda-quants.cuh decodes each): MUL_MAT,
 * MUL_MAT_ID, GET_ROWS and copies from them. Not the activation types Q8_1 and Q8_K. */
static bool weight_type(enum bp_type t)
{
    switch (t) {
    case BP_TYPE_Q8_0: case BP_TYPE_Q4_0: case BP_TYPE_Q4_1: case BP_TYPE_Q5_0:
    case BP_TYPE_Q5_1: case BP_TYPE_Q2_K: case BP_TYPE_Q3_K: case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K: case BP_TYPE_Q6_K: case BP_TYPE_IQ4_NL: case BP_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

/* Rows stored as whole contiguous blocks (how the quantised kernels address them). */
static bool rows_of_blocks(const bp_tensor *t)
{
    return t->nb[0] == bp_type_size(t->type);
}

/* DUP, CONT and CPY (the node is the destination): between float types in any layout, I32 to
 * I32, from a quantised weight type with whole-block rows, and into Q8_0 or Q4_0 with
 * whole-block rows. */
static bool copy_supported(const bp_tensor *dst, const bp_tensor *src)
{
    if (dst->type == BP_TYPE_I32 || src->type == BP_TYPE_I32)
        return dst->type == src->type;
    const bool src_ok = bp_cuda_float_type(src->type) || (weight_type(src->type) && rows_of_blocks(src));
    const bool dst_ok = bp_cuda_float_type(dst->type) || (quant_type(dst->type) && rows_of_blocks(dst));
    return src_ok && dst_ok;
}

/* Exactly what graph_compute below implements. */
bool bp_cuda_supports(const bp_tensor *op)
{
    const bp_tensor *a = op->src[0], *b = op->src[1];
    switch (op->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true;
    case BP_OP_DUP:
    case BP_OP_CONT:
    case BP_OP_CPY:
        return copy_supported(op, a);
    case BP_OP_GET_ROWS:
        return bp_cuda_float_type(op->type) && b->type == BP_TYPE_I32 &&
               (bp_cuda_float_type(a->type) ||
                (weight_type(a->type) && a->nb[0] == bp_type_size(a->type)));
    case BP_OP_SET_ROWS:
        return (bp_cuda_float_type(op->type) || (quant_type(op->type) && rows_of_blocks(op))) &&
               bp_cuda_float_type(b->type) && op->src[2]->type == BP_TYPE_I32;
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
    case BP_OP_CONCAT:
        return bp_cuda_float_type(op->type) && bp_cuda_float_type(a->type) && bp_cuda_float_type(b->type);
    case BP_OP_SCALE:
    case BP_OP_UNARY:
    case BP_OP_CLAMP:
    case BP_OP_L2_NORM:
    case BP_OP_SUM_ROWS:
    case BP_OP_MEAN:
    case BP_OP_NORM:
    case BP_OP_RMS_NORM:
        return bp_cuda_float_type(op->type) && bp_cuda_float_type(a->type);
    case BP_OP_ARGMAX:
        return bp_cuda_float_type(a->type);
    case BP_OP_ARGSORT:
    case BP_OP_TOP_K:
        return bp_cuda_float_type(a->type) && op->type == BP_TYPE_I32 &&
               a->ne[0] <= BP_CUDA_SORT_MAX;
    case BP_OP_SOFT_MAX:
        return bp_cuda_float_type(op->type) && bp_cuda_float_type(a->type) && (b == NULL || bp_cuda_float_type(b->type));
    case BP_OP_GLU:
        return bp_cuda_float_type(op->type) && bp_cuda_float_type(a->type) && (b == NULL || bp_cuda_float_type(b->type));
    case BP_OP_ROPE: {
        const int n_dims = bp_get_op_param_i32(op, 0), mode = bp_get_op_param_i32(op, 1);
        return bp_cuda_float_type(op->type) && bp_cuda_float_type(a->type) && b->type == BP_TYPE_I32 &&
               n_dims > 0 && n_dims % 2 == 0 && n_dims <= a->ne[0] &&
               (mode == BP_ROPE_NORMAL || mode == BP_ROPE_NEOX);
    }
    case BP_OP_FLASH_ATTN_EXT: {
        const bp_tensor *v = op->src[2], *mask = op->src[3];
        return op->type == BP_TYPE_F32 && a->type == BP_TYPE_F32 &&
               (bp_cuda_float_type(b->type) || b->type == BP_TYPE_Q8_0) &&
               (bp_cuda_float_type(v->type) || v->type == BP_TYPE_Q8_0) &&
               (mask == NULL || bp_cuda_float_type(mask->type)) &&
               a->ne[0] <= BP_CUDA_ATTN_MAX_D && v->ne[0] <= BP_CUDA_ATTN_MAX_D;
    }
    case BP_OP_MUL_MAT:
        return op->type == BP_TYPE_F32 && b->type == BP_TYPE_F32 &&
               (bp_cuda_float_type(a->type) || weight_type(a->type)) &&
               a->nb[0] == bp_type_size(a->type);
    case BP_OP_MUL_MAT_ID: /* gathered per expert, then MUL_MAT's path (cuda-compute.c) */
        return op->type == BP_TYPE_F32 && b->type == BP_TYPE_F32 &&
               (bp_cuda_float_type(a->type) || weight_type(a->type)) &&
               a->nb[0] == bp_type_size(a->type) && rows_of_pairs(b) && rows_of_pairs(op) &&
               bp_is_contiguous(op->src[2]);
    default:
        return false;
    }
}
