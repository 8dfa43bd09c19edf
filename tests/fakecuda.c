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
 *
 * Kernels: cuModuleLoadData takes any image and cuModuleGetFunction knows hoop's reduction kernels
 * by name (hoop_reduce_<dtype>_<op>, hoop_many_<dtype>_<op>, hoop_divide_<dtype>): they are
 * lib/mem/kernels.cu's own code compiled for the CPU (tests/kernels_host.cc). cuLaunchKernel
 * checks the launch's shape as the driver does, queues it on the stream like a copy, and the
 * stream's worker runs every thread of the grid it was given, one after the other, later. So the
 * tests check how hoop orders, waits for and launches its kernels, and the kernels' code too; only
 * the GPU's own arithmetic is left to test_cuda_kernels on a GPU.
 * FAKECUDA_KERNELS=0: no module calls, as a driver that cannot load hoop's kernels.
 *
 * CUDA IPC between processes: every allocation's bytes are in a memfd, cuIpcGetMemHandle names it
 * (process and descriptor), and cuIpcOpenMemHandle in another process maps it through
 * /proc/PID/fd behind an address range of its own, again PROT_NONE to the CPU. As with the real
 * driver, a handle does not open in the process that exported it. FAKECUDA_IPC=0: every open
 * fails (CUDA_ERROR_NOT_SUPPORTED), for the fallback. The count file adds "kernels K ipc_opens O".
 *
 * GPUDirect RDMA (tests/rdma-vm/suite): the GPU says it exports dma-buf unless FAKECUDA_DMABUF=0;
 * it answers CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING with FAKECUDA_GDR_ORDERING
 * (default 0: received data must be flushed) and offers cuFlushGPUDirectRDMAWrites, counted
 * ("flushes F" in the count file), unless FAKECUDA_GDR_FLUSH=0. FAKECUDA_HOST_VISIBLE=1 maps device
 * memory readable and writable at its device address, as the bytes' second mapping, so that
 * soft-RoCE can register it as nvidia-peermem registers GPU memory (ibv_reg_mr on the device
 * pointer); hoop's own CPU accesses then no longer fault, which the other tests check.
 *
 * FAKECUDA_LEGACY_ATTR=0: CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE says 0 for cuMemAlloc's
 * memory as well, as some drivers have (cuIpcGetMemHandle still works on it).
 *
 * FAKECUDA_FAIL_AFTER=N: every copy after the first N fails (CUDA_ERROR_ILLEGAL_ADDRESS, as a
 * device fault makes the real driver's calls fail), to see what hoop does when the driver does.
 *
 * Asynchronous copies (cuMemcpyAsync) and events really are asynchronous: a worker thread carries
 * out each stream's queue in order, FAKECUDA_ASYNC_DELAY_US microseconds per operation (default
 * 200), so that a caller that reads a copy's destination before waiting for its event or stream
 * reads stale bytes, and the tests catch it. cuEventSynchronize and cuStreamSynchronize wait for
 * the worker. Every stream has a queue and a worker of its own: the legacy default stream (NULL),
 * which the synchronous copies wait for, as the real ones do, and each stream created
 * (non-blocking, as hoop makes its own), not ordered after any other stream's work. The
 * synchronous copies keep the driver's documented exceptions: device to device, and from pageable
 * host memory to the device, they return with the copy still queued on the legacy default stream.
 *
 * Races: work queued on a stream that touches bytes that work on another stream writes (or writes
 * bytes it reads) aborts the process with both described, if that other work is still queued or
 * done but never waited for by the host (a stream or context synchronised, an event waited for, a
 * query that found the stream idle): nothing but the caller waiting orders two streams (hoop
 * records no cross-stream waits), so a GPU may or may not lose such a race, and the check catches
 * it whatever the timing here.
 */
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hoop.h"
#include "kernels_host.h"

#define MAX_ALLOCS 4096

typedef struct alloc {
  char *base;   /* the PROT_NONE reservation: the "device address" */
  char *shadow; /* where the bytes really are: a shared mapping of fd */
  size_t bytes;
  int fd;                /* the memfd; -1 for a peer's allocation opened by IPC, or a VMM mapping */
  unsigned long long id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
  int phys;              /* a VMM mapping (cuMemMap): its physical allocation's index + 1 */
} alloc;

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
/* Reserved address ranges (cuMemAddressReserve), each with a shadow range of its size where the
 * mappings' bytes are mapped at the same offsets. */
#define MAX_RESERVES 4096
struct reserve {
  char *base, *shadow;
  size_t bytes;
};
static struct reserve reserves[MAX_RESERVES];

/* Page-locked host memory (cuMemHostAlloc), which the synchronous copies treat otherwise. */
#define MAX_PINNED 1024
static struct pinned_range {
  char *base;
  size_t bytes;
} pinned_at[MAX_PINNED];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static alloc allocs[MAX_ALLOCS];
static int initialized;
static struct CUctx_st *const the_context = (struct CUctx_st *)0x1;
static __thread int ctx_depth; /* contexts pushed or set current on this thread */
static unsigned long long copies, copied_bytes, stream_syncs, pinned, kernels, ipc_opens, flushes,
    vmm_imports;
static unsigned long long next_id;
/* Streams: each one created has a queue of its own (queues[index]); NULL is the legacy default
 * stream, queues[0]. */
#define MAX_STREAMS 64
struct CUstream_st {
  int index;
};
static struct CUstream_st streams[MAX_STREAMS];
static int nstreams = 1;          /* streams[0] stands for the legacy default stream */
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

/* ---- the asynchronous queues: one for the legacy default stream (NULL) and one for each stream
 * created, each carried out in order by a worker thread of its own, so that work on one is not
 * ordered after work on another unless the caller waits for it */
typedef struct async_op {
  char *to;
  const char *from; /* NULL: an event's marker (or a kernel) */
  size_t bytes;
  unsigned long long seq;
  struct async_op *next;
  /* A kernel (kernel 1): kernels.cu's own code, compiled for the CPU (kernels_host.cc), run over
   * the grid it was launched with. */
  char *owned; /* freed once done: a pageable source's staged copy */
  int staged;  /* from is (was) owned: no one else's bytes */
  int kernel;
  fakecuda_kernel k;
  unsigned grid[3], block[3];
} async_op;

#define MAX_UNSEEN 4096
typedef struct queue {
  async_op *head, *tail;
  unsigned long long queued, done; /* sequence numbers of this queue */
  /* Done, but the host has not waited for them yet (a GPU may not have run them): the race check
   * looks at these too, whatever the timing here. */
  async_op *unseen_head, *unseen_tail;
  unsigned long long observed; /* what the host waited for */
  int nunseen;
  pthread_t worker;
  int started;
} queue;

struct CUevent_st {
  int queue;              /* where it was recorded */
  unsigned long long seq; /* the marker recorded last; 0: never recorded */
};

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER; /* work queued, or work done */
static queue queues[MAX_STREAMS]; /* [0]: the legacy default stream; then one per stream */
static long delay_us = -1;
static unsigned long long async_copies;

static int queue_of(CUstream stream) {
  return stream == NULL ? 0 : stream->index;
}

/* Whether stream is NULL or one this stand-in made. */
static int known_stream(CUstream stream) {
  return stream == NULL || (stream >= &streams[1] && stream < &streams[MAX_STREAMS] &&
                            stream->index == (int)(stream - streams));
}

static void *worker_main(void *arg) {
  queue *q = arg;
  pthread_mutex_lock(&queue_lock);
  for (;;) {
    while (!q->head)
      pthread_cond_wait(&queue_cond, &queue_lock);
    async_op *op = q->head;
    pthread_mutex_unlock(&queue_lock);
    if (delay_us > 0)
      usleep((useconds_t)delay_us);
    if (op->kernel)
      fakecuda_launch(&op->k, op->grid, op->block);
    else if (op->from)
      memmove(op->to, op->from, op->bytes);
    pthread_mutex_lock(&queue_lock);
    q->head = op->next;
    if (!q->head)
      q->tail = NULL;
    q->done = op->seq;
    free(op->owned);
    op->owned = NULL, op->next = NULL;
    if (op->seq > q->observed && (op->kernel || op->from)) {
      if (q->unseen_tail)
        q->unseen_tail->next = op;
      else
        q->unseen_head = op;
      q->unseen_tail = op;
      if (++q->nunseen > MAX_UNSEEN) { /* a bound on what is remembered: the oldest goes */
        async_op *old = q->unseen_head;
        q->unseen_head = old->next;
        free(old);
        q->nunseen--;
      }
    } else {
      free(op);
    }
    pthread_cond_broadcast(&queue_cond);
  }
  return NULL;
}

static async_op *running_sync; /* synchronous copies under way (queue_lock), by next */

/* The bytes an operation writes, and those it reads (up to 9 ranges), where they really are. */
static int ranges_of(const async_op *op, const char **w, const char *r[9], size_t *bytes) {
  int n = 0;
  *bytes = op->bytes;
  if (op->kernel) {
    *w = op->k.dst;
    if (op->k.kind == FAKECUDA_DIVIDE)
      r[n++] = op->k.dst;
    if (op->k.kind == FAKECUDA_REDUCE)
      r[n++] = op->k.a, r[n++] = op->k.b;
    for (int j = 0; op->k.kind == FAKECUDA_MANY && j < op->k.nsrcs && j < 8; j++)
      r[n++] = op->k.srcs[j];
  } else {
    *w = op->from ? op->to : NULL;
    if (op->from && !op->staged)
      r[n++] = op->from;
  }
  return n;
}

static int overlap(const char *a, size_t an, const char *b, size_t bn) {
  return a && b && an && bn && a < b + bn && b < a + an;
}

/* Whether x and y touch the same bytes and one of them writes them. */
static int conflict(const async_op *x, const async_op *y) {
  const char *xw, *yw, *xr[9], *yr[9];
  size_t xb, yb;
  int xn = ranges_of(x, &xw, xr, &xb), yn = ranges_of(y, &yw, yr, &yb);
  if (overlap(xw, xb, yw, yb))
    return 1;
  for (int i = 0; i < yn; i++)
    if (overlap(xw, xb, yr[i], yb))
      return 1;
  for (int i = 0; i < xn; i++)
    if (overlap(yw, yb, xr[i], xb))
      return 1;
  return 0;
}

/* Say what raced and abort: op on queue qi (-1: a synchronous copy) against p, which is where. */
static void race(int qi, const async_op *op, const async_op *p, const char *where) {
  fprintf(stderr,
          "fakecuda: race: a %s on stream %d (to %p from %p, %zu bytes) and a %s %s (to %p from "
          "%p, %zu bytes) touch the same bytes, one of them writing, with nothing ordering them\n",
          op->kernel ? "kernel" : "copy", qi, (void *)(op->kernel ? op->k.dst : op->to),
          (const void *)(op->kernel ? op->k.a : op->from), op->bytes, p->kernel ? "kernel" : "copy",
          where, (void *)(p->kernel ? p->k.dst : p->to),
          (const void *)(p->kernel ? p->k.a : p->from), p->bytes);
  abort();
}

/* The race check (queue_lock held): op, about to be queued on queue qi (-1: a synchronous copy,
 * which has waited for the legacy default stream), against the work on the other streams that the
 * host has not waited for, queued or done. Nothing orders work on two streams but the caller
 * waiting for one of them (hoop records no cross-stream waits), so touching the same bytes, one of
 * the two writing, is a race that a GPU may or may not lose: abort with what it was, whatever the
 * timing here. */
static void check_race(int qi, const async_op *op) {
  /* Synchronous copies under way on other threads (the legacy default stream's, as is queue 0). */
  for (const async_op *p = running_sync; qi > 0 && p; p = p->next)
    if (conflict(op, p))
      race(qi, op, p, "under way synchronously on another thread");
  char where[64];
  for (int j = 0; j < MAX_STREAMS; j++) {
    if (j == qi || (qi < 0 && j == 0))
      continue;
    for (int list = 0; list < 2; list++)
      for (const async_op *p = list ? queues[j].unseen_head : queues[j].head; p; p = p->next)
        if (conflict(op, p)) {
          snprintf(where, sizeof where, "%s on stream %d",
                   list ? "done but never waited for" : "still queued", j);
          race(qi, op, p, where);
        }
  }
}

/* Queue an operation (a copy, a marker, or like *kernel) on queue qi; its sequence number there,
 * or 0 when out of memory. */
static unsigned long long enqueue_op(int qi, char *to, const char *from, size_t bytes,
                                     const async_op *kernel) {
  async_op *op = calloc(1, sizeof *op);
  if (!op)
    return 0;
  queue *q = &queues[qi];
  pthread_mutex_lock(&queue_lock);
  if (delay_us < 0) {
    const char *text = getenv("FAKECUDA_ASYNC_DELAY_US");
    delay_us = text ? atol(text) : 200;
  }
  if (!q->started) {
    if (pthread_create(&q->worker, NULL, worker_main, q) != 0) {
      pthread_mutex_unlock(&queue_lock);
      free(op);
      return 0;
    }
    pthread_detach(q->worker);
    q->started = 1;
  }
  unsigned long long seq = ++q->queued;
  if (kernel)
    *op = *kernel;
  op->to = to, op->from = from, op->bytes = bytes, op->seq = seq, op->next = NULL;
  check_race(qi, op);
  if (q->tail)
    q->tail->next = op;
  else
    q->head = op;
  q->tail = op;
  pthread_cond_broadcast(&queue_cond);
  pthread_mutex_unlock(&queue_lock);
  return seq; /* not op->seq: the worker may have done and freed op by now */
}

static unsigned long long enqueue(int qi, char *to, const char *from, size_t bytes) {
  return enqueue_op(qi, to, from, bytes, NULL);
}

/* The host knows queue q has carried out seq (queue_lock held): what it did is ordered before
 * whatever the host queues next. */
static void observe(queue *q, unsigned long long seq) {
  if (seq > q->observed)
    q->observed = seq;
  while (q->unseen_head && q->unseen_head->seq <= q->observed) {
    async_op *op = q->unseen_head;
    q->unseen_head = op->next;
    free(op);
    q->nunseen--;
  }
  if (!q->unseen_head)
    q->unseen_tail = NULL;
}

/* Memory is going away, its addresses free for others: forget the done work that touched
 * addresses (work still queued on it would be a bug of the caller's). */
static void forget_done(void) {
  pthread_mutex_lock(&queue_lock);
  for (int i = 0; i < MAX_STREAMS; i++)
    observe(&queues[i], queues[i].done);
  pthread_mutex_unlock(&queue_lock);
}

/* Wait until queue qi has carried out seq (0: everything queued there so far). */
static void wait_done(int qi, unsigned long long seq) {
  queue *q = &queues[qi];
  pthread_mutex_lock(&queue_lock);
  if (seq == 0)
    seq = q->queued;
  while (q->done < seq)
    pthread_cond_wait(&queue_cond, &queue_lock);
  observe(q, seq);
  pthread_mutex_unlock(&queue_lock);
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
static alloc *find(const void *ptr, size_t len) {
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

static void drop(alloc *a) {
  munmap(a->base, a->bytes);
  munmap(a->shadow, a->bytes);
  if (a->fd >= 0)
    close(a->fd);
  memset(a, 0, sizeof *a);
}

/* Every queued operation carried out (the real cuMemFree synchronises the same way, so the worker
 * never runs on memory that is gone). */
static void drain(void) {
  for (int i = 0; i < MAX_STREAMS; i++)
    wait_done(i, 0);
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
static char *resolve(CUdeviceptr ptr, size_t bytes) {
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

static CUresult fake_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  char *to = resolve(dst, bytes), *from = resolve(src, bytes);
  CUresult counted = count_copy(bytes);
  async_copies += counted == CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  if (counted != CUDA_SUCCESS)
    return counted;
  return enqueue(queue_of(stream), to, from, bytes) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_memcpy_htod_async(CUdeviceptr dst, const void *src, size_t bytes,
                                       CUstream stream) {
  return fake_memcpy_async(dst, (CUdeviceptr)(uintptr_t)src, bytes, stream);
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
  if (!event || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  unsigned long long seq = enqueue(queue_of(stream), NULL, NULL, 0);
  if (!seq)
    return CUDA_ERROR_OUT_OF_MEMORY;
  event->queue = queue_of(stream);
  event->seq = seq;
  return CUDA_SUCCESS;
}

static CUresult fake_event_synchronize(CUevent event) {
  if (!event)
    return CUDA_ERROR_INVALID_HANDLE;
  if (event->seq)
    wait_done(event->queue, event->seq);
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
  const char *dmabuf = getenv("FAKECUDA_DMABUF"), *ordering = getenv("FAKECUDA_GDR_ORDERING"),
             *flush = getenv("FAKECUDA_GDR_FLUSH");
  if (attr == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
    *value = !(dmabuf && strcmp(dmabuf, "0") == 0);
  else if (attr == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING)
    *value = ordering ? atoi(ordering) : CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
  else if (attr == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)
    *value = flush && strcmp(flush, "0") == 0 ? 0 : CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
  else
    *value = 0;
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

static CUresult fake_flush_rdma_writes(CUflushGPUDirectRDMAWritesTarget target,
                                       CUflushGPUDirectRDMAWritesScope scope) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (target != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
      (scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER &&
       scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  flushes++;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_destroy(CUstream stream) {
  if (stream == NULL || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  wait_done(stream->index, 0); /* its work still runs to its end, as the driver's does */
  return CUDA_SUCCESS;
}

/* A stream with a queue of its own, not ordered after any other (hoop's are non-blocking); its
 * slot is not reused. */
static CUresult fake_stream_create(CUstream *stream, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&queue_lock);
  if (nstreams == MAX_STREAMS) {
    pthread_mutex_unlock(&queue_lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  streams[nstreams].index = nstreams;
  *stream = &streams[nstreams++];
  pthread_mutex_unlock(&queue_lock);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_synchronize(CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  stream_syncs++;
  pthread_mutex_unlock(&lock);
  wait_done(queue_of(stream), 0);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_query(CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  queue *q = &queues[queue_of(stream)];
  pthread_mutex_lock(&queue_lock);
  int done = q->done >= q->queued;
  if (done)
    observe(q, q->done);
  pthread_mutex_unlock(&queue_lock);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult fake_ctx_synchronize(void) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  drain();
  return CUDA_SUCCESS;
}

static CUresult fake_stream_get_ctx(CUstream stream, CUcontext *ctx) {
  if (stream == NULL || !known_stream(stream))
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

static CUresult fake_get_error_string(CUresult err, const char **text) {
  switch (err) {
  case CUDA_SUCCESS: *text = "no error"; break;
  case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
  case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
  case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
  case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported"; break;
  case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
  default: *text = "unknown error"; break;
  }
  return CUDA_SUCCESS;
}

/* ---- kernels: hoop's reduction kernels, lib/mem/kernels.cu compiled for the CPU
 * (kernels_host.cc), carried out by the queue's worker over the grid they were launched with */

struct CUmod_st {
  int unused;
};
static struct CUmod_st the_module;

struct CUfunc_st {
  void *fn;  /* kernels.cu's function */
  int kind;  /* FAKECUDA_REDUCE, _DIVIDE or _MANY */
  int dtype; /* for the element size */
};

#define MANY_MAX 8
struct many_sources { /* lib/mem/kernels.cu's, passed by value */
  const void *src[MANY_MAX];
  int n;
};

static const size_t esizes[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = 1,    [HOOP_UINT8] = 1,  [HOOP_INT32] = 4,   [HOOP_UINT32] = 4,
    [HOOP_INT64] = 8,   [HOOP_UINT64] = 8, [HOOP_FLOAT16] = 2, [HOOP_BFLOAT16] = 2,
    [HOOP_FLOAT32] = 4, [HOOP_FLOAT64] = 8};

static const char *const dtype_names[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = "int8",       [HOOP_UINT8] = "uint8",       [HOOP_INT32] = "int32",
    [HOOP_UINT32] = "uint32",   [HOOP_INT64] = "int64",       [HOOP_UINT64] = "uint64",
    [HOOP_FLOAT16] = "float16", [HOOP_BFLOAT16] = "bfloat16", [HOOP_FLOAT32] = "float32",
    [HOOP_FLOAT64] = "float64"};
static const char *const op_names[] = {"sum", "prod", "min", "max"};
/* [dtype][op]: hoop_reduce_, [dtype][4]: hoop_divide_, [dtype][5 + op]: hoop_many_ */
static struct CUfunc_st functions[HOOP_DTYPE_COUNT][9];

static CUresult fake_module_load_data(CUmodule *module, const void *image) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!image)
    return CUDA_ERROR_INVALID_VALUE;
  *module = &the_module;
  return CUDA_SUCCESS;
}

/* Only hoop's kernels, each found in kernels_host.cc by its name. */
static CUresult function_named(CUfunction *f, struct CUfunc_st *slot, const char *name, int kind,
                               int dtype) {
  void *fn = fakecuda_kernel_named(name);
  if (!fn)
    return CUDA_ERROR_NOT_FOUND;
  *slot = (struct CUfunc_st){fn, kind, dtype};
  *f = slot;
  return CUDA_SUCCESS;
}

static CUresult fake_module_get_function(CUfunction *f, CUmodule module, const char *name) {
  if (module != &the_module)
    return CUDA_ERROR_INVALID_HANDLE;
  char want[64];
  for (int d = 0; d < HOOP_DTYPE_COUNT; d++) {
    for (int o = 0; o < 4; o++) {
      snprintf(want, sizeof want, "hoop_reduce_%s_%s", dtype_names[d], op_names[o]);
      if (strcmp(name, want) == 0)
        return function_named(f, &functions[d][o], name, FAKECUDA_REDUCE, d);
      snprintf(want, sizeof want, "hoop_many_%s_%s", dtype_names[d], op_names[o]);
      if (strcmp(name, want) == 0)
        return function_named(f, &functions[d][5 + o], name, FAKECUDA_MANY, d);
    }
    snprintf(want, sizeof want, "hoop_divide_%s", dtype_names[d]);
    if (strcmp(name, want) == 0)
      return function_named(f, &functions[d][4], name, FAKECUDA_DIVIDE, d);
  }
  return CUDA_ERROR_NOT_FOUND;
}

/* The parameters are kernels.cu's: (dst, a, b, count) for a reduction, (buf, count, nranks) for
 * the division, (dst, sources, count, divide) for the many-source reduction; every pointer must be
 * device memory of this process (its own or mapped by IPC), as a kernel cannot read host memory
 * that is not mapped for it. The launch's shape is checked as the driver does (at most 1024
 * threads a block, a grid's y and z below 65536) and the grid is run as it is. */
static CUresult fake_launch_kernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shared, CUstream stream, void **params,
                                   void **extra) {
  (void)shared, (void)extra;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!f || !params || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 ||
      bz > 64 || (unsigned long long)bx * by * bz > 1024)
    return CUDA_ERROR_INVALID_VALUE;
  async_op op = {.kernel = 1, .grid = {gx, gy, gz}, .block = {bx, by, bz}};
  fakecuda_kernel *k = &op.k;
  k->fn = f->fn, k->kind = f->kind;
  size_t esize = esizes[f->dtype];
  int bad = 0;
  pthread_mutex_lock(&lock);
  if (f->kind == FAKECUDA_MANY) {
    const struct many_sources *sources = params[1];
    k->count = *(size_t *)params[2];
    k->divide = *(int *)params[3]; /* the division, 0: none */
    size_t bytes = k->count * esize;
    bad = sources->n < 1 || sources->n > MANY_MAX;
    for (int j = 0; !bad && j < sources->n; j++)
      if (!find(sources->src[j], bytes))
        bad = 1;
      else
        k->srcs[j] = resolve((CUdeviceptr)(uintptr_t)sources->src[j], bytes);
    k->nsrcs = sources->n;
  } else if (f->kind == FAKECUDA_REDUCE) {
    k->count = *(size_t *)params[3];
    size_t bytes = k->count * esize;
    bad = !find(*(void **)params[1], bytes) || !find(*(void **)params[2], bytes);
    if (!bad) {
      k->a = resolve((CUdeviceptr)(uintptr_t) * (void **)params[1], bytes);
      k->b = resolve((CUdeviceptr)(uintptr_t) * (void **)params[2], bytes);
    }
  } else {
    k->count = *(size_t *)params[1];
    k->divide = *(int *)params[2];
  }
  size_t bytes = k->count * esize;
  if (bad || !find(*(void **)params[0], bytes)) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  k->dst = resolve((CUdeviceptr)(uintptr_t) * (void **)params[0], bytes);
  kernels++;
  pthread_mutex_unlock(&lock);
  return enqueue_op(queue_of(stream), NULL, NULL, bytes, &op) ? CUDA_SUCCESS
                                                              : CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- CUDA IPC between processes ----------------------------------------------------------- */

typedef struct fake_ipc_handle {
  char magic[8]; /* "fakecuda" */
  int32_t pid, fd;
  uint64_t bytes, id;
} fake_ipc_handle;

/* ---- the virtual memory management API (cuMemCreate and kin) ------------------------------ */

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
    {"cuMemcpyDtoD", (void *)fake_memcpy},
    {"cuCtxSynchronize", (void *)fake_ctx_synchronize},
    {"cuPointerGetAttributes", (void *)fake_pointer_get_attributes},
    {"cuGetErrorString", (void *)fake_get_error_string},
    {"cuStreamCreate", (void *)fake_stream_create},
    {"cuStreamSynchronize", (void *)fake_stream_synchronize},
    {"cuStreamQuery", (void *)fake_stream_query},
    {"cuStreamGetCtx", (void *)fake_stream_get_ctx},
    {"cuMemHostAlloc", (void *)fake_mem_host_alloc},
    {"cuMemFreeHost", (void *)fake_mem_free_host},
    {"cuMemcpyAsync", (void *)fake_memcpy_async},
    {"cuMemcpyHtoDAsync", (void *)fake_memcpy_htod_async},
    {"cuEventCreate", (void *)fake_event_create},
    {"cuEventDestroy", (void *)fake_event_destroy},
    {"cuEventRecord", (void *)fake_event_record},
    {"cuEventSynchronize", (void *)fake_event_synchronize},
    {"cuStreamDestroy", (void *)fake_stream_destroy},
    {"cuDeviceGetAttribute", (void *)fake_device_get_attribute},
    {"cuMemGetHandleForAddressRange", (void *)fake_get_handle_for_range},
    {"cuFlushGPUDirectRDMAWrites", (void *)fake_flush_rdma_writes},
    {"cuIpcGetMemHandle", (void *)fake_ipc_get_mem_handle},
    {"cuIpcOpenMemHandle", (void *)fake_ipc_open_mem_handle},
    {"cuIpcCloseMemHandle", (void *)fake_ipc_close_mem_handle},
    {"cuModuleLoadData", (void *)fake_module_load_data},
    {"cuModuleGetFunction", (void *)fake_module_get_function},
    {"cuLaunchKernel", (void *)fake_launch_kernel},
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
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)version;
  (void)flags;
  const char *kernels_env = getenv("FAKECUDA_KERNELS");
  int no_kernels = kernels_env && strcmp(kernels_env, "0") == 0;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(symbol, table[i].name) == 0 &&
        !(no_kernels &&
          (strncmp(symbol, "cuModule", 8) == 0 || strcmp(symbol, "cuLaunchKernel") == 0))) {
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
  FILE *f = path && (copies || kernels) ? fopen(path, "a") : NULL;
  if (f) {
    fprintf(f,
            "copies %llu bytes %llu stream_syncs %llu pinned %llu async %llu kernels %llu "
            "ipc_opens %llu flushes %llu vmm_imports %llu\n",
            copies, copied_bytes, stream_syncs, pinned, async_copies, kernels, ipc_opens, flushes,
            vmm_imports);
    fclose(f);
  }
}
