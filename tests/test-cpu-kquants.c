/* test-cpu-kquants.c - the CPU plugin's super-block kernels (plugins/cpu/cpu-kquants.c): the
 * Q8_K quantiser against the runtime's, bit for bit, and the dot product of every type against
 * a double-precision sum of the runtime's dequantised weights and activations.
 *
 * The kernels are internal to the plugin, so this program is built from their source, once per
 * ISA variant of the plugin with that variant's flags (Makefile.am); a variant whose
 * instructions this CPU lacks skips (exit 77). */
#include "config.h"

#include <math.h>
#include <stdint.h>

#include "test-util.h"
#include "../plugins/cpu/cpu-qtypes.h"

static const enum bp_type k_types[] = {BP_TYPE_Q2_K, BP_TYPE_Q3_K, BP_TYPE_Q4_K,
                                       BP_TYPE_Q5_K, BP_TYPE_Q6_K, BP_TYPE_IQ4_XS};
#define N_TYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))

/* Row lengths: one super-block, two, and an odd number (11). */
static const int64_t k_lengths[] = {256, 512, 2816};

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static float rng_float(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_next() >> 40) / (float)(1ull << 24);
}

/* An fp16 scale in a range real models use: 2^-12 .. 2^-4. */
static uint16_t rng_scale(void)
{
    return bp_fp32_to_fp16(ldexpf(rng_float(1.0f, 2.0f), -4 - (int)(rng_next() % 9)));
}

/* One row of nb random valid super-blocks of type t: random bytes everywhere, then sane
 * positive fp16 scales in the scale fields. */
static void *random_row(enum bp_type t, int64_t nb)
{
    const size_t size = bp_type_size(t);
    unsigned char *row = malloc((size_t)nb * size);
    ck_assert_ptr_nonnull(row);
    for (size_t i = 0; i < (size_t)nb * size; i++)
        row[i] = (unsigned char)rng_next();
    for (int64_t i = 0; i < nb; i++) {
        unsigned char *b = row + (size_t)i * size;
        uint16_t d = rng_scale(), dmin = rng_scale();
        switch (t) {
        case BP_TYPE_Q2_K:
            memcpy(b + offsetof(struct bp_block_q2_k, d), &d, 2);
            memcpy(b + offsetof(struct bp_block_q2_k, dmin), &dmin, 2);
            break;
        case BP_TYPE_Q3_K:
            memcpy(b + offsetof(struct bp_block_q3_k, d), &d, 2);
            break;
        case BP_TYPE_Q4_K:
            memcpy(b + offsetof(struct bp_block_q4_k, d), &d, 2);
            memcpy(b + offsetof(struct bp_block_q4_k, dmin), &dmin, 2);
            break;
        case BP_TYPE_Q5_K:
            memcpy(b + offsetof(struct bp_block_q5_k, d), &d, 2);
            memcpy(b + offsetof(struct bp_block_q5_k, dmin), &dmin, 2);
            break;
        case BP_TYPE_Q6_K:
            memcpy(b + offsetof(struct bp_block_q6_k, d), &d, 2);
            break;
        default:
            memcpy(b + offsetof(struct bp_block_iq4_xs, d), &d, 2);
            break;
        }
    }
    return row;
}

/* k activations: mostly uniform in [-s, s], s varying by super-block, with a few outliers. */
static float *random_activations(int64_t k)
{
    float *x = malloc((size_t)k * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (int64_t i = 0; i < k; i += BP_QK_K) {
        const float s = ldexpf(1.0f, (int)(rng_next() % 12) - 6);
        for (int j = 0; j < BP_QK_K; j++)
            x[i + j] = rng_float(-s, s) * (rng_next() % 64 == 0 ? 8.0f : 1.0f);
    }
    return x;
}

static float *dequantize(enum bp_type t, const void *row, int64_t k)
{
    float *f = malloc((size_t)k * sizeof(float));
    ck_assert_ptr_nonnull(f);
    bp_type_get_traits(t)->to_float(row, f, k);
    return f;
}

START_TEST(test_table_names_the_k_types)
{
    for (int i = 0; i < N_TYPES; i++) {
        const struct bp_cpu_qtype *q = bp_cpu_qtype_k(k_types[i]);
        ck_assert_ptr_nonnull(q);
        ck_assert_int_eq(q->act, BP_TYPE_Q8_K);
        ck_assert_ptr_nonnull(q->quantize);
        ck_assert_ptr_nonnull(q->vec_dot);
    }
    const enum bp_type others[] = {BP_TYPE_F32, BP_TYPE_F16, BP_TYPE_Q8_0, BP_TYPE_Q4_0,
                                   BP_TYPE_Q4_1, BP_TYPE_IQ4_NL, BP_TYPE_Q8_K};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
        ck_assert_ptr_null(bp_cpu_qtype_k(others[i]));
    ck_assert_ptr_null(bp_cpu_qtype_k((enum bp_type)-1));
}
END_TEST

/* The plugin's Q8_K rows are the runtime's, byte for byte (scale, quants and bsums). */
static void check_quantizer_matches(const float *x, int64_t k)
{
    const size_t bytes = (size_t)(k / BP_QK_K) * sizeof(struct bp_block_q8_k);
    unsigned char *mine = malloc(bytes), *ref = malloc(bytes);
    ck_assert(mine != NULL && ref != NULL);
    memset(mine, 0xa5, bytes);
    memset(ref, 0x5a, bytes);
    bp_cpu_qtype_k(BP_TYPE_Q4_K)->quantize(x, mine, k);
    bp_type_get_traits(BP_TYPE_Q8_K)->from_float(x, ref, k);
    for (size_t i = 0; i < bytes; i++)
        ck_assert_msg(mine[i] == ref[i], "byte %zu of %zu differs: %u, runtime %u", i, bytes,
                      mine[i], ref[i]);
    free(mine);
    free(ref);
}

START_TEST(test_q8_k_quantizer_is_the_runtimes)
{
    rng_state = 1;
    for (int r = 0; r < 20; r++) {
        float *x = random_activations(2816);
        check_quantizer_matches(x, 2816);
        free(x);
    }
    float x[4 * BP_QK_K];
    /* zeros; ties to even (x * 127/128 hits n + 0.5 at j = 64 and 192); the first of two equal
     * magnitudes of opposite sign picks the sign; a negative largest value */
    for (int j = 0; j < BP_QK_K; j++) {
        x[j] = 0.0f;
        x[BP_QK_K + j] = (float)(j - 128) * 0.5f;
        x[2 * BP_QK_K + j] = (j % 7) * 0.25f;
        x[3 * BP_QK_K + j] = -(float)j / 255.0f;
    }
    x[2 * BP_QK_K + 5] = 3.0f;
    x[2 * BP_QK_K + 9] = -3.0f;
    check_quantizer_matches(x, 4 * BP_QK_K);
    x[2 * BP_QK_K + 5] = -3.0f;
    x[2 * BP_QK_K + 9] = 3.0f;
    check_quantizer_matches(x, 4 * BP_QK_K);
    /* a NaN is never the largest and quantises to 0; an infinity is the largest (scale -0) */
    x[BP_QK_K + 17] = NAN;
    x[BP_QK_K + 200] = -NAN;
    x[3 * BP_QK_K + 40] = INFINITY;
    check_quantizer_matches(x, 4 * BP_QK_K);
}
END_TEST

/* vec_dot of one type and length against sum w y in double over the runtime's dequantised
 * weights and activations, within 1e-5 of sum |w y|: the kernels' integer sums are exact, so
 * only the float scales and the accumulation round. */
static void check_dot(enum bp_type t, int64_t k)
{
    const struct bp_cpu_qtype *q = bp_cpu_qtype_k(t);
    void *w = random_row(t, k / BP_QK_K);
    float *x = random_activations(k);
    void *y = malloc((size_t)(k / BP_QK_K) * sizeof(struct bp_block_q8_k));
    ck_assert_ptr_nonnull(y);
    q->quantize(x, y, k);
    float *wf = dequantize(t, w, k), *yf = dequantize(BP_TYPE_Q8_K, y, k);
    double ref = 0.0, mag = 0.0;
    for (int64_t i = 0; i < k; i++) {
        ref += (double)wf[i] * yf[i];
        mag += fabs((double)wf[i] * yf[i]);
    }
    const double got = q->vec_dot(k, w, y);
    ck_assert_msg(mag > 0.0, "%s: a row of zeros tests nothing", bp_type_name(t));
    ck_assert_msg(fabs(got - ref) <= 1e-5 * mag, "%s k=%lld: %.9g, expected %.9g (sum |wy| %.9g)",
                  bp_type_name(t), (long long)k, got, ref, mag);
    free(w);
    free(x);
    free(y);
    free(wf);
    free(yf);
}

START_TEST(test_dot_matches_dequantized)
{
    const enum bp_type t = k_types[_i];
    rng_state = 1000 + (uint64_t)_i;
    for (int r = 0; r < 8; r++)
        for (size_t l = 0; l < sizeof(k_lengths) / sizeof(k_lengths[0]); l++)
            check_dot(t, k_lengths[l]);
}
END_TEST

/* Extreme quants: every byte 0x00 or 0xff (all-zero or all-maximum quants, scales and high
 * bits), so that no intermediate sum can saturate or wrap unseen. */
START_TEST(test_dot_extreme_quants)
{
    const enum bp_type t = k_types[_i];
    rng_state = 2000 + (uint64_t)_i;
    const int64_t k = 512;
    for (int fill = 0; fill < 2; fill++) {
        void *w = random_row(t, k / BP_QK_K);
        const size_t size = bp_type_size(t);
        /* keep the scales random_row wrote: d is 2 bytes at the offset it used */
        for (int64_t i = 0; i < k / BP_QK_K; i++) {
            unsigned char keep[4], *b = (unsigned char *)w + (size_t)i * size;
            const size_t at = t == BP_TYPE_Q2_K ? offsetof(struct bp_block_q2_k, d)
                              : t == BP_TYPE_Q3_K ? offsetof(struct bp_block_q3_k, d)
                              : t == BP_TYPE_Q6_K ? offsetof(struct bp_block_q6_k, d)
                                                  : 0;
            const size_t n = t == BP_TYPE_Q3_K || t == BP_TYPE_Q6_K || t == BP_TYPE_IQ4_XS ? 2 : 4;
            memcpy(keep, b + at, n);
            memset(b, fill ? 0xff : 0x00, size);
            memcpy(b + at, keep, n);
        }
        float *x = malloc((size_t)k * sizeof(float));
        ck_assert_ptr_nonnull(x);
        for (int64_t i = 0; i < k; i++)
            x[i] = (i % 3 == 0) ? -1.0f : 1.0f;
        void *y = malloc((size_t)(k / BP_QK_K) * sizeof(struct bp_block_q8_k));
        ck_assert_ptr_nonnull(y);
        bp_cpu_qtype_k(t)->quantize(x, y, k);
        float *wf = dequantize(t, w, k), *yf = dequantize(BP_TYPE_Q8_K, y, k);
        double ref = 0.0, mag = 0.0;
        for (int64_t i = 0; i < k; i++) {
            ref += (double)wf[i] * yf[i];
            mag += fabs((double)wf[i] * yf[i]);
        }
        const double got = bp_cpu_qtype_k(t)->vec_dot(k, w, y);
        ck_assert_msg(fabs(got - ref) <= 1e-5 * mag + 1e-30, "%s fill %d: %.9g, expected %.9g",
                      bp_type_name(t), fill, got, ref);
        free(w);
        free(x);
        free(y);
        free(wf);
        free(yf);
    }
}
END_TEST

/* Whether this CPU runs the instructions this build of the kernels was compiled for. */
static int isa_present(void)
{
#if defined(BP_CPU_HAVE_AVX512_VNNI)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
#elif defined(BP_CPU_HAVE_AVX2)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 1;
#endif
}

int main(void)
{
    if (!isa_present()) {
        fprintf(stderr, "this CPU lacks the instructions of this build: skipped\n");
        return 77;
    }
#if !defined(BP_CPU_HAVE_F16C)
    bp_cpu_half_table_init();
#endif
    Suite *s = suite_create("cpu-kquants");
    BP_TCASE(s, test_table_names_the_k_types, 10);
    BP_TCASE(s, test_q8_k_quantizer_is_the_runtimes, 30);
    TCase *tc = tcase_create("test_dot_matches_dequantized");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_dot_matches_dequantized, 0, N_TYPES);
    tcase_add_loop_test(tc, test_dot_extreme_quants, 0, N_TYPES);
    suite_add_tcase(s, tc);
    return bp_test_run(s);
}
