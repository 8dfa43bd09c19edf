/* memory.c - the stand-in driver's device memory (see fakecuda.h): cuMemAlloc's, PROT_NONE to the
 * CPU with its bytes in a memfd; page-locked host memory; the synchronous copies; what the pointer
 * queries answer. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

/* Page-locked host memory (cuMemHostAlloc), which the synchronous copies treat otherwise. */
#define MAX_PINNED 1024
static struct pinned_range {
  char *base;
  size_t bytes;
} pinned_at[MAX_PINNED];

alloc allocs[MAX_ALLOCS];
unsigned long long next_id;
static long long fail_after = -2; /* FAKECUDA_FAIL_AFTER, read at the first copy; -1: never */

/* Count a copy (under lock): CUDA_SUCCESS, or the failure FAKECUDA_FAIL_AFTER asks for. */
CUresult count_copy(size_t bytes) {
  if (fail_after == -2) {
    const char *text = getenv("FAKECUDA_FAIL_AFTER");
    fail_after = text && *text ? atoll(text) : -1;
  }
  if (fail_after >= 0 && copies >= (unsigned long long)fail_after)
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  copies++;
  copied_bytes += bytes;
  return CUDA_SUCCESS;
}

/* The allocation that holds [ptr, ptr + len): ptr inside it (not one past its end, which may be
 * where the next allocation starts: reservations are often adjacent). */
static alloc *mapping_at(const char *base) {
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].base == base && allocs[i].phys)
      return &allocs[i];
  return NULL;
}

/* A range may go on into the VMM mappings that follow its own in one reserved range: their
 * bytes lie one after the other in the reservation's shadow too, as the GPU's do in its address
 * space. */
alloc *find(const void *ptr, size_t len) {
  const char *p = ptr;
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].base && p >= allocs[i].base && (size_t)(p - allocs[i].base) < allocs[i].bytes) {
      size_t covered = allocs[i].bytes - (size_t)(p - allocs[i].base);
      const alloc *last = &allocs[i], *next;
      while (covered < len && last->phys && (next = mapping_at(last->base + last->bytes)) &&
             next->shadow == last->shadow + last->bytes) {
        covered += next->bytes;
        last = next;
      }
      if (len <= covered)
        return &allocs[i];
    }
  return NULL;
}

static CUresult fake_mem_alloc(CUdeviceptr *ptr, size_t bytes) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  size_t span = bytes ? bytes : 1;
  int fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
  char *shadow = fd >= 0 && ftruncate(fd, (off_t)span) == 0
                     ? mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
  const char *visible = getenv("FAKECUDA_HOST_VISIBLE");
  char *base = visible && strcmp(visible, "1") == 0 && shadow != MAP_FAILED
                   ? mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED || shadow == MAP_FAILED) {
    if (base != MAP_FAILED)
      munmap(base, span);
    if (shadow != MAP_FAILED)
      munmap(shadow, span);
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].base) {
      allocs[i] = (alloc){base, shadow, span, fd, ++next_id, 0};
      pthread_mutex_unlock(&lock);
      *ptr = (CUdeviceptr)(uintptr_t)base;
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  munmap(base, span);
  munmap(shadow, span);
  close(fd);
  return CUDA_ERROR_OUT_OF_MEMORY;
}

void drop(alloc *a) {
  munmap(a->base, a->bytes);
  munmap(a->shadow, a->bytes);
  if (a->fd >= 0)
    close(a->fd);
  memset(a, 0, sizeof *a);
}

static CUresult fake_mem_free(CUdeviceptr ptr) {
  drain();
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  if (!a || a->base != (char *)(uintptr_t)ptr || a->fd < 0) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  drop(a);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* Where the bytes at ptr really are: the shadow of device memory, or ptr itself. */
char *resolve(CUdeviceptr ptr, size_t bytes) {
  alloc *a = find((void *)(uintptr_t)ptr, bytes);
  return a ? a->shadow + ((char *)(uintptr_t)ptr - a->base) : (char *)(uintptr_t)ptr;
}

/* Whether [ptr, ptr + bytes) lies in page-locked memory of cuMemHostAlloc's (lock held). */
static int is_pinned(const void *ptr, size_t bytes) {
  for (int i = 0; i < MAX_PINNED; i++)
    if (pinned_at[i].base && (const char *)ptr >= pinned_at[i].base &&
        (const char *)ptr + bytes <= pinned_at[i].base + pinned_at[i].bytes)
      return 1;
  return 0;
}

/* cuMemcpy and its typed twins, as the driver documents them ("API synchronization behavior"):
 * they run on the legacy default stream, after what was queued there; to host memory, and from
 * page-locked host memory, they return once the copy is done; device to device they return at
 * once, the copy queued; from pageable host memory to the device they return once the source is
 * copied to a staging buffer, the rest queued. So a caller that needs the destination complete
 * (for another stream, or another process) must wait for the legacy default stream. */
static CUresult fake_memcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  int to_device = find((void *)(uintptr_t)dst, bytes) != NULL;
  int from_device = find((void *)(uintptr_t)src, bytes) != NULL;
  int pageable = !from_device && !is_pinned((void *)(uintptr_t)src, bytes);
  char *to = resolve(dst, bytes), *from = resolve(src, bytes);
  CUresult counted = count_copy(bytes);
  pthread_mutex_unlock(&lock);
  if (counted != CUDA_SUCCESS)
    return counted;
  if (to_device && (from_device || pageable)) {
    char *staged = NULL;
    if (pageable) {
      if (!(staged = malloc(bytes ? bytes : 1)))
        return CUDA_ERROR_OUT_OF_MEMORY;
      memcpy(staged, from, bytes);
    }
    async_op op = {.owned = staged, .staged = staged != NULL};
    if (!enqueue_op(0, to, staged ? staged : from, bytes, &op)) {
      free(staged);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
  }
  wait_done(0, 0);
  async_op sync = {.to = to, .from = from, .bytes = bytes};
  pthread_mutex_lock(&queue_lock);
  check_race(-1, &sync);
  sync.next = running_sync; /* what other threads queue meanwhile is checked against it */
  running_sync = &sync;
  pthread_mutex_unlock(&queue_lock);
  memmove(to, from, bytes);
  pthread_mutex_lock(&queue_lock);
  for (async_op **at = &running_sync; *at; at = &(*at)->next)
    if (*at == &sync) {
      *at = sync.next;
      break;
    }
  pthread_mutex_unlock(&queue_lock);
  return counted;
}

static CUresult fake_memcpy_htod(CUdeviceptr dst, const void *src, size_t bytes) {
  return fake_memcpy(dst, (CUdeviceptr)(uintptr_t)src, bytes);
}

static CUresult fake_memcpy_dtoh(void *dst, CUdeviceptr src, size_t bytes) {
  return fake_memcpy((CUdeviceptr)(uintptr_t)dst, src, bytes);
}

static CUresult fake_mem_host_alloc(void **ptr, size_t bytes, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (posix_memalign(ptr, 4096, bytes ? bytes : 1) != 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  pinned++;
  for (int i = 0; i < MAX_PINNED; i++)
    if (!pinned_at[i].base) {
      pinned_at[i] = (struct pinned_range){*ptr, bytes};
      break;
    }
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static CUresult fake_mem_free_host(void *ptr) {
  forget_done();
  pthread_mutex_lock(&lock);
  for (int i = 0; ptr && i < MAX_PINNED; i++)
    if (pinned_at[i].base == ptr)
      pinned_at[i] = (struct pinned_range){NULL, 0};
  pthread_mutex_unlock(&lock);
  free(ptr);
  return CUDA_SUCCESS;
}

static CUresult fake_pointer_get_attributes(unsigned int n, CUpointer_attribute *attrs, void **data,
                                            CUdeviceptr ptr) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  int device = a != NULL;
  alloc found = device ? *a : (alloc){0};
  struct reserve range = {0};
  for (int i = 0; found.phys && i < MAX_RESERVES; i++)
    if (reserves[i].base && found.base >= reserves[i].base &&
        found.base < reserves[i].base + reserves[i].bytes)
      range = reserves[i];
  pthread_mutex_unlock(&lock);
  for (unsigned int i = 0; i < n; i++) {
    switch (attrs[i]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(CUmemorytype *)data[i] = device ? CU_MEMORYTYPE_DEVICE : (CUmemorytype)0;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data[i] = 0; break;
    /* As the real driver's: VMM mappings belong to no context, their range is the reservation. */
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *(CUcontext *)data[i] = device && !found.phys ? the_context : NULL;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: {
      /* FAKECUDA_LEGACY_ATTR=0: 0 for cuMemAlloc's memory too, as some drivers have said. */
      const char *attr = getenv("FAKECUDA_LEGACY_ATTR");
      *(unsigned int *)data[i] = device && found.fd >= 0 && !(attr && strcmp(attr, "0") == 0);
      break;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = device ? 0 : -2; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data[i] = found.id; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(CUdeviceptr *)data[i] = (CUdeviceptr)(uintptr_t)(found.phys ? range.base : found.base);
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *(size_t *)data[i] = found.phys ? range.bytes : found.bytes;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

const fakecuda_entry fakecuda_memory_entries[] = {
    {"cuMemAlloc", (void *)fake_mem_alloc},
    {"cuMemFree", (void *)fake_mem_free},
    {"cuMemcpy", (void *)fake_memcpy},
    {"cuMemcpyHtoD", (void *)fake_memcpy_htod},
    {"cuMemcpyDtoH", (void *)fake_memcpy_dtoh},
    {"cuMemcpyDtoD", (void *)fake_memcpy},
    {"cuPointerGetAttributes", (void *)fake_pointer_get_attributes},
    {"cuMemHostAlloc", (void *)fake_mem_host_alloc},
    {"cuMemFreeHost", (void *)fake_mem_free_host},
    {NULL, NULL},
};
