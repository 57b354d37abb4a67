/* quants.c - the block types beyond Q8_0/Q4_0: Q4_1, Q5_0, Q5_1, Q8_1, the k-quants (Q2_K to
 * Q6_K, Q8_K) and the non-linear IQ4_NL/IQ4_XS, in ggml's layouts bit for bit (GGUF files are
 * shared with llama.cpp).
 *
 * The dequantizers are the reference: each multiplies in the same order as the gguf package's
 * numpy code (gguf.quants.dequantize) in single precision, so they agree with it bit for bit;
 * the library is built for the baseline ISA, so no multiply-add is fused. Kernels in plugins
 * may differ within the conformance bounds. Packed data may sit at any address: every 16- and
 * 32-bit field is read with memcpy. */
#include "config.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "bp-impl.h"
#include "quants.h"

static float half_at(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return bp_fp16_to_fp32(h);
}

static void put_half(unsigned char *p, float f)
{
    const uint16_t h = bp_fp32_to_fp16(f);
    memcpy(p, &h, sizeof(h));
}

static uint32_t u32_at(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The 16 values of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl). */
const int8_t bp__iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

#define FIELD(type, f) offsetof(struct type, f)

/* ---- Dequantizers ------------------------------------------------------------------------- */

void bp__q4_1_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK4_1; i++, b += sizeof(struct bp_block_q4_1)) {
        const float d = half_at(b + FIELD(bp_block_q4_1, d));
        const float m = half_at(b + FIELD(bp_block_q4_1, m));
        const uint8_t *qs = b + FIELD(bp_block_q4_1, qs);
        float *y = dst + i * BP_QK4_1;
        for (int j = 0; j < BP_QK4_1 / 2; j++) {
            y[j] = d * (float)(qs[j] & 0x0f) + m;
            y[j + BP_QK4_1 / 2] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

void bp__q5_0_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK5_0; i++, b += sizeof(struct bp_block_q5_0)) {
        const float d = half_at(b + FIELD(bp_block_q5_0, d));
        const uint32_t qh = u32_at(b + FIELD(bp_block_q5_0, qh));
        const uint8_t *qs = b + FIELD(bp_block_q5_0, qs);
        float *y = dst + i * BP_QK5_0;
        for (int j = 0; j < BP_QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) << 4) & 0x10, h1 = (int)(qh >> (j + 12)) & 0x10;
            y[j] = d * (float)(((qs[j] & 0x0f) | h0) - 16);
            y[j + BP_QK5_0 / 2] = d * (float)(((qs[j] >> 4) | h1) - 16);
        }
    }
}

void bp__q5_1_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK5_1; i++, b += sizeof(struct bp_block_q5_1)) {
        const float d = half_at(b + FIELD(bp_block_q5_1, d));
        const float m = half_at(b + FIELD(bp_block_q5_1, m));
        const uint32_t qh = u32_at(b + FIELD(bp_block_q5_1, qh));
        const uint8_t *qs = b + FIELD(bp_block_q5_1, qs);
        float *y = dst + i * BP_QK5_1;
        for (int j = 0; j < BP_QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) << 4) & 0x10, h1 = (int)(qh >> (j + 12)) & 0x10;
            y[j] = d * (float)((qs[j] & 0x0f) | h0) + m;
            y[j + BP_QK5_1 / 2] = d * (float)((qs[j] >> 4) | h1) + m;
        }
    }
}

void bp__q8_1_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK8_1; i++, b += sizeof(struct bp_block_q8_1)) {
        const float d = half_at(b + FIELD(bp_block_q8_1, d));
        const int8_t *qs = (const int8_t *)(b + FIELD(bp_block_q8_1, qs));
        for (int j = 0; j < BP_QK8_1; j++)
            dst[i * BP_QK8_1 + j] = d * (float)qs[j];
    }
}

void bp__q2_k_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q2_k)) {
        const float d = half_at(b + FIELD(bp_block_q2_k, d));
        const float dmin = half_at(b + FIELD(bp_block_q2_k, dmin));
        const uint8_t *sc = b + FIELD(bp_block_q2_k, scales);
        const uint8_t *q = b + FIELD(bp_block_q2_k, qs);
        float *y = dst + i * BP_QK_K;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int j = 0; j < 8; j++) { /* 8 groups of 16: shift 2*(j/2), bytes 16*(j%2) */
                const int s = sc[half * 8 + j], shift = 2 * (j / 2);
                const float dl = d * (float)(s & 0xf), ml = dmin * (float)(s >> 4);
                const uint8_t *qq = q + 16 * (j % 2);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((qq[l] >> shift) & 3) - ml;
            }
        }
    }
}

/* Q3_K's 16 6-bit scales (offset 32 removed) from their 12 packed bytes. */
void bp__q3_k_scales(const uint8_t *packed, int8_t *scales)
{
    for (int j = 0; j < 16; j++) {
        const int low = j < 8 ? (packed[j] & 0xf) : (packed[j - 8] >> 4);
        const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        scales[j] = (int8_t)((low | (high << 4)) - 32);
    }
}

void bp__q3_k_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q3_k)) {
        const float d = half_at(b + FIELD(bp_block_q3_k, d));
        const uint8_t *hm = b + FIELD(bp_block_q3_k, hmask);
        const uint8_t *q = b + FIELD(bp_block_q3_k, qs);
        int8_t sc[16];
        bp__q3_k_scales(b + FIELD(bp_block_q3_k, scales), sc);
        float *y = dst + i * BP_QK_K;
        int m = 1;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int j = 0; j < 8; j++) {
                const int shift = 2 * (j / 2), off = 16 * (j % 2);
                const float dl = d * (float)sc[half * 8 + j];
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)(((q[off + l] >> shift) & 3) -
                                        ((hm[off + l] & m) ? 0 : 4));
                if (j % 2 == 1)
                    m <<= 1;
            }
        }
    }
}

/* Scale and minimum j (0..7) of Q4_K/Q5_K's 12 packed bytes. */
void bp__k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void bp__q4_k_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q4_k)) {
        const float d = half_at(b + FIELD(bp_block_q4_k, d));
        const float dmin = half_at(b + FIELD(bp_block_q4_k, dmin));
        const uint8_t *scales = b + FIELD(bp_block_q4_k, scales);
        const uint8_t *q = b + FIELD(bp_block_q4_k, qs);
        float *y = dst + i * BP_QK_K;
        for (int j = 0; j < 4; j++, q += 32) {
            uint8_t s, m;
            bp__k4_scale_min(2 * j, scales, &s, &m);
            const float d1 = d * (float)s, m1 = dmin * (float)m;
            bp__k4_scale_min(2 * j + 1, scales, &s, &m);
            const float d2 = d * (float)s, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void bp__q5_k_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q5_k)) {
        const float d = half_at(b + FIELD(bp_block_q5_k, d));
        const float dmin = half_at(b + FIELD(bp_block_q5_k, dmin));
        const uint8_t *scales = b + FIELD(bp_block_q5_k, scales);
        const uint8_t *qh = b + FIELD(bp_block_q5_k, qh);
        const uint8_t *ql = b + FIELD(bp_block_q5_k, qs);
        float *y = dst + i * BP_QK_K;
        for (int j = 0; j < 4; j++, ql += 32) {
            uint8_t s, m;
            bp__k4_scale_min(2 * j, scales, &s, &m);
            const float d1 = d * (float)s, m1 = dmin * (float)m;
            bp__k4_scale_min(2 * j + 1, scales, &s, &m);
            const float d2 = d * (float)s, m2 = dmin * (float)m;
            const int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

void bp__q6_k_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q6_k)) {
        const float d = half_at(b + FIELD(bp_block_q6_k, d));
        const uint8_t *ql = b + FIELD(bp_block_q6_k, ql);
        const uint8_t *qh = b + FIELD(bp_block_q6_k, qh);
        const int8_t *sc = (const int8_t *)(b + FIELD(bp_block_q6_k, scales));
        float *y = dst + i * BP_QK_K;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void bp__q8_k_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q8_k)) {
        float d;
        memcpy(&d, b + FIELD(bp_block_q8_k, d), sizeof(d));
        const int8_t *qs = (const int8_t *)(b + FIELD(bp_block_q8_k, qs));
        for (int j = 0; j < BP_QK_K; j++)
            dst[i * BP_QK_K + j] = d * (float)qs[j];
    }
}

void bp__iq4_nl_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK4_NL; i++, b += sizeof(struct bp_block_iq4_nl)) {
        const float d = half_at(b + FIELD(bp_block_iq4_nl, d));
        const uint8_t *qs = b + FIELD(bp_block_iq4_nl, qs);
        float *y = dst + i * BP_QK4_NL;
        for (int j = 0; j < BP_QK4_NL / 2; j++) {
            y[j] = d * (float)bp__iq4nl_values[qs[j] & 0xf];
            y[j + BP_QK4_NL / 2] = d * (float)bp__iq4nl_values[qs[j] >> 4];
        }
    }
}

void bp__iq4_xs_to_float(const void *src, float *dst, int64_t n)
{
    const unsigned char *b = src;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_iq4_xs)) {
        const float d = half_at(b + FIELD(bp_block_iq4_xs, d));
        uint16_t sh;
        memcpy(&sh, b + FIELD(bp_block_iq4_xs, scales_h), sizeof(sh));
        const uint8_t *sl = b + FIELD(bp_block_iq4_xs, scales_l);
        const uint8_t *qs = b + FIELD(bp_block_iq4_xs, qs);
        float *y = dst + i * BP_QK_K;
        for (int ib = 0; ib < BP_QK_K / 32; ib++, y += 32, qs += 16) {
            const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)bp__iq4nl_values[qs[j] & 0xf];
                y[j + 16] = dl * (float)bp__iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

/* ---- Quantizers of the simple types (ggml's reference rules) ------------------------------ */

/* Bit 4 of q (0..31) of element j into qh, the low 4 bits into the nibble of qs. */
static void put5(uint8_t *qs, uint32_t *qh, int j, int q0, int q1)
{
    qs[j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
    *qh |= (uint32_t)((q0 & 0x10) >> 4) << j;
    *qh |= (uint32_t)((q1 & 0x10) >> 4) << (j + 16);
}

static void min_max(const float *x, int n, float *min, float *max)
{
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < n; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *min = lo;
    *max = hi;
}

static int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Asymmetric 4-bit: d = (max - min) / 15, m = min, q = round((x - min) / d). */
void bp__q4_1_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK4_1; i++, b += sizeof(struct bp_block_q4_1)) {
        const float *x = src + i * BP_QK4_1;
        float min, max;
        min_max(x, BP_QK4_1, &min, &max);
        const float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(b + FIELD(bp_block_q4_1, d), d);
        put_half(b + FIELD(bp_block_q4_1, m), min);
        uint8_t *qs = b + FIELD(bp_block_q4_1, qs);
        for (int j = 0; j < BP_QK4_1 / 2; j++) {
            const int q0 = clamp_int((int)((x[j] - min) * id + 0.5f), 0, 15);
            const int q1 = clamp_int((int)((x[j + BP_QK4_1 / 2] - min) * id + 0.5f), 0, 15);
            qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* 5-bit with offset 16: the value of largest magnitude maps to -16 (d = max / -16). */
void bp__q5_0_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK5_0; i++, b += sizeof(struct bp_block_q5_0)) {
        const float *x = src + i * BP_QK5_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < BP_QK5_0; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(b + FIELD(bp_block_q5_0, d), d);
        uint8_t *qs = b + FIELD(bp_block_q5_0, qs);
        uint32_t qh = 0;
        for (int j = 0; j < BP_QK5_0 / 2; j++)
            put5(qs, &qh, j, clamp_int((int)(x[j] * id + 16.5f), 0, 31),
                 clamp_int((int)(x[j + BP_QK5_0 / 2] * id + 16.5f), 0, 31));
        memcpy(b + FIELD(bp_block_q5_0, qh), &qh, sizeof(qh));
    }
}

/* Asymmetric 5-bit: d = (max - min) / 31, m = min. */
void bp__q5_1_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK5_1; i++, b += sizeof(struct bp_block_q5_1)) {
        const float *x = src + i * BP_QK5_1;
        float min, max;
        min_max(x, BP_QK5_1, &min, &max);
        const float d = (max - min) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(b + FIELD(bp_block_q5_1, d), d);
        put_half(b + FIELD(bp_block_q5_1, m), min);
        uint8_t *qs = b + FIELD(bp_block_q5_1, qs);
        uint32_t qh = 0;
        for (int j = 0; j < BP_QK5_1 / 2; j++)
            put5(qs, &qh, j, clamp_int((int)((x[j] - min) * id + 0.5f), 0, 31),
                 clamp_int((int)((x[j + BP_QK5_1 / 2] - min) * id + 0.5f), 0, 31));
        memcpy(b + FIELD(bp_block_q5_1, qh), &qh, sizeof(qh));
    }
}

/* Symmetric 8-bit with the scaled sum: d = max|x| / 127, s = d * sum(q). */
void bp__q8_1_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK8_1; i++, b += sizeof(struct bp_block_q8_1)) {
        const float *x = src + i * BP_QK8_1;
        float amax = 0.0f;
        for (int j = 0; j < BP_QK8_1; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t *qs = (int8_t *)(b + FIELD(bp_block_q8_1, qs));
        int sum = 0;
        for (int j = 0; j < BP_QK8_1; j++) {
            qs[j] = (int8_t)lrintf(x[j] * id);
            sum += qs[j];
        }
        put_half(b + FIELD(bp_block_q8_1, d), d);
        put_half(b + FIELD(bp_block_q8_1, s), (float)sum * d);
    }
}

/* 8-bit super-blocks: the value of largest magnitude maps to -127 exactly (its sign kept in
 * d), and the sums of each 16 values are kept for the k-quants' minimums. */
void bp__q8_k_from_float(const float *src, void *dst, int64_t n)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct bp_block_q8_k)) {
        const float *x = src + i * BP_QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < BP_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        int8_t *qs = (int8_t *)(b + FIELD(bp_block_q8_k, qs));
        int16_t sums[BP_QK_K / 16] = {0};
        float d = 0.0f;
        if (amax != 0.0f) {
            const float iscale = -127.0f / max;
            for (int j = 0; j < BP_QK_K; j++) {
                const int v = (int)lrintf(iscale * x[j]);
                qs[j] = (int8_t)(v > 127 ? 127 : v);
            }
            d = 1.0f / iscale;
        } else {
            memset(qs, 0, BP_QK_K);
        }
        for (int j = 0; j < BP_QK_K; j++)
            sums[j / 16] = (int16_t)(sums[j / 16] + qs[j]);
        memcpy(b + FIELD(bp_block_q8_k, d), &d, sizeof(d));
        memcpy(b + FIELD(bp_block_q8_k, bsums), sums, sizeof(sums));
    }
}

/* ---- Whole rows ---------------------------------------------------------------------------- */

typedef void (*weighted_fn)(const float *src, void *dst, int64_t n, const float *imatrix);

/* The quantizer of type that weighs its errors by an importance matrix; NULL if none does. */
static weighted_fn weighted_quantizer(enum bp_type type)
{
    switch (type) {
    case BP_TYPE_Q2_K: return bp__q2_k_quantize;
    case BP_TYPE_Q3_K: return bp__q3_k_quantize;
    case BP_TYPE_Q4_K: return bp__q4_k_quantize;
    case BP_TYPE_Q5_K: return bp__q5_k_quantize;
    case BP_TYPE_Q6_K: return bp__q6_k_quantize;
    case BP_TYPE_IQ4_NL: return bp__iq4_nl_quantize;
    case BP_TYPE_IQ4_XS: return bp__iq4_xs_quantize;
    default: return NULL;
    }
}

static bool is_legacy(enum bp_type type)
{
    return type == BP_TYPE_Q4_0 || type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_0 ||
           type == BP_TYPE_Q5_1;
}

/* An importance is a mean square: finite and not negative. */
static enum bp_status check_imatrix(const float *imatrix, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        if (!(isfinite(imatrix[j]) && imatrix[j] >= 0.0f))
            return bp__error(BP_ERR_INVALID_ARG, "bp_quantize_rows: imatrix[%lld] is %g; "
                             "importances must be finite and not negative", (long long)j,
                             (double)imatrix[j]);
    return BP_OK;
}

size_t bp_quantize_rows(enum bp_type type, const float *src, void *dst, int64_t n_rows,
                        int64_t n_per_row, const float *imatrix)
{
    const struct bp_type_traits *tr = bp_type_get_traits(type);
    if (tr == NULL)
        return 0;
    if (src == NULL || dst == NULL)
        return bp__error(BP_ERR_INVALID_ARG, "bp_quantize_rows: src and dst must not be NULL"),
               0;
    if (tr->from_float == NULL)
        return bp__error(BP_ERR_UNSUPPORTED, "bp_quantize_rows: there is no quantiser for %s",
                         tr->name), 0;
    const size_t row = bp_row_size(type, n_per_row);
    size_t total;
    if (n_rows < 0 || n_per_row <= 0 || row == 0 || !bp__mul_size(row, (size_t)n_rows, &total))
        return bp__error(BP_ERR_SHAPE, "bp_quantize_rows: %lld rows of %lld elements do not fit "
                         "%s (rows must be positive multiples of %lld elements)",
                         (long long)n_rows, (long long)n_per_row, tr->name,
                         (long long)tr->block_size), 0;
    const weighted_fn weighted = imatrix != NULL ? weighted_quantizer(type) : NULL;
    const bool legacy = imatrix != NULL && is_legacy(type);
    if (imatrix != NULL && check_imatrix(imatrix, n_per_row) != BP_OK)
        return 0;
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = src + r * n_per_row;
        void *y = (char *)dst + (size_t)r * row;
        if (weighted != NULL)
            weighted(x, y, n_per_row, imatrix);
        else if (legacy)
            bp__legacy_quantize(type, x, y, n_per_row, imatrix);
        else
            tr->from_float(x, y, n_per_row);
    }
    return total;
}

_Static_assert(sizeof(struct bp_block_q4_1) == 20, "Q4_1 block layout");
_Static_assert(sizeof(struct bp_block_q5_0) == 22, "Q5_0 block layout");
_Static_assert(sizeof(struct bp_block_q5_1) == 24, "Q5_1 block layout");
_Static_assert(sizeof(struct bp_block_q8_1) == 36, "Q8_1 block layout");
_Static_assert(sizeof(struct bp_block_q2_k) == 84, "Q2_K block layout");
_Static_assert(sizeof(struct bp_block_q3_k) == 110, "Q3_K block layout");
_Static_assert(sizeof(struct bp_block_q4_k) == 144, "Q4_K block layout");
_Static_assert(sizeof(struct bp_block_q5_k) == 176, "Q5_K block layout");
_Static_assert(sizeof(struct bp_block_q6_k) == 210, "Q6_K block layout");
_Static_assert(sizeof(struct bp_block_q8_k) == 292, "Q8_K block layout");
_Static_assert(sizeof(struct bp_block_iq4_nl) == 18, "IQ4_NL block layout");
_Static_assert(sizeof(struct bp_block_iq4_xs) == 136, "IQ4_XS block layout");
