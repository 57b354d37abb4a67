/* bench-mpi.c - all-reduce through the mpi plugin's communicator against MPI_Allreduce called
 * directly, in the same processes and the same run. Start it with mpirun:
 *
 *   mpirun -np 2 bench/bench-mpi [--sizes 256,65536,...] [--reps N]
 *
 * Each size (F32 values per rank) is measured in interleaved pairs: one round of ours, one of
 * MPI_Allreduce on the same buffer, each round `reps` calls after a barrier, timed on rank 0 as
 * the slowest rank's time (a max-reduce of the ranks' times). Rank 0 prints per size the
 * median time per call of each, the bandwidth (bytes per rank / time), and ours / direct as a
 * speed ratio (direct time / our time). The tensor is one CPU backend's, in host memory: the
 * plugin's fastest path, the one a meta device over CPUs on several nodes takes. */
#include "config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <backplane/backplane.h>
#include <backplane/bp-comm.h>

#include "../common/bench-util.h"

#define MAX_SIZES 32
#define ROUNDS 9

static double time_rounds(int reps, bp_comm_allreduce_fn ours, bp_comm *c, bp_tensor **ts,
                          int n, float *data, int count, bool direct)
{
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = bench_now();
    for (int i = 0; i < reps; i++) {
        if (direct)
            MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (ours(c, ts, n) != BP_OK) {
            fprintf(stderr, "bench-mpi: %s\n", bp_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    double t = (bench_now() - t0) / reps, slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n_ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    long sizes[MAX_SIZES] = {1, 256, 4096, 65536, 1 << 20, 1 << 22};
    int n_sizes = 6, reps_arg = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            n_sizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_sizes < MAX_SIZES;
                 tok = strtok(NULL, ","))
                sizes[n_sizes++] = strtol(tok, NULL, 10);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps_arg = atoi(argv[++i]);
        } else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np N bench-mpi [--sizes A,B,...] [--reps N]\n");
            MPI_Finalize();
            return 2;
        }
    }
#ifdef BP_BENCH_CPU_DIR
    if (getenv("BP_PLUGIN_PATH") == NULL)
        setenv("BP_PLUGIN_PATH", BP_BENCH_CPU_DIR ":" BP_BENCH_MPI_DIR, 1);
#endif
    bp_backend *cpu = bp_backend_init_by_name("CPU", "threads=1");
    bp_registry *reg = bp_registry_by_name("MPI");
    void *pi = reg ? bp_registry_get_proc_address(reg, "bp_comm_init_ranks") : NULL;
    void *pa = reg ? bp_registry_get_proc_address(reg, "bp_comm_allreduce") : NULL;
    void *pf = reg ? bp_registry_get_proc_address(reg, "bp_comm_free") : NULL;
    if (cpu == NULL || pi == NULL || pa == NULL || pf == NULL) {
        fprintf(stderr, "bench-mpi: rank %d: no CPU backend or mpi plugin: %s\n", rank,
                bp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    bp_comm_init_ranks_fn init;
    bp_comm_allreduce_fn ours;
    bp_comm_free_fn comm_free;
    memcpy(&init, &pi, sizeof(init));
    memcpy(&ours, &pa, sizeof(ours));
    memcpy(&comm_free, &pf, sizeof(comm_free));
    struct bp_comm_member m[64];
    for (int r = 0; r < n_ranks && r < 64; r++)
        m[r] = (struct bp_comm_member){r, r == rank ? cpu : NULL};
    bp_comm *c = init(m, n_ranks, BP_OK, 0);
    if (c == NULL) {
        fprintf(stderr, "bench-mpi: rank %d: %s\n", rank, bp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("# name count ranks value unit (medians of %d interleaved rounds)\n", ROUNDS);
    for (int si = 0; si < n_sizes; si++) {
        const int count = (int)sizes[si];
        bp_context *ctx = bp_context_new(1);
        bp_tensor *t = bp_new_tensor_1d(ctx, BP_TYPE_F32, count);
        bp_buffer *buf = bp_alloc_ctx_tensors(ctx, bp_backend_get_default_buffer_type(cpu));
        if (buf == NULL) {
            fprintf(stderr, "bench-mpi: %s\n", bp_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        bp_buffer_clear(buf, 0);
        bp_tensor *ts[64] = {NULL};
        ts[rank] = t;
        /* about 50 ms of calls per round */
        const double bytes = (double)count * sizeof(float);
        int reps = reps_arg > 0 ? reps_arg : (int)(0.05 / (20e-6 + bytes / 2e9)) + 1;
        time_rounds(reps, ours, c, ts, n_ranks, t->data, count, false); /* warm up */
        time_rounds(reps, ours, c, ts, n_ranks, t->data, count, true);
        double a[ROUNDS], b[ROUNDS], ratio[ROUNDS];
        for (int k = 0; k < ROUNDS; k++) {
            a[k] = time_rounds(reps, ours, c, ts, n_ranks, t->data, count, false);
            b[k] = time_rounds(reps, ours, c, ts, n_ranks, t->data, count, true);
            ratio[k] = b[k] / a[k];
        }
        const double ta = bench_median(a, ROUNDS), tb = bench_median(b, ROUNDS);
        const double r = bench_median(ratio, ROUNDS);
        if (rank == 0) {
            printf("allreduce_ours %d %d %.2f us\n", count, n_ranks, ta * 1e6);
            printf("allreduce_mpi_direct %d %d %.2f us\n", count, n_ranks, tb * 1e6);
            printf("allreduce_ours_bandwidth %d %d %.3f GB/s\n", count, n_ranks, bytes / ta / 1e9);
            printf("allreduce_ours_vs_direct %d %d %.3f x (median of paired ratios)\n", count,
                   n_ranks, r);
            fflush(stdout);
        }
        bp_buffer_free(buf);
        bp_context_free(ctx);
    }
    comm_free(c);
    bp_backend_free(cpu);
    MPI_Finalize();
    return 0;
}
