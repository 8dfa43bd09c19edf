/* transport.c - the transport layer between the collectives and the transports: choosing a
 * transport for each peer, posting to it, the wait loop every transport shares, and what the
 * transports share (the wake eventfd, the frame header, the lost-peer error). */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "core/log.h"
#include "rdzv/client.h"
#include "transport/transport.h"
#include "util/be.h"
#include "util/netaddr.h"

/* ---- posting and waiting --------------------------------------------------------------------- */

static void stamp(hoop_comm *comm, hoop__request *req, int peer, int is_send, size_t len) {
  req->peer = peer;
  req->is_send = is_send;
  req->pending = 0;
  req->len = len;
  if (comm->check_calls)
    memcpy(req->fingerprint, comm->fingerprint, sizeof req->fingerprint);
  else
    memset(req->fingerprint, 0, sizeof req->fingerprint);
}

hoop_result hoop__isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                        hoop__request *req) {
  stamp(comm, req, peer, 1, len);
  if (len == 0)
    return HOOP_OK;
  hoop__tctx *ctx = hoop__transport_of(comm, peer);
  return ctx->ops->isend(ctx, peer, buf, len, req);
}

hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req) {
  stamp(comm, req, peer, 0, len);
  if (len == 0)
    return HOOP_OK;
  hoop__tctx *ctx = hoop__transport_of(comm, peer);
  return ctx->ops->irecv(ctx, peer, buf, len, req);
}

hoop_result hoop__sendrecv(hoop_comm *comm, int to, const void *sendbuf, size_t sendlen, int from,
                           void *recvbuf, size_t recvlen) {
  hoop__request send_req, recv_req;
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
  char none = 0; /* an address for the empty buffers; nothing is read or written there */
  hoop__request send_req, recv_req;
  stamp(comm, &recv_req, from, 0, 0);
  stamp(comm, &send_req, to, 1, 0);
  hoop__tctx *from_ctx = hoop__transport_of(comm, from), *to_ctx = hoop__transport_of(comm, to);
  hoop_result result = from_ctx->ops->irecv(from_ctx, from, &none, 0, &recv_req);
  if (result == HOOP_OK)
    result = to_ctx->ops->isend(to_ctx, to, &none, 0, &send_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &recv_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &send_req);
  return result;
}

static void warn_stall(hoop_comm *comm, double now) {
  char waiting[512] = "";
  size_t used = 0;
  comm->stall_warned = 1;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank)
      continue;
    hoop__tctx *ctx = hoop__transport_of(comm, p);
    int pending = ctx->ops->pending(ctx, p);
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
  for (; prepared < comm->ntransports; prepared++) {
    hoop__tctx *ctx = &comm->transports[prepared];
    if (ctx->state && (result = ctx->ops->sleep_prepare(ctx, &parts[prepared], &counts[prepared],
                                                        &found)) != HOOP_OK)
      break;
  }
  size_t total = 1;
  for (int t = 0; t < prepared; t++)
    total += counts[t];
  if (result == HOOP_OK && total > comm->sleep_cap) {
    struct pollfd *fds = realloc(comm->sleep_fds, total * sizeof *fds);
    if (fds) {
      comm->sleep_fds = fds;
      comm->sleep_cap = total;
    } else {
      result = hoop__fail(comm, HOOP_ERR_SYSTEM, "out of memory for the poll set");
    }
  }
  if (result == HOOP_OK && !found) {
    nfds_t n = 0;
    for (int t = 0; t < prepared; t++)
      for (nfds_t i = 0; i < counts[t]; i++)
        comm->sleep_fds[n++] = parts[t][i];
    watched = comm->rdzv_fd >= 0;
    if (watched)
      comm->sleep_fds[n++] = (struct pollfd){.fd = comm->rdzv_fd, .events = POLLIN};
    int ready = poll(comm->sleep_fds, n, timeout_ms);
    if (ready < 0 && errno != EINTR)
      result = hoop__fail(comm, HOOP_ERR_SYSTEM, "poll: %s", strerror(errno));
    n = 0;
    for (int t = 0; t < prepared; t++) {
      for (nfds_t i = 0; i < counts[t]; i++)
        parts[t][i].revents = ready > 0 ? comm->sleep_fds[n + i].revents : 0;
      n += counts[t];
    }
    watched = ready > 0 && watched && comm->sleep_fds[n].revents;
  } else {
    for (int t = 0; t < prepared; t++)
      for (nfds_t i = 0; i < counts[t]; i++)
        parts[t][i].revents = 0;
  }
  *moved |= found;
  /* Every transport that prepared undoes it, whatever happened. */
  for (int t = 0; t < prepared; t++) {
    hoop__tctx *ctx = &comm->transports[t];
    if (!ctx->state)
      continue;
    hoop_result done = ctx->ops->sleep_done(ctx, moved);
    if (result == HOOP_OK)
      result = done;
  }
  /* News from the server last, after one more round has taken what the ranks sent before it
   * (a rank that aborted right after sending this one its last message). */
  for (int t = 0; t < comm->ntransports && result == HOOP_OK && watched; t++) {
    hoop__tctx *ctx = &comm->transports[t];
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
  int several = comm->ntransports_serving > 1;
  for (int t = 0; t < comm->ntransports; t++) {
    hoop__tctx *ctx = &comm->transports[t];
    if (!ctx->state)
      continue;
    hoop_result result = ctx->ops->progress(ctx, several ? 0 : timeout_ms, moved);
    if (result != HOOP_OK)
      return result;
  }
  if (!several || timeout_ms <= 0 || *moved)
    return HOOP_OK;
  if (comm->sleep_shared)
    return sleep_shared(comm, timeout_ms, moved);
  poll(NULL, 0, 1);
  return HOOP_OK;
}

hoop_result hoop__progress_once(hoop_comm *comm) {
  if (hoop__check_abort(comm) != HOOP_OK || comm->failed)
    return comm->failed;
  int moved = 0;
  return progress_all(comm, 0, &moved);
}

/* The grace after HOOP_TIMEOUT, as a fraction of it (of at most 1 s): see hoop__wait. */
#define TIMEOUT_GRACE 0.05

/* Between empty rounds of a spinning wait. Ranks that outnumber the CPUs give theirs to the peers
 * they wait for; a rank with a CPU of its own keeps it: sched_yield costs a system call, and a
 * switch to whatever else runs on the host (on a 2-core VM shared with a compiler, yielding made
 * an 8-byte allreduce over shared memory several times slower), while a pause instruction only
 * eases the spin on the core's sibling and the memory bus. One, not more: what arrives during the
 * pauses waits for them to end, and a pause takes 28 ns on the development VM's EPYC (up to 40 on
 * recent Intel cores), so the 16 of before added 0.2 us on average to every small message. */
static void spin_pause(const hoop_comm *comm) {
  if (comm->spin_yields) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Asked at the first wait: a transport may decide its spin only once the rank table is known. */
static double spin_s(hoop_comm *comm) {
  if (comm->spin_s < 0) {
    comm->spin_s = 0;
    comm->spin_yields = hoop__host_oversubscribed(comm);
    for (int t = 0; t < comm->ntransports; t++) {
      hoop__tctx *ctx = &comm->transports[t];
      double spin = ctx->state ? ctx->ops->spin_s(ctx) : 0;
      if (spin > comm->spin_s)
        comm->spin_s = spin;
    }
  }
  return comm->spin_s;
}

hoop_result hoop__wait(hoop_comm *comm, hoop__request *req) {
  if (req->pending == 0)
    return HOOP_OK;
  double spin = spin_s(comm);
  double now = hoop__now();
  double deadline = now + comm->timeout_s, spin_until = now + spin;
  int in_grace = 0;
  while (req->pending > 0) {
    if (hoop__check_abort(comm) != HOOP_OK || comm->failed)
      return comm->failed;
    int moved = 0;
    now = hoop__now();
    if (!comm->stall_warned && now - comm->call_started > comm->stall_warn_s)
      warn_stall(comm, now);
    double left = deadline - now;
    int spinning = now < spin_until;
    hoop_result result = progress_all(comm,
                                      spinning || left <= 0 ? 0
                                      : left > 0.1          ? 100
                                                            : (int)(left * 1000) + 1,
                                      &moved);
    /* Reading ahead may find a peer's notice after this request's last byte: the request itself
     * still completed; the failure stays recorded for what follows. */
    if (result != HOOP_OK)
      return req->pending == 0 ? HOOP_OK : result;
    /* A spinning round took no time to speak of: its clock reading still serves (each costs
     * about 25 ns, the round's whole work when nothing arrived). */
    if (!spinning)
      now = hoop__now();
    if (spinning && !moved)
      spin_pause(comm);
    if (moved) {
      deadline = now + comm->timeout_s;
      in_grace = 0;
    } else if (now > deadline) {
      hoop__tctx *ctx = hoop__transport_of(comm, req->peer);
      result = ctx->ops->timed_out(ctx, req, in_grace);
      if (result != HOOP_OK)
        return result;
      /* The transport knows the peer runs: it waits for someone else itself, and its notice
       * will say for whom (see timed_out in transport.h). */
      in_grace = 1;
      deadline = hoop__now() + (comm->timeout_s < 1.0 ? comm->timeout_s : 1.0) * TIMEOUT_GRACE;
    }
  }
  return HOOP_OK;
}

/* ---- the core's side, for transports --------------------------------------------------------- */

hoop_result hoop__tctx_watched(hoop__tctx *ctx) {
  return hoop__rendezvous_check(ctx->comm);
}

void hoop__tctx_failure(const hoop__tctx *ctx, int *origin, const char **cause) {
  const hoop_comm *comm = ctx->comm;
  *origin = comm->fail_origin >= 0 ? comm->fail_origin : comm->rank;
  *cause = comm->fail_cause[0] ? comm->fail_cause : hoop_strerror(comm->failed);
}

void hoop__tctx_staging(const hoop__tctx *ctx, void **ptr, size_t *bytes) {
  *ptr = ctx->comm->scratch;
  *bytes = ctx->comm->scratch_bytes;
}

void *hoop__tctx_registered(const hoop__tctx *ctx, const void *ptr, size_t len) {
  const hoop__registration *reg = hoop__registration_find(ctx->comm, ptr, len);
  return reg ? reg->transport_mem[ctx->index] : NULL;
}

/* ---- choosing transports --------------------------------------------------------------------- */

static const char *const transport_names =
#ifdef HOOP_HAVE_VERBS
    "auto, shm, tcp, ibverbs";
#else
    "auto, shm, tcp";
#endif

/* Every transport of this build, in priority order: shared memory for the peers on this host,
 * then verbs, then TCP. */
static const hoop__transport_ops *const all_transports[] = {
    &hoop__shm_transport,
#ifdef HOOP_HAVE_VERBS
    &hoop__ibverbs_transport,
#endif
    &hoop__tcp_transport,
};
#define ALL_TRANSPORTS (sizeof all_transports / sizeof all_transports[0])

hoop_result hoop__transport_check(hoop_comm *comm, const char *mode) {
  if (strcmp(mode, "auto") == 0)
    return HOOP_OK;
  for (size_t i = 0; i < ALL_TRANSPORTS; i++)
    if (strcmp(mode, all_transports[i]->name) == 0)
      return HOOP_OK;
  return hoop__set_error(
      comm, strcmp(mode, "ibverbs") == 0 ? HOOP_ERR_UNSUPPORTED : HOOP_ERR_INVALID_ARG,
      "hoop_init: transport '%s' is not available (this build has: %s)", mode, transport_names);
}

/* The transport of this build whose entries an address entry is: the one whose prefix it starts
 * with, else the one without a prefix. */
static const hoop__transport_ops *entry_owner(const char *entry) {
  const hoop__transport_ops *plain = NULL;
  for (size_t i = 0; i < ALL_TRANSPORTS; i++) {
    const char *prefix = all_transports[i]->addr_prefix;
    if (!prefix[0])
      plain = all_transports[i];
    else if (strncmp(entry, prefix, strlen(prefix)) == 0)
      return all_transports[i];
  }
  return plain;
}

/* ops's entry in a published address, copied to out without its prefix; 0 if found. */
static int find_entry(const char *addr, const hoop__transport_ops *ops, char *out, size_t outlen) {
  while (*addr) {
    size_t len = strcspn(addr, " ");
    if (len > 0) {
      char entry[HOOP__WIRE_MAX_ADDR + 1];
      snprintf(entry, sizeof entry, "%.*s", (int)len, addr);
      if (entry_owner(entry) == ops) {
        size_t skip = strlen(ops->addr_prefix);
        snprintf(out, outlen, "%s", entry + skip);
        return 0;
      }
    }
    addr += len;
    addr += strspn(addr, " ");
  }
  return -1;
}

int hoop__tctx_offered(const hoop__tctx *ctx, int rank) {
  char entry[HOOP__WIRE_MAX_ADDR + 1];
  return hoop__tctx_entry(ctx, rank, entry, sizeof entry) == 0;
}

int hoop__tctx_entry(const hoop__tctx *ctx, int rank, char *out, size_t outlen) {
  return find_entry(ctx->table->peers[rank].addr, ctx->ops, out, outlen);
}

static int is_verbs(const hoop__transport_ops *ops) {
  return strcmp(ops->name, "ibverbs") == 0;
}

static int is_tcp(const hoop__transport_ops *ops) {
  return strcmp(ops->name, "tcp") == 0;
}

hoop_result hoop__transport_listen(hoop_comm *comm, const char *mode, const struct sockaddr *toward,
                                   char *addr, size_t addrlen) {
  int is_auto = strcmp(mode, "auto") == 0;
  comm->transports = calloc(HOOP__MAX_TRANSPORTS, sizeof *comm->transports);
  if (!comm->transports)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: out of memory");
  addr[0] = '\0';
  for (size_t i = 0; i < ALL_TRANSPORTS && comm->ntransports < HOOP__MAX_TRANSPORTS; i++) {
    const hoop__transport_ops *ops = all_transports[i];
    if (!is_auto && strcmp(mode, ops->name) != 0)
      continue;
    hoop__tctx *ctx = &comm->transports[comm->ntransports];
    *ctx = (hoop__tctx){.comm = comm,
                        .ops = ops,
                        .index = comm->ntransports,
                        .rank = comm->rank,
                        .size = comm->size,
                        .table = &comm->table,
                        .timeout_s = comm->timeout_s,
                        .ifname = comm->ifname,
                        .tcp_streams = comm->tcp_streams,
                        .data_nonce = comm->data_nonce,
                        .failed = &comm->failed,
                        .watch_fd = &comm->rdzv_fd};
    char entry[HOOP__WIRE_MAX_ADDR + 1];
    hoop_result result = ops->listen(ctx, toward, entry, sizeof entry);
    /* Under auto, TCP is the one that must work; the others are left out if they cannot (verbs
     * whatever the reason, as before shm came; shm unless a HOOP_SHM setting is bad). */
    if (result != HOOP_OK && is_auto && !is_tcp(ops) &&
        (is_verbs(ops) || result != HOOP_ERR_INVALID_ARG)) {
      HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: %s is not usable here (%s)", ops->name,
                 comm->last_error);
      comm->last_error[0] = '\0';
      ops->finalize(ctx);
      continue;
    }
    comm->ntransports++;
    if (result != HOOP_OK)
      return result;
    size_t used = strlen(addr);
    if (used + 1 + strlen(ops->addr_prefix) + strlen(entry) >= addrlen)
      return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                             "hoop_init: transport addresses longer than %zu bytes", addrlen - 1);
    snprintf(addr + used, addrlen - used, "%s%s%s", used ? " " : "", ops->addr_prefix, entry);
  }
  return HOOP_OK;
}

/* The first of this rank's transports that peer offered too and that can reach it; -1 if none. */
static int choose_for(hoop_comm *comm, int peer) {
  for (int t = 0; t < comm->ntransports; t++) {
    hoop__tctx *ctx = &comm->transports[t];
    if (hoop__tctx_offered(ctx, peer) && (!ctx->ops->can_reach || ctx->ops->can_reach(ctx, peer)))
      return t;
  }
  return -1;
}

/* Under auto, say what was chosen and why; before agree keeps only the chosen entries. */
static void log_choice(const hoop_comm *comm, const int *served) {
  if (strcmp(comm->transport_mode, "auto") != 0)
    return;
  const hoop__tctx *verbs = NULL, *only = NULL;
  int serving = 0;
  char list[256] = "";
  size_t used = 0;
  for (int t = 0; t < comm->ntransports; t++) {
    const hoop__tctx *ctx = &comm->transports[t];
    if (is_verbs(ctx->ops))
      verbs = ctx;
    if (served[t] > 0) {
      serving++;
      only = ctx;
      if (used < sizeof list)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s for %d peer%s",
                                 used ? ", " : "", ctx->ops->name, served[t],
                                 served[t] == 1 ? "" : "s");
    }
  }
  if (serving > 1) {
    HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using several transports, by peer: %s", list);
    return;
  }
  if (only && !is_verbs(only->ops) && !is_tcp(only->ops)) {
    HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using %s (every peer is on this host)",
               only->ops->name);
    return;
  }
  if (only && is_verbs(only->ops)) {
    HOOP__INFO(HOOP_SUBSYS_NET,
               "HOOP_TRANSPORT=auto: using ibverbs (every rank has an active RDMA port)");
    return;
  }
  for (int r = 0; verbs && r < comm->size; r++)
    if (!hoop__tctx_offered(verbs, r)) {
      HOOP__INFO(HOOP_SUBSYS_NET,
                 "HOOP_TRANSPORT=auto: using tcp (rank %d offered no ibverbs address: '%s')", r,
                 comm->table.peers[r].addr);
      return;
    }
  HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using tcp (no active RDMA port here)");
}

hoop_result hoop__transport_agree(hoop_comm *comm) {
  comm->peer_transport = calloc((size_t)comm->size, sizeof *comm->peer_transport);
  if (!comm->peer_transport)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: out of memory");
  /* A shrunken job's transports listened before its size was known (core/shrink.c). */
  for (int t = 0; t < comm->ntransports; t++) {
    comm->transports[t].rank = comm->rank;
    comm->transports[t].size = comm->size;
    comm->transports[t].local_size = (int)comm->table.peers[comm->rank].local_size;
  }
  int served[HOOP__MAX_TRANSPORTS] = {0};
  for (int r = 0; r < comm->size; r++) {
    if (r == comm->rank)
      continue;
    int t = choose_for(comm, r);
    if (t < 0)
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                             "hoop_init: no transport that every rank offers: this rank "
                             "(HOOP_TRANSPORT=%s) offers '%s' but rank %d offers '%s'; set the "
                             "same HOOP_TRANSPORT on every rank",
                             comm->transport_mode, comm->table.peers[comm->rank].addr, r,
                             comm->table.peers[r].addr);
    comm->peer_transport[r] = (uint8_t)t;
    served[t]++;
  }
  log_choice(comm, served);
  /* This rank's own entry names the transport of the first pair (it is only logged). */
  comm->peer_transport[comm->rank] =
      comm->size > 1 ? comm->peer_transport[(comm->rank + 1) % comm->size] : 0;
  for (int r = 0; r < comm->size; r++) {
    char entry[HOOP__WIRE_MAX_ADDR + 1] = "";
    find_entry(comm->table.peers[r].addr, comm->transports[comm->peer_transport[r]].ops, entry,
               sizeof entry);
    snprintf(comm->table.peers[r].addr, sizeof comm->table.peers[r].addr, "%s", entry);
  }
  comm->ntransports_serving = 0;
  comm->sleep_shared = 1;
  comm->spin_s = -1;
  for (int t = 0; t < comm->ntransports; t++) {
    hoop__tctx *ctx = &comm->transports[t];
    if (!served[t]) {
      ctx->ops->finalize(ctx);
      continue;
    }
    comm->ntransports_serving++;
    if (!ctx->ops->sleep_prepare || !ctx->ops->sleep_done)
      comm->sleep_shared = 0;
  }
  return HOOP_OK;
}

const char *hoop__transport_names(const hoop_comm *comm, char *out, size_t outlen) {
  size_t used = 0;
  out[0] = '\0';
  for (int t = 0; t < comm->ntransports && used < outlen; t++)
    if (comm->transports[t].state)
      used += (size_t)snprintf(out + used, outlen - used, "%s%s", used ? "+" : "",
                               comm->transports[t].ops->name);
  if (!out[0])
    snprintf(out, outlen, "(none)");
  return out;
}

hoop_result hoop__transport_connect(hoop_comm *comm, int peer) {
  hoop__tctx *ctx = hoop__transport_of(comm, peer);
  return ctx->ops->connect(ctx, peer);
}

void hoop__transports_shutdown(hoop_comm *comm) {
  for (int t = 0; t < comm->ntransports; t++)
    if (comm->transports[t].state)
      comm->transports[t].ops->shutdown(&comm->transports[t]);
}

void hoop__transports_wake(hoop_comm *comm) {
  for (int t = 0; t < comm->ntransports; t++)
    if (comm->transports[t].state && comm->transports[t].ops->wake)
      comm->transports[t].ops->wake(&comm->transports[t]);
}

void hoop__transports_forget_mem(hoop_comm *comm, const void *ptr, size_t bytes) {
  for (int t = 0; t < comm->ntransports; t++)
    if (comm->transports[t].state && comm->transports[t].ops->forget_mem)
      comm->transports[t].ops->forget_mem(&comm->transports[t], ptr, bytes);
}

void hoop__transport_finalize(hoop_comm *comm) {
  for (int t = 0; t < comm->ntransports; t++)
    if (comm->transports[t].state)
      comm->transports[t].ops->finalize(&comm->transports[t]);
  free(comm->transports);
  free(comm->peer_transport);
  free(comm->sleep_fds);
  comm->sleep_fds = NULL;
  comm->sleep_cap = 0;
  comm->transports = NULL;
  comm->peer_transport = NULL;
  comm->ntransports = 0;
}

/* ---- what both transports do alike ----------------------------------------------------------- */

int hoop__wake_open(void) {
  return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

void hoop__wake_signal(int fd, const char *name) {
  uint64_t one = 1;
  if (fd >= 0 && write(fd, &one, sizeof one) < 0)
    HOOP__TRACE(HOOP_SUBSYS_NET, "%s: waking the progress engine: %s", name, strerror(errno));
}

hoop_result hoop__wait_listener(hoop__tctx *ctx, int listen_fd, int wake_fd, const char *name,
                                double deadline) {
  for (;;) {
    struct pollfd pfds[3] = {{.fd = listen_fd, .events = POLLIN},
                             {.fd = wake_fd, .events = POLLIN},
                             {.fd = *ctx->watch_fd, .events = POLLIN}};
    double left = deadline - hoop__now();
    if (left <= 0)
      return HOOP_ERR_TIMEOUT;
    int ready = poll(pfds, 3, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: poll: %s", name, strerror(errno));
    hoop_result result = HOOP_OK;
    if (ready > 0 && pfds[1].revents) {
      if ((result = hoop__wake_drain(ctx, wake_fd, name)) != HOOP_OK)
        return result;
      result = hoop__check_abort(ctx->comm);
    }
    if (result == HOOP_OK && ready > 0 && pfds[2].revents)
      result = hoop__tctx_watched(ctx);
    if (result != HOOP_OK || *ctx->failed)
      return result != HOOP_OK ? result : *ctx->failed;
    if (ready > 0 && pfds[0].revents)
      return HOOP_OK;
  }
}

hoop_result hoop__wake_drain(hoop__tctx *ctx, int fd, const char *name) {
  uint64_t count;
  if (read(fd, &count, sizeof count) < 0 && errno != EAGAIN)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: reading the wake eventfd: %s", name,
                      strerror(errno));
  return HOOP_OK;
}

void hoop__frame_encode(uint8_t *out, uint32_t magic, uint32_t type, uint64_t len,
                        const uint8_t *fingerprint) {
  hoop__put_be32(out, magic);
  hoop__put_be32(out + 4, type);
  hoop__put_be64(out + 8, len);
  if (fingerprint)
    memcpy(out + 16, fingerprint, HOOP__FINGERPRINT_BYTES);
  else
    memset(out + 16, 0, HOOP__FINGERPRINT_BYTES);
}

uint64_t hoop__frame_length(const uint8_t *frame) {
  return hoop__get_be64(frame + 8);
}

hoop_result hoop__frame_check(hoop__tctx *ctx, int peer, const uint8_t *frame,
                              const hoop__request *req) {
  static const uint8_t unchecked[HOOP__FINGERPRINT_BYTES];
  const uint8_t *theirs = frame + 16, *ours = req->fingerprint;
  int compare = memcmp(theirs, unchecked, sizeof unchecked) != 0 &&
                memcmp(ours, unchecked, sizeof unchecked) != 0;
  if ((compare && memcmp(theirs, ours, HOOP__FINGERPRINT_BYTES) != 0) ||
      hoop__frame_length(frame) != req->len)
    return hoop__mismatch(ctx->comm, peer, theirs, ours, hoop__frame_length(frame), req->len);
  return HOOP_OK;
}

hoop_result hoop__peer_failed(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                              const char *detail) {
  hoop_comm *comm = ctx->comm;
  const hoop__peer_entry *entry = &comm->table.peers[peer];
  /* This rank is fine; the peer is the one that failed, and peers told of it should say so. */
  if (!comm->failed && comm->fail_origin < 0)
    comm->fail_origin = peer;
  return hoop__fail(comm, code, "%s (call #%llu): lost rank %d (%s, host %s): %s: %s",
                    comm->call ? comm->call : "hoop_init", (unsigned long long)comm->seq, peer,
                    entry->addr, entry->host, what, detail);
}

hoop_result hoop__peer_sockaddr(hoop__tctx *ctx, int peer, const char *name,
                                struct sockaddr_storage *addr, socklen_t *addrlen) {
  const char *text = ctx->table->peers[peer].addr;
  char host[HOOP__WIRE_MAX_ADDR + 1], err[256];
  int port;
  if (hoop__split_hostport(text, host, sizeof host, &port) != 0 ||
      hoop__resolve(host, port, addr, addrlen, err, sizeof err) != 0)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "%s: rank %d published a bad address '%s'",
                      name, peer, text);
  return HOOP_OK;
}
