/* cuda-quants.cuh - private to plugins/cuda: the one place that decodes the quantised weight
 * blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS; ggml's
 * layouts, include/backplane/bp-tensor.h) for every kernel that reads them (cuda-kernels.cu).
 *
 * The unit of decoding is a group of 8 consecutive elements of a block: every type's scale (and
 * minimum) is shared by at least 16 consecutive elements, so a group needs one scale, and the
 * matrix-vector kernel gives each lane of a warp one group at a time (neighbouring lanes read
 * neighbouring bytes). Each formula is runtime/quants.c's (the reference dequantizers), with the
 * same element order and the same order of multiplications, so the host-side check
 * (tests/test-cuda-quants.cu) can demand equal bits. The functions are __host__ __device__ for
 * that check: it compiles this header with nvcc and compares with the runtime on the CPU, no GPU
 * needed. On the device, nvcc may fuse a multiply and an add (Q4_1, Q5_1, the k-quants'
 * minimums), which changes the last bit at most. */
#ifndef BP_CUDA_QUANTS_CUH
#define BP_CUDA_QUANTS_CUH

#include <stdint.h>
#include <string.h>

#include <cuda_fp16.h>
#include <vector_types.h>

#include "cuda-impl.h"

#define BPQ_FN static __host__ __device__ __forceinline__

/* Elements per block, and bytes per block, of a quantised type; 0 for any other type. */
BPQ_FN int bpq_block_elems(int type)
{
    switch (type) {
    case CU_Q8_0: case CU_Q4_0: case CU_Q4_1: case CU_Q5_0: case CU_Q5_1: case CU_IQ4_NL:
        return 32;
    case CU_Q2_K: case CU_Q3_K: case CU_Q4_K: case CU_Q5_K: case CU_Q6_K: case CU_IQ4_XS:
        return 256;
    default:
        return 0;
    }
}

BPQ_FN int bpq_block_bytes(int type)
{
    switch (type) {
    case CU_Q8_0: return 34;
    case CU_Q4_0: return 18;
    case CU_Q4_1: return 20;
    case CU_Q5_0: return 22;
    case CU_Q5_1: return 24;
    case CU_Q2_K: return 84;
    case CU_Q3_K: return 110;
    case CU_Q4_K: return 144;
    case CU_Q5_K: return 176;
    case CU_Q6_K: return 210;
    case CU_IQ4_NL: return 18;
    case CU_IQ4_XS: return 136;
    default: return 0;
    }
}

BPQ_FN bool bpq_is_quant(int type)
{
    return bpq_block_elems(type) != 0;
}

/* A 16-bit field. Every block size is even and rows start at even addresses, so on the device
 * it is one aligned load; the host reads bytes, as the runtime does. */
BPQ_FN uint16_t bpq_u16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
#endif
}

BPQ_FN float bpq_half(const uint8_t *p)
{
    __half_raw r;
    r.x = bpq_u16(p);
    return __half2float(__half(r));
}

/* Q5_0's and Q5_1's 32 fifth bits (little-endian), at an even but maybe not 4-aligned offset. */
BPQ_FN uint32_t bpq_u32(const uint8_t *p)
{
    return (uint32_t)bpq_u16(p) | ((uint32_t)bpq_u16(p + 2) << 16);
}

/* IQ4_NL's and IQ4_XS's table (ggml's kvalues_iq4nl: -127, -104, -83, -65, -49, -35, -22, -10,
 * 1, 13, 25, 38, 53, 69, 89, 113), one byte per value in two constants, so that no memory
 * table has to exist on both sides. */
BPQ_FN float bpq_iq4nl(int i)
{
    const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
    return (float)(int8_t)(uint8_t)(((i < 8 ? lo : hi) >> (8 * (i & 7))) & 0xff);
}

/* Nibble n of the 4-bit layout shared by Q4_0, Q4_1, Q5_*, IQ4_NL and each 32 of IQ4_XS: element
 * j (< 16) in the low nibble of qs[j], element j + 16 in the high one. */
BPQ_FN int bpq_nib(const uint8_t *qs, int e)
{
    return e < 16 ? (qs[e] & 0x0f) : (qs[e - 16] >> 4);
}

/* Q3_K's scale idx (0..15) of its 12 packed bytes, offset 32 removed (bp__q3_k_scales). */
BPQ_FN int bpq_q3k_scale(const uint8_t *packed, int idx)
{
    const int low = idx < 8 ? (packed[idx] & 0xf) : (packed[idx - 8] >> 4);
    const int high = (packed[8 + idx % 4] >> (2 * (idx / 4))) & 3;
    return (low | (high << 4)) - 32;
}

/* Q4_K's and Q5_K's scale and minimum j (0..7) of their 12 packed bytes (bp__k4_scale_min). */
BPQ_FN void bpq_k4_scale_min(int j, const uint8_t *q, int *d, int *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- The 32-element types: elements 8g .. 8g + 7 of block b (g 0..3) into w -------------- */

BPQ_FN void bpq_decode8_32(const uint8_t *b, int type, int g, float *w)
{
    const int e0 = 8 * g;
    const float d = bpq_half(b);
    switch (type) {
    case CU_Q8_0:
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)((const int8_t *)(b + 2))[e0 + i];
        break;
    case CU_Q4_0:
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)(bpq_nib(b + 2, e0 + i) - 8);
        break;
    case CU_Q4_1: {
        const float m = bpq_half(b + 2);
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)bpq_nib(b + 4, e0 + i) + m;
        break;
    }
    case CU_Q5_0: {
        const uint32_t qh = bpq_u32(b + 2);
        for (int i = 0; i < 8; i++) /* the fifth bit of element e is bit e of qh */
            w[i] = d * (float)((bpq_nib(b + 6, e0 + i) | (int)(((qh >> (e0 + i)) & 1) << 4)) - 16);
        break;
    }
    case CU_Q5_1: {
        const float m = bpq_half(b + 2);
        const uint32_t qh = bpq_u32(b + 4);
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)(bpq_nib(b + 8, e0 + i) | (int)(((qh >> (e0 + i)) & 1) << 4)) + m;
        break;
    }
    default: /* CU_IQ4_NL */
        for (int i = 0; i < 8; i++)
            w[i] = d * bpq_iq4nl(bpq_nib(b + 2, e0 + i));
        break;
    }
}

/* ---- The 256-element types: elements 8g .. 8g + 7 of super-block b (g 0..31) into w ------- */

/* Q2_K: 2 halves of 128, each 8 groups of 16 with a 4-bit scale and minimum; the 16 values of
 * group j sit in bytes 16 (j % 2) of the half's 32, at bit 2 (j / 2). */
BPQ_FN void bpq_decode8_q2_k(const uint8_t *b, int g, float *w)
{
    const int half = g / 16, j = (g % 16) / 2, l0 = 8 * (g % 2);
    const int s = b[half * 8 + j], shift = 2 * (j / 2);
    const float d = bpq_half(b + 80), dmin = bpq_half(b + 82);
    const float dl = d * (float)(s & 0xf), ml = dmin * (float)(s >> 4);
    const uint8_t *qq = b + 16 + 32 * half + 16 * (j % 2) + l0;
    for (int i = 0; i < 8; i++)
        w[i] = dl * (float)((qq[i] >> shift) & 3) - ml;
}

/* Q3_K: Q2_K's arrangement of the low 2 bits; the high bit of element (half, j, l) is bit
 * 4 half + j / 2 of hmask[16 (j % 2) + l], and a clear bit subtracts 4. */
BPQ_FN void bpq_decode8_q3_k(const uint8_t *b, int g, float *w)
{
    const int half = g / 16, j = (g % 16) / 2, l0 = 8 * (g % 2);
    const int shift = 2 * (j / 2), off = 16 * (j % 2) + l0;
    const int m = 1 << (4 * half + j / 2);
    const float dl = bpq_half(b + 108) * (float)bpq_q3k_scale(b + 96, half * 8 + j);
    const uint8_t *hm = b + off, *q = b + 32 + 32 * half + off;
    for (int i = 0; i < 8; i++)
        w[i] = dl * (float)(((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
}

/* Q4_K and Q5_K: 4 chunks of 64, the first 32 in the low nibbles of the chunk's 32 bytes of qs
 * and the next 32 in the high ones, scale and minimum sub = 2 chunk + (which nibble); Q5_K's
 * fifth bit of element l of sub-block sub is bit sub of qh[l]. */
BPQ_FN void bpq_decode8_q45_k(const uint8_t *b, int type, int g, float *w)
{
    const int chunk = g / 8, upper = (g % 8) / 4, l0 = 8 * (g % 4), sub = 2 * chunk + upper;
    int s, m;
    bpq_k4_scale_min(sub, b + 4, &s, &m);
    const float d1 = bpq_half(b) * (float)s, m1 = bpq_half(b + 2) * (float)m;
    const bool five = type == CU_Q5_K;
    const uint8_t *qs = b + (five ? 48 : 16) + 32 * chunk + l0, *qh = b + 16 + l0;
    for (int i = 0; i < 8; i++) {
        int q = upper ? (qs[i] >> 4) : (qs[i] & 0xf);
        if (five)
            q += (qh[i] >> sub) & 1 ? 16 : 0;
        w[i] = d1 * (float)q - m1;
    }
}

/* Q6_K: 2 halves of 128, each 4 quarters k of 32: low 4 bits in nibble k / 2 of ql[32 (k % 2)
 * + l], high 2 bits at bit 2 k of qh[l], signed 8-bit scale per 16. */
BPQ_FN void bpq_decode8_q6_k(const uint8_t *b, int g, float *w)
{
    const int half = g / 16, k = (g % 16) / 4, l0 = 8 * (g % 4);
    const uint8_t *ql = b + 64 * half + 32 * (k % 2) + l0, *qh = b + 128 + 32 * half + l0;
    const int sc = ((const int8_t *)(b + 192))[8 * half + l0 / 16 + 2 * k];
    const float dl = bpq_half(b + 208) * (float)sc;
    for (int i = 0; i < 8; i++) {
        const int q = (((ql[i] >> (4 * (k / 2))) & 0xf) | (((qh[i] >> (2 * k)) & 3) << 4)) - 32;
        w[i] = dl * (float)q;
    }
}

/* IQ4_XS: 8 blocks of 32 in IQ4_NL's nibble layout, each with a 6-bit scale (offset 32): low
 * 4 bits in nibble ib % 2 of scales_l[ib / 2], high 2 bits at bit 2 ib of scales_h. */
BPQ_FN void bpq_decode8_iq4_xs(const uint8_t *b, int g, float *w)
{
    const int ib = g / 4, e0 = 8 * (g % 4);
    const int sh = bpq_u16(b + 2);
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
    const float dl = bpq_half(b) * (float)(ls - 32);
    for (int i = 0; i < 8; i++)
        w[i] = dl * bpq_iq4nl(bpq_nib(b + 8 + 16 * ib, e0 + i));
}

/* Elements 8g .. 8g + 7 of the block at b of any quantised type. */
BPQ_FN void bpq_decode8(const uint8_t *b, int type, int g, float *w)
{
    switch (type) {
    case CU_Q2_K: bpq_decode8_q2_k(b, g, w); break;
    case CU_Q3_K: bpq_decode8_q3_k(b, g, w); break;
    case CU_Q4_K: case CU_Q5_K: bpq_decode8_q45_k(b, type, g, w); break;
    case CU_Q6_K: bpq_decode8_q6_k(b, g, w); break;
    case CU_IQ4_XS: bpq_decode8_iq4_xs(b, g, w); break;
    default: bpq_decode8_32(b, type, g, w); break;
    }
}

/* Element k of a row of blocks starting at row (k counted from the row's first element). */
BPQ_FN float bpq_get(const char *row, int type, int64_t k)
{
    const int qk = bpq_block_elems(type);
    const uint8_t *b = (const uint8_t *)row + (k / qk) * bpq_block_bytes(type);
    const int e = (int)(k % qk);
    if (type == CU_Q8_0) /* one value alone, for attention's Q8_0 keys and values */
        return bpq_half(b) * (float)((const int8_t *)(b + 2))[e];
    if (type == CU_Q4_0)
        return bpq_half(b) * (float)(bpq_nib(b + 2, e) - 8);
    float w[8];
    bpq_decode8(b, type, e / 8, w);
    float v = w[0];
    for (int i = 1; i < 8; i++) /* a select, not an index: w stays in registers */
        v = (int)(k % 8) == i ? w[i] : v;
    return v;
}

/* ---- The matrix-vector product's inner loop ------------------------------------------------ */

#define BPQ_DOT_COLS 4

/* Lane `lane` (0..31) of a warp's share of the products of one row of K quantised weights at
 * arow with nc (<= BPQ_DOT_COLS) F32 columns (column c at bcol + c nb1, elements nb0 apart),
 * added to acc[0..nc): the lane takes the groups of 8 numbered lane, lane + 32, ... of the row,
 * so neighbouring lanes decode neighbouring groups and every group is decoded once for all nc
 * columns. The warp's sum of acc is the product. */
BPQ_FN void bpq_dot_lane(const uint8_t *arow, int type, int64_t K, const char *bcol, int64_t nb0,
                         int64_t nb1, int nc, int lane, float *acc)
{
    const int groups = bpq_block_elems(type) / 8, bytes = bpq_block_bytes(type);
    for (int64_t u = lane; u < K / 8; u += 32) {
        float wv[8];
        bpq_decode8(arow + (u / groups) * bytes, type, (int)(u % groups), wv);
        for (int c = 0; c < BPQ_DOT_COLS; c++) {
            if (c >= nc)
                break;
            const char *x = bcol + c * nb1 + u * 8 * nb0;
            float xv[8];
            if (nb0 == 4 && ((uintptr_t)x & 15) == 0) { /* dense columns: two 16-byte loads */
                const float4 p = ((const float4 *)x)[0], q = ((const float4 *)x)[1];
                xv[0] = p.x, xv[1] = p.y, xv[2] = p.z, xv[3] = p.w;
                xv[4] = q.x, xv[5] = q.y, xv[6] = q.z, xv[7] = q.w;
            } else {
                for (int i = 0; i < 8; i++)
                    xv[i] = *(const float *)(x + i * nb0);
            }
            float part = 0.0f;
            for (int i = 0; i < 8; i++)
                part += wv[i] * xv[i];
            acc[c] += part;
        }
    }
}

#endif
