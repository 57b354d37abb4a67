/* cpu.c - which instruction-set features this process may use.
 *
 * A feature counts only when the CPU reports it (CPUID) and the operating system saves the
 * register state it needs (XCR0): a VM or kernel may hide AVX-512 state even on a CPU that has
 * the instructions, and running them there faults. The library itself is built for the baseline
 * ISA; this check is what keeps a plugin variant built for a newer one from ever being run. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bp-impl.h"
#include <backplane/bp-plugin.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static uint64_t detect(void)
{
    unsigned a, b, c, d;
    uint64_t f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const bool osxsave = (c >> 27) & 1;
    const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    const bool avx_state = (xcr0 & 0x6) == 0x6;          /* SSE and AVX registers */
    const bool avx512_state = avx_state && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM halves */
    const bool amx_state = (xcr0 & 0x60000) == 0x60000;  /* TILECFG and TILEDATA */

    if ((c >> 20) & 1)
        f |= BP_CPU_SSE4_2;
    if (avx_state) {
        if ((c >> 28) & 1)
            f |= BP_CPU_AVX;
        if ((c >> 12) & 1)
            f |= BP_CPU_FMA;
        if ((c >> 29) & 1)
            f |= BP_CPU_F16C;
    }
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        if (avx_state && ((b >> 5) & 1))
            f |= BP_CPU_AVX2;
        if (avx512_state) {
            if ((b >> 16) & 1)
                f |= BP_CPU_AVX512F;
            if ((b >> 17) & 1)
                f |= BP_CPU_AVX512DQ;
            if ((b >> 30) & 1)
                f |= BP_CPU_AVX512BW;
            if ((b >> 31) & 1)
                f |= BP_CPU_AVX512VL;
            if ((c >> 11) & 1)
                f |= BP_CPU_AVX512_VNNI;
        }
        if (amx_state) {
            if ((d >> 24) & 1)
                f |= BP_CPU_AMX_TILE;
            if ((d >> 25) & 1)
                f |= BP_CPU_AMX_INT8;
            if ((d >> 22) & 1)
                f |= BP_CPU_AMX_BF16;
        }
        unsigned max_sub = a;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if (avx_state && ((a >> 4) & 1))
                f |= BP_CPU_AVX_VNNI;
            if (avx512_state && ((a >> 5) & 1))
                f |= BP_CPU_AVX512_BF16;
            if (amx_state && ((a >> 21) & 1))
                f |= BP_CPU_AMX_FP16;
        }
    }
    return f;
}
#else
static uint64_t detect(void)
{
    return 0; /* no x86 features elsewhere; plugins for other ISAs declare none */
}
#endif

static const struct {
    uint64_t bit;
    const char *name;
} feature_names[] = {
#define BP_CPU_FEATURE_ROW(name, bit, text) {1ull << (bit), text},
    BP_CPU_FEATURE_MAP(BP_CPU_FEATURE_ROW)
#undef BP_CPU_FEATURE_ROW
};

const char *bp_cpu_feature_name(uint64_t feature)
{
    for (size_t i = 0; i < sizeof(feature_names) / sizeof(feature_names[0]); i++) {
        if (feature_names[i].bit == feature)
            return feature_names[i].name;
    }
    return NULL;
}

static uint64_t features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static void init_features(void)
{
    features = detect();
    const char *off = getenv("BP_CPU_DISABLE");
    if (off == NULL)
        return;
    /* Tokens are read in place: a copy into a fixed buffer would drop the end of a long list. */
    for (const char *p = off; *p;) {
        p += strspn(p, ", ");
        size_t n = strcspn(p, ", ");
        if (n == 0)
            break;
        bool known = false;
        for (size_t i = 0; i < sizeof(feature_names) / sizeof(feature_names[0]); i++) {
            const char *fname = feature_names[i].name;
            if (strlen(fname) == n && strncasecmp(p, fname, n) == 0) {
                features &= ~feature_names[i].bit;
                known = true;
            }
        }
        if (!known)
            bp_log(BP_LOG_WARN, "BP_CPU_DISABLE: unknown CPU feature '%.*s'", (int)n, p);
        p += n;
    }
}

uint64_t bp_cpu_features(void)
{
    pthread_once(&features_once, init_features);
    return features;
}
