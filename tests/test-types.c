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
        {BP_TYPE_Q4_1, "q4_1", 32, 20, true}, {BP_TYPE_Q5_0, "q5_0", 32, 22, true},
        {BP_TYPE_Q5_1, "q5_1", 32, 24, true}, {BP_TYPE_Q8_1, "q8_1", 32, 36, true},
        {BP_TYPE_Q2_K, "q2_K", 256, 84, true}, {BP_TYPE_Q3_K, "q3_K", 256, 110, true},
        {BP_TYPE_Q4_K, "q4_K", 256, 144, true}, {BP_TYPE_Q5_K, "q5_K", 256, 176, true},
        {BP_TYPE_Q6_K, "q6_K", 256, 210, true}, {BP_TYPE_Q8_K, "q8_K", 256, 292, true},
        {BP_TYPE_IQ4_NL, "iq4_nl", 32, 18, true}, {BP_TYPE_IQ4_XS, "iq4_xs", 256, 136, true},
    };
    ck_assert_int_eq(BP_TYPE_COUNT, 18);
    ck_assert_int_eq(sizeof(want) / sizeof(want[0]), BP_TYPE_COUNT);
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

/* Ties round away from zero as llama.cpp's file quantiser does (quantize_row_q8_0_ref, roundf):
 * with the largest magnitude 127 the scale is exactly 1, so x.5 lands on a tie. Rounding to
 * even (lrintf) would give 2, -2, 0 and 124 here. */
START_TEST(test_q8_0_ties_away_from_zero)
{
    float x[32] = {2.5f, -2.5f, 0.5f, 124.5f, 127.0f};
    struct bp_block_q8_0 blk;
    bp_type_get_traits(BP_TYPE_Q8_0)->from_float(x, &blk, 32);
    ck_assert_float_eq(bp_fp16_to_fp32(blk.d), 1.0f);
    ck_assert_int_eq(blk.qs[0], 3);
    ck_assert_int_eq(blk.qs[1], -3);
    ck_assert_int_eq(blk.qs[2], 1);
    ck_assert_int_eq(blk.qs[3], 125);
    ck_assert_int_eq(blk.qs[4], 127);
    ck_assert_int_eq(blk.qs[5], 0);
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
    enum { N = 256 }; /* a whole block of every type */
    float x[N], im[N], aligned[N], odd[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i % 11) * 0.37f - 1.5f;
        im[i] = (float)(i % 7) + 0.5f;
    }
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        const struct bp_type_traits *tr = bp_type_get_traits((enum bp_type)t);
        const size_t bytes = bp_row_size((enum bp_type)t, N);
        ck_assert_uint_gt(bytes, 0);
        _Alignas(64) unsigned char a[N * 4 + 64], b[N * 4 + 64], c[N * 4 + 64];
        ck_assert_uint_eq(bp_quantize_rows((enum bp_type)t, x, c, 1, N, im), bytes);
        tr->from_float(x, a, N);
        for (int off = 1; off < 4; off++) {
            ck_assert_uint_eq(bp_quantize_rows((enum bp_type)t, x, b + off, 1, N, im), bytes);
            ck_assert_mem_eq(b + off, c, bytes);
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

/* ---- Dequantizers on hand-built blocks ------------------------------------------------------
 *
 * Each block is random bytes with its scales set to powers of two, so every value is exact
 * and the expectation below (element i of a block, read from byte offsets per ggml's layout
 * description, in double) must equal the dequantizer's output bit for bit. The expectations
 * are written element by element, not in the dequantizers' loop order. */

static const int iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

static double h_at(const uint8_t *b, int off)
{
    return half_value((uint16_t)(b[off] | (b[off + 1] << 8)));
}

static void put_h(uint8_t *b, int off, uint16_t h)
{
    b[off] = (uint8_t)(h & 0xff);
    b[off + 1] = (uint8_t)(h >> 8);
}

/* The 4-bit value of element i (0..31) of a 16-byte Q4_0-style nibble array. */
static int nib32(const uint8_t *qs, int i)
{
    return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
}

/* Q2_K/Q3_K: 2 bits of element i (0..255): bytes 32 per 128 elements, shift 2 per 32. */
static int two_bits(const uint8_t *qs, int i)
{
    const int r = i % 128;
    return (qs[32 * (i / 128) + r % 32] >> (2 * (r / 32))) & 3;
}

/* Q4_K/Q5_K: low 4 bits of element i (0..255): 32 bytes per 64 elements, low nibble first. */
static int k_nibble(const uint8_t *qs, int i)
{
    const uint8_t byte = qs[32 * (i / 64) + i % 32];
    return i % 64 < 32 ? byte & 15 : byte >> 4;
}

/* Q4_K/Q5_K: 6-bit scale (want_min 0) or minimum (1) of sub-block j (0..7). */
static int k_scale(const uint8_t *s, int j, int want_min)
{
    if (j < 4)
        return s[j + 4 * want_min] & 63;
    const int low = want_min ? s[j + 4] >> 4 : s[j + 4] & 15;
    const int high = s[j - 4 + 4 * want_min] >> 6;
    return low | (high << 4);
}

static double expect_elem(enum bp_type t, const uint8_t *b, int i)
{
    switch (t) {
    case BP_TYPE_Q4_1: return h_at(b, 0) * nib32(b + 4, i) + h_at(b, 2);
    case BP_TYPE_Q5_0:
    case BP_TYPE_Q5_1: {
        const int one = t == BP_TYPE_Q5_1;
        const uint32_t qh = (uint32_t)b[2 + 2 * one] | (uint32_t)b[3 + 2 * one] << 8 |
                            (uint32_t)b[4 + 2 * one] << 16 | (uint32_t)b[5 + 2 * one] << 24;
        const int q = nib32(b + 6 + 2 * one, i) | (int)((qh >> i) & 1) << 4;
        return one ? h_at(b, 0) * q + h_at(b, 2) : h_at(b, 0) * (q - 16);
    }
    case BP_TYPE_Q8_1: return h_at(b, 0) * (int8_t)b[4 + i];
    case BP_TYPE_Q2_K: {
        const int sc = b[i / 16];
        return h_at(b, 80) * (sc & 15) * two_bits(b + 16, i) - h_at(b, 82) * (sc >> 4);
    }
    case BP_TYPE_Q3_K: {
        const int j = i / 16, sb = 96;
        const int low = j < 8 ? b[sb + j] & 15 : b[sb + j - 8] >> 4;
        const int sc = (low | ((b[sb + 8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
        const int hbit = (b[i % 32] >> (i / 32)) & 1;
        return h_at(b, 108) * sc * (two_bits(b + 32, i) - (hbit ? 0 : 4));
    }
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K: {
        const int five = t == BP_TYPE_Q5_K, j = i / 32;
        const int q = k_nibble(b + (five ? 48 : 16), i) +
                      (five ? ((b[16 + i % 32] >> (i / 32)) & 1) * 16 : 0);
        return h_at(b, 0) * k_scale(b + 4, j, 0) * q - h_at(b, 2) * k_scale(b + 4, j, 1);
    }
    case BP_TYPE_Q6_K: {
        const int half = i / 128, quarter = (i % 128) / 32, l = i % 32;
        const uint8_t lo = b[64 * half + l + 32 * (quarter % 2)];
        const int q = ((quarter < 2 ? lo & 15 : lo >> 4) |
                       ((b[128 + 32 * half + l] >> (2 * quarter)) & 3) << 4) - 32;
        return h_at(b, 208) * (int8_t)b[192 + i / 16] * q;
    }
    case BP_TYPE_Q8_K: {
        float d;
        memcpy(&d, b, 4);
        return d * (int8_t)b[4 + i];
    }
    case BP_TYPE_IQ4_NL: return h_at(b, 0) * iq4nl_table[nib32(b + 2, i)];
    case BP_TYPE_IQ4_XS: {
        const int ib = i / 32, sh = b[2] | b[3] << 8;
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
        return h_at(b, 0) * (ls - 32) * iq4nl_table[nib32(b + 8 + 16 * ib, i % 32)];
    }
    default: return NAN;
    }
}

/* Random bytes, then the scale fields of the layout set to exact powers of two. */
static void fill_known_block(enum bp_type t, uint8_t *b, size_t size, uint32_t seed)
{
    for (size_t k = 0; k < size; k++) {
        seed = seed * 1664525u + 1013904223u;
        b[k] = (uint8_t)(seed >> 24);
    }
    const float q8k_d = 0.125f;
    switch (t) {
    case BP_TYPE_Q4_1:
    case BP_TYPE_Q5_1: put_h(b, 0, 0x3800), put_h(b, 2, 0xbe00); break; /* 0.5, -1.5 */
    case BP_TYPE_Q5_0:
    case BP_TYPE_Q8_1:
    case BP_TYPE_IQ4_NL: put_h(b, 0, 0x4000); break;                   /* 2 */
    case BP_TYPE_Q2_K: put_h(b, 80, 0x3800), put_h(b, 82, 0x3400); break; /* 0.5, 0.25 */
    case BP_TYPE_Q3_K: put_h(b, 108, 0x2c00); break;                    /* 1/16 */
    case BP_TYPE_Q4_K:
    case BP_TYPE_Q5_K: put_h(b, 0, 0x3400), put_h(b, 2, 0x3800); break;
    case BP_TYPE_Q6_K: put_h(b, 208, 0x2c00); break;
    case BP_TYPE_Q8_K: memcpy(b, &q8k_d, 4); break;
    case BP_TYPE_IQ4_XS: put_h(b, 0, 0x3400); break;
    default: break;
    }
}

START_TEST(test_dequantize_known_blocks)
{
    static const enum bp_type types[] = {
        BP_TYPE_Q4_1, BP_TYPE_Q5_0, BP_TYPE_Q5_1, BP_TYPE_Q8_1,  BP_TYPE_Q2_K,  BP_TYPE_Q3_K,
        BP_TYPE_Q4_K, BP_TYPE_Q5_K, BP_TYPE_Q6_K, BP_TYPE_Q8_K, BP_TYPE_IQ4_NL, BP_TYPE_IQ4_XS};
    static const size_t sizes[] = {20, 22, 24, 36, 84, 110, 144, 176, 210, 292, 18, 136};
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        const struct bp_type_traits *tr = bp_type_get_traits(types[k]);
        const int n = (int)tr->block_size;
        ck_assert_uint_eq(tr->type_size, sizes[k]);
        uint8_t blocks[2 * 292];
        float y[2 * 256];
        for (int blk = 0; blk < 2; blk++)
            fill_known_block(types[k], blocks + blk * sizes[k], sizes[k], 7u + 31u * k + blk);
        tr->to_float(blocks, y, 2 * n);
        for (int blk = 0; blk < 2; blk++)
            for (int i = 0; i < n; i++) {
                const double want = expect_elem(types[k], blocks + blk * sizes[k], i);
                ck_assert_msg(y[blk * n + i] == want, "%s block %d element %d: %.9g, want %.9g",
                              tr->name, blk, i, (double)y[blk * n + i], want);
            }
    }
}
END_TEST

/* ---- Quantizers: round trips ------------------------------------------------------------- */

/* Standard normal samples (Box-Muller on the suite's generator). */
static float gauss(void)
{
    const double u1 = (rnd() + 1.0) / 2.0 + 1e-9, u2 = (rnd() + 1.0) / 2.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

enum { RT_ROWS = 16, RT_N = 1024 };

/* RMSE of a round trip of rows through type, with an optional importance matrix and, when
 * weights is not NULL, the error weighted by them instead. */
static double round_trip(enum bp_type type, const float *x, const float *imatrix,
                         const float *weights, float *y)
{
    static unsigned char q[RT_ROWS * RT_N * 2];
    const size_t row = bp_row_size(type, RT_N);
    ck_assert_uint_eq(bp_quantize_rows(type, x, q, RT_ROWS, RT_N, imatrix), RT_ROWS * row);
    bp_type_get_traits(type)->to_float(q, y, RT_ROWS * RT_N);
    double se = 0.0, sw = 0.0;
    for (int i = 0; i < RT_ROWS * RT_N; i++) {
        const double w = weights != NULL ? weights[i % RT_N] : 1.0;
        ck_assert_msg(isfinite(y[i]), "%s: element %d is %g", bp_type_name(type), i, (double)y[i]);
        se += w * (double)(y[i] - x[i]) * (double)(y[i] - x[i]);
        sw += w;
    }
    return sqrt(se / sw);
}

/* Every quantised type, with the RMSE bound (in units of the data's standard deviation, 1) it
 * must meet on Gaussian rows and on rows with 1% outliers of 8 sigma. The bounds are about 5%
 * above what the quantizers measure (docs/quantization.md lists the measurements), so a change
 * that makes the search worse fails here. */
static const struct {
    enum bp_type type;
    double gauss, outliers;
} rt_types[] = {
    {BP_TYPE_Q8_0, 0.0057, 0.0118},  {BP_TYPE_Q4_0, 0.0910, 0.185},
    {BP_TYPE_Q4_1, 0.0826, 0.132},   {BP_TYPE_Q5_0, 0.0453, 0.0932},
    {BP_TYPE_Q5_1, 0.0402, 0.0638},  {BP_TYPE_Q8_1, 0.0057, 0.0118},
    {BP_TYPE_Q2_K, 0.314, 0.492},    {BP_TYPE_Q3_K, 0.160, 0.278},
    {BP_TYPE_Q4_K, 0.0756, 0.123},   {BP_TYPE_Q5_K, 0.0382, 0.0621},
    {BP_TYPE_Q6_K, 0.0189, 0.0348},  {BP_TYPE_Q8_K, 0.0075, 0.0191},
    {BP_TYPE_IQ4_NL, 0.0810, 0.144}, {BP_TYPE_IQ4_XS, 0.0816, 0.1452},
};

static void make_rows(float *x, bool outliers)
{
    for (int i = 0; i < RT_ROWS * RT_N; i++) {
        x[i] = gauss();
        if (outliers && i % 97 == 13)
            x[i] = x[i] < 0 ? -8.0f : 8.0f;
    }
}

START_TEST(test_round_trip_rmse_bounds)
{
    static float x[RT_ROWS * RT_N], y[RT_ROWS * RT_N];
    int failed = 0;
    for (int pass = 0; pass < 2; pass++) {
        make_rows(x, pass == 1);
        for (size_t k = 0; k < sizeof(rt_types) / sizeof(rt_types[0]); k++) {
            const double rmse = round_trip(rt_types[k].type, x, NULL, NULL, y);
            const double bound = pass == 0 ? rt_types[k].gauss : rt_types[k].outliers;
            fprintf(stderr, "rmse %-7s %-8s %.5f (bound %.4f)\n", bp_type_name(rt_types[k].type),
                    pass == 0 ? "gauss" : "outliers", rmse, bound);
            failed += rmse > bound;
        }
    }
    ck_assert_msg(failed == 0, "%d round trips above their bounds (listed on stderr)", failed);
}
END_TEST

/* The types that take an importance matrix: with one, the bytes change and the error weighted
 * by it goes down; without one (or for the types that ignore it), bp_quantize_rows writes what
 * from_float writes. */
START_TEST(test_imatrix_lowers_weighted_error)
{
    static const enum bp_type types[] = {BP_TYPE_Q2_K, BP_TYPE_Q3_K,   BP_TYPE_Q4_K,
                                         BP_TYPE_Q5_K, BP_TYPE_Q6_K,   BP_TYPE_IQ4_NL,
                                         BP_TYPE_IQ4_XS, BP_TYPE_Q4_0, BP_TYPE_Q4_1,
                                         BP_TYPE_Q5_0, BP_TYPE_Q5_1};
    static float x[RT_ROWS * RT_N], y[RT_ROWS * RT_N], im[RT_N];
    static unsigned char a[RT_ROWS * RT_N * 2], b[RT_ROWS * RT_N * 2];
    make_rows(x, false);
    for (int j = 0; j < RT_N; j++) { /* a few columns matter far more than the rest */
        const float u = (rnd() + 1.0f) / 2.0f;
        im[j] = u * u * u * u * 20.0f;
    }
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        const double plain = round_trip(types[k], x, NULL, im, y);
        const double weighted = round_trip(types[k], x, im, im, y);
        fprintf(stderr, "imatrix %-7s weighted RMSE %.5f -> %.5f\n", bp_type_name(types[k]),
                plain, weighted);
        ck_assert_msg(weighted < 0.97 * plain, "%s: weighted RMSE %.5f with imatrix, %.5f "
                      "without", bp_type_name(types[k]), weighted, plain);
        const size_t bytes = RT_ROWS * bp_row_size(types[k], RT_N);
        bp_quantize_rows(types[k], x, a, RT_ROWS, RT_N, im);
        bp_type_get_traits(types[k])->from_float(x, b, RT_ROWS * RT_N);
        ck_assert(memcmp(a, b, bytes) != 0);
        bp_quantize_rows(types[k], x, a, RT_ROWS, RT_N, NULL);
        ck_assert_mem_eq(a, b, bytes);
    }
    /* Importances that are all zero say nothing: the result is that of no imatrix. */
    static float zero[RT_N];
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        const size_t bytes = RT_ROWS * bp_row_size(types[k], RT_N);
        bp_quantize_rows(types[k], x, a, RT_ROWS, RT_N, zero);
        bp_type_get_traits(types[k])->from_float(x, b, RT_ROWS * RT_N);
        ck_assert_mem_eq(a, b, bytes);
    }
    const size_t bytes = RT_ROWS * bp_row_size(BP_TYPE_Q8_0, RT_N);
    bp_quantize_rows(BP_TYPE_Q8_0, x, a, RT_ROWS, RT_N, im);
    bp_type_get_traits(BP_TYPE_Q8_0)->from_float(x, b, RT_ROWS * RT_N);
    ck_assert_mem_eq(a, b, bytes);
}
END_TEST

/* Rows that trip naive searches: all zero (exactly zero back), one huge value among small ones
 * (kept to within a few percent, the rest finite), a constant row and tiny values. */
START_TEST(test_special_rows_finite)
{
    enum { N = 512 };
    static float x[N], y[N], im[N];
    static unsigned char q[N * 2];
    for (int j = 0; j < N; j++)
        im[j] = (float)(j % 5) + 0.25f;
    for (int t = 0; t < BP_TYPE_COUNT; t++) {
        const struct bp_type_traits *tr = bp_type_get_traits((enum bp_type)t);
        if (!tr->is_quantized)
            continue;
        for (int kind = 0; kind < 4; kind++) {
            for (int j = 0; j < N; j++)
                x[j] = kind == 0 ? 0.0f : kind == 2 ? -0.75f : kind == 3 ? 1e-6f * gauss() : gauss();
            if (kind == 1)
                x[300] = 3000.0f;
            for (int w = 0; w < 2; w++) {
                ck_assert_uint_gt(bp_quantize_rows((enum bp_type)t, x, q, 1, N, w ? im : NULL), 0);
                tr->to_float(q, y, N);
                for (int j = 0; j < N; j++) {
                    ck_assert_msg(isfinite(y[j]), "%s kind %d: y[%d] = %g", tr->name, kind, j,
                                  (double)y[j]);
                    if (kind == 0)
                        ck_assert_msg(y[j] == 0.0f, "%s: zero became %g", tr->name, (double)y[j]);
                }
                if (kind == 1)
                    ck_assert_msg(fabsf(y[300] - 3000.0f) <= 150.0f, "%s: 3000 became %g",
                                  tr->name, (double)y[300]);
                if (kind == 2)
                    ck_assert_msg(fabsf(y[7] + 0.75f) <= 0.05f, "%s: -0.75 became %g", tr->name,
                                  (double)y[7]);
            }
        }
    }
}
END_TEST

START_TEST(test_quantize_rows_rejects_bad_input)
{
    float x[512] = {0}, im[256];
    unsigned char q[512];
    for (int j = 0; j < 256; j++)
        im[j] = 1.0f;
    bp_clear_error();
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, NULL, q, 1, 256, NULL), 0);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "NULL");
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, x, NULL, 1, 256, NULL), 0);
    ck_assert_error_has(BP_ERR_INVALID_ARG, "NULL");
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, x, q, 1, 128, NULL), 0);
    ck_assert_error_has(BP_ERR_SHAPE, "multiples of 256");
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, x, q, 1, 0, NULL), 0);
    ck_assert_error_has(BP_ERR_SHAPE, "0 elements");
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_IQ4_NL, x, q, 1, -32, NULL), 0);
    ck_assert_error_has(BP_ERR_SHAPE, "-32 elements");
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q2_K, x, q, -1, 256, NULL), 0);
    ck_assert_error_has(BP_ERR_SHAPE, "-1 rows");
    ck_assert_uint_eq(bp_quantize_rows((enum bp_type)99, x, q, 1, 256, NULL), 0);
    ck_assert_error_has(BP_ERR_TYPE, "99");
    static const float bad[3] = {NAN, -1.0f, INFINITY};
    for (int k = 0; k < 3; k++) {
        im[77] = bad[k];
        ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, x, q, 1, 256, im), 0);
        ck_assert_error_has(BP_ERR_INVALID_ARG, "imatrix[77]");
        ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q8_0, x, q, 1, 256, im), 0);
        ck_assert_error_has(BP_ERR_INVALID_ARG, "finite and not negative");
    }
    im[77] = 0.0f; /* zero importances are allowed: the column does not matter */
    bp_clear_error();
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, x, q, 2, 256, im), 288);
    ck_assert_int_eq(bp_last_status(), BP_OK);
    ck_assert_uint_eq(bp_quantize_rows(BP_TYPE_Q4_K, x, q, 0, 256, im), 0);
    ck_assert_int_eq(bp_last_status(), BP_OK);
}
END_TEST

/* ---- The same choices as llama.cpp ------------------------------------------------------ */

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

/* 4 rows of 1024 from a fixed generator (exact float operations only, so a script can make
 * the same rows), quantized with and without the importance (j % 7) + 0.5. The hashes are of
 * the bytes llama.cpp's ggml_quantize_chunk writes for these rows (llama-cpp-python 0.3.36's
 * ggml, measured with bench/quant-error.py's loaders): equal hashes mean the same levels and
 * scales in every block, so files we write are the files llama.cpp writes. 0: no imatrix. */
START_TEST(test_quantizers_match_llama_cpp)
{
    static const struct {
        enum bp_type type;
        uint64_t plain, weighted;
    } want[] = {
        {BP_TYPE_Q8_0, 0x6461403f23e1849eu, 0},
        {BP_TYPE_Q4_0, 0xb59ec80a734db40du, 0x2bb87b36c6f68022u},
        {BP_TYPE_Q4_1, 0xe197ab664f8d626eu, 0x9b22cda3ac2d151au},
        {BP_TYPE_Q5_0, 0x2d92c5e88b56ab1au, 0x499a120331c6a8a8u},
        {BP_TYPE_Q5_1, 0x69d5d870a7749ba3u, 0x5e82144cbea85873u},
        {BP_TYPE_Q2_K, 0x438911f69fe81b9u, 0xf112622533ea1606u},
        {BP_TYPE_Q3_K, 0xe6927a6a61c756bau, 0x449f23ae6b1401f8u},
        {BP_TYPE_Q4_K, 0x911f81cafb2934d4u, 0x20aef560f4c9e6bfu},
        {BP_TYPE_Q5_K, 0xf67dcf78baf60c06u, 0xcd37417c75be6c9eu},
        {BP_TYPE_Q6_K, 0x3aa0fd1b576b9b12u, 0x6cec517000d48692u},
        {BP_TYPE_IQ4_NL, 0x66a2c1f8fb6a5b12u, 0xed08ef0c4a66c105u},
        {BP_TYPE_IQ4_XS, 0x22467bfc72e0b88bu, 0x6bf4267c8b2f6c1au},
    };
    enum { ROWS = 4, N = 1024 };
    static float x[ROWS * N], im[N];
    static unsigned char q[ROWS * N * 2];
    uint32_t state = 2024;
    for (int i = 0; i < ROWS * N; i++) {
        state = state * 1664525u + 1013904223u;
        const float r = ((float)(state >> 8) / 16777216.0f) * 2.0f - 1.0f;
        x[i] = r * (float)(1 + (i / 256) % 4) * (i % 97 == 5 ? 6.0f : 1.0f);
    }
    for (int j = 0; j < N; j++)
        im[j] = (float)(j % 7) + 0.5f;
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++) {
        for (int w = 0; w < 2; w++) {
            const uint64_t expect = w ? want[k].weighted : want[k].plain;
            if (expect == 0)
                continue;
            const size_t bytes = bp_quantize_rows(want[k].type, x, q, ROWS, N, w ? im : NULL);
            ck_assert_uint_eq(bytes, ROWS * bp_row_size(want[k].type, N));
            ck_assert_msg(fnv1a(q, bytes) == expect, "%s%s: not the bytes llama.cpp writes",
                          bp_type_name(want[k].type), w ? " with imatrix" : "");
        }
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
    BP_TCASE(s, test_q8_0_ties_away_from_zero, 10);
    BP_TCASE(s, test_quantised_rows_error_bounds, 10);
    BP_TCASE(s, test_rows_at_any_address, 10);
    BP_TCASE(s, test_dequantize_known_blocks, 10);
    BP_TCASE(s, test_round_trip_rmse_bounds, 60);
    BP_TCASE(s, test_imatrix_lowers_weighted_error, 60);
    BP_TCASE(s, test_special_rows_finite, 60);
    BP_TCASE(s, test_quantize_rows_rejects_bad_input, 10);
    BP_TCASE(s, test_quantizers_match_llama_cpp, 30);
    return bp_test_run(s);
}
