/* cuda-kernel-bw.c - the GPU reduction kernels' bandwidth against the device's own copy bandwidth,
 * measured in one run (issue 21's goal: sum at 64 MiB and up reaches 80% of the copy's).
 *
 * A copy moves each byte twice (one read, one write); the kernel dst = a + b three times (two
 * reads, one write): each bandwidth counts the bytes it moves. Kernels are queued back to back on
 * hoop's stream and waited for once, as the CUDA IPC allreduce queues them; copies likewise on
 * the context's default stream. Runs on the driver hoop loads (HOOP_CUDA_LIBRARY): on a GPU; on
 * the stand-in driver of the tests it runs too, but its figures mean nothing.
 *
 * Usage: cuda-kernel-bw [-n ITERS] [SIZE...]   (sizes in bytes, K/M/G suffixes; default 64M 256M
 *        1G); prints one row per size and dtype: copy GB/s, kernel GB/s, ratio; a row for the
 *        many-source kernel of the CUDA IPC allreduce on 4 float32 inputs (five buffers' bytes);
 *        and rows for the codec of compressed reductions on SIZE bytes of float32 (issue 54's goal:
 *        80% of the copy's bandwidth): each format's encode (to nearest, stochastic, with error
 *        feedback), decode-add and decode, in the bytes each moves (an encode reads its input
 *        twice, once for the blocks' largest magnitudes; feedback reads the residual twice and
 *        writes it) and in GB/s of float32 input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "devmem.h"
#include "mem/compress.h"
#include "mem/cuda.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char *text) {
  char *end;
  double value = strtod(text, &end);
  switch (*end) {
  case 'G':
  case 'g': value *= 1024; /* fall through */
  case 'M':
  case 'm': value *= 1024; /* fall through */
  case 'K':
  case 'k': value *= 1024; break;
  default: break;
  }
  return (size_t)value;
}

/* The codec's rows on count float32 elements at in (its piece, residual, decoded values and sums
 * in the other buffers); 0, or 1 with the error printed. */
static int codec_rows(hoop_comm *comm, size_t count, void *in, void *piece, float *residual,
                      float *acc, int iters, double copy_bw) {
  static const int formats[] = {HOOP_COMPRESS_BF16, HOOP_COMPRESS_FP8, HOOP_COMPRESS_INT8};
  static const char *const names[] = {"bf16", "fp8", "int8"};
  enum { ENCODE, STOCHASTIC, FEEDBACK, DECODE_ADD, DECODE, STEPS };
  static const char *const steps[] = {"encode", "stoch", "feedback", "dec-add", "decode"};
  double in_bytes = 4.0 * (double)count;
  for (int f = 0; f < 3; f++) {
    double piece_bytes = (double)hoop__compress_bytes(formats[f], count);
    for (int step = 0; step < STEPS; step++) {
      int format = formats[f] | (step == STOCHASTIC ? HOOP_COMPRESS_STOCHASTIC : 0);
      hoop_result result = HOOP_OK;
      double start = 0;
      for (int i = -1; i < iters && result == HOOP_OK; i++) {
        if (i == 0) {
          result = hoop__cuda_sync(comm, piece);
          start = now_s();
        }
        uint64_t seed = step == STOCHASTIC ? (uint64_t)i * 2 + 3 : 0;
        if (result != HOOP_OK)
          break;
        if (step <= FEEDBACK)
          result = hoop__cuda_compress_async(comm, format, piece, in, HOOP_FLOAT32, count,
                                             step == FEEDBACK ? residual : NULL, seed, 0);
        else if (step == DECODE_ADD)
          result = hoop__cuda_expand_add_async(comm, format, acc, piece, count);
        else
          result = hoop__cuda_expand_async(comm, format, acc, HOOP_FLOAT32, piece, count);
      }
      if (result == HOOP_OK)
        result = hoop__cuda_sync(comm, piece);
      if (result != HOOP_OK) {
        printf("cuda-kernel-bw: %s\n", hoop_last_error(comm));
        return 1;
      }
      double took = now_s() - start;
      double moved = step == FEEDBACK     ? 2 * in_bytes + piece_bytes + 3 * in_bytes
                     : step <= FEEDBACK   ? 2 * in_bytes + piece_bytes
                     : step == DECODE_ADD ? piece_bytes + 2 * in_bytes
                                          : piece_bytes + in_bytes;
      double bw = moved * iters / took / 1e9;
      char label[24];
      snprintf(label, sizeof label, "%s %s", names[f], steps[step]);
      printf("  %12.0f %13s %10.1f %11.1f %7.2f   %.1f GB/s of float32\n", in_bytes, label, copy_bw,
             bw, bw / copy_bw, in_bytes * iters / took / 1e9);
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  int iters = 20, first = 1;
  if (argc > 2 && strcmp(argv[1], "-n") == 0) {
    iters = atoi(argv[2]);
    first = 3;
  }
  size_t sizes[16];
  int nsizes = 0;
  for (int i = first; i < argc && nsizes < 16; i++)
    sizes[nsizes++] = parse_size(argv[i]);
  if (nsizes == 0) {
    sizes[0] = (size_t)64 << 20, sizes[1] = (size_t)256 << 20, sizes[2] = (size_t)1 << 30;
    nsizes = 3;
  }
  char why[256];
  if (!hoop__cuda_kernels_built()) {
    printf("cuda-kernel-bw: this libhoop has no GPU kernels (configure found no nvcc)\n");
    return 77;
  }
  if (devmem_init(why, sizeof why) != 0) {
    printf("cuda-kernel-bw: no GPU: %s\n", why);
    return 77;
  }
  hoop_comm *comm = calloc(1, sizeof *comm);
  static const hoop_dtype dtypes[] = {HOOP_FLOAT32, HOOP_BFLOAT16, HOOP_FLOAT64, HOOP_INT32};
  printf("# %12s %13s %10s %11s %7s\n", "bytes", "kernel", "copy GB/s", "GB/s", "ratio");
  int status = 0;
  for (int s = 0; s < nsizes; s++) {
    size_t bytes = sizes[s];
    void *a = devmem_put(NULL, bytes), *b = devmem_put(NULL, bytes), *dst = devmem_put(NULL, bytes);
    /* The copy, warmed up once. */
    devmem_copy(dst, a, bytes);
    devmem_sync();
    double start = now_s();
    for (int i = 0; i < iters; i++)
      devmem_copy(dst, a, bytes);
    devmem_sync();
    double copy_bw = 2.0 * (double)bytes * iters / (now_s() - start) / 1e9;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
      size_t count = bytes / hoop_dtype_size(dtypes[d]);
      hoop_result result = hoop__cuda_reduce3_async(comm, dst, a, b, count, dtypes[d], HOOP_SUM);
      if (result == HOOP_OK)
        result = hoop__cuda_sync(comm, dst);
      start = now_s();
      for (int i = 0; i < iters && result == HOOP_OK; i++)
        result = hoop__cuda_reduce3_async(comm, dst, a, b, count, dtypes[d], HOOP_SUM);
      if (result == HOOP_OK)
        result = hoop__cuda_sync(comm, dst);
      if (result != HOOP_OK) {
        printf("cuda-kernel-bw: %s\n", hoop_last_error(comm));
        status = 1;
        break;
      }
      double sum_bw = 3.0 * (double)bytes * iters / (now_s() - start) / 1e9;
      printf("  %12zu %13s %10.1f %11.1f %7.2f\n", bytes, hoop_dtype_name(dtypes[d]), copy_bw,
             sum_bw, sum_bw / copy_bw);
    }
    /* The many-source kernel on 4 inputs: a, b, dst and c, in place over dst as the IPC
     * allreduce's rank 2 would. */
    void *c = devmem_put(NULL, bytes);
    const void *srcs[4] = {a, b, dst, c};
    size_t count = bytes / 4;
    hoop_result result =
        hoop__cuda_reduce_many_async(comm, dst, srcs, 4, count, HOOP_FLOAT32, HOOP_SUM, 0);
    if (result == HOOP_OK)
      result = hoop__cuda_sync(comm, dst);
    start = now_s();
    for (int i = 0; i < iters && result == HOOP_OK; i++)
      result = hoop__cuda_reduce_many_async(comm, dst, srcs, 4, count, HOOP_FLOAT32, HOOP_SUM, 0);
    if (result == HOOP_OK)
      result = hoop__cuda_sync(comm, dst);
    double many_bw = 5.0 * (double)bytes * iters / (now_s() - start) / 1e9;
    if (result == HOOP_OK) {
      printf("  %12zu %13s %10.1f %11.1f %7.2f\n", bytes, "f32 x4", copy_bw, many_bw,
             many_bw / copy_bw);
    } else {
      printf("cuda-kernel-bw: %s\n", hoop_last_error(comm));
      status = 1;
    }
    /* The codec on float32 values over many magnitudes: its piece in b, residual in c (zeros),
     * decoded into dst. */
    float *values = malloc(bytes);
    void *x = NULL, *zeros = calloc(1, bytes);
    if (values && zeros) {
      for (size_t i = 0; i < bytes / 4; i++)
        values[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * (1.0f / (float)(1 + i % 97));
      x = devmem_put(values, bytes);
      devmem_free(c);
      c = devmem_put(zeros, bytes);
    }
    devmem_sync();
    if (status == 0 && x)
      status = codec_rows(comm, bytes / 4, x, b, c, dst, iters, copy_bw);
    if (x)
      devmem_free(x);
    free(values);
    free(zeros);
    devmem_free(c);
    devmem_free(a);
    devmem_free(b);
    devmem_free(dst);
  }
  free(comm);
  return status;
}
