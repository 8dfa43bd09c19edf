/* fakecuda.c - a stand-in for the CUDA driver (libcuda.so.1) where there is no GPU, so that CI
 * runs hoop's device-buffer paths: HOOP_CUDA_LIBRARY=tests/.libs/libfakecuda.so.
 *
 * Its "device memory" is as out of the CPU's reach as a GPU's: cuMemAlloc reserves address space
 * that is mapped PROT_NONE, so any read or write of it by hoop on the CPU faults, and keeps the
 * bytes in a hidden host buffer that only the copy calls reach. As with the real driver, copies
 * need a current context on the calling thread (each thread has its own stack of them), the pointer
 * query answers CUDA_ERROR_NOT_INITIALIZED before cuInit and default values (memory type 0) for
 * pointers it does not know, and entry points are found through cuGetProcAddress_v2.
 *
 * FAKECUDA_COUNT=FILE: at exit, append "copies N bytes B stream_syncs S pinned P async A" to FILE
 * (the test checks that staging copied what it should through page-locked memory, that the stream
 * variants waited for their stream, and that the pipelined ring copied asynchronously).
 * cuModuleLoadData and cuLaunchKernel are missing, as kernels cannot run here.
 *
 * FAKECUDA_FAIL_AFTER=N: every copy after the first N fails (CUDA_ERROR_ILLEGAL_ADDRESS, as a
 * device fault makes the real driver's calls fail), to see what hoop does when the driver does.
 *
 * Asynchronous copies (cuMemcpyAsync) and events really are asynchronous: a worker thread carries
 * out each stream's queue in order, FAKECUDA_ASYNC_DELAY_US microseconds per operation (default
 * 200), so that a caller that reads a copy's destination before waiting for its event or stream
 * reads stale bytes, and the tests catch it. cuEventSynchronize and cuStreamSynchronize wait for
 * the worker.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_ALLOCS 4096

typedef struct alloc {
  char *base;   /* the PROT_NONE reservation: the "device address" */
  char *shadow; /* where the bytes really are */
  size_t bytes;
} alloc;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static alloc allocs[MAX_ALLOCS];
static int initialized;
static struct CUctx_st *const the_context = (struct CUctx_st *)0x1;
static __thread int ctx_depth; /* contexts pushed or set current on this thread */
static unsigned long long copies, copied_bytes, stream_syncs, pinned;
static struct CUstream_st *const the_stream = (struct CUstream_st *)0x2;
static long long fail_after = -2; /* FAKECUDA_FAIL_AFTER, read at the first copy; -1: never */

/* Count a copy (under lock): CUDA_SUCCESS, or the failure FAKECUDA_FAIL_AFTER asks for. */
static CUresult count_copy(size_t bytes) {
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

/* ---- the asynchronous queue: one for every stream (copies keep their order across streams) */
typedef struct async_op {
  char *to;
  const char *from; /* NULL: an event's marker */
  size_t bytes;
  unsigned long long seq;
  struct async_op *next;
} async_op;

struct CUevent_st {
  unsigned long long seq; /* the marker recorded last; 0: never recorded */
};

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER; /* work queued, or work done */
static async_op *queue_head, *queue_tail;
static unsigned long long queued_seq, done_seq;
static pthread_t worker;
static int worker_started;
static long delay_us = -1;
static unsigned long long async_copies;

static void *worker_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&queue_lock);
  for (;;) {
    while (!queue_head)
      pthread_cond_wait(&queue_cond, &queue_lock);
    async_op *op = queue_head;
    pthread_mutex_unlock(&queue_lock);
    if (delay_us > 0)
      usleep((useconds_t)delay_us);
    if (op->from)
      memmove(op->to, op->from, op->bytes);
    pthread_mutex_lock(&queue_lock);
    queue_head = op->next;
    if (!queue_head)
      queue_tail = NULL;
    done_seq = op->seq;
    free(op);
    pthread_cond_broadcast(&queue_cond);
  }
  return NULL;
}

/* Queue an operation; its sequence number, or 0 when out of memory. */
static unsigned long long enqueue(char *to, const char *from, size_t bytes) {
  async_op *op = calloc(1, sizeof *op);
  if (!op)
    return 0;
  pthread_mutex_lock(&queue_lock);
  if (!worker_started) {
    const char *text = getenv("FAKECUDA_ASYNC_DELAY_US");
    delay_us = text ? atol(text) : 200;
    if (pthread_create(&worker, NULL, worker_main, NULL) != 0) {
      pthread_mutex_unlock(&queue_lock);
      free(op);
      return 0;
    }
    pthread_detach(worker);
    worker_started = 1;
  }
  unsigned long long seq = ++queued_seq;
  *op = (async_op){to, from, bytes, seq, NULL};
  if (queue_tail)
    queue_tail->next = op;
  else
    queue_head = op;
  queue_tail = op;
  pthread_cond_broadcast(&queue_cond);
  pthread_mutex_unlock(&queue_lock);
  return seq; /* not op->seq: the worker may have done and freed op by now */
}

static void wait_done(unsigned long long seq) {
  pthread_mutex_lock(&queue_lock);
  while (done_seq < seq)
    pthread_cond_wait(&queue_cond, &queue_lock);
  pthread_mutex_unlock(&queue_lock);
}

static alloc *find(const void *ptr, size_t len) {
  const char *p = ptr;
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (allocs[i].base && p >= allocs[i].base && (size_t)(p - allocs[i].base) <= allocs[i].bytes &&
        len <= allocs[i].bytes - (size_t)(p - allocs[i].base))
      return &allocs[i];
  return NULL;
}

static CUresult fake_init(unsigned int flags) {
  (void)flags;
  initialized = 1;
  return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *device, int ordinal) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

static CUresult fake_primary_ctx_retain(CUcontext *ctx, CUdevice device) {
  (void)device;
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  *ctx = the_context;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_set_current(CUcontext ctx) {
  ctx_depth = ctx ? (ctx_depth ? ctx_depth : 1) : 0;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_push(CUcontext ctx) {
  if (ctx != the_context)
    return CUDA_ERROR_INVALID_CONTEXT;
  ctx_depth++;
  return CUDA_SUCCESS;
}

static CUresult fake_ctx_pop(CUcontext *ctx) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  ctx_depth--;
  if (ctx)
    *ctx = the_context;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_alloc(CUdeviceptr *ptr, size_t bytes) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  size_t span = bytes ? bytes : 1;
  char *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *shadow = malloc(span);
  if (base == MAP_FAILED || !shadow) {
    free(shadow);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_ALLOCS; i++)
    if (!allocs[i].base) {
      allocs[i] = (alloc){base, shadow, span};
      pthread_mutex_unlock(&lock);
      *ptr = (CUdeviceptr)(uintptr_t)base;
      return CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_mem_free(CUdeviceptr ptr) {
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  if (!a || a->base != (char *)(uintptr_t)ptr) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
  }
  munmap(a->base, a->bytes);
  free(a->shadow);
  memset(a, 0, sizeof *a);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* Where the bytes at ptr really are: the shadow of device memory, or ptr itself. */
static char *resolve(CUdeviceptr ptr, size_t bytes) {
  alloc *a = find((void *)(uintptr_t)ptr, bytes);
  return a ? a->shadow + ((char *)(uintptr_t)ptr - a->base) : (char *)(uintptr_t)ptr;
}

static CUresult fake_memcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  char *to = resolve(dst, bytes), *from = resolve(src, bytes);
  CUresult counted = count_copy(bytes);
  pthread_mutex_unlock(&lock);
  if (counted == CUDA_SUCCESS)
    memmove(to, from, bytes);
  return counted;
}

static CUresult fake_memcpy_htod(CUdeviceptr dst, const void *src, size_t bytes) {
  return fake_memcpy(dst, (CUdeviceptr)(uintptr_t)src, bytes);
}

static CUresult fake_memcpy_dtoh(void *dst, CUdeviceptr src, size_t bytes) {
  return fake_memcpy((CUdeviceptr)(uintptr_t)dst, src, bytes);
}

static CUresult fake_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (stream != NULL && stream != the_stream)
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  char *to = resolve(dst, bytes), *from = resolve(src, bytes);
  CUresult counted = count_copy(bytes);
  async_copies += counted == CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  if (counted != CUDA_SUCCESS)
    return counted;
  return enqueue(to, from, bytes) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_event_create(CUevent *event, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *event = calloc(1, sizeof **event);
  return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_event_destroy(CUevent event) {
  free(event);
  return CUDA_SUCCESS;
}

static CUresult fake_event_record(CUevent event, CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!event || (stream != NULL && stream != the_stream))
    return CUDA_ERROR_INVALID_HANDLE;
  unsigned long long seq = enqueue(NULL, NULL, 0);
  if (!seq)
    return CUDA_ERROR_OUT_OF_MEMORY;
  event->seq = seq;
  return CUDA_SUCCESS;
}

static CUresult fake_event_synchronize(CUevent event) {
  if (!event)
    return CUDA_ERROR_INVALID_HANDLE;
  wait_done(event->seq);
  return CUDA_SUCCESS;
}

/* GPUDirect RDMA's questions: the device says it exports dma-buf unless FAKECUDA_DMABUF=0, and the
 * export is an fd of the range's size (no RDMA device here can take it: soft-RoCE's rxe answers
 * EOPNOTSUPP, which is what hoop must then handle). */
static CUresult fake_device_get_attribute(int *value, CUdevice_attribute attr, CUdevice device) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (device != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  const char *dmabuf = getenv("FAKECUDA_DMABUF");
  *value =
      attr == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED ? !(dmabuf && strcmp(dmabuf, "0") == 0) : 0;
  return CUDA_SUCCESS;
}

static CUresult fake_get_handle_for_range(void *handle, CUdeviceptr ptr, size_t bytes,
                                          CUmemRangeHandleType type, unsigned long long flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  /* The range in whole pages of one allocation (its last page counts whole, as a GPU's would). */
  pthread_mutex_lock(&lock);
  alloc *a = find((void *)(uintptr_t)ptr, 0);
  int inside =
      a && (size_t)((char *)(uintptr_t)ptr - a->base) + bytes <= (a->bytes + 4095) / 4096 * 4096;
  pthread_mutex_unlock(&lock);
  if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || !inside || (ptr & 4095) || (bytes & 4095))
    return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("fakecuda-dmabuf", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *(int *)handle = fd;
  return CUDA_SUCCESS;
}

static CUresult fake_stream_destroy(CUstream stream) {
  return stream == the_stream ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult fake_stream_create(CUstream *stream, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *stream = the_stream;
  return CUDA_SUCCESS;
}

static CUresult fake_stream_synchronize(CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (stream != NULL && stream != the_stream)
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  stream_syncs++;
  pthread_mutex_unlock(&lock);
  pthread_mutex_lock(&queue_lock);
  unsigned long long last = queued_seq;
  pthread_mutex_unlock(&queue_lock);
  wait_done(last);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_get_ctx(CUstream stream, CUcontext *ctx) {
  if (stream != the_stream)
    return CUDA_ERROR_INVALID_HANDLE;
  *ctx = the_context;
  return CUDA_SUCCESS;
}

static CUresult fake_mem_host_alloc(void **ptr, size_t bytes, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (posix_memalign(ptr, 4096, bytes ? bytes : 1) != 0)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  pinned++;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static CUresult fake_mem_free_host(void *ptr) {
  free(ptr);
  return CUDA_SUCCESS;
}

static CUresult fake_pointer_get_attributes(unsigned int n, CUpointer_attribute *attrs, void **data,
                                            CUdeviceptr ptr) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&lock);
  int device = find((void *)(uintptr_t)ptr, 0) != NULL;
  pthread_mutex_unlock(&lock);
  for (unsigned int i = 0; i < n; i++) {
    switch (attrs[i]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(CUmemorytype *)data[i] = device ? CU_MEMORYTYPE_DEVICE : (CUmemorytype)0;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data[i] = 0; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data[i] = device ? the_context : NULL; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = device ? 0 : -2; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

static CUresult fake_get_error_string(CUresult err, const char **text) {
  switch (err) {
  case CUDA_SUCCESS: *text = "no error"; break;
  case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
  case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
  case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
  default: *text = "unknown error"; break;
  }
  return CUDA_SUCCESS;
}

static const struct {
  const char *name;
  void *fn;
} table[] = {
    {"cuInit", (void *)fake_init},
    {"cuDeviceGet", (void *)fake_device_get},
    {"cuDevicePrimaryCtxRetain", (void *)fake_primary_ctx_retain},
    {"cuCtxSetCurrent", (void *)fake_ctx_set_current},
    {"cuCtxPushCurrent", (void *)fake_ctx_push},
    {"cuCtxPopCurrent", (void *)fake_ctx_pop},
    {"cuMemAlloc", (void *)fake_mem_alloc},
    {"cuMemFree", (void *)fake_mem_free},
    {"cuMemcpy", (void *)fake_memcpy},
    {"cuMemcpyHtoD", (void *)fake_memcpy_htod},
    {"cuMemcpyDtoH", (void *)fake_memcpy_dtoh},
    {"cuPointerGetAttributes", (void *)fake_pointer_get_attributes},
    {"cuGetErrorString", (void *)fake_get_error_string},
    {"cuStreamCreate", (void *)fake_stream_create},
    {"cuStreamSynchronize", (void *)fake_stream_synchronize},
    {"cuStreamGetCtx", (void *)fake_stream_get_ctx},
    {"cuMemHostAlloc", (void *)fake_mem_host_alloc},
    {"cuMemFreeHost", (void *)fake_mem_free_host},
    {"cuMemcpyAsync", (void *)fake_memcpy_async},
    {"cuEventCreate", (void *)fake_event_create},
    {"cuEventDestroy", (void *)fake_event_destroy},
    {"cuEventRecord", (void *)fake_event_record},
    {"cuEventSynchronize", (void *)fake_event_synchronize},
    {"cuStreamDestroy", (void *)fake_stream_destroy},
    {"cuDeviceGetAttribute", (void *)fake_device_get_attribute},
    {"cuMemGetHandleForAddressRange", (void *)fake_get_handle_for_range},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)version;
  (void)flags;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(symbol, table[i].name) == 0) {
      *pfn = table[i].fn;
      if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status)
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

__attribute__((destructor)) static void report(void) {
  const char *path = getenv("FAKECUDA_COUNT");
  FILE *f = path && copies ? fopen(path, "a") : NULL;
  if (f) {
    fprintf(f, "copies %llu bytes %llu stream_syncs %llu pinned %llu async %llu\n", copies,
            copied_bytes, stream_syncs, pinned, async_copies);
    fclose(f);
  }
}
