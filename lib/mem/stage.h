/* stage.h - collectives on device buffers, through host memory: what a call's device buffers hold
 * is copied into a host stage before its algorithm runs and the result copied back after, so that
 * every algorithm and transport serves device buffers unchanged (what Gloo and Open MPI's
 * accelerator support do). Each rank decides alone: ranks on host and on device memory mix in one
 * call, and so do send and receive buffers of different kinds.
 *
 * An algorithm that reads its input and finishes its result in an order it declares (core/call.h:
 * the ring and direct allreduces, the chain broadcast and the ring allgather, which large buffers
 * take) does better where the driver has asynchronous copies: the input is copied in segment by
 * segment on a stream of hoop's own, in that order, and the algorithm runs on the piped memory
 * kind (hoop__mem_piped), whose need waits for a segment only when the algorithm first reads it
 * and whose done sends each piece of the result back as soon as it is final, while the others
 * move. The copies then hide behind the transfers instead of adding to them
 * (HOOP_CUDA_PIPELINE_BYTES).
 */
#ifndef HOOP__MEM_STAGE_H
#define HOOP__MEM_STAGE_H

#include "core/call.h"
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

/* If args names device memory, copy its inputs to the stage and point args at it; traits are
 * those of the algorithm about to run (one with an order may be piped: comm->mem is then the
 * piped kind until hoop__stage_out). */
hoop_result hoop__stage_in(hoop_comm *comm, hoop__coll_args *args, const hoop__algo_traits *traits,
                           hoop__stage *stage);

/* After the algorithm, which returned result: the result back to the user's device buffer (only
 * if result is HOOP_OK), copies still queued waited for, the stage released for the next call. */
hoop_result hoop__stage_out(hoop_comm *comm, hoop__stage *stage, hoop_result result);

/* Release the stage (hoop_finalize). */
void hoop__stage_free(hoop_comm *comm);

#endif /* HOOP__MEM_STAGE_H */
