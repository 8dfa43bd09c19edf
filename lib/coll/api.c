/* api.c - the collectives' public entry points: hoop_allreduce, hoop_broadcast, hoop_allgather,
 * hoop_reduce_scatter and hoop_barrier, their stream variants and their non-blocking forms, each a
 * request of core/request.c that runs the call through the dispatcher. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "core/fingerprint.h"
#include "core/request.h"
#include "mem/kind.h"

/* A collective's request: the call's arguments behind the request the queue runs. */
typedef struct coll_request {
  hoop_request base; /* first: the queue sees only this */
  hoop__coll_args args;
} coll_request;

static hoop_result run_call(hoop_comm *comm, hoop_request *req) {
  return hoop__coll_run(comm, &((coll_request *)req)->args);
}

/* Bytes of a call's payload per rank, for the trace: a reduce-scatter's and an alltoall's whole
 * input, an alltoallv's blocks sent. */
static size_t call_bytes(const hoop_comm *comm, const hoop__coll_args *args) {
  size_t esize = hoop_dtype_size(args->dtype), bytes = 0;
  if (args->coll == HOOP__COLL_ALLTOALLV) {
    for (int p = 0; args->sendcounts && p < comm->size; p++)
      bytes += args->sendcounts[p] * esize;
    return bytes;
  }
  bytes = args->coll == HOOP__COLL_BARRIER ? 0 : args->count * esize;
  return args->coll == HOOP__COLL_REDUCE_SCATTER || args->coll == HOOP__COLL_ALLTOALL ||
                 ((args->coll == HOOP__COLL_GATHER || args->coll == HOOP__COLL_SCATTER) &&
                  comm->rank == args->root)
             ? bytes * (size_t)comm->size
             : bytes;
}

/* A call's arguments (an alltoallv's arrays are set by its own calls), field by field: an
 * initializer would zero the struct with a `rep stos` first (see hoop__request_blocking). */
static hoop__coll_args call_args(hoop__coll coll, const void *sendbuf, void *recvbuf, size_t count,
                                 hoop_dtype dtype, hoop_op op, int root) {
  hoop__coll_args args;
  args.coll = coll;
  args.sendbuf = sendbuf;
  args.recvbuf = recvbuf;
  args.count = count;
  args.dtype = dtype;
  args.op = op;
  args.root = root;
  args.esize = args.bytes = 0;
  args.sendcounts = args.sdispls = args.recvcounts = args.rdispls = NULL;
  args.checked = 0;
  args.name_tag = 0;
  args.compress = HOOP__COMPRESS_COMM;
  return args;
}

/* ---- the calls ------------------------------------------------------------------------------- */

/* Validate and post args: blocking (request NULL) waits for it on this thread; non-blocking
 * returns a heap request. */
static hoop_result start(hoop_comm *comm, const hoop__coll_args *args, hoop_request **request,
                         const char *name) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (request)
    *request = NULL;
  uint32_t name_tag = hoop__name_take(comm); /* the named call is this one, refused or not */
  int compress = hoop__compress_take(comm);
  hoop_result result = hoop__coll_validate(comm, args, name);
  if (result == HOOP_OK)
    result = hoop__coll_check_compress(
        comm, name ? name : hoop__coll_call_name(args->coll), args->coll, args->dtype, args->op,
        compress, args->sendbuf,
        args->count * hoop_dtype_size(args->dtype) *
            (args->coll == HOOP__COLL_REDUCE_SCATTER ? (size_t)comm->size : 1));
  if (result != HOOP_OK)
    return result;
  if (!request) {
    coll_request req;
    hoop__request_blocking(&req.base, run_call, call_bytes(comm, args),
                           hoop__coll_call_name(args->coll));
    req.args = *args;
    req.args.checked = 1;
    req.args.name_tag = name_tag;
    req.args.compress = compress;
    return hoop__request_call(comm, &req.base);
  }
  /* An alltoallv's four arrays are copied behind the request: the caller may reuse them. */
  size_t arrays = args->coll == HOOP__COLL_ALLTOALLV ? 4 * (size_t)comm->size : 0;
  coll_request *req = calloc(1, sizeof *req + arrays * sizeof(size_t));
  if (!req)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for the request",
                           hoop__coll_call_name(args->coll));
  req->args = *args;
  req->args.checked = 1;
  req->args.name_tag = name_tag;
  req->args.compress = compress;
  if (arrays) {
    size_t n = (size_t)comm->size, *copy = (size_t *)(req + 1);
    const size_t *from[4] = {args->sendcounts, args->sdispls, args->recvcounts, args->rdispls};
    for (int a = 0; a < 4; a++)
      memcpy(copy + (size_t)a * n, from[a], n * sizeof *copy);
    req->args.sendcounts = copy;
    req->args.sdispls = copy + n;
    req->args.recvcounts = copy + 2 * n;
    req->args.rdispls = copy + 3 * n;
  }
  req->base.run = run_call;
  req->base.bytes = call_bytes(comm, args);
  req->base.on_heap = 1;
  req->base.name = name;
  if ((result = hoop__request_post(comm, &req->base)) != HOOP_OK) {
    free(req);
    return result;
  }
  *request = &req->base;
  return HOOP_OK;
}

hoop_result hoop_allreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype, hoop_op op) {
  hoop__coll_args args = call_args(HOOP__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_broadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int root) {
  hoop__coll_args args = call_args(HOOP__COLL_BROADCAST, buf, buf, count, dtype, HOOP_SUM, root);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_allgather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype) {
  hoop__coll_args args =
      call_args(HOOP__COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, HOOP_SUM, -1);
  return start(comm, &args, NULL, NULL);
}

/* The stream variants: the stream's queued work done first, then the blocking call. */
hoop_result hoop_allreduce_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, hoop_op op, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__mem_stream_wait(comm, "hoop_allreduce_stream", stream, recvbuf);
  return result == HOOP_OK ? hoop_allreduce(comm, sendbuf, recvbuf, count, dtype, op) : result;
}

hoop_result hoop_broadcast_stream(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                  int root, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__mem_stream_wait(comm, "hoop_broadcast_stream", stream, buf);
  return result == HOOP_OK ? hoop_broadcast(comm, buf, count, dtype, root) : result;
}

hoop_result hoop_allgather_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__mem_stream_wait(comm, "hoop_allgather_stream", stream, recvbuf);
  return result == HOOP_OK ? hoop_allgather(comm, sendbuf, recvbuf, count, dtype) : result;
}

hoop_result hoop_reduce_scatter(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                size_t recvcount, hoop_dtype dtype, hoop_op op) {
  hoop__coll_args args =
      call_args(HOOP__COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, -1);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_reduce_scatter_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hoop_dtype dtype, hoop_op op,
                                       void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__mem_stream_wait(comm, "hoop_reduce_scatter_stream", stream, recvbuf);
  return result == HOOP_OK ? hoop_reduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype, op)
                           : result;
}

hoop_result hoop_alltoall(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                          hoop_dtype dtype) {
  hoop__coll_args args =
      call_args(HOOP__COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, HOOP_SUM, -1);
  return start(comm, &args, NULL, NULL);
}

/* An alltoallv's arguments: count 0 (each pair has its own; the fingerprint carries none). */
static hoop__coll_args alltoallv_args(const void *sendbuf, const size_t *sendcounts,
                                      const size_t *sdispls, void *recvbuf,
                                      const size_t *recvcounts, const size_t *rdispls,
                                      hoop_dtype dtype) {
  return (hoop__coll_args){.coll = HOOP__COLL_ALLTOALLV,
                           .sendbuf = sendbuf,
                           .recvbuf = recvbuf,
                           .dtype = dtype,
                           .op = HOOP_SUM,
                           .root = -1,
                           .sendcounts = sendcounts,
                           .sdispls = sdispls,
                           .recvcounts = recvcounts,
                           .rdispls = rdispls};
}

hoop_result hoop_alltoallv(hoop_comm *comm, const void *sendbuf, const size_t *sendcounts,
                           const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                           const size_t *rdispls, hoop_dtype dtype) {
  hoop__coll_args args =
      alltoallv_args(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_alltoall_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 hoop_dtype dtype, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__mem_stream_wait(comm, "hoop_alltoall_stream", stream, recvbuf);
  return result == HOOP_OK ? hoop_alltoall(comm, sendbuf, recvbuf, count, dtype) : result;
}

hoop_result hoop_alltoallv_stream(hoop_comm *comm, const void *sendbuf, const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls, hoop_dtype dtype, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result =
      hoop__mem_stream_wait(comm, "hoop_alltoallv_stream", stream, recvbuf ? recvbuf : sendbuf);
  return result == HOOP_OK ? hoop_alltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                            rdispls, dtype)
                           : result;
}

hoop_result hoop_reduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        hoop_dtype dtype, hoop_op op, int root) {
  hoop__coll_args args = call_args(HOOP__COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_gather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        hoop_dtype dtype, int root) {
  hoop__coll_args args =
      call_args(HOOP__COLL_GATHER, sendbuf, recvbuf, count, dtype, HOOP_SUM, root);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_scatter(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         hoop_dtype dtype, int root) {
  hoop__coll_args args =
      call_args(HOOP__COLL_SCATTER, sendbuf, recvbuf, count, dtype, HOOP_SUM, root);
  return start(comm, &args, NULL, NULL);
}

/* The stream to wait for is the context's of whichever buffer this rank has. */
static const void *either(const void *a, const void *b) {
  return a ? a : b;
}

hoop_result hoop_reduce_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                               hoop_dtype dtype, hoop_op op, int root, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result =
      hoop__mem_stream_wait(comm, "hoop_reduce_stream", stream, either(sendbuf, recvbuf));
  return result == HOOP_OK ? hoop_reduce(comm, sendbuf, recvbuf, count, dtype, op, root) : result;
}

hoop_result hoop_gather_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                               hoop_dtype dtype, int root, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result =
      hoop__mem_stream_wait(comm, "hoop_gather_stream", stream, either(sendbuf, recvbuf));
  return result == HOOP_OK ? hoop_gather(comm, sendbuf, recvbuf, count, dtype, root) : result;
}

hoop_result hoop_scatter_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                hoop_dtype dtype, int root, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result =
      hoop__mem_stream_wait(comm, "hoop_scatter_stream", stream, either(recvbuf, sendbuf));
  return result == HOOP_OK ? hoop_scatter(comm, sendbuf, recvbuf, count, dtype, root) : result;
}

hoop_result hoop_ireduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         hoop_dtype dtype, hoop_op op, int root, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_ireduce");
  hoop__coll_args args = call_args(HOOP__COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ireduce") : result;
}

hoop_result hoop_igather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         hoop_dtype dtype, int root, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_igather");
  hoop__coll_args args =
      call_args(HOOP__COLL_GATHER, sendbuf, recvbuf, count, dtype, HOOP_SUM, root);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_igather") : result;
}

hoop_result hoop_iscatter(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                          hoop_dtype dtype, int root, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_iscatter");
  hoop__coll_args args =
      call_args(HOOP__COLL_SCATTER, sendbuf, recvbuf, count, dtype, HOOP_SUM, root);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_iscatter") : result;
}

hoop_result hoop_barrier(hoop_comm *comm) {
  hoop__coll_args args = call_args(HOOP__COLL_BARRIER, NULL, NULL, 0, HOOP_UINT8, HOOP_SUM, -1);
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop__coll_need_request(hoop_comm *comm, hoop_request **request, const char *call) {
  if (request)
    return HOOP_OK;
  return comm ? hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: request is NULL", call)
              : HOOP_ERR_INVALID_ARG;
}

hoop_result hoop_iallreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                            hoop_dtype dtype, hoop_op op, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_iallreduce");
  hoop__coll_args args = call_args(HOOP__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_iallreduce") : result;
}

hoop_result hoop_ibroadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int root,
                            hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_ibroadcast");
  hoop__coll_args args = call_args(HOOP__COLL_BROADCAST, buf, buf, count, dtype, HOOP_SUM, root);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ibroadcast") : result;
}

hoop_result hoop_iallgather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                            hoop_dtype dtype, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_iallgather");
  hoop__coll_args args =
      call_args(HOOP__COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, HOOP_SUM, -1);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_iallgather") : result;
}

hoop_result hoop_ireduce_scatter(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, hoop_dtype dtype, hoop_op op,
                                 hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_ireduce_scatter");
  hoop__coll_args args =
      call_args(HOOP__COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, -1);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ireduce_scatter") : result;
}

hoop_result hoop_ialltoall(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_ialltoall");
  hoop__coll_args args =
      call_args(HOOP__COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, HOOP_SUM, -1);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ialltoall") : result;
}

hoop_result hoop_ialltoallv(hoop_comm *comm, const void *sendbuf, const size_t *sendcounts,
                            const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                            const size_t *rdispls, hoop_dtype dtype, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_ialltoallv");
  hoop__coll_args args =
      alltoallv_args(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ialltoallv") : result;
}

hoop_result hoop_ibarrier(hoop_comm *comm, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_ibarrier");
  hoop__coll_args args = call_args(HOOP__COLL_BARRIER, NULL, NULL, 0, HOOP_UINT8, HOOP_SUM, -1);
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ibarrier") : result;
}
