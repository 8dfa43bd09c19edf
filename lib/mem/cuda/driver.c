/* driver.c - the CUDA driver, loaded at run time: its entry points, and the kind and context of
 * a pointer (see cuda.h and driver.h).
 *
 * Entry points are resolved through cuGetProcAddress_v2 for the driver API version hoop was
 * written against, so that a newer driver gives the behaviour this code expects.
 */
#include "config.h"

#include "hoop.h"
#include "mem/cuda.h"

int hoop_cuda_supported(void) {
  return hoop__cuda_loaded();
}

#ifdef HOOP_HAVE_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "core/env.h"
#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda/driver.h"

/* The driver API version the entry points are asked for (CUDA 12.0's ABI of each call). */
#define HOOP_CUDA_API_VERSION 12000

struct hoop__cuda_driver hoop__cuda_drv;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static int resolve(get_proc_fn get_proc, const char *name, void **fn) {
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (get_proc(name, fn, HOOP_CUDA_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=
          CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS || !*fn) {
    HOOP__INFO(HOOP_SUBSYS_INIT, "cuda: the driver has no %s; device buffers are not supported",
               name);
    return -1;
  }
  return 0;
}

static void load(void) {
  const char *path = hoop__env_get("HOOP_CUDA_LIBRARY");
  if (!path[0])
    return; /* HOOP_CUDA_LIBRARY="" turns the detection off */
  hoop__cuda_drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!hoop__cuda_drv.lib) {
    HOOP__TRACE(HOOP_SUBSYS_INIT, "cuda: no driver (%s): every buffer is host memory", dlerror());
    return;
  }
  get_proc_fn get_proc = (get_proc_fn)dlsym(hoop__cuda_drv.lib, "cuGetProcAddress_v2");
  if (!get_proc) {
    HOOP__INFO(HOOP_SUBSYS_INIT,
               "cuda: %s has no cuGetProcAddress_v2 (a driver older than CUDA "
               "12); device buffers are not supported",
               path);
    return;
  }
  if (resolve(get_proc, "cuPointerGetAttributes",
              (void **)&hoop__cuda_drv.pointer_get_attributes) ||
      resolve(get_proc, "cuCtxPushCurrent", (void **)&hoop__cuda_drv.ctx_push) ||
      resolve(get_proc, "cuCtxPopCurrent", (void **)&hoop__cuda_drv.ctx_pop) ||
      resolve(get_proc, "cuMemcpy", (void **)&hoop__cuda_drv.memcpy) ||
      resolve(get_proc, "cuGetErrorString", (void **)&hoop__cuda_drv.get_error_string))
    return;
  /* Optional: without them, device buffers work and only the GPU kernels are missing. */
  CUdriverProcAddressQueryResult status;
  get_proc("cuModuleLoadData", (void **)&hoop__cuda_drv.module_load_data, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuModuleGetFunction", (void **)&hoop__cuda_drv.module_get_function,
           HOOP_CUDA_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuLaunchKernel", (void **)&hoop__cuda_drv.launch_kernel, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuStreamCreate", (void **)&hoop__cuda_drv.stream_create, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuStreamSynchronize", (void **)&hoop__cuda_drv.stream_synchronize,
           HOOP_CUDA_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuStreamGetCtx", (void **)&hoop__cuda_drv.stream_get_ctx, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuMemHostAlloc", (void **)&hoop__cuda_drv.mem_host_alloc, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuMemFreeHost", (void **)&hoop__cuda_drv.mem_free_host, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  const struct {
    const char *name;
    void **fn;
  } pipe_calls[] = {
      {"cuMemcpyAsync", (void **)&hoop__cuda_drv.memcpy_async},
      {"cuEventCreate", (void **)&hoop__cuda_drv.event_create},
      {"cuEventDestroy", (void **)&hoop__cuda_drv.event_destroy},
      {"cuEventRecord", (void **)&hoop__cuda_drv.event_record},
      {"cuEventSynchronize", (void **)&hoop__cuda_drv.event_synchronize},
      {"cuStreamDestroy", (void **)&hoop__cuda_drv.stream_destroy},
      {"cuDeviceGet", (void **)&hoop__cuda_drv.device_get},
      {"cuDeviceGetAttribute", (void **)&hoop__cuda_drv.device_get_attribute},
      {"cuMemGetHandleForAddressRange", (void **)&hoop__cuda_drv.get_handle_for_range},
      {"cuFlushGPUDirectRDMAWrites", (void **)&hoop__cuda_drv.flush_rdma_writes},
      {"cuStreamQuery", (void **)&hoop__cuda_drv.stream_query},
      {"cuIpcGetMemHandle", (void **)&hoop__cuda_drv.ipc_get_mem_handle},
      {"cuIpcOpenMemHandle", (void **)&hoop__cuda_drv.ipc_open_mem_handle},
      {"cuIpcCloseMemHandle", (void **)&hoop__cuda_drv.ipc_close_mem_handle},
      {"cuMemAlloc", (void **)&hoop__cuda_drv.mem_alloc},
      {"cuMemFree", (void **)&hoop__cuda_drv.mem_free},
      {"cuMemRetainAllocationHandle", (void **)&hoop__cuda_drv.mem_retain_allocation_handle},
      {"cuMemGetAllocationPropertiesFromHandle",
       (void **)&hoop__cuda_drv.mem_get_allocation_properties},
      {"cuMemExportToShareableHandle", (void **)&hoop__cuda_drv.mem_export},
      {"cuMemImportFromShareableHandle", (void **)&hoop__cuda_drv.mem_import},
      {"cuMemRelease", (void **)&hoop__cuda_drv.mem_release},
      {"cuMemAddressReserve", (void **)&hoop__cuda_drv.mem_address_reserve},
      {"cuMemAddressFree", (void **)&hoop__cuda_drv.mem_address_free},
      {"cuMemMap", (void **)&hoop__cuda_drv.mem_map},
      {"cuMemUnmap", (void **)&hoop__cuda_drv.mem_unmap},
      {"cuMemSetAccess", (void **)&hoop__cuda_drv.mem_set_access},
      {"cuMemGetAddressRange", (void **)&hoop__cuda_drv.mem_get_address_range},
      {"cuDevicePrimaryCtxRetain", (void **)&hoop__cuda_drv.primary_ctx_retain}};
  for (size_t i = 0; i < sizeof pipe_calls / sizeof pipe_calls[0]; i++)
    if (get_proc(pipe_calls[i].name, pipe_calls[i].fn, HOOP_CUDA_API_VERSION,
                 CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS)
      *pipe_calls[i].fn = NULL;
  hoop__cuda_drv.usable = 1;
  HOOP__TRACE(HOOP_SUBSYS_INIT, "cuda: driver %s loaded: device buffers are detected", path);
}

int hoop__cuda_loaded(void) {
  pthread_once(&load_once, load);
  return hoop__cuda_drv.usable;
}

/* The primary context of the device that holds ptr, retained once per device for the process
 * (PyTorch and the runtime API work in it); NULL if the driver cannot say. */
#define MAX_DEVICES 64
static CUcontext primary_context_of(const void *ptr) {
  static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
  static CUcontext primary[MAX_DEVICES];
  int ordinal = -1;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (!hoop__cuda_drv.device_get || !hoop__cuda_drv.primary_ctx_retain ||
      hoop__cuda_drv.pointer_get_attributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)ptr) !=
          CUDA_SUCCESS ||
      ordinal < 0 || ordinal >= MAX_DEVICES)
    return NULL;
  pthread_mutex_lock(&primary_lock);
  CUdevice device;
  if (!primary[ordinal] && hoop__cuda_drv.device_get(&device, ordinal) == CUDA_SUCCESS &&
      hoop__cuda_drv.primary_ctx_retain(&primary[ordinal], device) != CUDA_SUCCESS)
    primary[ordinal] = NULL;
  CUcontext context = primary[ordinal];
  pthread_mutex_unlock(&primary_lock);
  return context;
}

/* Stream-ordered allocations (cudaMallocAsync) and VMM mappings (cuMemMap) belong to no context:
 * the pointer query answers NULL, and the device's primary context serves them. */
hoop__mem_kind hoop__cuda_kind_and_context(const void *ptr, CUcontext *context) {
  *context = NULL;
  if (!ptr || !hoop__cuda_loaded())
    return HOOP__MEM_HOST;
  CUmemorytype type = (CUmemorytype)0;
  unsigned int managed = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_CONTEXT};
  void *data[] = {&type, &managed, context};
  /* CUDA_ERROR_NOT_INITIALIZED (the program never called cuInit) or an unknown pointer: host. */
  if (hoop__cuda_drv.pointer_get_attributes(3, attrs, data, (CUdeviceptr)(uintptr_t)ptr) !=
      CUDA_SUCCESS)
    return HOOP__MEM_HOST;
  if (managed)
    return HOOP__MEM_MANAGED;
  if (type != CU_MEMORYTYPE_DEVICE)
    return HOOP__MEM_HOST;
  if (!*context)
    *context = primary_context_of(ptr);
  return HOOP__MEM_DEVICE;
}

hoop__mem_kind hoop__mem_kind_of(const void *ptr) {
  CUcontext context;
  return hoop__cuda_kind_and_context(ptr, &context);
}

void *hoop__cuda_context_of(const void *ptr) {
  CUcontext context = NULL;
  return hoop__cuda_kind_and_context(ptr, &context) == HOOP__MEM_DEVICE ? (void *)context : NULL;
}

const char *hoop__cuda_error_text(CUresult err) {
  const char *text = NULL;
  if (hoop__cuda_drv.get_error_string(err, &text) != CUDA_SUCCESS || !text)
    text = "unknown error";
  return text;
}

void hoop__cuda_say_why(char *why, size_t whylen, const char *what, CUresult err) {
  snprintf(why, whylen, "%s: %s (%d)", what, hoop__cuda_error_text(err), (int)err);
}

int hoop__cuda_push_context_of(const void *ptr, char *why, size_t whylen) {
  CUcontext context = NULL;
  if (hoop__cuda_kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context) {
    snprintf(why, whylen, "%p is not device memory of a live context", ptr);
    return -1;
  }
  CUresult err = hoop__cuda_drv.ctx_push(context);
  if (err != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, "cuCtxPushCurrent", err);
    return -1;
  }
  return 0;
}

hoop_result hoop__cuda_driver_error(hoop_comm *comm, const char *what, CUresult err) {
  const char *text = hoop__cuda_error_text(err);
  return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cuda: %s failed: %s (%d)",
                         comm->call ? comm->call : "hoop", what, text, (int)err);
}

#endif /* HOOP_HAVE_CUDA */
