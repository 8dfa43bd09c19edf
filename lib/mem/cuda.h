/* cuda.h - CUDA memory as a kind of buffer: is a pointer host or device memory, and copies between
 * the two. The driver (libcuda.so.1, or HOOP_CUDA_LIBRARY) is loaded at run time at the first
 * collective that asks, never in hoop_init and never initialised by hoop (cuInit is the program's
 * business: a program that has not called it has no device memory). libhoop links no CUDA
 * library: a build with CUDA runs unchanged where there is no driver, every buffer then being host
 * memory. Without --with-cuda these are stubs that say "host" (cuda/stubs.c). The code is in
 * cuda/, a file for each part: the driver and pointer kinds, copies, pipelined copies, GPUDirect
 * RDMA's questions, the kernels, IPC (legacy and VMM) and the VMM descriptor server.
 */
#ifndef HOOP__MEM_CUDA_H
#define HOOP__MEM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "hoop.h"
#include "mem/kind.h"

typedef enum hoop__mem_kind {
  HOOP__MEM_HOST = 0, /* ordinary or pinned host memory: the CPU reads it */
  HOOP__MEM_DEVICE,   /* device memory: only the driver reads it */
  HOOP__MEM_MANAGED,  /* managed memory: the CPU reads it too (pages migrate) */
} hoop__mem_kind;

/* Whether a usable driver is loaded (loading it on the first call). */
int hoop__cuda_loaded(void);

/* The kind of memory ptr points to: one driver query, HOST without a driver or when the program
 * has not initialised CUDA. */
hoop__mem_kind hoop__mem_kind_of(const void *ptr);

/* Copy bytes from src to dst, either or both of them device memory, synchronously: on return the
 * data is in dst. HOOP_OK, or HOOP_ERR_SYSTEM with the driver's message recorded on comm. */
hoop_result hoop__cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes);

/* Copy bytes from src to dst whatever memory each is in: memmove for host memory, the driver for
 * device memory. */
hoop_result hoop__mem_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes);

/* Page-locked host memory for the stage (cuMemHostAlloc, portable to every context), allocated in
 * the context of the device memory at near, so that copies to and from device memory run at the
 * bus's speed; NULL where the driver cannot (the caller then uses ordinary memory). Freed with
 * hoop__cuda_host_free. */
void *hoop__cuda_host_alloc(size_t bytes, const void *near);
void hoop__cuda_host_free(void *ptr);
/* Host memory to stage through: page-locked as above where the driver gives it, else ordinary
 * (64-byte aligned); *pinned says which. NULL when neither can be had. */
void *hoop__host_stage_alloc(size_t bytes, const void *near, int *pinned);
void hoop__host_stage_free(void *ptr, int pinned);

/* Wait until the work queued on stream (a CUstream; NULL: the legacy default stream of buf's
 * context, or nothing to wait for if buf is host memory) is done. HOOP_ERR_UNSUPPORTED for a stream
 * without CUDA support; call names the public call in messages. */
hoop_result hoop__cuda_stream_wait(hoop_comm *comm, const char *call, void *stream,
                                   const void *buf);

/* Copies that overlap a collective (mem/stage.c's pipelined ring): a stream of hoop's own in the
 * context of a device buffer, and events recorded after copies on it. One pipe per communicator,
 * made again when a call's device memory is in another context. */
typedef struct hoop__cuda_pipe hoop__cuda_pipe;
/* comm's pipe for the device memory at ptr, with at least nevents events; NULL (nothing recorded)
 * where the driver has no asynchronous copies or events, or they fail: stage synchronously then. */
hoop__cuda_pipe *hoop__cuda_pipe_get(hoop_comm *comm, const void *ptr, int nevents);
/* Queue a copy of bytes from src to dst, then record event (unless it is -1). */
hoop_result hoop__cuda_pipe_copy(hoop_comm *comm, hoop__cuda_pipe *pipe, void *dst, const void *src,
                                 size_t bytes, int event);
/* Wait for event: the copies queued before it are done. */
hoop_result hoop__cuda_pipe_wait(hoop_comm *comm, hoop__cuda_pipe *pipe, int event);
/* Wait for everything queued on the pipe. */
hoop_result hoop__cuda_pipe_drain(hoop_comm *comm, hoop__cuda_pipe *pipe);
/* Release comm's pipe (hoop_finalize). */
void hoop__cuda_pipe_free(hoop_comm *comm);

/* For GPUDirect RDMA (mem/gdr.h): the dma-buf attribute of the device that holds ptr (1, 0, or -1
 * when the driver cannot say), and a dma-buf fd for device memory [base, base + len), page
 * aligned (0, or -1 with why). */
int hoop__cuda_dmabuf_supported(const void *ptr);
int hoop__cuda_dmabuf_fd(const void *base, size_t len, int *fd, char *why, size_t whylen);
/* Whether data the RDMA device wrote into the device memory at ptr must be flushed before a kernel
 * reads it: 0 (the GPU orders such writes itself), 1 (hoop__cuda_gdr_flush after each arrival), -1
 * when it must but the driver cannot (why says so). */
int hoop__cuda_gdr_flush_mode(const void *ptr, char *why, size_t whylen);
hoop_result hoop__cuda_gdr_flush(hoop_comm *comm, const void *near);

/* The reduction kernels of reduce.h on the GPU (lib/mem/cuda/kernels.cu), bit for bit the same
 * results: dst = a op b over count elements, all three in the device memory of one context
 * (dst may be a or b); and AVG's final division. Synchronous: done on return. HOOP_ERR_UNSUPPORTED
 * when this build has no kernels (nvcc was not found) or the driver cannot load them. */
int hoop__cuda_kernels_built(void);
hoop_result hoop__cuda_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op);
hoop_result hoop__cuda_reduce_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                     hoop_op op, int nranks);

/* ---- CUDA IPC between ranks of one host (coll/path_ipc.c)
 * ------------------------------------------
 */

#define HOOP__CUDA_IPC_HANDLE_BYTES 64

/* What a peer needs to map a device buffer of this process: the IPC handle of the allocation that
 * holds it, where the buffer lies in it, and the allocation's identity (its base address here and
 * the driver's buffer id, which changes when memory is freed and allocated again). */
/* VMM allocations one buffer may lie across (an expandable segment's physical pieces). */
#define HOOP__CUDA_VMM_PIECES 16

typedef struct hoop__cuda_vmm_piece {
  uint64_t start, size; /* where it is mapped in the exporting process */
  /* Its identity: the buffer id there and the allocation handle mapped there (either may be
   * reused once freed; both at once, at the same address and size, hardly). */
  uint64_t buffer_id, handle;
} hoop__cuda_vmm_piece;

typedef struct hoop__cuda_export {
  unsigned char handle[HOOP__CUDA_IPC_HANDLE_BYTES]; /* legacy: the IPC handle */
  uint64_t base;      /* the allocation's address in the exporting process (VMM: the first's) */
  uint64_t size;      /* the allocation's bytes (VMM: all the pieces', one after the other) */
  uint64_t offset;    /* of the buffer in the allocation */
  uint64_t buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID (VMM: the first piece's) */
  uint32_t kind;      /* HOOP__CUDA_EXPORT_LEGACY or HOOP__CUDA_EXPORT_VMM */
  int32_t npieces;    /* VMM: the allocations mapped one after the other from base */
  uint64_t pid;       /* VMM: the exporting process */
  uint64_t server;    /* VMM: the nonce that names its descriptor server (cuda/vmm_server.c) */
  uint64_t token[2];  /* VMM: random, what a peer shows that server to be given descriptors */
  hoop__cuda_vmm_piece piece[HOOP__CUDA_VMM_PIECES];
} hoop__cuda_export;

#define HOOP__CUDA_EXPORT_LEGACY 0u /* cudaMalloc's memory: a legacy IPC handle */
/* Memory of the virtual memory management API (cuMemCreate and cuMemMap: PyTorch's expandable
 * segments, for one), whose allocations were created exportable as POSIX file descriptors: the
 * importer asks the exporting process's descriptor server (a Unix socket) for each allocation's
 * descriptor, imports it, reserves address space, maps and enables access. A buffer across several
 * allocations mapped one after the other (up to HOOP__CUDA_VMM_PIECES) is mapped the same way
 * here, piece after piece. */
#define HOOP__CUDA_EXPORT_VMM 1u

/* Fill out for the len bytes of device memory at ptr (0), or say why they cannot be exported (-1):
 * a legacy IPC handle where the driver gives one, else VMM file descriptors. Exports are cached
 * by buffer id: a buffer exported before costs one pointer query. */
int hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                          size_t whylen);
/* Whether two exports name the same memory, piece for piece (a mapping of one serves the other);
 * whether they overlap without being the same (the exporter freed one since: its mapping is
 * stale). */
int hoop__cuda_export_same(const hoop__cuda_export *a, const hoop__cuda_export *b);
int hoop__cuda_export_conflict(const hoop__cuda_export *a, const hoop__cuda_export *b);
/* Map a peer's allocation into the context of the device memory at near: its base here (0), or
 * why not (-1). Closed with hoop__cuda_ipc_close, in that context (hoop__cuda_context_of(near)):
 * the mapping's own pointer attributes may name the exporter's device. */
int hoop__cuda_ipc_open(const void *near, const hoop__cuda_export *export, void **base, char *why,
                        size_t whylen);
void hoop__cuda_ipc_close(void *context, void *base, const hoop__cuda_export *export);
/* The context of the device memory at ptr (a CUcontext), or NULL for other memory. */
void *hoop__cuda_context_of(const void *ptr);

/* Work queued on the kernel stream of hoop's own in the context of the device memory at its first
 * pointer, in order, not waited for: the reduction kernels (dst = a op b; AVG's division), a copy
 * between any two device addresses of that context (peers' mapped memory included), or between
 * one and host memory (in the device side's context). a, b and src
 * may be peers' memory mapped by hoop__cuda_ipc_open. hoop__cuda_sync waits for all of it. */
hoop_result hoop__cuda_reduce3_async(hoop_comm *comm, void *dst, const void *a, const void *b,
                                     size_t count, hoop_dtype dtype, hoop_op op);
hoop_result hoop__cuda_finish_async(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                    hoop_op op, int nranks);
hoop_result hoop__cuda_copy_async(hoop_comm *comm, void *dst, const void *src, size_t bytes);
/* dst = ((srcs[0] op srcs[1]) op srcs[2]) ... over count elements in one pass (each step rounded as
 * reduce3's chain would be), then divided by divide unless it is 0 (AVG: the rank count); 1 to
 * HOOP__CUDA_MANY_MAX sources; dst may be one of them. */
#define HOOP__CUDA_MANY_MAX 8
hoop_result hoop__cuda_reduce_many_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide);
/* The same over reproducible mode's fixed tree (kernels.cu's hoop_tree_*). */
hoop_result hoop__cuda_reduce_tree_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide);
/* The wire formats of compressed reductions (mem/compress.h's, bit for bit) on device memory of
 * one context, queued as the above: piece (hoop__compress_bytes(format, count) bytes) = count
 * elements of in (float32, float16 or bfloat16) encoded in format (its flags: stochastic rounding
 * with rounding's draws), residual (count floats, or NULL) added first and then left holding what
 * the encoding dropped; acc[i] += element i of the piece, in float32; out = the piece decoded into
 * dtype; widen: out = in's count elements as float32s; narrow: out = count float32s in dtype.
 * HOOP_ERR_INVALID_ARG for another dtype or format. */
hoop__encode_fn hoop__cuda_compress_async;
hoop__decode_add_fn hoop__cuda_expand_add_async;
hoop__decode_fn hoop__cuda_expand_async;
hoop__widen_fn hoop__cuda_widen_async;
hoop__narrow_fn hoop__cuda_narrow_async;
hoop_result hoop__cuda_sync(hoop_comm *comm, const void *near);
/* The same, calling meanwhile(comm) between looks at the stream (the GPUDirect path moves the
 * transports' messages while its kernels run); its failure ends the wait early and is returned,
 * once the queued work is done all the same. */
hoop_result hoop__cuda_sync_busy(hoop_comm *comm, const void *near,
                                 hoop_result (*meanwhile)(hoop_comm *comm));
/* Make hoop's stream in near's context, and load the kernels there if kernels, now (no waiting):
 * HOOP_OK, or why they cannot be had (recorded on comm). */
hoop_result hoop__cuda_ready(hoop_comm *comm, const void *near, int kernels);

/* Device memory of bytes in the context of near (scratch for the IPC allreduce), or NULL. */
void *hoop__cuda_alloc(size_t bytes, const void *near);
void hoop__cuda_free(void *ptr);

#endif /* HOOP__MEM_CUDA_H */
