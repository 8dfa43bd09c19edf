/* vmm.c - the stand-in driver's virtual memory management API (see fakecuda.h): cuMemCreate and
 * kin. A physical allocation is a memfd; a reserved address range is PROT_NONE, with a shadow range
 * of its size where the mappings' bytes are; a mapping is an allocation of its own, as the real
 * driver's pointer queries see it; export and import pass the memfd as a file descriptor. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda.h"

/* The virtual memory management API's physical allocations (cuMemCreate, or imported from a file
 * descriptor): a memfd each, a CUmemGenericAllocationHandle being the index + 1. */
#define MAX_PHYS 1024
#define VMM_GRANULARITY (2u << 20)
typedef struct phys_alloc {
  int fd; /* -1: free */
  size_t bytes;
  int refs; /* the handle's own, and one per mapping */
  CUmemAllocationHandleType types;
} phys_alloc;
static phys_alloc phys[MAX_PHYS];
/* cuMemAddressReserve's ranges (see fakecuda.h). */
struct reserve reserves[MAX_RESERVES];

static phys_alloc *phys_of(CUmemGenericAllocationHandle handle) {
  return handle >= 1 && handle <= MAX_PHYS && phys[handle - 1].fd >= 0 && phys[handle - 1].refs > 0
             ? &phys[handle - 1]
             : NULL;
}

/* A new physical allocation on fd (taken), under lock: its handle, or 0. */
static CUmemGenericAllocationHandle phys_add(int fd, size_t bytes,
                                             CUmemAllocationHandleType types) {
  for (int i = 0; i < MAX_PHYS; i++)
    if (phys[i].refs == 0) {
      phys[i] = (phys_alloc){fd, bytes, 1, types};
      return (CUmemGenericAllocationHandle)i + 1;
    }
  return 0;
}

static void phys_unref(phys_alloc *p) {
  if (--p->refs == 0) {
    close(p->fd);
    p->fd = -1;
  }
}

static CUresult fake_mem_get_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                         CUmemAllocationGranularity_flags option) {
  (void)prop, (void)option;
  *granularity = VMM_GRANULARITY;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_create(CUmemGenericAllocationHandle *handle, size_t bytes,
                                const CUmemAllocationProp *prop, unsigned long long flags) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!prop || flags || bytes == 0 || bytes % VMM_GRANULARITY ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
    return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&lock);
  *handle = phys_add(fd, bytes, prop->requestedHandleTypes);
  pthread_mutex_unlock(&lock);
  if (*handle == 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

static CUresult fake_mem_release(CUmemGenericAllocationHandle handle) {
  pthread_mutex_lock(&lock);
  phys_alloc *p = phys_of(handle);
  if (p)
    phys_unref(p);
  pthread_mutex_unlock(&lock);
  return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* bytes of PROT_NONE address space aligned to align (a power of two), or MAP_FAILED. */
static char *reserve_aligned(size_t bytes, size_t align) {
  int none = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  char *raw = mmap(NULL, bytes + align, PROT_NONE, none, -1, 0);
  if (raw == MAP_FAILED)
    return MAP_FAILED;
  char *aligned = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
  if (aligned > raw)
    munmap(raw, (size_t)(aligned - raw));
  if (raw + bytes + align > aligned + bytes)
    munmap(aligned + bytes, (size_t)(raw + bytes + align - (aligned + bytes)));
  return aligned;
}

static CUresult fake_mem_address_reserve(CUdeviceptr *ptr, size_t bytes, size_t alignment,
                                         CUdeviceptr addr, unsigned long long flags) {
  (void)addr;
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == 0 || bytes % VMM_GRANULARITY || flags || (alignment & (alignment - 1)))
    return CUDA_ERROR_INVALID_VALUE;
  int flags_none = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  char *range = reserve_aligned(bytes, alignment > VMM_GRANULARITY ? alignment : VMM_GRANULARITY);
  char *shadow = range == MAP_FAILED ? MAP_FAILED : mmap(NULL, bytes, PROT_NONE, flags_none, -1, 0);
  pthread_mutex_lock(&lock);
  int slot = -1;
  for (int i = 0; i < MAX_RESERVES && slot < 0 && shadow != MAP_FAILED; i++)
    if (!reserves[i].base)
      slot = i;
  if (slot >= 0) {
    reserves[slot].base = range;
    reserves[slot].shadow = shadow;
    reserves[slot].bytes = bytes;
  }
  pthread_mutex_unlock(&lock);
  if (slot < 0) {
    if (range != MAP_FAILED)
      munmap(range, bytes);
    if (shadow != MAP_FAILED)
      munmap(shadow, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *ptr = (CUdeviceptr)(uintptr_t)range;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_address_free(CUdeviceptr ptr, size_t bytes) {
  forget_done();
  pthread_mutex_lock(&lock);
  int found = 0;
  for (int i = 0; i < MAX_RESERVES && !found; i++)
    if (reserves[i].base == (char *)(uintptr_t)ptr && reserves[i].bytes == bytes) {
      munmap(reserves[i].base, bytes);
      munmap(reserves[i].shadow, bytes);
      memset(&reserves[i], 0, sizeof reserves[i]);
      found = 1;
    }
  pthread_mutex_unlock(&lock);
  return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Where in a reservation's shadow [ptr, ptr + bytes) lies (under lock), or NULL. */
static char *shadow_of(CUdeviceptr ptr, size_t bytes) {
  char *p = (char *)(uintptr_t)ptr;
  for (int i = 0; i < MAX_RESERVES; i++)
    if (reserves[i].base && p >= reserves[i].base &&
        (size_t)(p - reserves[i].base) + bytes <= reserves[i].bytes)
      return reserves[i].shadow + (p - reserves[i].base);
  return NULL;
}

/* Map a physical allocation at ptr, inside a reserved range: an allocation of its own, as the real
 * driver's pointer queries see it, whose bytes are the memfd's. */
static CUresult fake_mem_map(CUdeviceptr ptr, size_t bytes, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (offset || flags || bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  phys_alloc *p = phys_of(handle);
  char *at = shadow_of(ptr, bytes);
  CUresult err = !p || p->bytes != bytes || !at || ptr % VMM_GRANULARITY ? CUDA_ERROR_INVALID_VALUE
                 : find((void *)(uintptr_t)ptr, 0)                       ? CUDA_ERROR_ALREADY_MAPPED
                                                                         : CUDA_SUCCESS;
  char *shadow = err == CUDA_SUCCESS
                     ? mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, 0)
                     : MAP_FAILED;
  const char *visible = getenv("FAKECUDA_HOST_VISIBLE");
  int none = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
  if (shadow != MAP_FAILED && visible && strcmp(visible, "1") == 0 &&
      mmap((void *)(uintptr_t)ptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd,
           0) == MAP_FAILED) {
    mmap(shadow, bytes, PROT_NONE, none, -1, 0);
    shadow = MAP_FAILED;
  }
  if (err == CUDA_SUCCESS && shadow == MAP_FAILED)
    err = CUDA_ERROR_OUT_OF_MEMORY;
  int slot = -1;
  for (int i = 0; err == CUDA_SUCCESS && i < MAX_ALLOCS && slot < 0; i++)
    if (!allocs[i].base)
      slot = i;
  if (err == CUDA_SUCCESS && slot < 0) {
    mmap(shadow, bytes, PROT_NONE, none, -1, 0);
    err = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (err == CUDA_SUCCESS) {
    allocs[slot] =
        (alloc){(char *)(uintptr_t)ptr, shadow, bytes, -1, ++next_id, (int)(p - phys) + 1};
    p->refs++;
  }
  pthread_mutex_unlock(&lock);
  return err;
}

static CUresult fake_mem_unmap(CUdeviceptr ptr, size_t bytes) {
  forget_done();
  drain();
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  CUresult err = !a || !a->phys || a->base != (char *)(uintptr_t)ptr || a->bytes != bytes
                     ? CUDA_ERROR_INVALID_VALUE
                     : CUDA_SUCCESS;
  if (err == CUDA_SUCCESS) {
    /* The range and its shadow stay reserved, out of the CPU's reach again. */
    int none = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
    mmap(a->shadow, a->bytes, PROT_NONE, none, -1, 0);
    mmap(a->base, a->bytes, PROT_NONE, none, -1, 0);
    phys_unref(&phys[a->phys - 1]);
    memset(a, 0, sizeof *a);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

/* The mapped region (VMM: one mapping, not the reservation) that holds ptr; as the driver's, it
 * wants a current context. */
static CUresult fake_mem_get_address_range(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  if (a) {
    if (base)
      *base = (CUdeviceptr)(uintptr_t)a->base;
    if (size)
      *size = a->bytes;
  }
  pthread_mutex_unlock(&lock);
  return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult fake_mem_set_access(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc *desc,
                                    size_t count) {
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  int mapped = a && a->phys && a->base == (char *)(uintptr_t)ptr && a->bytes == bytes;
  pthread_mutex_unlock(&lock);
  if (!mapped || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      desc->location.id != 0 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_retain_allocation_handle(CUmemGenericAllocationHandle *handle,
                                                  void *addr) {
  pthread_mutex_lock(&lock);
  alloc *a = find(addr, 0);
  int index = a && a->phys ? a->phys : 0;
  if (index)
    phys[index - 1].refs++;
  pthread_mutex_unlock(&lock);
  *handle = (CUmemGenericAllocationHandle)index;
  return index ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_mem_get_allocation_properties(CUmemAllocationProp *prop,
                                                   CUmemGenericAllocationHandle handle) {
  pthread_mutex_lock(&lock);
  phys_alloc *p = phys_of(handle);
  CUmemAllocationHandleType types = p ? p->types : CU_MEM_HANDLE_TYPE_NONE;
  pthread_mutex_unlock(&lock);
  if (!p)
    return CUDA_ERROR_INVALID_VALUE;
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes = types;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = 0;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_export(void *shareable, CUmemGenericAllocationHandle handle,
                                CUmemAllocationHandleType type, unsigned long long flags) {
  pthread_mutex_lock(&lock);
  phys_alloc *p = phys_of(handle);
  int fd = p && !flags && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
                   (p->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
               ? fcntl(p->fd, F_DUPFD_CLOEXEC, 0)
               : -2;
  pthread_mutex_unlock(&lock);
  if (fd == -2)
    return p ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
  if (fd < 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareable = fd;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_import(CUmemGenericAllocationHandle *handle, void *os_handle,
                                CUmemAllocationHandleType type) {
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  int given = (int)(intptr_t)os_handle;
  if (fstat(given, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % VMM_GRANULARITY)
    return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  *handle = phys_add(fd, (size_t)st.st_size, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  vmm_imports += *handle != 0;
  pthread_mutex_unlock(&lock);
  if (*handle == 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

const fakecuda_entry fakecuda_vmm_entries[] = {
    {"cuMemGetAllocationGranularity", (void *)fake_mem_get_granularity},
    {"cuMemCreate", (void *)fake_mem_create},
    {"cuMemRelease", (void *)fake_mem_release},
    {"cuMemAddressReserve", (void *)fake_mem_address_reserve},
    {"cuMemAddressFree", (void *)fake_mem_address_free},
    {"cuMemMap", (void *)fake_mem_map},
    {"cuMemUnmap", (void *)fake_mem_unmap},
    {"cuMemSetAccess", (void *)fake_mem_set_access},
    {"cuMemGetAddressRange", (void *)fake_mem_get_address_range},
    {"cuMemRetainAllocationHandle", (void *)fake_mem_retain_allocation_handle},
    {"cuMemGetAllocationPropertiesFromHandle", (void *)fake_mem_get_allocation_properties},
    {"cuMemExportToShareableHandle", (void *)fake_mem_export},
    {"cuMemImportFromShareableHandle", (void *)fake_mem_import},
    {NULL, NULL},
};
