/* wait.c - what the collectives call to move bytes: posting a send or a receive to the transport
 * of its peer, and the wait loop every transport shares (spinning, then sleeping in one poll over
 * every serving transport, HOOP_TIMEOUT and HOOP_STALL_WARN). */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/trace.h"
#include "rdzv/client.h"
#include "transport/state.h"
#include "transport/stray.h"
#include "transport/transport.h"

/* ---- posting and waiting --------------------------------------------------------------------- */

/* A request of comm's, to or from its rank peer: the transports see net's rank. */
static void stamp(hoop_comm *comm, hoop__transfer *req, int peer, int is_send, size_t len) {
  req->peer = hoop__net_rank(comm, peer);
  req->is_send = is_send;
  req->channel = comm->channel;
  req->pending = 0;
  req->len = len;
  if (comm->check_calls)
    memcpy(req->fingerprint, comm->fingerprint, sizeof req->fingerprint);
  else
    memset(req->fingerprint, 0, sizeof req->fingerprint);
}

/* What went wrong below a view happened to its net (the transports record there): the view's call
 * reports it, and a failure is the view's too. */
static hoop_result adopt(hoop_comm *comm, hoop_result result) {
  hoop_comm *net = hoop__net(comm);
  if (result != HOOP_OK && net != comm && !comm->failed) {
    memcpy(comm->last_error, net->last_error, sizeof comm->last_error);
    hoop__net_failed(comm);
  }
  return result;
}

const hoop_comm *hoop__drive_begin(hoop_comm *comm) {
  hoop__net_enter(comm);
  const hoop_comm *outer = hoop__net(comm)->net_caller; /* a drive inside a drive: CUDA waits */
  hoop__net(comm)->net_caller = comm;
  return outer;
}

/* What went wrong is adopted before the lock goes: another thread may record over it. */
hoop_result hoop__drive_end(hoop_comm *comm, const hoop_comm *outer, hoop_result result) {
  result = adopt(comm, result);
  hoop__net(comm)->net_caller = outer;
  hoop__net_leave(comm);
  return result;
}

/* A stamped request to its transport, as comm's rank peer; a receive first looks for a stray of
 * its channel that came before it. */
/* Add v to a counter that only the holder of the net lock writes and any thread may read. */
static inline void tally(_Atomic uint64_t *counter, uint64_t v) {
  atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + v,
                        memory_order_relaxed);
}

static hoop_result post(hoop_comm *comm, int peer, int is_send, void *buf, size_t len,
                        hoop__transfer *req) {
  hoop_comm *net = hoop__net(comm);
  hoop_result result;
  const hoop_comm *outer = hoop__drive_begin(comm);
  if (net->transport->peer_sent)
    tally(is_send ? &net->transport->peer_sent[req->peer]
                  : &net->transport->peer_received[req->peer],
          len);
  if (is_send || !net->transport->strays || !hoop__stray_take(comm, req->peer, buf, req, &result)) {
    hoop__tctx *ctx = hoop__transport_of(comm, peer);
    result = is_send ? ctx->ops->isend(ctx, req->peer, buf, len, req)
                     : ctx->ops->irecv(ctx, req->peer, buf, len, req);
  }
  return hoop__drive_end(comm, outer, result);
}

hoop_result hoop__isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                        hoop__transfer *req) {
  stamp(comm, req, peer, 1, len);
  if (len == 0)
    return HOOP_OK;
  return post(comm, peer, 1, (void *)(uintptr_t)buf, len, req);
}

hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__transfer *req) {
  stamp(comm, req, peer, 0, len);
  if (len == 0)
    return HOOP_OK;
  return post(comm, peer, 0, buf, len, req);
}

/* An address for empty buffers: nothing is read or written there. */
static char no_bytes;

/* A stamped request posted as a message even when empty. */
static hoop_result post_framed(hoop_comm *comm, int is_send, int peer, void *buf, size_t len,
                               hoop__transfer *req) {
  return post(comm, peer, is_send, len ? buf : &no_bytes, len, req);
}

hoop_result hoop__ipost_marked(hoop_comm *comm, int is_send, int peer, void *buf, size_t len,
                               const uint8_t *fingerprint, hoop__transfer *req) {
  stamp(comm, req, peer, is_send, len);
  memcpy(req->fingerprint, fingerprint, sizeof req->fingerprint);
  return post_framed(comm, is_send, peer, buf, len, req);
}

hoop_result hoop__isend_framed(hoop_comm *comm, int peer, const void *buf, size_t len,
                               hoop__transfer *req) {
  stamp(comm, req, peer, 1, len);
  return post_framed(comm, 1, peer, (void *)(uintptr_t)buf, len, req);
}

hoop_result hoop__irecv_framed(hoop_comm *comm, int peer, void *buf, size_t len,
                               hoop__transfer *req) {
  stamp(comm, req, peer, 0, len);
  return post_framed(comm, 0, peer, buf, len, req);
}

hoop_result hoop__watch(hoop_comm *comm, int peer, const _Atomic uint64_t *word, uint64_t value,
                        hoop__transfer *req) {
  stamp(comm, req, peer, 0, 0);
  const hoop_comm *outer = hoop__drive_begin(comm);
  hoop__tctx *ctx = hoop__transport_of(comm, peer);
  hoop_result result = ctx->ops->board_watch(ctx, req->peer, word, value, req);
  return hoop__drive_end(comm, outer, result);
}

hoop_result hoop__sendrecv(hoop_comm *comm, int to, const void *sendbuf, size_t sendlen, int from,
                           void *recvbuf, size_t recvlen) {
  hoop__transfer send_req, recv_req;
  hoop_result result = hoop__irecv(comm, from, recvbuf, recvlen, &recv_req);
  if (result == HOOP_OK)
    result = hoop__isend(comm, to, sendbuf, sendlen, &send_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &recv_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &send_req);
  return result;
}

/* Posted straight to the transport, past the shorthands' shortcut for zero lengths. */
hoop_result hoop__sendrecv_empty(hoop_comm *comm, int to, int from) {
  hoop__transfer send_req, recv_req;
  hoop_result result = hoop__irecv_framed(comm, from, NULL, 0, &recv_req);
  if (result == HOOP_OK)
    result = hoop__isend_framed(comm, to, NULL, 0, &send_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &recv_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &send_req);
  return result;
}

static void warn_stall(hoop_comm *comm, double now) {
  char waiting[512] = "";
  size_t used = 0;
  comm->stall_warned++;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank)
      continue;
    hoop__tctx *ctx = hoop__transport_of(comm, p);
    int pending = ctx->ops->pending(ctx, hoop__net_rank(comm, p));
    int recv = pending & HOOP__PENDING_RECV, send = pending & HOOP__PENDING_SEND;
    if ((recv || send) && used < sizeof waiting)
      used +=
          (size_t)snprintf(waiting + used, sizeof waiting - used, "%s%d (%s)", used ? ", " : "", p,
                           recv && send ? "send and receive"
                           : recv       ? "receive"
                                        : "send");
  }
  HOOP__WARN(HOOP_SUBSYS_COLL,
             "%s (call #%llu) has waited %.1f s (HOOP_STALL_WARN=%g): still waiting for rank %s",
             comm->call ? comm->call : "hoop", (unsigned long long)comm->seq,
             now - comm->call_started, comm->stall_warn_s, used ? waiting : "(none)");
}

/* Several transports sleep in one poll: each readies itself and hands its descriptors over
 * (sleep_prepare), the watched descriptor is added once, and after the poll each acts on its
 * part (sleep_done). A transport whose last look found work cancels the sleep. */
static hoop_result sleep_shared(hoop_comm *comm, int timeout_ms, int *moved) {
  struct pollfd *parts[HOOP__MAX_TRANSPORTS] = {NULL};
  nfds_t counts[HOOP__MAX_TRANSPORTS] = {0};
  int prepared = 0, found = 0, watched = 0;
  hoop_result result = HOOP_OK;
  for (; prepared < comm->transport->ntransports; prepared++) {
    hoop__tctx *ctx = &comm->transport->transports[prepared];
    if (ctx->state && (result = ctx->ops->sleep_prepare(ctx, &parts[prepared], &counts[prepared],
                                                        &found)) != HOOP_OK)
      break;
  }
  size_t total = 1;
  for (int t = 0; t < prepared; t++)
    total += counts[t];
  if (result == HOOP_OK && total > comm->transport->sleep_cap) {
    struct pollfd *fds = realloc(comm->transport->sleep_fds, total * sizeof *fds);
    if (fds) {
      comm->transport->sleep_fds = fds;
      comm->transport->sleep_cap = total;
    } else {
      result = hoop__fail(comm, HOOP_ERR_SYSTEM, "out of memory for the poll set");
    }
  }
  if (result == HOOP_OK && !found) {
    nfds_t n = 0;
    for (int t = 0; t < prepared; t++)
      for (nfds_t i = 0; i < counts[t]; i++)
        comm->transport->sleep_fds[n++] = parts[t][i];
    watched = comm->rdzv_fd >= 0;
    if (watched)
      comm->transport->sleep_fds[n++] = (struct pollfd){.fd = comm->rdzv_fd, .events = POLLIN};
    int ready = poll(comm->transport->sleep_fds, n, timeout_ms);
    if (ready < 0 && errno != EINTR)
      result = hoop__fail(comm, HOOP_ERR_SYSTEM, "poll: %s", strerror(errno));
    n = 0;
    for (int t = 0; t < prepared; t++) {
      for (nfds_t i = 0; i < counts[t]; i++)
        parts[t][i].revents = ready > 0 ? comm->transport->sleep_fds[n + i].revents : 0;
      n += counts[t];
    }
    watched = ready > 0 && watched && comm->transport->sleep_fds[n].revents;
  } else {
    for (int t = 0; t < prepared; t++)
      for (nfds_t i = 0; i < counts[t]; i++)
        parts[t][i].revents = 0;
  }
  *moved |= found;
  /* Every transport that prepared undoes it, whatever happened. */
  for (int t = 0; t < prepared; t++) {
    hoop__tctx *ctx = &comm->transport->transports[t];
    if (!ctx->state)
      continue;
    hoop_result done = ctx->ops->sleep_done(ctx, moved);
    if (result == HOOP_OK)
      result = done;
  }
  /* News from the server last, after one more round has taken what the ranks sent before it
   * (a rank that aborted right after sending this one its last message). */
  for (int t = 0; t < comm->transport->ntransports && result == HOOP_OK && watched; t++) {
    hoop__tctx *ctx = &comm->transport->transports[t];
    if (ctx->state)
      result = ctx->ops->progress(ctx, 0, moved);
  }
  if (result == HOOP_OK && watched)
    result = hoop__rendezvous_check(comm);
  return result;
}

/* One round over the transports that serve peers. With one, it may sleep up to timeout_ms in its
 * own poll; with several, each gets one round without sleeping, and when none moved anything they
 * sleep together (sleep_shared), or, if one cannot share a sleep, nap a millisecond. */
static hoop_result progress_all(hoop_comm *comm, int timeout_ms, int *moved) {
  int several = comm->transport->ntransports_serving > 1;
  for (int t = 0; t < comm->transport->ntransports; t++) {
    hoop__tctx *ctx = &comm->transport->transports[t];
    if (!ctx->state)
      continue;
    hoop_result result = ctx->ops->progress(ctx, several ? 0 : timeout_ms, moved);
    if (result != HOOP_OK)
      return result;
  }
  if (!several || timeout_ms <= 0 || *moved)
    return HOOP_OK;
  if (comm->transport->sleep_shared)
    return sleep_shared(comm, timeout_ms, moved);
  poll(NULL, 0, 1);
  return HOOP_OK;
}

/* Up to rounds rounds of progress without sleeping, until req ends (req is read only past the
 * first round), holding the net throughout. */
static hoop_result progress_rounds(hoop_comm *comm, hoop__transfer *req, int rounds) {
  hoop_comm *net = hoop__net(comm);
  if (hoop__net_failed(comm))
    return comm->failed;
  const hoop_comm *outer = hoop__drive_begin(comm);
  hoop_result result = HOOP_OK;
  for (int r = 0; r < rounds && result == HOOP_OK; r++) {
    if (r > 0) {
      if (hoop__transfer_pending(req) == 0 ||
          atomic_load_explicit(&net->net_shared, memory_order_relaxed))
        break; /* ended, or another thread asks for the net: the wait's loop shares it */
      hoop__cpu_pause();
    }
    result = hoop__check_abort(net);
    if (result == HOOP_OK && net->failed)
      result = net->failed;
    int moved = 0;
    if (result == HOOP_OK)
      result = progress_all(net, 0, &moved);
    if (result == HOOP_OK && net->transport->strays_waited)
      result = hoop__strays_settle(net);
  }
  return hoop__drive_end(comm, outer, result);
}

hoop_result hoop__progress_once(hoop_comm *comm) {
  return progress_rounds(comm, NULL, 1);
}

/* Spinning rounds per clock reading in hoop__wait_some. */
#define CLOCK_EVERY 16

/* The grace after HOOP_TIMEOUT, as a fraction of it (of at most 1 s): see hoop__wait. */
#define TIMEOUT_GRACE 0.05

/* Between empty rounds of a spinning wait. Ranks that outnumber the CPUs give theirs to the peers
 * they wait for; a rank with a CPU of its own keeps it: sched_yield costs a system call, and a
 * switch to whatever else runs on the host (on a 2-core VM shared with a compiler, yielding made
 * an 8-byte allreduce over shared memory several times slower), while a pause instruction only
 * eases the spin on the core's sibling and the memory bus. One, not more: what arrives during the
 * pauses waits for them to end, and a pause takes 28 ns on the development VM's EPYC (up to 40 on
 * recent Intel cores), so the 16 of before added 0.2 us on average to every small message. */
static void spin_pause(int yielding) {
  if (yielding) {
    sched_yield();
    return;
  }
  hoop__cpu_pause();
}

/* On a host whose ranks outnumber its CPUs (spin_yields): whether a spinning wait gives the CPU
 * up between rounds now, as it must while the ranks awake outnumber the CPUs (the one it waits
 * for may be waiting for this CPU). Two ranks of four that exchange messages while the other two
 * sleep in a wait have a CPU each: a yield would cost each round a system call (4 ranks on 2
 * CPUs, sendrecv 8 B: 0.47 us one way yielding, 0.19 not). */
static int yield_now(hoop_comm *net) {
  int asleep = 0;
  for (int t = 0; t < net->transport->ntransports; t++) {
    hoop__tctx *ctx = &net->transport->transports[t];
    if (ctx->state && ctx->ops->asleep_peers)
      asleep += ctx->ops->asleep_peers(ctx);
  }
  return hoop__host_crowded_now(net, asleep);
}

/* Asked at the first wait: a transport may decide its spin only once the rank table is known. */
static double spin_s(hoop_comm *comm) {
  if (comm->transport->spin_s < 0) {
    comm->transport->spin_s = 0;
    comm->transport->spin_yields = hoop__host_oversubscribed(comm);
    for (int t = 0; t < comm->transport->ntransports; t++) {
      hoop__tctx *ctx = &comm->transport->transports[t];
      double spin = ctx->state ? ctx->ops->spin_s(ctx) : 0;
      if (spin > comm->transport->spin_s)
        comm->transport->spin_s = spin;
    }
  }
  return comm->transport->spin_s;
}

hoop_result hoop__wait(hoop_comm *comm, hoop__transfer *req) {
  hoop__wait_state state = {0};
  return hoop__wait_some(comm, req, 0, &state);
}

hoop_result hoop__wait_some(hoop_comm *comm, hoop__transfer *req, double slice_s,
                            hoop__wait_state *state) {
  if (hoop__transfer_pending(req) == 0)
    return HOOP_OK;
  /* A message that is there already, or comes within the rounds a spin takes between two clock
   * readings (one round where the host's ranks outnumber its CPUs), costs no clock reading: a
   * small message between two ranks with a CPU each comes within them (8 bytes one way, 0.14 us),
   * and two readings (the start and the end) were a tenth of its time. */
  if (!state->started) {
    int rounds = spin_s(comm) > 0 && !comm->transport->spin_yields ? CLOCK_EVERY : 1;
    hoop_result result = progress_rounds(comm, req, rounds);
    if (hoop__transfer_pending(req) == 0)
      return HOOP_OK;
    if (result != HOOP_OK)
      return result;
  }
  hoop_comm *net = hoop__net(comm);
  double now = hoop__now(), began = now;
  comm->call_waited = 1;
  if (comm->call_clock_start == 0)
    comm->call_clock_start = began;
  if (!state->started) {
    state->started = 1;
    state->clocked = 1;
    state->deadline = now + comm->timeout_s;
    state->spin_until = now + spin_s(comm);
    state->in_grace = 0;
  }
  double deadline = state->deadline, spin_until = state->spin_until;
  double until = slice_s > 0 ? now + slice_s : 0;
  int in_grace = state->in_grace;
  int spinning = now < spin_until;
  int yielding = 0; /* asked under the net lock, below: the transports' state is its */
  unsigned rounds = 0;
  hoop_result result = HOOP_OK;
  /* Round by round under the net lock (views of one net may wait in several threads at once):
   * the request may be completed by any of them, reading hoop__transfer_pending(req) under the
   * lock. */
  const hoop_comm *outer = hoop__drive_begin(comm);
  yielding = spinning && comm->transport->spin_yields && yield_now(net);
  /* Whom this wait waits for, for a peer's notice that blames this rank (core/error.c): the net's,
   * so written only while this thread holds the net, and given back before it lets go. */
  int waited_before = net->waiting_for;
  net->waiting_for = req->peer;
  while (hoop__transfer_pending(req) > 0) {
    if (until > 0 && now >= until)
      break;
    if (hoop__check_abort(net) != HOOP_OK || net->failed || comm->failed) {
      result = net->failed ? net->failed : comm->failed;
      break;
    }
    int moved = 0;
    /* While spinning, the clock is read every CLOCK_EVERY rounds: a reading costs about 25 ns,
     * as much as a round that finds nothing, and the timeout and the spin's end need no finer
     * a grain than a microsecond. Rounds that yield the CPU (to peers, or to other threads on
     * the net) may each take long: those read it every time. */
    int every = spinning && ++rounds % CLOCK_EVERY == 0;
    if (every && comm->transport->spin_yields)
      yielding = yield_now(net);
    if (!spinning || every || yielding ||
        atomic_load_explicit(&net->net_shared, memory_order_relaxed))
      now = hoop__now();
    /* At every HOOP_STALL_WARN seconds of the wait, not only the first: a rank that waits long
     * for a late peer (up to a timeout set long) keeps saying whom it waits for. */
    if (now - comm->call_started > comm->stall_warn_s * (comm->stall_warned + 1))
      warn_stall(comm, now);
    /* A peer on the board in this call's place while this rank waits for a message (board.c). */
    if (comm->transport->board && (!spinning || every) &&
        (result = hoop__board_peek(comm, comm->transport->board)) != HOOP_OK)
      break;
    double left = deadline - now;
    if (until > 0 && until - now < left)
      left = until - now;
    spinning = now < spin_until;
    /* Another thread waits for the lock: no sleep holding it. */
    int others = atomic_load_explicit(&net->net_waiters, memory_order_relaxed) > 0;
    result = progress_all(net,
                          spinning || others || left <= 0 ? 0
                          : left > 0.1                    ? 100
                                                          : (int)(left * 1000) + 1,
                          &moved);
    if (result == HOOP_OK && net->transport->strays_waited)
      result = hoop__strays_settle(net);
    /* Reading ahead may find a peer's notice after this request's last byte: the request itself
     * still completed; the failure stays recorded for what follows. */
    if (result != HOOP_OK) {
      result = hoop__transfer_pending(req) == 0 ? HOOP_OK : result;
      break;
    }
    /* A spinning round took no time to speak of: its clock reading still serves. */
    if (!spinning)
      now = hoop__now();
    if (moved) {
      deadline = now + comm->timeout_s;
      in_grace = 0;
    } else if (now > deadline) {
      hoop__tctx *ctx = &net->transport->transports[net->transport->peer_transport[req->peer]];
      result = ctx->ops->timed_out(ctx, req, in_grace);
      if (result != HOOP_OK)
        break;
      /* The transport knows the peer runs: it waits for someone else itself, and its notice
       * will say for whom (see timed_out in transport.h). */
      in_grace = 1;
      deadline = hoop__now() + (comm->timeout_s < 1.0 ? comm->timeout_s : 1.0) * TIMEOUT_GRACE;
    }
    if (atomic_load_explicit(&net->net_shared, memory_order_relaxed)) {
      net->waiting_for = waited_before;
      hoop__drive_end(comm, outer, HOOP_OK);
      hoop__net_yield(comm);
      if (spinning && !moved)
        spin_pause(yielding);
      outer = hoop__drive_begin(comm);
      waited_before = net->waiting_for;
      net->waiting_for = req->peer;
    } else if (spinning && !moved) {
      spin_pause(yielding);
    }
  }
  /* The time waited, to the last clock reading (which a spin takes every few rounds): for this
   * call's account (coll/dispatch.c) and the peer's (hoop_comm_stats). */
  uint64_t waited_ns = now > began ? (uint64_t)((now - began) * 1e9) : 0;
  comm->call_wait_ns += waited_ns;
  comm->call_clock_last = now;
  if (net->transport->peer_wait_ns)
    tally(&net->transport->peer_wait_ns[req->peer], waited_ns);
  if (hoop__tracing(comm) && now - began >= HOOP__TRACE_WAIT_MIN_S)
    hoop__trace_wait(comm, hoop__comm_rank_of_net(comm, req->peer), req->len, began, now);
  net->waiting_for = waited_before;
  result = hoop__drive_end(comm, outer, result);
  state->deadline = deadline;
  state->in_grace = in_grace;
  return result;
}

hoop_result hoop__poll_some(hoop_comm *comm, hoop__transfer *req, hoop__wait_state *state) {
  if (hoop__transfer_pending(req) == 0)
    return HOOP_OK;
  hoop_comm *net = hoop__net(comm);
  double now = hoop__now();
  state->clocked = 1;
  if (!state->started) {
    state->started = 1;
    state->deadline = now + comm->timeout_s;
    state->spin_until = now;
    state->in_grace = 0;
  }
  const hoop_comm *outer = hoop__drive_begin(comm);
  int moved = 0;
  hoop_result result = hoop__check_abort(net);
  if (result == HOOP_OK && net->failed)
    result = net->failed;
  if (result == HOOP_OK)
    result = progress_all(net, 0, &moved);
  if (result == HOOP_OK && net->transport->strays_waited)
    result = hoop__strays_settle(net);
  if (result != HOOP_OK) {
    result = hoop__transfer_pending(req) == 0 ? HOOP_OK : result;
  } else if (moved) {
    state->deadline = now + comm->timeout_s;
    state->in_grace = 0;
  } else if (hoop__transfer_pending(req) > 0 && now > state->deadline) {
    hoop__tctx *ctx = &net->transport->transports[net->transport->peer_transport[req->peer]];
    result = ctx->ops->timed_out(ctx, req, state->in_grace);
    if (result == HOOP_OK) { /* the peer runs: a grace, as in hoop__wait_some */
      state->in_grace = 1;
      state->deadline = now + (comm->timeout_s < 1.0 ? comm->timeout_s : 1.0) * TIMEOUT_GRACE;
    }
  }
  return hoop__drive_end(comm, outer, result);
}
