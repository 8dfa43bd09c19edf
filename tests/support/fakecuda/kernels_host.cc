/* kernels_host.cc - lib/mem/cuda/kernels.cu itself, compiled for the CPU, so that the stand-in
 * driver (fakecuda.h) carries out hoop's kernels with their own code, launched as hoop launches
 * them, rather than with lib/mem/reduce.c: every device-buffer test in CI then runs the kernels'
 * indexing, their vector and scalar paths, the many-source chain and the float16 and bfloat16
 * conversions, and tests/test_cuda_kernels compares them with reduce.c for real.
 *
 * The few CUDA names kernels.cu uses are given their meaning on the CPU below: the IEEE
 * round-to-nearest intrinsics are the plain operations (x86-64 does float and double arithmetic in
 * SSE, one rounding per operation; built with -ffp-contract=off, so nothing is fused), the bit
 * casts are copies, uint4 is 16 aligned bytes, and blockIdx, threadIdx, blockDim and gridDim are
 * this thread's, set by fakecuda_launch for each simulated GPU thread in turn. The kernels never
 * synchronise their threads or share memory, so running those threads one after the other is one
 * of the orders a GPU may run them in. What this cannot check is the GPU's arithmetic itself (a
 * NaN's payload, say): test_cuda_kernels on a GPU does.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __device__
#define __global__

struct uint4 {
  unsigned int x, y, z, w;
} __attribute__((aligned(16)));
struct dim3 {
  unsigned int x, y, z;
};
static __thread dim3 blockIdx, threadIdx, blockDim, gridDim;

static inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline float __fadd_rn(float x, float y) {
  return x + y;
}
static inline float __fmul_rn(float x, float y) {
  return x * y;
}
static inline float __fdiv_rn(float x, float y) {
  return x / y;
}
static inline double __dadd_rn(double x, double y) {
  return x + y;
}
static inline double __dmul_rn(double x, double y) {
  return x * y;
}
static inline double __ddiv_rn(double x, double y) {
  return x / y;
}

#include "mem/cuda/kernels.cu"

extern "C" {
#include "kernels_host.h"
}

void *fakecuda_kernel_named(const char *name) {
  Dl_info info;
  if (!dladdr((void *)&fakecuda_kernel_named, &info) || !info.dli_fname)
    return NULL;
  void *self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  void *fn = self ? dlsym(self, name) : NULL;
  if (self)
    dlclose(self);
  return fn;
}

void fakecuda_launch(const fakecuda_kernel *k, const unsigned grid[3], const unsigned block[3]) {
  gridDim = dim3{grid[0], grid[1], grid[2]};
  blockDim = dim3{block[0], block[1], block[2]};
  many_sources sources = {};
  if (k->kind == FAKECUDA_MANY) {
    for (int j = 0; j < k->nsrcs && j < HOOP_MANY_MAX; j++)
      sources.src[j] = k->srcs[j];
    sources.n = k->nsrcs;
  }
  for (unsigned bz = 0; bz < grid[2]; bz++)
    for (unsigned by = 0; by < grid[1]; by++)
      for (unsigned bx = 0; bx < grid[0]; bx++)
        for (unsigned tz = 0; tz < block[2]; tz++)
          for (unsigned ty = 0; ty < block[1]; ty++)
            for (unsigned tx = 0; tx < block[0]; tx++) {
              blockIdx = dim3{bx, by, bz};
              threadIdx = dim3{tx, ty, tz};
              switch (k->kind) {
              case FAKECUDA_REDUCE:
                ((void (*)(void *, const void *, const void *, size_t))k->fn)(k->dst, k->a, k->b,
                                                                              k->count);
                break;
              case FAKECUDA_DIVIDE:
                ((void (*)(void *, size_t, int))k->fn)(k->dst, k->count, k->divide);
                break;
              case FAKECUDA_MANY:
                ((void (*)(void *, many_sources, size_t, int))k->fn)(k->dst, sources, k->count,
                                                                     k->divide);
                break;
              case FAKECUDA_CODEC:
                ((void (*)(void *, void *, float *, size_t, int, int, uint32_t, uint32_t))k->fn)(
                    k->dst, k->data, k->residual, k->count, k->format, k->stochastic, k->seed,
                    k->first);
                break;
              }
            }
}
