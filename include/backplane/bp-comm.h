/* bp-comm.h - collectives between backends of one registry, as proc addresses.
 *
 * A registry that can reduce across its own devices offers three proc addresses with these
 * signatures (the CPU plugin in shared memory, the CUDA plugin through NCCL). The meta backend
 * uses them for its all-reduces and falls back to copies and ADD graphs when they are absent.
 * Each is converted to its type as bp_registry_get_proc_address (bp-backend.h) describes:
 *
 *   "bp_comm_init"       bp_comm_init_fn
 *   "bp_comm_allreduce"  bp_comm_allreduce_fn
 *   "bp_comm_free"       bp_comm_free_fn
 *
 * Across processes (the "MPI" registry of the mpi plugin; the distributed guide): the members of
 * a communicator are (rank, backend) pairs, a backend only for members on the calling rank.
 * Every rank of a communicator makes the same calls in the same order (SPMD). Such a registry
 * also offers:
 *
 *   "bp_comm_world"              bp_comm_world_fn
 *   "bp_comm_init_ranks"         bp_comm_init_ranks_fn
 *   "bp_comm_allreduce_checked"  bp_comm_allreduce_checked_fn
 *
 * and its "bp_comm_allreduce" and "bp_comm_free" take the communicators bp_comm_init_ranks
 * makes (bp_comm_allreduce is bp_comm_allreduce_checked with BP_OK).
 *
 * A registry whose devices' own library joins communicators across processes (the CUDA plugin
 * through NCCL) offers two more, which the MPI registry uses when every member is such a
 * device: the data then move device to device, only the statuses through MPI.
 *
 *   "bp_comm_unique_id"  bp_comm_unique_id_fn
 *   "bp_comm_init_rank"  bp_comm_init_rank_fn
 *
 * No call of the MPI registry waits forever: each collective gives up after the communicator's
 * timeout with BP_ERR_TIMEOUT, and the communicator then refuses further collectives (a
 * collective cannot be taken back). Ranks that pass different counts, types or member lists
 * get an error on every rank, before anything is summed. After an error, the contents of the
 * tensors passed are unspecified.
 */
#ifndef BACKPLANE_BP_COMM_H
#define BACKPLANE_BP_COMM_H

#include <backplane/bp-backend.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_comm bp_comm;

/* A communicator over n backends of the registry (one per rank, in rank order). NULL with an
 * error when a backend is not the registry's. Free with the registry's bp_comm_free. */
typedef bp_comm *(*bp_comm_init_fn)(bp_backend *const *backends, int n);
/* Sums tensors[0..n) element-wise and writes the sum into every one of them. tensors[i] lives on
 * rank i's backend; all have the same type and shape. */
typedef enum bp_status (*bp_comm_allreduce_fn)(bp_comm *comm, bp_tensor *const *tensors, int n);
typedef void (*bp_comm_free_fn)(bp_comm *comm);

/* This process's rank and the number of ranks (starting the MPI library when nobody has). */
typedef enum bp_status (*bp_comm_world_fn)(int *rank, int *n_ranks);

struct bp_comm_member {
    int rank;            /* the process holding this member */
    bp_backend *backend; /* on the calling rank: the member's backend; on another: NULL */
};
#define BP_COMM_DEFAULT_TIMEOUT 60.0 /* seconds */

/* A communicator over members[0..n) (every rank passes the same ranks in the same order, with
 * its own members' backends). Collective over the ranks named: each must call it. status is
 * the caller's state so far: a rank that failed before (its device missing, say) still calls
 * with its error, and then every rank returns NULL with BP_ERR_REMOTE naming it (the failing
 * rank keeps its own error). timeout_s: how long any collective of the communicator waits
 * (<= 0: BP_COMM_DEFAULT_TIMEOUT). NULL with an error also when a member is invalid. */
typedef bp_comm *(*bp_comm_init_ranks_fn)(const struct bp_comm_member *members, int n,
                                          enum bp_status status, double timeout_s);
#define BP_COMM_ID_MAX 256 /* bytes of the largest id bp_comm_unique_id makes */

/* An id for a communicator across processes, made on one of them and sent to the others:
 * *size in: room at id (BP_COMM_ID_MAX will do); out: its bytes. */
typedef enum bp_status (*bp_comm_unique_id_fn)(void *id, size_t *size);
/* This process's share of a communicator over n members in several processes, joined through
 * id: backends[i] for the members of this process, NULL for the others (member i is rank i of
 * the communicator). Every process of the communicator must call it at the same time; it is
 * the caller's to see that they do (the MPI registry exchanges statuses with a deadline first).
 * The registry's bp_comm_allreduce then takes NULL for the members of other processes. */
typedef bp_comm *(*bp_comm_init_rank_fn)(const void *id, size_t size, bp_backend *const *backends,
                                         int n);

/* Sums tensors[0..n) over every member and writes the sum into the members of the calling
 * rank (tensors[i]: NULL for members on other ranks). F32, F16 and BF16 (summed in F32, the
 * result rounded once), and I32 (summed as 32-bit integers, wrapping: with one nonzero
 * contribution per element this moves any bytes exactly). status: the caller's state; when it
 * is not BP_OK the caller's data are not summed and every rank returns BP_ERR_REMOTE naming the
 * first rank that failed (the failing rank its own status), so that an error on one rank
 * reaches all of them at the next collective instead of a hang. */
typedef enum bp_status (*bp_comm_allreduce_checked_fn)(bp_comm *comm, bp_tensor *const *tensors,
                                                      int n, enum bp_status status);

#ifdef __cplusplus
}
#endif

#endif
