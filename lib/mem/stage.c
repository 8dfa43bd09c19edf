/* stage.c - device buffers through a host stage (see stage.h).
 *
 * Per call: one driver query per buffer (none without a driver), then for a device buffer one copy
 * in (of what this rank contributes) and one copy out (of the result). A host buffer among them
 * serves as the stage itself where it can: an allreduce from device memory into host memory copies
 * the input into the host recvbuf and runs in place there.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "mem/cuda.h"
#include "mem/stage.h"
#include "transport/transport.h"

/* A stage of at least bytes: page-locked memory where the driver gives it (near: a device buffer of
 * the call, for its context), else ordinary memory. */
static void *stage_buffer(hoop_comm *comm, size_t bytes, const void *near) {
  if (bytes <= comm->stage_bytes)
    return comm->stage;
  hoop__stage_free(comm);
  void *grown = hoop__cuda_host_alloc(bytes, near);
  comm->stage_pinned = grown != NULL;
  if (!grown && posix_memalign(&grown, 64, bytes) != 0) {
    hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes to stage device memory",
                    comm->call ? comm->call : "hoop", bytes);
    return NULL;
  }
  comm->stage = grown;
  comm->stage_bytes = bytes;
  return grown;
}

void hoop__stage_free(hoop_comm *comm) {
  if (comm->stage && comm->peer_transport)
    hoop__transports_forget_mem(comm, comm->stage, comm->stage_bytes);
  if (comm->stage_pinned)
    hoop__cuda_host_free(comm->stage);
  else
    free(comm->stage);
  comm->stage = NULL;
  comm->stage_bytes = 0;
  comm->stage_pinned = 0;
}

hoop_result hoop__stage_in(hoop_comm *comm, hoop__coll_args *args, hoop__stage *stage) {
  stage->active = 0;
  if (!hoop__cuda_loaded() || args->bytes == 0)
    return HOOP_OK;
  int send_dev = hoop__mem_kind_of(args->sendbuf) == HOOP__MEM_DEVICE;
  int recv_dev = args->recvbuf == args->sendbuf
                     ? send_dev
                     : hoop__mem_kind_of(args->recvbuf) == HOOP__MEM_DEVICE;
  if (!send_dev && !recv_dev)
    return HOOP_OK;
  size_t bytes = args->bytes;
  size_t total = args->coll == HOOP__COLL_ALLGATHER ? bytes * (size_t)comm->size : bytes;
  char *host = recv_dev ? stage_buffer(comm, total, args->recvbuf) : args->recvbuf;
  if (!host)
    return HOOP_ERR_SYSTEM;
  hoop_result result = HOOP_OK;
  switch (args->coll) {
  case HOOP__COLL_ALLREDUCE: /* in place on the host copy of this rank's input */
    result = hoop__mem_copy(comm, host, args->sendbuf, bytes);
    args->sendbuf = host;
    break;
  case HOOP__COLL_BROADCAST: /* the root's data in; every rank's result out, but the root's */
    if (comm->rank == args->root)
      result = hoop__mem_copy(comm, host, args->sendbuf, bytes);
    args->sendbuf = host;
    break;
  case HOOP__COLL_ALLGATHER: { /* this rank's block in place; every block out */
    char *own = host + (size_t)comm->rank * bytes;
    result = hoop__mem_copy(comm, own, args->sendbuf, bytes);
    args->sendbuf = own;
    break;
  }
  default: return HOOP_OK;
  }
  if (result != HOOP_OK)
    return result;
  stage->active = recv_dev && !(args->coll == HOOP__COLL_BROADCAST && comm->rank == args->root);
  stage->user_recv = args->recvbuf;
  stage->out_from = host;
  stage->out_bytes = total;
  args->recvbuf = host;
  return HOOP_OK;
}

hoop_result hoop__stage_out(hoop_comm *comm, const hoop__stage *stage) {
  if (!stage->active)
    return HOOP_OK;
  return hoop__cuda_copy(comm, stage->user_recv, stage->out_from, stage->out_bytes);
}
