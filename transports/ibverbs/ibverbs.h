/* ibverbs.h - the verbs transport's private state, shared by its files: device.c picks the device,
 * port and address; conn.c sets up RC queue pairs with librdmacm; data.c moves messages through
 * registered slots; progress.c handles completions and runs the progress engine; ops.c implements
 * the transport ops; mr.c registers memory (hoop_register, the library's scratch).
 *
 * Data path: each side of a connection owns `slots` receive slots of `slot_bytes` each, registered
 * for remote write, and as many send slots. A message is copied into send slots and RDMA-written
 * with immediate data into the peer's receive slots, used in ring order; its first slot starts with
 * a header {magic, type, length, the call's fingerprint}. The receiver copies each slot out into
 * the posted receive and returns slots as credits (a zero-byte write with immediate), so at most
 * slots * slot_bytes are in flight per queue pair. Big messages are thereby pipelined: the peer
 * copies out the first slots while later ones are on the wire.
 *
 * Zero-copy (data.c, registrations in mr.c): a message of at least HOOP_IB_ZCOPY_MIN bytes whose
 * source lies in a registered range (hoop_register, or the library's scratch) goes as a
 * rendezvous: an RTS header {length, fingerprint} in a slot, in order with the other messages; the
 * receiver checks it like any header against its posted receive and answers with a CTS in a slot
 * outside the message order (immediate flag IB_IMM_CTS), saying either "write to {addr, rkey}" when
 * its buffer is registered too, or "use slots"; the sender then RDMA-writes the payload straight
 * between the two buffers in pieces (at most as many bytes in flight as the slots allow) and
 * ends with a ZDONE header {length, fingerprint} in a slot, or sends the message as usual. So the
 * sender's registration picks whether a rendezvous happens and the receiver's whether it is
 * zero-copy; neither has to guess the other's.
 */
#ifndef HOOP__IBVERBS_H
#define HOOP__IBVERBS_H

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "transport/transport.h"

#define IB_HEADER_MAGIC 0x48505242u /* "HPRB" */
#define IB_HEADER_BYTES HOOP__FRAME_BYTES
#define IB_NOTICE_MAX 1023
enum ib_msg_type {
  IB_MSG_DATA = 1,
  IB_MSG_NOTICE = 2,
  IB_MSG_BYE = 3,
  IB_MSG_RTS = 4,   /* a zero-copy candidate: header only, the receiver answers with a CTS */
  IB_MSG_ZDONE = 5, /* the payload of the RTS'd message has been written into the CTS's buffer */
  IB_MSG_CTS = 6,   /* the answer to an RTS (IB_CTS_BYTES, outside the message order) */
};
/* A CTS: the header (length of the message), then {zero-copy 0/1, rkey, addr high, addr low}. */
#define IB_CTS_BYTES (IB_HEADER_BYTES + 16)

/* Immediate data: a credit return has the top bit set and the number of slots below it; a data
 * write carries the index of the slot it filled, and a notice or bye that index with
 * IB_IMM_CONTROL set, so that it is never taken for the rest of a message it cut short. */
#define IB_IMM_CREDIT 0x80000000u
#define IB_IMM_CONTROL 0x40000000u
/* A slot write that carries a CTS: it takes the next slot but is no part of any message. */
#define IB_IMM_CTS 0x20000000u

/* wr_id: the connection's generation in the upper 32 bits, the peer in bits 8-31, what the work
 * request was in the lowest byte. A completion from an older generation is work flushed from a
 * queue pair torn down before a retry, and is dropped. */
enum ib_wr_kind {
  IB_WR_RECV = 1,
  IB_WR_DATA = 2,
  IB_WR_CREDIT = 3,
  IB_WR_CONTROL = 4,
  IB_WR_ZWRITE = 5, /* a piece of a zero-copy payload */
};

/* What a receive slot turned out to hold when it arrived. */
enum ib_slot_kind {
  IB_SLOT_HEADER = 1,
  IB_SLOT_MORE = 2,
  IB_SLOT_NOTICE = 3,
  IB_SLOT_BYE = 4,
  IB_SLOT_RTS = 5,
  IB_SLOT_ZDONE = 6,
  IB_SLOT_CTS = 7, /* parsed on arrival; consuming it only returns the slot */
};

/* Where the head send message stands in a rendezvous. */
enum ib_zsend_state {
  IB_ZSEND_NONE = 0, /* not started, or not a zero-copy candidate */
  IB_ZSEND_WAIT_CTS, /* RTS written, waiting for the CTS */
  IB_ZSEND_WRITE,    /* writing the payload into the peer's buffer */
  IB_ZSEND_COPY,     /* goes through the slots (no registration here, or the CTS said so) */
};

enum ib_peer_state {
  IB_PEER_NONE = 0,   /* no connection yet */
  IB_PEER_RESOLVING,  /* this rank connects: address and route being resolved */
  IB_PEER_CONNECTING, /* connect (or accept) sent, waiting for ESTABLISHED */
  IB_PEER_UP,
  IB_PEER_CLOSED, /* disconnected, or failed */
};

/* The handshake carried in librdmacm's private data, both ways: who is connecting, the job's data
 * nonce (as the TCP handshake presents it) and where the sender's receive slots are. */
#define IB_HELLO_MAGIC 0x48504948u /* "HPIH" */
#define IB_HELLO_BYTES (4 + 4 + HOOP__WIRE_NONCE + 8 + 4 + 4 + 4)

/* What ibverbs keeps in a request: the one fragment its peer's queue links. */
typedef struct ib_request {
  hoop__fragment frag;
} ib_request;
_Static_assert(sizeof(ib_request) <= HOOP__TRANSFER_STATE_BYTES,
               "a request's transport state holds ibverbs's fragment");

static inline hoop__fragment *ib_frag(hoop__transfer *req) {
  return &((ib_request *)(void *)req->transport_state)->frag;
}

typedef struct ib_peer {
  int state;
  struct rdma_cm_id *id;
  double retry_at; /* a refused connect is tried again at this time */
  int attempts;
  char last_event[96]; /* the last connection event that went wrong, for messages */

  char *recv_slots, *send_slots;
  struct ibv_mr *recv_mr, *send_mr;
  char *control; /* a notice or bye, sent once before closing */
  struct ibv_mr *control_mr;
  uint64_t remote_addr; /* the peer's receive slots */
  uint32_t remote_rkey;
  uint32_t generation; /* bumped as each queue pair to this peer is destroyed */
  int posted_recvs;    /* receive work requests outstanding */
  int sq_used;         /* send work requests not yet completed */

  /* Sending. A message occupies whole slots; the last remote slot is kept for the control
   * message, so a notice or bye can always go. */
  hoop__fragment *send_head, *send_tail;
  uint64_t slots_sent;   /* slots written */
  uint64_t slots_done;   /* data writes completed (send slots free again) */
  uint64_t credit_limit; /* slots the peer has allowed in all */
  int head_started;      /* the head message's header has gone */
  int control_sent, control_done;
  /* Zero-copy sending: the head message's rendezvous, and the message whose last piece is
   * written but not yet completed (its request completes with the last piece). */
  int zsend_state;         /* enum ib_zsend_state */
  struct ibv_mr *zsend_mr; /* the registration the head message's source lies in */
  size_t zsend_posted;     /* payload bytes whose writes are posted */
  int zwrites_inflight;    /* posted pieces not yet completed */
  hoop__transfer *zsend_finishing;
  int cts_seen; /* the CTS for the head message arrived: */
  int cts_zcopy;
  uint32_t cts_rkey;
  uint64_t cts_addr, cts_len;

  /* Receiving: slots arrive in order; arrival parsing marks each, consumption copies out. */
  hoop__fragment *recv_head, *recv_tail;
  uint64_t slots_arrived, slots_consumed;
  uint32_t *slot_len;    /* bytes in each receive slot */
  uint8_t *slot_kind;    /* enum ib_slot_kind */
  uint64_t arrival_left; /* payload bytes of the arriving message still to come */
  uint64_t consume_left; /* payload bytes of the message being consumed still to come */
  uint32_t credits_owed; /* slots consumed and not yet returned */
  int head_checked;      /* the head receive was compared with the slot's header */
  int head_zcopy;        /* the head receive offered its buffer in a CTS: ZDONE (or DATA) next */
  double head_first_at;  /* when the head receive's header came, for one of at least
                            HOOP__LINK_MIN_BYTES (the link's time, hoop__tctx_link_time); 0: none */
  int cts_pending;       /* a CTS waits for a slot to go out in */
  uint8_t cts_out[IB_CTS_BYTES];

  int said_bye;
  int notice_seen; /* a notice arrived, perhaps behind data nobody will read */
  hoop_result notice_code;
  int notice_origin;
  char notice[IB_NOTICE_MAX + 1];
} ib_peer;

typedef struct ib_state {
  int wake_fd;
  char device[64];
  int port;
  struct sockaddr_storage bind_addr; /* the address the listener is bound to */
  struct rdma_event_channel *events;
  struct rdma_cm_id *listen_id;
  struct ibv_context *verbs;
  struct ibv_pd *pd;
  struct ibv_comp_channel *channel;
  struct ibv_cq *cq;
  int cq_armed;
  hoop__pollset pollset; /* the poll set of a sleep (progress.c) */
  int closing; /* the shutdown is running: errors from queue pairs going away are expected */
  int slots;
  size_t slot_bytes;
  int qp_timeout;
  double spin_s;
  int max_send_wr, max_recv_wr;
  ib_peer *peers;

  /* Zero-copy: HOOP_IB_ZCOPY_MIN (0: off); writes go in pieces of zcopy_piece bytes, at most
   * zcopy_depth in flight per queue pair (as many bytes as the slots hold). */
  size_t zcopy_min, zcopy_piece;
  int zcopy_depth;
  /* The library's scratch (hoop__tctx_scratch), registered on first use as a zero-copy
   * destination and dropped through forget_mem when the host kind replaces it (mem/host.c). */
  struct ibv_mr *scratch_mr;
  int scratch_reg_failed;
  /* The registrations of device memory (GPUDirect RDMA): every message from them goes as a
   * rendezvous, whatever its size, and nothing of them through the slots. */
  struct ibv_mr **device_mrs;
  int ndevice_mrs, device_mrs_capacity;
  /* Counters for the log at finalize (HOOP_DEBUG=info) and the guest tests. */
  unsigned long long reg_calls, zcopy_msgs, zcopy_declined, device_msgs;
} ib_state;

static inline ib_state *ib_state_of(hoop__tctx *ctx) {
  return ctx->state;
}

/* device.c: choose the device, port and address (HOOP_IB_DEV, HOOP_IB_PORT, HOOP_IB_GID_INDEX)
 * and read the tuning variables. HOOP_ERR_UNSUPPORTED when there is no active port. */
hoop_result hoop__ib_choose_device(hoop__tctx *ctx, ib_state *state, const struct sockaddr *toward);

/* conn.c */
hoop_result hoop__ib_listen_cm(hoop__tctx *ctx, ib_state *state);
/* Start connecting to peer (the lower rank of a pair) or wait for it to connect; returns once
 * the connection is up, or the error. */
hoop_result hoop__ib_connect(hoop__tctx *ctx, int peer);
/* Handle every pending connection event without waiting. */
hoop_result hoop__ib_pump_cm(hoop__tctx *ctx, int *moved);
/* Connections that need a retry whose time has come are started again. */
hoop_result hoop__ib_retry_due(hoop__tctx *ctx);
void hoop__ib_close_peer(ib_state *state, ib_peer *peer);
void hoop__ib_free_cm(ib_state *state);

/* data.c */
hoop_result hoop__ib_post_recvs(hoop__tctx *ctx, int peer, int count);
hoop_result hoop__ib_peer_error(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                                const char *detail);
/* A connection closed or failed: a notice that arrived first names the cause; a peer that said
 * bye with nothing owed is no failure. */
hoop_result hoop__ib_peer_gone(hoop__tctx *ctx, int peer, const char *what, const char *detail);
/* A work request's wr_id (see enum ib_wr_kind). */
uint64_t hoop__ib_wr_id(const ib_peer *peer, int index, enum ib_wr_kind kind);
/* Move peer index's queued sends and arrived slots; return the credits owed (all when force). */
hoop_result hoop__ib_drive_send(hoop__tctx *ctx, int index, int *moved);
hoop_result hoop__ib_drive_recv(hoop__tctx *ctx, int index, int *moved);
hoop_result hoop__ib_return_credits(hoop__tctx *ctx, int index, int force);
/* A receive completed: a slot arrived with immediate imm and bytes in it. */
hoop_result hoop__ib_on_arrival(hoop__tctx *ctx, int index, uint32_t imm, uint32_t bytes);
/* A zero-copy write completed: the message whose last piece it was may now complete. */
void hoop__ib_zsend_complete(ib_peer *peer);

/* progress.c */
/* Handle every completion waiting in the CQ; *moved set if there was one. */
hoop_result hoop__ib_poll_cq(hoop__tctx *ctx, int *moved);
/* One round of the progress engine (the hoop__wait_hooks progress hook). */
hoop_result hoop__ib_progress(hoop__tctx *ctx, int timeout_ms, int *moved);
hoop_result hoop__ib_sleep_prepare(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved);
hoop_result hoop__ib_sleep_done(hoop__tctx *ctx, int *moved);

/* mr.c */
/* The registration that covers [buf, buf + len), or NULL: it goes through the slots. */
struct ibv_mr *hoop__ib_find_mr(hoop__tctx *ctx, const void *buf, size_t len);
/* The register_mem, deregister_mem and forget_mem ops. */
hoop_result hoop__ib_register_mem(hoop__tctx *ctx, void *ptr, size_t bytes, void **mem);
void hoop__ib_deregister_mem(hoop__tctx *ctx, void *mem);
void hoop__ib_forget_mem(hoop__tctx *ctx, const void *ptr, size_t bytes);
/* Whether mr is a registration of device memory; the one that covers [buf, buf + len), or NULL (a
 * walk over the few device registrations: the small-message path asks it). */
int hoop__ib_mr_is_device(const ib_state *state, const struct ibv_mr *mr);
struct ibv_mr *hoop__ib_device_mr(const ib_state *state, const void *buf, size_t len);
void hoop__ib_free_device_mrs(ib_state *state);

#endif /* HOOP__IBVERBS_H */
