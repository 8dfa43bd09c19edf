/* host.c - the host memory kind: the CPU copies and reduces (mem/reduce.c's kernels), and the
 * scratch that algorithms receive into is ordinary memory, grown on demand and kept for the
 * communicator's next calls. */
#include <stdlib.h>
#include <string.h>

#include "mem/compress.h"
#include "mem/cuda.h"
#include "mem/kind.h"
#include "mem/reduce.h"
#include "transport/transport.h"

hoop_result hoop__host_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op) {
  (void)comm;
  hoop__reduce3(dst, a, b, count, dtype, op);
  return HOOP_OK;
}

hoop_result hoop__host_reduce_fixed(hoop_comm *comm, void *dst, const void *const *srcs, int nsrcs,
                                    size_t count, hoop_dtype dtype, hoop_op op) {
  (void)comm;
  hoop__reduce_fixed(dst, srcs, nsrcs, count, dtype, op);
  return HOOP_OK;
}

hoop_result hoop__host_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                              hoop_op op, int nranks) {
  (void)comm;
  hoop__reduce_finish(buf, count, dtype, op, nranks);
  return HOOP_OK;
}

hoop_result hoop__host_encode(hoop_comm *comm, int format, void *piece, const void *in,
                              hoop_dtype dtype, size_t count, float *residual, uint64_t seed,
                              uint64_t first) {
  (void)comm;
  hoop__compress(format, piece, in, dtype, count, residual, (hoop__rounding){seed, first});
  return HOOP_OK;
}

hoop_result hoop__host_decode_add(hoop_comm *comm, int format, float *acc, const void *piece,
                                  size_t count) {
  (void)comm;
  hoop__expand_add(format, acc, piece, count);
  return HOOP_OK;
}

hoop_result hoop__host_decode(hoop_comm *comm, int format, void *out, hoop_dtype dtype,
                              const void *piece, size_t count) {
  (void)comm;
  hoop__expand(format, out, dtype, piece, count);
  return HOOP_OK;
}

hoop_result hoop__host_widen(hoop_comm *comm, float *out, const void *in, hoop_dtype dtype,
                             size_t count) {
  (void)comm;
  hoop__to_float(out, in, dtype, count);
  return HOOP_OK;
}

hoop_result hoop__host_narrow(hoop_comm *comm, void *out, hoop_dtype dtype, const float *in,
                              size_t count) {
  (void)comm;
  hoop__from_float(out, in, dtype, count);
  return HOOP_OK;
}

hoop_result hoop__host_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)comm;
  if (bytes && dst != src)
    memmove(dst, src, bytes);
  return HOOP_OK;
}

void *hoop__host_buf_grow(hoop_comm *comm, hoop__host_buf *buf, size_t bytes, const void *near,
                          const char *what) {
  if (buf->ptr && bytes <= buf->bytes)
    return buf->ptr;
  hoop__host_buf_free(comm, buf);
  void *grown = NULL;
  int pinned = 0;
  if (near)
    grown = hoop__host_stage_alloc(bytes, near, &pinned);
  else if (posix_memalign(&grown, 64, bytes) != 0)
    grown = NULL;
  if (!grown) {
    hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes %s",
                    comm->call ? comm->call : "hoop", bytes, what);
    return NULL;
  }
  *buf = (hoop__host_buf){grown, bytes, pinned};
  return grown;
}

void hoop__host_buf_free(hoop_comm *comm, hoop__host_buf *buf) {
  /* The transports may keep registrations of what they moved through it: they forget it first. */
  if (buf->ptr && hoop__transports_up(comm))
    hoop__transports_forget_mem(comm, buf->ptr, buf->bytes);
  hoop__host_stage_free(buf->ptr, buf->pinned);
  *buf = (hoop__host_buf){NULL, 0, 0};
}

void *hoop__host_scratch(hoop_comm *comm, size_t bytes) {
  return hoop__host_buf_grow(comm, &comm->scratch, bytes, NULL, "of scratch");
}

void hoop__host_scratch_free(hoop_comm *comm) {
  hoop__host_buf_free(comm, &comm->scratch);
}

const hoop__mem_ops hoop__mem_host = {.name = "host", HOOP__MEM_HOST_OPS};
