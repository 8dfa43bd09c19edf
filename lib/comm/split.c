/* split.c - hoop_comm_split: sub-communicators as views of the communicator hoop_init made (its
 * "net"). A view has ranks, a rank table, calls, requests, scratch and a progress thread of its
 * own, and borrows net's transports: its messages travel on net's connections marked with a
 * channel of its own (transport.h, "binding"), and its transfers name net's ranks (net_rank_of).
 *
 * The channel: every rank keeps the lowest channel no communicator of its has used
 * (net->life->next_channel); a split takes the highest of those among comm's ranks, and each of
 * them moves past it. Two communicators that share a pair of ranks were made by splits both ranks
 * took part in, the later one above the earlier's channel on both; communicators made by one split
 * with different colors share no rank. So a channel is never in use twice on one connection. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "comm/state.h"
#include "transport/transport.h"

/* Channels fit the frame's 16 bits; 0 is net's own. */
#define CHANNEL_MAX 65535u

typedef struct member {
  int32_t color, key, next_channel;
} member;

/* The view's rank table: the members' entries of net's, with who shares a host recounted. */
static hoop_result make_table(hoop_comm *view, const hoop_comm *net) {
  view->table.size = (uint32_t)view->size;
  view->table.rank = (uint32_t)view->rank;
  view->table.generation = net->table.generation;
  memcpy(view->table.nonce, net->table.nonce, sizeof view->table.nonce);
  view->table.peers = calloc((size_t)view->size, sizeof *view->table.peers);
  if (!view->table.peers)
    return HOOP_ERR_SYSTEM;
  /* A job of one rank met no rendezvous and has no table: its one entry stays empty (one host). */
  for (int i = 0; i < view->size && net->table.peers; i++)
    view->table.peers[i] = net->table.peers[view->net_rank_of[i]];
  for (int i = 0; i < view->size; i++) {
    hoop__peer_entry *entry = &view->table.peers[i];
    entry->local_rank = entry->local_size = 0;
    for (int j = 0; j < view->size; j++) {
      if (strcmp(view->table.peers[j].host, entry->host) != 0)
        continue;
      entry->local_size++;
      if (j < i)
        entry->local_rank++;
    }
  }
  view->local_rank = (int)view->table.peers[view->rank].local_rank;
  view->local_size = (int)view->table.peers[view->rank].local_size;
  return HOOP_OK;
}

/* The view of the members (their ranks in comm, in the new order) in which this rank is index
 * mine. */
static hoop_result make_view(hoop_comm *comm, const int *members, int n, int mine, uint16_t channel,
                             hoop_comm **out) {
  hoop_comm *net = hoop__net(comm);
  hoop_comm *view = hoop__comm_new();
  if (!view)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_comm_split: out of memory");
  view->net = net;
  view->channel = channel;
  view->rank = mine;
  view->size = n;
  view->generation = net->generation;
  hoop__comm_copy_settings(view, comm); /* a view's strings are net's, copied when it was made */
  view->net_rank_of = malloc((size_t)n * sizeof *view->net_rank_of);
  hoop_result result = view->net_rank_of ? hoop__coll_state_size(view) : HOOP_ERR_SYSTEM;
  for (int i = 0; i < n && result == HOOP_OK; i++)
    view->net_rank_of[i] = hoop__net_rank(comm, members[i]);
  if (result == HOOP_OK)
    result = hoop__transport_view(view, net);
  if (result == HOOP_OK)
    result = make_table(view, net);
  if (result != HOOP_OK) {
    hoop_finalize(view); /* not counted yet: transports unset */
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_comm_split: out of memory");
  }
  /* net's transports, shared: never finalized through the view (see hoop_finalize). */
  hoop__transport_view_join(view, net);
  hoop__net_enter(comm);
  net->life->views++;
  hoop__net_leave(comm);
  *out = view;
  return HOOP_OK;
}

/* From here on several channels may share net's connections, and views may run calls from other
 * threads: the transports go under the net lock. Raised while nothing runs on net (its call lock
 * held; with views alive it is raised already), before this rank's part of the agreement on a
 * channel leaves: no peer can send on the new channel before it has that part. */
static void begin_sharing(hoop_comm *net) {
  if (atomic_load(&net->net_shared))
    return;
  hoop__lock_take(&net->call_lock);
  atomic_store(&net->multiplexed, 1);
  atomic_store(&net->net_shared, 1);
  hoop__lock_release(&net->call_lock);
}

/* One member of this rank's color, to sort by key, then by rank in comm. */
typedef struct ordered {
  int32_t key;
  int rank;
} ordered;

static int by_key(const void *a, const void *b) {
  const ordered *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static hoop_result split_locked(hoop_comm *comm, int color, int key, hoop_comm **newcomm);

hoop_result hoop_comm_split(hoop_comm *comm, int color, int key, hoop_comm **newcomm) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (!newcomm)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_comm_split: newcomm is NULL");
  *newcomm = NULL;
  if (color < 0 && color != HOOP_SPLIT_NONE)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_split: color %d is neither >= 0 nor HOOP_SPLIT_NONE", color);
  hoop_comm *net = hoop__net(comm);
  begin_sharing(net);
  /* The channel agreement assumes every rank makes its splits in one order: two at once in one
   * process could pick the same channel for communicators that share a connection. */
  int busy = 0;
  if (!atomic_compare_exchange_strong(&net->life->splitting, &busy, 1))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_split: another split of this job runs in another thread; "
                           "splits are made one at a time, in the same order on every rank");
  hoop_result result = split_locked(comm, color, key, newcomm);
  atomic_store(&net->life->splitting, 0);
  return result;
}

static hoop_result split_locked(hoop_comm *comm, int color, int key, hoop_comm **newcomm) {
  hoop_comm *net = hoop__net(comm);
  member mine = {color, key, (int32_t)net->life->next_channel};
  member *all = malloc((size_t)comm->size * sizeof *all);
  int *members = malloc((size_t)comm->size * sizeof *members);
  ordered *order = malloc((size_t)comm->size * sizeof *order);
  if (!all || !members || !order) {
    free(all);
    free(members);
    free(order);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_comm_split: out of memory");
  }
  hoop_result result = hoop_allgather(comm, &mine, all, 3, HOOP_INT32);
  uint32_t channel = 0;
  for (int r = 0; r < comm->size && result == HOOP_OK; r++)
    if ((uint32_t)all[r].next_channel > channel)
      channel = (uint32_t)all[r].next_channel;
  if (result == HOOP_OK && channel > CHANNEL_MAX)
    result = hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                             "hoop_comm_split: the job has used all %u channels of its "
                             "connections (one per split)",
                             CHANNEL_MAX);
  if (result == HOOP_OK) {
    net->life->next_channel = channel + 1;
    int n = 0, index = -1;
    for (int r = 0; r < comm->size; r++)
      if (all[r].color == color && color != HOOP_SPLIT_NONE)
        order[n++] = (ordered){all[r].key, r};
    qsort(order, (size_t)n, sizeof *order, by_key);
    for (int i = 0; i < n; i++) {
      members[i] = order[i].rank;
      if (members[i] == comm->rank)
        index = i;
    }
    if (color != HOOP_SPLIT_NONE)
      result = make_view(comm, members, n, index, (uint16_t)channel, newcomm);
  }
  free(all);
  free(members);
  free(order);
  return result;
}

/* A tag of hoop_comm_create_group's own messages (tags are checked, not matched). */
#define CREATE_TAG 0x53504c54 /* "SPLT" */

static hoop_result create_locked(hoop_comm *comm, const int *ranks, int n, int mine,
                                 hoop_comm **newcomm) {
  hoop_comm *net = hoop__net(comm);
  /* The channel: the highest next channel among the members, gathered by the first and sent back
   * to each, with point-to-point messages on comm. */
  uint32_t channel = net->life->next_channel, theirs;
  hoop_result result = HOOP_OK;
  if (mine == 0) {
    for (int i = 1; i < n && result == HOOP_OK; i++)
      if ((result = hoop_recv(comm, &theirs, 1, HOOP_UINT32, ranks[i], CREATE_TAG)) == HOOP_OK &&
          theirs > channel)
        channel = theirs;
    for (int i = 1; i < n && result == HOOP_OK; i++)
      result = hoop_send(comm, &channel, 1, HOOP_UINT32, ranks[i], CREATE_TAG);
  } else if ((result = hoop_send(comm, &channel, 1, HOOP_UINT32, ranks[0], CREATE_TAG)) ==
             HOOP_OK) {
    result = hoop_recv(comm, &channel, 1, HOOP_UINT32, ranks[0], CREATE_TAG);
  }
  if (result != HOOP_OK)
    return result;
  if (channel > CHANNEL_MAX)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                           "hoop_comm_create_group: the job has used all %u channels of its "
                           "connections (one per split)",
                           CHANNEL_MAX);
  net->life->next_channel = channel + 1;
  return make_view(comm, ranks, n, mine, (uint16_t)channel, newcomm);
}

hoop_result hoop_comm_create_group(hoop_comm *comm, const int *ranks, int n, hoop_comm **newcomm) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (!newcomm)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_comm_create_group: newcomm is NULL");
  *newcomm = NULL;
  if (!ranks || n < 1 || n > comm->size)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_create_group: %d ranks%s (1 to %d, this rank among them)", n,
                           ranks ? "" : " at NULL", comm->size);
  int mine = -1;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= comm->size)
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                             "hoop_comm_create_group: ranks[%d] is %d, not a rank of the %d", i,
                             ranks[i], comm->size);
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i])
        return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                               "hoop_comm_create_group: rank %d is listed twice", ranks[i]);
    if (ranks[i] == comm->rank)
      mine = i;
  }
  if (mine < 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_create_group: this rank (%d) is not among the ranks listed; "
                           "only they call it",
                           comm->rank);
  hoop_comm *net = hoop__net(comm);
  int busy = 0;
  if (!atomic_compare_exchange_strong(&net->life->splitting, &busy, 1))
    return hoop__set_error(
        comm, HOOP_ERR_INVALID_ARG,
        "hoop_comm_create_group: another split of this job runs in another "
        "thread; splits are made one at a time, in the same order on every rank");
  begin_sharing(net);
  hoop_result result = create_locked(comm, ranks, n, mine, newcomm);
  atomic_store(&net->life->splitting, 0);
  return result;
}

hoop_result hoop__view_shrink(hoop_comm *view, hoop_comm **newcomm) {
  hoop_comm *next = view->net->life->successor;
  if (!next || !next->life->prev_rank)
    return hoop__set_error(view, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_shrink: shrink the communicator hoop_init made first (every "
                           "survivor calls hoop_comm_shrink on it), then its sub-communicators");
  /* The view's members that survive, in its order, by their ranks in the new generation: every
   * survivor knows them without asking anyone. */
  int *members = malloc((size_t)view->size * sizeof *members);
  if (!members)
    return hoop__set_error(view, HOOP_ERR_SYSTEM, "hoop_comm_shrink: out of memory");
  int n = 0, mine = -1;
  for (int i = 0; i < view->size; i++)
    for (int r = 0; r < next->size; r++) {
      if (next->life->prev_rank[r] != view->net_rank_of[i])
        continue;
      if (i == view->rank)
        mine = n;
      members[n++] = r;
      break;
    }
  hoop_result result = HOOP_OK;
  if (mine < 0)
    result = hoop__set_error(view, HOOP_ERR_INVALID_ARG,
                             "hoop_comm_shrink: this rank is not in the generation its job's "
                             "communicator shrank to");
  if (result == HOOP_OK)
    begin_sharing(next);
  /* The same channel: unique on the old connections among the views that follow, and the new
   * generation's splits start above every channel of the old one. */
  if (result == HOOP_OK &&
      (result = make_view(next, members, n, mine, view->channel, newcomm)) == HOOP_OK) {
    hoop__comm_copy_settings(*newcomm, view);
  }
  if (result != HOOP_OK && result != HOOP_ERR_INVALID_ARG)
    hoop__set_error(view, result, "%s", next->last_error);
  free(members);
  return result;
}
