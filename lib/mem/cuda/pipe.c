/* pipe.c - copies that overlap a collective (mem/stage.c's pipelined ring): a stream of hoop's own
 * in the context of a device buffer, and events recorded after copies on it (see cuda.h).
 */
#include "config.h"

#ifdef HOOP_HAVE_CUDA

#include <stdint.h>
#include <stdlib.h>

#include "core/internal.h"
#include "core/log.h"
#include "mem/cuda/driver.h"
#include "mem/state.h"

struct hoop__cuda_pipe {
  CUcontext context;
  CUstream stream;
  CUevent *events;
  int nevents;
};

void hoop__cuda_pipe_free(hoop_comm *comm) {
  hoop__cuda_pipe *pipe = comm->mem_state->cuda_pipe;
  if (!pipe)
    return;
  comm->mem_state->cuda_pipe = NULL;
  if (hoop__cuda_drv.ctx_push(pipe->context) == CUDA_SUCCESS) {
    for (int i = 0; i < pipe->nevents; i++)
      hoop__cuda_drv.event_destroy(pipe->events[i]);
    if (pipe->stream)
      hoop__cuda_drv.stream_destroy(pipe->stream);
    CUcontext popped;
    hoop__cuda_drv.ctx_pop(&popped);
  }
  free(pipe->events);
  free(pipe);
}

hoop__cuda_pipe *hoop__cuda_pipe_get(hoop_comm *comm, const void *ptr, int nevents) {
  CUcontext context = NULL;
  if (!hoop__cuda_drv.memcpy_async || !hoop__cuda_drv.event_create ||
      !hoop__cuda_drv.event_destroy || !hoop__cuda_drv.event_record ||
      !hoop__cuda_drv.event_synchronize || !hoop__cuda_drv.stream_destroy ||
      !hoop__cuda_drv.stream_create || !hoop__cuda_drv.stream_synchronize ||
      hoop__cuda_kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context)
    return NULL;
  hoop__cuda_pipe *pipe = comm->mem_state->cuda_pipe;
  if (pipe && pipe->context != context)
    hoop__cuda_pipe_free(comm);
  if (!(pipe = comm->mem_state->cuda_pipe)) {
    if (!(pipe = calloc(1, sizeof *pipe)))
      return NULL;
    pipe->context = context;
    comm->mem_state->cuda_pipe = pipe;
  }
  if (hoop__cuda_drv.ctx_push(context) != CUDA_SUCCESS)
    return NULL;
  CUresult err = CUDA_SUCCESS;
  if (!pipe->stream)
    err = hoop__cuda_drv.stream_create(&pipe->stream, CU_STREAM_NON_BLOCKING);
  if (err == CUDA_SUCCESS && pipe->nevents < nevents) {
    CUevent *grown = realloc(pipe->events, (size_t)nevents * sizeof *grown);
    if (grown) {
      pipe->events = grown;
      while (pipe->nevents < nevents &&
             (err = hoop__cuda_drv.event_create(&pipe->events[pipe->nevents],
                                                CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS)
        pipe->nevents++;
    } else {
      err = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS || pipe->nevents < nevents) {
    HOOP__INFO(HOOP_SUBSYS_COLL, "cuda: no stream or events to overlap copies (%d); staging whole",
               (int)err);
    return NULL;
  }
  return pipe;
}

hoop_result hoop__cuda_pipe_copy(hoop_comm *comm, hoop__cuda_pipe *pipe, void *dst, const void *src,
                                 size_t bytes, int event) {
  CUresult err = hoop__cuda_drv.ctx_push(pipe->context);
  if (err != CUDA_SUCCESS)
    return hoop__cuda_driver_error(comm, "cuCtxPushCurrent", err);
  if (bytes)
    err = hoop__cuda_drv.memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                      bytes, pipe->stream);
  const char *what = "cuMemcpyAsync";
  if (err == CUDA_SUCCESS && event >= 0) {
    what = "cuEventRecord";
    err = hoop__cuda_drv.event_record(pipe->events[event], pipe->stream);
  }
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, what, err);
}

hoop_result hoop__cuda_pipe_wait(hoop_comm *comm, hoop__cuda_pipe *pipe, int event) {
  CUresult err = hoop__cuda_drv.ctx_push(pipe->context);
  if (err != CUDA_SUCCESS)
    return hoop__cuda_driver_error(comm, "cuCtxPushCurrent", err);
  err = hoop__cuda_drv.event_synchronize(pipe->events[event]);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, "cuEventSynchronize", err);
}

hoop_result hoop__cuda_pipe_drain(hoop_comm *comm, hoop__cuda_pipe *pipe) {
  CUresult err = hoop__cuda_drv.ctx_push(pipe->context);
  if (err != CUDA_SUCCESS)
    return hoop__cuda_driver_error(comm, "cuCtxPushCurrent", err);
  err = hoop__cuda_drv.stream_synchronize(pipe->stream);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK : hoop__cuda_driver_error(comm, "cuStreamSynchronize", err);
}

#endif /* HOOP_HAVE_CUDA */
