/* cpu-impl.h - private to plugins/cpu: what the CPU plugin's files share. */
#ifndef BP_CPU_IMPL_H
#define BP_CPU_IMPL_H

#include <backplane/bp-plugin.h>

#include <stdatomic.h>

#include "cpu-isa.h"

#if defined(__GNUC__)
#define BP_CPU_INLINE static inline __attribute__((always_inline))
#else
#define BP_CPU_INLINE static inline
#endif

/* ---- Thread pool (cpu-pool.c) ---------------------------------------------------------- */

struct bp_cpu_pool;

/* The job every thread runs: ith in [0, nth). Thread 0 is the caller. */
typedef void (*bp_cpu_job_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 (the caller counts as one). NULL with an error on failure. */
struct bp_cpu_pool *bp_cpu_pool_new(int n_threads);
void bp_cpu_pool_free(struct bp_cpu_pool *pool);
int bp_cpu_pool_n_threads(const struct bp_cpu_pool *pool);
/* Runs job on every thread and returns when all have finished; after a job in which a thread
 * was descheduled (contention), the following jobs run for a while on the calling thread alone,
 * as job(arg, 0, 1) (cpu-pool.c). Callers size per-thread scratch for both. */
void bp_cpu_pool_run(struct bp_cpu_pool *pool, bp_cpu_job_fn job, void *arg);
/* Whether jobs now run on the calling thread alone (a solo period, or BP_CPU_FORCE_SOLO): a
 * hint for work that only helps several threads; the next job may still try them all. */
bool bp_cpu_pool_solo(const struct bp_cpu_pool *pool);
/* Inside a job: waits until every thread of the pool has reached this point. */
void bp_cpu_pool_barrier(struct bp_cpu_pool *pool);

/* ---- Kernels (cpu-ops.c; MUL_MAT: cpu-matmul.c and the files it names) ------------------ */

/* What a kernel gets: its node, which thread it is, and scratch memory of its own. */
struct bp_cpu_params {
    int ith;
    int nth;
    void *wdata;      /* this thread's scratch, wsize_thread bytes */
    void *wshared;    /* scratch shared by all threads of the node, wsize_shared bytes */
    struct bp_cpu_pool *pool;
    /* The first node of this compute that met data it cannot use (an id out of range): set
     * with bp_cpu_fault; the compute then fails with BP_ERR_OUT_OF_BOUNDS naming it. */
    _Atomic(const bp_tensor *) *fault;
};

/* Records node as the compute's first fault (later ones are dropped). The kernel goes on and
 * must still read and write nothing out of bounds. */
BP_CPU_INLINE void bp_cpu_fault(const struct bp_cpu_params *p, const bp_tensor *node)
{
    const bp_tensor *none = NULL;
    atomic_compare_exchange_strong(p->fault, &none, node);
}

/* CALL(c) with c the constant 1, 2, 3 or 4 for nc = 1, 2, 3 or more: each call inlines its own
 * copy of a kernel whose loops over columns then unroll. */
#define BP_CPU_BY_COLUMNS(nc, CALL)                                                            \
    switch (nc) {                                                                              \
    case 1:                                                                                    \
        CALL(1);                                                                               \
        break;                                                                                 \
    case 2:                                                                                    \
        CALL(2);                                                                               \
        break;                                                                                 \
    case 3:                                                                                    \
        CALL(3);                                                                               \
        break;                                                                                 \
    default:                                                                                   \
        CALL(4);                                                                               \
        break;                                                                                 \
    }

/* Rows [*r0, *r1) of nrows for thread ith of nth, as even as possible. */
BP_CPU_INLINE void bp_cpu_split(int64_t nrows, int ith, int nth, int64_t *r0, int64_t *r1)
{
    int64_t per = nrows / nth, extra = nrows % nth;
    *r0 = ith * per + (ith < extra ? ith : extra);
    *r1 = *r0 + per + (ith < extra ? 1 : 0);
}

BP_CPU_INLINE void *bp_cpu_row(const bp_tensor *t, int64_t i1, int64_t i2, int64_t i3)
{
    return (char *)t->data + i1 * (int64_t)t->nb[1] + i2 * (int64_t)t->nb[2] +
           i3 * (int64_t)t->nb[3];
}

/* Whether the op (with its sources' types and layouts) has a kernel here. */
bool bp_cpu_supports_op(const bp_tensor *op);
/* Scratch a node needs: per thread and shared. */
void bp_cpu_work_size(const bp_tensor *node, int nth, size_t *per_thread, size_t *shared);
/* Computes node's share for thread p->ith. All threads call it for every node. */
void bp_cpu_compute_node(bp_tensor *node, const struct bp_cpu_params *p);

/* FLASH_ATTN_EXT (cpu-attn.c). */
void bp_cpu_flash_attn(bp_tensor *dst, const struct bp_cpu_params *p);
bool bp_cpu_flash_attn_supported(const bp_tensor *dst);
void bp_cpu_flash_attn_work_size(const bp_tensor *dst, int nth, size_t *per_thread);

void bp_cpu_mul_mat(bp_tensor *dst, const struct bp_cpu_params *p);
/* MUL_MAT_ID (cpu-matmul.c): pairs grouped by expert, then the MUL_MAT kernels per group. */
void bp_cpu_mul_mat_id(bp_tensor *node, const struct bp_cpu_params *p);
bool bp_cpu_mul_mat_id_supported(const bp_tensor *node);
void bp_cpu_mul_mat_id_work_size(const bp_tensor *node, int nth, size_t *per_thread,
                                 size_t *shared);
bool bp_cpu_mul_mat_supported(const bp_tensor *dst);
void bp_cpu_mul_mat_work_size(const bp_tensor *dst, int nth, size_t *per_thread, size_t *shared);

/* x[i] = exp(x[i]), vectorised (cpu-attn.c): about 2 ulp, 0 below -87.3, NaN for NaN; for
 * arguments above 88.3 it gives a large finite value instead of inf. */
void bp_cpu_exp_inplace(float *x, int64_t n);

/* Rows of float from any type (contiguous row of src, n elements), vectorised (cpu-convert.c). */
void bp_cpu_to_float(enum bp_type type, const void *src, float *dst, int64_t n);
/* n floats to a row of type (the runtime's conversions, bit for bit; F16 with F16C). */
void bp_cpu_from_float(enum bp_type type, const float *src, void *dst, int64_t n);

#if !defined(BP_CPU_HAVE_F16C)
/* Every half as float, filled once when the plugin initialises (cpu_plugin_init): without F16C
 * the scalar conversion is a 256 KiB table, as ggml keeps, instead of the runtime's bit
 * manipulation per value (the baseline's Q8_0/Q4_0 dot products convert two scales a block). */
extern float bp_cpu_half_table[65536];
void bp_cpu_half_table_init(void);
#endif

/* One f16 value as float: the plugin's one scalar half conversion. */
BP_CPU_INLINE float bp_cpu_half_to_float(uint16_t h)
{
#if defined(BP_CPU_HAVE_F16C)
    return _cvtsh_ss(h);
#else
    return bp_cpu_half_table[h];
#endif
}

#if defined(BP_CPU_HAVE_SSE2) && !defined(BP_CPU_HAVE_F16C)
/* Four halves at p as floats with SSE2 alone (the baseline variant has no F16C), exactly:
 * normal halves have exponent and mantissa moved into place and scaled by 2^112, subnormal ones
 * (and zero) are their integer mantissa times 2^-24, which never makes an f32 denormal (so a
 * caller's denormals-are-zero mode changes nothing); infinities and NaNs get the f32 exponent;
 * the sign is put back last. */
BP_CPU_INLINE __m128 bp_cpu_half4_sse2(const uint16_t *p)
{
    const __m128i h = _mm_unpacklo_epi16(_mm_loadl_epi64((const __m128i *)p), _mm_setzero_si128());
    const __m128i em = _mm_and_si128(h, _mm_set1_epi32(0x7fff));
    const __m128i sign = _mm_slli_epi32(_mm_xor_si128(h, em), 16);
    __m128 f = _mm_mul_ps(_mm_castsi128_ps(_mm_slli_epi32(em, 13)),
                          _mm_castsi128_ps(_mm_set1_epi32(0x77800000))); /* 2^112 */
    const __m128i sub = _mm_cmplt_epi32(em, _mm_set1_epi32(0x400)); /* subnormal or zero */
    const __m128 fs = _mm_mul_ps(_mm_cvtepi32_ps(em),
                                 _mm_castsi128_ps(_mm_set1_epi32(0x33800000))); /* 2^-24 */
    f = _mm_or_ps(_mm_andnot_ps(_mm_castsi128_ps(sub), f), _mm_and_ps(_mm_castsi128_ps(sub), fs));
    const __m128i special = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x7bff)); /* inf or NaN */
    const __m128i naninf = _mm_or_si128(_mm_slli_epi32(em, 13), _mm_set1_epi32(0x7f800000));
    f = _mm_or_ps(_mm_andnot_ps(_mm_castsi128_ps(special), f),
                  _mm_and_ps(_mm_castsi128_ps(special), _mm_castsi128_ps(naninf)));
    return _mm_or_ps(f, _mm_castsi128_ps(sign));
}

#endif

#if defined(BP_CPU_HAVE_AVX512)
/* 16 rows x 16 columns of floats transposed: out[c][r] = in[r][c] (in: 16 row vectors). The
 * loops are unrolled so that, inlined into a caller that indexes r only with constants, all of
 * it stays in registers (a loop left rolled sends every stage through the stack). */
BP_CPU_INLINE void bp_cpu_transpose16(__m512 r[16])
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* Now, per 128-bit lane L: rows 4g..4g+3 at column 4L+j end up in r[4g+j]. */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
        const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
        r[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    /* Finally a 4 x 4 transpose of 128-bit lanes for each j. */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 b = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
        t[0 * 4 + j] = _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0));
        t[1 * 4 + j] = _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1));
        t[2 * 4 + j] = _mm512_shuffle_f32x4(b, d, _MM_SHUFFLE(2, 0, 2, 0));
        t[3 * 4 + j] = _mm512_shuffle_f32x4(b, d, _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

#endif

/* ---- AMX tiles (cpu-amx.c; the avx512 variant where the CPU and kernel allow) ------------- */

/* Whether this process may use AMX tiles (CPUID, XCR0, Linux's permission; BP_CPU_AMX=0 in the
 * environment says no). Asked once. */
bool bp_cpu_amx_available(void);
/* Whether MUL_MAT node dst runs on the AMX kernel. */
bool bp_cpu_amx_use(const bp_tensor *dst);
void bp_cpu_amx_work_size(const bp_tensor *dst, size_t *per_thread, size_t *shared);
/* One batch (2-D slice) of dst; every thread of the pool calls it. */
void bp_cpu_amx_mul_mat(bp_tensor *dst, const char *abase, const char *bbase, char *cbase,
                        const struct bp_cpu_params *p);

/* ---- Repacked weights (cpu-repack.c) ------------------------------------------------------- */

/* A device's "CPU_REPACK" buffer type (freed with the device). */
bp_buffer_type *bp_cpu_repack_buft_new(bp_device *dev);
bool bp_cpu_is_repack_buft(bp_buffer_type *buft);
/* The tensor whose repacked data t is or views (t itself, or its view_src); NULL when t's data
 * is in the ordinary layout. */
const bp_tensor *bp_cpu_repacked_base(const bp_tensor *t);
/* False when op touches repacked data in a way no kernel reads (only MUL_MAT and GET_ROWS of
 * the repacked tensor itself, as src[0], do). */
bool bp_cpu_repack_supports_op(const bp_tensor *op);
/* Whether this variant stores 2-D tensors of type row-interleaved in CPU_REPACK (the proc
 * address "bp_cpu_repack_type" answers with it). */
bool bp_cpu_repack_stores(enum bp_type type);
/* Row r, block kb of repacked t in its type's own layout (a block of 32 values, or of 256 for
 * Q4_K, Q5_K and IQ4_XS). */
void bp_cpu_repack_get_block(const bp_tensor *t, int64_t r, int64_t kb, void *out);
#if defined(BP_CPU_HAVE_AVX512) && defined(BP_CPU_REPACK_KERNEL)
/* Block (sub-block) kb of 32 values of the eight rows of group g (rows 8g..8g+7; past the
 * tensor's last group, zero; its padding rows as the layout holds them) of repacked t, not Q4_0 or Q8_0, as bp_cpu_unpack_q gives a block of
 * 32 (cpu-unpack32.h): row j's values in element order at q + 32 j, unsigned for the types
 * with a minimum (Q4_1, Q5_1, Q4_K, Q5_K) and signed for the others, and d[j], m[j] with
 * value = d q + m (for the super-block types, their scales times the sub-block's). */
void bp_cpu_repack_unpack_group(const bp_tensor *t, int64_t g, int64_t kb, int8_t *q, float *d,
                                float *m);
#endif
/* What the kernels want each activation block's quant sum multiplied by, per lane (ycorr). */
int32_t bp_cpu_repack_ycorr(enum bp_type type);
/* Kernels for the repacked layout, where BP_CPU_REPACK_KERNEL (cpu-isa.h) says there are: AVX-512
 * VNNI (Q4_0, Q8_0, IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, IQ4_XS), and AVX2 (Q4_0). Other builds
 * repack nothing. */
/* Groups of eight rows [g0, g1) of repacked a against N columns quantised to Q8_0 (bq; per
 * block: ycorr = bp_cpu_repack_ycorr(a->type) times the sum of its quants, yd = its scale as
 * float), into c (column n at
 * c + n * ldc). */
void bp_cpu_repack_mul_mat(const bp_tensor *a, const struct bp_block_q8_0 *bq,
                           const int32_t *ycorr, const float *yd, float *c, int64_t ldc,
                           int64_t g0, int64_t g1, int64_t N);

/* ---- Devices and collectives (cpu-plugin.c, cpu-comm.c) ---------------------------------- */

#include <backplane/bp-comm.h>

/* Whether be is a backend of this plugin's devices. */
bool bp_cpu_is_own_backend(bp_backend *be);
struct bp_cpu_pool *bp_cpu_backend_pool(bp_backend *be);
bp_comm *bp_cpu_comm_init(bp_backend *const *backends, int n);
enum bp_status bp_cpu_comm_allreduce(bp_comm *comm, bp_tensor *const *tensors, int n);
void bp_cpu_comm_free(bp_comm *comm);

/* nb blocks of 32 floats to Q8_0 activations, and the sum of each block's quants (cpu-gemv.c,
 * cpu-gemv-avx512.c): the runtime's scale, but ties rounded to even as ggml's vector quantiser
 * does (the runtime's, for files, rounds them away from zero as llama-quantize does). */
void bp_cpu_quantize_q8_0(const float *x, struct bp_block_q8_0 *b, int32_t *sums, int64_t nb);
/* Whether rows of type can be written from floats (CPY, SET_ROWS): the plain types, and the
 * quantised ones with a quantiser here or in the runtime (cpu-convert.c). */
bool bp_cpu_can_from_float(enum bp_type type);
/* "x86_64", "avx2", "avx512" or "generic": what this build was compiled for (cpu-plugin.c). */
const char *bp_cpu_variant_name(void);

#endif
