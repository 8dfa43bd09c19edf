/* ib_end_worker.c - one rank of the soft-RoCE suite's end-of-job cases (tests/rdma-vm/suite); the
 * timing it needs only shows over ibverbs, so make check only builds it.
 *
 * ib_end_worker bye SLEEP_S (3 ranks): a 1 MiB broadcast from rank 0 (the chain 0 -> 1 -> 2), then
 * a 4 KiB one (the tree: rank 0 writes to 1 and 2 directly), then finalize. Rank 2 starts SLEEP_S
 * late, so rank 1 waits on its sends to rank 2 while rank 0 writes the second broadcast, says bye
 * and disconnects: ranks 1 and 2 must still receive what rank 0 sent before its bye.
 *
 * ib_end_worker abort SLEEP_S (2 ranks): rank 0 broadcasts 8 MiB (more than the slots hold) and
 * aborts from another thread one second in; rank 1 starts receiving SLEEP_S late, behind a message
 * cut short by the abort notice. Rank 1 must fail naming the abort's reason. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hoop.h"

#define REASON "ib_end_worker aborts on purpose"

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

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "bye") != 0 && strcmp(argv[1], "abort") != 0)) {
    fprintf(stderr, "usage: ib_end_worker bye|abort SLEEP_S\n");
    return 2;
  }
  int sleep_s = atoi(argv[2]);
  hoop_result result = hoop_init_from_env(&comm);
  if (result != HOOP_OK) {
    fprintf(stderr, "hoop_init: %s: %s\n", hoop_strerror(result), hoop_last_error(comm));
    return 1;
  }
  int rank = hoop_rank(comm);
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
  int ok = result != HOOP_OK && strstr(why, REASON) != NULL;
  if (rank == 0)
    pthread_join(thread, NULL);
  hoop_finalize(comm);
  printf("rank %d: abort case %s\n", rank, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}
