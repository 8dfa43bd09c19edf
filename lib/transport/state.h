/* state.h - the transport layer's state of a communicator (hoop_comm.transport), which only
 * lib/transport sees (lib/floors: "own"): the transports this rank listens on and which serves
 * each peer, the shared sleep's poll set, the spin, the stray messages and the board. The other
 * layers reach it through transport.h. */
#ifndef HOOP__TRANSPORT_STATE_H
#define HOOP__TRANSPORT_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "transport/transport.h"

struct hoop__transport_state {
  /* The transports this rank listens on, in priority order, each with its context; after the
   * rank table, each peer's pair is served by one of them (select.c). A view's are net's. */
  struct hoop__tctx *transports; /* HOOP__MAX_TRANSPORTS entries, ntransports used */
  int ntransports;
  uint8_t *peer_transport;  /* size entries: an index in transports (this rank's own: unused) */
  int ntransports_serving;  /* of them, those that serve a peer */
  struct pollfd *sleep_fds; /* the poll set of a sleep shared by several transports */
  size_t sleep_cap;
  int sleep_shared; /* every serving transport can share a sleep (sleep_prepare) */
  double spin_s;    /* how long a wait spins: the most any serving transport asks; -1 until the
                       first wait asks them */
  int spin_yields;  /* a spinning wait yields the CPU between empty rounds (this host's ranks
                       outnumber its CPUs); else it pauses briefly */
  /* Messages diverted from their receive's place (stray.c), oldest first, and how many have a
   * receive waiting for their last bytes: net's. */
  struct hoop__stray *strays, *strays_tail;
  int strays_waited;
  /* The board the small calls of a communicator on one host go through (board.c; coll/board.c
   * opens it): mapped by every rank, or by none. */
  struct hoop__board *board;
  /* What this rank's posts and waits measured, by peer (net's, size entries each, written under
   * the net lock and read by hoop_comm_stats from any thread): the time it waited for each, the
   * bytes it posted to and from each. */
  _Atomic uint64_t *peer_wait_ns, *peer_sent, *peer_received;
  /* And the links' (hoop__tctx_link_time): bytes of large messages from each, and their time. */
  _Atomic uint64_t *link_bytes, *link_ns;
  /* The pairs' keys (shared.c): net's, by net rank. */
  struct hoop__keyring keyring;
};

#endif
