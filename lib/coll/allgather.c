/* allgather.c - hoop_allgather: for large blocks each rank's block travels once around the ring,
 * pipelined in chunks, so every rank sends and receives (n-1)/n of the result, the bandwidth
 * optimum; for smaller ones log2(n) rounds instead of n-1 hops: recursive doubling in place when
 * the rank count is a power of two, else Bruck's algorithm. */
#include <string.h>

#include "coll/coll.h"

/* At or below this many gathered bytes Bruck's log2(n) rounds beat the ring's n-1 hops: measured
 * at 4 ranks on loopback, p50 Bruck/ring 54/117 us at 8 B, 70/130 us at 64 KiB, 181/285 us at
 * 256 KiB, and 714/503 us at 1 MiB. It serves rank counts that are not powers of two. */
#define ALLGATHER_BRUCK_MAX_BYTES (256 * 1024)

/* For a power-of-two rank count recursive doubling, which moves the same bytes as Bruck without
 * its staging copy and rotation, runs up to this many gathered bytes. Measured on loopback (p50,
 * median of 3 or 4 alternated runs): at 2 ranks 8.5 us against Bruck's 9.4 at 8 B and 8.6 against
 * 10.0 at 4 KiB; at 4 ranks 34 against 42 us at 8 B, 108 against 152 at 256 KiB, 496 against the
 * ring's 536 at 1 MiB and 2.85 against 3.17 ms at 4 MiB; level with the ring from 16 MiB. Across
 * hosts each round waits for the last bytes of the one before, so the links idle at every round's
 * end while the ring's chunks stream on: 4 namespace hosts at 1 Gbit/s, busbw as a share of the
 * link, recursive doubling 94-96% and the ring 96% at 1 MiB, but 81-88% against 92% at 4 MiB.
 * So the larger bound holds only when every rank is on one host. */
#define ALLGATHER_RD_MAX_BYTES (1024 * 1024)
#define ALLGATHER_RD_MAX_BYTES_ONE_HOST (4 * 1024 * 1024)

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

/* Recursive doubling, for a power-of-two rank count: in the round at distance d a rank trades the
 * d blocks it holds for the d its partner r ^ d holds, all in place in recvbuf, so nothing is
 * staged or rotated. The blocks are the halving plan's parts of n elements of block bytes. */
static hoop_result recursive_doubling(hoop_comm *comm, char *recvbuf, size_t block) {
  hoop__halving plan;
  hoop__halving_plan(comm, (size_t)comm->size, &plan);
  hoop__arena arena = {0};
  hoop_result result = hoop__doubling_rounds(comm, &arena, recvbuf, block, &plan);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
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
  size_t gathered = block * (size_t)comm->size;
  int power_of_two = (comm->size & (comm->size - 1)) == 0;
  size_t rd_max =
      comm->local_size == comm->size ? ALLGATHER_RD_MAX_BYTES_ONE_HOST : ALLGATHER_RD_MAX_BYTES;
  if (power_of_two && (algo == HOOP__ALGO_HD || algo == HOOP__ALGO_RD ||
                       (algo == HOOP__ALGO_AUTO && gathered <= rd_max)))
    return hoop__coll_end(comm, recursive_doubling(comm, recvbuf, block));
  if (algo == HOOP__ALGO_RD || algo == HOOP__ALGO_HD ||
      (algo == HOOP__ALGO_AUTO && gathered <= ALLGATHER_BRUCK_MAX_BYTES))
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
