/* shrink.c - hoop_comm_shrink: the survivors of a failure agree through the rendezvous server on
 * who is left (rdzv/shrink.c decides) and go on as a new communicator.
 *
 * The rendezvous connection carries the job's generations: it passes from comm to each attempt,
 * and the attempt that gets a table owns it from then on (with the server thread, when this rank
 * hosts it). If the new communicator fails while it connects (another rank lost meanwhile), that
 * attempt asks for the next generation in turn, naming whom it lost, until one connects or the
 * timeout passes. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "comm/state.h"
#include "comm/watch.h"
#include "core/env.h"
#include "core/trace.h"
#include "rdzv/client.h"
#include "transport/transport.h"

void hoop__comm_copy_settings(hoop_comm *to, const hoop_comm *from) {
  memcpy(to->job, from->job, sizeof to->job);
  memcpy(to->rendezvous, from->rendezvous, sizeof to->rendezvous);
  memcpy(to->ifname, from->ifname, sizeof to->ifname);
  memcpy(to->transport_mode, from->transport_mode, sizeof to->transport_mode);
  memcpy(to->encrypt, from->encrypt, sizeof to->encrypt);
  to->timeout_s = from->timeout_s;
  to->tcp_streams = from->tcp_streams;
  to->check_calls = from->check_calls;
  to->reproducible = from->reproducible;
  to->compress = from->compress;
  to->stall_warn_s = from->stall_warn_s;
}

/* What a new generation keeps of its communicator's configuration: the settings, the token (it
 * connects anew, authenticating as the job's members do) and the key pair (the server keeps the
 * public key of the member's HELLO). */
static void copy_settings(hoop_comm *to, const hoop_comm *from) {
  hoop__comm_copy_settings(to, from);
  memcpy(to->token, from->token, sizeof to->token);
  memcpy(to->key_public, from->key_public, sizeof to->key_public);
  memcpy(to->key_secret, from->key_secret, sizeof to->key_secret);
}

/* The rendezvous connection (and the server hosted here, if any) pass from one to the other. */
static void take_connection(hoop_comm *to, hoop_comm *from) {
  hoop__rendezvous_hand_over(to, from);
  to->life->server = from->life->server;
  from->life->server = NULL;
}

/* Record result on comm as a failure of its own (hoop_init's rule: a communicator that could not
 * be made refuses every call). */
static hoop_result attempt_failed(hoop_comm *comm, hoop_result result) {
  if (!comm->failed) {
    comm->failed = result;
    memcpy(comm->fail_reason, comm->last_error, sizeof comm->fail_reason);
  }
  return result;
}

/* Make the communicator of the next generation once its table is in: ranks, transports, the
 * connections of the ring, and a barrier that says every member got this far. */
static hoop_result connect_generation(hoop_comm *next) {
  next->size = (int)next->table.size;
  next->rank = (int)next->table.rank;
  next->local_rank = (int)next->table.peers[next->rank].local_rank;
  next->local_size = (int)next->table.peers[next->rank].local_size;
  if (hoop__coll_state_size(next) != HOOP_OK)
    return hoop__set_error(next, HOOP_ERR_SYSTEM, "hoop_comm_shrink: out of memory");
  hoop__comm_derive_nonce(next);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "hoop rank %d", next->rank);
  hoop__log_set_prefix(prefix);
  if (strcmp(hoop__env_get("HOOP_FAULT"), "shrink-connect") == 0) {
    HOOP__WARN(HOOP_SUBSYS_INIT, "HOOP_FAULT=shrink-connect: dying in the middle of the shrink");
    raise(SIGKILL);
  }
  if (next->size == 1)
    return HOOP_OK;
  hoop_result result = hoop__transport_agree(next);
  if (result == HOOP_OK)
    result = hoop__comm_connect_ring(next);
  if (result == HOOP_OK)
    result = hoop_barrier(next);
  return result;
}

/* One attempt from cur (which holds the rendezvous connection): HOOP_OK with *next ready; or an
 * error recorded on cur (no table came: *next NULL) or on *next (the table came and *next, now
 * holding the connection, failed to connect). */
static hoop_result attempt(const hoop_comm *base, hoop_comm *cur, double deadline,
                           hoop_comm **next) {
  *next = NULL;
  hoop_comm *n = hoop__comm_new();
  if (!n)
    return hoop__set_error(cur, HOOP_ERR_SYSTEM, "hoop_comm_shrink: out of memory");
  copy_settings(n, base);
  n->generation = cur->generation + 1;
  /* The transports size their queues by the job at listen: the old size and the newcomers known
   * to wait bound the new one. */
  n->size = cur->size + hoop__rendezvous_newcomers(cur);
  if (n->size > HOOP__WIRE_MAX_RANKS)
    n->size = HOOP__WIRE_MAX_RANKS;
  n->rank = cur->rank;
  struct sockaddr_storage server;
  socklen_t server_len;
  char host[HOOP__WIRE_MAX_HOST + 1];
  int port;
  hoop__shrink_msg msg;
  memset(&msg, 0, sizeof msg);
  hoop_result result = hoop__comm_resolve_server(n, &server, &server_len, host, sizeof host, &port);
  if (result == HOOP_OK)
    result = hoop__transport_listen(n, n->transport_mode, (struct sockaddr *)&server, msg.addr,
                                    sizeof msg.addr);
  if (result != HOOP_OK) {
    hoop__set_error(cur, result, "%s", n->last_error);
    hoop_finalize(n);
    return result;
  }
  double left = deadline - hoop__now();
  msg.generation = cur->generation;
  msg.rank = (uint32_t)cur->rank;
  msg.timeout_ms = left > 1e-3 ? (uint32_t)(left * 1000) : 1;
  if (cur->fail_origin >= 0 && cur->fail_origin != cur->rank && cur->fail_origin < cur->size)
    msg.accused[msg.naccused++] = (uint32_t)cur->fail_origin;
  HOOP__INFO(HOOP_SUBSYS_INIT, "asking to go on without the failed ranks (generation %u -> %u%s)",
             cur->generation, n->generation, msg.naccused ? ", naming the rank lost" : "");
  /* The server answers within the timeout it was given; the margin lets its answer come first. */
  result = hoop__rendezvous_shrink(cur, &msg, deadline + 2.0, &n->table);
  if (result != HOOP_OK) {
    hoop_finalize(n);
    return result;
  }
  take_connection(n, cur);
  *next = n;
  result = connect_generation(n);
  if (result != HOOP_OK)
    return attempt_failed(n, result);
  HOOP__INFO(HOOP_SUBSYS_INIT, "generation %u: rank %d of %d", n->generation, n->rank, n->size);
  return HOOP_OK;
}

/* A job of one rank has nobody to lose: its next generation is itself again. */
static hoop_result shrink_alone(hoop_comm *comm, hoop_comm **newcomm) {
  hoop_comm *n = hoop__comm_new();
  if (n) {
    copy_settings(n, comm);
    n->generation = comm->generation + 1;
  }
  if (!n || hoop__coll_state_size(n) != HOOP_OK) {
    hoop_finalize(n);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_comm_shrink: out of memory");
  }
  *newcomm = n;
  return HOOP_OK;
}

static hoop_result shrink_locked(hoop_comm *comm, hoop_comm **newcomm, const char *call, int grow) {
  if (comm->size == 1 && comm->rdzv_fd < 0)
    return shrink_alone(comm, newcomm);
  const char *lost;
  hoop_result lost_code = hoop__rendezvous_lost(comm, &lost);
  if (comm->rdzv_fd < 0 && lost_code)
    return hoop__set_error(comm, lost_code,
                           "%s: this rank has no rendezvous connection left, and the ranks agree "
                           "through it: %s",
                           call, lost);
  if (comm->rdzv_fd < 0)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                           "%s: this rank has no rendezvous connection left (%s), and the ranks "
                           "agree through it",
                           call,
                           lost[0] ? lost
                                   : "the server closed it, it was lost with the rank "
                                     "hosting it, or a shrink already took it");
  if (!comm->failed)
    hoop__retire(comm, HOOP_ERR_ABORTED, "%s: rank %d retired this communicator to %s", call,
                 comm->rank, grow ? "take in newcomers" : "go on without failed ranks");
  double deadline = hoop__now() + comm->timeout_s;
  hoop_comm *cur = comm;
  hoop_result result;
  for (;;) {
    hoop_comm *next = NULL;
    result = attempt(comm, cur, deadline, &next);
    if (result == HOOP_OK) {
      if (cur != comm)
        hoop_finalize(cur);
      *newcomm = next;
      break;
    }
    hoop_comm *failed = next ? next : cur;
    if (failed != comm)
      hoop__set_error(comm, result, "%s", failed->last_error);
    if (!next || hoop__now() >= deadline) {
      if (next) {
        HOOP__WARN(HOOP_SUBSYS_INIT, "%s: giving up: %s", call, next->last_error);
        hoop_finalize(next);
      }
      if (cur != comm)
        hoop_finalize(cur);
      break;
    }
    /* Lost someone while connecting the new generation: go on from it to the next. */
    HOOP__WARN(HOOP_SUBSYS_INIT, "generation %u failed while connecting (%s); asking again",
               next->generation, next->last_error);
    if (cur != comm)
      hoop_finalize(cur);
    cur = next;
  }
  if (result == HOOP_OK) {
    hoop__launcher_watch_stop(comm);
    hoop__comm_log_config(*newcomm);
    char serving[64];
    if (hoop__trace_open(*newcomm, hoop__transports_serving(*newcomm, serving, sizeof serving)) !=
        HOOP_OK)
      HOOP__WARN(HOOP_SUBSYS_INIT, "hoop_comm_shrink: %s", (*newcomm)->last_error);
    hoop__launcher_watch_start(*newcomm);
  }
  return result;
}

static hoop_result next_generation(hoop_comm *comm, hoop_comm **newcomm, const char *call,
                                   int grow) {
  if (!newcomm)
    return comm ? hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: newcomm is NULL", call)
                : HOOP_ERR_INVALID_ARG;
  *newcomm = NULL;
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (comm->net != comm && grow)
    return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                           "%s: a sub-communicator (hoop_comm_split's) cannot grow; grow the "
                           "communicator hoop_init made, then split the new one",
                           call);
  if (comm->net != comm)
    return hoop__view_shrink(comm, newcomm);
  hoop__lock_take(&comm->call_lock);
  hoop_result result = shrink_locked(comm, newcomm, call, grow);
  hoop__lock_release(&comm->call_lock);
  /* Sub-communicators of comm follow it on their own (hoop__view_shrink): they need to know the
   * new generation and who each of its ranks was. Only survivors make this call, all of them. */
  if (result == HOOP_OK && !grow) {
    hoop_comm *next = *newcomm;
    int32_t mine = comm->rank;
    next->life->prev_rank = malloc((size_t)next->size * sizeof *next->life->prev_rank);
    result = next->life->prev_rank
                 ? hoop_allgather(next, &mine, next->life->prev_rank, 1, HOOP_INT32)
                 : hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", call);
    if (result != HOOP_OK) {
      hoop__set_error(comm, result, "%s", next->last_error);
      hoop_finalize(next);
      *newcomm = NULL;
      return result;
    }
    /* Channels the views carry over stay theirs on the new connections. */
    next->life->next_channel = comm->life->next_channel;
    comm->life->successor = next;
    next->life->predecessor = comm;
  }
  return result;
}

hoop_result hoop_comm_shrink(hoop_comm *comm, hoop_comm **newcomm) {
  return next_generation(comm, newcomm, "hoop_comm_shrink", 0);
}

hoop_result hoop_comm_grow(hoop_comm *comm, hoop_comm **newcomm) {
  return next_generation(comm, newcomm, "hoop_comm_grow", 1);
}

int hoop_comm_newcomers(hoop_comm *comm) {
  if (!comm)
    return 0;
  /* Read what the server sent, unless a call is running (it reads it itself). */
  if (hoop__lock_try(&comm->call_lock)) {
    hoop__net_enter(comm);
    if (!comm->failed)
      hoop__rendezvous_check(comm);
    hoop__net_leave(comm);
    hoop__lock_release(&comm->call_lock);
  }
  return hoop__rendezvous_newcomers(comm);
}
