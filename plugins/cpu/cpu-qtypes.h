/* cpu-qtypes.h - the CPU plugin's weight types beyond F32/F16/BF16/Q8_0/Q4_0: Q4_1, Q5_0, Q5_1,
 * IQ4_NL (blocks of 32, cpu-quants32.c) and Q2_K to Q6_K, IQ4_XS (super-blocks of 256,
 * cpu-kquants.c).
 *
 * Every such type names the type its activations are quantised to (as ggml pairs them: Q8_1 for
 * the types with a minimum, Q8_0 for the symmetric 32-blocks, Q8_K for the super-blocks) and a
 * dot product of one weight row with one quantised activation column. The matrix products of
 * these types (cpu-qtypes.c) quantise B's columns once, then call the dot product for every
 * (row, column) pair a thread owns. Each source file is built once per ISA variant of the
 * plugin and picks its body by BP_CPU_HAVE_AVX512 / BP_CPU_HAVE_AVX2 (else portable C); the
 * results of every variant agree with the runtime's dequantisers within rounding. */
#ifndef BP_CPU_QTYPES_H
#define BP_CPU_QTYPES_H

#include <stdint.h>
#include <string.h>

#include "cpu-impl.h"

/* sum over k of w[k] * y[k]: w one weight row of k elements (k a multiple of the weight type's
 * block), y the activations quantised to the type's activation type, same k. */
typedef float (*bp_cpu_vec_dot_fn)(int64_t k, const void *w, const void *y);
/* k floats (a multiple of the activation type's block) quantised to the activation type. */
typedef void (*bp_cpu_quantize_fn)(const float *x, void *y, int64_t k);

struct bp_cpu_qtype {
    enum bp_type act;             /* the activations' type: Q8_0, Q8_1 or Q8_K */
    bp_cpu_quantize_fn quantize;  /* floats to act */
    bp_cpu_vec_dot_fn vec_dot;    /* a weight row with an act row */
};

/* The entry of type t, or NULL when t is not one of these types (each file answers for its
 * own; bp_cpu_qtype asks both). */
const struct bp_cpu_qtype *bp_cpu_qtype32(enum bp_type t);
const struct bp_cpu_qtype *bp_cpu_qtype_k(enum bp_type t);
const struct bp_cpu_qtype *bp_cpu_qtype(enum bp_type t);

/* IQ4_XS's 8 scales of 32, offset 32 still on, as 8 bytes: the 8 low nibbles of scales_l and the
 * 8 2-bit fields of scales_h spread one to a byte, then put together. */
static inline uint64_t bp_cpu_iq4_xs_scales(const struct bp_block_iq4_xs *x)
{
    uint32_t l32;
    memcpy(&l32, x->scales_l, 4);
    uint64_t l = l32, h = x->scales_h;
    l = (l | l << 16) & 0x0000ffff0000ffffull;
    l = (l | l << 8) & 0x00ff00ff00ff00ffull;
    l = (l | l << 4) & 0x0f0f0f0f0f0f0f0full;
    h = (h | h << 24) & 0x000000ff000000ffull;
    h = (h | h << 12) & 0x000f000f000f000full;
    h = (h | h << 6) & 0x0303030303030303ull;
    return l | h << 4;
}

#endif
