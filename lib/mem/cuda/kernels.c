/* kernels.c - hoop's reduction kernels (lib/mem/cuda/kernels.cu, embedded as a fatbin) loaded in
 * each context, launched on a stream of hoop's own there, and the copies, waits and scratch memory
 * that go with them (see cuda.h).
 */
#include "config.h"

#ifdef HOOP_HAVE_CUDA

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "mem/cuda/codec_shape.h"
#include "mem/cuda/driver.h"

#ifdef HOOP_HAVE_CUDA_KERNELS
#include "mem/cuda/kernels_fatbin.h" /* hoop_cuda_fatbin: lib/mem/cuda/kernels.cu, built by nvcc */
#endif

#define MAX_CONTEXTS 16
#define THREADS 256
#define MAX_BLOCKS 32768

_Static_assert(HOOP__CODEC_BLOCK == HOOP_COMPRESS_BLOCK,
               "codec.cuh's blocks are the wire format's (hoop.h)");

static const char *const dtype_names[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = "int8",       [HOOP_UINT8] = "uint8",       [HOOP_INT32] = "int32",
    [HOOP_UINT32] = "uint32",   [HOOP_INT64] = "int64",       [HOOP_UINT64] = "uint64",
    [HOOP_FLOAT16] = "float16", [HOOP_BFLOAT16] = "bfloat16", [HOOP_FLOAT32] = "float32",
    [HOOP_FLOAT64] = "float64", [HOOP_INT16] = "int16",       [HOOP_UINT16] = "uint16",
    [HOOP_BOOL] = "bool"};
static const char *const op_names[HOOP_OP_COUNT] = {
    [HOOP_SUM] = "sum", [HOOP_PROD] = "prod", [HOOP_MIN] = "min", [HOOP_MAX] = "max",
    [HOOP_AVG] = "sum", [HOOP_BAND] = "band", [HOOP_BOR] = "bor", [HOOP_BXOR] = "bxor"};

/* The module loaded in one context, its functions, and a stream of hoop's own there. */
typedef struct kernel_set {
  CUcontext context;
  CUstream stream;
  CUfunction reduce[HOOP_DTYPE_COUNT][HOOP_OP_COUNT];
  CUfunction divide[HOOP_DTYPE_COUNT];
  CUfunction many[HOOP_DTYPE_COUNT][HOOP_OP_COUNT];
  CUfunction tree[HOOP_DTYPE_COUNT][HOOP_OP_COUNT];
  /* The codec's (kernels.cu's hoop_codec_*), by the float dtype they read or write (CODEC_DTYPES'
   * order), and the two that take none. */
  CUfunction codec_top[3], codec_encode[3], codec_decode[3], codec_widen[3], codec_narrow[3],
      codec_scale, codec_decode_add;
  int loaded;              /* the functions are there */
  hoop_result load_failed; /* the kernels could not be loaded here (not tried again), and why */
  char load_why[160];
} kernel_set;

/* The dtypes the codec kernels take, in their functions' order. */
static const hoop_dtype codec_dtypes[3] = {HOOP_FLOAT32, HOOP_FLOAT16, HOOP_BFLOAT16};

static kernel_set sets[MAX_CONTEXTS];
static int nsets;
static pthread_mutex_t sets_lock = PTHREAD_MUTEX_INITIALIZER;

int hoop__cuda_kernels_built(void) {
#ifdef HOOP_HAVE_CUDA_KERNELS
  return 1;
#else
  return 0;
#endif
}

#ifdef HOOP_HAVE_CUDA_KERNELS
/* The module's kernel of that name, or the driver's error recorded. */
static hoop_result function_named(hoop_comm *comm, CUfunction *f, CUmodule module,
                                  const char *name) {
  CUresult err = hoop__cuda_drv.module_get_function(f, module, name);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, name, err);
}

static hoop_result load_codec(hoop_comm *comm, kernel_set *set, CUmodule module) {
  hoop_result result = HOOP_OK;
  char name[64];
  static const char *const steps[] = {"top", "encode", "decode", "widen", "narrow"};
  for (int k = 0; k < 3 && result == HOOP_OK; k++) {
    CUfunction *slots[] = {&set->codec_top[k], &set->codec_encode[k], &set->codec_decode[k],
                           &set->codec_widen[k], &set->codec_narrow[k]};
    for (int step = 0; step < 5 && result == HOOP_OK; step++) {
      snprintf(name, sizeof name, "hoop_codec_%s_%s", steps[step], dtype_names[codec_dtypes[k]]);
      result = function_named(comm, slots[step], module, name);
    }
  }
  if (result == HOOP_OK)
    result = function_named(comm, &set->codec_scale, module, "hoop_codec_scale");
  if (result == HOOP_OK)
    result = function_named(comm, &set->codec_decode_add, module, "hoop_codec_decode_add");
  return result;
}
#endif

/* The stream of hoop's own in context (current on this thread) and, if need_kernels, the kernels
 * loaded there: both made on first use. A driver or build that cannot load the kernels still has
 * the stream, for copies. */
static hoop_result kernels_for(hoop_comm *comm, CUcontext context, kernel_set **out,
                               int need_kernels) {
  hoop_result result = HOOP_OK;
  CUresult err;
  *out = NULL;
  pthread_mutex_lock(&sets_lock);
  kernel_set *set = NULL;
  for (int i = 0; i < nsets && !set; i++)
    if (sets[i].context == context)
      set = &sets[i];
  if (!set) {
    if (!hoop__cuda_drv.stream_create || !hoop__cuda_drv.stream_synchronize)
      result = hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "cuda: the driver has no streams");
    else if (nsets == MAX_CONTEXTS)
      result =
          hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "cuda: more than %d contexts", MAX_CONTEXTS);
    else {
      kernel_set *fresh = &sets[nsets];
      memset(fresh, 0, sizeof *fresh);
      fresh->context = context;
      if ((err = hoop__cuda_drv.stream_create(&fresh->stream, CU_STREAM_NON_BLOCKING)) !=
          CUDA_SUCCESS)
        result = hoop__cuda_driver_error(comm, "cuStreamCreate", err);
      else
        set = &sets[nsets++];
    }
  }
  if (result == HOOP_OK && need_kernels && set->load_failed) {
    result = hoop__set_error(comm, set->load_failed, "%s", set->load_why);
  } else if (result == HOOP_OK && need_kernels && !set->loaded) {
#ifndef HOOP_HAVE_CUDA_KERNELS
    result = hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                             "cuda: this libhoop has no GPU kernels (nvcc was not found at build)");
#else
    CUmodule module;
    if (!hoop__cuda_drv.module_load_data || !hoop__cuda_drv.module_get_function ||
        !hoop__cuda_drv.launch_kernel)
      result = hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                               "cuda: the driver cannot load kernels (no cuModuleLoadData)");
    else if ((err = hoop__cuda_drv.module_load_data(&module, hoop_cuda_fatbin)) != CUDA_SUCCESS)
      result = hoop__cuda_driver_error(comm, "cuModuleLoadData (hoop's kernels)", err);
    char name[64];
    for (int d = 0; d < HOOP_DTYPE_COUNT && result == HOOP_OK; d++) {
      for (int o = 0; o < HOOP_OP_COUNT && result == HOOP_OK; o++) {
        if (hoop__op_refused((hoop_dtype)d, (hoop_op)o))
          continue; /* no kernel: the calls refuse it first (bitwise on floats, bool's AVG) */
        snprintf(name, sizeof name, "hoop_reduce_%s_%s", dtype_names[d], op_names[o]);
        result = function_named(comm, &set->reduce[d][o], module, name);
        snprintf(name, sizeof name, "hoop_many_%s_%s", dtype_names[d], op_names[o]);
        if (result == HOOP_OK)
          result = function_named(comm, &set->many[d][o], module, name);
        snprintf(name, sizeof name, "hoop_tree_%s_%s", dtype_names[d], op_names[o]);
        if (result == HOOP_OK)
          result = function_named(comm, &set->tree[d][o], module, name);
      }
      snprintf(name, sizeof name, "hoop_divide_%s", dtype_names[d]);
      if (result == HOOP_OK)
        result = function_named(comm, &set->divide[d], module, name);
    }
    if (result == HOOP_OK)
      result = load_codec(comm, set, module);
    if (result == HOOP_OK) {
      set->loaded = 1;
    } else {
      set->load_failed = result;
      snprintf(set->load_why, sizeof set->load_why, "%.150s", comm->last_error);
    }
#endif
  }
  if (result == HOOP_OK)
    *out = set;
  pthread_mutex_unlock(&sets_lock);
  return result;
}

/* The kernel set of near's context (its kernels loaded if kernels), current on this thread for the
 * caller (pop it after, as fire does). */
static hoop_result enter_set(hoop_comm *comm, const void *near, kernel_set **set, int kernels) {
  CUcontext context = NULL;
  if (hoop__cuda_kind_and_context(near, &context) != HOOP__MEM_DEVICE || !context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: %p is not device memory", near);
  CUresult err = hoop__cuda_drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return hoop__cuda_driver_error(comm, "cuCtxPushCurrent", err);
  hoop_result result = kernels_for(comm, context, set, kernels);
  if (result != HOOP_OK) {
    CUcontext popped;
    hoop__cuda_drv.ctx_pop(&popped);
  }
  return result;
}

/* Launch f over threads threads (THREADS a block, at most MAX_BLOCKS blocks: the kernels stride)
 * on set's stream, wait for it if wait, and leave set's context. */
static hoop_result fire(hoop_comm *comm, kernel_set *set, CUfunction f, size_t threads,
                        void **params, int wait) {
  size_t blocks = (threads + THREADS - 1) / THREADS;
  blocks = blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks;
  hoop_result result = HOOP_OK;
  CUresult err = hoop__cuda_drv.launch_kernel(f, (unsigned)blocks, 1, 1, THREADS, 1, 1, 0,
                                              set->stream, params, NULL);
  if (err != CUDA_SUCCESS)
    result = hoop__cuda_driver_error(comm, "cuLaunchKernel", err);
  else if (wait && (err = hoop__cuda_drv.stream_synchronize(set->stream)) != CUDA_SUCCESS)
    result = hoop__cuda_driver_error(comm, "cuStreamSynchronize", err);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return result;
}

/* Run a kernel over count elements in ptr's context on hoop's stream there, and wait for it if
 * wait: op >= 0 the reduction of dtype and op, -1 the division, -2 - op the many-source reduction
 * of op, TREE - op the many sources over the fixed tree. */
#define TREE (-2 - HOOP_OP_COUNT)
static hoop_result launch(hoop_comm *comm, const void *ptr, int dtype, int op, size_t count,
                          void **params, int wait) {
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, ptr, &set, 1);
  if (result != HOOP_OK)
    return result;
  CUfunction f = op >= 0     ? set->reduce[dtype][op]
                 : op == -1  ? set->divide[dtype]
                 : op > TREE ? set->many[dtype][-2 - op]
                             : set->tree[dtype][TREE - op];
  /* A thread a 16-byte vector. */
  return fire(comm, set, f, count / (16 / hoop_dtype_size((hoop_dtype)dtype)), params, wait);
}

/* dst = a op b on hoop's stream; done on return if wait. */
static hoop_result reduce3(hoop_comm *comm, void *dst, const void *a, const void *b, size_t count,
                           hoop_dtype dtype, hoop_op op, int wait) {
  if (count == 0)
    return HOOP_OK;
  if (hoop__op_refused(dtype, op))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: bad dtype or op");
  void *params[] = {&dst, &a, &b, &count};
  return launch(comm, dst, dtype, op, count, params, wait);
}

hoop_result hoop__cuda_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op) {
  return reduce3(comm, dst, a, b, count, dtype, op, 1);
}

hoop_result hoop__cuda_reduce3_async(hoop_comm *comm, void *dst, const void *a, const void *b,
                                     size_t count, hoop_dtype dtype, hoop_op op) {
  return reduce3(comm, dst, a, b, count, dtype, op, 0);
}

hoop_result hoop__cuda_reduce_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                     hoop_op op, int nranks) {
  if (op != HOOP_AVG || count == 0 || nranks < 1)
    return HOOP_OK;
  if ((unsigned)dtype >= HOOP_DTYPE_COUNT)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: bad dtype");
  void *params[] = {&buf, &count, &nranks};
  return launch(comm, buf, dtype, -1, count, params, 1);
}

hoop_result hoop__cuda_finish_async(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                    hoop_op op, int nranks) {
  if (op != HOOP_AVG || count == 0 || nranks < 1)
    return HOOP_OK;
  if ((unsigned)dtype >= HOOP_DTYPE_COUNT)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: bad dtype");
  void *params[] = {&buf, &count, &nranks};
  return launch(comm, buf, dtype, -1, count, params, 0);
}

/* The parameter the many-source kernels take by value (kernels.cu's many_sources). */
typedef struct many_sources {
  const void *src[HOOP__CUDA_MANY_MAX];
  int n;
} many_sources;
/* kernels.cu's parameter is .align 8, 72 bytes: 8 pointers, the count, padding. */
_Static_assert(sizeof(many_sources) == 72 && offsetof(many_sources, n) == 64,
               "many_sources must match lib/mem/cuda/kernels.cu");

/* The many-source kernels' launch: tree, over the fixed tree rather than left to right. */
static hoop_result launch_many(hoop_comm *comm, void *dst, const void *const *srcs, int nsrcs,
                               size_t count, hoop_dtype dtype, hoop_op op, int divide, int tree) {
  if (count == 0)
    return HOOP_OK;
  if (hoop__op_refused(dtype, op) || nsrcs < 1 || nsrcs > HOOP__CUDA_MANY_MAX)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: bad dtype, op or source count");
  many_sources sources = {.n = nsrcs};
  for (int j = 0; j < nsrcs; j++)
    sources.src[j] = srcs[j];
  void *params[] = {&dst, &sources, &count, &divide};
  return launch(comm, dst, dtype, tree ? TREE - (int)op : -2 - (int)op, count, params, 0);
}

hoop_result hoop__cuda_reduce_many_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide) {
  return launch_many(comm, dst, srcs, nsrcs, count, dtype, op, divide, 0);
}

hoop_result hoop__cuda_reduce_tree_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide) {
  return launch_many(comm, dst, srcs, nsrcs, count, dtype, op, divide, 1);
}

/* ---- the codec ------------------------------------------------------------------------------ */

/* kernels.cu's codec kernels' parameters, one list for all of them. */
typedef struct codec_args {
  void *piece, *data;
  float *residual;
  size_t count;
  int format, stochastic;
  uint32_t seed, first;
} codec_args;

enum {
  CODEC_TOP,
  CODEC_ENCODE,
  CODEC_SCALE,
  CODEC_DECODE,
  CODEC_DECODE_ADD,
  CODEC_WIDEN,
  CODEC_NARROW
};

/* One codec kernel over units threads (the piece's elements, or its blocks), queued on hoop's
 * stream in the context of the piece. */
static hoop_result launch_codec(hoop_comm *comm, int which, int k, size_t units, codec_args *a) {
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, a->piece, &set, 1);
  if (result != HOOP_OK)
    return result;
  CUfunction f = which == CODEC_TOP      ? set->codec_top[k]
                 : which == CODEC_ENCODE ? set->codec_encode[k]
                 : which == CODEC_SCALE  ? set->codec_scale
                 : which == CODEC_DECODE ? set->codec_decode[k]
                 : which == CODEC_WIDEN  ? set->codec_widen[k]
                 : which == CODEC_NARROW ? set->codec_narrow[k]
                                         : set->codec_decode_add;
  void *params[] = {&a->piece,  &a->data,       &a->residual, &a->count,
                    &a->format, &a->stochastic, &a->seed,     &a->first};
  return fire(comm, set, f, units, params, 0);
}

/* The index of dtype among the codec's, or -1 (recorded) for another, or for a bad format. */
static int codec_kind(hoop_comm *comm, int format, hoop_dtype dtype) {
  int f = format & 0xff;
  for (int k = 0; k < 3; k++)
    if (codec_dtypes[k] == dtype && f >= HOOP_COMPRESS_BF16 && f <= HOOP_COMPRESS_INT8)
      return k;
  hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: no codec kernel for format %#x and %s",
                  (unsigned)format, hoop_dtype_name(dtype) ? hoop_dtype_name(dtype) : "this dtype");
  return -1;
}

hoop_result hoop__cuda_compress_async(hoop_comm *comm, int format, void *piece, const void *in,
                                      hoop_dtype dtype, size_t count, float *residual,
                                      uint64_t seed, uint64_t first) {
  int k = codec_kind(comm, format, dtype);
  if (k < 0)
    return HOOP_ERR_INVALID_ARG;
  if (count == 0)
    return HOOP_OK;
  /* compress.c's draws: stochastic where the seed is not 0, from its two halves mixed. */
  codec_args a = {piece,     (void *)(uintptr_t)in,           residual,       count, format & 0xff,
                  seed != 0, (uint32_t)(seed ^ (seed >> 32)), (uint32_t)first};
  size_t blocks = (count + HOOP_COMPRESS_BLOCK - 1) / HOOP_COMPRESS_BLOCK;
  int scaled = a.format != HOOP_COMPRESS_BF16;
  /* The largest magnitudes a warp a block. */
  hoop_result result =
      scaled ? launch_codec(comm, CODEC_TOP, k, blocks * HOOP__CODEC_WARP, &a) : HOOP_OK;
  if (result == HOOP_OK)
    result = launch_codec(comm, CODEC_ENCODE, k, count, &a);
  if (result == HOOP_OK && scaled)
    result = launch_codec(comm, CODEC_SCALE, k, blocks, &a);
  return result;
}

/* A codec kernel a thread an element of count, over a piece and its data (their float dtype's
 * kernel; a widen's or narrow's piece is count floats and its format any valid one). */
static hoop_result codec_each(hoop_comm *comm, int which, int format, hoop_dtype dtype,
                              const void *piece, const void *data, size_t count) {
  int k = codec_kind(comm, format, dtype);
  if (k < 0)
    return HOOP_ERR_INVALID_ARG;
  if (count == 0)
    return HOOP_OK;
  codec_args a = {
      (void *)(uintptr_t)piece, (void *)(uintptr_t)data, NULL, count, format & 0xff, 0, 0, 0};
  return launch_codec(comm, which, k, count, &a);
}

hoop_result hoop__cuda_expand_add_async(hoop_comm *comm, int format, float *acc, const void *piece,
                                        size_t count) {
  return codec_each(comm, CODEC_DECODE_ADD, format, HOOP_FLOAT32, piece, acc, count);
}

hoop_result hoop__cuda_expand_async(hoop_comm *comm, int format, void *out, hoop_dtype dtype,
                                    const void *piece, size_t count) {
  return codec_each(comm, CODEC_DECODE, format, dtype, piece, out, count);
}

hoop_result hoop__cuda_widen_async(hoop_comm *comm, float *out, const void *in, hoop_dtype dtype,
                                   size_t count) {
  return codec_each(comm, CODEC_WIDEN, HOOP_COMPRESS_BF16, dtype, out, in, count);
}

hoop_result hoop__cuda_narrow_async(hoop_comm *comm, void *out, hoop_dtype dtype, const float *in,
                                    size_t count) {
  return codec_each(comm, CODEC_NARROW, HOOP_COMPRESS_BF16, dtype, in, out, count);
}

hoop_result hoop__cuda_copy_async(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return HOOP_OK;
  if (!hoop__cuda_drv.memcpy_async)
    return hoop__cuda_copy(comm, dst, src, bytes);
  /* In the context of the device side (a compressed call's pieces go to and from host memory). */
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, hoop__cuda_context_of(dst) ? dst : src, &set, 0);
  if (result != HOOP_OK)
    return result;
  CUresult err = hoop__cuda_drv.memcpy_async((CUdeviceptr)(uintptr_t)dst,
                                             (CUdeviceptr)(uintptr_t)src, bytes, set->stream);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, "cuMemcpyAsync", err);
}

hoop_result hoop__cuda_ready(hoop_comm *comm, const void *near, int kernels) {
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, near, &set, kernels);
  if (result == HOOP_OK) {
    CUcontext popped;
    hoop__cuda_drv.ctx_pop(&popped);
  }
  return result;
}

hoop_result hoop__cuda_sync(hoop_comm *comm, const void *near) {
  return hoop__cuda_sync_busy(comm, near, NULL);
}

hoop_result hoop__cuda_sync_busy(hoop_comm *comm, const void *near,
                                 hoop_result (*meanwhile)(hoop_comm *comm)) {
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, near, &set, 0);
  if (result != HOOP_OK)
    return result;
  CUresult err = CUDA_ERROR_NOT_READY;
  while (meanwhile && hoop__cuda_drv.stream_query &&
         (err = hoop__cuda_drv.stream_query(set->stream)) == CUDA_ERROR_NOT_READY &&
         (result = meanwhile(comm)) == HOOP_OK)
    ;
  /* Leaving on the other's failure, or without the query, still waits: nothing of the call may
   * run on the GPU once it returns. */
  if (err != CUDA_SUCCESS)
    err = hoop__cuda_drv.stream_synchronize(set->stream);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  if (result != HOOP_OK)
    return result;
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, "cuStreamSynchronize", err);
}

void *hoop__cuda_alloc(size_t bytes, const void *near) {
  CUcontext context = NULL;
  CUdeviceptr ptr = 0;
  if (!hoop__cuda_drv.mem_alloc || !hoop__cuda_drv.mem_free ||
      hoop__cuda_kind_and_context(near, &context) != HOOP__MEM_DEVICE || !context ||
      hoop__cuda_drv.ctx_push(context) != CUDA_SUCCESS)
    return NULL;
  CUresult err = hoop__cuda_drv.mem_alloc(&ptr, bytes ? bytes : 1);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? (void *)(uintptr_t)ptr : NULL;
}

void hoop__cuda_free(void *ptr) {
  CUcontext context = NULL;
  if (!ptr || hoop__cuda_kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context ||
      hoop__cuda_drv.ctx_push(context) != CUDA_SUCCESS)
    return;
  hoop__cuda_drv.mem_free((CUdeviceptr)(uintptr_t)ptr);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
}

#endif /* HOOP_HAVE_CUDA */
