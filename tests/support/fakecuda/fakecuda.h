/* fakecuda.h - the stand-in for the CUDA driver (libcuda.so.1) where there is no GPU, so that CI
 * runs hoop's device-buffer paths: HOOP_CUDA_LIBRARY=tests/.libs/libfakecuda.so; what it does,
 * and what its files share.
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
 * lib/mem/cuda/kernels.cu's own code compiled for the CPU (kernels_host.cc). cuLaunchKernel
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
 * out each stream's queue in order, each operation no sooner than FAKECUDA_ASYNC_DELAY_US
 * microseconds after it was queued (default 200), so that a caller that reads a copy's
 * destination before waiting for its event or stream reads stale bytes, and the tests catch it.
 * cuEventSynchronize and cuStreamSynchronize wait for the worker. Every stream has a queue and a
 * worker of its own: the legacy default stream (NULL), which the synchronous copies wait for, as
 * the real ones do, and each stream created (non-blocking, as hoop makes its own), not ordered
 * after any other stream's work. The synchronous copies keep the driver's documented exceptions:
 * device to device, and from pageable host memory to the device, they return with the copy still
 * queued on the legacy default stream.
 *
 * Races: work queued on a stream that touches bytes that work on another stream writes (or writes
 * bytes it reads) aborts the process with both described, if that other work is still queued or
 * done but never waited for by the host (a stream or context synchronised, an event waited for, a
 * query that found the stream idle): nothing but the caller waiting orders two streams (hoop
 * records no cross-stream waits), so a GPU may or may not lose such a race, and the check catches
 * it whatever the timing here.
 *
 * Its files: driver.c (cuGetProcAddress_v2 and the table of what it answers, initialisation, the
 * device and its contexts, GPUDirect RDMA's questions, error strings, the count file), memory.c
 * (cuMemAlloc's device memory, page-locked host memory, the synchronous copies, pointer
 * attributes), streams.c (the asynchronous queues, streams, events, the race check), kernels.c
 * (modules and launches), ipc.c (legacy CUDA IPC between processes), vmm.c (the virtual memory
 * management API), kernels_host.cc (lib/mem/cuda/kernels.cu compiled for the CPU).
 */
#ifndef HOOP_TESTS_FAKECUDA_H
#define HOOP_TESTS_FAKECUDA_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>

#include "kernels_host.h"

/* What the files share is hidden: the library exports cuGetProcAddress_v2, through which hoop
 * finds every entry point, and kernels_host.cc's names (it finds the kernels by name). */
#pragma GCC visibility push(hidden)

/* ---- the driver's state (driver.c) */
extern pthread_mutex_t lock; /* the allocations, the reservations, page-locked ranges, the counts */
extern int initialized;
extern struct CUctx_st *const the_context;
extern __thread int ctx_depth; /* contexts pushed or set current on this thread */
/* What FAKECUDA_COUNT reports (under lock). */
extern unsigned long long copies, copied_bytes, stream_syncs, pinned, kernels, ipc_opens, flushes,
    vmm_imports, async_copies, codecs;

/* The entry points a file answers for, by the name cuGetProcAddress_v2 is asked for; each table
 * ends with {NULL, NULL}. */
typedef struct fakecuda_entry {
  const char *name;
  void *fn;
} fakecuda_entry;
extern const fakecuda_entry fakecuda_memory_entries[], fakecuda_stream_entries[],
    fakecuda_kernel_entries[], fakecuda_ipc_entries[], fakecuda_vmm_entries[];

/* ---- device memory (memory.c): cuMemAlloc's, a peer's opened by IPC, and VMM mappings */
#define MAX_ALLOCS 4096

typedef struct alloc {
  char *base;   /* the PROT_NONE reservation: the "device address" */
  char *shadow; /* where the bytes really are: a shared mapping of fd */
  size_t bytes;
  int fd;                /* the memfd; -1 for a peer's allocation opened by IPC, or a VMM mapping */
  unsigned long long id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
  int phys;              /* a VMM mapping (cuMemMap): its physical allocation's index + 1 */
} alloc;
extern alloc allocs[MAX_ALLOCS];
extern unsigned long long next_id; /* the last CU_POINTER_ATTRIBUTE_BUFFER_ID given */

/* The allocation that holds [ptr, ptr + len), or NULL (lock held). */
alloc *find(const void *ptr, size_t len);
/* Where the bytes at ptr really are: the shadow of device memory, or ptr itself (lock held). */
char *resolve(CUdeviceptr ptr, size_t bytes);
/* Unmap an allocation and forget it (lock held). */
void drop(alloc *a);
/* Count a copy (under lock): CUDA_SUCCESS, or the failure FAKECUDA_FAIL_AFTER asks for. */
CUresult count_copy(size_t bytes);

/* ---- reserved address ranges (vmm.c) */
/* cuMemAddressReserve's ranges, each with a shadow range of its size where the
 * mappings' bytes are mapped at the same offsets. */
#define MAX_RESERVES 4096
struct reserve {
  char *base, *shadow;
  size_t bytes;
};
extern struct reserve reserves[MAX_RESERVES];

/* ---- the asynchronous queues (streams.c) */
/* What a queue holds: a copy, an event's marker, or a kernel. */
typedef struct async_op {
  char *to;
  const char *from; /* NULL: an event's marker (or a kernel) */
  size_t bytes;
  unsigned long long seq;
  unsigned long long due_ns; /* not carried out before this (CLOCK_MONOTONIC): queued + the delay */
  struct async_op *next;
  /* A kernel (kernel 1): kernels.cu's own code, compiled for the CPU (kernels_host.cc), run over
   * the grid it was launched with. */
  char *owned; /* freed once done: a pageable source's staged copy */
  int staged;  /* from is (was) owned: no one else's bytes */
  int kernel;
  fakecuda_kernel k;
  unsigned grid[3], block[3];
} async_op;

extern pthread_mutex_t queue_lock;
extern async_op *running_sync; /* synchronous copies under way (queue_lock), by next */

/* The queue of a stream (0: the legacy default stream, NULL), and whether it is NULL or one this
 * stand-in made. */
int queue_of(CUstream stream);
int known_stream(CUstream stream);
/* Abort if op, about to be queued on queue qi (-1: a synchronous copy), races with work on another
 * stream that the host has not waited for (queue_lock held). */
void check_race(int qi, const async_op *op);
/* Queue an operation (a copy, a marker, or like *kernel) on queue qi; its sequence number there,
 * or 0 when out of memory. */
unsigned long long enqueue_op(int qi, char *to, const char *from, size_t bytes,
                              const async_op *kernel);
/* Wait until queue qi has carried out seq (0: everything queued there so far). */
void wait_done(int qi, unsigned long long seq);
/* Every queued operation carried out. */
void drain(void);
/* Memory is going away: forget the done work that touched its addresses. */
void forget_done(void);

#pragma GCC visibility pop

#endif
