/* host.c - the host memory kind: the CPU copies and reduces (mem/reduce.c's kernels), and the
 * scratch that algorithms receive into is ordinary memory, grown on demand and kept for the
 * communicator's next calls. */
#include <stdlib.h>
#include <string.h>

#include "mem/kind.h"
#include "mem/reduce.h"
#include "transport/transport.h"

hoop_result hoop__host_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op) {
  (void)comm;
  hoop__reduce3(dst, a, b, count, dtype, op);
  return HOOP_OK;
}

hoop_result hoop__host_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                              hoop_op op, int nranks) {
  (void)comm;
  hoop__reduce_finish(buf, count, dtype, op, nranks);
  return HOOP_OK;
}

hoop_result hoop__host_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)comm;
  if (bytes && dst != src)
    memmove(dst, src, bytes);
  return HOOP_OK;
}

void *hoop__host_scratch(hoop_comm *comm, size_t bytes) {
  if (bytes <= comm->scratch_bytes)
    return comm->scratch;
  void *grown = NULL;
  if (posix_memalign(&grown, 64, bytes) != 0) {
    hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes of scratch",
                    comm->call ? comm->call : "hoop", bytes);
    return NULL;
  }
  hoop__host_scratch_free(comm);
  comm->scratch = grown;
  comm->scratch_bytes = bytes;
  return grown;
}

void hoop__host_scratch_free(hoop_comm *comm) {
  /* The transports may keep registrations of what they received into: they forget it first. */
  if (comm->scratch && comm->peer_transport)
    hoop__transports_forget_mem(comm, comm->scratch, comm->scratch_bytes);
  free(comm->scratch);
  comm->scratch = NULL;
  comm->scratch_bytes = 0;
}

const hoop__mem_ops hoop__mem_host = {
    .name = "host",
    .reduce3 = hoop__host_reduce3,
    .finish = hoop__host_finish,
    .copy = hoop__host_copy,
    .scratch = hoop__host_scratch,
};
