/* transport.h - the interface that collectives are written against: point-to-point, non-blocking,
 * in-order byte messages between ranks, with a deadline on every wait.
 *
 * Both ends of a transfer post the same length: collectives are deterministic, so the receiver
 * always knows how much comes. Messages between two ranks arrive in the order they were posted.
 * A transport is an ops table (rdma-core's providers, NCCL's net plugins); transports never know
 * which collective is running.
 */
#ifndef HOOP__TRANSPORT_H
#define HOOP__TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "core/internal.h"

/* TCP connections per peer at most (hoop_config's tcp_streams). */
#define HOOP__MAX_STREAMS 8

/* Bytes of a request that its transport may use as it likes (TCP: a fragment per stream). */
#define HOOP__REQUEST_STATE_BYTES 320

/* One piece of a request in a transport's queue: the whole of it, or one stripe (the TCP
 * transport stripes big messages over its streams). */
typedef struct hoop__fragment {
  struct hoop__request *owner;
  char *buf;
  size_t len;
  size_t done;
  struct hoop__fragment *next; /* the stream's queue */
} hoop__fragment;

typedef struct hoop__request {
  int peer;
  int is_send;
  int pending; /* fragments not finished; 0 when the request is complete */
  size_t len;
  /* The call's fingerprint, opaque to the transport: sent with the message, and compared with
   * the sender's on arrival (all zero: not checked). */
  uint8_t fingerprint[HOOP__FINGERPRINT_BYTES];
  /* The transport's own per-request state (its fragments), opaque here: each transport lays its
   * struct over it and checks at compile time that it fits. Requests never allocate. */
  _Alignas(max_align_t) unsigned char transport_state[HOOP__REQUEST_STATE_BYTES];
} hoop__request;

typedef struct hoop__transport_ops {
  const char *name;
  /* Open a listener on the address that routes toward the rendezvous server (or HOOP_IFNAME's) and
   * write the address peers should use into addr. */
  hoop_result (*listen)(hoop_comm *comm, const struct sockaddr *toward, char *addr, size_t addrlen);
  /* After the rank table is known: connect to peer now (the ring neighbours at init). Transfers to
   * other peers connect on demand. */
  hoop_result (*connect)(hoop_comm *comm, int peer);
  /* len may be 0: an empty message, which still carries the request's fingerprint. */
  hoop_result (*isend)(hoop_comm *comm, int peer, const void *buf, size_t len, hoop__request *req);
  hoop_result (*irecv)(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req);
  /* Make progress until req completes; HOOP_ERR_TIMEOUT if nothing moves it for comm->timeout_s.
   * Besides its own descriptors it polls hoop__rendezvous_fd(comm) (when >= 0) and calls
   * hoop__rendezvous_check when that is readable, so that another rank's abort told by the server
   * ends the wait (rdzv/client.h). */
  hoop_result (*wait)(hoop_comm *comm, hoop__request *req);
  /* Drop every connection and pending request (after a failure, and at abort), first telling
   * each peer why: {comm->failed, comm->fail_origin, comm->fail_cause}. */
  void (*shutdown)(hoop_comm *comm);
  /* Wake a thread blocked in wait; any thread may call it (hoop_abort). */
  void (*wake)(hoop_comm *comm);
  /* Free the transport's state. */
  void (*finalize)(hoop_comm *comm);
  /* Optional (NULL: nothing to do). Prepare a buffer of hoop_register for transfers and return
   * the transport's handle for it in *mem; release it. */
  hoop_result (*register_mem)(hoop_comm *comm, void *ptr, size_t bytes, void **mem);
  void (*deregister_mem)(hoop_comm *comm, void *mem);
  /* Optional. The library is about to free or reuse [ptr, ptr + bytes) of its own memory
   * (comm->scratch): drop whatever the transport keeps for it. */
  void (*forget_mem)(hoop_comm *comm, const void *ptr, size_t bytes);
} hoop__transport_ops;

extern const hoop__transport_ops hoop__tcp_transport;
#ifdef HOOP_HAVE_VERBS
extern const hoop__transport_ops hoop__ibverbs_transport;
#endif

/* Choosing the transport (HOOP_TRANSPORT=auto|tcp|ibverbs). Before the rendezvous each candidate
 * listens and the published address lists one entry per candidate, separated by spaces ("ib:"
 * marks the verbs one); under auto a candidate that cannot listen (no active RDMA port) is left
 * out quietly. Once the rank table is known every rank picks the first transport, verbs before
 * TCP, that every rank offered, so all ranks agree; the others are closed and each table address
 * keeps only the chosen entry. */
/* HOOP_OK if mode names a transport of this build, else the error recorded. */
hoop_result hoop__transport_check(hoop_comm *comm, const char *mode);
hoop_result hoop__transport_listen(hoop_comm *comm, const char *mode, const struct sockaddr *toward,
                                   char *addr, size_t addrlen);
hoop_result hoop__transport_agree(hoop_comm *comm);
/* Free the chosen transport, or every candidate if none was chosen yet. */
void hoop__transport_finalize(hoop_comm *comm);

/* The wait loop both transports share. Being put to sleep and woken costs tens of microseconds on a
 * loaded or virtual machine, several times what a small message takes to cross loopback, so a wait
 * first makes progress without sleeping for spin_s (yielding the CPU between rounds, for ranks
 * that share cores) and only then lets progress sleep. Any movement restarts HOOP_TIMEOUT; past
 * it, timed_out says which peer went silent. Past HOOP_STALL_WARN the peers that still owe or are
 * owed data are named once per call. */
typedef struct hoop__wait_hooks {
  double spin_s;
  /* One round: move what is ready, sleeping at most timeout_ms when nothing is; *moved says
   * whether any byte moved. */
  hoop_result (*progress)(hoop_comm *comm, int timeout_ms, int *moved);
  /* What is queued for peer: HOOP__PENDING_RECV and/or HOOP__PENDING_SEND. */
  int (*pending)(hoop_comm *comm, int peer);
  hoop_result (*timed_out)(hoop_comm *comm, const hoop__request *req);
} hoop__wait_hooks;

#define HOOP__PENDING_RECV 1
#define HOOP__PENDING_SEND 2

hoop_result hoop__wait_loop(hoop_comm *comm, hoop__request *req, const hoop__wait_hooks *hooks);

/* What both transports do alike. The wake eventfd: created non-blocking, written by hoop_abort's
 * thread (wake), and emptied by the waiting thread when poll finds it readable (drain; a read
 * error fails the communicator). name is the transport's, for the messages. */
int hoop__wake_open(void);
void hoop__wake_signal(int fd, const char *name);
hoop_result hoop__wake_drain(hoop_comm *comm, int fd, const char *name);
/* The header both transports put before a message: {u32 magic (the transport's own), u32 type,
 * u64 length, the call's fingerprint (zeros when NULL)}, big-endian like every wire. */
#define HOOP__FRAME_BYTES (16 + HOOP__FINGERPRINT_BYTES)
void hoop__frame_encode(uint8_t *out, uint32_t magic, uint32_t type, uint64_t len,
                        const uint8_t *fingerprint);
uint64_t hoop__frame_length(const uint8_t *frame);

/* peer failed this rank's transfer: fail the communicator with "CALL (call #N): lost rank P
 * (ADDR, host H): WHAT: DETAIL", and count the peer as where the failure began (peers told of
 * it name it, not this rank). */
hoop_result hoop__peer_failed(hoop_comm *comm, int peer, hoop_result code, const char *what,
                              const char *detail);

/* The address peer published in the rank table, resolved; HOOP_ERR_PROTOCOL (recorded) if bad. */
hoop_result hoop__peer_sockaddr(hoop_comm *comm, int peer, const char *name,
                                struct sockaddr_storage *addr, socklen_t *addrlen);

/* Shorthands used by the collectives. Zero-length transfers complete at once. */
hoop_result hoop__isend(hoop_comm *comm, int peer, const void *buf, size_t len, hoop__request *req);
hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req);
hoop_result hoop__wait(hoop_comm *comm, hoop__request *req);
/* Send to one peer and receive from another at the same time, then wait for both. */
hoop_result hoop__sendrecv(hoop_comm *comm, int to, const void *sendbuf, size_t sendlen, int from,
                           void *recvbuf, size_t recvlen);
/* Send an empty message to one peer and receive one from another, then wait for both: nothing but
 * the call's fingerprint travels, for a call that has no data to carry it. */
hoop_result hoop__sendrecv_empty(hoop_comm *comm, int to, int from);

#endif /* HOOP__TRANSPORT_H */
