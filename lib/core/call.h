/* call.h - one collective call as every layer sees it: its arguments, and what the algorithm
 * chosen for it tells the memory layer (how it reads its input and finishes its result, how much
 * scratch it takes), so that a path that runs it on other memory never asks which algorithm runs.
 */
#ifndef HOOP__CALL_H
#define HOOP__CALL_H

#include <stddef.h>

#include "core/internal.h"

/* One call's arguments, as every algorithm of every collective takes them. bytes is the call's
 * payload per rank: count elements (allgather: this rank's block), 0 for a barrier. A new field is
 * set in coll/api.c's call_args too. */
typedef struct hoop__coll_args {
  hoop__coll coll;
  const void *sendbuf;
  void *recvbuf; /* broadcast: buf */
  size_t count;
  hoop_dtype dtype;
  hoop_op op; /* allreduce */
  int root;   /* broadcast */
  size_t esize, bytes;
  /* alltoallv: elements to and from each rank, and where they lie (in elements) */
  const size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
  int checked;       /* the post's checks passed (coll/api.c): the run need not make them again */
  uint32_t name_tag; /* the name the program gave the call (hoop_name_next), 0 for none */
  /* The wire format across hosts (hoop.h's HOOP_COMPRESS_* with its flags): as posted, the one
   * hoop_compress_next asked for or HOOP__COMPRESS_COMM for the communicator's; once the call
   * runs, the one it goes by (0: exact). */
  int compress;
  /* With error feedback, the caller's input (before any staging): the residuals live with its
   * registration. */
  const void *feedback_buf;
} hoop__coll_args;

/* The bytes a call's result holds on each rank: the gathered blocks of an allgather, else the
 * call's payload. */
static inline size_t hoop__call_total(const hoop_comm *comm, const hoop__coll_args *args) {
  return args->coll == HOOP__COLL_ALLGATHER || args->coll == HOOP__COLL_ALLTOALL
             ? args->bytes * (size_t)comm->size
             : args->bytes;
}

/* In which order an algorithm reads its input and finishes its result, for a path that feeds its
 * input in and takes its result out while it runs (mem/stage.c): */
typedef enum hoop__order {
  HOOP__ORDER_WHOLE = 0, /* no order to follow: the input whole before, the result whole after */
  HOOP__ORDER_RING,      /* segment r first, then r-1, r-2...; each segment final as it comes */
  HOOP__ORDER_DIRECT,    /* the peers' segments r+1, r+2..., then its own; each final as it comes */
  HOOP__ORDER_SPREAD,    /* the root's buffer from its start, pieces final as they arrive */
} hoop__order;

/* What the tuning table says of an algorithm besides its name and code. */
typedef struct hoop__algo_traits {
  hoop__order order;
  int scratch_whole; /* its scratch may hold the whole call, not only a few chunks */
  int by_host;       /* it runs host by host (a step within hosts, one between, one within) */
} hoop__algo_traits;

/* Element range of ring segment i when count elements are cut into n near-equal segments. */
static inline void hoop__segment(size_t count, int n, int i, size_t *first, size_t *elems) {
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  size_t index = (size_t)i;
  *elems = base + (index < extra ? 1 : 0);
  *first = index * base + (index < extra ? index : extra);
}

#endif /* HOOP__CALL_H */
