/* bp-tensor.h - element types, tensors, contexts and the op builders. */
#ifndef BACKPLANE_BP_TENSOR_H
#define BACKPLANE_BP_TENSOR_H

#include <backplane/bp-core.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_MAX_DIMS 4
#define BP_MAX_SRC 4
#define BP_MAX_OP_PARAMS 64 /* bytes */
#define BP_MAX_NAME 64      /* bytes, including the terminating NUL */

/* ---- Element types ---------------------------------------------------------------------- */

enum bp_type {
    BP_TYPE_F32 = 0,
    BP_TYPE_F16 = 1,
    BP_TYPE_BF16 = 2,
    BP_TYPE_I32 = 3,
    BP_TYPE_Q8_0 = 4, /* blocks of 32: fp16 scale + 32 int8 */
    BP_TYPE_Q4_0 = 5, /* blocks of 32: fp16 scale + 32 4-bit values, offset 8 */
    /* The other weight types of published GGUF files, in ggml's block layouts (below). Values
     * are never renumbered; new types are added before BP_TYPE_COUNT. */
    BP_TYPE_Q4_1 = 6,    /* blocks of 32: fp16 scale and minimum + 32 4-bit values */
    BP_TYPE_Q5_0 = 7,    /* blocks of 32: fp16 scale + 32 5-bit values, offset 16 */
    BP_TYPE_Q5_1 = 8,    /* blocks of 32: fp16 scale and minimum + 32 5-bit values */
    BP_TYPE_Q8_1 = 9,    /* blocks of 32: fp16 scale and scaled sum + 32 int8 (activations) */
    BP_TYPE_Q2_K = 10,   /* super-blocks of 256: 16 x 16 2-bit values, 4-bit scales and mins */
    BP_TYPE_Q3_K = 11,   /* super-blocks of 256: 16 x 16 3-bit values, 6-bit scales */
    BP_TYPE_Q4_K = 12,   /* super-blocks of 256: 8 x 32 4-bit values, 6-bit scales and mins */
    BP_TYPE_Q5_K = 13,   /* super-blocks of 256: 8 x 32 5-bit values, 6-bit scales and mins */
    BP_TYPE_Q6_K = 14,   /* super-blocks of 256: 16 x 16 6-bit values, 8-bit scales */
    BP_TYPE_Q8_K = 15,   /* super-blocks of 256: float scale, int8, sums of 16 (activations) */
    BP_TYPE_IQ4_NL = 16, /* blocks of 32: fp16 scale + 32 4-bit indices into a non-linear table */
    BP_TYPE_IQ4_XS = 17, /* super-blocks of 256: IQ4_NL's table, 8 x 32 with 6-bit scales */
    BP_TYPE_COUNT
};

#define BP_QK8_0 32
#define BP_QK4_0 32
#define BP_QK4_1 32
#define BP_QK5_0 32
#define BP_QK5_1 32
#define BP_QK8_1 32
#define BP_QK4_NL 32
#define BP_QK_K 256        /* elements of a k-quant (and IQ4_XS) super-block */
#define BP_K_SCALE_SIZE 12 /* bytes of Q4_K's and Q5_K's packed 6-bit scales and mins */

/* On-disk and in-memory layout of the quantised blocks (identical to ggml's). */
struct bp_block_q8_0 {
    uint16_t d; /* fp16 scale */
    int8_t qs[BP_QK8_0];
};
struct bp_block_q4_0 {
    uint16_t d;               /* fp16 scale */
    uint8_t qs[BP_QK4_0 / 2]; /* element j in the low nibble of qs[j], element j+16 in the high */
};
struct bp_block_q4_1 {
    uint16_t d, m;            /* fp16 scale and minimum: x = d * q + m */
    uint8_t qs[BP_QK4_1 / 2]; /* as Q4_0's */
};
struct bp_block_q5_0 {
    uint16_t d;               /* fp16 scale: x = d * (q - 16) */
    uint8_t qh[4];            /* bit 4 of element j in bit j (little-endian 32 bits) */
    uint8_t qs[BP_QK5_0 / 2]; /* bits 0-3, as Q4_0's */
};
struct bp_block_q5_1 {
    uint16_t d, m; /* fp16 scale and minimum: x = d * q + m */
    uint8_t qh[4];
    uint8_t qs[BP_QK5_1 / 2];
};
struct bp_block_q8_1 {
    uint16_t d, s; /* fp16 scale, and d times the sum of qs */
    int8_t qs[BP_QK8_1];
};
struct bp_block_q2_k {
    uint8_t scales[BP_QK_K / 16]; /* per 16 elements: scale in bits 0-3, minimum in bits 4-7 */
    uint8_t qs[BP_QK_K / 4];      /* 2 bits each */
    uint16_t d, dmin;             /* fp16 super-block scales of the scales and of the minimums */
};
struct bp_block_q3_k {
    uint8_t hmask[BP_QK_K / 8]; /* the high bit of each (set: no offset of -4) */
    uint8_t qs[BP_QK_K / 4];    /* the low 2 bits */
    uint8_t scales[12];         /* 16 6-bit scales, offset 32 */
    uint16_t d;                 /* fp16 super-block scale */
};
struct bp_block_q4_k {
    uint16_t d, dmin;                /* fp16 super-block scales of the scales and minimums */
    uint8_t scales[BP_K_SCALE_SIZE]; /* 8 6-bit scales and 8 6-bit minimums */
    uint8_t qs[BP_QK_K / 2];
};
struct bp_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[BP_K_SCALE_SIZE];
    uint8_t qh[BP_QK_K / 8]; /* the fifth bits */
    uint8_t qs[BP_QK_K / 2];
};
struct bp_block_q6_k {
    uint8_t ql[BP_QK_K / 2];      /* the low 4 bits */
    uint8_t qh[BP_QK_K / 4];      /* the high 2 bits */
    int8_t scales[BP_QK_K / 16]; /* 8-bit scales of 16 elements */
    uint16_t d;                   /* fp16 super-block scale */
};
struct bp_block_q8_k {
    float d;                    /* scale */
    int8_t qs[BP_QK_K];
    int16_t bsums[BP_QK_K / 16]; /* sums of qs by 16 */
};
struct bp_block_iq4_nl {
    uint16_t d;                /* fp16 scale: x = d * table[q] */
    uint8_t qs[BP_QK4_NL / 2]; /* indices, as Q4_0's */
};
struct bp_block_iq4_xs {
    uint16_t d;                 /* fp16 super-block scale */
    uint16_t scales_h;          /* the high 2 bits of the 8 6-bit scales (offset 32) */
    uint8_t scales_l[BP_QK_K / 64]; /* their low 4 bits */
    uint8_t qs[BP_QK_K / 2];
};

/* Converts n elements (n a multiple of the block size) of a row to or from float. The packed
 * side (src of to_float, dst of from_float) may be at any address, aligned or not. */
typedef void (*bp_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*bp_from_float_fn)(const float *src, void *dst, int64_t n);

struct bp_type_traits {
    const char *name;       /* "f32", "q4_0", ... */
    int64_t block_size;     /* elements per block: 1 for plain types, 32 for Q8_0/Q4_0 */
    size_t type_size;       /* bytes per block */
    bool is_quantized;
    bp_to_float_fn to_float;
    bp_from_float_fn from_float;
};

/* NULL (with bp_last_error set) for a value outside the enum. Static storage. */
BP_API const struct bp_type_traits *bp_type_get_traits(enum bp_type type);
/* "f32" ...; "invalid" for a value outside the enum. */
BP_API const char *bp_type_name(enum bp_type type);
/* Case-insensitive; BP_ERR_NOT_FOUND for an unknown name. */
BP_API enum bp_status bp_type_from_name(const char *name, enum bp_type *out);
BP_API size_t bp_type_size(enum bp_type type);
BP_API int64_t bp_type_block_size(enum bp_type type);
/* Bytes of a row of ne0 elements; 0 when ne0 is not a multiple of the block size or the size
 * does not fit in size_t. */
BP_API size_t bp_row_size(enum bp_type type, int64_t ne0);
/* Quantises n_rows rows of n_per_row floats from src into dst, rows back to back in type's
 * layout (n_rows * bp_row_size(type, n_per_row) bytes); dst may be at any address.
 * imatrix (optional, n_per_row values): the importance of each column, as llama.cpp's
 * importance matrix gives it (mean squared activations). Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
 * IQ4_XS, Q4_0, Q4_1, Q5_0 and Q5_1 weigh their errors by it (as llama.cpp's quantize_* do);
 * the other types ignore it. Without it, each type quantises as its traits' from_float does.
 * Returns the bytes written; 0 with bp_last_error() set when type has no quantiser,
 * n_per_row is not a positive multiple of its block size, n_rows is negative, a pointer is
 * NULL, or an imatrix value is negative, infinite or NaN. */
BP_API size_t bp_quantize_rows(enum bp_type type, const float *src, void *dst, int64_t n_rows,
                               int64_t n_per_row, const float *imatrix);

/* Scalar conversions, round-to-nearest-even, NaN and Inf preserved. A half or bfloat NaN
 * converts to float and back bit for bit. */
BP_API float bp_fp16_to_fp32(uint16_t h);
BP_API uint16_t bp_fp32_to_fp16(float f);
BP_API float bp_bf16_to_fp32(uint16_t h);
BP_API uint16_t bp_fp32_to_bf16(float f);

/* ---- Ops -------------------------------------------------------------------------------- */

/* X(name, n_src, is_view): one row per op; is_view ops only move strides, they compute nothing.
 * n_src is the number of required sources (optional ones, such as soft_max's mask, excluded). */
#define BP_OP_MAP(X)         \
    X(NONE, 0, false)        \
    X(DUP, 1, false)         \
    X(CPY, 2, false)         \
    X(CONT, 1, false)        \
    X(RESHAPE, 1, true)      \
    X(VIEW, 1, true)         \
    X(PERMUTE, 1, true)      \
    X(TRANSPOSE, 1, true)    \
    X(GET_ROWS, 2, false)    \
    X(SET_ROWS, 3, false)    \
    X(ADD, 2, false)         \
    X(SUB, 2, false)         \
    X(MUL, 2, false)         \
    X(DIV, 2, false)         \
    X(SCALE, 1, false)       \
    X(UNARY, 1, false)       \
    X(SUM_ROWS, 1, false)    \
    X(MEAN, 1, false)        \
    X(ARGMAX, 1, false)      \
    X(NORM, 1, false)        \
    X(RMS_NORM, 1, false)    \
    X(MUL_MAT, 2, false)     \
    X(SOFT_MAX, 1, false)    \
    X(ROPE, 2, false)        \
    X(CONCAT, 2, false)      \
    X(GLU, 1, false)         \
    X(FLASH_ATTN_EXT, 3, false) \
    X(CLAMP, 1, false)          \
    X(L2_NORM, 1, false)        \
    X(ARGSORT, 1, false)        \
    X(TOP_K, 1, false)          \
    X(MUL_MAT_ID, 3, false)

enum bp_op {
#define BP_OP_ENUM(name, n_src, is_view) BP_OP_##name,
    BP_OP_MAP(BP_OP_ENUM)
#undef BP_OP_ENUM
    BP_OP_COUNT
};

#define BP_UNARY_OP_MAP(X)                                                                  \
    X(NEG) X(ABS) X(RELU) X(GELU) X(SILU) X(SIGMOID) X(TANH) X(EXP) X(SQR) X(SQRT) X(GELU_ERF)

enum bp_unary_op {
#define BP_UNARY_ENUM(name) BP_UNARY_OP_##name,
    BP_UNARY_OP_MAP(BP_UNARY_ENUM)
#undef BP_UNARY_ENUM
    BP_UNARY_OP_COUNT
};

enum bp_glu_op {
    BP_GLU_OP_SWIGLU = 0, /* silu(gate) * up */
    BP_GLU_OP_GEGLU = 1,  /* gelu(gate) * up, GELU's tanh form */
    BP_GLU_OP_GEGLU_ERF = 2, /* gelu_erf(gate) * up, GELU's erf form */
    BP_GLU_OP_COUNT
};

enum bp_rope_mode {
    BP_ROPE_NORMAL = 0, /* rotates adjacent pairs (x[2i], x[2i+1]) */
    BP_ROPE_NEOX = 2,   /* rotates the two halves (x[i], x[i + n_dims/2]) */
};

/*
 * Sources and parameters of each op, as a kernel finds them in the result tensor. src[i] not
 * listed are NULL. op_params are int32 slots; a float parameter is stored bit for bit in its
 * slot (read it with bp_get_op_param_f32), an int with bp_get_op_param_i32.
 *
 *   NONE       a leaf (bp_new_tensor*): no sources, no parameters.
 *   DUP        src[0] a. Contiguous, a's type and shape.
 *   CPY        src[0] a (the values), src[1] b (the destination). A view of b with b's type and
 *              shape; element j of a (in logical order) converted to b's type goes to element j
 *              of b.
 *   CONT       src[0] a. Contiguous, a's type, the shape given to bp_cont_4d; elements in a's
 *              logical order.
 *   RESHAPE    src[0] a. View; no parameters.
 *   VIEW       src[0] a. View; op_params[0..1] hold the size_t byte offset given to bp_view_*d
 *              (relative to a's data; view_offs is the offset into view_src).
 *   PERMUTE    src[0] a. View; op_params[i] (i = 0..3) is the result axis of source axis i.
 *   TRANSPOSE  src[0] a. View; axes 0 and 1 swapped.
 *   GET_ROWS   src[0] a [E, R, B, C] (any type), src[1] ids I32 [n, B, C]. F32 [E, n, B, C]:
 *              r[:, i, j, k] = a[:, ids[i, j, k], j, k].
 *   SET_ROWS   src[0] dst [E, R, B, C], src[1] src F32 [E, n, B, C], src[2] ids I32 [n, b, c].
 *              A view of dst: dst[:, ids[i, j % b, k % c], j, k] = src[:, i, j, k], converted to
 *              dst's type.
 *   ADD, SUB, MUL, DIV
 *              src[0] a, src[1] b, F32. r = a op b with b repeated by modulo:
 *              r[i0, i1, i2, i3] = a[i0, i1, i2, i3] op b[i0 % b.ne0, i1 % b.ne1, i2 % b.ne2,
 *              i3 % b.ne3].
 *   SCALE      src[0] a. op_params[0] = s (f32); r = a * s.
 *   UNARY      src[0] a. op_params[0] = enum bp_unary_op (bp_get_unary_op). NEG -x, ABS |x|,
 *              RELU max(x, 0), GELU the tanh form
 *                0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *              (not the erf form; kernels may compute it as x / (1 + e^(-2 sqrt(2/pi) (x +
 *              0.044715 x^3))), the same function), SILU x / (1 + e^-x), SIGMOID 1 / (1 + e^-x),
 *              TANH, EXP, SQR x^2, SQRT, GELU_ERF the erf form 0.5 x (1 + erf(x / sqrt 2)).
 *   SUM_ROWS, MEAN, ARGMAX
 *              src[0] a. No parameters.
 *   NORM, RMS_NORM
 *              src[0] a. op_params[0] = eps (f32).
 *   MUL_MAT    src[0] a [K, M, A2, A3] (the weights), src[1] b F32 [K, N, B2, B3];
 *              op_params[0] = precision (enum bp_mm_precision, bp_mul_mat_set_precision). F32
 *              [M, N, B2, B3]: r[m, n, i2, i3] = sum_k a[k, m, i2 / (B2 / A2), i3 / (B3 / A3)] *
 *              b[k, n, i2, i3]. a is broadcast by division, unlike the binary ops' modulo: each
 *              slice of a serves B2 / A2 consecutive slices of b (grouped-query attention: with
 *              A2 = 2 and B2 = 8, a's head 0 serves b's heads 0..3).
 *   MUL_MAT_ID src[0] as [K, M, E, 1] (E experts' weights stacked), src[1] b F32 [K, U or 1, T, 1],
 *              src[2] ids I32 [U, T, 1, 1]. F32 [M, U, T, 1]: r[m, u, t] = sum_k
 *              as[k, m, ids[u, t]] * b[k, u % b.ne1, t]. No parameters. An id outside [0, E)
 *              makes the compute fail with BP_ERR_OUT_OF_BOUNDS (that slot's results are
 *              undefined); nothing outside as is read.
 *   SOFT_MAX   src[0] a, src[1] mask or NULL, src[2] sinks or NULL. op_params[0] = scale
 *              (f32). Along ne[0] of a[:, i1, i2, i3] * scale + mask[:, i1, i2 % mask.ne2,
 *              i3 % mask.ne3], with sinks[i2] weighed in (bp_soft_max_add_sinks).
 *   ROPE       src[0] x, src[1] pos I32. op_params[0] = n_dims, [1] = enum bp_rope_mode,
 *              [2] = freq_base (f32), [3] = freq_scale (f32), and for YaRN (bp_rope_ext)
 *              [4] = ext_factor, [5] = the magnitude factor attn_factor (1 + 0.1 ln(1 /
 *              freq_scale)), [6], [7] = the first and last pair of the ramp, [8] = attn_factor,
 *              [9] = beta_fast, [10] = beta_slow (f32), [11] = n_ctx_orig; [4] = 0 and [5] = 1
 *              without YaRN, as below. In each head of token t (x's
 *              index 2), pair i (0 <= i < n_dims / 2: values 2i and 2i + 1, or i and
 *              i + n_dims / 2 in NeoX mode) (v0, v1) becomes (v0 cos th - v1 sin th,
 *              v0 sin th + v1 cos th) with th = pos[t] * freq_scale * freq_base^(-2i / n_dims);
 *              values from n_dims on are copied.
 *   CONCAT     src[0] a, src[1] b. op_params[0] = dim; b's elements follow a's along dim.
 *   GLU        src[0] a, src[1] b or NULL. op_params[0] = enum bp_glu_op, [1] = 1 when src[1]
 *              is NULL (a holds gate and value as the two halves of each row), else 0.
 *   FLASH_ATTN_EXT
 *              src[0] q, src[1] k, src[2] v, src[3] mask or NULL. op_params[0] = scale (f32),
 *              [1] = softcap (f32), [2] = flags (enum bp_attn_flags); see bp_flash_attn_ext.
 *   CLAMP      src[0] a. op_params[0] = lo (f32), [1] = hi (f32).
 *   L2_NORM    src[0] a. op_params[0] = eps (f32); along ne[0]: x / max(||x||, eps).
 *   ARGSORT    src[0] a F32. op_params[0] = enum bp_sort_order. I32, like bp_argsort.
 *   TOP_K      src[0] a F32. op_params[0] = k. I32 [k, ...], like bp_top_k.
 */

/* "ADD", "MUL_MAT", ...; "INVALID" out of range. */
BP_API const char *bp_op_name(enum bp_op op);
BP_API int bp_op_n_src(enum bp_op op);
BP_API bool bp_op_is_view(enum bp_op op);
BP_API const char *bp_unary_op_name(enum bp_unary_op op);
BP_API const char *bp_glu_op_name(enum bp_glu_op op);

/* ---- Tensors ---------------------------------------------------------------------------- */

enum bp_tensor_flag {
    BP_TENSOR_FLAG_INPUT = 1,  /* filled by the user before compute */
    BP_TENSOR_FLAG_OUTPUT = 2, /* read by the user after compute: never overwritten by reuse */
    BP_TENSOR_FLAG_PARAM = 4,  /* a trainable parameter / weight */
};

struct bp_buffer;

/*
 * A tensor is transparent: kernels read its fields directly. ne[0] is the innermost,
 * contiguous dimension; nb[i] is the byte stride of dimension i (nb[0] is the element or block
 * size). Unused dimensions have ne = 1. The data lives in a buffer (see bp-backend.h); a view
 * (view_src != NULL) shares the data of view_src at byte offset view_offs and owns nothing.
 */
struct bp_tensor {
    enum bp_type type;
    enum bp_op op;
    int64_t ne[BP_MAX_DIMS];
    size_t nb[BP_MAX_DIMS];

    /* Op parameters, read through bp_get_op_param_*(); the layout of each op is in "Sources
     * and parameters of each op" above bp_op_name(). */
    int32_t op_params[BP_MAX_OP_PARAMS / sizeof(int32_t)];
    uint32_t flags; /* enum bp_tensor_flag */

    struct bp_tensor *src[BP_MAX_SRC];
    struct bp_tensor *view_src; /* the tensor that owns the data, never itself a view */
    size_t view_offs;           /* byte offset into view_src's data */

    /* NULL until allocated. A view gets its view_src's buffer when it is placed
     * (bp_tensor_init_view, which the allocators call), so kernels may read t->buffer of any
     * placed tensor, view or not. */
    struct bp_buffer *buffer;
    /* Address inside buffer, NULL until allocated: host memory only when the buffer is a host
     * buffer (bp_buffer_is_host); otherwise an address in the plugin's own space (see
     * bp_buffer_get_base), not for the host to dereference. */
    void *data;
    void *extra;              /* for the backend that holds the buffer */

    char name[BP_MAX_NAME];
};

typedef struct bp_tensor bp_tensor;
typedef struct bp_context bp_context;

/* A context holds the metadata of up to max_tensors tensors (never their data). Running out is
 * a BP_ERR_CAPACITY error. Caller frees with bp_context_free, which frees every tensor in it. */
BP_API bp_context *bp_context_new(size_t max_tensors);
BP_API void bp_context_free(bp_context *ctx);
/* Forgets every tensor of ctx (their pointers become invalid), keeping the storage. */
BP_API void bp_context_reset(bp_context *ctx);
BP_API size_t bp_context_get_n_tensors(const bp_context *ctx);
BP_API size_t bp_context_get_capacity(const bp_context *ctx);
/* The i-th tensor created in the context, NULL when out of range. Owned by the context. */
BP_API bp_tensor *bp_context_get_tensor(const bp_context *ctx, size_t i);
/* First tensor with this name, NULL (no error) when none has it. */
BP_API bp_tensor *bp_context_find_tensor(const bp_context *ctx, const char *name);

/* The largest tensor, in bytes: a tensor whose byte size, any stride, element count or row
 * count would exceed it (or not fit in int64_t) is refused when it is created, so sizes derived
 * from a shape, plus alignment padding, never wrap. An empty tensor (a size of 0) is refused
 * when the product of its other sizes does not fit in int64_t. */
#define BP_MAX_TENSOR_BYTES ((size_t)1 << 62)

/* New tensors: ne[i] >= 0, at most 4 dims, ne[0] a multiple of the type's block size, at most
 * BP_MAX_TENSOR_BYTES. Owned by the context. NULL on error (BP_ERR_SHAPE when too large). */
BP_API bp_tensor *bp_new_tensor(bp_context *ctx, enum bp_type type, int n_dims, const int64_t *ne);
BP_API bp_tensor *bp_new_tensor_1d(bp_context *ctx, enum bp_type type, int64_t ne0);
BP_API bp_tensor *bp_new_tensor_2d(bp_context *ctx, enum bp_type type, int64_t ne0, int64_t ne1);
BP_API bp_tensor *bp_new_tensor_3d(bp_context *ctx, enum bp_type type, int64_t ne0, int64_t ne1,
                                   int64_t ne2);
BP_API bp_tensor *bp_new_tensor_4d(bp_context *ctx, enum bp_type type, int64_t ne0, int64_t ne1,
                                   int64_t ne2, int64_t ne3);

/* Names are truncated to BP_MAX_NAME - 1 bytes. Returns t. */
BP_API bp_tensor *bp_set_name(bp_tensor *t, const char *name);
BP_API bp_tensor *bp_format_name(bp_tensor *t, const char *fmt, ...) BP_PRINTF(2, 3);
BP_API const char *bp_get_name(const bp_tensor *t);
BP_API void bp_set_input(bp_tensor *t);
BP_API void bp_set_output(bp_tensor *t);
BP_API void bp_set_param(bp_tensor *t);

/* Shape queries. */
BP_API int64_t bp_nelements(const bp_tensor *t);
BP_API int64_t bp_nrows(const bp_tensor *t); /* ne[1] * ne[2] * ne[3] */
/* Bytes spanned from the first to one past the last element, strides included. */
BP_API size_t bp_nbytes(const bp_tensor *t);
BP_API int bp_n_dims(const bp_tensor *t); /* index of the last dimension > 1, plus one; >= 1 */
BP_API bool bp_is_contiguous(const bp_tensor *t);
BP_API bool bp_is_transposed(const bp_tensor *t); /* nb[0] > nb[1] */
BP_API bool bp_is_permuted(const bp_tensor *t);
BP_API bool bp_is_view(const bp_tensor *t);
BP_API bool bp_are_same_shape(const bp_tensor *a, const bp_tensor *b);
/* big.ne[i] % small.ne[i] == 0 for every i */
BP_API bool bp_can_repeat(const bp_tensor *small, const bp_tensor *big);
/* "[4, 3, 1, 1]" into buf (at least 96 bytes); returns buf. */
BP_API const char *bp_format_shape(const bp_tensor *t, char *buf, size_t size);
/* A description for messages into buf (BP_TENSOR_DESC_SIZE bytes hold any): "'wq' f16 [64, 64,
 * 1, 1]" for a named tensor, "unnamed MUL_MAT result f32 [64, 8, 1, 1]" or "unnamed f32 [...]"
 * for others; "(null)" for NULL. Truncated to size; returns buf. Plugins use it so every message
 * names tensors the same way. */
#define BP_TENSOR_DESC_SIZE (BP_MAX_NAME + 128)
BP_API const char *bp_describe_tensor(const bp_tensor *t, char *buf, size_t size);

/* Op parameters stored in the tensor, as 32-bit slots 0 .. BP_MAX_OP_PARAMS/4 - 1. A NULL
 * tensor or an index outside that range sets bp_last_error() and returns 0 (0.0f; for the op
 * getters BP_UNARY_OP_COUNT / BP_GLU_OP_COUNT, which name no op). */
BP_API int32_t bp_get_op_param_i32(const bp_tensor *t, int i);
BP_API float bp_get_op_param_f32(const bp_tensor *t, int i);
BP_API enum bp_unary_op bp_get_unary_op(const bp_tensor *t);
BP_API enum bp_glu_op bp_get_glu_op(const bp_tensor *t);

/* ---- Op builders -------------------------------------------------------------------------
 * Each builder validates types and shapes and returns a new tensor owned by ctx, or NULL with
 * bp_last_error() naming the op and the offending shapes. Builders only describe work; a
 * backend computes it when the graph is run. */

/* Copies. dup: same type and shape, contiguous. cpy: writes a into b (converting the type;
 * same element count) and returns a view of b. cont: contiguous copy of a, optionally reshaped. */
BP_API bp_tensor *bp_dup(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_cpy(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_cont(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_cont_4d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3);

/* Views (share a's data). reshape needs a contiguous a and the same element count. view_Nd
 * takes the new sizes, the byte strides of dimensions 1.. and a byte offset, and refuses a view
 * that would reach outside the data of the tensor that owns it. permute: source axis i becomes
 * result axis p_i. transpose swaps axes 0 and 1. */
BP_API bp_tensor *bp_reshape(bp_context *ctx, bp_tensor *a, int n_dims, const int64_t *ne);
BP_API bp_tensor *bp_reshape_1d(bp_context *ctx, bp_tensor *a, int64_t ne0);
BP_API bp_tensor *bp_reshape_2d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1);
BP_API bp_tensor *bp_reshape_3d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2);
BP_API bp_tensor *bp_reshape_4d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2, int64_t ne3);
BP_API bp_tensor *bp_view_1d(bp_context *ctx, bp_tensor *a, int64_t ne0, size_t offset);
BP_API bp_tensor *bp_view_2d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, size_t nb1,
                             size_t offset);
BP_API bp_tensor *bp_view_3d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                             size_t nb1, size_t nb2, size_t offset);
BP_API bp_tensor *bp_view_4d(bp_context *ctx, bp_tensor *a, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset);
BP_API bp_tensor *bp_permute(bp_context *ctx, bp_tensor *a, int p0, int p1, int p2, int p3);
BP_API bp_tensor *bp_transpose(bp_context *ctx, bp_tensor *a);

/* Rows. get_rows(a [E, R, B, C], ids I32 [n, B, C]) -> F32 [E, n, B, C].
 * set_rows(dst [E, R, B, C], src F32 [E, n, B, C], ids I32 [n, b, c] with B % b == 0 and
 * C % c == 0) writes row ids[i] of dst from row i of src and returns a view of dst. */
BP_API bp_tensor *bp_get_rows(bp_context *ctx, bp_tensor *a, bp_tensor *ids);
BP_API bp_tensor *bp_set_rows(bp_context *ctx, bp_tensor *dst, bp_tensor *src, bp_tensor *ids);

/* Element-wise binary ops on F32: b is repeated over a (a.ne[i] % b.ne[i] == 0); the result
 * has a's shape. The _inplace forms write into a and return a view of it. */
BP_API bp_tensor *bp_add(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_sub(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_mul(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_div(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_add_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_sub_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_mul_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b);
BP_API bp_tensor *bp_div_inplace(bp_context *ctx, bp_tensor *a, bp_tensor *b);

/* a * s, F32. */
BP_API bp_tensor *bp_scale(bp_context *ctx, bp_tensor *a, float s);
BP_API bp_tensor *bp_scale_inplace(bp_context *ctx, bp_tensor *a, float s);

/* Element-wise unary functions on F32. */
BP_API bp_tensor *bp_unary(bp_context *ctx, bp_tensor *a, enum bp_unary_op op);
BP_API bp_tensor *bp_unary_inplace(bp_context *ctx, bp_tensor *a, enum bp_unary_op op);
BP_API bp_tensor *bp_neg(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_abs(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_relu(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_gelu(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_silu(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_sigmoid(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_tanh(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_exp(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_sqr(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_sqrt(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_gelu_erf(bp_context *ctx, bp_tensor *a);

/* Row reductions over ne[0], F32 in. sum_rows and mean give F32 [1, ne1, ne2, ne3]; argmax
 * gives I32 [1, ne1, ne2, ne3] (the first index of the maximum). */
BP_API bp_tensor *bp_sum_rows(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_mean(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_argmax(bp_context *ctx, bp_tensor *a);

/* Row normalisations over ne[0], F32, eps >= 0 and finite (0 is allowed: an all-zero row is
 * then the caller's risk). norm: (x - mean) / sqrt(var + eps);
 * rms_norm: x / sqrt(mean(x^2) + eps). */
BP_API bp_tensor *bp_norm(bp_context *ctx, bp_tensor *a, float eps);
BP_API bp_tensor *bp_rms_norm(bp_context *ctx, bp_tensor *a, float eps);
/* l2_norm: x / max(sqrt(sum(x^2)), eps), each row scaled to unit length (eps guards zero rows). */
BP_API bp_tensor *bp_l2_norm(bp_context *ctx, bp_tensor *a, float eps);

/* The order of each row: argsort gives I32 [ne0, ne1, ne2, ne3], the indices of a's row sorted
 * by value (BP_SORT_ASC or BP_SORT_DESC); top_k gives I32 [k, ne1, ne2, ne3], the indices of the
 * k largest values, largest first (1 <= k <= ne0). Equal values keep the order of their indices;
 * NaN sorts after every number in either order (and is never among the top k while numbers
 * remain). */
enum bp_sort_order {
    BP_SORT_ASC = 0,
    BP_SORT_DESC = 1,
};
BP_API bp_tensor *bp_argsort(bp_context *ctx, bp_tensor *a, enum bp_sort_order order);
BP_API bp_tensor *bp_top_k(bp_context *ctx, bp_tensor *a, int k);

/* clamp(a F32, lo, hi): min(max(x, lo), hi) element by element; lo <= hi, neither NaN (either
 * may be infinite). NaN stays NaN. */
BP_API bp_tensor *bp_clamp(bp_context *ctx, bp_tensor *a, float lo, float hi);

/* mul_mat(a [K, M, A2, A3] any type but I32, b F32 [K, N, B2, B3]) -> F32 [M, N, B2, B3] with
 * r[m, n] = sum_k a[k, m] * b[k, n]; B2 % A2 == 0 and B3 % A3 == 0. a is broadcast by division:
 * slice i2 of b uses slice i2 / (B2 / A2) of a (not i2 % A2 as in the binary ops). */
BP_API bp_tensor *bp_mul_mat(bp_context *ctx, bp_tensor *a, bp_tensor *b);

/* mul_mat_id: the expert products of a mixture-of-experts layer (ggml's conventions). as holds E
 * experts' weights [K, M, E, 1] (any type but I32, rows contiguous along K), b the activations
 * F32 [K, U, T, 1] (one per used expert slot) or [K, 1, T, 1] (one per token, shared by its U
 * slots), ids I32 [U, T, 1, 1] the expert each slot of each token uses. -> F32 [M, U, T, 1]:
 * r[:, u, t] = as[:, :, ids[u, t]]^T b[:, u or 0, t]. Ids are read when the graph computes: one
 * outside [0, E) fails that compute with BP_ERR_OUT_OF_BOUNDS, never a read outside as. */
BP_API bp_tensor *bp_mul_mat_id(bp_context *ctx, bp_tensor *as, bp_tensor *b, bp_tensor *ids);

/* How a MUL_MAT may round its activations. By default every device keeps the same contract, so
 * that a model's results do not depend on which device runs it; HALF trades that for speed. */
enum bp_mm_precision {
    /* The contract on every device: the activations keep at least 16 significant bits and
     * products accumulate in f32 (NMSE at most 1e-9 against a double reference for F32, F16
     * and BF16 weights). */
    BP_MM_PRECISION_DEFAULT = 0,
    /* Permission, for BF16 and F16 weights, to round the activations once to the weights'
     * 16-bit type, as ggml does (NMSE at most 1e-5; about 2e-6 for BF16): the CPU then uses
     * AVX512_BF16 products for BF16 weights where the processor has them. A device may still
     * compute more precisely; other weight types ignore it. */
    BP_MM_PRECISION_HALF = 1,
};

/* Sets the precision of mm, a MUL_MAT node (op_params[0]); returns mm, or NULL with an error for
 * another node or an unknown precision. */
BP_API bp_tensor *bp_mul_mat_set_precision(bp_tensor *mm, enum bp_mm_precision precision);
/* mm's precision; BP_MM_PRECISION_DEFAULT for anything but a MUL_MAT node. */
BP_API enum bp_mm_precision bp_mul_mat_get_precision(const bp_tensor *mm);

/* softmax along ne[0] of a*scale + mask. a F32; mask optional (NULL), F32 or F16 with
 * mask.ne[0] == a.ne[0], mask.ne[1] >= a.ne[1], and a.ne[2], a.ne[3] multiples of mask's.
 * Rows that are all -inf give zeros. */
BP_API bp_tensor *bp_soft_max(bp_context *ctx, bp_tensor *a);
BP_API bp_tensor *bp_soft_max_ext(bp_context *ctx, bp_tensor *a, bp_tensor *mask, float scale);
/* Attention sinks: softmax node s (from bp_soft_max_ext) also weighs, for each row of head h (its
 * index 2), a virtual entry of value sinks[h] that takes part in the maximum and the sum but is
 * not output: y = exp(x - m) / (sum exp(x - m) + exp(sinks[h] - m)). sinks is F32 [ne2 of s],
 * contiguous, given once, before s goes into a graph (bp_graph_build_forward collects the
 * sources it has then). BP_OK, or an error (s unchanged). */
BP_API enum bp_status bp_soft_max_add_sinks(bp_tensor *s, bp_tensor *sinks);

/* rope(x F32 [head_dim, n_head, n_tok, 1], pos I32 [n_tok]): rotates the first n_dims (even,
 * <= head_dim) values of each head by pos * freq_scale * base^(-2i/n_dims). */
BP_API bp_tensor *bp_rope(bp_context *ctx, bp_tensor *x, bp_tensor *pos, int n_dims,
                          enum bp_rope_mode mode, float freq_base, float freq_scale);
/* rope with YaRN context extension (ext_factor in (0, 1]; 0 is plain rope with linear scaling
 * freq_scale): pair i turns by pos * base^(-2i/n_dims) * (freq_scale (1 - m_i) + m_i), where
 * m_i = ext_factor * ramp_i is 1 for the fast-turning pairs, whose wavelength fits n_ctx_orig
 * beta_fast times or more, 0 for those that fit beta_slow times or less, and linear in between
 * (pair positions floor/ceil(n_dims ln(n_ctx_orig / (2 pi beta)) / (2 ln base))); the results
 * are multiplied by attn_factor * (1 + 0.1 ln(1 / freq_scale)). As ggml's rope_ext. */
BP_API bp_tensor *bp_rope_ext(bp_context *ctx, bp_tensor *x, bp_tensor *pos, int n_dims,
                              enum bp_rope_mode mode, int n_ctx_orig, float freq_base,
                              float freq_scale, float ext_factor, float attn_factor,
                              float beta_fast, float beta_slow);

/* Fused attention with an online softmax (no [n_kv, n_tok] intermediate):
 *   q F32 [D, n_tok, n_head, n_seq], k [D, n_kv, n_head_kv, n_seq'], v [Dv, n_kv, n_head_kv,
 *   n_seq'] with k and v F32, F16, BF16 or Q8_0 (a quantised cache: rows of whole blocks),
 *   n_head_kv dividing n_head (grouped-query attention:
 *   query head h reads key/value head h / (n_head / n_head_kv)) and n_seq' 1 or n_seq;
 *   mask (optional) F32 or F16 [n_kv, >= n_tok, m2, m3] added to the scores, m2 dividing n_head
 *   and m3 dividing n_seq.
 * Scores are s = scale * q.k, or softcap * tanh(scale * q.k / softcap) when softcap > 0, plus the
 * mask; with flags & BP_ATTN_CAUSAL, query row i sees keys 0 .. n_kv - n_tok + i only (the query
 * rows are the last n_tok positions). A row that sees no key gives zeros. The result is F32
 * [Dv, n_head, n_tok, n_seq]: heads side by side, ready to reshape to [Dv * n_head, n_tok]. */
enum bp_attn_flags {
    BP_ATTN_CAUSAL = 1,
};
BP_API bp_tensor *bp_flash_attn_ext(bp_context *ctx, bp_tensor *q, bp_tensor *k, bp_tensor *v,
                                    bp_tensor *mask, float scale, float softcap, int flags);

/* concat(a, b, dim): same type, equal sizes except along dim, 0 <= dim < 4. */
BP_API bp_tensor *bp_concat(bp_context *ctx, bp_tensor *a, bp_tensor *b, int dim);

/* Gated linear units, F32. With b: act(a) * b, same shapes. Without b (NULL): a.ne[0] is even,
 * its first half is the gate and its second half the value; the result has half of ne[0]. */
BP_API bp_tensor *bp_glu(bp_context *ctx, bp_tensor *a, bp_tensor *b, enum bp_glu_op op);
BP_API bp_tensor *bp_swiglu(bp_context *ctx, bp_tensor *gate, bp_tensor *up);
BP_API bp_tensor *bp_geglu(bp_context *ctx, bp_tensor *gate, bp_tensor *up);
BP_API bp_tensor *bp_geglu_erf(bp_context *ctx, bp_tensor *gate, bp_tensor *up);

#ifdef __cplusplus
}
#endif

#endif
