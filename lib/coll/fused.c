/* fused.c - hoop_allreduce_many and hoop_iallreduce_many: a set of buffers allreduced as one
 * request, packed into pieces of HOOP_FUSION_BYTES (Horovod's tensor fusion, below the
 * framework), each piece one allreduce through the dispatcher. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"
#include "core/env.h"
#include "core/fingerprint.h"
#include "core/request.h"
#include "mem/kind.h"

#define FUSION_MIN_BYTES 4096
#define FUSION_MAX_BYTES (1L << 30)
/* A buffer of this many bytes in a fused set is allreduced where it lies, not packed. */
#define FUSION_DIRECT_BYTES (512L * 1024)

/* A fused request: n buffers, the arrays owned when on the heap. */
typedef struct fused_request {
  hoop_request base; /* first: the queue sees only this */
  hoop_dtype dtype;
  hoop_op op;
  size_t nbufs;
  const void *const *sendbufs;
  void *const *recvbufs;
  const size_t *counts;
  uint32_t name_tag; /* hoop_name_next's, which each piece carries */
  int compress;      /* hoop_compress_next's, or the communicator's (HOOP__COMPRESS_COMM) */
} fused_request;

/* ---- running a fused request ----------------------------------------------------------------- */

static hoop_result read_fusion(hoop_comm *comm) {
  long bytes;
  if (hoop__parse_int(hoop__env_get("HOOP_FUSION_BYTES"), FUSION_MIN_BYTES, FUSION_MAX_BYTES,
                      &bytes) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_allreduce_many: HOOP_FUSION_BYTES '%s' is not a number of bytes "
                           "in %d..%ld",
                           hoop__env_get("HOOP_FUSION_BYTES"), FUSION_MIN_BYTES, FUSION_MAX_BYTES);
  comm->coll->fusion = malloc((size_t)bytes);
  if (!comm->coll->fusion)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                           "hoop_allreduce_many: cannot allocate %ld bytes to pack into", bytes);
  comm->coll->fusion_bytes = (size_t)bytes;
  return HOOP_OK;
}

/* Packing and unpacking: memcpy, or hoop__mem_copy where a device memory kind is loaded (the
 * driver for device buffers; its errors name the call). */
static hoop_result pack_copy(hoop_comm *comm, const fused_request *req, void *dst, const void *src,
                             size_t bytes) {
  if (!hoop__mem_kinds_here()) {
    memcpy(dst, src, bytes);
    return HOOP_OK;
  }
  comm->call = req->base.name;
  hoop_result result = hoop__mem_copy(comm, dst, src, bytes);
  comm->call = NULL;
  return result;
}

/* The fused allreduce: pack as much as a piece holds (a buffer may span pieces, cut between
 * elements), allreduce the piece in place, unpack it. A buffer large enough that packing would
 * cost more than a call of its own (half a piece, or FUSION_DIRECT_BYTES) is allreduced where it
 * lies instead, with no copy. Every rank cuts the same pieces from the same counts, so each piece
 * is one matching allreduce. */
static hoop_result run_fused(hoop_comm *comm, hoop_request *request) {
  fused_request *req = (fused_request *)request;
  hoop_result result = HOOP_OK;
  size_t esize = hoop_dtype_size(req->dtype);
  if (!comm->coll->fusion && (result = read_fusion(comm)) != HOOP_OK)
    return result;
  size_t piece_elems = comm->coll->fusion_bytes / esize;
  size_t direct_bytes = comm->coll->fusion_bytes / 2 < FUSION_DIRECT_BYTES
                            ? comm->coll->fusion_bytes / 2
                            : FUSION_DIRECT_BYTES;
  char *piece = comm->coll->fusion;
  size_t buf = 0, at = 0; /* the next element to pack: buffer buf, element at */
  while (result == HOOP_OK) {
    if (buf < req->nbufs && at == 0 && req->counts[buf] * esize >= direct_bytes) {
      hoop__coll_args args = {.coll = HOOP__COLL_ALLREDUCE,
                              .sendbuf = req->sendbufs[buf],
                              .recvbuf = req->recvbufs[buf],
                              .count = req->counts[buf],
                              .dtype = req->dtype,
                              .op = req->op,
                              .root = -1,
                              .name_tag = req->name_tag,
                              .compress = req->compress};
      result = hoop__coll_run(comm, &args);
      buf++;
      continue;
    }
    size_t first_buf = buf, first_at = at, filled = 0;
    while (buf < req->nbufs && filled < piece_elems) {
      if (at == 0 && filled > 0 && req->counts[buf] * esize >= direct_bytes)
        break; /* it goes on its own, next */
      size_t take = req->counts[buf] - at;
      if (take > piece_elems - filled)
        take = piece_elems - filled;
      if (take && result == HOOP_OK)
        result = pack_copy(comm, req, piece + filled * esize,
                           (const char *)req->sendbufs[buf] + at * esize, take * esize);
      filled += take;
      at += take;
      if (at == req->counts[buf]) {
        buf++;
        at = 0;
      }
    }
    if (filled == 0 || result != HOOP_OK)
      break;
    hoop__coll_args args = {.coll = HOOP__COLL_ALLREDUCE,
                            .sendbuf = piece,
                            .recvbuf = piece,
                            .count = filled,
                            .dtype = req->dtype,
                            .op = req->op,
                            .root = -1,
                            .name_tag = req->name_tag,
                            .compress = req->compress};
    result = hoop__coll_run(comm, &args);
    /* Unpack what this piece carried, in the order it was packed. */
    for (size_t b = first_buf, from = first_at, done = 0; result == HOOP_OK && done < filled; b++) {
      size_t take = req->counts[b] - from;
      if (take > filled - done)
        take = filled - done;
      if (take)
        result = pack_copy(comm, req, (char *)req->recvbufs[b] + from * esize, piece + done * esize,
                           take * esize);
      done += take;
      from = 0;
    }
  }
  /* A copy that failed (through the driver) left the other ranks waiting for this rank's piece:
   * failing the communicator tells them at once, as a failed collective does (dispatch.c). */
  return result != HOOP_OK ? hoop__fail_as_recorded(comm, result) : result;
}

/* Bytes a fused request moves per rank, for the trace. */
static size_t fused_bytes(size_t n, const size_t *counts, hoop_dtype dtype) {
  size_t esize = hoop_dtype_size(dtype), total = 0;
  for (size_t i = 0; i < n; i++)
    total += counts[i] * esize;
  return total;
}

static void release_arrays(hoop_request *request) {
  fused_request *req = (fused_request *)request;
  free((void *)req->sendbufs);
  free((void *)req->recvbufs);
  free((void *)req->counts);
}

void hoop__fused_free(hoop_comm *comm) {
  free(comm->coll->fusion);
  comm->coll->fusion = NULL;
}

/* ---- the calls ------------------------------------------------------------------------------- */

static hoop_result check_many(hoop_comm *comm, const char *call, size_t n,
                              const void *const *sendbufs, void *const *recvbufs,
                              const size_t *counts, hoop_dtype dtype, hoop_op op) {
  if (hoop_dtype_size(dtype) == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  if (hoop__check_op(comm, call, dtype, op) != HOOP_OK)
    return HOOP_ERR_INVALID_ARG;
  if (n > 0 && (!sendbufs || !recvbufs || !counts))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with %zu buffers", call,
                           !sendbufs   ? "sendbufs"
                           : !recvbufs ? "recvbufs"
                                       : "counts",
                           n);
  for (size_t i = 0; i < n; i++)
    if (counts[i] > 0 && (!sendbufs[i] || !recvbufs[i]))
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: buffer %zu is NULL with count %zu",
                             call, i, counts[i]);
  return HOOP_OK;
}

static hoop_result start_many(hoop_comm *comm, const char *call, size_t n,
                              const void *const *sendbufs, void *const *recvbufs,
                              const size_t *counts, hoop_dtype dtype, hoop_op op,
                              hoop_request **request) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  uint32_t name_tag = hoop__name_take(comm);
  int compress = hoop__compress_take(comm);
  hoop_result result = check_many(comm, call, n, sendbufs, recvbufs, counts, dtype, op);
  if (result == HOOP_OK)
    result =
        hoop__coll_check_compress(comm, call, HOOP__COLL_ALLREDUCE, dtype, op, compress, NULL, 0);
  if (result != HOOP_OK)
    return result;
  /* A set may be empty (nbufs 0): its request still runs in its turn. */
  if (!request) {
    fused_request req = {
        .base = {.run = run_fused, .bytes = fused_bytes(n, counts, dtype), .name = call},
        .dtype = dtype,
        .op = op,
        .nbufs = n,
        .sendbufs = sendbufs,
        .recvbufs = recvbufs,
        .counts = counts,
        .name_tag = name_tag,
        .compress = compress};
    if ((result = hoop__request_post(comm, &req.base)) != HOOP_OK)
      return result;
    hoop__request_wait_done(comm, &req.base);
    return hoop__request_told(comm, &req.base);
  }
  *request = NULL;
  fused_request *req = calloc(1, sizeof *req);
  const void **sends = malloc((n ? n : 1) * sizeof *sends);
  void **recvs = malloc((n ? n : 1) * sizeof *recvs);
  size_t *copied = malloc((n ? n : 1) * sizeof *copied);
  if (!req || !sends || !recvs || !copied) {
    free(req);
    free(sends);
    free(recvs);
    free(copied);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for the request", call);
  }
  if (n) {
    memcpy(sends, sendbufs, n * sizeof *sends);
    memcpy(recvs, recvbufs, n * sizeof *recvs);
    memcpy(copied, counts, n * sizeof *copied);
  }
  req->dtype = dtype;
  req->op = op;
  req->nbufs = n;
  req->sendbufs = sends;
  req->recvbufs = recvs;
  req->counts = copied;
  req->name_tag = name_tag;
  req->compress = compress;
  req->base.run = run_fused;
  req->base.release = release_arrays;
  req->base.bytes = fused_bytes(n, copied, dtype);
  req->base.on_heap = 1;
  req->base.name = call;
  /* A post that failed (a bad HOOP_ASYNC_PROGRESS, no progress thread) queued nothing and counted
   * nothing outstanding: the request is freed here, not finished as one that ran. */
  if ((result = hoop__request_post(comm, &req->base)) != HOOP_OK) {
    release_arrays(&req->base);
    free(req);
    return result;
  }
  *request = &req->base;
  return HOOP_OK;
}

hoop_result hoop_allreduce_many(hoop_comm *comm, size_t n, const void *const *sendbufs,
                                void *const *recvbufs, const size_t *counts, hoop_dtype dtype,
                                hoop_op op) {
  return start_many(comm, "hoop_allreduce_many", n, sendbufs, recvbufs, counts, dtype, op, NULL);
}

hoop_result hoop_iallreduce_many(hoop_comm *comm, size_t n, const void *const *sendbufs,
                                 void *const *recvbufs, const size_t *counts, hoop_dtype dtype,
                                 hoop_op op, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_iallreduce_many");
  return result == HOOP_OK ? start_many(comm, "hoop_iallreduce_many", n, sendbufs, recvbufs, counts,
                                        dtype, op, request)
                           : result;
}
