/* cpu-impl.h - private to plugins/cpu: what the CPU plugin's files share. */
#ifndef BP_CPU_IMPL_H
#define BP_CPU_IMPL_H

#include <backplane/bp-plugin.h>

#include <stdatomic.h>

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
/* Runs job on every thread and returns when all have finished. */
void bp_cpu_pool_run(struct bp_cpu_pool *pool, bp_cpu_job_fn job, void *arg);
/* Inside a job: waits until every thread of the pool has reached this point. */
void bp_cpu_pool_barrier(struct bp_cpu_pool *pool);

/* ---- Kernels (cpu-ops.c, cpu-matmul.c) ------------------------------------------------- */

/* What a kernel gets: its node, which thread it is, and scratch memory of its own. */
struct bp_cpu_params {
    int ith;
    int nth;
    void *wdata;      /* this thread's scratch, wsize_thread bytes */
    void *wshared;    /* scratch shared by all threads of the node, wsize_shared bytes */
    struct bp_cpu_pool *pool;
};

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

void bp_cpu_mul_mat(bp_tensor *dst, const struct bp_cpu_params *p);
bool bp_cpu_mul_mat_supported(const bp_tensor *dst);
void bp_cpu_mul_mat_work_size(const bp_tensor *dst, int nth, size_t *per_thread, size_t *shared);

/* Rows of float from any type (contiguous row of src, n elements), vectorised (cpu-convert.c). */
void bp_cpu_to_float(enum bp_type type, const void *src, float *dst, int64_t n);
/* n floats to a row of type (the runtime's conversions, bit for bit; F16 with F16C). */
void bp_cpu_from_float(enum bp_type type, const float *src, void *dst, int64_t n);

#if defined(__F16C__)
#include <immintrin.h>
#endif

BP_CPU_INLINE float bp_cpu_half_to_float(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return bp_fp16_to_fp32(h);
#endif
}

/* ---- Devices and collectives (cpu-plugin.c, cpu-comm.c) ---------------------------------- */

#include <backplane/bp-comm.h>

/* Whether be is a backend of this plugin's devices. */
bool bp_cpu_is_own_backend(bp_backend *be);
struct bp_cpu_pool *bp_cpu_backend_pool(bp_backend *be);
bp_comm *bp_cpu_comm_init(bp_backend *const *backends, int n);
enum bp_status bp_cpu_comm_allreduce(bp_comm *comm, bp_tensor *const *tensors, int n);
void bp_cpu_comm_free(bp_comm *comm);

/* sum_k x[k] * y[k], with the widest vectors this variant may use (cpu-matmul.c). */
float bp_cpu_dot_f32(const float *x, const float *y, int64_t n);
/* "x86_64", "avx2", "avx512" or "generic": what this build was compiled for (cpu-plugin.c). */
const char *bp_cpu_variant_name(void);

#endif
