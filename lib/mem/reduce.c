/* reduce.c - the element-wise reduction kernels of reduce.h, the hot loop of the ring allreduce.
 * Each dtype x op is a plain indexed loop over restrict pointers, instantiated by macros, that gcc
 * -O2/-O3 vectorises for the baseline ISA; float16 and bfloat16 go through float in blocks. */
#include "mem/reduce.h"

#include <string.h>

/* ---- Combining two elements ------------------------------------------------------------------ */

/* x and y are elements of type T; U is the type the arithmetic happens in. Signed integers use
 * their unsigned twin, where overflow wraps instead of being undefined; the conversion back is
 * modular in gcc and clang (implementation-defined, not undefined). A U narrower than int is 8
 * bits wide, which promotes to int without overflowing even in prod.
 *
 * MIN and MAX follow x86 minps/maxps, which lets the loops vectorise: a NaN in y is returned, a
 * NaN in x is not, and min(-0, +0) is +0 while min(+0, -0) is -0. So whether a NaN reaches the
 * result of a MIN or MAX collective depends on where in the ring it enters. */
#define COMBINE_SUM(T, U, x, y) ((T)((U)(x) + (U)(y)))
#define COMBINE_PROD(T, U, x, y) ((T)((U)(x) * (U)(y)))
#define COMBINE_MIN(T, U, x, y) ((x) < (y) ? (x) : (y))
#define COMBINE_MAX(T, U, x, y) ((x) > (y) ? (x) : (y))
#define COMBINE_BAND(T, U, x, y) ((T)((U)(x) & (U)(y)))
#define COMBINE_BOR(T, U, x, y) ((T)((U)(x) | (U)(y)))
#define COMBINE_BXOR(T, U, x, y) ((T)((U)(x) ^ (U)(y)))
/* bool: each operand taken as 0 or 1, the op applied, the result made 0 or 1 again; so SUM and
 * MAX are or, PROD and MIN and. */
#define BOOL_OF(COMBINE, x, y) (uint8_t)(COMBINE(uint8_t, uint32_t, (x) != 0, (y) != 0) != 0)
#define COMBINE_BOOL_SUM(T, U, x, y) BOOL_OF(COMBINE_SUM, x, y)
#define COMBINE_BOOL_PROD(T, U, x, y) BOOL_OF(COMBINE_PROD, x, y)
#define COMBINE_BOOL_MIN(T, U, x, y) BOOL_OF(COMBINE_MIN, x, y)
#define COMBINE_BOOL_MAX(T, U, x, y) BOOL_OF(COMBINE_MAX, x, y)
#define COMBINE_BOOL_BAND(T, U, x, y) BOOL_OF(COMBINE_BAND, x, y)
#define COMBINE_BOOL_BOR(T, U, x, y) BOOL_OF(COMBINE_BOR, x, y)
#define COMBINE_BOOL_BXOR(T, U, x, y) BOOL_OF(COMBINE_BXOR, x, y)

/* Runs body for i from 0 to n - 1: whole spans of 64 elements, then the rest. gcc -O2 vectorises
 * only loops that need no scalar epilogue and pay off at once, so the inner loop has a constant
 * trip count that every vector width divides; gcc -O3 vectorises the remainder loop as well. */
#define VECTOR_SPAN 64
#define VECTOR_LOOP(i, n, body)                                                                    \
  do {                                                                                             \
    size_t span_, i;                                                                               \
    for (span_ = 0; span_ + VECTOR_SPAN <= (n); span_ += VECTOR_SPAN)                              \
      for (size_t j_ = 0; j_ < VECTOR_SPAN; j_++) {                                                \
        i = span_ + j_;                                                                            \
        body;                                                                                      \
      }                                                                                            \
    for (i = span_; i < (n); i++)                                                                  \
      body;                                                                                        \
  } while (0)

/* One kernel reduces count elements from a and b into dst; dst may be a, b or both. */
typedef void reduce_kernel(void *dst, const void *a, const void *b, size_t count);

/* Defines the kernel `name` and its four loops, one per way dst can alias the inputs. Each loop
 * tells the compiler through restrict that nothing else overlaps, which is what lets it vectorise
 * without runtime overlap checks; into_b keeps the operand order, as MIN and MAX are not
 * symmetric for zeros and NaN. */
#define DEFINE_KERNEL(name, T, U, COMBINE)                                                         \
  static void name##_apart(T *restrict dst, const T *restrict a, const T *restrict b, size_t n) {  \
    VECTOR_LOOP(i, n, dst[i] = COMBINE(T, U, a[i], b[i]));                                         \
  }                                                                                                \
  static void name##_into_a(T *restrict dst, const T *restrict b, size_t n) {                      \
    VECTOR_LOOP(i, n, dst[i] = COMBINE(T, U, dst[i], b[i]));                                       \
  }                                                                                                \
  static void name##_into_b(T *restrict dst, const T *restrict a, size_t n) {                      \
    VECTOR_LOOP(i, n, dst[i] = COMBINE(T, U, a[i], dst[i]));                                       \
  }                                                                                                \
  static void name##_self(T *dst, size_t n) {                                                      \
    VECTOR_LOOP(i, n, dst[i] = COMBINE(T, U, dst[i], dst[i]));                                     \
  }                                                                                                \
  static void name(void *dst, const void *a, const void *b, size_t count) {                        \
    if (dst != a && dst != b)                                                                      \
      name##_apart(dst, a, b, count);                                                              \
    else if (dst != b)                                                                             \
      name##_into_a(dst, b, count);                                                                \
    else if (dst != a)                                                                             \
      name##_into_b(dst, a, count);                                                                \
    else                                                                                           \
      name##_self(dst, count);                                                                     \
  }

#define DEFINE_KERNELS(type, T, U)                                                                 \
  DEFINE_KERNEL(reduce_##type##_sum, T, U, COMBINE_SUM)                                            \
  DEFINE_KERNEL(reduce_##type##_prod, T, U, COMBINE_PROD)                                          \
  DEFINE_KERNEL(reduce_##type##_min, T, U, COMBINE_MIN)                                            \
  DEFINE_KERNEL(reduce_##type##_max, T, U, COMBINE_MAX)

#define DEFINE_BITWISE(type, T, U)                                                                 \
  DEFINE_KERNEL(reduce_##type##_band, T, U, COMBINE_BAND)                                          \
  DEFINE_KERNEL(reduce_##type##_bor, T, U, COMBINE_BOR)                                            \
  DEFINE_KERNEL(reduce_##type##_bxor, T, U, COMBINE_BXOR)

#define DEFINE_INTEGER_KERNELS(type, T, U)                                                         \
  DEFINE_KERNELS(type, T, U)                                                                       \
  DEFINE_BITWISE(type, T, U)

/* On baseline x86-64 all of these vectorise except int64 and uint64 prod, min and max: SSE2 has no
 * 64-bit multiply or compare, so those stay scalar. The 16-bit types compute in uint32_t: uint16_t
 * would promote to int, whose product of two large values overflows. */
DEFINE_INTEGER_KERNELS(int8, int8_t, uint8_t)
DEFINE_INTEGER_KERNELS(uint8, uint8_t, uint8_t)
DEFINE_INTEGER_KERNELS(int16, int16_t, uint32_t)
DEFINE_INTEGER_KERNELS(uint16, uint16_t, uint32_t)
DEFINE_INTEGER_KERNELS(int32, int32_t, uint32_t)
DEFINE_INTEGER_KERNELS(uint32, uint32_t, uint32_t)
DEFINE_INTEGER_KERNELS(int64, int64_t, uint64_t)
DEFINE_INTEGER_KERNELS(uint64, uint64_t, uint64_t)
DEFINE_KERNELS(float32, float, float)
DEFINE_KERNELS(float64, double, double)
DEFINE_KERNEL(reduce_bool_sum, uint8_t, uint8_t, COMBINE_BOOL_SUM)
DEFINE_KERNEL(reduce_bool_prod, uint8_t, uint8_t, COMBINE_BOOL_PROD)
DEFINE_KERNEL(reduce_bool_min, uint8_t, uint8_t, COMBINE_BOOL_MIN)
DEFINE_KERNEL(reduce_bool_max, uint8_t, uint8_t, COMBINE_BOOL_MAX)
DEFINE_KERNEL(reduce_bool_band, uint8_t, uint8_t, COMBINE_BOOL_BAND)
DEFINE_KERNEL(reduce_bool_bor, uint8_t, uint8_t, COMBINE_BOOL_BOR)
DEFINE_KERNEL(reduce_bool_bxor, uint8_t, uint8_t, COMBINE_BOOL_BXOR)

/* ---- float16 and bfloat16 conversions -------------------------------------------------------- */

/* The conversions to and from float16 are split in two steps so that their block loops below
 * vectorise: one with the float arithmetic that subnormals need, done for every element, and one
 * of integer selects. gcc will not vectorise a loop that does float arithmetic under a condition
 * (it may trap, so it is not run speculatively), and it moves an unconditional one under the
 * condition that uses it when both steps share a loop. */

/* Step 1 of half_to_float: the value if half is zero or subnormal, mantissa * 2^-24, exact. */
static inline float half_subnormal(uint16_t half) {
  return (float)(half & 0x3ff) * 0x1p-24f;
}

/* Step 2: the float bits of half, given the bits of half_subnormal(half). Magnitudes are signed
 * here and below because SSE2 only compares signed integers. */
static inline uint32_t half_widen(uint16_t half, uint32_t subnormal) {
  uint32_t sign = (uint32_t)(half & 0x8000) << 16;
  int32_t mag = half & 0x7fff;
  /* Normal numbers: shift into place and rebias the exponent from 15 to 127. */
  uint32_t bits = ((uint32_t)mag << 13) + ((uint32_t)(127 - 15) << 23);
  /* Inf and NaN: the exponent becomes 255 and the NaN payload follows along. */
  bits = mag > 0x7bff ? bits + ((uint32_t)(128 - 16) << 23) : bits;
  return (mag < 0x0400 ? subnormal : bits) | sign;
}

static inline float half_to_float(uint16_t half) {
  return hoop__bits_float(half_widen(half, hoop__float_bits(half_subnormal(half))));
}

/* Step 1 of float_to_half: the half bits of |f| if that is below 2^-14, the subnormal range.
 * Adding 0.5 puts the float's last mantissa bit at 2^-24, the half subnormal step, so the float
 * addition rounds to nearest even for us (in the default rounding mode). */
static inline uint16_t half_round_subnormal(float f) {
  float magnitude = hoop__bits_float(hoop__float_bits(f) & 0x7fffffff);
  return (uint16_t)(hoop__float_bits(magnitude + 0.5f) - hoop__float_bits(0.5f));
}

/* Step 2: the half bits of f, given half_round_subnormal(f). */
static inline uint16_t half_narrow(float f, uint16_t subnormal) {
  uint32_t bits = hoop__float_bits(f);
  uint32_t sign = (bits >> 16) & 0x8000;
  int32_t mag = (int32_t)(bits & 0x7fffffff);
  /* Normal halves: rebias the exponent from 127 to 15 and round the 13 dropped bits to nearest
   * even; a carry out of the mantissa bumps the exponent, up to inf. */
  uint32_t normal = (bits & 0x7fffffff) - ((uint32_t)(127 - 15) << 23);
  normal = (normal + 0xfff + ((normal >> 13) & 1)) >> 13;
  /* 65536 and beyond overflow to inf; NaN stays NaN, made quiet, with its top payload bits. */
  uint32_t special = mag > 0x7f800000 ? 0x7e00 | ((bits >> 13) & 0x3ff) : 0x7c00;
  uint32_t result = mag > 0x477fffff ? special : mag < 0x38800000 ? subnormal : normal;
  return (uint16_t)(result | sign);
}

static inline uint16_t float_to_half(float f) {
  return half_narrow(f, half_round_subnormal(f));
}

static inline float bf16_to_float(uint16_t bf16) {
  return hoop__bits_float((uint32_t)bf16 << 16);
}

static inline uint16_t float_to_bf16(float f) {
  uint32_t bits = hoop__float_bits(f);
  /* Round the 16 dropped bits to nearest even; a carry bumps the exponent, up to inf. */
  uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
  /* Rounding would turn some NaNs into inf; keep them NaN, quiet, with sign and top payload. */
  uint32_t nan = (bits >> 16) | 0x40;
  return (uint16_t)((int32_t)(bits & 0x7fffffff) > 0x7f800000 ? nan : rounded);
}

float hoop__half_to_float(uint16_t h) {
  return half_to_float(h);
}

uint16_t hoop__float_to_half(float f) {
  return float_to_half(f);
}

float hoop__bf16_to_float(uint16_t b) {
  return bf16_to_float(b);
}

uint16_t hoop__float_to_bf16(float f) {
  return float_to_bf16(f);
}

/* ---- float16 and bfloat16 kernels ------------------------------------------------------------ */

/* Elements go through float a block at a time: the block fits in L1 next to the data, and each
 * of the convert, combine and convert-back loops vectorises on its own. */
enum { HALF_BLOCK = 256 };

typedef void half_load(float *restrict out, const uint16_t *restrict in, size_t n);
typedef void half_store(uint16_t *restrict out, const float *restrict in, size_t n);
typedef void float_combine(float *restrict acc, const float *restrict in, size_t n);

static void load_float16(float *restrict out, const uint16_t *restrict in, size_t n) {
  VECTOR_LOOP(i, n, out[i] = half_subnormal(in[i]));
  VECTOR_LOOP(i, n, out[i] = hoop__bits_float(half_widen(in[i], hoop__float_bits(out[i]))));
}

static void store_float16(uint16_t *restrict out, const float *restrict in, size_t n) {
  VECTOR_LOOP(i, n, out[i] = half_round_subnormal(in[i]));
  VECTOR_LOOP(i, n, out[i] = half_narrow(in[i], out[i]));
}

static void load_bfloat16(float *restrict out, const uint16_t *restrict in, size_t n) {
  VECTOR_LOOP(i, n, out[i] = bf16_to_float(in[i]));
}

static void store_bfloat16(uint16_t *restrict out, const float *restrict in, size_t n) {
  VECTOR_LOOP(i, n, out[i] = float_to_bf16(in[i]));
}

void hoop__to_float(float *out, const void *in, hoop_dtype dtype, size_t count) {
  if (dtype == HOOP_FLOAT16)
    load_float16(out, in, count);
  else if (dtype == HOOP_BFLOAT16)
    load_bfloat16(out, in, count);
  else if ((const void *)out != in)
    memmove(out, in, count * sizeof(float));
}

void hoop__from_float(void *out, const float *in, hoop_dtype dtype, size_t count) {
  if (dtype == HOOP_FLOAT16)
    store_float16(out, in, count);
  else if (dtype == HOOP_BFLOAT16)
    store_bfloat16(out, in, count);
  else if ((const void *)out != (const void *)in)
    memmove(out, in, count * sizeof(float));
}

/* Both inputs are converted before the block is written back, so dst may alias a or b. */
static void reduce_blocks(uint16_t *dst, const uint16_t *a, const uint16_t *b, size_t count,
                          half_load *load, half_store *store, float_combine *combine) {
  float x[HALF_BLOCK], y[HALF_BLOCK];
  for (size_t at = 0; at < count; at += HALF_BLOCK) {
    size_t n = count - at < HALF_BLOCK ? count - at : HALF_BLOCK;
    load(x, a + at, n);
    load(y, b + at, n);
    combine(x, y, n);
    store(dst + at, x, n);
  }
}

#define DEFINE_HALF_KERNEL(type, op)                                                               \
  static void reduce_##type##_##op(void *dst, const void *a, const void *b, size_t count) {        \
    reduce_blocks(dst, a, b, count, load_##type, store_##type, reduce_float32_##op##_into_a);      \
  }

#define DEFINE_HALF_KERNELS(type)                                                                  \
  DEFINE_HALF_KERNEL(type, sum)                                                                    \
  DEFINE_HALF_KERNEL(type, prod)                                                                   \
  DEFINE_HALF_KERNEL(type, min)                                                                    \
  DEFINE_HALF_KERNEL(type, max)

DEFINE_HALF_KERNELS(float16)
DEFINE_HALF_KERNELS(bfloat16)

/* ---- Dispatch -------------------------------------------------------------------------------- */

/* AVG reduces as SUM; hoop__reduce_finish divides at the end. The float types have no bitwise
 * ops and bool no AVG (NULL: the calls refuse them first, hoop__op_refused). */
#define KERNEL_ROW(dtype, type)                                                                    \
  [dtype] = {[HOOP_SUM] = reduce_##type##_sum,                                                     \
             [HOOP_PROD] = reduce_##type##_prod,                                                   \
             [HOOP_MIN] = reduce_##type##_min,                                                     \
             [HOOP_MAX] = reduce_##type##_max,                                                     \
             [HOOP_AVG] = reduce_##type##_sum}
#define INTEGER_ROW(dtype, type)                                                                   \
  [dtype] = {[HOOP_SUM] = reduce_##type##_sum, [HOOP_PROD] = reduce_##type##_prod,                 \
             [HOOP_MIN] = reduce_##type##_min, [HOOP_MAX] = reduce_##type##_max,                   \
             [HOOP_AVG] = reduce_##type##_sum, [HOOP_BAND] = reduce_##type##_band,                 \
             [HOOP_BOR] = reduce_##type##_bor, [HOOP_BXOR] = reduce_##type##_bxor}

static reduce_kernel *const kernels[HOOP_DTYPE_COUNT][HOOP_OP_COUNT] = {
    INTEGER_ROW(HOOP_INT8, int8),
    INTEGER_ROW(HOOP_UINT8, uint8),
    INTEGER_ROW(HOOP_INT16, int16),
    INTEGER_ROW(HOOP_UINT16, uint16),
    INTEGER_ROW(HOOP_INT32, int32),
    INTEGER_ROW(HOOP_UINT32, uint32),
    INTEGER_ROW(HOOP_INT64, int64),
    INTEGER_ROW(HOOP_UINT64, uint64),
    KERNEL_ROW(HOOP_FLOAT16, float16),
    KERNEL_ROW(HOOP_BFLOAT16, bfloat16),
    KERNEL_ROW(HOOP_FLOAT32, float32),
    KERNEL_ROW(HOOP_FLOAT64, float64),
    [HOOP_BOOL] = {[HOOP_SUM] = reduce_bool_sum,
                   [HOOP_PROD] = reduce_bool_prod,
                   [HOOP_MIN] = reduce_bool_min,
                   [HOOP_MAX] = reduce_bool_max,
                   [HOOP_BAND] = reduce_bool_band,
                   [HOOP_BOR] = reduce_bool_bor,
                   [HOOP_BXOR] = reduce_bool_bxor},
};

void hoop__reduce3(void *dst, const void *a, const void *b, size_t count, hoop_dtype dtype,
                   hoop_op op) {
  if ((unsigned)dtype < HOOP_DTYPE_COUNT && (unsigned)op < HOOP_OP_COUNT && kernels[dtype][op])
    kernels[dtype][op](dst, a, b, count);
}

void hoop__reduce(void *dst, const void *src, size_t count, hoop_dtype dtype, hoop_op op) {
  hoop__reduce3(dst, dst, src, count, dtype, op);
}

/* ---- Average --------------------------------------------------------------------------------- */

/* buf[i] /= nranks, with the division in type D: C division truncates toward zero, and int8 and
 * uint8 divide in int so that a rank count above 127 is not truncated first. */
#define DEFINE_DIVIDE(type, T, D)                                                                  \
  static void divide_##type(T *buf, size_t n, int nranks) {                                        \
    D divisor = (D)nranks;                                                                         \
    VECTOR_LOOP(i, n, buf[i] = (T)(buf[i] / divisor));                                             \
  }

DEFINE_DIVIDE(int8, int8_t, int)
DEFINE_DIVIDE(uint8, uint8_t, int)
DEFINE_DIVIDE(int16, int16_t, int)
DEFINE_DIVIDE(uint16, uint16_t, int)
DEFINE_DIVIDE(int32, int32_t, int32_t)
DEFINE_DIVIDE(uint32, uint32_t, uint32_t)
DEFINE_DIVIDE(int64, int64_t, int64_t)
DEFINE_DIVIDE(uint64, uint64_t, uint64_t)
DEFINE_DIVIDE(float32, float, float)
DEFINE_DIVIDE(float64, double, double)

/* float16 and bfloat16 divide in float and round once, back to their own type. */
static void divide_blocks(uint16_t *buf, size_t count, int nranks, half_load *load,
                          half_store *store) {
  float x[HALF_BLOCK];
  for (size_t at = 0; at < count; at += HALF_BLOCK) {
    size_t n = count - at < HALF_BLOCK ? count - at : HALF_BLOCK;
    load(x, buf + at, n);
    divide_float32(x, n, nranks);
    store(buf + at, x, n);
  }
}

void hoop__reduce_finish(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int nranks) {
  if (op != HOOP_AVG || nranks < 1)
    return;
  switch (dtype) {
  case HOOP_INT8: divide_int8(buf, count, nranks); break;
  case HOOP_UINT8: divide_uint8(buf, count, nranks); break;
  case HOOP_INT16: divide_int16(buf, count, nranks); break;
  case HOOP_UINT16: divide_uint16(buf, count, nranks); break;
  case HOOP_INT32: divide_int32(buf, count, nranks); break;
  case HOOP_UINT32: divide_uint32(buf, count, nranks); break;
  case HOOP_INT64: divide_int64(buf, count, nranks); break;
  case HOOP_UINT64: divide_uint64(buf, count, nranks); break;
  case HOOP_FLOAT16: divide_blocks(buf, count, nranks, load_float16, store_float16); break;
  case HOOP_BFLOAT16: divide_blocks(buf, count, nranks, load_bfloat16, store_bfloat16); break;
  case HOOP_FLOAT32: divide_float32(buf, count, nranks); break;
  case HOOP_FLOAT64: divide_float64(buf, count, nranks); break;
  default: break;
  }
}

/* ---- The fixed tree (reproducible mode) ------------------------------------------------------ */

/* hoop__reduce_fixed's tree, a tile at a time. With p the largest power of two <= n and rem =
 * n - p, virtual leaf v is sources 2v and 2v + 1 combined for v < rem and source v + rem for the
 * others; the p virtual leaves are combined as a binary counter: each is pushed as a run of width
 * 1, and while the two runs on top have the same width they are combined (the earlier one on the
 * left), which over p leaves is the perfect tree of adjacent pairs, then pairs of pairs. Recursive
 * doubling's fold and rounds compute the same tree (coll/allreduce.c). Runs are held in the
 * element type and combined by the kernels above, so float16 and bfloat16 are rounded back at
 * every node, as every algorithm's hop rounds them. */
enum { TREE_TILE = 128, TREE_LEVELS = 34 };

/* One tile of m elements at element offset at, esize bytes each. */
static void tree_tile(reduce_kernel *combine, size_t esize, unsigned char *stack, void *dst,
                      const void *const *srcs, int n, size_t at, size_t m) {
  size_t width[TREE_LEVELS];
  int depth = 0, p = 1;
  while (p * 2 <= n)
    p *= 2;
  int rem = n - p;
  size_t tile_bytes = TREE_TILE * esize;
#define SRC(i) ((const unsigned char *)srcs[i] + at * esize)
  for (int v = 0; v < p;) {
    unsigned char *top = stack + (size_t)depth * tile_bytes;
    if (v < rem) {
      combine(top, SRC(2 * v), SRC(2 * v + 1), m);
      width[depth++] = 1;
      v++;
    } else if (v % 2 == 0 && v + 1 < p) {
      /* Two virtual leaves that are sources themselves: a run of width 2 at once. */
      combine(top, SRC(v + rem), SRC(v + 1 + rem), m);
      width[depth++] = 2;
      v += 2;
    } else {
      memcpy(top, SRC(v + rem), m * esize);
      width[depth++] = 1;
      v++;
    }
    while (depth >= 2 && width[depth - 2] == width[depth - 1]) {
      unsigned char *left = stack + (size_t)(depth - 2) * tile_bytes;
      combine(left, left, left + tile_bytes, m);
      width[depth - 2] *= 2;
      depth--;
    }
  }
#undef SRC
  memcpy((unsigned char *)dst + at * esize, stack, m * esize);
}

void hoop__reduce_fixed(void *dst, const void *const *srcs, int n, size_t count, hoop_dtype dtype,
                        hoop_op op) {
  if ((unsigned)dtype >= HOOP_DTYPE_COUNT || (unsigned)op >= HOOP_OP_COUNT || n < 1 ||
      !kernels[dtype][op])
    return;
  size_t esize = hoop_dtype_size(dtype);
  /* The runs of one tile: at most one per bit of p. */
  _Alignas(64) unsigned char stack[TREE_LEVELS * TREE_TILE * 8];
  for (size_t at = 0; at < count; at += TREE_TILE)
    tree_tile(kernels[dtype][op], esize, stack, dst, srcs, n, at,
              count - at < TREE_TILE ? count - at : TREE_TILE);
  hoop__reduce_finish(dst, count, dtype, op, n);
}
