/* reduce.h - element-wise reduction kernels on host memory, for every dtype x op.
 *
 * float16 and bfloat16 are widened to float, combined, and rounded back (round to nearest even).
 * Integer sum and prod wrap around modulo 2^bits, as in two's complement, without undefined
 * behaviour. HOOP_AVG reduces as a sum; the collective divides once at the end with
 * hoop__reduce_finish.
 *
 * Floating min and max compute `a < b ? a : b` (and `a > b ? a : b`): a NaN survives or not
 * depending on which operand it is, so where a NaN enters the ring decides whether the result
 * holds it. Sum and prod propagate NaN as IEEE arithmetic does.
 */
#ifndef HOOP__REDUCE_H
#define HOOP__REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hoop.h"

/* dst[i] = a[i] op b[i] for i < count. dst may alias a or b (exactly, not partially). */
void hoop__reduce3(void *dst, const void *a, const void *b, size_t count, hoop_dtype dtype,
                   hoop_op op);

/* dst[i] = dst[i] op src[i]. */
void hoop__reduce(void *dst, const void *src, size_t count, hoop_dtype dtype, hoop_op op);

/* After a HOOP_AVG reduction (a sum over nranks contributions), divide each element by nranks.
 * Integers round toward zero. Does nothing for other ops. */
void hoop__reduce_finish(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int nranks);

/* Reproducible mode's reduction (hoop(3), "Reproducible reductions"): dst[i] = the n sources'
 * elements i combined over one fixed tree of the sources in their order: with p the largest power
 * of two <= n and rem = n - p, sources 2v and 2v + 1 are paired for v < rem, and the p leaves so
 * made (those pairs, then the sources left, in order) are combined as a perfect binary tree of
 * adjacent pairs, the lower operand on the left: recursive doubling's order
 * (((s0 op s1) op s2) op (s3 op s4) for 5). Every step rounds as hoop__reduce3 does (float16 and
 * bfloat16 in float, rounded back), and HOOP_AVG's sum is then divided as hoop__reduce_finish
 * divides. The bits depend only on the sources and their order. dst may be one of the sources
 * (exactly), not overlap one partly. */
void hoop__reduce_fixed(void *dst, const void *const *srcs, int n, size_t count, hoop_dtype dtype,
                        hoop_op op);

/* A float's bits, and back. */
static inline uint32_t hoop__float_bits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

static inline float hoop__bits_float(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* count elements of a float dtype (float32, float16, bfloat16) to float and back, the 16-bit
 * ones rounded to nearest even as the kernels round them. Other dtypes are the caller's error. */
void hoop__to_float(float *out, const void *in, hoop_dtype dtype, size_t count);
void hoop__from_float(void *out, const float *in, hoop_dtype dtype, size_t count);

/* Conversions used by the kernels, exposed for tests and for callers that pack gradients. */
float hoop__half_to_float(uint16_t h);
uint16_t hoop__float_to_half(float f);
float hoop__bf16_to_float(uint16_t b);
uint16_t hoop__float_to_bf16(float f);

#endif /* HOOP__REDUCE_H */
