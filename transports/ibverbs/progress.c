/* progress.c - the verbs transport's completions and progress engine: one completion queue for
 * every queue pair, polled while there is work and slept on through its completion channel (with
 * the connection events and the abort eventfd) when there is none. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "ibverbs.h"

/* ---- completions ----------------------------------------------------------------------------- */

static hoop_result on_completion(hoop__tctx *ctx, const struct ibv_wc *wc) {
  ib_state *state = ib_state_of(ctx);
  int index = (int)((wc->wr_id >> 8) & 0xffffff);
  enum ib_wr_kind kind = (enum ib_wr_kind)(wc->wr_id & 0xff);
  if (index < 0 || index >= ctx->size)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: a completion for unknown rank %d",
                      index);
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
    return hoop__ib_peer_gone(ctx, index,
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
      return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                        "ibverbs: rank %d sent without immediate data", index);
    if (imm & IB_IMM_CREDIT)
      peer->credit_limit += imm & ~IB_IMM_CREDIT;
    else
      result = hoop__ib_on_arrival(ctx, index, imm, wc->byte_len);
    /* The peer may write before this side has seen ESTABLISHED. */
    if (result == HOOP_OK && peer->id && peer->state != IB_PEER_CLOSED)
      result = hoop__ib_post_recvs(ctx, index, 1);
    return result;
  }
  case IB_WR_DATA: peer->slots_done++; return HOOP_OK;
  case IB_WR_CONTROL: peer->control_done = 1; return HOOP_OK;
  case IB_WR_ZWRITE:
    peer->zwrites_inflight--;
    hoop__ib_zsend_complete(peer);
    return HOOP_OK;
  default: return HOOP_OK;
  }
}

hoop_result hoop__ib_poll_cq(hoop__tctx *ctx, int *moved) {
  ib_state *state = ib_state_of(ctx);
  struct ibv_wc wcs[32];
  for (;;) {
    int n = ibv_poll_cq(state->cq, 32, wcs);
    if (n < 0)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_poll_cq failed (%d)", n);
    for (int i = 0; i < n; i++) {
      hoop_result result = on_completion(ctx, &wcs[i]);
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

static hoop_result drive_peers(hoop__tctx *ctx, int *moved) {
  ib_state *state = ib_state_of(ctx);
  /* No slots before the first connection (a rank whose first calls go over shared memory). */
  for (int p = 0; state->peers && p < ctx->size; p++) {
    ib_peer *peer = &state->peers[p];
    if (peer->state != IB_PEER_UP)
      continue;
    hoop_result result = hoop__ib_drive_recv(ctx, p, moved);
    if (result == HOOP_OK)
      result = hoop__ib_return_credits(ctx, p, 0);
    if (result == HOOP_OK)
      result = hoop__ib_drive_send(ctx, p, moved);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* The device's asynchronous events: a queue pair that went fatal loses its peer; the rest are
 * logged. */
static hoop_result drain_async(hoop__tctx *ctx, int *moved) {
  ib_state *state = ib_state_of(ctx);
  struct ibv_async_event event;
  while (ibv_get_async_event(state->verbs, &event) == 0) {
    enum ibv_event_type type = event.event_type;
    struct ibv_qp *qp = event.element.qp;
    ibv_ack_async_event(&event);
    *moved = 1;
    const char *what = ibv_event_type_str(type);
    if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
        type == IBV_EVENT_QP_ACCESS_ERR) {
      for (int p = 0; state->peers && p < ctx->size; p++)
        if (state->peers[p].id && state->peers[p].id->qp == qp) {
          char detail[96];
          snprintf(detail, sizeof detail, "asynchronous event %s", what);
          hoop_result result = hoop__ib_peer_gone(ctx, p, "queue pair", detail);
          if (result != HOOP_OK)
            return result;
        }
    } else if (type == IBV_EVENT_DEVICE_FATAL || type == IBV_EVENT_CQ_ERR) {
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: device %s: %s", state->device, what);
    } else {
      HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: device %s: asynchronous event %s", state->device, what);
    }
  }
  return HOOP_OK;
}

/* Arm the completion queue for an event; what completed before arming raises none, so look once
 * more: *moved when that found work (then do not sleep). */
static hoop_result arm(hoop__tctx *ctx, int *moved) {
  ib_state *state = ib_state_of(ctx);
  if (state->cq_armed)
    return HOOP_OK;
  if (ibv_req_notify_cq(state->cq, 0) != 0)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: ibv_req_notify_cq: %s",
                      strerror(errno));
  state->cq_armed = 1;
  return hoop__ib_poll_cq(ctx, moved);
}

/* The poll set's own entries (owners' peer): the device's asynchronous events first, then the
 * completion channel, then the connection events (which the next round reads). */
enum { OWN_ASYNC, OWN_CHANNEL, OWN_EVENTS };

/* The poll set: the wake eventfd, the watched descriptor when watch is set, the device's
 * asynchronous events, the completion channel and the connection events. */
static hoop_result build_pollset(hoop__tctx *ctx, int watch) {
  ib_state *state = ib_state_of(ctx);
  hoop__pollset *set = &state->pollset;
  hoop_result result = hoop__pollset_begin(ctx, set, 3, state->wake_fd, watch);
  if (result != HOOP_OK)
    return result;
  hoop__pollset_add(set, state->verbs->async_fd, POLLIN, OWN_ASYNC, 0);
  hoop__pollset_add(set, state->channel->fd, POLLIN, OWN_CHANNEL, 0);
  hoop__pollset_add(set, state->events->fd, POLLIN, OWN_EVENTS, 0);
  return HOOP_OK;
}

static hoop_result drive_ready(hoop__tctx *ctx, int own, int stream, int *moved) {
  (void)stream;
  ib_state *state = ib_state_of(ctx);
  if (own == OWN_ASYNC)
    return drain_async(ctx, moved);
  if (own == OWN_CHANNEL) {
    struct ibv_cq *cq;
    void *context;
    while (ibv_get_cq_event(state->channel, &cq, &context) == 0) {
      ibv_ack_cq_events(cq, 1);
      state->cq_armed = 0;
    }
  }
  return HOOP_OK;
}

/* What peers sent before the server's news still completes its receives. */
static hoop_result drive_before_watched(hoop__tctx *ctx, int *moved) {
  hoop_result result = hoop__ib_poll_cq(ctx, moved);
  return result == HOOP_OK ? drive_peers(ctx, moved) : result;
}

/* Act on the poll set's revents (the connection events are read by the next round). */
static hoop_result handle_pollset(hoop__tctx *ctx, int *moved) {
  ib_state *state = ib_state_of(ctx);
  return hoop__pollset_handle(ctx, &state->pollset, state->wake_fd, drive_ready,
                              drive_before_watched, moved);
}

static hoop_result sleep_on_events(hoop__tctx *ctx, int timeout_ms, int *moved) {
  ib_state *state = ib_state_of(ctx);
  hoop_result result = arm(ctx, moved);
  if (result != HOOP_OK || *moved)
    return result;
  /* The rendezvous connection too: another rank's abort or loss told by the server. */
  int ready = 0;
  if ((result = build_pollset(ctx, 1)) == HOOP_OK)
    result = hoop__pollset_wait(ctx, &state->pollset, timeout_ms, &ready);
  return result == HOOP_OK && ready > 0 ? handle_pollset(ctx, moved) : result;
}

hoop_result hoop__ib_sleep_prepare(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved) {
  ib_state *state = ib_state_of(ctx);
  *n = 0;
  state->pollset.used = 0;
  int found = 0;
  hoop_result result = arm(ctx, &found);
  if (result == HOOP_OK && !found && (result = build_pollset(ctx, 0)) == HOOP_OK)
    *n = state->pollset.used;
  *fds = state->pollset.fds;
  *moved |= found;
  return result;
}

hoop_result hoop__ib_sleep_done(hoop__tctx *ctx, int *moved) {
  return handle_pollset(ctx, moved);
}

/* One round: completions, connection events, then every connected peer's queues; with nothing
 * moved and timeout_ms > 0, sleep until something happens or timeout_ms passes. */
hoop_result hoop__ib_progress(hoop__tctx *ctx, int timeout_ms, int *moved) {
  hoop_result result = hoop__ib_poll_cq(ctx, moved);
  if (result == HOOP_OK)
    result = hoop__ib_pump_cm(ctx, moved);
  if (result == HOOP_OK)
    result = hoop__ib_retry_due(ctx);
  if (result == HOOP_OK)
    result = drive_peers(ctx, moved);
  if (result == HOOP_OK && !*moved && timeout_ms > 0)
    result = sleep_on_events(ctx, timeout_ms, moved);
  return result;
}
