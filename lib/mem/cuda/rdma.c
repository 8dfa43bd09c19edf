/* rdma.c - what GPUDirect RDMA (mem/gdr.c) asks of the driver: whether the device exports
 * dma-bufs, a dma-buf of device memory, and whether and how to flush what the RDMA device wrote.
 */
#include "config.h"

#ifdef HOOP_HAVE_CUDA

#include <stdint.h>
#include <stdio.h>

#include "core/internal.h"
#include "mem/cuda/driver.h"

/* An attribute of the device that holds ptr: 0, or -1 when the driver cannot say. */
static int device_attribute(const void *ptr, CUdevice_attribute which, int *value) {
  int ordinal = -1;
  CUdevice device;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (!hoop__cuda_loaded() || !hoop__cuda_drv.device_get || !hoop__cuda_drv.device_get_attribute ||
      hoop__cuda_drv.pointer_get_attributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)ptr) !=
          CUDA_SUCCESS ||
      ordinal < 0 || hoop__cuda_drv.device_get(&device, ordinal) != CUDA_SUCCESS ||
      hoop__cuda_drv.device_get_attribute(value, which, device) != CUDA_SUCCESS)
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
  if (hoop__cuda_drv.flush_rdma_writes &&
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
  if (hoop__cuda_push_context_of(near, why, sizeof why) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cuda: %s", comm->call ? comm->call : "hoop",
                           why);
  CUresult err = hoop__cuda_drv.flush_rdma_writes(
      CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX, CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  return err == CUDA_SUCCESS ? HOOP_OK
                             : hoop__cuda_driver_error(comm, "cuFlushGPUDirectRDMAWrites", err);
}

int hoop__cuda_dmabuf_fd(const void *base, size_t len, int *fd, char *why, size_t whylen) {
  if (!hoop__cuda_drv.get_handle_for_range) {
    snprintf(why, whylen, "the driver has no cuMemGetHandleForAddressRange");
    return -1;
  }
  if (hoop__cuda_push_context_of(base, why, whylen) != 0)
    return -1;
  CUresult err = hoop__cuda_drv.get_handle_for_range(fd, (CUdeviceptr)(uintptr_t)base, len,
                                                     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, "cuMemGetHandleForAddressRange", err);
    return -1;
  }
  return 0;
}

#endif /* HOOP_HAVE_CUDA */
