/* reference.c - inputs and expected results for the collective tests (see reference.h). */
#include "reference.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static int is_float(hoop_dtype dtype) {
  return dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16 || dtype == HOOP_FLOAT32 ||
         dtype == HOOP_FLOAT64;
}

static int is_signed(hoop_dtype dtype) {
  return dtype == HOOP_INT8 || dtype == HOOP_INT16 || dtype == HOOP_INT32 || dtype == HOOP_INT64 ||
         is_float(dtype);
}

static int is_bitwise(hoop_op op) {
  return op == HOOP_BAND || op == HOOP_BOR || op == HOOP_BXOR;
}

static int wide(unsigned seed) {
  return (seed & REF_WIDE) != 0;
}

/* A dtype's size in bytes, known here rather than asked of libhoop. */
static size_t dtype_bytes(hoop_dtype dtype) {
  switch (dtype) {
  case HOOP_INT8:
  case HOOP_UINT8:
  case HOOP_BOOL: return 1;
  case HOOP_INT16:
  case HOOP_UINT16:
  case HOOP_FLOAT16:
  case HOOP_BFLOAT16: return 2;
  case HOOP_INT32:
  case HOOP_UINT32:
  case HOOP_FLOAT32: return 4;
  default: return 8;
  }
}

/* The integer types' width in bits (bool's 8). */
static int width_bits(hoop_dtype dtype) {
  return 8 * (int)dtype_bytes(dtype);
}

/* 2^e for e in [-12, 11], exactly (ldexp's, without its call). */
static double pow2(int e) {
  return (double)(1u << (e + 12)) * 0x1p-12;
}

/* A wide float input: a full 53-bit mantissa (stored() rounds it to the dtype), so that sums and
 * products round and their order shows. Sums and averages spread over 2^-3 to 2^4 with both
 * signs, so that partial sums cancel; products lie in +-[0.5, 2), whose product over 9 ranks fits
 * float16. */
static double wide_float(hoop_op op, uint64_t h) {
  double frac = (double)(mix(h) >> 11) * 0x1p-53; /* [0, 1) */
  double sign = (h & 1) ? -1.0 : 1.0;
  if (op == HOOP_PROD)
    return sign * (1.0 + frac) * ((h & 2) ? 0.5 : 1.0);
  if (op == HOOP_MIN || op == HOOP_MAX)
    return sign * (1.0 + frac) * pow2((int)((h >> 2) % 24) - 12);
  return sign * (1.0 + frac) * pow2((int)((h >> 2) % 8) - 3);
}

/* The input as a number. Sums use [-3, 3] (or [0, 6] unsigned); products use +-1 and +-2 (1 and 2
 * unsigned), so float results are exact; min and max use a wide spread. */
static double input_value(hoop_dtype dtype, hoop_op op, int rank, size_t index, unsigned seed) {
  uint64_t h =
      mix(((uint64_t)seed << 40) ^ ((uint64_t)rank << 32) ^ index ^ ((uint64_t)dtype << 56));
  /* bool: false, true and another true byte (2), which results must make 1. */
  if (dtype == HOOP_BOOL)
    return (double)(h % 3);
  if (wide(seed) && is_float(dtype))
    return wide_float(op, h);
  /* Bitwise: random bits over the type's width (at most 40, exact in a double), mostly ones for
   * and so that it does not end all zeros over many ranks; signed types sign-extended. */
  if (is_bitwise(op)) {
    int w = width_bits(dtype) < 40 ? width_bits(dtype) : 40;
    uint64_t bits = op == HOOP_BAND ? ~(h & mix(h) & mix(h + 1)) : h;
    bits &= ((uint64_t)1 << w) - 1;
    if (is_signed(dtype) && (bits >> (w - 1)) & 1)
      return (double)(int64_t)(bits | ~(((uint64_t)1 << w) - 1));
    return (double)bits;
  }
  switch (op) {
  case HOOP_PROD: {
    double v = (h & 1) ? 2.0 : 1.0;
    return is_signed(dtype) && (h & 2) ? -v : v;
  }
  case HOOP_MIN:
  case HOOP_MAX:
    if (dtype == HOOP_INT8 || dtype == HOOP_UINT8)
      return is_signed(dtype) ? (double)(int)(h % 256) - 128 : (double)(h % 256);
    if (dtype == HOOP_INT16 || dtype == HOOP_UINT16)
      return is_signed(dtype) ? (double)(int)(h % 65536) - 32768 : (double)(h % 65536);
    if (dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16)
      return (double)(int)(h % 2001) - 1000; /* rounded to the format by stored() */
    return is_signed(dtype) ? (double)(int64_t)(h % 2000001) - 1000000 : (double)(h % 2000001);
  default: return is_signed(dtype) ? (double)(int)(h % 7) - 3 : (double)(h % 7);
  }
}

/* bfloat16 and float16 encodings of values that are exact in them (tests only use such values,
 * apart from min/max inputs, which are rounded here the way the library would store them). */
static uint16_t to_bf16(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)((bits + rounding) >> 16);
}

static double from_bf16(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t to_half(double v) {
  /* Values here are integers with |v| <= 2048 or results of rounding; go through the exact
   * binary expansion. */
  if (v == 0)
    return signbit(v) ? 0x8000 : 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = fabs(v);
  int e;
  double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  int exp = e - 1 + 15;
  if (exp >= 31)
    return sign | 0x7c00;
  if (exp <= 0) { /* subnormal */
    double q = nearbyint(a / ldexp(1, -24));
    return sign | (uint16_t)q;
  }
  double frac = nearbyint((m * 2 - 1) * 1024);
  if (frac >= 1024) {
    frac = 0;
    exp++;
    if (exp >= 31)
      return sign | 0x7c00;
  }
  return sign | (uint16_t)(exp << 10) | (uint16_t)frac;
}

static double from_half(uint16_t h) {
  int exp = (h >> 10) & 31, frac = h & 1023;
  double v = exp == 0 ? ldexp(frac, -24) : exp == 31 ? INFINITY : ldexp(1024 + frac, exp - 25);
  return (h & 0x8000) ? -v : v;
}

static void store(void *buf, size_t i, hoop_dtype dtype, double v) {
  switch (dtype) {
  case HOOP_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case HOOP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case HOOP_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
  case HOOP_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
  case HOOP_BOOL: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case HOOP_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case HOOP_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case HOOP_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case HOOP_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case HOOP_FLOAT16: ((uint16_t *)buf)[i] = to_half(v); break;
  case HOOP_BFLOAT16: ((uint16_t *)buf)[i] = to_bf16(v); break;
  case HOOP_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case HOOP_FLOAT64: ((double *)buf)[i] = v; break;
  default: break;
  }
}

static double load(const void *buf, size_t i, hoop_dtype dtype) {
  switch (dtype) {
  case HOOP_INT8: return ((const int8_t *)buf)[i];
  case HOOP_UINT8: return ((const uint8_t *)buf)[i];
  case HOOP_INT16: return ((const int16_t *)buf)[i];
  case HOOP_UINT16: return ((const uint16_t *)buf)[i];
  case HOOP_BOOL: return ((const uint8_t *)buf)[i];
  case HOOP_INT32: return ((const int32_t *)buf)[i];
  case HOOP_UINT32: return ((const uint32_t *)buf)[i];
  case HOOP_INT64: return (double)((const int64_t *)buf)[i];
  case HOOP_UINT64: return (double)((const uint64_t *)buf)[i];
  case HOOP_FLOAT16: return from_half(((const uint16_t *)buf)[i]);
  case HOOP_BFLOAT16: return from_bf16(((const uint16_t *)buf)[i]);
  case HOOP_FLOAT32: return ((const float *)buf)[i];
  case HOOP_FLOAT64: return ((const double *)buf)[i];
  default: return NAN;
  }
}

/* The value as the dtype stores it (inputs of min/max in 16-bit floats get rounded); the float
 * types without a trip through memory, and integers that a 16-bit float holds exactly (up to 2^11
 * in float16, 2^8 in bfloat16) as they are. */
static double stored(hoop_dtype dtype, double v) {
  switch (dtype) {
  case HOOP_FLOAT64: return v;
  case HOOP_FLOAT32: return (double)(float)v;
  case HOOP_FLOAT16:
    if (fabs(v) <= 2048 && v == (double)(int)v)
      return v;
    return from_half(to_half(v));
  case HOOP_BFLOAT16:
    if (fabs(v) <= 256 && v == (double)(int)v)
      return v;
    return from_bf16(to_bf16(v));
  default: {
    unsigned char cell[8];
    store(cell, 0, dtype, v);
    return load(cell, 0, dtype);
  }
  }
}

/* ---- Integers, as two's complement bits ------------------------------------------------------
 * Every integer value below is held as the 64 bits of its value sign-extended (zero-extended for
 * the unsigned types), so that int64 and uint64 are exact over their whole range, where a double
 * holds only 53 bits. */

static int is_integer(hoop_dtype dtype) {
  return !is_float(dtype) && dtype != HOOP_BOOL;
}

/* bits cut to the dtype's width and extended back to 64. */
static uint64_t extend(hoop_dtype dtype, uint64_t bits) {
  int w = width_bits(dtype);
  if (w >= 64)
    return bits;
  uint64_t mask = ((uint64_t)1 << w) - 1;
  bits &= mask;
  if (is_signed(dtype) && (bits >> (w - 1)) & 1)
    bits |= ~mask;
  return bits;
}

/* Narrow inputs are input_value's; wide ones random bits over the whole width (mostly ones for
 * band, as there). */
static uint64_t input_bits(hoop_dtype dtype, hoop_op op, int rank, size_t index, unsigned seed) {
  if (!wide(seed))
    return (uint64_t)(int64_t)input_value(dtype, op, rank, index, seed);
  uint64_t h =
      mix(((uint64_t)seed << 40) ^ ((uint64_t)rank << 32) ^ index ^ ((uint64_t)dtype << 56));
  return extend(dtype, op == HOOP_BAND ? ~(h & mix(h) & mix(h + 1)) : mix(h ^ 0x5bd1e995u));
}

static void store_bits(void *buf, size_t i, hoop_dtype dtype, uint64_t bits) {
  switch (dtype_bytes(dtype)) {
  case 1: ((uint8_t *)buf)[i] = (uint8_t)bits; break;
  case 2: ((uint16_t *)buf)[i] = (uint16_t)bits; break;
  case 4: ((uint32_t *)buf)[i] = (uint32_t)bits; break;
  default: ((uint64_t *)buf)[i] = bits; break;
  }
}

static uint64_t load_bits(const void *buf, size_t i, hoop_dtype dtype) {
  switch (dtype_bytes(dtype)) {
  case 1: return extend(dtype, ((const uint8_t *)buf)[i]);
  case 2: return extend(dtype, ((const uint16_t *)buf)[i]);
  case 4: return extend(dtype, ((const uint32_t *)buf)[i]);
  default: return ((const uint64_t *)buf)[i];
  }
}

static int less_bits(hoop_dtype dtype, uint64_t a, uint64_t b) {
  return is_signed(dtype) ? (int64_t)a < (int64_t)b : a < b;
}

/* op over the ranks in modular arithmetic, as the dtype's own would wrap; avg divides the wrapped
 * sum, truncating toward zero. */
static uint64_t expected_bits(hoop_dtype dtype, hoop_op op, int nranks, size_t i, unsigned seed) {
  uint64_t acc = input_bits(dtype, op, 0, i, seed);
  for (int r = 1; r < nranks; r++) {
    uint64_t v = input_bits(dtype, op, r, i, seed);
    switch (op) {
    case HOOP_SUM:
    case HOOP_AVG: acc += v; break;
    case HOOP_PROD: acc *= v; break;
    case HOOP_MIN: acc = less_bits(dtype, v, acc) ? v : acc; break;
    case HOOP_MAX: acc = less_bits(dtype, acc, v) ? v : acc; break;
    case HOOP_BAND: acc &= v; break;
    case HOOP_BOR: acc |= v; break;
    case HOOP_BXOR: acc ^= v; break;
    default: break;
    }
  }
  acc = extend(dtype, acc);
  if (op == HOOP_AVG)
    acc = is_signed(dtype) ? (uint64_t)((int64_t)acc / nranks) : acc / (uint64_t)nranks;
  return extend(dtype, acc);
}

static void describe_bits(char *msg, size_t msglen, const char *what, hoop_dtype dtype,
                          uint64_t want, uint64_t got) {
  if (is_signed(dtype))
    snprintf(msg, msglen, "%s: expected %lld, got %lld", what, (long long)want, (long long)got);
  else
    snprintf(msg, msglen, "%s: expected %llu, got %llu", what, (unsigned long long)want,
             (unsigned long long)got);
}

void ref_fill(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int rank, unsigned seed) {
  for (size_t i = 0; i < count; i++) {
    if (is_integer(dtype))
      store_bits(buf, i, dtype, input_bits(dtype, op, rank, i, seed));
    else
      store(buf, i, dtype, input_value(dtype, op, rank, i, seed));
  }
}

/* bool over the ranks: any nonzero byte true; sum and max or, prod and min and; a combined value
 * is 0 or 1. */
static double expected_bool(hoop_op op, int nranks, size_t i, unsigned seed) {
  double first = stored(HOOP_BOOL, input_value(HOOP_BOOL, op, 0, i, seed));
  if (nranks == 1)
    return first; /* nothing combined: the input as it is */
  int acc = first != 0;
  for (int r = 1; r < nranks; r++) {
    int v = stored(HOOP_BOOL, input_value(HOOP_BOOL, op, r, i, seed)) != 0;
    acc = op == HOOP_BXOR                                      ? acc != v
          : op == HOOP_SUM || op == HOOP_MAX || op == HOOP_BOR ? acc || v
                                                               : acc && v;
  }
  return acc;
}

/* The float dtypes' unit roundoff (half the distance from 1 to the next value) and their
 * smallest subnormal. */
static double unit_roundoff(hoop_dtype dtype) {
  return dtype == HOOP_FLOAT64   ? 0x1p-53
         : dtype == HOOP_FLOAT32 ? 0x1p-24
         : dtype == HOOP_FLOAT16 ? 0x1p-11
                                 : 0x1p-8;
}

static double smallest(hoop_dtype dtype) {
  return dtype == HOOP_FLOAT64   ? 0x1p-1074
         : dtype == HOOP_FLOAT32 ? 0x1p-149
         : dtype == HOOP_FLOAT16 ? 0x1p-24
                                 : 0x1p-133;
}

/* A float (or bool) result over the ranks, in long double, and how far a right answer may lie
 * from it (*bound). Narrow inputs are exact in any order (bound 0), but for avg's division.
 * Wide ones round: the n - 1 additions or multiplications of any order each err by at most u
 * times the magnitude so far, which is at most sum |x| (or |product| for prod), twice for the
 * 16-bit types (added in float, stored in their own), and avg's division and the last store
 * once more: (n + 2) u sum |x| bounds them all, (n + 2) u sum |x| / n for avg, plus the
 * dtype's smallest step for each rounding near zero. */
static long double expected(hoop_dtype dtype, hoop_op op, int nranks, size_t i, unsigned seed,
                            double *bound) {
  *bound = 0;
  if (dtype == HOOP_BOOL)
    return expected_bool(op, nranks, i, seed);
  long double acc = stored(dtype, input_value(dtype, op, 0, i, seed)), magnitude = fabsl(acc);
  for (int r = 1; r < nranks; r++) {
    double v = stored(dtype, input_value(dtype, op, r, i, seed));
    switch (op) {
    case HOOP_SUM:
    case HOOP_AVG:
      acc += v;
      magnitude += fabs(v);
      break;
    case HOOP_PROD: acc *= v; break;
    case HOOP_MIN: acc = v < acc ? v : acc; break;
    case HOOP_MAX: acc = v > acc ? v : acc; break;
    default: break;
    }
  }
  if (op == HOOP_PROD)
    magnitude = fabsl(acc);
  if (op == HOOP_AVG) {
    acc /= nranks;
    magnitude /= nranks;
  }
  if (op == HOOP_AVG && !wide(seed)) {
    /* Exact sums, one rounding in the division (and the 16-bit store). */
    *bound = 2 * unit_roundoff(dtype) * (double)fabsl(acc) + smallest(dtype);
  } else if (wide(seed) && op != HOOP_MIN && op != HOOP_MAX) {
    double n2 = nranks + 2;
    *bound = n2 * unit_roundoff(dtype) * (double)magnitude + n2 * smallest(dtype);
  }
  return acc;
}

size_t ref_check_reduced(const void *buf, size_t first, size_t count, hoop_dtype dtype, hoop_op op,
                         int nranks, unsigned seed, char *msg, size_t msglen) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    if (is_integer(dtype)) {
      uint64_t want = expected_bits(dtype, op, nranks, first + i, seed),
               got = load_bits(buf, i, dtype);
      if (want != got && wrong++ == 0) {
        char what[48];
        snprintf(what, sizeof what, "element %zu", first + i);
        describe_bits(msg, msglen, what, dtype, want, got);
      }
      continue;
    }
    double bound;
    long double want = expected(dtype, op, nranks, first + i, seed, &bound);
    double got = load(buf, i, dtype);
    if (!(fabsl(want - got) <= bound) && wrong++ == 0)
      snprintf(msg, msglen, "element %zu: expected %.17Lg (within %.3g), got %.17g", first + i,
               want, bound, got);
  }
  return wrong;
}

size_t ref_check_allreduce(const void *buf, size_t count, hoop_dtype dtype, hoop_op op, int nranks,
                           unsigned seed, char *msg, size_t msglen) {
  return ref_check_reduced(buf, 0, count, dtype, op, nranks, seed, msg, msglen);
}

size_t ref_check_equal(const void *buf, size_t count, hoop_dtype dtype, hoop_op op, int rank,
                       unsigned seed, char *msg, size_t msglen) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    if (is_integer(dtype)) {
      uint64_t want = input_bits(dtype, op, rank, i, seed), got = load_bits(buf, i, dtype);
      if (want != got && wrong++ == 0) {
        char what[64];
        snprintf(what, sizeof what, "element %zu (rank %d's input)", i, rank);
        describe_bits(msg, msglen, what, dtype, want, got);
      }
      continue;
    }
    double want = stored(dtype, input_value(dtype, op, rank, i, seed)), got = load(buf, i, dtype);
    if (want != got && wrong++ == 0)
      snprintf(msg, msglen, "element %zu: expected %.17g (rank %d's input), got %.17g", i, want,
               rank, got);
  }
  return wrong;
}
