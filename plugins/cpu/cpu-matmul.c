/* cpu-matmul.c - MUL_MAT on the CPU: dst[m, n] = sum_k a[k, m] * b[k, n]. This file is the
 * driver: it says which shapes and types there are kernels for, picks a strategy per node and
 * runs it over the node's batches.
 *
 * The strategy depends on N (the number of activation columns), the weights' type and layout,
 * and what this build variant may use; pick_strategy() below is the one place that decides:
 *
 *   AMX           tile kernels (cpu-amx.c), avx512 build, when the CPU and kernel allow and
 *                 the weights have enough columns for their type (bp_cpu_amx_use): F16, BF16,
 *                 and 8-bit tiles for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K and
 *                 IQ4_XS (repacked ones, but Q8_0 and Q4_0, from 32 columns)
 *   GEMM_INT8     N >= 16, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K to Q6_K or IQ4_XS weights (N >= 32
 *                 for those in CPU_REPACK), avx512 build, those AMX does not take:
 *                 16-row strips unpacked to bytes, VNNI dot products against B quantised to
 *                 Q8_0 (cpu-gemm-int8.c)
 *   DOT_BF16      N <= 48, BF16 weights under BP_MM_PRECISION_HALF, avx512 build on a CPU
 *                 with AVX512_BF16: activations rounded to BF16, vdpbf16ps dot-product tiles
 *                 on the weights' rows in place (cpu-gemm-bf16.c)
 *   GEMM_BF16     N > 48 otherwise: the same rounding, packed and blocked (cpu-gemm-bf16.c)
 *   BCAST         16 <= N <= 48, AVX2/AVX-512 builds: B packed, A read in place (cpu-gemm.c)
 *   GEMM          N >= 16 otherwise: the packed, blocked GEMM (cpu-gemm.c)
 *   GEMV_FLOAT    N < 16, F32/F16/BF16 weights: dot-product tiles (cpu-gemv.c)
 *   GEMV_QUANT    N < 16, Q8_0/Q4_0 weights: integer dot products against B quantised to Q8_0
 *   GEMV_REPACK   weights in the CPU_REPACK layout (cpu-repack.c: Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1,
 *                 Q5_1, Q4_K, Q5_K, IQ4_XS) where neither AMX nor GEMM_INT8 takes them
 *                 (Q4_0/Q8_0: any N without AMX; the others: below 32 columns): that file's
 *                 kernel (only builds that have one repack anything)
 *   QTYPE         the weight types of cpu-qtypes.h (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K to Q6_K,
 *                 IQ4_XS) below qtype_gemm_min_n columns: B quantised to the type's
 *                 activation type, then its dot product per (row, column) (cpu-qtypes.c);
 *                 from there on, GEMM (never the broadcast kernel, which would convert each
 *                 row for every few columns)
 *
 * Every thread calls bp_cpu_mul_mat for every node and must take the same strategy, since the
 * kernels meet at barriers; pick_strategy depends on the node alone. */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "cpu-matmul.h"
#include "cpu-qtypes.h"

#define BP_CPU_GEMM_MIN_N 16 /* below this, dot-product tiles (no packing) */
#define BCAST_MAX_N 48       /* up to this, the broadcast kernel where there is one */

/* The strategies this build has (see the top of the file). */
enum mm_strategy {
#if defined(BP_CPU_HAVE_AMX)
    MM_AMX,
#endif
#if defined(BP_CPU_HAVE_AVX512)
    MM_GEMM_BF16,
    MM_DOT_BF16,
#endif
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    MM_GEMM_INT8,
#endif
#if defined(BP_CPU_HAVE_AVX2)
    MM_BCAST,
#endif
    MM_GEMM,
    MM_GEMV_FLOAT,
    MM_GEMV_QUANT,
#if defined(BP_CPU_REPACK_KERNEL)
    MM_GEMV_REPACK,
#endif
    MM_QTYPE,
};

/* From how many columns the types of cpu-qtypes.h take the packed GEMM (their rows converted to
 * floats once per panel, shared by its columns) rather than a dot product per (row, column):
 * 16 for the blocks of 32 and 32 for Q4_K, which AVX2 and AVX-512 builds convert with vector
 * instructions (cpu-convert.c), 128 for the rest (Q6_K converts so too, but its dot products
 * keep up with the GEMM below 128 columns: pp64 of the SmolLM2 Q6_K file 928 tok/s with them,
 * 775 through the GEMM), the others converted by the runtime's scalar code.
 * GFLOP/s of dot products / GEMM, 2 threads, avx512 build on an AMD EPYC: Q5_0 (M = 1536,
 * K = 512) at N = 16 74 / 91, at 64 74 / 165; (M = 576, K = 1536) Q4_K at 16 110 / 103, at 32
 * 126 / 151, at 64 128 / 172; Q6_K at 16 143 / 100, at 32 141 / 147, at 64 142 / 144. */
static int64_t qtype_gemm_min_n(enum bp_type t)
{
#if defined(BP_CPU_HAVE_AVX2)
    if (t == BP_TYPE_Q4_1 || t == BP_TYPE_Q5_0 || t == BP_TYPE_Q5_1 || t == BP_TYPE_IQ4_NL)
        return 16;
    if (t == BP_TYPE_Q4_K)
        return 32;
#else
    (void)t;
#endif
    return 128;
}

static bool quantized(enum bp_type t)
{
    return t == BP_TYPE_Q8_0 || t == BP_TYPE_Q4_0;
}

/* The strategy for node dst: the same answer for every thread, every batch and the work size.
 * Repacked weights take neither the GEMM nor the broadcast kernel: they have their own kernel,
 * AMX or the 8-bit GEMM (builds without such a kernel repack nothing). */
static enum mm_strategy pick_strategy(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0];
    const int64_t N = dst->ne[1];
    const bool repacked = bp_cpu_repacked_base(a) != NULL;
#if defined(BP_CPU_HAVE_AMX)
    if (bp_cpu_amx_use(dst))
        return MM_AMX;
#endif
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    if (bp_cpu_gemm_int8_use(dst))
        return MM_GEMM_INT8;
#endif
    if (bp_cpu_qtype(a->type) != NULL && !repacked)
        return N < qtype_gemm_min_n(a->type) ? MM_QTYPE : MM_GEMM;
#if defined(BP_CPU_HAVE_AVX512)
    if (bp_cpu_dot_bf16_use(dst))
        return MM_DOT_BF16;
#endif
    if (N >= BP_CPU_GEMM_MIN_N && !repacked) {
#if defined(BP_CPU_HAVE_AVX512)
        if (bp_cpu_gemm_bf16_use(dst))
            return MM_GEMM_BF16;
#endif
#if defined(BP_CPU_HAVE_AVX2)
        if (N <= BCAST_MAX_N)
            return MM_BCAST;
#endif
        return MM_GEMM;
    }
#if defined(BP_CPU_REPACK_KERNEL)
    if (repacked)
        return MM_GEMV_REPACK;
#endif
    /* Builds without a repack kernel repack nothing. */
    return quantized(a->type) ? MM_GEMV_QUANT : MM_GEMV_FLOAT;
}

/* The weight types with kernels: the float ones, Q8_0 and Q4_0, and those of cpu-qtypes.h
 * that have an entry (not the activation types Q8_1 and Q8_K, nor I32). */
static bool weight_type(enum bp_type t)
{
    return t == BP_TYPE_F32 || t == BP_TYPE_F16 || t == BP_TYPE_BF16 || quantized(t) ||
           bp_cpu_qtype(t) != NULL;
}

bool bp_cpu_mul_mat_supported(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    /* Rows of A and B contiguous along K, and C contiguous along M; repacked weights one
     * matrix (stacked ones are MUL_MAT_ID's). */
    return weight_type(a->type) && b->type == BP_TYPE_F32 && dst->type == BP_TYPE_F32 &&
           a->nb[0] == bp_type_size(a->type) && b->nb[0] == sizeof(float) &&
           dst->nb[0] == sizeof(float) && (a->ne[2] == 1 || bp_cpu_repacked_base(a) == NULL);
}

void bp_cpu_mul_mat_work_size(const bp_tensor *dst, int nth, size_t *per_thread, size_t *shared)
{
    (void)nth;
    switch (pick_strategy(dst)) {
#if defined(BP_CPU_HAVE_AMX)
    case MM_AMX:
        bp_cpu_amx_work_size(dst, per_thread, shared);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX512)
    case MM_GEMM_BF16:
        bp_cpu_gemm_bf16_work_size(dst, per_thread, shared);
        break;
    case MM_DOT_BF16:
        bp_cpu_dot_bf16_work_size(dst, per_thread, shared);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    case MM_GEMM_INT8:
        bp_cpu_gemm_int8_work_size(dst, per_thread, shared);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX2)
    case MM_BCAST:
        bp_cpu_bcast_work_size(dst, per_thread, shared);
        break;
#endif
    case MM_GEMM:
        bp_cpu_gemm_work_size(dst, per_thread, shared);
        break;
    case MM_QTYPE:
        bp_cpu_qtype_work_size(dst, per_thread, shared);
        break;
    default: /* the matrix-vector strategies */
        bp_cpu_gemv_work_size(dst, per_thread, shared);
        break;
    }
}

/* One batch of dst with strategy s. */
static void run_batch(enum mm_strategy s, bp_tensor *dst, const char *abase, const char *bbase,
                      char *cbase, const struct bp_cpu_params *p)
{
    switch (s) {
#if defined(BP_CPU_HAVE_AMX)
    case MM_AMX:
        bp_cpu_amx_mul_mat(dst, abase, bbase, cbase, p);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX512)
    case MM_GEMM_BF16:
        bp_cpu_gemm_bf16_batch(dst, abase, bbase, cbase, p);
        break;
    case MM_DOT_BF16:
        bp_cpu_dot_bf16_batch(dst, abase, bbase, cbase, p);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    case MM_GEMM_INT8:
        bp_cpu_gemm_int8_batch(dst, abase, bbase, cbase, p);
        break;
#endif
#if defined(BP_CPU_HAVE_AVX2)
    case MM_BCAST:
        bp_cpu_bcast_batch(dst, abase, bbase, cbase, p);
        break;
#endif
    case MM_GEMM:
        bp_cpu_gemm_batch(dst, abase, bbase, cbase, p);
        break;
    case MM_GEMV_FLOAT:
        bp_cpu_gemv_float_batch(dst, abase, bbase, cbase, p);
        break;
    case MM_GEMV_QUANT:
        bp_cpu_gemv_quant_batch(dst, abase, bbase, cbase, p);
        break;
#if defined(BP_CPU_REPACK_KERNEL)
    case MM_GEMV_REPACK:
        bp_cpu_gemv_repack_batch(dst, bbase, cbase, p);
        break;
#endif
    case MM_QTYPE:
        bp_cpu_qtype_batch(dst, abase, bbase, cbase, p);
        break;
    }
}

void bp_cpu_mul_mat(bp_tensor *dst, const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t M = dst->ne[0], N = dst->ne[1];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const enum mm_strategy s = pick_strategy(dst);

    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++) {
            const char *abase = (const char *)a->data + (i2 / r2) * (int64_t)a->nb[2] +
                                (i3 / r3) * (int64_t)a->nb[3];
            const char *bbase = (const char *)b->data + i2 * (int64_t)b->nb[2] +
                                i3 * (int64_t)b->nb[3];
            char *cbase = (char *)dst->data + i2 * (int64_t)dst->nb[2] + i3 * (int64_t)dst->nb[3];
            if (M == 0 || N == 0)
                continue;
            if (a->ne[0] == 0) { /* empty sums: every kernel assumes some K */
                int64_t n0, n1;
                bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
                for (int64_t n = n0; n < n1; n++)
                    memset(cbase + n * (int64_t)dst->nb[1], 0, (size_t)M * sizeof(float));
                continue;
            }
            run_batch(s, dst, abase, bbase, cbase, p);
        }
    }
}

/* ---- MUL_MAT_ID ------------------------------------------------------------------------------
 *
 * The (slot, token) pairs are grouped by expert (a counting sort over the ids, which every
 * thread makes for itself: no meeting), and each expert with pairs becomes a MUL_MAT node of its
 * own over that expert's 2-D slice, so each group gets the kernel for its column count. An
 * expert with one pair (every expert when generating one token: a token's experts differ)
 * multiplies the activation row where it lies into the result column where it goes, with its
 * own part of the shared scratch, so such experts need no meeting between them beyond their
 * kernels' own. Experts
 * with more pairs gather their activation rows into one contiguous matrix first (one meeting),
 * share one part of the scratch (a meeting between them) and scatter their products to their
 * places at the end (one more).
 *
 * Per-thread scratch: the sort (pairs in expert order, where each expert's start, a running
 * position per expert), then the MUL_MAT kernels' own. Shared: the gathered rows (K floats per
 * pair), the products (M floats per pair), one part of the kernels' shared scratch per expert
 * with one pair (at most min(experts, pairs)), then the part the experts with several share. */

struct mm_id_layout {
    size_t order, start, inner_pt; /* per-thread scratch: the sort, then the kernels' own */
    size_t b, c, single, single_size, inner; /* shared: rows, products, one-pair parts, the rest */
};

static size_t align64(size_t x)
{
    return (x + 63) & ~(size_t)63;
}

/* The MUL_MAT node for expert e over n columns of B at bdata (contiguous rows of K floats) into
 * columns of C at cdata (ldc floats apart): a is that expert's 2-D slice. */
static void expert_node(const bp_tensor *node, int64_t e, int64_t n, const float *bdata,
                        float *cdata, int64_t ldc, bp_tensor *a, bp_tensor *b, bp_tensor *c)
{
    const bp_tensor *as = node->src[0];
    const int64_t K = as->ne[0], M = as->ne[1];
    memset(a, 0, sizeof(*a));
    memset(b, 0, sizeof(*b));
    memset(c, 0, sizeof(*c));
    a->type = as->type;
    a->op = BP_OP_NONE;
    a->ne[0] = K, a->ne[1] = M, a->ne[2] = a->ne[3] = 1;
    a->nb[0] = as->nb[0], a->nb[1] = as->nb[1];
    a->nb[2] = a->nb[3] = as->nb[1] * (size_t)M;
    a->data = (char *)as->data + e * (int64_t)as->nb[2];
    /* Stacked experts in the CPU_REPACK layout: each expert's rows are whole groups of that
     * layout, starting where its plain rows would, so the slice reads as a repacked matrix. */
    a->buffer = bp_cpu_repacked_base(as) != NULL ? as->buffer : NULL;
    b->type = BP_TYPE_F32;
    b->ne[0] = K, b->ne[1] = n, b->ne[2] = b->ne[3] = 1;
    b->nb[0] = sizeof(float), b->nb[1] = (size_t)K * sizeof(float);
    b->nb[2] = b->nb[3] = b->nb[1] * (size_t)(n > 0 ? n : 1);
    b->data = (void *)bdata;
    c->type = BP_TYPE_F32;
    c->op = BP_OP_MUL_MAT;
    c->ne[0] = M, c->ne[1] = n, c->ne[2] = c->ne[3] = 1;
    c->nb[0] = sizeof(float), c->nb[1] = (size_t)ldc * sizeof(float);
    c->nb[2] = c->nb[3] = c->nb[1] * (size_t)(n > 0 ? n : 1);
    c->src[0] = a;
    c->src[1] = b;
    c->data = cdata;
}

/* The MUL_MAT kernels' scratch for an expert with n columns. */
static void inner_work(const bp_tensor *node, int64_t n, int nth, size_t *pt, size_t *sh)
{
    bp_tensor a, b, c;
    expert_node(node, 0, n, NULL, NULL, node->src[0]->ne[1], &a, &b, &c);
    bp_cpu_mul_mat_work_size(&c, nth, pt, sh);
}

/* Where everything lies; the kernels' scratch sizes are not needed to find any of it (the work
 * size adds them at the ends). */
static struct mm_id_layout mm_id_layout(const bp_tensor *node, int nth)
{
    const bp_tensor *as = node->src[0];
    const int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2];
    const int64_t pairs = node->ne[1] * node->ne[2];
    struct mm_id_layout l;
    l.order = 0;
    l.start = align64((size_t)pairs * sizeof(int32_t));
    l.inner_pt = l.start + align64((size_t)(2 * E + 1) * sizeof(int64_t)); /* start, pos */
    l.b = 0;
    l.c = align64((size_t)(pairs * K) * sizeof(float));
    l.single = l.c + align64((size_t)(pairs * M) * sizeof(float));
    size_t pt1 = 0, sh1 = 0;
    if (pairs > 0)
        inner_work(node, 1, nth, &pt1, &sh1);
    l.single_size = align64(sh1);
    l.inner = l.single + l.single_size * (size_t)(E < pairs ? E : pairs);
    return l;
}

bool bp_cpu_mul_mat_id_supported(const bp_tensor *node)
{
    const bp_tensor *as = node->src[0], *b = node->src[1], *ids = node->src[2];
    return weight_type(as->type) && b->type == BP_TYPE_F32 && ids->type == BP_TYPE_I32 &&
           node->type == BP_TYPE_F32 && as->nb[0] == bp_type_size(as->type) &&
           b->nb[0] == sizeof(float) && node->nb[0] == sizeof(float);
}

void bp_cpu_mul_mat_id_work_size(const bp_tensor *node, int nth, size_t *per_thread,
                                 size_t *shared)
{
    const struct mm_id_layout l = mm_id_layout(node, nth);
    const int64_t pairs = node->ne[1] * node->ne[2];
    /* The kernels' scratch: for one column, and the most a group of several can need: every
     * column count up to 160, past every point where the strategy changes (the broadcast
     * kernel's 48, AMX's 4, 16 and 64, the 8-bit GEMMs' 16 and, for repacked weights, 32),
     * and the largest, since each strategy's scratch grows with the columns. */
    size_t pt = 0, sh = 0;
    if (pairs > 0)
        inner_work(node, 1, nth, &pt, &sh);
    sh = 0; /* one column's shared scratch has its own parts (l.single) */
    for (int64_t n = 2; n <= pairs; n = n < 160 ? n + 1 : (n < pairs ? pairs : n + 1)) {
        size_t p1, s1;
        inner_work(node, n, nth, &p1, &s1);
        pt = p1 > pt ? p1 : pt;
        sh = s1 > sh ? s1 : sh;
    }
    *per_thread = l.inner_pt + pt;
    *shared = l.inner + sh;
}

static int32_t id_of(const bp_tensor *ids, int64_t j, int64_t U)
{
    return *(const int32_t *)((const char *)ids->data + (j % U) * (int64_t)ids->nb[0] +
                              (j / U) * (int64_t)ids->nb[1]);
}

void bp_cpu_mul_mat_id(bp_tensor *node, const struct bp_cpu_params *p)
{
    const bp_tensor *as = node->src[0], *b = node->src[1], *ids = node->src[2];
    const int64_t K = as->ne[0], M = as->ne[1], E = as->ne[2];
    const int64_t U = node->ne[1], T = node->ne[2], pairs = U * T;
    if (pairs == 0 || M == 0)
        return;
    const struct mm_id_layout l = mm_id_layout(node, p->nth);
    char *mine = p->wdata, *sh = p->wshared;
    int32_t *order = (int32_t *)(mine + l.order);
    int64_t *start = (int64_t *)(mine + l.start), *pos = start + E + 1;
    float *bg = (float *)(sh + l.b), *cg = (float *)(sh + l.c);

    /* The pairs j = u + U t in expert order; an id out of range joins no group (and fails the
     * compute: thread 0 says so). */
    for (int64_t e = 0; e <= E; e++)
        start[e] = 0;
    bool bad = false;
    for (int64_t j = 0; j < pairs; j++) {
        const int32_t e = id_of(ids, j, U);
        if (e < 0 || e >= E)
            bad = true;
        else
            start[e + 1]++;
    }
    for (int64_t e = 0; e < E; e++) {
        start[e + 1] += start[e];
        pos[e] = start[e];
    }
    for (int64_t j = 0; j < pairs; j++) {
        const int32_t e = id_of(ids, j, U);
        if (e >= 0 && e < E)
            order[pos[e]++] = (int32_t)j;
    }
    if (bad && p->ith == 0)
        bp_cpu_fault(p, node);

    /* The rows of the experts with several pairs, gathered in expert order. */
    bool several = false;
    for (int64_t e = 0; e < E; e++)
        several = several || start[e + 1] - start[e] > 1;
    int64_t i0, i1;
    bp_cpu_split(start[E], p->ith, p->nth, &i0, &i1);
    if (several) {
        for (int64_t i = i0; i < i1; i++) {
            const int64_t j = order[i], u = j % U, t = j / U;
            memcpy(bg + i * K,
                   (const char *)b->data + (u % b->ne[1]) * (int64_t)b->nb[1] +
                       t * (int64_t)b->nb[2],
                   (size_t)K * sizeof(float));
        }
        bp_cpu_pool_barrier(p->pool);
    }

    struct bp_cpu_params q = *p;
    q.wdata = mine + l.inner_pt; /* the kernels' per-thread scratch follows the sort */
    int64_t n_single = 0, n_multi = 0;
    for (int64_t e = 0; e < E; e++) { /* one pair each: in place, own scratch, no meetings */
        if (start[e + 1] - start[e] != 1)
            continue;
        const int64_t j = order[start[e]], u = j % U, t = j / U;
        const float *row = (const float *)((const char *)b->data +
                                           (u % b->ne[1]) * (int64_t)b->nb[1] +
                                           t * (int64_t)b->nb[2]);
        float *col = (float *)((char *)node->data + u * (int64_t)node->nb[1] +
                               t * (int64_t)node->nb[2]);
        bp_tensor a, bt, c;
        expert_node(node, e, 1, row, col, M, &a, &bt, &c);
        q.wshared = sh + l.single + l.single_size * (size_t)n_single++;
        bp_cpu_mul_mat(&c, &q);
    }
    q.wshared = sh + l.inner;
    for (int64_t e = 0; e < E; e++) { /* several pairs: gathered rows, shared scratch */
        const int64_t n = start[e + 1] - start[e];
        if (n < 2)
            continue;
        if (n_multi++ > 0)
            bp_cpu_pool_barrier(p->pool); /* the kernels' shared scratch is reused */
        bp_tensor a, bt, c;
        expert_node(node, e, n, bg + start[e] * K, cg + start[e] * M, M, &a, &bt, &c);
        bp_cpu_mul_mat(&c, &q);
    }
    if (!several)
        return;
    bp_cpu_pool_barrier(p->pool);
    for (int64_t i = i0; i < i1; i++) { /* the products of the groups of several, in place */
        const int64_t j = order[i], u = j % U, t = j / U;
        int64_t e = 0;
        while (start[e + 1] <= i)
            e++;
        if (start[e + 1] - start[e] > 1)
            memcpy((char *)node->data + u * (int64_t)node->nb[1] + t * (int64_t)node->nb[2],
                   cg + i * M, (size_t)M * sizeof(float));
    }
}
