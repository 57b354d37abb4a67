/* conformance.c - private to the source tree: the harness of conformance.h.
 *
 * Each case is built twice from the same builder: once in host memory, computed by the
 * reference kernels, and once in the backend's own buffer type, computed by the backend. The
 * leafs get identical bytes (copied with bp_tensor_get/set, so device memory is fine), and the
 * two results are compared after conversion to float. */
#include "conformance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

double conf_nmse(const float *x, const float *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(x[i])) {
            if (isnan(ref[i]) != isnan(x[i]))
                return INFINITY;
            continue;
        }
        if (isinf(ref[i]) || isinf(x[i])) {
            if (ref[i] != x[i])
                return INFINITY;
            continue;
        }
        double d = (double)x[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static float rng_float(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_next(s) % 1000003) / 1000003.0f;
}

/* The node that consumes leaf as source `slot`, if any. */
static const bp_tensor *consumer(bp_graph *g, const bp_tensor *leaf, int *slot)
{
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        const bp_tensor *n = bp_graph_get_node(g, i);
        for (int s = 0; s < BP_MAX_SRC; s++) {
            if (n->src[s] == leaf) {
                *slot = s;
                return n;
            }
        }
    }
    return NULL;
}

/* Fills a host-placed leaf with reproducible data suited to its role. */
static void fill_leaf(bp_graph *g, bp_tensor *t, uint64_t seed)
{
    const int64_t n = bp_nelements(t);
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    uint64_t s = seed;
    const bool positive = strncmp(t->name, "pos:", 4) == 0;
    for (int64_t i = 0; i < n; i++)
        v[i] = positive ? rng_float(&s, 0.5f, 1.5f) : rng_float(&s, -1.0f, 1.0f);

    if (strncmp(t->name, "ties:", 5) == 0) /* values in steps of 1/4: many equal */
        for (int64_t i = 0; i < n; i++)
            v[i] = roundf(v[i] * 4.0f) / 4.0f;
    if (strcmp(t->name, "mask:pad3") == 0) /* [n_kv, rows]: the last 3 keys masked everywhere */
        for (int64_t i = 0; i < n; i++)
            v[i] = i % t->ne[0] >= t->ne[0] - 3 ? -INFINITY : 0.0f;
    if (strncmp(t->name, "nan3:", 5) == 0) /* the last 3 rows NaN and inf: an unwritten cache */
        for (int64_t i = (t->ne[1] - 3) * t->ne[0]; i < t->ne[0] * t->ne[1]; i++)
            v[i] = i % 2 ? NAN : INFINITY;
    if (strcmp(t->name, "mask:causal") == 0) {
        /* [n_kv, n_rows]: row r sees columns <= r + offset; the last row sees nothing. */
        const int64_t cols = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                v[r * cols + c] = (r == rows - 1 || c > r + cols - t->ne[1]) ? -INFINITY : 0.0f;
    }
    if (t->type == BP_TYPE_I32) {
        int slot = -1;
        const bp_tensor *use = consumer(g, t, &slot);
        int32_t *ids = (int32_t *)v;
        for (int64_t i = 0; i < n; i++) {
            if (use && use->op == BP_OP_GET_ROWS)
                ids[i] = (int32_t)(rng_next(&s) % (uint64_t)use->src[0]->ne[1]);
            else if (use && use->op == BP_OP_MUL_MAT_ID) /* expert ids */
                ids[i] = (int32_t)(rng_next(&s) % (uint64_t)use->src[0]->ne[2]);
            else if (use && use->op == BP_OP_SET_ROWS) /* distinct rows: no write races */
                ids[i] = (int32_t)((i * 7 + 3) % use->src[0]->ne[1]);
            else
                ids[i] = (int32_t)(rng_next(&s) % 64);
        }
        bp_tensor_set(t, ids, 0, (size_t)n * sizeof(int32_t));
        free(v);
        return;
    }
    /* Convert row by row into the leaf's own type (it is contiguous: a fresh leaf). */
    const struct bp_type_traits *tr = bp_type_get_traits(t->type);
    const int64_t rows = n > 0 ? n / t->ne[0] : 0;
    if (tr->is_quantized) {
        /* Blocks of very different magnitudes (1/8 to 13/8), so that a kernel that applies the
         * wrong block's or row's scale is far off, not within quantisation noise. */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < t->ne[0]; k++)
                v[r * t->ne[0] + k] *= 0.125f * (float)(1 + (r * 5 + k / 32 * 3) % 13);
    }
    for (int64_t r = 0; r < rows; r++)
        tr->from_float(v + r * t->ne[0], (char *)t->data + r * (int64_t)t->nb[1], t->ne[0]);
    free(v);
}

/* The result as floats in logical order (copied out of any buffer), or NULL when the buffer
 * could not be read: then why says so, with the status and the plugin's error. Caller frees. */
static float *read_result(const bp_tensor *t, const char *name, int v, char *why, size_t why_size)
{
    const size_t bytes = bp_nbytes(t);
    char *raw = malloc(bytes ? bytes : 1);
    const enum bp_status st = bp_tensor_get(t, raw, 0, bytes);
    if (st != BP_OK) {
        snprintf(why, why_size, "%s[%d]: the plugin failed to read the tensor back (%s): %s", name,
                 v, bp_status_name(st), bp_last_error());
        free(raw);
        return NULL;
    }
    const int64_t n = bp_nelements(t);
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const char *row = raw + i1 * (int64_t)t->nb[1] + i2 * (int64_t)t->nb[2] +
                                  i3 * (int64_t)t->nb[3];
                if (t->type == BP_TYPE_I32) {
                    for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                        out[k + i0] = (float)((const int32_t *)row)[i0];
                } else {
                    bp_type_get_traits(t->type)->to_float(row, out + k, t->ne[0]);
                }
                k += t->ne[0];
            }
    free(raw);
    return out;
}

bool conf_run(bp_backend *be, const struct conf_case *c, int v, bool *unsupported, char *why,
              size_t why_size)
{
    bool ok = false;
    *unsupported = false;
    why[0] = '\0';
    bp_context *cr = bp_context_new(64), *cd = bp_context_new(64);
    bp_tensor *outr = c->build(cr, v), *outd = c->build(cd, v);
    bp_graph *gr = bp_graph_new(64), *gd = bp_graph_new(64);
    bp_buffer *br = NULL, *bd = NULL;
    float *xr = NULL, *xd = NULL;
    if (outr == NULL || outd == NULL) {
        snprintf(why, why_size, "%s[%d]: the builder failed: %s", c->name, v, bp_last_error());
        goto done;
    }
    bp_graph_build_forward(gr, outr);
    bp_graph_build_forward(gd, outd);
    for (int i = 0; i < bp_graph_get_n_nodes(gd); i++) {
        if (!bp_backend_supports_op(be, bp_graph_get_node(gd, i))) {
            *unsupported = true;
            snprintf(why, why_size, "%s[%d]: %s does not support node %d (%s)", c->name, v,
                     bp_backend_get_name(be), i, bp_op_name(bp_graph_get_node(gd, i)->op));
            goto done;
        }
    }
    br = bp_alloc_ctx_tensors(cr, bp_host_buffer_type());
    bd = bp_alloc_ctx_tensors(cd, bp_backend_get_default_buffer_type(be));
    if (br == NULL || bd == NULL) {
        snprintf(why, why_size, "%s[%d]: allocation failed: %s", c->name, v, bp_last_error());
        goto done;
    }
    for (int i = 0; i < bp_graph_get_n_leafs(gr); i++) {
        bp_tensor *lr = bp_graph_get_leaf(gr, i), *ld = bp_graph_get_leaf(gd, i);
        fill_leaf(gr, lr, 0x5eed0000u + (uint64_t)i * 7919u + (uint64_t)v * 104729u);
        size_t bytes = bp_nbytes(lr);
        void *tmp = malloc(bytes ? bytes : 1);
        bp_tensor_get(lr, tmp, 0, bytes);
        const enum bp_status st = bp_tensor_set(ld, tmp, 0, bytes);
        free(tmp);
        if (st != BP_OK) {
            snprintf(why, why_size, "%s[%d]: the plugin failed to take the inputs (%s): %s",
                     c->name, v, bp_status_name(st), bp_last_error());
            goto done;
        }
    }
    if (!ref_compute_graph(gr)) {
        snprintf(why, why_size, "%s[%d]: the reference cannot compute it", c->name, v);
        goto done;
    }
    if (bp_backend_graph_compute(be, gd) != BP_OK) {
        snprintf(why, why_size, "%s[%d]: compute failed: %s", c->name, v, bp_last_error());
        goto done;
    }
    xr = read_result(outr, c->name, v, why, why_size);
    xd = read_result(outd, c->name, v, why, why_size);
    if (xr == NULL || xd == NULL)
        goto done;
    double e = conf_nmse(xd, xr, bp_nelements(outr));
    if (!(e <= c->max_nmse)) {
        snprintf(why, why_size, "%s[%d]: NMSE %.3g exceeds %.3g (%s %s, first values %g vs %g)",
                 c->name, v, e, c->max_nmse, bp_op_name(outd->op), bp_type_name(outd->type),
                 bp_nelements(outr) ? (double)xd[0] : 0.0, bp_nelements(outr) ? (double)xr[0] : 0.0);
        goto done;
    }
    ok = true;
done:
    free(xr);
    free(xd);
    bp_buffer_free(br);
    bp_buffer_free(bd);
    bp_graph_free(gr);
    bp_graph_free(gd);
    bp_context_free(cr);
    bp_context_free(cd);
    return ok;
}

int conf_run_variants(bp_backend *be, const struct conf_case *c, char *first, size_t first_size)
{
    int failed = 0;
    first[0] = '\0';
    for (int v = 0; v < c->n_variants; v++) {
        bool unsupported;
        char why[512];
        if (!conf_run(be, c, v, &unsupported, why, sizeof(why)) && failed++ == 0)
            snprintf(first, first_size, "%s", why);
    }
    return failed;
}
