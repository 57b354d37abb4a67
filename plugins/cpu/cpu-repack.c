/* cpu-repack.c - the "CPU_REPACK" buffer type: Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K
 * and IQ4_XS weights stored row-interleaved for the CPU's kernels, converted when they are
 * written and back when they are read.
 *
 * Which tensors: a 2-D (ne[2] = ne[3] = 1), contiguous, non-view tensor of a type this variant
 * repacks (bp_cpu_repack_stores: all nine on avx512, Q4_0 on avx2, none on the baseline) placed in a CPU_REPACK buffer is stored repacked; every other
 * tensor placed there is stored as it is, as in host memory. Applications reach the buffer type
 * through the CPU registry's proc address "bp_cpu_repack_buffer_type" and use it for weights
 * that the CPU multiplies.
 *
 * The layout: rows in groups of eight (the last group padded with zero rows). For the blocks of
 * 32, the same bytes per row and block as the type itself (18 for Q4_0 and IQ4_NL, 20 for Q4_1,
 * 22 for Q5_0, 24 for Q5_1, 34 for Q8_0), so a group is nblk * 8 blocks (nblk = ne[0] / 32
 * blocks per row); the super-block types take a little more (below). A group
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
 *   (Q4_K, Q5_K, IQ4_XS: their sub-blocks of 32 as the blocks kb above, laid out as Q4_1's,
 *   Q5_1's and IQ4_NL's, with the scale and minimum of 6 bits as two bytes per row, row j at
 *   kb * 16 + 2j (IQ4_XS: one byte, at kb * 8 + j), then per super-block i the rows' f16 d and
 *   dmin, row j at i * 32 + 4j (IQ4_XS: d, at i * 16 + 2j).)
 *
 * so a 512-bit load of a run gives every row two 32-bit lanes, and an 8-byte broadcast of the
 * activation's quants matches them without any shuffle: for Q8_0, run u holds values 8u..8u+7;
 * for the 4- and 5-bit types, the low nibbles of run u hold values 8u..8u+7 and the high nibbles
 * 16+8u..23+8u (IQ4_NL's nibbles index its table of 16 values, looked up with a byte shuffle;
 * the fifth bits for the same values are one 64-bit mask, 8 bytes of its fifth bits). One
 * vector of integer dot products then covers eight rows, and the eight scales are one 16-byte
 * load (Q4_1, Q5_1: a 32-byte load, the minimums taking the activations' block sums). The quants keep their values (Q8_0 stays signed), so every byte of a block of 32 stays a byte
 * of the same block: memset and clear mean the same in either layout. (Not so for the
 * super-block types, whose scales are widened: memset converts, and clear refills their blocks.)
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
#define MAX_BLOCK 176     /* bytes of the largest block stored here (Q5_K's) */

/* Identifies our buffer types: their context points here (compared, never read). */
static const char repack_tag;

bool bp_cpu_is_repack_buft(bp_buffer_type *buft)
{
    return buft != NULL && bp_buffer_type_get_context(buft) == &repack_tag;
}

/* The super-block types stored here (Q4_K, Q5_K, IQ4_XS) are laid out as sub-blocks of 32, each
 * like a block of 32 of Q4_1, Q5_1 or IQ4_NL, with their super-block's scales beside. */
static bool superblock(enum bp_type type)
{
    return type == BP_TYPE_Q4_K || type == BP_TYPE_Q5_K || type == BP_TYPE_IQ4_XS;
}

/* Per row and block (sub-block) of 32: quant bytes, bytes of fifth bits (Q5_0's, Q5_1's and
 * Q5_K's), and bytes of scale: f16 d (and m: Q4_1, Q5_1) for the blocks of 32, the 6-bit scale
 * and minimum as two bytes (Q4_K, Q5_K), the 6-bit scale (offset 32) as a byte (IQ4_XS). A
 * zero block is zero bytes in either layout. */
static int64_t qbytes(enum bp_type type)
{
    return type == BP_TYPE_Q8_0 ? 32 : 16;
}

static int64_t hbytes(enum bp_type type)
{
    return type == BP_TYPE_Q5_0 || type == BP_TYPE_Q5_1 || type == BP_TYPE_Q5_K ? 4 : 0;
}

static bool has_min(enum bp_type type)
{
    return type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1 || type == BP_TYPE_Q4_K ||
           type == BP_TYPE_Q5_K;
}

static int64_t sbytes(enum bp_type type)
{
    if (superblock(type))
        return type == BP_TYPE_IQ4_XS ? 1 : 2;
    return has_min(type) ? 4 : 2;
}

/* Per row and super-block of 256: f16 d and dmin (Q4_K, Q5_K), d (IQ4_XS); none for the others. */
static int64_t headbytes(enum bp_type type)
{
    return !superblock(type) ? 0 : type == BP_TYPE_IQ4_XS ? 2 : 4;
}

/* Bytes of one row in the layout: the type's own for the blocks of 32; 4 (Q4_K, Q5_K) or 2
 * (IQ4_XS) more per super-block, its twelve (six) bytes of packed scales being sixteen (eight). */
static int64_t row_bytes(enum bp_type type, int64_t ne0)
{
    return ne0 / 32 * (qbytes(type) + hbytes(type) + sbytes(type)) + ne0 / 256 * headbytes(type);
}

/* The types this variant stores repacked: those it has a kernel for that reads them faster than
 * plain rows. Q4_0 with the AVX512-VNNI or the AVX2 kernel; the others only with AVX512-VNNI
 * (N = 1, M = K = 4096, 2 threads: Q4_1 132 GFLOP/s against 58 for its dot products, Q5_1 96
 * against 35; M = 32000: Q4_K 172 against 99, IQ4_XS 131 against 85, Q5_K 88 against 74): IQ4_NL's values shifted to unsigned bytes (up to 240)
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
           type == BP_TYPE_Q5_0 || type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1 ||
           superblock(type);
#elif defined(BP_CPU_REPACK_KERNEL)
    return type == BP_TYPE_Q4_0;
#else
    (void)type;
    return false;
#endif
}

/* A 2-D tensor, or stacked matrices [K, M, n, 1] (MUL_MAT_ID's experts) whose M is a multiple
 * of the group: their M * n rows are grouped as one matrix's, and no group spans two of them,
 * so matrix e starts e * nb[2] bytes in, as in the plain layout. The super-block types' rows
 * are longer in the layout than in the file, so only their 2-D tensors are stored repacked.
 * Contiguous, whole blocks. */
static bool eligible(const bp_tensor *t)
{
    const size_t bs = bp_type_size(t->type);
    const int64_t qk = bp_type_block_size(t->type);
    return bp_cpu_repack_stores(t->type) && t->view_src == NULL &&
           (t->ne[2] == 1 || (t->ne[1] % GROUP == 0 && !superblock(t->type))) &&
           t->ne[3] == 1 && t->ne[0] % qk == 0 && t->nb[0] == bs &&
           t->nb[1] == (size_t)(t->ne[0] / qk) * bs && t->nb[2] == t->nb[1] * (size_t)t->ne[1];
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
    return (char *)t->data + g * GROUP * row_bytes(t->type, t->ne[0]);
}

/* Where the parts of a group of rows nsub blocks (sub-blocks) of 32 long lie. */
struct parts {
    char *q, *h, *s, *head; /* quants, fifth bits, scales per block of 32, per super-block */
};

static struct parts parts_of(const char *grp, int64_t nsub, enum bp_type type)
{
    struct parts p;
    p.q = (char *)grp;
    p.h = p.q + nsub * GROUP * qbytes(type);
    p.s = p.h + nsub * GROUP * hbytes(type);
    p.head = p.s + nsub * GROUP * sbytes(type);
    return p;
}

/* Row j of a group, block kb (of 32), copied out of (or, with in, into) the layout: the scale
 * (and minimum), the fifth bits (byte t of row j at kb * 32 + 8t + j of the group's fifth bits)
 * and the quants. */
BP_CPU_INLINE void block_out(const struct parts *p, enum bp_type type, int j, int64_t kb,
                             char *out)
{
    const int64_t qb = qbytes(type), hb = hbytes(type), sb = sbytes(type);
    memcpy(out, p->s + kb * GROUP * sb + sb * j, (size_t)sb);
    for (int64_t t = 0; t < hb; t++)
        out[sb + t] = p->h[kb * GROUP * hb + GROUP * t + j];
    for (int64_t u = 0; u < qb / 8; u++)
        memcpy(out + sb + hb + 8 * u, p->q + kb * GROUP * qb + 64 * u + 8 * j, 8);
}

BP_CPU_INLINE void block_in(const struct parts *p, enum bp_type type, int j, int64_t kb,
                            const char *in)
{
    const int64_t qb = qbytes(type), hb = hbytes(type), sb = sbytes(type);
    memcpy(p->s + kb * GROUP * sb + sb * j, in, (size_t)sb);
    for (int64_t t = 0; t < hb; t++)
        p->h[kb * GROUP * hb + GROUP * t + j] = in[sb + t];
    for (int64_t u = 0; u < qb / 8; u++)
        memcpy(p->q + kb * GROUP * qb + 64 * u + 8 * j, in + sb + hb + 8 * u, 8);
}

/* ---- Super-blocks --------------------------------------------------------------------------- */

/* A super-block of Q4_K, Q5_K or IQ4_XS as the layout holds it: values (the fifth bit included),
 * the eight sub-blocks' scales (and minimums), and the super-block's own (f16 bits). */
struct superblock {
    uint8_t v[256], sc[8], mn[8];
    uint16_t d, dmin;
};

/* The twelve bytes of Q4_K's and Q5_K's 6-bit scales and minimums (ggml's packing: the first
 * four of each in the low six bits of bytes 0-3 and 4-7; the last four in the nibbles of bytes
 * 8-11 and the top two bits of bytes 0-7). Every bit is used, so the two are inverses. */
static void k4_decode(const uint8_t q[12], uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 15) | (q[j] >> 6) << 4);
        mn[j + 4] = (uint8_t)((q[j + 8] >> 4) | (q[j + 4] >> 6) << 4);
    }
}

static void k4_encode(const uint8_t sc[8], const uint8_t mn[8], uint8_t q[12])
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
}

/* A block of the type's own layout into values and scales, and back. Q4_K and Q5_K: byte l of
 * the 32 quant bytes of chunk c holds value 64c + l in its low nibble and 64c + 32 + l in its
 * high one, whose fifth bits are bits 2c and 2c + 1 of qh[l]; IQ4_XS: byte k of the 16 of
 * sub-block s holds values 32s + k and 32s + 16 + k, and scale s is 6 bits, offset 32. */
static void super_decode(enum bp_type type, const char *in, struct superblock *sb)
{
    if (type == BP_TYPE_IQ4_XS) {
        struct bp_block_iq4_xs x;
        memcpy(&x, in, sizeof(x));
        sb->d = x.d;
        sb->dmin = 0;
        for (int s = 0; s < 8; s++) {
            const int ls = (x.scales_l[s / 2] >> 4 * (s % 2) & 15) | (x.scales_h >> 2 * s & 3) << 4;
            sb->sc[s] = (uint8_t)ls;
            sb->mn[s] = 0;
            for (int k = 0; k < 16; k++) {
                sb->v[32 * s + k] = x.qs[16 * s + k] & 15;
                sb->v[32 * s + 16 + k] = x.qs[16 * s + k] >> 4;
            }
        }
        return;
    }
    struct bp_block_q5_k x; /* Q4_K: the same without qh */
    const bool q5 = type == BP_TYPE_Q5_K;
    memcpy(&x, in, 16);
    memset(x.qh, 0, sizeof(x.qh));
    if (q5)
        memcpy(x.qh, in + 16, sizeof(x.qh));
    memcpy(x.qs, in + 16 + (q5 ? sizeof(x.qh) : 0), sizeof(x.qs));
    sb->d = x.d;
    sb->dmin = x.dmin;
    k4_decode(x.scales, sb->sc, sb->mn);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            sb->v[64 * c + l] = (uint8_t)((x.qs[32 * c + l] & 15) | (x.qh[l] >> 2 * c & 1) << 4);
            sb->v[64 * c + 32 + l] =
                (uint8_t)((x.qs[32 * c + l] >> 4) | (x.qh[l] >> (2 * c + 1) & 1) << 4);
        }
}

static void super_encode(enum bp_type type, const struct superblock *sb, char *out)
{
    if (type == BP_TYPE_IQ4_XS) {
        struct bp_block_iq4_xs x;
        memset(&x, 0, sizeof(x));
        x.d = sb->d;
        for (int s = 0; s < 8; s++) {
            const int ls = sb->sc[s];
            x.scales_l[s / 2] |= (uint8_t)((ls & 15) << 4 * (s % 2));
            x.scales_h |= (uint16_t)((ls >> 4 & 3) << 2 * s);
            for (int k = 0; k < 16; k++)
                x.qs[16 * s + k] =
                    (uint8_t)((sb->v[32 * s + k] & 15) | (sb->v[32 * s + 16 + k] & 15) << 4);
        }
        memcpy(out, &x, sizeof(x));
        return;
    }
    struct bp_block_q5_k x;
    const bool q5 = type == BP_TYPE_Q5_K;
    memset(&x, 0, sizeof(x));
    x.d = sb->d;
    x.dmin = sb->dmin;
    k4_encode(sb->sc, sb->mn, x.scales);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t lo = sb->v[64 * c + l], hi = sb->v[64 * c + 32 + l];
            x.qs[32 * c + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            x.qh[l] |= (uint8_t)((lo >> 4 & 1) << 2 * c | (hi >> 4 & 1) << (2 * c + 1));
        }
    memcpy(out, &x, 16);
    if (q5)
        memcpy(out + 16, x.qh, sizeof(x.qh));
    memcpy(out + 16 + (q5 ? sizeof(x.qh) : 0), x.qs, sizeof(x.qs));
}

/* Row j's super-block i out of the layout, or into it: sub-block kb = 8i + s as a block of 32
 * of the repacked layout (16 quant bytes: value k in the low nibble of byte k, 16 + k in the
 * high; Q5_K's fifth bits, byte t for values 8t..8t+7), then the super-block's scales. */
static void super_out(const struct parts *p, enum bp_type type, int j, int64_t i,
                      struct superblock *sb)
{
    const int64_t sbb = sbytes(type), hb = hbytes(type), headb = headbytes(type);
    for (int s = 0; s < 8; s++) {
        const int64_t kb = 8 * i + s;
        uint8_t *v = sb->v + 32 * s, b[16];
        for (int u = 0; u < 2; u++)
            memcpy(b + 8 * u, p->q + kb * GROUP * 16 + 64 * u + 8 * j, 8);
        for (int k = 0; k < 16; k++) {
            v[k] = b[k] & 15;
            v[16 + k] = b[k] >> 4;
        }
        for (int64_t t = 0; t < hb; t++) {
            const uint8_t bits = (uint8_t)p->h[kb * GROUP * hb + GROUP * t + j];
            for (int x = 0; x < 8; x++)
                v[8 * t + x] |= (uint8_t)((bits >> x & 1) << 4);
        }
        const uint8_t *sc = (const uint8_t *)p->s + kb * GROUP * sbb + sbb * j;
        sb->sc[s] = sc[0];
        sb->mn[s] = sbb > 1 ? sc[1] : 0;
    }
    const uint16_t *head = (const uint16_t *)(p->head + i * GROUP * headb + headb * j);
    sb->d = head[0];
    sb->dmin = headb > 2 ? head[1] : 0;
}

static void super_in(const struct parts *p, enum bp_type type, int j, int64_t i,
                     const struct superblock *sb)
{
    const int64_t sbb = sbytes(type), hb = hbytes(type), headb = headbytes(type);
    for (int s = 0; s < 8; s++) {
        const int64_t kb = 8 * i + s;
        const uint8_t *v = sb->v + 32 * s;
        uint8_t b[16];
        for (int k = 0; k < 16; k++)
            b[k] = (uint8_t)((v[k] & 15) | (v[16 + k] & 15) << 4);
        for (int u = 0; u < 2; u++)
            memcpy(p->q + kb * GROUP * 16 + 64 * u + 8 * j, b + 8 * u, 8);
        for (int64_t t = 0; t < hb; t++) {
            uint8_t bits = 0;
            for (int x = 0; x < 8; x++)
                bits |= (uint8_t)((v[8 * t + x] >> 4 & 1) << x);
            p->h[kb * GROUP * hb + GROUP * t + j] = (char)bits;
        }
        uint8_t *sc = (uint8_t *)p->s + kb * GROUP * sbb + sbb * j;
        sc[0] = sb->sc[s];
        if (sbb > 1)
            sc[1] = sb->mn[s];
    }
    uint16_t *head = (uint16_t *)(p->head + i * GROUP * headb + headb * j);
    head[0] = sb->d;
    if (headb > 2)
        head[1] = sb->dmin;
}

/* Block kb of row r (of the type's own size: 32 values, or 256 for the super-block types). */
void bp_cpu_repack_get_block(const bp_tensor *t, int64_t r, int64_t kb, void *out)
{
    const struct parts p = parts_of(group_of(t, r / GROUP), t->ne[0] / 32, t->type);
    if (superblock(t->type)) {
        struct superblock sb;
        super_out(&p, t->type, (int)(r % GROUP), kb, &sb);
        super_encode(t->type, &sb, out);
    } else
        block_out(&p, t->type, (int)(r % GROUP), kb, out);
}

/* Block kb of row r of a repacked tensor of type and row length ne0 whose data is at data. */
static void put_block_at(char *data, enum bp_type type, int64_t ne0, int64_t r, int64_t kb,
                         const void *in)
{
    const struct parts p = parts_of(data + r / GROUP * GROUP * row_bytes(type, ne0), ne0 / 32, type);
    if (superblock(type)) {
        struct superblock sb;
        super_decode(type, in, &sb);
        super_in(&p, type, (int)(r % GROUP), kb, &sb);
    } else
        block_in(&p, type, (int)(r % GROUP), kb, in);
}

static void put_block(const bp_tensor *t, int64_t r, int64_t kb, const void *in)
{
    put_block_at(t->data, t->type, t->ne[0], r, kb, in);
}

static size_t repacked_size(const bp_tensor *t)
{
    const int64_t rows = (n_rows(t) + GROUP - 1) / GROUP * GROUP;
    return (size_t)rows * (size_t)row_bytes(t->type, t->ne[0]);
}

/* ---- Buffers ------------------------------------------------------------------------------ */

/* A tensor of a super-block type stored in a buffer: clear fills its blocks, whose bytes in the
 * layout are not the block's own. */
struct super_tensor {
    size_t offset, bytes; /* from the buffer's base; its size in the layout */
    enum bp_type type;
    int64_t ne0, rows;
};

struct repack_buffer {
    void *mem;
    struct super_tensor *supers;
    size_t n_supers, cap_supers;
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
    free(rb->supers);
    free(rb);
}

/* The padding rows of the last group are zero (scale 0), so the kernels may read them. */
static enum bp_status rb_init_tensor(bp_buffer *buf, bp_tensor *t)
{
    struct repack_buffer *rb = bp_buffer_get_context(buf);
    if (eligible(t)) {
        const int64_t nblk = t->ne[0] / bp_type_block_size(t->type);
        const char zero[MAX_BLOCK] = {0};
        for (int64_t r = n_rows(t); r % GROUP != 0; r++)
            for (int64_t kb = 0; kb < nblk; kb++)
                put_block(t, r, kb, zero);
    }
    if (t->view_src != NULL)
        return BP_OK;
    /* t's bytes are its own now: records of tensors placed there before go. */
    const size_t off = (size_t)((char *)t->data - (char *)rb->mem);
    const size_t end = off + (eligible(t) ? repacked_size(t) : bp_nbytes(t));
    size_t kept = 0;
    for (size_t i = 0; i < rb->n_supers; i++) {
        const struct super_tensor *st = &rb->supers[i];
        if (st->offset >= end || st->offset + st->bytes <= off)
            rb->supers[kept++] = *st;
    }
    rb->n_supers = kept;
    if (!eligible(t) || !superblock(t->type))
        return BP_OK;
    if (rb->n_supers == rb->cap_supers) {
        const size_t cap = rb->cap_supers ? 2 * rb->cap_supers : 16;
        struct super_tensor *n = realloc(rb->supers, cap * sizeof(*n));
        if (n == NULL)
            return bp_set_error(BP_ERR_OUT_OF_MEMORY,
                                "CPU_REPACK: out of memory initialising tensor %s", t->name);
        rb->supers = n;
        rb->cap_supers = cap;
    }
    rb->supers[rb->n_supers++] =
        (struct super_tensor){off, repacked_size(t), t->type, t->ne[0], n_rows(t)};
    return BP_OK;
}

/* Whether [offset, offset + size) of repacked-layout tensor t can be read or written: t itself
 * (not a view of it), whole blocks. */
static enum bp_status check_range(const char *fn, const bp_tensor *t, size_t offset, size_t size)
{
    const size_t bs = bp_type_size(t->type);
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
    const int64_t nblk = t->ne[0] / bp_type_block_size(t->type);
    const int64_t bs = (int64_t)bp_type_size(t->type), b0 = (int64_t)offset / bs;
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
    const int64_t nblk = t->ne[0] / bp_type_block_size(t->type);
    const int64_t bs = (int64_t)bp_type_size(t->type), b0 = (int64_t)offset / bs;
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
    char blk[MAX_BLOCK];
    memset(blk, value, sizeof(blk));
    const int64_t nblk = t->ne[0] / bp_type_block_size(t->type);
    const int64_t bs = (int64_t)bp_type_size(t->type), b0 = (int64_t)offset / bs;
    for (int64_t i = 0; st == BP_OK && i < (int64_t)size / bs; i++)
        put_block(t, (b0 + i) / nblk, (b0 + i) % nblk, blk);
    return st;
}

/* Every byte of the buffer, and so of every block of the tensors of 32 values; the super-block
 * types' blocks are filled as memset fills them, so that they read back as value too. */
static enum bp_status rb_clear(bp_buffer *buf, uint8_t value)
{
    const struct repack_buffer *rb = bp_buffer_get_context(buf);
    memset(rb->mem, value, bp_buffer_get_size(buf));
    char blk[MAX_BLOCK];
    memset(blk, value, sizeof(blk));
    for (size_t i = 0; value != 0 && i < rb->n_supers; i++) {
        const struct super_tensor *st = &rb->supers[i];
        for (int64_t r = 0; r < st->rows; r++)
            for (int64_t kb = 0; kb < st->ne0 / 256; kb++)
                put_block_at((char *)rb->mem + st->offset, st->type, st->ne0, r, kb, blk);
    }
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
    if (has_min(type)) /* Q4_1, Q5_1, Q4_K, Q5_K: no offset; the raw sums, for the minimums */
        return 1;
    return type == BP_TYPE_Q4_0 ? -4 : type == BP_TYPE_Q5_0 ? -8 : -64; /* -64: IQ4_XS too */
}

#ifdef BP_CPU_REPACK_KERNEL

#if defined(BP_CPU_HAVE_AVX512)
#include "cpu-unpack32.h" /* iq4nl_values */

void bp_cpu_repack_unpack_group(const bp_tensor *t, int64_t g, int64_t kb, int8_t *q, float *d,
                                float *m)
{
    const enum bp_type type = t->type;
    if (g * GROUP >= n_rows(t)) { /* past the last group */
        memset(q, 0, GROUP * 32);
        memset(d, 0, GROUP * sizeof(float));
        memset(m, 0, GROUP * sizeof(float));
        return;
    }
    const struct parts p = parts_of(group_of(t, g), t->ne[0] / 32, type);
    /* Lane l (128 bits) of each run holds rows 2l and 2l + 1, 8 bytes each: unpacking 64-bit
     * halves gives each row its 16 bytes, whose low nibbles are values 0-15, high ones 16-31. */
    const char *qp = p.q + kb * GROUP * 16;
    const __m512i r0 = _mm512_loadu_si512(qp), r1 = _mm512_loadu_si512(qp + 64);
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i ev = _mm512_unpacklo_epi64(r0, r1), od = _mm512_unpackhi_epi64(r0, r1);
    uint8_t nib[4][64]; /* low and high nibbles of the even rows, then of the odd ones */
    _mm512_storeu_si512(nib[0], _mm512_and_si512(ev, m15));
    _mm512_storeu_si512(nib[1], _mm512_and_si512(_mm512_srli_epi16(ev, 4), m15));
    _mm512_storeu_si512(nib[2], _mm512_and_si512(od, m15));
    _mm512_storeu_si512(nib[3], _mm512_and_si512(_mm512_srli_epi16(od, 4), m15));
    const int64_t hb = hbytes(type), sbb = sbytes(type), headb = headbytes(type);
    const uint8_t *h = (const uint8_t *)p.h + kb * GROUP * hb;
    const uint8_t *sc = (const uint8_t *)p.s + kb * GROUP * sbb;
    const char *head = p.head + kb / 8 * GROUP * headb;
    /* The eight rows' scales (and minimums) at once: pairs (d, m) come interleaved. */
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 dm = _mm512_setzero_ps(); /* d0 m0 d1 m1 ... */
    switch (type) {
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K: /* d s and -dmin m */
        dm = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head)),
                           _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                               _mm_loadu_si128((const __m128i *)sc))));
        dm = _mm512_mask_sub_ps(dm, 0xaaaa, _mm512_setzero_ps(), dm);
        break;
    case BP_TYPE_Q4_1:
    case BP_TYPE_Q5_1:
        dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        break;
    case BP_TYPE_IQ4_XS: { /* d (s - 32) */
        const __m256 s8 = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc)));
        const __m256 d8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)head)),
                                        _mm256_sub_ps(s8, _mm256_set1_ps(32.0f)));
        dm = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 8, 2, 8, 3, 8, 4, 8, 5, 8, 6, 8, 7, 8),
                                   _mm512_castps256_ps512(d8));
        dm = _mm512_maskz_mov_ps(0x5555, dm);
        break;
    }
    default: /* Q5_0, IQ4_NL: d */
        dm = _mm512_maskz_permutexvar_ps(
            0x5555, _mm512_setr_epi32(0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0),
            _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc))));
    }
    _mm256_storeu_ps(d, _mm512_castps512_ps256(_mm512_permutexvar_ps(even, dm)));
    _mm256_storeu_ps(m, _mm512_castps512_ps256(_mm512_permutexvar_ps(odd, dm)));
    /* The fifth bits: byte u of row j (values 8u..8u+7) is byte 8u + j; each row's four
     * gathered into one 32-bit mask, bit k for value k. */
    uint32_t bits[GROUP];
    if (hb != 0) {
        const __m256i pairs = _mm256_shuffle_epi8(
            _mm256_loadu_si256((const __m256i *)h),
            _mm256_broadcastsi128_si256(
                _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15)));
        const __m128i b01 = _mm256_castsi256_si128(pairs), b23 = _mm256_extracti128_si256(pairs, 1);
        _mm_storeu_si128((__m128i *)bits, _mm_unpacklo_epi16(b01, b23));
        _mm_storeu_si128((__m128i *)(bits + 4), _mm_unpackhi_epi16(b01, b23));
    }
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
    for (int j = 0; j < GROUP; j++) {
        const uint8_t *lo = nib[2 * (j % 2)] + 16 * (j / 2);
        const uint8_t *hi = nib[2 * (j % 2) + 1] + 16 * (j / 2);
        __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)hi),
                                     _mm_loadu_si128((const __m128i *)lo));
        if (hb != 0)
            v = _mm256_mask_mov_epi8(v, bits[j], _mm256_or_si256(v, _mm256_set1_epi8(16)));
        if (type == BP_TYPE_IQ4_XS || type == BP_TYPE_IQ4_NL)
            v = _mm256_shuffle_epi8(tbl, v);
        else if (type == BP_TYPE_Q5_0)
            v = _mm256_sub_epi8(v, _mm256_set1_epi8(16));
        _mm256_storeu_si256((__m256i *)(q + 32 * j), v);
    }
}

#define NC_MAX 4 /* columns per pass */
#define BY_COLUMNS(nc, CALL) BP_CPU_BY_COLUMNS(nc, CALL)

BP_CPU_INLINE __m512i bcast8(const int8_t *p)
{
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi64(v);
}

/* The scales of block kb of a group's eight rows for the kernel below, each row's in both its
 * lanes (sw), and its minimum in the first (mw; zero for the types without one): sc points at
 * the block's scales, head at its super-block's (Q4_K, Q5_K, IQ4_XS). */
BP_CPU_INLINE void block_scales(const enum bp_type type, const char *sc, const char *head,
                                __m512 *sw_out, __m512 *mw_out)
{
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    /* Scales and minimums interleaved (Q4_1, Q5_1: d0 m0 d1 m1 ...): each row's d in both its
     * lanes, its m in the first only (the two lanes are added at the end). */
    const __m512i dup_d = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
    const __m512i at_m = _mm512_setr_epi32(1, 0, 3, 0, 5, 0, 7, 0, 9, 0, 11, 0, 13, 0, 15, 0);
    __m512 sw, mw = _mm512_setzero_ps();
    if (type == BP_TYPE_Q4_K || type == BP_TYPE_Q5_K) {
        /* The super-block's d and dmin times the sub-block's scale and minimum, interleaved
         * as Q4_1's d and m; the minimum subtracts. */
        const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
        __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc)));
        s = _mm512_mask_sub_ps(s, 0xaaaa, _mm512_setzero_ps(), s);
        const __m512 dm = _mm512_mul_ps(dd, s);
        sw = _mm512_permutexvar_ps(dup_d, dm);
        mw = _mm512_maskz_permutexvar_ps(0x5555, at_m, dm);
    } else if (type == BP_TYPE_IQ4_XS) {
        /* d times the 6-bit scale less 32 */
        const __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)head));
        const __m256 s = _mm256_sub_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc))),
            _mm256_set1_ps(32.0f));
        sw = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_mul_ps(dd, s)));
    } else if (has_min(type)) {
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        sw = _mm512_permutexvar_ps(dup_d, dm);
        mw = _mm512_maskz_permutexvar_ps(0x5555, at_m, dm);
    } else {
        sw = _mm512_permutexvar_ps(
            dup, _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc))));
    }
    *sw_out = sw;
    *mw_out = mw;
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
    const char *head = sc + nblk * sc_bytes; /* the super-blocks' scales */
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
            /* (unrolled, or v[] goes through the stack) */
            if (type == BP_TYPE_IQ4_NL || type == BP_TYPE_IQ4_XS)
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    v[u] = _mm512_shuffle_epi8(iq4nl_u8, v[u]);
            /* Q5_0: the 8 bytes at 8u of the block's fifth bits are the eight rows' bits for
             * values 8u..8u+7, byte j row j's: a mask lined up with v[u]. */
            if (hs_bytes != 0)
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) {
                    uint64_t bits;
                    memcpy(&bits, hbits + kb * hs_bytes + 8 * u, sizeof(bits));
                    v[u] = _mm512_or_si512(v[u], _mm512_maskz_mov_epi8(bits, sixteen));
                }
        } else {
            const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                v[u] = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * u), flip);
        }
        __m512 sw, mw;
        block_scales(type, sc + kb * sc_bytes, head + kb / 8 * GROUP * headbytes(type), &sw, &mw);
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
#define Q4K(c) group_t(BP_TYPE_Q4_K, c, grp, nblk, y, ycorr, yd, out)
#define Q5K(c) group_t(BP_TYPE_Q5_K, c, grp, nblk, y, ycorr, yd, out)
#define XS(c) group_t(BP_TYPE_IQ4_XS, c, grp, nblk, y, ycorr, yd, out)
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
    } else if (type == BP_TYPE_Q4_K) {
        BY_COLUMNS(nc, Q4K)
    } else if (type == BP_TYPE_Q5_K) {
        BY_COLUMNS(nc, Q5K)
    } else if (type == BP_TYPE_IQ4_XS) {
        BY_COLUMNS(nc, XS)
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
#undef Q4K
#undef Q5K
#undef XS
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
