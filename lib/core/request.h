/* request.h - a posted call (the public hoop_request; a transport's message is hoop__transfer):
 * each communicator's queue of calls, run in posting order (request.c), and its progress: the
 * progress thread and the threads that wait (progress.c). */
#ifndef HOOP__REQUEST_H
#define HOOP__REQUEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* Every collective is a request: posted to its communicator's queue, run in posting order by
 * whichever thread holds the communicator's call_lock, completed with its result.
 *
 * A blocking call posts a request that lives on its stack and waits for it: with nothing queued
 * ahead, the waiting thread takes call_lock and runs the call itself, as before requests existed.
 * A non-blocking call posts a request on the heap and wakes the communicator's progress thread
 * (started by the first such call), which runs the queue while the program computes, then sleeps
 * on queue_cond. A thread that waits for a request runs the queue itself when call_lock is free,
 * else sleeps on done_cond until the runner completes it.
 *
 * Order: ranks match calls by the order they run in, which is the order each rank posted them,
 * since only the holder of call_lock takes calls off the queue and it runs each to its end.
 *
 * Failures: a call that fails fails the communicator (coll/dispatch.c), and every call after it
 * is refused at its start with the same reason, so each queued request completes with the error
 * soon after; a request keeps its own message for hoop_last_error.
 *
 * The layer that posts a call (coll/api.c, coll/fused.c) puts the request first in a struct of
 * its own that holds the call, and sets run, name and bytes (and release, for a heap request that
 * owns more memory) before posting: the queue runs calls without knowing what they carry. */
/* A new field is set in hoop__request_blocking too. */
struct hoop_request {
  hoop_comm *comm;
  /* Run the call, with the communicator's call_lock held; its result completes the request. */
  hoop_result (*run)(hoop_comm *comm, hoop_request *req);
  /* Free what a heap request's call owns besides the request (NULL: nothing). */
  void (*release)(hoop_request *req);
  size_t bytes;    /* what the call moves per rank, for the trace */
  int on_heap;     /* posted by a non-blocking call: freed by hoop_test or hoop_wait */
  atomic_int done; /* set under queue_lock, read without it */
  hoop_result result;
  char *error;       /* the message of its failure, for the thread that waits for it */
  const char *name;  /* the call that posted it ("hoop_iallreduce"), for the trace */
  uint64_t trace_id; /* its span in the trace */
  struct hoop_request *next;
  /* A call whose run only posts its transfers (point-to-point; NULL for the others): once run
   * returned HOOP_OK the request is in flight, on the communicator's in_flight list, and advance
   * (with call_lock held) moves its transfers, for a slice of waiting if wait, else one round
   * without sleeping; it returns 1 once they ended, their result in *result. */
  int (*advance)(hoop_comm *comm, hoop_request *req, int wait, hoop_result *result);
  atomic_int in_flight;             /* set and cleared under call_lock */
  struct hoop_request *flight_next; /* the in_flight list */
};

/* ---- for the layers that post calls (request.c) ----------------------------------------------
 */

/* A blocking call's request, on the caller's stack, run to its end: on this thread at once when
 * nothing is queued and nobody runs the queue, else posted and waited for. Its result. */
hoop_result hoop__request_call(hoop_comm *comm, hoop_request *req);
/* A blocking call's request set up field by field: an initializer zeroing the whole of it and its
 * arguments took a `rep stos` that cost a small call 10 ns. */
static inline void hoop__request_blocking(hoop_request *req,
                                          hoop_result (*run)(hoop_comm *, hoop_request *),
                                          size_t bytes, const char *name) {
  req->comm = NULL;
  req->run = run;
  req->release = NULL;
  req->bytes = bytes;
  req->on_heap = 0;
  atomic_init(&req->done, 0);
  req->result = HOOP_OK;
  req->error = NULL;
  req->name = name;
  req->trace_id = 0;
  req->next = NULL;
  req->advance = NULL;
  atomic_init(&req->in_flight, 0);
  req->flight_next = NULL;
}
/* Queue req (its call validated); a non-blocking post wakes the progress thread, starting it if
 * need be. */
hoop_result hoop__request_post(hoop_comm *comm, hoop_request *req);
/* The request's result, its message put back as the communicator's last error, and a heap
 * request freed. */
hoop_result hoop__request_finish(hoop_request *req);
/* Stop the progress thread and refuse while requests are outstanding (hoop_finalize's first step:
 * HOOP_OK, or HOOP_ERR_INVALID_ARG recorded). */
hoop_result hoop__requests_finalize(hoop_comm *comm);

/* ---- running the queue (progress.c) ----------------------------------------------------------
 */

static inline int hoop__request_done(const hoop_request *req) {
  return atomic_load(&req->done);
}
/* Run queued calls in order until the queue is empty, or until `until` has completed. The caller
 * holds call_lock. */
void hoop__queue_run(hoop_comm *comm, const hoop_request *until);
/* A thread that ran the queue for its own request and leaves calls behind hands them to the
 * progress thread. */
void hoop__queue_hand_over(hoop_comm *comm);
/* With call_lock held: advance req (in flight) one round, or for a slice of waiting if wait,
 * completing it when it ends; then one round for every other request in flight, completing those
 * that ended. */
void hoop__in_flight_advance(hoop_comm *comm, hoop_request *req, int wait);
/* With call_lock held: req's run posted its transfers; it goes in flight (waiters and the progress
 * thread told). */
void hoop__request_fly(hoop_comm *comm, hoop_request *req);
/* Return once req has completed, running the queue on this thread whenever call_lock is free. */
void hoop__request_wait_done(hoop_comm *comm, hoop_request *req);
/* The progress thread's body; its argument is the communicator. */
void *hoop__progress_thread(void *arg);

/* A request another thread ran has completed: its failure's words become this thread's
 * (hoop__error_told, what hoop_last_error shows it), and its result is returned. */
hoop_result hoop__request_told(hoop_comm *comm, hoop_request *req);

#endif /* HOOP__REQUEST_H */
