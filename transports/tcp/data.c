/* data.c - the TCP transport's data path: messages cut into per-stream fragments and queued,
 * bytes moved with non-blocking sendmsg and recvmsg, frame headers and notices on stream 0, and
 * the poll()-based progress engine. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "tcp.h"
#include "util/be.h"

/* Messages below this go whole on stream 0: striping them costs more syscalls than it saves. */
#define STRIPE_MIN_BYTES (256 * 1024)
#define STRIPE_ALIGN 4096

/* ---- queues ---------------------------------------------------------------------------------- */

/* Cut a message into fragments, one per stream used; returns how many. The parts are len/used
 * rounded up to STRIPE_ALIGN, and the last fragment takes whatever remains, so that every byte is
 * in one fragment whatever the length. An empty message is one empty fragment on stream 0: its
 * frame header, with the call's fingerprint, still travels. */
int hoop__tcp_cut_message(tcp_state *state, char *buf, size_t len, hoop__transfer *req) {
  int used = len < STRIPE_MIN_BYTES ? 1 : state->nstreams;
  size_t share = (len + (size_t)used - 1) / (size_t)used;
  size_t part = (share + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  int n = 0;
  for (int s = 0; s < used; s++) {
    size_t begin = (size_t)s * part;
    if (s > 0 && begin >= len)
      break;
    hoop__fragment *frag = &tcp_frags(req)[n++];
    frag->owner = req;
    frag->buf = buf + begin;
    frag->len = len - begin < part || s == used - 1 ? len - begin : part;
    frag->done = 0;
    frag->next = NULL;
  }
  return n;
}

void hoop__tcp_enqueue(hoop__fragment **head, hoop__fragment **tail, hoop__fragment *frag) {
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
  hoop__transfer_set_pending(frag->owner, frag->owner->pending - 1);
}

/* ---- moving bytes ---------------------------------------------------------------------------- */

/* sendmsg and recvmsg on a stream, through its seal under HOOP_ENCRYPT (seal.h). */
static ssize_t stream_send(tcp_stream *stream, struct iovec *iov, int n) {
  if (stream->seal)
    return hoop__seal_send(stream->seal, stream->fd, iov, n);
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
  return sendmsg(stream->fd, &msg, MSG_NOSIGNAL);
}

static ssize_t stream_recv(tcp_stream *stream, struct iovec *iov, int n) {
  if (stream->seal)
    return hoop__seal_recv(stream->seal, stream->fd, iov, n);
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
  return recvmsg(stream->fd, &msg, 0);
}

/* A stream this rank connected: the acceptor's answer comes before anything else on it, and
 * nothing the stream carries is read before the answer proves the peer. 1: proven; 0: not all of
 * it is in yet; -1 with errno (EACCES: it does not prove the peer). */
static int take_reply(hoop__tctx *ctx, int peer, int index, tcp_stream *stream) {
  while (!stream->proven) {
    if (stream->reply_got == HOOP__TCP_REPLY) {
      if (!hoop__tcp_reply_ok(ctx, peer, index, stream)) {
        errno = EACCES;
        return -1;
      }
      stream->proven = 1;
      break;
    }
    ssize_t n =
        recv(stream->fd, stream->reply + stream->reply_got, HOOP__TCP_REPLY - stream->reply_got, 0);
    if (n > 0)
      stream->reply_got += (size_t)n;
    else if (n < 0 && errno == EINTR)
      continue;
    else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    else {
      errno = n < 0 ? errno : ECONNRESET;
      return -1;
    }
  }
  return 1;
}

int hoop__tcp_write_all(tcp_stream *stream, struct iovec *iov, int n, double deadline) {
  while (n > 0) {
    if (iov->iov_len == 0) {
      iov++;
      n--;
      continue;
    }
    ssize_t sent = stream_send(stream, iov, n);
    if (sent < 0 && errno == EINTR)
      continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      double left = deadline - hoop__now();
      struct pollfd pfd = {.fd = stream->fd, .events = POLLOUT};
      if (left <= 0 || (poll(&pfd, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR)) {
        errno = left <= 0 ? ETIMEDOUT : errno;
        return -1;
      }
      continue;
    }
    if (sent < 0)
      return -1;
    for (size_t left = (size_t)sent; left > 0 && n > 0;) {
      size_t take = left < iov->iov_len ? left : iov->iov_len;
      iov->iov_base = (char *)iov->iov_base + take;
      iov->iov_len -= take;
      left -= take;
      if (iov->iov_len == 0) {
        iov++;
        n--;
      }
    }
  }
  return 0;
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
      hoop__frame_encode(stream->send_frame, FRAME_MAGIC, FRAME_DATA, frag->owner->channel,
                         frag->owner->len, frag->owner->fingerprint);
      stream->send_frame_done = 0;
      stream->send_framed = 1;
    }
    size_t header_left = framed ? FRAME_BYTES - stream->send_frame_done : 0;
    if (header_left)
      iov[parts++] = (struct iovec){stream->send_frame + stream->send_frame_done, header_left};
    iov[parts++] = (struct iovec){frag->buf + frag->done, frag->len - frag->done};
    ssize_t n = stream_send(stream, iov, parts);
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
    struct iovec iov = {frag->buf + frag->done, frag->len - frag->done};
    ssize_t n = stream_recv(stream, &iov, 1);
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

static hoop_result frame_closed(hoop__tctx *ctx, int peer, tcp_stream *stream, int err) {
  tcp_peer *from = &state_of(ctx)->peers[peer];
  stream->eof = 1;
  stream->notice[stream->notice_done] = '\0';
  if (from->said_bye && !stream->recv_head && stream->recv_frame_done == 0)
    return HOOP_OK;
  if (stream->notice_len)
    return hoop__peer_notice(ctx->comm, peer, (hoop_result)hoop__get_be32(stream->recv_frame + 16),
                             (int)hoop__get_be32(stream->recv_frame + 20), stream->notice);
  return hoop__tcp_peer_error(ctx, peer, HOOP_ERR_PEER_LOST,
                              from->said_bye ? "receive (it had finalized)" : "receive",
                              err == ECONNRESET ? 0 : err);
}

/* The receive a data frame goes to (see "binding" in transport.h), at the front of stream 0's
 * queue, with its stripes queued on the other streams behind the messages bound before it (a
 * receive's stripes are queued only once its frame is read). NULL when nothing is posted (or out
 * of memory, the failure recorded). */
static hoop__fragment *bind_recv(hoop__tctx *ctx, int peer, tcp_stream *stream) {
  tcp_state *state = state_of(ctx);
  hoop__fragment *head = hoop__frags_bind(&stream->recv_head, &stream->recv_tail,
                                          hoop__frame_channel(stream->recv_frame));
  if (!head && stream->recv_head) {
    char *buf;
    hoop__transfer *stray = hoop__tctx_divert(ctx, peer, stream->recv_frame, &buf);
    if (!stray)
      return NULL;
    hoop__transfer_set_pending(stray, hoop__tcp_cut_message(state, buf, stray->len, stray));
    head = &tcp_frags(stray)[0];
    head->next = stream->recv_head;
    stream->recv_head = head;
  }
  if (!head)
    return NULL;
  /* Nothing of it has moved yet: pending is still its count of fragments. */
  hoop__transfer *req = head->owner;
  for (int s = 1; s < req->pending; s++) {
    tcp_stream *other = &state->peers[peer].streams[s];
    hoop__tcp_enqueue(&other->recv_head, &other->recv_tail, &tcp_frags(req)[s]);
  }
  return head;
}

/* A complete header: a notice or bye is handled here; a data header is bound to its receive and
 * compared with it, or, with none posted yet, compared with the running call
 * (hoop__mismatch_early) and parked until one is. extra bytes of payload came with it into the
 * head receive's buffer (only while one channel runs: see drive_recv_framed). */
static hoop_result take_frame(hoop__tctx *ctx, int peer, tcp_stream *stream, size_t extra) {
  const uint8_t *frame = stream->recv_frame;
  uint32_t type = hoop__frame_type(frame);
  if (hoop__get_be32(frame) != FRAME_MAGIC ||
      (type != FRAME_DATA && extra > 0 && type != FRAME_NOTICE))
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "tcp: rank %d sent a malformed frame", peer);
  if (type == FRAME_BYE) {
    state_of(ctx)->peers[peer].said_bye = 1;
    stream->recv_frame_done = 0;
    return HOOP_OK;
  }
  if (type == FRAME_NOTICE) {
    uint64_t len = hoop__frame_length(frame);
    if (len == 0) { /* nothing more will come for it: act on it now */
      stream->recv_frame_done = 0;
      return hoop__peer_notice(ctx->comm, peer, (hoop_result)hoop__get_be32(frame + 16),
                               (int)hoop__get_be32(frame + 20), "(no reason given)");
    }
    stream->notice_len = len > NOTICE_MAX ? NOTICE_MAX : (size_t)len;
    stream->notice_done = extra < stream->notice_len ? extra : stream->notice_len;
    if (stream->notice_done)
      memcpy(stream->notice, stream->recv_head->buf, stream->notice_done);
    return HOOP_OK;
  }
  if (type != FRAME_DATA)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "tcp: rank %d sent a frame of unknown type %u",
                      peer, type);
  hoop__fragment *posted = stream->recv_head;
  hoop__fragment *head = bind_recv(ctx, peer, stream);
  if (!head)
    return *ctx->failed
               ? *ctx->failed
               : hoop__mismatch_early(ctx->comm, peer, hoop__frame_channel(frame), frame + 16);
  if (extra > 0 && head != posted) /* read into another receive: cannot happen (see above) */
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                      "tcp: a message of rank %d was read into another receive", peer);
  hoop_result result = hoop__frame_check(ctx, peer, frame, head->owner);
  if (result != HOOP_OK)
    return result;
  stream->recv_checked = 1;
  head->done = extra;
  stream->first_at = head->owner->len >= HOOP__LINK_MIN_BYTES ? hoop__now() : 0;
  return HOOP_OK;
}

/* The head message is all in: a large one's time from its header to its last byte is the link's
 * (hoop_comm_stats' goodput by peer). */
static void link_time(hoop__tctx *ctx, int peer, tcp_stream *stream, const hoop__fragment *head) {
  if (stream->first_at > 0 && head->owner)
    hoop__tctx_link_time(ctx, peer, head->owner->len, hoop__now() - stream->first_at);
  stream->first_at = 0;
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
static hoop_result drive_recv_framed(hoop__tctx *ctx, int peer, tcp_stream *stream, int *moved) {
  int proven = stream->eof ? 1 : take_reply(ctx, peer, 0, stream);
  if (proven < 0)
    return errno == EACCES ? hoop__tcp_peer_error(ctx, peer, HOOP_ERR_AUTH, "receive", EACCES)
                           : frame_closed(ctx, peer, stream, errno);
  if (proven == 0)
    return HOOP_OK;
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
      /* The payload's first bytes ride with the header, into the first receive posted: while
       * one channel runs it is the message's. Once several may (a split began), the header is
       * read alone and bound first. */
      if (head && !atomic_load_explicit(ctx->multiplexed, memory_order_relaxed))
        iov[parts++] = (struct iovec){head->buf, head->len};
    } else if (!head) {
      return HOOP_OK; /* a data header waits for its receive to be posted */
    } else if (!stream->recv_checked) {
      hoop_result result = take_frame(ctx, peer, stream, 0);
      if (result != HOOP_OK)
        return result;
      head = stream->recv_head; /* the receive the frame was bound to */
      /* An empty message is complete with its header; there is nothing to read for it. */
      if (head && stream->recv_checked && head->len == 0 && finish_head(stream))
        return HOOP_OK; /* empty: no link time to count */
      continue;
    } else {
      iov[parts++] = (struct iovec){head->buf + head->done, head->len - head->done};
    }
    if (iov[0].iov_len == 0 && in_notice)
      return frame_closed(ctx, peer, stream, 0);
    ssize_t n = stream_recv(stream, iov, parts);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return HOOP_OK;
    if (n <= 0)
      return frame_closed(ctx, peer, stream, n < 0 ? errno : ECONNRESET);
    *moved = 1;
    size_t got = (size_t)n;
    if (in_notice) {
      stream->notice_done += got;
    } else if (stream->recv_frame_done < FRAME_BYTES) {
      size_t header_left = FRAME_BYTES - stream->recv_frame_done;
      size_t into_header = got < header_left ? got : header_left;
      stream->recv_frame_done += into_header;
      if (stream->recv_frame_done == FRAME_BYTES) {
        hoop_result result = take_frame(ctx, peer, stream, got - into_header);
        if (result != HOOP_OK)
          return result;
        head = stream->recv_head; /* the receive the frame was bound to */
      }
    } else {
      head->done += got;
    }
    if (head && stream->recv_checked && head->done == head->len) {
      link_time(ctx, peer, stream, head);
      if (finish_head(stream))
        return HOOP_OK;
    }
  }
  return stream->recv_head ? frame_closed(ctx, peer, stream, 0) : HOOP_OK;
}

/* Bytes of a message of len that travel on stream 0, as hoop__tcp_cut_message cuts it. */
static size_t stream0_share(const tcp_state *state, uint64_t len) {
  int used = len < STRIPE_MIN_BYTES ? 1 : state->nstreams;
  uint64_t share = (len + (uint64_t)used - 1) / (uint64_t)used;
  uint64_t part = (share + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  return (size_t)(used == 1 || len < part ? len : part);
}

/* The same on a stream, through its seal. */
static int discard_stream(tcp_stream *stream, size_t bytes) {
  if (!stream->seal)
    return hoop__tcp_discard(stream->fd, bytes);
  char sink[4096];
  while (bytes > 0) {
    struct iovec iov = {sink, bytes < sizeof sink ? bytes : sizeof sink};
    ssize_t n = stream_recv(stream, &iov, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    bytes -= (size_t)n;
  }
  return 0;
}

/* Read and drop up to bytes from fd without waiting; 0 when all were there. */
int hoop__tcp_discard(int fd, size_t bytes) {
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
static hoop_result read_last_words(hoop__tctx *ctx, int peer, int *moved) {
  tcp_state *state = state_of(ctx);
  tcp_stream *control = &state->peers[peer].streams[0];
  for (int frames = 0; frames < 4096 && !control->eof; frames++) {
    hoop_result result = drive_recv_framed(ctx, peer, control, moved);
    if (result != HOOP_OK || *ctx->failed)
      return result;
    /* Stuck unless a data header waits with nothing posted for it. */
    if (control->recv_frame_done < FRAME_BYTES || control->recv_head || control->notice_len ||
        control->eof)
      break;
    if (discard_stream(control, stream0_share(state, hoop__frame_length(control->recv_frame))) != 0)
      break;
    control->recv_frame_done = 0;
  }
  return HOOP_OK;
}

/* Move what the kernel takes and gives on one stream; with reading 0, only its sends. */
hoop_result hoop__tcp_drive_stream(hoop__tctx *ctx, int peer, int index, int reading, int *moved) {
  tcp_stream *stream = &state_of(ctx)->peers[peer].streams[index];
  tcp_stream *control = &state_of(ctx)->peers[peer].streams[0];
  int err = drive_send(stream, index == 0, moved);
  hoop_result result = HOOP_OK;
  if (!err && reading && index == 0)
    result = drive_recv_framed(ctx, peer, stream, moved);
  else if (!err && reading) {
    int proven = take_reply(ctx, peer, index, stream);
    err = proven < 0 ? errno : proven ? drive_recv(stream, moved) : 0;
  }
  if (result != HOOP_OK || !err)
    return result;
  /* The connection broke: a peer that failed sent its reason first; read it if it is there. */
  if (!control->eof && (result = read_last_words(ctx, peer, moved)) != HOOP_OK)
    return result;
  return hoop__tcp_peer_error(ctx, peer, HOOP_ERR_PEER_LOST, stream->send_head ? "send" : "receive",
                              err == EPIPE || err == ECONNRESET ? 0 : err);
}

/* The poll set: the wake eventfd, the watched descriptor when watch is set, and every stream
 * that has work (stream 0 listens for notices and closing even with nothing posted). */
static hoop_result build_pollset(hoop__tctx *ctx, int watch) {
  tcp_state *state = state_of(ctx);
  hoop__pollset *set = &state->pollset;
  hoop_result result = hoop__pollset_begin(ctx, set, (size_t)ctx->size * (size_t)state->nstreams,
                                           state->wake_fd, watch);
  if (result != HOOP_OK)
    return result;
  /* No peer has a connection yet (their slots come with the first): only the wake and watched
   * descriptors. A rank whose first calls go to peers on its host over shared memory polls here
   * before any (4 ranks per host crashed here at their first allreduce). */
  for (int p = 0; state->peers && p < ctx->size; p++) {
    for (int s = 0; s < state->nstreams && state->peers[p].connected; s++) {
      tcp_stream *stream = &state->peers[p].streams[s];
      int reading = stream->recv_head ||
                    (s == 0 && !stream->eof && stream->recv_frame_done < FRAME_BYTES) ||
                    (s == 0 && !stream->eof && stream->notice_len);
      if (!stream->send_head && !reading)
        continue;
      hoop__pollset_add(set, stream->fd,
                        (short)((stream->send_head ? POLLOUT : 0) | (reading ? POLLIN : 0)), p, s);
    }
  }
  return HOOP_OK;
}

static hoop_result drive_ready(hoop__tctx *ctx, int peer, int stream, int *moved) {
  return hoop__tcp_drive_stream(ctx, peer, stream, 1, moved);
}

/* Act on what the poll set's revents say is ready: the streams first, so that what a peer sent
 * before it aborted (through the rendezvous server) still completes its receive. */
static hoop_result handle_pollset(hoop__tctx *ctx, int *moved) {
  tcp_state *state = state_of(ctx);
  return hoop__pollset_handle(ctx, &state->pollset, state->wake_fd, drive_ready, NULL, moved);
}

/* Under HOOP_ENCRYPT, what a stream's seal holds of what came (a record read whole, of which the
 * receives posted so far took a part) is no longer in the kernel, and poll() would not say it is
 * there: the streams that hold some and have a receive for it are driven before any poll. */
static hoop_result drive_buffered(hoop__tctx *ctx, int *moved) {
  tcp_state *state = state_of(ctx);
  if (state->cipher == HOOP__CIPHER_NONE || !state->peers)
    return HOOP_OK;
  for (int p = 0; p < ctx->size; p++) {
    for (int s = 0; s < state->nstreams && state->peers[p].connected; s++) {
      tcp_stream *stream = &state->peers[p].streams[s];
      int wanted = stream->recv_head || (s == 0 && !stream->eof);
      if (!stream->seal || !wanted || !hoop__seal_buffered(stream->seal))
        continue;
      hoop_result result = hoop__tcp_drive_stream(ctx, p, s, 1, moved);
      if (result != HOOP_OK)
        return result;
    }
  }
  return HOOP_OK;
}

/* One round of the progress engine: poll every stream that has work, for at most timeout_ms, and
 * move what is ready. *moved tells whether any byte moved. */
hoop_result hoop__tcp_progress(hoop__tctx *ctx, int timeout_ms, int *moved) {
  tcp_state *state = state_of(ctx);
  int ready = 0, found = 0;
  hoop_result result = drive_buffered(ctx, &found);
  if (result != HOOP_OK || found) {
    *moved |= found;
    return result;
  }
  result = build_pollset(ctx, 1);
  if (result == HOOP_OK)
    result = hoop__pollset_wait(ctx, &state->pollset, timeout_ms, &ready);
  return result == HOOP_OK && ready > 0 ? handle_pollset(ctx, moved) : result;
}

hoop_result hoop__tcp_sleep_prepare(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved) {
  tcp_state *state = state_of(ctx);
  hoop_result result = drive_buffered(ctx, moved);
  if (result == HOOP_OK)
    result = build_pollset(ctx, 0);
  *fds = state->pollset.fds;
  *n = result == HOOP_OK ? state->pollset.used : 0;
  return result;
}

hoop_result hoop__tcp_sleep_done(hoop__tctx *ctx, int *moved) {
  return handle_pollset(ctx, moved);
}
