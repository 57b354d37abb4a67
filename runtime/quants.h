/* quants.h - the block types beyond Q8_0/Q4_0 (quants.c): their dequantizers, quantizers and
 * the pieces of their layouts that kernels share. Library-internal. */
#ifndef BP_QUANTS_H
#define BP_QUANTS_H

#include <stdint.h>

#include <backplane/bp-tensor.h>

/* IQ4_NL's and IQ4_XS's 16 values (ggml's kvalues_iq4nl). */
extern const int8_t bp__iq4nl_values[16];

/* Q3_K's 16 signed scales (offset removed) from its 12 packed bytes. */
void bp__q3_k_scales(const uint8_t *packed, int8_t *scales);
/* Q4_K's and Q5_K's scale and minimum j (0..7) from their 12 packed bytes. */
void bp__k4_scale_min(int j, const uint8_t *packed, uint8_t *d, uint8_t *m);

void bp__q4_1_to_float(const void *src, float *dst, int64_t n);
void bp__q5_0_to_float(const void *src, float *dst, int64_t n);
void bp__q5_1_to_float(const void *src, float *dst, int64_t n);
void bp__q8_1_to_float(const void *src, float *dst, int64_t n);
void bp__q2_k_to_float(const void *src, float *dst, int64_t n);
void bp__q3_k_to_float(const void *src, float *dst, int64_t n);
void bp__q4_k_to_float(const void *src, float *dst, int64_t n);
void bp__q5_k_to_float(const void *src, float *dst, int64_t n);
void bp__q6_k_to_float(const void *src, float *dst, int64_t n);
void bp__q8_k_to_float(const void *src, float *dst, int64_t n);
void bp__iq4_nl_to_float(const void *src, float *dst, int64_t n);
void bp__iq4_xs_to_float(const void *src, float *dst, int64_t n);

void bp__q4_1_from_float(const float *src, void *dst, int64_t n);
void bp__q5_0_from_float(const float *src, void *dst, int64_t n);
void bp__q5_1_from_float(const float *src, void *dst, int64_t n);
void bp__q8_1_from_float(const float *src, void *dst, int64_t n);
void bp__q8_k_from_float(const float *src, void *dst, int64_t n);

/* quants-k.c: the quantizers that search for their scales. Each _quantize takes n elements (a
 * multiple of the block size) and an optional importance matrix of n values (NULL: llama.cpp's
 * reference weighting); _from_float is _quantize without one. */
void bp__q2_k_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__q3_k_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__q4_k_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__q5_k_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__q6_k_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__iq4_nl_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__iq4_xs_quantize(const float *src, void *dst, int64_t n, const float *imatrix);
void bp__q2_k_from_float(const float *src, void *dst, int64_t n);
void bp__q3_k_from_float(const float *src, void *dst, int64_t n);
void bp__q4_k_from_float(const float *src, void *dst, int64_t n);
void bp__q5_k_from_float(const float *src, void *dst, int64_t n);
void bp__q6_k_from_float(const float *src, void *dst, int64_t n);
void bp__iq4_nl_from_float(const float *src, void *dst, int64_t n);
void bp__iq4_xs_from_float(const float *src, void *dst, int64_t n);
/* One row of n elements of Q4_0, Q4_1, Q5_0 or Q5_1 weighed by imatrix (not NULL). */
void bp__legacy_quantize(enum bp_type type, const float *src, void *dst, int64_t n,
                         const float *imatrix);

#endif
