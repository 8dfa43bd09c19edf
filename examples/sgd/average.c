/* average.c - gradient averaging: pack a group of gradient tensors into the fusion buffer,
 * allreduce it, unpack it. See average.h for what it computes.
 *
 * Divide, then sum. Each rank packs its share of the mean, grad / global_batch, and the allreduce
 * sums the shares. That equals summing first and dividing after up to float rounding, keeps the
 * values the size of a gradient (float16 overflows past 65504), and stays right when the ranks'
 * slices of the batch differ in size, which HOOP_AVG (sum / ranks) would not.
 *
 * What "float16 on the wire, summed in float32" means here. hoop's HOOP_FLOAT16 allreduce converts
 * each received chunk to float, adds in float, and converts the partial sum back to float16 before
 * it sends it on (DESIGN.md: "fp16/bf16 via float"). So every addition is a float32 addition and
 * every byte on the wire is float16: half the traffic of float32. The price is one float16 rounding
 * of each rank's share and one of each partial sum, n - 1 on the way around a ring of n ranks;
 * with 11-bit mantissas that is a relative error of a few 2^-11 per element. The alternative,
 * keeping float32 partial sums, would send float32 for all but the first hop and save nothing.
 */
#include "average.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "timer.h"

/* ---- float16 --------------------------------------------------------------------------------- */
/* IEEE 754 binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. */

static uint16_t float_to_half(float value) {
  uint32_t x;
  memcpy(&x, &value, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x >= 0x7f800000) /* infinity, or NaN (kept a NaN) */
    return sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0);
  if (x >= 0x477ff000) /* 65520 and more round to infinity */
    return sign | 0x7c00;
  if (x < 0x38800000) {
    /* Below 2^-14 a half is subnormal: a multiple of 2^-24. Adding 0.5f, whose last mantissa bit
     * is worth 2^-24, makes the float addition round to that multiple, to nearest even. */
    float magnitude, shifted;
    memcpy(&magnitude, &x, sizeof x);
    shifted = magnitude + 0.5f;
    uint32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    return sign | (uint16_t)(bits - 0x3f000000);
  }
  /* Normal: rebias the exponent from 127 to 15 (0xc8000000 is -112 << 23) and round the mantissa
   * from 23 to 10 bits, to nearest even; a carry out of the mantissa raises the exponent, as it
   * should. */
  uint32_t odd = (x >> 13) & 1;
  x += 0xc8000000u + 0xfff + odd;
  return sign | (uint16_t)(x >> 13);
}

static float half_to_float(uint16_t half) {
  uint32_t sign = (uint32_t)(half & 0x8000) << 16;
  uint32_t exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
  uint32_t bits;
  if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float */
    float magnitude = (float)mantissa * 0x1p-24f;
    memcpy(&bits, &magnitude, sizeof bits);
  } else if (exponent == 31) { /* infinity or NaN */
    bits = 0x7f800000 | mantissa << 13;
  } else {
    bits = (exponent + 112) << 23 | mantissa << 13;
  }
  bits |= sign;
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/* ---- planning -------------------------------------------------------------------------------- */

int averager_init(averager *a, hoop_comm *comm, const tensor *tensors, int ntensors,
                  size_t fusion_bytes, int fp16) {
  memset(a, 0, sizeof *a);
  a->comm = comm;
  a->wire_dtype = fp16 ? HOOP_FLOAT16 : HOOP_FLOAT32;
  size_t wire_size = hoop_dtype_size(a->wire_dtype);
  size_t largest = 0;
  for (int i = 0; i < ntensors;) {
    fusion_group *group = &a->groups[a->ngroups++];
    group->first = i;
    group->elements = tensors[i++].count;
    while (i < ntensors && (group->elements + tensors[i].count) * wire_size <= fusion_bytes)
      group->elements += tensors[i++].count;
    group->end = i;
    largest = group->elements > largest ? group->elements : largest;
  }
  a->buffer = malloc(largest ? largest * wire_size : 1);
  return a->buffer ? 0 : -1;
}

/* ---- one step -------------------------------------------------------------------------------- */

static void pack(averager *a, const fusion_group *group, const tensor *tensors, float scale) {
  float *wire32 = a->buffer;
  uint16_t *wire16 = a->buffer;
  size_t at = 0;
  for (int i = group->first; i < group->end; i++)
    for (size_t k = 0; k < tensors[i].count; k++, at++) {
      float share = tensors[i].grad[k] * scale;
      if (a->wire_dtype == HOOP_FLOAT16)
        wire16[at] = float_to_half(share);
      else
        wire32[at] = share;
    }
}

static void unpack(const averager *a, const fusion_group *group, tensor *tensors) {
  const float *wire32 = a->buffer;
  const uint16_t *wire16 = a->buffer;
  size_t at = 0;
  for (int i = group->first; i < group->end; i++)
    for (size_t k = 0; k < tensors[i].count; k++, at++)
      tensors[i].grad[k] = a->wire_dtype == HOOP_FLOAT16 ? half_to_float(wire16[at]) : wire32[at];
}

hoop_result averager_compress(averager *a, int format) {
  a->compress = format;
  if (!(format & HOOP_COMPRESS_FEEDBACK) || a->handle)
    return HOOP_OK;
  size_t largest = 0;
  for (int g = 0; g < a->ngroups; g++)
    largest = a->groups[g].elements > largest ? a->groups[g].elements : largest;
  return hoop_register(a->comm, a->buffer, largest * hoop_dtype_size(a->wire_dtype), &a->handle);
}

hoop_result averager_run(averager *a, tensor *tensors, size_t global_batch) {
  float scale = 1.0f / (float)global_batch;
  for (int g = 0; g < a->ngroups; g++) {
    const fusion_group *group = &a->groups[g];
    double start = now_seconds();
    pack(a, group, tensors, scale);
    double packed = now_seconds();
    /* In place: every rank ends with the same sum, bit for bit, because each element is added up
     * on one rank and then copied around the ring. The parameters stay identical on all ranks. */
    hoop_result result = a->compress ? hoop_compress_next(a->comm, a->compress) : HOOP_OK;
    if (result == HOOP_OK)
      result =
          hoop_allreduce(a->comm, a->buffer, a->buffer, group->elements, a->wire_dtype, HOOP_SUM);
    double reduced = now_seconds();
    if (result != HOOP_OK)
      return result;
    unpack(a, group, tensors);
    a->packing_seconds += (packed - start) + (now_seconds() - reduced);
    a->allreduce_seconds += reduced - packed;
  }
  return HOOP_OK;
}

void averager_free(averager *a) {
  if (a->handle)
    hoop_deregister(a->comm, a->handle);
  a->handle = 0;
  free(a->buffer);
  a->buffer = NULL;
}
