/* kind.c - the CUDA memory kind: an algorithm that runs on device memory reduces and copies
 * with hoop's kernels and the driver's copies, on hoop's stream in the context of the call's
 * buffers, and receives into device scratch of that context.
 *
 * Each reduction or copy is done before the algorithm goes on, so that what it sends next is
 * final; while one runs the rank keeps its transports moving (answering peers' requests to send,
 * taking arrivals), so that a pipeline of chunks does not stall behind the GPU. Where the call's
 * path says so (data written into GPU memory by an RDMA device, on GPUs that do not order such
 * writes), every kernel or copy that reads received data first flushes those writes.
 *
 * The queued operations (reduce_many, copy_queued, sync) serve the algorithms that read their
 * peers' buffers mapped into this process: nothing is waited for until sync. */
#include "config.h"

#include <stdlib.h>

#include "mem/cuda.h"
#include "mem/cuda/kind.h"
#include "mem/kind.h"
#include "mem/state.h"
#include "transport/transport.h"

struct hoop__cuda_kind {
  const void *near; /* the running call's device memory */
  int flush;        /* received data must be flushed before the GPU reads it */
  int registered;   /* the running call's scratch must be registered with every peer's transport */
  char *scratch;    /* device memory of near's context, or NULL */
  int scratch_registered; /* it is registered */
  size_t scratch_bytes;
};

static void drop_scratch(hoop_comm *comm, struct hoop__cuda_kind *kind) {
  if (!kind->scratch)
    return;
  hoop__deregister_internal(comm, kind->scratch);
  hoop__cuda_free(kind->scratch);
  kind->scratch = NULL;
  kind->scratch_bytes = 0;
  kind->scratch_registered = 0;
}

hoop_result hoop__cuda_kind_begin(hoop_comm *comm, const void *near, int flush, int registered) {
  struct hoop__cuda_kind *kind = comm->mem_state->cuda_kind;
  if (!kind && !(kind = comm->mem_state->cuda_kind = calloc(1, sizeof *kind)))
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory (device memory's state)",
                           comm->call);
  /* Scratch of another context, or not registered where it must be, is made again. */
  if (kind->scratch && (hoop__cuda_context_of(kind->scratch) != hoop__cuda_context_of(near) ||
                        (registered && !kind->scratch_registered)))
    drop_scratch(comm, kind);
  kind->near = near;
  kind->flush = flush;
  kind->registered = registered;
  return HOOP_OK;
}

void hoop__cuda_kind_free(hoop_comm *comm) {
  struct hoop__cuda_kind *kind = comm->mem_state->cuda_kind;
  if (!kind)
    return;
  /* Its registration went with the others (hoop__registrations_release) if it was still there. */
  drop_scratch(comm, kind);
  free(kind);
  comm->mem_state->cuda_kind = NULL;
}

static void *cuda_scratch(hoop_comm *comm, size_t bytes) {
  struct hoop__cuda_kind *kind = comm->mem_state->cuda_kind;
  if (bytes <= kind->scratch_bytes)
    return kind->scratch;
  /* Never between a receive's post and its arrival: algorithms take their scratch before they
   * post. The transports forget the old one with its registration. */
  drop_scratch(comm, kind);
  if (bytes < 4096)
    bytes = 4096;
  char *ptr = hoop__cuda_alloc(bytes, kind->near);
  if (!ptr) {
    hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes of device scratch",
                    comm->call, bytes);
    return NULL;
  }
  if (kind->registered) {
    if (hoop__register_internal(comm, ptr, bytes) != HOOP_OK) {
      hoop__cuda_free(ptr);
      return NULL;
    }
    if (!hoop__registered_for_peers(comm, ptr, bytes, NULL)) {
      hoop__deregister_internal(comm, ptr);
      hoop__cuda_free(ptr);
      hoop__set_error(comm, HOOP_ERR_SYSTEM,
                      "%s: %zu bytes of device scratch could not be registered for the network",
                      comm->call, bytes);
      return NULL;
    }
  }
  kind->scratch = ptr;
  kind->scratch_bytes = bytes;
  kind->scratch_registered = kind->registered;
  return ptr;
}

void *hoop__cuda_kind_scratch(hoop_comm *comm, size_t bytes) {
  return cuda_scratch(comm, bytes);
}

hoop_result hoop__cuda_kind_flushed(hoop_comm *comm) {
  struct hoop__cuda_kind *kind = comm->mem_state->cuda_kind;
#ifdef HOOP_HAVE_CUDA
  return kind->flush ? hoop__cuda_gdr_flush(comm, kind->near) : HOOP_OK;
#else
  (void)kind; /* without CUDA there is no device memory to run on */
  return HOOP_OK;
#endif
}

static hoop_result cuda_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                                size_t count, hoop_dtype dtype, hoop_op op) {
  hoop_result result = count ? hoop__cuda_kind_flushed(comm) : HOOP_OK;
  if (count && result == HOOP_OK &&
      (result = hoop__cuda_reduce3_async(comm, dst, a, b, count, dtype, op)) == HOOP_OK)
    result = hoop__cuda_sync_busy(comm, dst, hoop__progress_once);
  return result;
}

static hoop_result cuda_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                               hoop_op op, int nranks) {
  if (op != HOOP_AVG || count == 0)
    return HOOP_OK;
  hoop_result result = hoop__cuda_finish_async(comm, buf, count, dtype, op, nranks);
  return result == HOOP_OK ? hoop__cuda_sync_busy(comm, buf, hoop__progress_once) : result;
}

static hoop_result cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0 || dst == src)
    return HOOP_OK;
  hoop_result result = hoop__cuda_kind_flushed(comm);
  if (result == HOOP_OK && (result = hoop__cuda_copy_async(comm, dst, src, bytes)) == HOOP_OK)
    result = hoop__cuda_sync_busy(
        comm, ((struct hoop__cuda_kind *)comm->mem_state->cuda_kind)->near, hoop__progress_once);
  return result;
}

static hoop_result cuda_sync(hoop_comm *comm) {
  return hoop__cuda_sync(comm, ((struct hoop__cuda_kind *)comm->mem_state->cuda_kind)->near);
}

_Static_assert(HOOP__CUDA_MANY_MAX <= HOOP__MEM_MANY_MAX, "reduce_many takes too many sources");

unsigned hoop__mem_kinds_built(void) {
#ifdef HOOP_HAVE_CUDA
  return hoop__mem_cuda.caps;
#else
  return 0;
#endif
}

hoop_result hoop__mem_stream_wait(hoop_comm *comm, const char *call, void *stream,
                                  const void *buf) {
  return hoop__cuda_stream_wait(comm, call, stream, buf);
}

unsigned hoop__mem_kinds_here(void) {
  return hoop__cuda_loaded() ? hoop__mem_cuda.caps : 0;
}

static const hoop__device_ops device_ops = {
    .context_of = hoop__cuda_context_of,
    .ipc_export = hoop__cuda_ipc_export,
    .ready = hoop__cuda_ready,
    .stream_wait = hoop__cuda_stream_wait,
    .begin = hoop__cuda_kind_begin,
    .scratch = hoop__cuda_kind_scratch,
    .flushed = hoop__cuda_kind_flushed,
    .gdr_flush_mode = hoop__cuda_gdr_flush_mode,
};

const hoop__mem_ops hoop__mem_cuda = {
    .name = "cuda",
    .caps = HOOP__MEMCAP_MAP | HOOP__MEMCAP_NET,
    .reduce3 = cuda_reduce3,
    .finish = cuda_finish,
    .copy = cuda_copy,
    .scratch = cuda_scratch,
    .reduce_many = hoop__cuda_reduce_many_async,
    .reduce_many_tree = hoop__cuda_reduce_tree_async,
    .many_max = HOOP__CUDA_MANY_MAX,
    .copy_queued = hoop__cuda_copy_async,
    .sync = cuda_sync,
#ifdef HOOP_HAVE_CUDA
    .encode = hoop__cuda_compress_async,
    .decode_add = hoop__cuda_expand_add_async,
    .decode = hoop__cuda_expand_async,
    .widen = hoop__cuda_widen_async,
    .narrow = hoop__cuda_narrow_async,
#endif
    .device = &device_ops,
};
