/* request.c - every collective as a request: posted to its communicator's queue, run in posting
 * order by whichever thread holds the communicator's call_lock, completed with its result.
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
 * Failures: a call that fails fails the communicator (dispatch.c), and every call after it is
 * refused at its start with the same reason, so each queued request completes with the error
 * soon after; a request keeps its own message for hoop_last_error. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "core/env.h"
#include "core/trace.h"
#include "mem/cuda.h"

#define FUSION_MIN_BYTES 4096
#define FUSION_MAX_BYTES (1L << 30)
/* A buffer of this many bytes in a fused set is allreduced where it lies, not packed. */
#define FUSION_DIRECT_BYTES (512L * 1024)

struct hoop_request {
  hoop_comm *comm;
  hoop__coll_args args;
  /* hoop_allreduce_many (args.count SIZE_MAX): n buffers, the arrays owned when on the heap */
  size_t nbufs;
  const void *const *sendbufs;
  void *const *recvbufs;
  const size_t *counts;
  int on_heap;     /* posted by a non-blocking call: freed by hoop_test or hoop_wait */
  atomic_int done; /* set under queue_lock, read without it */
  hoop_result result;
  char *error;       /* the message of its failure (heap requests) */
  const char *name;  /* the call that posted it ("hoop_iallreduce"), for the trace */
  uint64_t trace_id; /* its span in the trace */
  struct hoop_request *next;
};

/* ---- running the queue ----------------------------------------------------------------------- */

static hoop_result read_fusion(hoop_comm *comm) {
  long bytes;
  if (hoop__parse_int(hoop__env_get("HOOP_FUSION_BYTES"), FUSION_MIN_BYTES, FUSION_MAX_BYTES,
                      &bytes) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_allreduce_many: HOOP_FUSION_BYTES '%s' is not a number of bytes "
                           "in %d..%ld",
                           hoop__env_get("HOOP_FUSION_BYTES"), FUSION_MIN_BYTES, FUSION_MAX_BYTES);
  comm->fusion = malloc((size_t)bytes);
  if (!comm->fusion)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                           "hoop_allreduce_many: cannot allocate %ld bytes to pack into", bytes);
  comm->fusion_bytes = (size_t)bytes;
  return HOOP_OK;
}

/* Packing and unpacking: memcpy, or the driver for device buffers (its errors name the call). */
static hoop_result pack_copy(hoop_comm *comm, const hoop_request *req, void *dst, const void *src,
                             size_t bytes) {
  if (!hoop__cuda_loaded()) {
    memcpy(dst, src, bytes);
    return HOOP_OK;
  }
  comm->call = req->name;
  hoop_result result = hoop__mem_copy(comm, dst, src, bytes);
  comm->call = NULL;
  return result;
}

/* The fused allreduce: pack as much as a piece holds (a buffer may span pieces, cut between
 * elements), allreduce the piece in place, unpack it. A buffer large enough that packing would
 * cost more than a call of its own (half a piece, or FUSION_DIRECT_BYTES) is allreduced where it
 * lies instead, with no copy. Every rank cuts the same pieces from the same counts, so each piece
 * is one matching allreduce. */
static hoop_result run_fused(hoop_comm *comm, hoop_request *req) {
  hoop_result result = HOOP_OK;
  size_t esize = hoop_dtype_size(req->args.dtype);
  if (!comm->fusion && (result = read_fusion(comm)) != HOOP_OK)
    return result;
  size_t piece_elems = comm->fusion_bytes / esize;
  size_t direct_bytes =
      comm->fusion_bytes / 2 < FUSION_DIRECT_BYTES ? comm->fusion_bytes / 2 : FUSION_DIRECT_BYTES;
  char *piece = comm->fusion;
  size_t buf = 0, at = 0; /* the next element to pack: buffer buf, element at */
  while (result == HOOP_OK) {
    if (buf < req->nbufs && at == 0 && req->counts[buf] * esize >= direct_bytes) {
      hoop__coll_args args = {HOOP__COLL_ALLREDUCE,
                              req->sendbufs[buf],
                              req->recvbufs[buf],
                              req->counts[buf],
                              req->args.dtype,
                              req->args.op,
                              -1,
                              0,
                              0};
      result = hoop__coll_run(comm, &args);
      buf++;
      continue;
    }
    size_t first_buf = buf, first_at = at, filled = 0;
    while (buf < req->nbufs && filled < piece_elems) {
      if (at == 0 && filled > 0 && req->counts[buf] * esize >= direct_bytes)
        break; /* it goes on its own, next */
      size_t take = req->counts[buf] - at;
      if (take > piece_elems - filled)
        take = piece_elems - filled;
      if (take && result == HOOP_OK)
        result = pack_copy(comm, req, piece + filled * esize,
                           (const char *)req->sendbufs[buf] + at * esize, take * esize);
      filled += take;
      at += take;
      if (at == req->counts[buf]) {
        buf++;
        at = 0;
      }
    }
    if (filled == 0 || result != HOOP_OK)
      break;
    hoop__coll_args args = {HOOP__COLL_ALLREDUCE, piece, piece, filled, req->args.dtype,
                            req->args.op,         -1,    0,     0};
    result = hoop__coll_run(comm, &args);
    /* Unpack what this piece carried, in the order it was packed. */
    for (size_t b = first_buf, from = first_at, done = 0; result == HOOP_OK && done < filled; b++) {
      size_t take = req->counts[b] - from;
      if (take > filled - done)
        take = filled - done;
      if (take)
        result = pack_copy(comm, req, (char *)req->recvbufs[b] + from * esize, piece + done * esize,
                           take * esize);
      done += take;
      from = 0;
    }
  }
  /* A copy that failed (through the driver) left the other ranks waiting for this rank's piece:
   * failing the communicator tells them at once, as a failed collective does (dispatch.c). */
  if (result != HOOP_OK && !comm->failed) {
    char message[sizeof comm->last_error];
    memcpy(message, comm->last_error, sizeof message);
    hoop__fail(comm, result, "%s", message);
  }
  return result;
}

/* Bytes a request moves per rank, for the trace. */
static size_t request_bytes(const hoop_request *req) {
  size_t esize = hoop_dtype_size(req->args.dtype), total = 0;
  if (req->args.count != SIZE_MAX)
    return req->args.coll == HOOP__COLL_BARRIER ? 0 : req->args.count * esize;
  for (size_t i = 0; i < req->nbufs; i++)
    total += req->counts[i] * esize;
  return total;
}

static void complete(hoop_comm *comm, hoop_request *req, hoop_result result) {
  if (result != HOOP_OK && req->on_heap)
    req->error = strdup(comm->last_error);
  if (hoop__tracing(comm))
    hoop__trace_done(comm, req->trace_id, req->name, result, hoop__now());
  pthread_mutex_lock(&comm->queue_lock);
  req->result = result;
  atomic_store(&req->done, 1);
  pthread_cond_broadcast(&comm->done_cond);
  pthread_mutex_unlock(&comm->queue_lock);
}

/* Run queued calls in order until the queue is empty, or until `until` has completed. The caller
 * holds call_lock. */
static void run_queue(hoop_comm *comm, const hoop_request *until) {
  for (;;) {
    pthread_mutex_lock(&comm->queue_lock);
    hoop_request *req = comm->queue_head;
    if (!req || (until && atomic_load(&until->done))) {
      pthread_mutex_unlock(&comm->queue_lock);
      break;
    }
    comm->queue_head = req->next;
    if (!comm->queue_head)
      comm->queue_tail = NULL;
    pthread_mutex_unlock(&comm->queue_lock);
    complete(comm, req,
             req->args.count == SIZE_MAX ? run_fused(comm, req) : hoop__coll_run(comm, &req->args));
  }
  /* A hoop_abort from another thread that found call_lock taken left its work to the holder. */
  if (atomic_load(&comm->abort_requested) == 1)
    hoop__check_abort(comm);
}

/* A thread that ran the queue for its own request and leaves calls behind hands them to the
 * progress thread. */
static void hand_over(hoop_comm *comm) {
  pthread_mutex_lock(&comm->queue_lock);
  if (comm->queue_head && comm->progress_started)
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
 * hand_over and finalize always do). */
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
 * (hoop_register, hoop_abort): whoever runs the queue hands leftovers over (hand_over). */
#define PROGRESS_RETRY_S 1e-3

/* The progress thread: asleep while nothing is posted; woken by a post, it runs the queue unless
 * another thread holds call_lock (a waiter running it for its own request, or a blocking call),
 * in which case it naps and looks again rather than block on the lock, which would make that
 * thread's every unlock a system call to wake it. */
static void *progress_main(void *arg) {
  hoop_comm *comm = arg;
  pthread_mutex_lock(&comm->queue_lock);
  for (;;) {
    if (!comm->queue_head && !comm->progress_stop) {
      comm->progress_idle = 0;
      nap(comm, PROGRESS_LINGER_S);
      if (!comm->queue_head && !comm->progress_stop) {
        comm->progress_idle = 1;
        while (!comm->queue_head && !comm->progress_stop)
          pthread_cond_wait(&comm->queue_cond, &comm->queue_lock);
        comm->progress_idle = 0;
        if (!comm->progress_stop)
          nap(comm, PROGRESS_GRACE_S);
      }
      continue;
    }
    if (!comm->queue_head)
      break;
    pthread_mutex_unlock(&comm->queue_lock);
    int ran = pthread_mutex_trylock(&comm->call_lock) == 0;
    if (ran) {
      run_queue(comm, NULL);
      pthread_mutex_unlock(&comm->call_lock);
    }
    pthread_mutex_lock(&comm->queue_lock);
    if (!ran && comm->queue_head && !comm->progress_stop)
      nap(comm, PROGRESS_RETRY_S);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  return NULL;
}

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
  hoop__trace_post(comm, req->trace_id, req->name, request_bytes(req), hoop__now());
}

/* Queue req (validated); a non-blocking post wakes the progress thread, starting it if need be. */
static hoop_result post(hoop_comm *comm, hoop_request *req) {
  hoop_result result;
  if (req->on_heap && comm->async_progress < 0 && (result = read_progress(comm)) != HOOP_OK)
    return result;
  req->comm = comm;
  atomic_init(&req->done, 0);
  req->next = NULL;
  req->error = NULL;
  if (!req->name)
    req->name = hoop__coll_call_name(req->args.coll);
  if (hoop__tracing(comm))
    trace_post(comm, req);
  pthread_mutex_lock(&comm->queue_lock);
  if (req->on_heap && !comm->progress_started && comm->async_progress) {
    int err = pthread_create(&comm->progress, NULL, progress_main, comm);
    if (err != 0) {
      pthread_mutex_unlock(&comm->queue_lock);
      return hoop__set_error(comm, HOOP_ERR_SYSTEM, "cannot start the progress thread: %s",
                             strerror(err));
    }
    comm->progress_started = 1;
  }
  if (comm->queue_tail)
    comm->queue_tail->next = req;
  else
    comm->queue_head = req;
  comm->queue_tail = req;
  if (req->on_heap) {
    comm->outstanding++;
    if (comm->progress_idle)
      pthread_cond_signal(&comm->queue_cond);
  }
  pthread_mutex_unlock(&comm->queue_lock);
  return HOOP_OK;
}

static int is_done(const hoop_request *req) {
  return atomic_load(&req->done);
}

/* The request's result, its message put back as the communicator's last error, and a heap
 * request freed. */
static hoop_result finish(hoop_request *req) {
  hoop_comm *comm = req->comm;
  hoop_result result = req->result;
  if (!req->on_heap)
    return result;
  if (req->error) {
    pthread_mutex_lock(&comm->call_lock);
    snprintf(comm->last_error, sizeof comm->last_error, "%s", req->error);
    pthread_mutex_unlock(&comm->call_lock);
    free(req->error);
  }
  pthread_mutex_lock(&comm->queue_lock);
  comm->outstanding--;
  pthread_mutex_unlock(&comm->queue_lock);
  free((void *)req->sendbufs);
  free((void *)req->recvbufs);
  free((void *)req->counts);
  free(req);
  return result;
}

/* Run the queue here while call_lock is free; else spin a while (a wake through the condition
 * variable costs the runner a system call and this thread a scheduling delay), then sleep until
 * the holder completes the request. The sleep is bounded: call_lock may be held a moment by a
 * thread that does not run the queue (hoop_register, hoop_abort). */
#define WAIT_SPIN_S 20e-6
#define WAIT_SLEEP_S 10e-3

static void wait_done(hoop_comm *comm, const hoop_request *req) {
  double spin_until = -1;
  while (!is_done(req)) {
    if (pthread_mutex_trylock(&comm->call_lock) == 0) {
      run_queue(comm, req);
      pthread_mutex_unlock(&comm->call_lock);
      hand_over(comm);
      continue;
    }
    /* A short spin catches a small call about to end; a long one would take the CPU from the
     * thread running it. */
    if (spin_until < 0)
      spin_until = hoop__now() + WAIT_SPIN_S;
    if (hoop__now() < spin_until) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    pthread_mutex_lock(&comm->queue_lock);
    if (!atomic_load(&req->done))
      timed_wait(comm, &comm->done_cond, WAIT_SLEEP_S);
    pthread_mutex_unlock(&comm->queue_lock);
  }
}

hoop_result hoop_wait(hoop_request *req) {
  if (!req)
    return HOOP_ERR_INVALID_ARG;
  wait_done(req->comm, req);
  return finish(req);
}

hoop_result hoop_test(hoop_request *req, int *done) {
  if (!req || !done)
    return HOOP_ERR_INVALID_ARG;
  hoop_comm *comm = req->comm;
  *done = is_done(req);
  /* With no progress thread running the queue (it is busy elsewhere, or the program tests in a
   * loop), testing moves it on, as MPI_Test does. */
  if (!*done && pthread_mutex_trylock(&comm->call_lock) == 0) {
    run_queue(comm, req);
    pthread_mutex_unlock(&comm->call_lock);
    hand_over(comm);
    *done = is_done(req);
  }
  return *done ? finish(req) : HOOP_OK;
}

/* ---- the calls ------------------------------------------------------------------------------- */

/* Validate and post args: blocking (request NULL) waits for it on this thread; non-blocking
 * returns a heap request. */
static hoop_result start(hoop_comm *comm, const hoop__coll_args *args, hoop_request **request,
                         const char *name) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (request)
    *request = NULL;
  hoop_result result = hoop__coll_validate(comm, args);
  if (result != HOOP_OK)
    return result;
  if (!request) {
    hoop_request req = {.args = *args, .name = hoop__coll_call_name(args->coll)};
    /* Nothing queued and nobody running: this thread runs the call, as before requests. */
    if (pthread_mutex_trylock(&comm->call_lock) == 0) {
      pthread_mutex_lock(&comm->queue_lock);
      int idle = !comm->queue_head;
      pthread_mutex_unlock(&comm->queue_lock);
      if (idle) {
        if (hoop__tracing(comm))
          trace_post(comm, &req);
        result = hoop__coll_run(comm, &req.args);
        if (hoop__tracing(comm))
          hoop__trace_done(comm, req.trace_id, req.name, result, hoop__now());
        if (atomic_load(&comm->abort_requested) == 1)
          hoop__check_abort(comm);
        pthread_mutex_unlock(&comm->call_lock);
        return result;
      }
      pthread_mutex_unlock(&comm->call_lock);
    }
    if ((result = post(comm, &req)) != HOOP_OK)
      return result;
    wait_done(comm, &req);
    return req.result;
  }
  hoop_request *req = calloc(1, sizeof *req);
  if (!req)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for the request",
                           hoop__coll_call_name(args->coll));
  req->args = *args;
  req->on_heap = 1;
  req->name = name;
  if ((result = post(comm, req)) != HOOP_OK) {
    free(req);
    return result;
  }
  *request = req;
  return HOOP_OK;
}

hoop_result hoop_allreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype, hoop_op op) {
  hoop__coll_args args = {HOOP__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1, 0, 0};
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_broadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int root) {
  hoop__coll_args args = {HOOP__COLL_BROADCAST, buf, buf, count, dtype, HOOP_SUM, root, 0, 0};
  return start(comm, &args, NULL, NULL);
}

hoop_result hoop_allgather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           hoop_dtype dtype) {
  hoop__coll_args args = {HOOP__COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, HOOP_SUM, -1, 0, 0};
  return start(comm, &args, NULL, NULL);
}

/* The stream variants: the stream's queued work done first, then the blocking call. */
hoop_result hoop_allreduce_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, hoop_op op, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__cuda_stream_wait(comm, "hoop_allreduce_stream", stream, recvbuf);
  return result == HOOP_OK ? hoop_allreduce(comm, sendbuf, recvbuf, count, dtype, op) : result;
}

hoop_result hoop_broadcast_stream(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                  int root, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__cuda_stream_wait(comm, "hoop_broadcast_stream", stream, buf);
  return result == HOOP_OK ? hoop_broadcast(comm, buf, count, dtype, root) : result;
}

hoop_result hoop_allgather_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, void *stream) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = hoop__cuda_stream_wait(comm, "hoop_allgather_stream", stream, recvbuf);
  return result == HOOP_OK ? hoop_allgather(comm, sendbuf, recvbuf, count, dtype) : result;
}

hoop_result hoop_barrier(hoop_comm *comm) {
  hoop__coll_args args = {HOOP__COLL_BARRIER, NULL, NULL, 0, HOOP_UINT8, HOOP_SUM, -1, 0, 0};
  return start(comm, &args, NULL, NULL);
}

static hoop_result need_request(hoop_comm *comm, hoop_request **request, const char *call) {
  if (request)
    return HOOP_OK;
  return comm ? hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: request is NULL", call)
              : HOOP_ERR_INVALID_ARG;
}

hoop_result hoop_iallreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                            hoop_dtype dtype, hoop_op op, hoop_request **request) {
  hoop_result result = need_request(comm, request, "hoop_iallreduce");
  hoop__coll_args args = {HOOP__COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, -1, 0, 0};
  return result == HOOP_OK ? start(comm, &args, request, "hoop_iallreduce") : result;
}

hoop_result hoop_ibroadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int root,
                            hoop_request **request) {
  hoop_result result = need_request(comm, request, "hoop_ibroadcast");
  hoop__coll_args args = {HOOP__COLL_BROADCAST, buf, buf, count, dtype, HOOP_SUM, root, 0, 0};
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ibroadcast") : result;
}

hoop_result hoop_iallgather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                            hoop_dtype dtype, hoop_request **request) {
  hoop_result result = need_request(comm, request, "hoop_iallgather");
  hoop__coll_args args = {HOOP__COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, HOOP_SUM, -1, 0, 0};
  return result == HOOP_OK ? start(comm, &args, request, "hoop_iallgather") : result;
}

hoop_result hoop_ibarrier(hoop_comm *comm, hoop_request **request) {
  hoop_result result = need_request(comm, request, "hoop_ibarrier");
  hoop__coll_args args = {HOOP__COLL_BARRIER, NULL, NULL, 0, HOOP_UINT8, HOOP_SUM, -1, 0, 0};
  return result == HOOP_OK ? start(comm, &args, request, "hoop_ibarrier") : result;
}

/* ---- fused allreduce ------------------------------------------------------------------------- */

static hoop_result check_many(hoop_comm *comm, const char *call, size_t n,
                              const void *const *sendbufs, void *const *recvbufs,
                              const size_t *counts, hoop_dtype dtype, hoop_op op) {
  if (hoop_dtype_size(dtype) == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  if ((unsigned)op >= HOOP_OP_COUNT)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown op %d", call, (int)op);
  if (n > 0 && (!sendbufs || !recvbufs || !counts))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with %zu buffers", call,
                           !sendbufs   ? "sendbufs"
                           : !recvbufs ? "recvbufs"
                                       : "counts",
                           n);
  for (size_t i = 0; i < n; i++)
    if (counts[i] > 0 && (!sendbufs[i] || !recvbufs[i]))
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: buffer %zu is NULL with count %zu",
                             call, i, counts[i]);
  return HOOP_OK;
}

static hoop_result start_many(hoop_comm *comm, const char *call, size_t n,
                              const void *const *sendbufs, void *const *recvbufs,
                              const size_t *counts, hoop_dtype dtype, hoop_op op,
                              hoop_request **request) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  hoop_result result = check_many(comm, call, n, sendbufs, recvbufs, counts, dtype, op);
  if (result != HOOP_OK)
    return result;
  /* SIZE_MAX marks a fused request whose set may be empty (nbufs 0): it still runs in its turn. */
  hoop__coll_args args = {HOOP__COLL_ALLREDUCE, NULL, NULL, SIZE_MAX, dtype, op, -1, 0, 0};
  if (!request) {
    hoop_request req = {.args = args, .nbufs = n, .name = call};
    req.sendbufs = sendbufs;
    req.recvbufs = recvbufs;
    req.counts = counts;
    if ((result = post(comm, &req)) != HOOP_OK)
      return result;
    wait_done(comm, &req);
    return req.result;
  }
  *request = NULL;
  hoop_request *req = calloc(1, sizeof *req);
  const void **sends = malloc((n ? n : 1) * sizeof *sends);
  void **recvs = malloc((n ? n : 1) * sizeof *recvs);
  size_t *copied = malloc((n ? n : 1) * sizeof *copied);
  if (!req || !sends || !recvs || !copied) {
    free(req);
    free(sends);
    free(recvs);
    free(copied);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for the request", call);
  }
  if (n) {
    memcpy(sends, sendbufs, n * sizeof *sends);
    memcpy(recvs, recvbufs, n * sizeof *recvs);
    memcpy(copied, counts, n * sizeof *copied);
  }
  req->args = args;
  req->nbufs = n;
  req->sendbufs = sends;
  req->recvbufs = recvs;
  req->counts = copied;
  req->on_heap = 1;
  req->name = call;
  if ((result = post(comm, req)) != HOOP_OK) {
    req->nbufs = 0;
    finish(req);
    return result;
  }
  *request = req;
  return HOOP_OK;
}

hoop_result hoop_allreduce_many(hoop_comm *comm, size_t n, const void *const *sendbufs,
                                void *const *recvbufs, const size_t *counts, hoop_dtype dtype,
                                hoop_op op) {
  return start_many(comm, "hoop_allreduce_many", n, sendbufs, recvbufs, counts, dtype, op, NULL);
}

hoop_result hoop_iallreduce_many(hoop_comm *comm, size_t n, const void *const *sendbufs,
                                 void *const *recvbufs, const size_t *counts, hoop_dtype dtype,
                                 hoop_op op, hoop_request **request) {
  hoop_result result = need_request(comm, request, "hoop_iallreduce_many");
  return result == HOOP_OK ? start_many(comm, "hoop_iallreduce_many", n, sendbufs, recvbufs, counts,
                                        dtype, op, request)
                           : result;
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
  free(comm->fusion);
  comm->fusion = NULL;
  return HOOP_OK;
}
