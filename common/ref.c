/* ref.c - private to the source tree: reference kernels for every op (see ref.h). */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *elem(const bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (const char *)t->data + i0 * (int64_t)t->nb[0] + i1 * (int64_t)t->nb[1] +
           i2 * (int64_t)t->nb[2] + i3 * (int64_t)t->nb[3];
}

double ref_get(const bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    const char *p = elem(t, i0, i1, i2, i3);
    uint16_t h;
    switch (t->type) {
    case BP_TYPE_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case BP_TYPE_F16:
        memcpy(&h, p, 2);
        return bp_fp16_to_fp32(h);
    case BP_TYPE_BF16:
        memcpy(&h, p, 2);
        return bp_bf16_to_fp32(h);
    case BP_TYPE_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default:
        abort(); /* quantised types are read by rows */
    }
}

void ref_set(bp_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v)
{
    char *p = (char *)elem(t, i0, i1, i2, i3);
    float f = (float)v;
    uint16_t h;
    switch (t->type) {
    case BP_TYPE_F32:
        memcpy(p, &f, 4);
        break;
    case BP_TYPE_F16:
        h = bp_fp32_to_fp16(f);
        memcpy(p, &h, 2);
        break;
    case BP_TYPE_BF16:
        h = bp_fp32_to_bf16(f);
        memcpy(p, &h, 2);
        break;
    case BP_TYPE_I32: {
        int32_t x = (int32_t)llrint(v);
        memcpy(p, &x, 4);
        break;
    }
    default:
        abort();
    }
}

/* Row (i1, i2, i3) of t as floats, any type. */
static void get_row(const bp_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *out)
{
    if (bp_type_get_traits(t->type)->is_quantized) {
        bp_type_get_traits(t->type)->to_float(elem(t, 0, i1, i2, i3), out, t->ne[0]);
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
        out[i0] = (float)ref_get(t, i0, i1, i2, i3);
}

static void set_row(bp_tensor *t, int64_t i1, int64_t i2, int64_t i3, const float *in)
{
    const struct bp_type_traits *tr = bp_type_get_traits(t->type);
    if (tr->is_quantized) {
        tr->from_float(in, (void *)elem(t, 0, i1, i2, i3), t->ne[0]);
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
        ref_set(t, i0, i1, i2, i3, in[i0]);
}

#define FOR_ROWS(t)                                                                            \
    for (int64_t i3 = 0; i3 < (t)->ne[3]; i3++)                                                \
        for (int64_t i2 = 0; i2 < (t)->ne[2]; i2++)                                            \
            for (int64_t i1 = 0; i1 < (t)->ne[1]; i1++)

#define FOR_ALL(t)                                                                             \
    FOR_ROWS(t)                                                                                \
    for (int64_t i0 = 0; i0 < (t)->ne[0]; i0++)

double ref_unary(enum bp_unary_op op, double x)
{
    switch (op) {
    case BP_UNARY_OP_NEG:
        return -x;
    case BP_UNARY_OP_ABS:
        return fabs(x);
    case BP_UNARY_OP_RELU:
        return x > 0 ? x : 0;
    case BP_UNARY_OP_GELU:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case BP_UNARY_OP_SILU:
        return x / (1.0 + exp(-x));
    case BP_UNARY_OP_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    case BP_UNARY_OP_TANH:
        return tanh(x);
    case BP_UNARY_OP_EXP:
        return exp(x);
    case BP_UNARY_OP_SQR:
        return x * x;
    case BP_UNARY_OP_SQRT:
        return sqrt(x);
    case BP_UNARY_OP_GELU_ERF:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    default:
        return NAN;
    }
}

/* All elements of t in logical order (i0 fastest) as floats; caller frees. */
static float *flatten(const bp_tensor *t)
{
    float *out = malloc((size_t)(bp_nelements(t) > 0 ? bp_nelements(t) : 1) * sizeof(float));
    int64_t k = 0;
    FOR_ROWS(t)
    {
        get_row(t, i1, i2, i3, out + k);
        k += t->ne[0];
    }
    return out;
}

static void unflatten(bp_tensor *t, const float *in)
{
    int64_t k = 0;
    FOR_ROWS(t)
    {
        set_row(t, i1, i2, i3, in + k);
        k += t->ne[0];
    }
}

static bool copy_op(bp_tensor *dst, const bp_tensor *src)
{
    float *flat = flatten(src);
    unflatten(dst, flat);
    free(flat);
    return true;
}

static bool binary(bp_tensor *r)
{
    const bp_tensor *a = r->src[0], *b = r->src[1];
    FOR_ALL(r)
    {
        double x = ref_get(a, i0, i1, i2, i3);
        double y = ref_get(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        double v = r->op == BP_OP_ADD ? x + y : r->op == BP_OP_SUB ? x - y
                 : r->op == BP_OP_MUL ? x * y : x / y;
        ref_set(r, i0, i1, i2, i3, v);
    }
    return true;
}

static bool mul_mat(bp_tensor *r)
{
    const bp_tensor *a = r->src[0], *b = r->src[1];
    const int64_t K = a->ne[0];
    float *arow = malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    float *brow = malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    for (int64_t i3 = 0; i3 < r->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < r->ne[2]; i2++)
            for (int64_t n = 0; n < r->ne[1]; n++) {
                get_row(b, n, i2, i3, brow);
                for (int64_t m = 0; m < r->ne[0]; m++) {
                    get_row(a, m, i2 / r2, i3 / r3, arow);
                    double sum = 0;
                    for (int64_t k = 0; k < K; k++)
                        sum += (double)arow[k] * (double)brow[k];
                    ref_set(r, m, n, i2, i3, sum);
                }
            }
    free(arow);
    free(brow);
    return true;
}

static bool row_op(bp_tensor *r)
{
    const bp_tensor *a = r->src[0];
    const int64_t n = a->ne[0];
    float eps = bp_get_op_param_f32(r, 0);
    FOR_ROWS(a)
    {
        double sum = 0, sq = 0, best = -INFINITY;
        int64_t arg = 0;
        for (int64_t i0 = 0; i0 < n; i0++) {
            double x = ref_get(a, i0, i1, i2, i3);
            sum += x;
            sq += x * x;
            if (x > best) {
                best = x;
                arg = i0;
            }
        }
        double mean = n > 0 ? sum / (double)n : 0;
        switch (r->op) {
        case BP_OP_SUM_ROWS:
            ref_set(r, 0, i1, i2, i3, sum);
            break;
        case BP_OP_MEAN:
            ref_set(r, 0, i1, i2, i3, mean);
            break;
        case BP_OP_ARGMAX:
            ref_set(r, 0, i1, i2, i3, (double)arg);
            break;
        case BP_OP_RMS_NORM: {
            double scale = 1.0 / sqrt(sq / (double)n + eps);
            for (int64_t i0 = 0; i0 < n; i0++)
                ref_set(r, i0, i1, i2, i3, ref_get(a, i0, i1, i2, i3) * scale);
            break;
        }
        case BP_OP_NORM: {
            double var = 0;
            for (int64_t i0 = 0; i0 < n; i0++) {
                double d = ref_get(a, i0, i1, i2, i3) - mean;
                var += d * d;
            }
            double scale = 1.0 / sqrt(var / (double)n + eps);
            for (int64_t i0 = 0; i0 < n; i0++)
                ref_set(r, i0, i1, i2, i3, (ref_get(a, i0, i1, i2, i3) - mean) * scale);
            break;
        }
        default:
            return false;
        }
    }
    return true;
}

static bool soft_max(bp_tensor *r)
{
    const bp_tensor *a = r->src[0], *mask = r->src[1], *sinks = r->src[2];
    const double scale = bp_get_op_param_f32(r, 0);
    const int64_t n = a->ne[0];
    double *row = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    FOR_ROWS(a)
    {
        double max = -INFINITY;
        for (int64_t i0 = 0; i0 < n; i0++) {
            double v = ref_get(a, i0, i1, i2, i3) * scale;
            if (mask)
                v += ref_get(mask, i0, i1, i2 % mask->ne[2], i3 % mask->ne[3]);
            row[i0] = v;
            max = fmax(max, v);
        }
        const double sink = sinks ? ref_get(sinks, i2, 0, 0, 0) : -INFINITY;
        max = fmax(max, sink);
        double sum = sinks && max != -INFINITY ? exp(sink - max) : 0;
        for (int64_t i0 = 0; i0 < n; i0++) {
            row[i0] = max == -INFINITY ? 0 : exp(row[i0] - max);
            sum += row[i0];
        }
        for (int64_t i0 = 0; i0 < n; i0++)
            ref_set(r, i0, i1, i2, i3, sum > 0 ? row[i0] / sum : 0);
    }
    free(row);
    return true;
}

/* Before: whether value x (index i) comes before y (index j) in the order (NaN last). */
static bool sorts_before(double x, int64_t i, double y, int64_t j, bool desc)
{
    if (isnan(x) || isnan(y))
        return isnan(x) != isnan(y) ? !isnan(x) : i < j;
    if (x != y)
        return desc ? x > y : x < y;
    return i < j;
}

/* ARGSORT and TOP_K: an insertion sort of the indices by sorts_before, the first ne0 of r. */
static bool sort_rows(bp_tensor *r)
{
    const bp_tensor *a = r->src[0];
    const bool desc = r->op == BP_OP_TOP_K || bp_get_op_param_i32(r, 0) == BP_SORT_DESC;
    int64_t *idx = malloc((size_t)(a->ne[0] > 0 ? a->ne[0] : 1) * sizeof(int64_t));
    double *val = malloc((size_t)(a->ne[0] > 0 ? a->ne[0] : 1) * sizeof(double));
    FOR_ROWS(a)
    {
        const int64_t n = a->ne[0];
        for (int64_t i = 0; i < n; i++) {
            val[i] = ref_get(a, i, i1, i2, i3);
            int64_t j = i;
            while (j > 0 && sorts_before(val[i], i, val[idx[j - 1]], idx[j - 1], desc)) {
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = i;
        }
        for (int64_t i = 0; i < r->ne[0]; i++)
            ref_set(r, i, i1, i2, i3, (double)idx[i]);
    }
    free(idx);
    free(val);
    return true;
}

static bool clamp_op(bp_tensor *r)
{
    const bp_tensor *a = r->src[0];
    const double lo = bp_get_op_param_f32(r, 0), hi = bp_get_op_param_f32(r, 1);
    FOR_ALL(r)
    {
        const double x = ref_get(a, i0, i1, i2, i3);
        ref_set(r, i0, i1, i2, i3, isnan(x) ? x : x < lo ? lo : x > hi ? hi : x);
    }
    return true;
}

static bool l2_norm(bp_tensor *r)
{
    const bp_tensor *a = r->src[0];
    const double eps = bp_get_op_param_f32(r, 0);
    FOR_ROWS(a)
    {
        double sq = 0;
        for (int64_t i0 = 0; i0 < a->ne[0]; i0++)
            sq += ref_get(a, i0, i1, i2, i3) * ref_get(a, i0, i1, i2, i3);
        const double scale = 1.0 / fmax(sqrt(sq), eps);
        for (int64_t i0 = 0; i0 < a->ne[0]; i0++)
            ref_set(r, i0, i1, i2, i3, ref_get(a, i0, i1, i2, i3) * scale);
    }
    return true;
}

/* Attention written out: every score, an exact softmax in double, then the weighted values. */
static bool flash_attn_ext(bp_tensor *r)
{
    const bp_tensor *q = r->src[0], *k = r->src[1], *v = r->src[2], *mask = r->src[3];
    const double scale = bp_get_op_param_f32(r, 0), softcap = bp_get_op_param_f32(r, 1);
    const bool causal = (bp_get_op_param_i32(r, 2) & BP_ATTN_CAUSAL) != 0;
    const int64_t D = q->ne[0], T = q->ne[1], H = q->ne[2], KV = k->ne[1], Dv = v->ne[0];
    const int64_t group = H / k->ne[2];
    double *s = malloc((size_t)(KV > 0 ? KV : 1) * sizeof(double));
    /* Keys and values by rows (any type, quantised ones too). */
    float *krow = malloc((size_t)(D > 0 ? D : 1) * sizeof(float));
    float *vrows = malloc((size_t)(KV * Dv > 0 ? KV * Dv : 1) * sizeof(float));
    for (int64_t b = 0; b < q->ne[3]; b++) {
        const int64_t kb = k->ne[3] == 1 ? 0 : b;
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < T; i++) {
                double max = -INFINITY;
                for (int64_t j = 0; j < KV; j++) {
                    double dot = 0;
                    get_row(k, j, h / group, kb, krow);
                    get_row(v, j, h / group, kb, vrows + j * Dv);
                    for (int64_t d = 0; d < D; d++)
                        dot += ref_get(q, d, i, h, b) * krow[d];
                    double x = softcap > 0 ? softcap * tanh(scale * dot / softcap) : scale * dot;
                    if (mask) { /* a masked key is out, whatever its key and value hold */
                        const double m = ref_get(mask, j, i, h % mask->ne[2], b % mask->ne[3]);
                        x = m == -INFINITY ? -INFINITY : x + m;
                    }
                    if (causal && j > KV - T + i)
                        x = -INFINITY;
                    s[j] = x;
                    max = fmax(max, x);
                }
                double sum = 0;
                for (int64_t j = 0; j < KV; j++) {
                    s[j] = max == -INFINITY ? 0 : exp(s[j] - max);
                    sum += s[j];
                }
                for (int64_t d = 0; d < Dv; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < KV; j++)
                        if (s[j] != 0)
                            acc += s[j] * vrows[j * Dv + d];
                    ref_set(r, d, h, i, b, sum > 0 ? acc / sum : 0);
                }
            }
        }
    }
    free(s);
    free(krow);
    free(vrows);
    return true;
}

/* YaRN's ramp over pair i, from the raw parameters (not the pair range the builder stored). */
static double yarn_mix(int n_dims, int n_ctx_orig, double base, double beta_fast,
                       double beta_slow, double ext, int i)
{
    if (ext == 0)
        return 0;
    const double lo = fmax(0, floor(n_dims * log(n_ctx_orig / (beta_fast * 2 * M_PI)) /
                                    (2 * log(base))));
    const double hi = fmin(n_dims - 1, ceil(n_dims * log(n_ctx_orig / (beta_slow * 2 * M_PI)) /
                                            (2 * log(base))));
    const double y = (i - lo) / fmax(0.001, hi - lo);
    return ext * (1 - fmin(1, fmax(0, y)));
}

static bool rope(bp_tensor *r)
{
    const bp_tensor *x = r->src[0], *pos = r->src[1];
    const int n_dims = bp_get_op_param_i32(r, 0), mode = bp_get_op_param_i32(r, 1);
    const double base = bp_get_op_param_f32(r, 2), fscale = bp_get_op_param_f32(r, 3);
    const double ext = bp_get_op_param_f32(r, 4), attn = bp_get_op_param_f32(r, 8);
    const double mag = ext == 0 ? bp_get_op_param_f32(r, 5) : attn * (1 + 0.1 * log(1 / fscale));
    FOR_ROWS(x)
    {
        double p = ref_get(pos, i2, 0, 0, 0);
        for (int64_t i0 = n_dims; i0 < x->ne[0]; i0++)
            ref_set(r, i0, i1, i2, i3, ref_get(x, i0, i1, i2, i3));
        for (int i = 0; i < n_dims / 2; i++) {
            const double mix = yarn_mix(n_dims, bp_get_op_param_i32(r, 11), base,
                                        bp_get_op_param_f32(r, 9), bp_get_op_param_f32(r, 10),
                                        ext, i);
            double theta = p * pow(base, -2.0 * i / n_dims) * (fscale * (1 - mix) + mix);
            int64_t j0 = mode == BP_ROPE_NEOX ? i : 2 * i;
            int64_t j1 = mode == BP_ROPE_NEOX ? i + n_dims / 2 : 2 * i + 1;
            double v0 = ref_get(x, j0, i1, i2, i3), v1 = ref_get(x, j1, i1, i2, i3);
            ref_set(r, j0, i1, i2, i3, mag * (v0 * cos(theta) - v1 * sin(theta)));
            ref_set(r, j1, i1, i2, i3, mag * (v0 * sin(theta) + v1 * cos(theta)));
        }
    }
    return true;
}

/* MUL_MAT_ID: false for an id outside [0, n_expert). */
static bool mul_mat_id(bp_tensor *r)
{
    const bp_tensor *as = r->src[0], *b = r->src[1], *ids = r->src[2];
    const int64_t K = as->ne[0];
    float *arow = malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    float *brow = malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    bool ok = true;
    for (int64_t t = 0; t < r->ne[2] && ok; t++)
        for (int64_t u = 0; u < r->ne[1] && ok; u++) {
            const int64_t e = (int64_t)ref_get(ids, u, t, 0, 0);
            if (e < 0 || e >= as->ne[2]) {
                ok = false;
                break;
            }
            get_row(b, u % b->ne[1], t, 0, brow);
            for (int64_t m = 0; m < r->ne[0]; m++) {
                get_row(as, m, e, 0, arow);
                double sum = 0;
                for (int64_t k = 0; k < K; k++)
                    sum += (double)arow[k] * (double)brow[k];
                ref_set(r, m, u, t, 0, sum);
            }
        }
    free(arow);
    free(brow);
    return ok;
}

static bool get_rows(bp_tensor *r)
{
    const bp_tensor *a = r->src[0], *ids = r->src[1];
    float *row = malloc((size_t)(a->ne[0] > 0 ? a->ne[0] : 1) * sizeof(float));
    FOR_ROWS(r)
    {
        int64_t id = (int64_t)ref_get(ids, i1, i2, i3, 0);
        if (id < 0 || id >= a->ne[1]) {
            free(row);
            return false;
        }
        get_row(a, id, i2, i3, row);
        for (int64_t i0 = 0; i0 < r->ne[0]; i0++)
            ref_set(r, i0, i1, i2, i3, row[i0]);
    }
    free(row);
    return true;
}

static bool set_rows(bp_tensor *r)
{
    const bp_tensor *src = r->src[1], *ids = r->src[2];
    float *row = malloc((size_t)(src->ne[0] > 0 ? src->ne[0] : 1) * sizeof(float));
    FOR_ROWS(src)
    {
        int64_t id = (int64_t)ref_get(ids, i1, i2 % ids->ne[1], i3 % ids->ne[2], 0);
        if (id < 0 || id >= r->ne[1]) {
            free(row);
            return false;
        }
        get_row(src, i1, i2, i3, row);
        set_row(r, id, i2, i3, row);
    }
    free(row);
    return true;
}

static bool concat(bp_tensor *r)
{
    const bp_tensor *a = r->src[0], *b = r->src[1];
    const int dim = bp_get_op_param_i32(r, 0);
    FOR_ALL(r)
    {
        int64_t i[4] = {i0, i1, i2, i3};
        const bp_tensor *s = a;
        if (i[dim] >= a->ne[dim]) {
            i[dim] -= a->ne[dim];
            s = b;
        }
        ref_set(r, i0, i1, i2, i3, ref_get(s, i[0], i[1], i[2], i[3]));
    }
    return true;
}

static bool glu(bp_tensor *r)
{
    const bp_tensor *a = r->src[0], *b = r->src[1];
    const enum bp_glu_op g = bp_get_glu_op(r);
    const enum bp_unary_op act = g == BP_GLU_OP_SWIGLU  ? BP_UNARY_OP_SILU
                                 : g == BP_GLU_OP_GEGLU ? BP_UNARY_OP_GELU
                                                        : BP_UNARY_OP_GELU_ERF;
    FOR_ALL(r)
    {
        double gate = ref_get(a, i0, i1, i2, i3);
        double up = b ? ref_get(b, i0, i1, i2, i3) : ref_get(a, i0 + r->ne[0], i1, i2, i3);
        ref_set(r, i0, i1, i2, i3, ref_unary(act, gate) * up);
    }
    return true;
}

bool ref_compute_node(bp_tensor *r)
{
    switch (r->op) {
    case BP_OP_NONE:
    case BP_OP_RESHAPE:
    case BP_OP_VIEW:
    case BP_OP_PERMUTE:
    case BP_OP_TRANSPOSE:
        return true;
    case BP_OP_DUP:
    case BP_OP_CONT:
        return copy_op(r, r->src[0]);
    case BP_OP_CPY:
        return copy_op(r, r->src[0]);
    case BP_OP_ADD:
    case BP_OP_SUB:
    case BP_OP_MUL:
    case BP_OP_DIV:
        return binary(r);
    case BP_OP_SCALE: {
        double s = bp_get_op_param_f32(r, 0);
        FOR_ALL(r) ref_set(r, i0, i1, i2, i3, ref_get(r->src[0], i0, i1, i2, i3) * s);
        return true;
    }
    case BP_OP_UNARY: {
        enum bp_unary_op op = bp_get_unary_op(r);
        FOR_ALL(r) ref_set(r, i0, i1, i2, i3, ref_unary(op, ref_get(r->src[0], i0, i1, i2, i3)));
        return true;
    }
    case BP_OP_SUM_ROWS:
    case BP_OP_MEAN:
    case BP_OP_ARGMAX:
    case BP_OP_NORM:
    case BP_OP_RMS_NORM:
        return row_op(r);
    case BP_OP_MUL_MAT:
        return mul_mat(r);
    case BP_OP_MUL_MAT_ID:
        return mul_mat_id(r);
    case BP_OP_SOFT_MAX:
        return soft_max(r);
    case BP_OP_ROPE:
        return rope(r);
    case BP_OP_GET_ROWS:
        return get_rows(r);
    case BP_OP_SET_ROWS:
        return set_rows(r);
    case BP_OP_CONCAT:
        return concat(r);
    case BP_OP_GLU:
        return glu(r);
    case BP_OP_FLASH_ATTN_EXT:
        return flash_attn_ext(r);
    case BP_OP_CLAMP:
        return clamp_op(r);
    case BP_OP_ARGSORT:
    case BP_OP_TOP_K:
        return sort_rows(r);
    case BP_OP_L2_NORM:
        return l2_norm(r);
    default:
        return false;
    }
}

bool ref_compute_graph(bp_graph *g)
{
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        if (!ref_compute_node(bp_graph_get_node(g, i)))
            return false;
    }
    return true;
}
