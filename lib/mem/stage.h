/* stage.h - collectives on device buffers, through host memory: what a call's device buffers hold
 * is copied into a host stage before its algorithm runs and the result copied back after, so that
 * every algorithm and transport serves device buffers unchanged (what Gloo and Open MPI's
 * accelerator support do). Each rank decides alone: ranks on host and on device memory mix in one
 * call, and so do send and receive buffers of different kinds.
 *
 * The ring and direct allreduces, the chain broadcast and the ring allgather, which large buffers
 * take, do better where the driver has asynchronous copies: the input is copied in segment by
 * segment on a stream of hoop's own, in the order the algorithm reads the segments, and it waits
 * for a segment only when it first reads it; each piece of the result goes back as soon as it is
 * final, while the others move. The copies
 * then hide behind the transfers instead of adding to them (HOOP_CUDA_PIPELINE_BYTES).
 */
#ifndef HOOP__MEM_STAGE_H
#define HOOP__MEM_STAGE_H

#include "coll/coll.h"
#include "core/internal.h"
#include "mem/cuda.h"

typedef struct hoop__stage {
  int active;       /* the call runs on the stage: stage_out copies back */
  void *user_recv;  /* where the result goes */
  size_t out_bytes; /* how much of the stage is the result */
  void *out_from;
  /* The pipelined ring (pipe not NULL): the stage host[0, bytes) in the ring's segments. */
  hoop__cuda_pipe *pipe;
  char *host;
  size_t bytes;
  int nsegments;
  size_t *offset;          /* nsegments + 1 entries: segment s is [offset[s], offset[s + 1]) */
  unsigned char *waited;   /* per segment: its copy in has been waited for */
  int copy_back;           /* the result goes back to device memory, segment by segment */
  hoop_result copy_result; /* the first failure of a copy queued from a hook */
} hoop__stage;

/* If args names device memory, copy its inputs to the stage and point args at it; algo is the
 * algorithm about to run (the ring allreduce may pipeline). */
hoop_result hoop__stage_in(hoop_comm *comm, hoop__coll_args *args, hoop__algo_fn algo,
                           hoop__stage *stage);

/* After the algorithm, which returned result: the result back to the user's device buffer (only
 * if result is HOOP_OK), copies still queued waited for, the stage released for the next call. */
hoop_result hoop__stage_out(hoop_comm *comm, hoop__stage *stage, hoop_result result);

/* The algorithms' hooks (no-ops unless a pipelined stage is active): one is about to read [ptr,
 * ptr + len) of its input, or [ptr, ptr + len) of its result is final. */
hoop_result hoop__stage_need_slow(hoop_comm *comm, const void *ptr, size_t len);
void hoop__stage_done_slow(hoop_comm *comm, const void *ptr, size_t len);
static inline hoop_result hoop__stage_need(hoop_comm *comm, const void *ptr, size_t len) {
  return comm->stage_pipe ? hoop__stage_need_slow(comm, ptr, len) : HOOP_OK;
}
static inline void hoop__stage_done(hoop_comm *comm, const void *ptr, size_t len) {
  if (comm->stage_pipe)
    hoop__stage_done_slow(comm, ptr, len);
}

/* Release the stage (hoop_finalize). */
void hoop__stage_free(hoop_comm *comm);

#endif /* HOOP__MEM_STAGE_H */
