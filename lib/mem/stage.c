/* stage.c - device buffers through a host stage (see stage.h).
 *
 * Per call: one driver query per buffer (none without a driver), then for a device buffer one copy
 * in (of what this rank contributes) and one copy out (of the result). A host buffer among them
 * serves as the stage itself where it can: an allreduce from device memory into host memory copies
 * the input into the host recvbuf and runs in place there.
 */
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/internal.h"
#include "mem/cuda.h"
#include "mem/kind.h"
#include "mem/stage.h"
#include "mem/state.h"
#include "transport/transport.h"

/* A stage of at least bytes: page-locked memory where the driver gives it (near: a device buffer of
 * the call, for its context), else ordinary memory. */
static void *stage_buffer(hoop_comm *comm, size_t bytes, const void *near) {
  return hoop__host_buf_grow(comm, &comm->mem_state->stage, bytes, near, "to stage device memory");
}

void hoop__stage_free(hoop_comm *comm) {
  hoop__host_buf_free(comm, &comm->mem_state->stage);
}

/* Below HOOP_CUDA_PIPELINE_BYTES (1 MiB by default) a device allreduce stages whole: the ring's
 * segments would be too small for their copies to overlap anything. */
static size_t pipeline_bytes(hoop_comm *comm) {
  if (!comm->mem_state->pipeline_read) {
    comm->mem_state->pipeline_bytes = hoop__env_bytes("HOOP_CUDA_PIPELINE_BYTES", (long)1 << 50);
    comm->mem_state->pipeline_read = 1;
  }
  return comm->mem_state->pipeline_bytes;
}

static void pipe_release(hoop_comm *comm, hoop__stage *stage) {
  free(stage->offset);
  free(stage->waited);
  stage->offset = NULL;
  stage->waited = NULL;
  stage->pipe = NULL;
  comm->mem_state->stage_pipe = NULL;
  comm->mem = &hoop__mem_host;
}

/* The ring or direct allreduce with device input: queue the copies in, segment by segment in the
 * order the algorithm reads them (the ring: this rank's own first, then r-1, r-2...; direct: the
 * peers' r+1, r+2... that it sends them, then its own), each followed by its event. 1 when the
 * pipeline is set up (args then point at host), 0 to stage whole, or -1 on a failure (recorded). */
static int pipeline_in(hoop_comm *comm, hoop__coll_args *args, char *host, int recv_dev, int direct,
                       hoop__stage *stage) {
  int n = comm->size;
  hoop__cuda_pipe *pipe = hoop__cuda_pipe_get(comm, args->sendbuf, n);
  if (!pipe)
    return 0;
  memset(stage, 0, sizeof *stage);
  stage->offset = malloc(((size_t)n + 1) * sizeof *stage->offset);
  stage->waited = calloc((size_t)n, 1);
  if (!stage->offset || !stage->waited) {
    pipe_release(comm, stage);
    return 0;
  }
  for (int i = 0; i < n; i++) {
    size_t first, elems;
    hoop__segment(args->count, n, i, &first, &elems);
    stage->offset[i] = first * args->esize;
  }
  stage->offset[n] = args->bytes;
  stage->pipe = pipe;
  stage->host = host;
  stage->bytes = args->bytes;
  stage->nsegments = n;
  stage->copy_back = recv_dev;
  stage->user_recv = args->recvbuf;
  const char *src = args->sendbuf;
  for (int k = 0; k < n; k++) {
    int s = direct ? (comm->rank + k + 1) % n : ((comm->rank - k) % n + n) % n;
    size_t at = stage->offset[s], len = stage->offset[s + 1] - at;
    if (hoop__cuda_pipe_copy(comm, pipe, host + at, src + at, len, s) != HOOP_OK) {
      hoop__cuda_pipe_drain(comm, pipe);
      pipe_release(comm, stage);
      return -1;
    }
  }
  args->sendbuf = args->recvbuf = host;
  comm->mem_state->stage_pipe = stage;
  comm->mem = &hoop__mem_piped;
  return 1;
}

static void piped_done(hoop_comm *comm, const void *ptr, size_t len);

/* Segments of a pipelined broadcast's copy in: enough for the copies to overlap the chain. */
#define BROADCAST_SEGMENTS 16

/* The chain broadcast and the ring allgather on device memory: the root's buffer copied in
 * segment by segment, each waited for when the chain first sends from it; received pieces copied
 * back as they arrive (the allgather's own block at once). 1 when set up (args then point at
 * host), 0 to stage whole, -1 on a failure (recorded). */
static int pipeline_spread(hoop_comm *comm, hoop__coll_args *args, char *host, int send_dev,
                           int recv_dev, hoop__stage *stage) {
  int allgather = args->coll == HOOP__COLL_ALLGATHER;
  int root = !allgather && comm->rank == args->root;
  int nsegments = root && send_dev ? BROADCAST_SEGMENTS : 0;
  int copy_back = allgather ? recv_dev : !root && recv_dev;
  if (!nsegments && !copy_back)
    return 0;
  hoop__cuda_pipe *pipe = hoop__cuda_pipe_get(comm, args->recvbuf, nsegments);
  if (!pipe)
    return 0;
  memset(stage, 0, sizeof *stage);
  stage->offset = malloc(((size_t)nsegments + 1) * sizeof *stage->offset);
  stage->waited = calloc((size_t)nsegments + 1, 1);
  if (!stage->offset || !stage->waited) {
    pipe_release(comm, stage);
    return 0;
  }
  size_t total = allgather ? args->bytes * (size_t)comm->size : args->bytes;
  for (int s = 0; s <= nsegments; s++)
    stage->offset[s] = nsegments ? total / (size_t)nsegments * (size_t)s : 0;
  if (nsegments)
    stage->offset[nsegments] = total;
  stage->pipe = pipe;
  stage->host = host;
  stage->bytes = total;
  stage->nsegments = nsegments;
  stage->copy_back = copy_back;
  stage->user_recv = args->recvbuf;
  hoop_result result = HOOP_OK;
  for (int s = 0; s < nsegments && result == HOOP_OK; s++)
    result = hoop__cuda_pipe_copy(comm, pipe, host + stage->offset[s],
                                  (const char *)args->sendbuf + stage->offset[s],
                                  stage->offset[s + 1] - stage->offset[s], s);
  char *own = host + (allgather ? (size_t)comm->rank * args->bytes : 0);
  if (result == HOOP_OK && allgather)
    result = hoop__mem_copy(comm, own, args->sendbuf, args->bytes);
  if (result != HOOP_OK) {
    hoop__cuda_pipe_drain(comm, pipe);
    pipe_release(comm, stage);
    return -1;
  }
  comm->mem_state->stage_pipe = stage;
  comm->mem = &hoop__mem_piped;
  if (allgather) {
    piped_done(comm, own, args->bytes); /* this rank's block: final already */
    args->sendbuf = own;
  } else {
    args->sendbuf = host;
  }
  args->recvbuf = host;
  return 1;
}

static hoop_result piped_need(hoop_comm *comm, const void *ptr, size_t len) {
  hoop__stage *stage = comm->mem_state->stage_pipe;
  const char *p = ptr;
  if (p < stage->host || p >= stage->host + stage->bytes || len == 0)
    return HOOP_OK;
  size_t at = (size_t)(p - stage->host), end = at + len;
  for (int s = 0; s < stage->nsegments; s++) {
    if (stage->waited[s] || stage->offset[s + 1] <= at || stage->offset[s] >= end)
      continue;
    hoop_result result = hoop__cuda_pipe_wait(comm, stage->pipe, s);
    if (result != HOOP_OK)
      return result;
    stage->waited[s] = 1;
  }
  return HOOP_OK;
}

static void piped_done(hoop_comm *comm, const void *ptr, size_t len) {
  hoop__stage *stage = comm->mem_state->stage_pipe;
  const char *p = ptr;
  if (!stage->copy_back || stage->copy_result != HOOP_OK || p < stage->host ||
      p >= stage->host + stage->bytes || len == 0)
    return;
  size_t at = (size_t)(p - stage->host);
  stage->copy_result =
      hoop__cuda_pipe_copy(comm, stage->pipe, (char *)stage->user_recv + at, p, len, -1);
}

/* Host memory whose input is still being copied in from the device and whose result goes back
 * piece by piece: the host kind's operations, with need and done. */
const hoop__mem_ops hoop__mem_piped = {.name = "host, piped to the device",
                                       HOOP__MEM_HOST_OPS,
                                       .need = piped_need,
                                       .done = piped_done};

/* A reduce-scatter: the whole input (size blocks) copied in when it is device memory, the
 * algorithm run on it, and this rank's block copied out when the result goes to device memory;
 * with both on the device, in place on the stage. */
static hoop_result stage_reduce_scatter(hoop_comm *comm, hoop__coll_args *args, int send_dev,
                                        int recv_dev, hoop__stage *stage) {
  size_t block = args->bytes, input = block * (size_t)comm->size;
  char *host = stage_buffer(comm, send_dev ? input : block,
                            send_dev ? args->sendbuf : (const void *)args->recvbuf);
  if (!host)
    return HOOP_ERR_SYSTEM;
  if (send_dev) {
    hoop_result result = hoop__mem_copy(comm, host, args->sendbuf, input);
    if (result != HOOP_OK)
      return result;
    args->sendbuf = host;
  }
  if (recv_dev) {
    char *out = send_dev ? host + (size_t)comm->rank * block : host;
    stage->active = 1;
    stage->user_recv = args->recvbuf;
    stage->out_from = out;
    stage->out_bytes = block;
    args->recvbuf = out;
  }
  return HOOP_OK;
}

/* The bytes from a buffer's start to the end of its last block (an alltoallv's extent). */
static size_t extent(const size_t *counts, const size_t *displs, int n, size_t esize) {
  size_t end = 0;
  for (int p = 0; p < n; p++)
    if (counts[p] && (displs[p] + counts[p]) * esize > end)
      end = (displs[p] + counts[p]) * esize;
  return end;
}

/* An alltoallv: the send extent and the receive extent side by side on the stage, each copied in
 * where it is device memory (the receive extent too, so that what lies between its blocks comes
 * back as it was), the receive extent copied out after. */
static hoop_result stage_alltoallv(hoop_comm *comm, hoop__coll_args *args, int send_dev,
                                   int recv_dev, hoop__stage *stage) {
  size_t sent = extent(args->sendcounts, args->sdispls, comm->size, args->esize);
  size_t received = extent(args->recvcounts, args->rdispls, comm->size, args->esize);
  char *host = stage_buffer(comm, sent + received + 1,
                            send_dev ? args->sendbuf : (const void *)args->recvbuf);
  if (!host)
    return HOOP_ERR_SYSTEM;
  /* A device buffer with no block to copy: the work queued on the legacy default stream before
   * the call is done all the same when it returns, as the copy would have ordered it (a reader on
   * another stream sees the buffer as the call left it). */
  hoop_result result = HOOP_OK;
  if (send_dev && sent == 0)
    result = hoop__cuda_stream_wait(comm, comm->call, NULL, args->sendbuf);
  if (result == HOOP_OK && recv_dev && received == 0)
    result = hoop__cuda_stream_wait(comm, comm->call, NULL, args->recvbuf);
  if (result == HOOP_OK && send_dev &&
      (result = hoop__mem_copy(comm, host, args->sendbuf, sent)) == HOOP_OK)
    args->sendbuf = host;
  if (result == HOOP_OK && recv_dev &&
      (result = hoop__mem_copy(comm, host + sent, args->recvbuf, received)) == HOOP_OK) {
    stage->active = 1;
    stage->user_recv = args->recvbuf;
    stage->out_from = host + sent;
    stage->out_bytes = received;
    args->recvbuf = host + sent;
  }
  return result;
}

/* Reduce, gather and scatter: the buffers that matter on this rank (the root's result or blocks,
 * every rank's input or block) side by side on the stage, the input copied in where it is device
 * memory, the result copied out where it is. In place (one buffer inside the other at the root),
 * the whole of the larger goes in and out, the smaller kept at its offset in it. */
static hoop_result stage_rooted(hoop_comm *comm, hoop__coll_args *args, hoop__stage *stage) {
  int root = comm->rank == args->root, n = comm->size;
  size_t block = args->bytes;
  size_t send_bytes = args->coll == HOOP__COLL_SCATTER ? (root ? block * (size_t)n : 0) : block;
  size_t recv_bytes = args->coll == HOOP__COLL_REDUCE   ? (root ? block : 0)
                      : args->coll == HOOP__COLL_GATHER ? (root ? block * (size_t)n : 0)
                                                        : block;
  const char *send = send_bytes ? args->sendbuf : NULL;
  char *recv = recv_bytes ? args->recvbuf : NULL;
  int send_dev = send && hoop__mem_kind_of(send) == HOOP__MEM_DEVICE;
  int recv_dev = recv && hoop__mem_kind_of(recv) == HOOP__MEM_DEVICE;
  if (!send_dev && !recv_dev)
    return HOOP_OK;
  /* In place: the smaller buffer lies inside the larger. */
  int nested = send && recv &&
               ((send >= recv && send + send_bytes <= recv + recv_bytes) ||
                (recv >= send && recv + recv_bytes <= send + send_bytes));
  if (nested) {
    const char *outer = send_bytes >= recv_bytes ? send : recv;
    size_t outer_bytes = send_bytes >= recv_bytes ? send_bytes : recv_bytes;
    char *host = stage_buffer(comm, outer_bytes, outer);
    if (!host)
      return HOOP_ERR_SYSTEM;
    hoop_result result = hoop__mem_copy(comm, host, outer, outer_bytes);
    if (result != HOOP_OK)
      return result;
    args->sendbuf = host + (send - outer);
    args->recvbuf = host + (recv - outer);
    stage->active = 1;
    stage->user_recv = recv;
    stage->out_from = args->recvbuf;
    stage->out_bytes = recv_bytes;
    return HOOP_OK;
  }
  char *host = stage_buffer(comm, send_bytes + recv_bytes + 1, send_dev ? send : recv);
  if (!host)
    return HOOP_ERR_SYSTEM;
  if (send_dev) {
    hoop_result result = hoop__mem_copy(comm, host, send, send_bytes);
    if (result != HOOP_OK)
      return result;
    args->sendbuf = host;
  }
  if (recv_dev) {
    args->recvbuf = host + send_bytes;
    stage->active = 1;
    stage->user_recv = recv;
    stage->out_from = args->recvbuf;
    stage->out_bytes = recv_bytes;
  }
  return HOOP_OK;
}

hoop_result hoop__stage_in(hoop_comm *comm, hoop__coll_args *args, const hoop__algo_traits *traits,
                           hoop__stage *stage) {
  stage->active = 0;
  stage->pipe = NULL;
  if (!hoop__cuda_loaded() || (args->bytes == 0 && args->coll != HOOP__COLL_ALLTOALLV))
    return HOOP_OK;
  if (args->coll == HOOP__COLL_REDUCE || args->coll == HOOP__COLL_GATHER ||
      args->coll == HOOP__COLL_SCATTER)
    return stage_rooted(comm, args, stage);
  int send_dev = hoop__mem_kind_of(args->sendbuf) == HOOP__MEM_DEVICE;
  int recv_dev = args->recvbuf == args->sendbuf
                     ? send_dev
                     : hoop__mem_kind_of(args->recvbuf) == HOOP__MEM_DEVICE;
  if (!send_dev && !recv_dev)
    return HOOP_OK;
  if (args->coll == HOOP__COLL_REDUCE_SCATTER)
    return stage_reduce_scatter(comm, args, send_dev, recv_dev, stage);
  if (args->coll == HOOP__COLL_ALLTOALLV)
    return stage_alltoallv(comm, args, send_dev, recv_dev, stage);
  size_t bytes = args->bytes;
  size_t total = hoop__call_total(comm, args);
  char *host = recv_dev ? stage_buffer(comm, total, args->recvbuf) : args->recvbuf;
  if (!host)
    return HOOP_ERR_SYSTEM;
  hoop__order order = traits ? traits->order : HOOP__ORDER_WHOLE;
  int direct = order == HOOP__ORDER_DIRECT;
  int ring_in = args->coll == HOOP__COLL_ALLREDUCE &&
                (order == HOOP__ORDER_RING || order == HOOP__ORDER_DIRECT) && send_dev &&
                bytes >= pipeline_bytes(comm);
  int spread = order == HOOP__ORDER_SPREAD &&
               (args->coll == HOOP__COLL_BROADCAST || args->coll == HOOP__COLL_ALLGATHER) &&
               total >= pipeline_bytes(comm);
  if ((ring_in || spread) && comm->size > 1) {
    /* The pipe's stream is hoop's own, not ordered after the legacy default stream as the whole
     * stage's synchronous copies are: the work the program queued there on its buffers first. */
    hoop_result result =
        hoop__cuda_stream_wait(comm, comm->call, NULL, send_dev ? args->sendbuf : args->recvbuf);
    if (result != HOOP_OK)
      return result;
    int piped = ring_in ? pipeline_in(comm, args, host, recv_dev, direct, stage)
                        : pipeline_spread(comm, args, host, send_dev, recv_dev, stage);
    if (piped != 0)
      return piped > 0 ? HOOP_OK : HOOP_ERR_SYSTEM;
  }
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
  case HOOP__COLL_ALLTOALL: /* every block in, in place on the host copy; every block out */
    result = hoop__mem_copy(comm, host, args->sendbuf, total);
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

hoop_result hoop__stage_out(hoop_comm *comm, hoop__stage *stage, hoop_result result) {
  if (stage->pipe) {
    /* Copies still queued read or write the stage: they end before it is used again. */
    hoop_result drained = hoop__cuda_pipe_drain(comm, stage->pipe);
    if (result == HOOP_OK)
      result = stage->copy_result != HOOP_OK ? stage->copy_result : drained;
    pipe_release(comm, stage);
    return result;
  }
  if (!stage->active || result != HOOP_OK)
    return result;
  return hoop__cuda_copy(comm, stage->user_recv, stage->out_from, stage->out_bytes);
}
