/* bp-cpu.h - the CPU plugin's extras, as proc addresses of its registry ("CPU").
 *
 * Each is converted to its type as bp_registry_get_proc_address (bp-backend.h) describes:
 *
 *   "bp_cpu_repack_buffer_type"  bp_cpu_repack_buffer_type_fn
 *   "bp_cpu_repack_type"         bp_cpu_repack_type_fn
 *
 * The thread count of a CPU backend is set with the generic bp_backend_set_n_threads
 * (bp-backend.h), which the CPU plugin implements. */
#ifndef BACKPLANE_BP_CPU_H
#define BACKPLANE_BP_CPU_H

#include <backplane/bp-backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A CPU device's "CPU_REPACK" buffer type, for weights only the CPU multiplies: 2-D tensors of
 * the types the loaded CPU variant has a faster kernel for in that layout (Q4_0, Q8_0, IQ4_NL,
 * Q5_0, Q4_1, Q5_1, Q4_K, Q5_K and IQ4_XS with AVX-512 VNNI, Q4_0 with AVX2, none on the
 * baseline: bp_cpu_repack_type_fn says which)
 * placed there are stored row-interleaved for faster MUL_MAT; other tensors are stored as they
 * are. Interleaved tensors are set and read in whole blocks, used directly only by MUL_MAT and
 * GET_ROWS, and copied (unpacked) for anything else. NULL for a device that is not a CPU device
 * of this plugin. */
typedef bp_buffer_type *(*bp_cpu_repack_buffer_type_fn)(bp_device *dev);

/* Whether 2-D tensors of type placed in dev's CPU_REPACK buffer type are stored row-interleaved
 * (else they are stored as they are, as in host memory, and gain nothing there). False, with
 * bp_last_error set, for a device that is not a CPU device of this plugin. */
typedef bool (*bp_cpu_repack_type_fn)(bp_device *dev, enum bp_type type);

#ifdef __cplusplus
}
#endif

#endif
