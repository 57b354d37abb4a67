/* cpu-repack.c - the "CPU_REPACK" buffer type: Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1 and Q5_1 weights
 * stored row-interleaved for the CPU's kernels, converted when they are written and back when
 * they are read.
 *
 * Which tensors: a 2-D (ne[2] = ne[3] = 1), contiguous, non-view tensor of a type this variant
 * repacks (bp_cpu_repack_stores: Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1 and Q5_1 on avx512, Q4_0 on
 * avx2, none on the baseline) placed in a CPU_REPACK buffer is stored repacked; every other
 * tensor placed there is stored as it is, as in host memory. Applications reach the buffer type
 * through the CPU registry's proc address "bp_cpu_repack_buffer_type" and use it for weights
 * that the CPU multiplies.
 *
 * The layout: rows in groups of eight (the last group padded with zero rows), the same bytes per
 * row and block as the type itself (18 for Q4_0 and IQ4_NL, 20 for Q4_1, 22 for Q5_0, 24 for
 * Q5_1, 34 for Q8_0), so a group is nblk * 8 blocks (nblk = ne[0] / 32 blocks per row). A group
 * holds first the quants of its blocks, qb * 8 bytes per block (qb = 16 quant bytes per row, 32
 * for Q8_0), then Q5_0's and Q5_1's fifth bits, 32 bytes per block, then the scales, 16 bytes per
 * block (Q4_1, Q5_1: 32, each row's scale and minimum side by side). The quants of a block come in
 * runs of 64 bytes, run u holding bytes 8u..8u+7 of each row's quants, row j at 8j:
 *
 *   quants of block kb, at kb * 8 qb:  [row 0 qs 0-7][row 1 qs 0-7] ... [row 7 qs 0-7]
 *                                      [row 0 qs 8-15] ...              [row 7 qs 8-15]  (...)
 *   fifth bits of block kb (Q5_0), at nblk * 8 qb + kb * 32: byte t of each row's qh, row j at
 *                                      8t + j (bits of values 8t..8t+7)
 *   scales of block kb, after them at kb * 16: the eight rows' f16 scales (Q4_1, Q5_1: at
 *                                      kb * 32, d and m of row 0, of row 1, ...)
 *
 * so a 512-bit load of a run gives every row two 32-bit lanes, and an 8-byte broadcast of the
 * activation's quants matches them without any shuffle: for Q8_0, run u holds values 8u..8u+7;
 * for the 4- and 5-bit types, the low nibbles of run u hold values 8u..8u+7 and the high nibbles
 * 16+8u..23+8u (IQ4_NL's nibbles index its table of 16 values, looked up with a byte shuffle;
 * the fifth bits for the same values are one 64-bit mask, 8 bytes of its fifth bits). One
 * vector of integer dot products then covers eight rows, and the eight scales are one 16-byte
 * load (Q4_1, Q5_1: a 32-byte load, the minimums taking the activations' block sums). The quants keep their values (Q8_0 stays signed), so every byte of a block stays a byte of
 * the same block: memset and clear mean the same in either layout.
 *
 * Operations on repacked data: MUL_MAT (as src[0]) and GET_ROWS (as src[0]) of a 2-D tensor
 * itself, MUL_MAT_ID (as src[0]) of stacked ones; views of it and any other op are refused by
 * supports_op, so the scheduler copies the
 * tensor (through get_tensor, which unpacks) wherever something else needs it. Reads and writes
 * go in whole blocks. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "cpu-impl.h"

#define GROUP 8
#define ALIGNMENT 64
#define PREFETCH 4096     /* bytes ahead of the quants being read, into L1 */
#define PREFETCH_L2 16384 /* and further ahead into L2 */

/* Identifies our buffer types: their context points here (compared, never read). */
static const char repack_tag;

bool bp_cpu_is_repack_buft(bp_buffer_type *buft)
{
    return buft != NULL && bp_buffer_type_get_context(buft) == &repack_tag;
}

/* Quant bytes per row and block, bytes of fifth bits (Q5_0's and Q5_1's qh), bytes of scale
 * (and minimum: Q4_1, Q5_1), and bytes per block. */
static int64_t qbytes(enum bp_type type)
{
    return type == BP_TYPE_Q8_0 ? 32 : 16;
}

static int64_t hbytes(enum bp_type type)
{
    return type == BP_TYPE_Q5_0 || type == BP_TYPE_Q5_1 ? 4 : 0;
}

static bool has_min(enum bp_type type)
{
    return type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1;
}

static int64_t sbytes(enum bp_type type)
{
    return has_min(type) ? 4 : 2;
}

static int64_t block_bytes(enum bp_type type)
{
    return sbytes(type) + hbytes(type) + qbytes(type);
}

/* The types this variant stores repacked: those it has a kernel for that reads them faster than
 * plain rows. Q4_0 with the AVX512-VNNI or the AVX2 kernel; Q8_0, IQ4_NL, Q5_0, Q4_1 and Q5_1
 * only with AVX512-VNNI (Q4_1 at N = 1, M = K = 4096, 2 threads: 132 GFLOP/s against 58 for its
 * dot products; Q5_1 96 against 35): IQ4_NL's values shifted to unsigned bytes (up to 240)
 * would saturate AVX2's 16-bit pair sums, the fifth bits come in through a mask register, and on
 * the avx2 variant
 * plain Q8_0 rows stream at 0.97 of the read bandwidth at N = 1 against 0.81 repacked (M 32000,
 * K 4096, 2 threads) and the broadcast kernel beats the repacked one at N = 32 (205 against 168
 * GFLOP/s). Elsewhere (the baseline, generic builds) nothing is: the buffer type then holds
 * plain rows, like host memory, and the ordinary kernels read them. */
bool bp_cpu_repack_stores(enum bp_type type)
{
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    return type == BP_TYPE_Q4_0 || type == BP_TYPE_Q8_0 || type == BP_TYPE_IQ4_NL ||
           type == BP_TYPE_Q5_0 || type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1;
#elif defined(BP_CPU_REPACK_KERNEL)
    return type == BP_TYPE_Q4_0;
#else
    (void)type;
    return false;
#endif
}

/* A 2-D tensor, or stacked matrices [K, M, n, 1] (MUL_MAT_ID's experts) whose M is a multiple
 * of the group: their M * n rows are grouped as one matrix's, and no group spans two of them,
 * so matrix e starts e * nb[2] bytes in, as in the plain layout. Contiguous, whole blocks. */
static bool eligible(const bp_tensor *t)
{
    return bp_cpu_repack_stores(t->type) && t->view_src == NULL &&
           (t->ne[2] == 1 || t->ne[1] % GROUP == 0) && t->ne[3] == 1 && t->ne[0] % 32 == 0 &&
           t->nb[0] == (size_t)block_bytes(t->type) &&
           t->nb[1] == (size_t)(t->ne[0] / 32 * block_bytes(t->type)) &&
           t->nb[2] == t->nb[1] * (size_t)t->ne[1];
}

/* Rows of a repacked tensor, all its matrices'. */
static int64_t n_rows(const bp_tensor *t)
{
    return t->ne[1] * t->ne[2];
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
        /* MUL_MAT and GET_ROWS read one matrix, MUL_MAT_ID stacked ones. */
        const bool one = s->ne[2] == 1 && (op->op == BP_OP_MUL_MAT || op->op == BP_OP_GET_ROWS);
        if (i != 0 || s->view_src != NULL || !(one || op->op == BP_OP_MUL_MAT_ID))
            return false;
    }
    return true;
}

/* The first byte of group g (rows 8g..8g+7). */
static char *group_of(const bp_tensor *t, int64_t g)
{
    return (char *)t->data + g * (t->ne[0] / 32) * GROUP * block_bytes(t->type);
}

/* Row j of group grp, block kb, copied out of (or, with in, into) the layout: the scale (and
 * minimum), the fifth bits (Q5_0, Q5_1: byte t of row j at kb * 32 + 8t + j of the group's fifth
 * bits) and the quants. */
BP_CPU_INLINE void block_out(const char *grp, int64_t nblk, enum bp_type type, int j, int64_t kb,
                             char *out)
{
    const int64_t qb = qbytes(type), hb = hbytes(type), sb = sbytes(type);
    const char *hbits = grp + nblk * GROUP * qb, *scales = hbits + nblk * GROUP * hb;
    memcpy(out, scales + kb * GROUP * sb + sb * j, (size_t)sb);
    for (int64_t t = 0; t < hb; t++)
        out[sb + t] = hbits[kb * GROUP * hb + GROUP * t + j];
    for (int64_t u = 0; u < qb / 8; u++)
        memcpy(out + sb + hb + 8 * u, grp + kb * GROUP * qb + 64 * u + 8 * j, 8);
}

BP_CPU_INLINE void block_in(char *grp, int64_t nblk, enum bp_type type, int j, int64_t kb,
                            const char *in)
{
    const int64_t qb = qbytes(type), hb = hbytes(type), sb = sbytes(type);
    char *hbits = grp + nblk * GROUP * qb, *scales = hbits + nblk * GROUP * hb;
    memcpy(scales + kb * GROUP * sb + sb * j, in, (size_t)sb);
    for (int64_t t = 0; t < hb; t++)
        hbits[kb * GROUP * hb + GROUP * t + j] = in[sb + t];
    for (int64_t u = 0; u < qb / 8; u++)
        memcpy(grp + kb * GROUP * qb + 64 * u + 8 * j, in + sb + hb + 8 * u, 8);
}

void bp_cpu_repack_get_block(const bp_tensor *t, int64_t r, int64_t kb, void *out)
{
    block_out(group_of(t, r / GROUP), t->ne[0] / 32, t->type, (int)(r % GROUP), kb, out);
}

static void put_block(const bp_tensor *t, int64_t r, int64_t kb, const void *in)
{
    block_in(group_of(t, r / GROUP), t->ne[0] / 32, t->type, (int)(r % GROUP), kb, in);
}

static size_t repacked_size(const bp_tensor *t)
{
    const int64_t rows = (n_rows(t) + GROUP - 1) / GROUP * GROUP;
    return (size_t)rows * (size_t)(t->ne[0] / 32 * block_bytes(t->type));
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
        const char zero[34] = {0};
        for (int64_t r = n_rows(t); r % GROUP != 0; r++)
            for (int64_t kb = 0; kb < nblk; kb++)
                put_block(t, r, kb, zero);
    }
    return BP_OK;
}

/* Whether [offset, offset + size) of repacked-layout tensor t can be read or written: t itself
 * (not a view of it), whole blocks. */
static enum bp_status check_range(const char *fn, const bp_tensor *t, size_t offset, size_t size)
{
    const size_t bs = (size_t)block_bytes(t->type);
    char desc[BP_TENSOR_DESC_SIZE], src_desc[BP_TENSOR_DESC_SIZE];
    if (t->view_src != NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "CPU_REPACK %s: %s is a view of a repacked "
                            "tensor; use the tensor %s itself", fn,
                            bp_describe_tensor(t, desc, sizeof(desc)),
                            bp_describe_tensor(t->view_src, src_desc, sizeof(src_desc)));
    if (offset % bs != 0 || size % bs != 0)
        return bp_set_error(BP_ERR_INVALID_ARG,
                            "CPU_REPACK %s: tensor %s is stored repacked and is read and written "
                            "in whole %s blocks of %zu bytes (offset %zu, size %zu)",
                            fn, bp_describe_tensor(t, desc, sizeof(desc)), bp_type_name(t->type),
                            bs, offset, size);
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
    const int64_t nblk = t->ne[0] / 32, bs = block_bytes(t->type), b0 = (int64_t)offset / bs;
    for (int64_t i = 0; st == BP_OK && i < (int64_t)size / bs; i++)
        put_block(t, (b0 + i) / nblk, (b0 + i) % nblk, (const char *)data + i * bs);
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
    const int64_t nblk = t->ne[0] / 32, bs = block_bytes(t->type), b0 = (int64_t)offset / bs;
    for (int64_t i = 0; st == BP_OK && i < (int64_t)size / bs; i++)
        bp_cpu_repack_get_block(t, (b0 + i) / nblk, (b0 + i) % nblk, (char *)data + i * bs);
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
    char blk[34];
    memset(blk, value, sizeof(blk));
    const int64_t nblk = t->ne[0] / 32, bs = block_bytes(t->type), b0 = (int64_t)offset / bs;
    for (int64_t i = 0; st == BP_OK && i < (int64_t)size / bs; i++)
        put_block(t, (b0 + i) / nblk, (b0 + i) % nblk, blk);
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

/* The activation's block sums times this start each lane (Q4_0: nibbles used as unsigned, q + 8,
 * two lanes a row, so -4; Q8_0, repacked on AVX-512 only: bytes x ^ 0x80 = x + 128, so -64;
 * IQ4_NL, the same: its table values plus 128; Q5_0: q + 16 with the fifth bit, so -8). */
int32_t bp_cpu_repack_ycorr(enum bp_type type)
{
    if (has_min(type)) /* Q4_1, Q5_1: no offset; the raw sums, for their minimums */
        return 1;
    return type == BP_TYPE_Q4_0 ? -4 : type == BP_TYPE_Q5_0 ? -8 : -64;
}

#ifdef BP_CPU_REPACK_KERNEL

#if defined(BP_CPU_HAVE_AVX512)
#include "cpu-unpack32.h" /* iq4nl_values */

#define NC_MAX 4 /* columns per pass */
#define BY_COLUMNS(nc, CALL) BP_CPU_BY_COLUMNS(nc, CALL)

BP_CPU_INLINE __m512i bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi64(v);
}

/* One group of eight rows against nc (1-4) columns: out[c * 8 + j] = row j . column c. The
 * weights are used unsigned; ycorr (per lane, two lanes per row) removes the offset. v[u] holds
 * the values 8u..8u+7 of every row, matching the activation's bytes 8u..8u+7. */
BP_CPU_INLINE void group_t(const enum bp_type type, const int nc, const char *grp, int64_t nblk,
                           const struct bp_block_q8_0 *const y[4], const int32_t *const ycorr[4],
                           const float *const yd[4], float *out)
{
    const int64_t qs_bytes = GROUP * qbytes(type), hs_bytes = GROUP * hbytes(type);
    const int64_t sc_bytes = GROUP * sbytes(type);
    const bool mins = has_min(type);
    const char *hbits = grp + nblk * qs_bytes, *sc = hbits + nblk * hs_bytes;
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* Scales and minimums interleaved (Q4_1, Q5_1: d0 m0 d1 m1 ...): each row's d in both its
     * lanes, its m in the first only (the two lanes are added at the end). */
    const __m512i dup_d = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
    const __m512i at_m = _mm512_setr_epi32(1, 0, 3, 0, 5, 0, 7, 0, 9, 0, 11, 0, 13, 0, 15, 0);
    const __m512i sixteen = _mm512_set1_epi8(16);
    /* IQ4_NL's values plus 128 (1..241), in every 128-bit lane for the byte shuffle. */
    const __m512i iq4nl_u8 = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)iq4nl_values), _mm_set1_epi8((char)0x80)));
    __m512 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < nblk; kb++) {
        const char *q = grp + kb * qs_bytes;
        /* The group's quants stream from L3 or memory: ask 4 KiB ahead into L1 and 16 KiB
         * ahead into L2. Measured at N = 1, M = 32000, K = 4096 (weights from DRAM), fraction of
         * the read bandwidth, Q4_0: none 0.53, 4 KiB alone 0.65, 8 or 16 KiB into L2 alone 0.72,
         * both 0.82-0.90 (12 or 32 KiB into L2: 0.78-0.79). */
#pragma GCC unroll 4
        for (int64_t u = 0; u < qs_bytes / 64; u++) {
            _mm_prefetch(q + PREFETCH + 64 * u, _MM_HINT_T0);
            _mm_prefetch(q + PREFETCH_L2 + 64 * u, _MM_HINT_T1);
        }
        __m512i v[4];
        if (type != BP_TYPE_Q8_0) {
            const __m512i m = _mm512_set1_epi8(0x0f);
            const __m512i q0 = _mm512_loadu_si512(q), q1 = _mm512_loadu_si512(q + 64);
            v[0] = _mm512_and_si512(q0, m);
            v[1] = _mm512_and_si512(q1, m);
            v[2] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m);
            v[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m);
            if (type == BP_TYPE_IQ4_NL)
                for (int u = 0; u < 4; u++)
                    v[u] = _mm512_shuffle_epi8(iq4nl_u8, v[u]);
            /* Q5_0: the 8 bytes at 8u of the block's fifth bits are the eight rows' bits for
             * values 8u..8u+7, byte j row j's: a mask lined up with v[u]. */
            if (type == BP_TYPE_Q5_0 || type == BP_TYPE_Q5_1)
                for (int u = 0; u < 4; u++) {
                    uint64_t bits;
                    memcpy(&bits, hbits + kb * hs_bytes + 8 * u, sizeof(bits));
                    v[u] = _mm512_or_si512(v[u], _mm512_maskz_mov_epi8(bits, sixteen));
                }
        } else {
            const __m512i flip = _mm512_set1_epi8((char)0x80);
            for (int u = 0; u < 4; u++)
                v[u] = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * u), flip);
        }
        __m512 sw, mw = _mm512_setzero_ps();
        if (mins) {
            const __m512 dm =
                _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + kb * sc_bytes)));
            sw = _mm512_permutexvar_ps(dup_d, dm);
            mw = _mm512_maskz_permutexvar_ps(0x5555, at_m, dm);
        } else {
            sw = _mm512_permutexvar_ps(
                dup, _mm512_castps256_ps512(
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + kb * sc_bytes)))));
        }
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            const int8_t *qs = y[c][kb].qs;
            /* Two chains of two dot products, not one of four: the block's sum is ready
             * sooner, so more blocks are in flight (N = 8 one thread: 1.5x). */
            __m512i s = _mm512_set1_epi32(mins ? 0 : ycorr[c][kb]), t = _mm512_setzero_si512();
            s = _mm512_dpbusd_epi32(s, v[0], bcast8(qs));
            t = _mm512_dpbusd_epi32(t, v[1], bcast8(qs + 8));
            s = _mm512_dpbusd_epi32(s, v[2], bcast8(qs + 16));
            t = _mm512_dpbusd_epi32(t, v[3], bcast8(qs + 24));
            s = _mm512_add_epi32(s, t);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                     _mm512_mul_ps(sw, _mm512_set1_ps(yd[c][kb])), acc[c]);
            if (mins)
                acc[c] = _mm512_fmadd_ps(
                    mw, _mm512_set1_ps(yd[c][kb] * (float)ycorr[c][kb]), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        /* Lanes 2j and 2j + 1 are row j's. */
        const __m512 pair = _mm512_add_ps(acc[c], _mm512_permute_ps(acc[c], 0xb1));
        _mm256_storeu_ps(out + 8 * c, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, pair)));
    }
}

#else /* AVX2: no vpdpbusd, so vpmaddubsw (pairs into 16 bits) and vpmaddwd (into 32) */
#define NC_MAX 2 /* 16 registers: eight weight vectors and two accumulators per column */

BP_CPU_INLINE __m256i bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi64x(v);
}

/* As the AVX-512 kernel for Q4_0 (the only type this variant repacks), each half of the group
 * (rows 0-3, rows 4-7) in its own register: the four pair sums of a row's lane fit in 16 bits
 * (4 * 2 * 15 * 127), so they are added before widening. */
BP_CPU_INLINE void group_t(const enum bp_type type, const int nc, const char *grp, int64_t nblk,
                           const struct bp_block_q8_0 *const y[4], const int32_t *const ycorr[4],
                           const float *const yd[4], float *out)
{
    const int64_t qs_bytes = GROUP * qbytes(type);
    const char *sc = grp + nblk * qs_bytes;
    const __m256i m = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i dup0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i dup1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int c = 0; c < nc; c++)
        acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    for (int64_t kb = 0; kb < nblk; kb++) {
        const char *q = grp + kb * qs_bytes;
#pragma GCC unroll 4
        for (int64_t u = 0; u < qs_bytes / 64; u++) {
            _mm_prefetch(q + PREFETCH + 64 * u, _MM_HINT_T0);
            _mm_prefetch(q + PREFETCH_L2 + 64 * u, _MM_HINT_T1);
        }
        __m256i v[4][2]; /* [values 8u..8u+7][rows 0-3, 4-7] */
        for (int h = 0; h < 2; h++) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(q + 32 * h));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(q + 64 + 32 * h));
            v[0][h] = _mm256_and_si256(q0, m);
            v[1][h] = _mm256_and_si256(q1, m);
            v[2][h] = _mm256_and_si256(_mm256_srli_epi16(q0, 4), m);
            v[3][h] = _mm256_and_si256(_mm256_srli_epi16(q1, 4), m);
        }
        const __m256 s8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + kb * 16)));
#pragma GCC unroll 2
        for (int c = 0; c < nc; c++) {
            const int8_t *qs = y[c][kb].qs;
            const __m256i a[4] = {bcast8(qs), bcast8(qs + 8), bcast8(qs + 16), bcast8(qs + 24)};
            const __m256 sd = _mm256_mul_ps(s8, _mm256_set1_ps(yd[c][kb]));
            for (int h = 0; h < 2; h++) {
                const __m256i p = _mm256_add_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(v[0][h], a[0]),
                                     _mm256_maddubs_epi16(v[1][h], a[1])),
                    _mm256_add_epi16(_mm256_maddubs_epi16(v[2][h], a[2]),
                                     _mm256_maddubs_epi16(v[3][h], a[3])));
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

/* Two columns at most per pass. */
#define BY_COLUMNS(nc, CALL)                                                                   \
    if ((nc) == 1)                                                                             \
        CALL(1);                                                                               \
    else                                                                                       \
        CALL(2);
#endif

/* One loop per weight type and column count. */
static void group(enum bp_type type, int nc, const char *grp, int64_t nblk,
                  const struct bp_block_q8_0 *const y[4], const int32_t *const ycorr[4],
                  const float *const yd[4], float *out)
{
#define Q4(c) group_t(BP_TYPE_Q4_0, c, grp, nblk, y, ycorr, yd, out)
#define Q8(c) group_t(BP_TYPE_Q8_0, c, grp, nblk, y, ycorr, yd, out)
#define NL(c) group_t(BP_TYPE_IQ4_NL, c, grp, nblk, y, ycorr, yd, out)
#define Q5(c) group_t(BP_TYPE_Q5_0, c, grp, nblk, y, ycorr, yd, out)
#define Q41(c) group_t(BP_TYPE_Q4_1, c, grp, nblk, y, ycorr, yd, out)
#define Q51(c) group_t(BP_TYPE_Q5_1, c, grp, nblk, y, ycorr, yd, out)
#if defined(BP_CPU_HAVE_AVX512)
    if (type == BP_TYPE_Q4_0) {
        BY_COLUMNS(nc, Q4)
    } else if (type == BP_TYPE_IQ4_NL) {
        BY_COLUMNS(nc, NL)
    } else if (type == BP_TYPE_Q5_0) {
        BY_COLUMNS(nc, Q5)
    } else if (type == BP_TYPE_Q4_1) {
        BY_COLUMNS(nc, Q41)
    } else if (type == BP_TYPE_Q5_1) {
        BY_COLUMNS(nc, Q51)
    } else {
        BY_COLUMNS(nc, Q8)
    }
#else
    (void)type; /* the avx2 variant repacks Q4_0 only (bp_cpu_repack_stores) */
    BY_COLUMNS(nc, Q4)
#endif
#undef Q4
#undef Q8
#undef NL
#undef Q5
#undef Q41
#undef Q51
}
#undef BY_COLUMNS

void bp_cpu_repack_mul_mat(const bp_tensor *a, const struct bp_block_q8_0 *bq,
                           const int32_t *ycorr, const float *yd, float *c, int64_t ldc,
                           int64_t g0, int64_t g1, int64_t N)
{
    const int64_t nblk = a->ne[0] / 32, M = a->ne[1];
    for (int64_t g = g0; g < g1; g++) {
        const char *grp = group_of(a, g);
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
            group(a->type, nc, grp, nblk, y, yc, ydc, out);
            for (int k = 0; k < nc; k++)
                memcpy(c + (n + k) * ldc + g * GROUP, out + 8 * k, (size_t)rows * sizeof(float));
        }
    }
}
#endif /* BP_CPU_REPACK_KERNEL */
