/* reduce_scatter.c - hoop_reduce_scatter's algorithms: every rank ends with its block of the input
 * reduced over the ranks. The ring is the ring allreduce's first half, shifted so that rank r
 * finishes block r: each rank sends and receives (n-1)/n of the input, the bandwidth optimum, in
 * n-1 pipelined steps, and nothing crosses twice. Direct (ranks on one host) is the direct
 * allreduce's first half: each rank reduces its own block straight from every other rank's part,
 * depending on no chain of others. Either way each element is reduced on one rank in one order, so
 * the result has the bits the allreduce of the same input would have on that rank's block. */
#include "coll/coll.h"

/* Block i of the input: [i * bytes, (i + 1) * bytes), in comm's block tables. */
static void plan_blocks(hoop_comm *comm, size_t bytes) {
  for (int i = 0; i < comm->size; i++) {
    comm->block_offset[i] = (size_t)i * bytes;
    comm->block_length[i] = bytes;
  }
}

hoop_result hoop__reduce_scatter_ring(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size;
  plan_blocks(comm, args->bytes);
  size_t chunk_max = hoop__chunk_bytes(comm, args->bytes, args->esize);
  /* The receive slices, then room for the partial sums of every block at its place (they are
   * sent from there; the finished block goes straight to recvbuf). */
  size_t slices = HOOP__RING_RECV_DEPTH * chunk_max;
  char *scratch = hoop__kind_scratch(comm, slices + (size_t)n * args->bytes);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  hoop__arena arena = {0};
  hoop__group whole = hoop__whole(comm);
  hoop__ring_rs rs = {args->sendbuf,
                      scratch + slices,
                      args->recvbuf,
                      comm->block_offset,
                      comm->block_length,
                      n - 1,
                      scratch,
                      chunk_max,
                      args->dtype,
                      args->op,
                      1,
                      0};
  hoop_result result = hoop__ring_reduce_scatter(comm, &whole, &arena, &rs);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

hoop_result hoop__reduce_scatter_direct(hoop_comm *comm, const hoop__coll_args *args) {
  plan_blocks(comm, args->bytes);
  hoop__arena arena = {0};
  hoop_result result =
      hoop__direct_reduce(comm, &arena, args->sendbuf, args->recvbuf, comm->block_offset,
                          comm->block_length, args->esize, args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}
