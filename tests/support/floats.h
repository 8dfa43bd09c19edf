/* floats.h - the tests' own numbers, without libhoop: the 16-bit float types converted (float16
 * and bfloat16 to float exactly, and float to them rounded to nearest even), and the mixer the
 * workers draw their inputs from. */
#ifndef HOOP_TEST_FLOATS_H
#define HOOP_TEST_FLOATS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bits_to_float(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static inline float half_to_float(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? INFINITY : ldexp(1024 + man, exp - 25);
  return (float)(sign ? -v : v);
}

/* Round to nearest even: the quantum of x's binade (2^-24 below the normals) divides x exactly. */
static inline uint16_t float_to_half(float f) {
  double x = fabs((double)f);
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isnan(f))
    return sign | 0x7e00;
  int e;
  frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
  double quantum = x < ldexp(1, -14) ? ldexp(1, -24) : ldexp(1, e - 11);
  double q = nearbyint(x / quantum) * quantum;
  if (q >= 65520.0 || isinf(x))
    return sign | 0x7c00;
  if (q < ldexp(1, -14))
    return sign | (uint16_t)(q / ldexp(1, -24));
  frexp(q, &e);
  uint16_t man = (uint16_t)((q / ldexp(1, e - 11)) - 1024);
  return sign | (uint16_t)((e - 1 + 15) << 10) | man;
}

static inline float bf16_to_float(uint16_t b) {
  return bits_to_float((uint32_t)b << 16);
}

static inline uint16_t float_to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  if (isnan(f))
    return (uint16_t)((b >> 16) | 0x40);
  uint32_t lower = b & 0xffff, upper = b >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1)))
    upper++;
  return (uint16_t)upper;
}

/* splitmix64's finaliser: a well-spread 64-bit value from any seed. */
static inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

#endif
