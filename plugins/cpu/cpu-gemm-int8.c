/* cpu-gemm-int8.c - MUL_MAT for Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K to Q6_K and IQ4_XS weights over
 * many columns with AVX-512 VNNI integer dot products (the avx512 variant; on machines with AMX,
 * cpu-amx.c takes the types it has tiles for).
 *
 * Every block of 32 of these types is 32 small integers q with a scale d and a minimum m (zero
 * for the symmetric ones): value = d q + m; Q2_K, Q3_K and Q6_K have a d and an m for each half
 * of 16. The activations are quantised to Q8_0 once per batch (quants a, scale dx, and
 * sx = dx * the sum of the quants of the block, or of each half), so that the product of a
 * weight block with an activation block is
 *
 *     d dx (q . a) + m sx
 *
 * with q . a exact in 32-bit integers. vpdpbusd multiplies unsigned bytes by signed ones: the
 * types whose q are signed (Q5_0, IQ4_NL, IQ4_XS) are stored as q + 128 (their sign bit
 * flipped), and m takes -128 d to make up for it; Q3_K and Q6_K are stored unsigned (q + 4,
 * q + 32) with m = -4 d, -32 d.
 *
 * Each thread takes strips of 16 rows. A strip is unpacked once into a panel that lies in L2:
 * per block, eight vectors, vector c holding bytes 4c..4c+3 of each of the 16 rows (row r in
 * 32-bit lane r), then the 16 rows' d and m (two of each where they go by 16). A vector of dot
 * products against one column's four bytes, broadcast to every lane, then covers the 16 rows,
 * and eight of them a block; the block's scales and minimums apply to the 16 lanes with one
 * multiply and two fused multiply-adds, and the result needs no horizontal sum. The strip then
 * meets every column NC at a time. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"

#if defined(BP_CPU_HAVE_AVX512_VNNI)

#include "cpu-unpack32.h"

#define NC 4 /* columns per pass of the kernel */

/* Fewest columns worth unpacking a strip (below, cpu-qtypes.c's dot products). */
#define INT8_MIN_N 16
/* The same for the types in the CPU_REPACK layout other than Q4_0 and Q8_0, whose strips are
 * unpacked from that layout eight rows at a time (bp_cpu_repack_unpack_group): below this the
 * layout's own kernel is faster. GFLOP/s, M = K = 4096, 2 threads, no AMX, N = 32, this kernel
 * against the layout's: Q4_K 296 / 359, Q5_K 308 / 246, IQ4_XS 325 / 320, Q4_1 343 / 388,
 * IQ4_NL 342 / 351; at N = 64 this kernel wins for every type (Q4_K 388, IQ4_XS 401 against the
 * layout's 340-390). */
#define INT8_MIN_N_REPACKED 32

bool bp_cpu_gemm_int8_use(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0];
    switch (a->type) {
    case BP_TYPE_Q4_1:
    case BP_TYPE_Q5_0:
    case BP_TYPE_Q5_1:
    case BP_TYPE_IQ4_NL:
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K:
    case BP_TYPE_IQ4_XS:
    case BP_TYPE_Q2_K:
    case BP_TYPE_Q3_K:
    case BP_TYPE_Q6_K:
        break;
    default:
        return false;
    }
    /* Of these types, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K and IQ4_XS may be in the CPU_REPACK
     * layout. */
    return dst->ne[1] >= (bp_cpu_repacked_base(a) != NULL ? INT8_MIN_N_REPACKED : INT8_MIN_N);
}

static bool signed_q(enum bp_type t)
{
    return t == BP_TYPE_Q5_0 || t == BP_TYPE_IQ4_NL || t == BP_TYPE_IQ4_XS;
}

/* Whether type t's scales and minimums go by 16 values (two per block of 32). */
static bool by16(enum bp_type t)
{
    return t == BP_TYPE_Q2_K || t == BP_TYPE_Q3_K || t == BP_TYPE_Q6_K;
}

/* Bytes of one block of a panel: 512 of quants, then 16 scales and 16 minimums per set (two
 * sets, first and second half, where they go by 16). */
static int64_t block_bytes(bool sub16)
{
    return 512 + (sub16 ? 4 : 2) * 16 * (int64_t)sizeof(float);
}

static size_t panel_bytes(int64_t nb, bool sub16)
{
    return (size_t)(nb * block_bytes(sub16));
}

/* Shared: B as Q8_0 blocks, then each block's dx, then two sx per block (of each half, or of
 * the block and unused). */
static size_t blocks_bytes(int64_t N, int64_t nb)
{
    return ((size_t)(N * nb) * sizeof(struct bp_block_q8_0) + 63) / 64 * 64;
}

void bp_cpu_gemm_int8_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    const int64_t nb = dst->src[0]->ne[0] / 32, N = dst->ne[1];
    /* The panel, and one column's block sums while quantising. */
    *per_thread = panel_bytes(nb, by16(dst->src[0]->type)) + (size_t)nb * sizeof(int32_t) + 128;
    *shared = blocks_bytes(N, nb) + 3 * (size_t)(N * nb) * sizeof(float);
}

/* Blocks t and t + 1 (if < nb) of the 16 rows from m0 (a multiple of 16) of repacked a, unpacked
 * eight rows at a time: v[r] holds row r's two blocks, signed types made unsigned. */
static void unpack_repacked(const bp_tensor *a, int64_t m0, int64_t t, int64_t nb, bool sgn,
                            __m512i v[16], float d[2][16], float m[2][16])
{
    int8_t qv[2][16][32];
    for (int h = 0; h < 2; h++)
        for (int gi = 0; gi < 2; gi++) {
            if (t + h < nb)
                bp_cpu_repack_unpack_group(a, m0 / 8 + gi, t + h, qv[h][8 * gi], d[h] + 8 * gi,
                                           m[h] + 8 * gi);
            else {
                memset(qv[h][8 * gi], 0, 8 * 32);
                memset(d[h] + 8 * gi, 0, 8 * sizeof(float));
                memset(m[h] + 8 * gi, 0, 8 * sizeof(float));
            }
        }
    for (int r = 0; r < 16; r++) {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            q[h] = _mm256_loadu_si256((const __m256i *)qv[h][r]);
            if (sgn) {
                q[h] = _mm256_xor_si256(q[h], _mm256_set1_epi8((char)0x80));
                m[h][r] -= 128.0f * d[h][r];
            }
        }
        v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1);
    }
}

/* Rows [m0, m0 + rows) of a (rows <= 16; the rest of the strip zero), all nb blocks, into the
 * panel p: block t at p + t * block_bytes, its eight vectors of quants, then the 16 rows' d and
 * their m (by 16: d of the first half, d of the second, m of the first, m of the second). */
BP_CPU_INLINE void pack_strip_t(const enum bp_type type, const bp_tensor *a, const char *abase,
                                int64_t m0, int rows, int64_t nb, char *p)
{
    const bool sgn = signed_q(type), sub16 = by16(type);
    const bool repacked = bp_cpu_repacked_base(a) != NULL;
    /* Repacked weights come as blocks of 32, with their scales (bp_cpu_repack_unpack_group). */
    const bool superblk = !repacked && (type == BP_TYPE_Q2_K || type == BP_TYPE_Q3_K ||
                                        type == BP_TYPE_Q4_K || type == BP_TYPE_Q5_K ||
                                        type == BP_TYPE_Q6_K || type == BP_TYPE_IQ4_XS);
    const int64_t bb = block_bytes(sub16);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const char *rowp[16];
    for (int r = 0; r < 16; r++)
        rowp[r] = r < rows ? abase + (m0 + r) * (int64_t)a->nb[1] : NULL;
    for (int64_t t = 0; t < nb; t += 2) {
        /* Two blocks of each row (16 dwords) at once: after the transpose, vectors 0-7 are
         * block t's and 8-15 block t + 1's. The blocks of 32 take their d and m here; the
         * super-blocks', below. */
        __m512i v[16];
        float d[2][16], m[2][16]; /* [block][row] */
        if (repacked)
            unpack_repacked(a, m0, t, nb, sgn, v, d, m);
        for (int r = 0; r < 16 && !repacked; r++) {
            __m256i q[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int h = 0; h < 2; h++) {
                d[h][r] = m[h][r] = 0.0f;
                if (!rowp[r] || t + h >= nb)
                    continue;
                if (sub16)
                    q[h] = bp_cpu_unpack_q16(type, rowp[r], t + h);
                else if (superblk)
                    q[h] = bp_cpu_unpack_q(type, rowp[r], t + h, NULL, NULL);
                else
                    q[h] = bp_cpu_unpack_q(type, rowp[r], t + h, &d[h][r], &m[h][r]);
                if (sgn) {
                    q[h] = _mm256_xor_si256(q[h], flip);
                    m[h][r] -= 128.0f * d[h][r];
                }
            }
            v[r] = _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1);
        }
        bp_cpu_transpose16((__m512 *)v);
        for (int h = 0; h < 2 && t + h < nb; h++) {
            char *blk = p + (t + h) * bb;
            for (int c = 0; c < 8; c++)
                _mm512_storeu_si512(blk + 64 * c, v[8 * h + c]);
            if (!superblk) {
                memcpy(blk + 512, d[h], 64);
                memcpy(blk + 576, m[h], 64);
            }
        }
    }
    if (!superblk)
        return;
    /* Per super-block: each row's 16 scales (and minimums) as one vector, transposed, so that
     * vector k holds scale k of the 16 rows. */
    for (int64_t i = 0; i < nb / 8; i++) {
        __m512 vd[16], vm[16];
        for (int r = 0; r < 16; r++) {
            if (rowp[r])
                bp_cpu_superblock_scales(type, rowp[r], i, &vd[r], &vm[r]);
            else
                vd[r] = vm[r] = _mm512_setzero_ps();
        }
        bp_cpu_transpose16(vd);
        bp_cpu_transpose16(vm);
        for (int t = 0; t < 8; t++) {
            float *f = (float *)(p + (8 * i + t) * bb + 512);
            if (sub16) { /* d of each half, then m of each half */
                _mm512_storeu_ps(f, vd[2 * t]);
                _mm512_storeu_ps(f + 16, vd[2 * t + 1]);
                _mm512_storeu_ps(f + 32, vm[2 * t]);
                _mm512_storeu_ps(f + 48, vm[2 * t + 1]);
            } else {
                _mm512_storeu_ps(f, vd[t]);
                _mm512_storeu_ps(f + 16, sgn ? _mm512_mul_ps(vd[t], _mm512_set1_ps(-128.0f))
                                             : vm[t]);
            }
        }
    }
}

/* pack_strip_t with the type's unpacking inlined. */
static void pack_strip(const bp_tensor *a, const char *abase, int64_t m0, int rows, int64_t nb,
                       char *p)
{
#define PACK(t)                                                                                \
    case t:                                                                                    \
        pack_strip_t(t, a, abase, m0, rows, nb, p);                                            \
        break
    switch (a->type) {
        PACK(BP_TYPE_Q4_1);
        PACK(BP_TYPE_Q5_0);
        PACK(BP_TYPE_Q5_1);
        PACK(BP_TYPE_IQ4_NL);
        PACK(BP_TYPE_Q2_K);
        PACK(BP_TYPE_Q3_K);
        PACK(BP_TYPE_Q4_K);
        PACK(BP_TYPE_Q5_K);
        PACK(BP_TYPE_Q6_K);
    default: /* IQ4_XS (bp_cpu_gemm_int8_use admits no other) */
        pack_strip_t(BP_TYPE_IQ4_XS, a, abase, m0, rows, nb, p);
        break;
    }
#undef PACK
}

BP_CPU_INLINE __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi32(v);
}

/* The strip in panel p (nb blocks) against nc (1-NC) columns: y[c] their Q8_0 blocks, dx[c]
 * their blocks' scales, sx[c] the scaled sums (two per block: of each half when sub16, else
 * of the block, then unused); out[c] the 16 results of column c. */
BP_CPU_INLINE void strip_t(const int nc, const bool sub16, const char *p, int64_t nb,
                           const struct bp_block_q8_0 *const y[NC], const float *const dx[NC],
                           const float *const sx[NC], __m512 out[NC])
{
    const int64_t bb = block_bytes(sub16);
    __m512 acc[NC];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < nb; t++) {
        const char *blk = p + t * bb;
        const float *f = (const float *)(blk + 512);
        __m512i w[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            w[i] = _mm512_loadu_si512(blk + 64 * i);
        const __m512 dw0 = _mm512_loadu_ps(f), mw0 = _mm512_loadu_ps(f + (sub16 ? 32 : 16));
        const __m512 dw1 = sub16 ? _mm512_loadu_ps(f + 16) : dw0;
        const __m512 mw1 = sub16 ? _mm512_loadu_ps(f + 48) : mw0;
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qs = y[c][t].qs;
            /* Chains over values 0-15 and 16-31 (each half's scale where they differ): the
             * block's sums are ready sooner. */
            __m512i s = _mm512_setzero_si512(), u = _mm512_setzero_si512();
            s = _mm512_dpbusd_epi32(s, w[0], bcast4(qs));
            u = _mm512_dpbusd_epi32(u, w[4], bcast4(qs + 16));
            s = _mm512_dpbusd_epi32(s, w[1], bcast4(qs + 4));
            u = _mm512_dpbusd_epi32(u, w[5], bcast4(qs + 20));
            s = _mm512_dpbusd_epi32(s, w[2], bcast4(qs + 8));
            u = _mm512_dpbusd_epi32(u, w[6], bcast4(qs + 24));
            s = _mm512_dpbusd_epi32(s, w[3], bcast4(qs + 12));
            u = _mm512_dpbusd_epi32(u, w[7], bcast4(qs + 28));
            const __m512 x = _mm512_set1_ps(dx[c][t]);
            if (sub16) {
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw0, x), acc[c]);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), _mm512_mul_ps(dw1, x), acc[c]);
                acc[c] = _mm512_fmadd_ps(mw0, _mm512_set1_ps(sx[c][2 * t]), acc[c]);
                acc[c] = _mm512_fmadd_ps(mw1, _mm512_set1_ps(sx[c][2 * t + 1]), acc[c]);
            } else {
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s, u)),
                                         _mm512_mul_ps(dw0, x), acc[c]);
                acc[c] = _mm512_fmadd_ps(mw0, _mm512_set1_ps(sx[c][2 * t]), acc[c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++)
        out[c] = acc[c];
}

static void strip(int nc, bool sub16, const char *p, int64_t nb,
                  const struct bp_block_q8_0 *const y[NC], const float *const dx[NC],
                  const float *const sx[NC], __m512 out[NC])
{
#define BY16(c) strip_t(c, true, p, nb, y, dx, sx, out)
#define BY32(c) strip_t(c, false, p, nb, y, dx, sx, out)
    if (sub16) {
        BP_CPU_BY_COLUMNS(nc, BY16)
    } else {
        BP_CPU_BY_COLUMNS(nc, BY32)
    }
#undef BY16
#undef BY32
}

void bp_cpu_gemm_int8_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                            const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1], nb = a->ne[0] / 32;
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const bool sub16 = by16(a->type);
    char *panel = (char *)(((uintptr_t)p->wdata + 63) & ~(uintptr_t)63);
    int32_t *sums = (int32_t *)(panel + panel_bytes(nb, sub16));
    struct bp_block_q8_0 *bq = p->wshared;
    float *bdx = (float *)((char *)p->wshared + blocks_bytes(N, nb));
    float *bsx = bdx + N * nb;

    /* Each thread quantises a share of the columns. */
    int64_t n0, n1;
    bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
    for (int64_t n = n0; n < n1; n++) {
        struct bp_block_q8_0 *yb = bq + n * nb;
        bp_cpu_quantize_q8_0((const float *)(bbase + n * (int64_t)b->nb[1]), yb, sums, nb);
        for (int64_t t = 0; t < nb; t++) {
            const float d = bp_cpu_half_to_float(yb[t].d);
            bdx[n * nb + t] = d;
            if (sub16) {
                int first = 0;
                for (int l = 0; l < 16; l++)
                    first += yb[t].qs[l];
                bsx[2 * (n * nb + t)] = d * (float)first;
                bsx[2 * (n * nb + t) + 1] = d * (float)(sums[t] - first);
            } else {
                bsx[2 * (n * nb + t)] = d * (float)sums[t];
            }
        }
    }
    bp_cpu_pool_barrier(p->pool);

    int64_t s0, s1; /* strips of 16 rows */
    bp_cpu_split((M + 15) / 16, p->ith, p->nth, &s0, &s1);
    for (int64_t s = s0; s < s1; s++) {
        const int64_t m0 = s * 16;
        const int rows = M - m0 < 16 ? (int)(M - m0) : 16;
        const __mmask16 mask = (__mmask16)((1u << rows) - 1);
        pack_strip(a, abase, m0, rows, nb, panel);
        for (int64_t n = 0; n < N; n += NC) {
            const int nc = N - n < NC ? (int)(N - n) : NC;
            const struct bp_block_q8_0 *y[NC];
            const float *dx[NC], *sx[NC];
            for (int c = 0; c < NC; c++) {
                const int64_t col = n + (c < nc ? c : 0);
                y[c] = bq + col * nb;
                dx[c] = bdx + col * nb;
                sx[c] = bsx + 2 * col * nb;
            }
            __m512 out[NC];
            strip(nc, sub16, panel, nb, y, dx, sx, out);
            for (int c = 0; c < nc; c++)
                _mm512_mask_storeu_ps((float *)cbase + (n + c) * ldc + m0, mask, out[c]);
        }
    }
    bp_cpu_pool_barrier(p->pool); /* B's blocks are rewritten for the next batch */
}

#endif
