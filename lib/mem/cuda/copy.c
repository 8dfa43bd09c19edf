/* copy.c - synchronous copies between host and device memory, page-locked host memory to stage
 * through, and waiting for a caller's stream (see cuda.h).
 */
#include "config.h"

#include <stdlib.h>

#include "mem/cuda.h"

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

#ifdef HOOP_HAVE_CUDA

#include <stdint.h>
#include <string.h>

#include "core/env.h"
#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda/driver.h"

hoop_result hoop__cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0)
    return HOOP_OK;
  CUcontext context = NULL, dst_context = NULL;
  /* Managed memory counts as the device's here: the driver copies into it as into device memory
   * (and the CPU may read it next). */
  int to_device = hoop__cuda_kind_and_context(dst, &dst_context) != HOOP__MEM_HOST;
  if (hoop__cuda_kind_and_context(src, &context) != HOOP__MEM_DEVICE || !context)
    context = dst_context;
  if (!context)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: cuda: neither %p nor %p is device memory of a live context",
                           comm->call ? comm->call : "hoop", dst, src);
  CUresult err = hoop__cuda_drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return hoop__cuda_driver_error(comm, "cuCtxPushCurrent", err);
  /* Unified addressing: the driver tells host from device by the addresses. cuMemcpy runs on the
   * legacy default stream and returns once the data is in host memory, or once it left page-locked
   * host memory; but device to device, or from pageable host memory, it may return before the
   * bytes are in device memory (the driver's "API synchronization behavior"). Whoever reads them
   * next may be another stream or another process: wait for them. */
  const char *what = "cuMemcpy";
  err = hoop__cuda_drv.memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes);
  if (err == CUDA_SUCCESS && to_device) {
    /* An event after the copy, not the whole stream: work other threads queue there after it is
     * not waited for. */
    CUevent copied = NULL;
    if (hoop__cuda_drv.event_create && hoop__cuda_drv.event_record &&
        hoop__cuda_drv.event_synchronize && hoop__cuda_drv.event_destroy &&
        hoop__cuda_drv.event_create(&copied, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) {
      what = "cuEventRecord (after cuMemcpy)";
      if ((err = hoop__cuda_drv.event_record(copied, NULL)) == CUDA_SUCCESS) {
        what = "cuEventSynchronize (after cuMemcpy)";
        err = hoop__cuda_drv.event_synchronize(copied);
      }
      hoop__cuda_drv.event_destroy(copied);
    } else {
      what = "cuStreamSynchronize (after cuMemcpy)";
      err = hoop__cuda_drv.stream_synchronize(NULL);
    }
  }
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, what, err);
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
  if (!hoop__cuda_drv.mem_host_alloc || !hoop__cuda_drv.mem_free_host ||
      hoop__cuda_kind_and_context(near, &context) != HOOP__MEM_DEVICE || !context)
    return NULL;
  void *ptr = NULL;
  if (hoop__cuda_drv.ctx_push(context) != CUDA_SUCCESS)
    return NULL;
  CUresult err = hoop__cuda_drv.mem_host_alloc(&ptr, bytes, CU_MEMHOSTALLOC_PORTABLE);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS) {
    HOOP__INFO(HOOP_SUBSYS_COLL,
               "cuda: cannot page-lock %zu bytes to stage through (%d); "
               "staging through ordinary memory",
               bytes, (int)err);
    return NULL;
  }
  hoop__cuda_drv.host_context = context;
  return ptr;
}

void hoop__cuda_host_free(void *ptr) {
  if (!ptr || !hoop__cuda_drv.mem_free_host)
    return;
  if (hoop__cuda_drv.host_context &&
      hoop__cuda_drv.ctx_push(hoop__cuda_drv.host_context) == CUDA_SUCCESS) {
    hoop__cuda_drv.mem_free_host(ptr);
    CUcontext popped;
    hoop__cuda_drv.ctx_pop(&popped);
  } else {
    hoop__cuda_drv.mem_free_host(ptr);
  }
}

hoop_result hoop__cuda_stream_wait(hoop_comm *comm, const char *call, void *stream,
                                   const void *buf) {
  if (!hoop__cuda_loaded())
    return stream ? hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                                    "%s: a CUDA stream, but no CUDA driver loads (%s)", call,
                                    hoop__env_get("HOOP_CUDA_LIBRARY"))
                  : HOOP_OK;
  if (!hoop__cuda_drv.stream_synchronize)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "%s: the driver has no cuStreamSynchronize",
                           call);
  CUcontext context = NULL;
  if (stream && hoop__cuda_drv.stream_get_ctx)
    hoop__cuda_drv.stream_get_ctx((CUstream)stream, &context);
  if (!context)
    hoop__cuda_kind_and_context(buf, &context);
  if (!context) {
    if (!stream)
      return HOOP_OK; /* host buffers on the default stream: nothing queued to wait for */
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: cannot tell the context of stream %p",
                           call, stream);
  }
  CUresult err = hoop__cuda_drv.ctx_push(context);
  if (err != CUDA_SUCCESS)
    return hoop__cuda_driver_error(comm, "cuCtxPushCurrent", err);
  err = hoop__cuda_drv.stream_synchronize((CUstream)stream);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, "cuStreamSynchronize", err);
}

#endif /* HOOP_HAVE_CUDA */
