/* stray.c - messages that came before their receive while receives of other communicators waited
 * behind them on the same connection (see "binding" in transport.h), and the net lock that lets
 * calls on several communicators run at once from different threads.
 *
 * A transport that reads such a frame asks for a stray (hoop__tctx_divert): a receive of the
 * core's, with a buffer of the message's length, which the transport fills like any other. A
 * receive posted later on the message's channel and peer takes the oldest stray there (before
 * anything is posted to the transport: the stray came first): checked like a frame, copied at
 * once if complete, else when its last byte is in (hoop__strays_settle, after each round of a
 * wait). Strays exist only where sub-communicators run at once; with one communicator every frame
 * finds its receive in place. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "transport/state.h"
#include "transport/stray.h"
#include "transport/transport.h"

struct hoop__stray {
  hoop__transfer req; /* the transport's receive: first, for the transports' casts */
  uint8_t frame[HOOP__FRAME_BYTES];
  /* The receive that took it while it still arrived, its buffer and communicator. */
  hoop__transfer *waiter;
  void *waiter_buf;
  hoop_comm *waiter_comm;
  struct hoop__stray *next;
  _Alignas(max_align_t) char buf[];
};

hoop__transfer *hoop__tctx_divert(hoop__tctx *ctx, int peer, const uint8_t *frame, char **buf) {
  hoop_comm *net = ctx->comm;
  uint64_t len = hoop__frame_length(frame);
  hoop__stray *stray = len < SIZE_MAX - sizeof *stray ? malloc(sizeof *stray + len + 1) : NULL;
  if (!stray) {
    hoop__fail(net, HOOP_ERR_SYSTEM,
               "out of memory for a %llu-byte message from rank %d that came before its receive",
               (unsigned long long)len, peer);
    return NULL;
  }
  memset(&stray->req, 0, sizeof stray->req);
  stray->req.peer = peer;
  stray->req.len = (size_t)len;
  stray->req.channel = hoop__frame_channel(frame);
  memcpy(stray->req.fingerprint, frame + 16, sizeof stray->req.fingerprint);
  memcpy(stray->frame, frame, sizeof stray->frame);
  stray->waiter = NULL;
  stray->next = NULL;
  if (net->transport->strays_tail)
    net->transport->strays_tail->next = stray;
  else
    net->transport->strays = stray;
  net->transport->strays_tail = stray;
  HOOP__TRACE(HOOP_SUBSYS_NET,
              "a %llu-byte message of channel %u from rank %d came before its "
              "receive: kept aside",
              (unsigned long long)len, stray->req.channel, peer);
  *buf = stray->buf;
  return &stray->req;
}

static void unlink_stray(hoop_comm *net, hoop__stray *stray) {
  hoop__stray *prev = NULL;
  for (hoop__stray *s = net->transport->strays; s; prev = s, s = s->next) {
    if (s != stray)
      continue;
    if (prev)
      prev->next = s->next;
    else
      net->transport->strays = s->next;
    if (net->transport->strays_tail == s)
      net->transport->strays_tail = prev;
    return;
  }
}

static hoop_result host_copy(hoop_comm *comm, void *dst, const void *src, size_t n) {
  (void)comm;
  memcpy(dst, src, n);
  return HOOP_OK;
}

static _Atomic(hoop__stray_copy_fn) stray_copy = host_copy;

void hoop__strays_set_copy(hoop__stray_copy_fn copy) {
  atomic_store(&stray_copy, copy ? copy : host_copy);
}

/* The stray's bytes into the receive's buffer (which may be device memory), and the stray gone. */
static hoop_result deliver(hoop_comm *comm, hoop__stray *stray, void *buf, hoop__transfer *req) {
  hoop_result result = HOOP_OK;
  if (stray->req.len > 0)
    result = atomic_load(&stray_copy)(comm, buf, stray->buf, stray->req.len);
  if (result != HOOP_OK) /* the receive must not look complete: everyone learns of it */
    result = hoop__fail_as_recorded(comm, result);
  hoop__transfer_set_pending(req, 0);
  unlink_stray(hoop__net(comm), stray);
  free(stray);
  return result;
}

int hoop__stray_take(hoop_comm *comm, int wpeer, void *buf, hoop__transfer *req,
                     hoop_result *result) {
  hoop_comm *net = hoop__net(comm);
  hoop__stray *stray = net->transport->strays;
  while (stray && (stray->waiter || stray->req.peer != wpeer || stray->req.channel != req->channel))
    stray = stray->next;
  if (!stray)
    return 0;
  hoop__tctx *ctx = hoop__transport_of(net, wpeer);
  *result = hoop__frame_check(ctx, wpeer, stray->frame, req);
  if (*result != HOOP_OK)
    return 1;
  if (hoop__transfer_pending(&stray->req) == 0) {
    *result = deliver(comm, stray, buf, req);
    return 1;
  }
  stray->waiter = req;
  stray->waiter_buf = buf;
  stray->waiter_comm = comm;
  hoop__transfer_set_pending(req, 1);
  net->transport->strays_waited++;
  return 1;
}

hoop_result hoop__strays_settle(hoop_comm *net) {
  hoop_result result = HOOP_OK;
  hoop__stray *stray = net->transport->strays;
  while (stray && net->transport->strays_waited > 0) {
    hoop__stray *next = stray->next;
    if (stray->waiter && hoop__transfer_pending(&stray->req) == 0) {
      net->transport->strays_waited--;
      hoop_result delivered = deliver(stray->waiter_comm, stray, stray->waiter_buf, stray->waiter);
      if (result == HOOP_OK)
        result = delivered;
    }
    stray = next;
  }
  return result;
}

void hoop__strays_free(hoop_comm *net) {
  while (net->transport->strays) {
    hoop__stray *next = net->transport->strays->next;
    free(net->transport->strays);
    net->transport->strays = next;
  }
  net->transport->strays_tail = NULL;
  net->transport->strays_waited = 0;
}
