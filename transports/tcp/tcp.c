/* tcp.c - the TCP transport: one listener per rank, several streams per peer, non-blocking sockets
 * driven by one poll()-based progress engine.
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
#include <arpa/inet.h>
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/env.h"
#include "rdzv/client.h"
#include "transport/transport.h"
#include "util/be32.h"
#include "util/netaddr.h"
#include "util/sockio.h"

#define HANDSHAKE_MAGIC 0x54504f48u /* "HOPT" */
#define HANDSHAKE_BYTES (16 + HOOP_WIRE_NONCE)
/* Messages below this go whole on stream 0: striping them costs more syscalls than it saves. */
#define STRIPE_MIN_BYTES (256 * 1024)
#define STRIPE_ALIGN 4096
/* A stranger that connects and says nothing may hold up an accept this long. */
#define HANDSHAKE_WAIT_S 5.0
/* A send also reads stream 0 (a notice that a peer failed or aborted may wait there behind its
 * last message) when this long has passed since a send last did; every send would cost a system
 * call per small message that finds nothing. A rank that waits polls stream 0 anyway. */
#define SEND_PEEK_EVERY_S 0.001

#define FRAME_MAGIC 0x464f5048u /* "HOPF" */
#define FRAME_BYTES (16 + HOOP_FINGERPRINT_BYTES)
#define NOTICE_MAX 1023
enum frame_type { FRAME_DATA = 1, FRAME_NOTICE = 2, FRAME_BYE = 3 };

typedef struct tcp_stream {
  int fd;
  hoop__fragment *send_head, *send_tail;
  hoop__fragment *recv_head, *recv_tail;
  /* Stream 0 only: the frame header of the message at the head of each queue. */
  uint8_t send_frame[FRAME_BYTES];
  size_t send_frame_done;
  int send_framed; /* send_frame holds the head message's header */
  uint8_t recv_frame[FRAME_BYTES];
  size_t recv_frame_done;
  int recv_checked; /* the complete header was compared with the posted receive */
  char notice[NOTICE_MAX + 1];
  size_t notice_len, notice_done;
  int eof;
  double peeked_at; /* stream 0: when a send last looked for what the peer sent (hoop__now) */
} tcp_stream;

typedef struct tcp_peer {
  int connected;
  int streams_up;
  int said_bye; /* it finalized: its closing is no failure */
  tcp_stream streams[HOOP_MAX_STREAMS];
} tcp_peer;

typedef struct tcp_state {
  int listen_fd;
  int wake_fd; /* an eventfd in every poll set, written by hoop_abort from any thread */
  int nstreams;
  double spin_s; /* HOOP_TCP_SPIN_US: how long a wait polls without sleeping; < 0: auto */
  tcp_peer *peers;
  struct pollfd *pfds;
  struct poll_owner {
    int stream;
    int peer;
  } * pfd_owners; /* pfd_owners[i] is what pfds[i] polls for */
  size_t pfd_cap;
} tcp_state;

static tcp_state *state_of(hoop_comm *comm) {
  return comm->transport_state;
}

/* ---- errors ---------------------------------------------------------------------------------- */

static hoop_result peer_error(hoop_comm *comm, int peer, hoop_result code, const char *what,
                              int err) {
  const hoop__peer_entry *entry = &comm->table.peers[peer];
  /* This rank is fine; the peer is the one that failed, and peers told of it should say so. */
  if (!comm->failed && comm->fail_origin < 0)
    comm->fail_origin = peer;
  return hoop__fail(comm, code, "%s (call #%llu): lost rank %d (%s, host %s): %s: %s",
                    comm->call ? comm->call : "hoop_init", (unsigned long long)comm->seq, peer,
                    entry->addr, entry->host, what, err ? strerror(err) : "connection closed");
}

/* ---- setting up ------------------------------------------------------------------------------ */

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
  state->wake_fd = hoop__wake_open();
  if (state->wake_fd < 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "tcp: eventfd: %s", strerror(errno));
  const char *spin = hoop__env_get("HOOP_TCP_SPIN_US");
  long spin_us = -1;
  if (strcmp(spin, "auto") != 0 && hoop__parse_int(spin, 0, 1000000, &spin_us) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "tcp: HOOP_TCP_SPIN_US '%s' is not auto or a number of microseconds "
                           "(0-1000000)",
                           spin);
  state->spin_s = spin_us < 0 ? -1.0 : (double)spin_us * 1e-6;

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

/* {magic, from rank, stream index, streams per peer} then the job's nonce. Both ends must cut
 * messages over the same number of streams, so a rank whose HOOP_TCP_STREAMS differs is refused
 * with a message that says so, instead of exchanging misaligned bytes. */
static void encode_handshake(uint8_t *out, uint32_t from, uint32_t stream, uint32_t nstreams,
                             const uint8_t *nonce) {
  uint32_t words[4] = {htonl(HANDSHAKE_MAGIC), htonl(from), htonl(stream), htonl(nstreams)};
  memcpy(out, words, 16);
  memcpy(out + 16, nonce, HOOP_WIRE_NONCE);
}

static hoop_result connect_streams(hoop_comm *comm, int peer, double deadline) {
  tcp_state *state = state_of(comm);
  struct sockaddr_storage addr;
  socklen_t addrlen;
  hoop_result resolved = hoop__peer_sockaddr(comm, peer, "tcp", &addr, &addrlen);
  if (resolved != HOOP_OK)
    return resolved;
  for (int s = 0; s < state->nstreams; s++) {
    int fd = hoop__connect_deadline((struct sockaddr *)&addr, addrlen, deadline);
    if (fd < 0)
      return peer_error(comm, peer, errno == ETIMEDOUT ? HOOP_ERR_TIMEOUT : HOOP_ERR_PEER_LOST,
                        "connect", errno);
    state->peers[peer].streams[s].fd = fd;
    uint8_t hello[HANDSHAKE_BYTES];
    encode_handshake(hello, (uint32_t)comm->rank, (uint32_t)s, (uint32_t)state->nstreams,
                     comm->data_nonce);
    if (hoop__write_full(fd, hello, sizeof hello, deadline) != 0)
      return peer_error(comm, peer, HOOP_ERR_PEER_LOST, "handshake", errno);
  }
  state->peers[peer].connected = 1;
  return HOOP_OK;
}

/* Wait until the listener has a connection to accept: HOOP_OK, HOOP_ERR_TIMEOUT at the deadline,
 * or the failure that an abort (this process's, or another rank's told by the rendezvous server)
 * caused meanwhile: a rank that waits for a peer to connect must not miss those for the timeout. */
static hoop_result wait_for_connection(hoop_comm *comm, double deadline) {
  tcp_state *state = state_of(comm);
  for (;;) {
    struct pollfd pfds[3] = {{.fd = state->listen_fd, .events = POLLIN},
                             {.fd = state->wake_fd, .events = POLLIN},
                             {.fd = hoop__rendezvous_fd(comm), .events = POLLIN}};
    double left = deadline - hoop__now();
    if (left <= 0)
      return HOOP_ERR_TIMEOUT;
    int ready = poll(pfds, 3, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR)
      return hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: poll: %s", strerror(errno));
    hoop_result result = HOOP_OK;
    if (ready > 0 && pfds[1].revents) {
      if ((result = hoop__wake_drain(comm, state->wake_fd, "tcp")) != HOOP_OK)
        return result;
      result = hoop__check_abort(comm);
    }
    if (result == HOOP_OK && ready > 0 && pfds[2].revents)
      result = hoop__rendezvous_check(comm);
    if (result != HOOP_OK || comm->failed)
      return result != HOOP_OK ? result : comm->failed;
    if (ready > 0 && pfds[0].revents)
      return HOOP_OK;
  }
}

/* Accept one connection and file it under the rank it names; strangers are closed. */
static hoop_result accept_one(hoop_comm *comm, double deadline) {
  tcp_state *state = state_of(comm);
  hoop_result waited = wait_for_connection(comm, deadline);
  if (waited != HOOP_OK)
    return waited;
  int fd = accept4(state->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0)
    return errno == EAGAIN || errno == EINTR || errno == ECONNABORTED
               ? HOOP_OK
               : hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: accept: %s", strerror(errno));
  tune_socket(fd);
  uint8_t hello[HANDSHAKE_BYTES];
  double wait_until = hoop__now() + HANDSHAKE_WAIT_S;
  uint32_t words[4];
  if (hoop__read_full(fd, hello, sizeof hello, wait_until < deadline ? wait_until : deadline) != 0)
    goto refuse;
  memcpy(words, hello, 16);
  uint32_t from = ntohl(words[1]), stream = ntohl(words[2]), nstreams = ntohl(words[3]);
  if (ntohl(words[0]) != HANDSHAKE_MAGIC ||
      !hoop__auth_equal(hello + 16, comm->data_nonce, HOOP_WIRE_NONCE) ||
      from >= (uint32_t)comm->size || (int)from >= comm->rank)
    goto refuse;
  if (nstreams != (uint32_t)state->nstreams) {
    close(fd);
    return hoop__fail(comm, HOOP_ERR_INVALID_ARG,
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

/* ---- queues ---------------------------------------------------------------------------------- */

/* Cut a message into fragments, one per stream used; returns how many. The parts are len/used
 * rounded up to STRIPE_ALIGN, and the last fragment takes whatever remains, so that every byte is
 * in one fragment whatever the length. An empty message is one empty fragment on stream 0: its
 * frame header, with the call's fingerprint, still travels. */
static int cut_message(tcp_state *state, char *buf, size_t len, hoop__request *req) {
  int used = len < STRIPE_MIN_BYTES ? 1 : state->nstreams;
  size_t share = (len + (size_t)used - 1) / (size_t)used;
  size_t part = (share + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  int n = 0;
  for (int s = 0; s < used; s++) {
    size_t begin = (size_t)s * part;
    if (s > 0 && begin >= len)
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

/* ---- moving bytes ---------------------------------------------------------------------------- */

static void encode_frame(uint8_t *out, uint32_t type, uint64_t len, const uint8_t *fingerprint) {
  hoop__put_be32(out, FRAME_MAGIC);
  hoop__put_be32(out + 4, type);
  hoop__put_be32(out + 8, (uint32_t)(len >> 32));
  hoop__put_be32(out + 12, (uint32_t)len);
  if (fingerprint)
    memcpy(out + 16, fingerprint, HOOP_FINGERPRINT_BYTES);
  else
    memset(out + 16, 0, HOOP_FINGERPRINT_BYTES);
}

static uint64_t frame_len(const uint8_t *frame) {
  return (uint64_t)hoop__get_be32(frame + 8) << 32 | hoop__get_be32(frame + 12);
}

/* Each returns 0 when the kernel asks us to wait (or the queue is empty), else an errno; a peer
 * that closed its end reads as ECONNRESET. On stream 0 (framed) each message goes after its
 * header. */
static int drive_send(tcp_stream *stream, int framed, int *moved) {
  while (stream->send_head) {
    hoop__fragment *frag = stream->send_head;
    struct iovec iov[2];
    int parts = 0;
    if (framed && !stream->send_framed) {
      encode_frame(stream->send_frame, FRAME_DATA, frag->owner->len, frag->owner->fingerprint);
      stream->send_frame_done = 0;
      stream->send_framed = 1;
    }
    size_t header_left = framed ? FRAME_BYTES - stream->send_frame_done : 0;
    if (header_left)
      iov[parts++] = (struct iovec){stream->send_frame + stream->send_frame_done, header_left};
    iov[parts++] = (struct iovec){frag->buf + frag->done, frag->len - frag->done};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)parts};
    ssize_t n = sendmsg(stream->fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      *moved = 1;
      size_t sent = (size_t)n, into_header = sent < header_left ? sent : header_left;
      stream->send_frame_done += into_header;
      frag->done += sent - into_header;
      /* An empty message is done once its header is out. */
      if (frag->done == frag->len && (!framed || stream->send_frame_done == FRAME_BYTES)) {
        stream->send_framed = 0;
        dequeue_done(&stream->send_head, &stream->send_tail);
      }
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

static hoop_result frame_closed(hoop_comm *comm, int peer, tcp_stream *stream, int err) {
  tcp_peer *from = &state_of(comm)->peers[peer];
  stream->eof = 1;
  stream->notice[stream->notice_done] = '\0';
  if (from->said_bye && !stream->recv_head && stream->recv_frame_done == 0)
    return HOOP_OK;
  if (stream->notice_len)
    return hoop__peer_notice(comm, peer, (hoop_result)hoop__get_be32(stream->recv_frame + 16),
                             (int)hoop__get_be32(stream->recv_frame + 20), stream->notice);
  return peer_error(comm, peer, HOOP_ERR_PEER_LOST,
                    from->said_bye ? "receive (it had finalized)" : "receive",
                    err == ECONNRESET ? 0 : err);
}

/* A complete header: a notice or bye is handled here; a data header is compared with the receive
 * posted for it, or, with none posted yet, with the running call (hoop__mismatch_early) and parked
 * until one is. extra bytes of payload came with it into head's buffer. */
static hoop_result take_frame(hoop_comm *comm, int peer, tcp_stream *stream, size_t extra) {
  const uint8_t *frame = stream->recv_frame;
  hoop__fragment *head = stream->recv_head;
  uint32_t type = hoop__get_be32(frame + 4);
  if (hoop__get_be32(frame) != FRAME_MAGIC ||
      (type != FRAME_DATA && extra > 0 && type != FRAME_NOTICE))
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "tcp: rank %d sent a malformed frame", peer);
  if (type == FRAME_BYE) {
    state_of(comm)->peers[peer].said_bye = 1;
    stream->recv_frame_done = 0;
    return HOOP_OK;
  }
  if (type == FRAME_NOTICE) {
    uint64_t len = frame_len(frame);
    if (len == 0) { /* nothing more will come for it: act on it now */
      stream->recv_frame_done = 0;
      return hoop__peer_notice(comm, peer, (hoop_result)hoop__get_be32(frame + 16),
                               (int)hoop__get_be32(frame + 20), "(no reason given)");
    }
    stream->notice_len = len > NOTICE_MAX ? NOTICE_MAX : (size_t)len;
    stream->notice_done = extra < stream->notice_len ? extra : stream->notice_len;
    if (stream->notice_done)
      memcpy(stream->notice, head->buf, stream->notice_done);
    return HOOP_OK;
  }
  if (type != FRAME_DATA)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "tcp: rank %d sent a frame of unknown type %u", peer,
                      type);
  if (!head)
    return hoop__mismatch_early(comm, peer, frame + 16);
  static const uint8_t unchecked[HOOP_FINGERPRINT_BYTES];
  const uint8_t *theirs = frame + 16, *ours = head->owner->fingerprint;
  int compare = memcmp(theirs, unchecked, sizeof unchecked) != 0 &&
                memcmp(ours, unchecked, sizeof unchecked) != 0;
  if ((compare && memcmp(theirs, ours, HOOP_FINGERPRINT_BYTES) != 0) ||
      frame_len(frame) != head->owner->len)
    return hoop__mismatch(comm, peer, theirs, ours, frame_len(frame), head->owner->len);
  stream->recv_checked = 1;
  head->done = extra;
  return HOOP_OK;
}

/* The message at the head of stream 0's receive queue is complete: take it off, ready for the
 * next header. Returns 1 when nothing more is posted: what comes next is read when poll() says it
 * is there, which saves a system call per message. */
static int finish_head(tcp_stream *stream) {
  stream->recv_frame_done = 0;
  stream->recv_checked = 0;
  dequeue_done(&stream->recv_head, &stream->recv_tail);
  return stream->recv_head == NULL;
}

/* Stream 0's receive side: headers, notices and payloads in turn; reads headers even when nothing
 * is posted (at most one header ahead). A payload's first bytes ride with its header's read. */
static hoop_result drive_recv_framed(hoop_comm *comm, int peer, tcp_stream *stream, int *moved) {
  while (!stream->eof) {
    hoop__fragment *head = stream->recv_head;
    struct iovec iov[2];
    int parts = 0;
    int in_notice = stream->notice_len > 0;
    if (in_notice) {
      iov[parts++] = (struct iovec){stream->notice + stream->notice_done,
                                    stream->notice_len - stream->notice_done};
    } else if (stream->recv_frame_done < FRAME_BYTES) {
      iov[parts++] = (struct iovec){stream->recv_frame + stream->recv_frame_done,
                                    FRAME_BYTES - stream->recv_frame_done};
      if (head)
        iov[parts++] = (struct iovec){head->buf, head->len};
    } else if (!head) {
      return HOOP_OK; /* a data header waits for its receive to be posted */
    } else if (!stream->recv_checked) {
      hoop_result result = take_frame(comm, peer, stream, 0);
      if (result != HOOP_OK)
        return result;
      /* An empty message is complete with its header; there is nothing to read for it. */
      if (head->len == 0 && finish_head(stream))
        return HOOP_OK;
      continue;
    } else {
      iov[parts++] = (struct iovec){head->buf + head->done, head->len - head->done};
    }
    if (iov[0].iov_len == 0 && in_notice)
      return frame_closed(comm, peer, stream, 0);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)parts};
    ssize_t n = recvmsg(stream->fd, &msg, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return HOOP_OK;
    if (n <= 0)
      return frame_closed(comm, peer, stream, n < 0 ? errno : ECONNRESET);
    *moved = 1;
    size_t got = (size_t)n;
    if (in_notice) {
      stream->notice_done += got;
    } else if (stream->recv_frame_done < FRAME_BYTES) {
      size_t header_left = FRAME_BYTES - stream->recv_frame_done;
      size_t into_header = got < header_left ? got : header_left;
      stream->recv_frame_done += into_header;
      if (stream->recv_frame_done == FRAME_BYTES) {
        hoop_result result = take_frame(comm, peer, stream, got - into_header);
        if (result != HOOP_OK)
          return result;
      }
    } else {
      head->done += got;
    }
    if (head && stream->recv_checked && head->done == head->len && finish_head(stream))
      return HOOP_OK;
  }
  return stream->recv_head ? frame_closed(comm, peer, stream, 0) : HOOP_OK;
}

/* Bytes of a message of len that travel on stream 0, as cut_message cuts it. */
static size_t stream0_share(const tcp_state *state, uint64_t len) {
  int used = len < STRIPE_MIN_BYTES ? 1 : state->nstreams;
  uint64_t share = (len + (uint64_t)used - 1) / (uint64_t)used;
  uint64_t part = (share + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  return (size_t)(used == 1 || len < part ? len : part);
}

/* Read and drop up to bytes from fd without waiting; 0 when all were there. */
static int discard(int fd, size_t bytes) {
  char sink[65536];
  while (bytes > 0) {
    ssize_t n = recv(fd, sink, bytes < sizeof sink ? bytes : sizeof sink, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    bytes -= (size_t)n;
  }
  return 0;
}

/* The connection to peer broke. A peer that failed sent its reason last on stream 0, behind data
 * this rank may not have asked for yet: read up to it, dropping that data, without waiting. */
static hoop_result read_last_words(hoop_comm *comm, int peer, int *moved) {
  tcp_state *state = state_of(comm);
  tcp_stream *control = &state->peers[peer].streams[0];
  for (int frames = 0; frames < 4096 && !control->eof; frames++) {
    hoop_result result = drive_recv_framed(comm, peer, control, moved);
    if (result != HOOP_OK || comm->failed)
      return result;
    /* Stuck unless a data header waits with nothing posted for it. */
    if (control->recv_frame_done < FRAME_BYTES || control->recv_head || control->notice_len ||
        control->eof)
      break;
    if (discard(control->fd, stream0_share(state, frame_len(control->recv_frame))) != 0)
      break;
    control->recv_frame_done = 0;
  }
  return HOOP_OK;
}

/* Move what the kernel takes and gives on one stream; with reading 0, only its sends. */
static hoop_result drive_stream(hoop_comm *comm, int peer, int index, int reading, int *moved) {
  tcp_stream *stream = &state_of(comm)->peers[peer].streams[index];
  tcp_stream *control = &state_of(comm)->peers[peer].streams[0];
  int err = drive_send(stream, index == 0, moved);
  hoop_result result = HOOP_OK;
  if (!err && reading && index == 0)
    result = drive_recv_framed(comm, peer, stream, moved);
  else if (!err && reading)
    err = drive_recv(stream, moved);
  if (result != HOOP_OK || !err)
    return result;
  /* The connection broke: a peer that failed sent its reason first; read it if it is there. */
  if (!control->eof && (result = read_last_words(comm, peer, moved)) != HOOP_OK)
    return result;
  return peer_error(comm, peer, HOOP_ERR_PEER_LOST, stream->send_head ? "send" : "receive",
                    err == EPIPE || err == ECONNRESET ? 0 : err);
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
  hoop_result result = grow_pollset(comm, (size_t)comm->size * (size_t)state->nstreams + 2);
  if (result != HOOP_OK)
    return result;
  state->pfds[0] = (struct pollfd){.fd = state->wake_fd, .events = POLLIN};
  state->pfd_owners[0] = (struct poll_owner){0, -1};
  /* The rendezvous connection: other ranks' aborts and losses, told by the server. */
  int rdzv_fd = hoop__rendezvous_fd(comm);
  nfds_t n = 1, first_stream = 1;
  if (rdzv_fd >= 0) {
    state->pfds[1] = (struct pollfd){.fd = rdzv_fd, .events = POLLIN};
    state->pfd_owners[1] = (struct poll_owner){0, -1};
    n = first_stream = 2;
  }
  for (int p = 0; p < comm->size; p++) {
    for (int s = 0; s < state->nstreams && state->peers[p].connected; s++) {
      tcp_stream *stream = &state->peers[p].streams[s];
      /* Stream 0 listens for notices and closing even with nothing posted. */
      int reading = stream->recv_head ||
                    (s == 0 && !stream->eof && stream->recv_frame_done < FRAME_BYTES) ||
                    (s == 0 && !stream->eof && stream->notice_len);
      if (!stream->send_head && !reading)
        continue;
      state->pfds[n] = (struct pollfd){
          .fd = stream->fd,
          .events = (short)((stream->send_head ? POLLOUT : 0) | (reading ? POLLIN : 0))};
      state->pfd_owners[n++] = (struct poll_owner){s, p};
    }
  }
  int ready = poll(state->pfds, n, timeout_ms);
  if (ready < 0 && errno != EINTR)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "tcp: poll: %s", strerror(errno));
  if (ready > 0 && state->pfds[0].revents) {
    if ((result = hoop__wake_drain(comm, state->wake_fd, "tcp")) != HOOP_OK ||
        (result = hoop__check_abort(comm)) != HOOP_OK)
      return result;
  }
  if (ready > 0 && first_stream == 2 && state->pfds[1].revents &&
      (result = hoop__rendezvous_check(comm)) != HOOP_OK)
    return result;
  for (nfds_t i = first_stream; i < n && ready > 0; i++) {
    if (!state->pfds[i].revents)
      continue;
    result = drive_stream(comm, state->pfd_owners[i].peer, state->pfd_owners[i].stream, 1, moved);
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
    int reading = 1;
    if (is_send && s == 0) {
      double now = hoop__now();
      reading = now - stream->peeked_at >= SEND_PEEK_EVERY_S;
      if (reading)
        stream->peeked_at = now;
    }
    if ((result = drive_stream(comm, peer, s, reading, &moved)) != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

static hoop_result tcp_isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                             hoop__request *req) {
  /* The transport never writes through a send buffer; the cast only shares the fragment type. */
  return post(comm, peer, (void *)(uintptr_t)buf, len, req, 1);
}

static hoop_result tcp_irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req) {
  return post(comm, peer, buf, len, req, 0);
}

/* What is queued for peer on any of its streams (for the stall warning). */
static int tcp_pending(hoop_comm *comm, int peer) {
  tcp_state *state = state_of(comm);
  int pending = 0;
  for (int s = 0; s < state->nstreams && state->peers[peer].connected; s++) {
    if (state->peers[peer].streams[s].recv_head)
      pending |= HOOP__PENDING_RECV;
    if (state->peers[peer].streams[s].send_head)
      pending |= HOOP__PENDING_SEND;
  }
  return pending;
}

static hoop_result tcp_timed_out(hoop_comm *comm, const hoop__request *req) {
  return peer_error(comm, req->peer, HOOP_ERR_TIMEOUT,
                    req->is_send ? "no data accepted for HOOP_TIMEOUT"
                                 : "no data received for HOOP_TIMEOUT",
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

static double auto_spin_s(const hoop_comm *comm) {
  return hoop__host_oversubscribed(comm) ? SPIN_CROWDED_S : SPIN_ALONE_S;
}

static hoop_result tcp_wait(hoop_comm *comm, hoop__request *req) {
  tcp_state *state = state_of(comm);
  if (state->spin_s < 0) {
    state->spin_s = auto_spin_s(comm);
    HOOP_TRACE(HOOP_SUBSYS_NET, "HOOP_TCP_SPIN_US=auto: %.0f us (%d ranks on this host)",
               state->spin_s * 1e6, comm->local_size);
  }
  hoop__wait_hooks hooks = {state->spin_s, progress, tcp_pending, tcp_timed_out};
  return hoop__wait_loop(comm, req, &hooks);
}

/* Before closing: a notice of why (after a failure) or a bye (at finalize). A message half sent
 * on stream 0 is finished first (its buffer is still the running call's) if the peer takes it
 * within GOODBYE_WAIT_S; else the peer just sees the connection close. */
#define GOODBYE_WAIT_S 0.5
#define BYE_WAIT_S 30.0
static void say_goodbye(hoop_comm *comm, tcp_stream *control) {
  uint8_t frame[FRAME_BYTES + NOTICE_MAX];
  size_t len = 0;
  if (control->send_framed && (control->send_frame_done > 0 || control->send_head->done > 0)) {
    hoop__fragment *frag = control->send_head;
    double deadline = hoop__now() + GOODBYE_WAIT_S;
    if (hoop__write_full(control->fd, control->send_frame + control->send_frame_done,
                         FRAME_BYTES - control->send_frame_done, deadline) != 0 ||
        hoop__write_full(control->fd, frag->buf + frag->done, frag->len - frag->done, deadline) !=
            0)
      return;
  }
  if (comm->failed) {
    const char *text = comm->fail_cause[0] ? comm->fail_cause : hoop_strerror(comm->failed);
    len = strlen(text) > NOTICE_MAX ? NOTICE_MAX : strlen(text);
    encode_frame(frame, FRAME_NOTICE, len, NULL);
    hoop__put_be32(frame + 16, (uint32_t)comm->failed);
    hoop__put_be32(frame + 20, (uint32_t)(comm->fail_origin >= 0 ? comm->fail_origin : comm->rank));
    memcpy(frame + FRAME_BYTES, text, len);
  } else {
    encode_frame(frame, FRAME_BYE, 0, NULL);
  }
  /* A clean goodbye may sit behind this rank's last chunks, which a live peer is still reading
   * (on a loaded host or a slow link that takes more than GOODBYE_WAIT_S); without it the peer
   * would take the close for a crash. So it waits up to BYE_WAIT_S, within the timeout. */
  double wait_s = comm->failed                   ? GOODBYE_WAIT_S
                  : comm->timeout_s < BYE_WAIT_S ? comm->timeout_s
                                                 : BYE_WAIT_S;
  if (hoop__write_full(control->fd, frame, FRAME_BYTES + len, hoop__now() + wait_s) != 0)
    HOOP_TRACE(HOOP_SUBSYS_NET, "could not tell a peer why this rank closes: %s", strerror(errno));
}

/* Closing a socket with unread input resets the connection, and a reset throws away what this
 * side had not sent yet: the notice, if the peer was slow to read. So after a failure each
 * connection is half-closed, and closed once the peer has taken everything (or after
 * GOODBYE_WAIT_S), dropping what it still sends meanwhile. */
static void drain_before_close(tcp_state *state, int size) {
  double deadline = hoop__now() + GOODBYE_WAIT_S;
  for (int p = 0; p < size; p++)
    for (int s = 0; s < HOOP_MAX_STREAMS; s++)
      if (state->peers[p].streams[s].fd >= 0)
        shutdown(state->peers[p].streams[s].fd, SHUT_WR);
  for (int unsent = 1; unsent && hoop__now() < deadline;) {
    unsent = 0;
    for (int p = 0; p < size; p++) {
      for (int s = 0; s < HOOP_MAX_STREAMS; s++) {
        int fd = state->peers[p].streams[s].fd, queued = 0;
        if (fd < 0)
          continue;
        discard(fd, 1u << 20);
        /* Only stream 0 carries the notice. A reset connection keeps a stale count. */
        struct tcp_info info;
        socklen_t info_len = sizeof info;
        if (s == 0 && getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &info_len) == 0 &&
            info.tcpi_state != TCP_CLOSE && ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0)
          unsent = 1;
      }
    }
    if (unsent)
      poll(NULL, 0, 1);
  }
}

static void tcp_shutdown(hoop_comm *comm) {
  tcp_state *state = state_of(comm);
  if (!state)
    return;
  for (int p = 0; state->peers && p < comm->size; p++)
    if (state->peers[p].connected && !state->peers[p].streams[0].eof)
      say_goodbye(comm, &state->peers[p].streams[0]);
  if (state->peers && comm->failed)
    drain_before_close(state, comm->size);
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
  if (state->wake_fd >= 0)
    close(state->wake_fd);
  free(state->pfds);
  free(state->pfd_owners);
  free(state->peers);
  free(state);
  comm->transport_state = NULL;
}

static void tcp_wake(hoop_comm *comm) {
  tcp_state *state = state_of(comm);
  if (state)
    hoop__wake_signal(state->wake_fd, "tcp");
}

const hoop__transport_ops hoop__tcp_transport = {
    .name = "tcp",
    .listen = tcp_listen,
    .connect = tcp_connect,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .wait = tcp_wait,
    .shutdown = tcp_shutdown,
    .wake = tcp_wake,
    .finalize = tcp_finalize,
};
