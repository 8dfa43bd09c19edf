/* transport.c - the calls collectives make, dispatched to the communicator's transport. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "core/log.h"
#include "transport/transport.h"
#include "util/be.h"
#include "util/netaddr.h"

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
  return len == 0 ? HOOP_OK : comm->transport->isend(comm, peer, buf, len, req);
}

hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req) {
  stamp(comm, req, peer, 0, len);
  return len == 0 ? HOOP_OK : comm->transport->irecv(comm, peer, buf, len, req);
}

hoop_result hoop__wait(hoop_comm *comm, hoop__request *req) {
  return req->pending == 0 ? HOOP_OK : comm->transport->wait(comm, req);
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
  hoop_result result = comm->transport->irecv(comm, from, &none, 0, &recv_req);
  if (result == HOOP_OK)
    result = comm->transport->isend(comm, to, &none, 0, &send_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &recv_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &send_req);
  return result;
}

/* ---- choosing the transport ------------------------------------------------------------------ */

static const char *const transport_names =
#ifdef HOOP_HAVE_VERBS
    "auto, tcp, ibverbs";
#else
    "auto, tcp";
#endif

hoop_result hoop__transport_check(hoop_comm *comm, const char *mode) {
  if (strcmp(mode, "auto") == 0 || strcmp(mode, "tcp") == 0)
    return HOOP_OK;
#ifdef HOOP_HAVE_VERBS
  if (strcmp(mode, "ibverbs") == 0)
    return HOOP_OK;
#endif
  return hoop__set_error(
      comm, strcmp(mode, "ibverbs") == 0 ? HOOP_ERR_UNSUPPORTED : HOOP_ERR_INVALID_ARG,
      "hoop_init: transport '%s' is not available (this build has: %s)", mode, transport_names);
}

/* Entries of an address, in the order they are tried: verbs first. */
static int entry_is_verbs(const char *entry) {
  return strncmp(entry, "ib:", 3) == 0;
}

static int ops_is_verbs(const hoop__transport_ops *ops) {
  return strcmp(ops->name, "ibverbs") == 0;
}

hoop_result hoop__transport_listen(hoop_comm *comm, const char *mode, const struct sockaddr *toward,
                                   char *addr, size_t addrlen) {
  const hoop__transport_ops *candidates[2];
  int count = 0, is_auto = strcmp(mode, "auto") == 0;
#ifdef HOOP_HAVE_VERBS
  if (is_auto || strcmp(mode, "ibverbs") == 0)
    candidates[count++] = &hoop__ibverbs_transport;
#endif
  if (is_auto || strcmp(mode, "tcp") == 0)
    candidates[count++] = &hoop__tcp_transport;
  addr[0] = '\0';
  for (int i = 0; i < count; i++) {
    char entry[HOOP__WIRE_MAX_ADDR + 1];
    comm->transport_state = NULL;
    hoop_result result = candidates[i]->listen(comm, toward, entry, sizeof entry);
    void *state = comm->transport_state;
    comm->transport_state = NULL;
    if (result != HOOP_OK && is_auto && ops_is_verbs(candidates[i])) {
      HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: ibverbs is not usable here (%s); tcp it is",
                 comm->last_error);
      comm->last_error[0] = '\0';
      comm->transport_state = state;
      candidates[i]->finalize(comm);
      comm->transport_state = NULL;
      continue;
    }
    comm->offered[comm->offered_count] = candidates[i];
    comm->offered_state[comm->offered_count++] = state;
    if (result != HOOP_OK)
      return result;
    size_t used = strlen(addr);
    if (used + 1 + strlen(entry) >= addrlen)
      return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                             "hoop_init: transport addresses longer than "
                             "%zu bytes",
                             addrlen - 1);
    snprintf(addr + used, addrlen - used, "%s%s", used ? " " : "", entry);
  }
  return HOOP_OK;
}

/* The entry of kind verbs (or not) in a published address, copied to out without its "ib:"
 * prefix; 0 if found. */
static int find_entry(const char *addr, int verbs, char *out, size_t outlen) {
  while (*addr) {
    size_t len = strcspn(addr, " ");
    if (len > 0 && entry_is_verbs(addr) == verbs) {
      size_t skip = verbs ? 3 : 0;
      snprintf(out, outlen, "%.*s", (int)(len - skip), addr + skip);
      return 0;
    }
    addr += len;
    addr += strspn(addr, " ");
  }
  return -1;
}

hoop_result hoop__transport_agree(hoop_comm *comm) {
  int chosen = -1, missing = -1;
  for (int c = 0; c < comm->offered_count && chosen < 0; c++) {
    int verbs = ops_is_verbs(comm->offered[c]);
    char entry[HOOP__WIRE_MAX_ADDR + 1];
    int without = -1;
    for (int r = 0; r < comm->size && without < 0; r++)
      if (find_entry(comm->table.peers[r].addr, verbs, entry, sizeof entry) != 0)
        without = r;
    if (without < 0)
      chosen = c;
    else if (missing < 0)
      missing = without;
  }
  if (chosen < 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: no transport that every rank offers: this rank "
                           "(HOOP_TRANSPORT=%s) offers '%s' but rank %d offers '%s'; set the same "
                           "HOOP_TRANSPORT on every rank",
                           comm->transport_mode, comm->table.peers[comm->rank].addr,
                           missing < 0 ? 0 : missing,
                           comm->table.peers[missing < 0 ? 0 : missing].addr);
  const hoop__transport_ops *ops = comm->offered[chosen];
  int verbs = ops_is_verbs(ops);
  if (strcmp(comm->transport_mode, "auto") == 0 && verbs)
    HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using ibverbs (every rank has an active RDMA "
                                "port)");
  else if (strcmp(comm->transport_mode, "auto") == 0 && missing >= 0)
    HOOP__INFO(HOOP_SUBSYS_NET,
               "HOOP_TRANSPORT=auto: using tcp (rank %d offered no ibverbs "
               "address: '%s')",
               missing, comm->table.peers[missing].addr);
  else if (strcmp(comm->transport_mode, "auto") == 0)
    HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using tcp (no active RDMA port here)");
  for (int r = 0; r < comm->size; r++) {
    char entry[HOOP__WIRE_MAX_ADDR + 1];
    find_entry(comm->table.peers[r].addr, verbs, entry, sizeof entry);
    snprintf(comm->table.peers[r].addr, sizeof comm->table.peers[r].addr, "%s", entry);
  }
  for (int c = 0; c < comm->offered_count; c++) {
    if (c == chosen)
      continue;
    comm->transport_state = comm->offered_state[c];
    comm->offered[c]->finalize(comm);
  }
  comm->transport = ops;
  comm->transport_state = comm->offered_state[chosen];
  comm->offered_count = 0;
  return HOOP_OK;
}

void hoop__transport_finalize(hoop_comm *comm) {
  if (comm->transport) {
    comm->transport->finalize(comm);
    return;
  }
  for (int c = 0; c < comm->offered_count; c++) {
    comm->transport_state = comm->offered_state[c];
    comm->offered[c]->finalize(comm);
  }
  comm->offered_count = 0;
  comm->transport_state = NULL;
}

/* ---- the wait loop the transports share ------------------------------------------------------ */

static void warn_stall(hoop_comm *comm, double now, const hoop__wait_hooks *hooks) {
  char waiting[512] = "";
  size_t used = 0;
  comm->stall_warned = 1;
  for (int p = 0; p < comm->size; p++) {
    int pending = hooks->pending(comm, p);
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

hoop_result hoop__wait_loop(hoop_comm *comm, hoop__request *req, const hoop__wait_hooks *hooks) {
  double now = hoop__now();
  double deadline = now + comm->timeout_s, spin_until = now + hooks->spin_s;
  while (req->pending > 0) {
    if (hoop__check_abort(comm) != HOOP_OK || comm->failed)
      return comm->failed;
    int moved = 0;
    now = hoop__now();
    if (!comm->stall_warned && now - comm->call_started > comm->stall_warn_s)
      warn_stall(comm, now, hooks);
    double left = deadline - now;
    int spinning = now < spin_until;
    hoop_result result = hooks->progress(comm,
                                         spinning || left <= 0 ? 0
                                         : left > 0.1          ? 100
                                                               : (int)(left * 1000) + 1,
                                         &moved);
    /* Reading ahead may find a peer's notice after this request's last byte: the request itself
     * still completed; the failure stays recorded for what follows. */
    if (result != HOOP_OK)
      return req->pending == 0 ? HOOP_OK : result;
    if (spinning && !moved)
      sched_yield();
    if (moved)
      deadline = hoop__now() + comm->timeout_s;
    else if (hoop__now() > deadline)
      return hooks->timed_out(comm, req);
  }
  return HOOP_OK;
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

hoop_result hoop__wake_drain(hoop_comm *comm, int fd, const char *name) {
  uint64_t count;
  if (read(fd, &count, sizeof count) < 0 && errno != EAGAIN)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "%s: reading the wake eventfd: %s", name,
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

hoop_result hoop__peer_failed(hoop_comm *comm, int peer, hoop_result code, const char *what,
                              const char *detail) {
  const hoop__peer_entry *entry = &comm->table.peers[peer];
  /* This rank is fine; the peer is the one that failed, and peers told of it should say so. */
  if (!comm->failed && comm->fail_origin < 0)
    comm->fail_origin = peer;
  return hoop__fail(comm, code, "%s (call #%llu): lost rank %d (%s, host %s): %s: %s",
                    comm->call ? comm->call : "hoop_init", (unsigned long long)comm->seq, peer,
                    entry->addr, entry->host, what, detail);
}

hoop_result hoop__peer_sockaddr(hoop_comm *comm, int peer, const char *name,
                                struct sockaddr_storage *addr, socklen_t *addrlen) {
  const char *text = comm->table.peers[peer].addr;
  char host[HOOP__WIRE_MAX_ADDR + 1], err[256];
  int port;
  if (hoop__split_hostport(text, host, sizeof host, &port) != 0 ||
      hoop__resolve(host, port, addr, addrlen, err, sizeof err) != 0)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "%s: rank %d published a bad address '%s'", name,
                      peer, text);
  return HOOP_OK;
}
