/* tcp.h - the TCP transport's private state, shared by its files: conn.c listens, connects,
 * accepts and checks handshakes; data.c queues messages and moves their bytes (the progress
 * engine); tcp.c implements the transport ops. The design is described at the top of tcp.c. */
#ifndef HOOP__TCP_H
#define HOOP__TCP_H

#include <poll.h>

#include "seal.h"
#include "transport/pending.h"
#include "transport/transport.h"

#define FRAME_MAGIC 0x464f5048u /* "HOPF" */
#define FRAME_BYTES HOOP__FRAME_BYTES
#define NOTICE_MAX 1023
#define CONGESTION_NAME_MAX 16 /* the kernel's TCP_CA_NAME_MAX, with its terminating NUL */
enum frame_type { FRAME_DATA = 1, FRAME_NOTICE = 2, FRAME_BYE = 3 };
/* A connection's handshake (conn.c: five words, 16 random bytes, the proof), and the acceptor's
 * answer to it. */
#define HOOP__TCP_HANDSHAKE (20 + 2 * HOOP__WIRE_NONCE)
#define HOOP__TCP_REPLY HOOP__WIRE_NONCE

/* What TCP keeps in a request: a fragment per stream it is striped over. */
typedef struct tcp_request {
  hoop__fragment frags[HOOP__MAX_STREAMS];
} tcp_request;
_Static_assert(sizeof(tcp_request) <= HOOP__TRANSFER_STATE_BYTES,
               "a request's transport state holds TCP's fragments");

static inline hoop__fragment *tcp_frags(hoop__transfer *req) {
  return ((tcp_request *)(void *)req->transport_state)->frags;
}

typedef struct tcp_stream {
  int fd;
  /* A stream this rank connected: its handshake, and the acceptor's answer as it comes; nothing
   * the stream carries is believed before the answer proves the peer (proven). An accepted
   * stream is proven at once. */
  uint8_t hello[HOOP__TCP_HANDSHAKE];
  uint8_t reply[HOOP__TCP_REPLY];
  size_t reply_got;
  int proven;
  hoop__seal *seal; /* HOOP_ENCRYPT: the stream's records (seal.h); NULL in clear */
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
  double first_at;  /* stream 0: when the head message's header came, for one of at least
                       HOOP__LINK_MIN_BYTES (the link's time, hoop__tctx_link_time); 0: none */
} tcp_stream;

typedef struct tcp_peer {
  int connected;
  int streams_up;
  int said_bye; /* it finalized: its closing is no failure */
  tcp_stream streams[HOOP__MAX_STREAMS];
} tcp_peer;

typedef struct tcp_state {
  int listen_fd;
  int wake_fd;           /* an eventfd in every poll set, written by hoop_abort from any thread */
  hoop__pending pending; /* accepted connections whose handshake is not all in */
  int nstreams;
  hoop__cipher cipher; /* HOOP_ENCRYPT: what seals every connection (HOOP__CIPHER_NONE: none) */
  double spin_s;       /* HOOP_TCP_SPIN_US: how long a wait polls without sleeping; < 0: auto */
  /* HOOP_TCP_CONGESTION: the congestion control every connection gets, "" for auto (conn.c's
   * IN_HOST_CONGESTION within a host with a CPU per rank, the system's elsewhere), or NULL for
   * the system's. */
  const char *congestion;
  char congestion_name[CONGESTION_NAME_MAX];
  tcp_peer *peers;
  hoop__pollset pollset; /* owners: a peer and its stream */
} tcp_state;

static inline tcp_state *state_of(hoop__tctx *ctx) {
  return ctx->state;
}

/* conn.c */
/* The connection to peer is lost (err 0: it closed): fail the call, naming the peer. */
hoop_result hoop__tcp_peer_error(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                                 int err);
/* The listen and connect ops. */
hoop_result hoop__tcp_listen(hoop__tctx *ctx, const struct sockaddr *toward, char *addr,
                             size_t addrlen);
hoop_result hoop__tcp_connect(hoop__tctx *ctx, int peer);
/* 1 when the answer the acceptor of this rank's stream index to peer sent proves it. */
int hoop__tcp_reply_ok(const hoop__tctx *ctx, int peer, int index, const tcp_stream *stream);
/* Under HOOP_ENCRYPT, the stream's seal, keyed by the pair's keys and its handshake (hello); a
 * failure (out of memory) fails the communicator. */
hoop_result hoop__tcp_seal_start(hoop__tctx *ctx, int peer, int index, tcp_stream *stream,
                                 const uint8_t *hello);

/* data.c */
/* Cut a message into one fragment per stream used; returns how many. */
int hoop__tcp_cut_message(tcp_state *state, char *buf, size_t len, hoop__transfer *req);
void hoop__tcp_enqueue(hoop__fragment **head, hoop__fragment **tail, hoop__fragment *frag);
/* Read and drop up to bytes from fd without waiting; 0 when all were there. */
int hoop__tcp_discard(int fd, size_t bytes);
/* Write the n pieces of iov on the stream (sealed under HOOP_ENCRYPT, after any record half
 * written), waiting until deadline: 0, or -1 with errno. */
int hoop__tcp_write_all(tcp_stream *stream, struct iovec *iov, int n, double deadline);
/* Move what the kernel takes and gives on one stream; with reading 0, only its sends. */
hoop_result hoop__tcp_drive_stream(hoop__tctx *ctx, int peer, int index, int reading, int *moved);
/* One round of the progress engine (the hoop__wait_hooks progress hook). */
hoop_result hoop__tcp_progress(hoop__tctx *ctx, int timeout_ms, int *moved);
hoop_result hoop__tcp_sleep_prepare(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved);
hoop_result hoop__tcp_sleep_done(hoop__tctx *ctx, int *moved);

#endif /* HOOP__TCP_H */
