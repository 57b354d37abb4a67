/* fuzz-graph.c - libFuzzer target: random graphs built through the public op builders from the
 * input bytes (leaf shapes and types, then a sequence of ops on earlier tensors), computed
 * through the scheduler over the test accelerator (a partial op set, so graphs get split) and
 * the CPU, and compared with the reference implementation of common/ref.c. A builder may refuse
 * (that is its job); a crash, a leak, an error without a message or a wrong result is a finding
 * (abort). Built and run by tests/fuzz/run.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>

#include "../../common/ref.h"

#define MAX_T 24

struct input {
    const uint8_t *p;
    size_t n;
};

static unsigned take(struct input *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static bp_backend *backends[2];
static long n_compared, n_ill; /* for the progress line: how much is really checked */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *cpu = getenv("BP_FUZZ_CPU_DIR"), *accel = getenv("BP_FUZZ_ACCEL_DIR");
    if (cpu == NULL || accel == NULL) {
        fprintf(stderr, "fuzz-graph: set BP_FUZZ_CPU_DIR and BP_FUZZ_ACCEL_DIR\n");
        abort();
    }
    bp_log_set_level(BP_LOG_NONE);
    bp_plugin_load_all_from(cpu);
    bp_plugin_load_all_from(accel);
    backends[0] = bp_backend_init_by_name("ACCEL0", NULL);
    backends[1] = bp_backend_init_by_name("CPU", "threads=1");
    if (backends[0] == NULL || backends[1] == NULL) {
        fprintf(stderr, "fuzz-graph: %s\n", bp_last_error());
        abort();
    }
    return 0;
}

/* The graph and where the scheduler put each node, for a report. */
static void dump(bp_graph *g, bp_sched *s, const float *xd, const float *xr, int64_t n,
                 bp_graph *gr)
{
    for (int i = 0; i < bp_graph_get_n_leafs(gr); i++)
        fprintf(stderr, "  leaf %d: %s, first value %g\n", i,
                bp_type_name(bp_graph_get_leaf(gr, i)->type), ref_get(bp_graph_get_leaf(gr, i), 0, 0, 0, 0));
    for (int i = 0; i < bp_graph_get_n_nodes(gr); i++) {
        const bp_tensor *t = bp_graph_get_node(gr, i);
        fprintf(stderr, "  reference node %d: %s op_params[0] %d (%g), first value %g\n", i,
                bp_op_name(t->op), t->op_params[0], bp_get_op_param_f32(t, 0),
                ref_get(t, 0, 0, 0, 0));
    }
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        const bp_tensor *t = bp_graph_get_node(g, i);
        bp_backend *be = bp_sched_get_tensor_backend(s, t);
        fprintf(stderr, "  node %d: %s %s [%lld %lld %lld %lld] nb [%zu %zu %zu %zu] on %s, srcs",
                i, bp_op_name(t->op), bp_type_name(t->type), (long long)t->ne[0],
                (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], t->nb[0], t->nb[1],
                t->nb[2], t->nb[3], be ? bp_backend_get_name(be) : "?");
        for (int k = 0; k < BP_MAX_SRC && t->src[k]; k++)
            fprintf(stderr, " %s[%lld %lld %lld %lld]", bp_op_name(t->src[k]->op),
                    (long long)t->src[k]->ne[0], (long long)t->src[k]->ne[1],
                    (long long)t->src[k]->ne[2], (long long)t->src[k]->ne[3]);
        fprintf(stderr, "\n");
    }
    for (int64_t i = 0; i < n && i < 16; i++)
        fprintf(stderr, "  out[%lld]: %g scheduled, %g reference\n", (long long)i, xd[i], xr[i]);
}

/* The same graph, from the same bytes, every time: leafs in lctx, ops in octx. */
static bp_tensor *build(const uint8_t *data, size_t size, bp_context *lctx, bp_context *octx)
{
    struct input in = {data, size};
    bp_tensor *t[MAX_T];
    int n = 0;
    const int n_leafs = 1 + (int)(take(&in) % 3);
    for (int i = 0; i < n_leafs; i++) {
        int64_t ne[4] = {1 + take(&in) % 7, 1 + take(&in) % 5, 1 + take(&in) % 3,
                         1 + take(&in) % 2};
        enum bp_type type = take(&in) % 4 == 0 ? BP_TYPE_F16 : BP_TYPE_F32;
        t[n] = bp_new_tensor_4d(lctx, type, ne[0], ne[1], ne[2], ne[3]);
        if (t[n] == NULL)
            return NULL;
        bp_set_input(t[n]);
        n++;
    }
    for (int k = 0; k < 10 && in.n > 0 && n < MAX_T; k++) {
        const unsigned op = take(&in) % 14;
        bp_tensor *a = t[take(&in) % n], *b = t[take(&in) % n], *r = NULL;
        switch (op) {
        case 0: r = bp_add(octx, a, b); break;
        case 1: r = bp_sub(octx, a, b); break;
        case 2: r = bp_mul(octx, a, b); break;
        case 3: r = bp_scale(octx, a, (float)((int)take(&in) - 128) / 32.0f); break;
        case 4: {
            /* no EXP/SQRT: overflow and negative roots make the comparison meaningless */
            static const enum bp_unary_op ops[] = {BP_UNARY_OP_NEG, BP_UNARY_OP_ABS,
                                                   BP_UNARY_OP_RELU, BP_UNARY_OP_GELU,
                                                   BP_UNARY_OP_SILU, BP_UNARY_OP_SIGMOID,
                                                   BP_UNARY_OP_TANH, BP_UNARY_OP_SQR};
            r = bp_unary(octx, a, ops[take(&in) % 8]);
            break;
        }
        case 5: r = bp_rms_norm(octx, a, 1e-3f); break;
        case 6: r = bp_norm(octx, a, 1e-3f); break;
        case 7: r = bp_soft_max(octx, a); break;
        case 8: r = bp_mul_mat(octx, a, b); break;
        case 9: r = bp_cont(octx, bp_transpose(octx, a)); break;
        case 10: {
            static const int perms[][4] = {{0, 2, 1, 3}, {1, 0, 2, 3}, {2, 1, 0, 3}, {0, 1, 3, 2}};
            const int *p = perms[take(&in) % 4];
            r = bp_cont(octx, bp_permute(octx, a, p[0], p[1], p[2], p[3]));
            break;
        }
        case 11: r = bp_sum_rows(octx, a); break;
        case 12: r = bp_concat(octx, a, b, (int)(take(&in) % 4)); break;
        default: r = bp_swiglu(octx, a, b); break;
        }
        if (r != NULL)
            t[n++] = r;
    }
    bp_tensor *out = t[n - 1];
    if (out->op == BP_OP_NONE) /* a leaf: give the graph something to compute */
        out = bp_scale(octx, out, 1.0f);
    if (out != NULL)
        bp_set_output(out);
    return out;
}

/* Values in [-2, 2]; with perturb, each moved by a relative 1e-5 (for the conditioning check). */
static void fill(bp_tensor *t, uint64_t seed, bool perturb)
{
    const int64_t n = bp_nelements(t);
    uint64_t p = seed ^ 0x5DEECE66Dull;
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p = p * 6364136223846793005ull + 1442695040888963407ull;
        float v = (float)((seed >> 40) % 4001) / 1000.0f - 2.0f;
        if (perturb)
            v *= 1.0f + 1e-5f * ((float)((p >> 40) % 2001) / 1000.0f - 1.0f);
        const int64_t i0 = i % t->ne[0], i1 = (i / t->ne[0]) % t->ne[1];
        const int64_t i2 = (i / (t->ne[0] * t->ne[1])) % t->ne[2];
        const int64_t i3 = i / (t->ne[0] * t->ne[1] * t->ne[2]);
        ref_set(t, i0, i1, i2, i3, v);
    }
}

static float *read_out(const bp_tensor *t)
{
    const int64_t n = bp_nelements(t);
    float *o = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    char *raw = malloc(bp_nbytes(t) + 1);
    bp_tensor_get(t, raw, 0, bp_nbytes(t));
    bp_tensor view = *t;
    view.data = raw;
    for (int64_t i = 0; i < n; i++) {
        const int64_t i0 = i % t->ne[0], i1 = (i / t->ne[0]) % t->ne[1];
        const int64_t i2 = (i / (t->ne[0] * t->ne[1])) % t->ne[2];
        const int64_t i3 = i / (t->ne[0] * t->ne[1] * t->ne[2]);
        o[i] = (float)ref_get(&view, i0, i1, i2, i3);
    }
    free(raw);
    return o;
}

static double nmse_scaled(const float *x, const float *ref, int64_t n, double scale);

/* The reference computed again from inputs moved by a relative 1e-5: when that moves the result
 * by more than an NMSE of 1e-4, the graph amplifies input errors so much (a sum of normalised
 * rows is pure cancellation, for instance) that float kernels and the double reference cannot be
 * compared; such graphs are skipped rather than reported. */
static bool ill_conditioned(const uint8_t *data, size_t size, const bp_tensor *outr)
{
    bp_context *lp = bp_context_new(MAX_T), *op = bp_context_new(4 * MAX_T);
    bp_tensor *outp = build(data, size, lp, op);
    bp_graph *gp = bp_graph_new(256);
    bp_buffer *bl = NULL, *bo = NULL;
    bool ill = true;
    if (outp != NULL && bp_graph_build_forward(gp, outp) == BP_OK &&
        (bl = bp_alloc_ctx_tensors(lp, bp_host_buffer_type())) != NULL &&
        (bo = bp_alloc_ctx_tensors(op, bp_host_buffer_type())) != NULL) {
        for (size_t i = 0; i < bp_context_get_n_tensors(lp); i++)
            fill(bp_context_get_tensor(lp, i), 1000 + i, true);
        if (ref_compute_graph(gp)) {
            float *a = read_out(outr), *b = read_out(outp);
            const double e = nmse_scaled(b, a, bp_nelements(outr), 0.0);
            ill = !(e <= 1e-4);
            free(a);
            free(b);
        }
    }
    bp_buffer_free(bl);
    bp_buffer_free(bo);
    bp_graph_free(gp);
    bp_context_free(lp);
    bp_context_free(op);
    return ill;
}

/* The largest finite magnitude among the reference graph's node values. */
static double graph_scale(bp_graph *g)
{
    double m = 0;
    for (int i = 0; i < bp_graph_get_n_nodes(g); i++) {
        const bp_tensor *t = bp_graph_get_node(g, i);
        if (t->type != BP_TYPE_F32 && t->type != BP_TYPE_F16)
            continue;
        float *v = read_out(t);
        for (int64_t k = 0; k < bp_nelements(t); k++)
            if (isfinite(v[k]) && fabs(v[k]) > m)
                m = fabs(v[k]);
        free(v);
    }
    return m;
}

/* NMSE over the finite pairs (any NaN/inf disagreement counts as infinite), with the
 * denominator at least n (1e-5 scale)^2 / 1e-5: an absolute error of 1e-5 scale per element
 * counts like a relative one of 1e-5 (scale 0: plain NMSE). */
static double nmse_scaled(const float *x, const float *ref, int64_t n, double scale)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(ref[i])) {
            if (!(isnan(x[i]) && isnan(ref[i])) && x[i] != ref[i])
                return INFINITY;
            continue;
        }
        num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    const double floor = (double)n * (1e-5 * scale) * (1e-5 * scale) / 1e-5;
    den = den > floor ? den : floor;
    return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

/* A result that disagrees with the reference: reported with the graph and, when
 * BP_FUZZ_FINDINGS is a directory, the input saved there; the run goes on (tests/fuzz/run.sh
 * counts them). Crashes, leaks and errors without a message still stop the fuzzer. */
static void report_mismatch(const uint8_t *data, size_t size)
{
    const char *dir = getenv("BP_FUZZ_FINDINGS");
    if (dir == NULL)
        abort();
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 1099511628211ull;
    char path[4096];
    snprintf(path, sizeof(path), "%s/mismatch-%016llx", dir, (unsigned long long)h);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(data, 1, size, f);
        fclose(f);
    }
    fprintf(stderr, "fuzz-graph: MISMATCH, input saved as %s\n", path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bp_context *lr = bp_context_new(MAX_T), *orr = bp_context_new(4 * MAX_T);
    bp_context *ld = bp_context_new(MAX_T), *od = bp_context_new(4 * MAX_T);
    bp_tensor *outr = build(data, size, lr, orr), *outd = build(data, size, ld, od);
    if ((outr == NULL) != (outd == NULL))
        abort(); /* the builders are not deterministic */
    bp_graph *gr = bp_graph_new(256), *gd = bp_graph_new(256);
    bp_buffer *blr = NULL, *bor = NULL, *bld = NULL;
    bp_sched *s = NULL;
    float *xr = NULL, *xd = NULL;
    if (outr == NULL || bp_graph_build_forward(gr, outr) != BP_OK ||
        bp_graph_build_forward(gd, outd) != BP_OK)
        goto done;
    blr = bp_alloc_ctx_tensors(lr, bp_host_buffer_type());
    bor = bp_alloc_ctx_tensors(orr, bp_host_buffer_type());
    bld = bp_alloc_ctx_tensors(ld, bp_host_buffer_type());
    if (blr == NULL || bor == NULL || bld == NULL)
        abort();
    for (size_t i = 0; i < bp_context_get_n_tensors(lr); i++) {
        fill(bp_context_get_tensor(lr, i), 1000 + i, false);
        fill(bp_context_get_tensor(ld, i), 1000 + i, false);
    }
    if (!ref_compute_graph(gr))
        goto done; /* an op the reference does not define for these types */
    if (ill_conditioned(data, size, outr)) {
        n_ill++;
        goto done; /* float results cannot be expected to match: nothing to compare */
    }
    s = bp_sched_new(backends, NULL, 2, 256, false);
    if (s == NULL)
        abort();
    if (bp_sched_graph_compute(s, gd) != BP_OK) {
        if (bp_last_error()[0] == '\0')
            abort(); /* an error must say what went wrong */
        goto done;
    }
    xr = read_out(outr);
    xd = read_out(outd);
    /* Well-conditioned graphs (see ill_conditioned): f32 kernels against the double reference
     * through up to ten ops agree to far better than 1e-5 relative to the result, or 1e-5
     * absolute relative to the largest value the computation went through (a sum that cancels
     * to 0 can only be that exact); a wrong kernel or a misplaced split is off by far more. */
    const double scale = graph_scale(gr);
    const double e = nmse_scaled(xd, xr, bp_nelements(outr), scale);
    if (++n_compared % 20000 == 0)
        fprintf(stderr, "fuzz-graph: %ld results compared, %ld ill-conditioned graphs skipped\n",
                n_compared, n_ill);
    if (!(e <= 1e-5)) {
        fprintf(stderr, "NMSE %g: %s %s [%lld %lld %lld %lld]\n", e,
                bp_op_name(outd->op), bp_type_name(outd->type), (long long)outd->ne[0],
                (long long)outd->ne[1], (long long)outd->ne[2], (long long)outd->ne[3]);
        dump(gd, s, xd, xr, bp_nelements(outr), gr);
        report_mismatch(data, size);
    }
done:
    free(xr);
    free(xd);
    bp_sched_free(s);
    bp_graph_free(gr);
    bp_graph_free(gd);
    bp_buffer_free(blr);
    bp_buffer_free(bor);
    bp_buffer_free(bld);
    bp_context_free(lr);
    bp_context_free(orr);
    bp_context_free(ld);
    bp_context_free(od);
    return 0;
}
