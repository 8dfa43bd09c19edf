/* data.c - the verbs transport's data path: messages cut into slots, RDMA-written with immediate
 * data, copied out on arrival, slots returned as credits, and zero-copy sends as a rendezvous.
 * Completions and the progress engine are in progress.c, the ops in ops.c, registrations in mr.c.
 *
 * Failures: a completion with an error status, a connection event that says the peer went away,
 * or nothing moving for HOOP_TIMEOUT become HOOP_ERR_PEER_LOST (or HOOP_ERR_TIMEOUT) naming the
 * peer. Before closing, a rank writes a notice {code, origin rank, message} after a failure, or a
 * bye at finalize, into the slot it keeps for that, so peers say who started it and a peer that
 * finished is told apart from one that died.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "ibverbs.h"
#include "util/be.h"

/* ---- errors ---------------------------------------------------------------------------------- */

hoop_result hoop__ib_peer_error(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                                const char *detail) {
  char ib_what[160];
  snprintf(ib_what, sizeof ib_what, "ibverbs %s", what);
  return hoop__peer_failed(ctx, peer, code, ib_what, detail);
}

hoop_result hoop__ib_peer_gone(hoop__tctx *ctx, int index, const char *what, const char *detail) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  if (state->closing || *ctx->failed)
    return *ctx->failed;
  int was_closed = peer->state == IB_PEER_CLOSED;
  peer->state = IB_PEER_CLOSED;
  if (!was_closed && peer->slot_kind) {
    /* What arrived before the end is still in the slots: deliver it, or find the notice. */
    int moved = 0;
    hoop_result result = hoop__ib_drive_recv(ctx, index, &moved);
    if (result != HOOP_OK || *ctx->failed)
      return result;
  }
  if (peer->notice_seen)
    return hoop__peer_notice(ctx->comm, index, peer->notice_code, peer->notice_origin,
                             peer->notice);
  if (peer->said_bye && !peer->recv_head && !peer->send_head)
    return HOOP_OK;
  char text[256];
  snprintf(text, sizeof text, "%s%s", detail, peer->said_bye ? " (it had finalized)" : "");
  return hoop__ib_peer_error(ctx, index, HOOP_ERR_PEER_LOST, what, text);
}

/* ---- posting --------------------------------------------------------------------------------- */

uint64_t hoop__ib_wr_id(const ib_peer *peer, int index, enum ib_wr_kind kind) {
  return (uint64_t)peer->generation << 32 | (uint64_t)(uint32_t)index << 8 | (uint64_t)kind;
}

/* Receives take no buffer: writes with immediate data land in the slots, and only the immediate
 * and the length come with the completion. */
hoop_result hoop__ib_post_recvs(hoop__tctx *ctx, int index, int count) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  for (int i = 0; i < count; i++) {
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = hoop__ib_wr_id(peer, index, IB_WR_RECV);
    int err = ibv_post_recv(peer->id->qp, &wr, &bad);
    if (err != 0)
      return hoop__ib_peer_error(ctx, index, HOOP_ERR_SYSTEM, "ibv_post_recv", strerror(err));
    peer->posted_recvs++;
  }
  return HOOP_OK;
}

/* One RDMA write of bytes at local (lkey) to remote (rkey) on peer index's queue pair: with the
 * immediate imm (IBV_WR_RDMA_WRITE_WITH_IMM), or plain (IBV_WR_RDMA_WRITE, imm unused). */
static hoop_result post_rdma(hoop__tctx *ctx, int index, const char *local, uint32_t lkey,
                             uint32_t bytes, uint64_t remote, uint32_t rkey,
                             enum ibv_wr_opcode opcode, uint32_t imm, enum ib_wr_kind kind,
                             const char *what) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)local, .length = bytes, .lkey = lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = hoop__ib_wr_id(peer, index, kind);
  wr.opcode = opcode;
  wr.sg_list = bytes ? &sge : NULL;
  wr.num_sge = bytes ? 1 : 0;
  if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
    wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  int err = ibv_post_send(peer->id->qp, &wr, &bad);
  if (err != 0)
    return hoop__ib_peer_gone(ctx, index, what, strerror(err));
  peer->sq_used++;
  return HOOP_OK;
}

static hoop_result post_write(hoop__tctx *ctx, int index, char *local, uint32_t lkey,
                              uint32_t bytes, uint64_t remote, uint32_t imm, enum ib_wr_kind kind) {
  return post_rdma(ctx, index, local, lkey, bytes, remote,
                   ib_state_of(ctx)->peers[index].remote_rkey, IBV_WR_RDMA_WRITE_WITH_IMM, imm,
                   kind, "ibv_post_send");
}

/* A piece of a zero-copy payload: a plain RDMA write into the buffer the peer's CTS named; the
 * ZDONE that follows it on the same queue pair lands after it (RC writes are placed in order). */
static hoop_result post_zwrite(hoop__tctx *ctx, int index, const char *local, uint32_t lkey,
                               uint32_t bytes, uint64_t remote, uint32_t rkey) {
  hoop_result result = post_rdma(ctx, index, local, lkey, bytes, remote, rkey, IBV_WR_RDMA_WRITE, 0,
                                 IB_WR_ZWRITE, "ibv_post_send (zero-copy write)");
  if (result == HOOP_OK)
    ib_state_of(ctx)->peers[index].zwrites_inflight++;
  return result;
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
static hoop_result send_small(hoop__tctx *ctx, int index, const uint8_t *bytes, uint32_t len,
                              uint32_t imm_flag) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  uint32_t slot = (uint32_t)(peer->slots_sent % (uint64_t)state->slots);
  char *where = peer->send_slots + (size_t)slot * state->slot_bytes;
  memcpy(where, bytes, len);
  hoop_result result = post_write(ctx, index, where, peer->send_mr->lkey, len,
                                  peer->remote_addr + (uint64_t)slot * state->slot_bytes,
                                  slot | imm_flag, IB_WR_DATA);
  if (result == HOOP_OK)
    peer->slots_sent++;
  return result;
}

void hoop__ib_zsend_complete(ib_peer *peer) {
  if (peer->zsend_finishing && peer->zwrites_inflight == 0) {
    hoop__transfer_set_pending(peer->zsend_finishing, peer->zsend_finishing->pending - 1);
    peer->zsend_finishing = NULL;
  }
}

/* The head message as a rendezvous. Returns with *handled 0 when the head goes through the slots
 * as usual; otherwise with what could be done now done. */
static hoop_result drive_zsend(hoop__tctx *ctx, int index, int *handled, int *moved) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  hoop__fragment *frag = peer->send_head;
  *handled = 0;
  /* Below HOOP_IB_ZCOPY_MIN only a message from GPU memory goes as a rendezvous (it must: the
   * slots are host memory); an empty message never needs one. */
  int small = state->zcopy_min == 0 || frag->len < state->zcopy_min;
  if (peer->zsend_state == IB_ZSEND_COPY || peer->head_started ||
      (small && (state->ndevice_mrs == 0 || frag->len == 0)))
    return HOOP_OK;
  *handled = 1;
  uint8_t header[IB_HEADER_BYTES];
  if (peer->zsend_state == IB_ZSEND_NONE) {
    peer->zsend_mr = small ? hoop__ib_device_mr(state, frag->buf, frag->len)
                           : hoop__ib_find_mr(ctx, frag->buf, frag->len);
    if (!peer->zsend_mr) {
      peer->zsend_state = IB_ZSEND_COPY;
      *handled = 0;
      return HOOP_OK;
    }
    hoop__frame_encode(header, IB_HEADER_MAGIC, IB_MSG_RTS, frag->owner->channel, frag->len,
                       frag->owner->fingerprint);
    hoop_result result = send_small(ctx, index, header, IB_HEADER_BYTES, 0);
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
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d cleared %llu bytes for a "
                        "%zu-byte message",
                        index, (unsigned long long)peer->cts_len, frag->len);
    if (!peer->cts_zcopy) {
      if (hoop__ib_mr_is_device(state, peer->zsend_mr))
        return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                          "ibverbs: rank %d has no registered buffer for a %zu-byte message from "
                          "GPU memory, which cannot go through host slots",
                          index, frag->len);
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
        post_zwrite(ctx, index, frag->buf + peer->zsend_posted, peer->zsend_mr->lkey, piece,
                    peer->cts_addr + peer->zsend_posted, peer->cts_rkey);
    if (result != HOOP_OK)
      return result;
    peer->zsend_posted += piece;
    *moved = 1;
  }
  if (peer->zsend_posted < frag->len || !slot_free(state, peer))
    return HOOP_OK;
  hoop__frame_encode(header, IB_HEADER_MAGIC, IB_MSG_ZDONE, frag->owner->channel, frag->len,
                     frag->owner->fingerprint);
  hoop_result result = send_small(ctx, index, header, IB_HEADER_BYTES, 0);
  if (result != HOOP_OK)
    return result;
  state->zcopy_msgs++;
  if (hoop__ib_mr_is_device(state, peer->zsend_mr))
    state->device_msgs++;
  peer->send_head = frag->next;
  if (!peer->send_head)
    peer->send_tail = NULL;
  peer->zsend_state = IB_ZSEND_NONE;
  /* The request completes when its last piece has: until then its buffer is still being read. */
  peer->zsend_finishing = frag->owner;
  hoop__ib_zsend_complete(peer);
  *moved = 1;
  return HOOP_OK;
}

/* A CTS owed to the peer goes first, outside the message order, so that it never waits behind
 * this side's own messages (which may themselves wait for the peer). */
static hoop_result send_cts(hoop__tctx *ctx, int index, int *moved) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  if (!peer->cts_pending || !slot_free(state, peer))
    return HOOP_OK;
  hoop_result result = send_small(ctx, index, peer->cts_out, IB_CTS_BYTES, IB_IMM_CTS);
  if (result == HOOP_OK) {
    peer->cts_pending = 0;
    *moved = 1;
  }
  return result;
}

/* Copy as much of the queued messages into send slots and write them as credits and the send
 * queue allow; the last remote slot and a few send work requests stay free for the control
 * message and credit returns. A send completes once its last byte is copied. */
hoop_result hoop__ib_drive_send(hoop__tctx *ctx, int index, int *moved) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  hoop_result result = send_cts(ctx, index, moved);
  if (result != HOOP_OK)
    return result;
  while (peer->send_head && slot_free(state, peer)) {
    int handled = 0;
    if ((result = drive_zsend(ctx, index, &handled, moved)) != HOOP_OK)
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
      hoop__frame_encode((uint8_t *)where, IB_HEADER_MAGIC, IB_MSG_DATA, frag->owner->channel,
                         frag->owner->len, frag->owner->fingerprint);
      used = IB_HEADER_BYTES;
      room = state->slot_bytes - IB_HEADER_BYTES;
    }
    size_t take = frag->len - frag->done < room ? frag->len - frag->done : room;
    memcpy(where + used, frag->buf + frag->done, take);
    result = post_write(ctx, index, where, peer->send_mr->lkey, (uint32_t)(used + take),
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
      hoop__transfer_set_pending(frag->owner, frag->owner->pending - 1);
    }
  }
  return HOOP_OK;
}

hoop_result hoop__ib_return_credits(hoop__tctx *ctx, int index, int force) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  uint32_t threshold = (uint32_t)(state->slots / 2 > 0 ? state->slots / 2 : 1);
  if (peer->state != IB_PEER_UP || peer->credits_owed == 0 ||
      (!force && peer->credits_owed < threshold) || peer->sq_used >= state->max_send_wr - 1)
    return HOOP_OK;
  hoop_result result = post_write(ctx, index, NULL, 0, 0, peer->remote_addr,
                                  IB_IMM_CREDIT | peer->credits_owed, IB_WR_CREDIT);
  if (result == HOOP_OK)
    peer->credits_owed = 0;
  return result;
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* A CTS arrived, answering this side's RTS: kept for drive_zsend at once, since slots in front
 * of it may wait for a receive that this side posts only after its send. */
static hoop_result on_cts(hoop__tctx *ctx, int index, uint32_t slot, const uint8_t *data,
                          uint32_t bytes) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  if (bytes != IB_CTS_BYTES || hoop__get_be32(data) != IB_HEADER_MAGIC ||
      hoop__frame_type(data) != IB_MSG_CTS)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a malformed CTS", index);
  if (peer->zsend_state != IB_ZSEND_WAIT_CTS || peer->cts_seen)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a CTS nobody asked for",
                      index);
  const uint8_t *body = data + IB_HEADER_BYTES;
  peer->cts_len = hoop__frame_length(data);
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
hoop_result hoop__ib_on_arrival(hoop__tctx *ctx, int index, uint32_t imm, uint32_t bytes) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  uint32_t slot = (uint32_t)(peer->slots_arrived % (uint64_t)state->slots);
  const uint8_t *data = (const uint8_t *)peer->recv_slots + (size_t)slot * state->slot_bytes;
  if (imm == (slot | IB_IMM_CTS))
    return on_cts(ctx, index, slot, data, bytes);
  int control = (imm & IB_IMM_CONTROL) != 0;
  imm &= ~IB_IMM_CONTROL;
  if (imm != slot || bytes > state->slot_bytes)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                      "ibverbs: rank %d wrote slot %u (%u bytes) where "
                      "slot %u was next",
                      index, imm, bytes, slot);
  peer->slot_len[slot] = bytes;
  peer->slots_arrived++;
  if (control) /* a notice or bye ends whatever message was arriving */
    peer->arrival_left = 0;
  if (peer->arrival_left > 0) {
    if (bytes > peer->arrival_left)
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d overran a message", index);
    peer->slot_kind[slot] = IB_SLOT_MORE;
    peer->arrival_left -= bytes;
    return HOOP_OK;
  }
  if (bytes < IB_HEADER_BYTES || hoop__get_be32(data) != IB_HEADER_MAGIC)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a malformed header",
                      index);
  uint32_t type = hoop__frame_type(data);
  uint64_t len = hoop__frame_length(data);
  if (type == IB_MSG_DATA) {
    if (control)
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d sent data as a control "
                        "message",
                        index);
    uint64_t here = bytes - IB_HEADER_BYTES;
    if (here > len)
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d sent a message longer than "
                        "its header says",
                        index);
    peer->slot_kind[slot] = IB_SLOT_HEADER;
    peer->arrival_left = len - here;
  } else if (type == IB_MSG_RTS || type == IB_MSG_ZDONE) {
    if (bytes != IB_HEADER_BYTES)
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent a malformed %s", index,
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
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                      "ibverbs: rank %d sent a message of unknown type "
                      "%u",
                      index, type);
  }
  return HOOP_OK;
}

/* The receive a message starting with a header or an RTS goes to (see "binding" in transport.h):
 * the first posted of its channel, moved to the front; a stray when only other channels' are
 * posted; NULL when nothing is posted (or out of memory, the failure recorded). */
static hoop__fragment *bind_recv(hoop__tctx *ctx, int index, const uint8_t *frame) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  hoop__fragment *head =
      hoop__frags_bind(&peer->recv_head, &peer->recv_tail, hoop__frame_channel(frame));
  if (head || !peer->recv_head)
    return head;
  char *buf;
  hoop__transfer *stray = hoop__tctx_divert(ctx, index, frame, &buf);
  if (!stray)
    return NULL;
  head = ib_frag(stray);
  *head = (hoop__fragment){.owner = stray, .buf = buf, .len = stray->len, .next = peer->recv_head};
  hoop__transfer_set_pending(stray, 1);
  peer->recv_head = head;
  return head;
}

static void finish_recv_head(hoop__tctx *ctx, int index, ib_peer *peer) {
  hoop__fragment *frag = peer->recv_head;
  /* A large message's time from its header to its last byte (or the RDMA write's ZDONE) is the
   * link's (hoop_comm_stats' goodput by peer). */
  if (peer->head_first_at > 0)
    hoop__tctx_link_time(ctx, index, frag->owner->len, hoop__now() - peer->head_first_at);
  peer->head_first_at = 0;
  peer->recv_head = frag->next;
  if (!peer->recv_head)
    peer->recv_tail = NULL;
  peer->head_checked = 0;
  hoop__transfer_set_pending(frag->owner, frag->owner->pending - 1);
}

/* An RTS for the head receive (its header already checked against it): offer the buffer when
 * it is registered, else ask for the slots. The payload must come whole, so a receive that has
 * taken bytes already (impossible from a sender that follows the protocol) is refused. */
static hoop_result answer_rts(hoop__tctx *ctx, int index) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  hoop__fragment *head = peer->recv_head;
  if (peer->cts_pending || head->done != 0)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                      "ibverbs: rank %d sent an RTS in the middle of "
                      "a message",
                      index);
  struct ibv_mr *mr = hoop__ib_find_mr(ctx, head->buf, head->len);
  uint64_t addr = (uint64_t)(uintptr_t)head->buf;
  hoop__frame_encode(peer->cts_out, IB_HEADER_MAGIC, IB_MSG_CTS, 0, head->len, NULL);
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES, mr ? 1 : 0);
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES + 4, mr ? mr->rkey : 0);
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES + 8, (uint32_t)(addr >> 32));
  hoop__put_be32(peer->cts_out + IB_HEADER_BYTES + 12, (uint32_t)addr);
  peer->cts_pending = 1;
  peer->head_zcopy = mr != NULL;
  return send_cts(ctx, index, &(int){0});
}

/* A ZDONE: the payload is in the head receive's buffer, written before it on this queue pair. */
static hoop_result finish_zcopy(hoop__tctx *ctx, int index) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  peer->recv_head->done = peer->recv_head->len;
  peer->head_zcopy = 0;
  finish_recv_head(ctx, index, peer);
  return HOOP_OK;
}

/* Copy arrived slots, in order, into the posted receives. */
hoop_result hoop__ib_drive_recv(hoop__tctx *ctx, int index, int *moved) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
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
      return hoop__peer_notice(ctx->comm, index, peer->notice_code, peer->notice_origin,
                               peer->notice);
    }
    if (kind == IB_SLOT_HEADER || kind == IB_SLOT_RTS || kind == IB_SLOT_ZDONE) {
      if (kind == IB_SLOT_ZDONE && (!head || !peer->head_zcopy))
        return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                          "ibverbs: rank %d finished a zero-copy "
                          "write that no CTS offered",
                          index);
      if (kind != IB_SLOT_ZDONE && head && !peer->head_checked &&
          !(head = bind_recv(ctx, index, data)) && *ctx->failed)
        return *ctx->failed;
      if (!head) /* parked until its receive is posted; it may already show a mismatch */
        return hoop__mismatch_early(ctx->comm, index, hoop__frame_channel(data), data + 16);
      hoop_result checked = hoop__frame_check(ctx, index, data, head->owner);
      if (checked != HOOP_OK)
        return checked;
      peer->head_checked = 1;
      if (kind != IB_SLOT_ZDONE) /* a ZDONE ends the message its RTS began */
        peer->head_first_at = head->owner->len >= HOOP__LINK_MIN_BYTES ? hoop__now() : 0;
      data += IB_HEADER_BYTES;
      bytes -= IB_HEADER_BYTES;
      if (kind != IB_SLOT_HEADER) {
        hoop_result result =
            kind == IB_SLOT_RTS ? answer_rts(ctx, index) : finish_zcopy(ctx, index);
        if (result != HOOP_OK)
          return result;
        peer->slots_consumed++;
        peer->credits_owed++;
        *moved = 1;
        continue;
      }
      peer->head_zcopy = 0; /* the sender chose the slots after all */
      if (state->ndevice_mrs > 0 && head->len > 0 &&
          hoop__ib_device_mr(state, head->buf, head->len))
        return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                          "ibverbs: rank %d sent a %zu-byte message for GPU memory through host "
                          "slots instead of writing it there",
                          index, head->len);
    } else if (kind == IB_SLOT_MORE && (!head || !peer->head_checked)) {
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d continued a message that had "
                        "no receive",
                        index);
    }
    if (kind != IB_SLOT_BYE) {
      if (bytes > head->len - head->done)
        return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "ibverbs: rank %d sent more than posted",
                          index);
      memcpy(head->buf + head->done, data, bytes);
      head->done += bytes;
      if (head->done == head->len)
        finish_recv_head(ctx, index, peer);
    }
    peer->slots_consumed++;
    peer->credits_owed++;
    *moved = 1;
  }
  return HOOP_OK;
}
