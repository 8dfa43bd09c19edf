/* allgather.c - hoop_allgather: each rank's block travels once around the ring, pipelined in
 * chunks, so every rank sends and receives (n-1)/n of the result, the bandwidth optimum. */
#include <string.h>

#include "coll.h"

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
    return hoop__coll_end(comm, HOOP_OK);
  hoop__algo algo; /* allgather has only the ring; the call still obeys HOOP_CHUNK_BYTES */
  if ((result = hoop__coll_tuning(comm, &algo)) != HOOP_OK)
    return hoop__coll_end(comm, result);
  char *own = (char *)recvbuf + (size_t)comm->rank * block;
  if (sendbuf != own)
    memmove(own, sendbuf, block);
  if (comm->size == 1)
    return hoop__coll_end(comm, HOOP_OK);
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
