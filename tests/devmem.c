/* devmem.c - see devmem.h. Any driver failure ends the test program (exit 2). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "devmem.h"

typedef int (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);
static int (*cu_init)(unsigned int);
static int (*cu_device_get)(int *, int);
static int (*cu_primary_retain)(void **, int);
static int (*cu_ctx_set_current)(void *);
static int (*cu_mem_alloc)(unsigned long long *, size_t);
static int (*cu_mem_free)(unsigned long long);
static int (*cu_htod)(unsigned long long, const void *, size_t);
static int (*cu_dtoh)(void *, unsigned long long, size_t);
static int (*cu_stream_create)(void **, unsigned int);
static int (*cu_dtod)(unsigned long long, unsigned long long, size_t);
static int (*cu_htod_async)(unsigned long long, const void *, size_t, void *);
static int (*cu_ctx_synchronize)(void);

static void must(int err, const char *what) {
  if (err != 0) {
    fprintf(stderr, "devmem: %s failed: CUresult %d\n", what, err);
    exit(2);
  }
}

int devmem_init(char *msg, size_t msglen) {
  const char *path = getenv("HOOP_CUDA_LIBRARY");
  if (!path || !*path)
    path = "libcuda.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(msg, msglen, "no CUDA driver: %s", dlerror());
    return -1;
  }
  get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
  if (!get_proc) {
    snprintf(msg, msglen, "%s has no cuGetProcAddress_v2", path);
    return -1;
  }
  struct {
    const char *name;
    void **fn;
  } want[] = {{"cuInit", (void **)&cu_init},
              {"cuDeviceGet", (void **)&cu_device_get},
              {"cuDevicePrimaryCtxRetain", (void **)&cu_primary_retain},
              {"cuCtxSetCurrent", (void **)&cu_ctx_set_current},
              {"cuMemAlloc", (void **)&cu_mem_alloc},
              {"cuMemFree", (void **)&cu_mem_free},
              {"cuMemcpyHtoD", (void **)&cu_htod},
              {"cuMemcpyDtoH", (void **)&cu_dtoh},
              {"cuStreamCreate", (void **)&cu_stream_create},
              {"cuMemcpyDtoD", (void **)&cu_dtod},
              {"cuMemcpyHtoDAsync", (void **)&cu_htod_async},
              {"cuCtxSynchronize", (void **)&cu_ctx_synchronize}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int status = 0;
    if (get_proc(want[i].name, want[i].fn, 12000, 0, &status) != 0 || !*want[i].fn) {
      snprintf(msg, msglen, "%s: no %s", path, want[i].name);
      return -1;
    }
  }
  int err = cu_init(0), device = 0;
  void *ctx = NULL;
  if (err != 0 || (err = cu_device_get(&device, 0)) != 0 ||
      (err = cu_primary_retain(&ctx, device)) != 0 || (err = cu_ctx_set_current(ctx)) != 0) {
    snprintf(msg, msglen, "%s: no usable GPU (CUresult %d)", path, err);
    return -1;
  }
  return 0;
}

void *devmem_put(const void *host, size_t bytes) {
  unsigned long long dev = 0;
  must(cu_mem_alloc(&dev, bytes ? bytes : 1), "cuMemAlloc");
  if (host && bytes)
    must(cu_htod(dev, host, bytes), "cuMemcpyHtoD");
  return (void *)(uintptr_t)dev;
}

void *devmem_put_late(const void *host, size_t bytes, void *stream) {
  unsigned long long dev = 0;
  must(cu_mem_alloc(&dev, bytes ? bytes : 1), "cuMemAlloc");
  if (host && bytes)
    must(cu_htod_async(dev, host, bytes, stream), "cuMemcpyHtoDAsync");
  return (void *)(uintptr_t)dev;
}

void devmem_upload(void *dev, const void *host, size_t bytes) {
  if (bytes)
    must(cu_htod((unsigned long long)(uintptr_t)dev, host, bytes), "cuMemcpyHtoD");
}

void devmem_get(void *host, const void *dev, size_t bytes) {
  if (bytes)
    must(cu_dtoh(host, (unsigned long long)(uintptr_t)dev, bytes), "cuMemcpyDtoH");
}

void *devmem_stream(void) {
  void *stream = NULL;
  must(cu_stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  return stream;
}

void devmem_copy(void *dst, const void *src, size_t bytes) {
  if (bytes)
    must(cu_dtod((unsigned long long)(uintptr_t)dst, (unsigned long long)(uintptr_t)src, bytes),
         "cuMemcpyDtoD");
}

void devmem_sync(void) {
  must(cu_ctx_synchronize(), "cuCtxSynchronize");
}

void devmem_free(void *dev) {
  must(cu_mem_free((unsigned long long)(uintptr_t)dev), "cuMemFree");
}
