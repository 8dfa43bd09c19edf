/* p2p.c - point-to-point messages: hoop_send, hoop_recv and their non-blocking forms.
 *
 * Each is a request of core/request.c, queued behind the communicator's earlier calls so that a
 * pair's messages keep the order in which each rank posted its sends, receives and collectives.
 * Its run only posts the transfer (a framed message, so that an empty one travels too) and leaves
 * the request in flight; the transfer then moves with every progress the communicator makes (the
 * progress thread, any wait), and the request completes when it ends. Posting does not wait for
 * the peer: a cycle of sends and receives posted together cannot deadlock.
 *
 * Every message carries its own fingerprint (count, dtype, tag; core/fingerprint.c), checked on
 * arrival against the receive's whatever HOOP_CHECK_CALLS says: a difference fails the
 * communicator with HOOP_ERR_MISMATCH naming both calls and ranks.
 *
 * Device buffers go through a host copy of their own: a send's is made at the post, a receive's is
 * copied to the device when the transfer ends. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"
#include "core/fingerprint.h"
#include "core/flight.h"
#include "core/request.h"
#include "mem/cuda.h"
#include "mem/kind.h"
#include "transport/transport.h"

typedef struct p2p_request {
  hoop_request base; /* first: the queue sees only this */
  int is_send, peer;
  void *buf;
  size_t bytes;
  void *stage;              /* a device buffer's host copy, or NULL */
  int stage_slot;           /* which of the communicator's stages, or -1: own_stage */
  hoop__host_buf own_stage; /* when all of the communicator's are taken */
  uint8_t fingerprint[HOOP__FINGERPRINT_BYTES];
  hoop__transfer transfer;
  hoop__wait_state waiting; /* HOOP_TIMEOUT across the wait's slices */
  long flight_slot;         /* in the flight recorder, from the post to the end */
  double posted_at;         /* the post's coarse clock reading (the recorder's start) */
  double wait_started;      /* for HOOP_STALL_WARN, */
  int stall_warned;         /* said once */
} p2p_request;

/* The slice of waiting a wait takes before it lets the communicator's other calls run. */
#define WAIT_SLICE_S 1e-3

static const char *call_name(int is_send, int blocking) {
  if (is_send)
    return blocking ? "hoop_send" : "hoop_isend";
  return blocking ? "hoop_recv" : "hoop_irecv";
}

#define STAGES HOOP__P2P_STAGES

/* With call_lock held: a host stage of bytes for the device buffer at near, one of the
 * communicator's kept ones where one is free (grown if need be), else an allocation of the
 * message's own; NULL with the error recorded. */
static void *take_stage(hoop_comm *comm, p2p_request *p2p, size_t bytes, const void *near) {
  int free_slot = -1;
  for (int i = 0; i < STAGES; i++) {
    if (comm->coll->p2p_stage_busy[i])
      continue;
    if (comm->coll->p2p_stage[i].ptr && comm->coll->p2p_stage[i].bytes >= bytes) {
      free_slot = i;
      break;
    }
    if (free_slot < 0)
      free_slot = i;
  }
  if (free_slot >= 0) {
    void *ptr = hoop__host_buf_grow(comm, &comm->coll->p2p_stage[free_slot], bytes, near,
                                    "to stage a device buffer through");
    if (ptr) {
      comm->coll->p2p_stage_busy[free_slot] = 1;
      p2p->stage_slot = free_slot;
    }
    return ptr;
  }
  p2p->stage_slot = -1;
  p2p->own_stage = (hoop__host_buf){NULL, 0, 0};
  return hoop__host_buf_grow(comm, &p2p->own_stage, bytes, near,
                             "to stage a device buffer through");
}

/* With call_lock held: the stage given back (a message's own freed, the transports told). */
static void drop_stage(hoop_comm *comm, p2p_request *p2p) {
  if (!p2p->stage)
    return;
  if (p2p->stage_slot >= 0)
    comm->coll->p2p_stage_busy[p2p->stage_slot] = 0;
  else
    hoop__host_buf_free(comm, &p2p->own_stage);
  p2p->stage = NULL;
}

/* A request freed with its stage still taken (it never ran to its end): given back. */
static void release(hoop_request *req) {
  p2p_request *p2p = (p2p_request *)req;
  if (!p2p->stage)
    return;
  hoop__lock_take(&req->comm->call_lock);
  drop_stage(req->comm, p2p);
  hoop__lock_release(&req->comm->call_lock);
}

void hoop__p2p_free(hoop_comm *comm) {
  for (int i = 0; i < STAGES; i++)
    hoop__host_buf_free(comm, &comm->coll->p2p_stage[i]);
}

/* A message that was not posted fails the communicator, as a collective that fails half way does:
 * the peer's matching call would otherwise take this rank's next message instead. */
static hoop_result not_posted(hoop_comm *comm, p2p_request *p2p, hoop_result result) {
  drop_stage(comm, p2p);
  hoop__flight_end(p2p->flight_slot, result, hoop__now_coarse());
  return hoop__fail_as_recorded(comm, result);
}

/* The flight recorder's entry for the message, from the post on. */
static void record_post(hoop_comm *comm, p2p_request *p2p, const char *name) {
  p2p->posted_at = hoop__now_coarse();
  p2p->flight_slot = hoop__flight_begin(comm->rank, comm->seq, name, p2p->bytes, p2p->posted_at);
}

/* With call_lock held: post the transfer (the request goes in flight). */
static hoop_result run(hoop_comm *comm, hoop_request *req) {
  p2p_request *p2p = (p2p_request *)req;
  hoop__check_abort(comm);
  if (hoop__net_failed(comm))
    return hoop__refuse_failed(comm, req->name);
  void *buf = p2p->buf;
  hoop_result result = HOOP_OK;
  int device = p2p->bytes && hoop__mem_kind_of(buf) == HOOP__MEM_DEVICE;
  /* The recorder's times at the kernel's tick: a message's two fine readings would cost as much
   * as a small message takes (a hang's dump needs seconds). A host buffer's message is recorded
   * after its post, which never waits: a small one is then on its way to the peer meanwhile. */
  if (device) {
    record_post(comm, p2p, req->name);
    if (!(p2p->stage = take_stage(comm, p2p, p2p->bytes, buf)))
      return not_posted(comm, p2p, HOOP_ERR_SYSTEM);
    if (p2p->is_send && (result = hoop__mem_copy(comm, p2p->stage, buf, p2p->bytes)) != HOOP_OK)
      return not_posted(comm, p2p, result);
    buf = p2p->stage;
  }
  comm->call = req->name;
  result = hoop__ipost_marked(comm, p2p->is_send, p2p->peer, buf, p2p->bytes, p2p->fingerprint,
                              &p2p->transfer);
  comm->call = NULL;
  if (!device)
    record_post(comm, p2p, req->name);
  return result == HOOP_OK ? HOOP_OK : not_posted(comm, p2p, result);
}

/* With call_lock held: move the transfer (for a slice of waiting if wait); 1 once it ended. */
static int advance(hoop_comm *comm, hoop_request *req, int wait, hoop_result *result) {
  p2p_request *p2p = (p2p_request *)req;
  const char *outer = comm->call;
  comm->call = req->name;
  *result = HOOP_OK;
  if (hoop__transfer_pending(&p2p->transfer) && comm->failed) {
    /* Ended by the communicator's failure (a transfer that ended before it stands). */
    *result =
        hoop__set_error(comm, comm->failed, "%s: %s", req->name,
                        comm->fail_reason[0] ? comm->fail_reason : hoop_strerror(comm->failed));
  } else if (wait && hoop__transfer_pending(&p2p->transfer)) {
    /* A slice; HOOP_STALL_WARN counts from the wait's start. */
    double started = comm->call_started;
    int warned = comm->stall_warned;
    if (p2p->wait_started == 0)
      p2p->wait_started = p2p->posted_at; /* at the clock's tick, as the warning needs */
    comm->call_started = p2p->wait_started;
    comm->stall_warned = p2p->stall_warned;
    *result = hoop__wait_some(comm, &p2p->transfer, WAIT_SLICE_S, &p2p->waiting);
    p2p->stall_warned = comm->stall_warned;
    comm->call_started = started;
    comm->stall_warned = warned;
    if (*result == HOOP_OK && hoop__transfer_pending(&p2p->transfer)) {
      comm->call = outer;
      return 0;
    }
  } else if (hoop__transfer_pending(&p2p->transfer)) {
    *result = hoop__poll_some(comm, &p2p->transfer, &p2p->waiting);
    if (*result == HOOP_OK && hoop__transfer_pending(&p2p->transfer)) {
      comm->call = outer;
      return 0;
    }
  }
  if (*result == HOOP_OK && !p2p->is_send && p2p->stage)
    *result = hoop__mem_copy(comm, p2p->buf, p2p->stage, p2p->bytes);
  /* A message that ended within its first wait's spin took no time a hang's dump could show: it
   * ends when it was posted, as a small collective does (dispatch.c). */
  hoop__flight_end(p2p->flight_slot, *result,
                   p2p->waiting.clocked || *result != HOOP_OK ? hoop__now_coarse()
                                                              : p2p->posted_at);
  comm->call = outer;
  drop_stage(comm, p2p);
  return 1;
}

static hoop_result check(hoop_comm *comm, const char *call, const void *buf, size_t count,
                         hoop_dtype dtype, int peer, int tag) {
  size_t esize = hoop_dtype_size(dtype);
  if (esize == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  if (count > SIZE_MAX / esize)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: count %zu is too large", call, count);
  if (peer < 0 || peer >= comm->size)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: peer %d is not a rank (0 to %d)", call,
                           peer, comm->size - 1);
  if (peer == comm->rank)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: peer %d is this rank: messages go to and from other ranks", call,
                           peer);
  if (tag < 0 || tag == INT32_MAX)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: tag %d is not 0 to %d", call, tag,
                           INT32_MAX - 1);
  if (count > 0 && !buf)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: buf is NULL with count %zu", call,
                           count);
  return HOOP_OK;
}

static hoop_result start(hoop_comm *comm, int is_send, void *buf, size_t count, hoop_dtype dtype,
                         int peer, int tag, hoop_request **request) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (request)
    *request = NULL;
  const char *name = call_name(is_send, !request);
  hoop_result result = check(comm, name, buf, count, dtype, peer, tag);
  if (result != HOOP_OK)
    return result;
  p2p_request local, *p2p = request ? calloc(1, sizeof *p2p) : &local;
  if (!p2p)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for the request", name);
  size_t bytes = count * hoop_dtype_size(dtype);
  if (!request) {
    /* Field by field, as hoop__request_blocking does: not the transfer's state, which posting
     * stamps. */
    hoop__request_blocking(&p2p->base, run, bytes, name);
    p2p->stage = NULL;
    p2p->stage_slot = -1;
    p2p->own_stage = (hoop__host_buf){NULL, 0, 0};
    p2p->waiting = (hoop__wait_state){0};
    p2p->flight_slot = -1;
    p2p->wait_started = 0;
    p2p->stall_warned = 0;
  }
  p2p->base.run = run;
  p2p->base.advance = advance;
  p2p->base.release = release;
  p2p->base.name = name;
  p2p->base.on_heap = request != NULL;
  p2p->is_send = is_send;
  p2p->peer = peer;
  p2p->buf = buf;
  p2p->bytes = p2p->base.bytes = bytes;
  hoop__fingerprint_p2p(p2p->fingerprint, is_send, count, dtype, tag);
  if (!request)
    return hoop__request_call(comm, &p2p->base);
  if ((result = hoop__request_post(comm, &p2p->base)) != HOOP_OK) {
    free(p2p);
    return result;
  }
  *request = &p2p->base;
  return HOOP_OK;
}

hoop_result hoop_send(hoop_comm *comm, const void *buf, size_t count, hoop_dtype dtype, int peer,
                      int tag) {
  return start(comm, 1, (void *)(uintptr_t)buf, count, dtype, peer, tag, NULL);
}

hoop_result hoop_recv(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int peer,
                      int tag) {
  return start(comm, 0, buf, count, dtype, peer, tag, NULL);
}

hoop_result hoop_isend(hoop_comm *comm, const void *buf, size_t count, hoop_dtype dtype, int peer,
                       int tag, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_isend");
  return result == HOOP_OK
             ? start(comm, 1, (void *)(uintptr_t)buf, count, dtype, peer, tag, request)
             : result;
}

hoop_result hoop_irecv(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int peer,
                       int tag, hoop_request **request) {
  hoop_result result = hoop__coll_need_request(comm, request, "hoop_irecv");
  return result == HOOP_OK ? start(comm, 0, buf, count, dtype, peer, tag, request) : result;
}
