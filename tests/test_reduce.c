/* test_reduce.c - the reduction kernels against a plain scalar reference: every dtype x op, counts
 * around the vector widths, out of place and in place; float16 and bfloat16 conversions against a
 * textbook encoder; and the AVG division of hoop__reduce_finish. */
#include <check.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hoop.h"
#include "mem/reduce.h"

/* ---- dtypes as the reference sees them ------------------------------------------------------- */

typedef enum value_kind { SIGNED, UNSIGNED, FLOAT32, FLOAT64, HALF, BOOLEAN } value_kind;

/* The test keeps its own table rather than use dtype.c, so that it builds with reduce.c alone. */
static const struct {
  const char *name;
  size_t size;
  value_kind kind;
  int exp_bits, mant_bits; /* HALF only: the binary16 or bfloat16 layout */
} dtypes[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = {"int8", 1, SIGNED, 0, 0},        [HOOP_UINT8] = {"uint8", 1, UNSIGNED, 0, 0},
    [HOOP_INT32] = {"int32", 4, SIGNED, 0, 0},      [HOOP_UINT32] = {"uint32", 4, UNSIGNED, 0, 0},
    [HOOP_INT64] = {"int64", 8, SIGNED, 0, 0},      [HOOP_UINT64] = {"uint64", 8, UNSIGNED, 0, 0},
    [HOOP_FLOAT16] = {"float16", 2, HALF, 5, 10},   [HOOP_BFLOAT16] = {"bfloat16", 2, HALF, 8, 7},
    [HOOP_FLOAT32] = {"float32", 4, FLOAT32, 0, 0}, [HOOP_FLOAT64] = {"float64", 8, FLOAT64, 0, 0},
    [HOOP_INT16] = {"int16", 2, SIGNED, 0, 0},      [HOOP_UINT16] = {"uint16", 2, UNSIGNED, 0, 0},
    [HOOP_BOOL] = {"bool", 1, BOOLEAN, 0, 0},
};

static const char *const op_names[HOOP_OP_COUNT] = {"sum", "prod", "min", "max",
                                                    "avg", "band", "bor", "bxor"};

/* What hoop.h refuses (the calls say so before any kernel runs): bitwise ops on the float types,
 * and bool's AVG. The kernels must leave memory alone for them. */
static int refused(hoop_dtype dtype, hoop_op op) {
  value_kind k = dtypes[dtype].kind;
  return (op >= HOOP_BAND && (k == FLOAT32 || k == FLOAT64 || k == HALF)) ||
         (op == HOOP_AVG && k == BOOLEAN);
}

/* Counts that are not multiples of any vector width, and that cross the 64-element spans and the
 * 256-element float16 blocks of reduce.c. */
static const size_t counts[] = {0, 1, 2, 3, 7, 31, 257, 1000, 4099};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* ck_assert_msg reports its location to the parent process on every pass; in loops over many
 * thousands of values only a failure is worth that. */
#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ck_abort_msg(__VA_ARGS__);                                                                   \
  } while (0)

/* A deterministic generator, so that a failure can be reproduced. */
static uint64_t rng_state;

static void rng_seed(uint64_t seed) {
  rng_state = seed * 0x9e3779b97f4a7c15u + 1;
}

static uint64_t rng_next(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Element i of buf as raw bits, zero-extended. */
static uint64_t get_bits(const void *buf, size_t i, size_t size) {
  const unsigned char *p = (const unsigned char *)buf + i * size;
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  switch (size) {
  case 1: memcpy(&u8, p, 1); return u8;
  case 2: memcpy(&u16, p, 2); return u16;
  case 4: memcpy(&u32, p, 4); return u32;
  default: memcpy(&u64, p, 8); return u64;
  }
}

static void set_bits(void *buf, size_t i, size_t size, uint64_t bits) {
  unsigned char *p = (unsigned char *)buf + i * size;
  uint8_t u8 = (uint8_t)bits;
  uint16_t u16 = (uint16_t)bits;
  uint32_t u32 = (uint32_t)bits;
  switch (size) {
  case 1: memcpy(p, &u8, 1); break;
  case 2: memcpy(p, &u16, 2); break;
  case 4: memcpy(p, &u32, 4); break;
  default: memcpy(p, &bits, 8); break;
  }
}

/* Sign-extends the low 8 * size bits. */
static int64_t as_signed(uint64_t bits, size_t size) {
  if (size == 8)
    return (int64_t)bits;
  uint64_t sign = (uint64_t)1 << (8 * size - 1);
  return (int64_t)((bits ^ sign) - sign);
}

static float bits_to_float(uint64_t bits) {
  uint32_t u = (uint32_t)bits;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static double bits_to_double(uint64_t bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

static uint64_t double_to_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

/* ---- a textbook float16 / bfloat16 codec ----------------------------------------------------- */

/* The value of bits in a binary format with exp_bits exponent and mant_bits mantissa bits. */
static double ref_decode(uint64_t bits, int exp_bits, int mant_bits) {
  int bias = (1 << (exp_bits - 1)) - 1;
  unsigned exp = (unsigned)(bits >> mant_bits) & ((1u << exp_bits) - 1);
  unsigned mant = (unsigned)bits & ((1u << mant_bits) - 1);
  double mag;
  if (exp == (1u << exp_bits) - 1)
    mag = mant ? NAN : INFINITY;
  else if (exp == 0)
    mag = ldexp(mant, 1 - bias - mant_bits);
  else
    mag = ldexp(mant + (1u << mant_bits), (int)exp - bias - mant_bits);
  return (bits >> (exp_bits + mant_bits)) & 1 ? -mag : mag;
}

/* x rounded to nearest even in that format: find x's binade (subnormals share the lowest one),
 * count x in steps of that binade and round the count with nearbyint. NaN gives a quiet NaN. */
static uint16_t ref_encode(double x, int exp_bits, int mant_bits) {
  int bias = (1 << (exp_bits - 1)) - 1;
  uint16_t sign = signbit(x) ? (uint16_t)(1u << (exp_bits + mant_bits)) : 0;
  uint16_t inf = (uint16_t)(((1u << exp_bits) - 1) << mant_bits);
  x = fabs(x);
  if (isnan(x))
    return sign | inf | (uint16_t)(1u << (mant_bits - 1));
  if (x == 0)
    return sign;
  if (isinf(x))
    return sign | inf;
  int e;
  frexp(x, &e);
  int exp = e - 1 < 1 - bias ? 1 - bias : e - 1;
  double steps = nearbyint(ldexp(x, mant_bits - exp));
  if (steps == ldexp(1, mant_bits + 1)) { /* rounded up into the next binade */
    steps /= 2;
    exp++;
  }
  if (exp > bias)
    return sign | inf;
  if (steps < ldexp(1, mant_bits)) /* subnormal */
    return sign | (uint16_t)steps;
  uint32_t mant = (uint32_t)steps - (1u << mant_bits);
  return sign | (uint16_t)(((uint32_t)(exp + bias) << mant_bits) | mant);
}

static int half_is_nan(uint64_t bits, hoop_dtype dtype) {
  return isnan(ref_decode(bits, dtypes[dtype].exp_bits, dtypes[dtype].mant_bits));
}

/* ---- the reference --------------------------------------------------------------------------- */

/* Integers in 64-bit wrap-around arithmetic, cut to the dtype's width by set_bits. */
static uint64_t ref_int(hoop_op op, value_kind k, size_t size, uint64_t a, uint64_t b) {
  int64_t sa = as_signed(a, size), sb = as_signed(b, size);
  int a_less = k == SIGNED ? sa < sb : a < b;
  switch (op) {
  case HOOP_PROD: return (uint64_t)sa * (uint64_t)sb;
  case HOOP_MIN: return a_less ? a : b;
  case HOOP_MAX: return a_less ? b : a;
  case HOOP_BAND: return a & b;
  case HOOP_BOR: return a | b;
  case HOOP_BXOR: return a ^ b;
  default: return (uint64_t)sa + (uint64_t)sb; /* SUM and AVG */
  }
}

/* bool: any nonzero byte is true; SUM, MAX and BOR are or, PROD, MIN and BAND and. */
static uint64_t ref_bool(hoop_op op, uint64_t a, uint64_t b) {
  int x = a != 0, y = b != 0;
  switch (op) {
  case HOOP_SUM:
  case HOOP_MAX:
  case HOOP_BOR: return (uint64_t)(x || y);
  case HOOP_BXOR: return (uint64_t)(x != y);
  default: return (uint64_t)(x && y); /* PROD, MIN, BAND */
  }
}

#define REF_FLOAT_OP(op, x, y)                                                                     \
  ((op) == HOOP_PROD  ? (x) * (y)                                                                  \
   : (op) == HOOP_MIN ? ((x) < (y) ? (x) : (y))                                                    \
   : (op) == HOOP_MAX ? ((x) > (y) ? (x) : (y))                                                    \
                      : (x) + (y))

/* The expected bits of a op b for one element. float16 and bfloat16 combine in float and round
 * once, which is what reduce.h promises. */
static uint64_t ref_combine(hoop_dtype dtype, hoop_op op, uint64_t a, uint64_t b) {
  size_t size = dtypes[dtype].size;
  int exp_bits = dtypes[dtype].exp_bits, mant_bits = dtypes[dtype].mant_bits;
  switch (dtypes[dtype].kind) {
  case FLOAT32: {
    float x = bits_to_float(a), y = bits_to_float(b);
    return float_to_bits(REF_FLOAT_OP(op, x, y));
  }
  case FLOAT64: {
    double x = bits_to_double(a), y = bits_to_double(b);
    return double_to_bits(REF_FLOAT_OP(op, x, y));
  }
  case HALF: {
    float x = (float)ref_decode(a, exp_bits, mant_bits);
    float y = (float)ref_decode(b, exp_bits, mant_bits);
    return ref_encode(REF_FLOAT_OP(op, x, y), exp_bits, mant_bits);
  }
  case BOOLEAN: return ref_bool(op, a, b);
  default: return ref_int(op, dtypes[dtype].kind, size, a, b) & (~(uint64_t)0 >> (64 - 8 * size));
  }
}

/* Bit-exact, except that any NaN matches any NaN: their payloads are not specified. */
static int same_value(hoop_dtype dtype, uint64_t expected, uint64_t got) {
  switch (dtypes[dtype].kind) {
  case FLOAT32:
    return expected == got || (isnan(bits_to_float(expected)) && isnan(bits_to_float(got)));
  case FLOAT64:
    return expected == got || (isnan(bits_to_double(expected)) && isnan(bits_to_double(got)));
  case HALF: return expected == got || (half_is_nan(expected, dtype) && half_is_nan(got, dtype));
  default: return expected == got;
  }
}

/* "0x3c00 (1)" and the like, for failure messages; rotates over a few buffers. */
static const char *describe(hoop_dtype dtype, uint64_t bits) {
  static char text[4][64];
  static int next;
  char *out = text[next++ % 4];
  size_t size = dtypes[dtype].size;
  int hex = (int)(2 * size);
  switch (dtypes[dtype].kind) {
  case SIGNED: snprintf(out, 64, "%" PRId64, as_signed(bits, size)); break;
  case UNSIGNED:
  case BOOLEAN: snprintf(out, 64, "%" PRIu64, bits); break;
  case FLOAT32: snprintf(out, 64, "0x%08" PRIx64 " (%.9g)", bits, bits_to_float(bits)); break;
  case FLOAT64: snprintf(out, 64, "0x%016" PRIx64 " (%.17g)", bits, bits_to_double(bits)); break;
  case HALF:
    snprintf(out, 64, "0x%0*" PRIx64 " (%.9g)", hex, bits,
             ref_decode(bits, dtypes[dtype].exp_bits, dtypes[dtype].mant_bits));
    break;
  }
  return out;
}

/* ---- inputs ---------------------------------------------------------------------------------- */

static uint64_t random_int(size_t size) {
  /* Mostly random bits; one in four from the edges, where wrapping and ordering go wrong. */
  uint64_t top = (uint64_t)1 << (8 * size - 1);
  const uint64_t edges[] = {0, 1, ~(uint64_t)0, top, top - 1, top + 1, 2, ~(uint64_t)0 - 1};
  uint64_t r = rng_next();
  if (r % 4 == 0)
    return edges[(r >> 8) % (sizeof edges / sizeof edges[0])];
  return rng_next();
}

/* Zeros of both signs, small integers (equal pairs for min and max), large and tiny magnitudes
 * (overflow and underflow in prod), infinities, and ordinary values with fractions. */
static double random_real(double large, double tiny) {
  uint64_t r = rng_next();
  double sign = r & 1 ? -1.0 : 1.0;
  double unit = (double)(rng_next() >> 11) * 0x1p-53; /* [0, 1) */
  switch ((r >> 1) % 16) {
  case 0: return 0.0;
  case 1: return -0.0;
  case 2: return sign * (double)((r >> 8) % 4);
  case 3: return sign * large * (1 + unit);
  case 4: return sign * ldexp(tiny * (1 + unit), -(int)((r >> 8) % 40)); /* down to subnormal */
  case 5: return (r >> 8) % 4 == 0 ? sign * INFINITY : sign * unit;
  default: return sign * 2000 * unit;
  }
}

static uint64_t random_element(hoop_dtype dtype) {
  size_t size = dtypes[dtype].size;
  switch (dtypes[dtype].kind) {
  case BOOLEAN: {
    /* Mostly 0 and 1; one in eight another true byte, which the result must make 1. */
    uint64_t r = rng_next();
    return r % 8 == 0 ? 2 + (r >> 8) % 254 : (r >> 8) & 1;
  }
  case FLOAT32: return float_to_bits((float)random_real(1e30, 1e-30));
  case FLOAT64: return double_to_bits(random_real(1e300, 1e-300));
  case HALF: {
    /* Any bit pattern but NaN covers subnormals, infinities and the whole range. */
    uint64_t bits;
    do
      bits = rng_next() & 0xffff;
    while (half_is_nan(bits, dtype));
    return bits;
  }
  default: return random_int(size) & (~(uint64_t)0 >> (64 - 8 * size));
  }
}

static void fill(void *buf, size_t count, hoop_dtype dtype) {
  for (size_t i = 0; i < count; i++)
    set_bits(buf, i, dtypes[dtype].size, random_element(dtype));
}

/* ---- hoop__reduce3 and hoop__reduce against the reference ------------------------------------ */

typedef enum aliasing { APART, DST_IS_A, DST_IS_B, DST_IS_BOTH } aliasing;

static const char *const aliasing_names[] = {
    [APART] = "hoop__reduce3(dst, a, b)",
    [DST_IS_A] = "hoop__reduce(a, b)",
    [DST_IS_B] = "hoop__reduce3(b, a, b)",
    [DST_IS_BOTH] = "hoop__reduce(a, a)",
};

enum { GUARD = 16 }; /* elements after dst that must stay untouched */
#define GUARD_BYTE 0xa5

/* malloc(0) may return NULL, which would read as a failure. */
static void *malloc_exact(size_t bytes) {
  return malloc(bytes ? bytes : 1);
}

/* Reduces count elements, offset elements into freshly allocated buffers, the way `how` says, and
 * checks every element and the guard after dst. The inputs are allocated to their exact size so
 * that AddressSanitizer sees any read past the end. */
static void check_reduce(hoop_dtype dtype, hoop_op op, size_t count, size_t offset, aliasing how) {
  size_t size = dtypes[dtype].size;
  unsigned char *a_buf = malloc_exact((offset + count) * size);
  unsigned char *b_buf = malloc_exact((offset + count) * size);
  unsigned char *d_buf = malloc_exact((offset + count + GUARD) * size);
  ck_assert(a_buf && b_buf && d_buf);
  unsigned char *a = a_buf + offset * size, *b = b_buf + offset * size,
                *dst = d_buf + offset * size;
  rng_seed(((uint64_t)dtype * HOOP_OP_COUNT + op) * 1000003 + count * 7 + offset);
  fill(a, count, dtype);
  fill(b, count, dtype);
  memset(d_buf, GUARD_BYTE, (offset + count + GUARD) * size);
  const unsigned char *x = a, *y = how == DST_IS_BOTH ? a : b;

  if (refused(dtype, op)) {
    /* No kernel: dst must stay as it was (the guard bytes). */
    hoop__reduce3(dst, a, b, count, dtype, op);
    hoop__reduce(dst, b, count, dtype, op);
    for (size_t i = 0; i < (count + GUARD) * size; i++)
      EXPECT(dst[i] == GUARD_BYTE, "%s %s (refused): byte %zu of dst was written",
             dtypes[dtype].name, op_names[op], i);
    free(d_buf);
    free(b_buf);
    free(a_buf);
    return;
  }
  switch (how) {
  case APART: hoop__reduce3(dst, a, b, count, dtype, op); break;
  case DST_IS_A:
    memcpy(dst, a, count * size);
    hoop__reduce(dst, b, count, dtype, op);
    break;
  case DST_IS_B:
    memcpy(dst, b, count * size);
    hoop__reduce3(dst, a, dst, count, dtype, op);
    break;
  case DST_IS_BOTH:
    memcpy(dst, a, count * size);
    hoop__reduce(dst, dst, count, dtype, op);
    break;
  }

  for (size_t i = 0; i < count; i++) {
    uint64_t xa = get_bits(x, i, size), yb = get_bits(y, i, size);
    uint64_t expected = ref_combine(dtype, op, xa, yb), got = get_bits(dst, i, size);
    EXPECT(same_value(dtype, expected, got),
           "%s %s, %s, count %zu, offset %zu, element %zu: %s op %s: expected %s, got %s",
           dtypes[dtype].name, op_names[op], aliasing_names[how], count, offset, i,
           describe(dtype, xa), describe(dtype, yb), describe(dtype, expected),
           describe(dtype, got));
  }
  for (size_t i = 0; i < GUARD * size; i++)
    EXPECT(dst[count * size + i] == GUARD_BYTE,
           "%s %s, %s, count %zu: byte %zu after the end was written (0x%02x)", dtypes[dtype].name,
           op_names[op], aliasing_names[how], count, i, dst[count * size + i]);
  free(d_buf);
  free(b_buf);
  free(a_buf);
}

/* _i runs over dtype x op. */
static void check_all_counts(int combination, aliasing how) {
  hoop_dtype dtype = (hoop_dtype)(combination / HOOP_OP_COUNT);
  hoop_op op = (hoop_op)(combination % HOOP_OP_COUNT);
  for (size_t c = 0; c < NCOUNTS; c++)
    for (size_t offset = 0; offset < 2; offset++)
      check_reduce(dtype, op, counts[c], offset, how);
}

START_TEST(test_reduce3_out_of_place) {
  check_all_counts(_i, APART);
}
END_TEST

START_TEST(test_reduce_in_place_into_a) {
  check_all_counts(_i, DST_IS_A);
}
END_TEST

START_TEST(test_reduce3_in_place_into_b) {
  check_all_counts(_i, DST_IS_B);
}
END_TEST

START_TEST(test_reduce_with_itself) {
  check_all_counts(_i, DST_IS_BOTH);
}
END_TEST

/* Out of place with both inputs the same buffer. */
START_TEST(test_reduce3_same_inputs) {
  hoop_dtype dtype = (hoop_dtype)(_i / HOOP_OP_COUNT);
  hoop_op op = (hoop_op)(_i % HOOP_OP_COUNT);
  size_t size = dtypes[dtype].size, count = 1000;
  unsigned char *a = malloc(count * size), *dst = malloc(count * size);
  ck_assert(a && dst);
  rng_seed(42 + (uint64_t)_i);
  fill(a, count, dtype);
  if (refused(dtype, op)) {
    free(dst);
    free(a);
    return; /* check_reduce checks that refused pairs leave memory alone */
  }
  hoop__reduce3(dst, a, a, count, dtype, op);
  for (size_t i = 0; i < count; i++) {
    uint64_t x = get_bits(a, i, size), expected = ref_combine(dtype, op, x, x);
    uint64_t got = get_bits(dst, i, size);
    EXPECT(same_value(dtype, expected, got),
           "%s %s, hoop__reduce3(dst, a, a), element %zu: %s: expected %s, got %s",
           dtypes[dtype].name, op_names[op], i, describe(dtype, x), describe(dtype, expected),
           describe(dtype, got));
  }
  free(dst);
  free(a);
}
END_TEST

/* Unknown dtypes and ops are the caller's to reject; the kernels leave memory alone. */
START_TEST(test_unknown_dtype_or_op_does_nothing) {
  uint8_t a[64], b[64], dst[64], before[64];
  for (int i = 0; i < 64; i++) {
    a[i] = (uint8_t)i;
    b[i] = (uint8_t)(3 * i);
    dst[i] = before[i] = (uint8_t)(100 + i);
  }
  const struct {
    int dtype, op;
  } cases[] = {{HOOP_DTYPE_COUNT, HOOP_SUM},
               {-1, HOOP_SUM},
               {HOOP_INT8, HOOP_OP_COUNT},
               {HOOP_INT8, -1},
               {HOOP_DTYPE_COUNT, HOOP_OP_COUNT}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hoop__reduce3(dst, a, b, 8, (hoop_dtype)cases[c].dtype, (hoop_op)cases[c].op);
    hoop__reduce(dst, a, 8, (hoop_dtype)cases[c].dtype, (hoop_op)cases[c].op);
    hoop__reduce_finish(dst, 8, (hoop_dtype)cases[c].dtype, (hoop_op)cases[c].op, 2);
    if ((unsigned)cases[c].dtype >= HOOP_DTYPE_COUNT)
      hoop__reduce_finish(dst, 8, (hoop_dtype)cases[c].dtype, HOOP_AVG, 2);
    ck_assert_msg(memcmp(dst, before, sizeof dst) == 0,
                  "dtype %d op %d: expected dst untouched, but it changed", cases[c].dtype,
                  cases[c].op);
  }
}
END_TEST

/* ---- min and max with NaN and signed zeros --------------------------------------------------- */

/* reduce.c's kernels follow x86 minps/maxps: a < b ? a : b. So a NaN in b wins, a NaN in a loses,
 * and of two zeros b is returned; the in-place forms must keep that operand order. */
static void check_min_max_order(hoop_dtype dtype, uint64_t nan, uint64_t one, uint64_t pzero,
                                uint64_t nzero) {
  const uint64_t pairs[][2] = {{nan, one}, {one, nan}, {pzero, nzero}, {nzero, pzero}};
  size_t size = dtypes[dtype].size;
  for (hoop_op op = HOOP_MIN; op <= HOOP_MAX; op++)
    for (size_t p = 0; p < 4; p++)
      for (aliasing how = APART; how <= DST_IS_B; how++) {
        unsigned char a[8], b[8], dst[8];
        set_bits(a, 0, size, pairs[p][0]);
        set_bits(b, 0, size, pairs[p][1]);
        if (how == APART) {
          hoop__reduce3(dst, a, b, 1, dtype, op);
        } else if (how == DST_IS_A) {
          memcpy(dst, a, size);
          hoop__reduce(dst, b, 1, dtype, op);
        } else {
          memcpy(dst, b, size);
          hoop__reduce3(dst, a, dst, 1, dtype, op);
        }
        uint64_t expected = pairs[p][1], got = get_bits(dst, 0, size);
        ck_assert_msg(same_value(dtype, expected, got),
                      "%s %s, %s: %s op %s: expected %s (the second operand), got %s",
                      dtypes[dtype].name, op_names[op], aliasing_names[how],
                      describe(dtype, pairs[p][0]), describe(dtype, pairs[p][1]),
                      describe(dtype, expected), describe(dtype, got));
      }
}

START_TEST(test_min_max_nan_and_zero_order) {
  check_min_max_order(HOOP_FLOAT32, 0x7fc00000, float_to_bits(1.0f), 0, 0x80000000);
  check_min_max_order(HOOP_FLOAT64, 0x7ff8000000000000, double_to_bits(1.0), 0, 0x8000000000000000);
  check_min_max_order(HOOP_FLOAT16, 0x7e00, 0x3c00, 0, 0x8000);
  check_min_max_order(HOOP_BFLOAT16, 0x7fc0, 0x3f80, 0, 0x8000);
}
END_TEST

/* ---- float16 conversions --------------------------------------------------------------------- */

static uint16_t ref_half(float f) {
  return ref_encode(f, 5, 10);
}

START_TEST(test_half_known_values) {
  const struct {
    float f;
    uint16_t h;
  } cases[] = {
      {1.0f, 0x3c00},      {-2.0f, 0xc000},           {0.5f, 0x3800},
      {65504.0f, 0x7bff},  {-65504.0f, 0xfbff},       {0.0f, 0x0000},
      {-0.0f, 0x8000},     {INFINITY, 0x7c00},        {-INFINITY, 0xfc00},
      {0x1p-14f, 0x0400},  {0x1p-24f, 0x0001},        {0x3ffp-24f, 0x03ff},
      {-0x1p-24f, 0x8001}, {0.333251953125f, 0x3555}, {1024.0f, 0x6400},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    uint16_t h = hoop__float_to_half(cases[c].f);
    ck_assert_msg(h == cases[c].h, "float_to_half(%a): expected 0x%04x, got 0x%04x", cases[c].f,
                  cases[c].h, h);
    float back = hoop__half_to_float(cases[c].h);
    ck_assert_msg(float_to_bits(back) == float_to_bits(cases[c].f),
                  "half_to_float(0x%04x): expected %a, got %a", cases[c].h, cases[c].f, back);
  }
}
END_TEST

START_TEST(test_half_rounding_overflow_underflow) {
  const struct {
    float f;
    uint16_t h;
  } cases[] = {
      {1.0f + 0x1p-11f, 0x3c00},            /* tie between 1 and 1+2^-10: even, down */
      {1.0f + 0x3p-11f, 0x3c02},            /* tie: even, up */
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01}, /* just above the tie */
      {65519.0f, 0x7bff},                   /* below the midpoint to 65536 */
      {65520.0f, 0x7c00},                   /* the midpoint rounds to even: inf */
      {1e10f, 0x7c00},
      {-1e10f, 0xfc00},
      {FLT_MAX, 0x7c00},
      {-FLT_MAX, 0xfc00},
      {0x1p-25f, 0x0000},        /* half the smallest subnormal: tie to even 0 */
      {0x1.000002p-25f, 0x0001}, /* just above it */
      {0x3p-25f, 0x0002},        /* subnormal tie, up to even */
      {0x5p-25f, 0x0002},        /* subnormal tie, down to even */
      {-0x1p-26f, 0x8000},
      {FLT_TRUE_MIN, 0x0000},
      {0x1.ffcp-15f, 0x0400},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    uint16_t h = hoop__float_to_half(cases[c].f);
    ck_assert_msg(h == cases[c].h, "float_to_half(%a): expected 0x%04x, got 0x%04x", cases[c].f,
                  cases[c].h, h);
  }
}
END_TEST

START_TEST(test_half_nan_stays_nan) {
  const uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xff800001, 0x7fffffff};
  for (size_t c = 0; c < sizeof nans / sizeof nans[0]; c++) {
    uint16_t h = hoop__float_to_half(bits_to_float(nans[c]));
    ck_assert_msg((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0,
                  "float_to_half(NaN 0x%08x): expected a NaN, got 0x%04x", nans[c], h);
    ck_assert_msg((h & 0x8000) == ((nans[c] >> 16) & 0x8000),
                  "float_to_half(NaN 0x%08x): expected the sign kept, got 0x%04x", nans[c], h);
  }
  const uint16_t half_nans[] = {0x7e00, 0xfe00, 0x7c01, 0x7fff, 0xfc01};
  for (size_t c = 0; c < sizeof half_nans / sizeof half_nans[0]; c++) {
    float f = hoop__half_to_float(half_nans[c]);
    ck_assert_msg(isnan(f), "half_to_float(0x%04x): expected NaN, got %a", half_nans[c], f);
  }
}
END_TEST

/* All 65536 patterns: widening matches the textbook decoder, and narrowing gives the pattern back
 * (NaNs only need to stay NaN). */
START_TEST(test_half_round_trip_all_patterns) {
  for (uint32_t h = 0; h <= 0xffff; h++) {
    float f = hoop__half_to_float((uint16_t)h);
    double expected = ref_decode(h, 5, 10);
    uint16_t back = hoop__float_to_half(f);
    if (isnan(expected)) {
      EXPECT(isnan(f), "half_to_float(0x%04x): expected NaN, got %a", h, f);
      EXPECT(half_is_nan(back, HOOP_FLOAT16),
             "float_to_half(half_to_float(0x%04x)): expected NaN, got 0x%04x", h, back);
      continue;
    }
    EXPECT(float_to_bits(f) == float_to_bits((float)expected),
           "half_to_float(0x%04x): expected %a, got %a", h, expected, f);
    EXPECT(back == h, "float_to_half(half_to_float(0x%04x)) = 0x%04x", h, back);
  }
}
END_TEST

/* Every midpoint between two neighbouring halves rounds to the even one, and the floats just
 * around it to the nearer one; 0x7bff's upper neighbour is 65536, beyond which lies inf. */
START_TEST(test_half_every_tie) {
  for (uint32_t h = 0; h < 0x7c00; h++) {
    float lo = (float)ref_decode(h, 5, 10);
    float hi = h + 1 == 0x7c00 ? 65536.0f : (float)ref_decode(h + 1, 5, 10);
    float mid = lo + (hi - lo) / 2;
    uint32_t even = h % 2 ? h + 1 : h;
    const struct {
      float f;
      uint32_t h;
    } cases[] = {{mid, even}, {nextafterf(mid, 0), h}, {nextafterf(mid, INFINITY), h + 1}};
    for (size_t c = 0; c < 3; c++)
      for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        float f = sign ? -cases[c].f : cases[c].f;
        uint16_t got = hoop__float_to_half(f);
        EXPECT(got == (cases[c].h | sign), "float_to_half(%a): expected 0x%04x, got 0x%04x", f,
               cases[c].h | sign, got);
      }
  }
}
END_TEST

/* Random floats, half of them in or near the float16 range, against the textbook encoder. */
START_TEST(test_half_random_floats) {
  rng_seed(16);
  for (int n = 0; n < 1 << 20; n++) {
    uint32_t bits = (uint32_t)rng_next();
    if (n % 2) /* exponent 2^-30 .. 2^17 */
      bits = (bits & 0x807fffff) | (uint32_t)(97 + rng_next() % 48) << 23;
    float f = bits_to_float(bits);
    if (isnan(f))
      continue;
    uint16_t got = hoop__float_to_half(f), expected = ref_half(f);
    EXPECT(got == expected, "float_to_half(%a = 0x%08x): expected 0x%04x, got 0x%04x", f, bits,
           expected, got);
  }
}
END_TEST

/* ---- bfloat16 conversions -------------------------------------------------------------------- */

static uint16_t ref_bf16(float f) {
  return ref_encode(f, 8, 7);
}

START_TEST(test_bf16_known_values) {
  const struct {
    uint32_t f; /* float bits */
    uint16_t b;
  } cases[] = {
      {0x3f800000, 0x3f80},                       /* 1 */
      {0xc0000000, 0xc000},                       /* -2 */
      {0x7f7f0000, 0x7f7f},                       /* the largest bfloat16, 0x1.fep127 */
      {0x7f800000, 0x7f80},                       /* inf */
      {0xff800000, 0xff80},                       /* -inf */
      {0x00000000, 0x0000}, {0x80000000, 0x8000}, /* zeros */
      {0x00010000, 0x0001},                       /* the smallest subnormal */
      {0x00800000, 0x0080},                       /* the smallest normal */
      {0x40490fdb, 0x4049},                       /* pi rounds down */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    float f = bits_to_float(cases[c].f);
    uint16_t b = hoop__float_to_bf16(f);
    ck_assert_msg(b == cases[c].b, "float_to_bf16(%a): expected 0x%04x, got 0x%04x", f, cases[c].b,
                  b);
    float back = hoop__bf16_to_float(cases[c].b);
    ck_assert_msg(float_to_bits(back) == (cases[c].f & 0xffff0000u),
                  "bf16_to_float(0x%04x): expected 0x%08x, got 0x%08x", cases[c].b,
                  cases[c].f & 0xffff0000u, float_to_bits(back));
  }
}
END_TEST

START_TEST(test_bf16_rounding_overflow_nan) {
  const struct {
    uint32_t f;
    uint16_t b;
  } cases[] = {
      {0x3f808000, 0x3f80}, /* 1 + 2^-8, a tie: even, down */
      {0x3f818000, 0x3f82}, /* 1 + 3 * 2^-8, a tie: even, up */
      {0x3f808001, 0x3f81}, /* just above the tie */
      {0x7f7f7fff, 0x7f7f}, /* just below the midpoint above the largest */
      {0x7f7f8000, 0x7f80}, /* the midpoint: inf */
      {0x7f7fffff, 0x7f80}, /* FLT_MAX: inf */
      {0xff7fffff, 0xff80}, /* -FLT_MAX: -inf */
      {0x00008000, 0x0000}, /* subnormal tie, down to even 0 */
      {0x00018000, 0x0002}, /* subnormal tie, up to even */
      {0x00008001, 0x0001}, /* just above */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    uint16_t b = hoop__float_to_bf16(bits_to_float(cases[c].f));
    ck_assert_msg(b == cases[c].b, "float_to_bf16(0x%08x): expected 0x%04x, got 0x%04x", cases[c].f,
                  cases[c].b, b);
  }
  /* Low payload bits only: rounding must not turn these into inf, nor wrap them around. */
  const uint32_t nans[] = {0x7f800001, 0xff800001, 0x7fc00000, 0x7fffffff, 0xffffffff, 0x7fff8000};
  for (size_t c = 0; c < sizeof nans / sizeof nans[0]; c++) {
    uint16_t b = hoop__float_to_bf16(bits_to_float(nans[c]));
    ck_assert_msg(half_is_nan(b, HOOP_BFLOAT16) && (b & 0x8000) == ((nans[c] >> 16) & 0x8000),
                  "float_to_bf16(NaN 0x%08x): expected a NaN of the same sign, got 0x%04x", nans[c],
                  b);
  }
}
END_TEST

START_TEST(test_bf16_round_trip_all_patterns) {
  for (uint32_t b = 0; b <= 0xffff; b++) {
    float f = hoop__bf16_to_float((uint16_t)b);
    double expected = ref_decode(b, 8, 7);
    uint16_t back = hoop__float_to_bf16(f);
    if (isnan(expected)) {
      EXPECT(isnan(f) && half_is_nan(back, HOOP_BFLOAT16),
             "bfloat16 NaN 0x%04x: got %a and back 0x%04x", b, f, back);
      continue;
    }
    EXPECT(float_to_bits(f) == float_to_bits((float)expected),
           "bf16_to_float(0x%04x): expected %a, got %a", b, expected, f);
    EXPECT(back == b, "float_to_bf16(bf16_to_float(0x%04x)) = 0x%04x", b, back);
  }
}
END_TEST

START_TEST(test_bf16_every_tie) {
  for (uint32_t b = 0; b < 0x7f80; b++) {
    uint32_t mid = b << 16 | 0x8000, even = b % 2 ? b + 1 : b;
    const struct { uint32_t f, b; } cases[] = {{mid, even}, {mid - 1, b}, {mid + 1, b + 1}};
    for (size_t c = 0; c < 3; c++)
      for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        uint32_t f = cases[c].f | sign << 16;
        uint16_t got = hoop__float_to_bf16(bits_to_float(f));
        EXPECT(got == (cases[c].b | sign), "float_to_bf16(0x%08x): expected 0x%04x, got 0x%04x", f,
               cases[c].b | sign, got);
      }
  }
}
END_TEST

START_TEST(test_bf16_random_floats) {
  rng_seed(7);
  for (int n = 0; n < 1 << 20; n++) {
    uint32_t bits = (uint32_t)rng_next();
    float f = bits_to_float(bits);
    if (isnan(f))
      continue;
    uint16_t got = hoop__float_to_bf16(f), expected = ref_bf16(f);
    EXPECT(got == expected, "float_to_bf16(%a = 0x%08x): expected 0x%04x, got 0x%04x", f, bits,
           expected, got);
  }
}
END_TEST

/* ---- hoop__reduce_finish --------------------------------------------------------------------- */

START_TEST(test_finish_integers_round_toward_zero) {
  const struct {
    hoop_dtype dtype;
    int64_t value;
    int nranks;
    int64_t expected;
  } cases[] = {
      {HOOP_INT8, -7, 2, -3},
      {HOOP_INT8, 7, 2, 3},
      {HOOP_INT8, -128, 3, -42},
      {HOOP_INT8, -128, 200, 0},
      {HOOP_UINT8, 255, 2, 127},
      {HOOP_UINT8, 255, 200, 1},
      {HOOP_INT32, -7, 2, -3},
      {HOOP_INT32, INT32_MIN, 2, INT32_MIN / 2},
      {HOOP_INT32, -1, 3, 0},
      {HOOP_UINT32, UINT32_MAX, 2, UINT32_MAX / 2},
      {HOOP_INT64, -7, 2, -3},
      {HOOP_INT64, INT64_MIN, 3, INT64_MIN / 3},
      {HOOP_UINT64, -1, 3, (int64_t)(UINT64_MAX / 3)},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hoop_dtype dtype = cases[c].dtype;
    size_t size = dtypes[dtype].size;
    unsigned char buf[8];
    set_bits(buf, 0, size, (uint64_t)cases[c].value);
    hoop__reduce_finish(buf, 1, dtype, HOOP_AVG, cases[c].nranks);
    uint64_t expected = (uint64_t)cases[c].expected & (~(uint64_t)0 >> (64 - 8 * size));
    uint64_t got = get_bits(buf, 0, size);
    ck_assert_msg(got == expected, "%s %s / %d: expected %s, got %s", dtypes[dtype].name,
                  describe(dtype, (uint64_t)cases[c].value), cases[c].nranks,
                  describe(dtype, expected), describe(dtype, got));
  }
}
END_TEST

/* The expected average of one element: C division for integers (it truncates toward zero), the
 * dtype's own division for float32 and float64, float division rounded back for the 16-bit ones. */
static uint64_t ref_average(hoop_dtype dtype, uint64_t bits, int nranks) {
  size_t size = dtypes[dtype].size;
  int exp_bits = dtypes[dtype].exp_bits, mant_bits = dtypes[dtype].mant_bits;
  switch (dtypes[dtype].kind) {
  case SIGNED: return (uint64_t)(as_signed(bits, size) / nranks);
  case UNSIGNED: return bits / (uint64_t)nranks;
  case FLOAT32: return float_to_bits(bits_to_float(bits) / (float)nranks);
  case FLOAT64: return double_to_bits(bits_to_double(bits) / nranks);
  case BOOLEAN: return bits; /* no average: finish leaves bool alone */
  default:
    return ref_encode((float)ref_decode(bits, exp_bits, mant_bits) / (float)nranks, exp_bits,
                      mant_bits);
  }
}

/* _i is the dtype. */
START_TEST(test_finish_divides_every_element) {
  hoop_dtype dtype = (hoop_dtype)_i;
  size_t size = dtypes[dtype].size, count = 1000;
  uint64_t mask = ~(uint64_t)0 >> (64 - 8 * size);
  const int nranks[] = {1, 2, 3, 7, 16, 200};
  unsigned char *in = malloc(count * size), *buf = malloc(count * size);
  ck_assert(in && buf);
  rng_seed(100 + (uint64_t)_i);
  fill(in, count, dtype);
  for (size_t r = 0; r < sizeof nranks / sizeof nranks[0]; r++) {
    memcpy(buf, in, count * size);
    hoop__reduce_finish(buf, count, dtype, HOOP_AVG, nranks[r]);
    for (size_t i = 0; i < count; i++) {
      uint64_t x = get_bits(in, i, size), got = get_bits(buf, i, size);
      uint64_t expected = ref_average(dtype, x, nranks[r]) & mask;
      EXPECT(same_value(dtype, expected, got),
             "%s avg finish, nranks %d, element %zu: %s / %d: expected %s, got %s",
             dtypes[dtype].name, nranks[r], i, describe(dtype, x), nranks[r],
             describe(dtype, expected), describe(dtype, got));
    }
  }
  free(buf);
  free(in);
}
END_TEST

START_TEST(test_finish_leaves_other_ops_alone) {
  unsigned char buf[64], before[64];
  for (int i = 0; i < 64; i++)
    buf[i] = before[i] = (uint8_t)(7 * i + 1);
  for (int d = 0; d < HOOP_DTYPE_COUNT; d++)
    for (hoop_op op = HOOP_SUM; op < HOOP_OP_COUNT; op++) {
      if (op == HOOP_AVG)
        continue;
      hoop__reduce_finish(buf, 64 / dtypes[d].size, (hoop_dtype)d, op, 4);
      ck_assert_msg(memcmp(buf, before, sizeof buf) == 0, "%s %s: finish changed the buffer",
                    dtypes[d].name, op_names[op]);
    }
  /* Nor does it divide by a rank count below one. */
  hoop__reduce_finish(buf, 16, HOOP_INT32, HOOP_AVG, 0);
  ck_assert_msg(memcmp(buf, before, sizeof buf) == 0, "int32 avg, nranks 0: buffer changed");
}
END_TEST

/* ---- the fixed tree ----------------------------------------------------------------------------
 */

/* The tree of reduce.h, bottom up: with p the largest power of two <= n and rem = n - p, leaf v
 * is sources 2v and 2v + 1 combined for v < rem, source v + rem after; then adjacent leaves,
 * pairs of them, and so on (recursive doubling's fold and rounds). */
enum { TREE_MAX = 64 };
static int tree_leaves(int n, int *rem) {
  int p = 1;
  while (p * 2 <= n)
    p *= 2;
  *rem = n - p;
  return p;
}
static float tree_f(const float *x, int n, int prod) {
  float v[TREE_MAX];
  int rem, p = tree_leaves(n, &rem);
  for (int i = 0; i < p; i++)
    v[i] = i < rem ? (prod ? x[2 * i] * x[2 * i + 1] : x[2 * i] + x[2 * i + 1]) : x[i + rem];
  for (int w = 1; w < p; w *= 2)
    for (int i = 0; i < p; i += 2 * w)
      v[i] = prod ? v[i] * v[i + w] : v[i] + v[i + w];
  return v[0];
}
static double tree_d(const double *x, int n) {
  double v[TREE_MAX];
  int rem, p = tree_leaves(n, &rem);
  for (int i = 0; i < p; i++)
    v[i] = i < rem ? x[2 * i] + x[2 * i + 1] : x[i + rem];
  for (int w = 1; w < p; w *= 2)
    for (int i = 0; i < p; i += 2 * w)
      v[i] = v[i] + v[i + w];
  return v[0];
}
/* bfloat16: every sum rounded back. */
static uint16_t tree_bf16(const uint16_t *x, int n) {
  uint16_t v[TREE_MAX];
  int rem, p = tree_leaves(n, &rem);
#define BF_ADD(a, b) hoop__float_to_bf16(hoop__bf16_to_float(a) + hoop__bf16_to_float(b))
  for (int i = 0; i < p; i++)
    v[i] = i < rem ? BF_ADD(x[2 * i], x[2 * i + 1]) : x[i + rem];
  for (int w = 1; w < p; w *= 2)
    for (int i = 0; i < p; i += 2 * w)
      v[i] = BF_ADD(v[i], v[i + w]);
#undef BF_ADD
  return v[0];
}

/* hoop__reduce_fixed on 1 to 40 sources of 300 elements (three tiles, the last partial) against
 * the tree computed bottom up: float32 sum and prod, float64 sum, bfloat16 sum (rounded back at
 * every step),
 * float32 avg; dst the last source exactly. Values of mixed signs and exponents, which round
 * differently in every order. */
START_TEST(test_reduce_fixed_tree) {
  enum { COUNT = 300, MAX = 40 };
  static float f[MAX][COUNT];
  static double d[MAX][COUNT];
  static uint16_t b[MAX][COUNT];
  unsigned seed = 7;
  for (int r = 0; r < MAX; r++)
    for (int i = 0; i < COUNT; i++) {
      seed = seed * 1103515245u + 12345u;
      double v = ldexp(1.0 + (seed >> 8 & 0xffff) / 65536.0, (int)(seed >> 24) % 25 - 12);
      v = seed & 1 ? -v : v;
      d[r][i] = v;
      f[r][i] = (float)v;
      b[r][i] = hoop__float_to_bf16((float)v);
    }
  for (int n = 1; n <= MAX; n++) {
    const void *srcs[MAX];
    float got[COUNT], want[COUNT], col[MAX];
    double dgot[COUNT], dcol[MAX];
    uint16_t bgot[COUNT], bcol[MAX];
    for (int op = 0; op < 3; op++) {
      hoop_op hop = op == 0 ? HOOP_SUM : op == 1 ? HOOP_PROD : HOOP_AVG;
      for (int r = 0; r < n; r++)
        srcs[r] = f[r];
      hoop__reduce_fixed(got, srcs, n, COUNT, HOOP_FLOAT32, hop);
      for (int i = 0; i < COUNT; i++) {
        for (int r = 0; r < n; r++)
          col[r] = op == 1 ? 1.0f + f[r][i] / 1024.0f : f[r][i];
        want[i] = tree_f(col, n, op == 1);
        if (op == 2)
          want[i] /= (float)n;
      }
      if (op == 1) { /* products of values near 1, which stay in range over 40 sources */
        static float near1[MAX][COUNT];
        for (int r = 0; r < n; r++) {
          for (int i = 0; i < COUNT; i++)
            near1[r][i] = 1.0f + f[r][i] / 1024.0f;
          srcs[r] = near1[r];
        }
        hoop__reduce_fixed(got, srcs, n, COUNT, HOOP_FLOAT32, hop);
      }
      ck_assert_msg(memcmp(got, want, sizeof got) == 0, "float32 %s over %d sources",
                    hoop_op_name(hop), n);
    }
    for (int r = 0; r < n; r++)
      srcs[r] = d[r];
    hoop__reduce_fixed(dgot, srcs, n, COUNT, HOOP_FLOAT64, HOOP_SUM);
    for (int i = 0; i < COUNT; i++) {
      for (int r = 0; r < n; r++)
        dcol[r] = d[r][i];
      double w = tree_d(dcol, n);
      ck_assert_msg(memcmp(&dgot[i], &w, sizeof w) == 0, "float64 sum over %d sources, element %d",
                    n, i);
    }
    for (int r = 0; r < n; r++)
      srcs[r] = b[r];
    hoop__reduce_fixed(bgot, srcs, n, COUNT, HOOP_BFLOAT16, HOOP_SUM);
    for (int i = 0; i < COUNT; i++) {
      for (int r = 0; r < n; r++)
        bcol[r] = b[r][i];
      ck_assert_msg(bgot[i] == tree_bf16(bcol, n), "bfloat16 sum over %d sources, element %d", n,
                    i);
    }
    /* In place: the last source is the destination. */
    static float last[COUNT];
    memcpy(last, f[n - 1], sizeof last);
    for (int r = 0; r < n; r++)
      srcs[r] = r == n - 1 ? last : f[r];
    hoop__reduce_fixed(last, srcs, n, COUNT, HOOP_FLOAT32, HOOP_SUM);
    for (int r = 0; r < n; r++)
      srcs[r] = f[r];
    hoop__reduce_fixed(got, srcs, n, COUNT, HOOP_FLOAT32, HOOP_SUM);
    ck_assert_msg(memcmp(got, last, sizeof got) == 0, "float32 sum in place over %d sources", n);
  }
}
END_TEST

/* ---- runner ---------------------------------------------------------------------------------- */

static Suite *reduce_suite(void) {
  Suite *s = suite_create("reduce");
  int combinations = HOOP_DTYPE_COUNT * HOOP_OP_COUNT;

  TCase *kernels = tcase_create("kernels");
  tcase_add_loop_test(kernels, test_reduce3_out_of_place, 0, combinations);
  tcase_add_loop_test(kernels, test_reduce_in_place_into_a, 0, combinations);
  tcase_add_loop_test(kernels, test_reduce3_in_place_into_b, 0, combinations);
  tcase_add_loop_test(kernels, test_reduce_with_itself, 0, combinations);
  tcase_add_loop_test(kernels, test_reduce3_same_inputs, 0, combinations);
  tcase_add_test(kernels, test_unknown_dtype_or_op_does_nothing);
  tcase_add_test(kernels, test_min_max_nan_and_zero_order);
  suite_add_tcase(s, kernels);

  TCase *half = tcase_create("float16");
  tcase_set_timeout(half, 60);
  tcase_add_test(half, test_half_known_values);
  tcase_add_test(half, test_half_rounding_overflow_underflow);
  tcase_add_test(half, test_half_nan_stays_nan);
  tcase_add_test(half, test_half_round_trip_all_patterns);
  tcase_add_test(half, test_half_every_tie);
  tcase_add_test(half, test_half_random_floats);
  suite_add_tcase(s, half);

  TCase *bf16 = tcase_create("bfloat16");
  tcase_set_timeout(bf16, 60);
  tcase_add_test(bf16, test_bf16_known_values);
  tcase_add_test(bf16, test_bf16_rounding_overflow_nan);
  tcase_add_test(bf16, test_bf16_round_trip_all_patterns);
  tcase_add_test(bf16, test_bf16_every_tie);
  tcase_add_test(bf16, test_bf16_random_floats);
  suite_add_tcase(s, bf16);

  TCase *fixed = tcase_create("fixed tree");
  tcase_add_test(fixed, test_reduce_fixed_tree);
  suite_add_tcase(s, fixed);

  TCase *finish = tcase_create("finish");
  tcase_add_test(finish, test_finish_integers_round_toward_zero);
  tcase_add_loop_test(finish, test_finish_divides_every_element, 0, HOOP_DTYPE_COUNT);
  tcase_add_test(finish, test_finish_leaves_other_ops_alone);
  suite_add_tcase(s, finish);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(reduce_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
