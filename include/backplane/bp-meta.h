/* bp-meta.h - meta devices: tensor parallelism over other plugins' devices. */
#ifndef BACKPLANE_BP_META_H
#define BACKPLANE_BP_META_H

#include <string.h> /* memcpy, for bp_meta_device_new */

#include <backplane/bp-backend.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_META_MAX_DEVICES 16

enum bp_meta_state {
    BP_META_MIRRORED = 0, /* every device holds all of it */
    BP_META_SPLIT = 1,    /* device i holds sizes[i] elements of axis `axis` */
    BP_META_PARTIAL = 2,  /* every device holds a summand; the value is the sum */
};

struct bp_meta_split {
    enum bp_meta_state state;
    int axis;                             /* BP_META_SPLIT: 0..3 */
    int64_t sizes[BP_META_MAX_DEVICES];   /* BP_META_SPLIT: per device, summing to ne[axis] */
};

/* Chooses how a weight (a tensor in a buffer with usage BP_BUFFER_USAGE_WEIGHTS) is split over
 * the n devices: fill *out and return true, or return false for the default policy. It is
 * asked when the weight is first written: a split along the rows (axis 1) or, in whole blocks,
 * the columns (axis 0) of a 2-D weight, or of a contiguous stack of matrices [K, M, n, 1]
 * (MUL_MAT_ID's experts, every matrix split alike), is then how the weight is stored - each
 * device holds only its slice - and every graph uses it split that way (a graph that needs it
 * otherwise gets a whole copy per device for that computation). *out is zeroed before the
 * call.
 *
 * Accepted answers: state BP_META_MIRRORED (the weight stays whole, as with false), or state
 * BP_META_SPLIT with axis 0..3 and sizes[0..n) each >= 0 (0: that device takes no part),
 * summing exactly to the weight's ne[axis], and multiples of the type's block size on axis 0
 * (32 for Q4_0 and Q8_0). Entries of sizes from n on are not read. Anything else (PARTIAL, an
 * unknown state, another axis, a negative size, a wrong sum, part of a block) is refused: the
 * write or computation that asked fails with BP_ERR_INVALID_ARG and an error naming the
 * weight, the axis and the sizes. */
typedef bool (*bp_meta_split_fn)(const bp_tensor *weight, int n_devices, struct bp_meta_split *out,
                                 void *user_data);

/* The "bp_meta_device_new" proc address of the "Meta" registry. A meta device is keyed by its
 * devices (in order), split and user_data: the same key gives the same meta device; another
 * split or user_data over the same devices gives another device, of the same name, that stores
 * its weights by its own policy. split NULL is the default policy (user_data is then ignored),
 * the device a "Meta(A,B,...)" name gives. Owned by the meta plugin. */
typedef bp_device *(*bp_meta_device_new_fn)(bp_device *const *devices, int n,
                                            bp_meta_split_fn split, void *user_data);

/* The "bp_meta_device_by_name" proc address: the meta device a "Meta(A,B,...)" name describes
 * (as bp_backend_init_by_name reads it) with the split policy (split, user_data), keyed as
 * bp_meta_device_new keys devices. The way to give a policy to a device with parts on other
 * processes ("DEVICE@RANK", the distributed guide): every rank calls it with the same name and
 * policy. A rank that fails here (its device missing) tells the others when they make the
 * device's backend, where they then fail too. */
typedef bp_device *(*bp_meta_device_by_name_fn)(const char *name, bp_meta_split_fn split,
                                                void *user_data);

/* The "bp_meta_backend_reduced_bytes" proc address: bytes of the tensors a meta backend has
 * all-reduced since it was created (with parts on other processes, also the tensors gathered
 * across them, each counted once); 0 with an error for other backends. */
typedef size_t (*bp_meta_backend_reduced_bytes_fn)(bp_backend *backend);

/* The "bp_meta_backend_stats" proc address: all-reduces a meta backend has done since it was
 * created and the wall time they took (seconds). BP_ERR_INVALID_ARG for other backends. */
typedef enum bp_status (*bp_meta_backend_stats_fn)(bp_backend *backend, int *n_reduces,
                                                   double *reduce_seconds);

/* The "bp_meta_buffer_part_bytes" proc address: bytes a meta buffer holds on its part `part`
 * (storage is made at first use; weights split by the callback hold only their slices). 0 for
 * other buffers or parts. */
typedef size_t (*bp_meta_buffer_part_bytes_fn)(bp_buffer *buffer, int part);

/* Helper: resolves the proc address and calls it. NULL with an error when the meta plugin is
 * not loaded. */
static inline bp_device *bp_meta_device_new(bp_device *const *devices, int n,
                                            bp_meta_split_fn split, void *user_data)
{
    bp_registry *reg = bp_registry_by_name("Meta");
    if (reg == NULL)
        return NULL;
    void *proc = bp_registry_get_proc_address(reg, "bp_meta_device_new");
    if (proc == NULL)
        return NULL;
    /* ISO C and C++ do not convert an object pointer to a function pointer (a -Wpedantic
     * warning in every file that includes this header); POSIX guarantees they have the same
     * representation, so the bytes are copied instead. */
    bp_meta_device_new_fn fn;
    memcpy(&fn, &proc, sizeof(fn));
    return fn(devices, n, split, user_data);
}

#ifdef __cplusplus
}
#endif

#endif
