/* test-device.h - private to tests/: an in-process "accelerator" registry for exercising the
 * backend API and allocators without a real plugin. Its memory is ordinary host memory, but its
 * buffer type says it is not host memory, so the runtime must go through the buffer interface
 * (and stage copies through the host) exactly as it would for a GPU. Like a GPU it can also offer
 * a host buffer type ("TestAccel_Host", host memory that says so), standing for pinned memory.
 * Compute uses the reference kernels. */
#ifndef BP_TEST_DEVICE_H
#define BP_TEST_DEVICE_H

#include <backplane/bp-plugin.h>

struct test_device_stats {
    int set_calls, get_calls, memset_calls, clear_calls, cpy_calls;
    int computes, syncs, events_recorded, events_waited;
    int backends_freed, buffers_freed;
    int host_buffers_allocated, host_buffers_freed; /* of the host buffer type */
};

extern struct test_device_stats test_device_stats;

/* A registry "TestAccel" with one device "ACCEL0". max_buffer caps buffer sizes (0: no cap).
 * Caller frees with bp_registry_free. */
bp_registry *test_device_registry_new(size_t max_buffer);
/* The same with another registry name and n_devices devices named <dev_prefix>0, 1, ... */
bp_registry *test_device_registry_new_named(const char *reg_name, const char *dev_prefix,
                                            int n_devices, size_t max_buffer);
/* Makes the devices of this process support only views, MUL_MAT and MUL_MAT_ID (not with Q4_0
 * weights), ADD, MUL, SCALE, RMS_NORM, SOFT_MAX and CONT (not ROPE, GET_ROWS, GLU, ...), like an
 * accelerator with a partial op set, so the scheduler has to split graphs around it. In either
 * mode the devices ask to run MUL_MAT_ID wherever its weights live (offload_op). */
void test_device_set_op_subset(bool on);

/* Makes the next n direct or queued copies of this process's test devices fail with an error
 * (BP_ERR_BACKEND, "... failed (injected)") instead of copying. */
void test_device_fail_copies(int n);

/* Makes the devices created afterwards in this process offer the host buffer type. */
void test_device_set_host_buffer(bool on);
/* Makes the next n allocations of the host buffer type fail (BP_ERR_OUT_OF_MEMORY), as pinning
 * does when page-locked memory runs out; returns how many of the previous count were left. Also
 * the registry's proc address "test_device_fail_host_buffers", for tests that load the plugin. */
int test_device_fail_host_buffers(int n);

/* Makes the devices of this process decline op (an enum bp_op; -1: none) in supports_op, like a
 * device without that kernel. */
void test_device_set_declined_op(int op);

/* Makes the devices of this process compute op (an enum bp_op; -1: none) wrongly: the first
 * element of every F32 result of it is off by 1, as a broken kernel would be. */
void test_device_set_wrong_op(int op);

/* Calls hook(arg) at the start of every graph compute of this process's test backends (NULL:
 * none), so a test can hold a backend inside a call while another thread tries to enter it. */
void test_device_set_compute_hook(void (*hook)(void *), void *arg);

/* Makes the test devices of this process break the plugin API in one way, named by what (NULL:
 * none), so the runtime's checks of plugin answers can be tested. The first device of each
 * registry tells the lie, the others stay honest (registry-wide lies excepted):
 *   name-null, name-empty, name-control, name-utf8   its get_name answer
 *   desc-null                                        get_description returns NULL
 *   base-null, base-misaligned                       get_base of its buffers
 *   align-0, align-3, align-huge (2^40)              get_alignment of its buffer type
 *   alloc-size-0, alloc-size-small (half the bytes)  get_alloc_size of its buffer type
 *   max-size-0                                       get_max_size of its buffer type
 *   get-tensor-fails                                 get_tensor of its buffers fails
 *   reg-name-null                                    the registry's get_name returns NULL
 *   device-null                                      get_device(0) returns NULL
 *   count-too-many                                   get_device_count says 5 more than made
 * what must stay valid while the devices live (a string literal, or getenv's answer). */
void test_device_set_lie(const char *what);

/* The proc address the registry offers, for the get_proc_address test. */
int test_device_answer(void);

#endif
