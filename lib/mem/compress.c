/* compress.c - the wire formats of compressed reductions (compress.h). Each piece is worked a
 * block of HOOP_COMPRESS_BLOCK elements at a time, widened to float first; the loops over a whole
 * block have a constant trip count, so that gcc -O2 vectorises them (reduce.c's rule), and use
 * only selects and integer arithmetic on the floats' bits where a branch would stop it. */
#include "mem/compress.h"

#include <math.h>
#include <string.h>

#include "mem/reduce.h"

/* This file is compiled twice: here for the build's baseline, and by compress_avx2.c again for
 * AVX2, each copy of the codec with its own names (CODEC); the public entry points at its end,
 * compiled once, choose between them. */
#ifndef CODEC
#define CODEC(name) name##_generic
#endif

#define BLOCK HOOP_COMPRESS_BLOCK

/* Below this a block's largest magnitude is taken for zero: its scale's inverse must stay finite.
 */
#define TINY 0x1p-100f

/* Adding and taking away 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer, to
 * nearest even (the default rounding mode), in two vectorisable additions. */
#define ROUNDER 0x1.8p23f

static inline float round_even(float v) {
  return (v + ROUNDER) - ROUNDER;
}

/* The random bits of element index of a stochastic encode: murmur3's finaliser over the index
 * mixed with the seed. */
static inline uint32_t random_bits(uint32_t seed, uint32_t index) {
  uint32_t h = (index * 0x9e3779b1u) ^ seed;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

/* Uniform in [0, 1), 24 bits of it. */
static inline float uniform(uint32_t bits) {
  return (float)(int32_t)(bits >> 8) * 0x1p-24f;
}

/* What encoding one block needs besides its values. */
typedef struct block_round {
  int stochastic;
  uint32_t seed, first; /* element first + i draws random_bits(seed, first + i) */
} block_round;

/* ---- int8 and fp8: a scale per block ---------------------------------------------------------
 */

/* The largest magnitude's bits (non-negative floats order as their bits; a NaN's are above
 * infinity's). */
static inline uint32_t magnitude_bits(const float *restrict x, size_t n) {
  int32_t top = 0; /* signed: SSE2 compares only signed integers */
  for (size_t i = 0; i < n; i++) {
    int32_t a = (int32_t)(hoop__float_bits(x[i]) & 0x7fffffffu);
    top = a > top ? a : top;
  }
  return (uint32_t)top;
}

/* The block's scale (what code 1, or the top code qmax, stands for: scale * qmax is the largest
 * magnitude) and its inverse; NaN for a block holding NaN or infinity, 0 for a tiny one. */
static inline void block_scale(uint32_t top, float qmax, float *scale, float *inverse) {
  float largest = hoop__bits_float(top);
  if (top >= 0x7f800000u) {
    *scale = NAN;
    *inverse = 0;
  } else if (largest < TINY) {
    *scale = *inverse = 0;
  } else {
    *scale = largest / qmax;
    *inverse = qmax / largest;
  }
}

/* The integer at or below v (|v| below 2^22): one less than v rounded where that went up, read
 * from the sign of the difference as an integer (a float compare would stop the vectoriser). */
static inline int32_t floor_int(float v) {
  float t = round_even(v);
  /* In unsigned arithmetic: a block of NaN or infinity (whose codes are then set to 0) converts
   * to INT32_MIN here on x86-64, less one must not overflow. */
  return (int32_t)((uint32_t)(int32_t)t - (uint32_t)((int32_t)hoop__float_bits(t - v) > 0));
}

/* c clamped to -127..127. */
static inline int8_t int8_clamp(int32_t c) {
  c = c > 127 ? 127 : c;
  return (int8_t)(c < -127 ? -127 : c);
}

static inline void int8_codes(int8_t *restrict code, const float *restrict x, size_t n,
                              float inverse, const block_round *round) {
  if (!round->stochastic) {
    for (size_t i = 0; i < n; i++) {
      code[i] = (int8_t)(int32_t)round_even(x[i] * inverse); /* within +-127: no clamp */
    }
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float u = uniform(random_bits(round->seed, round->first + (uint32_t)i));
    code[i] = int8_clamp(floor_int(x[i] * inverse + u));
  }
}

static inline float int8_value(int8_t code) {
  return (float)code;
}

/* float8 e4m3 (bias 7, no infinities, 448 its largest finite value): a magnitude of at least
 * 2^-6 keeps 3 mantissa bits, rounded on the float's bits; below, a multiple of 2^-9. Each
 * conversion is two loops, as reduce.c's float16 ones: the float arithmetic of the subnormal
 * range for every element, then integer selects (gcc sinks arithmetic that feeds a select under
 * its condition, where it no longer vectorises). Magnitudes compare as their bits: 448 is
 * 0x43e00000, 2^-6 0x3c800000. */
#define FP8_MAX_BITS 0x43e00000u
#define FP8_NORMAL_BITS 0x3c800000u

static inline uint32_t fp8_magnitude(float v) {
  uint32_t bits = hoop__float_bits(v) & 0x7fffffffu;
  return bits < FP8_MAX_BITS ? bits : FP8_MAX_BITS;
}

/* The code of the magnitude whose bits are ab, given its subnormal code and what rounding adds
 * to the 20 dropped bits; sign is the value's sign bit. */
static inline uint8_t fp8_code(uint32_t sign, uint32_t ab, uint32_t subnormal, uint32_t add) {
  uint32_t normal = ((ab + add) >> 20) - ((127u - 7u) << 3);
  normal = normal < 0x7eu ? normal : 0x7eu;
  return (uint8_t)(sign | (ab < FP8_NORMAL_BITS ? subnormal : normal));
}

static inline void fp8_codes(uint8_t *restrict code, const float *restrict x, size_t n,
                             float inverse, const block_round *round) {
  uint32_t subnormal[BLOCK], random[BLOCK];
  if (!round->stochastic) {
    for (size_t i = 0; i < n; i++)
      subnormal[i] =
          (uint32_t)(int32_t)round_even(hoop__bits_float(fp8_magnitude(x[i] * inverse)) * 512.0f);
    for (size_t i = 0; i < n; i++) {
      uint32_t ab = fp8_magnitude(x[i] * inverse);
      uint32_t sign = (hoop__float_bits(x[i]) >> 24) & 0x80u;
      code[i] = fp8_code(sign, ab, subnormal[i], 0x7ffffu + ((ab >> 20) & 1u));
    }
    return;
  }
  /* Stochastically, a subnormal is rounded on the bits as a normal is: 2^-6 added, its mantissa's
   * top 3 bits are the multiple of 2^-9 (a carry out of them makes the smallest normal, code 8),
   * and the same 20 random bits decide both (1.3x the speed of a float floor over a 24-bit draw;
   * the sum rounds the magnitude to 2^-29 first, a 2^-20 of a step). */
  for (size_t i = 0; i < n; i++) {
    random[i] = random_bits(round->seed, round->first + (uint32_t)i) >> 12;
    float low = hoop__bits_float(fp8_magnitude(x[i] * inverse)) + hoop__bits_float(FP8_NORMAL_BITS);
    subnormal[i] = ((hoop__float_bits(low) + random[i]) >> 20) - ((127u - 6u) << 3);
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t sign = (hoop__float_bits(x[i]) >> 24) & 0x80u;
    code[i] = fp8_code(sign, fp8_magnitude(x[i] * inverse), subnormal[i], random[i]);
  }
}

/* A code's value, from its bits: exponent field e and mantissa m make 2^(e - 7) * (1 + m / 8),
 * and e = 0 makes m * 2^-9, which is e = 1's value less 2^-6 (exactly); the sign bit is the
 * float's. Masks rather than selects or a table, so that the loops over a block vectorise. */
static inline float fp8_value(uint8_t c) {
  uint32_t e = (uint32_t)(c >> 3) & 15u, m = (uint32_t)c & 7u, subnormal = e == 0;
  float v = hoop__bits_float((e + subnormal + 120u) << 23 | m << 20) -
            hoop__bits_float(FP8_NORMAL_BITS & -subnormal);
  return hoop__bits_float(hoop__float_bits(v) | ((uint32_t)c & 0x80u) << 24);
}

/* ---- bf16 -----------------------------------------------------------------------------------
 */

static inline void bf16_codes(uint16_t *restrict code, const float *restrict x, size_t n,
                              const block_round *round) {
  if (!round->stochastic) {
    hoop__from_float(code, x, HOOP_BFLOAT16, n);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t bits = hoop__float_bits(x[i]);
    uint32_t up = random_bits(round->seed, round->first + (uint32_t)i) >> 16;
    uint32_t rounded = (bits + up) >> 16;
    code[i] = (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? (bits >> 16) | 0x40u : rounded);
  }
}

static inline float bf16_value(uint16_t code) {
  return hoop__bits_float((uint32_t)code << 16);
}

/* ---- pieces ---------------------------------------------------------------------------------
 */

/* One block of n (at most BLOCK) elements: x holds them widened (and the residual added); the
 * codes go to code, the scale to *scale. */
static void encode_block(int format, void *code, float *scale, const float *x, size_t n,
                         const block_round *round) {
  if (format == HOOP_COMPRESS_BF16) {
    if (n == BLOCK)
      bf16_codes(code, x, BLOCK, round);
    else
      bf16_codes(code, x, n, round);
    return;
  }
  float qmax = format == HOOP_COMPRESS_INT8 ? 127.0f : 448.0f, inverse;
  block_scale(n == BLOCK ? magnitude_bits(x, BLOCK) : magnitude_bits(x, n), qmax, scale, &inverse);
  if (format == HOOP_COMPRESS_INT8)
    n == BLOCK ? int8_codes(code, x, BLOCK, inverse, round)
               : int8_codes(code, x, n, inverse, round);
  else
    n == BLOCK ? fp8_codes(code, x, BLOCK, inverse, round) : fp8_codes(code, x, n, inverse, round);
}

/* The codes' values times their scale, written (SET) or added (ADD) to value[0..n). */
#define SET(place, v) ((place) = (v))
#define ADD(place, v) ((place) += (v))
#define DEFINE_DECODERS(MODE)                                                                      \
  static inline void int8_##MODE(float *restrict value, const int8_t *restrict code, size_t n,     \
                                 float scale) {                                                    \
    for (size_t i = 0; i < n; i++)                                                                 \
      MODE(value[i], int8_value(code[i]) * scale);                                                 \
  }                                                                                                \
  static inline void fp8_##MODE(float *restrict value, const uint8_t *restrict code, size_t n,     \
                                float scale) {                                                     \
    for (size_t i = 0; i < n; i++)                                                                 \
      MODE(value[i], fp8_value(code[i]) * scale);                                                  \
  }                                                                                                \
  static inline void bf16_##MODE(float *restrict value, const uint16_t *restrict code, size_t n) { \
    for (size_t i = 0; i < n; i++)                                                                 \
      MODE(value[i], bf16_value(code[i]));                                                         \
  }                                                                                                \
  /* Block b (n codes) of an encoded piece of count elements. */                                   \
  static void decode_##MODE(int format, float *value, const char *piece, size_t count, size_t b,   \
                            size_t n) {                                                            \
    if (format == HOOP_COMPRESS_BF16) {                                                            \
      const uint16_t *code = (const uint16_t *)(const void *)piece + b * BLOCK;                    \
      n == BLOCK ? bf16_##MODE(value, code, BLOCK) : bf16_##MODE(value, code, n);                  \
      return;                                                                                      \
    }                                                                                              \
    float scale;                                                                                   \
    memcpy(&scale, piece + b * sizeof(float), sizeof scale);                                       \
    const char *codes = piece + sizeof(float) * ((count + BLOCK - 1) / BLOCK) + b * BLOCK;         \
    if (format == HOOP_COMPRESS_INT8)                                                              \
      n == BLOCK ? int8_##MODE(value, (const int8_t *)codes, BLOCK, scale)                         \
                 : int8_##MODE(value, (const int8_t *)codes, n, scale);                            \
    else                                                                                           \
      n == BLOCK ? fp8_##MODE(value, (const uint8_t *)codes, BLOCK, scale)                         \
                 : fp8_##MODE(value, (const uint8_t *)codes, n, scale);                            \
  }

DEFINE_DECODERS(SET)
DEFINE_DECODERS(ADD)

static inline void add_to(float *restrict sum, const float *restrict value, size_t n) {
  for (size_t i = 0; i < n; i++)
    sum[i] += value[i];
}

static inline void sum_of(float *restrict x, const float *restrict a, const float *restrict b,
                          size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = a[i] + b[i];
}

/* What the encoding dropped of each value; nothing where it was not finite, so that one step of
 * infinities (a loss scaler's overflow) does not poison every later one. */
static inline void keep_dropped(float *restrict kept, const float *restrict x,
                                const float *restrict value, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float dropped = x[i] - value[i];
    kept[i] = dropped - dropped == 0.0f ? dropped : 0.0f;
  }
}

void CODEC(hoop__compress)(int format, void *out, const void *in, hoop_dtype dtype, size_t count,
                           float *residual, hoop__rounding rounding) {
  format = hoop__compress_format(format);
  size_t esize = hoop_dtype_size(dtype), blocks = (count + BLOCK - 1) / BLOCK;
  char *scales = out, *codes = (char *)out + (format == HOOP_COMPRESS_BF16 ? 0 : 4 * blocks);
  size_t code_size = format == HOOP_COMPRESS_BF16 ? 2 : 1;
  block_round round = {rounding.seed != 0, (uint32_t)(rounding.seed ^ (rounding.seed >> 32)),
                       (uint32_t)rounding.first};
  float x[BLOCK], scale = 0, value[BLOCK];
  for (size_t b = 0; b < blocks; b++) {
    size_t n = count - b * BLOCK < BLOCK ? count - b * BLOCK : BLOCK;
    float *kept = residual ? residual + b * BLOCK : NULL;
    /* float32 without a residual is encoded where it lies. */
    const float *values = (const float *)in + b * BLOCK;
    if (dtype == HOOP_FLOAT32 && kept) {
      n == BLOCK ? sum_of(x, values, kept, BLOCK) : sum_of(x, values, kept, n);
      values = x;
    } else if (dtype != HOOP_FLOAT32 || kept) {
      hoop__to_float(x, (const char *)in + b * BLOCK * esize, dtype, n);
      if (kept)
        n == BLOCK ? add_to(x, kept, BLOCK) : add_to(x, kept, n);
      values = x;
    }
    encode_block(format, codes + b * BLOCK * code_size, &scale, values, n, &round);
    if (format != HOOP_COMPRESS_BF16)
      memcpy(scales + b * sizeof scale, &scale, sizeof scale);
    /* A block holding NaN or infinity (its scale NaN) decodes to NaN whatever its codes: they are
     * 0, rather than what its values times an inverse of 0 made of them (which depends on how the
     * machine converts a NaN, and on its NaN's sign). */
    if (format != HOOP_COMPRESS_BF16 && scale != scale)
      memset(codes + b * BLOCK * code_size, 0, n);
    if (kept) {
      decode_SET(format, value, out, count, b, n);
      n == BLOCK ? keep_dropped(kept, x, value, BLOCK) : keep_dropped(kept, x, value, n);
    }
    round.first += BLOCK;
  }
}

void CODEC(hoop__expand_add)(int format, float *acc, const void *in, size_t count) {
  format = hoop__compress_format(format);
  for (size_t b = 0, blocks = (count + BLOCK - 1) / BLOCK; b < blocks; b++) {
    size_t n = count - b * BLOCK < BLOCK ? count - b * BLOCK : BLOCK;
    decode_ADD(format, acc + b * BLOCK, in, count, b, n);
  }
}

void CODEC(hoop__expand)(int format, void *out, hoop_dtype dtype, const void *in, size_t count) {
  format = hoop__compress_format(format);
  size_t esize = hoop_dtype_size(dtype);
  float value[BLOCK];
  for (size_t b = 0, blocks = (count + BLOCK - 1) / BLOCK; b < blocks; b++) {
    size_t n = count - b * BLOCK < BLOCK ? count - b * BLOCK : BLOCK;
    if (dtype == HOOP_FLOAT32) {
      decode_SET(format, (float *)out + b * BLOCK, in, count, b, n);
      continue;
    }
    decode_SET(format, value, in, count, b, n);
    hoop__from_float((char *)out + b * BLOCK * esize, value, dtype, n);
  }
}

/* ---- the entry points, once ------------------------------------------------------------------
 */
#ifndef CODEC_VARIANT

size_t hoop__compress_bytes(int format, size_t count) {
  switch (hoop__compress_format(format)) {
  case HOOP_COMPRESS_BF16: return 2 * count;
  case HOOP_COMPRESS_FP8:
  case HOOP_COMPRESS_INT8: return count + sizeof(float) * ((count + BLOCK - 1) / BLOCK);
  default: return count * sizeof(float);
  }
}

/* The AVX2 copy where the build has one and the CPU runs it: 8 lanes where SSE2 has 4, and the
 * 32-bit multiplies of stochastic rounding's hash in vector registers (SSE2 has none). */
static int avx2(void) {
#if HOOP__CODEC_AVX2
  return __builtin_cpu_supports("avx2");
#else
  return 0;
#endif
}

void hoop__compress(int format, void *out, const void *in, hoop_dtype dtype, size_t count,
                    float *residual, hoop__rounding rounding) {
#if HOOP__CODEC_AVX2
  if (avx2()) {
    hoop__compress_avx2(format, out, in, dtype, count, residual, rounding);
    return;
  }
#endif
  hoop__compress_generic(format, out, in, dtype, count, residual, rounding);
}

void hoop__expand_add(int format, float *acc, const void *in, size_t count) {
#if HOOP__CODEC_AVX2
  if (avx2()) {
    hoop__expand_add_avx2(format, acc, in, count);
    return;
  }
#endif
  hoop__expand_add_generic(format, acc, in, count);
}

void hoop__expand(int format, void *out, hoop_dtype dtype, const void *in, size_t count) {
#if HOOP__CODEC_AVX2
  if (avx2()) {
    hoop__expand_avx2(format, out, dtype, in, count);
    return;
  }
#endif
  hoop__expand_generic(format, out, dtype, in, count);
}

const char *hoop__codec_name(void) {
  return avx2() ? "avx2" : "generic";
}

#endif /* CODEC_VARIANT */
