/* cpu-attn.c - FLASH_ATTN_EXT: attention with an online softmax, never holding the scores of
 * more than one tile of keys.
 *
 * Work is divided into units of one sequence, one key/value head and a block of query rows;
 * a unit takes every query head that reads that key/value head (grouped-query attention), so
 * each tile of keys and values is converted to f32 once and used by all the unit's queries.
 * Units are shared out among the threads. For each query the unit keeps the running maximum
 * M, the running sum S of exp(s - M) and the running weighted sum of values; a tile whose
 * maximum exceeds M rescales them once (exp(M_old - M_new)), so no score is ever exponentiated
 * twice. Keys a causal query cannot see are never read. */
#include "config.h"

#include <math.h>
#include <string.h>

#include "cpu-impl.h"

#define ATTN_TILE 64  /* keys converted and scored at a time */
#define ATTN_MAX_ROWS 32 /* query rows per unit, at most */

struct attn {
    const bp_tensor *q, *k, *v, *mask;
    bp_tensor *dst;
    float scale, softcap;
    bool causal;
    int64_t D, Dv, T, H, HK, G, KV, B;
    int64_t rows; /* query rows per unit */
    int64_t units, blocks;
};

static void attn_init(struct attn *a, bp_tensor *dst, int nth)
{
    a->dst = dst;
    a->q = dst->src[0];
    a->k = dst->src[1];
    a->v = dst->src[2];
    a->mask = dst->src[3];
    a->scale = bp_get_op_param_f32(dst, 0);
    a->softcap = bp_get_op_param_f32(dst, 1);
    a->causal = (bp_get_op_param_i32(dst, 2) & BP_ATTN_CAUSAL) != 0;
    a->D = a->q->ne[0];
    a->T = a->q->ne[1];
    a->H = a->q->ne[2];
    a->B = a->q->ne[3];
    a->KV = a->k->ne[1];
    a->HK = a->k->ne[2];
    a->G = a->H / a->HK;
    a->Dv = a->v->ne[0];
    /* Enough units to keep every thread busy (four each where the rows allow), each as many
     * rows as that leaves, up to ATTN_MAX_ROWS. */
    const int64_t heads = a->HK * a->B, want = 4 * (int64_t)nth;
    int64_t rows = heads >= want ? a->T : (a->T * heads + want - 1) / want;
    rows = rows < 1 ? 1 : rows > ATTN_MAX_ROWS ? ATTN_MAX_ROWS : rows;
    a->rows = rows;
    a->blocks = (a->T + rows - 1) / rows;
    a->units = heads * a->blocks;
}

/* Per-thread scratch, in floats: the key and value tiles, one tile of scores, a mask row, and
 * per query (G * rows of them) its maximum, its sum and its weighted values. */
static size_t attn_floats(const struct attn *a)
{
    const size_t nq = (size_t)(a->G * a->rows);
    return (size_t)ATTN_TILE * (size_t)(a->D + a->Dv) + 2 * ATTN_TILE + nq * (2 + (size_t)a->Dv) +
           64;
}

void bp_cpu_flash_attn_work_size(const bp_tensor *dst, int nth, size_t *per_thread)
{
    struct attn a;
    attn_init(&a, (bp_tensor *)dst, nth);
    *per_thread = attn_floats(&a) * sizeof(float);
}

static float dot(const float *x, const float *y, int64_t n)
{
    int64_t i = 0;
    float s = 0.0f;
#if defined(BP_CPU_HAVE_AVX512)
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
    }
    for (; i + 16 <= n; i += 16)
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc0);
    s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(BP_CPU_HAVE_AVX2)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    const __m256 t = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#else
    float acc[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += x[i + l] * y[i + l];
    for (int l = 0; l < 8; l++)
        s += acc[l];
#endif
    for (; i < n; i++)
        s += x[i] * y[i];
    return s;
}

/* y += w * x over n floats. */
static void axpy(float *y, float w, const float *x, int64_t n)
{
    int64_t i = 0;
#if defined(BP_CPU_HAVE_AVX512)
    const __m512 vw = _mm512_set1_ps(w);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vw, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#elif defined(BP_CPU_HAVE_AVX2)
    const __m256 vw = _mm256_set1_ps(w);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] += w * x[i];
}

/* One unit: sequence b, key/value head g, query rows [t0, t1). */
static void attn_unit(const struct attn *a, int64_t b, int64_t g, int64_t t0, int64_t t1,
                      float *scratch)
{
    const bp_tensor *q = a->q, *k = a->k, *v = a->v, *mask = a->mask;
    const int64_t D = a->D, Dv = a->Dv, G = a->G, nr = t1 - t0, nq = G * nr;
    const int64_t kb = k->ne[3] == 1 ? 0 : b;
    float *kt = scratch, *vt = kt + ATTN_TILE * D, *s = vt + ATTN_TILE * Dv;
    float *mrow = s + ATTN_TILE, *M = mrow + ATTN_TILE, *S = M + nq, *acc = S + nq;
    for (int64_t qi = 0; qi < nq; qi++) {
        M[qi] = -INFINITY;
        S[qi] = 0.0f;
    }
    memset(acc, 0, (size_t)(nq * Dv) * sizeof(float));
    /* The last key any of the unit's rows sees. */
    const int64_t kv_end = a->causal ? a->KV - a->T + t1 : a->KV;
    const bool capped = a->softcap > 0.0f;
    const float pre = capped ? a->scale / a->softcap : a->scale;
    for (int64_t j0 = 0; j0 < kv_end; j0 += ATTN_TILE) {
        const int64_t nk = kv_end - j0 < ATTN_TILE ? kv_end - j0 : ATTN_TILE;
        for (int64_t jj = 0; jj < nk; jj++) {
            bp_cpu_to_float(k->type, bp_cpu_row(k, j0 + jj, g, kb), kt + jj * D, D);
            bp_cpu_to_float(v->type, bp_cpu_row(v, j0 + jj, g, kb), vt + jj * Dv, Dv);
        }
        for (int64_t hh = 0; hh < G; hh++) {
            const int64_t h = g * G + hh;
            for (int64_t i = t0; i < t1; i++) {
                const int64_t qi = hh * nr + (i - t0);
                /* Keys this row sees in the tile. */
                int64_t n = nk;
                if (a->causal && a->KV - a->T + i + 1 - j0 < n)
                    n = a->KV - a->T + i + 1 - j0;
                if (n <= 0)
                    continue;
                const float *qrow = bp_cpu_row(q, i, h, b);
                if (mask != NULL)
                    bp_cpu_to_float(mask->type,
                                    (const char *)bp_cpu_row(mask, i, h % mask->ne[2],
                                                             b % mask->ne[3]) +
                                        j0 * (int64_t)mask->nb[0],
                                    mrow, n);
                float tmax = -INFINITY;
                for (int64_t jj = 0; jj < n; jj++) {
                    float x = dot(qrow, kt + jj * D, D) * pre;
                    if (capped)
                        x = a->softcap * tanhf(x);
                    if (mask != NULL)
                        x += mrow[jj];
                    s[jj] = x;
                    tmax = x > tmax ? x : tmax;
                }
                if (tmax == -INFINITY)
                    continue; /* nothing visible in this tile */
                float *y = acc + qi * Dv;
                if (tmax > M[qi]) {
                    const float c = expf(M[qi] - tmax); /* 0 the first time */
                    S[qi] *= c;
                    for (int64_t d = 0; d < Dv; d++)
                        y[d] *= c;
                    M[qi] = tmax;
                }
                const float m = M[qi];
                for (int64_t jj = 0; jj < n; jj++) {
                    const float w = expf(s[jj] - m);
                    S[qi] += w;
                    axpy(y, w, vt + jj * Dv, Dv);
                }
            }
        }
    }
    for (int64_t hh = 0; hh < G; hh++) {
        for (int64_t i = t0; i < t1; i++) {
            const int64_t qi = hh * nr + (i - t0);
            float *out = bp_cpu_row(a->dst, g * G + hh, i, b);
            const float inv = S[qi] > 0.0f ? 1.0f / S[qi] : 0.0f;
            for (int64_t d = 0; d < Dv; d++)
                out[d] = acc[qi * Dv + d] * inv;
        }
    }
}

void bp_cpu_flash_attn(bp_tensor *dst, const struct bp_cpu_params *p)
{
    struct attn a;
    attn_init(&a, dst, p->nth);
    int64_t u0, u1;
    bp_cpu_split(a.units, p->ith, p->nth, &u0, &u1);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t blk = u % a.blocks, head = u / a.blocks;
        const int64_t g = head % a.HK, b = head / a.HK;
        const int64_t t0 = blk * a.rows, t1 = t0 + a.rows < a.T ? t0 + a.rows : a.T;
        attn_unit(&a, b, g, t0, t1, p->wdata);
    }
}

bool bp_cpu_flash_attn_supported(const bp_tensor *dst)
{
    const bp_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    /* Rows read as contiguous runs: the innermost dimension of every source and the result. */
    return q->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float) &&
           k->nb[0] == bp_type_size(k->type) && v->nb[0] == bp_type_size(v->type) &&
           (mask == NULL || mask->nb[0] == bp_type_size(mask->type));
}
