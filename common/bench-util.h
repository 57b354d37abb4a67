/* bench-util.h - private to the source tree: shared by tools/ and bench/ (common/libcommon.a).
 * Timing, medians, argument parsing, weight-type names and the hardware limits (FMA peak, a
 * STREAM-style triad, cache and memory read bandwidth) that the benchmarks and `backplane
 * bench` report next to their figures; `backplane run` takes its timing and the CPU's repacked
 * buffer type from here too. */
#ifndef BP_COMMON_BENCH_UTIL_H
#define BP_COMMON_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include <backplane/backplane.h>

double bench_now(void); /* seconds, monotonic */
/* Fills t (in any buffer, any element type) with values in [-1, 1] from a xorshift generator
 * started at seed, converted row by row to t's type and written with bp_tensor_set. */
void bench_fill(bp_tensor *t, unsigned long long seed);
double bench_median(double *v, int n);
/* The value after `key` in argv, or def. */
const char *bench_arg(int argc, char **argv, const char *key, const char *def);
bool bench_flag(int argc, char **argv, const char *key);
/* A --types entry: the weight type named, and whether the name ends in "_repack" (weights in
 * the CPU's CPU_REPACK buffer type: "q4_0_repack"). False when it names no weight type. */
bool bench_weight_type(const char *name, enum bp_type *type, bool *repack);
/* The CPU_REPACK buffer type of be's device (proc address "bp_cpu_repack_buffer_type"), or NULL
 * when the device has none. */
bp_buffer_type *bench_repack_buft(bp_backend *be);
/* Loads the plugins of dir, the build tree's directory built into a benchmark; an empty dir
 * (benchmarks built with `make BENCH_PLUGIN_DIRS=`) means the runtime's search path instead
 * (BP_PLUGIN_PATH, then the installed plugins). */
void bench_load_plugins(const char *dir);
/* A comma-separated list of integers ("1,8,32") into out (at most max); returns the count. */
int bench_parse_list(const char *s, long *out, int max);
/* Measured peak f32 FMA rate of `threads` cores (GFLOP/s), with the widest vectors available
 * (AVX-512 when the CPU has it). */
double bench_fma_peak(int threads);
/* Measured triad a[i] = b[i] + s * c[i] bandwidth over arrays far larger than the caches,
 * GB/s (bytes read and written), with `threads` threads. */
double bench_triad(int threads);
/* Measured read bandwidth (GB/s) of `threads` threads each reading its share of a working set
 * of `bytes` over and over: a set that fits the caches measures them (e.g. a weight matrix
 * that stays in L3 between products). */
double bench_read(size_t bytes, int threads);

#endif
