/* driver.c - the stand-in for the CUDA driver (see fakecuda.h): cuGetProcAddress_v2, the one
 * symbol hoop looks up, and the entry points it hands out from each file's table; initialisation,
 * the device and its contexts; GPUDirect RDMA's questions; error strings; the count file
 * (FAKECUDA_COUNT), written at exit. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
int initialized;
struct CUctx_st *const the_context = (struct CUctx_st *)0x1;
__thread int ctx_depth;
unsigned long long copies, copied_bytes, stream_syncs, pinned, kernels, ipc_opens, flushes,
    vmm_imports, async_copies, codecs;

static CUresult fake_init(unsigned int flags) {
  (void)flags;
  initialized = 1;
  return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *device, int ordinal) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_retain(CUcontext *ctx, CUdevice device) {
  (void)device;
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  *ctx = the_context;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_set_current(CUcontext ctx) {
  ctx_depth = ctx ? (ctx_depth ? ctx_depth : 1) : 0;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_push(CUcontext ctx) {
  if (ctx != the_context)
    return CUDA_ERROR_INVALID_CONTEXT;
  ctx_depth++;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_pop(CUcontext *ctx) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  ctx_depth--;
  if (ctx)
    *ctx = the_context;
  return CUDA_SUCCESS;
}

/* GPUDirect RDMA's questions: the device says it exports dma-buf unless FAKECUDA_DMABUF=0, and the
 * export is an fd of the range's size (no RDMA device here can take it: soft-RoCE's rxe answers
 * EOPNOTSUPP, which is what hoop must then handle). */
static CUresult fake_device_get_attribute(int *value, CUdevice_attribute attr, CUdevice device) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (device != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  const char *dmabuf = getenv("FAKECUDA_DMABUF"), *ordering = getenv("FAKECUDA_GDR_ORDERING"),
             *flush = getenv("FAKECUDA_GDR_FLUSH");
  if (attr == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
    *value = !(dmabuf && strcmp(dmabuf, "0") == 0);
  else if (attr == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING)
    *value = ordering ? atoi(ordering) : CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
  else if (attr == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)
    *value = flush && strcmp(flush, "0") == 0 ? 0 : CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
  else
    *value = 0;
  return CUDA_SUCCESS;
}

static CUresult fake_get_handle_for_range(void *handle, CUdeviceptr ptr, size_t bytes,
                                          CUmemRangeHandleType type, unsigned long long flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  /* The range in whole pages of one allocation (its last page counts whole, as a GPU's would). */
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  int inside =
      a && (size_t)((char *)(uintptr_t)ptr - a->base) + bytes <= (a->bytes + 4095) / 4096 * 4096;
  pthread_mutex_unlock(&lock);
  if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || !inside || (ptr & 4095) || (bytes & 4095))
    return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("fakecuda-dmabuf", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *(int *)handle = fd;
  return CUDA_SUCCESS;
}

static CUresult fake_flush_rdma_writes(CUflushGPUDirectRDMAWritesTarget target,
                                       CUflushGPUDirectRDMAWritesScope scope) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (target != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
      (scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER &&
       scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  flushes++;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static CUresult fake_get_error_string(CUresult err, const char **text) {
  switch (err) {
  case CUDA_SUCCESS: *text = "no error"; break;
  case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
  case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
  case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
  case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported"; break;
  case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
  default: *text = "unknown error"; break;
  }
  return CUDA_SUCCESS;
}

static const fakecuda_entry driver_entries[] = {
    {"cuInit", (void *)fake_init},
    {"cuDeviceGet", (void *)fake_device_get},
    {"cuDevicePrimaryCtxRetain", (void *)fake_primary_ctx_retain},
    {"cuCtxSetCurrent", (void *)fake_ctx_set_current},
    {"cuCtxPushCurrent", (void *)fake_ctx_push},
    {"cuCtxPopCurrent", (void *)fake_ctx_pop},
    {"cuGetErrorString", (void *)fake_get_error_string},
    {"cuDeviceGetAttribute", (void *)fake_device_get_attribute},
    {"cuMemGetHandleForAddressRange", (void *)fake_get_handle_for_range},
    {"cuFlushGPUDirectRDMAWrites", (void *)fake_flush_rdma_writes},
    {NULL, NULL},
};

/* Every entry point the stand-in answers, by file. */
static const fakecuda_entry *const tables[] = {
    driver_entries,          fakecuda_memory_entries, fakecuda_stream_entries,
    fakecuda_kernel_entries, fakecuda_ipc_entries,    fakecuda_vmm_entries,
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)version;
  (void)flags;
  const char *kernels_env = getenv("FAKECUDA_KERNELS");
  int no_kernels = kernels_env && strcmp(kernels_env, "0") == 0;
  for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
    for (const fakecuda_entry *e = tables[t]; e->name; e++)
      if (strcmp(symbol, e->name) == 0 &&
          !(no_kernels &&
            (strncmp(symbol, "cuModule", 8) == 0 || strcmp(symbol, "cuLaunchKernel") == 0))) {
        *pfn = e->fn;
        if (status)
          *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
      }
  *pfn = NULL;
  if (status)
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

__attribute__((destructor)) static void report(void) {
  const char *path = getenv("FAKECUDA_COUNT");
  FILE *f = path && (copies || kernels) ? fopen(path, "a") : NULL;
  if (f) {
    fprintf(f,
            "copies %llu bytes %llu stream_syncs %llu pinned %llu async %llu kernels %llu "
            "ipc_opens %llu flushes %llu vmm_imports %llu codecs %llu\n",
            copies, copied_bytes, stream_syncs, pinned, async_copies, kernels, ipc_opens, flushes,
            vmm_imports, codecs);
    fclose(f);
  }
}
