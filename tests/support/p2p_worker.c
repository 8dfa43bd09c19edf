/* p2p_worker.c - point-to-point messages on every rank of a job started by hooprun, each message's
 * contents checked against reference.c's fill for its sender:
 *   a ring shift of every dtype at odd counts (0 among them) and at 4 MiB, the receive and the
 *   send posted together and completed in either order; a pair exchanging 16 MiB each way, posted
 *   together (a cycle that only non-blocking posts survive); eight messages of different tags and
 *   sizes in flight to one peer, completed in scrambled order by hoop_test and hoop_wait; blocking
 *   hoop_send and hoop_recv, the even ranks sending first; messages in flight across an allreduce
 *   posted after them; argument errors.
 * Usage (under hooprun): p2p_worker [--quick] [--device] [--kill] [--stopped]
 *   --device: the buffers in CUDA device memory (HOOP_CUDA_LIBRARY's driver), checked through
 *   host copies. --kill: the last rank dies while the others wait to receive from it.
 *   --stopped (2 ranks): rank 1 stops (SIGSTOP) and rank 0 polls a receive from it with
 *   hoop_test, which must fail within HOOP_TIMEOUT naming it; rank 0 then kills it. */
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
static int rank, nranks, device_buffers;
static size_t checks, failures;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d FAIL: ", rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures++;
}

static void must(hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d FAIL: %s returned %s: %s\n", rank, what, hoop_strerror(result),
            hoop_last_error(comm));
    exit(1);
  }
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    exit(2);
  }
  return p;
}

/* A message's buffers: host memory the test fills and checks, and what the call gets (the device
 * copy with --device). */
typedef struct msg {
  char *host, *buf;
  size_t count;
  hoop_dtype dtype;
  int peer, tag, is_send;
  unsigned seed;
  hoop_request *req;
} msg;

static void msg_init(msg *m, int is_send, int peer, int tag, size_t count, hoop_dtype dtype,
                     unsigned seed) {
  size_t bytes = count * hoop_dtype_size(dtype);
  m->host = xmalloc(bytes);
  m->count = count;
  m->dtype = dtype;
  m->peer = peer;
  m->tag = tag;
  m->is_send = is_send;
  m->seed = seed;
  m->req = NULL;
  if (is_send)
    ref_fill(m->host, count, dtype, HOOP_SUM, rank, seed);
  else
    memset(m->host, 0xA5, bytes);
  m->buf = device_buffers && bytes ? devmem_put(m->host, bytes) : m->host;
}

static void msg_post(msg *m) {
  if (m->is_send)
    must(hoop_isend(comm, m->buf, m->count, m->dtype, m->peer, m->tag, &m->req), "hoop_isend");
  else
    must(hoop_irecv(comm, m->buf, m->count, m->dtype, m->peer, m->tag, &m->req), "hoop_irecv");
}

/* A received message holds its sender's fill; a sent one is unchanged. Frees the buffers. */
static void msg_check(msg *m, const char *what) {
  size_t bytes = m->count * hoop_dtype_size(m->dtype);
  if (m->buf != m->host) {
    devmem_get(m->host, m->buf, bytes);
    devmem_free(m->buf);
  }
  char why[256] = "";
  int from = m->is_send ? rank : m->peer;
  if (ref_check_equal(m->host, m->count, m->dtype, HOOP_SUM, from, m->seed, why, sizeof why))
    fail("%s: %s of %zu %s, tag %d, %s rank %d: %s", what, m->is_send ? "send" : "receive",
         m->count, hoop_dtype_name(m->dtype), m->tag, m->is_send ? "to" : "from", m->peer, why);
  checks++;
  free(m->host);
}

static const size_t odd_counts[] = {0, 1, 3, 7, 31, 97, 1031, 4099};
#define NCOUNTS (sizeof odd_counts / sizeof odd_counts[0])

/* Every rank sends to the next and receives from the previous, posted together. */
static void ring_shift(size_t count, hoop_dtype dtype, unsigned seed, int recv_first) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  msg s, r;
  msg_init(&s, 1, next, 5, count, dtype, seed);
  msg_init(&r, 0, prev, 5, count, dtype, seed);
  if (recv_first) {
    msg_post(&r);
    msg_post(&s);
  } else {
    msg_post(&s);
    msg_post(&r);
  }
  /* Completed in the other order from the posts. */
  must(hoop_wait(recv_first ? s.req : r.req), "hoop_wait");
  must(hoop_wait(recv_first ? r.req : s.req), "hoop_wait");
  msg_check(&r, "ring shift");
  msg_check(&s, "ring shift");
}

/* Ranks 2k and 2k+1 exchange bytes each way, both posted before either waits, the earlier posted
 * waited for first, though the send can end only once the peer's receive, posted after its own
 * send, is under way: the wait must run what was posted behind it. tested: the send completed by
 * a loop of hoop_test, which must do the same. */
static void pair_exchange(size_t bytes, int tested) {
  int partner = rank ^ 1;
  if (partner >= nranks)
    return;
  msg s, r;
  msg_init(&s, 1, partner, 1 + tested, bytes, HOOP_UINT8, 91u + (unsigned)tested);
  msg_init(&r, 0, partner, 1 + tested, bytes, HOOP_UINT8, 91u + (unsigned)tested);
  msg_post(&s);
  msg_post(&r);
  for (int done = 0; tested && !done;)
    must(hoop_test(s.req, &done), "hoop_test");
  if (!tested)
    must(hoop_wait(s.req), "hoop_wait");
  must(hoop_wait(r.req), "hoop_wait");
  msg_check(&r, tested ? "pair exchange, tested" : "pair exchange");
  msg_check(&s, tested ? "pair exchange, tested" : "pair exchange");
}

/* Rank 0 posts eight messages of different tags, sizes and dtypes to rank 1, which posts their
 * receives in the same order; each side completes them in a scrambled order, some by testing. */
static void many_in_flight(int quick) {
  if (nranks < 2 || rank > 1)
    return;
  enum { N = 8 };
  msg m[N];
  for (int i = 0; i < N; i++) {
    size_t count = odd_counts[i % NCOUNTS] * (quick ? 1 : 3) + (size_t)i;
    hoop_dtype dtype = (hoop_dtype)(i % HOOP_DTYPE_COUNT);
    msg_init(&m[i], rank == 0, 1 - rank, 100 + i, count, dtype, 300u + (unsigned)i);
    msg_post(&m[i]);
  }
  static const int order[N] = {5, 2, 7, 0, 3, 6, 1, 4};
  for (int k = 0; k < N; k++) {
    msg *it = &m[order[k]];
    if (k % 2) {
      int done = 0;
      while (!done)
        must(hoop_test(it->req, &done), "hoop_test");
    } else {
      must(hoop_wait(it->req), "hoop_wait");
    }
    msg_check(it, "many in flight");
  }
}

/* Blocking calls: even ranks send to the odd rank above, which answers. */
static void blocking_pingpong(size_t count) {
  int partner = rank ^ 1;
  if (partner >= nranks)
    return;
  msg out, in;
  msg_init(&out, 1, partner, 7, count, HOOP_FLOAT64, 55);
  msg_init(&in, 0, partner, 7, count, HOOP_FLOAT64, 55);
  if (rank % 2 == 0) {
    must(hoop_send(comm, out.buf, count, HOOP_FLOAT64, partner, 7), "hoop_send");
    must(hoop_recv(comm, in.buf, count, HOOP_FLOAT64, partner, 7), "hoop_recv");
  } else {
    must(hoop_recv(comm, in.buf, count, HOOP_FLOAT64, partner, 7), "hoop_recv");
    must(hoop_send(comm, out.buf, count, HOOP_FLOAT64, partner, 7), "hoop_send");
  }
  msg_check(&in, "blocking");
  msg_check(&out, "blocking");
}

/* A ring shift in flight while an allreduce posted after it runs. */
static void across_allreduce(size_t count) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  msg s, r;
  msg_init(&s, 1, next, 9, count, HOOP_INT32, 17);
  msg_init(&r, 0, prev, 9, count, HOOP_INT32, 17);
  msg_post(&r);
  msg_post(&s);
  float sum = 1.0f;
  must(hoop_allreduce(comm, &sum, &sum, 1, HOOP_FLOAT32, HOOP_SUM), "hoop_allreduce");
  if (sum != (float)nranks)
    fail("allreduce between posted messages gave %g, not %d", sum, nranks);
  checks++;
  must(hoop_wait(s.req), "hoop_wait");
  must(hoop_wait(r.req), "hoop_wait");
  msg_check(&r, "across an allreduce");
  msg_check(&s, "across an allreduce");
}

/* A refused call: HOOP_ERR_INVALID_ARG, its message naming what is wrong. */
static void refused(hoop_result result, const char *needle) {
  if (result != HOOP_ERR_INVALID_ARG || !strstr(hoop_last_error(comm), needle))
    fail("expected a refusal saying '%s', got %s: '%s'", needle, hoop_strerror(result),
         hoop_last_error(comm));
  checks++;
}

/* Messages posted among non-blocking collectives, all completed in the reverse order: a receive
 * and a send, an allreduce, a reduce to rank 0 (both ranks of each pair post the messages between
 * them before the collectives, as hoop.h asks), the collectives waited for first. */
static void among_collectives(size_t count) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  msg s, r;
  msg_init(&s, 1, next, 11, count, HOOP_FLOAT32, 23);
  msg_init(&r, 0, prev, 11, count, HOOP_FLOAT32, 23);
  double one = 1.0, sum = 0, total = 0;
  hoop_request *allreduce, *reduce;
  msg_post(&r);
  msg_post(&s);
  must(hoop_iallreduce(comm, &one, &sum, 1, HOOP_FLOAT64, HOOP_SUM, &allreduce), "hoop_iallreduce");
  must(hoop_ireduce(comm, &one, &total, 1, HOOP_FLOAT64, HOOP_SUM, 0, &reduce), "hoop_ireduce");
  must(hoop_wait(reduce), "hoop_wait");
  must(hoop_wait(allreduce), "hoop_wait");
  must(hoop_wait(s.req), "hoop_wait");
  must(hoop_wait(r.req), "hoop_wait");
  checks += 2;
  if (sum != nranks || (rank == 0 && total != nranks))
    fail("collectives among messages: allreduce %g, reduce %g, not %d", sum, total, nranks);
  msg_check(&r, "among collectives");
  msg_check(&s, "among collectives");
}

/* Bad arguments are refused at once, name what is wrong, and leave the communicator working. */
static void bad_arguments(void) {
  char buf[8];
  int other = (rank + 1) % nranks;
  hoop_request *req = (hoop_request *)buf;
  refused(hoop_send(comm, buf, 1, HOOP_UINT8, nranks, 0), "is not a rank");
  refused(hoop_send(comm, buf, 1, HOOP_UINT8, rank, 0), "is this rank");
  if (nranks > 1) {
    refused(hoop_recv(comm, buf, 1, HOOP_UINT8, other, -1), "tag -1");
    refused(hoop_isend(comm, NULL, 4, HOOP_UINT8, other, 0, &req), "buf is NULL");
    if (req != NULL)
      fail("a refused post left its request set");
    refused(hoop_irecv(comm, buf, 1, (hoop_dtype)99, other, 0, &req), "unknown dtype");
  }
}

/* --kill: the last rank dies while the others wait to receive from it; each must fail, naming it,
 * within HOOP_TIMEOUT (hooprun's --timeout). Each survivor first sends the last rank one byte and
 * then posts its receive; the last rank dies once it has every survivor's byte, so no survivor can
 * still be in an earlier call (a barrier before the kill let a survivor learn of the death inside
 * the barrier, told by another). A survivor slow to post may find the communicator failed
 * already: its hoop_irecv then refuses, naming the rank, which is the same report. */
static int kill_last(void) {
  int last = nranks - 1;
  char buf[64] = {0};
  if (rank == last) {
    for (int r = 0; r < last; r++)
      must(hoop_recv(comm, buf, 1, HOOP_UINT8, r, 0), "hoop_recv");
    raise(SIGKILL);
    return 1;
  }
  hoop_request *sent, *req;
  must(hoop_isend(comm, buf, 1, HOOP_UINT8, last, 0, &sent), "hoop_isend");
  hoop_result result = hoop_irecv(comm, buf, sizeof buf, HOOP_UINT8, last, 0, &req);
  if (result == HOOP_OK)
    result = hoop_wait(req);
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d", last);
  if (result == HOOP_OK || !strstr(hoop_last_error(comm), needle)) {
    fprintf(stderr, "rank %d FAIL: the receive from the killed rank gave %s: %s\n", rank,
            hoop_strerror(result), hoop_last_error(comm));
    return 1;
  }
  printf("p2p_worker rank %d: the receive failed naming rank %d: %s\n", rank, last,
         hoop_last_error(comm));
  hoop_wait(sent);
  hoop_finalize(comm);
  return 0;
}

/* --stopped: a receive only ever polled (hoop_test, and the progress thread) from a rank that
 * stopped still fails within HOOP_TIMEOUT, naming it. */
static int stopped_peer(void) {
  int32_t pid = (int32_t)getpid();
  if (rank == 1) {
    must(hoop_send(comm, &pid, 1, HOOP_INT32, 0, 0), "hoop_send");
    raise(SIGSTOP);
    return 0;
  }
  must(hoop_recv(comm, &pid, 1, HOOP_INT32, 1, 0), "hoop_recv");
  char buf[8];
  hoop_request *req;
  must(hoop_irecv(comm, buf, sizeof buf, HOOP_UINT8, 1, 0, &req), "hoop_irecv");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int done = 0;
  hoop_result result = HOOP_OK;
  double took = 0;
  while (!done && result == HOOP_OK && took < 120) {
    result = hoop_test(req, &done);
    usleep(2000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  }
  kill((pid_t)pid, SIGKILL);
  if (result == HOOP_OK || !strstr(hoop_last_error(comm), "rank 1")) {
    fprintf(stderr, "rank 0 FAIL: polling a receive from a stopped rank gave %s after %.1f s: %s\n",
            hoop_strerror(result), took, hoop_last_error(comm));
    return 1;
  }
  printf("p2p_worker rank 0: polling a receive from a stopped rank failed after %.1f s naming "
         "rank 1: %s\n",
         took, hoop_last_error(comm));
  hoop_finalize(comm);
  return 0;
}

int main(int argc, char **argv) {
  int quick = 0, kill = 0, stopped = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "--device") == 0)
      device_buffers = 1;
    else if (strcmp(argv[i], "--kill") == 0)
      kill = 1;
    else if (strcmp(argv[i], "--stopped") == 0)
      stopped = 1;
  }
  char why[256];
  if (device_buffers && devmem_init(why, sizeof why) != 0) {
    fprintf(stderr, "p2p_worker: --device: %s\n", why);
    return 77;
  }
  must(hoop_init_from_env(&comm), "hoop_init_from_env");
  rank = hoop_rank(comm);
  nranks = hoop_size(comm);
  if (kill)
    return kill_last();
  if (stopped && nranks == 2)
    return stopped_peer();
  if (nranks > 1) {
    for (int d = 0; d < HOOP_DTYPE_COUNT; d++)
      for (size_t c = 0; c < NCOUNTS; c++)
        ring_shift(odd_counts[c], (hoop_dtype)d, 11u * (unsigned)d + (unsigned)c, (int)(c % 2));
    ring_shift((size_t)1 << (quick ? 20 : 22), HOOP_FLOAT32, 3, 1);
    pair_exchange(quick ? (size_t)4 << 20 : (size_t)16 << 20, 0);
    pair_exchange((size_t)4 << 20, 1);
    many_in_flight(quick);
    blocking_pingpong(1);
    blocking_pingpong(quick ? 100000 : 1000003);
    across_allreduce(4099);
    among_collectives(1 << 18);
    must(hoop_barrier(comm), "hoop_barrier");
  }
  bad_arguments();
  must(hoop_barrier(comm), "hoop_barrier");
  printf("p2p_worker rank %d of %d: %zu checks, %zu failed\n", rank, nranks, checks, failures);
  must(hoop_finalize(comm), "hoop_finalize");
  return failures ? 1 : 0;
}
