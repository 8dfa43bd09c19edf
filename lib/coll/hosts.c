/* hosts.c - the job's hosts as the rank table names them, for the algorithms that work host by
 * host: which ranks share this rank's host, and which rank of every host has this rank's place
 * on its own. Every rank computes the same from the same table. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"

static int same_host(const hoop_comm *comm, int a, int b) {
  return strcmp(comm->table.peers[a].host, comm->table.peers[b].host) == 0;
}

/* The first rank on rank r's host. */
static int host_leader(const hoop_comm *comm, int r) {
  for (int q = 0; q < r; q++)
    if (same_host(comm, q, r))
      return q;
  return r;
}

hoop_result hoop__hosts_plan(hoop_comm *comm) {
  int n = comm->size;
  /* One block: the struct, then offset and length (n each), local, cross and at (n each). */
  size_t bytes = sizeof(hoop__hosts) + 3 * (size_t)n * sizeof(int) + 2 * (size_t)n * sizeof(size_t);
  hoop__hosts *hosts = calloc(1, bytes);
  if (!hosts)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  hosts->offset = (size_t *)(hosts + 1);
  hosts->length = hosts->offset + n;
  hosts->local = (int *)(hosts->length + n);
  hosts->cross = hosts->local + n;
  hosts->at = hosts->cross + n;
  int *leader = malloc((size_t)n * sizeof *leader);
  if (!leader) {
    free(hosts);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  }
  for (int r = 0; r < n; r++)
    leader[r] = host_leader(comm, r);
  /* This host's ranks, in rank order, and this rank's place among them. */
  int mine = leader[comm->rank];
  for (int r = 0; r < n; r++)
    if (leader[r] == mine) {
      if (r == comm->rank)
        hosts->local_index = hosts->per_host;
      hosts->local[hosts->per_host++] = r;
    }
  /* Hosts in order of their lowest rank; on each, the rank at this rank's place. Hosts with
   * another number of ranks leave per_host 0: no host-by-host algorithm fits. */
  for (int r = 0; r < n; r++) {
    if (leader[r] != r)
      continue;
    int count = 0, at = -1;
    for (int q = r; q < n; q++)
      if (leader[q] == r) {
        if (count == hosts->local_index)
          at = q;
        count++;
      }
    if (count != hosts->per_host)
      hosts->even = -1;
    if (r == mine)
      hosts->host_index = hosts->count;
    hosts->cross[hosts->count++] = at;
  }
  /* Every host's ranks by place, where every host has as many. */
  if (hosts->even == 0)
    for (int r = 0, h = 0; r < n; r++)
      if (leader[r] == r) {
        for (int q = r, l = 0; q < n; q++)
          if (leader[q] == r)
            hosts->at[h * hosts->per_host + l++] = q;
        h++;
      }
  hosts->even = hosts->even == 0 && hosts->count > 1 && hosts->per_host > 1;
  hosts->consecutive = hosts->even;
  for (int r = 0; r < n && hosts->consecutive; r++)
    hosts->consecutive = leader[r] == r - r % hosts->per_host;
  free(leader);
  comm->coll->hosts = hosts;
  return HOOP_OK;
}
