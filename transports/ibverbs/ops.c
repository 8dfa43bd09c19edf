/* ops.c - the verbs transport's ops: listen (device, connection manager, completion queue),
 * connect, isend and irecv, wait; at the end a notice or bye to each peer, then the teardown. The
 * ops table is here. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibverbs.h"
#include "util/be.h"
#include "util/netaddr.h"

#define GOODBYE_WAIT_S 0.5
#define BYE_WAIT_S 10.0

/* ---- the ops --------------------------------------------------------------------------------- */

static hoop_result ensure_peers(hoop__tctx *ctx) {
  ib_state *state = ib_state_of(ctx);
  if (state->peers)
    return HOOP_OK;
  state->peers = calloc((size_t)ctx->size, sizeof *state->peers);
  if (!state->peers)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: out of memory for %d peers", ctx->size);
  return HOOP_OK;
}

static hoop_result create_queues(hoop__tctx *ctx, ib_state *state) {
  struct ibv_device_attr attr;
  int err = ibv_query_device(state->verbs, &attr);
  if (err != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_query_device(%s): %s",
                           state->device, strerror(err));
  state->max_send_wr = state->slots + 8;
  state->max_recv_wr = 2 * state->slots + 8;
  if (state->max_send_wr > attr.max_qp_wr || state->max_recv_wr > attr.max_qp_wr)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "ibverbs: HOOP_IB_SLOTS=%d needs %d work "
                           "requests per queue; %s allows %d",
                           state->slots, state->max_recv_wr, state->device, attr.max_qp_wr);
  long cqe = (long)(ctx->size > 1 ? ctx->size - 1 : 1) * (state->max_send_wr + state->max_recv_wr);
  if (cqe > attr.max_cqe) /* a smaller queue could overrun, which breaks every queue pair */
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "ibverbs: %d ranks with HOOP_IB_SLOTS=%d "
                           "need a completion queue of %ld entries; %s allows %d (lower "
                           "HOOP_IB_SLOTS, or use HOOP_TRANSPORT=tcp)",
                           ctx->size, state->slots, cqe, state->device, attr.max_cqe);
  if (!(state->pd = ibv_alloc_pd(state->verbs)))
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_alloc_pd(%s): %s",
                           state->device, strerror(errno));
  if (!(state->channel = ibv_create_comp_channel(state->verbs)))
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_create_comp_channel: %s",
                           strerror(errno));
  int flags = fcntl(state->channel->fd, F_GETFL);
  if (flags < 0 || fcntl(state->channel->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM,
                           "ibverbs: fcntl on the completion channel: %s", strerror(errno));
  flags = fcntl(state->verbs->async_fd, F_GETFL);
  if (flags < 0 || fcntl(state->verbs->async_fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: fcntl on the async event fd: %s",
                           strerror(errno));
  if (!(state->cq = ibv_create_cq(state->verbs, (int)cqe, NULL, state->channel, 0)))
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_create_cq(%ld): %s", cqe,
                           strerror(errno));
  return HOOP_OK;
}

static hoop_result ib_listen(hoop__tctx *ctx, const struct sockaddr *toward, char *addr,
                             size_t addrlen) {
  ib_state *state = calloc(1, sizeof *state);
  if (!state)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: out of memory");
  ctx->state = state;
  state->wake_fd = hoop__wake_open();
  if (state->wake_fd < 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: eventfd: %s", strerror(errno));
  /* RDMA writes land in the peer's memory as they left this one's: nothing could seal them. */
  if (hoop__encrypt_asked(ctx->encrypt))
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                           "ibverbs: HOOP_ENCRYPT=%s, and RDMA carries data in clear; TCP "
                           "serves the pairs across hosts instead",
                           ctx->encrypt);
  hoop_result result = hoop__ib_choose_device(ctx, state, toward);
  if (result == HOOP_OK)
    result = hoop__ib_listen_cm(ctx, state);
  if (result == HOOP_OK)
    result = create_queues(ctx, state);
  if (result != HOOP_OK)
    return result;
  struct sockaddr_storage bound = state->bind_addr;
  if (bound.ss_family == AF_INET)
    ((struct sockaddr_in *)&bound)->sin_port = rdma_get_src_port(state->listen_id);
  else
    ((struct sockaddr_in6 *)&bound)->sin6_port = rdma_get_src_port(state->listen_id);
  char where[80];
  hoop__format_sockaddr((struct sockaddr *)&bound, where, sizeof where);
  snprintf(addr, addrlen, "%s", where); /* the core marks it with .addr_prefix */
  HOOP__INFO(HOOP_SUBSYS_NET,
             "ibverbs: listening on %s (device %s port %d, %d slots of %zu bytes "
             "per peer)",
             where, state->device, state->port, state->slots, state->slot_bytes);
  return HOOP_OK;
}

static hoop_result ib_connect(hoop__tctx *ctx, int peer) {
  hoop_result result = ensure_peers(ctx);
  if (result != HOOP_OK)
    return result;
  if (ib_state_of(ctx)->peers[peer].state == IB_PEER_UP)
    return HOOP_OK;
  return hoop__ib_connect(ctx, peer);
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

static hoop_result post(hoop__tctx *ctx, int index, void *buf, size_t len, hoop__transfer *req,
                        int is_send) {
  req->peer = index;
  req->is_send = is_send;
  hoop__transfer_set_pending(req, 0);
  if (*ctx->failed)
    return *ctx->failed;
  hoop_result result = ensure_peers(ctx);
  if (result != HOOP_OK)
    return result;
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  int parked = !is_send && parked_after_bye(ib_state_of(ctx), peer);
  if (!parked && (result = ib_connect(ctx, index)) != HOOP_OK)
    return result;
  if (peer->state != IB_PEER_UP && !parked)
    return hoop__ib_peer_gone(ctx, index, is_send ? "send" : "receive", "the connection closed");
  hoop__fragment *frag = ib_frag(req);
  frag->owner = req;
  frag->buf = buf;
  frag->len = len;
  frag->done = 0;
  frag->next = NULL;
  hoop__transfer_set_pending(req, 1);
  hoop__fragment **head = is_send ? &peer->send_head : &peer->recv_head;
  hoop__fragment **tail = is_send ? &peer->send_tail : &peer->recv_tail;
  if (*tail)
    (*tail)->next = frag;
  else
    *head = frag;
  *tail = frag;
  int moved = 0;
  if (is_send)
    return hoop__ib_drive_send(ctx, index, &moved);
  if ((result = hoop__ib_drive_recv(ctx, index, &moved)) != HOOP_OK || !parked ||
      hoop__transfer_pending(req) == 0)
    return result;
  /* What the peer sent before its bye did not fill this receive, and nothing more will come. */
  return hoop__ib_peer_error(ctx, index, HOOP_ERR_PEER_LOST, "receive",
                             "the connection closed (it had finalized)");
}

static hoop_result ib_isend(hoop__tctx *ctx, int peer, const void *buf, size_t len,
                            hoop__transfer *req) {
  /* The transport never writes through a send buffer; the cast only shares the fragment type. */
  return post(ctx, peer, (void *)(uintptr_t)buf, len, req, 1);
}

static hoop_result ib_irecv(hoop__tctx *ctx, int peer, void *buf, size_t len, hoop__transfer *req) {
  return post(ctx, peer, buf, len, req, 0);
}

/* What is queued for peer (for the stall warning). */
static int ib_pending(hoop__tctx *ctx, int peer) {
  const ib_peer *p = &ib_state_of(ctx)->peers[peer];
  return (p->recv_head ? HOOP__PENDING_RECV : 0) | (p->send_head ? HOOP__PENDING_SEND : 0);
}

static hoop_result ib_timed_out(hoop__tctx *ctx, const hoop__transfer *req, int in_grace) {
  (void)in_grace;
  return hoop__ib_peer_error(
      ctx, req->peer, HOOP_ERR_TIMEOUT, req->is_send ? "send" : "receive",
      req->is_send
          ? "no data accepted within the timeout (HOOP_TIMEOUT, or the communicator's own)"
          : "no data received within the timeout (HOOP_TIMEOUT, or the communicator's own)");
}

/* A wait polls without sleeping for HOOP_IB_SPIN_US, then sleeps on the completion channel. */
static double ib_spin_s(hoop__tctx *ctx) {
  return ib_state_of(ctx)->spin_s;
}

/* ibverbs serves a job only where every rank can use it, so that HOOP_TRANSPORT=auto falls back
 * to TCP on every rank alike when one rank has no active RDMA port. */
static int ib_can_reach(const hoop__tctx *ctx, int peer) {
  (void)peer;
  for (int r = 0; r < ctx->size; r++)
    if (!hoop__tctx_offered(ctx, r))
      return 0;
  return 1;
}

/* ---- the end --------------------------------------------------------------------------------- */

/* A notice (after a failure) or a bye (at finalize) into the slot kept for it. */
static int send_goodbye(hoop__tctx *ctx, int index) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  if (peer->state != IB_PEER_UP || peer->control_sent || peer->slots_sent >= peer->credit_limit ||
      peer->sq_used >= state->max_send_wr)
    return 0;
  size_t len = 0;
  uint8_t *out = (uint8_t *)peer->control;
  if (*ctx->failed) {
    int origin;
    const char *text;
    hoop__tctx_failure(ctx, &origin, &text);
    len = strlen(text) > IB_NOTICE_MAX ? IB_NOTICE_MAX : strlen(text);
    hoop__frame_encode(out, IB_HEADER_MAGIC, IB_MSG_NOTICE, 0, len, NULL);
    hoop__put_be32(out + 16, (uint32_t)*ctx->failed);
    hoop__put_be32(out + 20, (uint32_t)origin);
    memcpy(out + IB_HEADER_BYTES, text, len);
  } else {
    hoop__frame_encode(out, IB_HEADER_MAGIC, IB_MSG_BYE, 0, 0, NULL);
  }
  uint32_t slot = (uint32_t)(peer->slots_sent % (uint64_t)state->slots);
  struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)out,
                        .length = (uint32_t)(IB_HEADER_BYTES + len),
                        .lkey = peer->control_mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = hoop__ib_wr_id(peer, index, IB_WR_CONTROL);
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

static void ib_shutdown(hoop__tctx *ctx) {
  ib_state *state = ib_state_of(ctx);
  if (!state || !state->peers || state->closing)
    return;
  state->closing = 1;
  int sent = 0;
  for (int p = 0; p < ctx->size; p++)
    sent += send_goodbye(ctx, p);
  /* The goodbyes go after this rank's last data on each queue pair; their completions say all
   * of it reached the peers. */
  double wait_s = *ctx->failed                  ? GOODBYE_WAIT_S
                  : ctx->timeout_s < BYE_WAIT_S ? ctx->timeout_s
                                                : BYE_WAIT_S;
  double deadline = hoop__now() + wait_s;
  while (sent > 0 && hoop__now() < deadline) {
    int done = 0, moved = 0;
    for (int p = 0; p < ctx->size; p++)
      done += state->peers[p].control_sent && state->peers[p].control_done;
    /* A peer that disconnected meanwhile flushes its goodbye; its event must be read for that. */
    if (done == sent || hoop__ib_poll_cq(ctx, &moved) != HOOP_OK ||
        hoop__ib_pump_cm(ctx, &moved) != HOOP_OK)
      break;
    if (!moved)
      sched_yield();
  }
  for (int p = 0; p < ctx->size; p++) {
    ib_peer *peer = &state->peers[p];
    if (peer->id && peer->state == IB_PEER_UP && rdma_disconnect(peer->id) != 0)
      HOOP__TRACE(HOOP_SUBSYS_NET, "ibverbs: rdma_disconnect(rank %d): %s", p, strerror(errno));
    hoop__ib_close_peer(state, peer);
    peer->send_head = peer->send_tail = peer->recv_head = peer->recv_tail = NULL;
    peer->zsend_finishing = NULL;
    peer->zsend_state = IB_ZSEND_NONE;
    peer->zwrites_inflight = 0;
    peer->cts_seen = peer->cts_pending = peer->head_zcopy = 0;
  }
  state->closing = 0;
}

static void ib_finalize(hoop__tctx *ctx) {
  ib_state *state = ib_state_of(ctx);
  if (!state)
    return;
  ib_shutdown(ctx);
  if (state->peers)
    HOOP__INFO(HOOP_SUBSYS_NET,
               "ibverbs: %llu messages went zero-copy (%llu of them from GPU memory), %llu were "
               "declined by receivers without registered buffers; %llu ibv_reg_mr calls for "
               "registered buffers",
               state->zcopy_msgs, state->device_msgs, state->zcopy_declined, state->reg_calls);
  hoop__ib_forget_mem(ctx, NULL, 0);
  if (state->cq && ibv_destroy_cq(state->cq) != 0)
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_destroy_cq: %s", strerror(errno));
  if (state->channel && ibv_destroy_comp_channel(state->channel) != 0)
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_destroy_comp_channel: %s", strerror(errno));
  if (state->pd && ibv_dealloc_pd(state->pd) != 0)
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dealloc_pd: %s", strerror(errno));
  hoop__ib_free_cm(state);
  if (state->wake_fd >= 0)
    close(state->wake_fd);
  hoop__ib_free_device_mrs(state);
  free(state->peers);
  hoop__pollset_free(&state->pollset);
  free(state);
  ctx->state = NULL;
}

static void ib_wake(hoop__tctx *ctx) {
  ib_state *state = ib_state_of(ctx);
  if (state)
    hoop__wake_signal(state->wake_fd, "ibverbs");
}

const hoop__transport_ops hoop__ibverbs_transport = {
    .name = "ibverbs",
    .caps = HOOP__TCAP_REGISTERS,
    .auto_role = HOOP__AUTO_IF_USABLE,
    .auto_alone = "every rank has an active RDMA port",
    .auto_absent = "no active RDMA port here",
    .addr_prefix = "ib:",
    .listen = ib_listen,
    .can_reach = ib_can_reach,
    .connect = ib_connect,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .progress = hoop__ib_progress,
    .sleep_prepare = hoop__ib_sleep_prepare,
    .sleep_done = hoop__ib_sleep_done,
    .pending = ib_pending,
    .timed_out = ib_timed_out,
    .spin_s = ib_spin_s,
    .shutdown = ib_shutdown,
    .wake = ib_wake,
    .finalize = ib_finalize,
    .register_mem = hoop__ib_register_mem,
    .deregister_mem = hoop__ib_deregister_mem,
    .forget_mem = hoop__ib_forget_mem,
};
