/* tcp.c - the TCP transport: one listener per rank, several streams per peer, non-blocking sockets
 * driven by one poll()-based progress engine.
 *
 * Connections: of each pair of ranks the lower one connects and the higher one accepts; each new
 * stream opens with a handshake {magic, from rank, stream index, job nonce}, so a stranger or a
 * stale rank of another job is turned away. Big messages are striped over the streams; both ends
 * cut a message the same way because both know its length.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "netaddr.h"
#include "sockio.h"
#include "transport.h"

#define HANDSHAKE_MAGIC 0x54504f48u /* "HOPT" */
#define HANDSHAKE_BYTES (12 + HOOP_WIRE_NONCE)
/* Messages below this go whole on stream 0: striping them costs more syscalls than it saves. */
#define STRIPE_MIN_BYTES (256 * 1024)
#define STRIPE_ALIGN 4096
/* A stranger that connects and says nothing may hold up an accept this long. */
#define HANDSHAKE_WAIT_S 5.0

typedef struct tcp_stream {
  int fd;
  hoop__fragment *send_head, *send_tail;
  hoop__fragment *recv_head, *recv_tail;
} tcp_stream;

typedef struct tcp_peer {
  int connected;
  int streams_up;
  tcp_stream streams[HOOP_MAX_STREAMS];
} tcp_peer;

typedef struct tcp_state {
  int listen_fd;
  int nstreams;
  double spin_s; /* HOOP_TCP_SPIN_US: how long a wait polls without sleeping */
  tcp_peer *peers;
  struct pollfd *pfds;
  struct poll_owner {
    tcp_stream *stream;
    int peer;
  } *pfd_owners; /* pfd_owners[i] is what pfds[i] polls for */
  size_t pfd_cap;
} tcp_state;

static tcp_state *state_of(hoop_comm *comm) {
  return comm->transport_state;
}

/* ---- errors ------------------------------------------------------------------------------------ */

static hoop_result peer_error(hoop_comm *comm, int peer, hoop_result code, const char *what,
                              int err) {
  const hoop__peer_entry *entry = &comm->table.peers[peer];
  return hoop__fail(comm, code, "%s (call #%llu): lost rank %d (%s, host %s): %s: %s",
                    comm->call ? comm->call : "hoop_init", (unsigned long long)comm->seq, peer,
                    entry->addr, entry->host, what, err ? strerror(err) : "connection closed");
}

/* ---- setting up ---------------------------------------------------------------------------------- */

static void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static hoop_result tcp_listen(hoop_comm *comm, const struct sockaddr *toward, char *addr,
                              size_t addrlen) {
  tcp_state *state = calloc(1, sizeof *state);
  if (!state)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "tcp: out of memory");
  state->listen_fd = -1;
  state->nstreams = comm->tcp_streams;
  comm->transport_state = state;
  long spin_us;
  if (hoop__parse_int(hoop__env_get("HOOP_TCP_SPIN_US"), 0, 1000000, &spin_us) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "tcp: HOOP_TCP_SPIN_US '%s' is not a number of microseconds (0-1000000)",
                           hoop__env_get("HOOP_TCP_SPIN_US"));
  state->spin_s = (double)spin_us * 1e-6;

  struct sockaddr_storage local;
  socklen_t local_len;
  char chosen[64], err[256];
  if (hoop__choose_local_addr(comm->ifname, toward, &local, &local_len, chosen, sizeof chosen, err,
                              sizeof err) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "tcp: choosing an interface: %s", err);
  int fd = socket(local.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "tcp: socket: %s", strerror(errno));
  state->listen_fd = fd;
  if (bind(fd, (struct sockaddr *)&local, local_len) != 0 || listen(fd, 512) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "tcp: bind/listen on interface %s: %s", chosen,
                           strerror(errno));
  local_len = sizeof local;
  if (getsockname(fd, (struct sockaddr *)&local, &local_len) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "tcp: getsockname: %s", strerror(errno));
  hoop__format_sockaddr((struct sockaddr *)&local, addr, addrlen);
  HOOP_INFO(HOOP_SUBSYS_NET, "listening on %s (interface %s%s)", addr, chosen,
            comm->ifname[0] ? ", from HOOP_IFNAME" : ", the route to the rendezvous server");
  return HOOP_OK;
}

/* Peers are known only after the rendezvous; allocate their slots on first use. */
static hoop_result ensure_peers(hoop_comm *comm) {
  tcp_state *state = state_of(comm);
  if (state->peers)
    return HOOP_OK;
  state->peers = calloc((size_t)comm->size, sizeof *state->peers);
  if (!state->peers)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: out of memory for %d peers", comm->size);
  for (int p = 0; p < comm->size; p++)
    for (int s = 0; s < HOOP_MAX_STREAMS; s++)
      state->peers[p].streams[s].fd = -1;
  return HOOP_OK;
}

static void encode_handshake(uint8_t *out, uint32_t from, uint32_t stream, const uint8_t *nonce) {
  uint32_t words[3] = {htonl(HANDSHAKE_MAGIC), htonl(from), htonl(stream)};
  memcpy(out, words, 12);
  memcpy(out + 12, nonce, HOOP_WIRE_NONCE);
}

static hoop_result connect_streams(hoop_comm *comm, int peer, double deadline) {
  tcp_state *state = state_of(comm);
  const char *text = comm->table.peers[peer].addr;
  char host[HOOP_WIRE_MAX_ADDR + 1], err[256];
  int port;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  if (hoop__split_hostport(text, host, sizeof host, &port) != 0 ||
      hoop__resolve(host, port, &addr, &addrlen, err, sizeof err) != 0)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "tcp: rank %d published a bad address '%s'", peer,
                      text);
  for (int s = 0; s < state->nstreams; s++) {
    int fd = hoop__connect_deadline((struct sockaddr *)&addr, addrlen, deadline);
    if (fd < 0)
      return peer_error(comm, peer, errno == ETIMEDOUT ? HOOP_ERR_TIMEOUT : HOOP_ERR_PEER_LOST,
                        "connect", errno);
    state->peers[peer].streams[s].fd = fd;
    uint8_t hello[HANDSHAKE_BYTES];
    encode_handshake(hello, (uint32_t)comm->rank, (uint32_t)s, comm->table.nonce);
    if (hoop__write_full(fd, hello, sizeof hello, deadline) != 0)
      return peer_error(comm, peer, HOOP_ERR_PEER_LOST, "handshake", errno);
  }
  state->peers[peer].connected = 1;
  return HOOP_OK;
}

/* Accept one connection and file it under the rank it names; strangers are closed. */
static hoop_result accept_one(hoop_comm *comm, double deadline) {
  tcp_state *state = state_of(comm);
  if (hoop__poll_one(state->listen_fd, POLLIN, deadline) != 0)
    return HOOP_ERR_TIMEOUT;
  int fd = accept4(state->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0)
    return errno == EAGAIN || errno == EINTR || errno == ECONNABORTED
               ? HOOP_OK
               : hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: accept: %s", strerror(errno));
  tune_socket(fd);
  uint8_t hello[HANDSHAKE_BYTES];
  double wait_until = hoop__now() + HANDSHAKE_WAIT_S;
  uint32_t words[3];
  if (hoop__read_full(fd, hello, sizeof hello, wait_until < deadline ? wait_until : deadline) != 0)
    goto refuse;
  memcpy(words, hello, 12);
  uint32_t from = ntohl(words[1]), stream = ntohl(words[2]);
  if (ntohl(words[0]) != HANDSHAKE_MAGIC ||
      memcmp(hello + 12, comm->table.nonce, HOOP_WIRE_NONCE) != 0 ||
      from >= (uint32_t)comm->size || (int)from >= comm->rank ||
      stream >= (uint32_t)state->nstreams || state->peers[from].streams[stream].fd >= 0)
    goto refuse;
  tcp_peer *peer = &state->peers[from];
  peer->streams[stream].fd = fd;
  if (++peer->streams_up == state->nstreams)
    peer->connected = 1;
  return HOOP_OK;
refuse:
  HOOP_WARN(HOOP_SUBSYS_NET, "refused a connection that did not present this job's handshake");
  close(fd);
  return HOOP_OK;
}

static hoop_result tcp_connect(hoop_comm *comm, int peer) {
  hoop_result result = ensure_peers(comm);
  if (result != HOOP_OK || state_of(comm)->peers[peer].connected)
    return result;
  double deadline = hoop__now() + comm->timeout_s;
  if (comm->rank < peer)
    return connect_streams(comm, peer, deadline);
  tcp_state *state = state_of(comm);
  while (!state->peers[peer].connected) {
    result = accept_one(comm, deadline);
    if (result == HOOP_ERR_TIMEOUT)
      return peer_error(comm, peer, HOOP_ERR_TIMEOUT, "waiting for it to connect", ETIMEDOUT);
    if (result != HOOP_OK)
      return result;
  }
  HOOP_TRACE(HOOP_SUBSYS_NET, "connected to rank %d with %d streams", peer, state->nstreams);
  return HOOP_OK;
}

/* ---- queues ------------------------------------------------------------------------------------- */

/* Cut a message into fragments, one per stream used; returns how many. The parts are len/used
 * rounded up to STRIPE_ALIGN, and the last fragment takes whatever remains, so that every byte is
 * in one fragment whatever the length. */
static int cut_message(tcp_state *state, char *buf, size_t len, hoop__request *req) {
  int used = len < STRIPE_MIN_BYTES ? 1 : state->nstreams;
  size_t share = (len + (size_t)used - 1) / (size_t)used;
  size_t part = (share + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  int n = 0;
  for (int s = 0; s < used; s++) {
    size_t begin = (size_t)s * part;
    if (begin >= len)
      break;
    hoop__fragment *frag = &req->frags[n++];
    frag->owner = req;
    frag->buf = buf + begin;
    frag->len = len - begin < part || s == used - 1 ? len - begin : part;
    frag->done = 0;
    frag->next = NULL;
  }
  return n;
}

static void enqueue(hoop__fragment **head, hoop__fragment **tail, hoop__fragment *frag) {
  if (*tail)
    (*tail)->next = frag;
  else
    *head = frag;
  *tail = frag;
}

static void dequeue_done(hoop__fragment **head, hoop__fragment **tail) {
  hoop__fragment *frag = *head;
  *head = frag->next;
  if (!*head)
    *tail = NULL;
  frag->owner->pending--;
}

/* ---- moving bytes ---------------------------------------------------------------------------------- */

/* Each returns 0 when the kernel asks us to wait (or the queue is empty), else an errno; a peer that
 * closed its end reads as ECONNRESET. */
static int drive_send(tcp_stream *stream, int *moved) {
  while (stream->send_head) {
    hoop__fragment *frag = stream->send_head;
    ssize_t n = send(stream->fd, frag->buf + frag->done, frag->len - frag->done, MSG_NOSIGNAL);
    if (n > 0) {
      *moved = 1;
      frag->done += (size_t)n;
      if (frag->done == frag->len)
        dequeue_done(&stream->send_head, &stream->send_tail);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else {
      return n < 0 ? errno : EPIPE;
    }
  }
  return 0;
}

static int drive_recv(tcp_stream *stream, int *moved) {
  while (stream->recv_head) {
    hoop__fragment *frag = stream->recv_head;
    ssize_t n = recv(stream->fd, frag->buf + frag->done, frag->len - frag->done, 0);
    if (n > 0) {
      *moved = 1;
      frag->done += (size_t)n;
      if (frag->done == frag->len)
        dequeue_done(&stream->recv_head, &stream->recv_tail);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return 0;
    } else {
      return n < 0 ? errno : ECONNRESET;
    }
  }
  return 0;
}

static hoop_result drive_stream(hoop_comm *comm, int peer, tcp_stream *stream, int *moved) {
  int err = drive_send(stream, moved);
  if (err)
    return peer_error(comm, peer, HOOP_ERR_PEER_LOST, "send", err == EPIPE ? 0 : err);
  err = drive_recv(stream, moved);
  if (err)
    return peer_error(comm, peer, HOOP_ERR_PEER_LOST, "receive", err == ECONNRESET ? 0 : err);
  return HOOP_OK;
}

static hoop_result grow_pollset(hoop_comm *comm, size_t need) {
  tcp_state *state = state_of(comm);
  if (need <= state->pfd_cap)
    return HOOP_OK;
  struct pollfd *pfds = realloc(state->pfds, need * sizeof *pfds);
  if (pfds)
    state->pfds = pfds;
  struct poll_owner *owners = realloc(state->pfd_owners, need * sizeof *owners);
  if (owners)
    state->pfd_owners = owners;
  if (!pfds || !owners)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: out of memory for the poll set");
  state->pfd_cap = need;
  return HOOP_OK;
}

/* One round of the progress engine: poll every stream that has work, for at most timeout_ms, and
 * move what is ready. *moved tells whether any byte moved. */
static hoop_result progress(hoop_comm *comm, int timeout_ms, int *moved) {
  tcp_state *state = state_of(comm);
  hoop_result result = grow_pollset(comm, (size_t)comm->size * (size_t)state->nstreams);
  if (result != HOOP_OK)
    return result;
  nfds_t n = 0;
  for (int p = 0; p < comm->size; p++) {
    for (int s = 0; s < state->nstreams && state->peers[p].connected; s++) {
      tcp_stream *stream = &state->peers[p].streams[s];
      if (!stream->send_head && !stream->recv_head)
        continue;
      state->pfds[n] = (struct pollfd){.fd = stream->fd,
                                       .events = (short)((stream->send_head ? POLLOUT : 0) |
                                                         (stream->recv_head ? POLLIN : 0))};
      state->pfd_owners[n++] = (struct poll_owner){stream, p};
    }
  }
  if (n == 0)
    return HOOP_OK;
  int ready = poll(state->pfds, n, timeout_ms);
  if (ready < 0 && errno != EINTR)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: poll: %s", strerror(errno));
  for (nfds_t i = 0; i < n && ready > 0; i++) {
    if (!state->pfds[i].revents)
      continue;
    result = drive_stream(comm, state->pfd_owners[i].peer, state->pfd_owners[i].stream, moved);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* ---- the ops --------------------------------------------------------------------------------- */

static hoop_result post(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req,
                        int is_send) {
  req->peer = peer;
  req->is_send = is_send;
  req->pending = 0;
  if (comm->failed)
    return comm->failed;
  hoop_result result = tcp_connect(comm, peer);
  if (result != HOOP_OK)
    return result;
  tcp_state *state = state_of(comm);
  int n = cut_message(state, buf, len, req);
  req->pending = n;
  int moved = 0;
  for (int s = 0; s < n; s++) {
    tcp_stream *stream = &state->peers[peer].streams[s];
    if (is_send)
      enqueue(&stream->send_head, &stream->send_tail, &req->frags[s]);
    else
      enqueue(&stream->recv_head, &stream->recv_tail, &req->frags[s]);
    /* Move what the kernel takes right away: small messages then never wait for a poll. */
    if ((result = drive_stream(comm, peer, stream, &moved)) != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

static hoop_result tcp_isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                             hoop__request *req) {
  /* The transport never writes through a send buffer; the cast only shares the fragment type. */
  return post(comm, peer, (void *)(uintptr_t)buf, len, req, 1);
}

static hoop_result tcp_irecv(hoop_comm *comm, int peer, void *buf, size_t len,
                             hoop__request *req) {
  return post(comm, peer, buf, len, req, 0);
}

/* Being put to sleep in poll() and woken costs tens of microseconds on a loaded or virtual machine,
 * several times what a small message takes to cross loopback. So a wait first polls without
 * sleeping for spin_s (yielding the CPU between polls, for ranks that share cores), and sleeps
 * only when nothing came in that time. */
static hoop_result tcp_wait(hoop_comm *comm, hoop__request *req) {
  double now = hoop__now();
  double deadline = now + comm->timeout_s, spin_until = now + state_of(comm)->spin_s;
  while (req->pending > 0) {
    if (comm->failed)
      return comm->failed;
    int moved = 0;
    now = hoop__now();
    double left = deadline - now;
    int spinning = now < spin_until;
    hoop_result result =
        progress(comm, spinning ? 0 : left > 0.1 ? 100 : (int)(left * 1000) + 1, &moved);
    if (result != HOOP_OK)
      return result;
    if (spinning && !moved)
      sched_yield();
    if (moved)
      deadline = hoop__now() + comm->timeout_s;
    else if (hoop__now() > deadline)
      return peer_error(comm, req->peer, HOOP_ERR_TIMEOUT,
                        req->is_send ? "no data accepted for HOOP_TIMEOUT"
                                     : "no data received for HOOP_TIMEOUT",
                        ETIMEDOUT);
  }
  return HOOP_OK;
}

static void tcp_shutdown(hoop_comm *comm) {
  tcp_state *state = state_of(comm);
  if (!state)
    return;
  for (int p = 0; state->peers && p < comm->size; p++) {
    for (int s = 0; s < HOOP_MAX_STREAMS; s++) {
      tcp_stream *stream = &state->peers[p].streams[s];
      if (stream->fd >= 0)
        close(stream->fd);
      memset(stream, 0, sizeof *stream);
      stream->fd = -1;
    }
    state->peers[p].connected = 0;
    state->peers[p].streams_up = 0;
  }
  if (state->listen_fd >= 0)
    close(state->listen_fd);
  state->listen_fd = -1;
}

static void tcp_finalize(hoop_comm *comm) {
  tcp_state *state = state_of(comm);
  if (!state)
    return;
  tcp_shutdown(comm);
  free(state->pfds);
  free(state->pfd_owners);
  free(state->peers);
  free(state);
  comm->transport_state = NULL;
}

const hoop__transport_ops hoop__tcp_transport = {
    .name = "tcp",
    .listen = tcp_listen,
    .connect = tcp_connect,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .wait = tcp_wait,
    .shutdown = tcp_shutdown,
    .finalize = tcp_finalize,
};
