/* cpu-kquants.c - the super-block kernels (Q2_K to Q6_K and IQ4_XS, activations as Q8_K) live
 * here; until they are written no type has an entry, so the CPU plugin declines those types. */
#include "config.h"

#include "cpu-qtypes.h"

const struct bp_cpu_qtype *bp_cpu_qtype_k(enum bp_type t) { (void)t; return NULL; }
