/* kernels.c - the stand-in driver's kernels (see fakecuda.h): hoop's reduction kernels,
 * lib/mem/cuda/kernels.cu compiled for the CPU (kernels_host.cc), carried out by the queue's worker
 * over the grid they were launched with. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fakecuda.h"
#include "hoop.h"

struct CUmod_st {
  int unused;
};
static struct CUmod_st the_module;

struct CUfunc_st {
  void *fn;  /* kernels.cu's function */
  int kind;  /* FAKECUDA_REDUCE, _DIVIDE, _MANY or _CODEC */
  int dtype; /* for the element size (a codec kernel's data; -1: it takes none) */
  int step;  /* a codec kernel's FAKECUDA_CODEC_* */
};

#define MANY_MAX 8
struct many_sources { /* lib/mem/cuda/kernels.cu's, passed by value */
  const void *src[MANY_MAX];
  int n;
};

static const size_t esizes[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = 1,    [HOOP_UINT8] = 1,   [HOOP_INT32] = 4,   [HOOP_UINT32] = 4,
    [HOOP_INT64] = 8,   [HOOP_UINT64] = 8,  [HOOP_FLOAT16] = 2, [HOOP_BFLOAT16] = 2,
    [HOOP_FLOAT32] = 4, [HOOP_FLOAT64] = 8, [HOOP_INT16] = 2,   [HOOP_UINT16] = 2,
    [HOOP_BOOL] = 1};

static const char *const dtype_names[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = "int8",       [HOOP_UINT8] = "uint8",       [HOOP_INT32] = "int32",
    [HOOP_UINT32] = "uint32",   [HOOP_INT64] = "int64",       [HOOP_UINT64] = "uint64",
    [HOOP_FLOAT16] = "float16", [HOOP_BFLOAT16] = "bfloat16", [HOOP_FLOAT32] = "float32",
    [HOOP_FLOAT64] = "float64", [HOOP_INT16] = "int16",       [HOOP_UINT16] = "uint16",
    [HOOP_BOOL] = "bool"};
/* The kernels' op names (AVG runs as sum), NOPS of them. */
static const char *const op_names[] = {"sum", "prod", "min", "max", "band", "bor", "bxor"};
#define NOPS ((int)(sizeof op_names / sizeof op_names[0]))
/* [dtype][op]: hoop_reduce_, [dtype][NOPS + op]: hoop_many_, [dtype][2 NOPS + op]: hoop_tree_
 * (launched as the many-source kernels are: the same parameters), [dtype][3 NOPS]:
 * hoop_divide_ */
static struct CUfunc_st functions[HOOP_DTYPE_COUNT][3 * NOPS + 1];

/* The codec's kernels (kernels.cu's hoop_codec_*): the steps that take a float dtype, by dtype;
 * hoop_codec_scale (no data) and hoop_codec_decode_add (float32 data). */
static const char *const codec_steps[] = {"top", "encode", "decode", "widen", "narrow"};
#define CODEC_STEPS ((int)(sizeof codec_steps / sizeof codec_steps[0]))
static const int codec_dtypes[] = {HOOP_FLOAT32, HOOP_FLOAT16, HOOP_BFLOAT16};
static struct CUfunc_st codec_functions[CODEC_STEPS][3], codec_scale, codec_decode_add;

static CUresult fake_module_load_data(CUmodule *module, const void *image) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!image)
    return CUDA_ERROR_INVALID_VALUE;
  *module = &the_module;
  return CUDA_SUCCESS;
}

/* Only hoop's kernels, each found in kernels_host.cc by its name. */
static CUresult function_named(CUfunction *f, struct CUfunc_st *slot, const char *name, int kind,
                               int dtype) {
  void *fn = fakecuda_kernel_named(name);
  if (!fn)
    return CUDA_ERROR_NOT_FOUND;
  *slot = (struct CUfunc_st){fn, kind, dtype, 0};
  *f = slot;
  return CUDA_SUCCESS;
}

/* A codec kernel: as function_named, with its step (FAKECUDA_CODEC_*). */
static CUresult codec_named(CUfunction *f, struct CUfunc_st *slot, const char *name, int dtype,
                            int step) {
  CUresult result = function_named(f, slot, name, FAKECUDA_CODEC, dtype);
  slot->step = step;
  return result;
}

static CUresult fake_module_get_function(CUfunction *f, CUmodule module, const char *name) {
  if (module != &the_module)
    return CUDA_ERROR_INVALID_HANDLE;
  char want[64];
  for (int d = 0; d < HOOP_DTYPE_COUNT; d++) {
    for (int o = 0; o < NOPS; o++) {
      snprintf(want, sizeof want, "hoop_reduce_%s_%s", dtype_names[d], op_names[o]);
      if (strcmp(name, want) == 0)
        return function_named(f, &functions[d][o], name, FAKECUDA_REDUCE, d);
      snprintf(want, sizeof want, "hoop_many_%s_%s", dtype_names[d], op_names[o]);
      if (strcmp(name, want) == 0)
        return function_named(f, &functions[d][NOPS + o], name, FAKECUDA_MANY, d);
      snprintf(want, sizeof want, "hoop_tree_%s_%s", dtype_names[d], op_names[o]);
      if (strcmp(name, want) == 0)
        return function_named(f, &functions[d][2 * NOPS + o], name, FAKECUDA_MANY, d);
    }
    snprintf(want, sizeof want, "hoop_divide_%s", dtype_names[d]);
    if (strcmp(name, want) == 0)
      return function_named(f, &functions[d][3 * NOPS], name, FAKECUDA_DIVIDE, d);
  }
  /* codec_steps' FAKECUDA_CODEC_*. */
  static const int step_of[CODEC_STEPS] = {FAKECUDA_CODEC_TOP, FAKECUDA_CODEC_ENCODE,
                                           FAKECUDA_CODEC_DECODE, FAKECUDA_CODEC_WIDEN,
                                           FAKECUDA_CODEC_NARROW};
  for (int step = 0; step < CODEC_STEPS; step++)
    for (int k = 0; k < 3; k++) {
      snprintf(want, sizeof want, "hoop_codec_%s_%s", codec_steps[step],
               dtype_names[codec_dtypes[k]]);
      if (strcmp(name, want) == 0)
        return codec_named(f, &codec_functions[step][k], name, codec_dtypes[k], step_of[step]);
    }
  if (strcmp(name, "hoop_codec_scale") == 0)
    return codec_named(f, &codec_scale, name, -1, FAKECUDA_CODEC_SCALE);
  if (strcmp(name, "hoop_codec_decode_add") == 0)
    return codec_named(f, &codec_decode_add, name, HOOP_FLOAT32, FAKECUDA_CODEC_DECODE_ADD);
  return CUDA_ERROR_NOT_FOUND;
}

/* A codec launch's pointers (piece, data, residual, count, format, stochastic, seed, first): the
 * piece of hoop__compress_bytes' size (a widen's or a narrow's: count floats), the data of count
 * elements unless the kernel takes none, the residual of count floats where it is given; 0 where
 * one is not device memory. */
static int codec_params(const struct CUfunc_st *f, void **params, fakecuda_kernel *k) {
  k->count = *(size_t *)params[3];
  k->format = *(int *)params[4];
  k->stochastic = *(int *)params[5];
  k->seed = *(uint32_t *)params[6];
  k->first = *(uint32_t *)params[7];
  size_t blocks = (k->count + HOOP_COMPRESS_BLOCK - 1) / HOOP_COMPRESS_BLOCK;
  int floats = f->step == FAKECUDA_CODEC_WIDEN || f->step == FAKECUDA_CODEC_NARROW;
  size_t piece = floats                            ? 4 * k->count
                 : k->format == HOOP_COMPRESS_BF16 ? 2 * k->count
                                                   : k->count + 4 * blocks;
  void *at = *(void **)params[0], *data = *(void **)params[1];
  float *residual = *(float **)params[2];
  if (!find(at, piece))
    return 0;
  k->dst = resolve((CUdeviceptr)(uintptr_t)at, piece);
  k->step = f->step;
  k->piece_bytes = piece;
  if (f->dtype >= 0) {
    size_t bytes = k->data_bytes = k->count * esizes[f->dtype];
    if (!find(data, bytes))
      return 0;
    k->data = resolve((CUdeviceptr)(uintptr_t)data, bytes);
  }
  if (residual) {
    if (!find(residual, k->count * sizeof(float)))
      return 0;
    k->residual =
        (float *)(void *)resolve((CUdeviceptr)(uintptr_t)residual, k->count * sizeof(float));
  }
  return 1;
}

/* The parameters are kernels.cu's: (dst, a, b, count) for a reduction, (buf, count, nranks) for
 * the division, (dst, sources, count, divide) for the many-source reduction, and the codec's
 * (codec_params); every pointer must be
 * device memory of this process (its own or mapped by IPC), as a kernel cannot read host memory
 * that is not mapped for it. The launch's shape is checked as the driver does (at most 1024
 * threads a block, a grid's y and z below 65536) and the grid is run as it is. */
static CUresult fake_launch_kernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shared, CUstream stream, void **params,
                                   void **extra) {
  (void)shared, (void)extra;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!f || !params || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 ||
      bz > 64 || (unsigned long long)bx * by * bz > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  async_op op = {.kernel = 1, .grid = {gx, gy, gz}, .block = {bx, by, bz}};
  fakecuda_kernel *k = &op.k;
  k->fn = f->fn, k->kind = f->kind;
  if (f->kind == FAKECUDA_CODEC) {
    pthread_mutex_lock(&lock);
    int ok = codec_params(f, params, k);
    kernels += ok;
    codecs += ok;
    pthread_mutex_unlock(&lock);
    if (!ok)
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    return enqueue_op(queue_of(stream), NULL, NULL, k->count, &op) ? CUDA_SUCCESS
                                                                   : CUDA_ERROR_OUT_OF_MEMORY;
  }
  size_t esize = esizes[f->dtype];
  int bad = 0;
  pthread_mutex_lock(&lock);
  if (f->kind == FAKECUDA_MANY) {
    const struct many_sources *sources = params[1];
    k->count = *(size_t *)params[2];
    k->divide = *(int *)params[3]; /* the division, 0: none */
    size_t bytes = k->count * esize;
    bad = sources->n < 1 || sources->n > MANY_MAX;
    for (int j = 0; !bad && j < sources->n; j++)
      if (!find(sources->src[j], bytes))
        bad = 1;
      else
        k->srcs[j] = resolve((CUdeviceptr)(uintptr_t)sources->src[j], bytes);
    k->nsrcs = sources->n;
  } else if (f->kind == FAKECUDA_REDUCE) {
    k->count = *(size_t *)params[3];
    size_t bytes = k->count * esize;
    bad = !find(*(void **)params[1], bytes) || !find(*(void **)params[2], bytes);
    if (!bad) {
      k->a = resolve((CUdeviceptr)(uintptr_t) * (void **)params[1], bytes);
      k->b = resolve((CUdeviceptr)(uintptr_t) * (void **)params[2], bytes);
    }
  } else {
    k->count = *(size_t *)params[1];
    k->divide = *(int *)params[2];
  }
  size_t bytes = k->count * esize;
  if (bad || !find(*(void **)params[0], bytes)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  k->dst = resolve((CUdeviceptr)(uintptr_t) * (void **)params[0], bytes);
  kernels++;
  pthread_mutex_unlock(&lock);
  return enqueue_op(queue_of(stream), NULL, NULL, bytes, &op) ? CUDA_SUCCESS
                                                              : CUDA_ERROR_OUT_OF_MEMORY;
}

const fakecuda_entry fakecuda_kernel_entries[] = {
    {"cuModuleLoadData", (void *)fake_module_load_data},
    {"cuModuleGetFunction", (void *)fake_module_get_function},
    {"cuLaunchKernel", (void *)fake_launch_kernel},
    {NULL, NULL},
};
