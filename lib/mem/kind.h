/* kind.h - memory kinds: the operations an algorithm performs on the memory it works in, behind
 * one ops table, so that one ring serves every kind of buffer (UCC keeps its mc/ and ec/ layers
 * apart the same way). The algorithms call the hoop__kind_* wrappers below and never ask what
 * memory they run on; the dispatcher sets comm->mem for the running call from the path the tuning
 * table chose (host memory, a host copy fed while the algorithm runs, device memory), and puts
 * the host kind back after it.
 *
 * Kinds: hoop__mem_host (mem/host.c), hoop__mem_piped (mem/stage.c: host memory whose input is
 * still arriving from the device and whose result leaves for it piece by piece), hoop__mem_cuda
 * (mem/cuda/kind.c: device memory, the GPU reducing and copying). */
#ifndef HOOP__MEM_KIND_H
#define HOOP__MEM_KIND_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* What a kind's memory allows besides the operations (the tuning table's device paths need them).
 * MAP: a peer on this host can map it (IPC); NET: a transport can register it for the network. */
#define HOOP__MEMCAP_MAP 1u
#define HOOP__MEMCAP_NET 2u

/* The compressed calls' codec, as each kind gives it (hoop__mem_ops' encode, decode_add, decode,
 * widen and narrow). */
typedef hoop_result hoop__encode_fn(hoop_comm *comm, int format, void *piece, const void *in,
                                    hoop_dtype dtype, size_t count, float *residual, uint64_t seed,
                                    uint64_t first);
typedef hoop_result hoop__decode_add_fn(hoop_comm *comm, int format, float *acc, const void *piece,
                                        size_t count);
typedef hoop_result hoop__decode_fn(hoop_comm *comm, int format, void *out, hoop_dtype dtype,
                                    const void *piece, size_t count);
typedef hoop_result hoop__widen_fn(hoop_comm *comm, float *out, const void *in, hoop_dtype dtype,
                                   size_t count);
typedef hoop_result hoop__narrow_fn(hoop_comm *comm, void *out, hoop_dtype dtype, const float *in,
                                    size_t count);

typedef struct hoop__mem_ops {
  const char *name; /* for the log and the trace: "host", "cuda" */
  unsigned caps;    /* HOOP__MEMCAP_* */
  /* dst = a op b over count elements (dst may be a or b), done when it returns. */
  hoop_result (*reduce3)(hoop_comm *comm, void *dst, const void *a, const void *b, size_t count,
                         hoop_dtype dtype, hoop_op op);
  /* dst = the nsrcs sources over reproducible mode's fixed tree (mem/reduce.h,
   * hoop__reduce_fixed), AVG divided by nsrcs; dst may be one of them. NULL: the kind cannot
   * (the dispatcher keeps reproducible calls off it). */
  hoop_result (*reduce_fixed)(hoop_comm *comm, void *dst, const void *const *srcs, int nsrcs,
                              size_t count, hoop_dtype dtype, hoop_op op);
  /* AVG's final division by nranks (nothing for the other ops), done when it returns. */
  hoop_result (*finish)(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, hoop_op op,
                        int nranks);
  /* bytes from src to dst (they may overlap), done when it returns. */
  hoop_result (*copy)(hoop_comm *comm, void *dst, const void *src, size_t bytes);
  /* Scratch of at least bytes that the transports receive into and reduce3 reads, valid until the
   * next call of it; NULL with the error recorded. Taken before any receive into it is posted. */
  void *(*scratch)(hoop_comm *comm, size_t bytes);
  /* The two synchronisation points of a buffer that is fed while the algorithm runs (NULL: the
   * kind's buffers are always ready): [ptr, ptr + len) of the input is about to be read; of the
   * result, is final. */
  hoop_result (*need)(hoop_comm *comm, const void *ptr, size_t len);
  void (*done)(hoop_comm *comm, const void *ptr, size_t len);

  /* Queued work, for the algorithms that read their peers' buffers mapped into this process
   * (coll/mapped.c); NULL where the kind has no queue. Nothing is done until sync returns. */
  /* dst = ((srcs[0] op srcs[1]) op srcs[2]) ... over count elements, each step rounded as reduce3
   * rounds it, then divided by divide unless it is 0; 1 to many_max sources, dst may be one. */
  hoop_result (*reduce_many)(hoop_comm *comm, void *dst, const void *const *srcs, int nsrcs,
                             size_t count, hoop_dtype dtype, hoop_op op, int divide);
  /* The same over reproducible mode's fixed tree (hoop__reduce_fixed's, bit for bit), with the
   * divide (AVG) after it; NULL where the kind cannot. */
  hoop_result (*reduce_many_tree)(hoop_comm *comm, void *dst, const void *const *srcs, int nsrcs,
                                  size_t count, hoop_dtype dtype, hoop_op op, int divide);
  int many_max; /* at most HOOP__MEM_MANY_MAX */
  hoop_result (*copy_queued)(hoop_comm *comm, void *dst, const void *src, size_t bytes);
  hoop_result (*sync)(hoop_comm *comm);

  /* The wire formats of compressed calls (mem/compress.h's, bit for bit; coll/compressed.c), on
   * this kind's memory, queued where the kind queues (copy orders after them, sync waits), done
   * when they return on the host; NULL where the kind has none. encode: piece = count elements of
   * in encoded, residual (count floats, or NULL) added first and left holding what was dropped,
   * stochastic with seed's draws from first where seed is not 0; decode_add: acc += the piece, in
   * float32; decode: out = the piece in dtype; widen: out = in as float32; narrow: out = in
   * (float32) in dtype. */
  hoop__encode_fn *encode;
  hoop__decode_add_fn *decode_add;
  hoop__decode_fn *decode;
  hoop__widen_fn *widen;
  hoop__narrow_fn *narrow;

  /* The device memory's own operations, for the device paths (NULL for host memory). */
  const struct hoop__device_ops *device;
} hoop__mem_ops;

struct hoop__cuda_export;

/* What the device paths (coll/path_ipc.c, coll/path_gdr.c) do with device memory besides the
 * algorithms' operations, through the device kind (hoop__mem_cuda.device), so that lib/coll names
 * no driver function. In a build without CUDA every one says so. */
typedef struct hoop__device_ops {
  /* The context of the device memory at ptr, or NULL for other memory. */
  void *(*context_of)(const void *ptr);
  /* Fill out for the len bytes at ptr (0), or say why they cannot be shared with another process
   * on this host (-1). */
  int (*ipc_export)(const void *ptr, size_t len, struct hoop__cuda_export *out, char *why,
                    size_t whylen);
  /* The library's stream in near's context, and its kernels if kernels, ready now: HOOP_OK or the
   * error recorded. */
  hoop_result (*ready)(hoop_comm *comm, const void *near, int kernels);
  /* Wait for the work queued on stream (NULL: buf's context's default stream). */
  hoop_result (*stream_wait)(hoop_comm *comm, const char *call, void *stream, const void *buf);
  /* Before comm->mem becomes the device kind: the call's memory is at near; flush: what a
   * network device writes must be flushed before the GPU reads it; registered: the scratch is
   * registered with every peer's transport. */
  hoop_result (*begin)(hoop_comm *comm, const void *near, int flush, int registered);
  /* The call's device scratch of at least bytes, made now; NULL with the error recorded. */
  void *(*scratch)(hoop_comm *comm, size_t bytes);
  /* What a network device wrote into the call's memory is visible to the GPU. */
  hoop_result (*flushed)(hoop_comm *comm);
  /* Whether network writes into the device memory at ptr need a flush before a kernel reads
   * them: 0, 1, or -1 when they would and cannot have one (why says so). */
  int (*gdr_flush_mode)(const void *ptr, char *why, size_t whylen);
} hoop__device_ops;

/* The most sources a kind's reduce_many takes. */
#define HOOP__MEM_MANY_MAX 16

/* The memory kinds' state of a communicator (mem/state.h), made with it (NULL: out of memory)
 * and freed with it last, after the kinds' own frees. */
hoop__mem_state *hoop__mem_state_new(void);
void hoop__mem_state_free(hoop_comm *comm);
/* How many of the user's registrations on comm's net are of device memory (GPUDirect's path
 * takes a call only when some are). */
size_t hoop__mem_device_regs(const hoop_comm *comm);

extern const hoop__mem_ops hoop__mem_host;
extern const hoop__mem_ops hoop__mem_piped;
extern const hoop__mem_ops hoop__mem_cuda;

static inline hoop_result hoop__kind_reduce3(hoop_comm *comm, void *dst, const void *a,
                                             const void *b, size_t count, hoop_dtype dtype,
                                             hoop_op op) {
  return comm->mem->reduce3(comm, dst, a, b, count, dtype, op);
}
static inline hoop_result hoop__kind_reduce_fixed(hoop_comm *comm, void *dst,
                                                  const void *const *srcs, int nsrcs, size_t count,
                                                  hoop_dtype dtype, hoop_op op) {
  if (!comm->mem->reduce_fixed)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                           "%s: reproducible mode cannot reduce in %s memory", comm->call,
                           comm->mem->name);
  return comm->mem->reduce_fixed(comm, dst, srcs, nsrcs, count, dtype, op);
}
static inline hoop_result hoop__kind_finish(hoop_comm *comm, void *buf, size_t count,
                                            hoop_dtype dtype, hoop_op op, int nranks) {
  return comm->mem->finish(comm, buf, count, dtype, op, nranks);
}
static inline hoop_result hoop__kind_copy(hoop_comm *comm, void *dst, const void *src,
                                          size_t bytes) {
  return comm->mem->copy(comm, dst, src, bytes);
}
static inline void *hoop__kind_scratch(hoop_comm *comm, size_t bytes) {
  return comm->mem->scratch(comm, bytes);
}
static inline hoop_result hoop__kind_need(hoop_comm *comm, const void *ptr, size_t len) {
  return comm->mem->need ? comm->mem->need(comm, ptr, len) : HOOP_OK;
}
static inline void hoop__kind_done(hoop_comm *comm, const void *ptr, size_t len) {
  if (comm->mem->done)
    comm->mem->done(comm, ptr, len);
}

/* The capabilities of the kinds this build has (built) and this process has loaded (here: a
 * driver found); host memory has none. */
unsigned hoop__mem_kinds_built(void);
unsigned hoop__mem_kinds_here(void);

/* The work the caller queued on stream (a CUDA stream; NULL: the legacy default stream of buf's
 * context) done, for the stream-ordered calls; nothing to wait for on host memory. call names the
 * public call in messages. */
hoop_result hoop__mem_stream_wait(hoop_comm *comm, const char *call, void *stream, const void *buf);

/* Copy bytes between any two memories, host or device, synchronously (mem/cuda/copy.c). */
hoop_result hoop__mem_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes);

/* The host kind's operations, as every kind that is host memory underneath names them. */
#define HOOP__MEM_HOST_OPS                                                                         \
  .reduce3 = hoop__host_reduce3, .reduce_fixed = hoop__host_reduce_fixed,                          \
  .finish = hoop__host_finish, .copy = hoop__host_copy, .scratch = hoop__host_scratch,             \
  .encode = hoop__host_encode, .decode_add = hoop__host_decode_add, .decode = hoop__host_decode,   \
  .widen = hoop__host_widen, .narrow = hoop__host_narrow

/* A buffer of the library's own grown to at least bytes: page-locked in the context of the device
 * memory at near where the driver gives it (near NULL: ordinary memory, 64-byte aligned), and
 * forgotten by the transports before it is freed (they may keep registrations of it). The old
 * contents are not kept. NULL with "cannot allocate N bytes WHAT" recorded. */
void *hoop__host_buf_grow(hoop_comm *comm, hoop__host_buf *buf, size_t bytes, const void *near,
                          const char *what);
void hoop__host_buf_free(hoop_comm *comm, hoop__host_buf *buf);

/* The host kind's operations, for kinds that are host memory with something added (piped). */
hoop_result hoop__host_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op);
hoop_result hoop__host_reduce_fixed(hoop_comm *comm, void *dst, const void *const *srcs, int nsrcs,
                                    size_t count, hoop_dtype dtype, hoop_op op);
hoop_result hoop__host_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                              hoop_op op, int nranks);
hoop_result hoop__host_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes);
void *hoop__host_scratch(hoop_comm *comm, size_t bytes);
hoop__encode_fn hoop__host_encode;
hoop__decode_add_fn hoop__host_decode_add;
hoop__decode_fn hoop__host_decode;
hoop__widen_fn hoop__host_widen;
hoop__narrow_fn hoop__host_narrow;
/* Free the host kind's scratch (hoop_finalize). */
void hoop__host_scratch_free(hoop_comm *comm);

#endif /* HOOP__MEM_KIND_H */
