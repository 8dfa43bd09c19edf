/* reduce_scatter.c - hoop_reduce_scatter's algorithms: every rank ends with its block of the input
 * reduced over the ranks. The ring is the ring allreduce's first half, shifted so that rank r
 * finishes block r: each rank sends and receives (n-1)/n of the input, the bandwidth optimum, in
 * n-1 pipelined steps, and nothing crosses twice. Direct (ranks on one host) is the direct
 * allreduce's first half: each rank reduces its own block straight from every other rank's part,
 * depending on no chain of others. Recursive halving (a power-of-two rank count) is
 * halving-doubling's first half: log2(n) rounds, each trading half of what a rank still holds with
 * the partner that differs in one bit, the ring's bytes in log2(n) waits instead of n-1. Either way
 * each element is reduced on one rank in one order, so the result has the bits the allreduce of the
 * same input would have on that rank's block. */
#include "coll/coll.h"
#include "coll/state.h"

hoop_result hoop__reduce_scatter_ring(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size;
  hoop__plan_blocks(comm, args->bytes);
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
                      comm->coll->block_offset,
                      comm->coll->block_length,
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
  hoop__plan_blocks(comm, args->bytes);
  hoop__arena arena = {0};
  hoop_result result =
      hoop__direct_reduce(comm, &arena, args->sendbuf, args->recvbuf, comm->coll->block_offset,
                          comm->coll->block_length, args->esize, args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* Recursive halving over the whole input. With near_first (reproducible mode) neighbours pair
 * first, which leaves rank r the part numbered by r's bits reversed; so the blocks are first copied
 * into work in that order (block b at part reverse(b)), and each rank still ends with its own. */
static hoop_result reduce_scatter_halving(hoop_comm *comm, const hoop__coll_args *args,
                                          int near_first) {
  int n = comm->size;
  size_t count = args->count * (size_t)n, total = count * args->esize;
  size_t slice = hoop__chunk_bytes(comm, total, args->esize);
  size_t slices = HOOP__RING_RECV_DEPTH * slice;
  /* The receive slices, then the whole input's partial sums (what was given away is sent from
   * there until the arena is waited for). */
  char *scratch = hoop__kind_scratch(comm, slices + total);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  char *work = scratch + slices;
  hoop__halving
      plan; /* with n a power of two and count a multiple of n, rank r ends with block r */
  hoop__halving_plan_order(comm, count, near_first, &plan);
  const char *input = args->sendbuf;
  hoop_result result = HOOP_OK;
  if (near_first) {
    for (int b = 0; b < n && result == HOOP_OK; b++) {
      int part = 0;
      for (int k = 1, bit = n / 2; k < n; k <<= 1, bit >>= 1)
        part |= b & k ? bit : 0;
      result = hoop__kind_copy(comm, work + (size_t)part * args->bytes,
                               args->sendbuf + (size_t)b * args->bytes, args->bytes);
    }
    input = work;
  }
  hoop__arena arena = {0};
  if (result == HOOP_OK)
    result = hoop__halving_reduce(comm, &arena, input, work, count, args->dtype, args->op, scratch,
                                  slice, &plan);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  char *mine = work + plan.first * args->esize;
  if (result == HOOP_OK)
    result = hoop__kind_finish(comm, mine, plan.last - plan.first, args->dtype, args->op, n);
  if (result == HOOP_OK)
    result = hoop__kind_copy(comm, args->recvbuf, mine, args->bytes);
  hoop__arena_free(&arena);
  return result;
}

hoop_result hoop__reduce_scatter_halving(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size;
  if (n & (n - 1))
    return hoop__reduce_scatter_ring(comm, args); /* the plan would fold ranks, who own nothing */
  return reduce_scatter_halving(comm, args, 0);
}

/* Reproducible mode's: neighbours paired first, each block combined over the fixed tree (a
 * power-of-two rank count; recursive doubling's whole-input allreduce elsewhere). */
hoop_result hoop__reduce_scatter_repro_halving(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size;
  if (n & (n - 1))
    return hoop__reduce_scatter_repro_rd(comm, args);
  return reduce_scatter_halving(comm, args, 1);
}
