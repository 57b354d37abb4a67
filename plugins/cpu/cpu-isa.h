/* cpu-isa.h - private to plugins/cpu/: which instruction sets this build may use.
 *
 * Every source of the plugin is compiled once per build variant (Makefile.am: x86_64, avx2,
 * avx512, or one generic build elsewhere) with that variant's -m flags. This header turns the
 * compiler's macros (__AVX2__, __AVX512F__, ...) into the few levels the kernels are written
 * for, and nothing else in plugins/cpu/ tests the compiler's macros directly. The levels are
 * cumulative, so code for a level may use everything below it:
 *
 *   BP_CPU_HAVE_SSE2         128-bit SSE2, part of x86-64 itself: the x86_64 (baseline) variant
 *   BP_CPU_HAVE_F16C         half <-> float conversions (F16C, with AVX's 256-bit registers)
 *   BP_CPU_HAVE_AVX2         AVX2 + FMA + F16C: the avx2 variant
 *   BP_CPU_HAVE_AVX512       AVX-512 F/BW/VL/DQ on top of AVX2
 *   BP_CPU_HAVE_AVX512_VNNI  AVX512-VNNI on top of that: the avx512 variant
 *   BP_CPU_HAVE_AMX          AMX-TILE/BF16/INT8 (the avx512 variant, when the compiler has them;
 *                            whether the CPU and kernel allow tiles is asked at run time)
 *
 * A build whose flags name only part of a level (say -mavx2 without -mfma) gets the level
 * below. Each macro is defined as 1 or not at all; test it with #ifdef or defined(). */
#ifndef BP_CPU_ISA_H
#define BP_CPU_ISA_H

#if defined(__SSE2__)
#define BP_CPU_HAVE_SSE2 1
#endif

#if defined(BP_CPU_HAVE_SSE2) && defined(__F16C__) && defined(__AVX__)
#define BP_CPU_HAVE_F16C 1
#endif

#if defined(BP_CPU_HAVE_F16C) && defined(__AVX2__) && defined(__FMA__)
#define BP_CPU_HAVE_AVX2 1
#endif

#if defined(BP_CPU_HAVE_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) &&               \
    defined(__AVX512VL__) && defined(__AVX512DQ__)
#define BP_CPU_HAVE_AVX512 1
#endif

#if defined(BP_CPU_HAVE_AVX512) && defined(__AVX512VNNI__)
#define BP_CPU_HAVE_AVX512_VNNI 1
#endif

/* AMX: when configure found the compiler's AMX flags and added them to the avx512 variant. */
#if defined(BP_CPU_HAVE_AVX512_VNNI) && defined(__AMX_TILE__) && defined(__AMX_BF16__) &&       \
    defined(__AMX_INT8__)
#define BP_CPU_HAVE_AMX 1
#endif

/* The repacked Q4_0/Q8_0 layout has a kernel of its own (cpu-repack.c) with AVX512-VNNI, and
 * with AVX2 where AVX-512 is absent; other builds unpack eight rows at a time instead. */
#if defined(BP_CPU_HAVE_AVX512_VNNI) || (defined(BP_CPU_HAVE_AVX2) && !defined(BP_CPU_HAVE_AVX512))
#define BP_CPU_REPACK_KERNEL 1
#endif

#if defined(BP_CPU_HAVE_F16C)
#include <immintrin.h>
#elif defined(BP_CPU_HAVE_SSE2)
#include <emmintrin.h>
#endif

#endif
