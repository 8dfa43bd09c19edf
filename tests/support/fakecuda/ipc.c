/* ipc.c - the stand-in driver's legacy CUDA IPC between processes (see fakecuda.h): a handle names
 * the memfd that holds an allocation's bytes (process and descriptor), and another process maps
 * it through /proc/PID/fd behind an address range of its own. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

/* What cuIpcGetMemHandle writes into a CUipcMemHandle's bytes. */
typedef struct fake_ipc_handle {
  char magic[8]; /* "fakecuda" */
  int32_t pid, fd;
  uint64_t bytes, id;
} fake_ipc_handle;

static CUresult fake_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr ptr) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  if (!a || a->base != (char *)(uintptr_t)ptr || a->fd < 0) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  fake_ipc_handle h = {
      {'f', 'a', 'k', 'e', 'c', 'u', 'd', 'a'}, (int32_t)getpid(), a->fd, a->bytes, a->id};
  pthread_mutex_unlock(&lock);
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &h, sizeof h);
  return CUDA_SUCCESS;
}

static CUresult fake_ipc_open_mem_handle(CUdeviceptr *ptr, CUipcMemHandle handle,
                                         unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  const char *ipc = getenv("FAKECUDA_IPC");
  if (ipc && strcmp(ipc, "0") == 0)
    return CUDA_ERROR_NOT_SUPPORTED;
  fake_ipc_handle h;
  memcpy(&h, handle.reserved, sizeof h);
  if (memcmp(h.magic, "fakecuda", 8) != 0 || h.bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (h.pid == (int32_t)getpid())
    return CUDA_ERROR_INVALID_CONTEXT; /* the real driver's answer within one process */
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return CUDA_ERROR_INVALID_VALUE;
  char *base = mmap(NULL, h.bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *shadow = mmap(NULL, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED || shadow == MAP_FAILED) {
    if (base != MAP_FAILED)
      munmap(base, h.bytes);
    if (shadow != MAP_FAILED)
      munmap(shadow, h.bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].base) {
      allocs[i] = (alloc){base, shadow, h.bytes, -1, ++next_id, 0};
      ipc_opens++;
      pthread_mutex_unlock(&lock);
      *ptr = (CUdeviceptr)(uintptr_t)base;
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  munmap(base, h.bytes);
  munmap(shadow, h.bytes);
  return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_ipc_close_mem_handle(CUdeviceptr ptr) {
  forget_done();
  drain();
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  if (!a || a->base != (char *)(uintptr_t)ptr || a->fd >= 0) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  drop(a);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

const fakecuda_entry fakecuda_ipc_entries[] = {
    {"cuIpcGetMemHandle", (void *)fake_ipc_get_mem_handle},
    {"cuIpcOpenMemHandle", (void *)fake_ipc_open_mem_handle},
    {"cuIpcCloseMemHandle", (void *)fake_ipc_close_mem_handle},
    {NULL, NULL},
};
