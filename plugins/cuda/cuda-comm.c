/* cuda-comm.c - collectives between CUDA backends through NCCL (the bp_comm_* proc
 * addresses), built where configure found NCCL. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

/* ---- Collectives (NCCL) ------------------------------------------------------------------------ */

#ifdef BP_HAVE_NCCL
#define COMM_MAX_MEMBERS 64

/* Members 0..n-1; backends[i] and comms[i] for the members of this process (all of them for
 * bp_comm_init's communicators; NULL for other processes' members in bp_comm_init_rank's). */
struct bp_comm {
    int n;
    ncclComm_t comms[COMM_MAX_MEMBERS];
    struct cuda_backend *backends[COMM_MAX_MEMBERS];
};

bp_comm *bp_cuda_comm_init(bp_backend *const *backends, int n)
{
    if (n < 1 || n > CUDA_MAX_DEVICES) {
        bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init takes 1 to %d backends, not %d",
                     CUDA_MAX_DEVICES, n);
        return NULL;
    }
    int devs[CUDA_MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        if (backends[i] == NULL || !bp_cuda_is_backend(backends[i])) {
            bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init: backend %d is not a CUDA "
                         "backend", i);
            return NULL;
        }
        devs[i] = ((struct cuda_backend *)bp_backend_get_context(backends[i]))->cd->id;
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i]) {
                bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init: GPU %d appears twice; NCCL "
                             "needs one backend per GPU", devs[i]);
                return NULL;
            }
    }
    bp_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA: out of memory");
        return NULL;
    }
    c->n = n;
    for (int i = 0; i < n; i++)
        c->backends[i] = bp_backend_get_context(backends[i]);
    ncclResult_t r = ncclCommInitAll(c->comms, n, devs);
    if (r != ncclSuccess) {
        bp_set_error(BP_ERR_BACKEND, "CUDA: ncclCommInitAll over %d GPUs failed: %s", n,
                     ncclGetErrorString(r));
        free(c);
        return NULL;
    }
    return c;
}

/* Sums tensors[i] (on backend i) in place, queued on each backend's stream as one NCCL group.
 * Members of other processes (no backend here) have NULL tensors. */
enum bp_status bp_cuda_comm_allreduce(bp_comm *c, bp_tensor *const *tensors, int n)
{
    if (c == NULL || n != c->n)
        return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_allreduce: %d tensors for a "
                            "communicator of %d", n, c ? c->n : 0);
    ncclDataType_t type = ncclFloat32;
    char desc[BP_TENSOR_DESC_SIZE];
    const bp_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        const bp_tensor *t = tensors[i];
        if ((t != NULL) != (c->backends[i] != NULL))
            return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_allreduce: member %d %s",
                                i, t ? "is in another process: its tensor must be NULL here"
                                     : "is in this process but has no tensor");
        if (t == NULL)
            continue;
        if (first == NULL)
            first = t;
        if (!contiguous(t) || !bp_cuda_is_tensor(t) || !bp_cuda_float_type(t->type) ||
            bp_nelements(t) != bp_nelements(first) || t->type != first->type)
            return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_allreduce: %s must be a "
                                "contiguous F32/F16/BF16 tensor in GPU memory, like the others",
                                bp_describe_tensor(t, desc, sizeof(desc)));
    }
    if (first == NULL)
        return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_allreduce: no member here");
    type = first->type == BP_TYPE_F16 ? ncclFloat16
         : first->type == BP_TYPE_BF16 ? ncclBfloat16 : ncclFloat32;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        if (tensors[i] == NULL)
            continue;
        cudaError_t e = cudaSetDevice(c->backends[i]->cd->id);
        if (e != cudaSuccess) {
            (void)ncclGroupEnd();
            return bp_cuda_fail(e, c->backends[i]->cd->name, "cudaSetDevice for the all-reduce");
        }
        r = ncclAllReduce(tensors[i]->data, tensors[i]->data, (size_t)bp_nelements(tensors[i]),
                          type, ncclSum, c->comms[i], c->backends[i]->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    return r == ncclSuccess ? BP_OK
                            : bp_set_error(BP_ERR_BACKEND, "CUDA: ncclAllReduce failed: %s",
                                           ncclGetErrorString(r));
}

void bp_cuda_comm_free(bp_comm *c)
{
    if (c == NULL)
        return;
    /* An all-reduce may still be queued on the backends' streams: let it finish before its
     * communicators go. Errors cannot be returned from here; they are logged. */
    for (int i = 0; i < c->n; i++) {
        if (c->backends[i] == NULL)
            continue; /* a member of another process */
        cudaError_t e = cudaSetDevice(c->backends[i]->cd->id);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(c->backends[i]->stream);
        if (e != cudaSuccess) {
            bp_log(BP_LOG_WARN, "CUDA: %s: waiting for the stream before freeing its "
                   "communicator failed: %s", c->backends[i]->cd->name, cudaGetErrorString(e));
            (void)cudaGetLastError();
        }
        ncclCommDestroy(c->comms[i]);
    }
    free(c);
}

enum bp_status bp_cuda_comm_unique_id(void *id, size_t *size)
{
    if (id == NULL || size == NULL || *size < sizeof(ncclUniqueId))
        return bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_unique_id needs %zu bytes of room",
                            sizeof(ncclUniqueId));
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return bp_set_error(BP_ERR_BACKEND, "CUDA: ncclGetUniqueId failed: %s",
                            ncclGetErrorString(r));
    memcpy(id, &u, sizeof(u));
    *size = sizeof(u);
    return BP_OK;
}

/* This process's members of an NCCL communicator over n members in several processes: one
 * ncclCommInitRank per local member (its NCCL rank is its member index), in one group. */
bp_comm *bp_cuda_comm_init_rank(const void *id, size_t size, bp_backend *const *backends, int n)
{
    if (id == NULL || size != sizeof(ncclUniqueId) || backends == NULL || n < 1 ||
        n > COMM_MAX_MEMBERS) {
        bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init_rank: an NCCL id of %zu bytes and "
                     "1 to %d members, not %zu bytes and %d", sizeof(ncclUniqueId),
                     COMM_MAX_MEMBERS, size, n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (backends[i] != NULL && !bp_cuda_is_backend(backends[i])) {
            bp_set_error(BP_ERR_INVALID_ARG, "CUDA: bp_comm_init_rank: backend %d is not a CUDA "
                         "backend", i);
            return NULL;
        }
    bp_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        bp_set_error(BP_ERR_OUT_OF_MEMORY, "CUDA: out of memory");
        return NULL;
    }
    c->n = n;
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        if (backends[i] == NULL)
            continue;
        c->backends[i] = bp_backend_get_context(backends[i]);
        cudaError_t e = cudaSetDevice(c->backends[i]->cd->id);
        if (e != cudaSuccess) {
            (void)ncclGroupEnd();
            bp_cuda_fail(e, c->backends[i]->cd->name, "cudaSetDevice for ncclCommInitRank");
            free(c);
            return NULL;
        }
        r = ncclCommInitRank(&c->comms[i], n, u, i);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess) {
        bp_set_error(BP_ERR_BACKEND, "CUDA: ncclCommInitRank over %d members failed: %s", n,
                     ncclGetErrorString(r));
        free(c);
        return NULL;
    }
    return c;
}
#endif
