/* ipc.c - CUDA IPC between ranks of one host (coll/path_ipc.c): a device buffer exported by a
 * legacy IPC handle or, for the virtual memory management API's memory, by its allocations'
 * descriptors (vmm.c, vmm_server.c); this process's exports, cached; a peer's mapped and closed
 * (see cuda.h).
 */
#include "config.h"

#ifdef HOOP_HAVE_CUDA

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mem/cuda/vmm.h"

/* This process's exports, by buffer id: cuIpcGetMemHandle is a driver round trip. A VMM export
 * holds no descriptor: the descriptor server (vmm_server.c) exports the allocation when a peer
 * asks. */
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
    if (hoop__cuda_vmm_still_mapped(e)) {
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

int hoop__cuda_exported_piece(const uint64_t token[2], uint64_t start, uint64_t handle,
                              uint64_t buffer_id) {
  int found = 0;
  pthread_mutex_lock(&exports_lock);
  for (int i = 0; i < nexports && !found; i++) {
    const hoop__cuda_export *e = &exports[i];
    if (e->kind != HOOP__CUDA_EXPORT_VMM || e->token[0] != token[0] || e->token[1] != token[1])
      continue;
    for (int p = 0; p < hoop__cuda_pieces_of(e) && !found; p++)
      found = e->piece[p].start == start && e->piece[p].handle == handle &&
              e->piece[p].buffer_id == buffer_id;
  }
  pthread_mutex_unlock(&exports_lock);
  return found;
}

int hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                          size_t whylen) {
  if (!hoop__cuda_loaded() || !hoop__cuda_drv.ipc_get_mem_handle ||
      !hoop__cuda_drv.ipc_open_mem_handle || !hoop__cuda_drv.ipc_close_mem_handle ||
      !hoop__cuda_drv.memcpy_async) {
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
  CUresult err = hoop__cuda_drv.pointer_get_attributes(6, attrs, data, (CUdeviceptr)(uintptr_t)ptr);
  CUcontext context = NULL;
  if (err != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE || managed || !start ||
      hoop__cuda_kind_and_context(ptr, &context) != HOOP__MEM_DEVICE || !context) {
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
    if (!hoop__cuda_vmm_calls())
      snprintf(vmm_why, sizeof vmm_why, "the driver has no virtual memory management calls");
    else if ((err = hoop__cuda_drv.ctx_push(context)) != CUDA_SUCCESS)
      hoop__cuda_say_why(vmm_why, sizeof vmm_why, "cuCtxPushCurrent", err);
    else {
      cached = vmm_cached(ptr, end, out) == 0;
      failed = cached ? 0 : hoop__cuda_vmm_export(ptr, len, out, vmm_why, sizeof vmm_why);
      CUcontext popped;
      hoop__cuda_drv.ctx_pop(&popped);
    }
    if ((cached || !failed) && hoop__cuda_fd_server_start(&server, vmm_why, sizeof vmm_why) == 0) {
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
  if ((err = hoop__cuda_drv.ctx_push(context)) == CUDA_SUCCESS) {
    err = hoop__cuda_drv.ipc_get_mem_handle(&handle, start);
    CUcontext popped;
    hoop__cuda_drv.ctx_pop(&popped);
  }
  if (err != CUDA_SUCCESS) {
    if (legacy)
      hoop__cuda_say_why(why, whylen, "cuIpcGetMemHandle", err);
    else
      snprintf(why, whylen,
               "not memory of cudaMalloc (no legacy IPC handle: %s (%d)); as VMM memory: %s",
               hoop__cuda_error_text(err), (int)err, vmm_why);
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

int hoop__cuda_export_same(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  if (a->kind != b->kind || a->base != b->base || a->size != b->size ||
      a->buffer_id != b->buffer_id)
    return 0;
  if (a->kind != HOOP__CUDA_EXPORT_VMM)
    return memcmp(a->handle, b->handle, sizeof a->handle) == 0;
  if (a->npieces != b->npieces || hoop__cuda_pieces_of(a) != a->npieces)
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
  for (int i = 0; i < hoop__cuda_pieces_of(a); i++)
    for (int j = 0; j < hoop__cuda_pieces_of(b); j++) {
      const hoop__cuda_vmm_piece *p = &a->piece[i], *q = &b->piece[j];
      if (p->start < q->start + q->size && q->start < p->start + p->size &&
          (p->start != q->start || p->size != q->size || p->buffer_id != q->buffer_id ||
           p->handle != q->handle))
        return 1;
    }
  return 0;
}

int hoop__cuda_ipc_open(const void *near, const hoop__cuda_export *export, void **base, char *why,
                        size_t whylen) {
  if (hoop__cuda_push_context_of(near, why, whylen) != 0)
    return -1;
  CUdeviceptr mapped = 0;
  CUcontext popped;
  if (export->kind == HOOP__CUDA_EXPORT_VMM) {
    int failed = hoop__cuda_vmm_open(near, export, &mapped, why, whylen);
    hoop__cuda_drv.ctx_pop(&popped);
    if (failed)
      return -1;
    *base = (void *)(uintptr_t)mapped;
    return 0;
  }
  CUipcMemHandle handle;
  memcpy(handle.reserved, export->handle, sizeof handle.reserved);
  CUresult err =
      hoop__cuda_drv.ipc_open_mem_handle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  /* The size the peer claims must be what the handle maps: the bounds its descriptors are checked
   * against (coll/path_ipc.c) come from that claim. */
  CUdeviceptr start = 0;
  size_t size = 0;
  int short_map = err == CUDA_SUCCESS && hoop__cuda_drv.mem_get_address_range &&
                  (hoop__cuda_drv.mem_get_address_range(&start, &size, mapped) != CUDA_SUCCESS ||
                   start != mapped || size < export->size);
  if (short_map)
    hoop__cuda_drv.ipc_close_mem_handle(mapped);
  hoop__cuda_drv.ctx_pop(&popped);
  if (err != CUDA_SUCCESS) {
    hoop__cuda_say_why(why, whylen, "cuIpcOpenMemHandle", err);
    return -1;
  }
  if (short_map) {
    snprintf(why, whylen, "it claims an allocation of %llu bytes, but its handle maps %zu",
             (unsigned long long)export->size, size);
    return -1;
  }
  *base = (void *)(uintptr_t)mapped;
  return 0;
}

void hoop__cuda_ipc_close(void *context, void *base, const hoop__cuda_export *export) {
  if (!base || !context || !hoop__cuda_drv.ipc_close_mem_handle ||
      hoop__cuda_drv.ctx_push((CUcontext)context) != CUDA_SUCCESS)
    return;
  if (export->kind == HOOP__CUDA_EXPORT_VMM) {
    hoop__cuda_vmm_unmap((CUdeviceptr)(uintptr_t)base, export, export->npieces);
  } else {
    hoop__cuda_drv.ipc_close_mem_handle((CUdeviceptr)(uintptr_t)base);
  }
  CUcontext popped;
  hoop__cuda_drv.ctx_pop(&popped);
}

#endif /* HOOP_HAVE_CUDA */
