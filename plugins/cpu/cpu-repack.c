/* cpu-repack.c - the "CPU_REPACK" buffer type: Q4_0 weights stored row-interleaved for the
 * matrix-vector kernel, converted when they are written and back when they are read.
 *
 * Which tensors: a 2-D (ne[2] = ne[3] = 1), contiguous, non-view Q4_0 tensor placed in a
 * CPU_REPACK buffer is stored repacked; every other tensor placed there is stored as it is, as in
 * host memory. Applications reach the buffer type through the CPU registry's proc address
 * "bp_cpu_repack_buffer_type" and use it for weights that the CPU multiplies.
 *
 * The layout: rows in groups of eight (the last group padded with zero rows), each group
 * nblk * 144 bytes (nblk = ne[0] / 32 blocks per row), the same 18 bytes per row and block as
 * Q4_0 itself. A group holds first the quants of its blocks, 128 bytes per block, then the
 * scales, 16 bytes per block:
 *
 *   quants of block kb, at kb * 128:  [row 0 qs 0-7][row 1 qs 0-7] ... [row 7 qs 0-7]
 *                                     [row 0 qs 8-15] ...             [row 7 qs 8-15]
 *   scales of block kb, at nblk * 128 + kb * 16: the eight rows' f16 scales
 *
 * so a 512-bit load of the first 64 bytes gives every row two 32-bit lanes (lane 2j: row j's
 * values 0-3 in the low nibbles and 16-19 in the high; lane 2j + 1: values 4-7 and 20-23), and
 * an 8-byte broadcast of the activation's quants matches them without any shuffle. One vector of
 * integer dot products then covers eight rows, and the eight scales are one 16-byte load.
 *
 * Operations on repacked data: MUL_MAT (as src[0]) and GET_ROWS (as src[0]) of the tensor
 * itself; views of it and any other op are refused by supports_op, so the scheduler copies the
 * tensor (through get_tensor, which unpacks) wherever something else needs it. Reads and writes
 * go in whole Q4_0 blocks. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "cpu-impl.h"

#define GROUP 8
#define QS_BYTES 128 /* quants of one block of a group */
#define SC_BYTES 16  /* scales of one block of a group */
#define ALIGNMENT 64
#define PREFETCH 4096 /* bytes ahead of the quants being read */

/* Identifies our buffer types: their context points here (compared, never read). */
static const char repack_tag;

bool bp_cpu_is_repack_buft(bp_buffer_type *buft)
{
    return buft != NULL && bp_buffer_type_get_context(buft) == &repack_tag;
}

static bool eligible(const bp_tensor *t)
{
    return t->type == BP_TYPE_Q4_0 && t->view_src == NULL && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->ne[0] % 32 == 0 && t->nb[0] == sizeof(struct bp_block_q4_0) &&
           t->nb[1] == (size_t)(t->ne[0] / 32) * sizeof(struct bp_block_q4_0);
}

const bp_tensor *bp_cpu_repacked_base(const bp_tensor *t)
{
    if (t == NULL)
        return NULL;
    /* Asked for every source of every node the scheduler places: the cheap tests first. */
    const bp_tensor *base = t->view_src ? t->view_src : t;
    if (!eligible(base) || base->buffer == NULL ||
        !bp_cpu_is_repack_buft(bp_buffer_get_type(base->buffer)))
        return NULL;
    return base;
}

bool bp_cpu_repack_supports_op(const bp_tensor *op)
{
    if (bp_cpu_repacked_base(op) != NULL)
        return false; /* nothing writes repacked data */
    for (int i = 0; i < BP_MAX_SRC; i++) {
        const bp_tensor *s = op->src[i];
        if (s == NULL || bp_cpu_repacked_base(s) == NULL)
            continue;
        if (i != 0 || s->view_src != NULL || (op->op != BP_OP_MUL_MAT && op->op != BP_OP_GET_ROWS))
            return false;
    }
    return true;
}

void bp_cpu_repack_get_block(const bp_tensor *t, int64_t r, int64_t kb, struct bp_block_q4_0 *out)
{
    const int64_t nblk = t->ne[0] / 32;
    const char *g = (const char *)t->data + (r / GROUP) * nblk * (QS_BYTES + SC_BYTES);
    const int j = (int)(r % GROUP);
    memcpy(&out->d, g + nblk * QS_BYTES + kb * SC_BYTES + 2 * j, 2);
    memcpy(out->qs, g + kb * QS_BYTES + 8 * j, 8);
    memcpy(out->qs + 8, g + kb * QS_BYTES + 64 + 8 * j, 8);
}

void bp_cpu_repack_unpack_group(const bp_tensor *t, int64_t g, int rows,
                                struct bp_block_q4_0 *out)
{
    const int64_t nblk = t->ne[0] / 32;
    const char *grp = (const char *)t->data + g * nblk * (QS_BYTES + SC_BYTES);
    const char *sc = grp + nblk * QS_BYTES;
    for (int64_t kb = 0; kb < nblk; kb++) {
        const char *q = grp + kb * QS_BYTES;
        for (int j = 0; j < rows; j++) {
            struct bp_block_q4_0 *o = out + j * nblk + kb;
            memcpy(&o->d, sc + kb * SC_BYTES + 2 * j, 2);
            memcpy(o->qs, q + 8 * j, 8);
            memcpy(o->qs + 8, q + 64 + 8 * j, 8);
        }
    }
}

static void put_block(const bp_tensor *t, int64_t r, int64_t kb, const struct bp_block_q4_0 *in)
{
    const int64_t nblk = t->ne[0] / 32;
    char *g = (char *)t->data + (r / GROUP) * nblk * (QS_BYTES + SC_BYTES);
    const int j = (int)(r % GROUP);
    memcpy(g + nblk * QS_BYTES + kb * SC_BYTES + 2 * j, &in->d, 2);
    memcpy(g + kb * QS_BYTES + 8 * j, in->qs, 8);
    memcpy(g + kb * QS_BYTES + 64 + 8 * j, in->qs + 8, 8);
}

static size_t repacked_size(const bp_tensor *t)
{
    const int64_t rows = (t->ne[1] + GROUP - 1) / GROUP * GROUP;
    return (size_t)rows * (size_t)(t->ne[0] / 32) * sizeof(struct bp_block_q4_0);
}

/* ---- Buffers ------------------------------------------------------------------------------ */

struct repack_buffer {
    void *mem;
};

static void *rb_base(bp_buffer *buf)
{
    const struct repack_buffer *rb = bp_buffer_get_context(buf);
    return rb->mem;
}

static void rb_free(bp_buffer *buf)
{
    struct repack_buffer *rb = bp_buffer_get_context(buf);
    free(rb->mem);
    free(rb);
}

/* The padding rows of the last group are zero (scale 0), so the kernels may read them. */
static enum bp_status rb_init_tensor(bp_buffer *buf, bp_tensor *t)
{
    (void)buf;
    if (eligible(t)) {
        const int64_t nblk = t->ne[0] / 32;
        const struct bp_block_q4_0 zero = {0};
        for (int64_t r = t->ne[1]; r % GROUP != 0; r++)
            for (int64_t kb = 0; kb < nblk; kb++)
                put_block(t, r, kb, &zero);
    }
    return BP_OK;
}

/* Whether [offset, offset + size) of repacked-layout tensor t can be read or written: t itself
 * (not a view of it), whole blocks. */
static enum bp_status check_range(const char *fn, const bp_tensor *t, size_t offset, size_t size)
{
    const size_t bs = sizeof(struct bp_block_q4_0);
    if (t->view_src != NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "CPU_REPACK %s: '%s' is a view of a repacked "
                            "tensor; use the tensor '%s' itself", fn, t->name, t->view_src->name);
    if (offset % bs != 0 || size % bs != 0)
        return bp_set_error(BP_ERR_INVALID_ARG,
                            "CPU_REPACK %s: tensor '%s' is stored repacked and is read and written "
                            "in whole Q4_0 blocks of %zu bytes (offset %zu, size %zu)",
                            fn, t->name, bs, offset, size);
    return BP_OK;
}

static enum bp_status rb_set(bp_buffer *buf, bp_tensor *t, const void *data, size_t offset,
                             size_t size)
{
    (void)buf;
    if (bp_cpu_repacked_base(t) == NULL) {
        memcpy((char *)t->data + offset, data, size);
        return BP_OK;
    }
    enum bp_status st = check_range("set", t, offset, size);
    const int64_t nblk = t->ne[0] / 32, b0 = (int64_t)(offset / sizeof(struct bp_block_q4_0));
    const struct bp_block_q4_0 *in = data;
    for (int64_t i = 0; st == BP_OK && i < (int64_t)(size / sizeof(*in)); i++)
        put_block(t, (b0 + i) / nblk, (b0 + i) % nblk, in + i);
    return st;
}

static enum bp_status rb_get(bp_buffer *buf, const bp_tensor *t, void *data, size_t offset,
                             size_t size)
{
    (void)buf;
    if (bp_cpu_repacked_base(t) == NULL) {
        memcpy(data, (const char *)t->data + offset, size);
        return BP_OK;
    }
    enum bp_status st = check_range("get", t, offset, size);
    const int64_t nblk = t->ne[0] / 32, b0 = (int64_t)(offset / sizeof(struct bp_block_q4_0));
    struct bp_block_q4_0 *out = data;
    for (int64_t i = 0; st == BP_OK && i < (int64_t)(size / sizeof(*out)); i++)
        bp_cpu_repack_get_block(t, (b0 + i) / nblk, (b0 + i) % nblk, out + i);
    return st;
}

/* Every byte of each block gets value: in either layout that is the same bytes, but only whole
 * blocks of a repacked tensor are its own. */
static enum bp_status rb_memset(bp_buffer *buf, bp_tensor *t, uint8_t value, size_t offset,
                                size_t size)
{
    (void)buf;
    if (bp_cpu_repacked_base(t) == NULL) {
        memset((char *)t->data + offset, value, size);
        return BP_OK;
    }
    enum bp_status st = check_range("memset", t, offset, size);
    struct bp_block_q4_0 blk;
    memset(&blk, value, sizeof(blk));
    const int64_t nblk = t->ne[0] / 32, b0 = (int64_t)(offset / sizeof(blk));
    for (int64_t i = 0; st == BP_OK && i < (int64_t)(size / sizeof(blk)); i++)
        put_block(t, (b0 + i) / nblk, (b0 + i) % nblk, &blk);
    return st;
}

static enum bp_status rb_clear(bp_buffer *buf, uint8_t value)
{
    memset(rb_base(buf), value, bp_buffer_get_size(buf));
    return BP_OK;
}

static const struct bp_buffer_iface repack_buffer_iface = {
    .struct_size = sizeof(struct bp_buffer_iface),
    .free_buffer = rb_free,
    .get_base = rb_base,
    .init_tensor = rb_init_tensor,
    .memset_tensor = rb_memset,
    .set_tensor = rb_set,
    .get_tensor = rb_get,
    .clear = rb_clear,
};

/* ---- The buffer type ------------------------------------------------------------------------ */

static const char *rbt_name(bp_buffer_type *buft)
{
    (void)buft;
    return "CPU_REPACK";
}

static size_t rbt_alignment(bp_buffer_type *buft)
{
    (void)buft;
    return ALIGNMENT;
}

static size_t rbt_alloc_size(bp_buffer_type *buft, const bp_tensor *t)
{
    (void)buft;
    return eligible(t) ? repacked_size(t) : bp_nbytes(t);
}

static bp_buffer *rbt_alloc(bp_buffer_type *buft, size_t size)
{
    if (size > SIZE_MAX - 2 * ALIGNMENT) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU_REPACK: a buffer of %zu bytes is too large", size);
        return NULL;
    }
    const size_t rounded = size == 0 ? ALIGNMENT : (size + ALIGNMENT - 1) & ~(size_t)(ALIGNMENT - 1);
    struct repack_buffer *rb = calloc(1, sizeof(*rb));
    if (rb != NULL)
        rb->mem = aligned_alloc(ALIGNMENT, rounded);
    if (rb == NULL || rb->mem == NULL) {
        free(rb);
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CPU_REPACK: out of memory allocating %zu bytes", size);
        return NULL;
    }
    bp_buffer *buf = bp_buffer_new(buft, &repack_buffer_iface, rb, size);
    if (buf == NULL) {
        free(rb->mem);
        free(rb);
    }
    return buf;
}

static const struct bp_buffer_type_iface repack_buft_iface = {
    .struct_size = sizeof(struct bp_buffer_type_iface),
    .get_name = rbt_name,
    .alloc_buffer = rbt_alloc,
    .get_alignment = rbt_alignment,
    .get_alloc_size = rbt_alloc_size,
};

bp_buffer_type *bp_cpu_repack_buft_new(bp_device *dev)
{
    return bp_buffer_type_new(dev, &repack_buft_iface, (void *)&repack_tag);
}

/* ---- Kernels ------------------------------------------------------------------------------- */

#ifdef BP_CPU_REPACK_KERNEL
#include <immintrin.h>

#if defined(__AVX512F__)
#define NC_MAX 4 /* columns per pass */

BP_CPU_INLINE __m512i bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi64(v);
}

/* One group of eight rows against nc (1-4) columns: out[c * 8 + j] = row j . column c. The
 * nibbles are used unsigned (q + 8); ycorr (-4 times the block's quant sum, per lane, two lanes
 * per row) removes the offset. */
BP_CPU_INLINE void group_t(const int nc, const char *grp, int64_t nblk,
                           const struct bp_block_q8_0 *const y[4], const int32_t *const ycorr[4],
                           const float *const yd[4], float *out)
{
    const char *sc = grp + nblk * QS_BYTES;
    const __m512i m = _mm512_set1_epi8(0x0f);
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < nblk; kb++) {
        /* The group's quants stream from L3 or memory: ask 4 KiB ahead (measured: +5-15 % at
         * N = 1 against none, 1 KiB or 2 KiB ahead, or 8 KiB into L2). */
        _mm_prefetch(grp + kb * QS_BYTES + PREFETCH, _MM_HINT_T0);
        _mm_prefetch(grp + kb * QS_BYTES + PREFETCH + 64, _MM_HINT_T0);
        const __m512i q0 = _mm512_loadu_si512(grp + kb * QS_BYTES);
        const __m512i q1 = _mm512_loadu_si512(grp + kb * QS_BYTES + 64);
        const __m512i lo0 = _mm512_and_si512(q0, m), hi0 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m);
        const __m512i lo1 = _mm512_and_si512(q1, m), hi1 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m);
        const __m512 sw = _mm512_permutexvar_ps(
            dup, _mm512_castps256_ps512(
                     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + kb * SC_BYTES)))));
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qs = y[c][kb].qs;
            /* Two chains of two dot products, not one of four: the block's sum is ready
             * sooner, so more blocks are in flight (N = 8 one thread: 1.5x). */
            __m512i s = _mm512_set1_epi32(ycorr[c][kb]), t = _mm512_setzero_si512();
            s = _mm512_dpbusd_epi32(s, lo0, bcast8(qs));
            t = _mm512_dpbusd_epi32(t, lo1, bcast8(qs + 8));
            s = _mm512_dpbusd_epi32(s, hi0, bcast8(qs + 16));
            t = _mm512_dpbusd_epi32(t, hi1, bcast8(qs + 24));
            s = _mm512_add_epi32(s, t);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                     _mm512_mul_ps(sw, _mm512_set1_ps(yd[c][kb])), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        /* Lanes 2j and 2j + 1 are row j's. */
        const __m512 pair = _mm512_add_ps(acc[c], _mm512_permute_ps(acc[c], 0xb1));
        _mm256_storeu_ps(out + 8 * c, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, pair)));
    }
}

static void group(int nc, const char *grp, int64_t nblk, const struct bp_block_q8_0 *const y[4],
                  const int32_t *const ycorr[4], const float *const yd[4], float *out)
{
    switch (nc) {
    case 1:
        group_t(1, grp, nblk, y, ycorr, yd, out);
        break;
    case 2:
        group_t(2, grp, nblk, y, ycorr, yd, out);
        break;
    case 3:
        group_t(3, grp, nblk, y, ycorr, yd, out);
        break;
    default:
        group_t(4, grp, nblk, y, ycorr, yd, out);
        break;
    }
}
#else /* AVX2: no vpdpbusd, so vpmaddubsw (pairs into 16 bits) and vpmaddwd (into 32) */
#define NC_MAX 2 /* 16 registers: eight nibble vectors and two accumulators per column */

BP_CPU_INLINE __m256i bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi64x(v);
}

/* As the AVX-512 kernel, each half of the group (rows 0-3, rows 4-7) in its own register. The
 * four pair sums of a row's lane fit in 16 bits (4 * 2 * 15 * 127), so they are added before
 * widening. */
BP_CPU_INLINE void group_t(const int nc, const char *grp, int64_t nblk,
                           const struct bp_block_q8_0 *const y[4], const int32_t *const ycorr[4],
                           const float *const yd[4], float *out)
{
    const char *sc = grp + nblk * QS_BYTES;
    const __m256i m = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i dup0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i dup1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int c = 0; c < nc; c++)
        acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    for (int64_t kb = 0; kb < nblk; kb++) {
        _mm_prefetch(grp + kb * QS_BYTES + PREFETCH, _MM_HINT_T0);
        _mm_prefetch(grp + kb * QS_BYTES + PREFETCH + 64, _MM_HINT_T0);
        const char *q = grp + kb * QS_BYTES;
        __m256i lo[2][2], hi[2][2]; /* [half of the block's bytes][rows 0-3, 4-7] */
        for (int u = 0; u < 2; u++)
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * u + 32 * h));
                lo[u][h] = _mm256_and_si256(v, m);
                hi[u][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
            }
        const __m256 s8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + kb * SC_BYTES)));
#pragma GCC unroll 2
        for (int c = 0; c < nc; c++) {
            const int8_t *qs = y[c][kb].qs;
            const __m256i a0 = bcast8(qs), a1 = bcast8(qs + 8), a2 = bcast8(qs + 16),
                          a3 = bcast8(qs + 24);
            const __m256 sd = _mm256_mul_ps(s8, _mm256_set1_ps(yd[c][kb]));
            for (int h = 0; h < 2; h++) {
                const __m256i p = _mm256_add_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo[0][h], a0),
                                     _mm256_maddubs_epi16(lo[1][h], a1)),
                    _mm256_add_epi16(_mm256_maddubs_epi16(hi[0][h], a2),
                                     _mm256_maddubs_epi16(hi[1][h], a3)));
                const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(p, ones),
                                                     _mm256_set1_epi32(ycorr[c][kb]));
                const __m256 w = _mm256_permutevar8x32_ps(sd, h ? dup1 : dup0);
                acc[c][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), w, acc[c][h]);
            }
        }
    }
#pragma GCC unroll 2
    for (int c = 0; c < nc; c++)
        for (int h = 0; h < 2; h++) {
            float t[8];
            _mm256_storeu_ps(t, acc[c][h]);
            for (int j = 0; j < 4; j++)
                out[8 * c + 4 * h + j] = t[2 * j] + t[2 * j + 1];
        }
}

static void group(int nc, const char *grp, int64_t nblk, const struct bp_block_q8_0 *const y[4],
                  const int32_t *const ycorr[4], const float *const yd[4], float *out)
{
    if (nc == 1)
        group_t(1, grp, nblk, y, ycorr, yd, out);
    else
        group_t(2, grp, nblk, y, ycorr, yd, out);
}
#endif
void bp_cpu_repack_mul_mat(const bp_tensor *a, const struct bp_block_q8_0 *bq,
                           const int32_t *ycorr, const float *yd, float *c, int64_t ldc,
                           int64_t g0, int64_t g1, int64_t N)
{
    const int64_t nblk = a->ne[0] / 32, M = a->ne[1];
    for (int64_t g = g0; g < g1; g++) {
        const char *grp = (const char *)a->data + g * nblk * (QS_BYTES + SC_BYTES);
        const int rows = M - g * GROUP < GROUP ? (int)(M - g * GROUP) : GROUP;
        for (int64_t n = 0; n < N; n += NC_MAX) {
            const int nc = N - n < NC_MAX ? (int)(N - n) : NC_MAX;
            const struct bp_block_q8_0 *y[4];
            const int32_t *yc[4];
            const float *ydc[4];
            for (int k = 0; k < 4; k++) {
                const int64_t col = n + (k < nc ? k : 0);
                y[k] = bq + col * nblk;
                yc[k] = ycorr + col * nblk;
                ydc[k] = yd + col * nblk;
            }
            float out[32];
            group(nc, grp, nblk, y, yc, ydc, out);
            for (int k = 0; k < nc; k++)
                memcpy(c + (n + k) * ldc + g * GROUP, out + 8 * k, (size_t)rows * sizeof(float));
        }
    }
}
#endif /* BP_CPU_REPACK_KERNEL */
