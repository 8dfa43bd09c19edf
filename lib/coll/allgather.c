/* allgather.c - hoop_allgather's algorithms: the ring, where each rank's block travels once around,
 * pipelined in chunks, so every rank sends and receives (n-1)/n of the result, the bandwidth
 * optimum; and log2(n) rounds instead of n-1 hops: recursive doubling in place when the rank count
 * is a power of two, else Bruck's algorithm. The dispatcher has put this rank's own block in place
 * (recvbuf + rank * block) before any of them runs. */
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"

/* Bruck: in the round at distance d a rank sends the first min(d, n-d) blocks it holds to rank
 * r-d and appends as many from rank r+d. Blocks gather in scratch in the order r, r+1, ..., so
 * they are rotated into place at the end; this works for any n, not only powers of two. */
hoop_result hoop__allgather_bruck(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, r = comm->rank;
  size_t block = args->bytes;
  char *recvbuf = args->recvbuf;
  const char *own = recvbuf + (size_t)r * block;
  char *scratch = hoop__kind_scratch(comm, (size_t)n * block);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop_result result = hoop__kind_copy(comm, scratch, own, block);
  size_t have = 1;
  for (int distance = 1; distance < n && result == HOOP_OK; distance <<= 1) {
    size_t blocks = (size_t)(distance < n - distance ? distance : n - distance);
    result = hoop__sendrecv(comm, (r - distance + n) % n, scratch, blocks * block,
                            (r + distance) % n, scratch + have * block, blocks * block);
    have += blocks;
  }
  for (int i = 0; i < n && result == HOOP_OK; i++)
    result = hoop__kind_copy(comm, recvbuf + (size_t)((r + i) % n) * block,
                             scratch + (size_t)i * block, block);
  return result;
}

/* Recursive doubling, for a power-of-two rank count: in the round at distance d a rank trades the
 * d blocks it holds for the d its partner r ^ d holds, all in place in recvbuf, so nothing is
 * copied aside or rotated. The blocks are the halving plan's parts of n elements of block bytes. */
hoop_result hoop__allgather_rd(hoop_comm *comm, const hoop__coll_args *args) {
  if (comm->size & (comm->size - 1))
    return hoop__allgather_bruck(comm, args); /* its log2(n) rounds for any rank count */
  char *recvbuf = args->recvbuf;
  size_t block = args->bytes;
  hoop__halving plan;
  hoop__halving_plan(comm, (size_t)comm->size, &plan);
  hoop__arena arena = {0};
  hoop_result result = hoop__doubling_rounds(comm, &arena, recvbuf, block, &plan);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

hoop_result hoop__allgather_ring(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__plan_blocks(comm, args->bytes);
  hoop__arena arena = {0};
  hoop__group whole = hoop__whole(comm);
  hoop_result result =
      hoop__ring_circulate(comm, &whole, &arena, args->recvbuf, comm->coll->block_offset,
                           comm->coll->block_length, 0, args->esize, 0);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* Direct: every rank sends its block to every other rank and receives each block from its owner,
 * all at once, in one round: over shared memory each block is one copy out of its owner's buffer
 * (CMA), and a rank depends on no other's forwarding. Sends start with the next rank and receives
 * with the previous one, so that no rank is everyone's first. */
hoop_result hoop__allgather_direct(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, r = comm->rank;
  size_t block = args->bytes;
  char *recvbuf = args->recvbuf;
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int from = (r - k + n) % n;
    hoop__transfer *req = hoop__arena_next(comm, &arena);
    result =
        req ? hoop__irecv(comm, from, recvbuf + (size_t)from * block, block, req) : HOOP_ERR_SYSTEM;
  }
  for (int k = 1; k < n && result == HOOP_OK; k++)
    result = hoop__arena_isend(comm, &arena, (r + k) % n, recvbuf + (size_t)r * block, block);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}
