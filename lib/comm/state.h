/* state.h - the communicator's life's state (hoop_comm.life), which only lib/comm sees
 * (lib/floors: "own"): its sub-communicators, the generations before and after it, the launcher
 * watch and the rendezvous server it hosts. */
#ifndef HOOP__COMM_STATE_H
#define HOOP__COMM_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/internal.h"

struct hoop__comm_life {
  int views;             /* net's: sub-communicators alive (split.c) */
  uint32_t next_channel; /* the lowest channel no communicator of this rank has used */
  atomic_int splitting;  /* a hoop_comm_split of one of net's communicators runs */
  /* Shrinking with sub-communicators: the generation that followed this net on this rank
   * (hoop_comm_shrink's, until it is finalized), and in that one each rank's rank before it (-1
   * for a newcomer), so that the views of this net can follow it (hoop__view_shrink). */
  hoop_comm *successor, *predecessor;
  int *prev_rank;
  struct hoop__rdzv_thread *server; /* the embedded rendezvous server, when this rank hosts it */
  struct hoop__watch *watch;        /* the launcher watch (watch.c), or NULL */
  int watch_running;
};

#endif
