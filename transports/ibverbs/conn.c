/* conn.c - reliable-connected queue pairs set up with librdmacm. Of each pair of ranks the lower
 * one connects and the higher one accepts (as over TCP); both sides' private data carry a hello
 * {magic, rank, job nonce, receive slots' address and key, slot count and size}, so a stranger is
 * rejected and each side learns where to write. A refused or failed connect is retried until the
 * deadline: a peer may be slow to take its connection requests. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibverbs.h"
#include "util/be.h"
#include "util/netaddr.h"

#define RESOLVE_TIMEOUT_MS 5000
#define RETRY_FIRST_S 0.05
#define RETRY_MAX_S 1.0

static int set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

hoop_result hoop__ib_listen_cm(hoop__tctx *ctx, ib_state *state) {
  state->events = rdma_create_event_channel();
  if (!state->events)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_create_event_channel: %s",
                           strerror(errno));
  if (set_nonblocking(state->events->fd) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: fcntl on the CM channel: %s",
                           strerror(errno));
  if (rdma_create_id(state->events, &state->listen_id, NULL, RDMA_PS_TCP) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_create_id: %s",
                           strerror(errno));
  char where[80];
  hoop__format_sockaddr((struct sockaddr *)&state->bind_addr, where, sizeof where);
  if (rdma_bind_addr(state->listen_id, (struct sockaddr *)&state->bind_addr) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                           "ibverbs: rdma_bind_addr(%s) for %s: %s", where, state->device,
                           strerror(errno));
  if (rdma_listen(state->listen_id, 512) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_listen on %s: %s", where,
                           strerror(errno));
  state->verbs = state->listen_id->verbs;
  if (!state->verbs)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED, "ibverbs: %s is not an RDMA address",
                           where);
  const char *bound = ibv_get_device_name(state->verbs->device);
  if (strcmp(bound, state->device) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                           "ibverbs: address %s belongs to %s, not to the chosen device %s", where,
                           bound, state->device);
  return HOOP_OK;
}

/* ---- the hello in private data --------------------------------------------------------------- */

typedef struct ib_hello {
  uint32_t rank;
  uint8_t nonce[HOOP__WIRE_NONCE];
  uint64_t addr;
  uint32_t rkey, slots, slot_bytes;
} ib_hello;

/* To the rank at index: the connect request, or the accept's reply; each carries the link's proof
 * from its sender to its receiver, so both ends prove the job's key to each other. */
static void encode_hello(hoop__tctx *ctx, int index, const ib_peer *peer, uint8_t *out) {
  ib_state *state = ib_state_of(ctx);
  uint64_t addr = (uint64_t)(uintptr_t)peer->recv_slots;
  hoop__put_be32(out, IB_HELLO_MAGIC);
  hoop__put_be32(out + 4, (uint32_t)ctx->rank);
  hoop__link_proof(ctx, "ibverbs", (uint32_t)ctx->rank, (uint32_t)index, 0, out + 8);
  hoop__put_be32(out + 8 + HOOP__WIRE_NONCE, (uint32_t)(addr >> 32));
  hoop__put_be32(out + 12 + HOOP__WIRE_NONCE, (uint32_t)addr);
  hoop__put_be32(out + 16 + HOOP__WIRE_NONCE, peer->recv_mr->rkey);
  hoop__put_be32(out + 20 + HOOP__WIRE_NONCE, (uint32_t)state->slots);
  hoop__put_be32(out + 24 + HOOP__WIRE_NONCE, (uint32_t)state->slot_bytes);
}

/* 0 when data holds a hello of this job. */
static int decode_hello(hoop__tctx *ctx, const void *data, size_t len, ib_hello *hello) {
  const uint8_t *in = data;
  if (!data || len < IB_HELLO_BYTES || hoop__get_be32(in) != IB_HELLO_MAGIC)
    return -1;
  hello->rank = hoop__get_be32(in + 4);
  if (hello->rank >= (uint32_t)ctx->size ||
      !hoop__link_proof_ok(ctx, "ibverbs", hello->rank, (uint32_t)ctx->rank, 0, in + 8))
    return -1;
  hello->addr = (uint64_t)hoop__get_be32(in + 8 + HOOP__WIRE_NONCE) << 32 |
                hoop__get_be32(in + 12 + HOOP__WIRE_NONCE);
  hello->rkey = hoop__get_be32(in + 16 + HOOP__WIRE_NONCE);
  hello->slots = hoop__get_be32(in + 20 + HOOP__WIRE_NONCE);
  hello->slot_bytes = hoop__get_be32(in + 24 + HOOP__WIRE_NONCE);
  return hello->rank < (uint32_t)ctx->size ? 0 : -1;
}

static hoop_result check_geometry(hoop__tctx *ctx, const ib_hello *hello) {
  ib_state *state = ib_state_of(ctx);
  if (hello->slots == (uint32_t)state->slots && hello->slot_bytes == state->slot_bytes)
    return HOOP_OK;
  return hoop__fail(ctx->comm, HOOP_ERR_INVALID_ARG,
                    "ibverbs: rank %u uses HOOP_IB_SLOTS=%u HOOP_IB_SLOT_BYTES=%u but this rank "
                    "uses %d and %zu; every rank of a job must use the same values",
                    hello->rank, hello->slots, hello->slot_bytes, state->slots, state->slot_bytes);
}

/* ---- per-connection resources ---------------------------------------------------------------- */

/* Slots, their registrations and the queue pair on id, with every receive posted: the peer may
 * write as soon as the connection is up. */
static hoop_result setup_connection(hoop__tctx *ctx, int index, struct rdma_cm_id *id) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  size_t bytes = (size_t)state->slots * state->slot_bytes;
  peer->id = id;
  id->context = (void *)(intptr_t)(index + 1);
  if (id->verbs != state->verbs)
    return hoop__ib_peer_error(ctx, index, HOOP_ERR_SYSTEM, "connect",
                               "the connection is on another RDMA device than the listener");
  if (posix_memalign((void **)&peer->recv_slots, 4096, bytes) != 0 ||
      posix_memalign((void **)&peer->send_slots, 4096, bytes) != 0 ||
      posix_memalign((void **)&peer->control, 4096, IB_HEADER_BYTES + IB_NOTICE_MAX) != 0 ||
      !(peer->slot_len = calloc((size_t)state->slots, sizeof *peer->slot_len)) ||
      !(peer->slot_kind = calloc((size_t)state->slots, sizeof *peer->slot_kind)))
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: out of memory for %zu bytes of slots",
                      2 * bytes);
  peer->recv_mr = ibv_reg_mr(state->pd, peer->recv_slots, bytes,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (peer->recv_mr)
    peer->send_mr = ibv_reg_mr(state->pd, peer->send_slots, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (peer->send_mr)
    peer->control_mr = ibv_reg_mr(state->pd, peer->control, IB_HEADER_BYTES + IB_NOTICE_MAX,
                                  IBV_ACCESS_LOCAL_WRITE);
  if (!peer->control_mr)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM,
                      "ibverbs: ibv_reg_mr of %zu bytes: %s (is the "
                      "locked-memory limit, ulimit -l, too low?)",
                      bytes, strerror(errno));
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = state->cq;
  attr.recv_cq = state->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = (uint32_t)state->max_send_wr;
  attr.cap.max_recv_wr = (uint32_t)state->max_recv_wr;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, state->pd, &attr) != 0)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_create_qp for rank %d: %s", index,
                      strerror(errno));
  uint8_t timeout = (uint8_t)state->qp_timeout;
  if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout))
    HOOP__INFO(HOOP_SUBSYS_NET, "ibverbs: cannot set the ACK timeout of rank %d's QP: %s", index,
               strerror(errno));
  peer->credit_limit = (uint64_t)state->slots;
  return hoop__ib_post_recvs(ctx, index, state->max_recv_wr);
}

/* Free what setup_connection made; the queues and counters are left alone. */
static void release_connection(ib_peer *peer) {
  if (peer->id && peer->id->qp) {
    rdma_destroy_qp(peer->id);
    peer->generation++; /* what it flushes is no longer counted (see wr_id) */
  }
  if (peer->id)
    rdma_destroy_id(peer->id);
  peer->id = NULL;
  if (peer->control_mr)
    ibv_dereg_mr(peer->control_mr);
  if (peer->send_mr)
    ibv_dereg_mr(peer->send_mr);
  if (peer->recv_mr)
    ibv_dereg_mr(peer->recv_mr);
  peer->control_mr = peer->send_mr = peer->recv_mr = NULL;
  free(peer->control);
  free(peer->send_slots);
  free(peer->recv_slots);
  free(peer->slot_kind);
  free(peer->slot_len);
  peer->control = peer->send_slots = peer->recv_slots = NULL;
  peer->slot_kind = NULL;
  peer->slot_len = NULL;
  peer->posted_recvs = peer->sq_used = 0;
}

void hoop__ib_close_peer(ib_state *state, ib_peer *peer) {
  (void)state;
  release_connection(peer);
  peer->state = IB_PEER_CLOSED;
}

void hoop__ib_free_cm(ib_state *state) {
  if (state->listen_id)
    rdma_destroy_id(state->listen_id);
  state->listen_id = NULL;
  if (state->events)
    rdma_destroy_event_channel(state->events);
  state->events = NULL;
}

/* ---- connecting ------------------------------------------------------------------------------ */

static hoop_result start_connect(hoop__tctx *ctx, int index) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  struct sockaddr_storage addr;
  socklen_t addrlen;
  hoop_result resolved = hoop__peer_sockaddr(ctx, index, "ibverbs", &addr, &addrlen);
  if (resolved != HOOP_OK)
    return resolved;
  peer->attempts++;
  if (rdma_create_id(state->events, &peer->id, (void *)(intptr_t)(index + 1), RDMA_PS_TCP) != 0)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_create_id: %s", strerror(errno));
  if (rdma_resolve_addr(peer->id, (struct sockaddr *)&state->bind_addr, (struct sockaddr *)&addr,
                        RESOLVE_TIMEOUT_MS) != 0)
    return hoop__ib_peer_error(ctx, index, HOOP_ERR_PEER_LOST, "rdma_resolve_addr",
                               strerror(errno));
  peer->state = IB_PEER_RESOLVING;
  return HOOP_OK;
}

/* This rank's connect went wrong: start over after a pause that doubles each time. */
static void schedule_retry(ib_peer *peer, const char *what) {
  release_connection(peer);
  peer->state = IB_PEER_NONE;
  double pause = RETRY_FIRST_S;
  for (int i = 1; i < peer->attempts && pause < RETRY_MAX_S; i++)
    pause *= 2;
  peer->retry_at = hoop__now() + (pause < RETRY_MAX_S ? pause : RETRY_MAX_S);
  snprintf(peer->last_event, sizeof peer->last_event, "%s", what);
}

hoop_result hoop__ib_retry_due(hoop__tctx *ctx) {
  ib_state *state = ib_state_of(ctx);
  double now = hoop__now();
  for (int p = ctx->rank + 1; p < ctx->size; p++) {
    ib_peer *peer = &state->peers[p];
    if (peer->state == IB_PEER_NONE && peer->attempts > 0 && now >= peer->retry_at) {
      hoop_result result = start_connect(ctx, p);
      if (result != HOOP_OK)
        return result;
    }
  }
  return HOOP_OK;
}

static hoop_result on_route_resolved(hoop__tctx *ctx, int index) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  hoop_result result = setup_connection(ctx, index, peer->id);
  if (result != HOOP_OK)
    return result;
  uint8_t hello[IB_HELLO_BYTES];
  encode_hello(ctx, index, peer, hello);
  struct rdma_conn_param param;
  memset(&param, 0, sizeof param);
  param.private_data = hello;
  param.private_data_len = sizeof hello;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_connect(peer->id, &param) != 0)
    return hoop__ib_peer_error(ctx, index, HOOP_ERR_PEER_LOST, "rdma_connect", strerror(errno));
  peer->state = IB_PEER_CONNECTING;
  return HOOP_OK;
}

/* A peer asks to connect: check its hello, set up, accept. */
static hoop_result on_connect_request(hoop__tctx *ctx, struct rdma_cm_id *id, const void *data,
                                      size_t len) {
  ib_state *state = ib_state_of(ctx);
  if (state->closing) { /* shutdown reads events to see its peers go; it takes no new ones */
    rdma_reject(id, NULL, 0);
    rdma_destroy_id(id);
    return HOOP_OK;
  }
  ib_hello hello;
  int valid = decode_hello(ctx, data, len, &hello) == 0 && (int)hello.rank < ctx->rank;
  if (valid && state->peers[hello.rank].state == IB_PEER_CONNECTING) {
    /* The connector gave up on the request this rank accepted and asks again: the old accept
     * will never complete. */
    HOOP__INFO(HOOP_SUBSYS_NET,
               "ibverbs: rank %u connects again; dropping the accept it gave up "
               "on",
               hello.rank);
    release_connection(&state->peers[hello.rank]);
    state->peers[hello.rank].state = IB_PEER_NONE;
  }
  if (!valid || state->peers[hello.rank].state != IB_PEER_NONE) {
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: refused a connection that did not present this job's "
                                "hello (or came from a rank already connected)");
    if (rdma_reject(id, NULL, 0) != 0)
      HOOP__INFO(HOOP_SUBSYS_NET, "ibverbs: rdma_reject: %s", strerror(errno));
    rdma_destroy_id(id);
    return HOOP_OK;
  }
  hoop_result result = check_geometry(ctx, &hello);
  if (result != HOOP_OK) {
    rdma_reject(id, NULL, 0);
    rdma_destroy_id(id);
    return result;
  }
  int index = (int)hello.rank;
  ib_peer *peer = &state->peers[index];
  peer->remote_addr = hello.addr;
  peer->remote_rkey = hello.rkey;
  if ((result = setup_connection(ctx, index, id)) != HOOP_OK)
    return result;
  uint8_t reply[IB_HELLO_BYTES];
  encode_hello(ctx, index, peer, reply);
  struct rdma_conn_param param;
  memset(&param, 0, sizeof param);
  param.private_data = reply;
  param.private_data_len = sizeof reply;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  if (rdma_accept(id, &param) != 0) {
    /* Most likely the connector already gave up on this request; it will ask again. */
    HOOP__INFO(HOOP_SUBSYS_NET,
               "ibverbs: rdma_accept for rank %d: %s; waiting for it to connect "
               "again",
               index, strerror(errno));
    snprintf(peer->last_event, sizeof peer->last_event, "rdma_accept: %s", strerror(errno));
    release_connection(peer);
    peer->state = IB_PEER_NONE;
    return HOOP_OK;
  }
  peer->state = IB_PEER_CONNECTING;
  return HOOP_OK;
}

static hoop_result on_established(hoop__tctx *ctx, int index, const void *data, size_t len) {
  ib_peer *peer = &ib_state_of(ctx)->peers[index];
  if (index > ctx->rank) { /* this rank connected: the accept's hello says where to write */
    ib_hello hello;
    if (decode_hello(ctx, data, len, &hello) != 0 || (int)hello.rank != index)
      return hoop__ib_peer_error(ctx, index, HOOP_ERR_PROTOCOL, "connect",
                                 "its reply did not carry this job's hello");
    hoop_result result = check_geometry(ctx, &hello);
    if (result != HOOP_OK)
      return result;
    peer->remote_addr = hello.addr;
    peer->remote_rkey = hello.rkey;
  }
  peer->state = IB_PEER_UP;
  HOOP__TRACE(HOOP_SUBSYS_NET, "ibverbs: connected to rank %d", index);
  return HOOP_OK;
}

static hoop_result handle_event(hoop__tctx *ctx, enum rdma_cm_event_type type,
                                struct rdma_cm_id *id, int status, const void *data, size_t len) {
  ib_state *state = ib_state_of(ctx);
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
    return on_connect_request(ctx, id, data, len);
  if (type == RDMA_CM_EVENT_DEVICE_REMOVAL)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: device %s was removed", state->device);
  int index = (int)(intptr_t)id->context - 1;
  if (index < 0 || index >= ctx->size || state->peers[index].id != id)
    return HOOP_OK; /* an id already given up */
  ib_peer *peer = &state->peers[index];
  char what[96];
  snprintf(what, sizeof what, "%s (status %d)", rdma_event_str(type), status);
  switch (type) {
  case RDMA_CM_EVENT_ADDR_RESOLVED:
    if (rdma_resolve_route(id, RESOLVE_TIMEOUT_MS) != 0)
      return hoop__ib_peer_error(ctx, index, HOOP_ERR_PEER_LOST, "rdma_resolve_route",
                                 strerror(errno));
    return HOOP_OK;
  case RDMA_CM_EVENT_ROUTE_RESOLVED: return on_route_resolved(ctx, index);
  case RDMA_CM_EVENT_ESTABLISHED: return on_established(ctx, index, data, len);
  case RDMA_CM_EVENT_ADDR_ERROR:
  case RDMA_CM_EVENT_ROUTE_ERROR:
  case RDMA_CM_EVENT_CONNECT_ERROR:
  case RDMA_CM_EVENT_UNREACHABLE:
  case RDMA_CM_EVENT_REJECTED:
    if (peer->state == IB_PEER_UP)
      return hoop__ib_peer_gone(ctx, index, "connection", what);
    if (index > ctx->rank) {
      schedule_retry(peer, what);
    } else { /* the connecting side starts over with a new request */
      release_connection(peer);
      peer->state = IB_PEER_NONE;
    }
    return HOOP_OK;
  case RDMA_CM_EVENT_DISCONNECTED: {
    if (state->closing) { /* this rank is shutting down: its goodbye to the peer is flushed */
      peer->control_done = 1;
      return HOOP_OK;
    }
    /* The CQ and the event channel are read apart: completions of data the peer wrote before it
     * disconnected can still wait in the CQ. Take them first, or their data reads as lost. */
    int moved = 0;
    hoop_result result = hoop__ib_poll_cq(ctx, &moved);
    if (result != HOOP_OK)
      return result;
    return hoop__ib_peer_gone(ctx, index, "connection", "it disconnected");
  }
  default: return HOOP_OK;
  }
}

hoop_result hoop__ib_pump_cm(hoop__tctx *ctx, int *moved) {
  ib_state *state = ib_state_of(ctx);
  for (;;) {
    struct rdma_cm_event *event;
    if (rdma_get_cm_event(state->events, &event) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return HOOP_OK;
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_get_cm_event: %s",
                        strerror(errno));
    }
    /* The event is acknowledged before it is handled: destroying its id waits for that. */
    enum rdma_cm_event_type type = event->event;
    struct rdma_cm_id *id = event->id;
    int status = event->status;
    uint8_t data[256];
    size_t len = event->param.conn.private_data_len;
    if (len > sizeof data)
      len = sizeof data;
    if (event->param.conn.private_data && len)
      memcpy(data, event->param.conn.private_data, len);
    else
      len = 0;
    if (rdma_ack_cm_event(event) != 0)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: rdma_ack_cm_event: %s",
                        strerror(errno));
    *moved = 1;
    HOOP__TRACE(HOOP_SUBSYS_NET, "ibverbs: %s (status %d)", rdma_event_str(type), status);
    hoop_result result = handle_event(ctx, type, id, status, len ? data : NULL, len);
    if (result != HOOP_OK)
      return result;
  }
}

hoop_result hoop__ib_connect(hoop__tctx *ctx, int index) {
  ib_state *state = ib_state_of(ctx);
  ib_peer *peer = &state->peers[index];
  double deadline = hoop__now() + ctx->timeout_s;
  hoop_result result = HOOP_OK;
  if (peer->state == IB_PEER_NONE && index > ctx->rank && peer->attempts == 0)
    result = start_connect(ctx, index);
  while (result == HOOP_OK && peer->state != IB_PEER_UP) {
    if (*ctx->failed)
      return *ctx->failed;
    if (peer->state == IB_PEER_CLOSED)
      return hoop__ib_peer_error(ctx, index, HOOP_ERR_PEER_LOST, "connect",
                                 "the connection closed");
    if ((result = hoop__check_abort(ctx->comm)) != HOOP_OK)
      return result;
    double now = hoop__now();
    if (now > deadline) {
      char detail[160];
      snprintf(detail, sizeof detail, "no connection within HOOP_TIMEOUT%s%s",
               peer->last_event[0] ? "; last: " : "", peer->last_event);
      return hoop__ib_peer_error(ctx, index, HOOP_ERR_TIMEOUT, "connect", detail);
    }
    struct pollfd fds[3] = {{.fd = state->events->fd, .events = POLLIN},
                            {.fd = state->wake_fd, .events = POLLIN},
                            {.fd = *ctx->watch_fd, .events = POLLIN}};
    if (poll(fds, 3, 20) < 0 && errno != EINTR)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "ibverbs: poll: %s", strerror(errno));
    /* Another rank's abort or loss told by the rendezvous server ends the wait too. */
    if (fds[2].revents && (result = hoop__tctx_watched(ctx)) != HOOP_OK)
      return result;
    if (fds[1].revents && (result = hoop__wake_drain(ctx, state->wake_fd, "ibverbs")) != HOOP_OK)
      return result;
    int moved = 0;
    if ((result = hoop__ib_pump_cm(ctx, &moved)) == HOOP_OK)
      result = hoop__ib_retry_due(ctx);
  }
  return result;
}
