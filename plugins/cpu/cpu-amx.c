/* cpu-amx.c - MUL_MAT with Intel AMX tiles (built into the avx512 variant only; used when the
 * CPU has AMX-TILE, AMX-BF16 and AMX-INT8 and the kernel lets this process use tile data).
 *
 * Orientation: the tile "A" operand is the weights (16 rows of A x 32 K values, copied or
 * converted into 1 KiB tiles per K block), the tile "B" operand is
 * the activations, packed by all threads NB columns at a time into the VNNI layout AMX wants (for
 * each pair of K values, 16 columns of two bf16 each), and the 16 x 16 tile of C holds dst rows m
 * by columns n, so it is transposed on the way out. Four C tiles (32 rows x 32 columns) stay in
 * tile registers over a K block of KC; between K blocks they go to a per-thread buffer that
 * covers MB rows x NB columns, so the weights are read once per NB columns and the packed
 * activations once per MB rows.
 *
 * Precision: AMX multiplies bf16 (8 significant bits). To keep F16/BF16 products at the single
 * precision the conformance thresholds ask for (NMSE 1e-9), each activation is split into two
 * bf16 values, hi = x rounded to bf16 and lo = x - hi rounded to bf16 (together 16 bits, error
 * at most 2^-17 |x|), and F16 weights likewise (exactly: an f16 value has 11 bits). Products of
 * bf16 values are exact in the f32 accumulators. BF16 weights: w*hi + w*lo (two passes). F16
 * weights: whi*hi + whi*lo + wlo*hi (three passes; the dropped wlo*lo is below 2^-17 |w x|).
 *
 * Q8_0/Q4_0 weights use 8-bit tiles (TDPBSSD) against activations quantised to Q8_0, as the
 * dot-product path does: each 32-value block's 16 x 16 integer tile is scaled by the weight
 * row's and the activation column's block scales into f32 accumulators in L1 (the scales differ
 * per block, so the integer sums cannot run longer). Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K and
 * IQ4_XS take the same tiles, their blocks (or sub-blocks) of 32 unpacked to bytes; the types
 * with a minimum add, per block, the row's minimum times the column's scaled quant sum. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu-impl.h"

#if defined(BP_CPU_HAVE_AMX)

#include "cpu-unpack32.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define MB 256  /* rows of C per thread block (the buffer of C: MB x NB floats) */
#define NB 512  /* columns of C per block */
#define KC 512  /* K per block: the C tiles stay in registers this long */
/* Fewest columns worth the AMX kernel (bench-matmul both ways, 2 threads): BF16 from 4 (N = 4:
 * 105 against 56 GFLOP/s; one column stays on the memory-bound dot products). F16 weights are
 * split into two bf16 panels first, which costs about as much as the products below 64.
 * Q8_0/Q4_0 from 16: each block's integer tile is scaled whatever N is, and at N = 8 the
 * eight-row VNNI dot products are as fast (80-160 against 78-135 GFLOP/s over four runs). */
#define AMX_MIN_N_BF16 4
#define AMX_MIN_N_F16 64
#define AMX_MIN_N_QUANT 16
#define AMX_MIN_N_REPACKED 32 /* CPU_REPACK's types other than Q4_0 and Q8_0 */

/* ---- Availability ------------------------------------------------------------------------ */

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    const char *env = getenv("BP_CPU_AMX");
    if (env && strcmp(env, "0") == 0)
        return;
    /* The runtime's CPUID/XCR0 check (which also honours BP_CPU_DISABLE=amx_tile). */
    const uint64_t need = BP_CPU_AMX_TILE | BP_CPU_AMX_BF16 | BP_CPU_AMX_INT8;
    if ((bp_cpu_features() & need) != need)
        return;
    /* Linux hands out tile state per process on request (5.16 and later). */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return;
    amx_ok = true;
}

bool bp_cpu_amx_available(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

/* The weight types that go through 8-bit tiles: each block of 32 values is 32 small integers q
 * (int8), a scale d and for some a minimum m, value = d q + m (Q4_K: d = d s, m = -dmin m of
 * its sub-block of 32; IQ4_NL/IQ4_XS: q is the table's value). Repacked weights: Q8_0 and Q4_0
 * from their layout directly, the other repacked types (Q5_0, IQ4_NL, Q4_1, Q5_1, Q4_K, Q5_K,
 * IQ4_XS) eight rows at a time through bp_cpu_repack_unpack_group and from AMX_MIN_N_REPACKED
 * columns only (N = 32, 2 threads, M = K = 4096: Q4_K 400-409, Q5_K 348-374, IQ4_XS 448, IQ4_NL
 * 454 GFLOP/s here against 359, 246, 320 and 351 in the layout's kernel; Q4_1 384 against 388). */
static bool quant(enum bp_type t)
{
    switch (t) {
    case BP_TYPE_Q8_0:
    case BP_TYPE_Q4_0:
    case BP_TYPE_Q4_1:
    case BP_TYPE_Q5_0:
    case BP_TYPE_Q5_1:
    case BP_TYPE_IQ4_NL:
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K:
    case BP_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

/* Whether the blocks of type t have a minimum (the products then need each activation block's
 * sum). */
static bool has_min(enum bp_type t)
{
    return t == BP_TYPE_Q4_1 || t == BP_TYPE_Q5_1 || t == BP_TYPE_Q4_K || t == BP_TYPE_Q5_K;
}

bool bp_cpu_amx_use(const bp_tensor *dst)
{
    const bp_tensor *a = dst->src[0];
    const int64_t min_n = a->type == BP_TYPE_BF16  ? AMX_MIN_N_BF16
                          : a->type == BP_TYPE_F16 ? AMX_MIN_N_F16
                          : quant(a->type)         ? AMX_MIN_N_QUANT
                                                   : INT64_MAX;
    /* The other repacked types are unpacked eight rows at a time (bp_cpu_repack_unpack_group),
     * which pays from as many columns as in cpu-gemm-int8.c; below, the layout's own kernel. */
    const bool other_repacked = bp_cpu_repacked_base(a) != NULL && a->type != BP_TYPE_Q8_0 &&
                                a->type != BP_TYPE_Q4_0;
    return dst->ne[1] >= (other_repacked ? AMX_MIN_N_REPACKED : min_n) && a->ne[0] % 32 == 0 &&
           bp_cpu_amx_available();
}


static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* Bytes of the per-thread A panels for one MB x KC block (both kinds fit). */
#define A_PANEL_BYTES ((size_t)MB * KC * 2 * sizeof(uint16_t))

void bp_cpu_amx_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared)
{
    const int64_t K = dst->src[0]->ne[0], N = dst->ne[1];
    const int64_t Np = round_up(N < NB ? N : NB, 32); /* activations are packed NB at a time */
    /* C buffer, then A panels (bf16 hi and lo, or quants and scales). */
    *per_thread = (size_t)MB * NB * sizeof(float) + A_PANEL_BYTES + 64;
    if (quant(dst->src[0]->type)) {
        /* Plus 16 columns quantised to Q8_0 and their block sums, for packing. */
        const int64_t nb = K / 32;
        *per_thread += (size_t)(16 * nb) * sizeof(struct bp_block_q8_0) +
                       (size_t)nb * sizeof(int32_t) + 64;
        /* Quants of the activations, then their scales and (for weights with a minimum)
         * their scaled block sums. */
        *shared = (size_t)(Np * K) + 2 * (size_t)(Np * nb) * sizeof(float);
    } else {
        /* Activations, hi and lo, in groups of 16 columns. */
        *shared = 2 * (size_t)(Np * K) * sizeof(uint16_t);
    }
}

/* ---- bf16 splitting ----------------------------------------------------------------------- */

/* x rounded to bf16 (nearest, ties to even), as f32 bits with the low half zero. NaN stays a
 * quiet NaN (rounding could carry a NaN with only low mantissa bits into an infinity). */
BP_CPU_INLINE __m512i round_bf16(__m512 x)
{
    const __m512i b = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x00400000));
    return _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
}

/* x = hi + lo (as bf16 bit patterns in the high halves of the 32-bit lanes). lo is zero where
 * hi is infinite, so that an infinite x stays infinite. */
BP_CPU_INLINE void split_bf16(__m512 x, __m512i *hi, __m512i *lo)
{
    const __m512i h = round_bf16(x);
    const __mmask16 inf = _mm512_cmpeq_epi32_mask(
        _mm512_and_si512(h, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512 l = _mm512_maskz_sub_ps((__mmask16)~inf, x, _mm512_castsi512_ps(h));
    *hi = h;
    *lo = round_bf16(l);
}

/* The high halves of a (values 0..15) and b (16..31) as 32 consecutive bf16. */
BP_CPU_INLINE __m512i pack_bf16(__m512i a, __m512i b)
{
    const __m512i idx = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35,
                                         33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3,
                                         1);
    return _mm512_permutex2var_epi16(a, idx, b);
}

/* 32 values of a row (f32 or f16) as bf16 hi and lo. */
BP_CPU_INLINE void split32(__m512 x0, __m512 x1, __m512i *hi, __m512i *lo)
{
    __m512i h0, l0, h1, l1;
    split_bf16(x0, &h0, &l0);
    split_bf16(x1, &h1, &l1);
    *hi = pack_bf16(h0, h1);
    *lo = pack_bf16(l0, l1);
}

/* ---- Packing ------------------------------------------------------------------------------ */

/* Columns [n0, n0 + 16) of b (zero past N), all of K, into the VNNI layout: for each pair of K
 * values p, 16 dwords (one per column) of two bf16. out + k * 16 is the tile for K values
 * [k, k + 32), rows of 64 bytes. */
static void pack_b_group(const bp_tensor *b, const char *bbase, int64_t n0, int64_t N, int64_t K,
                         uint16_t *hi, uint16_t *lo)
{
    static const float zeros[32];
    const float *rows[16];
    for (int j = 0; j < 16; j++)
        rows[j] = n0 + j < N ? (const float *)(bbase + (n0 + j) * (int64_t)b->nb[1]) : zeros;
    for (int64_t k = 0; k < K; k += 32) {
        __m512i vh[16], vl[16];
        for (int j = 0; j < 16; j++) {
            const int64_t kk = rows[j] == zeros ? 0 : k;
            split32(_mm512_loadu_ps(rows[j] + kk), _mm512_loadu_ps(rows[j] + kk + 16), &vh[j],
                    &vl[j]);
        }
        /* Row j holds pairs p = 0..15 of column j; the tile wants row p = pairs of columns. */
        bp_cpu_transpose16((__m512 *)vh);
        bp_cpu_transpose16((__m512 *)vl);
        for (int p = 0; p < 16; p++) {
            _mm512_storeu_si512(hi + k * 16 + p * 32, vh[p]);
            _mm512_storeu_si512(lo + k * 16 + p * 32, vl[p]);
        }
    }
}

/* Rows [m0, m0 + rows) of a (zero up to 16 rows), K values [k0, k0 + kc), into tiles of 16 rows
 * x 32 values (1 KiB each, kc / 32 of them): bf16 copied (hi only), f16 split into hi and lo. */
static void pack_a_half(const bp_tensor *a, const char *abase, int64_t m0, int rows, int64_t k0,
                        int64_t kc, uint16_t *hi, uint16_t *lo)
{
    for (int r = 0; r < 16; r++) {
        const uint16_t *row =
            r < rows ? (const uint16_t *)(abase + (m0 + r) * (int64_t)a->nb[1]) + k0 : NULL;
        for (int64_t t = 0; t < kc / 32; t++) {
            uint16_t *h = hi + t * 512 + r * 32, *l = lo + t * 512 + r * 32;
            if (!row) {
                _mm512_storeu_si512(h, _mm512_setzero_si512());
                _mm512_storeu_si512(l, _mm512_setzero_si512());
            } else if (a->type == BP_TYPE_BF16) {
                _mm512_storeu_si512(h, _mm512_loadu_si512(row + t * 32));
            } else {
                __m512i vh, vl;
                const __m512 x0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + t * 32)));
                const __m512 x1 =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + t * 32 + 16)));
                split32(x0, x1, &vh, &vl);
                _mm512_storeu_si512(h, vh);
                _mm512_storeu_si512(l, vl);
            }
        }
    }
}

/* Columns [n0, n0 + 16) of b (zero past N) quantised to Q8_0 and packed for 8-bit tiles: for
 * block t, 8 rows of 64 bytes at q + t * 512 (row r: quants 4r..4r+3 of each column) and the
 * 16 scales at d + t * 16; s (unless NULL) likewise gets each block's scale times the sum of its
 * quants. tmp holds the 16 columns' blocks and one column's block sums. */
static void pack_b_group_q(const bp_tensor *b, const char *bbase, int64_t n0, int64_t N,
                           int64_t nb, int8_t *q, float *d, float *s, struct bp_block_q8_0 *tmp,
                           int32_t *sums)
{
    for (int j = 0; j < 16; j++) {
        if (n0 + j < N) {
            bp_cpu_quantize_q8_0((const float *)(bbase + (n0 + j) * (int64_t)b->nb[1]),
                                 tmp + j * nb, sums, nb);
            for (int64_t t = 0; s && t < nb; t++)
                s[t * 16 + j] = bp_cpu_half_to_float(tmp[j * nb + t].d) * (float)sums[t];
        } else {
            memset(tmp + j * nb, 0, (size_t)nb * sizeof(*tmp));
            for (int64_t t = 0; s && t < nb; t++)
                s[t * 16 + j] = 0.0f;
        }
    }
    for (int64_t t = 0; t < nb; t += 2) {
        /* Two blocks of each column (16 dwords) at once: after the transpose, rows 0-7 are
         * block t's tile and rows 8-15 block t + 1's. */
        __m512i v[16];
        for (int j = 0; j < 16; j++) {
            const struct bp_block_q8_0 *x = tmp + j * nb + t;
            const __m256i lo = _mm256_loadu_si256((const __m256i *)x[0].qs);
            const __m256i hi =
                t + 1 < nb ? _mm256_loadu_si256((const __m256i *)x[1].qs) : _mm256_setzero_si256();
            v[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            d[t * 16 + j] = bp_cpu_half_to_float(x[0].d);
            if (t + 1 < nb)
                d[(t + 1) * 16 + j] = bp_cpu_half_to_float(x[1].d);
        }
        bp_cpu_transpose16((__m512 *)v);
        for (int r = 0; r < 8; r++)
            _mm512_storeu_si512(q + t * 512 + r * 64, v[r]);
        if (t + 1 < nb)
            for (int r = 0; r < 8; r++)
                _mm512_storeu_si512(q + (t + 1) * 512 + r * 64, v[8 + r]);
    }
}

/* pack_a_half_q for Q4_0 or Q8_0 in the CPU_REPACK layout (cpu-repack.c; m0 is a multiple of
 * 16, so the 16 rows are two whole groups of eight): per group and block, four 64-byte vectors
 * hold values 0-7, 8-15, 16-23 and 24-31 of each row (Q4_0: unpacked from two runs of nibbles;
 * Q8_0: the four runs as they are), and each row takes 8 bytes from each, by 64-bit lane
 * permutes. */
static void pack_a_half_repacked(const bp_tensor *a, int64_t m0, int rows, int64_t b0,
                                 int64_t nbk, int8_t *q, float *d)
{
    const bool q4 = a->type == BP_TYPE_Q4_0;
    const int64_t nblk = a->ne[0] / 32, qs_bytes = q4 ? 128 : 256; /* of a block of the group */
    const __m512i m = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    for (int h = 0; h < 2; h++) {
        const int live = rows - 8 * h; /* rows of this group that exist */
        const char *grp = (const char *)a->data + (m0 / 8 + h) * nblk * (qs_bytes + 16);
        for (int64_t t = 0; t < nbk; t++) {
            int8_t *out = q + t * 512 + h * 8 * 32;
            float *dd = d + t * 16 + h * 8;
            if (live <= 0) {
                memset(out, 0, 8 * 32);
                memset(dd, 0, 8 * sizeof(float));
                continue;
            }
            const char *qs = grp + (b0 + t) * qs_bytes;
            /* v0..v3: values 0-7, 8-15, 16-23, 24-31, one 64-bit lane per row. */
            __m512i v0, v1, v2, v3;
            if (q4) {
                const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
                v0 = _mm512_sub_epi8(_mm512_and_si512(q0, m), eight);
                v1 = _mm512_sub_epi8(_mm512_and_si512(q1, m), eight);
                v2 = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(q0, 4), m), eight);
                v3 = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(q1, 4), m), eight);
            } else {
                v0 = _mm512_loadu_si512(qs);
                v1 = _mm512_loadu_si512(qs + 64);
                v2 = _mm512_loadu_si512(qs + 128);
                v3 = _mm512_loadu_si512(qs + 192);
            }
            /* Row j is lanes j of v0, v1, v2, v3: interleave v0/v1 and v2/v3, then take
             * pairs from each for two rows per register. */
            for (int half = 0; half < 2; half++) { /* rows 0-3, rows 4-7 */
                const __m512i ilv = half ? _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15)
                                         : _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
                const __m512i p01 = _mm512_permutex2var_epi64(v0, ilv, v1);
                const __m512i p23 = _mm512_permutex2var_epi64(v2, ilv, v3);
                _mm512_storeu_si512(out + half * 128,
                                    _mm512_permutex2var_epi64(
                                        p01, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), p23));
                _mm512_storeu_si512(out + half * 128 + 64,
                                    _mm512_permutex2var_epi64(
                                        p01, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), p23));
            }
            _mm256_storeu_ps(dd, _mm256_cvtph_ps(_mm_loadu_si128(
                                     (const __m128i *)(grp + nblk * qs_bytes + (b0 + t) * 16))));
            for (int j = live; j < 8; j++) { /* rows past the end: nothing */
                memset(out + j * 32, 0, 32);
                dd[j] = 0.0f;
            }
        }
    }
}

/* pack_a_half_q for Q4_K, Q5_K and IQ4_XS (b0 and nbk whole super-blocks): the quants row by
 * row, then per super-block each row's eight scales (and minimums) as one vector, transposed so
 * that vector t holds block t's scales of the 16 rows. */
static void pack_a_half_superblocks(const bp_tensor *a, const char *abase, int64_t m0, int rows,
                                    int64_t b0, int64_t nbk, int8_t *q, float *d, float *m)
{
    const char *rowp[16];
    for (int r = 0; r < 16; r++) {
        rowp[r] = r < rows ? abase + (m0 + r) * (int64_t)a->nb[1] : NULL;
        for (int64_t t = 0; t < nbk; t++)
            _mm256_storeu_si256((__m256i *)(q + t * 512 + r * 32),
                                rowp[r] ? bp_cpu_unpack_q(a->type, rowp[r], b0 + t, NULL, NULL)
                                        : _mm256_setzero_si256());
    }
    for (int64_t i = 0; i < nbk / 8; i++) {
        __m512 vd[16], vm[16];
        for (int r = 0; r < 16; r++) {
            if (rowp[r])
                bp_cpu_superblock_scales(a->type, rowp[r], b0 / 8 + i, &vd[r], &vm[r]);
            else
                vd[r] = vm[r] = _mm512_setzero_ps();
        }
        bp_cpu_transpose16(vd);
        bp_cpu_transpose16(vm);
        for (int t = 0; t < 8; t++) {
            _mm512_storeu_ps(d + (8 * i + t) * 16, vd[t]);
            if (m)
                _mm512_storeu_ps(m + (8 * i + t) * 16, vm[t]);
        }
    }
}

/* Rows [m0, m0 + rows) of a (zero up to 16 rows), blocks [b0, b0 + nbk), as tiles of 16 rows x
 * 32 quants at q + t * 512, the rows' scales at d + t * 16 and (types with a minimum) their
 * minimums at m + t * 16. */
static void pack_a_half_q(const bp_tensor *a, bool repacked, const char *abase, int64_t m0,
                          int rows, int64_t b0, int64_t nbk, int8_t *q, float *d, float *m)
{
    if (repacked && (a->type == BP_TYPE_Q8_0 || a->type == BP_TYPE_Q4_0)) {
        pack_a_half_repacked(a, m0, rows, b0, nbk, q, d);
        return;
    }
    if (repacked) { /* the other repacked types, eight rows at a time (m0 is a multiple of 16) */
        for (int64_t t = 0; t < nbk; t++)
            for (int gi = 0; gi < 2; gi++) {
                float mm[8];
                bp_cpu_repack_unpack_group(a, m0 / 8 + gi, b0 + t, q + t * 512 + gi * 256,
                                           d + t * 16 + gi * 8, m ? m + t * 16 + gi * 8 : mm);
            }
        return;
    }
    if (!repacked &&
        (a->type == BP_TYPE_Q4_K || a->type == BP_TYPE_Q5_K || a->type == BP_TYPE_IQ4_XS)) {
        pack_a_half_superblocks(a, abase, m0, rows, b0, nbk, q, d, m);
        return;
    }
    for (int r = 0; r < 16; r++) {
        const char *row = r < rows ? abase + (m0 + r) * (int64_t)a->nb[1] : NULL;
        for (int64_t t = 0; t < nbk; t++) {
            int8_t *out = q + t * 512 + r * 32;
            if (!row) {
                _mm256_storeu_si256((__m256i *)out, _mm256_setzero_si256());
                d[t * 16 + r] = 0.0f;
                if (m)
                    m[t * 16 + r] = 0.0f;
            } else if (a->type != BP_TYPE_Q8_0 && a->type != BP_TYPE_Q4_0) {
                float mm = 0.0f;
                _mm256_storeu_si256((__m256i *)out,
                                    bp_cpu_unpack_q(a->type, row, b0 + t, &d[t * 16 + r], &mm));
                if (m)
                    m[t * 16 + r] = mm;
            } else if (a->type == BP_TYPE_Q8_0) {
                const struct bp_block_q8_0 *x = (const struct bp_block_q8_0 *)row + b0 + t;
                _mm256_storeu_si256((__m256i *)out, _mm256_loadu_si256((const __m256i *)x->qs));
                d[t * 16 + r] = bp_cpu_half_to_float(x->d);
            } else {
                /* Q4_0: value j in the low nibble of byte j, value j + 16 in the high; minus 8. */
                const struct bp_block_q4_0 *x = (const struct bp_block_q4_0 *)row + b0 + t;
                const __m128i v = _mm_loadu_si128((const __m128i *)x->qs);
                const __m128i lo4 = _mm_set1_epi8(0x0f);
                const __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo4),
                                                   _mm_and_si128(v, lo4));
                _mm256_storeu_si256((__m256i *)out, _mm256_sub_epi8(u, _mm256_set1_epi8(8)));
                d[t * 16 + r] = bp_cpu_half_to_float(x->d);
            }
        }
    }
}

/* ---- Tiles -------------------------------------------------------------------------------- */

struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles 0-3: C (rows h0/h1 x columns j0/j1), 4-5: A (h0, h1), 6-7: B (j0, j1). bf16: all 16 rows
 * x 64 bytes (32 K values). int8: A 16 x 32 bytes and B 8 x 64 bytes (one 32-value block). */
static void load_config(bool int8)
{
    struct tile_config c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    if (int8) {
        c.colsb[4] = c.colsb[5] = 32;
        c.rows[6] = c.rows[7] = 8;
    }
    _tile_loadconfig(&c);
}

/* The four products of a 2 x 2 block: C tile (h, j) += A tile h x B tile j. Tile numbers
 * must be constants, hence a macro. */
#define TILE_PRODUCTS_2X2(op)                                                                  \
    do {                                                                                       \
        op(0, 4, 6);                                                                           \
        op(1, 4, 7);                                                                           \
        op(2, 5, 6);                                                                           \
        op(3, 5, 7);                                                                           \
    } while (0)

/* The A tiles of one 16-row half: tile t at hi + t * 512 (and lo + t * 512 for F16). */
struct a_src {
    const uint16_t *hi, *lo;
};

/* C[32 x 32] (four tiles at c, 256 floats each) += A[32 x kc] B[kc x 32], in passes. */
static void tile_block(const struct a_src *a0, const struct a_src *a1, const uint16_t *bh0,
                       const uint16_t *bh1, const uint16_t *bl0, const uint16_t *bl1, int64_t kc,
                       bool f16, bool first, float *c)
{
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, 64);
        _tile_loadd(1, c + 256, 64);
        _tile_loadd(2, c + 512, 64);
        _tile_loadd(3, c + 768, 64);
    }
    for (int64_t t = 0; t < kc / 32; t++) {
        const size_t bo = (size_t)t * 512; /* uint16 per 32 K values of a column group */
        _tile_loadd(4, a0->hi + t * 512, 64);
        _tile_loadd(5, a1->hi + t * 512, 64);
        _tile_loadd(6, bh0 + bo, 64);
        _tile_loadd(7, bh1 + bo, 64);
        TILE_PRODUCTS_2X2(_tile_dpbf16ps);
        _tile_loadd(6, bl0 + bo, 64);
        _tile_loadd(7, bl1 + bo, 64);
        TILE_PRODUCTS_2X2(_tile_dpbf16ps);
        if (f16) {
            _tile_loadd(4, a0->lo + t * 512, 64);
            _tile_loadd(5, a1->lo + t * 512, 64);
            _tile_loadd(6, bh0 + bo, 64);
            _tile_loadd(7, bh1 + bo, 64);
            TILE_PRODUCTS_2X2(_tile_dpbf16ps);
        }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
}

/* acc (four 16 x 16 float tiles: rows h0/h1 x columns j0/j1) += the integer tiles ci, each
 * element scaled by its row's weight scale (dw0/dw1) and its column's activation scale, plus
 * (where mw0 is not NULL) its row's weight minimum times its column's scaled block sum. */
BP_CPU_INLINE void rescale(float *acc, const int32_t *ci, const float *dw0, const float *dw1,
                           const float *dx0, const float *dx1, const float *mw0,
                           const float *mw1, const float *sx0, const float *sx1)
{
    const __m512 x[2] = {_mm512_loadu_ps(dx0), _mm512_loadu_ps(dx1)};
    for (int t = 0; t < 4; t++) {
        const float *dw = t >> 1 ? dw1 : dw0;
        for (int i = 0; i < 16; i++) {
            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(dw[i]), x[t & 1]);
            const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(ci + t * 256 + i * 16));
            float *p = acc + t * 256 + i * 16;
            _mm512_store_ps(p, _mm512_fmadd_ps(c, sc, _mm512_load_ps(p)));
        }
    }
    if (!mw0)
        return;
    const __m512 sx[2] = {_mm512_loadu_ps(sx0), _mm512_loadu_ps(sx1)};
    for (int t = 0; t < 4; t++) {
        const float *mw = t >> 1 ? mw1 : mw0;
        for (int i = 0; i < 16; i++) {
            float *p = acc + t * 256 + i * 16;
            _mm512_store_ps(p, _mm512_fmadd_ps(_mm512_set1_ps(mw[i]), sx[t & 1],
                                               _mm512_load_ps(p)));
        }
    }
}

/* Where the 8-bit tiles of one 16-row half come from (packed: block t at q + t * 512), their
 * scales and (NULL for types without) minimums. */
struct a_src_q {
    const int8_t *q;
    const float *d, *m;
};

/* acc[32 x 32] (+)= A[32 x 32 nbk] B[32 nbk x 32] one block at a time, scaled per block; sx0 and
 * sx1 the activations' scaled block sums where the weights have minimums. */
static void tile_block_q(const struct a_src_q *a0, const struct a_src_q *a1, const int8_t *b0,
                         const int8_t *b1, const float *dx0, const float *dx1, const float *sx0,
                         const float *sx1, int64_t nbk, bool first, float *acc)
{
    int32_t ci[1024] __attribute__((aligned(64)));
    if (first)
        memset(acc, 0, 1024 * sizeof(float));
    for (int64_t t = 0; t < nbk; t++) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, a0->q + t * 512, 32);
        _tile_loadd(5, a1->q + t * 512, 32);
        _tile_loadd(6, b0 + t * 512, 64);
        _tile_loadd(7, b1 + t * 512, 64);
        TILE_PRODUCTS_2X2(_tile_dpbssd);
        _tile_stored(0, ci, 64);
        _tile_stored(1, ci + 256, 64);
        _tile_stored(2, ci + 512, 64);
        _tile_stored(3, ci + 768, 64);
        rescale(acc, ci, a0->d + t * 16, a1->d + t * 16, dx0 + t * 16, dx1 + t * 16,
                a0->m ? a0->m + t * 16 : NULL, a1->m ? a1->m + t * 16 : NULL,
                a0->m ? sx0 + t * 16 : NULL, a0->m ? sx1 + t * 16 : NULL);
    }
}

/* A 16 x 16 tile t (rows m, columns n) into dst (column n at dst + n * ldc), rows < mrows and
 * columns < ncols only. */
static void store_tile(const float *t, float *dst, int64_t ldc, int mrows, int ncols)
{
    __m512 r[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(t + 16 * i);
    bp_cpu_transpose16(r);
    const __mmask16 mask = (__mmask16)((1u << mrows) - 1);
    for (int j = 0; j < ncols; j++)
        _mm512_mask_storeu_ps(dst + j * ldc, mask, r[j]);
}

/* Where the packed activations of one block of NB columns live in the shared scratch, in groups
 * of 16 columns: bf16 hi and lo for float weights, Q8_0 quants q and scales d for int8 ones. */
struct b_panels {
    uint16_t *hi, *lo;
    int8_t *q;
    float *d, *s;
};

static struct b_panels b_panels_of(const bp_tensor *dst, void *wshared)
{
    const int64_t N = dst->ne[1], K = dst->src[0]->ne[0];
    const int64_t Np = round_up(N < NB ? N : NB, 32);
    struct b_panels b;
    b.hi = wshared;
    b.lo = b.hi + Np * K;
    b.q = wshared;
    b.d = (float *)((int8_t *)wshared + Np * K);
    b.s = has_min(dst->src[0]->type) ? b.d + Np * (K / 32) : NULL;
    return b;
}

/* Thread p->ith's share of the activations of the NB-column block at n0 (ng groups of 32
 * columns), packed into bp (int8 weights: quantised through this thread's scratch after its A
 * panels). The caller waits for the other threads' shares. */
static void pack_b_block(const bp_tensor *dst, const char *bbase, int64_t n0, int64_t ng,
                         bool int8, char *apanel, const struct b_panels *bp,
                         const struct bp_cpu_params *p)
{
    const bp_tensor *b = dst->src[1];
    const int64_t N = dst->ne[1], K = dst->src[0]->ne[0], nb = K / 32;
    uint16_t *bhi = bp->hi, *blo = bp->lo;
    int8_t *bq = bp->q;
    float *bd = bp->d;
    /* Everyone packs a share of this block's 16-column groups. */
    int64_t g0, g1;
    bp_cpu_split(ng * 2, p->ith, p->nth, &g0, &g1);
    for (int64_t g = g0; g < g1; g++) {
        if (int8) {
            struct bp_block_q8_0 *tmp = (struct bp_block_q8_0 *)(
                ((uintptr_t)apanel + A_PANEL_BYTES + 63) & ~(uintptr_t)63);
            pack_b_group_q(b, bbase, n0 + g * 16, N, nb, bq + g * 16 * K, bd + g * 16 * nb,
                           bp->s ? bp->s + g * 16 * nb : NULL, tmp, (int32_t *)(tmp + 16 * nb));
        } else {
            pack_b_group(b, bbase, n0 + g * 16, N, K, bhi + g * 16 * K, blo + g * 16 * K);
        }
    }
}

/* The C buffer of one block (rows [mb0, m_end) in ns strips of 32, columns from n0 in ng
 * groups of 32) to dst, transposed. */
static void store_block(const float *cbuf, float *cbase, int64_t ldc, int64_t mb0, int64_t m_end,
                        int64_t ns, int64_t n0, int64_t ng, int64_t N)
{
    for (int64_t s = 0; s < ns; s++) {
        for (int64_t g = 0; g < ng; g++) {
            const float *c = cbuf + (s * (NB / 32) + g) * 1024;
            for (int t = 0; t < 4; t++) {
                const int64_t m = mb0 + s * 32 + (t >> 1) * 16;
                const int64_t n = n0 + g * 32 + (t & 1) * 16;
                if (m >= m_end || n >= N)
                    continue;
                const int mrows = m_end - m < 16 ? (int)(m_end - m) : 16;
                const int ncols = N - n < 16 ? (int)(N - n) : 16;
                store_tile(c + t * 256, cbase + n * ldc + m, ldc, mrows, ncols);
            }
        }
    }
}

/* ---- Driver ------------------------------------------------------------------------------- */

void bp_cpu_amx_mul_mat(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p)
{
    const bp_tensor *a = dst->src[0];
    const int64_t M = dst->ne[0], N = dst->ne[1], K = a->ne[0], nb = K / 32;
    const int64_t ldc = (int64_t)(dst->nb[1] / sizeof(float));
    const bool f16 = a->type == BP_TYPE_F16, int8 = quant(a->type);
    const bool repacked = bp_cpu_repacked_base(a) != NULL; /* CPU_REPACK layout (cpu-repack.c) */
    float *cbuf = (float *)(((uintptr_t)p->wdata + 63) & ~(uintptr_t)63);
    char *apanel = (char *)(cbuf + MB * NB);

    /* Rows of this thread: whole 32-row strips. */
    int64_t s0, s1;
    bp_cpu_split((M + 31) / 32, p->ith, p->nth, &s0, &s1);
    const int64_t m_begin = s0 * 32, m_end = s1 * 32 < M ? s1 * 32 : M;

    /* Packed activations of one block of NB columns, in groups of 16 columns. */
    const struct b_panels bp = b_panels_of(dst, p->wshared);
    const uint16_t *bhi = bp.hi, *blo = bp.lo;
    const int8_t *bq = bp.q;
    const float *bd = bp.d, *bs = bp.s;

    load_config(int8);
    for (int64_t n0 = 0; n0 < N; n0 += NB) {
        const int64_t nw = N - n0 < NB ? N - n0 : NB;
        const int64_t ng = (nw + 31) / 32;
        pack_b_block(dst, bbase, n0, ng, int8, apanel, &bp, p);
        bp_cpu_pool_barrier(p->pool);

        for (int64_t mb0 = m_begin; mb0 < m_end; mb0 += MB) {
            const int64_t mh = m_end - mb0 < MB ? m_end - mb0 : MB;
            const int64_t ns = (mh + 31) / 32;
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                const int64_t kc = K - k0 < KC ? K - k0 : KC;
                /* A for each 16-row half of the block, packed into 1 KiB tiles. Loading BF16
                 * tiles in place was slower: rows 8 KiB apart (K = 4096) all fall into one L1
                 * set, so a 16-row tile misses L1 (2 threads, N = 512, five alternating runs:
                 * median 415 in place against 675 packed at K = 4096, 452 against 559 at
                 * K = 14336). */
                struct a_src src[MB / 16];
                struct a_src_q srcq[MB / 16];
                for (int64_t h = 0; h < 2 * ns; h++) {
                    const int64_t m = mb0 + h * 16;
                    const int rows = m_end - m >= 16 ? 16 : (int)(m_end - m > 0 ? m_end - m : 0);
                    if (int8) {
                        int8_t *q = (int8_t *)apanel + h * 16 * KC;
                        float *d = (float *)(apanel + (size_t)MB * KC) + h * (KC / 32) * 16;
                        float *mins = bs ? d + (size_t)MB * (KC / 32) : NULL;
                        pack_a_half_q(a, repacked, abase, m, rows, k0 / 32, kc / 32, q, d, mins);
                        srcq[h].q = q;
                        srcq[h].d = d;
                        srcq[h].m = mins;
                    } else {
                        uint16_t *hh = (uint16_t *)apanel + h * 16 * KC;
                        uint16_t *ll = (uint16_t *)apanel + (MB + h * 16) * KC;
                        pack_a_half(a, abase, m, rows, k0, kc, hh, ll);
                        src[h].hi = hh;
                        src[h].lo = ll;
                    }
                }
                for (int64_t g = 0; g < ng; g++) {
                    const int64_t col = g * 32; /* in the block: groups col/16, col/16 + 1 */
                    for (int64_t s = 0; s < ns; s++) {
                        float *c = cbuf + (s * (NB / 32) + g) * 1024;
                        if (int8) {
                            const int8_t *b0 = bq + col * K + k0 * 16;
                            const float *d0 = bd + col * nb + k0 / 32 * 16;
                            const float *x0 = bs ? bs + col * nb + k0 / 32 * 16 : NULL;
                            tile_block_q(&srcq[2 * s], &srcq[2 * s + 1], b0, b0 + 16 * K, d0,
                                         d0 + 16 * nb, x0, x0 ? x0 + 16 * nb : NULL, kc / 32,
                                         k0 == 0, c);
                        } else {
                            const uint16_t *bh0 = bhi + col * K + k0 * 16;
                            const uint16_t *bl0 = blo + col * K + k0 * 16;
                            tile_block(&src[2 * s], &src[2 * s + 1], bh0, bh0 + 16 * K, bl0,
                                       bl0 + 16 * K, kc, f16, k0 == 0, c);
                        }
                    }
                }
            }
            store_block(cbuf, (float *)cbase, ldc, mb0, m_end, ns, n0, ng, N);
        }
        /* This block's packed activations are rewritten only after everyone is done. */
        bp_cpu_pool_barrier(p->pool);
    }
    _tile_release();
}

#else

bool bp_cpu_amx_available(void)
{
    return false;
}

#endif
