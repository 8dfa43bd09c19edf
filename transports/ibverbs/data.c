/* data.c - the verbs transport's data path and its ops: messages cut into slots, RDMA-written with
 * immediate data, copied out on arrival, slots returned as credits; one completion queue for every
 * queue pair, polled while there is work and slept on through its completion channel (with the
 * connection events and the abort eventfd) when there is none.
 *
 * Failures: a completion with an error status, a connection event that says the peer went away,
 * or nothing moving for HOOP_TIMEOUT become HOOP_ERR_PEER_LOST (or HOOP_ERR_TIMEOUT) naming the
 * peer. Before closing, a rank writes a notice {code, origin rank, message} after a failure, or a
 * bye at finalize, into the slot it keeps for that, so peers say who started it and a peer that
 * finished is told apart from one that died.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibverbs.h"
#include "rdzv/client.h"
#include "util/be32.h"
#include "util/netaddr.h"

#define GOODBYE_WAIT_S 0.5
#define BYE_WAIT_S 10.0

/* ---- errors ---------------------------------------------------------------------------------- */

hoop_result hoop__ib_peer_error(hoop_comm *comm, int peer, hoop_result code, const char *what,
                                const char *detail) {
  const hoop__peer_entry *entry = &comm->table.peers[peer];
  if (!comm->failed && comm->fail_origin < 0)
    comm->fail_origin = peer;
  return hoop__fail(comm, code, "%s (call #%llu): lost rank %d (%s, host %s): ibverbs %s: %s",
                    comm->call ? comm->call : "hoop_init", (unsigned long long)comm->seq, peer,
                    entry->addr, entry->host, what, detail);
}

static hoop_result drive_recv(hoop_comm *comm, int index, int *moved);

hoop_result hoop__ib_peer_gone(hoop_comm *comm, int index, const char *what, const char *detail) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  if (state->closing || comm->failed)
    return comm->failed;
  int was_closed = peer->state == IB_PEER_CLOSED;
  peer->state = IB_PEER_CLOSED;
  if (!was_closed && peer->slot_kind) {
    /* What arrived before the end is still in the slots: deliver it, or find the notice. */
    int moved = 0;
    hoop_result result = drive_recv(comm, index, &moved);
    if (result != HOOP_OK || comm->failed)
      return result;
  }
  if (peer->notice_seen)
    return hoop__peer_notice(comm, index, peer->notice_code, peer->notice_origin, peer->notice);
  if (peer->said_bye && !peer->recv_head && !peer->send_head)
    return HOOP_OK;
  char text[256];
  snprintf(text, sizeof text, "%s%s", detail, peer->said_bye ? " (it had finalized)" : "");
  return hoop__ib_peer_error(comm, index, HOOP_ERR_PEER_LOST, what, text);
}

/* ---- posting --------------------------------------------------------------------------------- */

static uint64_t wr_id(const ib_peer *peer, int index, enum ib_wr_kind kind) {
  return (uint64_t)peer->generation << 32 | (uint64_t)(uint32_t)index << 8 | (uint64_t)kind;
}

/* Receives take no buffer: writes with immediate data land in the slots, and only the immediate
 * and the length come with the completion. */
hoop_result hoop__ib_post_recvs(hoop_comm *comm, int index, int count) {
  ib_peer *peer = &ib_state_of(comm)->peers[index];
  for (int i = 0; i < count; i++) {
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id(peer, index, IB_WR_RECV);
    int err = ibv_post_recv(peer->id->qp, &wr, &bad);
    if (err != 0)
      return hoop__ib_peer_error(comm, index, HOOP_ERR_SYSTEM, "ibv_post_recv", strerror(err));
    peer->posted_recvs++;
  }
  return HOOP_OK;
}

/* One RDMA write of bytes at local (lkey) to remote (rkey) on peer index's queue pair: with the
 * immediate imm (IBV_WR_RDMA_WRITE_WITH_IMM), or plain (IBV_WR_RDMA_WRITE, imm unused). */
static hoop_result post_rdma(hoop_comm *comm, int index, const char *local, uint32_t lkey,
                             uint32_t bytes, uint64_t remote, uint32_t rkey,
                             enum ibv_wr_opcode opcode, uint32_t imm, enum ib_wr_kind kind,
                             const char *what) {
  ib_peer *peer = &ib_state_of(comm)->peers[index];
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)local, .length = bytes, .lkey = lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id(peer, index, kind);
  wr.opcode = opcode;
  wr.sg_list = bytes ? &sge : NULL;
  wr.num_sge = bytes ? 1 : 0;
  if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
    wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  int err = ibv_post_send(peer->id->qp, &wr, &bad);
  if (err != 0)
    return hoop__ib_peer_gone(comm, index, what, strerror(err));
  peer->sq_used++;
  return HOOP_OK;
}

static hoop_result post_write(hoop_comm *comm, int index, char *local, uint32_t lkey,
                              uint32_t bytes, uint64_t remote, uint32_t imm, enum ib_wr_kind kind) {
  return post_rdma(comm, index, local, lkey, bytes, remote,
                   ib_state_of(comm)->peers[index].remote_rkey, IBV_WR_RDMA_WRITE_WITH_IMM, imm,
                   kind, "ibv_post_send");
}

/* A piece of a zero-copy payload: a plain RDMA write into the buffer the peer's CTS named; the
 * ZDONE that follows it on the same queue pair lands after it (RC writes are placed in order). */
static hoop_result post_zwrite(hoop_comm *comm, int index, const char *local, uint32_t lkey,
                               uint32_t bytes, uint64_t remote, uint32_t rkey) {
  hoop_result result = post_rdma(comm, index, local, lkey, bytes, remote, rkey, IBV_WR_RDMA_WRITE,
                                 0, IB_WR_ZWRITE, "ibv_post_send (zero-copy write)");
  if (result == HOOP_OK)
    ib_state_of(comm)->peers[index].zwrites_inflight++;
  return result;
}

static void encode_header(uint8_t *out, uint32_t type, uint64_t len, const uint8_t *fingerprint) {
  hoop__put_be32(out, IB_HEADER_MAGIC);
  hoop__put_be32(out + 4, type);
  hoop__put_be32(out + 8, (uint32_t)(len >> 32));
  hoop__put_be32(out + 12, (uint32_t)len);
  if (fingerprint)
    memcpy(out + 16, fingerprint, HOOP_FINGERPRINT_BYTES);
  else
    memset(out + 16, 0, HOOP_FINGERPRINT_BYTES);
}

static uint64_t header_len(const uint8_t *header) {
  return (uint64_t)hoop__get_be32(header + 8) << 32 | hoop__get_be32(header + 12);
}

/* ---- registrations --------------------------------------------------------------------------- */

/* Register [ptr, ptr + bytes) for local access and remote writes; counted for the tests. */
static struct ibv_mr *reg_mr(hoop_comm *comm, void *ptr, size_t bytes, const char *what) {
  ib_state *state = ib_state_of(comm);
  struct ibv_mr *mr =
      ibv_reg_mr(state->pd, ptr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr) {
    state->reg_calls++;
    HOOP_TRACE(HOOP_SUBSYS_NET, "ibverbs: ibv_reg_mr #%llu: %zu bytes at %p (%s)", state->reg_calls,
               bytes, ptr, what);
  }
  return mr;
}

/* The registration that covers [buf, buf + len): the user's (hoop_register), or the staging
 * buffer, registered on first use. Nothing else is ever registered implicitly: see register.c
 * for why a cache of arbitrary pointers is unsafe. The staging buffer is safe because the library
 * owns it and hoop__scratch calls forget_mem before it frees it. */
static struct ibv_mr *find_mr(hoop_comm *comm, const void *buf, size_t len) {
  ib_state *state = ib_state_of(comm);
  const hoop__registration *reg = hoop__registration_find(comm, buf, len);
  if (reg)
    return reg->transport_mem;
  uintptr_t start = (uintptr_t)buf, scratch = (uintptr_t)comm->scratch;
  if (!comm->scratch || start < scratch || start - scratch > comm->scratch_bytes ||
      len > comm->scratch_bytes - (start - scratch))
    return NULL;
  if (!state->scratch_mr && !state->scratch_reg_failed) {
    state->scratch_mr = reg_mr(comm, comm->scratch, comm->scratch_bytes, "staging");
    if (!state->scratch_mr) {
      /* Not fatal: the staging buffer keeps going through the slots. */
      state->scratch_reg_failed = 1;
      HOOP_INFO(HOOP_SUBSYS_NET,
                "ibverbs: ibv_reg_mr of the %zu-byte staging buffer: %s; it is "
                "copied through the slots instead",
                comm->scratch_bytes, strerror(errno));
    }
  }
  return state->scratch_mr;
}

static hoop_result ib_register_mem(hoop_comm *comm, void *ptr, size_t bytes, void **mem) {
  struct ibv_mr *mr = reg_mr(comm, ptr, bytes, "hoop_register");
  if (!mr)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                           "hoop_register: ibv_reg_mr of %zu bytes at %p "
                           "on %s: %s (is the locked-memory limit, ulimit -l, too low, or the "
                           "memory read-only?)",
                           bytes, ptr, ib_state_of(comm)->device, strerror(errno));
  *mem = mr;
  return HOOP_OK;
}

static void ib_deregister_mem(hoop_comm *comm, void *mem) {
  int err = ibv_dereg_mr(mem);
  if (err != 0)
    HOOP_WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dereg_mr (hoop_deregister): %s", strerror(err));
  (void)comm;
}

static void ib_forget_mem(hoop_comm *comm, const void *ptr, size_t bytes) {
  ib_state *state = ib_state_of(comm);
  (void)ptr;
  (void)bytes; /* only the staging buffer is ever handed here */
  if (state && state->scratch_mr) {
    int err = ibv_dereg_mr(state->scratch_mr);
    if (err != 0)
      HOOP_WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dereg_mr (staging buffer): %s", strerror(err));
  }
  if (state) {
    state->scratch_mr = NULL;
    state->scratch_reg_failed = 0;
  }
}

/* ---- sending --------------------------------------------------------------------------------- */

/* The slot-path conditions: a free remote slot beyond the one kept for the control message, a
 * free send slot, and room in the send queue. */
static int slot_free(const ib_state *state, const ib_peer *peer) {
  return peer->state == IB_PEER_UP && peer->slots_sent + 1 < peer->credit_limit &&
         peer->slots_sent - peer->slots_done < (uint64_t)state->slots &&
         peer->sq_used < state->max_send_wr - 4;
}

/* Write a small slot (a header, or a CTS) from the next send slot. */
static hoop_result send_small(hoop_comm *comm, int index, const uint8_t *bytes, uint32_t len,
                              uint32_t imm_flag) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  uint32_t slot = (uint32_t)(peer->slots_sent % (uint64_t)state->slots);
  char *where = peer->send_slots + (size_t)slot * state->slot_bytes;
  memcpy(where, bytes, len);
  hoop_result result = post_write(comm, index, where, peer->send_mr->lkey, len,
                                  peer->remote_addr + (uint64_t)slot * state->slot_bytes,
                                  slot | imm_flag, IB_WR_DATA);
  if (result == HOOP_OK)
    peer->slots_sent++;
  return result;
}

static void zsend_complete(ib_peer *peer) {
  if (peer->zsend_finishing && peer->zwrites_inflight == 0) {
    peer->zsend_finishing->pending--;
    peer->zsend_finishing = NULL;
  }
}

/* The head message as a rendezvous. Returns with *handled 0 when the head goes through the slots
 * as usual; otherwise with what could be done now done. */
static hoop_result drive_zsend(hoop_comm *comm, int index, int *handled, int *moved) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  hoop__fragment *frag = peer->send_head;
  *handled = 0;
  if (peer->zsend_state == IB_ZSEND_COPY || peer->head_started || state->zcopy_min == 0 ||
      frag->len < state->zcopy_min)
    return HOOP_OK;
  *handled = 1;
  uint8_t header[IB_HEADER_BYTES];
  if (peer->zsend_state == IB_ZSEND_NONE) {
    peer->zsend_mr = find_mr(comm, frag->buf, frag->len);
    if (!peer->zsend_mr) {
      peer->zsend_state = IB_ZSEND_COPY;
      *handled = 0;
      return HOOP_OK;
    }
    encode_header(header, IB_MSG_RTS, frag->len, frag->owner->fingerprint);
    hoop_result result = send_small(comm, index, header, IB_HEADER_BYTES, 0);
    if (result != HOOP_OK)
      return result;
    peer->zsend_state = IB_ZSEND_WAIT_CTS;
    *moved = 1;
    return HOOP_OK;
  }
  if (peer->zsend_state == IB_ZSEND_WAIT_CTS) {
    /* One message finishes its pieces before the next starts writing. */
    if (!peer->cts_seen || peer->zsend_finishing)
      return HOOP_OK;
    peer->cts_seen = 0;
    if (peer->cts_len != frag->len)
      return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d cleared %llu bytes for a "
                        "%zu-byte message",
                        index, (unsigned long long)peer->cts_len, frag->len);
    if (!peer->cts_zcopy) {
      state->zcopy_declined++;
      peer->zsend_state = IB_ZSEND_COPY;
      *handled = 0;
      return HOOP_OK;
    }
    peer->zsend_state = IB_ZSEND_WRITE;
    peer->zsend_posted = 0;
    *moved = 1;
  }
  /* IB_ZSEND_WRITE: the pieces, then the ZDONE once a slot is free. */
  while (peer->zsend_posted < frag->len && peer->zwrites_inflight < state->zcopy_depth &&
         peer->sq_used < state->max_send_wr - 4) {
    size_t left = frag->len - peer->zsend_posted;
    uint32_t piece = (uint32_t)(left < state->zcopy_piece ? left : state->zcopy_piece);
    hoop_result result =
        post_zwrite(comm, index, frag->buf + peer->zsend_posted, peer->zsend_mr->lkey, piece,
                    peer->cts_addr + peer->zsend_posted, peer->cts_rkey);
    if (result != HOOP_OK)
      return result;
    peer->zsend_posted += piece;
    *moved = 1;
  }
  if (peer->zsend_posted < frag->len || !slot_free(state, peer))
    return HOOP_OK;
  encode_header(header, IB_MSG_ZDONE, frag->len, frag->owner->fingerprint);
  hoop_result result = send_small(comm, index, header, IB_HEADER_BYTES, 0);
  if (result != HOOP_OK)
    return result;
  state->zcopy_msgs++;
  peer->send_head = frag->next;
  if (!peer->send_head)
    peer->send_tail = NULL;
  peer->zsend_state = IB_ZSEND_NONE;
  /* The request completes when its last piece has: until then its buffer is still being read. */
  peer->zsend_finishing = frag->owner;
  zsend_complete(peer);
  *moved = 1;
  return HOOP_OK;
}

/* A CTS owed to the peer goes first, outside the message order, so that it never waits behind
 * this side's own messages (which may themselves wait for the peer). */
static hoop_result send_cts(hoop_comm *comm, int index, int *moved) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  if (!peer->cts_pending || !slot_free(state, peer))
    return HOOP_OK;
  hoop_result result = send_small(comm, index, peer->cts_out, IB_CTS_BYTES, IB_IMM_CTS);
  if (result == HOOP_OK) {
    peer->cts_pending = 0;
    *moved = 1;
  }
  return result;
}

/* Copy as much of the queued messages into send slots and write them as credits and the send
 * queue allow; the last remote slot and a few send work requests stay free for the control
 * message and credit returns. A send completes once its last byte is copied. */
static hoop_result drive_send(hoop_comm *comm, int index, int *moved) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  hoop_result result = send_cts(comm, index, moved);
  if (result != HOOP_OK)
    return result;
  while (peer->send_head && slot_free(state, peer)) {
    int handled = 0;
    if ((result = drive_zsend(comm, index, &handled, moved)) != HOOP_OK)
      return result;
    if (handled) {
      if (peer->send_head && peer->zsend_state == IB_ZSEND_NONE)
        continue; /* the message went; the next one may go too */
      break;      /* waiting for a CTS, a completion or a slot */
    }
    hoop__fragment *frag = peer->send_head;
    uint32_t slot = (uint32_t)(peer->slots_sent % (uint64_t)state->slots);
    char *where = peer->send_slots + (size_t)slot * state->slot_bytes;
    size_t room = state->slot_bytes, used = 0;
    if (!peer->head_started) {
      encode_header((uint8_t *)where, IB_MSG_DATA, frag->owner->len, frag->owner->fingerprint);
      used = IB_HEADER_BYTES;
      room = state->slot_bytes - IB_HEADER_BYTES;
    }
    size_t take = frag->len - frag->done < room ? frag->len - frag->done : room;
    memcpy(where + used, frag->buf + frag->done, take);
    result = post_write(comm, index, where, peer->send_mr->lkey, (uint32_t)(used + take),
                        peer->remote_addr + (uint64_t)slot * state->slot_bytes, slot, IB_WR_DATA);
    if (result != HOOP_OK)
      return result;
    peer->slots_sent++;
    peer->head_started = 1;
    frag->done += take;
    *moved = 1;
    if (frag->done == frag->len) {
      peer->send_head = frag->next;
      if (!peer->send_head)
        peer->send_tail = NULL;
      peer->head_started = 0;
      peer->zsend_state = IB_ZSEND_NONE;
      frag->owner->pending--;
    }
  }
  return HOOP_OK;
}

static hoop_result return_credits(hoop_comm *comm, int index, int force) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  uint32_t threshold = (uint32_t)(state->slots / 2 > 0 ? state->slots / 2 : 1);
  if (peer->state != IB_PEER_UP || peer->credits_owed == 0 ||
      (!force && peer->credits_owed < threshold) || peer->sq_used >= state->max_send_wr - 1)
    return HOOP_OK;
  hoop_result result = post_write(comm, index, NULL, 0, 0, peer->remote_addr,
                                  IB_IMM_CREDIT | peer->credits_owed, IB_WR_CREDIT);
  if (result == HOOP_OK)
    peer->credits_owed = 0;
  return result;
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* A CTS arrived, answering this side's RTS: kept for drive_zsend at once, since slots in front
 * of it may wait for a receive that this side posts only after its send. */
static hoop_result on_cts(hoop_comm *comm, int index, uint32_t slot, const uint8_t *data,
                          uint32_t bytes) {
  ib_peer *peer = &ib_state_of(comm)->peers[index];
  if (bytes != IB_CTS_BYTES || hoop__get_be32(data) != IB_HEADER_MAGIC ||
      hoop__get_be32(data + 4) != IB_MSG_CTS)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a malformed CTS", index);
  if (peer->zsend_state != IB_ZSEND_WAIT_CTS || peer->cts_seen)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a CTS nobody asked for",
                      index);
  const uint8_t *body = data + IB_HEADER_BYTES;
  peer->cts_len = header_len(data);
  peer->cts_zcopy = hoop__get_be32(body) != 0;
  peer->cts_rkey = hoop__get_be32(body + 4);
  peer->cts_addr = (uint64_t)hoop__get_be32(body + 8) << 32 | hoop__get_be32(body + 12);
  peer->cts_seen = 1;
  peer->slot_len[slot] = bytes;
  peer->slot_kind[slot] = IB_SLOT_CTS;
  peer->slots_arrived++;
  return HOOP_OK;
}

/* A slot arrived: mark what it holds. A notice is kept aside at once, since data nobody reads may
 * sit in front of it; a bye says the peer finished. */
static hoop_result on_arrival(hoop_comm *comm, int index, uint32_t imm, uint32_t bytes) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  uint32_t slot = (uint32_t)(peer->slots_arrived % (uint64_t)state->slots);
  const uint8_t *data = (const uint8_t *)peer->recv_slots + (size_t)slot * state->slot_bytes;
  if (imm == (slot | IB_IMM_CTS))
    return on_cts(comm, index, slot, data, bytes);
  int control = (imm & IB_IMM_CONTROL) != 0;
  imm &= ~IB_IMM_CONTROL;
  if (imm != slot || bytes > state->slot_bytes)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                      "ibverbs: rank %d wrote slot %u (%u bytes) where "
                      "slot %u was next",
                      index, imm, bytes, slot);
  peer->slot_len[slot] = bytes;
  peer->slots_arrived++;
  if (control) /* a notice or bye ends whatever message was arriving */
    peer->arrival_left = 0;
  if (peer->arrival_left > 0) {
    if (bytes > peer->arrival_left)
      return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d overran a message", index);
    peer->slot_kind[slot] = IB_SLOT_MORE;
    peer->arrival_left -= bytes;
    return HOOP_OK;
  }
  if (bytes < IB_HEADER_BYTES || hoop__get_be32(data) != IB_HEADER_MAGIC)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a malformed header", index);
  uint32_t type = hoop__get_be32(data + 4);
  uint64_t len = header_len(data);
  if (type == IB_MSG_DATA) {
    if (control)
      return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d sent data as a control "
                        "message",
                        index);
    uint64_t here = bytes - IB_HEADER_BYTES;
    if (here > len)
      return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d sent a message longer than "
                        "its header says",
                        index);
    peer->slot_kind[slot] = IB_SLOT_HEADER;
    peer->arrival_left = len - here;
  } else if (type == IB_MSG_RTS || type == IB_MSG_ZDONE) {
    if (bytes != IB_HEADER_BYTES)
      return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a malformed %s", index,
                        type == IB_MSG_RTS ? "RTS" : "ZDONE");
    peer->slot_kind[slot] = type == IB_MSG_RTS ? IB_SLOT_RTS : IB_SLOT_ZDONE;
  } else if (type == IB_MSG_NOTICE) {
    peer->slot_kind[slot] = IB_SLOT_NOTICE;
    size_t text = bytes - IB_HEADER_BYTES < IB_NOTICE_MAX ? bytes - IB_HEADER_BYTES : IB_NOTICE_MAX;
    memcpy(peer->notice, data + IB_HEADER_BYTES, text);
    peer->notice[text] = '\0';
    peer->notice_code = (hoop_result)hoop__get_be32(data + 16);
    peer->notice_origin = (int)hoop__get_be32(data + 20);
    peer->notice_seen = 1;
  } else if (type == IB_MSG_BYE) {
    peer->slot_kind[slot] = IB_SLOT_BYE;
    peer->said_bye = 1;
  } else {
    return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                      "ibverbs: rank %d sent a message of unknown type "
                      "%u",
                      index, type);
  }
  return HOOP_OK;
}

static void finish_recv_head(ib_peer *peer) {
  hoop__fragment *frag = peer->recv_head;
  peer->recv_head = frag->next;
  if (!peer->recv_head)
    peer->recv_tail = NULL;
  peer->head_checked = 0;
  frag->owner->pending--;
}

/* An RTS for the head receive (its header already checked against it): offer the buffer when
 * it is registered, else ask for the slots. The payload must come whole, so a receive that has
 * taken bytes already (impossible from a sender that follows the protocol) is refused. */
static hoop_result answer_rts(hoop_comm *comm, int index) {
  ib_peer *peer = &ib_state_of(comm)->peers[index];
  hoop__fragment *head = peer->recv_head;
  if (peer->cts_pending || head->done != 0)
    return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                      "ibverbs: rank %d sent an RTS in the middle of "
                      "a message",
                      index);
  struct ibv_mr *mr = find_mr(comm, head->buf, head->len);
  uint64_t addr = (uint64_t)(uintptr_t)head->buf;
  encode_header(peer->cts_out, IB_MSG_CTS, head->len, NULL);
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES, mr ? 1 : 0);
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES + 4, mr ? mr->rkey : 0);
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES + 8, (uint32_t)(addr >> 32));
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES + 12, (uint32_t)addr);
  peer->cts_pending = 1;
  peer->head_zcopy = mr != NULL;
  return send_cts(comm, index, &(int){0});
}

/* A ZDONE: the payload is in the head receive's buffer, written before it on this queue pair. */
static hoop_result finish_zcopy(hoop_comm *comm, int index) {
  ib_peer *peer = &ib_state_of(comm)->peers[index];
  peer->recv_head->done = peer->recv_head->len;
  peer->head_zcopy = 0;
  finish_recv_head(peer);
  return HOOP_OK;
}

/* Copy arrived slots, in order, into the posted receives. */
static hoop_result drive_recv(hoop_comm *comm, int index, int *moved) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  static const uint8_t unchecked[HOOP_FINGERPRINT_BYTES];
  while (peer->slots_consumed < peer->slots_arrived) {
    uint32_t slot = (uint32_t)(peer->slots_consumed % (uint64_t)state->slots);
    const uint8_t *data = (const uint8_t *)peer->recv_slots + (size_t)slot * state->slot_bytes;
    uint32_t bytes = peer->slot_len[slot];
    hoop__fragment *head = peer->recv_head;
    int kind = peer->slot_kind[slot];
    if (kind == IB_SLOT_CTS) { /* its contents were taken on arrival */
      peer->slots_consumed++;
      peer->credits_owed++;
      *moved = 1;
      continue;
    }
    if (kind == IB_SLOT_NOTICE) {
      peer->slots_consumed++;
      return hoop__peer_notice(comm, index, peer->notice_code, peer->notice_origin, peer->notice);
    }
    if (kind == IB_SLOT_HEADER || kind == IB_SLOT_RTS || kind == IB_SLOT_ZDONE) {
      if (kind == IB_SLOT_ZDONE && (!head || !peer->head_zcopy))
        return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                          "ibverbs: rank %d finished a zero-copy "
                          "write that no CTS offered",
                          index);
      if (!head) /* parked until its receive is posted; it may already show a mismatch */
        return hoop__mismatch_early(comm, index, data + 16);
      const uint8_t *theirs = data + 16, *ours = head->owner->fingerprint;
      int compare = memcmp(theirs, unchecked, sizeof unchecked) != 0 &&
                    memcmp(ours, unchecked, sizeof unchecked) != 0;
      if ((compare && memcmp(theirs, ours, HOOP_FINGERPRINT_BYTES) != 0) ||
          header_len(data) != head->owner->len)
        return hoop__mismatch(comm, index, theirs, ours, header_len(data), head->owner->len);
      peer->head_checked = 1;
      data += IB_HEADER_BYTES;
      bytes -= IB_HEADER_BYTES;
      if (kind != IB_SLOT_HEADER) {
        hoop_result result =
            kind == IB_SLOT_RTS ? answer_rts(comm, index) : finish_zcopy(comm, index);
        if (result != HOOP_OK)
          return result;
        peer->slots_consumed++;
        peer->credits_owed++;
        *moved = 1;
        continue;
      }
      peer->head_zcopy = 0; /* the sender chose the slots after all */
    } else if (kind == IB_SLOT_MORE && (!head || !peer->head_checked)) {
      return hoop__fail(comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d continued a message that had "
                        "no receive",
                        index);
    }
    if (kind != IB_SLOT_BYE) {
      if (bytes > head->len - head->done)
        return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent more than posted", index);
      memcpy(head->buf + head->done, data, bytes);
      head->done += bytes;
      if (head->done == head->len)
        finish_recv_head(peer);
    }
    peer->slots_consumed++;
    peer->credits_owed++;
    *moved = 1;
  }
  return HOOP_OK;
}

/* ---- completions ----------------------------------------------------------------------------- */

static hoop_result on_completion(hoop_comm *comm, const struct ibv_wc *wc) {
  ib_state *state = ib_state_of(comm);
  int index = (int)((wc->wr_id >> 8) & 0xffffff);
  enum ib_wr_kind kind = (enum ib_wr_kind)(wc->wr_id & 0xff);
  if (index < 0 || index >= comm->size)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "ibverbs: a completion for unknown rank %d", index);
  ib_peer *peer = &state->peers[index];
  if ((uint32_t)(wc->wr_id >> 32) != peer->generation)
    return HOOP_OK; /* flushed from a queue pair that an earlier connect attempt tore down */
  if (kind == IB_WR_RECV)
    peer->posted_recvs--;
  else
    peer->sq_used--;
  if (wc->status != IBV_WC_SUCCESS) {
    /* A goodbye that failed or was flushed is finished too: nothing more will come of it, and
     * shutdown must not wait out BYE_WAIT_S for it. */
    if (kind == IB_WR_CONTROL)
      peer->control_done = 1;
    if (peer->state == IB_PEER_CLOSED || state->closing)
      return HOOP_OK; /* work flushed from a queue pair that is going away */
    char detail[160];
    snprintf(detail, sizeof detail, "completion with error status %s (%d, vendor error 0x%x)",
             ibv_wc_status_str(wc->status), (int)wc->status, wc->vendor_err);
    return hoop__ib_peer_gone(comm, index,
                              kind == IB_WR_RECV     ? "receive"
                              : kind == IB_WR_DATA   ? "write"
                              : kind == IB_WR_ZWRITE ? "zero-copy write"
                                                     : "send",
                              detail);
  }
  switch (kind) {
  case IB_WR_RECV: {
    uint32_t imm = ntohl(wc->imm_data);
    hoop_result result = HOOP_OK;
    if (!(wc->wc_flags & IBV_WC_WITH_IMM))
      return hoop__fail(comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent without immediate data",
                        index);
    if (imm & IB_IMM_CREDIT)
      peer->credit_limit += imm & ~IB_IMM_CREDIT;
    else
      result = on_arrival(comm, index, imm, wc->byte_len);
    /* The peer may write before this side has seen ESTABLISHED. */
    if (result == HOOP_OK && peer->id && peer->state != IB_PEER_CLOSED)
      result = hoop__ib_post_recvs(comm, index, 1);
    return result;
  }
  case IB_WR_DATA: peer->slots_done++; return HOOP_OK;
  case IB_WR_CONTROL: peer->control_done = 1; return HOOP_OK;
  case IB_WR_ZWRITE:
    peer->zwrites_inflight--;
    zsend_complete(peer);
    return HOOP_OK;
  default: return HOOP_OK;
  }
}

hoop_result hoop__ib_poll_cq(hoop_comm *comm, int *moved) {
  ib_state *state = ib_state_of(comm);
  struct ibv_wc wcs[32];
  for (;;) {
    int n = ibv_poll_cq(state->cq, 32, wcs);
    if (n < 0)
      return hoop__fail(comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_poll_cq failed (%d)", n);
    for (int i = 0; i < n; i++) {
      hoop_result result = on_completion(comm, &wcs[i]);
      if (result != HOOP_OK)
        return result;
    }
    if (n > 0)
      *moved = 1;
    if (n < 32)
      return HOOP_OK;
  }
}

/* ---- the progress engine --------------------------------------------------------------------- */

static hoop_result drive_peers(hoop_comm *comm, int *moved) {
  ib_state *state = ib_state_of(comm);
  for (int p = 0; p < comm->size; p++) {
    ib_peer *peer = &state->peers[p];
    if (peer->state != IB_PEER_UP)
      continue;
    hoop_result result = drive_recv(comm, p, moved);
    if (result == HOOP_OK)
      result = return_credits(comm, p, 0);
    if (result == HOOP_OK)
      result = drive_send(comm, p, moved);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* The device's asynchronous events: a queue pair that went fatal loses its peer; the rest are
 * logged. */
static hoop_result drain_async(hoop_comm *comm, int *moved) {
  ib_state *state = ib_state_of(comm);
  struct ibv_async_event event;
  while (ibv_get_async_event(state->verbs, &event) == 0) {
    enum ibv_event_type type = event.event_type;
    struct ibv_qp *qp = event.element.qp;
    ibv_ack_async_event(&event);
    *moved = 1;
    const char *what = ibv_event_type_str(type);
    if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
        type == IBV_EVENT_QP_ACCESS_ERR) {
      for (int p = 0; p < comm->size; p++)
        if (state->peers[p].id && state->peers[p].id->qp == qp) {
          char detail[96];
          snprintf(detail, sizeof detail, "asynchronous event %s", what);
          hoop_result result = hoop__ib_peer_gone(comm, p, "queue pair", detail);
          if (result != HOOP_OK)
            return result;
        }
    } else if (type == IBV_EVENT_DEVICE_FATAL || type == IBV_EVENT_CQ_ERR) {
      return hoop__fail(comm, HOOP_ERR_SYSTEM, "ibverbs: device %s: %s", state->device, what);
    } else {
      HOOP_WARN(HOOP_SUBSYS_NET, "ibverbs: device %s: asynchronous event %s", state->device, what);
    }
  }
  return HOOP_OK;
}

static hoop_result sleep_on_events(hoop_comm *comm, int timeout_ms, int *moved) {
  ib_state *state = ib_state_of(comm);
  if (!state->cq_armed) {
    if (ibv_req_notify_cq(state->cq, 0) != 0)
      return hoop__fail(comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_req_notify_cq: %s", strerror(errno));
    state->cq_armed = 1;
    /* What completed before arming raises no event: look once more. */
    hoop_result result = hoop__ib_poll_cq(comm, moved);
    if (result != HOOP_OK || *moved)
      return result;
  }
  /* The rendezvous connection too: another rank's abort or loss told by the server. */
  struct pollfd fds[5] = {{.fd = state->channel->fd, .events = POLLIN},
                          {.fd = state->events->fd, .events = POLLIN},
                          {.fd = state->wake_fd, .events = POLLIN},
                          {.fd = hoop__rendezvous_fd(comm), .events = POLLIN},
                          {.fd = state->verbs->async_fd, .events = POLLIN}};
  int ready = poll(fds, 5, timeout_ms);
  if (ready < 0 && errno != EINTR)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "ibverbs: poll: %s", strerror(errno));
  if (ready > 0 && fds[4].revents) {
    hoop_result result = drain_async(comm, moved);
    if (result != HOOP_OK)
      return result;
  }
  if (ready > 0 && fds[0].revents) {
    struct ibv_cq *cq;
    void *context;
    while (ibv_get_cq_event(state->channel, &cq, &context) == 0) {
      ibv_ack_cq_events(cq, 1);
      state->cq_armed = 0;
    }
  }
  if (ready > 0 && fds[2].revents) {
    hoop_result result = hoop__wake_drain(comm, state->wake_fd, "ibverbs");
    if (result == HOOP_OK)
      result = hoop__check_abort(comm);
    if (result != HOOP_OK)
      return result;
  }
  if (ready > 0 && fds[3].revents)
    return hoop__rendezvous_check(comm);
  return HOOP_OK;
}

/* One round: completions, connection events, then every connected peer's queues; with nothing
 * moved and timeout_ms > 0, sleep until something happens or timeout_ms passes. */
static hoop_result progress(hoop_comm *comm, int timeout_ms, int *moved) {
  hoop_result result = hoop__ib_poll_cq(comm, moved);
  if (result == HOOP_OK)
    result = hoop__ib_pump_cm(comm, moved);
  if (result == HOOP_OK)
    result = hoop__ib_retry_due(comm);
  if (result == HOOP_OK)
    result = drive_peers(comm, moved);
  if (result == HOOP_OK && !*moved && timeout_ms > 0)
    result = sleep_on_events(comm, timeout_ms, moved);
  return result;
}

/* ---- the ops --------------------------------------------------------------------------------- */

static hoop_result ensure_peers(hoop_comm *comm) {
  ib_state *state = ib_state_of(comm);
  if (state->peers)
    return HOOP_OK;
  state->peers = calloc((size_t)comm->size, sizeof *state->peers);
  if (!state->peers)
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "ibverbs: out of memory for %d peers", comm->size);
  return HOOP_OK;
}

static hoop_result create_queues(hoop_comm *comm, ib_state *state) {
  struct ibv_device_attr attr;
  int err = ibv_query_device(state->verbs, &attr);
  if (err != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_query_device(%s): %s",
                           state->device, strerror(err));
  state->max_send_wr = state->slots + 8;
  state->max_recv_wr = 2 * state->slots + 8;
  if (state->max_send_wr > attr.max_qp_wr || state->max_recv_wr > attr.max_qp_wr)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "ibverbs: HOOP_IB_SLOTS=%d needs %d work "
                           "requests per queue; %s allows %d",
                           state->slots, state->max_recv_wr, state->device, attr.max_qp_wr);
  long cqe =
      (long)(comm->size > 1 ? comm->size - 1 : 1) * (state->max_send_wr + state->max_recv_wr);
  if (cqe > attr.max_cqe) /* a smaller queue could overrun, which breaks every queue pair */
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "ibverbs: %d ranks with HOOP_IB_SLOTS=%d "
                           "need a completion queue of %ld entries; %s allows %d (lower "
                           "HOOP_IB_SLOTS, or use HOOP_TRANSPORT=tcp)",
                           comm->size, state->slots, cqe, state->device, attr.max_cqe);
  if (!(state->pd = ibv_alloc_pd(state->verbs)))
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_alloc_pd(%s): %s", state->device,
                           strerror(errno));
  if (!(state->channel = ibv_create_comp_channel(state->verbs)))
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_create_comp_channel: %s",
                           strerror(errno));
  int flags = fcntl(state->channel->fd, F_GETFL);
  if (flags < 0 || fcntl(state->channel->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: fcntl on the completion channel: %s",
                           strerror(errno));
  flags = fcntl(state->verbs->async_fd, F_GETFL);
  if (flags < 0 || fcntl(state->verbs->async_fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: fcntl on the async event fd: %s",
                           strerror(errno));
  if (!(state->cq = ibv_create_cq(state->verbs, (int)cqe, NULL, state->channel, 0)))
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_create_cq(%ld): %s", cqe,
                           strerror(errno));
  return HOOP_OK;
}

static hoop_result ib_listen(hoop_comm *comm, const struct sockaddr *toward, char *addr,
                             size_t addrlen) {
  ib_state *state = calloc(1, sizeof *state);
  if (!state)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: out of memory");
  comm->transport_state = state;
  state->wake_fd = hoop__wake_open();
  if (state->wake_fd < 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "ibverbs: eventfd: %s", strerror(errno));
  hoop_result result = hoop__ib_choose_device(comm, state, toward);
  if (result == HOOP_OK)
    result = hoop__ib_listen_cm(comm, state);
  if (result == HOOP_OK)
    result = create_queues(comm, state);
  if (result != HOOP_OK)
    return result;
  struct sockaddr_storage bound = state->bind_addr;
  if (bound.ss_family == AF_INET)
    ((struct sockaddr_in *)&bound)->sin_port = rdma_get_src_port(state->listen_id);
  else
    ((struct sockaddr_in6 *)&bound)->sin6_port = rdma_get_src_port(state->listen_id);
  char where[80];
  hoop__format_sockaddr((struct sockaddr *)&bound, where, sizeof where);
  snprintf(addr, addrlen, "ib:%s", where);
  HOOP_INFO(HOOP_SUBSYS_NET,
            "ibverbs: listening on %s (device %s port %d, %d slots of %zu bytes "
            "per peer)",
            where, state->device, state->port, state->slots, state->slot_bytes);
  return HOOP_OK;
}

static hoop_result ib_connect(hoop_comm *comm, int peer) {
  hoop_result result = ensure_peers(comm);
  if (result != HOOP_OK)
    return result;
  if (ib_state_of(comm)->peers[peer].state == IB_PEER_UP)
    return HOOP_OK;
  return hoop__ib_connect(comm, peer);
}

/* 1 when a peer that said bye and closed still has arrived slots nobody has copied out: as over
 * TCP, where the end of the stream comes after the data in front of it, they can be received. */
static int parked_after_bye(ib_state *state, const ib_peer *peer) {
  if (peer->state != IB_PEER_CLOSED || !peer->said_bye || !peer->slot_kind)
    return 0;
  for (uint64_t n = peer->slots_consumed; n < peer->slots_arrived; n++)
    if (peer->slot_kind[n % (uint64_t)state->slots] != IB_SLOT_BYE)
      return 1;
  return 0;
}

static hoop_result post(hoop_comm *comm, int index, void *buf, size_t len, hoop__request *req,
                        int is_send) {
  req->peer = index;
  req->is_send = is_send;
  req->pending = 0;
  if (comm->failed)
    return comm->failed;
  hoop_result result = ensure_peers(comm);
  if (result != HOOP_OK)
    return result;
  ib_peer *peer = &ib_state_of(comm)->peers[index];
  int parked = !is_send && parked_after_bye(ib_state_of(comm), peer);
  if (!parked && (result = ib_connect(comm, index)) != HOOP_OK)
    return result;
  if (peer->state != IB_PEER_UP && !parked)
    return hoop__ib_peer_gone(comm, index, is_send ? "send" : "receive", "the connection closed");
  hoop__fragment *frag = &req->frags[0];
  frag->owner = req;
  frag->buf = buf;
  frag->len = len;
  frag->done = 0;
  frag->next = NULL;
  req->pending = 1;
  hoop__fragment **head = is_send ? &peer->send_head : &peer->recv_head;
  hoop__fragment **tail = is_send ? &peer->send_tail : &peer->recv_tail;
  if (*tail)
    (*tail)->next = frag;
  else
    *head = frag;
  *tail = frag;
  int moved = 0;
  if (is_send)
    return drive_send(comm, index, &moved);
  if ((result = drive_recv(comm, index, &moved)) != HOOP_OK || !parked || req->pending == 0)
    return result;
  /* What the peer sent before its bye did not fill this receive, and nothing more will come. */
  return hoop__ib_peer_error(comm, index, HOOP_ERR_PEER_LOST, "receive",
                             "the connection closed (it had finalized)");
}

static hoop_result ib_isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                            hoop__request *req) {
  /* The transport never writes through a send buffer; the cast only shares the fragment type. */
  return post(comm, peer, (void *)(uintptr_t)buf, len, req, 1);
}

static hoop_result ib_irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req) {
  return post(comm, peer, buf, len, req, 0);
}

/* What is queued for peer (for the stall warning). */
static int ib_pending(hoop_comm *comm, int peer) {
  const ib_peer *p = &ib_state_of(comm)->peers[peer];
  return (p->recv_head ? HOOP__PENDING_RECV : 0) | (p->send_head ? HOOP__PENDING_SEND : 0);
}

static hoop_result ib_timed_out(hoop_comm *comm, const hoop__request *req) {
  return hoop__ib_peer_error(comm, req->peer, HOOP_ERR_TIMEOUT, req->is_send ? "send" : "receive",
                             req->is_send ? "no data accepted for HOOP_TIMEOUT"
                                          : "no data received for HOOP_TIMEOUT");
}

/* Polls without sleeping for HOOP_IB_SPIN_US, then sleeps on the completion channel. */
static hoop_result ib_wait(hoop_comm *comm, hoop__request *req) {
  hoop__wait_hooks hooks = {ib_state_of(comm)->spin_s, progress, ib_pending, ib_timed_out};
  return hoop__wait_loop(comm, req, &hooks);
}

/* ---- the end --------------------------------------------------------------------------------- */

/* A notice (after a failure) or a bye (at finalize) into the slot kept for it. */
static int send_goodbye(hoop_comm *comm, int index) {
  ib_state *state = ib_state_of(comm);
  ib_peer *peer = &state->peers[index];
  if (peer->state != IB_PEER_UP || peer->control_sent || peer->slots_sent >= peer->credit_limit ||
      peer->sq_used >= state->max_send_wr)
    return 0;
  size_t len = 0;
  uint8_t *out = (uint8_t *)peer->control;
  if (comm->failed) {
    const char *text = comm->fail_cause[0] ? comm->fail_cause : hoop_strerror(comm->failed);
    len = strlen(text) > IB_NOTICE_MAX ? IB_NOTICE_MAX : strlen(text);
    encode_header(out, IB_MSG_NOTICE, len, NULL);
    hoop__put_be32(out + 16, (uint32_t)comm->failed);
    hoop__put_be32(out + 20, (uint32_t)(comm->fail_origin >= 0 ? comm->fail_origin : comm->rank));
    memcpy(out + IB_HEADER_BYTES, text, len);
  } else {
    encode_header(out, IB_MSG_BYE, 0, NULL);
  }
  uint32_t slot = (uint32_t)(peer->slots_sent % (uint64_t)state->slots);
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)out,
                        .length = (uint32_t)(IB_HEADER_BYTES + len),
                        .lkey = peer->control_mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id(peer, index, IB_WR_CONTROL);
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.imm_data = htonl(IB_IMM_CONTROL | slot);
  wr.wr.rdma.remote_addr = peer->remote_addr + (uint64_t)slot * state->slot_bytes;
  wr.wr.rdma.rkey = peer->remote_rkey;
  if (ibv_post_send(peer->id->qp, &wr, &bad) != 0)
    return 0;
  peer->sq_used++;
  peer->slots_sent++;
  peer->control_sent = 1;
  return 1;
}

static void ib_shutdown(hoop_comm *comm) {
  ib_state *state = ib_state_of(comm);
  if (!state || !state->peers || state->closing)
    return;
  state->closing = 1;
  int sent = 0;
  for (int p = 0; p < comm->size; p++)
    sent += send_goodbye(comm, p);
  /* The goodbyes go after this rank's last data on each queue pair; their completions say all
   * of it reached the peers. */
  double wait_s = comm->failed                   ? GOODBYE_WAIT_S
                  : comm->timeout_s < BYE_WAIT_S ? comm->timeout_s
                                                 : BYE_WAIT_S;
  double deadline = hoop__now() + wait_s;
  while (sent > 0 && hoop__now() < deadline) {
    int done = 0, moved = 0;
    for (int p = 0; p < comm->size; p++)
      done += state->peers[p].control_sent && state->peers[p].control_done;
    /* A peer that disconnected meanwhile flushes its goodbye; its event must be read for that. */
    if (done == sent || hoop__ib_poll_cq(comm, &moved) != HOOP_OK ||
        hoop__ib_pump_cm(comm, &moved) != HOOP_OK)
      break;
    if (!moved)
      sched_yield();
  }
  for (int p = 0; p < comm->size; p++) {
    ib_peer *peer = &state->peers[p];
    if (peer->id && peer->state == IB_PEER_UP && rdma_disconnect(peer->id) != 0)
      HOOP_TRACE(HOOP_SUBSYS_NET, "ibverbs: rdma_disconnect(rank %d): %s", p, strerror(errno));
    hoop__ib_close_peer(state, peer);
    peer->send_head = peer->send_tail = peer->recv_head = peer->recv_tail = NULL;
    peer->zsend_finishing = NULL;
    peer->zsend_state = IB_ZSEND_NONE;
    peer->zwrites_inflight = 0;
    peer->cts_seen = peer->cts_pending = peer->head_zcopy = 0;
  }
  state->closing = 0;
}

static void ib_finalize(hoop_comm *comm) {
  ib_state *state = ib_state_of(comm);
  if (!state)
    return;
  ib_shutdown(comm);
  if (state->peers)
    HOOP_INFO(HOOP_SUBSYS_NET,
              "ibverbs: %llu messages went zero-copy, %llu were declined by "
              "receivers without registered buffers; %llu ibv_reg_mr calls for registered "
              "buffers",
              state->zcopy_msgs, state->zcopy_declined, state->reg_calls);
  ib_forget_mem(comm, NULL, 0);
  if (state->cq && ibv_destroy_cq(state->cq) != 0)
    HOOP_WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_destroy_cq: %s", strerror(errno));
  if (state->channel && ibv_destroy_comp_channel(state->channel) != 0)
    HOOP_WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_destroy_comp_channel: %s", strerror(errno));
  if (state->pd && ibv_dealloc_pd(state->pd) != 0)
    HOOP_WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dealloc_pd: %s", strerror(errno));
  hoop__ib_free_cm(state);
  if (state->wake_fd >= 0)
    close(state->wake_fd);
  free(state->peers);
  free(state);
  comm->transport_state = NULL;
}

static void ib_wake(hoop_comm *comm) {
  ib_state *state = ib_state_of(comm);
  if (state)
    hoop__wake_signal(state->wake_fd, "ibverbs");
}

const hoop__transport_ops hoop__ibverbs_transport = {
    .name = "ibverbs",
    .listen = ib_listen,
    .connect = ib_connect,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .wait = ib_wait,
    .shutdown = ib_shutdown,
    .wake = ib_wake,
    .finalize = ib_finalize,
    .register_mem = ib_register_mem,
    .deregister_mem = ib_deregister_mem,
    .forget_mem = ib_forget_mem,
};
