/* allgather.c - hoop_allgather: for large blocks each rank's block travels once around the ring,
 * pipelined in chunks, so every rank sends and receives (n-1)/n of the result, the bandwidth
 * optimum; for small ones Bruck's algorithm gathers in ceil(log2 n) rounds instead of n-1 hops. */
#include <string.h>

#include "coll.h"

/* At or below this many gathered bytes Bruck's log2(n) rounds beat the ring's n-1 hops: measured
 * at 4 ranks on loopback, p50 Bruck/ring 54/117 us at 8 B, 70/130 us at 64 KiB, 181/285 us at
 * 256 KiB, and 714/503 us at 1 MiB. */
#define ALLGATHER_BRUCK_MAX_BYTES (256 * 1024)

/* Bruck: in the round at distance d a rank sends the first min(d, n-d) blocks it holds to rank
 * r-d and appends as many from rank r+d. Blocks gather in staging in the order r, r+1, ..., so
 * they are rotated into place at the end; this works for any n, not only powers of two. */
static hoop_result bruck(hoop_comm *comm, const char *own, char *recvbuf, size_t block) {
  int n = comm->size, r = comm->rank;
  char *staging = hoop__scratch(comm, (size_t)n * block);
  if (!staging)
    return HOOP_ERR_SYSTEM;
  memcpy(staging, own, block);
  hoop_result result = HOOP_OK;
  size_t have = 1;
  for (int distance = 1; distance < n && result == HOOP_OK; distance <<= 1) {
    size_t blocks = (size_t)(distance < n - distance ? distance : n - distance);
    result = hoop__sendrecv(comm, (r - distance + n) % n, staging, blocks * block,
                            (r + distance) % n, staging + have * block, blocks * block);
    have += blocks;
  }
  for (int i = 0; i < n && result == HOOP_OK; i++)
    memcpy(recvbuf + (size_t)((r + i) % n) * block, staging + (size_t)i * block, block);
  return result;
}

hoop_result hoop_allgather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype) {
  hoop_result result = hoop__coll_begin(comm, "hoop_allgather", count, dtype, 1);
  if (result != HOOP_OK)
    return hoop__coll_end(comm, result);
  if (count > 0 && (!sendbuf || !recvbuf))
    return hoop__coll_end(comm, hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                                                "hoop_allgather: %s is NULL with count %zu",
                                                sendbuf ? "recvbuf" : "sendbuf", count));
  size_t block = count * hoop_dtype_size(dtype);
  if (block == 0)
    return hoop__coll_end(comm, hoop__coll_no_data(comm));
  hoop__algo algo;
  if ((result = hoop__coll_tuning(comm, &algo)) != HOOP_OK)
    return hoop__coll_end(comm, result);
  char *own = (char *)recvbuf + (size_t)comm->rank * block;
  if (sendbuf != own)
    memmove(own, sendbuf, block);
  if (comm->size == 1)
    return hoop__coll_end(comm, HOOP_OK);
  if (algo == HOOP__ALGO_RD ||
      (algo == HOOP__ALGO_AUTO && block * (size_t)comm->size <= ALLGATHER_BRUCK_MAX_BYTES))
    return hoop__coll_end(comm, bruck(comm, own, recvbuf, block));
  for (int i = 0; i < comm->size; i++) {
    comm->block_offset[i] = (size_t)i * block;
    comm->block_length[i] = block;
  }
  hoop__arena arena = {0};
  result = hoop__ring_circulate(comm, &arena, recvbuf, comm->block_offset, comm->block_length, 0,
                                hoop_dtype_size(dtype), 0);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return hoop__coll_end(comm, result);
}
