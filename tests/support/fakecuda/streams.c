/* streams.c - the stand-in driver's asynchronous queues (see fakecuda.h): one for the legacy
 * default stream (NULL) and one for each stream created, each carried out in order by a worker
 * thread of its own, so that work on one is not ordered after work on another unless the caller
 * waits for it; the asynchronous copies, streams and events on them; and the race check. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

/* Streams: each one created has a queue of its own (queues[index]); NULL is the legacy default
 * stream, queues[0]. */
#define MAX_STREAMS 64
struct CUstream_st {
  int index;
};
static struct CUstream_st streams[MAX_STREAMS];
static int nstreams = 1; /* streams[0] stands for the legacy default stream */

#define MAX_UNSEEN 4096
typedef struct queue {
  async_op *head, *tail;
  unsigned long long queued, done; /* sequence numbers of this queue */
  /* Done, but the host has not waited for them yet (a GPU may not have run them): the race check
   * looks at these too, whatever the timing here. */
  async_op *unseen_head, *unseen_tail;
  unsigned long long observed; /* what the host waited for */
  int nunseen;
  pthread_t worker;
  int started;
  /* Each queue's own (not one for all: every copy would wake every stream's worker and waiter). */
  pthread_cond_t queued_cond, done_cond; /* work queued; work done (set up with the worker) */
} queue;

struct CUevent_st {
  int queue;              /* where it was recorded */
  unsigned long long seq; /* the marker recorded last; 0: never recorded */
};

pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static queue queues[MAX_STREAMS]; /* [0]: the legacy default stream; then one per stream */
static long delay_us = -1;

int queue_of(CUstream stream) {
  return stream == NULL ? 0 : stream->index;
}

/* Whether stream is NULL or one this stand-in made. */
int known_stream(CUstream stream) {
  return stream == NULL || (stream >= &streams[1] && stream < &streams[MAX_STREAMS] &&
                            stream->index == (int)(stream - streams));
}

static unsigned long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void *worker_main(void *arg) {
  queue *q = arg;
  /* Wake at the due time, not up to the default 50 us of slack after it. */
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  pthread_mutex_lock(&queue_lock);
  for (;;) {
    while (!q->head)
      pthread_cond_wait(&q->queued_cond, &queue_lock);
    async_op *op = q->head;
    pthread_mutex_unlock(&queue_lock);
    /* Not before its due time: a queue of several waits about one delay in all, not one each. */
    while (op->due_ns > now_ns()) {
      struct timespec due = {(time_t)(op->due_ns / 1000000000), (long)(op->due_ns % 1000000000)};
      clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL);
    }
    if (op->kernel)
      fakecuda_launch(&op->k, op->grid, op->block);
    else if (op->from)
      memmove(op->to, op->from, op->bytes);
    pthread_mutex_lock(&queue_lock);
    q->head = op->next;
    if (!q->head)
      q->tail = NULL;
    q->done = op->seq;
    free(op->owned);
    op->owned = NULL, op->next = NULL;
    if (op->seq > q->observed && (op->kernel || op->from)) {
      if (q->unseen_tail)
        q->unseen_tail->next = op;
      else
        q->unseen_head = op;
      q->unseen_tail = op;
      if (++q->nunseen > MAX_UNSEEN) { /* a bound on what is remembered: the oldest goes */
        async_op *old = q->unseen_head;
        q->unseen_head = old->next;
        free(old);
        q->nunseen--;
      }
    } else {
      free(op);
    }
    pthread_cond_broadcast(&q->done_cond);
  }
  return NULL;
}

async_op *running_sync;

/* Ranges of bytes an operation touches, where they really are: those it writes (w, up to 2) and
 * those it reads (r, up to 9), each with its length. */
typedef struct ranges {
  const char *w[2], *r[9];
  size_t wb[2], rb[9];
  int nw, nr;
} ranges;

static void add_range(const char **at, size_t *len, int *n, const void *p, size_t bytes) {
  if (p && bytes) {
    at[*n] = p;
    len[(*n)++] = bytes;
  }
}

/* A codec kernel's (fakecuda_kernel's step): the piece, its data and its residual. */
static void codec_ranges(const fakecuda_kernel *k, ranges *g) {
  size_t residual = k->residual ? k->count * sizeof(float) : 0;
  switch (k->step) {
  case FAKECUDA_CODEC_TOP:
  case FAKECUDA_CODEC_ENCODE:
  case FAKECUDA_CODEC_WIDEN:
    add_range(g->w, g->wb, &g->nw, k->dst, k->piece_bytes);
    add_range(g->r, g->rb, &g->nr, k->data, k->data_bytes);
    add_range(g->r, g->rb, &g->nr, k->residual, residual);
    if (k->step == FAKECUDA_CODEC_ENCODE)
      add_range(g->w, g->wb, &g->nw, k->residual, residual);
    break;
  case FAKECUDA_CODEC_SCALE: add_range(g->w, g->wb, &g->nw, k->dst, k->piece_bytes); break;
  default: /* the decodes: the piece read, the data written (and read, to add to it) */
    add_range(g->r, g->rb, &g->nr, k->dst, k->piece_bytes);
    add_range(g->w, g->wb, &g->nw, k->data, k->data_bytes);
    if (k->step == FAKECUDA_CODEC_DECODE_ADD)
      add_range(g->r, g->rb, &g->nr, k->data, k->data_bytes);
  }
}

static void ranges_of(const async_op *op, ranges *g) {
  memset(g, 0, sizeof *g);
  if (op->kernel && op->k.kind == FAKECUDA_CODEC) {
    codec_ranges(&op->k, g);
  } else if (op->kernel) {
    add_range(g->w, g->wb, &g->nw, op->k.dst, op->bytes);
    if (op->k.kind == FAKECUDA_DIVIDE)
      add_range(g->r, g->rb, &g->nr, op->k.dst, op->bytes);
    if (op->k.kind == FAKECUDA_REDUCE) {
      add_range(g->r, g->rb, &g->nr, op->k.a, op->bytes);
      add_range(g->r, g->rb, &g->nr, op->k.b, op->bytes);
    }
    for (int j = 0; op->k.kind == FAKECUDA_MANY && j < op->k.nsrcs && j < 8; j++)
      add_range(g->r, g->rb, &g->nr, op->k.srcs[j], op->bytes);
  } else if (op->from) {
    add_range(g->w, g->wb, &g->nw, op->to, op->bytes);
    if (!op->staged)
      add_range(g->r, g->rb, &g->nr, op->from, op->bytes);
  }
}

static int overlap(const char *a, size_t an, const char *b, size_t bn) {
  return a && b && an && bn && a < b + bn && b < a + an;
}

/* Whether one of x's writes overlaps any of y's ranges. */
static int writes_into(const ranges *x, const ranges *y) {
  for (int i = 0; i < x->nw; i++) {
    for (int j = 0; j < y->nw; j++)
      if (overlap(x->w[i], x->wb[i], y->w[j], y->wb[j]))
        return 1;
    for (int j = 0; j < y->nr; j++)
      if (overlap(x->w[i], x->wb[i], y->r[j], y->rb[j]))
        return 1;
  }
  return 0;
}

/* Whether x and y touch the same bytes and one of them writes them. */
static int conflict(const async_op *x, const async_op *y) {
  ranges gx, gy;
  ranges_of(x, &gx);
  ranges_of(y, &gy);
  return writes_into(&gx, &gy) || writes_into(&gy, &gx);
}

/* Say what raced and abort: op on queue qi (-1: a synchronous copy) against p, which is where. */
static void race(int qi, const async_op *op, const async_op *p, const char *where) {
  fprintf(stderr,
          "fakecuda: race: a %s on stream %d (to %p from %p, %zu bytes) and a %s %s (to %p from "
          "%p, %zu bytes) touch the same bytes, one of them writing, with nothing ordering them\n",
          op->kernel ? "kernel" : "copy", qi, (void *)(op->kernel ? op->k.dst : op->to),
          (const void *)(op->kernel ? op->k.a : op->from), op->bytes, p->kernel ? "kernel" : "copy",
          where, (void *)(p->kernel ? p->k.dst : p->to),
          (const void *)(p->kernel ? p->k.a : p->from), p->bytes);
  abort();
}

/* The race check (queue_lock held): op, about to be queued on queue qi (-1: a synchronous copy,
 * which has waited for the legacy default stream), against the work on the other streams that the
 * host has not waited for, queued or done. Nothing orders work on two streams but the caller
 * waiting for one of them (hoop records no cross-stream waits), so touching the same bytes, one of
 * the two writing, is a race that a GPU may or may not lose: abort with what it was, whatever the
 * timing here. */
void check_race(int qi, const async_op *op) {
  /* Synchronous copies under way on other threads (the legacy default stream's, as is queue 0). */
  for (const async_op *p = running_sync; qi > 0 && p; p = p->next)
    if (conflict(op, p))
      race(qi, op, p, "under way synchronously on another thread");
  char where[64];
  for (int j = 0; j < MAX_STREAMS; j++) {
    if (j == qi || (qi < 0 && j == 0))
      continue;
    for (int list = 0; list < 2; list++)
      for (const async_op *p = list ? queues[j].unseen_head : queues[j].head; p; p = p->next)
        if (conflict(op, p)) {
          snprintf(where, sizeof where, "%s on stream %d",
                   list ? "done but never waited for" : "still queued", j);
          race(qi, op, p, where);
        }
  }
}

/* Queue an operation (a copy, a marker, or like *kernel) on queue qi; its sequence number there,
 * or 0 when out of memory. */
unsigned long long enqueue_op(int qi, char *to, const char *from, size_t bytes,
                              const async_op *kernel) {
  async_op *op = calloc(1, sizeof *op);
  if (!op)
    return 0;
  queue *q = &queues[qi];
  pthread_mutex_lock(&queue_lock);
  if (delay_us < 0) {
    const char *text = getenv("FAKECUDA_ASYNC_DELAY_US");
    delay_us = text ? atol(text) : 200;
  }
  if (!q->started) {
    pthread_cond_init(&q->queued_cond, NULL);
    pthread_cond_init(&q->done_cond, NULL);
    if (pthread_create(&q->worker, NULL, worker_main, q) != 0) {
      pthread_mutex_unlock(&queue_lock);
      free(op);
      return 0;
    }
    pthread_detach(q->worker);
    q->started = 1;
  }
  unsigned long long seq = ++q->queued;
  if (kernel)
    *op = *kernel;
  op->to = to, op->from = from, op->bytes = bytes, op->seq = seq, op->next = NULL;
  op->due_ns = delay_us > 0 ? now_ns() + (unsigned long long)delay_us * 1000 : 0;
  check_race(qi, op);
  if (q->tail)
    q->tail->next = op;
  else
    q->head = op;
  q->tail = op;
  pthread_cond_signal(&q->queued_cond);
  pthread_mutex_unlock(&queue_lock);
  return seq; /* not op->seq: the worker may have done and freed op by now */
}

static unsigned long long enqueue(int qi, char *to, const char *from, size_t bytes) {
  return enqueue_op(qi, to, from, bytes, NULL);
}

/* The host knows queue q has carried out seq (queue_lock held): what it did is ordered before
 * whatever the host queues next. */
static void observe(queue *q, unsigned long long seq) {
  if (seq > q->observed)
    q->observed = seq;
  while (q->unseen_head && q->unseen_head->seq <= q->observed) {
    async_op *op = q->unseen_head;
    q->unseen_head = op->next;
    free(op);
    q->nunseen--;
  }
  if (!q->unseen_head)
    q->unseen_tail = NULL;
}

/* Memory is going away, its addresses free for others: forget the done work that touched
 * addresses (work still queued on it would be a bug of the caller's). */
void forget_done(void) {
  pthread_mutex_lock(&queue_lock);
  for (int i = 0; i < MAX_STREAMS; i++)
    observe(&queues[i], queues[i].done);
  pthread_mutex_unlock(&queue_lock);
}

/* Wait until queue qi has carried out seq (0: everything queued there so far). */
void wait_done(int qi, unsigned long long seq) {
  queue *q = &queues[qi];
  pthread_mutex_lock(&queue_lock);
  if (seq == 0)
    seq = q->queued;
  while (q->started && q->done < seq) /* nothing was ever queued where no worker started */
    pthread_cond_wait(&q->done_cond, &queue_lock);
  observe(q, seq);
  pthread_mutex_unlock(&queue_lock);
}

/* Every queued operation carried out (the real cuMemFree synchronises the same way, so the worker
 * never runs on memory that is gone). */
void drain(void) {
  for (int i = 0; i < MAX_STREAMS; i++)
    wait_done(i, 0);
}

static CUresult fake_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  char *to = resolve(dst, bytes), *from = resolve(src, bytes);
  CUresult counted = count_copy(bytes);
  async_copies += counted == CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  if (counted != CUDA_SUCCESS)
    return counted;
  return enqueue(queue_of(stream), to, from, bytes) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_memcpy_htod_async(CUdeviceptr dst, const void *src, size_t bytes,
                                       CUstream stream) {
  return fake_memcpy_async(dst, (CUdeviceptr)(uintptr_t)src, bytes, stream);
}

static CUresult fake_event_create(CUevent *event, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *event = calloc(1, sizeof **event);
  return *event ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_event_destroy(CUevent event) {
  free(event);
  return CUDA_SUCCESS;
}

static CUresult fake_event_record(CUevent event, CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!event || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  unsigned long long seq = enqueue(queue_of(stream), NULL, NULL, 0);
  if (!seq)
    return CUDA_ERROR_OUT_OF_MEMORY;
  event->queue = queue_of(stream);
  event->seq = seq;
  return CUDA_SUCCESS;
}

static CUresult fake_event_synchronize(CUevent event) {
  if (!event)
    return CUDA_ERROR_INVALID_HANDLE;
  if (event->seq)
    wait_done(event->queue, event->seq);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_destroy(CUstream stream) {
  if (stream == NULL || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  wait_done(stream->index, 0); /* its work still runs to its end, as the driver's does */
  return CUDA_SUCCESS;
}

/* A stream with a queue of its own, not ordered after any other (hoop's are non-blocking); its
 * slot is not reused. */
static CUresult fake_stream_create(CUstream *stream, unsigned int flags) {
  (void)flags;
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&queue_lock);
  if (nstreams == MAX_STREAMS) {
    pthread_mutex_unlock(&queue_lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  streams[nstreams].index = nstreams;
  *stream = &streams[nstreams++];
  pthread_mutex_unlock(&queue_lock);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_synchronize(CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  stream_syncs++;
  pthread_mutex_unlock(&lock);
  wait_done(queue_of(stream), 0);
  return CUDA_SUCCESS;
}

static CUresult fake_stream_query(CUstream stream) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  queue *q = &queues[queue_of(stream)];
  pthread_mutex_lock(&queue_lock);
  int done = q->done >= q->queued;
  if (done)
    observe(q, q->done);
  pthread_mutex_unlock(&queue_lock);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult fake_ctx_synchronize(void) {
  if (ctx_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  drain();
  return CUDA_SUCCESS;
}

static CUresult fake_stream_get_ctx(CUstream stream, CUcontext *ctx) {
  if (stream == NULL || !known_stream(stream))
    return CUDA_ERROR_INVALID_HANDLE;
  *ctx = the_context;
  return CUDA_SUCCESS;
}

const fakecuda_entry fakecuda_stream_entries[] = {
    {"cuCtxSynchronize", (void *)fake_ctx_synchronize},
    {"cuStreamCreate", (void *)fake_stream_create},
    {"cuStreamSynchronize", (void *)fake_stream_synchronize},
    {"cuStreamQuery", (void *)fake_stream_query},
    {"cuStreamGetCtx", (void *)fake_stream_get_ctx},
    {"cuMemcpyAsync", (void *)fake_memcpy_async},
    {"cuMemcpyHtoDAsync", (void *)fake_memcpy_htod_async},
    {"cuEventCreate", (void *)fake_event_create},
    {"cuEventDestroy", (void *)fake_event_destroy},
    {"cuEventRecord", (void *)fake_event_record},
    {"cuEventSynchronize", (void *)fake_event_synchronize},
    {"cuStreamDestroy", (void *)fake_stream_destroy},
    {NULL, NULL},
};
