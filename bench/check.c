/* check.c - the inputs hoop-bench writes and the check of what comes back: small integers that are
 * exact in every dtype, and a count of the elements that differ from what the collective should
 * have left, compared through the same encoding. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "hoop-bench.h"

/* Rank r's element i: a small integer, exact in every dtype and after any order of summation
 * (1 everywhere for prod, so that products stay in range too). */
static double input_value(hoop_op op, int r, size_t i) {
  return op == HOOP_PROD ? 1.0 : (double)((r * 7 + (int)(i % 13)) % 5) + 1;
}

static int is_float(hoop_dtype dtype) {
  return dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16 || dtype == HOOP_FLOAT32 ||
         dtype == HOOP_FLOAT64;
}

static void store(void *buf, size_t i, hoop_dtype dtype, double v) {
  switch (dtype) {
  case HOOP_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case HOOP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case HOOP_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
  case HOOP_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
  case HOOP_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
  case HOOP_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case HOOP_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case HOOP_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case HOOP_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case HOOP_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case HOOP_FLOAT64: ((double *)buf)[i] = v; break;
  case HOOP_FLOAT16: { /* small positive integers: exponent and mantissa by hand */
    int e = 0;
    while ((1 << (e + 1)) <= (int)v)
      e++;
    ((uint16_t *)buf)[i] = (uint16_t)(((e + 15) << 10) | ((((int)v << 10) >> e) & 0x3ff));
    break;
  }
  case HOOP_BFLOAT16: {
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16);
    break;
  }
  default: break;
  }
}

void bench_fill(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int r) {
  for (size_t i = 0; i < count; i++)
    store(buf, i, dtype, input_value(op, r, i));
}

static double expected_reduction(size_t i, hoop_op op, hoop_dtype dtype, int nranks) {
  double acc = input_value(op, 0, i);
  if (dtype == HOOP_BOOL) /* every input is true (nonzero): or, and give true, xor the parity */
    return op == HOOP_BXOR ? nranks % 2 : 1;
  for (int r = 1; r < nranks; r++) {
    double v = input_value(op, r, i);
    int64_t a = (int64_t)acc, b = (int64_t)v;
    acc = op == HOOP_PROD   ? acc * v
          : op == HOOP_MIN  ? fmin(acc, v)
          : op == HOOP_MAX  ? fmax(acc, v)
          : op == HOOP_BAND ? (double)(a & b)
          : op == HOOP_BOR  ? (double)(a | b)
          : op == HOOP_BXOR ? (double)(a ^ b)
                            : acc + v;
  }
  if (op == HOOP_AVG)
    acc = is_float(dtype) ? acc / nranks : trunc(acc / nranks);
  return acc;
}

/* A float element back as a double. */
static double load_float(const void *buf, size_t i, hoop_dtype dtype) {
  uint16_t h = dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16 ? ((const uint16_t *)buf)[i] : 0;
  if (dtype == HOOP_FLOAT32)
    return ((const float *)buf)[i];
  if (dtype == HOOP_FLOAT64)
    return ((const double *)buf)[i];
  if (dtype == HOOP_BFLOAT16) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
  }
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -v : v;
}

/* A compressed run's sums may be off by the format's steps (hoop(3), "Slow links"): at most one
 * step of the largest sum (5 per rank) for each host's part and for the result. */
static double compressed_tolerance;

void bench_compressed(int format, int nranks) {
  double step = (format & 0xff) == HOOP_COMPRESS_BF16   ? 0x1p-7
                : (format & 0xff) == HOOP_COMPRESS_FP8  ? 0x1p-3
                : (format & 0xff) == HOOP_COMPRESS_INT8 ? 1.0 / 127
                                                        : 0;
  compressed_tolerance = step * (nranks + 1) * 5.0 * nranks;
}

/* Compare element by element through the same encoding; avg of floats allows rounding, and a
 * compressed sum of floats its format's. */
long bench_count_wrong(const void *buf, size_t count, hoop_dtype dtype, hoop_op op, int kind,
                       int from_rank, size_t first, int nranks) {
  size_t esize = hoop_dtype_size(dtype);
  long wrong = 0;
  unsigned char cell[8];
  for (size_t i = 0; i < count; i++) {
    int reduced = kind == BENCH_ALLREDUCE || kind == BENCH_REDUCE_SCATTER;
    double want = reduced ? expected_reduction(first + i, op, dtype, nranks)
                          : input_value(op, from_rank, first + i);
    store(cell, 0, dtype, want);
    if (reduced && is_float(dtype) && compressed_tolerance > 0 &&
        (op == HOOP_SUM || op == HOOP_AVG) && dtype != HOOP_FLOAT64) {
      double got = load_float(buf, i, dtype);
      wrong += !(fabs(got - want) <= compressed_tolerance / (op == HOOP_AVG ? nranks : 1));
      continue;
    }
    if (memcmp(cell, (const char *)buf + i * esize, esize) != 0 &&
        !(reduced && op == HOOP_AVG && is_float(dtype)))
      wrong++;
  }
  return wrong;
}
