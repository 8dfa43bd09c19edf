/* request.c - a posted call's life: queued on its communicator (a blocking one run at once when
 * nothing is queued), completed by hoop_test or hoop_wait, and the queue's end at hoop_finalize.
 * What runs the queue is progress.c; what posts calls is the coll layer (coll/api.c, fused.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/request.h"
#include "core/trace.h"

/* ---- posting and completing -------------------------------------------------------------------
 */

/* HOOP_ASYNC_PROGRESS, read at the first non-blocking post: 1 (default) runs posted calls on a
 * progress thread, 0 only inside hoop_test, hoop_wait and blocking calls, as MPI does without
 * an asynchronous progress thread (no wake per post; no overlap while the program computes). */
static hoop_result read_progress(hoop_comm *comm) {
  long value;
  if (hoop__parse_int(hoop__env_get("HOOP_ASYNC_PROGRESS"), 0, 1, &value) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "HOOP_ASYNC_PROGRESS '%s' is not 0 or 1",
                           hoop__env_get("HOOP_ASYNC_PROGRESS"));
  comm->async_progress = (int)value;
  return HOOP_OK;
}

/* Number req and write its post to the trace. */
static void trace_post(hoop_comm *comm, hoop_request *req) {
  req->trace_id = atomic_fetch_add(&comm->trace_ids, 1);
  hoop__trace_post(comm, req->trace_id, req->name, req->bytes, hoop__now());
}

hoop_result hoop__request_post(hoop_comm *comm, hoop_request *req) {
  hoop_result result;
  if (req->on_heap && comm->async_progress < 0 && (result = read_progress(comm)) != HOOP_OK)
    return result;
  req->comm = comm;
  atomic_init(&req->done, 0);
  req->next = NULL;
  req->error = NULL;
  if (hoop__tracing(comm))
    trace_post(comm, req);
  pthread_mutex_lock(&comm->queue_lock);
  if (req->on_heap && !comm->progress_started && comm->async_progress) {
    int err = pthread_create(&comm->progress, NULL, hoop__progress_thread, comm);
    if (err != 0) {
      pthread_mutex_unlock(&comm->queue_lock);
      return hoop__set_error(comm, HOOP_ERR_SYSTEM, "cannot start the progress thread: %s",
                             strerror(err));
    }
    comm->progress_started = 1;
  }
  if (comm->queue_tail)
    comm->queue_tail->next = req;
  else /* atomically: a blocking call reads it without the lock (hoop__request_call) */
    __atomic_store_n(&comm->queue_head, req, __ATOMIC_RELEASE);
  comm->queue_tail = req;
  if (req->on_heap) {
    comm->outstanding++;
    if (comm->progress_idle)
      pthread_cond_signal(&comm->queue_cond);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  return HOOP_OK;
}

hoop_result hoop__request_call(hoop_comm *comm, hoop_request *req) {
  hoop_result result;
  /* Nothing queued and nobody running: this thread runs the call, as before requests. */
  if (hoop__lock_try(&comm->call_lock)) {
    /* Read without queue_lock (a lock and an unlock more on every blocking call): a call this
     * thread posted before is seen; one another thread posts meanwhile has no order against this
     * one either way, as with the lock, which it could take right after. */
    int idle = !__atomic_load_n(&comm->queue_head, __ATOMIC_ACQUIRE);
    if (idle) {
      if (hoop__tracing(comm))
        trace_post(comm, req);
      result = req->run(comm, req);
      /* A blocking send or receive: its first slice of waiting right here (a small message on
       * shared memory ends within it, with no request in flight and no lock more); then in
       * flight, waited for as a posted one is, so that calls other threads post meanwhile run
       * too. */
      if (req->advance && result == HOOP_OK && req->advance(comm, req, 1, &result))
        req->advance = NULL; /* it ended: as a call that ran to its end */
      if (req->advance && result == HOOP_OK) {
        hoop__request_fly(comm, req);
        hoop__lock_release(&comm->call_lock);
        hoop__request_wait_done(comm, req);
        return hoop__request_told(comm, req);
      }
      if (hoop__tracing(comm))
        hoop__trace_done(comm, req->trace_id, req->name, result, hoop__now());
      if (atomic_load(&comm->abort_requested) == 1)
        hoop__check_abort(comm);
      hoop__lock_release(&comm->call_lock);
      return result;
    }
    hoop__lock_release(&comm->call_lock);
  }
  if ((result = hoop__request_post(comm, req)) != HOOP_OK)
    return result;
  hoop__request_wait_done(comm, req);
  return hoop__request_told(comm, req);
}

hoop_result hoop__request_told(hoop_comm *comm, hoop_request *req) {
  if (req->error) {
    hoop__error_told(comm, req->error);
    free(req->error);
    req->error = NULL;
  }
  return req->result;
}

hoop_result hoop__request_finish(hoop_request *req) {
  hoop_comm *comm = req->comm;
  hoop_result result = req->result;
  if (!req->on_heap)
    return result;
  if (req->error) {
    hoop__lock_take(&comm->call_lock);
    snprintf(comm->last_error, sizeof comm->last_error, "%s", req->error);
    hoop__lock_release(&comm->call_lock);
    hoop__request_told(comm, req);
  }
  pthread_mutex_lock(&comm->queue_lock);
  comm->outstanding--;
  pthread_mutex_unlock(&comm->queue_lock);
  if (req->release)
    req->release(req);
  free(req);
  return result;
}

hoop_result hoop_wait(hoop_request *req) {
  if (!req)
    return HOOP_ERR_INVALID_ARG;
  hoop__request_wait_done(req->comm, req);
  return hoop__request_finish(req);
}

hoop_result hoop_test(hoop_request *req, int *done) {
  if (!req || !done)
    return HOOP_ERR_INVALID_ARG;
  hoop_comm *comm = req->comm;
  *done = hoop__request_done(req);
  /* With no progress thread running the queue (it is busy elsewhere, or the program tests in a
   * loop), testing moves it on, as MPI_Test does. */
  if (!*done && hoop__lock_try(&comm->call_lock)) {
    hoop__queue_run(comm, req);
    /* In flight: the calls posted behind it run too (the peer may wait for their messages). */
    if (req->in_flight)
      hoop__queue_run(comm, NULL);
    hoop__in_flight_advance(comm, req, 0);
    hoop__lock_release(&comm->call_lock);
    hoop__queue_hand_over(comm);
    *done = hoop__request_done(req);
  }
  return *done ? hoop__request_finish(req) : HOOP_OK;
}

/* ---- finalize -------------------------------------------------------------------------------- */

hoop_result hoop__requests_finalize(hoop_comm *comm) {
  pthread_mutex_lock(&comm->queue_lock);
  size_t outstanding = comm->outstanding;
  int started = comm->progress_started;
  if (!outstanding) {
    comm->progress_stop = 1;
    pthread_cond_signal(&comm->queue_cond);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  if (outstanding)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_finalize: %zu request%s outstanding: complete %s with hoop_wait "
                           "or hoop_test first",
                           outstanding, outstanding == 1 ? " is" : "s are",
                           outstanding == 1 ? "it" : "them");
  if (started)
    pthread_join(comm->progress, NULL);
  comm->progress_started = 0;
  return HOOP_OK;
}
