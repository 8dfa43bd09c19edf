/* codec.cuh - the wire formats of compressed reductions (lib/mem/compress.c) on the GPU, bit for
 * bit: part of kernels.cu (included at its end, after the conversions it uses), in a file of its
 * own. */

/* A piece of count elements: bf16, count 2-byte codes; fp8 and int8, one float32 scale per block
 * of CODEC_BLOCK elements (the last may be shorter), then count 1-byte codes (hoop.h's
 * HOOP_COMPRESS_* and compress.h's layout). The same float operations as compress.c, each with its
 * IEEE round-to-nearest intrinsic (no contraction into a fused multiply-add); a block holding NaN
 * or infinity (its scale NaN) has codes 0, whatever the GPU's NaN, as compress.c gives it.
 *
 * An encode is three launches: hoop_codec_top_* (a warp a block) leaves each block's largest
 * magnitude in the scale's place, hoop_codec_encode_* (a thread an element) reads it there and
 * writes the element's code (and what the encoding dropped, with error feedback), and
 * hoop_codec_scale_* (a thread a block) turns the largest magnitude into the scale. bf16 needs
 * only the middle one. Decoding is a thread an element, and so are hoop_codec_widen_*, which
 * starts a float32 sum (its piece) from data, and hoop_codec_narrow_*, which ends one in data.
 * Every codec kernel takes (piece, data, residual, count, format, stochastic, seed, first): data
 * is the input (dtype) of an encode or a widen, the output of a decode or a narrow (dtype) or of a
 * decode-add (float32). */

#include "codec_shape.h"

#define CODEC_BLOCK HOOP__CODEC_BLOCK
#define CODEC_BF16 1
#define CODEC_FP8 2
#define CODEC_INT8 3
#define FP8_MAX_BITS 0x43e00000u
#define FP8_NORMAL_BITS 0x3c800000u
#define ROUNDER 0x1.8p23f
#define TINY 0x1p-100f

/* A float's integer part, INT32_MIN where it has none in range (x86-64's conversion; C++ leaves
 * it undefined, and the GPU saturates): only a block of NaN or infinity reaches that, and its
 * codes are 0 whatever comes of it. */
__device__ static inline int32_t to_int32(float v) {
  return v >= -0x1p31f && v < 0x1p31f ? (int32_t)v : INT32_MIN;
}

__device__ static inline float round_even(float v) {
  return __fadd_rn(__fadd_rn(v, ROUNDER), -ROUNDER);
}

__device__ static inline uint32_t random_bits(uint32_t seed, uint32_t index) {
  uint32_t h = (index * 0x9e3779b1u) ^ seed;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

__device__ static inline float uniform(uint32_t bits) {
  return __fmul_rn((float)(int32_t)(bits >> 8), 0x1p-24f);
}

__device__ static inline int32_t floor_int(float v) {
  float t = round_even(v);
  return (int32_t)((uint32_t)to_int32(t) - (uint32_t)((int32_t)float_bits(__fadd_rn(t, -v)) > 0));
}

__device__ static inline uint32_t fp8_magnitude(float v) {
  uint32_t bits = float_bits(v) & 0x7fffffffu;
  return bits < FP8_MAX_BITS ? bits : FP8_MAX_BITS;
}

__device__ static inline uint8_t fp8_code(uint32_t sign, uint32_t ab, uint32_t subnormal,
                                          uint32_t add) {
  uint32_t normal = ((ab + add) >> 20) - ((127u - 7u) << 3);
  normal = normal < 0x7eu ? normal : 0x7eu;
  return (uint8_t)(sign | (ab < FP8_NORMAL_BITS ? subnormal : normal));
}

__device__ static inline float fp8_value(uint8_t c) {
  uint32_t e = (uint32_t)(c >> 3) & 15u, m = (uint32_t)c & 7u, subnormal = e == 0;
  float v = __fadd_rn(bits_float((e + subnormal + 120u) << 23 | m << 20),
                      -bits_float(FP8_NORMAL_BITS & (0u - subnormal)));
  return bits_float(float_bits(v) | ((uint32_t)c & 0x80u) << 24);
}

/* A piece's parts: its scales (fp8, int8) and its codes. */
__device__ static inline float *codec_scales(void *piece) {
  return (float *)piece;
}
__device__ static inline unsigned char *codec_codes(void *piece, int format, size_t count) {
  return (unsigned char *)piece +
         (format == CODEC_BF16 ? 0 : sizeof(float) * ((count + CODEC_BLOCK - 1) / CODEC_BLOCK));
}

/* Element i of the input, widened, with what the last encoding dropped added. */
template <typename K>
__device__ static inline float codec_input(const void *data, const float *residual, size_t i);
template <> __device__ inline float codec_input<floating<float>>(const void *data,
                                                                 const float *residual, size_t i) {
  float x = ((const float *)data)[i];
  return residual ? __fadd_rn(x, residual[i]) : x;
}
template <> __device__ inline float codec_input<half16>(const void *data, const float *residual,
                                                        size_t i) {
  float x = half_to_float(((const uint16_t *)data)[i]);
  return residual ? __fadd_rn(x, residual[i]) : x;
}
template <> __device__ inline float codec_input<bfloat16>(const void *data, const float *residual,
                                                          size_t i) {
  float x = bf16_to_float(((const uint16_t *)data)[i]);
  return residual ? __fadd_rn(x, residual[i]) : x;
}

/* The block's scale, and the inverse the codes are made with, from its largest magnitude's bits. */
__device__ static inline void block_scale(uint32_t top, float qmax, float *scale, float *inverse) {
  float largest = bits_float(top);
  if (top >= 0x7f800000u) {
    *scale = bits_float(0x7fc00000u);
    *inverse = 0;
  } else if (largest < TINY) {
    *scale = *inverse = 0;
  } else {
    *scale = __fdiv_rn(largest, qmax);
    *inverse = __fdiv_rn(qmax, largest);
  }
}

/* Code i's value (times its block's scale), as the receivers decode it. */
__device__ static inline float codec_value(void *piece, int format, size_t count, size_t i) {
  const unsigned char *codes = codec_codes(piece, format, count);
  if (format == CODEC_BF16)
    return bf16_to_float(((const uint16_t *)codes)[i]);
  float scale = codec_scales(piece)[i / CODEC_BLOCK];
  float v = format == CODEC_INT8 ? (float)(int8_t)codes[i] : fp8_value(codes[i]);
  return __fmul_rn(v, scale);
}

/* Each block's largest magnitude (as the bits of its absolute value, which order as the values
 * do; a NaN's above every number), launched with CODEC_WARP threads a block. On the GPU a warp
 * takes a block: lane l reads its elements l, l + 32, ..., so that the warp's loads are
 * coalesced, and shuffles leave the largest with lane 0. Compiled for the CPU (the stand-in
 * driver runs threads one after another and has no shuffles) a thread takes a block, the others
 * none. Either way the largest of the same integers. */
#define CODEC_WARP HOOP__CODEC_WARP
template <typename K>
__device__ static void codec_top(void *piece, const void *data, const float *residual,
                                 size_t count) {
  size_t blocks = (count + CODEC_BLOCK - 1) / CODEC_BLOCK;
  size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
#ifdef __CUDA_ARCH__
  unsigned lane = threadIdx.x % CODEC_WARP;
  for (size_t b = thread / CODEC_WARP; b < blocks; b += stride / CODEC_WARP) {
    size_t end = (b + 1) * CODEC_BLOCK < count ? (b + 1) * CODEC_BLOCK : count;
    int32_t top = 0;
    for (size_t i = b * CODEC_BLOCK + lane; i < end; i += CODEC_WARP) {
      int32_t a = (int32_t)(float_bits(codec_input<K>(data, residual, i)) & 0x7fffffffu);
      top = a > top ? a : top;
    }
    for (int apart = CODEC_WARP / 2; apart > 0; apart /= 2) {
      int32_t other = __shfl_xor_sync(0xffffffffu, top, apart);
      top = other > top ? other : top;
    }
    if (lane == 0)
      ((uint32_t *)piece)[b] = (uint32_t)top;
  }
#else
  for (size_t b = thread; b < blocks; b += stride) {
    size_t end = (b + 1) * CODEC_BLOCK < count ? (b + 1) * CODEC_BLOCK : count;
    int32_t top = 0;
    for (size_t i = b * CODEC_BLOCK; i < end; i++) {
      int32_t a = (int32_t)(float_bits(codec_input<K>(data, residual, i)) & 0x7fffffffu);
      top = a > top ? a : top;
    }
    ((uint32_t *)piece)[b] = (uint32_t)top;
  }
#endif
}

template <typename K>
__device__ static void codec_encode(void *piece, const void *data, float *residual, size_t count,
                                    int format, int stochastic, uint32_t seed, uint32_t first) {
  unsigned char *codes = codec_codes(piece, format, count);
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    float x = codec_input<K>(data, residual, i);
    uint32_t random = stochastic ? random_bits(seed, first + (uint32_t)i) : 0;
    float scale = 1, inverse = 1;
    if (format == CODEC_BF16) {
      uint32_t bits = float_bits(x);
      ((uint16_t *)codes)[i] =
          !stochastic ? float_to_bf16(x)
          : (bits & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((bits >> 16) | 0x40u)
                                                : (uint16_t)((bits + (random >> 16)) >> 16);
    } else {
      float qmax = format == CODEC_INT8 ? 127.0f : 448.0f;
      uint32_t top = ((const uint32_t *)piece)[i / CODEC_BLOCK];
      block_scale(top, qmax, &scale, &inverse);
      float scaled = __fmul_rn(x, inverse);
      if (top >= 0x7f800000u) {
        codes[i] = 0; /* a block of NaN or infinity: its codes are 0, as compress.c makes them */
      } else if (format == CODEC_INT8) {
        /* To nearest the code is within +-127 (no clamp, as compress.c has none). */
        int32_t c = stochastic ? floor_int(__fadd_rn(scaled, uniform(random)))
                               : to_int32(round_even(scaled));
        if (stochastic)
          c = c > 127 ? 127 : c < -127 ? -127 : c;
        codes[i] = (uint8_t)(int8_t)c;
      } else {
        uint32_t ab = fp8_magnitude(scaled), sign = (float_bits(x) >> 24) & 0x80u, subnormal, add;
        if (!stochastic) {
          subnormal = (uint32_t)to_int32(round_even(__fmul_rn(bits_float(ab), 512.0f)));
          add = 0x7ffffu + ((ab >> 20) & 1u);
        } else {
          add = random >> 12;
          float low = __fadd_rn(bits_float(ab), bits_float(FP8_NORMAL_BITS));
          subnormal = ((float_bits(low) + add) >> 20) - ((127u - 6u) << 3);
        }
        codes[i] = fp8_code(sign, ab, subnormal, add);
      }
    }
    if (residual) {
      /* The code's value as the receivers decode it (the scale the last launch writes). */
      float v;
      if (format == CODEC_BF16)
        v = bf16_to_float(((const uint16_t *)codes)[i]);
      else
        v = __fmul_rn(format == CODEC_INT8 ? (float)(int8_t)codes[i] : fp8_value(codes[i]), scale);
      float d = __fadd_rn(x, -v);
      residual[i] = __fadd_rn(d, -d) == 0.0f ? d : 0.0f;
    }
  }
}

__device__ static void codec_scale(void *piece, size_t count, int format) {
  size_t blocks = (count + CODEC_BLOCK - 1) / CODEC_BLOCK;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  float qmax = format == CODEC_INT8 ? 127.0f : 448.0f;
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    float scale, inverse;
    block_scale(((const uint32_t *)piece)[b], qmax, &scale, &inverse);
    codec_scales(piece)[b] = scale;
  }
}

/* Element i of data (dtype K) = v, rounded as compress.c's hoop__from_float rounds it. */
template <typename K> __device__ static inline void codec_store(void *data, size_t i, float v);
template <> __device__ inline void codec_store<floating<float>>(void *data, size_t i, float v) {
  ((float *)data)[i] = v;
}
template <> __device__ inline void codec_store<half16>(void *data, size_t i, float v) {
  ((uint16_t *)data)[i] = float_to_half(v);
}
template <> __device__ inline void codec_store<bfloat16>(void *data, size_t i, float v) {
  ((uint16_t *)data)[i] = float_to_bf16(v);
}

template <typename K>
__device__ static void codec_decode(void *piece, void *data, size_t count, int format) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
    codec_store<K>(data, i, codec_value(piece, format, count, i));
}

/* A widen: the piece is count float32s, each of data's elements as a float (an exact sum's start,
 * as compress.c's hoop__to_float); a narrow the other way (a finished sum into the dtype). */
template <typename K>
__device__ static void codec_widen(void *piece, const void *data, size_t count) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
    ((float *)piece)[i] = codec_input<K>(data, NULL, i);
}
template <typename K> __device__ static void codec_narrow(void *piece, void *data, size_t count) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
    codec_store<K>(data, i, ((const float *)piece)[i]);
}

__device__ static void codec_decode_add(void *piece, float *acc, size_t count, int format) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
    acc[i] = __fadd_rn(acc[i], codec_value(piece, format, count, i));
}

/* Every codec kernel has the same parameters (the stand-in driver checks them alike); each names
 * those it reads. */
#define CODEC_PARAMS(piece, data, residual, count, format, stochastic, seed, first)                 \
  void *piece, void *data, float *residual, size_t count, int format, int stochastic,            \
      uint32_t seed, uint32_t first
#define DEFINE_CODEC(name, K)                                                                       \
  extern "C" __global__ void hoop_codec_top_##name(CODEC_PARAMS(piece, data, residual, count, , , \
                                                                , )) {                            \
    codec_top<K>(piece, data, residual, count);                                                   \
  }                                                                                                \
  extern "C" __global__ void hoop_codec_encode_##name(                                             \
      CODEC_PARAMS(piece, data, residual, count, format, stochastic, seed, first)) {              \
    codec_encode<K>(piece, data, residual, count, format, stochastic, seed, first);               \
  }                                                                                                \
  extern "C" __global__ void hoop_codec_decode_##name(                                             \
      CODEC_PARAMS(piece, data, , count, format, , , )) {                                          \
    codec_decode<K>(piece, data, count, format);                                                  \
  }                                                                                                \
  extern "C" __global__ void hoop_codec_widen_##name(CODEC_PARAMS(piece, data, , count, , , , )) { \
    codec_widen<K>(piece, data, count);                                                           \
  }                                                                                                \
  extern "C" __global__ void hoop_codec_narrow_##name(CODEC_PARAMS(piece, data, , count, , , , )) {\
    codec_narrow<K>(piece, data, count);                                                          \
  }

DEFINE_CODEC(float32, floating<float>)
DEFINE_CODEC(float16, half16)
DEFINE_CODEC(bfloat16, bfloat16)

extern "C" __global__ void hoop_codec_scale(CODEC_PARAMS(piece, , , count, format, , , )) {
  codec_scale(piece, count, format);
}

extern "C" __global__ void hoop_codec_decode_add(CODEC_PARAMS(piece, data, , count, format, , , )) {
  codec_decode_add(piece, (float *)data, count, format);
}
