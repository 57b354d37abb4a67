/* quants-k.c - the quantizers that search for their scales: the k-quants (Q2_K to Q6_K),
 * IQ4_NL and IQ4_XS, and the importance-weighted forms of Q4_0, Q4_1, Q5_0 and Q5_1.
 *
 * A block's quality is decided by its scale (and minimum), not by the rounding of each value,
 * so every quantizer here tries a range of scales around the obvious one (largest value to
 * largest level), solves the weighted least-squares scale for the levels each gives, and keeps
 * the best. The super-block scales of the k-quants are then quantized the same way. These are
 * the searches of llama.cpp's ggml-quants.c, step for step and in the same float operations,
 * so that on the same data they pick the same levels and files interchange with llama.cpp:
 *
 *   fit_symmetric  x ~ d * (L - nmax), weights given or x^2   (ggml's make_qx_quants)
 *   fit_q3         the same, then coordinate descent on L     (make_q3_quants)
 *   fit_affine     x ~ d * L + m with m <= 0                  (make_qkx2/qkx3_quants)
 *   fit_positive   x ~ d * L, x >= 0, for the super-blocks    (make_qp_quants)
 *   iq4_fit        x ~ d * table[L]                           (quantize_row_iq4_nl_impl)
 *
 * Without an importance matrix each type weighs its errors as llama.cpp's reference does (by
 * |x|, x^2 or the mean magnitude plus |x|); with one, element j weighs imatrix[j] * sqrt(sigma2
 * + x_j^2), sigma2 the mean square of the super-block (of the whole row for Q4_0..Q5_1), except
 * Q6_K, which weighs by imatrix[j] alone, as llama.cpp does.
 *
 * Blocks are built in a local struct and copied out, so dst may be at any address. */
#include "config.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "bp-impl.h"
#include "quants.h"

/* Blocks whose largest magnitude is below this are all zero. */
#define GROUP_EPS 1e-15f

/* Round to nearest, ties to even, by the float-addition trick ggml uses (the same result as
 * lrintf in the default rounding mode, without depending on it). Out-of-range values saturate
 * and NaN gives 0, so corrupt input never reaches an undefined conversion. */
static int nearest_int(float v)
{
    if (!(fabsf(v) <= 4194303.0f))
        return v > 0.0f ? 4194303 : v < 0.0f ? -4194303 : 0;
    const float f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

static int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static float sum_squares(const float *x, int n)
{
    float s = 0.0f;
    for (int j = 0; j < n; j++)
        s += x[j] * x[j];
    return s;
}

/* The element of largest magnitude, with its sign. */
static float signed_max(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

/* imatrix[j] * sqrt(sigma2 + x_j^2): important columns count more, and small values do not
 * vanish from the fit. */
static void importance_weights(const float *x, const float *qw, float sigma2, int n, float *w)
{
    for (int j = 0; j < n; j++)
        w[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
}

/* ---- Scale searches ----------------------------------------------------------------------- */

static float symmetric_weight(const float *x, const float *qw, int i)
{
    return qw != NULL ? qw[i] : x[i] * x[i];
}

/* Levels L in 0..2*nmax-1 for x ~ d * (L - nmax), minimizing the error weighted by qw (x^2
 * when NULL). Tries the 19 inverse scales -(nmax + 0.1 * is) / max, is = -9..9; returns d. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L, const float *qw)
{
    const float max = signed_max(x, n);
    if (fabsf(max) < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max, sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = symmetric_weight(x, qw, i);
        L[i] = (int8_t)(l + nmax);
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = symmetric_weight(x, qw, i);
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's search without an importance matrix: start from the largest value and move single
 * levels while the x^2-weighted fit improves (at most 5 passes). L in 0..2*nmax-1. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
    const float max = signed_max(x, n);
    if (fabsf(max) < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        L[i] = (int8_t)l;
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0.0f))
                continue;
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            const int nl = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == L[i])
                continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (changed == 0)
            break;
    }
    for (int i = 0; i < n; i++)
        L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The search of an affine fit x ~ scale * L + min (min <= 0, L in 0..nmax): the inverse scales
 * (rmin + rdelta * is + nmax) / (max - min) for is = 0..nstep, each followed by the weighted
 * least-squares scale and minimum of the levels it gives. */
struct affine_search {
    float rmin, rdelta;
    int nstep;
    bool use_mad; /* weigh absolute errors rather than squared ones */
};

static float affine_error(int n, const float *x, const float *w, const uint8_t *L, float scale,
                          float min, bool use_mad)
{
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        err += w[i] * diff;
    }
    return err;
}

/* Returns the scale and stores -min (>= 0) in *neg_min. */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L,
                        float *neg_min, const struct affine_search *s)
{
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        min = x[i] < min ? x[i] : min;
        max = x[i] > max ? x[i] : max;
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    min = min > 0.0f ? 0.0f : min;
    if (!(max > min)) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1.0f / iscale;
    for (int i = 0; i < n; i++)
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
    float best = affine_error(n, x, w, L, scale, min, s->use_mad);
    uint8_t aux[32];
    for (int is = 0; is <= s->nstep; is++) {
        iscale = (s->rmin + s->rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const float v = iscale * (x[i] - min);
            const int l = v > 0.0f ? nearest_int(v < (float)nmax ? v : (float)nmax) : 0;
            aux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0.0f))
            continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        const float err = affine_error(n, x, w, aux, this_scale, this_min, s->use_mad);
        if (err < best) {
            memcpy(L, aux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *neg_min = -min;
    return scale;
}

static float positive_error(int n, int nmax, const float *x, const float *qw, float iscale,
                            bool clamp)
{
    const float scale = 1.0f / iscale;
    float mse = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = clamp && l > nmax ? nmax : l;
        const float diff = x[i] - scale * (float)l;
        mse += qw[i] * diff * diff;
    }
    return mse;
}

/* The super-block scale of non-negative sub-block scales or minimums x, levels L in 0..nmax,
 * weighted by qw: 9 inverse scales, then coordinate descent as in fit_q3. */
static float fit_positive(int n, int nmax, const float *x, uint8_t *L, const float *qw)
{
    float max = 0.0f;
    for (int i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    if (max < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    float best = positive_error(n, nmax, x, qw, iscale, false);
    for (int is = -4; is <= 4; is++) {
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max;
        const float mse = is != 0 ? positive_error(n, nmax, x, qw, iscale_is, true) : best;
        if (mse < best) {
            best = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = (uint8_t)(l > nmax ? nmax : l);
        sumlx += qw[i] * x[i] * (float)L[i];
        suml2 += qw[i] * (float)L[i] * (float)L[i];
    }
    for (int itry = 0; itry < 5; itry++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = qw[i];
            float slx = sumlx - w * x[i] * (float)L[i], sl2 = suml2 - w * (float)L[i] * (float)L[i];
            if (!(slx > 0.0f && sl2 > 0.0f))
                continue;
            int nl = nearest_int(x[i] * sl2 / slx);
            nl = nl > nmax ? nmax : nl;
            if (nl == L[i])
                continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (uint8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (changed == 0)
            break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ---- Q2_K ------------------------------------------------------------------------------------ */

/* Levels from the stored (half-precision) scales: x ~ d * L - m for each group of g values. */
static void requantize_affine(const float *x, int groups, int g, int nmax, const float *d,
                              const float *m, uint8_t *L)
{
    for (int j = 0; j < groups; j++) {
        if (d[j] == 0.0f)
            continue;
        for (int i = 0; i < g; i++)
            L[g * j + i] = (uint8_t)clamp_int(nearest_int((x[g * j + i] + m[j]) / d[j]), 0, nmax);
    }
}

/* Four 2-bit levels per byte: byte l of each 32 holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < BP_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* 4-bit codes of non-negative values by their maximum: returns the step, max / 15. */
static float code_by_max(const float *v, int n, int shift, uint8_t *codes)
{
    float max = 0.0f;
    for (int j = 0; j < n; j++)
        max = v[j] > max ? v[j] : max;
    if (!(max > 0.0f))
        return 0.0f;
    const float iscale = 15.0f / max;
    for (int j = 0; j < n; j++)
        codes[j] |= (uint8_t)((unsigned)nearest_int(iscale * v[j]) << shift);
    return max / 15.0f;
}

static void q2_k_block(const float *x, const float *qw, struct bp_block_q2_k *y)
{
    static const struct affine_search plain = {-0.5f, 0.1f, 15, true};
    static const struct affine_search weighted = {-0.9f, 0.05f, 36, false};
    uint8_t L[BP_QK_K], Ls[16], Lm[16];
    float scales[16], mins[16], sw[16] = {0}, w[16], d[16], m[16];
    const float sigma2 = sum_squares(x, BP_QK_K) / BP_QK_K;
    for (int j = 0; j < 16; j++) {
        if (qw != NULL) {
            importance_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w);
            for (int l = 0; l < 16; l++)
                sw[j] += w[l];
        } else {
            for (int l = 0; l < 16; l++)
                w[l] = fabsf(x[16 * j + l]);
        }
        scales[j] = fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j],
                               qw != NULL ? &weighted : &plain);
    }
    memset(y->scales, 0, sizeof(y->scales));
    float dm, mm;
    if (qw != NULL) {
        dm = fit_positive(16, 15, scales, Ls, sw);
        mm = fit_positive(16, 15, mins, Lm, sw);
        for (int j = 0; j < 16; j++)
            y->scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    } else {
        dm = code_by_max(scales, 16, 0, y->scales);
        mm = code_by_max(mins, 16, 4, y->scales);
    }
    y->d = bp_fp32_to_fp16(dm);
    y->dmin = bp_fp32_to_fp16(mm);
    for (int j = 0; j < 16; j++) {
        d[j] = bp_fp16_to_fp32(y->d) * (float)(y->scales[j] & 0xf);
        m[j] = bp_fp16_to_fp32(y->dmin) * (float)(y->scales[j] >> 4);
    }
    requantize_affine(x, 16, 16, 3, d, m, L);
    pack_2bit(L, y->qs);
}

/* ---- Q3_K ------------------------------------------------------------------------------------ */

/* Sixteen 6-bit codes (0..63) into Q3_K's 12 bytes: low nibbles in 0..7, top 2 bits in 8..11. */
static void pack_q3_scales(const int *l, uint8_t *packed)
{
    memset(packed, 0, 12);
    for (int j = 0; j < 16; j++) {
        if (j < 8)
            packed[j] = (uint8_t)(l[j] & 0xf);
        else
            packed[j - 8] |= (uint8_t)((l[j] & 0xf) << 4);
        packed[j % 4 + 8] |= (uint8_t)((l[j] >> 4) << (2 * (j / 4)));
    }
}

/* Levels -4..3 from the stored scales, the high bit into hmask, the low two into qs. */
static void q3_k_finish(const float *x, int8_t *L, struct bp_block_q3_k *y)
{
    int8_t sc[16];
    bp__q3_k_scales(y->scales, sc);
    for (int j = 0; j < 16; j++) {
        const float d = bp_fp16_to_fp32(y->d) * (float)sc[j];
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
    }
    uint8_t U[BP_QK_K];
    memset(y->hmask, 0, sizeof(y->hmask));
    for (int j = 0; j < BP_QK_K; j++) { /* element j: hmask byte j % 32, bit j / 32 */
        U[j] = (uint8_t)L[j];
        if (U[j] > 3) {
            y->hmask[j % 32] |= (uint8_t)(1 << (j / 32));
            U[j] = (uint8_t)(U[j] - 4);
        }
    }
    pack_2bit(U, y->qs);
}

static void q3_k_block(const float *x, const float *qw, struct bp_block_q3_k *y)
{
    int8_t L[BP_QK_K], Ls[16];
    float scales[16], sw[16], w[16];
    int codes[16];
    if (qw != NULL) {
        const float sigma2 = 2.0f * sum_squares(x, BP_QK_K) / BP_QK_K;
        for (int j = 0; j < 16; j++) {
            importance_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w);
            sw[j] = 0.0f;
            for (int l = 0; l < 16; l++)
                sw[j] += w[l];
            scales[j] = fit_symmetric(16, 4, x + 16 * j, L + 16 * j, w);
        }
        y->d = bp_fp32_to_fp16(fit_symmetric(16, 32, scales, Ls, sw));
        for (int j = 0; j < 16; j++)
            codes[j] = Ls[j];
    } else {
        float max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            max_scale = fabsf(scales[j]) > fabsf(max_scale) ? scales[j] : max_scale;
        }
        const float iscale = max_scale != 0.0f ? -32.0f / max_scale : 0.0f;
        for (int j = 0; j < 16; j++)
            codes[j] = max_scale != 0.0f ?
                clamp_int((int8_t)nearest_int(iscale * scales[j]), -32, 31) + 32 : 0;
        y->d = bp_fp32_to_fp16(max_scale != 0.0f ? 1.0f / iscale : 0.0f);
    }
    pack_q3_scales(codes, y->scales);
    q3_k_finish(x, L, y);
}

/* ---- Q4_K and Q5_K --------------------------------------------------------------------------- */

/* Eight 6-bit scales and minimums into the 12 bytes bp__k4_scale_min reads. */
static void pack_k4_scales(const uint8_t *ls, const uint8_t *lm, uint8_t *q)
{
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (uint8_t)((ls[j] & 0xf) | ((lm[j] & 0xf) << 4));
            q[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            q[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* The eight 32-value fits of a Q4_K/Q5_K super-block (nmax 15 or 31), their scales and
 * minimums packed into scales[12], *d and *dmin, and the levels L from the stored values. */
static void k4_block(const float *x, const float *qw, int nmax, uint8_t *packed, uint16_t *hd,
                     uint16_t *hdmin, uint8_t *L)
{
    const struct affine_search plain = {nmax == 15 ? -1.0f : -0.5f, 0.1f, nmax == 15 ? 20 : 15,
                                        false};
    static const struct affine_search weighted = {-0.9f, 0.05f, 36, false};
    float scales[8], mins[8], sw[8], w[32], d[8], m[8];
    uint8_t ls[8], lm[8];
    const float sigma2 = 2.0f * sum_squares(x, BP_QK_K) / BP_QK_K;
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        if (qw != NULL) {
            importance_weights(xb, qw + 32 * j, sigma2, 32, w);
        } else {
            const float av_x = sqrtf(sum_squares(xb, 32) / 32);
            for (int l = 0; l < 32; l++)
                w[l] = av_x + fabsf(xb[l]);
        }
        sw[j] = 0.0f;
        for (int l = 0; l < 32; l++)
            sw[j] += w[l];
        scales[j] = fit_affine(32, nmax, xb, w, L + 32 * j, &mins[j],
                               qw != NULL ? &weighted : &plain);
    }
    float dd, dm;
    if (qw != NULL) {
        dd = fit_positive(8, 63, scales, ls, sw);
        dm = fit_positive(8, 63, mins, lm, sw);
    } else {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            max_scale = scales[j] > max_scale ? scales[j] : max_scale;
            max_min = mins[j] > max_min ? mins[j] : max_min;
        }
        const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
        const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
        for (int j = 0; j < 8; j++) { /* a byte, as ggml stores it, then at most 63 */
            ls[j] = (uint8_t)nearest_int(inv_scale * scales[j]);
            lm[j] = (uint8_t)nearest_int(inv_min * mins[j]);
            ls[j] = ls[j] > 63 ? 63 : ls[j];
            lm[j] = lm[j] > 63 ? 63 : lm[j];
        }
        dd = max_scale / 63.0f;
        dm = max_min / 63.0f;
    }
    pack_k4_scales(ls, lm, packed);
    *hd = bp_fp32_to_fp16(dd);
    *hdmin = bp_fp32_to_fp16(dm);
    for (int j = 0; j < 8; j++) {
        uint8_t s, mm;
        bp__k4_scale_min(j, packed, &s, &mm);
        d[j] = bp_fp16_to_fp32(*hd) * (float)s;
        m[j] = bp_fp16_to_fp32(*hdmin) * (float)mm;
    }
    requantize_affine(x, 8, 32, nmax, d, m, L);
}

static void q4_k_block(const float *x, const float *qw, struct bp_block_q4_k *y)
{
    uint8_t L[BP_QK_K];
    k4_block(x, qw, 15, y->scales, &y->d, &y->dmin, L);
    for (int j = 0; j < BP_QK_K; j += 64)
        for (int l = 0; l < 32; l++)
            y->qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void q5_k_block(const float *x, const float *qw, struct bp_block_q5_k *y)
{
    uint8_t L[BP_QK_K];
    k4_block(x, qw, 31, y->scales, &y->d, &y->dmin, L);
    memset(y->qh, 0, sizeof(y->qh));
    for (int n = 0, g = 0; n < BP_QK_K; n += 64, g++) { /* 64 values: qh bits 2g and 2g+1 */
        for (int j = 0; j < 32; j++) {
            const int l1 = L[n + j], l2 = L[n + j + 32];
            y->qh[j] |= (uint8_t)(((l1 >> 4) << (2 * g)) | ((l2 >> 4) << (2 * g + 1)));
            y->qs[n / 2 + j] = (uint8_t)((l1 & 0xf) | ((l2 & 0xf) << 4));
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------------------------ */

static void q6_k_block(const float *x, const float *qw, struct bp_block_q6_k *y)
{
    int8_t L[BP_QK_K];
    float scales[16], max_scale = 0.0f;
    for (int ib = 0; ib < 16; ib++) {
        scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib,
                                   qw != NULL ? qw + 16 * ib : NULL);
        max_scale = fabsf(scales[ib]) > fabsf(max_scale) ? scales[ib] : max_scale;
    }
    memset(y, 0, sizeof(*y));
    if (fabsf(max_scale) < GROUP_EPS)
        return;
    const float iscale = -128.0f / max_scale;
    y->d = bp_fp32_to_fp16(1.0f / iscale);
    for (int ib = 0; ib < 16; ib++) {
        const int s = nearest_int(iscale * scales[ib]);
        y->scales[ib] = (int8_t)(s > 127 ? 127 : s);
    }
    for (int j = 0; j < 16; j++) {
        const float d = bp_fp16_to_fp32(y->d) * (float)y->scales[j];
        if (d == 0.0f)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    for (int j = 0, o = 0; j < BP_QK_K; j += 128, o += 64) { /* ql: 64 bytes, qh: 32 per 128 */
        for (int l = 0; l < 32; l++) {
            const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
            y->ql[o + l] = (uint8_t)((q1 & 0xf) | ((q3 & 0xf) << 4));
            y->ql[o + l + 32] = (uint8_t)((q2 & 0xf) | ((q4 & 0xf) << 4));
            y->qh[o / 2 + l] =
                (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
    }
}

/* ---- IQ4_NL and IQ4_XS ----------------------------------------------------------------------- */

/* The index of the table value nearest x (ties to the larger), by bisection on the midpoints,
 * exact in float since the midpoints are halves of integers. NaN gives 0. */
static int iq4_index(float x)
{
    const float x2 = x + x;
    int idx = 0;
    for (int step = 8; step > 0; step >>= 1) {
        const int j = idx + step;
        idx = x2 >= (float)(bp__iq4nl_values[j - 1] + bp__iq4nl_values[j]) ? j : idx;
    }
    return idx;
}

/* Weighted sums of the fit of xb to table[index(id * xb)]; the indices into Lb when not NULL. */
static void iq4_sums(const float *xb, const float *w, float id, uint8_t *Lb, float *sumqx,
                     float *sumq2)
{
    *sumqx = *sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
        const int l = iq4_index(id * xb[j]);
        const float q = (float)bp__iq4nl_values[l];
        if (Lb != NULL)
            Lb[j] = (uint8_t)l;
        *sumqx += w[j] * q * xb[j];
        *sumq2 += w[j] * q * q;
    }
}

/* The scale of 32 values on the non-linear table: the largest value on the table's largest
 * magnitude (-127), then 15 inverse scales (itry + table[0]) / max, itry = -7..7. */
static float iq4_fit(const float *xb, const float *w, uint8_t *Lb)
{
    const float max = signed_max(xb, 32);
    if (fabsf(max) < GROUP_EPS) {
        memset(Lb, 0, 32);
        return 0.0f;
    }
    const float v0 = (float)bp__iq4nl_values[0];
    float sumqx, sumq2;
    iq4_sums(xb, w, 1.0f / (-max / v0), Lb, &sumqx, &sumq2);
    float d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -7; itry <= 7; itry++) {
        iq4_sums(xb, w, ((float)itry + v0) / max, NULL, &sumqx, &sumq2);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

static void iq4_weights(const float *xb, const float *qw, float sigma2, float *w)
{
    if (qw != NULL) {
        importance_weights(xb, qw, sigma2, 32, w);
    } else {
        for (int j = 0; j < 32; j++)
            w[j] = xb[j] * xb[j];
    }
}

static void pack_nibbles(const uint8_t *L, int n, uint8_t *qs)
{
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++)
            qs[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void iq4_nl_block(const float *x, const float *qw, struct bp_block_iq4_nl *y)
{
    uint8_t L[32];
    float w[32];
    iq4_weights(x, qw, 2.0f * sum_squares(x, 32) / 32, w);
    const float d = iq4_fit(x, w, L);
    y->d = bp_fp32_to_fp16(d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f; /* the levels for the exact scale found */
    for (int j = 0; j < 32; j++)
        L[j] = (uint8_t)iq4_index(id * x[j]);
    pack_nibbles(L, 32, y->qs);
}

static void iq4_xs_block(const float *x, const float *qw, struct bp_block_iq4_xs *y)
{
    uint8_t L[BP_QK_K];
    float scales[8], w[32], max_scale = 0.0f;
    const float sigma2 = 2.0f * sum_squares(x, BP_QK_K) / BP_QK_K;
    for (int ib = 0; ib < 8; ib++) {
        iq4_weights(x + 32 * ib, qw != NULL ? qw + 32 * ib : NULL, sigma2, w);
        scales[ib] = iq4_fit(x + 32 * ib, w, L + 32 * ib);
        max_scale = fabsf(scales[ib]) > fabsf(max_scale) ? scales[ib] : max_scale;
    }
    /* The 6-bit scales (offset 32) of the super-block scale -max/32, and the levels again for
     * the scale each sub-block ends up with. */
    const float d = -max_scale / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = bp_fp32_to_fp16(d);
    y->scales_h = 0;
    memset(y->scales_l, 0, sizeof(y->scales_l));
    for (int ib = 0; ib < 8; ib++) {
        const int l = clamp_int(nearest_int(id * scales[ib]), -32, 31);
        const float dl = d * (float)l, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
        for (int j = 0; j < 32; j++)
            L[32 * ib + j] = (uint8_t)iq4_index(idl * x[32 * ib + j]);
        y->scales_l[ib / 2] |= (uint8_t)(((l + 32) & 0xf) << (4 * (ib % 2)));
        y->scales_h |= (uint16_t)(((l + 32) >> 4) << (2 * ib));
    }
    pack_nibbles(L, BP_QK_K, y->qs);
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1 with an importance matrix ---------------------------------------- */

/* Bit 4 of each 5-bit level into qh (element j at bit j), the low 4 bits into qs as Q4_0's. */
static void pack_5bit(const uint8_t *L, uint8_t *qs, uint8_t *qh_bytes)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0xf) | ((L[j + 16] & 0xf) << 4));
        qh |= (uint32_t)(L[j] >> 4) << j;
        qh |= (uint32_t)(L[j + 16] >> 4) << (j + 16);
    }
    memcpy(qh_bytes, &qh, sizeof(qh));
}

/* One block of 32 of Q4_0 (bits 4) or Q5_0 (bits 5): symmetric, offset 2^(bits-1). */
static void legacy_symmetric_block(const float *x, const float *w, int bits, void *dst)
{
    int8_t L[32];
    const float d = fit_symmetric(32, 1 << (bits - 1), x, L, w);
    if (bits == 4) {
        struct bp_block_q4_0 y;
        y.d = bp_fp32_to_fp16(d);
        pack_nibbles((const uint8_t *)L, 32, y.qs);
        memcpy(dst, &y, sizeof(y));
    } else {
        struct bp_block_q5_0 y;
        y.d = bp_fp32_to_fp16(d);
        pack_5bit((const uint8_t *)L, y.qs, y.qh);
        memcpy(dst, &y, sizeof(y));
    }
}

/* One block of 32 of Q4_1 (bits 4) or Q5_1 (bits 5): x ~ d * L + m. */
static void legacy_affine_block(const float *x, const float *w, int bits, void *dst)
{
    static const struct affine_search search = {-0.9f, 0.05f, 36, false};
    uint8_t L[32];
    float neg_min;
    const float d = fit_affine(32, (1 << bits) - 1, x, w, L, &neg_min, &search);
    if (bits == 4) {
        struct bp_block_q4_1 y;
        y.d = bp_fp32_to_fp16(d);
        y.m = bp_fp32_to_fp16(-neg_min);
        pack_nibbles(L, 32, y.qs);
        memcpy(dst, &y, sizeof(y));
    } else {
        struct bp_block_q5_1 y;
        y.d = bp_fp32_to_fp16(d);
        y.m = bp_fp32_to_fp16(-neg_min);
        pack_5bit(L, y.qs, y.qh);
        memcpy(dst, &y, sizeof(y));
    }
}

/* ---- Entry points ---------------------------------------------------------------------------- */

/* The importances of one block, or NULL when there are none or all are zero: a block that
 * matters nowhere is quantized as without an importance matrix rather than to zeros. */
static const float *block_importance(const float *imatrix, int64_t offset, int n)
{
    if (imatrix == NULL)
        return NULL;
    for (int j = 0; j < n; j++)
        if (imatrix[offset + j] != 0.0f)
            return imatrix + offset;
    return NULL;
}

/* Runs block() on each super-block of 256, building it in aligned storage and copying it out. */
#define K_ROW(name, btype)                                                                       \
    void bp__##name##_quantize(const float *src, void *dst, int64_t n, const float *imatrix)     \
    {                                                                                            \
        unsigned char *b = dst;                                                                  \
        for (int64_t i = 0; i < n / BP_QK_K; i++, b += sizeof(struct btype)) {                  \
            struct btype y;                                                                      \
            name##_block(src + i * BP_QK_K, block_importance(imatrix, i * BP_QK_K, BP_QK_K),  \
                         &y);                                                                    \
            memcpy(b, &y, sizeof(y));                                                            \
        }                                                                                        \
    }                                                                                            \
    void bp__##name##_from_float(const float *src, void *dst, int64_t n)                         \
    {                                                                                            \
        bp__##name##_quantize(src, dst, n, NULL);                                                \
    }

K_ROW(q2_k, bp_block_q2_k)
K_ROW(q3_k, bp_block_q3_k)
K_ROW(q4_k, bp_block_q4_k)
K_ROW(q5_k, bp_block_q5_k)
K_ROW(q6_k, bp_block_q6_k)
K_ROW(iq4_xs, bp_block_iq4_xs)

void bp__iq4_nl_quantize(const float *src, void *dst, int64_t n, const float *imatrix)
{
    unsigned char *b = dst;
    for (int64_t i = 0; i < n / BP_QK4_NL; i++, b += sizeof(struct bp_block_iq4_nl)) {
        struct bp_block_iq4_nl y;
        iq4_nl_block(src + i * BP_QK4_NL, block_importance(imatrix, i * BP_QK4_NL, 32), &y);
        memcpy(b, &y, sizeof(y));
    }
}

void bp__iq4_nl_from_float(const float *src, void *dst, int64_t n)
{
    bp__iq4_nl_quantize(src, dst, n, NULL);
}

/* One row of Q4_0, Q4_1, Q5_0 or Q5_1 weighed by imatrix (not NULL); sigma2 is the mean
 * square of the whole row. A block whose importances are all zero is quantized by from_float. */
void bp__legacy_quantize(enum bp_type type, const float *src, void *dst, int64_t n,
                         const float *imatrix)
{
    const bool affine = type == BP_TYPE_Q4_1 || type == BP_TYPE_Q5_1;
    const int bits = type == BP_TYPE_Q4_0 || type == BP_TYPE_Q4_1 ? 4 : 5;
    const size_t bsize = bp_type_size(type);
    float sum = 0.0f, w[32];
    for (int64_t j = 0; j < n; j++)
        sum += src[j] * src[j];
    const float sigma2 = sum / (float)n;
    for (int64_t i = 0; i < n / 32; i++) {
        void *b = (unsigned char *)dst + (size_t)i * bsize;
        const float *qw = block_importance(imatrix, 32 * i, 32);
        if (qw == NULL) {
            bp_type_get_traits(type)->from_float(src + 32 * i, b, 32);
            continue;
        }
        importance_weights(src + 32 * i, qw, sigma2, 32, w);
        if (affine)
            legacy_affine_block(src + 32 * i, w, bits, b);
        else
            legacy_symmetric_block(src + 32 * i, w, bits, b);
    }
}
