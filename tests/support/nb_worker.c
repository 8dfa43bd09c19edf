/* nb_worker.c - one rank of the non-blocking test: posts many collectives of every kind at once
 * (allreduce of every dtype and op, broadcast, allgather, barrier, fused allreduce of many
 * buffers, reduce-scatter, all-to-all, some of them large), completes them in an order of its own
 * (scrambled by rank, by hoop_test loops and hoop_wait), and checks each result against
 * reference.c; then the fused call blocking, and hoop_finalize refusing while a request is
 * outstanding. Started by hooprun.
 *
 * Usage: nb_worker [--quick] [--device]  (--device: allreduce, broadcast and allgather on device
 *                                       buffers, HOOP_CUDA_LIBRARY's, and the fused allreduce's
 *                                       buffers on the device one in two, host and device mixed)
 *        nb_worker --progress           rank 0 posts a barrier and sleeps 2 s without calling hoop;
 *                                       the others' blocking barrier must end well before, so its
 *                                       progress thread took part (fails with
 *                                       HOOP_ASYNC_PROGRESS=0)
 *        nb_worker --fail abort|kill    rank 1 aborts (or dies) while the others have requests
 *                                       outstanding: every request there must complete with an
 *                                       error naming rank 1, within HOOP_TIMEOUT
 *        nb_worker --fail kill-device   the same with every buffer in device memory
 *                                       (HOOP_CUDA_LIBRARY): rank 1 posts the first four requests,
 *                                       sees two through and dies with the others in flight (they
 *                                       may complete or fail naming rank 1); the last eight must
 *                                       fail
 *        nb_worker --fail pack          rank 1's buffers of a fused allreduce are on the device
 *                                       (HOOP_CUDA_LIBRARY) and the driver fails its copies in the
 *                                       middle of packing (FAKECUDA_FAIL_AFTER, the stand-in's):
 *                                       rank 1 gets the driver's error, the others one naming
 *                                       rank 1, long before HOOP_TIMEOUT
 *        nb_worker --idle S | --busy S  say "ready", then for S seconds make no call (idle) or
 *                                       allreduce in a loop (busy), then finalize: the ranks whose
 *                                       launcher test_launcher.sh kills
 */
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "devmem.h"
#include "hoop.h"
#include "reference.h"

static hoop_comm *comm;
static int rank, nranks;
static size_t checks, failures;
static size_t calls; /* collectives this rank called, blocking or not (the trace holds each) */

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d FAIL: ", rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures++;
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    exit(2);
  }
  return p;
}

static void must(hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d FAIL: %s returned %s: %s\n", rank, what, hoop_strerror(result),
            hoop_last_error(comm));
    exit(1);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum kind {
  ALLREDUCE,
  BROADCAST,
  ALLGATHER,
  BARRIER,
  FUSED,
  REDUCE_SCATTER,
  ALLTOALL,
  REDUCE,
  GATHER,
  SCATTER,
  KINDS
};
#define MAX_BUFS 12

typedef struct item {
  enum kind kind;
  hoop_dtype dtype;
  hoop_op op;
  size_t count; /* FUSED: unused */
  int root, in_place;
  unsigned seed;
  char *send, *recv;
  char *dsend, *drecv; /* --device: the device copies the call gets (NULL: it gets send, recv) */
  size_t nbufs, counts[MAX_BUFS];
  char *sends[MAX_BUFS], *recvs[MAX_BUFS];
  char *dsends[MAX_BUFS], *drecvs[MAX_BUFS]; /* --device: those on the device (NULL: on the host) */
  hoop_request *req;
} item;

static const size_t odd_counts[] = {0, 1, 3, 7, 31, 97, 1031, 4099};
#define NCOUNTS (sizeof odd_counts / sizeof odd_counts[0])

static int device_buffers; /* --device: allreduce, broadcast and allgather on device buffers */

/* The device copy of bytes of host (--device), or host itself. */
static char *on_device(char *host, size_t bytes) {
  return device_buffers ? devmem_put(host, bytes) : host;
}

static void post(item *it, int i, size_t big) {
  size_t esize = hoop_dtype_size(it->dtype);
  calls++;
  it->seed = (unsigned)(i * 7919 + 13);
  switch (it->kind) {
  case ALLREDUCE:
    it->send = xmalloc(it->count * esize);
    it->recv = it->in_place ? it->send : xmalloc(it->count * esize);
    ref_fill(it->send, it->count, it->dtype, it->op, rank, it->seed);
    it->dsend = on_device(it->send, it->count * esize);
    it->drecv = it->in_place ? it->dsend : on_device(it->recv, it->count * esize);
    must(hoop_iallreduce(comm, it->dsend, it->drecv, it->count, it->dtype, it->op, &it->req),
         "hoop_iallreduce");
    break;
  case BROADCAST:
    it->send = xmalloc(it->count * esize);
    if (rank == it->root)
      ref_fill(it->send, it->count, it->dtype, HOOP_MIN, it->root, it->seed);
    else
      memset(it->send, 0xa5, it->count * esize);
    it->dsend = it->drecv = on_device(it->send, it->count * esize);
    must(hoop_ibroadcast(comm, it->dsend, it->count, it->dtype, it->root, &it->req),
         "hoop_ibroadcast");
    break;
  case ALLGATHER: {
    size_t block = it->count * esize;
    it->recv = xmalloc(block * (size_t)nranks);
    it->send = it->in_place ? it->recv + (size_t)rank * block : xmalloc(block);
    ref_fill(it->send, it->count, it->dtype, HOOP_MAX, rank, it->seed);
    it->drecv = on_device(it->recv, block * (size_t)nranks);
    it->dsend = it->in_place ? it->drecv + (size_t)rank * block : on_device(it->send, block);
    must(hoop_iallgather(comm, it->dsend, it->drecv, it->count, it->dtype, &it->req),
         "hoop_iallgather");
    break;
  }
  case REDUCE_SCATTER: {
    size_t block = it->count * esize, total = block * (size_t)nranks;
    it->send = xmalloc(total);
    it->recv = it->in_place ? it->send + (size_t)rank * block : xmalloc(block);
    ref_fill(it->send, it->count * (size_t)nranks, it->dtype, it->op, rank, it->seed);
    it->dsend = on_device(it->send, total);
    it->drecv = it->in_place ? it->dsend + (size_t)rank * block : on_device(it->recv, block);
    must(hoop_ireduce_scatter(comm, it->dsend, it->drecv, it->count, it->dtype, it->op, &it->req),
         "hoop_ireduce_scatter");
    break;
  }
  case ALLTOALL: {
    size_t total = it->count * esize * (size_t)nranks;
    it->send = xmalloc(total);
    it->recv = it->in_place ? it->send : xmalloc(total);
    ref_fill(it->send, it->count * (size_t)nranks, it->dtype, HOOP_MAX, rank, it->seed);
    it->dsend = on_device(it->send, total);
    it->drecv = it->in_place ? it->dsend : on_device(it->recv, total);
    must(hoop_ialltoall(comm, it->dsend, it->drecv, it->count, it->dtype, &it->req),
         "hoop_ialltoall");
    break;
  }
  case REDUCE: /* out of place; the other ranks pass no result buffer */
    it->send = xmalloc(it->count * esize);
    it->recv = xmalloc(it->count * esize);
    ref_fill(it->send, it->count, it->dtype, it->op, rank, it->seed);
    it->dsend = on_device(it->send, it->count * esize);
    it->drecv = rank == it->root ? on_device(it->recv, it->count * esize) : NULL;
    must(hoop_ireduce(comm, it->dsend, it->drecv, it->count, it->dtype, it->op, it->root, &it->req),
         "hoop_ireduce");
    break;
  case GATHER: {
    size_t block = it->count * esize;
    it->send = xmalloc(block);
    it->recv = xmalloc(block * (size_t)nranks);
    ref_fill(it->send, it->count, it->dtype, HOOP_MAX, rank, it->seed);
    it->dsend = on_device(it->send, block);
    it->drecv = rank == it->root ? on_device(it->recv, block * (size_t)nranks) : NULL;
    must(hoop_igather(comm, it->dsend, it->drecv, it->count, it->dtype, it->root, &it->req),
         "hoop_igather");
    break;
  }
  case SCATTER: {
    size_t block = it->count * esize;
    it->send = xmalloc(block * (size_t)nranks);
    it->recv = xmalloc(block);
    for (int r = 0; r < nranks; r++)
      ref_fill(it->send + (size_t)r * block, it->count, it->dtype, HOOP_MIN, r, it->seed);
    it->dsend = rank == it->root ? on_device(it->send, block * (size_t)nranks) : NULL;
    it->drecv = on_device(it->recv, block);
    must(hoop_iscatter(comm, it->dsend, it->drecv, it->count, it->dtype, it->root, &it->req),
         "hoop_iscatter");
    break;
  }
  case BARRIER: must(hoop_ibarrier(comm, &it->req), "hoop_ibarrier"); break;
  case FUSED:
    for (size_t b = 0; b < it->nbufs; b++) {
      it->counts[b] = b == 3 ? big / 7 : odd_counts[(b + (size_t)i) % NCOUNTS];
      it->sends[b] = xmalloc(it->counts[b] * esize);
      it->recvs[b] = b % 2 ? it->sends[b] : xmalloc(it->counts[b] * esize);
      ref_fill(it->sends[b], it->counts[b], it->dtype, it->op, rank, it->seed + (unsigned)b);
      if (device_buffers && (b + (size_t)i) % 2 == 0 && it->counts[b]) {
        it->dsends[b] = devmem_put(it->sends[b], it->counts[b] * esize);
        it->drecvs[b] = b % 2 ? it->dsends[b] : devmem_put(NULL, it->counts[b] * esize);
      }
    }
    char *sends[MAX_BUFS], *recvs[MAX_BUFS];
    for (size_t b = 0; b < it->nbufs; b++) {
      sends[b] = it->dsends[b] ? it->dsends[b] : it->sends[b];
      recvs[b] = it->drecvs[b] ? it->drecvs[b] : it->recvs[b];
    }
    must(hoop_iallreduce_many(comm, it->nbufs, (const void *const *)sends, (void *const *)recvs,
                              it->counts, it->dtype, it->op, &it->req),
         "hoop_iallreduce_many");
    break;
  default: break;
  }
}

/* --device: the result back into the host copy, the device copies freed. */
static void from_device(item *it) {
  size_t esize = hoop_dtype_size(it->dtype);
  for (size_t b = 0; it->kind == FUSED && b < it->nbufs; b++) {
    if (!it->drecvs[b])
      continue;
    devmem_get(it->recvs[b], it->drecvs[b], it->counts[b] * esize);
    if (it->drecvs[b] != it->dsends[b])
      devmem_free(it->drecvs[b]);
    devmem_free(it->dsends[b]);
    it->dsends[b] = it->drecvs[b] = NULL;
  }
  if (it->kind == REDUCE || it->kind == GATHER || it->kind == SCATTER) {
    size_t bytes = it->count * esize * (it->kind == GATHER ? (size_t)nranks : 1);
    if (device_buffers && it->drecv) {
      devmem_get(it->recv, it->drecv, bytes);
      devmem_free(it->drecv);
    }
    if (device_buffers && it->dsend)
      devmem_free(it->dsend);
    it->dsend = it->drecv = NULL;
    return;
  }
  if (!device_buffers || !it->drecv)
    return;
  if (it->kind == REDUCE_SCATTER) { /* in place, the result lies inside the input */
    devmem_get(it->recv, it->drecv, it->count * esize);
    if (!it->in_place)
      devmem_free(it->drecv);
    devmem_free(it->dsend);
    it->dsend = it->drecv = NULL;
    return;
  }
  size_t bytes = it->kind == ALLGATHER || it->kind == ALLTOALL ? it->count * esize * (size_t)nranks
                                                               : it->count * esize;
  devmem_get(it->kind == BROADCAST ? it->send : it->recv, it->drecv, bytes);
  if (it->kind == ALLGATHER ? !it->in_place : it->dsend != it->drecv)
    devmem_free(it->dsend);
  devmem_free(it->drecv);
  it->dsend = it->drecv = NULL;
}

static void check(item *it) {
  char msg[256];
  from_device(it);
  switch (it->kind) {
  case ALLREDUCE:
    checks++;
    if (ref_check_allreduce(it->recv, it->count, it->dtype, it->op, nranks, it->seed, msg,
                            sizeof msg))
      fail("iallreduce %s %s count %zu: %s", hoop_dtype_name(it->dtype), hoop_op_name(it->op),
           it->count, msg);
    break;
  case BROADCAST:
    checks++;
    if (ref_check_equal(it->send, it->count, it->dtype, HOOP_MIN, it->root, it->seed, msg,
                        sizeof msg))
      fail("ibroadcast %s count %zu root %d: %s", hoop_dtype_name(it->dtype), it->count, it->root,
           msg);
    break;
  case ALLGATHER: {
    size_t block = it->count * hoop_dtype_size(it->dtype);
    for (int r = 0; r < nranks; r++) {
      checks++;
      if (ref_check_equal(it->recv + (size_t)r * block, it->count, it->dtype, HOOP_MAX, r, it->seed,
                          msg, sizeof msg))
        fail("iallgather %s count %zu, block of rank %d: %s", hoop_dtype_name(it->dtype), it->count,
             r, msg);
    }
    break;
  }
  case ALLTOALL: {
    size_t block = it->count * hoop_dtype_size(it->dtype);
    char *input = xmalloc(block * (size_t)nranks);
    for (int q = 0; q < nranks; q++) {
      ref_fill(input, it->count * (size_t)nranks, it->dtype, HOOP_MAX, q, it->seed);
      checks++;
      if (memcmp(it->recv + (size_t)q * block, input + (size_t)rank * block, block) != 0)
        fail("ialltoall %s count %zu %s: the block from rank %d differs",
             hoop_dtype_name(it->dtype), it->count, it->in_place ? "in place" : "out of place", q);
    }
    free(input);
    break;
  }
  case REDUCE_SCATTER:
    checks++;
    if (ref_check_reduced(it->recv, (size_t)rank * it->count, it->count, it->dtype, it->op, nranks,
                          it->seed, msg, sizeof msg))
      fail("ireduce_scatter %s %s recvcount %zu %s: %s", hoop_dtype_name(it->dtype),
           hoop_op_name(it->op), it->count, it->in_place ? "in place" : "out of place", msg);
    break;
  case REDUCE:
    checks++;
    if (rank == it->root && ref_check_allreduce(it->recv, it->count, it->dtype, it->op, nranks,
                                                it->seed, msg, sizeof msg))
      fail("ireduce %s %s count %zu root %d: %s", hoop_dtype_name(it->dtype), hoop_op_name(it->op),
           it->count, it->root, msg);
    break;
  case GATHER: {
    size_t block = it->count * hoop_dtype_size(it->dtype);
    for (int r = 0; rank == it->root && r < nranks; r++) {
      checks++;
      if (ref_check_equal(it->recv + (size_t)r * block, it->count, it->dtype, HOOP_MAX, r, it->seed,
                          msg, sizeof msg))
        fail("igather %s count %zu root %d, block of rank %d: %s", hoop_dtype_name(it->dtype),
             it->count, it->root, r, msg);
    }
    break;
  }
  case SCATTER:
    checks++;
    if (ref_check_equal(it->recv, it->count, it->dtype, HOOP_MIN, rank, it->seed, msg, sizeof msg))
      fail("iscatter %s count %zu root %d: %s", hoop_dtype_name(it->dtype), it->count, it->root,
           msg);
    break;
  case FUSED:
    for (size_t b = 0; b < it->nbufs; b++) {
      checks++;
      if (ref_check_allreduce(it->recvs[b], it->counts[b], it->dtype, it->op, nranks,
                              it->seed + (unsigned)b, msg, sizeof msg))
        fail("iallreduce_many %s %s buffer %zu of %zu (count %zu): %s", hoop_dtype_name(it->dtype),
             hoop_op_name(it->op), b, it->nbufs, it->counts[b], msg);
    }
    break;
  default: checks++; break;
  }
}

static void release(item *it) {
  if (it->kind == FUSED) {
    for (size_t b = 0; b < it->nbufs; b++) {
      if (it->recvs[b] != it->sends[b])
        free(it->recvs[b]);
      free(it->sends[b]);
    }
    return;
  }
  if (it->kind == ALLGATHER) {
    if (!it->in_place)
      free(it->send);
    free(it->recv);
    return;
  }
  if (it->kind == REDUCE_SCATTER) {
    if (!it->in_place)
      free(it->recv);
    free(it->send);
    return;
  }
  if (it->recv != it->send)
    free(it->recv);
  free(it->send);
}

/* Post n items of every kind, then complete them in a rank's own scrambled order: every third by
 * testing until done, the rest by waiting. */
static void batch(int n, size_t big) {
  item *items = calloc((size_t)n, sizeof *items);
  int *order = xmalloc((size_t)n * sizeof *order);
  if (!items)
    exit(2);
  for (int i = 0; i < n; i++) {
    item *it = &items[i];
    it->kind = (enum kind)(i % KINDS);
    it->dtype = (hoop_dtype)((i / KINDS + i) % HOOP_DTYPE_COUNT);
    it->op = (hoop_op)((i / 3) % HOOP_OP_COUNT);
    /* The pairs hoop.h refuses (bitwise ops on float types, bool's AVG) take a sum instead. */
    int is_float = it->dtype == HOOP_FLOAT16 || it->dtype == HOOP_BFLOAT16 ||
                   it->dtype == HOOP_FLOAT32 || it->dtype == HOOP_FLOAT64;
    if ((is_float && it->op >= HOOP_BAND) || (it->dtype == HOOP_BOOL && it->op == HOOP_AVG))
      it->op = HOOP_SUM;
    it->count = i % 11 == 0 ? big : odd_counts[(size_t)i % NCOUNTS];
    it->root = i % nranks;
    it->in_place = (i / KINDS) % 2;
    it->nbufs = 4 + (size_t)i % (MAX_BUFS - 3);
    post(it, i, big);
    order[i] = i;
  }
  unsigned state = (unsigned)rank * 2654435761u + 1u;
  for (int i = n - 1; i > 0; i--) {
    state = state * 1103515245u + 12345u;
    int j = (int)((state >> 16) % (unsigned)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int k = 0; k < n; k++) {
    item *it = &items[order[k]];
    if (k % 3 == 0) {
      int done = 0;
      while (!done) {
        must(hoop_test(it->req, &done), "hoop_test");
        if (!done)
          sched_yield();
      }
    } else {
      must(hoop_wait(it->req), "hoop_wait");
    }
    check(it);
    release(it);
  }
  free(order);
  free(items);
}

/* The fused call blocking, on many buffers of odd counts, some in place, some empty. */
static void fused_blocking(size_t big) {
  enum { N = 37 };
  char *sends[N], *recvs[N];
  size_t counts[N];
  hoop_dtype dtype = HOOP_FLOAT32;
  for (int b = 0; b < N; b++) {
    counts[b] = b == 20 ? big : odd_counts[(size_t)b % NCOUNTS] + (size_t)b;
    sends[b] = xmalloc(counts[b] * 4);
    recvs[b] = b % 3 == 0 ? sends[b] : xmalloc(counts[b] * 4);
    ref_fill(sends[b], counts[b], dtype, HOOP_SUM, rank, 777u + (unsigned)b);
  }
  calls++;
  must(hoop_allreduce_many(comm, N, (const void *const *)sends, (void *const *)recvs, counts, dtype,
                           HOOP_SUM),
       "hoop_allreduce_many");
  char msg[256];
  for (int b = 0; b < N; b++) {
    checks++;
    if (ref_check_allreduce(recvs[b], counts[b], dtype, HOOP_SUM, nranks, 777u + (unsigned)b, msg,
                            sizeof msg))
      fail("allreduce_many buffer %d (count %zu): %s", b, counts[b], msg);
    if (recvs[b] != sends[b])
      free(recvs[b]);
    free(sends[b]);
  }
}

/* hoop_finalize with a request outstanding refuses and leaves the communicator whole. */
static void finalize_refused(void) {
  hoop_request *req;
  must(hoop_ibarrier(comm, &req), "hoop_ibarrier");
  calls++;
  checks++;
  hoop_result result = hoop_finalize(comm);
  if (result != HOOP_ERR_INVALID_ARG || !strstr(hoop_last_error(comm), "outstanding"))
    fail("hoop_finalize with a request outstanding returned %s (%s), expected invalid argument "
         "naming the outstanding request",
         hoop_strerror(result), hoop_last_error(comm));
  must(hoop_wait(req), "hoop_wait after the refused finalize");
}

/* Post the failure cases' first n requests on zeroed buffers of count floats (on the device with
 * device): every fourth a barrier, the others in-place allreduces of count or 7 elements. */
static void post_zeros(int n, float **bufs, hoop_request **reqs, size_t count, int device) {
  float *zeros = xmalloc(count * sizeof(float));
  memset(zeros, 0, count * sizeof(float));
  for (int i = 0; i < n; i++) {
    if (device) {
      bufs[i] = devmem_put(zeros, count * sizeof(float));
    } else {
      bufs[i] = xmalloc(count * sizeof(float));
      memcpy(bufs[i], zeros, count * sizeof(float));
    }
    if (i % 4 == 3)
      must(hoop_ibarrier(comm, &reqs[i]), "hoop_ibarrier");
    else
      must(hoop_iallreduce(comm, bufs[i], bufs[i], i % 2 ? count : 7, HOOP_FLOAT32, HOOP_SUM,
                           &reqs[i]),
           "hoop_iallreduce");
  }
  free(zeros);
}

/* Rank 1 aborts or dies after a moment; the others post and must see every request fail (with
 * kill-device, every request after the first four: rank 1 saw two through and died with two in
 * flight, which its progress thread may have finished). */
static int failing(const char *how) {
  int device = strcmp(how, "kill-device") == 0, first_failing = device ? 4 : 0;
  if (device) {
    char msg[256];
    if (devmem_init(msg, sizeof msg) != 0) {
      fail("--fail kill-device needs a driver: %s", msg);
      return 1;
    }
  }
  double timeout = 10;
  const char *text = getenv("HOOP_TIMEOUT");
  if (text)
    timeout = atof(text);
  /* hooprun ends the job when a rank dies (SIGTERM, then SIGKILL 3 s later): the survivors stay
   * to report what their requests said. */
  if (rank != 1)
    signal(SIGTERM, SIG_IGN);
  enum { N = 12 };
  hoop_request *reqs[N];
  size_t count = 1 << 20;
  float *bufs[N];
  if (rank == 1 && device) {
    /* Post what the others post first, see two through, die with two more in flight. */
    post_zeros(first_failing, bufs, reqs, count, 1);
    must(hoop_wait(reqs[0]), "hoop_wait");
    must(hoop_wait(reqs[1]), "hoop_wait");
    raise(SIGKILL);
  }
  if (rank == 1) {
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    if (strcmp(how, "kill") == 0)
      raise(SIGKILL);
    hoop_abort(comm, "nb_worker aborts on purpose");
    hoop_finalize(comm);
    return 0;
  }
  double start = now_s();
  post_zeros(N, bufs, reqs, count, device);
  int bad = 0;
  for (int i = N - 1; i >= 0; i--) {
    hoop_result result = hoop_wait(reqs[i]);
    checks++;
    if (device && i == 0) {
      /* Rank 1 saw request 1 through: every rank had finished request 0 before its part of
       * request 1's last barrier. */
      if (result != HOOP_OK)
        fail("request 0, which every rank saw through, failed: %s", hoop_last_error(comm));
    } else if (device && i == 1) {
      /* Rank 1 saw it through and died at once. A rank still in the last round of the call's
       * closing barrier, waiting on another survivor, may see the death first (its socket's end,
       * or the news from a peer), and a loss seen during a call fails the call: either is right,
       * as long as a failure names rank 1. */
      if (result != HOOP_OK && !strstr(hoop_last_error(comm), "rank 1"))
        fail("request 1 failed without naming rank 1: %s", hoop_last_error(comm));
    } else if (i < first_failing && result == HOOP_OK) {
      /* rank 1's progress thread may have seen it through before the kill */
    } else if (result == HOOP_OK || !strstr(hoop_last_error(comm), "rank 1")) {
      fail("request %d completed with %s (%s): expected an error naming rank 1", i,
           hoop_strerror(result), hoop_last_error(comm));
      bad = 1;
    }
    if (device)
      devmem_free(bufs[i]);
    else
      free(bufs[i]);
  }
  double took = now_s() - start;
  checks++;
  if (took > timeout + 5)
    fail("the requests took %.1f s to fail, HOOP_TIMEOUT is %.0f s", took, timeout);
  if (!bad)
    printf("nb_worker rank %d: all %d requests failed naming rank 1 (%s) in %.2f s: %s\n", rank,
           N - first_failing, how, took, hoop_last_error(comm));
  checks++;
  if (hoop_finalize(comm) != HOOP_OK)
    fail("hoop_finalize after the failure refused");
  return 0;
}

static void failing_pack(void) {
  enum { N = 6, COUNT = 1001 };
  float host[COUNT];
  for (int i = 0; i < COUNT; i++)
    host[i] = (float)i;
  void *sends[N], *recvs[N];
  size_t counts[N];
  if (rank == 1) {
    /* The stand-in counts every copy: N uploads, then two packing copies go through. */
    char env[16], msg[256];
    snprintf(env, sizeof env, "%d", N + 2);
    setenv("FAKECUDA_FAIL_AFTER", env, 1);
    if (devmem_init(msg, sizeof msg) != 0) {
      fail("--fail pack needs a driver: %s", msg);
      return;
    }
  }
  for (int b = 0; b < N; b++) {
    sends[b] = rank == 1 ? devmem_put(host, sizeof host) : xmalloc(sizeof host);
    if (rank != 1)
      memcpy(sends[b], host, sizeof host);
    recvs[b] = sends[b];
    counts[b] = COUNT;
  }
  /* Every rank past its start before rank 1 fails; rank 1 may leave the barrier first, so the
   * others may learn of its failure in the barrier already. */
  double start = now_s();
  hoop_result result = hoop_barrier(comm);
  if (result == HOOP_OK)
    result = hoop_allreduce_many(comm, N, (const void *const *)sends, recvs, counts, HOOP_FLOAT32,
                                 HOOP_SUM);
  double took = now_s() - start;
  const char *message = hoop_last_error(comm);
  const char *expect = rank == 1 ? "illegal memory access" : "rank 1";
  checks++;
  if (result == HOOP_OK || !strstr(message, expect) || took > 3.0)
    fail("the barrier and fused allreduce returned %s after %.2f s (%s): expected an error saying "
         "'%s' within 3 s",
         hoop_strerror(result), took, message, expect);
  else
    printf("nb_worker rank %d: the barrier or fused allreduce failed in %.2f s: %s\n", rank, took,
           message);
  /* Rank 1 goes on living (as a program that caught the error would) rather than finalize at
   * once: the others must have been told, not learn it from its goodbye. */
  if (rank == 1) {
    struct timespec linger = {4, 0};
    nanosleep(&linger, NULL);
  }
  for (int b = 0; b < N; b++)
    if (rank == 1)
      devmem_free(sends[b]);
    else
      free(sends[b]);
  hoop_finalize(comm);
}

static void progress_without_calls(void) {
  if (rank == 0) {
    hoop_request *req;
    must(hoop_ibarrier(comm, &req), "hoop_ibarrier");
    struct timespec nap = {2, 0};
    nanosleep(&nap, NULL);
    must(hoop_wait(req), "hoop_wait");
  } else {
    double start = now_s();
    must(hoop_barrier(comm), "hoop_barrier");
    double took = now_s() - start;
    checks++;
    if (took > 1.0)
      fail("the barrier took %.2f s while rank 0 slept 2 s after posting its own: rank 0's "
           "request did not progress without calls",
           took);
    else
      printf("nb_worker rank %d: barrier done in %.3f s while rank 0 slept\n", rank, took);
  }
}

int main(int argc, char **argv) {
  int quick = 0, progress = 0;
  double idle = 0, busy = 0;
  const char *how = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "--progress") == 0)
      progress = 1;
    else if (strcmp(argv[i], "--fail") == 0 && i + 1 < argc)
      how = argv[++i];
    else if (strcmp(argv[i], "--idle") == 0 && i + 1 < argc)
      idle = atof(argv[++i]);
    else if (strcmp(argv[i], "--busy") == 0 && i + 1 < argc)
      busy = atof(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0)
      device_buffers = 1;
  }
  char why[256];
  if (device_buffers && devmem_init(why, sizeof why) != 0) {
    fprintf(stderr, "nb_worker: --device: %s\n", why);
    return 77;
  }
  must(hoop_init_from_env(&comm), "hoop_init_from_env");
  rank = hoop_rank(comm);
  nranks = hoop_size(comm);
  if (idle > 0 || busy > 0) {
    printf("nb_worker rank %d ready\n", rank);
    fflush(stdout);
    double until = now_s() + idle + busy;
    if (busy > 0) {
      /* The ranks stop together: once one's time is up (the allreduce's MAX), all are. */
      for (float over = 0; over == 0;) {
        over = now_s() >= until;
        must(hoop_allreduce(comm, &over, &over, 1, HOOP_FLOAT32, HOOP_MAX), "hoop_allreduce");
      }
    }
    while (now_s() < until)
      usleep(10000);
    must(hoop_finalize(comm), "hoop_finalize");
  } else if (how && strcmp(how, "pack") == 0) {
    failing_pack();
  } else if (how) {
    failing(how);
  } else if (progress) {
    progress_without_calls();
    must(hoop_finalize(comm), "hoop_finalize");
  } else {
    size_t big = quick ? 150001 : 1300021;
    batch(quick ? 25 : 60, big);
    batch(10, big / 8);
    fused_blocking(big);
    finalize_refused();
    must(hoop_barrier(comm), "hoop_barrier");
    calls++;
    must(hoop_finalize(comm), "hoop_finalize");
    printf("nb_worker rank %d called %zu collectives\n", rank, calls);
  }
  printf("nb_worker rank %d of %d: %zu checks, %zu failed\n", rank, nranks, checks, failures);
  return failures ? 1 : 0;
}
