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

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "core/internal.h"

/* TCP connections per peer at most (hoop_config's tcp_streams). */
#define HOOP__MAX_STREAMS 8

/* Bytes of a transfer that its transport may use as it likes (TCP: a fragment per stream). */
#define HOOP__TRANSFER_STATE_BYTES 320

/* One piece of a transfer in a transport's queue: the whole of it, or one stripe (the TCP
 * transport stripes big messages over its streams). */
typedef struct hoop__fragment {
  struct hoop__transfer *owner;
  char *buf;
  size_t len;
  size_t done;
  struct hoop__fragment *next; /* the stream's queue */
} hoop__fragment;

/* A transfer: one message posted to one peer, a send or a receive, that a transport moves (the
 * public hoop_request is a call's; "request" is only that). */
typedef struct hoop__transfer {
  int peer;
  int is_send;
  /* The communicator whose message it is (hoop_comm_split): 0 for the one hoop_init made. It
   * travels in the frame, and a receive takes only a message of its own channel. */
  uint16_t channel;
  /* Fragments not finished; 0 when the transfer is complete. Written by whichever thread drives
   * the net (holding its lock), read by the thread that waits for it, which may not hold it:
   * through hoop__transfer_pending and hoop__transfer_set_pending below. */
  int pending;
  size_t len;
  /* The call's fingerprint, opaque to the transport: sent with the message, and compared with
   * the sender's on arrival (all zero: not checked). */
  uint8_t fingerprint[HOOP__FINGERPRINT_BYTES];
  /* The transport's own per-transfer state (its fragments), opaque here: each transport lays its
   * struct over it and checks at compile time that it fits. Transfers never allocate. */
  _Alignas(max_align_t) unsigned char transport_state[HOOP__TRANSFER_STATE_BYTES];
} hoop__transfer;

/* A transfer's pending count as its waiter reads it: a read that sees 0 acquires what the thread
 * that completed it delivered (the bytes of a receive). Written with release for the same reason,
 * one writer at a time (the net lock's holder). Both are plain moves on x86. */
static inline int hoop__transfer_pending(const hoop__transfer *req) {
  return __atomic_load_n(&req->pending, __ATOMIC_ACQUIRE);
}
static inline void hoop__transfer_set_pending(hoop__transfer *req, int n) {
  __atomic_store_n(&req->pending, n, __ATOMIC_RELEASE);
}

#define HOOP__PENDING_RECV 1
#define HOOP__PENDING_SEND 2

/* A transport's capabilities. SAME_HOST: the two ranks of a pair share this host, their memory
 * and its descriptors, so one can map what the other exports (device memory by CUDA IPC).
 * REGISTERS: it registers memory (register_mem), device memory included where the NIC can reach
 * it, and moves registered buffers without a copy through the host. */
#define HOOP__TCAP_SAME_HOST 1u
#define HOOP__TCAP_REGISTERS 2u

/* What HOOP_TRANSPORT=auto does with a transport that cannot listen here: MUST, the job fails
 * (the one every pair can fall back on); IF_USABLE, it is left out whatever went wrong;
 * IF_SET_RIGHT, it is left out unless one of its own settings is wrong (HOOP_ERR_INVALID_ARG),
 * which fails the job as any wrong setting does. */
typedef enum hoop__auto_role {
  HOOP__AUTO_MUST,
  HOOP__AUTO_IF_USABLE,
  HOOP__AUTO_IF_SET_RIGHT,
} hoop__auto_role;

/* Transports one rank can listen on at once. */
#define HOOP__MAX_TRANSPORTS 4

struct hoop__transport_ops;

/* What a transport sees of the communicator: its rank and the rank table, the settings it needs,
 * its own state, and an opaque handle that it only hands back to the core's calls (hoop__fail,
 * hoop__mismatch, hoop__peer_notice, hoop__check_abort, ...). */
typedef struct hoop__tctx {
  hoop_comm *comm; /* opaque to the transport */
  const struct hoop__transport_ops *ops;
  void *state;                /* the transport's own */
  int index;                  /* in the communicator's list: registrations keep one handle each */
  int rank, size, local_size; /* rank and local_size: as the rank table says, once known */
  const hoop__table *table;   /* filled by the rendezvous */
  double timeout_s;
  const char *ifname; /* HOOP_IFNAME, "" for the route to the rendezvous */
  int tcp_streams;
  const char *encrypt;       /* HOOP_ENCRYPT's value, as hoop_init took it */
  const uint8_t *data_nonce; /* the job's data key, for hoop__link_proof (core/internal.h) */
  /* This rank's key pair (core/internal.h), and the keys of the pairs it makes, computed once a
   * pair needs them (shared.c; owned by the transport layer's state). */
  const uint8_t *key_public, *key_secret;
  struct hoop__keyring *keyring;
  const hoop_result *failed; /* the communicator's failure, HOOP_OK while it works */
  /* The ranks on this rank's kernel, whatever their network namespaces (0 until the table is
   * agreed; see the kernel_ranks op): for what the transport logs of the host. */
  const int *kernel_ranks;
  /* A descriptor the core wants watched while the transport sleeps (the rendezvous connection:
   * other ranks' aborts and losses), -1 for none; read it at each poll, as the core may close it.
   * A transport that polls adds it and, when it is readable, calls hoop__tctx_watched. */
  const int *watch_fd;
  /* Raised once this rank has begun to split a communicator: from then on messages of several
   * channels may arrive on one connection, and a frame is bound to its receive only once read (see
   * "binding" below). */
  const atomic_int *multiplexed;
} hoop__tctx;

typedef struct hoop__transport_ops {
  const char *name;
  /* Marks this transport's entry among the published address's ("ib:"); "" for none. */
  const char *addr_prefix;
  /* What the pairs it serves offer besides messages (HOOP__TCAP_*): the tuning table's device
   * paths are chosen by these, never by a transport's name. */
  unsigned caps;
  /* Under HOOP_TRANSPORT=auto: what a failure to listen does (hoop__auto_role); why the job uses
   * this transport alone when it serves every peer ("every peer is on this host"), NULL for the
   * one every pair falls back on; and, for a transport that is left out when it cannot listen,
   * why that would be ("no active RDMA port here"), NULL if not worth saying. */
  hoop__auto_role auto_role;
  const char *auto_alone;
  const char *auto_absent;
  /* Optional (NULL: it cannot tell). The ranks on this rank's kernel, whatever their network
   * namespaces, as this transport's entries in the rank table tell; called before agree keeps
   * only the chosen entries. */
  int (*kernel_ranks)(const hoop__tctx *ctx);
  /* Open a listener on the address that routes toward the rendezvous server (or HOOP_IFNAME's) and
   * write the address peers should use into addr. */
  hoop_result (*listen)(hoop__tctx *ctx, const struct sockaddr *toward, char *addr, size_t addrlen);
  /* After the rank table is known, for a peer that published an entry of this transport: whether
   * this transport serves the pair. Both ends must answer alike from the table. NULL: yes. */
  int (*can_reach)(const hoop__tctx *ctx, int peer);
  /* Connect to peer now (the ring neighbours at init). Transfers to other peers connect on
   * demand. */
  hoop_result (*connect)(hoop__tctx *ctx, int peer);
  /* len may be 0: an empty message, which still carries the transfer's fingerprint. */
  hoop_result (*isend)(hoop__tctx *ctx, int peer, const void *buf, size_t len, hoop__transfer *req);
  hoop_result (*irecv)(hoop__tctx *ctx, int peer, void *buf, size_t len, hoop__transfer *req);
  /* The shared wait loop's hooks. One round: move what is ready, sleeping at most timeout_ms when
   * nothing is (watching ctx->watch_fd too); *moved says whether any byte moved. */
  hoop_result (*progress)(hoop__tctx *ctx, int timeout_ms, int *moved);
  /* Optional, both or neither: sleeping in one poll with the other transports that serve peers
   * (a job whose peers are on several transports; without them such a job naps 1 ms when idle).
   * sleep_prepare readies the transport for the sleep as its own progress would before polling
   * (raise flags, arm notifications, look once more) and hands back its poll set, an array of its
   * own, without the watched descriptor (the core polls that once for all); it sets *moved if
   * looking once more found work, and then nobody sleeps. The core writes the poll's revents back
   * into the array (zeros when it did not poll) and calls sleep_done, which acts on them and
   * undoes the preparation, after every sleep_prepare that returned HOOP_OK. */
  hoop_result (*sleep_prepare)(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved);
  hoop_result (*sleep_done)(hoop__tctx *ctx, int *moved);
  /* What is queued for peer: HOOP__PENDING_RECV and/or HOOP__PENDING_SEND. */
  int (*pending)(hoop__tctx *ctx, int peer);
  /* Nothing moved req for HOOP_TIMEOUT: fail, naming the peer. A transport that can tell a peer
   * that runs (and so waits for another rank itself) from one that is stopped may return HOOP_OK
   * once (in_grace 0): the wait goes on for a twentieth of the timeout (at most 50 ms), so that
   * the notice of the rank nearest the stopped one, which times out first, tells the story. */
  hoop_result (*timed_out)(hoop__tctx *ctx, const hoop__transfer *req, int in_grace);
  /* How long a wait makes progress without sleeping (see hoop__wait). */
  double (*spin_s)(hoop__tctx *ctx);
  /* Optional. How many of its peers this transport sees asleep in a wait now (shared memory: a
   * peer's sleeping flag up): a wait on a host whose ranks outnumber its CPUs gives the CPU up
   * between rounds only while the ranks awake still outnumber them. */
  int (*asleep_peers)(hoop__tctx *ctx);
  /* Drop every connection and pending transfer (after a failure, and at abort), first telling
   * each peer why (hoop__tctx_failure). */
  void (*shutdown)(hoop__tctx *ctx);
  /* Wake a thread blocked in progress; any thread may call it (hoop_abort). */
  void (*wake)(hoop__tctx *ctx);
  /* Free the transport's state. */
  void (*finalize)(hoop__tctx *ctx);
  /* Optional (NULL: nothing to do). Prepare a buffer of hoop_register for transfers and return
   * the transport's handle for it in *mem; release it. */
  hoop_result (*register_mem)(hoop__tctx *ctx, void *ptr, size_t bytes, void **mem);
  void (*deregister_mem)(hoop__tctx *ctx, void *mem);
  /* Optional. The library is about to free or reuse [ptr, ptr + bytes) of its own memory (its
   * scratch, hoop__tctx_scratch; the stage of device buffers; the IPC path's host memory): drop
   * whatever the transport keeps for it. */
  void (*forget_mem)(hoop__tctx *ctx, const void *ptr, size_t bytes);
  /* Optional, all or none (NULL: no boards). A board is a segment that every rank of a
   * communicator maps, all of them served by this transport, for its small calls
   * (transport/board.c). board_create, on the communicator's lowest rank: make a segment of bytes,
   * map it into *map, and hand it to each other rank of ranks (net's, n of them, this one among
   * them) over its pair, or tell them it could not (*map NULL then). board_attach, on the others:
   * once the board of channel came from creator, *settled is 1 and *map holds it mapped (NULL:
   * creator could not make it, or this rank could not map it); *settled 0 while it has not come.
   * The pairs are connected before either runs. */
  hoop_result (*board_create)(hoop__tctx *ctx, uint16_t channel, const int *ranks, int n,
                              size_t bytes, void **map);
  hoop_result (*board_attach)(hoop__tctx *ctx, uint16_t channel, int creator, size_t bytes,
                              void **map, int *settled);
  /* A watch: req completes once *word, a word of a board that peer raises, is at least value.
   * Progress looks at it as at a receive, a wait on it sleeps as on one, and the peer's death or
   * goodbye fails it. */
  hoop_result (*board_watch)(hoop__tctx *ctx, int peer, const _Atomic uint64_t *word,
                             uint64_t value, hoop__transfer *req);
  /* After raising a word of a board that the n peers (net's ranks) may watch: wake those that
   * sleep. */
  void (*board_wake)(hoop__tctx *ctx, const int *peers, int n);
} hoop__transport_ops;

extern const hoop__transport_ops hoop__shm_transport;
extern const hoop__transport_ops hoop__tcp_transport;
#ifdef HOOP_HAVE_VERBS
extern const hoop__transport_ops hoop__ibverbs_transport;
#endif

/* ---- the core's side, for transports ----------------------------------------------------------
 */

/* Whether rank published an address entry for this transport (valid until agree keeps only the
 * chosen entry of each address). */
int hoop__tctx_offered(const hoop__tctx *ctx, int rank);
/* That entry, without the transport's prefix, copied to out; 0 if rank offered one. */
int hoop__tctx_entry(const hoop__tctx *ctx, int rank, char *out, size_t outlen);
/* The watched descriptor was readable: read it; HOOP_OK, or the failure it told of. */
hoop_result hoop__tctx_watched(hoop__tctx *ctx);
/* Why the communicator failed, for the notice a transport sends its peers: the rank where it
 * began and that rank's message. */
void hoop__tctx_failure(const hoop__tctx *ctx, int *origin, const char **cause);
/* The library's scratch, what algorithms on host memory receive into, as it is now (NULL, 0 when
 * none). */
void hoop__tctx_scratch(const hoop__tctx *ctx, void **ptr, size_t *bytes);
/* The handle this transport made of a registration covering [ptr, ptr + len); NULL if none. */
void *hoop__tctx_registered(const hoop__tctx *ctx, const void *ptr, size_t len);

/* ---- the transport layer, for the core --------------------------------------------------------
 */

/* Choosing transports (HOOP_TRANSPORT=auto|shm|tcp|ibverbs). Before the rendezvous each candidate,
 * in priority order (verbs before TCP), listens, and the published address lists one entry per
 * candidate, separated by spaces, each marked by its transport's prefix; under auto a candidate
 * that cannot listen (no active RDMA port, HOOP_SHM=0) is left out quietly. Once the rank table is
 * known each peer gets the first transport that both ends offered and that can reach it; every rank
 * decides from the same table, so both ends of a pair agree. Transports that serve nobody are
 * closed. */
/* HOOP_OK if mode names a transport of this build, else the error recorded. */
hoop_result hoop__transport_check(hoop_comm *comm, const char *mode);
hoop_result hoop__transport_listen(hoop_comm *comm, const char *mode, const struct sockaddr *toward,
                                   char *addr, size_t addrlen);
hoop_result hoop__transport_agree(hoop_comm *comm);
/* The transport of peer's pair (after agree). */
hoop__tctx *hoop__transport_of(const hoop_comm *comm, int peer);
hoop_result hoop__transport_connect(hoop_comm *comm, int peer);
/* Every transport: shutdown (after a failure), wake (hoop_abort's thread), forget one of the
 * library's buffer, finalize (closing them all). */
void hoop__transports_shutdown(hoop_comm *comm);
void hoop__transports_wake(hoop_comm *comm);
void hoop__transports_forget_mem(hoop_comm *comm, const void *ptr, size_t bytes);
void hoop__transport_finalize(hoop_comm *comm);

/* The layer's state of a communicator (transport/state.h): made with it (NULL: out of memory) and
 * freed with it last. A view's: its pairs' transports, from net's (after its net_rank_of; an error
 * when out of memory), then net's transports themselves once the view is made (never finalized
 * through the view). */
hoop__transport_state *hoop__transport_state_new(void);
void hoop__transport_state_free(hoop_comm *comm);
hoop_result hoop__transport_view(hoop_comm *view, const hoop_comm *net);
void hoop__transport_view_join(hoop_comm *view, const hoop_comm *net);
/* The transports this rank listens on (0 before listen, or in a job of one rank), the t-th,
 * the index of peer's pair's; whether the pairs are chosen (after agree). */
int hoop__transport_count(const hoop_comm *comm);
hoop__tctx *hoop__transport_at(const hoop_comm *comm, int t);
int hoop__transport_of_peer(const hoop_comm *comm, int peer);
int hoop__transports_up(const hoop_comm *comm);
/* "tcp", "ibverbs", or "ibverbs+tcp" when pairs differ, for the log. */
const char *hoop__transport_names(const hoop_comm *comm, char *out, size_t outlen);
/* The transports that serve this rank's peers, "shm+tcp"; "none" on one rank. */
const char *hoop__transports_serving(const hoop_comm *comm, char *out, size_t len);

/* ---- shared by the transports -----------------------------------------------------------------
 */

/* A transport's poll set (transport/pollset.c), the one every transport builds and handles the
 * same way: its wake eventfd first, the watched descriptor (ctx->watch_fd) where asked, then the
 * transport's own descriptors, each with an owner, two ints the transport gives meaning to (a peer
 * and a stream). Zeroed is empty; hoop__pollset_free frees it. */
#define HOOP__POLL_WAKE (-1)
#define HOOP__POLL_WATCHED (-2)
typedef struct hoop__poll_owner {
  int peer; /* or HOOP__POLL_WAKE, HOOP__POLL_WATCHED */
  int stream;
} hoop__poll_owner;
typedef struct hoop__pollset {
  struct pollfd *fds;
  hoop__poll_owner *owners;
  size_t cap;
  nfds_t used; /* entries of the last set built */
} hoop__pollset;

/* Start a set with room for own more descriptors: wake_fd, and the watched descriptor if watch
 * and there is one. Out of memory fails the communicator, naming the transport. */
hoop_result hoop__pollset_begin(hoop__tctx *ctx, hoop__pollset *set, size_t own, int wake_fd,
                                int watch);
/* One of the transport's own descriptors (within the room begin made). */
static inline void hoop__pollset_add(hoop__pollset *set, int fd, short events, int peer,
                                     int stream) {
  set->fds[set->used] = (struct pollfd){.fd = fd, .events = events};
  set->owners[set->used++] = (hoop__poll_owner){peer, stream};
}
/* poll(2) over the set for at most timeout_ms: *ready descriptors (0 when it ran out or a signal
 * came). A failed poll fails the communicator, naming the transport. */
hoop_result hoop__pollset_wait(hoop__tctx *ctx, hoop__pollset *set, int timeout_ms, int *ready);
/* Act on the set's revents: drive(ctx, peer, stream, moved) for each of the transport's own that
 * is ready, in the set's order; then the wake eventfd drained and an abort looked at; then, if the
 * watched descriptor is readable, before_watched (NULL: nothing; what peers sent before the
 * server's news still completes its receives) and hoop__tctx_watched. Stops at the first failure.
 */
hoop_result
hoop__pollset_handle(hoop__tctx *ctx, hoop__pollset *set, int wake_fd,
                     hoop_result (*drive)(hoop__tctx *ctx, int peer, int stream, int *moved),
                     hoop_result (*before_watched)(hoop__tctx *ctx, int *moved), int *moved);
void hoop__pollset_free(hoop__pollset *set);

/* The keys of the pairs this rank makes (shared.c): for each peer of the table, tx and rx of
 * hoop__auth_pair_keys, once a connection needed them; known[peer] 1 when computed, -1 when the
 * peer's published key was unusable. */
typedef struct hoop__keyring {
  int size;
  int8_t *known;
  uint8_t (*keys)[2][HOOP__AUTH_KEY];
} hoop__keyring;
void hoop__keyring_free(hoop__keyring *ring);

/* What a data connection presents: HMAC-SHA256 keyed by the key of the pair from -> to (which
 * only those two ranks can compute: neither a stranger nor another member can stand in for
 * either), over the transport's name, both ranks (from connects or writes, to reads), the stream,
 * the table's generation and the job's data key (ctx->data_nonce), cut to HOOP__WIRE_NONCE bytes.
 * No key crosses the wire, and bytes seen on one connection open no other: another pair, stream,
 * transport or generation wants other bytes, and this one's slot is taken by then. ok: 1 when got
 * is what from must present to to. One of from and to must be this rank. */
void hoop__link_proof(const hoop__tctx *ctx, const char *transport, uint32_t from, uint32_t to,
                      uint32_t stream, uint8_t *out);
int hoop__link_proof_ok(const hoop__tctx *ctx, const char *transport, uint32_t from, uint32_t to,
                        uint32_t stream, const uint8_t *got);
/* The same MAC for another purpose (proto/auth.h's HOOP__AUTH_*), over bind_len more bytes (a
 * handshake it answers or keys), whole (HOOP__AUTH_PROOF bytes): an acceptor's answer
 * (HOOP__AUTH_REPLY, proving it back to the connector) and an encrypted connection's keys
 * (HOOP__AUTH_SEAL). 0, or -1 (out random) when the pair has no usable key. */
int hoop__link_mac(const hoop__tctx *ctx, const char *purpose, const char *transport, uint32_t from,
                   uint32_t to, uint32_t stream, const uint8_t *bind, size_t bind_len,
                   uint8_t out[HOOP__AUTH_PROOF]);
/* The same cut to HOOP__WIRE_NONCE bytes, as handshakes carry it (link_proof's is the
 * HOOP__AUTH_LINK one over nothing more); ok: 1 when got is it. */
void hoop__link_tag(const hoop__tctx *ctx, const char *purpose, const char *transport,
                    uint32_t from, uint32_t to, uint32_t stream, const uint8_t *bind,
                    size_t bind_len, uint8_t *out);
int hoop__link_tag_ok(const hoop__tctx *ctx, const char *purpose, const char *transport,
                      uint32_t from, uint32_t to, uint32_t stream, const uint8_t *bind,
                      size_t bind_len, const uint8_t *got);

/* Whether a setting of HOOP_ENCRYPT (ctx->encrypt; NULL or "" for unset) asks for sealing: not 0
 * or no. Whether the value names a cipher is the TCP transport's to say. */
static inline int hoop__encrypt_asked(const char *value) {
  return value && value[0] && strcmp(value, "0") != 0 && strcmp(value, "no") != 0;
}

/* What both transports do alike. The wake eventfd: created non-blocking, written by hoop_abort's
 * thread (wake), and emptied by the waiting thread when poll finds it readable (drain; a read
 * error fails the communicator). name is the transport's, for the messages. */
int hoop__wake_open(void);
void hoop__wake_signal(int fd, const char *name);
hoop_result hoop__wake_drain(hoop__tctx *ctx, int fd, const char *name);
/* Wait until listen_fd has a connection to accept: HOOP_OK, HOOP_ERR_TIMEOUT past the deadline,
 * or the failure that an abort (this process's, seen on wake_fd, or another rank's told by the
 * rendezvous server on the watched descriptor) caused meanwhile: a rank that waits for a peer to
 * connect must not miss those for the timeout. */
hoop_result hoop__wait_listener(hoop__tctx *ctx, int listen_fd, int wake_fd, const char *name,
                                double deadline);
/* The header every transport puts before a message: {u32 magic (the transport's own), u16 channel
 * (the communicator's, hoop__transfer.channel), u16 type, u64 length, the call's fingerprint (zeros
 * when NULL)}, big-endian like every wire. */
#define HOOP__FRAME_BYTES (16 + HOOP__FINGERPRINT_BYTES)
void hoop__frame_encode(uint8_t *out, uint32_t magic, uint32_t type, uint16_t channel, uint64_t len,
                        const uint8_t *fingerprint);
uint64_t hoop__frame_length(const uint8_t *frame);
uint32_t hoop__frame_type(const uint8_t *frame);
uint16_t hoop__frame_channel(const uint8_t *frame);

/* Binding. Messages between two ranks arrive in the order they were sent, but with several
 * communicators on one connection (hoop_comm_split) the receiver's threads may post their
 * receives in another order. So a data frame, once read, goes to the first posted receive of its
 * channel (hoop__frags_bind moves it to the front of a queue of fragments); if receives of other
 * channels wait and none of its own, it is diverted into a buffer of the core's
 * (hoop__tctx_divert), which a receive posted later takes; with nothing posted for the peer it
 * waits, as before. With one communicator the first posted receive is always the one. */
hoop__fragment *hoop__frags_bind(hoop__fragment **head, hoop__fragment **tail, uint16_t channel);
/* A receive for a diverted message from peer (frame, already read): the transport sets up its own
 * state in it as for a posted receive and puts it first. Its buffer in *buf. NULL when out of
 * memory (the failure recorded). */
hoop__transfer *hoop__tctx_divert(hoop__tctx *ctx, int peer, const uint8_t *frame, char **buf);
/* A frame from peer against the receive it arrived for: HOOP_OK when their lengths agree and so
 * do the fingerprints (where both sides carry one), else HOOP_ERR_MISMATCH naming both calls. */
hoop_result hoop__frame_check(hoop__tctx *ctx, int peer, const uint8_t *frame,
                              const hoop__transfer *req);

/* peer failed this rank's transfer: fail the communicator with "CALL (call #N): lost rank P
 * (ADDR, host H): WHAT: DETAIL", and count the peer as where the failure began (peers told of
 * it name it, not this rank). */
hoop_result hoop__peer_failed(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                              const char *detail);

/* The address peer published in the rank table, resolved; HOOP_ERR_PROTOCOL (recorded) if bad. */
hoop_result hoop__peer_sockaddr(hoop__tctx *ctx, int peer, const char *name,
                                struct sockaddr_storage *addr, socklen_t *addrlen);

/* ---- what the collectives call ----------------------------------------------------------------
 */

/* Zero-length transfers complete at once. hoop__wait is the wait loop every transport shares.
 * Being put to sleep and woken costs tens of microseconds on a loaded or virtual machine, several
 * times what a small message takes to cross loopback, so a wait first makes progress without
 * sleeping for the transports' spin_s (yielding the CPU between rounds, for ranks that share
 * cores) and only then lets progress sleep. Any movement restarts HOOP_TIMEOUT; past it, the
 * waited-for peer's transport says which peer went silent. Past HOOP_STALL_WARN the peers that
 * still owe or are owed data are named once per call. The rendezvous connection is watched
 * throughout: another rank's abort told by the server ends the wait. */
hoop_result hoop__isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                        hoop__transfer *req);
hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__transfer *req);
hoop_result hoop__wait(hoop_comm *comm, hoop__transfer *req);
/* The same wait in slices: it returns HOOP_OK with the transfer still pending after slice_s (0:
 * not before it ends), keeping in *state (zeroed before the first slice) when the transfer last
 * moved and when its spin ends, so that HOOP_TIMEOUT and the spin count across slices. */
typedef struct hoop__wait_state {
  int started, in_grace;
  int clocked; /* the wait read the clock (it did not end within its first rounds) */
  double deadline, spin_until;
} hoop__wait_state;
hoop_result hoop__wait_some(hoop_comm *comm, hoop__transfer *req, double slice_s,
                            hoop__wait_state *state);
/* One round of progress for req without sleeping (hoop_test, the progress thread), its
 * HOOP_TIMEOUT kept in *state as hoop__wait_some keeps it: a transfer only ever polled still fails
 * naming its peer once nothing has moved for the timeout. */
hoop_result hoop__poll_some(hoop_comm *comm, hoop__transfer *req, hoop__wait_state *state);
/* The same, but a zero length still travels as an empty message, so that the receiver checks
 * every length against what it posted (sizes that each pair chooses, as all-to-all's). */
hoop_result hoop__isend_framed(hoop_comm *comm, int peer, const void *buf, size_t len,
                               hoop__transfer *req);
hoop_result hoop__irecv_framed(hoop_comm *comm, int peer, void *buf, size_t len,
                               hoop__transfer *req);
/* A framed send (is_send) or receive that carries and checks the given fingerprint rather than
 * the running call's: point-to-point messages, whose count, dtype and tag are always checked. */
hoop_result hoop__ipost_marked(hoop_comm *comm, int is_send, int peer, void *buf, size_t len,
                               const uint8_t *fingerprint, hoop__transfer *req);
/* The transports, for comm: under the net lock, naming comm's call in their failures; the end
 * adopts into a view what went wrong below it, and gives back result. */
const hoop_comm *hoop__drive_begin(hoop_comm *comm);
hoop_result hoop__drive_end(hoop_comm *comm, const hoop_comm *outer, hoop_result result);
/* A watch of comm's rank peer (transport ops' board_watch), which hoop__wait waits for. */
hoop_result hoop__watch(hoop_comm *comm, int peer, const _Atomic uint64_t *word, uint64_t value,
                        hoop__transfer *req);
/* One round of every transport's progress without sleeping (the communicator's failure, if any):
 * what a rank busy with something else calls so that its peers' transfers go on. */
hoop_result hoop__progress_once(hoop_comm *comm);
/* Send to one peer and receive from another at the same time, then wait for both. */
hoop_result hoop__sendrecv(hoop_comm *comm, int to, const void *sendbuf, size_t sendlen, int from,
                           void *recvbuf, size_t recvlen);
/* Send an empty message to one peer and receive one from another, then wait for both: nothing but
 * the call's fingerprint travels, for a call that has no data to carry it. */
hoop_result hoop__sendrecv_empty(hoop_comm *comm, int to, int from);

/* ---- the board: a communicator's small calls through one shared segment (board.c) ------------
 *
 * Every rank of a communicator whose pairs all share one host may map one segment, the board: per
 * rank a done word and HOOP__BOARD_SLOTS slots of HOOP__BOARD_PAYLOAD bytes each, written by that
 * rank alone. The communicator's calls on the board are numbered alike on every rank (seq, from
 * 1); call seq writes slot seq % HOOP__BOARD_SLOTS. A rank publishes its slot by its sequence
 * number (with the call's fingerprint, which readers compare with theirs), after the payload;
 * readers wait for that number and read the payload in place. A slot is written again only once
 * every rank is done with the call that last wrote it (hoop__board_claim): a broadcast's root runs
 * ahead of its receivers by at most HOOP__BOARD_SLOTS - 1 calls. Waiting is a watch, so a board
 * wait spins, sleeps, times out, names a silent or dead peer and sees mismatched messages as a
 * message's wait does; a rank that raises a word rings the bells of its sleeping peers. */
#define HOOP__BOARD_SLOTS 32
/* A rank raises its done word every this many calls (hoop__board_done): less than the slots, so
 * that the word's lag never holds back a root that could go on. */
#define HOOP__BOARD_DONE_EVERY 8
_Static_assert(HOOP__BOARD_DONE_EVERY < HOOP__BOARD_SLOTS,
               "the done word lags less than the slots");
#define HOOP__BOARD_PAYLOAD 4096
/* The most ranks a board serves: past them, trees and rounds of messages beat every rank reading
 * every other's slot. */
#define HOOP__BOARD_MAX_RANKS 8
typedef struct hoop__board hoop__board;
/* What this rank measured of its net's rank net_peer, as hoop_comm_stats gives it (any thread):
 * the time it waited for it, the bytes posted to and from it (every communicator of the net), and
 * the link's: the bytes of the messages of at least HOOP__LINK_MIN_BYTES that came from it, and
 * the time each took from its first byte to its last. */
typedef struct hoop__peer_tally {
  uint64_t wait_ns, sent, received, link_bytes, link_ns;
} hoop__peer_tally;
void hoop__transport_peer_tally(const hoop_comm *comm, int net_peer, hoop__peer_tally *out);

/* Messages at least this large time the link they come over (hoop__tctx_link_time): smaller ones
 * take too little time for a clock to tell the link's rate from its latency. */
#define HOOP__LINK_MIN_BYTES (64 * 1024)
/* Called by a transport: a message of bytes from peer took seconds from its first byte to its last
 * (under the net lock). */
void hoop__tctx_link_time(hoop__tctx *ctx, int peer, size_t bytes, double seconds);

/* The communicator's board (coll/board.c opens and closes it; the waits peek at it), or NULL. */
hoop__board *hoop__transport_board(const hoop_comm *comm);
void hoop__transport_set_board(hoop_comm *comm, hoop__board *board);
/* Map comm's board (every rank at once, in the same call): *board NULL where this rank has none
 * (its transport has no boards, or making or mapping the segment failed). The ranks must then
 * agree whether all have one (hoop__board_close where not). */
hoop_result hoop__board_open(hoop_comm *comm, hoop__board **board);
void hoop__board_close(hoop__board *board);
/* The next call's sequence number. */
uint64_t hoop__board_next(hoop__board *board);
/* rank's payload for call seq, whose slots hold bytes each (alike on every rank): up to
 * HOOP__BOARD_INLINE bytes share the cache line of the slot's sequence number, so that the miss
 * that brings it brings them; more start on a line of their own, as a copy likes. */
#define HOOP__BOARD_INLINE 8
void *hoop__board_slot(hoop__board *board, int rank, uint64_t seq, size_t bytes);
/* Before this rank writes its slot for seq: every rank done with the call that used it last. */
hoop_result hoop__board_claim(hoop_comm *comm, hoop__board *board, uint64_t seq);
/* This rank's slot for seq is written: publish it, with the running call's fingerprint. */
void hoop__board_publish(hoop_comm *comm, hoop__board *board, uint64_t seq);
/* Wait until rank has published its slot for seq, and check its fingerprint against this rank's
 * call. */
hoop_result hoop__board_wait(hoop_comm *comm, hoop__board *board, int rank, uint64_t seq);
/* While this rank waits in a call that is not on the board (a message's wait): a peer that has
 * published its next board call under this call's number runs another call (a size past the
 * board's on one side only, say), which no message would tell this rank: HOOP_ERR_MISMATCH naming
 * both, else HOOP_OK. */
hoop_result hoop__board_peek(hoop_comm *comm, hoop__board *board);
/* This rank is done with call seq (read what it needed); every_rank: the call read every rank's
 * slot, so every rank had finished seq - 1. */
void hoop__board_done(hoop_comm *comm, hoop__board *board, uint64_t seq, int every_rank);
/* A call of comm's that went by messages (not on the board) ended: its fingerprint is the call
 * before that the next board call's slot carries. Two ranks that each took themselves for a
 * scatter's root only sent, and their next call, a barrier on the board, may find both arrived
 * at once and wait for nothing: only the call before tells them apart. */
void hoop__board_note_call(hoop_comm *comm);

#endif /* HOOP__TRANSPORT_H */
