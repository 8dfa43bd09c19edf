/* board.c - small calls on one host through the communicator's board (transport.h): each rank
 * writes its part into a slot of its own and publishes it, and reads its peers' slots in place.
 * No message, frame or queue is involved: a small allreduce costs each rank one store of its line
 * and one miss per peer; a broadcast's root publishes and goes on, up to HOOP__BOARD_SLOTS - 1
 * calls ahead of its slowest receiver. Every rank reduces the slots in rank order, so all get the
 * same bits; in reproducible mode over the fixed tree (repro.c), as every other path would. A call
 * that does not fit a slot, or a communicator without a board, runs the algorithm the cut-over
 * table would choose for small calls without the board. */
#include "coll/coll.h"
#include "core/env.h"

/* Every rank's flag ANDed around the ring, n - 1 steps: only the neighbours' pairs carry it, which
 * hoop_init connected, so a communicator that ends without a board has joined no other pair. */
static hoop_result ring_agree(hoop_comm *comm, int *flag) {
  int n = comm->size;
  unsigned char mine = *flag != 0;
  hoop_result result = HOOP_OK;
  for (int step = 0; step < n - 1 && result == HOOP_OK; step++) {
    unsigned char heard = 0;
    result =
        hoop__sendrecv(comm, (comm->rank + 1) % n, &mine, 1, (comm->rank + n - 1) % n, &heard, 1);
    mine &= heard;
  }
  *flag = mine;
  return result;
}

hoop_result hoop__coll_board_open(hoop_comm *comm) {
  if (comm->size < 2 || comm->size > HOOP__BOARD_MAX_RANKS)
    return HOOP_OK;
  /* Alike on every rank: whether to try (HOOP_SHM_BOARD; trying connects every pair), and
   * whether every rank mapped it. */
  int ok = strcmp(hoop__env_get("HOOP_SHM_BOARD"), "0") != 0;
  hoop_result result = ring_agree(comm, &ok);
  if (result != HOOP_OK || !ok)
    return result;
  hoop__group whole = hoop__whole(comm);
  hoop__board *board = NULL;
  if ((result = hoop__board_open(comm, &board)) != HOOP_OK)
    return result;
  ok = board != NULL;
  if ((result = hoop__group_agree(comm, &whole, &ok, 0)) != HOOP_OK || !ok) {
    hoop__board_close(board);
    return result;
  }
  hoop__transport_set_board(comm, board);
  return HOOP_OK;
}

void hoop__coll_board_free(hoop_comm *comm) {
  hoop__board_close(hoop__transport_board(comm));
  hoop__transport_set_board(comm, NULL);
}

/* The board, if the call's payload in a slot (bytes) fits. */
static hoop__board *board_for(const hoop_comm *comm, size_t bytes) {
  return bytes <= HOOP__BOARD_PAYLOAD ? hoop__transport_board(comm) : NULL;
}

/* Publish this rank's slot for seq after writing bytes of src into it (none for a barrier). */
static hoop_result post(hoop_comm *comm, hoop__board *board, uint64_t seq, const void *src,
                        size_t bytes) {
  hoop_result result = hoop__board_claim(comm, board, seq);
  if (result == HOOP_OK && bytes)
    result = hoop__kind_copy(comm, hoop__board_slot(board, comm->rank, seq, bytes), src, bytes);
  if (result == HOOP_OK)
    hoop__board_publish(comm, board, seq);
  return result;
}

/* Wait for every other rank's slot of seq. */
static hoop_result wait_all(hoop_comm *comm, hoop__board *board, uint64_t seq) {
  hoop_result result = HOOP_OK;
  for (int r = 0; r < comm->size && result == HOOP_OK; r++)
    if (r != comm->rank)
      result = hoop__board_wait(comm, board, r, seq);
  return result;
}

/* Reproducible mode: every rank's part over the fixed tree (repro.c), this rank's from its input
 * (mine) and the others' from their slots, at byte offset at of each slot of total bytes. */
static hoop_result reduce_fixed(hoop_comm *comm, hoop__board *board, uint64_t seq,
                                const hoop__coll_args *args, const void *mine, size_t at,
                                size_t total) {
  const void *srcs[HOOP__BOARD_MAX_RANKS];
  for (int r = 0; r < comm->size; r++)
    srcs[r] = r == comm->rank ? mine : (const char *)hoop__board_slot(board, r, seq, total) + at;
  return hoop__kind_reduce_fixed(comm, args->recvbuf, srcs, comm->size, args->count, args->dtype,
                                 args->op);
}

/* An allreduce's result: every slot (of count elements), reduced in rank order on every rank, so
 * that all ranks get the same bits. */
static hoop_result reduce_slots(hoop_comm *comm, hoop__board *board, uint64_t seq,
                                const hoop__coll_args *args) {
  size_t bytes = args->bytes, count = args->count;
  void *dst = args->recvbuf;
  if (comm->reproducible)
    return reduce_fixed(comm, board, seq, args, hoop__board_slot(board, comm->rank, seq, bytes), 0,
                        bytes);
  hoop_result result =
      hoop__kind_reduce3(comm, dst, hoop__board_slot(board, 0, seq, bytes),
                         hoop__board_slot(board, 1, seq, bytes), count, args->dtype, args->op);
  for (int r = 2; r < comm->size && result == HOOP_OK; r++)
    result = hoop__kind_reduce3(comm, dst, dst, hoop__board_slot(board, r, seq, bytes), count,
                                args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__kind_finish(comm, dst, count, args->dtype, args->op, comm->size);
  return result;
}

hoop_result hoop__allreduce_board(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__board *board = board_for(comm, args->bytes);
  if (!board)
    return hoop__allreduce_rd(comm, args); /* whose order is the fixed tree's too */
  uint64_t seq = hoop__board_next(board);
  hoop_result result = post(comm, board, seq, args->sendbuf, args->bytes);
  if (result == HOOP_OK)
    result = wait_all(comm, board, seq);
  if (result == HOOP_OK)
    result = reduce_slots(comm, board, seq, args);
  if (result == HOOP_OK)
    hoop__board_done(comm, board, seq, 1);
  return result;
}

hoop_result hoop__broadcast_board(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__board *board = board_for(comm, args->bytes);
  if (!board)
    return hoop__broadcast_tree(comm, args);
  uint64_t seq = hoop__board_next(board);
  hoop_result result;
  if (comm->rank == args->root) {
    result = post(comm, board, seq, args->recvbuf, args->bytes);
  } else {
    result = hoop__board_wait(comm, board, args->root, seq);
    if (result == HOOP_OK)
      result = hoop__kind_copy(comm, args->recvbuf,
                               hoop__board_slot(board, args->root, seq, args->bytes), args->bytes);
  }
  if (result == HOOP_OK)
    hoop__board_done(comm, board, seq, 0);
  return result;
}

hoop_result hoop__barrier_board(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__board *board = hoop__transport_board(comm);
  if (!board)
    return hoop__barrier_dissemination(comm, args);
  uint64_t seq = hoop__board_next(board);
  hoop_result result = post(comm, board, seq, NULL, 0);
  if (result == HOOP_OK)
    result = wait_all(comm, board, seq);
  if (result == HOOP_OK)
    hoop__board_done(comm, board, seq, 1);
  return result;
}

/* The own block is in place already (the dispatcher's prepare). */
hoop_result hoop__allgather_board(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__board *board = board_for(comm, args->bytes);
  if (!board)
    return (comm->size & (comm->size - 1)) == 0 ? hoop__allgather_rd(comm, args)
                                                : hoop__allgather_bruck(comm, args);
  uint64_t seq = hoop__board_next(board);
  hoop_result result = post(comm, board, seq, args->sendbuf, args->bytes);
  for (int r = 0; r < comm->size && result == HOOP_OK; r++) {
    if (r == comm->rank)
      continue;
    result = hoop__board_wait(comm, board, r, seq);
    if (result == HOOP_OK)
      result = hoop__kind_copy(comm, (char *)args->recvbuf + (size_t)r * args->bytes,
                               hoop__board_slot(board, r, seq, args->bytes), args->bytes);
  }
  if (result == HOOP_OK)
    hoop__board_done(comm, board, seq, 1);
  return result;
}

/* The blocks of this rank's input meant for the others into its slot (its own block's place left
 * as it was), published. */
static hoop_result post_others(hoop_comm *comm, hoop__board *board, uint64_t seq,
                               const hoop__coll_args *args, size_t total) {
  size_t mine = (size_t)comm->rank * args->bytes, after = mine + args->bytes;
  char *slot = hoop__board_slot(board, comm->rank, seq, total);
  const char *send = args->sendbuf;
  hoop_result result = hoop__board_claim(comm, board, seq);
  if (result == HOOP_OK && mine)
    result = hoop__kind_copy(comm, slot, send, mine);
  if (result == HOOP_OK && after < total)
    result = hoop__kind_copy(comm, slot + after, send + after, total - after);
  if (result == HOOP_OK)
    hoop__board_publish(comm, board, seq);
  return result;
}

/* Each rank publishes the blocks of its input meant for the others and reduces its own block from
 * its input and every other slot. Only this rank computes its block, so the order need not be
 * the same on every rank: its own input first, then the others in rank order (an in-place call's
 * output is that input block, which a reduction may overwrite as it reads). */
hoop_result hoop__reduce_scatter_board(hoop_comm *comm, const hoop__coll_args *args) {
  size_t total = args->bytes * (size_t)comm->size;
  hoop__board *board = board_for(comm, total);
  if (!board)
    return comm->reproducible ? hoop__reduce_scatter_repro(comm, args)
                              : hoop__reduce_scatter_direct(comm, args);
  uint64_t seq = hoop__board_next(board);
  size_t mine = (size_t)comm->rank * args->bytes;
  hoop_result result = post_others(comm, board, seq, args, total);
  if (comm->reproducible) {
    /* Every part is needed before the tree's first step: all slots first. */
    if (result == HOOP_OK)
      result = wait_all(comm, board, seq);
    if (result == HOOP_OK)
      result =
          reduce_fixed(comm, board, seq, args, (const char *)args->sendbuf + mine, mine, total);
    if (result == HOOP_OK)
      hoop__board_done(comm, board, seq, 1);
    return result;
  }
  const void *acc = (const char *)args->sendbuf + mine;
  for (int r = 0; r < comm->size && result == HOOP_OK; r++) {
    if (r == comm->rank)
      continue;
    result = hoop__board_wait(comm, board, r, seq);
    if (result == HOOP_OK)
      result = hoop__kind_reduce3(comm, args->recvbuf, acc,
                                  (const char *)hoop__board_slot(board, r, seq, total) + mine,
                                  args->count, args->dtype, args->op);
    acc = args->recvbuf;
  }
  if (result == HOOP_OK)
    result = hoop__kind_finish(comm, args->recvbuf, args->count, args->dtype, args->op, comm->size);
  if (result == HOOP_OK)
    hoop__board_done(comm, board, seq, 1);
  return result;
}

/* Each rank publishes the blocks of its input meant for the others (its own block's place in the
 * slot is left as it was) and takes its block from every other rank's slot; its own goes from its
 * input straight to its output (where the input is the output it is in place already). */
hoop_result hoop__alltoall_board(hoop_comm *comm, const hoop__coll_args *args) {
  size_t total = args->bytes * (size_t)comm->size;
  hoop__board *board = board_for(comm, total);
  if (!board)
    return hoop__alltoall_pairwise(comm, args);
  uint64_t seq = hoop__board_next(board);
  size_t mine = (size_t)comm->rank * args->bytes;
  hoop_result result = post_others(comm, board, seq, args, total);
  if (result == HOOP_OK && args->sendbuf != args->recvbuf)
    result = hoop__kind_copy(comm, (char *)args->recvbuf + mine, (const char *)args->sendbuf + mine,
                             args->bytes);
  for (int r = 0; r < comm->size && result == HOOP_OK; r++) {
    if (r == comm->rank)
      continue;
    result = hoop__board_wait(comm, board, r, seq);
    if (result == HOOP_OK)
      result =
          hoop__kind_copy(comm, (char *)args->recvbuf + (size_t)r * args->bytes,
                          (const char *)hoop__board_slot(board, r, seq, total) + mine, args->bytes);
  }
  if (result == HOOP_OK)
    hoop__board_done(comm, board, seq, 1);
  return result;
}
