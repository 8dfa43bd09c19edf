/* cuda-share-probe - the driver's cost of the small copies a staged collective makes, for telling
 * hoop's own cost from the GPU's when ranks share one GPU (bench/TUNING.md, "On a GPU"). Run one,
 * then two at once, then two under MPS. Not built by make (it links the driver itself):
 *   gcc -O2 -I/usr/local/cuda/include bench/cuda-share-probe.c -o cuda-share-probe \
 *     -L/usr/local/cuda/lib64/stubs -lcuda
 *   ./cuda-share-probe 2000 alone; ./cuda-share-probe 2000 A & ./cuda-share-probe 2000 B; wait */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
#define C(x)                                                                                       \
  do {                                                                                             \
    CUresult e_ = (x);                                                                             \
    if (e_) {                                                                                      \
      printf("%s: %d\n", #x, (int)e_);                                                             \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  const char *tag = argc > 2 ? argv[2] : "";
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr d;
  void *h, *p;
  C(cuInit(0));
  C(cuDeviceGet(&dev, 0));
  C(cuDevicePrimaryCtxRetain(&ctx, dev));
  C(cuCtxSetCurrent(ctx));
  C(cuMemAlloc(&d, 1 << 20));
  C(cuMemAllocHost(&h, 1 << 20));
  p = malloc(1 << 20);
  size_t sizes[] = {8, 4096, 32768, 262144};
  for (int si = 0; si < 4; si++) {
    size_t n = sizes[si];
    double t0 = now();
    for (int i = 0; i < iters; i++)
      C(cuMemcpy((CUdeviceptr)h, d, n));
    double dtoh = (now() - t0) / iters * 1e6;
    t0 = now();
    for (int i = 0; i < iters; i++) {
      CUevent ev;
      C(cuMemcpy(d, (CUdeviceptr)h, n));
      C(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
      C(cuEventRecord(ev, NULL));
      C(cuEventSynchronize(ev));
      C(cuEventDestroy(ev));
    }
    double htod = (now() - t0) / iters * 1e6;
    t0 = now();
    for (int i = 0; i < iters; i++) {
      C(cuMemcpyHtoDAsync(d, h, n, NULL));
      C(cuStreamSynchronize(NULL));
    }
    double htod_async = (now() - t0) / iters * 1e6;
    t0 = now();
    for (int i = 0; i < iters; i++)
      C(cuMemcpy((CUdeviceptr)p, d, n));
    double dtoh_pageable = (now() - t0) / iters * 1e6;
    printf("%s %7zu B: DtoH %.1f us, HtoD+event %.1f us, HtoDAsync+sync %.1f us, DtoH pageable "
           "%.1f us\n",
           tag, n, dtoh, htod, htod_async, dtoh_pageable);
  }
  return 0;
}
