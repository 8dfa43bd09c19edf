/* conn.c - the TCP transport's connection setup: the listener, and each pair's streams, which the
 * lower rank connects and the higher one accepts, each opened with a handshake that turns away
 * strangers and ranks of other jobs. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/env.h"
#include "tcp.h"
#include "util/netaddr.h"
#include "util/sockio.h"

#define HANDSHAKE_MAGIC 0x54504f48u /* "HOPT" */
#define HANDSHAKE_BYTES (16 + HOOP__WIRE_NONCE)

/* ---- errors ---------------------------------------------------------------------------------- */

hoop_result hoop__tcp_peer_error(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                                 int err) {
  return hoop__peer_failed(ctx, peer, code, what, err ? strerror(err) : "connection closed");
}

/* ---- setting up ------------------------------------------------------------------------------ */

static void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

hoop_result hoop__tcp_listen(hoop__tctx *ctx, const struct sockaddr *toward, char *addr,
                             size_t addrlen) {
  tcp_state *state = calloc(1, sizeof *state);
  if (!state)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "tcp: out of memory");
  state->listen_fd = -1;
  state->nstreams = ctx->tcp_streams;
  ctx->state = state;
  state->wake_fd = hoop__wake_open();
  if (state->wake_fd < 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "tcp: eventfd: %s", strerror(errno));
  const char *spin = hoop__env_get("HOOP_TCP_SPIN_US");
  long spin_us = -1;
  if (strcmp(spin, "auto") != 0 && hoop__parse_int(spin, 0, 1000000, &spin_us) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "tcp: HOOP_TCP_SPIN_US '%s' is not auto or a number of microseconds "
                           "(0-1000000)",
                           spin);
  state->spin_s = spin_us < 0 ? -1.0 : (double)spin_us * 1e-6;

  struct sockaddr_storage local;
  socklen_t local_len;
  char chosen[64], err[256];
  if (hoop__choose_local_addr(ctx->ifname, toward, &local, &local_len, chosen, sizeof chosen, err,
                              sizeof err) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "tcp: choosing an interface: %s", err);
  int fd = socket(local.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "tcp: socket: %s", strerror(errno));
  state->listen_fd = fd;
  if (bind(fd, (struct sockaddr *)&local, local_len) != 0 || listen(fd, 512) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "tcp: bind/listen on interface %s: %s",
                           chosen, strerror(errno));
  local_len = sizeof local;
  if (getsockname(fd, (struct sockaddr *)&local, &local_len) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "tcp: getsockname: %s", strerror(errno));
  hoop__format_sockaddr((struct sockaddr *)&local, addr, addrlen);
  HOOP__INFO(HOOP_SUBSYS_NET, "listening on %s (interface %s%s)", addr, chosen,
             ctx->ifname[0] ? ", from HOOP_IFNAME" : ", the route to the rendezvous server");
  return HOOP_OK;
}

/* Peers are known only after the rendezvous; allocate their slots on first use. */
static hoop_result ensure_peers(hoop__tctx *ctx) {
  tcp_state *state = state_of(ctx);
  if (state->peers)
    return HOOP_OK;
  state->peers = calloc((size_t)ctx->size, sizeof *state->peers);
  if (!state->peers)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "tcp: out of memory for %d peers", ctx->size);
  for (int p = 0; p < ctx->size; p++)
    for (int s = 0; s < HOOP__MAX_STREAMS; s++)
      state->peers[p].streams[s].fd = -1;
  return HOOP_OK;
}

/* {magic, from rank, stream index, streams per peer} then the link's proof (bound to both ranks,
 * the stream and the generation). Both ends must cut messages over the same number of streams, so
 * a rank whose HOOP_TCP_STREAMS differs is refused with a message that says so, instead of
 * exchanging misaligned bytes. */
static void encode_handshake(const hoop__tctx *ctx, uint8_t *out, uint32_t to, uint32_t stream,
                             uint32_t nstreams) {
  uint32_t from = (uint32_t)ctx->rank;
  uint32_t words[4] = {htonl(HANDSHAKE_MAGIC), htonl(from), htonl(stream), htonl(nstreams)};
  memcpy(out, words, 16);
  hoop__link_proof(ctx, "tcp", from, to, stream, out + 16);
}

static hoop_result connect_streams(hoop__tctx *ctx, int peer, double deadline) {
  tcp_state *state = state_of(ctx);
  struct sockaddr_storage addr;
  socklen_t addrlen;
  hoop_result resolved = hoop__peer_sockaddr(ctx, peer, "tcp", &addr, &addrlen);
  if (resolved != HOOP_OK)
    return resolved;
  for (int s = 0; s < state->nstreams; s++) {
    int fd = hoop__connect_deadline((struct sockaddr *)&addr, addrlen, deadline);
    if (fd < 0)
      return hoop__tcp_peer_error(
          ctx, peer, errno == ETIMEDOUT ? HOOP_ERR_TIMEOUT : HOOP_ERR_PEER_LOST, "connect", errno);
    state->peers[peer].streams[s].fd = fd;
    uint8_t hello[HANDSHAKE_BYTES];
    encode_handshake(ctx, hello, (uint32_t)peer, (uint32_t)s, (uint32_t)state->nstreams);
    if (hoop__write_full(fd, hello, sizeof hello, deadline) != 0)
      return hoop__tcp_peer_error(ctx, peer, HOOP_ERR_PEER_LOST, "handshake", errno);
  }
  state->peers[peer].connected = 1;
  return HOOP_OK;
}

/* A connection just accepted: where from (its address, without the port, is what the limit of
 * connections waiting from one place counts). */
static int tcp_admit(hoop__pending_conn *conn, char *why, size_t whylen) {
  struct sockaddr_storage peer;
  socklen_t len = sizeof peer;
  if (getpeername(conn->fd, (struct sockaddr *)&peer, &len) != 0) {
    snprintf(why, whylen, "getpeername: %s", strerror(errno));
    return -1;
  }
  hoop__format_host((struct sockaddr *)&peer, conn->from, sizeof conn->from);
  return 0;
}

static int tcp_read(hoop__pending_conn *conn, size_t bytes, char *why, size_t whylen) {
  while (conn->got < bytes) {
    ssize_t n = recv(conn->fd, conn->buf + conn->got, bytes - conn->got, MSG_DONTWAIT);
    if (n > 0) {
      conn->got += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return 0;
    snprintf(why, whylen, "%s after %zu bytes", n == 0 ? "closed" : strerror(errno), conn->got);
    return -1;
  }
  return 1;
}

static const hoop__pending_ops tcp_pending = {"tcp", HANDSHAKE_BYTES, tcp_admit, tcp_read};

/* Accept connections until one presents a handshake, and file it under the rank it names;
 * strangers are closed. */
static hoop_result accept_one(hoop__tctx *ctx, double deadline) {
  tcp_state *state = state_of(ctx);
  hoop__pending_conn conn;
  hoop_result waited = hoop__pending_accept(ctx, &state->pending, &tcp_pending, state->listen_fd,
                                            state->wake_fd, deadline, &conn);
  if (waited != HOOP_OK)
    return waited;
  int fd = conn.fd;
  tune_socket(fd);
  const uint8_t *hello = conn.buf;
  uint32_t words[4];
  memcpy(words, hello, 16);
  uint32_t from = ntohl(words[1]), stream = ntohl(words[2]), nstreams = ntohl(words[3]);
  if (ntohl(words[0]) != HANDSHAKE_MAGIC || from >= (uint32_t)ctx->size || (int)from >= ctx->rank ||
      !hoop__link_proof_ok(ctx, "tcp", from, (uint32_t)ctx->rank, stream, hello + 16))
    goto refuse;
  if (nstreams != (uint32_t)state->nstreams) {
    close(fd);
    return hoop__fail(ctx->comm, HOOP_ERR_INVALID_ARG,
                      "tcp: rank %u uses HOOP_TCP_STREAMS=%u but this rank uses %d; every rank "
                      "of a job must use the same value",
                      from, nstreams, state->nstreams);
  }
  if (stream >= (uint32_t)state->nstreams || state->peers[from].streams[stream].fd >= 0)
    goto refuse;
  tcp_peer *peer = &state->peers[from];
  peer->streams[stream].fd = fd;
  if (++peer->streams_up == state->nstreams)
    peer->connected = 1;
  return HOOP_OK;
refuse:
  hoop__pending_refuse(&conn, "tcp", "not this job's handshake, or a stream already open");
  return HOOP_OK;
}

hoop_result hoop__tcp_connect(hoop__tctx *ctx, int peer) {
  hoop_result result = ensure_peers(ctx);
  if (result != HOOP_OK || state_of(ctx)->peers[peer].connected)
    return result;
  double deadline = hoop__now() + ctx->timeout_s;
  if (ctx->rank < peer)
    return connect_streams(ctx, peer, deadline);
  tcp_state *state = state_of(ctx);
  while (!state->peers[peer].connected) {
    result = accept_one(ctx, deadline);
    if (result == HOOP_ERR_TIMEOUT)
      return hoop__tcp_peer_error(ctx, peer, HOOP_ERR_TIMEOUT, "waiting for it to connect",
                                  ETIMEDOUT);
    if (result != HOOP_OK)
      return result;
  }
  HOOP__TRACE(HOOP_SUBSYS_NET, "connected to rank %d with %d streams", peer, state->nstreams);
  return HOOP_OK;
}
