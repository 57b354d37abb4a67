/* cpu-qtypes.c - MUL_MAT (and through it MUL_MAT_ID) for the weight types of cpu-qtypes.h: the
 * table lookup that joins the two kernel files, and the strategy these types take for small N
 * (ggml multiplies them with its dot products on x86; from a few dozen columns on the packed
 * GEMM over rows converted to floats is faster, cpu-matmul.c's qtype_gemm_min_n).
 *
 * Each batch: every thread quantises its share of B's columns to the type's activation type in
 * the shared scratch (one row of act per column, 64-byte aligned), all meet at a barrier, then
 * each thread computes its part of C with the type's dot product: its rows against every column
 * when there are enough rows to share (rows are streamed once per run of QT_COLS columns, so at
 * N = 1 the weights are read exactly once), else its columns against every row. A last barrier
 * keeps the scratch until everyone is done, since the next batch rewrites it. */
#include "config.h"

#include <stdint.h>

#include "cpu-matmul.h"
#include "cpu-qtypes.h"

/* Columns per run: a run's quantised columns stay in L2 (64 columns of K = 4096 as Q8_1 are
 * 288 KiB) while every row of the thread passes over them. */
#define QT_COLS 64

/* Bytes ahead of the row being read that its thread asks for (one cache line at a time, as much
 * as a row ahead). Rows of small models are short (576 Q4_1 values are 360 bytes), and the
 * hardware prefetchers barely start on one before the next: generation on the SmolLM2 Q4_1 file
 * went from 75 to 200-220 tokens/s with it (2 threads, a 2-core Xeon VM with AMX; 1 and 2 KiB
 * ahead measured 200-214, 8 and 16 KiB no better). Rows longer than QT_PREFETCH_MAX_ROW bytes
 * are left to the hardware: a burst of one prefetch per line of a 3 KiB row fills the line-fill
 * buffers and stalls the core (Q6_K at N = 1, M = K = 4096, 2 threads: 84 GFLOP/s with the
 * prefetches, a third of the time in them, 108 without). */
#define QT_PREFETCH 4096
#define QT_PREFETCH_MAX_ROW 1024

const struct bp_cpu_qtype *bp_cpu_qtype(enum bp_type t)
{
    const struct bp_cpu_qtype *q = bp_cpu_qtype32(t);
    return q != NULL ? q : bp_cpu_qtype_k(t);
}

/* Bytes of one quantised column of K values, rounded up to a cache line. */
static size_t column_bytes(const struct bp_cpu_qtype *q, int64_t K)
{
    return (bp_row_size(q->act, K) + 63) & ~(size_t)63;
}

void bp_cpu_qtype_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    const struct bp_cpu_qtype *q = bp_cpu_qtype(dst->src[0]->type);
    *per_thread = 0;
    *shared = q != NULL ? column_bytes(q, dst->src[0]->ne[0]) * (size_t)dst->ne[1] : 0;
}

void bp_cpu_qtype_batch(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0], *b = dst->src[1];
    const struct bp_cpu_qtype *q = bp_cpu_qtype(a->type);
    const int64_t K = a->ne[0], M = dst->ne[0], N = dst->ne[1];
    const int64_t lda = (int64_t)a->nb[1], ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const size_t cb = column_bytes(q, K);
    char *yq = p->wshared;
    int64_t n0, n1;
    bp_cpu_split(N, p->ith, p->nth, &n0, &n1);
    for (int64_t n = n0; n < n1; n++)
        q->quantize((const float *)(bbase + n * (int64_t)b->nb[1]), yq + (size_t)n * cb, K);
    bp_cpu_pool_barrier(p->pool);

    /* Rows shared out when each thread gets a few (N = 1 always has them), else columns. */
    int64_t m0 = 0, m1 = M;
    if (M >= 4 * (int64_t)p->nth || N < p->nth) {
        bp_cpu_split(M, p->ith, p->nth, &m0, &m1);
        n0 = 0;
        n1 = N;
    }
    float *c = (float *)cbase;
    for (int64_t r0 = n0; r0 < n1; r0 += QT_COLS) {
        const int64_t r1 = r0 + QT_COLS < n1 ? r0 + QT_COLS : n1;
        for (int64_t m = m0; m < m1; m++) {
            const char *row = abase + m * lda;
            for (int64_t off = 0; lda <= QT_PREFETCH_MAX_ROW && off < lda; off += 64)
                __builtin_prefetch(row + QT_PREFETCH + off, 0, 3);
            for (int64_t n = r0; n < r1; n++)
                c[n * ldc + m] = q->vec_dot(K, row, yq + (size_t)n * cb);
        }
    }
    bp_cpu_pool_barrier(p->pool);
}
