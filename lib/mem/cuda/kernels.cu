/* kernels.cu - the reduction kernels of reduce.h on the GPU, bit for bit the same results.
 *
 * Built by nvcc into a fatbin (sm_80, sm_90, and PTX for newer GPUs) that is embedded in libhoop
 * and loaded with cuModuleLoadData (lib/mem/cuda/kernels.c): no CUDA runtime, no C++ runtime.
 * Every kernel is extern "C" with a name of the form hoop_reduce_<dtype>_<op> or
 * hoop_divide_<dtype>.
 *
 * To match lib/mem/reduce.c exactly: the same operand order (dst = a op b), MIN and MAX as
 * `a < b ? a : b` (not fminf, which treats NaN and zeros otherwise), integer arithmetic in the
 * unsigned twin type (wraparound), float16 and bfloat16 through float with the same integer
 * conversion code (round to nearest even, subnormals kept: no -ftz, no fast math), and AVG as a
 * sum followed by one IEEE division. Loads are 16 bytes wide where all three pointers allow it.
 *
 * hoop_many_<dtype>_<op> reduces up to HOOP_MANY_MAX sources in one pass (the CUDA IPC allreduce's
 * block of every rank's input): dst = ((s0 op s1) op s2) ..., each step rounded to the element
 * type as the chain of two-operand kernels would, then divided by `divide` when it is not 0 (AVG).
 * Each element is read from every source before it is written, so dst may be one of them.
 *
 * hoop_tree_<dtype>_<op> takes the same sources and combines them over reproducible mode's fixed
 * tree instead (lib/mem/reduce.h, hoop__reduce_fixed): with p the largest power of two <= n and
 * rem = n - p, leaf v is sources 2v and 2v + 1 combined for v < rem and source v + rem after,
 * then adjacent leaves, pairs of them and so on, the lower operand on the left, each step rounded
 * as the two-operand kernels round it; so a device buffer gets the host's bits.
 */
#include <stddef.h>
#include <stdint.h>

/* ---- combining two elements (as reduce.c's COMBINE_*) ---------------------------------------- */

struct op_sum {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return (T)((U)x + (U)y);
  }
};
struct op_prod {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return (T)((U)x * (U)y);
  }
};
struct op_min {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return x < y ? x : y;
  }
};
struct op_max {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return x > y ? x : y;
  }
};
struct op_band {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return (T)((U)x & (U)y);
  }
};
struct op_bor {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return (T)((U)x | (U)y);
  }
};
struct op_bxor {
  template <typename T, typename U> __device__ static T apply(T x, T y) {
    return (T)((U)x ^ (U)y);
  }
};

/* ---- float16 and bfloat16 through float (reduce.c's conversions, unchanged) -------------------- */

__device__ static inline uint32_t float_bits(float f) {
  return __float_as_uint(f);
}

__device__ static inline float bits_float(uint32_t bits) {
  return __uint_as_float(bits);
}

__device__ static inline float half_to_float(uint16_t half) {
  float subnormal = __fmul_rn((float)(half & 0x3ff), 0x1p-24f);
  uint32_t sign = (uint32_t)(half & 0x8000) << 16;
  int32_t mag = half & 0x7fff;
  uint32_t bits = ((uint32_t)mag << 13) + ((uint32_t)(127 - 15) << 23);
  bits = mag > 0x7bff ? bits + ((uint32_t)(128 - 16) << 23) : bits;
  return bits_float((mag < 0x0400 ? float_bits(subnormal) : bits) | sign);
}

__device__ static inline uint16_t float_to_half(float f) {
  float magnitude = bits_float(float_bits(f) & 0x7fffffff);
  uint16_t subnormal = (uint16_t)(float_bits(__fadd_rn(magnitude, 0.5f)) - float_bits(0.5f));
  uint32_t bits = float_bits(f);
  uint32_t sign = (bits >> 16) & 0x8000;
  int32_t mag = (int32_t)(bits & 0x7fffffff);
  uint32_t normal = (bits & 0x7fffffff) - ((uint32_t)(127 - 15) << 23);
  normal = (normal + 0xfff + ((normal >> 13) & 1)) >> 13;
  uint32_t special = mag > 0x7f800000 ? 0x7e00 | ((bits >> 13) & 0x3ff) : 0x7c00;
  uint32_t result = mag > 0x477fffff ? special : mag < 0x38800000 ? subnormal : normal;
  return (uint16_t)(result | sign);
}

__device__ static inline float bf16_to_float(uint16_t bf16) {
  return bits_float((uint32_t)bf16 << 16);
}

__device__ static inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_bits(f);
  uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
  uint32_t nan = (bits >> 16) | 0x40;
  return (uint16_t)((int32_t)(bits & 0x7fffffff) > 0x7f800000 ? nan : rounded);
}

/* An element type, the type its arithmetic happens in, and how it reaches and leaves it. */
template <typename T, typename U> struct plain {
  typedef T elem;
  template <typename Op> __device__ static T combine(T x, T y) {
    return Op::template apply<T, U>(x, y);
  }
  /* C division in the element's own type: signed types truncate toward zero. */
  __device__ static T divide(T x, int nranks) {
    return (T)(x / (T)nranks);
  }
};

/* The 8- and 16-bit integers: arithmetic in U (uint8_t for 8 bits; uint32_t for 16, as uint16_t
 * would promote to int, whose product of two large values overflows), and the division in int, so
 * that a rank count above the type's range is not truncated first. */
template <typename T, typename U> struct narrow_int {
  typedef T elem;
  template <typename Op> __device__ static T combine(T x, T y) {
    return Op::template apply<T, U>(x, y);
  }
  __device__ static T divide(T x, int nranks) {
    return (T)((int)x / nranks);
  }
};

/* bool: each operand taken as 0 or 1, the op applied, the result made 0 or 1 again (reduce.c's
 * BOOL_OF): sum and max are or, prod and min and. It has no average. */
struct boolean {
  typedef uint8_t elem;
  template <typename Op> __device__ static uint8_t combine(uint8_t x, uint8_t y) {
    return (uint8_t)(Op::template apply<uint8_t, uint32_t>(x != 0, y != 0) != 0);
  }
  __device__ static uint8_t divide(uint8_t x, int nranks) {
    (void)nranks; /* never launched: the calls refuse bool's AVG */
    return x;
  }
};

struct half16 {
  typedef uint16_t elem;
  template <typename Op> __device__ static uint16_t combine(uint16_t x, uint16_t y) {
    return float_to_half(Op::template apply<float, float>(half_to_float(x), half_to_float(y)));
  }
  __device__ static uint16_t divide(uint16_t x, int nranks) {
    return float_to_half(__fdiv_rn(half_to_float(x), (float)nranks));
  }
};

struct bfloat16 {
  typedef uint16_t elem;
  template <typename Op> __device__ static uint16_t combine(uint16_t x, uint16_t y) {
    return float_to_bf16(Op::template apply<float, float>(bf16_to_float(x), bf16_to_float(y)));
  }
  __device__ static uint16_t divide(uint16_t x, int nranks) {
    return float_to_bf16(__fdiv_rn(bf16_to_float(x), (float)nranks));
  }
};

/* float sum and prod with the IEEE round-to-nearest intrinsics, so that no -fmad contraction or
 * flag can change them; min and max compare. */
struct op_fsum {
  template <typename T, typename U> __device__ static T apply(T x, T y);
};
template <> __device__ float op_fsum::apply<float, float>(float x, float y) {
  return __fadd_rn(x, y);
}
template <> __device__ double op_fsum::apply<double, double>(double x, double y) {
  return __dadd_rn(x, y);
}
struct op_fprod {
  template <typename T, typename U> __device__ static T apply(T x, T y);
};
template <> __device__ float op_fprod::apply<float, float>(float x, float y) {
  return __fmul_rn(x, y);
}
template <> __device__ double op_fprod::apply<double, double>(double x, double y) {
  return __dmul_rn(x, y);
}

template <typename T> struct floating {
  typedef T elem;
  template <typename Op> __device__ static T combine(T x, T y) {
    return Op::template apply<T, T>(x, y);
  }
  __device__ static T divide(T x, int nranks);
};
template <> __device__ float floating<float>::divide(float x, int nranks) {
  return __fdiv_rn(x, (float)nranks);
}
template <> __device__ double floating<double>::divide(double x, int nranks) {
  return __ddiv_rn(x, (double)nranks);
}

/* ---- the loops ----------------------------------------------------------------------------------- */

/* dst[i] = a[i] op b[i]; dst may be a or b. Threads stride over 16-byte vectors when the three
 * pointers are 16-byte aligned, and over elements for the rest. */
template <typename K, typename Op>
__device__ static void reduce_loop(typename K::elem *dst, const typename K::elem *a,
                                   const typename K::elem *b, size_t n) {
  typedef typename K::elem T;
  const size_t per = 16 / sizeof(T);
  size_t start = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  if ((((uintptr_t)dst | (uintptr_t)a | (uintptr_t)b) & 15) == 0) {
    size_t vectors = n / per;
    for (size_t v = start; v < vectors; v += stride) {
      uint4 x = ((const uint4 *)a)[v], y = ((const uint4 *)b)[v], out;
      const T *xs = (const T *)&x, *ys = (const T *)&y;
      T *os = (T *)&out;
#pragma unroll
      for (size_t k = 0; k < per; k++)
        os[k] = K::template combine<Op>(xs[k], ys[k]);
      ((uint4 *)dst)[v] = out;
    }
    done = vectors * per;
  }
  for (size_t i = done + start; i < n; i += stride)
    dst[i] = K::template combine<Op>(a[i], b[i]);
}

#define HOOP_MANY_MAX 8 /* as in lib/mem/cuda/kernels.c */

struct many_sources {
  const void *src[HOOP_MANY_MAX];
  int n;
};

/* dst[i] = src[0][i] op src[1][i] op ... (left to right), divided by divide unless it is 0. */
template <typename K, typename Op>
__device__ static void many_loop(typename K::elem *dst, const many_sources &s, size_t n,
                                 int divide) {
  typedef typename K::elem T;
  const size_t per = 16 / sizeof(T);
  size_t start = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  /* Loops to the fixed HOOP_MANY_MAX, unrolled, so that the sources stay in registers rather than
   * being indexed in a local copy of the parameter. */
  uintptr_t bits = (uintptr_t)dst;
#pragma unroll
  for (int j = 0; j < HOOP_MANY_MAX; j++)
    if (j < s.n)
      bits |= (uintptr_t)s.src[j];
  if ((bits & 15) == 0) {
    size_t vectors = n / per;
    for (size_t v = start; v < vectors; v += stride) {
      uint4 acc = ((const uint4 *)s.src[0])[v];
      T *as = (T *)&acc;
#pragma unroll
      for (int j = 1; j < HOOP_MANY_MAX; j++) {
        if (j >= s.n)
          break;
        uint4 y = ((const uint4 *)s.src[j])[v];
        const T *ys = (const T *)&y;
#pragma unroll
        for (size_t k = 0; k < per; k++)
          as[k] = K::template combine<Op>(as[k], ys[k]);
      }
      if (divide)
#pragma unroll
        for (size_t k = 0; k < per; k++)
          as[k] = K::divide(as[k], divide);
      ((uint4 *)dst)[v] = acc;
    }
    done = vectors * per;
  }
  for (size_t i = done + start; i < n; i += stride) {
    T acc = ((const T *)s.src[0])[i];
#pragma unroll
    for (int j = 1; j < HOOP_MANY_MAX; j++) {
      if (j >= s.n)
        break;
      acc = K::template combine<Op>(acc, ((const T *)s.src[j])[i]);
    }
    if (divide)
      acc = K::divide(acc, divide);
    dst[i] = acc;
  }
}

/* One element over the fixed tree of the sources (p, rem as above). Unrolled to HOOP_MANY_MAX, so
 * that the leaves stay in registers. */
template <typename K, typename Op>
__device__ static typename K::elem tree_element(const many_sources &s, size_t i, int p, int rem) {
  typedef typename K::elem T;
  T v[HOOP_MANY_MAX];
#pragma unroll
  for (int j = 0; j < HOOP_MANY_MAX; j++) {
    if (j >= p)
      break;
    if (j < rem && 2 * j + 1 < HOOP_MANY_MAX)
      v[j] = K::template combine<Op>(((const T *)s.src[2 * j])[i], ((const T *)s.src[2 * j + 1])[i]);
    else if (j + rem < HOOP_MANY_MAX)
      v[j] = ((const T *)s.src[j + rem])[i];
  }
#pragma unroll
  for (int w = 1; w < HOOP_MANY_MAX; w *= 2)
#pragma unroll
    for (int j = 0; j + w < HOOP_MANY_MAX; j += 2 * w)
      if (j + w < p)
        v[j] = K::template combine<Op>(v[j], v[j + w]);
  return v[0];
}

/* dst[i] = the sources' elements i over the fixed tree, divided by divide unless it is 0. */
template <typename K, typename Op>
__device__ static void tree_loop(typename K::elem *dst, const many_sources &s, size_t n,
                                 int divide) {
  int p = 1;
  while (p * 2 <= s.n)
    p *= 2;
  int rem = s.n - p;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    typename K::elem acc = tree_element<K, Op>(s, i, p, rem);
    if (divide)
      acc = K::divide(acc, divide);
    dst[i] = acc;
  }
}

template <typename K>
__device__ static void divide_loop(typename K::elem *buf, size_t n, int nranks) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    buf[i] = K::divide(buf[i], nranks);
}

#define DEFINE_REDUCE(name, K, OP)                                                                  \
  extern "C" __global__ void hoop_reduce_##name##_##OP(void *dst, const void *a, const void *b,  \
                                                       size_t n) {                                \
    reduce_loop<K, op_##OP>((K::elem *)dst, (const K::elem *)a, (const K::elem *)b, n);          \
  }

#define DEFINE_FLOAT_REDUCE(name, K, OP, FOP)                                                       \
  extern "C" __global__ void hoop_reduce_##name##_##OP(void *dst, const void *a, const void *b,  \
                                                       size_t n) {                                \
    reduce_loop<K, FOP>((K::elem *)dst, (const K::elem *)a, (const K::elem *)b, n);              \
  }

#define DEFINE_MANY(name, K, OP, FOP)                                                               \
  extern "C" __global__ void hoop_many_##name##_##OP(void *dst, many_sources s, size_t n,        \
                                                     int divide) {                               \
    many_loop<K, FOP>((K::elem *)dst, s, n, divide);                                              \
  }

#define DEFINE_TREE(name, K, OP, FOP)                                                               \
  extern "C" __global__ void hoop_tree_##name##_##OP(void *dst, many_sources s, size_t n,        \
                                                     int divide) {                               \
    tree_loop<K, FOP>((K::elem *)dst, s, n, divide);                                              \
  }

#define DEFINE_DIVIDE(name, K)                                                                      \
  extern "C" __global__ void hoop_divide_##name(void *buf, size_t n, int nranks) {               \
    divide_loop<K>((K::elem *)buf, n, nranks);                                                    \
  }

/* One op of an integer type (or bool): its two-source, many-source and fixed-tree kernels. */
#define DEFINE_INT_OP(name, K, OP)                                                                  \
  DEFINE_REDUCE(name, K, OP)                                                                        \
  DEFINE_MANY(name, K, OP, op_##OP)                                                                 \
  DEFINE_TREE(name, K, OP, op_##OP)

/* The integer types and bool: every op, the bitwise ones included, and the division. */
#define DEFINE_INTS(name, K)                                                                        \
  DEFINE_INT_OP(name, K, sum)                                                                       \
  DEFINE_INT_OP(name, K, prod)                                                                      \
  DEFINE_INT_OP(name, K, min)                                                                       \
  DEFINE_INT_OP(name, K, max)                                                                       \
  DEFINE_INT_OP(name, K, band)                                                                      \
  DEFINE_INT_OP(name, K, bor)                                                                       \
  DEFINE_INT_OP(name, K, bxor)                                                                      \
  DEFINE_DIVIDE(name, K)

#define DEFINE_FLOATS(name, K)                                                                      \
  DEFINE_FLOAT_REDUCE(name, K, sum, op_fsum)                                                        \
  DEFINE_FLOAT_REDUCE(name, K, prod, op_fprod)                                                      \
  DEFINE_FLOAT_REDUCE(name, K, min, op_min)                                                         \
  DEFINE_FLOAT_REDUCE(name, K, max, op_max)                                                         \
  DEFINE_MANY(name, K, sum, op_fsum)                                                                \
  DEFINE_MANY(name, K, prod, op_fprod)                                                              \
  DEFINE_MANY(name, K, min, op_min)                                                                 \
  DEFINE_MANY(name, K, max, op_max)                                                                 \
  DEFINE_TREE(name, K, sum, op_fsum)                                                                \
  DEFINE_TREE(name, K, prod, op_fprod)                                                              \
  DEFINE_TREE(name, K, min, op_min)                                                                 \
  DEFINE_TREE(name, K, max, op_max)                                                                 \
  DEFINE_DIVIDE(name, K)

/* The half types combine in float with the float ops. */
#define DEFINE_HALVES(name, K)                                                                      \
  extern "C" __global__ void hoop_reduce_##name##_sum(void *dst, const void *a, const void *b,    \
                                                      size_t n) {                                 \
    reduce_loop<K, op_fsum>((uint16_t *)dst, (const uint16_t *)a, (const uint16_t *)b, n);       \
  }                                                                                                \
  extern "C" __global__ void hoop_reduce_##name##_prod(void *dst, const void *a, const void *b,   \
                                                       size_t n) {                                \
    reduce_loop<K, op_fprod>((uint16_t *)dst, (const uint16_t *)a, (const uint16_t *)b, n);      \
  }                                                                                                \
  extern "C" __global__ void hoop_reduce_##name##_min(void *dst, const void *a, const void *b,    \
                                                      size_t n) {                                 \
    reduce_loop<K, op_min>((uint16_t *)dst, (const uint16_t *)a, (const uint16_t *)b, n);        \
  }                                                                                                \
  extern "C" __global__ void hoop_reduce_##name##_max(void *dst, const void *a, const void *b,    \
                                                      size_t n) {                                 \
    reduce_loop<K, op_max>((uint16_t *)dst, (const uint16_t *)a, (const uint16_t *)b, n);        \
  }                                                                                                \
  DEFINE_MANY(name, K, sum, op_fsum)                                                                \
  DEFINE_MANY(name, K, prod, op_fprod)                                                              \
  DEFINE_MANY(name, K, min, op_min)                                                                 \
  DEFINE_MANY(name, K, max, op_max)                                                                 \
  DEFINE_TREE(name, K, sum, op_fsum)                                                                \
  DEFINE_TREE(name, K, prod, op_fprod)                                                              \
  DEFINE_TREE(name, K, min, op_min)                                                                 \
  DEFINE_TREE(name, K, max, op_max)                                                                 \
  DEFINE_DIVIDE(name, K)

typedef narrow_int<int8_t, uint8_t> k_int8;
typedef narrow_int<uint8_t, uint8_t> k_uint8;
typedef narrow_int<int16_t, uint32_t> k_int16;
typedef narrow_int<uint16_t, uint32_t> k_uint16;
typedef plain<int32_t, uint32_t> k_int32;
typedef plain<uint32_t, uint32_t> k_uint32;
typedef plain<int64_t, uint64_t> k_int64;
typedef plain<uint64_t, uint64_t> k_uint64;

DEFINE_INTS(int8, k_int8)
DEFINE_INTS(uint8, k_uint8)
DEFINE_INTS(int16, k_int16)
DEFINE_INTS(uint16, k_uint16)
DEFINE_INTS(bool, boolean)
DEFINE_INTS(int32, k_int32)
DEFINE_INTS(uint32, k_uint32)
DEFINE_INTS(int64, k_int64)
DEFINE_INTS(uint64, k_uint64)
DEFINE_HALVES(float16, half16)
DEFINE_HALVES(bfloat16, bfloat16)
DEFINE_FLOATS(float32, floating<float>)
DEFINE_FLOATS(float64, floating<double>)

/* The codec of compressed reductions (lib/mem/compress.c's wire formats), bit for bit. */
#include "codec.cuh"
