/* tcp.c - the TCP transport: one listener per rank, several streams per peer, non-blocking sockets
 * driven by one poll()-based progress engine. This file has the transport ops; conn.c sets up the
 * connections, data.c queues messages and moves their bytes, and tcp.h holds what they share.
 *
 * Connections: of each pair of ranks the lower one connects and the higher one accepts; each new
 * stream opens with a handshake {magic, from rank, stream index, job nonce}, so a stranger or a
 * stale rank of another job is turned away. Big messages are striped over the streams; both ends
 * cut a message the same way because both know its length.
 *
 * Frames: on stream 0 every message starts with a frame header {magic, type, length, the call's
 * fingerprint}, sent in the same sendmsg as the payload. The receiver compares length and
 * fingerprint with what it posted before it takes the payload (or, for a header that comes first,
 * the fingerprint with the running call's), so mismatched calls are reported, not hung on or read
 * as data. An empty message is a header alone: calls with no data still send their fingerprint.
 * Two other frames close a connection: NOTICE {code, origin rank, message} when this rank fails or
 * aborts, so that peers say who started it, and BYE at finalize, so that a peer that finished is
 * told apart from one that died. Stream 0 of every connected peer
 * is polled even when no receive is posted, so a notice or a closed connection is seen at once.
 */
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "tcp.h"
#include "util/be.h"
#include "util/sockio.h"

/* A send also reads stream 0 (a notice that a peer failed or aborted may wait there behind its
 * last message) when this long has passed since a send last did; every send would cost a system
 * call per small message that finds nothing. A rank that waits polls stream 0 anyway. */
#define SEND_PEEK_EVERY_S 0.001

/* ---- the ops --------------------------------------------------------------------------------- */

static hoop_result post(hoop__tctx *ctx, int peer, void *buf, size_t len, hoop__transfer *req,
                        int is_send) {
  req->peer = peer;
  req->is_send = is_send;
  hoop__transfer_set_pending(req, 0);
  if (*ctx->failed)
    return *ctx->failed;
  hoop_result result = hoop__tcp_connect(ctx, peer);
  if (result != HOOP_OK)
    return result;
  tcp_state *state = state_of(ctx);
  int n = hoop__tcp_cut_message(state, buf, len, req);
  hoop__transfer_set_pending(req, n);
  int moved = 0;
  /* A receive's stripes past stream 0 are queued once its frame is read and bound to it
   * (data.c's bind_recv): another channel's message may come first. */
  for (int s = 0; s < (is_send ? n : 1); s++) {
    tcp_stream *stream = &state->peers[peer].streams[s];
    if (is_send)
      hoop__tcp_enqueue(&stream->send_head, &stream->send_tail, &tcp_frags(req)[s]);
    else
      hoop__tcp_enqueue(&stream->recv_head, &stream->recv_tail, &tcp_frags(req)[s]);
    /* Move what the kernel takes right away: small messages then never wait for a poll. */
    int reading = 1;
    if (is_send && s == 0) {
      double now = hoop__now();
      reading = now - stream->peeked_at >= SEND_PEEK_EVERY_S;
      if (reading)
        stream->peeked_at = now;
    }
    if ((result = hoop__tcp_drive_stream(ctx, peer, s, reading, &moved)) != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

static hoop_result tcp_isend(hoop__tctx *ctx, int peer, const void *buf, size_t len,
                             hoop__transfer *req) {
  /* The transport never writes through a send buffer; the cast only shares the fragment type. */
  return post(ctx, peer, (void *)(uintptr_t)buf, len, req, 1);
}

static hoop_result tcp_irecv(hoop__tctx *ctx, int peer, void *buf, size_t len,
                             hoop__transfer *req) {
  return post(ctx, peer, buf, len, req, 0);
}

/* What is queued for peer on any of its streams (for the stall warning). */
static int tcp_pending(hoop__tctx *ctx, int peer) {
  tcp_state *state = state_of(ctx);
  int pending = 0;
  for (int s = 0; state->peers && s < state->nstreams && state->peers[peer].connected; s++) {
    if (state->peers[peer].streams[s].recv_head)
      pending |= HOOP__PENDING_RECV;
    if (state->peers[peer].streams[s].send_head)
      pending |= HOOP__PENDING_SEND;
  }
  return pending;
}

static hoop_result tcp_timed_out(hoop__tctx *ctx, const hoop__transfer *req, int in_grace) {
  (void)in_grace;
  return hoop__tcp_peer_error(
      ctx, req->peer, HOOP_ERR_TIMEOUT,
      req->is_send
          ? "no data accepted within the timeout (HOOP_TIMEOUT, or the communicator's own)"
          : "no data received within the timeout (HOOP_TIMEOUT, or the communicator's own)",
      ETIMEDOUT);
}

/* HOOP_TCP_SPIN_US=auto, decided at the first wait, once the rank table says how many ranks share
 * this host. A rank with a CPU of its own spins through a whole message of a MiB or so (2 ranks on
 * loopback, 1 MiB broadcast, p50 over 3 alternated rounds: 209-244 us with a 50 us spin, 165-176
 * with 1 ms, Open MPI's polling 183-188), while ranks that outnumber the CPUs spin briefly and
 * leave the cores to the peers they wait for (4 ranks on 2 CPUs: 1 ms moved 1 MiB broadcasts and
 * allreduces by -12% to +78%). */
#define SPIN_ALONE_S 1e-3
#define SPIN_CROWDED_S 50e-6

static double auto_spin_s(const hoop__tctx *ctx) {
  return hoop__host_oversubscribed(ctx->comm) ? SPIN_CROWDED_S : SPIN_ALONE_S;
}

static double tcp_spin_s(hoop__tctx *ctx) {
  tcp_state *state = state_of(ctx);
  if (state->spin_s < 0) {
    state->spin_s = auto_spin_s(ctx);
    HOOP__TRACE(HOOP_SUBSYS_NET,
                "HOOP_TCP_SPIN_US=auto: %.0f us (%d ranks on this host, %d on its kernel)",
                state->spin_s * 1e6, ctx->local_size, *ctx->kernel_ranks);
  }
  return state->spin_s;
}

/* Before closing: a notice of why (after a failure) or a bye (at finalize). A message half sent
 * on stream 0 is finished first (its buffer is still the running call's) if the peer takes it;
 * else the peer just sees the connection close. After a failure this rank waits for a peer that
 * takes nothing for GOODBYE_WAIT_S (a stopped or dead one), and for one that reads, however slowly
 * (a loaded host), up to BYE_WAIT_S within the timeout. */
#define GOODBYE_WAIT_S 0.5
#define BYE_WAIT_S 30.0

static size_t iov_left(const struct iovec *iov, int n) {
  size_t left = 0;
  for (int i = 0; i < n; i++)
    left += iov[i].iov_len;
  return left;
}

/* hoop__tcp_write_all, giving up after patience_s in which the peer took nothing, or at until. */
static int write_patiently(tcp_stream *stream, struct iovec *iov, int n, double patience_s,
                           double until) {
  for (;;) {
    size_t before = iov_left(iov, n);
    double now = hoop__now(), deadline = now + patience_s < until ? now + patience_s : until;
    if (hoop__tcp_write_all(stream, iov, n, deadline) == 0)
      return 0;
    if (errno != ETIMEDOUT || iov_left(iov, n) == before || hoop__now() >= until)
      return -1;
  }
}

/* When this rank stops waiting for its peers to take its last words. */
static double goodbye_until(const hoop__tctx *ctx) {
  return hoop__now() + (ctx->timeout_s < BYE_WAIT_S ? ctx->timeout_s : BYE_WAIT_S);
}

static void say_goodbye(hoop__tctx *ctx, tcp_stream *control) {
  uint8_t frame[FRAME_BYTES + NOTICE_MAX];
  size_t len = 0;
  /* Under HOOP_ENCRYPT a record may be half written before any of its bytes count as sent. */
  int begun =
      control->send_framed && (control->send_frame_done > 0 || control->send_head->done > 0 ||
                               (control->seal && control->seal->out_len > 0));
  if (begun) {
    hoop__fragment *frag = control->send_head;
    struct iovec rest[2] = {
        {control->send_frame + control->send_frame_done, FRAME_BYTES - control->send_frame_done},
        {frag->buf + frag->done, frag->len - frag->done}};
    if (write_patiently(control, rest, 2, GOODBYE_WAIT_S, goodbye_until(ctx)) != 0)
      return;
  }
  if (*ctx->failed) {
    int origin;
    const char *text;
    hoop__tctx_failure(ctx, &origin, &text);
    len = strlen(text) > NOTICE_MAX ? NOTICE_MAX : strlen(text);
    hoop__frame_encode(frame, FRAME_MAGIC, FRAME_NOTICE, 0, len, NULL);
    hoop__put_be32(frame + 16, (uint32_t)*ctx->failed);
    hoop__put_be32(frame + 20, (uint32_t)origin);
    memcpy(frame + FRAME_BYTES, text, len);
  } else {
    hoop__frame_encode(frame, FRAME_MAGIC, FRAME_BYE, 0, 0, NULL);
  }
  /* A clean goodbye may sit behind this rank's last chunks, which a live peer is still reading
   * (on a loaded host or a slow link that takes more than GOODBYE_WAIT_S); without it the peer
   * would take the close for a crash. So it waits up to BYE_WAIT_S, within the timeout. */
  double until = goodbye_until(ctx);
  struct iovec last = {frame, FRAME_BYTES + len};
  if (write_patiently(control, &last, 1, *ctx->failed ? GOODBYE_WAIT_S : until - hoop__now(),
                      until) != 0)
    HOOP__TRACE(HOOP_SUBSYS_NET, "could not tell a peer why this rank closes: %s", strerror(errno));
}

/* Closing a socket with unread input resets the connection, and a reset throws away what this
 * side had not sent yet: the notice, if the peer was slow to read. So after a failure stream 0 of
 * each connection is half-closed, and every stream is closed (tcp_shutdown) once the peer has
 * taken all of stream 0 (waiting as say_goodbye waits), dropping what it still sends meanwhile.
 * The other streams stay open till then: a peer that saw one of them close before the notice had
 * come on stream 0 would take the close for a crash (test_failures' abort in a large allreduce,
 * once, under load). */
static void drain_before_close(hoop__tctx *ctx, tcp_state *state, int size) {
  double until = goodbye_until(ctx), deadline = hoop__now() + GOODBYE_WAIT_S;
  for (int p = 0; p < size; p++)
    if (state->peers[p].streams[0].fd >= 0)
      shutdown(state->peers[p].streams[0].fd, SHUT_WR);
  long least = -1; /* the fewest bytes stream 0 held unsent so far, all peers together */
  for (double now = hoop__now(); now < deadline && now < until; now = hoop__now()) {
    long unsent = 0;
    for (int p = 0; p < size; p++) {
      for (int s = 0; s < HOOP__MAX_STREAMS; s++) {
        int fd = state->peers[p].streams[s].fd, queued = 0;
        if (fd < 0)
          continue;
        hoop__tcp_discard(fd, 1u << 20);
        /* Only stream 0 carries the notice. A reset connection keeps a stale count. */
        struct tcp_info info;
        socklen_t info_len = sizeof info;
        if (s == 0 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &info_len) == 0 &&
            info.tcpi_state != TCP_CLOSE && ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0)
          unsent += queued;
      }
    }
    if (unsent == 0)
      break;
    if (least < 0 || unsent < least) { /* a peer took some: it is alive, if slow */
      least = unsent;
      deadline = now + GOODBYE_WAIT_S;
    }
    poll(NULL, 0, 1);
  }
}

static void tcp_shutdown(hoop__tctx *ctx) {
  tcp_state *state = state_of(ctx);
  if (!state)
    return;
  for (int p = 0; state->peers && p < ctx->size; p++)
    if (state->peers[p].connected && !state->peers[p].streams[0].eof)
      say_goodbye(ctx, &state->peers[p].streams[0]);
  if (state->peers && *ctx->failed)
    drain_before_close(ctx, state, ctx->size);
  for (int p = 0; state->peers && p < ctx->size; p++) {
    for (int s = 0; s < HOOP__MAX_STREAMS; s++) {
      tcp_stream *stream = &state->peers[p].streams[s];
      if (stream->fd >= 0)
        close(stream->fd);
      if (stream->seal)
        hoop__seal_free(stream->seal);
      free(stream->seal);
      memset(stream, 0, sizeof *stream);
      stream->fd = -1;
    }
    state->peers[p].connected = 0;
    state->peers[p].streams_up = 0;
  }
  hoop__pending_close(&state->pending);
  if (state->listen_fd >= 0)
    close(state->listen_fd);
  state->listen_fd = -1;
}

static void tcp_finalize(hoop__tctx *ctx) {
  tcp_state *state = state_of(ctx);
  if (!state)
    return;
  tcp_shutdown(ctx);
  if (state->wake_fd >= 0)
    close(state->wake_fd);
  hoop__pollset_free(&state->pollset);
  free(state->peers);
  free(state);
  ctx->state = NULL;
}

static void tcp_wake(hoop__tctx *ctx) {
  tcp_state *state = state_of(ctx);
  if (state)
    hoop__wake_signal(state->wake_fd, "tcp");
}

const hoop__transport_ops hoop__tcp_transport = {
    .name = "tcp",
    .auto_role = HOOP__AUTO_MUST,
    .addr_prefix = "",
    .listen = hoop__tcp_listen,
    .connect = hoop__tcp_connect,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .progress = hoop__tcp_progress,
    .sleep_prepare = hoop__tcp_sleep_prepare,
    .sleep_done = hoop__tcp_sleep_done,
    .pending = tcp_pending,
    .timed_out = tcp_timed_out,
    .spin_s = tcp_spin_s,
    .shutdown = tcp_shutdown,
    .wake = tcp_wake,
    .finalize = tcp_finalize,
};
