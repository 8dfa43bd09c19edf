/* kernels_host.h - lib/mem/cuda/kernels.cu compiled for the CPU (kernels_host.cc), as the stand-in
 * driver (fakecuda.h) launches it. */
#ifndef HOOP_TESTS_KERNELS_HOST_H
#define HOOP_TESTS_KERNELS_HOST_H

#include <stddef.h>

enum { FAKECUDA_REDUCE, FAKECUDA_DIVIDE, FAKECUDA_MANY, FAKECUDA_CODEC };

/* One launch, its pointers already where the CPU reads the bytes: hoop_reduce_* (dst, a, b,
 * count), hoop_divide_* (dst, count, divide), hoop_many_* (dst, srcs[0..nsrcs), count, divide) or
 * hoop_codec_* (dst: the piece, data, residual, count, format, stochastic, seed, first). */
typedef struct fakecuda_kernel {
  void *fn; /* the kernel, from fakecuda_kernel_named */
  int kind;
  void *dst;
  const void *a, *b;
  const void *srcs[8];
  int nsrcs;
  size_t count;
  int divide;
  void *data;
  float *residual;
  int format, stochastic;
  unsigned seed, first;
  /* A codec kernel's step (FAKECUDA_CODEC_*), and the bytes of its piece and its data, for the
   * stand-in's race check. */
  int step;
  size_t piece_bytes, data_bytes;
} fakecuda_kernel;

enum {
  FAKECUDA_CODEC_TOP,
  FAKECUDA_CODEC_ENCODE,
  FAKECUDA_CODEC_DECODE,
  FAKECUDA_CODEC_SCALE,
  FAKECUDA_CODEC_DECODE_ADD,
  FAKECUDA_CODEC_WIDEN,
  FAKECUDA_CODEC_NARROW
};

/* The kernel of that name (hoop_reduce_float32_sum, ...), or NULL. */
void *fakecuda_kernel_named(const char *name);

/* Runs every thread of the grid, one after the other. */
void fakecuda_launch(const fakecuda_kernel *k, const unsigned grid[3], const unsigned block[3]);

#endif
