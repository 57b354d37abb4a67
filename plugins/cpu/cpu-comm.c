/* cpu-comm.c - collectives between CPU devices in shared memory (the bp_comm_* proc addresses).
 *
 * Every CPU device's memory is the same host memory, so an all-reduce is a sum over the ranks'
 * tensors written back to each of them. The work is split over the first rank's thread pool.
 * CPU backends compute synchronously, so the inputs are complete when this is called. */
#include "config.h"

#include <stdlib.h>

#include "cpu-impl.h"

struct bp_comm {
    int n;
    bp_backend *backends[64];
};

bp_comm *bp_cpu_comm_init(bp_backend *const *backends, int n)
{
    if (backends == NULL || n < 1 || n > 64) {
        bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init (CPU): need 1 to 64 backends, got %d", n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!bp_cpu_is_own_backend(backends[i])) {
            bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_init (CPU): backend %d (%s) is not a CPU "
                         "backend", i, backends[i] ? bp_backend_get_name(backends[i]) : "NULL");
            return NULL;
        }
    }
    bp_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "bp_comm_init (CPU): out of memory");
        return NULL;
    }
    c->n = n;
    for (int i = 0; i < n; i++)
        c->backends[i] = backends[i];
    return c;
}

void bp_cpu_comm_free(bp_comm *comm)
{
    free(comm);
}

struct reduce_job {
    float *data[64];
    int n;
    int64_t count;
};

static void reduce_run(void *arg, int ith, int nth)
{
    const struct reduce_job *j = arg;
    int64_t e0, e1;
    bp_cpu_split(j->count, ith, nth, &e0, &e1);
    /* Blocks of 256 keep the partial sums in cache while every rank's copy is written. */
    for (int64_t b = e0; b < e1; b += 256) {
        const int64_t end = b + 256 < e1 ? b + 256 : e1;
        float sum[256];
        for (int64_t e = b; e < end; e++)
            sum[e - b] = j->data[0][e];
        for (int r = 1; r < j->n; r++)
            for (int64_t e = b; e < end; e++)
                sum[e - b] += j->data[r][e];
        for (int r = 0; r < j->n; r++)
            for (int64_t e = b; e < end; e++)
                j->data[r][e] = sum[e - b];
    }
}

enum bp_status bp_cpu_comm_allreduce(bp_comm *comm, bp_tensor *const *tensors, int n)
{
    if (comm == NULL || tensors == NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (CPU): NULL argument");
    if (n != comm->n)
        return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (CPU): %d tensors for %d ranks",
                            n, comm->n);
    struct reduce_job job = {.n = n};
    for (int i = 0; i < n; i++) {
        const bp_tensor *t = tensors[i];
        if (t == NULL || t->data == NULL || !bp_buffer_is_host(t->buffer))
            return bp_set_error(BP_ERR_INVALID_ARG,
                                "bp_comm_allreduce (CPU): tensor %d is missing or not in host "
                                "memory", i);
        if (t->type != BP_TYPE_F32)
            return bp_set_error(BP_ERR_TYPE, "bp_comm_allreduce (CPU): tensor %d is %s; only f32 "
                                "is reduced", i, bp_type_name(t->type));
        if (!bp_is_contiguous(t))
            return bp_set_error(BP_ERR_INVALID_ARG, "bp_comm_allreduce (CPU): tensor %d is not "
                                "contiguous", i);
        if (!bp_are_same_shape(t, tensors[0]))
            return bp_set_error(BP_ERR_SHAPE, "bp_comm_allreduce (CPU): tensor %d's shape differs "
                                "from tensor 0's", i);
        job.data[i] = t->data;
    }
    job.count = bp_nelements(tensors[0]);
    if (job.count > 0)
        bp_cpu_pool_run(bp_cpu_backend_pool(comm->backends[0]), reduce_run, &job);
    return BP_OK;
}
