/* bench-util.c - see bench-util.h. The hardware limits start the threads asked for on the
 * ISA-specific loops of bench-peak-*.c (bench-peak.h) and keep the best or median run. */
#include "bench-util.h"
#include "bench-peak.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <backplane/bp-plugin.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void bench_fill(bp_tensor *t, unsigned long long seed)
{
    const int64_t n0 = t->ne[0], rows = bp_nrows(t);
    const size_t row_bytes = bp_row_size(t->type, n0);
    float *row = malloc((size_t)n0 * sizeof(float));
    char *conv = malloc(row_bytes);
    unsigned long long s = seed ? seed : 88172645463325252ull;
    for (int64_t r = 0; r < rows && row != NULL && conv != NULL; r++) {
        for (int64_t i = 0; i < n0; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            row[i] = (float)(s % 2000001) / 1000000.0f - 1.0f;
        }
        bp_type_get_traits(t->type)->from_float(row, conv, n0);
        bp_tensor_set(t, conv, (size_t)r * t->nb[1], row_bytes);
    }
    free(row);
    free(conv);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char *bench_arg(int argc, char **argv, const char *key, const char *def)
{
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], key) == 0)
            return argv[i + 1];
    }
    return def;
}

bool bench_flag(int argc, char **argv, const char *key)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], key) == 0)
            return true;
    }
    return false;
}

/* ---- FMA peak ---------------------------------------------------------------------------- */

struct peak_arg {
    long iters;
    bool avx512;
    double flops;
};

static void *peak_thread(void *p)
{
    struct peak_arg *a = p;
    a->flops = a->avx512 ? bench_fma_loop_avx512(a->iters) : bench_fma_loop_avx2(a->iters);
    return NULL;
}

double bench_fma_peak(int threads)
{
    const bool avx512 = (bp_cpu_features() & BP_CPU_AVX512F) != 0;
    if (!avx512 && !(bp_cpu_features() & BP_CPU_FMA))
        return 0.0;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[64];
        struct peak_arg args[64];
        double t0 = bench_now();
        for (int i = 0; i < threads; i++) {
            args[i] = (struct peak_arg){50000000L, avx512, 0.0};
            pthread_create(&th[i], NULL, peak_thread, &args[i]);
        }
        double flops = 0.0;
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            flops += args[i].flops;
        }
        double rate = flops / (bench_now() - t0) * 1e-9;
        best = rate > best ? rate : best;
    }
    return best;
}

/* ---- Triad ------------------------------------------------------------------------------- */

struct triad_arg {
    float *a, *b, *c;
    size_t n;
};

static void *triad_thread(void *p)
{
    struct triad_arg *t = p;
    for (size_t i = 0; i < t->n; i++)
        t->a[i] = t->b[i] + 3.0f * t->c[i];
    return NULL;
}

double bench_triad(int threads)
{
    const size_t n = (size_t)64 << 20; /* 3 arrays of 256 MiB */
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)),
          *c = malloc(n * sizeof(float));
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0.0;
    }
    for (size_t i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    double times[5];
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        struct triad_arg args[64];
        size_t per = n / (size_t)threads;
        double t0 = bench_now();
        for (int i = 0; i < threads; i++) {
            args[i] = (struct triad_arg){a + i * per, b + i * per, c + i * per, per};
            pthread_create(&th[i], NULL, triad_thread, &args[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(th[i], NULL);
        times[rep] = bench_now() - t0;
    }
    double t = bench_median(times, 5);
    free(a);
    free(b);
    free(c);
    return 3.0 * (double)n * sizeof(float) / t * 1e-9;
}

/* ---- Read bandwidth of a working set ------------------------------------------------------ */

struct read_arg {
    const char *p;
    size_t n;
    int passes;
    bool avx512;
    double sink;
};

static void *read_thread(void *p)
{
    struct read_arg *a = p;
    a->sink = a->avx512 ? bench_read_loop_avx512(a->p, a->n, a->passes)
                        : bench_read_loop_avx2(a->p, a->n, a->passes);
    return NULL;
}

double bench_read(size_t bytes, int threads)
{
    const bool avx512 = (bp_cpu_features() & BP_CPU_AVX512F) != 0;
    if ((!avx512 && !(bp_cpu_features() & BP_CPU_AVX2)) || threads < 1 || threads > 64)
        return 0.0;
    const size_t per = (bytes / (size_t)threads + 255) & ~(size_t)255;
    char *buf = aligned_alloc(64, per * (size_t)threads);
    if (buf == NULL)
        return 0.0;
    memset(buf, 1, per * (size_t)threads);
    /* About 0.1 s per measurement at 50 GB/s. */
    const int passes = (int)(5e9 / (double)(per * (size_t)threads)) + 1;
    double times[7];
    for (int rep = 0; rep < 7; rep++) {
        pthread_t th[64];
        struct read_arg args[64];
        double t0 = bench_now();
        for (int i = 0; i < threads; i++) {
            args[i] = (struct read_arg){buf + (size_t)i * per, per, passes, avx512, 0.0};
            pthread_create(&th[i], NULL, read_thread, &args[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(th[i], NULL);
        times[rep] = bench_now() - t0;
    }
    free(buf);
    return (double)per * (double)threads * passes / bench_median(times, 7) * 1e-9;
}

bool bench_weight_type(const char *name, enum bp_type *type, bool *repack)
{
    char base[32];
    snprintf(base, sizeof(base), "%s", name);
    const size_t n = strlen(base);
    *repack = n > 7 && strcmp(base + n - 7, "_repack") == 0;
    if (*repack)
        base[n - 7] = '\0';
    /* Weights are filled through the runtime's quantiser (bench_fill): types without one are
     * refused. */
    return bp_type_from_name(base, type) == BP_OK && *type != BP_TYPE_I32 &&
           bp_type_get_traits(*type)->from_float != NULL;
}

void bench_load_plugins(const char *dir)
{
    if (dir[0] != '\0')
        bp_plugin_load_all_from(dir);
    else
        bp_plugin_load_all();
}

bp_buffer_type *bench_repack_buft(bp_backend *be)
{
    bp_device *dev = bp_backend_get_device(be);
    bp_cpu_repack_buffer_type_fn get = (bp_cpu_repack_buffer_type_fn)bp_registry_get_proc_address(
        bp_device_get_registry(dev), "bp_cpu_repack_buffer_type");
    return get ? get(dev) : NULL;
}

int bench_parse_list(const char *s, long *out, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < max;
         t = strtok_r(NULL, ",", &save))
        out[n++] = strtol(t, NULL, 10);
    return n;
}
