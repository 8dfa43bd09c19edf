/* stats.c - hoop_comm_stats: what the floors below measured, gathered for the program: the
 * collectives' calls and waits (coll/tally.c), the bytes and waits by peer (the transport layer),
 * and the rendezvous server's last view of who comes late (rdzv/report.c). */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "rdzv/client.h"
#include "transport/transport.h"

_Static_assert(HOOP_STATS_COLLS == HOOP__COLL_COUNT, "hoop_stats.colls is one per collective");

static const char *const coll_names[HOOP_STATS_COLLS] = {
    "allreduce", "broadcast", "allgather", "barrier", "reduce_scatter",
    "alltoall",  "alltoallv", "reduce",    "gather",  "scatter",
};

const char *hoop_stats_coll_name(int index) {
  return index >= 0 && index < HOOP_STATS_COLLS ? coll_names[index] : NULL;
}

static void gather(hoop_comm *comm, hoop_stats *stats, hoop_peer_stats *peers, int npeers) {
  memset(stats, 0, sizeof *stats);
  double since = hoop__now() - hoop__coll_tally_began(comm);
  stats->since_s = since > 0 ? since : 0;
  for (int c = 0; c < HOOP__COLL_COUNT; c++) {
    uint64_t calls, bytes, time_ns, wait_ns;
    hoop__coll_tally_read(comm, (hoop__coll)c, &calls, &bytes, &time_ns, &wait_ns);
    stats->colls[c] =
        (hoop_coll_stats){calls, bytes, (double)time_ns * 1e-9, (double)wait_ns * 1e-9};
    stats->calls += calls;
    stats->bytes += bytes;
    stats->in_calls_s += (double)time_ns * 1e-9;
    stats->waited_s += (double)wait_ns * 1e-9;
  }
  stats->wait_share = stats->since_s > 0 ? stats->waited_s / stats->since_s : 0;
  if (stats->wait_share > 1)
    stats->wait_share = 1;

  hoop__view_msg view;
  stats->view_age_s = hoop__rendezvous_view(comm->net, &view);
  stats->late_calls = view.calls;
  stats->reporting = (int)view.reporting;
  stats->slowest_rank = -1;
  for (uint32_t i = 0; i < view.nlate && view.calls > 0; i++) {
    int r = hoop__comm_rank_of_net(comm, (int)view.late[i].rank);
    if (r >= 0) {
      stats->slowest_rank = r;
      stats->slowest_late_s = view.late[i].median_us * 1e-6;
      break;
    }
  }
  stats->slowest_link_from = stats->slowest_link_to = -1;
  if (view.nlinks > 0) {
    stats->slowest_link_from = hoop__comm_rank_of_net(comm, (int)view.links[0].from);
    stats->slowest_link_to = hoop__comm_rank_of_net(comm, (int)view.links[0].to);
    stats->slowest_link_goodput = (double)view.links[0].bytes / ((double)view.links[0].us * 1e-6);
  }
  for (int p = 0; p < npeers; p++) {
    hoop_peer_stats *peer = &peers[p];
    memset(peer, 0, sizeof *peer);
    peer->rank = p;
    peer->late_median_s = peer->late_p99_s = peer->late_max_s = peer->goodput = -1;
    int net_rank = hoop__net_rank(comm, p);
    for (uint32_t i = 0; i < view.nlate && view.calls > 0; i++)
      if (view.late[i].rank == (uint32_t)net_rank) {
        peer->late_median_s = view.late[i].median_us * 1e-6;
        peer->late_p99_s = view.late[i].p99_us * 1e-6;
        peer->late_max_s = view.late[i].max_us * 1e-6;
      }
    if (p == comm->rank || !hoop__transports_up(comm))
      continue;
    hoop__peer_tally tally;
    hoop__transport_peer_tally(comm, net_rank, &tally);
    peer->waited_s = (double)tally.wait_ns * 1e-9;
    peer->bytes_sent = tally.sent;
    peer->bytes_received = tally.received;
    peer->goodput =
        tally.link_ns > 0 ? (double)tally.link_bytes / ((double)tally.link_ns * 1e-9) : -1;
  }
}

hoop_result hoop_comm_stats_sized(hoop_comm *comm, hoop_stats *stats, size_t stats_size,
                                  hoop_peer_stats *peers, size_t peer_size, int npeers) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (!stats || stats_size == 0 || npeers < 0 || npeers > comm->size || (npeers > 0 && !peers) ||
      (npeers > 0 && peer_size == 0))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_comm_stats: %s",
                           !stats || stats_size == 0 ? "stats is NULL"
                           : npeers < 0 || npeers > comm->size
                               ? "npeers is not in 0..the communicator's size"
                               : "peers is NULL with npeers above 0");
  hoop_peer_stats *mine = npeers > 0 ? calloc((size_t)npeers, sizeof *mine) : NULL;
  if (npeers > 0 && !mine)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_comm_stats: out of memory");
  hoop_stats all;
  gather(comm, &all, mine, npeers);
  memcpy(stats, &all, stats_size < sizeof all ? stats_size : sizeof all);
  size_t each = peer_size < sizeof *mine ? peer_size : sizeof *mine;
  for (int p = 0; p < npeers; p++)
    memcpy((char *)peers + (size_t)p * peer_size, &mine[p], each);
  free(mine);
  return HOOP_OK;
}
