/* stats_worker.c - hoop_comm_stats against a rank slowed on purpose (tests/test_stats.sh runs it
 * under hooprun). Every rank runs steps of one allreduce (its result checked); rank --slow sleeps
 * --delay-ms before each. Rank 0 decides when to stop (a flag in the allreduce), after --seconds.
 * Each rank reads hoop_comm_stats every 100 ms and notes when the rendezvous server's answer first
 * names the slow rank as the latest, with its median lateness within 20% of the delay of the
 * lateness measured by the clock: each step's allreduce carries every rank's arrival time (one
 * machine's CLOCK_MONOTONIC, which network namespaces share), so every rank knows how much
 * later than the first the slow rank came, and the median of the last 64 is what the lateness
 * named is held to (where ranks far outnumber the CPUs the slow rank comes later than its
 * sleep, by more the busier the machine, and its sleep alone was not a fair reference); with
 * --slow-link S (and --count large enough to time links: each allreduce's payload, in floats), when
 * it first names rank S as the sender on the job's slowest link (tests/netns-test.sh shapes S's
 * host's link). --slow -1: no rank is slowed, and lateness is not checked. --tolerance F: the
 * lateness named may be off the sleep by F of the delay (default 0.2). --expect-goodput: some
 * peer's large messages to this rank were timed (a goodput), as over TCP and ibverbs they are.
 *
 * It then checks what every rank's figures must say: the allreduce's calls counted once each, the
 * payload, time waiting within time inside calls, bytes and waits by peer (this rank's own entry
 * empty), the slowest rank mapped into a communicator split from the job's (even and odd ranks),
 * and the argument checks. Prints one line "stats_worker rank R: named rank S late M ms after T s;
 * steps N; waited W s (share P); the slow rank came Z ms late (it slept Y ms)" and "stats_worker
 * rank R: C checks, F failed"; exit 1 on a failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hoop.h"

/* Floats per allreduce by default, and 2 + size more: rank 0's stop flag, the slow rank's sleep,
 * each rank's arrival (ms on CLOCK_MONOTONIC modulo 65536: a float holds it to 4 us). */
#define COUNT 1000
#define SLEPT 64 /* the last steps, whose median lateness by the clock is the reference */

static hoop_comm *comm;
static int rank, size;
static int checks, failures;

static void check(int ok, const char *what) {
  checks++;
  if (!ok) {
    failures++;
    fprintf(stderr, "stats_worker rank %d: FAIL: %s\n", rank, what);
  }
}

static void must(hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "stats_worker rank %d: %s: %s: %s\n", rank, what, hoop_strerror(result),
            hoop_last_error(comm));
    exit(1);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of the first n of values (n <= SLEPT), 0 for none. */
static double median(const double *values, int n) {
  double sorted[SLEPT];
  if (n <= 0)
    return 0;
  memcpy(sorted, values, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, by_double);
  return sorted[(n - 1) / 2];
}

/* Rank r's input of step s, element i: not small integers, so that a wrong sum shows. */
static float input(int r, long s, int i) {
  return (float)(r + 1) * 0.37f + (float)((s * 7 + i) % 113) * 0.011f;
}

int main(int argc, char **argv) {
  int slow = 1, slow_link = -1, expect_goodput = 0;
  size_t count = COUNT;
  double delay_ms = 5, seconds = 4, tolerance = 0.2;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--expect-goodput") == 0)
      expect_goodput = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--expect-goodput") == 0) {
      i--;
      continue;
    }
    if (strcmp(argv[i], "--slow") == 0)
      slow = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--delay-ms") == 0)
      delay_ms = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--seconds") == 0)
      seconds = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--tolerance") == 0)
      tolerance = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--slow-link") == 0)
      slow_link = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--count") == 0)
      count = (size_t)atol(argv[i + 1]);
  }
  must(hoop_init_from_env(&comm), "hoop_init_from_env");
  rank = hoop_rank(comm);
  size = hoop_size(comm);
  size_t extra = 2 + (size_t)size; /* the floats after the payload */
  float *buf = malloc((count + extra) * sizeof *buf);
  hoop_peer_stats *peers = calloc((size_t)size, sizeof *peers);
  if (!buf || !peers)
    return 1;

  double began = now_s(), named_after = -1, named_late = 0, next_look = began;
  double link_after = -1, link_goodput = 0;
  int named = -1, link_to = -1;
  long steps = 0;
  /* How much later than the first the slow rank came to each step, and how long it slept
   * before it (ms). */
  double came[SLEPT] = {0}, came_median = 0, slept[SLEPT] = {0};
  for (;;) {
    double sleep_ms = 0;
    if (rank == slow) {
      double before = now_s();
      usleep((useconds_t)(delay_ms * 1000));
      sleep_ms = (now_s() - before) * 1000;
    }
    for (size_t i = 0; i < count; i++)
      buf[i] = input(rank, steps, (int)(i % 100000));
    buf[count] = rank == 0 && now_s() - began >= seconds ? 1.0f : 0.0f;
    buf[count + 1] = (float)sleep_ms;
    for (int r = 0; r < size; r++)
      buf[count + 2 + r] = 0;
    buf[count + 2 + rank] = (float)fmod(now_s() * 1000, 65536);
    must(hoop_allreduce(comm, buf, buf, count + extra, HOOP_FLOAT32, HOOP_SUM), "hoop_allreduce");
    slept[steps % SLEPT] = buf[count + 1];
    if (slow >= 0 && slow < size) {
      /* The slow rank's arrival after each other rank's, across the modulus: the most is after
       * the first. */
      double latest = 0;
      for (int r = 0; r < size; r++) {
        double after =
            fmod(buf[count + 2 + slow] - buf[count + 2 + r] + 65536 + 32768, 65536) - 32768;
        if (after > latest)
          latest = after;
      }
      came[steps % SLEPT] = latest;
    }
    int wrong = 0;
    for (size_t i = 0; i < count; i++) {
      double want = 0;
      for (int r = 0; r < size; r++)
        want += input(r, steps, (int)(i % 100000));
      wrong += fabs(buf[i] - want) > 1e-4 * fabs(want) + 1e-5;
    }
    check(!wrong, "the allreduce's result");
    steps++;
    if (buf[count] > 0)
      break;
    if (now_s() >= next_look) {
      next_look += 0.1;
      hoop_stats stats;
      must(hoop_comm_stats(comm, &stats, NULL, 0), "hoop_comm_stats");
      double late = stats.slowest_late_s * 1000;
      came_median = median(came, steps < SLEPT ? (int)steps : SLEPT);
      if (named_after < 0 && stats.slowest_rank == slow &&
          fabs(late - came_median) <= tolerance * delay_ms) {
        named_after = now_s() - began;
        named = stats.slowest_rank;
        named_late = late;
      }
      if (link_after < 0 && slow_link >= 0 && stats.slowest_link_from == slow_link) {
        link_after = now_s() - began;
        link_to = stats.slowest_link_to;
        link_goodput = stats.slowest_link_goodput;
      }
    }
  }

  hoop_stats stats;
  must(hoop_comm_stats(comm, &stats, peers, size), "hoop_comm_stats");
  const hoop_coll_stats *ar = &stats.colls[0];
  check(strcmp(hoop_stats_coll_name(0), "allreduce") == 0 && hoop_stats_coll_name(10) == NULL,
        "hoop_stats_coll_name");
  check(ar->calls == (uint64_t)steps, "one allreduce counted per step");
  check(ar->bytes == (uint64_t)steps * (count + extra) * sizeof(float), "the allreduces' payload");
  check(stats.calls == ar->calls && stats.bytes == ar->bytes, "the totals are the allreduces'");
  check(stats.waited_s <= stats.in_calls_s + 1e-9 && stats.in_calls_s <= stats.since_s + 0.01,
        "waiting within the calls, the calls within the communicator's life");
  check(stats.wait_share >= 0 && stats.wait_share <= 1, "the share of time waiting");
  /* Every rank but the slow one waits the delay in every step, most of its time (0.99 seen); the
   * slow one waits far less (0.29 seen alone, 0.51 with 16 ranks on 2 CPUs beside two other
   * jobs, when it also waits for ranks the CPUs kept from running). */
  if (slow < 0)
    ;
  else if (rank != slow)
    check(stats.wait_share > 0.3, "a rank that waits for the slow one waits most of its time");
  else
    check(stats.wait_share < 0.75, "the slow rank waits far less than the ranks that wait for it");
  check(stats.view_age_s >= 0 && stats.view_age_s < 5, "an answer from the server, recent");
  check(stats.reporting == size, "every rank reports");
  uint64_t sent = 0, received = 0;
  double waited = 0;
  for (int p = 0; p < size; p++) {
    check(peers[p].rank == p, "peers[p].rank");
    sent += peers[p].bytes_sent;
    received += peers[p].bytes_received;
    waited += peers[p].waited_s;
  }
  check(peers[rank].bytes_sent == 0 && peers[rank].bytes_received == 0 && peers[rank].waited_s == 0,
        "this rank's own entry is empty");
  /* The board carries small calls on one host without messages: bytes only where there are. */
  check(waited <= stats.waited_s + 1e-6, "the waits by peer add up to at most the calls' waits");
  int who = slow >= 0 ? slow : 0;
  check(peers[who].late_median_s >= 0 && peers[who].late_median_s <= peers[who].late_p99_s &&
            peers[who].late_p99_s <= peers[who].late_max_s,
        "the slow rank's lateness: median <= p99 <= max");

  /* Lateness in a communicator of the even or the odd ranks: the slow rank by its rank there. */
  hoop_comm *half;
  must(hoop_comm_split(comm, rank % 2, rank, &half), "hoop_comm_split");
  hoop_stats hs;
  must(hoop_comm_stats(half, &hs, NULL, 0), "hoop_comm_stats on the split");
  if (slow < 0)
    check(hs.slowest_rank >= -1 && hs.slowest_rank < hoop_size(half),
          "the split names one of its own ranks or none");
  else if (rank % 2 == slow % 2)
    check(hs.slowest_rank == slow / 2, "the split names the slow rank by its rank in the split");
  else
    check(hs.slowest_rank != -1 && hs.slowest_rank < hoop_size(half),
          "the split names one of its own ranks");
  check(hs.calls == 0, "the split made no calls yet");
  must(hoop_barrier(half), "hoop_barrier on the split");
  must(hoop_comm_stats(half, &hs, NULL, 0), "hoop_comm_stats on the split");
  check(hs.colls[3].calls == 1 && hs.calls == 1, "the split's barrier counted on the split");

  /* Argument checks, and the communicator still works after them. */
  check(hoop_comm_stats(NULL, &hs, NULL, 0) == HOOP_ERR_INVALID_ARG, "a NULL comm is refused");
  check(hoop_comm_stats(comm, NULL, NULL, 0) == HOOP_ERR_INVALID_ARG &&
            strstr(hoop_last_error(comm), "hoop_comm_stats"),
        "NULL stats is refused, naming the call");
  check(hoop_comm_stats(comm, &hs, peers, size + 1) == HOOP_ERR_INVALID_ARG,
        "npeers above the size is refused");
  check(hoop_comm_stats(comm, &hs, NULL, 1) == HOOP_ERR_INVALID_ARG,
        "NULL peers with npeers is refused");
  must(hoop_barrier(comm), "hoop_barrier after the refusals");

  must(hoop_finalize(half), "hoop_finalize on the split");
  printf("stats_worker rank %d: named rank %d late %.2f ms after %.1f s; steps %ld; waited %.2f s "
         "(share %.2f); the slow rank came %.2f ms late (it slept %.2f ms)\n",
         rank, named, named_late, named_after, steps, stats.waited_s, stats.wait_share,
         slow >= 0 ? median(came, steps < SLEPT ? (int)steps : SLEPT) : 0,
         slow >= 0 ? median(slept, steps < SLEPT ? (int)steps : SLEPT) : 0);
  if (slow >= 0)
    check(named == slow, "the slow rank was named within the run, late by its sleep within the "
                         "tolerance (20% of the delay unless told)");
  if (expect_goodput) {
    double best = -1;
    for (int p = 0; p < size; p++)
      if (peers[p].goodput > best)
        best = peers[p].goodput;
    printf("stats_worker rank %d: goodput from its peers up to %.1f MB/s\n", rank, best / 1e6);
    check(best > 0, "a goodput from a peer that sent this rank large messages");
  }
  if (slow_link >= 0) {
    printf("stats_worker rank %d: slowest link %d -> %d at %.1f MB/s after %.1f s\n", rank,
           slow_link, link_to, link_goodput / 1e6, link_after);
    check(link_after >= 0, "the slow link's sender was named within the run");
    check(peers[slow_link].goodput != 0, "a goodput from the slow link's sender");
  }
  printf("stats_worker rank %d: %d checks, %d failed\n", rank, checks, failures);
  must(hoop_finalize(comm), "hoop_finalize");
  free(buf);
  free(peers);
  return failures ? 1 : 0;
}
