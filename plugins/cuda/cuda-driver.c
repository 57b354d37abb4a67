/* cuda-driver.c - finding the GPUs without starting the CUDA runtime.
 *
 * Discovery only enumerates devices, and on a machine without a GPU (or without the driver)
 * it must cost next to nothing: starting cudart there costs about 220 MB of memory and a
 * tenth of a second per process, for no devices. So the plugin asks the driver API, loaded
 * with dlopen only for this, and starts cudart, cuBLAS and NCCL when a backend or buffer is
 * made. No driver library, or a driver that fails cuInit, is zero devices with the reason. */
#include "config.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda-impl.h"

/* The few driver API entry points used, by their documented C signatures (CUresult is an
 * int-sized enum, CUdevice an int). */
typedef int (*cu_init_fn)(unsigned flags);
typedef int (*cu_count_fn)(int *count);
typedef int (*cu_get_fn)(int *dev, int ordinal);
typedef int (*cu_name_fn)(char *name, int len, int dev);
typedef int (*cu_mem_fn)(size_t *bytes, int dev);
typedef int (*cu_attr_fn)(int *value, int attribute, int dev);
typedef int (*cu_errstr_fn)(int error, const char **text);

enum { CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76 };

/* dlsym into a function pointer without a cast ISO C lacks. */
static void *sym(void *lib, const char *name)
{
    return dlsym(lib, name);
}

#define LOAD(var, type, name)                                                                  \
    type var;                                                                                  \
    do {                                                                                       \
        void *p_ = sym(lib, name);                                                             \
        if (p_ == NULL) {                                                                      \
            snprintf(why, why_size, "the CUDA driver has no %s", name);                        \
            goto none;                                                                         \
        }                                                                                      \
        memcpy(&var, &p_, sizeof(var));                                                        \
    } while (0)

int bp_cuda_enumerate(struct bp_cuda_gpu *out, int max, char *why, size_t why_size)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        snprintf(why, why_size, "no usable GPU: no CUDA driver (%s)", err ? err : "libcuda.so.1");
        return 0;
    }
    LOAD(cu_init, cu_init_fn, "cuInit");
    LOAD(cu_count, cu_count_fn, "cuDeviceGetCount");
    LOAD(cu_get, cu_get_fn, "cuDeviceGet");
    LOAD(cu_name, cu_name_fn, "cuDeviceGetName");
    LOAD(cu_mem, cu_mem_fn, "cuDeviceTotalMem_v2");
    LOAD(cu_attr, cu_attr_fn, "cuDeviceGetAttribute");
    int e = cu_init(0), count = 0;
    if (e == 0)
        e = cu_count(&count);
    if (e != 0) {
        const char *text = NULL;
        void *p = sym(lib, "cuGetErrorString");
        cu_errstr_fn errstr;
        if (p != NULL) {
            memcpy(&errstr, &p, sizeof(errstr));
            errstr(e, &text);
        }
        snprintf(why, why_size, "no usable GPU: the CUDA driver failed to start: %s (error %d)",
                 text ? text : "unknown error", e);
        goto none;
    }
    if (count == 0) {
        snprintf(why, why_size, "no GPU found");
        goto none;
    }
    int n = 0;
    for (int i = 0; i < count && n < max; i++) {
        struct bp_cuda_gpu *g = &out[n];
        int dev;
        if (cu_get(&dev, i) != 0 || cu_name(g->name, (int)sizeof(g->name), dev) != 0 ||
            cu_mem(&g->total_memory, dev) != 0 || cu_attr(&g->major, CU_ATTR_CC_MAJOR, dev) != 0 ||
            cu_attr(&g->minor, CU_ATTR_CC_MINOR, dev) != 0)
            continue;
        g->name[sizeof(g->name) - 1] = '\0';
        g->ordinal = i;
        n++;
    }
    /* With GPUs the library stays loaded: cudart loads it anyway when the first backend
     * starts. */
    if (n == 0)
        snprintf(why, why_size, "no usable GPU: the driver could not describe its %d device%s",
                 count, count == 1 ? "" : "s");
    return n;
none:
    dlclose(lib);
    return 0;
}
