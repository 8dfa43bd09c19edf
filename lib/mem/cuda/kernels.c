/* cuda.c - the CUDA driver, loaded at run time: pointer kinds and copies (see cuda.h).
 *
 * Entry points are resolved through cuGetProcAddress_v2 for the driver API version hoop was
 * written against, so that a newer driver gives the behaviour this code expects. Every driver call
 * runs in the context of the device memory it touches (pushed for the call and popped after),
 * since the thread that runs a collective, the caller's or hoop's progress thread, may have none
 * current.
 */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/env.h"
#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda.h"
#include "util/sockio.h"

int hoop_cuda_supported(void) {
  return hoop__cuda_loaded();
}

void *hoop__host_stage_alloc(size_t bytes, const void *near, int *pinned) {
  void *ptr = hoop__cuda_host_alloc(bytes, near);
  *pinned = ptr != NULL;
  if (!ptr && posix_memalign(&ptr, 64, bytes) != 0)
    return NULL;
  return ptr;
}

void hoop__host_stage_free(void *ptr, int pinned) {
  if (pinned)
    hoop__cuda_host_free(ptr);
  else
    free(ptr);
}

#ifndef HOOP_HAVE_CUDA

int hoop__cuda_loaded(void) {
  return 0;
}

hoop__mem_kind hoop__mem_kind_of(const void *ptr) {
  (void)ptr;
  return HOOP__MEM_HOST;
}

hoop_result hoop__cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)dst;
  (void)src;
  (void)bytes;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__mem_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)comm;
  if (bytes)
    memmove(dst, src, bytes);
  return HOOP_OK;
}

int hoop__cuda_kernels_built(void) {
  return 0;
}

void *hoop__cuda_host_alloc(size_t bytes, const void *near) {
  (void)bytes, (void)near;
  return NULL;
}

void hoop__cuda_host_free(void *ptr) {
  (void)ptr;
}

hoop_result hoop__cuda_stream_wait(hoop_comm *comm, const char *call, void *stream,
                                   const void *buf) {
  (void)buf;
  if (!stream)
    return HOOP_OK;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                         "%s: a CUDA stream, but this libhoop was built without CUDA", call);
}

hoop_result hoop__cuda_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op) {
  (void)dst, (void)a, (void)b, (void)count, (void)dtype, (void)op;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop__cuda_pipe *hoop__cuda_pipe_get(hoop_comm *comm, const void *ptr, int nevents) {
  (void)comm, (void)ptr, (void)nevents;
  return NULL;
}

hoop_result hoop__cuda_pipe_copy(hoop_comm *comm, hoop__cuda_pipe *pipe, void *dst, const void *src,
                                 size_t bytes, int event) {
  (void)pipe, (void)dst, (void)src, (void)bytes, (void)event;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_pipe_wait(hoop_comm *comm, hoop__cuda_pipe *pipe, int event) {
  (void)pipe, (void)event;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_pipe_drain(hoop_comm *comm, hoop__cuda_pipe *pipe) {
  (void)pipe;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void hoop__cuda_pipe_free(hoop_comm *comm) {
  (void)comm;
}

int hoop__cuda_dmabuf_supported(const void *ptr) {
  (void)ptr;
  return -1;
}

int hoop__cuda_dmabuf_fd(const void *base, size_t len, int *fd, char *why, size_t whylen) {
  (void)base, (void)len, (void)fd;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

hoop_result hoop__cuda_reduce_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                     hoop_op op, int nranks) {
  (void)buf, (void)count, (void)dtype, (void)op, (void)nranks;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

int hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                          size_t whylen) {
  (void)ptr, (void)len, (void)out;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

int hoop__cuda_ipc_open(const void *near, const hoop__cuda_export *export, void **base, char *why,
                        size_t whylen) {
  (void)near, (void)export, (void)base;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

void hoop__cuda_ipc_close(void *context, void *base, const hoop__cuda_export *export) {
  (void)context, (void)base, (void)export;
}

int hoop__cuda_export_same(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

int hoop__cuda_export_conflict(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  (void)a, (void)b;
  return 0;
}

void *hoop__cuda_context_of(const void *ptr) {
  (void)ptr;
  return NULL;
}

hoop_result hoop__cuda_reduce3_async(hoop_comm *comm, void *dst, const void *a, const void *b,
                                     size_t count, hoop_dtype dtype, hoop_op op) {
  return hoop__cuda_reduce3(comm, dst, a, b, count, dtype, op);
}

hoop_result hoop__cuda_finish_async(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                    hoop_op op, int nranks) {
  return hoop__cuda_reduce_finish(comm, buf, count, dtype, op, nranks);
}

hoop_result hoop__cuda_reduce_many_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide) {
  (void)dst, (void)srcs, (void)nsrcs, (void)count, (void)dtype, (void)op, (void)divide;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_copy_async(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  return hoop__cuda_copy(comm, dst, src, bytes);
}

hoop_result hoop__cuda_sync(hoop_comm *comm, const void *near) {
  (void)near;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_sync_busy(hoop_comm *comm, const void *near,
                                 hoop_result (*meanwhile)(hoop_comm *comm)) {
  (void)near, (void)meanwhile;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void *hoop__cuda_alloc(size_t bytes, const void *near) {
  (void)bytes, (void)near;
  return NULL;
}

hoop_result hoop__cuda_ready(hoop_comm *comm, const void *near, int kernels) {
  (void)near, (void)kernels;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void hoop__cuda_free(void *ptr) {
  (void)ptr;
}

#else /* HOOP_HAVE_CUDA */

#include <cuda.h>

/* The driver API version the entry points are asked for (CUDA 12.0's ABI of each call). */
#define HOOP_CUDA_API_VERSION 12000

static struct {
  void *lib;
  int usable;
  CUresult (*pointer_get_attributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
  CUresult (*ctx_push)(CUcontext);
  CUresult (*ctx_pop)(CUcontext *);
  CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*get_error_string)(CUresult, const char **);
  /* The kernels' calls: NULL where the driver lacks them (the stand-in of the tests). */
  CUresult (*module_load_data)(CUmodule *, const void *);
  CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
  CUresult (*launch_kernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                            unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
  CUresult (*stream_create)(CUstream *, unsigned int);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*stream_query)(CUstream); /* NULL where the driver lacks it */
  CUresult (*stream_get_ctx)(CUstream, CUcontext *);
  CUresult (*mem_host_alloc)(void **, size_t, unsigned int);
  CUresult (*mem_free_host)(void *);
  /* The pipelined ring's: NULL where the driver lacks them. */
  CUresult (*memcpy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*event_create)(CUevent *, unsigned int);
  CUresult (*event_destroy)(CUevent);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_synchronize)(CUevent);
  CUresult (*stream_destroy)(CUstream);
  /* GPUDirect RDMA's: NULL where the driver lacks them. */
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*get_handle_for_range)(void *, CUdeviceptr, size_t, CUmemRangeHandleType,
                                   unsigned long long);
  CUresult (*flush_rdma_writes)(CUflushGPUDirectRDMAWritesTarget, CUflushGPUDirectRDMAWritesScope);
  /* CUDA IPC's and the IPC allreduce's scratch: NULL where the driver lacks them. */
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*ipc_open_mem_handle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
  CUresult (*ipc_close_mem_handle)(CUdeviceptr);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  /* CUDA IPC of VMM memory's: NULL where the driver lacks them. */
  CUresult (*mem_retain_allocation_handle)(CUmemGenericAllocationHandle *, void *);
  CUresult (*mem_get_allocation_properties)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
  CUresult (*mem_export)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                         unsigned long long);
  CUresult (*mem_import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
  CUresult (*mem_release)(CUmemGenericAllocationHandle);
  CUresult (*mem_address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*mem_address_free)(CUdeviceptr, size_t);
  CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                      unsigned long long);
  CUresult (*mem_unmap)(CUdeviceptr, size_t);
  CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*mem_get_address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
  /* Memory that belongs to no context (stream-ordered allocations, VMM mappings) runs in its
   * device's primary context: NULL where the driver lacks the call. */
  CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
  CUcontext host_context; /* where the staging memory was allocated, to free it there */
} drv;

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
  drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    HOOP__TRACE(HOOP_SUBSYS_INIT, "cuda: no driver (%s): every buffer is host memory", dlerror());
    return;
  }
  get_proc_fn get_proc = (get_proc_fn)dlsym(drv.lib, "cuGetProcAddress_v2");
  if (!get_proc) {
    HOOP__INFO(HOOP_SUBSYS_INIT,
               "cuda: %s has no cuGetProcAddress_v2 (a driver older than CUDA "
               "12); device buffers are not supported",
               path);
    return;
  }
  if (resolve(get_proc, "cuPointerGetAttributes", (void **)&drv.pointer_get_attributes) ||
      resolve(get_proc, "cuCtxPushCurrent", (void **)&drv.ctx_push) ||
      resolve(get_proc, "cuCtxPopCurrent", (void **)&drv.ctx_pop) ||
      resolve(get_proc, "cuMemcpy", (void **)&drv.memcpy) ||
      resolve(get_proc, "cuGetErrorString", (void **)&drv.get_error_string))
    return;
  /* Optional: without them, device buffers work and only the GPU kernels are missing. */
  CUdriverProcAddressQueryResult status;
  get_proc("cuModuleLoadData", (void **)&drv.module_load_data, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuModuleGetFunction", (void **)&drv.module_get_function, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuLaunchKernel", (void **)&drv.launch_kernel, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuStreamCreate", (void **)&drv.stream_create, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuStreamSynchronize", (void **)&drv.stream_synchronize, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuStreamGetCtx", (void **)&drv.stream_get_ctx, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuMemHostAlloc", (void **)&drv.mem_host_alloc, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  get_proc("cuMemFreeHost", (void **)&drv.mem_free_host, HOOP_CUDA_API_VERSION,
           CU_GET_PROC_ADDRESS_DEFAULT, &status);
  const struct {
    const char *name;
    void **fn;
  } pipe_calls[] = {
      {"cuMemcpyAsync", (void **)&drv.memcpy_async},
      {"cuEventCreate", (void **)&drv.event_create},
      {"cuEventDestroy", (void **)&drv.event_destroy},
      {"cuEventRecord", (void **)&drv.event_record},
      {"cuEventSynchronize", (void **)&drv.event_synchronize},
      {"cuStreamDestroy", (void **)&drv.stream_destroy},
      {"cuDeviceGet", (void **)&drv.device_get},
      {"cuDeviceGetAttribute", (void **)&drv.device_get_attribute},
      {"cuMemGetHandleForAddressRange", (void **)&drv.get_handle_for_range},
      {"cuFlushGPUDirectRDMAWrites", (void **)&drv.flush_rdma_writes},
      {"cuStreamQuery", (void **)&drv.stream_query},
      {"cuIpcGetMemHandle", (void **)&drv.ipc_get_mem_handle},
      {"cuIpcOpenMemHandle", (void **)&drv.ipc_open_mem_handle},
      {"cuIpcCloseMemHandle", (void **)&drv.ipc_close_mem_handle},
      {"cuMemAlloc", (void **)&drv.mem_alloc},
      {"cuMemFree", (void **)&drv.mem_free},
      {"cuMemRetainAllocationHandle", (void **)&drv.mem_retain_allocation_handle},
      {"cuMemGetAllocationPropertiesFromHandle", (void **)&drv.mem_get_allocation_properties},
      {"cuMemExportToShareableHandle", (void **)&drv.mem_export},
      {"cuMemImportFromShareableHandle", (void **)&drv.mem_import},
      {"cuMemRelease", (void **)&drv.mem_release},
      {"cuMemAddressReserve", (void **)&drv.mem_address_reserve},
      {"cuMemAddressFree", (void **)&drv.mem_address_free},
      {"cuMemMap", (void **)&drv.mem_map},
      {"cuMemUnmap", (void **)&drv.mem_unmap},
      {"cuMemSetAccess", (void **)&drv.mem_set_access},
      {"cuMemGetAddressRange", (void **)&drv.mem_get_address_range},
      {"cuDevicePrimaryCtxRetain", (void **)&drv.primary_ctx_retain}};
  for (size_t i = 0; i < sizeof pipe_calls / sizeof pipe_calls[0]; i++)
    if (get_proc(pipe_calls[i].name, pipe_calls[i].fn, HOOP_CUDA_API_VERSION,
                 CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS)
      *pipe_calls[i].fn = NULL;
  drv.usable = 1;
  HOOP__TRACE(HOOP_SUBSYS_INIT, "cuda: driver %s loaded: device buffers are detected", path);
}

int hoop__cuda_loaded(void) {
  pthread_once(&load_once, load);
  return drv.usable;
}

/* The kind of ptr and, for device memory, its context. */
/* The primary context of the device that holds ptr, retained once per device for the process
 * (PyTorch and the runtime API work in it); NULL if the driver cannot say. */
#define MAX_DEVICES 64
static CUcontext primary_context_of(const void *ptr) {
  static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
  static CUcontext primary[MAX_DEVICES];
  int ordinal = -1;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (!drv.device_get || !drv.primary_ctx_retain ||
      drv.pointer_get_attributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS ||
      ordinal < 0 || ordinal >= MAX_DEVICES)
    return NULL;
  pthread_mutex_lock(&primary_lock);
  CUdevice device;
  if (!primary[ordinal] && drv.device_get(&device, ordinal) == CUDA_SUCCESS &&
      drv.primary_ctx_retain(&primary[ordinal], device) != CUDA_SUCCESS)
    primary[ordinal] = NULL;
  CUcontext context = primary[ordinal];
  pthread_mutex_unlock(&primary_lock);
  return context;
}

/* Stream-ordered allocations (cudaMallocAsync) and VMM mappings (cuMemMap) belong to no context:
 * the pointer query answers NULL, and the device's primary context serves them. */
static hoop__mem_kind kind_and_context(const void *ptr, CUcontext *context) {
  *context = NULL;
  if (!ptr || !hoop__cuda_loaded())
    return HOOP__MEM_HOST;
  CUmemorytype type = (CUmemorytype)0;
  unsigned int managed = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_CONTEXT};
  void *data[] = {&type, &managed, context};
  /* CUDA_ERROR_NOT_INITIALIZED (the program never called cuInit) or an unknown pointer: host. */
  if (drv.pointer_get_attributes(3, attrs, data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS)
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
  return kind_and_context(ptr, &context);
}

/* The driver's words for err. */
static const char *error_text(CUresult err) {
  const char *text = NULL;
  if (drv.get_error_string(err, &text) != CUDA_SUCCESS || !text)
    text = "unknown error";
  return text;
}

/* "what: the driver's words (err)" into why, for the callers that explain rather than fail. */
static void say_why(char *why, size_t whylen, const char *what, CUresult err) {
  snprintf(why, whylen, "%s: %s (%d)", what, error_text(err), (int)err);
}

/* Make the context of the device memory at ptr current (pop it after): 0, or -1 with why. */
static int push_context_of(const void *ptr, char *why, size_t whylen) {
  CUcontext context = NULL;
  if (kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context) {
    snprintf(why, whylen, "%p is not device memory of a live context", ptr);
    return -1;
  }
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS) {
    say_why(why, whylen, "cuCtxPushCurrent", err);
    return -1;
  }
  return 0;
}

static hoop_result driver_error(hoop_comm *comm, const char *what, CUresult err) {
  const char *text = error_text(err);
  return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cuda: %s failed: %s (%d)",
                         comm->call ? comm->call : "hoop", what, text, (int)err);
}

hoop_result hoop__cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return HOOP_OK;
  CUcontext context = NULL, dst_context = NULL;
  /* Managed memory counts as the device's here: the driver copies into it as into device memory
   * (and the CPU may read it next). */
  int to_device = kind_and_context(dst, &dst_context) != HOOP__MEM_HOST;
  if (kind_and_context(src, &context) != HOOP__MEM_DEVICE || !context)
    context = dst_context;
  if (!context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: cuda: neither %p nor %p is device memory of a live context",
                           comm->call ? comm->call : "hoop", dst, src);
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  /* Unified addressing: the driver tells host from device by the addresses. cuMemcpy runs on the
   * legacy default stream and returns once the data is in host memory, or once it left page-locked
   * host memory; but device to device, or from pageable host memory, it may return before the
   * bytes are in device memory (the driver's "API synchronization behavior"). Whoever reads them
   * next may be another stream or another process: wait for them. */
  const char *what = "cuMemcpy";
  err = drv.memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes);
  if (err == CUDA_SUCCESS && to_device) {
    /* An event after the copy, not the whole stream: work other threads queue there after it is
     * not waited for. */
    CUevent copied = NULL;
    if (drv.event_create && drv.event_record && drv.event_synchronize && drv.event_destroy &&
        drv.event_create(&copied, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
      what = "cuEventRecord (after cuMemcpy)";
      if ((err = drv.event_record(copied, NULL)) == CUDA_SUCCESS) {
        what = "cuEventSynchronize (after cuMemcpy)";
        err = drv.event_synchronize(copied);
      }
      drv.event_destroy(copied);
    } else {
      what = "cuStreamSynchronize (after cuMemcpy)";
      err = drv.stream_synchronize(NULL);
    }
  }
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, what, err);
}

hoop_result hoop__mem_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return HOOP_OK;
  if (hoop__mem_kind_of(src) != HOOP__MEM_DEVICE && hoop__mem_kind_of(dst) != HOOP__MEM_DEVICE) {
    memmove(dst, src, bytes);
    return HOOP_OK;
  }
  return hoop__cuda_copy(comm, dst, src, bytes);
}

void *hoop__cuda_host_alloc(size_t bytes, const void *near) {
  CUcontext context = NULL;
  if (!drv.mem_host_alloc || !drv.mem_free_host ||
      kind_and_context(near, &context) != HOOP__MEM_DEVICE || !context)
    return NULL;
  void *ptr = NULL;
  if (drv.ctx_push(context) != CUDA_SUCCESS)
    return NULL;
  CUresult err = drv.mem_host_alloc(&ptr, bytes, CU_MEMHOSTALLOC_PORTABLE);
  CUcontext popped;
  drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS) {
    HOOP__INFO(HOOP_SUBSYS_COLL,
               "cuda: cannot page-lock %zu bytes to stage through (%d); "
               "staging through ordinary memory",
               bytes, (int)err);
    return NULL;
  }
  drv.host_context = context;
  return ptr;
}

void hoop__cuda_host_free(void *ptr) {
  if (!ptr || !drv.mem_free_host)
    return;
  if (drv.host_context && drv.ctx_push(drv.host_context) == CUDA_SUCCESS) {
    drv.mem_free_host(ptr);
    CUcontext popped;
    drv.ctx_pop(&popped);
  } else {
    drv.mem_free_host(ptr);
  }
}

hoop_result hoop__cuda_stream_wait(hoop_comm *comm, const char *call, void *stream,
                                   const void *buf) {
  if (!hoop__cuda_loaded())
    return stream ? hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                                    "%s: a CUDA stream, but no CUDA driver loads (%s)", call,
                                    hoop__env_get("HOOP_CUDA_LIBRARY"))
                  : HOOP_OK;
  if (!drv.stream_synchronize)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "%s: the driver has no cuStreamSynchronize",
                           call);
  CUcontext context = NULL;
  if (stream && drv.stream_get_ctx)
    drv.stream_get_ctx((CUstream)stream, &context);
  if (!context)
    kind_and_context(buf, &context);
  if (!context) {
    if (!stream)
      return HOOP_OK; /* host buffers on the default stream: nothing queued to wait for */
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: cannot tell the context of stream %p",
                           call, stream);
  }
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  err = drv.stream_synchronize((CUstream)stream);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuStreamSynchronize", err);
}

/* ---- copies that overlap a collective ----------------------------------------------------- */

struct hoop__cuda_pipe {
  CUcontext context;
  CUstream stream;
  CUevent *events;
  int nevents;
};

void hoop__cuda_pipe_free(hoop_comm *comm) {
  hoop__cuda_pipe *pipe = comm->cuda_pipe;
  if (!pipe)
    return;
  comm->cuda_pipe = NULL;
  if (drv.ctx_push(pipe->context) == CUDA_SUCCESS) {
    for (int i = 0; i < pipe->nevents; i++)
      drv.event_destroy(pipe->events[i]);
    if (pipe->stream)
      drv.stream_destroy(pipe->stream);
    CUcontext popped;
    drv.ctx_pop(&popped);
  }
  free(pipe->events);
  free(pipe);
}

hoop__cuda_pipe *hoop__cuda_pipe_get(hoop_comm *comm, const void *ptr, int nevents) {
  CUcontext context = NULL;
  if (!drv.memcpy_async || !drv.event_create || !drv.event_destroy || !drv.event_record ||
      !drv.event_synchronize || !drv.stream_destroy || !drv.stream_create ||
      !drv.stream_synchronize || kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context)
    return NULL;
  hoop__cuda_pipe *pipe = comm->cuda_pipe;
  if (pipe && pipe->context != context)
    hoop__cuda_pipe_free(comm);
  if (!(pipe = comm->cuda_pipe)) {
    if (!(pipe = calloc(1, sizeof *pipe)))
      return NULL;
    pipe->context = context;
    comm->cuda_pipe = pipe;
  }
  if (drv.ctx_push(context) != CUDA_SUCCESS)
    return NULL;
  CUresult err = CUDA_SUCCESS;
  if (!pipe->stream)
    err = drv.stream_create(&pipe->stream, CU_STREAM_NON_BLOCKING);
  if (err == CUDA_SUCCESS && pipe->nevents < nevents) {
    CUevent *grown = realloc(pipe->events, (size_t)nevents * sizeof *grown);
    if (grown) {
      pipe->events = grown;
      while (pipe->nevents < nevents &&
             (err = drv.event_create(&pipe->events[pipe->nevents], CU_EVENT_DISABLE_TIMING)) ==
                 CUDA_SUCCESS)
        pipe->nevents++;
    } else {
      err = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  CUcontext popped;
  drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS || pipe->nevents < nevents) {
    HOOP__INFO(HOOP_SUBSYS_COLL, "cuda: no stream or events to overlap copies (%d); staging whole",
               (int)err);
    return NULL;
  }
  return pipe;
}

hoop_result hoop__cuda_pipe_copy(hoop_comm *comm, hoop__cuda_pipe *pipe, void *dst, const void *src,
                                 size_t bytes, int event) {
  CUresult err = drv.ctx_push(pipe->context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  if (bytes)
    err = drv.memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                           pipe->stream);
  const char *what = "cuMemcpyAsync";
  if (err == CUDA_SUCCESS && event >= 0) {
    what = "cuEventRecord";
    err = drv.event_record(pipe->events[event], pipe->stream);
  }
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, what, err);
}

hoop_result hoop__cuda_pipe_wait(hoop_comm *comm, hoop__cuda_pipe *pipe, int event) {
  CUresult err = drv.ctx_push(pipe->context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  err = drv.event_synchronize(pipe->events[event]);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuEventSynchronize", err);
}

hoop_result hoop__cuda_pipe_drain(hoop_comm *comm, hoop__cuda_pipe *pipe) {
  CUresult err = drv.ctx_push(pipe->context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  err = drv.stream_synchronize(pipe->stream);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuStreamSynchronize", err);
}

/* ---- GPUDirect RDMA's questions ------------------------------------------------------------ */

/* An attribute of the device that holds ptr: 0, or -1 when the driver cannot say. */
static int device_attribute(const void *ptr, CUdevice_attribute which, int *value) {
  int ordinal = -1;
  CUdevice device;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (!hoop__cuda_loaded() || !drv.device_get || !drv.device_get_attribute ||
      drv.pointer_get_attributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS ||
      ordinal < 0 || drv.device_get(&device, ordinal) != CUDA_SUCCESS ||
      drv.device_get_attribute(value, which, device) != CUDA_SUCCESS)
    return -1;
  return 0;
}

int hoop__cuda_dmabuf_supported(const void *ptr) {
  int value = 0;
  if (device_attribute(ptr, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, &value) != 0)
    return -1;
  return value != 0;
}

int hoop__cuda_gdr_flush_mode(const void *ptr, char *why, size_t whylen) {
  int ordering = 0, options = 0;
  if (device_attribute(ptr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, &ordering) == 0 &&
      ordering >= CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)
    return 0;
  if (drv.flush_rdma_writes &&
      device_attribute(ptr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, &options) ==
          0 &&
      (options & CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST))
    return 1;
  snprintf(why, whylen,
           "the GPU does not order GPUDirect RDMA writes before its kernels' reads, and the "
           "driver offers no flush (cuFlushGPUDirectRDMAWrites)");
  return -1;
}

hoop_result hoop__cuda_gdr_flush(hoop_comm *comm, const void *near) {
  char why[160];
  if (push_context_of(near, why, sizeof why) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cuda: %s", comm->call ? comm->call : "hoop",
                           why);
  CUresult err = drv.flush_rdma_writes(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                       CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuFlushGPUDirectRDMAWrites", err);
}

int hoop__cuda_dmabuf_fd(const void *base, size_t len, int *fd, char *why, size_t whylen) {
  if (!drv.get_handle_for_range) {
    snprintf(why, whylen, "the driver has no cuMemGetHandleForAddressRange");
    return -1;
  }
  if (push_context_of(base, why, whylen) != 0)
    return -1;
  CUresult err = drv.get_handle_for_range(fd, (CUdeviceptr)(uintptr_t)base, len,
                                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  CUcontext popped;
  drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS) {
    say_why(why, whylen, "cuMemGetHandleForAddressRange", err);
    return -1;
  }
  return 0;
}

/* ---- the reduction kernels ---------------------------------------------------------------- */

#ifdef HOOP_HAVE_CUDA_KERNELS
#include "mem/kernels_fatbin.h" /* hoop_cuda_fatbin: lib/mem/kernels.cu, built by nvcc */
#endif

#define MAX_CONTEXTS 16
#define THREADS 256
#define MAX_BLOCKS 32768

static const char *const dtype_names[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = "int8",       [HOOP_UINT8] = "uint8",       [HOOP_INT32] = "int32",
    [HOOP_UINT32] = "uint32",   [HOOP_INT64] = "int64",       [HOOP_UINT64] = "uint64",
    [HOOP_FLOAT16] = "float16", [HOOP_BFLOAT16] = "bfloat16", [HOOP_FLOAT32] = "float32",
    [HOOP_FLOAT64] = "float64"};
static const char *const op_names[HOOP_OP_COUNT] = {[HOOP_SUM] = "sum",
                                                    [HOOP_PROD] = "prod",
                                                    [HOOP_MIN] = "min",
                                                    [HOOP_MAX] = "max",
                                                    [HOOP_AVG] = "sum"};

/* The module loaded in one context, its functions, and a stream of hoop's own there. */
typedef struct kernel_set {
  CUcontext context;
  CUstream stream;
  CUfunction reduce[HOOP_DTYPE_COUNT][HOOP_OP_COUNT];
  CUfunction divide[HOOP_DTYPE_COUNT];
  CUfunction many[HOOP_DTYPE_COUNT][HOOP_OP_COUNT];
  int loaded;              /* the functions are there */
  hoop_result load_failed; /* the kernels could not be loaded here (not tried again), and why */
  char load_why[160];
} kernel_set;

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
    if (!drv.stream_create || !drv.stream_synchronize)
      result = hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "cuda: the driver has no streams");
    else if (nsets == MAX_CONTEXTS)
      result =
          hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "cuda: more than %d contexts", MAX_CONTEXTS);
    else {
      kernel_set *fresh = &sets[nsets];
      memset(fresh, 0, sizeof *fresh);
      fresh->context = context;
      if ((err = drv.stream_create(&fresh->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
        result = driver_error(comm, "cuStreamCreate", err);
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
    if (!drv.module_load_data || !drv.module_get_function || !drv.launch_kernel)
      result = hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                               "cuda: the driver cannot load kernels (no cuModuleLoadData)");
    else if ((err = drv.module_load_data(&module, hoop_cuda_fatbin)) != CUDA_SUCCESS)
      result = driver_error(comm, "cuModuleLoadData (hoop's kernels)", err);
    char name[64];
    for (int d = 0; d < HOOP_DTYPE_COUNT && result == HOOP_OK; d++) {
      for (int o = 0; o < HOOP_OP_COUNT && result == HOOP_OK; o++) {
        snprintf(name, sizeof name, "hoop_reduce_%s_%s", dtype_names[d], op_names[o]);
        if ((err = drv.module_get_function(&set->reduce[d][o], module, name)) != CUDA_SUCCESS)
          result = driver_error(comm, name, err);
        snprintf(name, sizeof name, "hoop_many_%s_%s", dtype_names[d], op_names[o]);
        if (result == HOOP_OK &&
            (err = drv.module_get_function(&set->many[d][o], module, name)) != CUDA_SUCCESS)
          result = driver_error(comm, name, err);
      }
      snprintf(name, sizeof name, "hoop_divide_%s", dtype_names[d]);
      if (result == HOOP_OK &&
          (err = drv.module_get_function(&set->divide[d], module, name)) != CUDA_SUCCESS)
        result = driver_error(comm, name, err);
    }
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

/* Run a kernel over count elements in ptr's context on hoop's stream there, and wait for it if
 * wait: op >= 0 the reduction of dtype and op, -1 the division, -2 - op the many-source reduction
 * of op. */
static hoop_result launch(hoop_comm *comm, const void *ptr, int dtype, int op, size_t count,
                          void **params, int wait) {
  CUcontext context = NULL;
  if (kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: %p is not device memory", ptr);
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  kernel_set *set = NULL;
  hoop_result result = kernels_for(comm, context, &set, 1);
  if (result == HOOP_OK) {
    CUfunction f = op >= 0    ? set->reduce[dtype][op]
                   : op == -1 ? set->divide[dtype]
                              : set->many[dtype][-2 - op];
    size_t per = 16 / hoop_dtype_size((hoop_dtype)dtype);
    size_t blocks = (count / per + THREADS - 1) / THREADS;
    blocks = blocks < 1 ? 1 : blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks;
    if ((err = drv.launch_kernel(f, (unsigned)blocks, 1, 1, THREADS, 1, 1, 0, set->stream, params,
                                 NULL)) != CUDA_SUCCESS)
      result = driver_error(comm, "cuLaunchKernel", err);
    else if (wait && (err = drv.stream_synchronize(set->stream)) != CUDA_SUCCESS)
      result = driver_error(comm, "cuStreamSynchronize", err);
  }
  CUcontext popped;
  drv.ctx_pop(&popped);
  return result;
}

/* dst = a op b on hoop's stream; done on return if wait. */
static hoop_result reduce3(hoop_comm *comm, void *dst, const void *a, const void *b, size_t count,
                           hoop_dtype dtype, hoop_op op, int wait) {
  if (count == 0)
    return HOOP_OK;
  if ((unsigned)dtype >= HOOP_DTYPE_COUNT || (unsigned)op >= HOOP_OP_COUNT)
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
               "many_sources must match lib/mem/kernels.cu");

hoop_result hoop__cuda_reduce_many_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide) {
  if (count == 0)
    return HOOP_OK;
  if ((unsigned)dtype >= HOOP_DTYPE_COUNT || (unsigned)op >= HOOP_OP_COUNT || nsrcs < 1 ||
      nsrcs > HOOP__CUDA_MANY_MAX)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: bad dtype, op or source count");
  many_sources sources = {.n = nsrcs};
  for (int j = 0; j < nsrcs; j++)
    sources.src[j] = srcs[j];
  void *params[] = {&dst, &sources, &count, &divide};
  return launch(comm, dst, dtype, -2 - (int)op, count, params, 0);
}

/* The kernel set of near's context, current on this thread for the caller (pop it after). */
static hoop_result enter_set(hoop_comm *comm, const void *near, kernel_set **set) {
  CUcontext context = NULL;
  if (kind_and_context(near, &context) != HOOP__MEM_DEVICE || !context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: %p is not device memory", near);
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  hoop_result result = kernels_for(comm, context, set, 0);
  if (result != HOOP_OK) {
    CUcontext popped;
    drv.ctx_pop(&popped);
  }
  return result;
}

hoop_result hoop__cuda_copy_async(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return HOOP_OK;
  if (!drv.memcpy_async)
    return hoop__cuda_copy(comm, dst, src, bytes);
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, dst, &set);
  if (result != HOOP_OK)
    return result;
  CUresult err = drv.memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                                  set->stream);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuMemcpyAsync", err);
}

hoop_result hoop__cuda_ready(hoop_comm *comm, const void *near, int kernels) {
  CUcontext context = NULL;
  if (kind_and_context(near, &context) != HOOP__MEM_DEVICE || !context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "cuda: %p is not device memory", near);
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  kernel_set *set = NULL;
  hoop_result result = kernels_for(comm, context, &set, kernels);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return result;
}

hoop_result hoop__cuda_sync(hoop_comm *comm, const void *near) {
  return hoop__cuda_sync_busy(comm, near, NULL);
}

hoop_result hoop__cuda_sync_busy(hoop_comm *comm, const void *near,
                                 hoop_result (*meanwhile)(hoop_comm *comm)) {
  kernel_set *set = NULL;
  hoop_result result = enter_set(comm, near, &set);
  if (result != HOOP_OK)
    return result;
  CUresult err = CUDA_ERROR_NOT_READY;
  while (meanwhile && drv.stream_query &&
         (err = drv.stream_query(set->stream)) == CUDA_ERROR_NOT_READY &&
         (result = meanwhile(comm)) == HOOP_OK)
    ;
  /* Leaving on the other's failure, or without the query, still waits: nothing of the call may
   * run on the GPU once it returns. */
  if (err != CUDA_SUCCESS)
    err = drv.stream_synchronize(set->stream);
  CUcontext popped;
  drv.ctx_pop(&popped);
  if (result != HOOP_OK)
    return result;
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuStreamSynchronize", err);
}

void *hoop__cuda_alloc(size_t bytes, const void *near) {
  CUcontext context = NULL;
  CUdeviceptr ptr = 0;
  if (!drv.mem_alloc || !drv.mem_free || kind_and_context(near, &context) != HOOP__MEM_DEVICE ||
      !context || drv.ctx_push(context) != CUDA_SUCCESS)
    return NULL;
  CUresult err = drv.mem_alloc(&ptr, bytes ? bytes : 1);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? (void *)(uintptr_t)ptr : NULL;
}

void hoop__cuda_free(void *ptr) {
  CUcontext context = NULL;
  if (!ptr || kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context ||
      drv.ctx_push(context) != CUDA_SUCCESS)
    return;
  drv.mem_free((CUdeviceptr)(uintptr_t)ptr);
  CUcontext popped;
  drv.ctx_pop(&popped);
}

/* ---- CUDA IPC ---------------------------------------------------------------------------------
 */

/* This process's exports, by buffer id: cuIpcGetMemHandle is a driver round trip. A VMM export
 * holds no descriptor: the descriptor server below exports the allocation when a peer asks. */
#define MAX_EXPORTS 64
static hoop__cuda_export exports[MAX_EXPORTS];
static int nexports, next_export;
/* Buffers that could not be exported (by buffer id, address and length), and why: asked once. */
#define MAX_REFUSED 16
static struct refusal {
  uint64_t id;
  uintptr_t ptr;
  size_t len;
  char why[256];
} refused[MAX_REFUSED];
static int next_refused;
static pthread_mutex_t exports_lock = PTHREAD_MUTEX_INITIALIZER;

static int vmm_calls(void) {
  return drv.mem_retain_allocation_handle && drv.mem_get_allocation_properties && drv.mem_export &&
         drv.mem_import && drv.mem_release && drv.mem_address_reserve && drv.mem_address_free &&
         drv.mem_map && drv.mem_unmap && drv.mem_set_access && drv.mem_get_address_range;
}

/* The VMM allocation mapped at start (its context current), exported as a file descriptor into
 * *fd, its handle (its identity) into *id: 0, or -1 with why. */
static int vmm_export_piece(CUdeviceptr start, int *fd, uint64_t *id, char *why, size_t whylen) {
  *fd = -1;
  if (!vmm_calls()) {
    snprintf(why, whylen, "the driver has no virtual memory management calls");
    return -1;
  }
  CUmemGenericAllocationHandle handle;
  CUresult err = drv.mem_retain_allocation_handle(&handle, (void *)(uintptr_t)start);
  if (err != CUDA_SUCCESS) {
    say_why(why, whylen, "cuMemRetainAllocationHandle", err);
    return -1;
  }
  CUmemAllocationProp prop;
  *id = (uint64_t)handle; /* the handle mapped there: the allocation's identity */
  if ((err = drv.mem_get_allocation_properties(&prop, handle)) != CUDA_SUCCESS)
    say_why(why, whylen, "cuMemGetAllocationPropertiesFromHandle", err);
  else if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    snprintf(why, whylen,
             "its allocation (cuMemCreate) was not made exportable as a file descriptor "
             "(requestedHandleTypes lacks CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
  else if ((err = drv.mem_export(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) !=
           CUDA_SUCCESS)
    say_why(why, whylen, "cuMemExportToShareableHandle", err);
  drv.mem_release(handle);
  return *fd >= 0 ? 0 : -1;
}

/* The buffer id of the memory at ptr (0 if the driver cannot say). */
static uint64_t buffer_id_at(CUdeviceptr ptr) {
  unsigned long long id = 0;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_BUFFER_ID;
  void *data = &id;
  if (drv.pointer_get_attributes(1, &attr, &data, ptr) != CUDA_SUCCESS)
    return 0;
  return id;
}

/* A peer's piece count, which nothing has checked yet. */
static int pieces_of(const hoop__cuda_export *export) {
  return export->npieces < 0                       ? 0
         : export->npieces > HOOP__CUDA_VMM_PIECES ? HOOP__CUDA_VMM_PIECES
                                                   : export->npieces;
}

/* ---- VMM descriptors, passed over a Unix socket
 *
 * A process that exports VMM memory serves its allocations' file descriptors on an abstract Unix
 * socket "hoop-vmm-PID-NONCE" (NONCE random, told to the peers in the export), from a thread of
 * its own started at its first VMM export, and a short-lived thread per connection. An importer
 * connects, asks for each piece of an export by its identity (address, allocation handle, buffer
 * id) and the export's token (random, told only to the peers of the call that sent it); the server
 * answers only for pieces of an export of its cache with that token whose allocation is still the
 * one mapped there: it exports it, sends the descriptor (SCM_RIGHTS) and closes its own. Each end
 * checks that the other is a process of the same user (SO_PEERCRED), the importer that it is the
 * exporting process. So no descriptor stays open here between calls (an open one holds its
 * allocation's memory after the program frees it), and nothing needs the permission to ptrace the
 * exporter (pidfd_getfd's, which Yama's default on Ubuntu refuses between sibling processes).
 * Ranks of one host must share a network namespace (abstract sockets live in one). */

#define VMM_ASK_MAGIC 0x686f6f702d766d6dull /* "hoop-vmm" */
#define VMM_SERVER_CONNS 32                 /* connections served at once; more are closed */
#define VMM_IDLE_SECONDS 2                  /* an importer that says nothing is not waited for */
#define VMM_ANSWER_SECONDS 10               /* what an importer waits for the server, at most */
typedef struct vmm_ask {
  uint64_t magic, token[2], start, handle, buffer_id;
} vmm_ask;
typedef struct vmm_answer {
  int32_t status; /* 0: the descriptor comes with it */
  char why[124];
} vmm_answer;

static struct {
  pthread_mutex_t lock;
  pid_t pid; /* the process whose server it is (a forked child starts its own) */
  uint64_t nonce;
  int fd;    /* the listening socket */
  int conns; /* connections being served */
} fd_server = {PTHREAD_MUTEX_INITIALIZER, 0, 0, -1, 0};

static socklen_t server_address(struct sockaddr_un *sa, uint64_t pid, uint64_t nonce) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "hoop-vmm-%llu-%016llx",
                   (unsigned long long)pid, (unsigned long long)nonce);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Whether the other end of socket fd runs as this process's user (and is pid, when pid > 0). */
static int peer_is(int fd, pid_t pid) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid() &&
         (pid <= 0 || cred.pid == pid);
}

/* Close every descriptor an SCM_RIGHTS message brought, but the first if keep; that one, or -1. */
static int take_descriptors(struct msghdr *msg, int keep) {
  int first = -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (keep && first < 0)
        first = fd;
      else
        close(fd);
    }
  }
  return first;
}

/* Whether a piece with ask's identity belongs to an export of this process's cache made with ask's
 * token (the peers of the call that sent it know it; nobody else does). */
static int asked_for_export(const vmm_ask *ask) {
  int found = 0;
  pthread_mutex_lock(&exports_lock);
  for (int i = 0; i < nexports && !found; i++) {
    const hoop__cuda_export *e = &exports[i];
    if (e->kind != HOOP__CUDA_EXPORT_VMM || e->token[0] != ask->token[0] ||
        e->token[1] != ask->token[1])
      continue;
    for (int p = 0; p < pieces_of(e) && !found; p++)
      found = e->piece[p].start == ask->start && e->piece[p].handle == ask->handle &&
              e->piece[p].buffer_id == ask->buffer_id;
  }
  pthread_mutex_unlock(&exports_lock);
  return found;
}

/* The descriptor of the allocation an importer asks for, if this process exported it to that
 * importer's call and it is still the one mapped at its address here: >= 0, or -1 with why. */
static int serve_piece(const vmm_ask *ask, char *why, size_t whylen) {
  if (!asked_for_export(ask)) {
    snprintf(why, whylen, "no export of 0x%llx with that token here (freed, or forgotten)",
             (unsigned long long)ask->start);
    return -1;
  }
  CUcontext context = NULL;
  const void *at = (const void *)(uintptr_t)ask->start;
  if (kind_and_context(at, &context) != HOOP__MEM_DEVICE || !context ||
      drv.ctx_push(context) != CUDA_SUCCESS) {
    snprintf(why, whylen, "no device memory at 0x%llx any more", (unsigned long long)ask->start);
    return -1;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  uint64_t handle = 0;
  int fd = -1;
  if (drv.mem_get_address_range(&base, &size, (CUdeviceptr)ask->start) != CUDA_SUCCESS ||
      base != (CUdeviceptr)ask->start || buffer_id_at(base) != ask->buffer_id ||
      (vmm_export_piece(base, &fd, &handle, why, whylen) == 0 && handle != ask->handle)) {
    if (fd >= 0)
      close(fd);
    fd = -1;
    snprintf(why, whylen, "the allocation at 0x%llx was freed or replaced",
             (unsigned long long)ask->start);
  }
  CUcontext popped;
  drv.ctx_pop(&popped);
  return fd;
}

/* One importer's connection: its asks answered until it closes, errs or idles. */
static void *fd_server_conn(void *arg) {
  int conn = (int)(intptr_t)arg;
  struct timeval idle = {VMM_IDLE_SECONDS, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof idle);
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &idle, sizeof idle);
  vmm_ask ask;
  char control[CMSG_SPACE(sizeof(int) * 4)];
  struct iovec iov = {&ask, sizeof ask};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  for (;;) {
    msg.msg_control = control, msg.msg_controllen = sizeof control;
    ssize_t got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR)
      continue;
    take_descriptors(&msg, 0); /* an importer sends none */
    if (got != (ssize_t)sizeof ask || ask.magic != VMM_ASK_MAGIC)
      break;
    vmm_answer answer = {0};
    int fd = serve_piece(&ask, answer.why, sizeof answer.why);
    answer.status = fd >= 0 ? 0 : -1;
    int sent =
        hoop__send_with_fd(conn, &answer, sizeof answer, fd) == (ssize_t)sizeof answer ? 0 : -1;
    if (fd >= 0)
      close(fd);
    if (sent != 0)
      break;
  }
  close(conn);
  pthread_mutex_lock(&fd_server.lock);
  fd_server.conns--;
  pthread_mutex_unlock(&fd_server.lock);
  return NULL;
}

static void *fd_server_main(void *arg) {
  int listener = (int)(intptr_t)arg;
  for (;;) {
    int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        usleep(10000); /* out of descriptors or memory for a while: the importer waits */
        continue;
      }
      break;
    }
    pthread_mutex_lock(&fd_server.lock);
    int room = fd_server.conns < VMM_SERVER_CONNS && peer_is(conn, 0);
    pthread_t thread;
    if (room && pthread_create(&thread, NULL, fd_server_conn, (void *)(intptr_t)conn) == 0) {
      fd_server.conns++;
      pthread_detach(thread);
    } else {
      close(conn); /* another user's, or too many at once: the importer stages */
    }
    pthread_mutex_unlock(&fd_server.lock);
  }
  /* Whatever stopped it, the next export starts a server anew rather than name a dead one. */
  HOOP__WARN(HOOP_SUBSYS_COLL, "cuda: the VMM descriptor server stops: accept: %s",
             strerror(errno));
  pthread_mutex_lock(&fd_server.lock);
  if (fd_server.fd == listener && fd_server.pid == getpid())
    fd_server.fd = -1, fd_server.pid = 0;
  pthread_mutex_unlock(&fd_server.lock);
  close(listener);
  return NULL;
}

/* This process's descriptor server, started if need be: 0 with its nonce, or -1 with why. */
static int fd_server_start(uint64_t *nonce, char *why, size_t whylen) {
  pthread_mutex_lock(&fd_server.lock);
  int result = 0;
  if (fd_server.pid != getpid()) {
    if (fd_server.fd >= 0)
      close(fd_server.fd); /* a forked child's copy of its parent's */
    fd_server.fd = -1, fd_server.pid = 0, fd_server.conns = 0;
    uint64_t n = 0;
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const char *what = "socket";
    if (fd >= 0 && getrandom(&n, sizeof n, 0) != (ssize_t)sizeof n)
      what = "getrandom";
    else if (fd >= 0 &&
             bind(fd, (struct sockaddr *)&sa, server_address(&sa, (uint64_t)getpid(), n)) != 0)
      what = "bind";
    else if (fd >= 0 && listen(fd, 128) != 0)
      what = "listen";
    else if (fd >= 0)
      what = NULL;
    pthread_t thread;
    sigset_t all, old;
    sigfillset(&all);
    if (!what) {
      /* Its threads take none of the program's signals. */
      pthread_sigmask(SIG_SETMASK, &all, &old);
      int err = pthread_create(&thread, NULL, fd_server_main, (void *)(intptr_t)fd);
      pthread_sigmask(SIG_SETMASK, &old, NULL);
      if (err == 0)
        pthread_detach(thread);
      else
        what = "pthread_create", errno = err;
    }
    if (what) {
      snprintf(why, whylen, "cannot serve its VMM descriptors: %s: %s", what, strerror(errno));
      if (fd >= 0)
        close(fd);
      result = -1;
    } else {
      fd_server.fd = fd, fd_server.pid = getpid(), fd_server.nonce = n;
    }
  }
  *nonce = fd_server.nonce;
  pthread_mutex_unlock(&fd_server.lock);
  return result;
}

/* A connection to the descriptor server of export's process: >= 0, or -1 with why. */
static int fd_server_connect(const hoop__cuda_export *export, char *why, size_t whylen) {
  struct sockaddr_un sa;
  socklen_t len = server_address(&sa, export->pid, export->server);
  const char *what = NULL;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    what = strerror(errno);
  } else if (connect(fd, (struct sockaddr *)&sa, len) != 0 && errno != EINPROGRESS &&
             errno != EAGAIN && errno != EINTR) {
    what = strerror(errno);
  } else {
    /* A full backlog, or a signal: the connection goes on; wait for it, within a deadline. */
    int err = 0;
    socklen_t errlen = sizeof err;
    if (hoop__poll_one(fd, POLLOUT, hoop__now() + VMM_ANSWER_SECONDS) != 0)
      what = strerror(errno);
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) != 0 || err != 0)
      what = strerror(err ? err : errno);
    else if (!peer_is(fd, (pid_t) export->pid))
      what = "the socket is not that process's, or it is another user's";
    else
      return fd;
  }
  if (fd >= 0)
    close(fd);
  snprintf(why, whylen,
           "connecting to pid %llu's VMM descriptor server (an abstract Unix socket: ranks on one "
           "host must share a network namespace): %s",
           (unsigned long long)export->pid, what);
  return -1;
}

/* The descriptor of one piece, from the server at sock (non-blocking): >= 0, or -1 with why. */
static int fd_server_ask(int sock, const hoop__cuda_export *export,
                         const hoop__cuda_vmm_piece *piece, char *why, size_t whylen) {
  vmm_ask ask = {VMM_ASK_MAGIC,
                 {export->token[0], export->token[1]},
                 piece->start,
                 piece->handle,
                 piece->buffer_id};
  vmm_answer answer = {0};
  char control[CMSG_SPACE(sizeof(int) * 4)];
  struct iovec iov = {&answer, sizeof answer};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  double deadline = hoop__now() + VMM_ANSWER_SECONDS;
  ssize_t got = -1;
  for (;;) { /* asks are small: a SEQPACKET socket takes one whole or not at all */
    ssize_t sent = send(sock, &ask, sizeof ask, MSG_NOSIGNAL);
    if (sent == (ssize_t)sizeof ask)
      break;
    if ((sent >= 0 || (errno != EAGAIN && errno != EINTR)) ||
        hoop__poll_one(sock, POLLOUT, deadline) != 0)
      goto failed;
  }
  for (;;) {
    msg.msg_control = control, msg.msg_controllen = sizeof control;
    got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got >= 0 || (errno != EAGAIN && errno != EINTR) ||
        hoop__poll_one(sock, POLLIN, deadline) != 0)
      break;
  }
  if (got >= 0) {
    int fd = take_descriptors(&msg, 1);
    if (got == (ssize_t)sizeof answer && answer.status == 0 && fd >= 0 &&
        !(msg.msg_flags & MSG_CTRUNC))
      return fd;
    if (fd >= 0)
      close(fd);
    answer.why[sizeof answer.why - 1] = '\0';
    if (got == (ssize_t)sizeof answer && answer.status != 0) {
      snprintf(why, whylen, "pid %llu: %s", (unsigned long long)export->pid, answer.why);
      return -1;
    }
    errno = EPROTO;
  }
failed:
  snprintf(why, whylen, "no descriptor from pid %llu's VMM descriptor server: %s",
           (unsigned long long)export->pid,
           got == 0 ? "it closed the connection" : strerror(errno));
  return -1;
}

/* The VMM allocations that hold [ptr, ptr + len), mapped one after the other (cuMemGetAddressRange
 * gives each mapped region; the pointer attributes give the whole reserved range), each exported
 * (their context current): 0, or -1 with why. */
static int vmm_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                      size_t whylen) {
  memset(out, 0, sizeof *out);
  out->kind = HOOP__CUDA_EXPORT_VMM;
  out->pid = (uint64_t)getpid();
  if (getrandom(out->token, sizeof out->token, 0) != (ssize_t)sizeof out->token) {
    snprintf(why, whylen, "getrandom: %s", strerror(errno));
    return -1;
  }
  uint64_t end = (uint64_t)(uintptr_t)ptr + len, at = (uint64_t)(uintptr_t)ptr;
  do {
    if (out->npieces == HOOP__CUDA_VMM_PIECES) {
      snprintf(why, whylen, "the buffer lies across more than %d VMM allocations",
               HOOP__CUDA_VMM_PIECES);
      break;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult err = drv.mem_get_address_range(&base, &size, (CUdeviceptr)at);
    if (err != CUDA_SUCCESS || size == 0 || (out->npieces > 0 && base != (CUdeviceptr)at)) {
      snprintf(why, whylen, "%s",
               out->npieces ? "the buffer goes on past its VMM allocation into other memory"
                            : "cuMemGetAddressRange failed on it");
      break;
    }
    hoop__cuda_vmm_piece *piece = &out->piece[out->npieces];
    *piece = (hoop__cuda_vmm_piece){(uint64_t)base, (uint64_t)size, 0, 0};
    /* Exported once here, so that an allocation the driver will not export is staged before any
     * peer asks; the server exports it again for each importer. */
    int fd = -1;
    if (vmm_export_piece(base, &fd, &piece->handle, why, whylen) != 0)
      break;
    close(fd);
    piece->buffer_id = buffer_id_at(base);
    out->npieces++;
    at = (uint64_t)base + size;
  } while (at < end);
  if (out->npieces > 0 && at >= end) {
    out->base = out->piece[0].start;
    out->size = at - out->base;
    out->buffer_id = out->piece[0].buffer_id;
    return 0;
  }
  return -1;
}

/* Whether every piece of a cached VMM export is still the allocation mapped there. */
static int vmm_still_mapped(const hoop__cuda_export *export) {
  for (int i = 0; i < pieces_of(export); i++) {
    const hoop__cuda_vmm_piece *piece = &export->piece[i];
    CUdeviceptr base = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle;
    if (drv.mem_get_address_range(&base, &size, (CUdeviceptr)piece->start) != CUDA_SUCCESS ||
        base != (CUdeviceptr)piece->start || size != piece->size ||
        drv.mem_retain_allocation_handle(&handle, (void *)(uintptr_t)piece->start) != CUDA_SUCCESS)
      return 0;
    drv.mem_release(handle);
    if ((uint64_t)handle != piece->handle || buffer_id_at(base) != piece->buffer_id)
      return 0;
  }
  return 1;
}

int hoop__cuda_export_same(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  if (a->kind != b->kind || a->base != b->base || a->size != b->size ||
      a->buffer_id != b->buffer_id)
    return 0;
  if (a->kind != HOOP__CUDA_EXPORT_VMM)
    return memcmp(a->handle, b->handle, sizeof a->handle) == 0;
  if (a->npieces != b->npieces || pieces_of(a) != a->npieces)
    return 0;
  for (int i = 0; i < a->npieces; i++)
    if (a->piece[i].start != b->piece[i].start || a->piece[i].size != b->piece[i].size ||
        a->piece[i].buffer_id != b->piece[i].buffer_id || a->piece[i].handle != b->piece[i].handle)
      return 0;
  return 1;
}

int hoop__cuda_export_conflict(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  if (a->base >= b->base + b->size || b->base >= a->base + a->size || hoop__cuda_export_same(a, b))
    return 0;
  if (a->kind != HOOP__CUDA_EXPORT_VMM || b->kind != HOOP__CUDA_EXPORT_VMM)
    return 1; /* live allocations never overlap */
  /* Two spans of VMM pieces may overlap and both be right; not if a piece changed. */
  for (int i = 0; i < pieces_of(a); i++)
    for (int j = 0; j < pieces_of(b); j++) {
      const hoop__cuda_vmm_piece *p = &a->piece[i], *q = &b->piece[j];
      if (p->start < q->start + q->size && q->start < p->start + p->size &&
          (p->start != q->start || p->size != q->size || p->buffer_id != q->buffer_id ||
           p->handle != q->handle))
        return 1;
    }
  return 0;
}

/* Unmap the first n pieces of a VMM export mapped at base, and free the range. */
static void vmm_unmap(CUdeviceptr base, const hoop__cuda_export *export, int n) {
  for (int i = 0; i < n; i++)
    drv.mem_unmap(base + (export->piece[i].start - export->base), export->piece[i].size);
  drv.mem_address_free(base, export->size);
}

/* Map one piece of a peer's VMM export at va (the current context's, on device ordinal) from its
 * descriptor fd (closed): 0, or -1 with why. */
static int vmm_map_piece(const hoop__cuda_vmm_piece *piece, int fd, CUdeviceptr va, int ordinal,
                         char *why, size_t whylen) {
  CUmemGenericAllocationHandle handle;
  CUresult err =
      drv.mem_import(&handle, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd);
  if (err != CUDA_SUCCESS) {
    say_why(why, whylen, "cuMemImportFromShareableHandle", err);
    return -1;
  }
  const char *what = "cuMemMap";
  if ((err = drv.mem_map(va, piece->size, 0, handle, 0)) == CUDA_SUCCESS) {
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, ordinal},
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    what = "cuMemSetAccess";
    if ((err = drv.mem_set_access(va, piece->size, &access, 1)) != CUDA_SUCCESS)
      drv.mem_unmap(va, piece->size);
  }
  drv.mem_release(handle); /* the mapping holds the allocation from here */
  if (err != CUDA_SUCCESS) {
    say_why(why, whylen, what, err);
    return -1;
  }
  return 0;
}

/* Map a peer's VMM export into the current context (that of near), its pieces one after the
 * other as in the exporter: 0, or -1 with why. */
static int vmm_open(const void *near, const hoop__cuda_export *export, CUdeviceptr *mapped,
                    char *why, size_t whylen) {
  if (!vmm_calls()) {
    snprintf(why, whylen, "the driver has no virtual memory management calls");
    return -1;
  }
  int ordinal = -1;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (drv.pointer_get_attributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)near) != CUDA_SUCCESS ||
      ordinal < 0) {
    snprintf(why, whylen, "the device of %p is unknown", near);
    return -1;
  }
  if (export->npieces < 1 || export->npieces > HOOP__CUDA_VMM_PIECES) {
    snprintf(why, whylen, "a VMM export of %d pieces", export->npieces);
    return -1;
  }
  /* Aligned as the exporter's pieces are to one another: each starts at a multiple of the
   * granularity from the first, whose own alignment is at least the largest power of two that
   * divides its address there. */
  uint64_t align = export->base & (~export->base + 1);
  if (align > ((uint64_t)1 << 30))
    align = (uint64_t)1 << 30;
  /* Every descriptor first, so that the exporter's server is not held while this maps. */
  int fds[HOOP__CUDA_VMM_PIECES], got = 0;
  int sock = fd_server_connect(export, why, whylen);
  if (sock < 0)
    return -1;
  while (got < export->npieces &&
         (fds[got] = fd_server_ask(sock, export, &export->piece[got], why, whylen)) >= 0)
    got++;
  close(sock);
  int failed = got < export->npieces;
  CUresult err = CUDA_SUCCESS;
  if (!failed &&
      (err = drv.mem_address_reserve(mapped, export->size, (size_t)align, 0, 0)) != CUDA_SUCCESS) {
    say_why(why, whylen, "cuMemAddressReserve", err);
    failed = 1;
  }
  int i = 0;
  for (; !failed && i < export->npieces; i++)
    if (vmm_map_piece(&export->piece[i], fds[i], *mapped + (export->piece[i].start - export->base),
                      ordinal, why, whylen) != 0) {
      vmm_unmap(*mapped, export, i);
      failed = 1;
      i++; /* that one's descriptor is closed */
    }
  for (; i < got; i++)
    close(fds[i]);
  return failed ? -1 : 0;
}

/* Keep out in the export cache. */
static void remember(const hoop__cuda_export *out) {
  pthread_mutex_lock(&exports_lock);
  exports[next_export] = *out;
  next_export = (next_export + 1) % MAX_EXPORTS;
  if (nexports < MAX_EXPORTS)
    nexports++;
  pthread_mutex_unlock(&exports_lock);
}

/* A cached VMM export that covers [ptr, end) and is still what is mapped there (0), or -1. An
 * entry whose pieces changed is dropped. */
static int vmm_cached(const void *ptr, uint64_t end, hoop__cuda_export *out) {
  uint64_t at = (uint64_t)(uintptr_t)ptr;
  int found = -1;
  pthread_mutex_lock(&exports_lock);
  for (int i = 0; i < nexports && found < 0; i++) {
    hoop__cuda_export *e = &exports[i];
    if (e->kind != HOOP__CUDA_EXPORT_VMM || e->npieces == 0 || at < e->base ||
        end > e->base + e->size)
      continue;
    if (vmm_still_mapped(e)) {
      *out = *e;
      found = i;
    } else {
      e->npieces = 0;
    }
  }
  pthread_mutex_unlock(&exports_lock);
  if (found < 0)
    return -1;
  out->offset = at - out->base;
  return 0;
}

int hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                          size_t whylen) {
  if (!hoop__cuda_loaded() || !drv.ipc_get_mem_handle || !drv.ipc_open_mem_handle ||
      !drv.ipc_close_mem_handle || !drv.memcpy_async) {
    snprintf(why, whylen, "the driver has no CUDA IPC (cuIpcGetMemHandle) or cuMemcpyAsync");
    return -1;
  }
  CUmemorytype type = (CUmemorytype)0;
  unsigned int managed = 0, legacy = 0;
  unsigned long long id = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_BUFFER_ID,   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE,  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void *data[] = {&type, &managed, &id, &start, &size, &legacy};
  CUresult err = drv.pointer_get_attributes(6, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
  CUcontext context = NULL;
  if (err != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE || managed || !start ||
      kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context) {
    snprintf(why, whylen, "%p is not device memory the driver can describe (%d)", ptr, (int)err);
    return -1;
  }
  uint64_t end = (uint64_t)(uintptr_t)ptr + len;
  /* A legacy export of this allocation, cached (also where the pointer query said it could not
   * have one); or a refusal of these very bytes (buffer ids are never reused): at once. */
  pthread_mutex_lock(&exports_lock);
  for (int i = 0; i < nexports; i++)
    if (exports[i].kind == HOOP__CUDA_EXPORT_LEGACY && exports[i].buffer_id == id &&
        exports[i].base == (uint64_t)start) {
      *out = exports[i];
      pthread_mutex_unlock(&exports_lock);
      out->offset = (uint64_t)((uintptr_t)ptr - (uintptr_t)start);
      return 0;
    }
  for (int i = 0; i < MAX_REFUSED; i++)
    if (refused[i].id == id && refused[i].ptr == (uintptr_t)ptr && refused[i].len == len &&
        refused[i].id) {
      snprintf(why, whylen, "%s", refused[i].why);
      pthread_mutex_unlock(&exports_lock);
      return -1;
    }
  pthread_mutex_unlock(&exports_lock);
  char vmm_why[200] = "";
  if (!legacy) {
    /* The virtual memory management API's memory: its allocations' file descriptors. The cache's
     * check asks cuMemGetAddressRange, which wants a current context too. */
    int failed = 1, cached = 0;
    uint64_t server = 0;
    if (!vmm_calls())
      snprintf(vmm_why, sizeof vmm_why, "the driver has no virtual memory management calls");
    else if ((err = drv.ctx_push(context)) != CUDA_SUCCESS)
      say_why(vmm_why, sizeof vmm_why, "cuCtxPushCurrent", err);
    else {
      cached = vmm_cached(ptr, end, out) == 0;
      failed = cached ? 0 : vmm_export(ptr, len, out, vmm_why, sizeof vmm_why);
      CUcontext popped;
      drv.ctx_pop(&popped);
    }
    if ((cached || !failed) && fd_server_start(&server, vmm_why, sizeof vmm_why) == 0) {
      if (!cached)
        remember(out);
      /* This process's server (a forked child has its own), whether the entry was cached or not. */
      out->pid = (uint64_t)getpid(), out->server = server;
      out->offset = (uint64_t)((uintptr_t)ptr) - out->base;
      return 0;
    }
    /* Not VMM memory that can go as descriptors: a legacy handle after all, as drivers have been
     * known to say 0 for cudaMalloc's memory (UCX works around it); for stream-ordered memory
     * (cudaMallocAsync) the driver refuses it too, and both reasons are told. */
  }
  CUipcMemHandle handle;
  if ((err = drv.ctx_push(context)) == CUDA_SUCCESS) {
    err = drv.ipc_get_mem_handle(&handle, start);
    CUcontext popped;
    drv.ctx_pop(&popped);
  }
  if (err != CUDA_SUCCESS) {
    if (legacy)
      say_why(why, whylen, "cuIpcGetMemHandle", err);
    else
      snprintf(why, whylen,
               "not memory of cudaMalloc (no legacy IPC handle: %s (%d)); as VMM memory: %s",
               error_text(err), (int)err, vmm_why);
    pthread_mutex_lock(&exports_lock);
    refused[next_refused] = (struct refusal){id, (uintptr_t)ptr, len, ""};
    snprintf(refused[next_refused].why, sizeof refused[next_refused].why, "%s", why);
    next_refused = (next_refused + 1) % MAX_REFUSED;
    pthread_mutex_unlock(&exports_lock);
    return -1;
  }
  memset(out, 0, sizeof *out);
  memcpy(out->handle, handle.reserved, sizeof out->handle);
  out->kind = HOOP__CUDA_EXPORT_LEGACY;
  out->base = (uint64_t)start;
  out->size = (uint64_t)size;
  out->buffer_id = id;
  remember(out);
  out->offset = (uint64_t)((uintptr_t)ptr - (uintptr_t)start);
  return 0;
}

int hoop__cuda_ipc_open(const void *near, const hoop__cuda_export *export, void **base, char *why,
                        size_t whylen) {
  if (push_context_of(near, why, whylen) != 0)
    return -1;
  CUdeviceptr mapped = 0;
  CUcontext popped;
  if (export->kind == HOOP__CUDA_EXPORT_VMM) {
    int failed = vmm_open(near, export, &mapped, why, whylen);
    drv.ctx_pop(&popped);
    if (failed)
      return -1;
    *base = (void *)(uintptr_t)mapped;
    return 0;
  }
  CUipcMemHandle handle;
  memcpy(handle.reserved, export->handle, sizeof handle.reserved);
  CUresult err = drv.ipc_open_mem_handle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS) {
    say_why(why, whylen, "cuIpcOpenMemHandle", err);
    return -1;
  }
  *base = (void *)(uintptr_t)mapped;
  return 0;
}

void *hoop__cuda_context_of(const void *ptr) {
  CUcontext context = NULL;
  return kind_and_context(ptr, &context) == HOOP__MEM_DEVICE ? (void *)context : NULL;
}

void hoop__cuda_ipc_close(void *context, void *base, const hoop__cuda_export *export) {
  if (!base || !context || !drv.ipc_close_mem_handle ||
      drv.ctx_push((CUcontext)context) != CUDA_SUCCESS)
    return;
  if (export->kind == HOOP__CUDA_EXPORT_VMM) {
    vmm_unmap((CUdeviceptr)(uintptr_t)base, export, export->npieces);
  } else {
    drv.ipc_close_mem_handle((CUdeviceptr)(uintptr_t)base);
  }
  CUcontext popped;
  drv.ctx_pop(&popped);
}

#endif /* HOOP_HAVE_CUDA */
