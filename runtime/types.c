/* types.c - the element type table, half/bfloat conversions and Q8_0/Q4_0 (de)quantisation.
 *
 * The float conversions are integer bit manipulation rather than compiler or F16C intrinsics,
 * so the library built for the baseline ISA gives the same answer on every machine. They round
 * to nearest, ties to even, keep the sign of zero, turn overflow into infinity and keep NaN
 * payloads where the narrow format can hold them (a narrow NaN survives float and back). */
#include "config.h"

#include <math.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "bp-impl.h"
#include "quants.h"

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    return x;
}

static float f32_from_bits(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

float bp_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;

    if (exp == 0x1f) /* Inf or NaN: widen the payload */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0) /* normal: rebias 15 -> 127 */
        return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0)
        return f32_from_bits(sign);
    /* Subnormal half: man * 2^-24 is a normal float; shift the leading one into place. */
    int shift = 0;
    while ((man & 0x400) == 0) {
        man <<= 1;
        shift++;
    }
    return f32_from_bits(sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ff) << 13));
}

uint16_t bp_fp32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;

    if (ax > 0x7f800000u) { /* NaN: keep the top payload bits, never let it become Inf */
        uint32_t payload = (ax >> 13) & 0x3ff;
        return (uint16_t)(sign | 0x7c00 | (payload ? payload : 0x200));
    }
    if (ax >= 0x477ff000u) /* >= 65520 rounds past the largest half (65504): Inf */
        return sign | 0x7c00;
    if (ax >= 0x38800000u) { /* normal half: rebias 127 -> 15 and round off 13 bits */
        uint32_t r = ax - 0x38000000u;
        uint32_t q = r >> 13, rem = r & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
            q++; /* a carry into the exponent is still the right encoding */
        return (uint16_t)(sign | q);
    }
    if (ax < 0x33000000u) /* below 2^-25, half the smallest subnormal: zero */
        return sign;
    /* Subnormal half: count units of 2^-24 with the implicit bit made explicit. */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

float bp_bf16_to_fp32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

uint16_t bp_fp32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) { /* NaN: truncate, keeping it a NaN */
        uint16_t h = (uint16_t)(x >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    /* Round to nearest even; overflow carries into the exponent and lands on Inf. */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ---- Row conversions --------------------------------------------------------------------
 *
 * The packed side of every conversion is read and written byte-wise (memcpy of each 16-bit
 * value or scale): rows may sit at any address, such as a tensor of a GGUF file whose
 * general.alignment is 1. Compilers turn the 2-byte memcpy into a plain load or store. */

static uint16_t load16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static void store16(unsigned char *p, uint16_t v)
{
    memcpy(p, &v, sizeof(v));
}

static void f32_to_float(const void *src, float *dst, int64_t n)
{
    memmove(dst, src, (size_t)n * sizeof(float));
}

static void f32_from_float(const float *src, void *dst, int64_t n)
{
    memmove(dst, src, (size_t)n * sizeof(float));
}

static void f16_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bp_fp16_to_fp32(load16(s + 2 * i));
}

static void f16_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *d = dst;
    for (int64_t i = 0; i < n; i++)
        store16(d + 2 * i, bp_fp32_to_fp16(src[i]));
}

static void bf16_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bp_bf16_to_fp32(load16(s + 2 * i));
}

static void bf16_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *d = dst;
    for (int64_t i = 0; i < n; i++)
        store16(d + 2 * i, bp_fp32_to_bf16(src[i]));
}

static void i32_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, s + 4 * i, sizeof(v));
        dst[i] = (float)v;
    }
}

/* Nearest integer, saturating at the int32 range; NaN becomes 0. */
static void i32_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *d = dst;
    for (int64_t i = 0; i < n; i++) {
        float v = src[i];
        int32_t r;
        if (isnan(v))
            r = 0;
        else if (v >= 2147483647.0f)
            r = INT32_MAX;
        else if (v <= -2147483648.0f)
            r = INT32_MIN;
        else
            r = (int32_t)lrintf(v);
        memcpy(d + 4 * i, &r, sizeof(r));
    }
}

/* Blocks as bytes: the f16 scale at offsetof(..., d), the quants at offsetof(..., qs). */
#define Q8_BYTES sizeof(struct bp_block_q8_0)
#define Q4_BYTES sizeof(struct bp_block_q4_0)

static void q8_0_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK8_0; i++, b += Q8_BYTES) {
        const float d = bp_fp16_to_fp32(load16(b + offsetof(struct bp_block_q8_0, d)));
        const int8_t *qs = (const int8_t *)(b + offsetof(struct bp_block_q8_0, qs));
        for (int j = 0; j < BP_QK8_0; j++)
            dst[i * BP_QK8_0 + j] = d * (float)qs[j];
    }
}

/* Symmetric 8-bit: d = max|x| / 127, q = x * (1 / d) rounded half away from zero (roundf), as
 * llama.cpp's quantize_row_q8_0_ref writes files: ties do occur with f16 inputs. */
static void q8_0_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK8_0; i++, b += Q8_BYTES) {
        const float *x = src + i * BP_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < BP_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store16(b + offsetof(struct bp_block_q8_0, d), bp_fp32_to_fp16(d));
        int8_t *qs = (int8_t *)(b + offsetof(struct bp_block_q8_0, qs));
        for (int j = 0; j < BP_QK8_0; j++)
            qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void q4_0_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK4_0; i++, b += Q4_BYTES) {
        const float d = bp_fp16_to_fp32(load16(b + offsetof(struct bp_block_q4_0, d)));
        const uint8_t *qs = b + offsetof(struct bp_block_q4_0, qs);
        for (int j = 0; j < BP_QK4_0 / 2; j++) {
            dst[i * BP_QK4_0 + j] = d * (float)((qs[j] & 0x0f) - 8);
            dst[i * BP_QK4_0 + j + BP_QK4_0 / 2] = d * (float)((qs[j] >> 4) - 8);
        }
    }
}

/* 4-bit with offset 8: the value of largest magnitude maps to -8 exactly (d = max / -8), which
 * gives one more level on its side than a symmetric scale would. */
static void q4_0_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK4_0; i++, b += Q4_BYTES) {
        const float *x = src + i * BP_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < BP_QK4_0; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        store16(b + offsetof(struct bp_block_q4_0, d), bp_fp32_to_fp16(d));
        uint8_t *qs = b + offsetof(struct bp_block_q4_0, qs);
        for (int j = 0; j < BP_QK4_0 / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f);
            int q1 = (int)(x[j + BP_QK4_0 / 2] * id + 8.5f);
            q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
            q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
            qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static const struct bp_type_traits type_traits[BP_TYPE_COUNT] = {
    [BP_TYPE_F32] = {"f32", 1, sizeof(float), false, f32_to_float, f32_from_float},
    [BP_TYPE_F16] = {"f16", 1, sizeof(uint16_t), false, f16_to_float, f16_from_float},
    [BP_TYPE_BF16] = {"bf16", 1, sizeof(uint16_t), false, bf16_to_float, bf16_from_float},
    [BP_TYPE_I32] = {"i32", 1, sizeof(int32_t), false, i32_to_float, i32_from_float},
    [BP_TYPE_Q8_0] = {"q8_0", BP_QK8_0, sizeof(struct bp_block_q8_0), true, q8_0_to_float,
                      q8_0_from_float},
    [BP_TYPE_Q4_0] = {"q4_0", BP_QK4_0, sizeof(struct bp_block_q4_0), true, q4_0_to_float,
                      q4_0_from_float},
    [BP_TYPE_Q4_1] = {"q4_1", BP_QK4_1, sizeof(struct bp_block_q4_1), true, bp__q4_1_to_float,
                      bp__q4_1_from_float},
    [BP_TYPE_Q5_0] = {"q5_0", BP_QK5_0, sizeof(struct bp_block_q5_0), true, bp__q5_0_to_float,
                      bp__q5_0_from_float},
    [BP_TYPE_Q5_1] = {"q5_1", BP_QK5_1, sizeof(struct bp_block_q5_1), true, bp__q5_1_to_float,
                      bp__q5_1_from_float},
    [BP_TYPE_Q8_1] = {"q8_1", BP_QK8_1, sizeof(struct bp_block_q8_1), true, bp__q8_1_to_float,
                      bp__q8_1_from_float},
    [BP_TYPE_Q2_K] = {"q2_K", BP_QK_K, sizeof(struct bp_block_q2_k), true, bp__q2_k_to_float,
                      bp__q2_k_from_float},
    [BP_TYPE_Q3_K] = {"q3_K", BP_QK_K, sizeof(struct bp_block_q3_k), true, bp__q3_k_to_float,
                      bp__q3_k_from_float},
    [BP_TYPE_Q4_K] = {"q4_K", BP_QK_K, sizeof(struct bp_block_q4_k), true, bp__q4_k_to_float,
                      bp__q4_k_from_float},
    [BP_TYPE_Q5_K] = {"q5_K", BP_QK_K, sizeof(struct bp_block_q5_k), true, bp__q5_k_to_float,
                      bp__q5_k_from_float},
    [BP_TYPE_Q6_K] = {"q6_K", BP_QK_K, sizeof(struct bp_block_q6_k), true, bp__q6_k_to_float,
                      bp__q6_k_from_float},
    [BP_TYPE_Q8_K] = {"q8_K", BP_QK_K, sizeof(struct bp_block_q8_k), true, bp__q8_k_to_float,
                      bp__q8_k_from_float},
    [BP_TYPE_IQ4_NL] = {"iq4_nl", BP_QK4_NL, sizeof(struct bp_block_iq4_nl), true,
                        bp__iq4_nl_to_float, bp__iq4_nl_from_float},
    [BP_TYPE_IQ4_XS] = {"iq4_xs", BP_QK_K, sizeof(struct bp_block_iq4_xs), true,
                        bp__iq4_xs_to_float, bp__iq4_xs_from_float},
};

_Static_assert(sizeof(struct bp_block_q8_0) == 34, "Q8_0 block layout");
_Static_assert(sizeof(struct bp_block_q4_0) == 18, "Q4_0 block layout");

static bool type_valid(enum bp_type type)
{
    return (unsigned)type < BP_TYPE_COUNT;
}

const struct bp_type_traits *bp_type_get_traits(enum bp_type type)
{
    if (!type_valid(type)) {
        bp__error(BP_ERR_TYPE, "type %d is not a backplane type (valid: 0..%d)", (int)type,
                  BP_TYPE_COUNT - 1);
        return NULL;
    }
    return &type_traits[type];
}

const char *bp_type_name(enum bp_type type)
{
    return type_valid(type) ? type_traits[type].name : "invalid";
}

enum bp_status bp_type_from_name(const char *name, enum bp_type *out)
{
    if (name == NULL || out == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_type_from_name: name and out must not be NULL");
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        if (strcasecmp(name, type_traits[t].name) == 0) {
            *out = (enum bp_type)t;
            return BP_OK;
        }
    }
    return bp__error(BP_ERR_NOT_FOUND,
                     "unknown type name '%s' (expected f32, f16, bf16, i32, q8_0, q4_0, q4_1, "
                     "q5_0, q5_1, q8_1, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K, iq4_nl or iq4_xs)",
                     name);
}

size_t bp_type_size(enum bp_type type)
{
    return type_valid(type) ? type_traits[type].type_size : 0;
}

int64_t bp_type_block_size(enum bp_type type)
{
    return type_valid(type) ? type_traits[type].block_size : 0;
}

size_t bp_row_size(enum bp_type type, int64_t ne0)
{
    size_t size;
    if (!type_valid(type) || ne0 < 0 || ne0 % type_traits[type].block_size != 0 ||
        !bp__mul_size((size_t)(ne0 / type_traits[type].block_size), type_traits[type].type_size,
                      &size))
        return 0;
    return size;
}
