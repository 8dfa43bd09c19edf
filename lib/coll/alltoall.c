/* alltoall.c - hoop_alltoall and hoop_alltoallv: every rank sends a block to every rank (the
 * experts' exchange of a mixture-of-experts layer). Pairwise exchange: every receive is posted
 * first, then the sends go out in the order r+1, r+2, ..., so that at any moment the ranks send to
 * different peers and none is everyone's first; each pair meets once, and each block crosses once
 * between its owner and its reader. Every pair's message travels even when it is empty, so that
 * each receiver checks the length it posted against what its peer sent: an alltoallv whose counts
 * disagree between two ranks fails on both, naming the other (HOOP_ERR_MISMATCH). */
#include <stdlib.h>

#include "coll/coll.h"

/* Where the block for (to) or from (from) peer lies, in bytes: an alltoall's equal blocks or an
 * alltoallv's counts and displacements. */
static size_t send_at(const hoop__coll_args *args, int peer, size_t *len) {
  if (args->coll == HOOP__COLL_ALLTOALL) {
    *len = args->bytes;
    return (size_t)peer * args->bytes;
  }
  *len = args->sendcounts[peer] * args->esize;
  return args->sdispls[peer] * args->esize;
}

static size_t recv_at(const hoop__coll_args *args, int peer, size_t *len) {
  if (args->coll == HOOP__COLL_ALLTOALL) {
    *len = args->bytes;
    return (size_t)peer * args->bytes;
  }
  *len = args->recvcounts[peer] * args->esize;
  return args->rdispls[peer] * args->esize;
}

hoop_result hoop__alltoall_pairwise(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, r = comm->rank;
  const char *src = args->sendbuf;
  char *dst = args->recvbuf;
  /* In place (alltoall only: an alltoallv's buffer may be one, its blocks apart): the input is
   * read from a copy, as blocks arrive over it. */
  if (src == dst && args->coll == HOOP__COLL_ALLTOALL) {
    size_t total = (size_t)n * args->bytes;
    char *copy = hoop__kind_scratch(comm, total);
    hoop_result copied = copy ? hoop__kind_copy(comm, copy, src, total) : HOOP_ERR_SYSTEM;
    if (copied != HOOP_OK)
      return copied;
    src = copy;
  }
  /* The arena's requests: the communicator's spare block, no allocation per call. */
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int from = (r - k + n) % n;
    size_t len, at = recv_at(args, from, &len);
    hoop__transfer *req = hoop__arena_next(comm, &arena);
    result = req ? hoop__irecv_framed(comm, from, dst + at, len, req) : HOOP_ERR_SYSTEM;
  }
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int to = (r + k) % n;
    size_t len, at = send_at(args, to, &len);
    hoop__transfer *req = hoop__arena_next(comm, &arena);
    result = req ? hoop__isend_framed(comm, to, src + at, len, req) : HOOP_ERR_SYSTEM;
  }
  /* This rank's own block, while the others travel. */
  size_t own_len, own_in = send_at(args, r, &own_len), own_out_len,
                  own_out = recv_at(args, r, &own_out_len);
  if (result == HOOP_OK)
    result = hoop__kind_copy(comm, dst + own_out, src + own_in, own_len);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  (void)own_out_len; /* equal to own_len: checked when the call was posted */
  hoop__arena_free(&arena);
  return result;
}

/* Bruck's all-to-all, for small blocks: ceil(log2 n) rounds instead of n-1 messages. The blocks
 * are first rotated so that position i holds the block for rank r + i; in the round of bit k, each
 * rank sends the blocks whose position has bit k set to rank r + 2^k, packed into one message, and
 * receives as many from rank r - 2^k into the same positions; at the end position i holds the
 * block from rank r - i, which the last step puts in its place. Every block travels up to log2(n)
 * times, so it pays only while per-message costs outweigh the bytes. */
hoop_result hoop__alltoall_bruck(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, r = comm->rank;
  size_t block = args->bytes, half = (size_t)(n + 1) / 2 * block;
  char *tmp = hoop__kind_scratch(comm, (size_t)n * block + 2 * half);
  if (!tmp)
    return HOOP_ERR_SYSTEM;
  char *out = tmp + (size_t)n * block, *in = out + half;
  const char *src = args->sendbuf;
  char *dst = args->recvbuf;
  hoop_result result = HOOP_OK;
  /* Position i: the block for rank (r + i) % n, in two pieces. */
  size_t head = (size_t)(n - r) * block;
  if ((result = hoop__kind_copy(comm, tmp, src + (size_t)r * block, head)) != HOOP_OK ||
      (result = hoop__kind_copy(comm, tmp + head, src, (size_t)r * block)) != HOOP_OK)
    return result;
  for (int bit = 1; bit < n && result == HOOP_OK; bit <<= 1) {
    size_t packed = 0;
    for (int i = bit; i < n && result == HOOP_OK; i++)
      if (i & bit) {
        result = hoop__kind_copy(comm, out + packed, tmp + (size_t)i * block, block);
        packed += block;
      }
    if (result == HOOP_OK)
      result = hoop__sendrecv(comm, (r + bit) % n, out, packed, (r - bit + n) % n, in, packed);
    packed = 0;
    for (int i = bit; i < n && result == HOOP_OK; i++)
      if (i & bit) {
        result = hoop__kind_copy(comm, tmp + (size_t)i * block, in + packed, block);
        packed += block;
      }
  }
  /* Position i holds the block from rank (r - i) % n. */
  for (int i = 0; i < n && result == HOOP_OK; i++)
    result = hoop__kind_copy(comm, dst + (size_t)((r - i + n) % n) * block, tmp + (size_t)i * block,
                             block);
  return result;
}
