/* progress.c - running a communicator's queue of posted calls: by its progress thread while the
 * program computes, or by a thread waiting for its own request (hoop_wait, a blocking call). */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/request.h"
#include "core/trace.h"

static void complete(hoop_comm *comm, hoop_request *req, hoop_result result) {
  /* Its own words, which the caller reads after it woke (hoop__request_told): by then another
   * call may have overwritten comm->last_error. */
  if (result != HOOP_OK)
    req->error = strdup(comm->last_error);
  if (hoop__tracing(comm))
    hoop__trace_done(comm, req->trace_id, req->name, result, hoop__now());
  pthread_mutex_lock(&comm->queue_lock);
  req->result = result;
  atomic_store(&req->done, 1);
  pthread_cond_broadcast(&comm->done_cond);
  pthread_mutex_unlock(&comm->queue_lock);
}

/* ---- requests in flight (point-to-point) ----------------------------------------------------- */

static void take_off(hoop_comm *comm, hoop_request *req) {
  for (hoop_request **at = &comm->in_flight; *at; at = &(*at)->flight_next)
    if (*at == req) {
      *at = req->flight_next;
      break;
    }
  req->in_flight = 0;
  atomic_fetch_sub(&comm->in_flight_count, 1);
}

/* One request's transfers, once or until they end; completed when they end. */
static void advance_one(hoop_comm *comm, hoop_request *req, int wait) {
  hoop_result result = HOOP_OK;
  if (req->advance(comm, req, wait, &result)) {
    take_off(comm, req);
    complete(comm, req, result);
  }
}

void hoop__in_flight_advance(hoop_comm *comm, hoop_request *req, int wait) {
  if (req && req->in_flight)
    advance_one(comm, req, wait);
  for (hoop_request *other = comm->in_flight, *next; other; other = next) {
    next = other->flight_next;
    if (other != req)
      advance_one(comm, other, 0);
  }
}

void hoop__request_fly(hoop_comm *comm, hoop_request *req) {
  req->in_flight = 1;
  req->flight_next = comm->in_flight;
  comm->in_flight = req;
  atomic_fetch_add(&comm->in_flight_count, 1);
  /* Its waiter, asleep while another thread ran the queue, now moves it itself; the progress
   * thread, asleep with nothing posted, moves it while the program computes. */
  pthread_mutex_lock(&comm->queue_lock);
  pthread_cond_broadcast(&comm->done_cond);
  if (comm->progress_started)
    pthread_cond_signal(&comm->queue_cond);
  pthread_mutex_unlock(&comm->queue_lock);
}

/* Run a call; one that only posted its transfers goes in flight instead of completing. */
static void run_one(hoop_comm *comm, hoop_request *req) {
  hoop_result result = req->run(comm, req);
  if (req->advance && result == HOOP_OK)
    hoop__request_fly(comm, req);
  else
    complete(comm, req, result);
}

/* ---- running the queue ----------------------------------------------------------------------- */

void hoop__queue_run(hoop_comm *comm, const hoop_request *until) {
  for (;;) {
    pthread_mutex_lock(&comm->queue_lock);
    hoop_request *req = comm->queue_head;
    if (!req || (until && (atomic_load(&until->done) || until->in_flight))) {
      pthread_mutex_unlock(&comm->queue_lock);
      break;
    }
    __atomic_store_n(&comm->queue_head, req->next, __ATOMIC_RELEASE);
    if (!comm->queue_head)
      comm->queue_tail = NULL;
    pthread_mutex_unlock(&comm->queue_lock);
    run_one(comm, req);
  }
  /* A hoop_abort from another thread that found call_lock taken left its work to the holder. */
  if (atomic_load(&comm->abort_requested) == 1)
    hoop__check_abort(comm);
}

void hoop__queue_hand_over(hoop_comm *comm) {
  pthread_mutex_lock(&comm->queue_lock);
  if ((comm->queue_head || atomic_load(&comm->in_flight_count) > 0) && comm->progress_started)
    pthread_cond_signal(&comm->queue_cond);
  pthread_mutex_unlock(&comm->queue_lock);
}

/* Sleep on cond (with queue_lock, which the caller holds) until signalled or for at most seconds.
 */
static void timed_wait(hoop_comm *comm, pthread_cond_t *cond, double seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  long ns = until.tv_nsec + (long)(seconds * 1e9);
  until.tv_sec += ns / 1000000000;
  until.tv_nsec = ns % 1000000000;
  pthread_cond_timedwait(cond, &comm->queue_lock, &until);
}

/* The progress thread sleeps on queue_cond (posts do not wake it unless progress_idle is set;
 * hoop__queue_hand_over and finalize always do). */
static void nap(hoop_comm *comm, double seconds) {
  timed_wait(comm, &comm->queue_cond, seconds);
}

/* Woken by a post, the thread first lets the posting thread take the call for a moment: a program
 * that waits at once runs the call itself, with no switch of threads in its way. */
#define PROGRESS_GRACE_S 20e-6
/* Having run the queue (or found it taken), the thread lingers, still awake to further posts,
 * before it sleeps until woken: a burst of posts, or a loop of post and wait, then costs one wake
 * per linger instead of one per call. */
#define PROGRESS_LINGER_S 1e-3
/* The longest the thread waits on call_lock held by a thread that may not run the queue
 * (hoop_register, hoop_abort): whoever runs the queue hands leftovers over
 * (hoop__queue_hand_over). */
#define PROGRESS_RETRY_S 1e-3
/* Between the rounds in which the thread moves point-to-point transfers in flight: short, as a
 * peer's receive may be waiting for each piece of a send. */
#define PROGRESS_FLIGHT_S 20e-6

/* The progress thread: asleep while nothing is posted; woken by a post, it runs the queue unless
 * another thread holds call_lock (a waiter running it for its own request, or a blocking call),
 * in which case it naps and looks again rather than block on the lock, which would make that
 * thread's every unlock a system call to wake it. */
void *hoop__progress_thread(void *arg) {
  hoop_comm *comm = arg;
  pthread_mutex_lock(&comm->queue_lock);
  for (;;) {
    int flying = atomic_load(&comm->in_flight_count) > 0;
    if (!comm->queue_head && !comm->progress_stop && !flying) {
      comm->progress_idle = 0;
      nap(comm, PROGRESS_LINGER_S);
      if (!comm->queue_head && !comm->progress_stop && atomic_load(&comm->in_flight_count) == 0) {
        comm->progress_idle = 1;
        while (!comm->queue_head && !comm->progress_stop &&
               atomic_load(&comm->in_flight_count) == 0)
          pthread_cond_wait(&comm->queue_cond, &comm->queue_lock);
        comm->progress_idle = 0;
        if (!comm->progress_stop)
          nap(comm, PROGRESS_GRACE_S);
      }
      continue;
    }
    if (!comm->queue_head && (comm->progress_stop || !flying))
      break;
    pthread_mutex_unlock(&comm->queue_lock);
    int ran = hoop__lock_try(&comm->call_lock);
    if (ran) {
      hoop__queue_run(comm, NULL);
      /* Point-to-point transfers in flight move while the program computes. */
      hoop__in_flight_advance(comm, NULL, 0);
      hoop__lock_release(&comm->call_lock);
    }
    pthread_mutex_lock(&comm->queue_lock);
    if (!ran && comm->queue_head && !comm->progress_stop)
      nap(comm, PROGRESS_RETRY_S);
    else if (!comm->queue_head && !comm->progress_stop && atomic_load(&comm->in_flight_count) > 0)
      nap(comm, PROGRESS_FLIGHT_S);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  return NULL;
}

/* ---- waiting for a request ------------------------------------------------------------------- */

/* Run the queue here while call_lock is free; else spin a while (a wake through the condition
 * variable costs the runner a system call and this thread a scheduling delay), then sleep until
 * the holder completes the request. The sleep is bounded: call_lock may be held a moment by a
 * thread that does not run the queue (hoop_register, hoop_abort). */
#define WAIT_SPIN_S 20e-6
#define WAIT_SLEEP_S 10e-3

/* A request in flight is waited for in slices of this long, call_lock let go between them, so
 * that calls posted meanwhile (by this thread before the wait, or by others) run too: their
 * messages may be what the peer waits for before it sends what this request waits for. */
#define WAIT_FLIGHT_SLICE_S 1e-3

void hoop__request_wait_done(hoop_comm *comm, hoop_request *req) {
  double spin_until = -1;
  while (!hoop__request_done(req)) {
    if (hoop__lock_try(&comm->call_lock)) {
      hoop__queue_run(comm, req);
      if (req->in_flight) {
        hoop__queue_run(comm, NULL);
        hoop__in_flight_advance(comm, req, 1);
      }
      hoop__lock_release(&comm->call_lock);
      hoop__queue_hand_over(comm);
      continue;
    }
    /* A short spin catches a small call about to end; a long one would take the CPU from the
     * thread running it. */
    if (spin_until < 0)
      spin_until = hoop__now() + WAIT_SPIN_S;
    if (hoop__now() < spin_until) {
      hoop__cpu_pause();
      continue;
    }
    pthread_mutex_lock(&comm->queue_lock);
    if (!atomic_load(&req->done))
      timed_wait(comm, &comm->done_cond, req->in_flight ? WAIT_FLIGHT_SLICE_S : WAIT_SLEEP_S);
    pthread_mutex_unlock(&comm->queue_lock);
  }
}
