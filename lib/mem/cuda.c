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
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "core/env.h"
#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda.h"

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
  drv.usable = 1;
  HOOP__TRACE(HOOP_SUBSYS_INIT, "cuda: driver %s loaded: device buffers are detected", path);
}

int hoop__cuda_loaded(void) {
  pthread_once(&load_once, load);
  return drv.usable;
}

/* The kind of ptr and, for device memory, its context. */
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
  return type == CU_MEMORYTYPE_DEVICE ? HOOP__MEM_DEVICE : HOOP__MEM_HOST;
}

hoop__mem_kind hoop__mem_kind_of(const void *ptr) {
  CUcontext context;
  return kind_and_context(ptr, &context);
}

static hoop_result driver_error(hoop_comm *comm, const char *what, CUresult err) {
  const char *text = NULL;
  if (drv.get_error_string(err, &text) != CUDA_SUCCESS || !text)
    text = "unknown error";
  return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cuda: %s failed: %s (%d)",
                         comm->call ? comm->call : "hoop", what, text, (int)err);
}

hoop_result hoop__cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return HOOP_OK;
  CUcontext context = NULL;
  if (kind_and_context(src, &context) != HOOP__MEM_DEVICE || !context)
    kind_and_context(dst, &context);
  if (!context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: cuda: neither %p nor %p is device memory of a live context",
                           comm->call ? comm->call : "hoop", dst, src);
  CUresult err = drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return driver_error(comm, "cuCtxPushCurrent", err);
  /* Unified addressing: the driver tells host from device by the addresses. cuMemcpy returns once
   * the data is in dst. */
  err = drv.memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes);
  CUcontext popped;
  drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : driver_error(comm, "cuMemcpy", err);
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

#endif /* HOOP_HAVE_CUDA */
