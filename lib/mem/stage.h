/* stage.h - collectives on device buffers, through host memory: what a call's device buffers hold
 * is copied into a host stage before its algorithm runs and the result copied back after, so that
 * every algorithm and transport serves device buffers unchanged (what Gloo and Open MPI's
 * accelerator support do). Each rank decides alone: ranks on host and on device memory mix in one
 * call, and so do send and receive buffers of different kinds.
 */
#ifndef HOOP__MEM_STAGE_H
#define HOOP__MEM_STAGE_H

#include "coll/coll.h"

typedef struct hoop__stage {
  int active;       /* the call runs on the stage: stage_out copies back */
  void *user_recv;  /* where the result goes */
  size_t out_bytes; /* how much of the stage is the result */
  void *out_from;
} hoop__stage;

/* If args names device memory, copy its inputs to the stage and point args at it. */
hoop_result hoop__stage_in(hoop_comm *comm, hoop__coll_args *args, hoop__stage *stage);

/* After the algorithm: the result back to the user's device buffer. */
hoop_result hoop__stage_out(hoop_comm *comm, const hoop__stage *stage);

/* Release the stage (hoop_finalize). */
void hoop__stage_free(hoop_comm *comm);

#endif /* HOOP__MEM_STAGE_H */
