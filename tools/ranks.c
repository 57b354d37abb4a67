/* ranks.c - backplane run across processes: which rank this process is, and the ranks'
 * meeting before the prompt is timed, through the mpi plugin's registry ("MPI": its proc
 * addresses, docs/distributed.md). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/bp-comm.h>
#include <backplane/bp-meta.h>

#include "tool.h"

/* With devices on other processes (DEVICE@RANK in -d: the run is one of several started by
 * mpirun), this process's rank and the number of ranks; else 0 of 1. */
int tool_process_rank(const char *devices, int *n_ranks)
{
    *n_ranks = 1;
    bp_registry *reg = devices != NULL && strchr(devices, '@') ? bp_registry_by_name("MPI") : NULL;
    void *proc = reg ? bp_registry_get_proc_address(reg, "bp_comm_world") : NULL;
    bp_comm_world_fn world;
    int rank = 0;
    if (proc == NULL) /* (the meta plugin explains a missing mpi plugin when it opens -d) */
        return 0;
    memcpy(&world, &proc, sizeof(world));
    if (world(&rank, n_ranks) != BP_OK)
        *n_ranks = 1;
    return rank;
}

/* With devices on other processes (DEVICE@RANK): waits until every rank is here, by making a
 * communicator of every rank with this rank's state (`ok`: everything before went well) and
 * summing one value over it, so that the prompt's time that follows is this step's and not a
 * slower rank's loading, and a rank that failed before tells the others now instead of leaving
 * them waiting in the prompt's first collective. False when this rank or another failed
 * (printed, naming the rank); true without devices on other processes. Waits as long as the
 * meta device's collectives do (BP_COMM_TIMEOUT). */
bool tool_sync_ranks(const char *devices, bool ok)
{
    bp_registry *reg = devices != NULL && strchr(devices, '@') ? bp_registry_by_name("MPI") : NULL;
    void *pw = reg ? bp_registry_get_proc_address(reg, "bp_comm_world") : NULL;
    void *pi = reg ? bp_registry_get_proc_address(reg, "bp_comm_init_ranks") : NULL;
    void *pa = reg ? bp_registry_get_proc_address(reg, "bp_comm_allreduce_checked") : NULL;
    void *pf = reg ? bp_registry_get_proc_address(reg, "bp_comm_free") : NULL;
    if (pw == NULL || pi == NULL || pa == NULL || pf == NULL)
        return ok;
    bp_comm_world_fn world;
    bp_comm_init_ranks_fn init;
    bp_comm_allreduce_checked_fn allreduce;
    bp_comm_free_fn comm_free;
    memcpy(&world, &pw, sizeof(world));
    memcpy(&init, &pi, sizeof(init));
    memcpy(&allreduce, &pa, sizeof(allreduce));
    memcpy(&comm_free, &pf, sizeof(comm_free));
    int rank = 0, n_ranks = 1;
    if (world(&rank, &n_ranks) != BP_OK || n_ranks > BP_META_MAX_DEVICES)
        return ok;
    const char *v = getenv("BP_COMM_TIMEOUT");
    char *end = NULL;
    const double t = v != NULL ? strtod(v, &end) : 0;
    const double timeout = v != NULL && end != v && *end == '\0' && t > 0 && t < 1e9 ? t : 0;
    enum bp_status mine = ok ? BP_OK : bp_last_status();
    if (mine == BP_OK && !ok)
        mine = BP_ERR_BACKEND;
    bp_backend *cpu = bp_backend_init_by_name("CPU", "threads=1");
    if (cpu == NULL && mine == BP_OK)
        mine = bp_last_status();
    struct bp_comm_member m[BP_META_MAX_DEVICES];
    for (int r = 0; r < n_ranks; r++)
        m[r] = (struct bp_comm_member){r, r == rank ? cpu : NULL};
    bp_comm *c = init(m, n_ranks, mine, timeout);
    bp_context *ctx = bp_context_new(1);
    bp_tensor *x = ctx != NULL ? bp_new_tensor_1d(ctx, BP_TYPE_F32, 1) : NULL;
    bp_buffer *buf = x != NULL && cpu != NULL
                         ? bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu))
                         : NULL;
    enum bp_status st = c == NULL ? bp_last_status() : BP_OK;
    if (c != NULL) {
        if (mine == BP_OK && (buf == NULL || bp_buffer_clear(buf, 0) != BP_OK))
            mine = bp_last_status() != BP_OK ? bp_last_status() : BP_ERR_OUT_OF_MEMORY;
        bp_tensor *ts[BP_META_MAX_DEVICES] = {NULL};
        ts[rank] = x;
        st = allreduce(c, ts, n_ranks, mine);
        comm_free(c);
    }
    if (st != BP_OK && ok) /* (this rank's own failure was printed where it happened) */
        fprintf(stderr, "backplane run: rank %d: %s\n", rank, tool_text(bp_last_error()));
    bp_buffer_free(buf);
    bp_context_free(ctx);
    bp_backend_free(cpu);
    return ok && st == BP_OK;
}
