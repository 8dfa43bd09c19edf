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
#define HANDSHAKE_WORDS 20          /* magic, from, stream, streams, cipher */

/* ---- errors ---------------------------------------------------------------------------------- */

hoop_result hoop__tcp_peer_error(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                                 int err) {
  if (err == EACCES)
    return hoop__peer_failed(ctx, peer, HOOP_ERR_AUTH, what,
                             "the end that answered at its address did not prove to be it (it "
                             "lacks the pair's key)");
  if (err == EBADMSG)
    return hoop__peer_failed(ctx, peer, HOOP_ERR_AUTH, what,
                             "an encrypted frame failed its check (changed, replayed or reordered "
                             "on the way); none of it was delivered");
  return hoop__peer_failed(ctx, peer, code, what, err ? strerror(err) : "connection closed");
}

/* ---- setting up ------------------------------------------------------------------------------ */

/* Within one host a connection runs over loopback, where there is no link to pace for. A pacing
 * congestion control (BBR, the default of some systems) holds a message's segments back on timers
 * there: 2 ranks on 2 CPUs, a broadcast took 36-40 us at 128 KiB and 96-160 at 1 MiB against 14-17
 * and 94-115 with reno, and an allgather 146-167 us at 1 MiB against 113-122. Ranks that outnumber
 * the CPUs are the other way round: 4 ranks on 2 CPUs, 1 MiB, BBR's allreduce took 660-700 us
 * against reno's 1110-1200, its all-to-all 350-380 against 500-515 (bench/TUNING.md). Reno paces
 * nothing and every user may choose it. */
#define IN_HOST_CONGESTION "reno"

/* Whether the connection on fd stays on this host: the peer's address is this end's own, or a
 * loopback one. */
static int in_host(int fd) {
  struct sockaddr_storage mine, theirs;
  socklen_t mine_len = sizeof mine, theirs_len = sizeof theirs;
  if (getsockname(fd, (struct sockaddr *)&mine, &mine_len) != 0 ||
      getpeername(fd, (struct sockaddr *)&theirs, &theirs_len) != 0)
    return 0;
  return hoop__is_loopback((const struct sockaddr *)&theirs) ||
         hoop__same_ip((const struct sockaddr *)&mine, (const struct sockaddr *)&theirs);
}

static void tune_socket(hoop__tctx *ctx, int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const char *congestion = state_of(ctx)->congestion;
  if (congestion && !congestion[0])
    congestion = in_host(fd) && !hoop__host_oversubscribed(ctx->comm) ? IN_HOST_CONGESTION : NULL;
  /* A name the user gave was tried on the listener first; auto's is every user's to choose. A
   * refusal here leaves the system's, which moves the same bytes. */
  if (congestion)
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion, (socklen_t)strlen(congestion));
}

/* HOOP_TCP_CONGESTION: auto, system or a congestion control's name, which the kernel must accept
 * on the listener (and so on every connection it accepts). */
static hoop_result choose_congestion(hoop__tctx *ctx, tcp_state *state) {
  const char *value = hoop__env_get("HOOP_TCP_CONGESTION");
  state->congestion = NULL;
  if (strcmp(value, "system") == 0)
    return HOOP_OK;
  if (strcmp(value, "auto") == 0) {
    state->congestion = "";
    return HOOP_OK;
  }
  size_t len = strlen(value);
  if (len == 0 || len >= sizeof state->congestion_name ||
      setsockopt(state->listen_fd, IPPROTO_TCP, TCP_CONGESTION, value, (socklen_t)len) != 0)
    return hoop__set_error(
        ctx->comm, HOOP_ERR_INVALID_ARG,
        "tcp: HOOP_TCP_CONGESTION '%s' is not auto, system or a congestion "
        "control this kernel lets this user choose (%s; see "
        "net.ipv4.tcp_allowed_congestion_control)",
        value, len == 0 || len >= sizeof state->congestion_name ? "not a name" : strerror(errno));
  memcpy(state->congestion_name, value, len + 1);
  state->congestion = state->congestion_name;
  return HOOP_OK;
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
  const char *encrypt = hoop__encrypt_asked(ctx->encrypt) ? ctx->encrypt : "0", *why;
  if (hoop__seal_choose(encrypt, &state->cipher, &why) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG, "tcp: HOOP_ENCRYPT '%s': %s", encrypt,
                           why);

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
  hoop_result chosen_congestion = choose_congestion(ctx, state);
  if (chosen_congestion != HOOP_OK)
    return chosen_congestion;
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

/* {magic, from rank, stream index, streams per peer, cipher}, 16 random bytes, then the link's
 * proof (bound to both ranks, the stream and the generation, and over the bytes before it). Both
 * ends must cut messages over the same number of streams and seal them alike, so a rank whose
 * HOOP_TCP_STREAMS or HOOP_ENCRYPT differs is refused with a message that says so, instead of
 * exchanging misaligned bytes. The random bytes make each connection's answer and keys its own. */
static void encode_handshake(const hoop__tctx *ctx, uint8_t *out, uint32_t to, uint32_t stream,
                             uint32_t nstreams, uint32_t cipher) {
  uint32_t from = (uint32_t)ctx->rank;
  uint32_t words[5] = {htonl(HANDSHAKE_MAGIC), htonl(from), htonl(stream), htonl(nstreams),
                       htonl(cipher)};
  memcpy(out, words, HANDSHAKE_WORDS);
  hoop__auth_random(out + HANDSHAKE_WORDS, HOOP__WIRE_NONCE);
  hoop__link_tag(ctx, HOOP__AUTH_LINK, "tcp", from, to, stream, out,
                 HANDSHAKE_WORDS + HOOP__WIRE_NONCE, out + HANDSHAKE_WORDS + HOOP__WIRE_NONCE);
}

static int handshake_proven(const hoop__tctx *ctx, const uint8_t *hello, uint32_t from,
                            uint32_t stream) {
  return hoop__link_tag_ok(ctx, HOOP__AUTH_LINK, "tcp", from, (uint32_t)ctx->rank, stream, hello,
                           HANDSHAKE_WORDS + HOOP__WIRE_NONCE,
                           hello + HANDSHAKE_WORDS + HOOP__WIRE_NONCE);
}

/* Each way its own key: the pair's MAC of that direction over the handshake, which holds the
 * connector's random bytes, so that no two connections share a key and a record's number never
 * repeats under one. */
hoop_result hoop__tcp_seal_start(hoop__tctx *ctx, int peer, int index, tcp_stream *stream,
                                 const uint8_t *hello) {
  tcp_state *state = state_of(ctx);
  if (state->cipher == HOOP__CIPHER_NONE)
    return HOOP_OK;
  uint8_t tx[HOOP__AUTH_PROOF], rx[HOOP__AUTH_PROOF];
  _Static_assert(HOOP__AUTH_PROOF == HOOP__SEAL_KEY, "a MAC is a key's length");
  int keyed = hoop__link_mac(ctx, HOOP__AUTH_SEAL, "tcp", (uint32_t)ctx->rank, (uint32_t)peer,
                             (uint32_t)index, hello, HOOP__TCP_HANDSHAKE, tx) == 0 &&
              hoop__link_mac(ctx, HOOP__AUTH_SEAL, "tcp", (uint32_t)peer, (uint32_t)ctx->rank,
                             (uint32_t)index, hello, HOOP__TCP_HANDSHAKE, rx) == 0;
  stream->seal = keyed ? malloc(sizeof *stream->seal) : NULL;
  int ready = stream->seal && hoop__seal_init(stream->seal, state->cipher, tx, rx) == 0;
  hoop__auth_wipe(tx, sizeof tx);
  hoop__auth_wipe(rx, sizeof rx);
  if (!ready) {
    free(stream->seal);
    stream->seal = NULL;
    return hoop__fail(ctx->comm, keyed ? HOOP_ERR_SYSTEM : HOOP_ERR_AUTH,
                      keyed ? "tcp: out of memory for an encrypted connection to rank %d"
                            : "tcp: rank %d published a key no pair can be made with",
                      peer);
  }
  return HOOP_OK;
}

/* The acceptor's answer, first on every stream it accepted: the pair's tag of the acceptor's
 * direction over the connector's handshake, which the connector checks before it believes a byte
 * of the stream (data.c), so that no acceptor is unproven. */
int hoop__tcp_reply_ok(const hoop__tctx *ctx, int peer, int index, const tcp_stream *stream) {
  return hoop__link_tag_ok(ctx, HOOP__AUTH_REPLY, "tcp", (uint32_t)peer, (uint32_t)ctx->rank,
                           (uint32_t)index, stream->hello, HOOP__TCP_HANDSHAKE, stream->reply);
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
    tcp_stream *stream = &state->peers[peer].streams[s];
    stream->fd = fd;
    tune_socket(ctx, fd);
    encode_handshake(ctx, stream->hello, (uint32_t)peer, (uint32_t)s, (uint32_t)state->nstreams,
                     (uint32_t)state->cipher);
    if (hoop__write_full(fd, stream->hello, HOOP__TCP_HANDSHAKE, deadline) != 0)
      return hoop__tcp_peer_error(ctx, peer, HOOP_ERR_PEER_LOST, "handshake", errno);
    hoop_result sealed = hoop__tcp_seal_start(ctx, peer, s, stream, stream->hello);
    if (sealed != HOOP_OK)
      return sealed;
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

static const hoop__pending_ops tcp_pending = {"tcp", HOOP__TCP_HANDSHAKE, tcp_admit, tcp_read};

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
  tune_socket(ctx, fd);
  const uint8_t *hello = conn.buf;
  uint32_t words[5];
  memcpy(words, hello, HANDSHAKE_WORDS);
  uint32_t from = ntohl(words[1]), stream = ntohl(words[2]), nstreams = ntohl(words[3]);
  uint32_t cipher = ntohl(words[4]);
  if (ntohl(words[0]) != HANDSHAKE_MAGIC || from >= (uint32_t)ctx->size || (int)from >= ctx->rank ||
      !handshake_proven(ctx, hello, from, stream))
    goto refuse;
  if (nstreams != (uint32_t)state->nstreams || cipher != (uint32_t)state->cipher) {
    close(fd);
    if (cipher != (uint32_t)state->cipher)
      return hoop__fail(ctx->comm, HOOP_ERR_INVALID_ARG,
                        "tcp: rank %u seals its connections with %s but this rank with %s; every "
                        "rank of a job must use the same HOOP_ENCRYPT",
                        from, hoop__seal_cipher_name(cipher),
                        hoop__seal_cipher_name(state->cipher));
    return hoop__fail(ctx->comm, HOOP_ERR_INVALID_ARG,
                      "tcp: rank %u uses HOOP_TCP_STREAMS=%u but this rank uses %d; every rank "
                      "of a job must use the same value",
                      from, nstreams, state->nstreams);
  }
  if (stream >= (uint32_t)state->nstreams || state->peers[from].streams[stream].fd >= 0)
    goto refuse;
  uint8_t reply[HOOP__TCP_REPLY];
  hoop__link_tag(ctx, HOOP__AUTH_REPLY, "tcp", (uint32_t)ctx->rank, from, stream, hello,
                 HOOP__TCP_HANDSHAKE, reply);
  /* A fresh connection's send buffer takes these few bytes at once. */
  if (hoop__write_full(fd, reply, sizeof reply, deadline) != 0) {
    close(fd);
    return hoop__tcp_peer_error(ctx, (int)from, HOOP_ERR_PEER_LOST, "handshake", errno);
  }
  tcp_peer *peer = &state->peers[from];
  tcp_stream *accepted = &peer->streams[stream];
  accepted->fd = fd;
  accepted->reply_got = HOOP__TCP_REPLY; /* it proved itself; this end proves itself by the reply */
  accepted->proven = 1;
  if (hoop__tcp_seal_start(ctx, (int)from, (int)stream, accepted, hello) != HOOP_OK)
    return *ctx->failed;
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
