/* test-cuda-quants.cu - the CUDA plugin's block decoders (plugins/cuda/cuda-quants.cuh) run on
 * the CPU against the runtime's dequantizers (bp_type_get_traits()->to_float), so that every
 * type's decoding is checked on a machine without a GPU. The decoders are __host__ __device__:
 * this file is compiled by nvcc like the kernels, and the host copy of each function is the same
 * source as the device copy. Random blocks (every bit pattern of the packed values, finite fp16
 * scales of both signs and many magnitudes) must decode to the same bits, group by group
 * (bpq_decode8, what the matrix-vector kernel uses) and element by element (bpq_get, what
 * GET_ROWS, copies and the GEMM conversion use); and the matrix-vector kernel's inner loop
 * (bpq_dot_lane), run for the 32 lanes of a warp, against products in double. Exit 0 when all
 * agree, 1 otherwise. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

#include "cuda-quants.cuh"

#define N_BLOCKS 97

/* Where a type keeps its fp16 scales (and minimums): set to finite values after the random
 * fill, as a real file has them. */
struct layout {
    int type;
    size_t half_at[2];
    int n_halves;
};

static const struct layout layouts[] = {
    {CU_Q8_0, {offsetof(struct bp_block_q8_0, d)}, 1},
    {CU_Q4_0, {offsetof(struct bp_block_q4_0, d)}, 1},
    {CU_Q4_1, {offsetof(struct bp_block_q4_1, d), offsetof(struct bp_block_q4_1, m)}, 2},
    {CU_Q5_0, {offsetof(struct bp_block_q5_0, d)}, 1},
    {CU_Q5_1, {offsetof(struct bp_block_q5_1, d), offsetof(struct bp_block_q5_1, m)}, 2},
    {CU_Q2_K, {offsetof(struct bp_block_q2_k, d), offsetof(struct bp_block_q2_k, dmin)}, 2},
    {CU_Q3_K, {offsetof(struct bp_block_q3_k, d)}, 1},
    {CU_Q4_K, {offsetof(struct bp_block_q4_k, d), offsetof(struct bp_block_q4_k, dmin)}, 2},
    {CU_Q5_K, {offsetof(struct bp_block_q5_k, d), offsetof(struct bp_block_q5_k, dmin)}, 2},
    {CU_Q6_K, {offsetof(struct bp_block_q6_k, d)}, 1},
    {CU_IQ4_NL, {offsetof(struct bp_block_iq4_nl, d)}, 1},
    {CU_IQ4_XS, {offsetof(struct bp_block_iq4_xs, d)}, 1},
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

/* A finite fp16 of either sign, magnitude 2^-14 .. 2^3. */
static uint16_t random_half(void)
{
    const uint16_t exponent = (uint16_t)(1 + next() % 17), mantissa = (uint16_t)(next() & 0x3ff);
    return (uint16_t)((next() & 1) << 15 | exponent << 10 | mantissa);
}

static bool same(float a, float b)
{
    return memcmp(&a, &b, sizeof(a)) == 0;
}

/* The matrix-vector kernel's inner loop (bpq_dot_lane) run for all 32 lanes of a warp on the
 * one row of K weights at blocks (ref: their values), against products in double: with dense
 * 16-byte aligned columns (the float4 loads) and with columns of every other float (the scalar
 * loads), 3 columns each. A group of 8 that no lane or two lanes took, or the wrong block's
 * bytes, moves a product by far more than the bound of float accumulation (1e-5 of the sum of
 * |w x|). Returns the number of failures. */
static int check_dot(const char *name, int type, const uint8_t *blocks, const float *ref,
                     int64_t K)
{
    enum { NC = 3 };
    float *x = (float *)aligned_alloc(16, sizeof(float) * (size_t)(2 * K * NC));
    for (int64_t i = 0; i < 2 * K * NC; i++)
        x[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
    int bad = 0;
    for (int strided = 0; strided < 2; strided++) {
        const int64_t nb0 = strided ? 8 : 4, nb1 = K * nb0;
        float acc[BPQ_DOT_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int lane = 0; lane < 32; lane++) {
            float part[BPQ_DOT_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
            bpq_dot_lane(blocks, type, K, (const char *)x, nb0, nb1, NC, lane, part);
            for (int c = 0; c < BPQ_DOT_COLS; c++)
                acc[c] += part[c];
        }
        for (int c = 0; c < BPQ_DOT_COLS; c++) {
            double want = 0.0, mag = 0.0;
            for (int64_t k = 0; c < NC && k < K; k++) {
                const double xv = x[(c * nb1 + k * nb0) / 4];
                want += (double)ref[k] * xv;
                mag += fabs((double)ref[k] * xv);
            }
            if (fabs((double)acc[c] - want) > 1e-5 * mag) {
                printf("FAIL: %s dot (%s columns) column %d: %.9g, want %.9g\n", name,
                       strided ? "strided" : "dense", c, acc[c], want);
                bad++;
            }
        }
    }
    free(x);
    printf("%s %s: matrix-vector inner loop, %lld weights x %d columns, dense and strided\n",
           bad ? "FAIL" : "ok", name, (long long)K, NC);
    return bad;
}

/* Checks one type; returns the number of mismatches (the first few printed). */
static int check_type(const struct layout *l)
{
    const struct bp_type_traits *tr = bp_type_get_traits((enum bp_type)l->type);
    const int qk = bpq_block_elems(l->type), bytes = bpq_block_bytes(l->type);
    if (tr == NULL || tr->to_float == NULL || tr->block_size != qk ||
        tr->type_size != (size_t)bytes) {
        printf("FAIL: type %d: block size %d or %d bytes disagree with the runtime's\n", l->type,
               qk, bytes);
        return 1;
    }
    uint8_t *blocks = (uint8_t *)malloc((size_t)bytes * N_BLOCKS);
    float *ref = (float *)malloc(sizeof(float) * qk * N_BLOCKS);
    for (int i = 0; i < bytes * N_BLOCKS; i++)
        blocks[i] = (uint8_t)next();
    for (int b = 0; b < N_BLOCKS; b++)
        for (int h = 0; h < l->n_halves; h++) {
            const uint16_t v = random_half();
            memcpy(blocks + (size_t)b * bytes + l->half_at[h], &v, sizeof(v));
        }
    tr->to_float(blocks, ref, (int64_t)qk * N_BLOCKS);
    int bad = 0;
    for (int b = 0; b < N_BLOCKS; b++)
        for (int g = 0; g < qk / 8; g++) {
            float w[8];
            bpq_decode8(blocks + (size_t)b * bytes, l->type, g, w);
            for (int i = 0; i < 8; i++) {
                const int64_t k = (int64_t)b * qk + 8 * g + i;
                const float e = bpq_get((const char *)blocks, l->type, k);
                if ((!same(w[i], ref[k]) || !same(e, ref[k])) && bad++ < 5)
                    printf("FAIL: %s block %d element %d: decode8 %.9g, get %.9g, runtime %.9g\n",
                           tr->name, b, 8 * g + i, w[i], e, ref[k]);
            }
        }
    printf("%s %s: %d blocks of %d, %d mismatches\n", bad ? "FAIL" : "ok", tr->name, N_BLOCKS,
           qk, bad);
    bad += check_dot(tr->name, l->type, blocks, ref, (int64_t)qk * N_BLOCKS);
    free(blocks);
    free(ref);
    return bad;
}

int main(void)
{
    int bad = 0;
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
        bad += check_type(&layouts[i]);
    /* Every other type is no quantised type to the decoders. */
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        bool listed = false;
        for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
            listed = listed || layouts[i].type == t;
        if (bpq_is_quant(t) != listed) {
            printf("FAIL: type %s: bpq_is_quant says %d\n", bp_type_name((enum bp_type)t),
                   (int)bpq_is_quant(t));
            bad++;
        }
    }
    return bad == 0 ? 0 : 1;
}
