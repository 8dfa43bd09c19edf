/* driver.h - private to lib/mem/cuda/: the CUDA driver's entry points, resolved at run time by
 * driver.c, and what the files here share: a pointer's kind and context, the driver's words for an
 * error. Only for a build with CUDA (HOOP_HAVE_CUDA): it needs the toolkit's cuda.h.
 *
 * Every driver call runs in the context of the device memory it touches (pushed for the call and
 * popped after), since the thread that runs a collective, the caller's or hoop's progress thread,
 * may have none current.
 */
#ifndef HOOP__MEM_CUDA_DRIVER_H
#define HOOP__MEM_CUDA_DRIVER_H

#include <cuda.h>
#include <stddef.h>

#include "hoop.h"
#include "mem/cuda.h"

/* The driver, loaded by hoop__cuda_loaded's first call: usable once the calls every device buffer
 * needs are there. */
struct hoop__cuda_driver {
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
};
extern struct hoop__cuda_driver hoop__cuda_drv;

/* The kind of ptr and, for device memory, its context. */
hoop__mem_kind hoop__cuda_kind_and_context(const void *ptr, CUcontext *context);
/* Make the context of the device memory at ptr current (pop it after): 0, or -1 with why. */
int hoop__cuda_push_context_of(const void *ptr, char *why, size_t whylen);

/* The driver's words for err. */
const char *hoop__cuda_error_text(CUresult err);
/* "what: the driver's words (err)" into why, for the callers that explain rather than fail. */
void hoop__cuda_say_why(char *why, size_t whylen, const char *what, CUresult err);
/* HOOP_ERR_SYSTEM, with the call, what failed and the driver's words recorded on comm. */
hoop_result hoop__cuda_driver_error(hoop_comm *comm, const char *what, CUresult err);

#endif /* HOOP__MEM_CUDA_DRIVER_H */
