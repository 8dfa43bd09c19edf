/* ib_end_worker.c - one rank of the soft-RoCE suite's end-of-job cases (tests/rdma-vm/suite); the
 * timing it needs only shows over ibverbs, so make check only builds it.
 *
 * ib_end_worker bye SLEEP_S (3 ranks, run with HOOP_ALGO=ring): a 1 MiB broadcast from rank 0,
 * then a 4 KiB one, both along the chain 0 -> 1 -> 2, then finalize. Rank 2 starts SLEEP_S late, so
 * rank 1 waits on its sends to rank 2 while rank 0 writes the second broadcast, says bye and
 * disconnects: rank 1 must still receive what rank 0 sent before its bye, and pass it on.
 *
 * ib_end_worker gone SLEEP_S (2 ranks): after one barrier rank 1 leaves at once without finalizing
 * (_exit: the kernel tears its queue pairs down), while rank 0 stays out of the library for
 * SLEEP_S, so that the disconnect waits unread; then rank 0 finalizes, which must not wait for a
 * goodbye that can no longer be delivered: it prints how long its hoop_finalize took, and fails
 * past GONE_FINALIZE_MAX_S (the wait it used to make was min(HOOP_TIMEOUT, 30 s)).
 *
 * ib_end_worker abort SLEEP_S (2 ranks): rank 0 broadcasts 8 MiB (more than the slots hold) and
 * aborts from another thread one second in; rank 1 starts receiving SLEEP_S late, behind a message
 * cut short by the abort notice. Rank 1 must fail naming the abort's reason.
 *
 * ib_end_worker inband SLEEP_S: the same, but the reason must come in band, on the queue pair: each
 * rank writes $HOOP_TEST_DIR/readyR once initialized and waits for $HOOP_TEST_DIR/go, which the
 * suite creates after stopping the hoopd the job met at; with no server left to relay the abort,
 * rank 1 must find the notice behind the cut message (and its message must not name the server). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hoop.h"

#define REASON "ib_end_worker aborts on purpose"
#define GONE_FINALIZE_MAX_S 10.0

static hoop_comm *comm;

static void *aborter(void *arg) {
  (void)arg;
  sleep(1);
  hoop_abort(comm, REASON);
  return NULL;
}

static int fill_and_check(int *buf, size_t count, int seed, int root_rank) {
  for (size_t i = 0; i < count; i++) {
    int want = (int)(i * 7u) + seed;
    if (root_rank)
      buf[i] = want;
    else if (buf[i] != want)
      return -1;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* inband: say this rank is up, then wait (at most a minute) for the suite's go. */
static int wait_for_go(int rank) {
  const char *dir = getenv("HOOP_TEST_DIR");
  if (!dir)
    return -1;
  char path[4096];
  snprintf(path, sizeof path, "%s/ready%d", dir, rank);
  FILE *ready = fopen(path, "w");
  if (!ready || fclose(ready) != 0)
    return -1;
  snprintf(path, sizeof path, "%s/go", dir);
  for (int tries = 0; tries < 1200; tries++) {
    if (access(path, F_OK) == 0)
      return 0;
    usleep(50 * 1000);
  }
  return -1;
}

static int gone_case(int rank, int sleep_s) {
  hoop_result result = hoop_barrier(comm);
  if (result != HOOP_OK) {
    printf("rank %d FAIL: barrier: %s: %s\n", rank, hoop_strerror(result), hoop_last_error(comm));
    return 1;
  }
  if (rank == 1) {
    printf("rank 1: leaving without hoop_finalize\n");
    fflush(stdout);
    _exit(0);
  }
  sleep((unsigned)sleep_s);
  double started = now_s();
  hoop_finalize(comm);
  double took = now_s() - started;
  int ok = took < GONE_FINALIZE_MAX_S;
  printf("rank %d: hoop_finalize took %.2f s; gone case %s\n", rank, took, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "bye") != 0 && strcmp(argv[1], "abort") != 0 &&
                    strcmp(argv[1], "inband") != 0 && strcmp(argv[1], "gone") != 0)) {
    fprintf(stderr, "usage: ib_end_worker bye|abort|inband|gone SLEEP_S\n");
    return 2;
  }
  int sleep_s = atoi(argv[2]);
  hoop_result result = hoop_init_from_env(&comm);
  if (result != HOOP_OK) {
    fprintf(stderr, "hoop_init: %s: %s\n", hoop_strerror(result), hoop_last_error(comm));
    return 1;
  }
  int rank = hoop_rank(comm);
  if (strcmp(argv[1], "gone") == 0)
    return gone_case(rank, sleep_s);
  if (strcmp(argv[1], "bye") == 0) {
    size_t big = (1 << 20) / sizeof(int), small = 4096 / sizeof(int);
    int *a = calloc(big, sizeof *a), *b = calloc(small, sizeof *b);
    if (!a || !b)
      return 2;
    fill_and_check(a, big, 1, rank == 0);
    fill_and_check(b, small, 2, rank == 0);
    if (rank == 2)
      sleep((unsigned)sleep_s);
    result = hoop_broadcast(comm, a, big, HOOP_INT32, 0);
    if (result == HOOP_OK)
      result = hoop_broadcast(comm, b, small, HOOP_INT32, 0);
    if (result != HOOP_OK) {
      printf("rank %d FAIL: %s: %s\n", rank, hoop_strerror(result), hoop_last_error(comm));
      return 1;
    }
    if (fill_and_check(a, big, 1, 0) != 0 || fill_and_check(b, small, 2, 0) != 0) {
      printf("rank %d FAIL: wrong data\n", rank);
      return 1;
    }
    hoop_finalize(comm);
    printf("rank %d: bye case ok\n", rank);
    return 0;
  }
  int inband = strcmp(argv[1], "inband") == 0;
  if (inband && wait_for_go(rank) != 0) {
    printf("rank %d FAIL: no go from the suite (HOOP_TEST_DIR)\n", rank);
    return 1;
  }
  size_t count = (8 << 20) / sizeof(int);
  int *buf = calloc(count, sizeof *buf);
  if (!buf)
    return 2;
  pthread_t thread;
  if (rank == 0 && pthread_create(&thread, NULL, aborter, NULL) != 0)
    return 2;
  if (rank == 1)
    sleep((unsigned)sleep_s);
  result = hoop_broadcast(comm, buf, count, HOOP_INT32, 0);
  const char *why = hoop_last_error(comm);
  printf("rank %d: broadcast returned %s: %s\n", rank, hoop_strerror(result), why);
  int ok = result != HOOP_OK && strstr(why, REASON) != NULL &&
           !(inband && rank == 1 && strstr(why, "rendezvous server") != NULL);
  if (rank == 0)
    pthread_join(thread, NULL);
  hoop_finalize(comm);
  printf("rank %d: abort case %s\n", rank, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
