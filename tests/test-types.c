/* test-types.c - the type table and float/half/bfloat/quantised conversions.
 *
 * The references here are independent of runtime/types.c: half values are computed with ldexp
 * from their fields, rounding boundaries from exact midpoints, and (where the compiler has it)
 * the compiler's own _Float16 conversion is compared as well. */
#include <math.h>
#include <stdint.h>

#include "test-util.h"

static uint32_t bits_of(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float float_of(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* The exact value of a half bit pattern, from its fields (NaN for NaN patterns). */
static double half_value(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -24);
    else
        v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

START_TEST(test_traits_table)
{
    static const struct {
        enum bp_type t;
        const char *name;
        int64_t blck;
        size_t size;
        bool quant;
    } want[] = {
        {BP_TYPE_F32, "f32", 1, 4, false},   {BP_TYPE_F16, "f16", 1, 2, false},
        {BP_TYPE_BF16, "bf16", 1, 2, false}, {BP_TYPE_I32, "i32", 1, 4, false},
        {BP_TYPE_Q8_0, "q8_0", 32, 34, true}, {BP_TYPE_Q4_0, "q4_0", 32, 18, true},
    };
    ck_assert_int_eq(BP_TYPE_COUNT, 6);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const struct bp_type_traits *tr = bp_type_get_traits(want[i].t);
        ck_assert_ptr_nonnull(tr);
        ck_assert_str_eq(tr->name, want[i].name);
        ck_assert_str_eq(bp_type_name(want[i].t), want[i].name);
        ck_assert_int_eq(tr->block_size, want[i].blck);
        ck_assert_uint_eq(tr->type_size, want[i].size);
        ck_assert_int_eq(tr->is_quantized, want[i].quant);
        ck_assert_ptr_nonnull(tr->to_float);
        ck_assert_ptr_nonnull(tr->from_float);
        enum bp_type back;
        ck_assert_int_eq(bp_type_from_name(want[i].name, &back), BP_OK);
        ck_assert_int_eq(back, want[i].t);
    }
    enum bp_type t;
    ck_assert_int_eq(bp_type_from_name("Q4_0", &t), BP_OK);
    ck_assert_int_eq(t, BP_TYPE_Q4_0);
    ck_assert_int_eq(bp_row_size(BP_TYPE_Q4_0, 64), 36);
    ck_assert_int_eq(bp_row_size(BP_TYPE_Q8_0, 96), 102);
    ck_assert_int_eq(bp_row_size(BP_TYPE_F16, 7), 14);
}
END_TEST

START_TEST(test_traits_reject_bad_input)
{
    ck_assert_rejected(bp_type_get_traits(BP_TYPE_COUNT), BP_ERR_TYPE, "not a backplane type");
    ck_assert_rejected(bp_type_get_traits((enum bp_type)-1), BP_ERR_TYPE, "-1");
    ck_assert_str_eq(bp_type_name((enum bp_type)77), "invalid");
    ck_assert_uint_eq(bp_type_size((enum bp_type)77), 0);
    ck_assert_int_eq(bp_row_size(BP_TYPE_Q8_0, 33), 0); /* not whole blocks */
    enum bp_type t;
    ck_assert_int_eq(bp_type_from_name("f64", &t), BP_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(bp_last_error(), "'f64'"));
    ck_assert_int_eq(bp_type_from_name(NULL, &t), BP_ERR_INVALID_ARG);
}
END_TEST

/* All 65,536 halves: the float value is exact and converting back gives the same bits. */
START_TEST(test_fp16_all_patterns_exact_and_round_trip)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = bp_fp16_to_fp32((uint16_t)h);
        double ref = half_value((uint16_t)h);
        if (isnan(ref)) {
            ck_assert_msg(isnan(f), "half 0x%04x should be NaN", h);
            ck_assert_int_eq(signbit(f) != 0, (h >> 15) != 0);
        } else {
            ck_assert_msg((double)f == ref, "half 0x%04x: got %.10g, want %.10g", h, (double)f,
                          ref);
            ck_assert_int_eq(signbit(f) != 0, (h >> 15) != 0); /* -0 stays -0 */
        }
        ck_assert_msg(bp_fp32_to_fp16(f) == h, "half 0x%04x does not round-trip (got 0x%04x)", h,
                      bp_fp32_to_fp16(f));
    }
}
END_TEST

/* Every rounding boundary between two adjacent finite halves: just below the midpoint rounds
 * down, just above rounds up, the midpoint itself goes to the even pattern. */
START_TEST(test_fp16_round_to_nearest_even_everywhere)
{
    for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        for (uint32_t h = 0; h < 0x7bff; h++) {
            double lo = half_value((uint16_t)h), hi = half_value((uint16_t)(h + 1));
            float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
            ck_assert((double)mid == (lo + hi) / 2);
            uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
            if (sign) {
                mid = -mid;
                below = -below;
                above = -above;
            }
            ck_assert_msg(bp_fp32_to_fp16(mid) == (even | sign), "midpoint after 0x%04x", h);
            ck_assert_msg(bp_fp32_to_fp16(below) == (h | sign), "below midpoint after 0x%04x", h);
            ck_assert_msg(bp_fp32_to_fp16(above) == ((h + 1) | sign), "above 0x%04x", h);
        }
    }
    /* Overflow: 65504 is the largest half; 65520 is the midpoint to "65536" and rounds to Inf. */
    ck_assert_uint_eq(bp_fp32_to_fp16(65504.0f), 0x7bff);
    ck_assert_uint_eq(bp_fp32_to_fp16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    ck_assert_uint_eq(bp_fp32_to_fp16(65520.0f), 0x7c00);
    ck_assert_uint_eq(bp_fp32_to_fp16(-1e30f), 0xfc00);
    ck_assert_uint_eq(bp_fp32_to_fp16(INFINITY), 0x7c00);
    /* Underflow: 2^-25 is halfway to the smallest subnormal and rounds to even (zero). */
    ck_assert_uint_eq(bp_fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);
    ck_assert_uint_eq(bp_fp32_to_fp16(nextafterf(ldexpf(1.0f, -25), 1.0f)), 0x0001);
    ck_assert_uint_eq(bp_fp32_to_fp16(-1e-30f), 0x8000);
    /* Float NaNs stay NaN, including one whose payload lives only in the low bits. */
    ck_assert_uint_eq(bp_fp32_to_fp16(float_of(0x7f800001u)) & 0x7c00, 0x7c00);
    ck_assert_uint_ne(bp_fp32_to_fp16(float_of(0x7f800001u)) & 0x3ff, 0);
    ck_assert_uint_eq(bp_fp32_to_fp16(float_of(0xffc00000u)), 0xfe00);
}
END_TEST

#if defined(__FLT16_MAX__) && !defined(__clang__)
/* A sweep of float bit patterns against the compiler's own float->_Float16 conversion. */
START_TEST(test_fp16_matches_compiler)
{
    for (uint64_t x = 0; x <= 0xffffffffu; x += 4093) {
        float f = float_of((uint32_t)x);
        _Float16 c = (_Float16)f;
        uint16_t want;
        memcpy(&want, &c, 2);
        uint16_t got = bp_fp32_to_fp16(f);
        if (isnan(f))
            ck_assert((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0);
        else
            ck_assert_msg(got == want, "float 0x%08x: got 0x%04x, compiler 0x%04x", (unsigned)x,
                          got, want);
    }
}
END_TEST
#endif

START_TEST(test_bf16_all_patterns_exact_and_round_trip)
{
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = bp_bf16_to_fp32((uint16_t)h);
        ck_assert_uint_eq(bits_of(f), h << 16); /* bfloat16 is the top half of a float */
        ck_assert_msg(bp_fp32_to_bf16(f) == h, "bf16 0x%04x does not round-trip", h);
    }
}
END_TEST

START_TEST(test_bf16_round_to_nearest_even_everywhere)
{
    for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        for (uint32_t h = 0; h < 0x7f7f; h++) { /* up to the largest finite bf16 */
            uint32_t lo = h << 16;
            uint32_t mid = lo + 0x8000; /* exactly halfway to the next pattern */
            uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            ck_assert_uint_eq(bp_fp32_to_bf16(float_of((sign << 16) | mid)), even | sign);
            ck_assert_uint_eq(bp_fp32_to_bf16(float_of((sign << 16) | (mid - 1))), h | sign);
            ck_assert_uint_eq(bp_fp32_to_bf16(float_of((sign << 16) | (mid + 1))),
                              (h + 1) | sign);
        }
    }
    /* Above the largest finite bf16 the halfway point rounds (to even) into Inf. */
    ck_assert_uint_eq(bp_fp32_to_bf16(float_of(0x7f7f8000u)), 0x7f80);
    ck_assert_uint_eq(bp_fp32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);
    ck_assert_uint_eq(bp_fp32_to_bf16(INFINITY), 0x7f80);
    /* A NaN whose payload is only in the low half stays NaN. */
    uint16_t n = bp_fp32_to_bf16(float_of(0x7f800001u));
    ck_assert(isnan(bp_bf16_to_fp32(n)));
}
END_TEST

START_TEST(test_rows_f16_bf16_i32)
{
    float src[7] = {0.0f, -1.5f, 3.14159f, 65504.0f, 1e-8f, -2.5f, 100.49f};
    uint16_t h[7], b[7];
    float back[7];
    bp_type_get_traits(BP_TYPE_F16)->from_float(src, h, 7);
    bp_type_get_traits(BP_TYPE_BF16)->from_float(src, b, 7);
    for (int i = 0; i < 7; i++) {
        ck_assert_uint_eq(h[i], bp_fp32_to_fp16(src[i]));
        ck_assert_uint_eq(b[i], bp_fp32_to_bf16(src[i]));
    }
    bp_type_get_traits(BP_TYPE_F16)->to_float(h, back, 7);
    for (int i = 0; i < 7; i++)
        ck_assert(back[i] == bp_fp16_to_fp32(h[i]));

    float big[6] = {2.5f, -2.5f, 3e9f, -3e9f, NAN, 7.7f};
    int32_t q[6];
    bp_type_get_traits(BP_TYPE_I32)->from_float(big, q, 6);
    ck_assert_int_eq(q[0], 2); /* nearest even */
    ck_assert_int_eq(q[1], -2);
    ck_assert_int_eq(q[2], INT32_MAX);
    ck_assert_int_eq(q[3], INT32_MIN);
    ck_assert_int_eq(q[4], 0);
    ck_assert_int_eq(q[5], 8);
    bp_type_get_traits(BP_TYPE_I32)->to_float(q, back, 6);
    ck_assert(back[5] == 8.0f);
}
END_TEST

/* Q4_0 on a block worked out by hand: x_j = j - 16, so max|x| = 16 at x = -16, d = 2, and each
 * value becomes round(x / 2) + 8 clamped to 0..15. */
START_TEST(test_q4_0_known_block)
{
    float x[32], y[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16);
    struct bp_block_q4_0 blk;
    bp_type_get_traits(BP_TYPE_Q4_0)->from_float(x, &blk, 32);
    ck_assert_float_eq(bp_fp16_to_fp32(blk.d), 2.0f);
    for (int j = 0; j < 16; j++) {
        int lo = blk.qs[j] & 15, hi = blk.qs[j] >> 4;
        int want_lo = (int)floor((j - 16) / 2.0 + 8.5), want_hi = (int)floor(j / 2.0 + 8.5);
        if (want_hi > 15)
            want_hi = 15;
        ck_assert_int_eq(lo, want_lo);
        ck_assert_int_eq(hi, want_hi);
    }
    bp_type_get_traits(BP_TYPE_Q4_0)->to_float(&blk, y, 32);
    for (int j = 0; j < 32; j++)
        ck_assert(fabsf(y[j] - x[j]) <= 1.0f); /* half a step of d = 2 */
    ck_assert_float_eq(y[0], -16.0f);          /* the extreme value is exact */
}
END_TEST

/* Q8_0 on a hand-worked block: x_j = (j - 12) / 4, max |x| = 19/4 -> d = 19/508. */
START_TEST(test_q8_0_known_block)
{
    float x[32], y[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 12) / 4.0f;
    struct bp_block_q8_0 blk;
    bp_type_get_traits(BP_TYPE_Q8_0)->from_float(x, &blk, 32);
    double d = 19.0 / 4.0 / 127.0;
    ck_assert(fabs(bp_fp16_to_fp32(blk.d) - d) <= d * 1e-3);
    for (int j = 0; j < 32; j++)
        ck_assert_int_eq(blk.qs[j], (int)lround(x[j] / d));
    ck_assert_int_eq(blk.qs[31], 127);
    bp_type_get_traits(BP_TYPE_Q8_0)->to_float(&blk, y, 32);
    for (int j = 0; j < 32; j++)
        ck_assert(fabs(y[j] - x[j]) <= 0.6 * d);
}
END_TEST

static uint32_t rng_state = 12345;
static float rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((float)(rng_state >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* Random rows of several blocks: every element within the format's error bound of its block,
 * all-zero blocks exact. Q8_0 is symmetric: half a step (plus the fp16 rounding of the scale).
 * Q4_0 maps the extreme value to -8 steps, so values on the other side can reach only +7 steps
 * and may be clamped by up to one whole step. */
/* Rows at odd addresses (a GGUF file with general.alignment 1 hands such rows out) convert as
 * at aligned ones, both ways; UBSan builds would flag a misaligned access. */
START_TEST(test_rows_at_any_address)
{
    enum { N = 64 };
    float x[N], aligned[N], odd[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(i % 11) * 0.37f - 1.5f;
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        const struct bp_type_traits *tr = bp_type_get_traits((enum bp_type)t);
        const size_t bytes = bp_row_size((enum bp_type)t, N);
        _Alignas(64) unsigned char a[N * 4 + 64], b[N * 4 + 64];
        tr->from_float(x, a, N);
        for (int off = 1; off < 4; off++) {
            tr->from_float(x, b + off, N);
            ck_assert_mem_eq(b + off, a, bytes);
            tr->to_float(a, aligned, N);
            tr->to_float(b + off, odd, N);
            ck_assert_mem_eq(odd, aligned, sizeof(odd));
        }
    }
}
END_TEST

START_TEST(test_quantised_rows_error_bounds)
{
    enum { N = 32 * 40 };
    static float x[N], y[N];
    static unsigned char buf[N * 2];
    for (int i = 0; i < N; i++)
        x[i] = rnd() * (float)(1 + i / 32); /* different magnitudes per block */
    for (int j = 0; j < 32; j++)
        x[5 * 32 + j] = 0.0f; /* one all-zero block */

    enum bp_type types[2] = {BP_TYPE_Q8_0, BP_TYPE_Q4_0};
    double steps[2] = {127.0, 8.0};
    double bound[2] = {0.6, 1.01}; /* in steps */
    for (int k = 0; k < 2; k++) {
        const struct bp_type_traits *tr = bp_type_get_traits(types[k]);
        tr->from_float(x, buf, N);
        tr->to_float(buf, y, N);
        for (int blk = 0; blk < N / 32; blk++) {
            double amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmax(amax, fabs(x[blk * 32 + j]));
            double d = amax / steps[k];
            for (int j = 0; j < 32; j++) {
                int i = blk * 32 + j;
                ck_assert_msg(fabs(y[i] - x[i]) <= bound[k] * d + 1e-7, "%s block %d elem %d: %g vs %g",
                              tr->name, blk, j, (double)y[i], (double)x[i]);
            }
        }
        for (int j = 0; j < 32; j++)
            ck_assert(y[5 * 32 + j] == 0.0f);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("types");
    BP_TCASE(s, test_traits_table, 10);
    BP_TCASE(s, test_traits_reject_bad_input, 10);
    BP_TCASE(s, test_fp16_all_patterns_exact_and_round_trip, 60);
    BP_TCASE(s, test_fp16_round_to_nearest_even_everywhere, 60);
#if defined(__FLT16_MAX__) && !defined(__clang__)
    BP_TCASE(s, test_fp16_matches_compiler, 120);
#endif
    BP_TCASE(s, test_bf16_all_patterns_exact_and_round_trip, 60);
    BP_TCASE(s, test_bf16_round_to_nearest_even_everywhere, 60);
    BP_TCASE(s, test_rows_f16_bf16_i32, 10);
    BP_TCASE(s, test_q4_0_known_block, 10);
    BP_TCASE(s, test_q8_0_known_block, 10);
    BP_TCASE(s, test_quantised_rows_error_bounds, 10);
    BP_TCASE(s, test_rows_at_any_address, 10);
    return bp_test_run(s);
}
