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

#ifdef __cplusplus
}
#endif

#endif
