/* vmm.c - the virtual memory management API's memory (cuMemCreate and cuMemMap: PyTorch's
 * expandable segments, for one) across processes: its allocations exported as file descriptors,
 * and a peer's mapped here piece after piece from the descriptors its server gives (see vmm.h).
 */
#include "config.h"

#ifdef HOOP_HAVE_CUDA

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "mem/cuda/vmm.h"

int hoop__cuda_vmm_calls(void) {
  return hoop__cuda_drv.mem_retain_allocation_handle &&
         hoop__cuda_drv.mem_get_allocation_properties && hoop__cuda_drv.mem_export &&
         hoop__cuda_drv.mem_import && hoop__cuda_drv.mem_release &&
         hoop__cuda_drv.mem_address_reserve && hoop__cuda_drv.mem_address_free &&
         hoop__cuda_drv.mem_map && hoop__cuda_drv.mem_unmap && hoop__cuda_drv.mem_set_access &&
         hoop__cuda_drv.mem_get_address_range;
}

int hoop__cuda_vmm_export_piece(CUdeviceptr start, int *fd, uint64_t *id, char *why,
                                size_t whylen) {
  *fd = -1;
  if (!hoop__cuda_vmm_calls()) {
    snprintf(why, whylen, "the driver has no virtual memory management calls");
    return -1;
  }
  CUmemGenericAllocationHandle handle;
  CUresult err = hoop__cuda_drv.mem_retain_allocation_handle(&handle, (void *)(uintptr_t)start);
  if (err != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, "cuMemRetainAllocationHandle", err);
    return -1;
  }
  CUmemAllocationProp prop;
  *id = (uint64_t)handle; /* the handle mapped there: the allocation's identity */
  if ((err = hoop__cuda_drv.mem_get_allocation_properties(&prop, handle)) != CUDA_SUCCESS)
    hoop__cuda_say_why(why, whylen, "cuMemGetAllocationPropertiesFromHandle", err);
  else if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    snprintf(why, whylen,
             "its allocation (cuMemCreate) was not made exportable as a file descriptor "
             "(requestedHandleTypes lacks CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
  else if ((err = hoop__cuda_drv.mem_export(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                            0)) != CUDA_SUCCESS)
    hoop__cuda_say_why(why, whylen, "cuMemExportToShareableHandle", err);
  hoop__cuda_drv.mem_release(handle);
  return *fd >= 0 ? 0 : -1;
}

uint64_t hoop__cuda_buffer_id_at(CUdeviceptr ptr) {
  unsigned long long id = 0;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_BUFFER_ID;
  void *data = &id;
  if (hoop__cuda_drv.pointer_get_attributes(1, &attr, &data, ptr) != CUDA_SUCCESS)
    return 0;
  return id;
}

int hoop__cuda_vmm_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
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
    CUresult err = hoop__cuda_drv.mem_get_address_range(&base, &size, (CUdeviceptr)at);
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
    if (hoop__cuda_vmm_export_piece(base, &fd, &piece->handle, why, whylen) != 0)
      break;
    close(fd);
    piece->buffer_id = hoop__cuda_buffer_id_at(base);
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

int hoop__cuda_vmm_still_mapped(const hoop__cuda_export *export) {
  for (int i = 0; i < hoop__cuda_pieces_of(export); i++) {
    const hoop__cuda_vmm_piece *piece = &export->piece[i];
    CUdeviceptr base = 0;
    size_t size = 0;
    CUmemGenericAllocationHandle handle;
    if (hoop__cuda_drv.mem_get_address_range(&base, &size, (CUdeviceptr)piece->start) !=
            CUDA_SUCCESS ||
        base != (CUdeviceptr)piece->start || size != piece->size ||
        hoop__cuda_drv.mem_retain_allocation_handle(&handle, (void *)(uintptr_t)piece->start) !=
            CUDA_SUCCESS)
      return 0;
    hoop__cuda_drv.mem_release(handle);
    if ((uint64_t)handle != piece->handle || hoop__cuda_buffer_id_at(base) != piece->buffer_id)
      return 0;
  }
  return 1;
}

void hoop__cuda_vmm_unmap(CUdeviceptr base, const hoop__cuda_export *export, int n) {
  for (int i = 0; i < n; i++)
    hoop__cuda_drv.mem_unmap(base + (export->piece[i].start - export->base), export->piece[i].size);
  hoop__cuda_drv.mem_address_free(base, export->size);
}

/* Map one piece of a peer's VMM export at va (the current context's, on device ordinal) from its
 * descriptor fd (closed): 0, or -1 with why. */
static int vmm_map_piece(const hoop__cuda_vmm_piece *piece, int fd, CUdeviceptr va, int ordinal,
                         char *why, size_t whylen) {
  CUmemGenericAllocationHandle handle;
  CUresult err = hoop__cuda_drv.mem_import(&handle, (void *)(uintptr_t)fd,
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd);
  if (err != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, "cuMemImportFromShareableHandle", err);
    return -1;
  }
  const char *what = "cuMemMap";
  if ((err = hoop__cuda_drv.mem_map(va, piece->size, 0, handle, 0)) == CUDA_SUCCESS) {
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, ordinal},
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    what = "cuMemSetAccess";
    if ((err = hoop__cuda_drv.mem_set_access(va, piece->size, &access, 1)) != CUDA_SUCCESS)
      hoop__cuda_drv.mem_unmap(va, piece->size);
  }
  hoop__cuda_drv.mem_release(handle); /* the mapping holds the allocation from here */
  if (err != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, what, err);
    return -1;
  }
  return 0;
}

int hoop__cuda_vmm_open(const void *near, const hoop__cuda_export *export, CUdeviceptr *mapped,
                        char *why, size_t whylen) {
  if (!hoop__cuda_vmm_calls()) {
    snprintf(why, whylen, "the driver has no virtual memory management calls");
    return -1;
  }
  int ordinal = -1;
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void *data = &ordinal;
  if (hoop__cuda_drv.pointer_get_attributes(1, &attr, &data, (CUdeviceptr)(uintptr_t)near) !=
          CUDA_SUCCESS ||
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
  int sock = hoop__cuda_fd_server_connect(export, why, whylen);
  if (sock < 0)
    return -1;
  while (got < export->npieces &&
         (fds[got] = hoop__cuda_fd_server_ask(sock, export, &export->piece[got], why, whylen)) >= 0)
    got++;
  close(sock);
  int failed = got < export->npieces;
  CUresult err = CUDA_SUCCESS;
  if (!failed && (err = hoop__cuda_drv.mem_address_reserve(mapped, export->size, (size_t)align, 0,
                                                           0)) != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, "cuMemAddressReserve", err);
    failed = 1;
  }
  int i = 0;
  for (; !failed && i < export->npieces; i++)
    if (vmm_map_piece(&export->piece[i], fds[i], *mapped + (export->piece[i].start - export->base),
                      ordinal, why, whylen) != 0) {
      hoop__cuda_vmm_unmap(*mapped, export, i);
      failed = 1;
      i++; /* that one's descriptor is closed */
    }
  for (; i < got; i++)
    close(fds[i]);
  return failed ? -1 : 0;
}

#endif /* HOOP_HAVE_CUDA */
