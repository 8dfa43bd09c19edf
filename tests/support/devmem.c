/* devmem.c - see devmem.h. Any driver failure ends the test program (exit 2). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"

typedef int (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);
static int (*cu_init)(unsigned int);
static int (*cu_device_get)(int *, int);
static int (*cu_primary_retain)(void **, int);
static int (*cu_ctx_set_current)(void *);
static int (*cu_mem_alloc)(unsigned long long *, size_t);
static int (*cu_mem_free)(unsigned long long);
static int (*cu_htod)(unsigned long long, const void *, size_t);
static int (*cu_stream_create)(void **, unsigned int);
static int (*cu_dtod)(unsigned long long, unsigned long long, size_t);
static int (*cu_htod_async)(unsigned long long, const void *, size_t, void *);
static int (*cu_memcpy_async)(unsigned long long, unsigned long long, size_t, void *);
static int (*cu_stream_synchronize)(void *);
static void *reader; /* devmem_get's stream */
static int (*cu_ctx_synchronize)(void);

/* DEVMEM_VMM=1: buffers from the virtual memory management API instead of cuMemAlloc (as
 * PyTorch's expandable segments make them), exportable as file descriptors: a physical allocation
 * of whole granules (cuMemCreate) mapped into reserved address space. DEVMEM_VMM=noexport: the
 * same, not exportable; DEVMEM_VMM=split: a buffer is one physical allocation per granule, mapped
 * one after the other, as an expandable segment grows. The driver's structures as
 * cuda.h lays them out, without the header. */
typedef struct {
  int type, id;
} mem_location;
typedef struct {
  int type;                   /* CU_MEM_ALLOCATION_TYPE_PINNED: 1 */
  int requested_handle_types; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: 1 */
  mem_location location;      /* CU_MEM_LOCATION_TYPE_DEVICE: 1, device 0 */
  void *win32_metadata;
  unsigned char compression, gpu_direct_rdma;
  unsigned short usage;
  unsigned char reserved[4];
} mem_prop;
typedef struct {
  mem_location location;
  int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE: 3 */
} mem_access;
static int vmm;
static size_t granule;
static int (*cu_granularity)(size_t *, const mem_prop *, int);
static int (*cu_create)(unsigned long long *, size_t, const mem_prop *, unsigned long long);
static int (*cu_release)(unsigned long long);
static int (*cu_reserve)(unsigned long long *, size_t, size_t, unsigned long long,
                         unsigned long long);
static int (*cu_address_free)(unsigned long long, size_t);
static int (*cu_map)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
static int (*cu_unmap)(unsigned long long, size_t);
static int (*cu_set_access)(unsigned long long, size_t, const mem_access *, size_t);
/* The VMM buffers handed out, to undo them in devmem_free. */
#define MAX_VMM 4096
static struct {
  unsigned long long ptr;
  size_t span, piece; /* piece: each physical allocation's bytes (span unless split) */
} vmm_bufs[MAX_VMM];

static void must(int err, const char *what);

/* Map a new physical allocation of bytes at dev. */
static void vmm_piece(unsigned long long dev, size_t bytes) {
  mem_prop prop = {1, vmm == 2 ? 0 : 1, {1, 0}, NULL, 0, 0, 0, {0}};
  mem_access access = {{1, 0}, 3};
  unsigned long long handle = 0;
  must(cu_create(&handle, bytes, &prop, 0), "cuMemCreate");
  must(cu_map(dev, bytes, 0, handle, 0), "cuMemMap");
  must(cu_set_access(dev, bytes, &access, 1), "cuMemSetAccess");
  must(cu_release(handle), "cuMemRelease"); /* the mapping holds it */
}

static void must(int err, const char *what) {
  if (err != 0) {
    fprintf(stderr, "devmem: %s failed: CUresult %d\n", what, err);
    exit(2);
  }
}

typedef struct entry_point {
  const char *name;
  void **fn;
} entry_point;

/* Resolve n entry points: 0, or -1 with which one is missing in msg (after note). */
static int resolve_all(get_proc_fn get_proc, const entry_point *want, size_t n, const char *path,
                       const char *note, char *msg, size_t msglen) {
  for (size_t i = 0; i < n; i++) {
    int status = 0;
    if (get_proc(want[i].name, want[i].fn, 12000, 0, &status) != 0 || !*want[i].fn) {
      snprintf(msg, msglen, "%s: no %s%s", path, want[i].name, note);
      return -1;
    }
  }
  return 0;
}

/* The context devmem_init made current, for other threads (devmem_attach). */
static void *primary_ctx;

void devmem_attach(void) {
  if (primary_ctx && cu_ctx_set_current(primary_ctx) != 0) {
    fprintf(stderr, "devmem: cuCtxSetCurrent failed in a thread\n");
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
  entry_point want[] = {{"cuInit", (void **)&cu_init},
                        {"cuDeviceGet", (void **)&cu_device_get},
                        {"cuDevicePrimaryCtxRetain", (void **)&cu_primary_retain},
                        {"cuCtxSetCurrent", (void **)&cu_ctx_set_current},
                        {"cuMemAlloc", (void **)&cu_mem_alloc},
                        {"cuMemFree", (void **)&cu_mem_free},
                        {"cuMemcpyHtoD", (void **)&cu_htod},
                        {"cuStreamCreate", (void **)&cu_stream_create},
                        {"cuMemcpyDtoD", (void **)&cu_dtod},
                        {"cuMemcpyHtoDAsync", (void **)&cu_htod_async},
                        {"cuMemcpyAsync", (void **)&cu_memcpy_async},
                        {"cuStreamSynchronize", (void **)&cu_stream_synchronize},
                        {"cuCtxSynchronize", (void **)&cu_ctx_synchronize}};
  if (resolve_all(get_proc, want, sizeof want / sizeof want[0], path, "", msg, msglen) != 0)
    return -1;
  const char *want_vmm = getenv("DEVMEM_VMM");
  vmm = !want_vmm || !*want_vmm || strcmp(want_vmm, "0") == 0 ? 0
        : strcmp(want_vmm, "noexport") == 0                   ? 2
        : strcmp(want_vmm, "split") == 0                      ? 3
                                                              : 1;
  entry_point want_vmm_calls[] = {{"cuMemGetAllocationGranularity", (void **)&cu_granularity},
                                  {"cuMemCreate", (void **)&cu_create},
                                  {"cuMemRelease", (void **)&cu_release},
                                  {"cuMemAddressReserve", (void **)&cu_reserve},
                                  {"cuMemAddressFree", (void **)&cu_address_free},
                                  {"cuMemMap", (void **)&cu_map},
                                  {"cuMemUnmap", (void **)&cu_unmap},
                                  {"cuMemSetAccess", (void **)&cu_set_access}};
  if (vmm && resolve_all(get_proc, want_vmm_calls, sizeof want_vmm_calls / sizeof want_vmm_calls[0],
                         path, " (DEVMEM_VMM)", msg, msglen) != 0)
    return -1;
  int err = cu_init(0), device = 0;
  void *ctx = NULL;
  if (err != 0 || (err = cu_device_get(&device, 0)) != 0 ||
      (err = cu_primary_retain(&ctx, device)) != 0 || (err = cu_ctx_set_current(ctx)) != 0) {
    snprintf(msg, msglen, "%s: no usable GPU (CUresult %d)", path, err);
    return -1;
  }
  primary_ctx = ctx;
  mem_prop prop = {1, 1, {1, device}, NULL, 0, 0, 0, {0}};
  if (vmm && (err = cu_granularity(&granule, &prop, 0)) != 0) {
    snprintf(msg, msglen, "%s: cuMemGetAllocationGranularity: CUresult %d", path, err);
    return -1;
  }
  return 0;
}

/* bytes of device memory: cuMemAlloc's, or under DEVMEM_VMM=1 the virtual memory management
 * API's, the physical allocation released at once (its mapping holds it). */
static unsigned long long dev_alloc(size_t bytes) {
  unsigned long long dev = 0;
  if (!vmm) {
    must(cu_mem_alloc(&dev, bytes ? bytes : 1), "cuMemAlloc");
    return dev;
  }
  size_t span = (bytes + granule - (bytes ? 1 : 0)) / granule * granule;
  if (span == 0)
    span = granule;
  size_t piece = vmm == 3 ? granule : span;
  must(cu_reserve(&dev, span, 0, 0, 0), "cuMemAddressReserve");
  for (size_t at = 0; at < span; at += piece)
    vmm_piece(dev + at, piece);
  for (int i = 0; i < MAX_VMM; i++)
    if (!vmm_bufs[i].ptr) {
      vmm_bufs[i].ptr = dev;
      vmm_bufs[i].span = span;
      vmm_bufs[i].piece = piece;
      return dev;
    }
  fprintf(stderr, "devmem: more than %d VMM buffers at once\n", MAX_VMM);
  exit(2);
}

void *devmem_put(const void *host, size_t bytes) {
  unsigned long long dev = dev_alloc(bytes);
  if (host && bytes)
    must(cu_htod(dev, host, bytes), "cuMemcpyHtoD");
  return (void *)(uintptr_t)dev;
}

void *devmem_put_late(const void *host, size_t bytes, void *stream) {
  unsigned long long dev = dev_alloc(bytes);
  if (host && bytes)
    must(cu_htod_async(dev, host, bytes, stream), "cuMemcpyHtoDAsync");
  return (void *)(uintptr_t)dev;
}

void devmem_upload(void *dev, const void *host, size_t bytes) {
  if (bytes)
    must(cu_htod((unsigned long long)(uintptr_t)dev, host, bytes), "cuMemcpyHtoD");
}

void devmem_get(void *host, const void *dev, size_t bytes) {
  if (!bytes)
    return;
  if (!reader)
    must(cu_stream_create(&reader, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  must(cu_memcpy_async((unsigned long long)(uintptr_t)host, (unsigned long long)(uintptr_t)dev,
                       bytes, reader),
       "cuMemcpyAsync");
  must(cu_stream_synchronize(reader), "cuStreamSynchronize");
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
  unsigned long long ptr = (unsigned long long)(uintptr_t)dev;
  for (int i = 0; vmm && i < MAX_VMM; i++)
    if (vmm_bufs[i].ptr == ptr) {
      must(cu_ctx_synchronize(), "cuCtxSynchronize");
      for (size_t at = 0; at < vmm_bufs[i].span; at += vmm_bufs[i].piece)
        must(cu_unmap(ptr + at, vmm_bufs[i].piece), "cuMemUnmap");
      must(cu_address_free(ptr, vmm_bufs[i].span), "cuMemAddressFree");
      vmm_bufs[i].ptr = 0;
      return;
    }
  must(cu_mem_free(ptr), "cuMemFree");
}
