/* quantize.c - `backplane quantize`: a GGUF model written again in another weight type, or in
 * one of llama.cpp's mixes (Q4_K_M...), tensor by tensor as llama-quantize chooses them
 * (quantize-plan.c).
 *
 * The input is mapped (bp_gguf_open); every tensor that changes type is turned into floats
 * row by row (its type's to_float) and quantised with bp_quantize_rows, with the column weights
 * of an importance matrix when one is given; the others are copied as they are. The output is
 * built in host memory (one buffer the size of the output's tensor data) and written by the GGUF
 * writer, which replaces the target atomically. Metadata and the order of the tensors are kept;
 * general.file_type and general.quantization_version are set as llama-quantize sets them.
 */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <backplane/backplane.h>

#include "quantize.h"
#include "tool.h"

static const char qcmd[] = "backplane quantize";

#define TOOL_MAX_QUANT_THREADS 256

struct qopts {
    const char *in, *out, *type, *imatrix;
    bool dry_run, pure;
    int threads; /* -t: at least 1 */
};

/* text's words after `indent` spaces, in lines of at most 78 columns, then end. */
static void put_wrapped(FILE *f, const char *text, int indent, const char *end)
{
    int col = 0;
    for (const char *p = text; *p != '\0';) {
        const size_t n = strcspn(p, " ");
        if (col > indent && col + 1 + (int)n > 78) {
            fputc('\n', f);
            col = 0;
        }
        if (col == 0)
            col = fprintf(f, "%*s", indent, "");
        else
            col += fprintf(f, " ");
        col += fprintf(f, "%.*s", (int)n, p);
        p += n;
        p += strspn(p, " ");
    }
    fprintf(f, "%s\n", end);
}

static void quantize_usage(FILE *f)
{
    fprintf(f, "usage: backplane quantize [--imatrix FILE] [--pure] [-t N] IN.gguf OUT.gguf TYPE\n"
               "       backplane quantize --dry-run [--imatrix FILE] [--pure] IN.gguf\n"
               "                                    [OUT.gguf] TYPE\n"
               "\n"
               "  TYPE      one of llama.cpp's file types (case-insensitive):\n");
    put_wrapped(f, quant_ftype_names(), 12, ";");
    fprintf(f, "            a mix (Q4_K_M...) gives attn_v, ffn_down, attn_output, output and\n"
               "            tied token embeddings the types llama-quantize gives them; k-quants\n"
               "            need rows that are multiples of 256, others fall back (Q4_K to\n"
               "            Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K and Q3_K to Q4_0, IQ4_XS to\n"
               "            IQ4_NL); norms and other vectors keep their type; quantised\n"
               "            tensors are dequantised and quantised again\n"
               "  --imatrix FILE  llama.cpp's legacy importance matrix (.dat): each tensor's\n"
               "            column weights go to its quantiser\n"
               "  --pure    every weight matrix in TYPE (fallbacks only), no mix rules\n"
               "  -t N      threads quantising each tensor (default: the online CPUs); the\n"
               "            output is the same for any N\n"
               "  --dry-run print the plan (tensor, shape, type -> type, bytes; 'no quantizer'\n"
               "            where this build has none for the type) and write nothing\n");
}

/* 1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct qopts *o)
{
    const char *pos[3];
    int n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            quantize_usage(stdout);
            return 0;
        } else if (strcmp(a, "--dry-run") == 0) {
            o->dry_run = true;
        } else if (strcmp(a, "--pure") == 0) {
            o->pure = true;
        } else if (strcmp(a, "--imatrix") == 0) {
            if (i + 1 >= argc)
                return tool_no_value(qcmd, a);
            o->imatrix = argv[++i];
        } else if (strcmp(a, "-t") == 0) {
            long long n;
            if (i + 1 >= argc)
                return tool_no_value(qcmd, a);
            if (!tool_parse_int(qcmd, a, argv[++i], 1, TOOL_MAX_QUANT_THREADS, &n))
                return 2;
            o->threads = (int)n;
        } else if (a[0] == '-' && a[1] != '\0') {
            return tool_bad_arg(qcmd, a);
        } else if (n_pos == 3) {
            return tool_bad_arg(qcmd, a);
        } else {
            pos[n_pos++] = a;
        }
    }
    if (n_pos < 2 || (n_pos == 2 && !o->dry_run)) {
        fprintf(stderr, "%s: needs IN.gguf%s and TYPE\n", qcmd, o->dry_run ? "" : ", OUT.gguf");
        return 2;
    }
    o->in = pos[0];
    o->out = n_pos == 3 ? pos[1] : NULL;
    o->type = pos[n_pos - 1];
    return 1;
}

/* <arch>.<suffix> as a whole number (the first element of a per-layer array); false when the
 * file does not have it. */
static bool arch_int(const bp_gguf *g, const char *arch, const char *suffix, int64_t *v)
{
    char key[160];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    const int64_t i = bp_gguf_find_key(g, key);
    if (i < 0)
        return false;
    if (bp_gguf_get_kv_type(g, i) == BP_GGUF_TYPE_ARRAY)
        return bp_gguf_get_arr_n(g, i) > 0 && bp_gguf_get_arr_int(g, i, 0, v) == BP_OK;
    return bp_gguf_get_int(g, i, v) == BP_OK;
}

/* The model's hyperparameters the rules use; false after a message. */
static bool model_info(const bp_gguf *g, const char *path, struct quant_model *m)
{
    memset(m, 0, sizeof(*m));
    const char *arch = NULL;
    const int64_t ia = bp_gguf_find_key(g, "general.architecture");
    int64_t n_layer = 0, n_head = 0, n_head_kv = 0, n_expert = 0;
    if (ia < 0 || bp_gguf_get_str(g, ia, &arch, NULL) != BP_OK ||
        !arch_int(g, arch, "block_count", &n_layer) || n_layer < 0 || n_layer > 100000) {
        fprintf(stderr, "%s: %s does not say its architecture and layer count "
                "(general.architecture, <arch>.block_count), which the mix rules need\n", qcmd,
                tool_text(path));
        return false;
    }
    arch_int(g, arch, "attention.head_count", &n_head);
    if (!arch_int(g, arch, "attention.head_count_kv", &n_head_kv))
        n_head_kv = n_head;
    arch_int(g, arch, "expert_count", &n_expert);
    m->falcon = strcmp(arch, "falcon") == 0;
    m->n_layer = (int)n_layer;
    m->n_gqa = n_head_kv > 0 ? (int)(n_head / n_head_kv) : 0;
    m->n_expert = n_expert > 0 && n_expert < 1 << 20 ? (int)n_expert : 0;
    m->is_70b = strcmp(arch, "llama") == 0 && n_layer == 80 && n_head != n_head_kv;
    return true;
}

/* Whether bp_quantize_rows has a quantiser for t: one block of zeros through it. */
static bool has_quantizer(enum bp_type t)
{
    static signed char known[BP_TYPE_COUNT]; /* 0 unknown, 1 yes, -1 no */
    if (known[t] == 0) {
        float zeros[BP_QK_K] = {0};
        unsigned char out[512];
        known[t] = bp_quantize_rows(t, zeros, out, 1, bp_type_block_size(t), NULL) > 0 ? 1 : -1;
    }
    return known[t] > 0;
}

static size_t tensor_bytes(enum bp_type t, const int64_t ne[4])
{
    return bp_row_size(t, ne[0]) * (size_t)(ne[1] * ne[2] * ne[3]);
}

/* The tensors of the file into items (names owned by g); false after a message. */
static bool collect(const bp_gguf *g, struct quant_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct bp_gguf_tensor info;
        const enum bp_status st = bp_gguf_get_tensor(g, (int64_t)i, &info);
        if (st != BP_OK && st != BP_ERR_UNSUPPORTED) {
            fprintf(stderr, "%s: %s\n", qcmd, tool_text(bp_last_error()));
            return false;
        }
        items[i] = (struct quant_item){.name = info.name, .from = info.type,
                                       .supported = info.supported};
        memcpy(items[i].ne, info.ne, sizeof(items[i].ne));
    }
    return true;
}

/* What the plan cannot do: an input type backplane does not have, an importance matrix entry
 * of the wrong width. false after a message. */
static bool check_plan(const bp_gguf *g, const struct quant_item *items, size_t n,
                       const struct quant_imatrix *im)
{
    for (size_t i = 0; i < n; i++) {
        const struct quant_item *it = &items[i];
        if (!it->supported) {
            struct bp_gguf_tensor info;
            bp_gguf_get_tensor(g, (int64_t)i, &info);
            fprintf(stderr, "%s: tensor '%s' has type %s, which backplane cannot read\n", qcmd,
                    tool_text(it->name), info.type_name);
            return false;
        }
        const struct quant_imatrix_entry *e = im ? quant_imatrix_find(im, it->name) : NULL;
        /* As llama-quantize: token_embd is never multiplied, a width that does not match is
         * ignored there. */
        if (e != NULL && it->quantize && e->n != it->ne[0] * it->ne[2] &&
            strcmp(it->name, "token_embd.weight") != 0) {
            fprintf(stderr, "%s: the imatrix has %lld values for tensor '%s', whose rows have "
                    "%lld elements (x %lld experts)\n", qcmd, (long long)e->n,
                    tool_text(it->name), (long long)it->ne[0], (long long)it->ne[2]);
            return false;
        }
    }
    return true;
}

static void print_plan(const struct qopts *o, const struct quant_ftype *ft,
                       const struct quant_item *items, size_t n, const bp_gguf *g)
{
    const int64_t n_kv = bp_gguf_get_n_kv(g), ik = bp_gguf_find_key(g, "general.file_type");
    int64_t v = 0;
    char in_ftype[32] = "none";
    if (ik >= 0 && bp_gguf_get_int(g, ik, &v) == BP_OK)
        snprintf(in_ftype, sizeof(in_ftype), "%lld", (long long)v);
    size_t before = 0, after = 0;
    bool missing[BP_TYPE_COUNT] = {false};
    for (size_t i = 0; i < n; i++) {
        const struct quant_item *it = &items[i];
        char shape[96];
        int dims = 4, len = 0;
        while (dims > 2 && it->ne[dims - 1] == 1)
            dims--;
        for (int d = 0; d < dims; d++)
            len += snprintf(shape + len, sizeof(shape) - (size_t)len, "%s%lld", d ? "x" : "",
                            (long long)it->ne[d]);
        const size_t b = tensor_bytes(it->to, it->ne);
        before += tensor_bytes(it->from, it->ne);
        after += b;
        const bool none = it->to != it->from && !has_quantizer(it->to);
        missing[it->to] |= none;
        printf("%-36s %-16s %-6s -> %-6s %12zu%s%s%s\n", it->name, shape, bp_type_name(it->from),
               bp_type_name(it->to), b, it->wanted != it->to ? "  fallback from " : "",
               it->wanted != it->to ? bp_type_name(it->wanted) : "", none ? "  no quantizer" : "");
    }
    printf("plan: %s%s (general.file_type %d), %zu tensors, %lld keys, %zu -> %zu bytes; "
           "input general.file_type %s\n", ft->name, o->pure ? " pure" : "", ft->ftype, n,
           (long long)n_kv, before, after, in_ftype);
    printf("no quantizer:");
    for (int t = 0; t < BP_TYPE_COUNT; t++)
        if (missing[t])
            printf(" %s", bp_type_name((enum bp_type)t));
    printf("\n");
}

/* Whether every type the plan converts to has a quantiser, before any work is done; false after
 * the library's sentence for the first that has none. */
static bool quantizers_present(const struct quant_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (items[i].to == items[i].from || has_quantizer(items[i].to))
            continue;
        float zeros[BP_QK_K] = {0};
        unsigned char out[512];
        bp_quantize_rows(items[i].to, zeros, out, 1, bp_type_block_size(items[i].to), NULL);
        fprintf(stderr, "%s: tensor '%s': %s\n", qcmd, tool_text(items[i].name),
                tool_text(bp_last_error()));
        return false;
    }
    return true;
}

/* One tensor's conversion, shared by its threads: chunks of CHUNK rows (within one expert's
 * matrix) taken in turn from next. */
enum { CHUNK = 64 };
struct convert_job {
    const struct quant_item *it;
    const void *src;
    bp_tensor *dst;
    const struct quant_imatrix_entry *e;
    int64_t n_chunks, per_slice;
    atomic_llong next;
    atomic_bool failed;
    pthread_mutex_t lock;
    char err[512]; /* the first failure's sentence */
};

/* Chunk k of the job: dequantised into f (CHUNK rows), quantised into dst. */
static bool convert_chunk(struct convert_job *j, int64_t k, float *f)
{
    const struct quant_item *it = j->it;
    const int64_t ne0 = it->ne[0], rows = it->ne[1], s = k / j->per_slice;
    const int64_t r = k % j->per_slice * CHUNK, nr = rows - r < CHUNK ? rows - r : CHUNK;
    const size_t in_row = bp_row_size(it->from, ne0), out_row = bp_row_size(it->to, ne0);
    const size_t first = (size_t)(s * rows + r);
    const struct quant_imatrix_entry *e = j->e;
    /* An expert's columns have their own weights: the matrix holds ne0 x ne2 of them. */
    const float *w = e != NULL && e->n == ne0 * it->ne[2] ? e->values + (s % it->ne[2]) * ne0
                     : e != NULL && e->n == ne0          ? e->values
                                                         : NULL;
    for (int64_t q = 0; q < nr; q++)
        bp_type_get_traits(it->from)->to_float((const char *)j->src + (first + (size_t)q) * in_row,
                                               f + q * ne0, ne0);
    return bp_quantize_rows(it->to, f, (char *)j->dst->data + first * out_row, nr, ne0, w) > 0;
}

static void *convert_worker(void *arg)
{
    struct convert_job *j = arg;
    float *f = malloc((size_t)j->it->ne[0] * CHUNK * sizeof(float));
    const char *why = f == NULL ? "out of memory" : NULL;
    while (why == NULL && !atomic_load(&j->failed)) {
        const int64_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n_chunks)
            break;
        if (!convert_chunk(j, k, f))
            why = bp_last_error(); /* (the library's error is per thread) */
    }
    if (why != NULL) {
        pthread_mutex_lock(&j->lock);
        if (!atomic_exchange(&j->failed, true))
            snprintf(j->err, sizeof(j->err), "%s", why);
        pthread_mutex_unlock(&j->lock);
    }
    free(f);
    return NULL;
}

/* Tensor it from src (its bytes in the input) into dst, allocated in host memory in its new
 * type, on up to n_threads threads; false after a message. */
static bool convert(const struct quant_item *it, const void *src, bp_tensor *dst,
                    const struct quant_imatrix_entry *e, int n_threads)
{
    if (it->to == it->from) {
        memcpy(dst->data, src, tensor_bytes(it->to, it->ne));
        return true;
    }
    struct convert_job j = {.it = it, .src = src, .dst = dst, .e = e,
                            .per_slice = (it->ne[1] + CHUNK - 1) / CHUNK};
    j.n_chunks = j.per_slice * it->ne[2] * it->ne[3];
    atomic_init(&j.next, 0);
    atomic_init(&j.failed, false);
    pthread_mutex_init(&j.lock, NULL);
    pthread_t th[TOOL_MAX_QUANT_THREADS];
    int started = 0;
    for (; started < n_threads - 1 && started < j.n_chunks - 1; started++)
        if (pthread_create(&th[started], NULL, convert_worker, &j) != 0)
            break; /* (fewer threads do the same work) */
    convert_worker(&j);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.lock);
    if (atomic_load(&j.failed))
        fprintf(stderr, "%s: tensor '%s': %s\n", qcmd, tool_text(it->name), tool_text(j.err));
    return !atomic_load(&j.failed);
}

/* The metadata of g, with the file type of ft, into w. */
static bool copy_metadata(bp_gguf_writer *w, const bp_gguf *g, const struct quant_ftype *ft)
{
    for (int64_t k = 0; k < bp_gguf_get_n_kv(g); k++)
        if (bp_gguf_writer_copy_kv(w, g, k) != BP_OK)
            return false;
    return bp_gguf_writer_set_u32(w, "general.quantization_version", 2) == BP_OK &&
           bp_gguf_writer_set_u32(w, "general.file_type", (uint32_t)ft->ftype) == BP_OK;
}

/* The tensors of the plan in host memory, then the file; false after a message. */
static bool write_output(const struct qopts *o, const struct quant_ftype *ft, const bp_gguf *g,
                         const struct quant_item *items, size_t n, const struct quant_imatrix *im)
{
    bp_context *ctx = bp_context_new(n ? n : 1);
    bp_gguf_writer *w = bp_gguf_writer_new();
    bp_buffer *buf = NULL;
    bool ok = ctx != NULL && w != NULL && copy_metadata(w, g, ft);
    for (size_t i = 0; i < n && ok; i++)
        ok = bp_new_tensor(ctx, items[i].to, 4, items[i].ne) != NULL;
    if (ok)
        ok = (buf = bp_alloc_ctx_tensors(ctx, bp_host_buffer_type())) != NULL || n == 0;
    if (!ok)
        fprintf(stderr, "%s: %s\n", qcmd, tool_text(bp_last_error()));
    size_t before = 0, after = 0;
    for (size_t i = 0; i < n && ok; i++) {
        const struct quant_item *it = &items[i];
        struct bp_gguf_tensor info;
        bp_gguf_get_tensor(g, (int64_t)i, &info);
        bp_tensor *t = bp_context_get_tensor(ctx, i);
        fprintf(stderr, "[%4zu/%4zu] %-36s %-6s -> %s\n", i + 1, n, tool_text(it->name),
                bp_type_name(it->from), bp_type_name(it->to));
        ok = convert(it, info.data, t, im && it->quantize ? quant_imatrix_find(im, it->name) : NULL,
                     o->threads);
        if (ok && bp_gguf_writer_add_tensor(w, it->name, t) != BP_OK) {
            fprintf(stderr, "%s: %s\n", qcmd, tool_text(bp_last_error()));
            ok = false;
        }
        before += info.size;
        after += bp_nbytes(t);
    }
    if (ok && bp_gguf_writer_write(w, o->out) != BP_OK) {
        fprintf(stderr, "%s: %s\n", qcmd, tool_text(bp_last_error()));
        ok = false;
    }
    if (ok)
        printf("%s: %zu tensors, %s, %.2f MiB -> %.2f MiB\n", o->out, n, ft->name,
               (double)before / (1 << 20), (double)after / (1 << 20));
    bp_gguf_writer_free(w);
    bp_buffer_free(buf);
    bp_context_free(ctx);
    return ok;
}

int cmd_quantize(int argc, char **argv)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    struct qopts o = {.threads = cpus < 1 ? 1 : cpus > TOOL_MAX_QUANT_THREADS ? TOOL_MAX_QUANT_THREADS : (int)cpus};
    const int st = parse_args(argc, argv, &o);
    if (st != 1)
        return st;
    const struct quant_ftype *ft = quant_ftype_find(o.type);
    if (ft == NULL) {
        fprintf(stderr, "%s: unknown type '%s'; types: %s\n", qcmd, tool_text(o.type),
                quant_ftype_names());
        return 2;
    }
    struct quant_imatrix im = {0};
    struct quant_item *items = NULL;
    struct quant_model m;
    int rc = 1;
    bp_gguf *g = NULL;
    if (o.imatrix != NULL && !quant_imatrix_load(o.imatrix, &im))
        goto done;
    if ((g = bp_gguf_open(o.in)) == NULL) {
        fprintf(stderr, "%s: %s\n", qcmd, tool_text(bp_last_error()));
        goto done;
    }
    const size_t n = (size_t)bp_gguf_get_n_tensors(g);
    if ((items = calloc(n ? n : 1, sizeof(*items))) == NULL) {
        fprintf(stderr, "%s: out of memory\n", qcmd);
        goto done;
    }
    if (!collect(g, items, n) || !model_info(g, o.in, &m) ||
        !quant_plan(ft, &m, items, n, o.pure, o.imatrix != NULL) ||
        !check_plan(g, items, n, o.imatrix ? &im : NULL))
        goto done;
    if (!o.dry_run && !quantizers_present(items, n))
        goto done;
    if (o.dry_run) {
        print_plan(&o, ft, items, n, g);
        rc = 0;
    } else {
        rc = write_output(&o, ft, g, items, n, o.imatrix ? &im : NULL) ? 0 : 1;
    }
done:
    free(items);
    bp_gguf_close(g);
    quant_imatrix_free(&im);
    return rc;
}
