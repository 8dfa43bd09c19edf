/* test_shrink.c - survivors go on: after ranks of a job are killed (SIGKILL) or stopped (SIGSTOP)
 * in the middle of allreduces, every survivor's call fails, hoop_comm_shrink gives each a
 * communicator of the survivors alone (dense ranks in the old order), and an allreduce on it gives
 * the sum over exactly the survivors. Cases: one loss, two at once, a second loss in the shrunken
 * job (two shrinks), a rank dying inside the shrink itself, a survivor slow to notice (not cut
 * off), a stopped rank (left out after the grace, told so when it resumes), and the rank hosting
 * the rendezvous lost (the shrink fails clearly, nobody hangs); and a rank that grows a healthy
 * communicator neither fails a call the others are still finishing nor lets a later one hang.
 * Real processes, real sockets. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hoop.h"
#include "support/procs.h"

#define MAX_RANKS 8
/* Iterations before a victim dies: the job is well under way. */
#define KILL_AT 20
/* Elements per allreduce: odd, and big enough to take several messages. */
#define COUNT 100003

typedef struct shrink_case {
  int port;
  int n;
  double timeout_s;
  int victim[MAX_RANKS]; /* 1: dies (SIGKILL to itself) at iteration KILL_AT */
  int stopper;           /* this rank stops itself (SIGSTOP) at KILL_AT instead; -1: none */
  int dies_in_shrink;    /* this rank dies inside hoop_comm_shrink (HOOP_FAULT); -1: none */
  int slow;              /* this rank waits slow_s after its failure before shrinking; -1 */
  double slow_s;
  int second_victim;      /* this rank dies in the shrunken job, which shrinks again; -1 */
  int expect_unsupported; /* the shrink must fail (the server was lost with its host) */
} shrink_case;

/* Allreduce (index + 1) over comm until a call fails; die at KILL_AT when told to. Returns the
 * failed call's result (HOOP_OK never: the loop only ends on a failure). */
static hoop_result run_until_failure(hoop_comm *comm, int index, int die, int stop, int32_t *buf) {
  for (int i = 0;; i++) {
    if (i == KILL_AT && die)
      raise(SIGKILL);
    if (i == KILL_AT && stop)
      raise(SIGSTOP);
    for (size_t k = 0; k < COUNT; k++)
      buf[k] = index + 1;
    hoop_result result = hoop_allreduce(comm, buf, buf, COUNT, HOOP_INT32, HOOP_SUM);
    /* A victim dies whatever happens: with two, the first may die while the other is still
     * finishing the call before KILL_AT, and the failure reaches the other there. */
    if (result != HOOP_OK && die)
      raise(SIGKILL);
    if (result != HOOP_OK)
      return result;
  }
}

/* After a shrink: comm must hold exactly the ranks alive[] (old indices), this one at its
 * position among them, and sum their (index + 1). 0 when so. */
static int check_generation(hoop_comm *comm, int index, const int *alive, int n, int32_t *buf) {
  int size = 0, position = -1;
  int32_t sum = 0;
  for (int i = 0; i < n; i++) {
    if (!alive[i])
      continue;
    if (i == index)
      position = size;
    size++;
    sum += i + 1;
  }
  if (hoop_size(comm) != size || hoop_rank(comm) != position) {
    fprintf(stderr, "rank %d: new communicator is rank %d of %d, expected %d of %d\n", index,
            hoop_rank(comm), hoop_size(comm), position, size);
    return 1;
  }
  for (size_t k = 0; k < COUNT; k++)
    buf[k] = index + 1;
  hoop_result result = hoop_allreduce(comm, buf, buf, COUNT, HOOP_INT32, HOOP_SUM);
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d: allreduce after the shrink: %s\n", index, hoop_last_error(comm));
    return 1;
  }
  for (size_t k = 0; k < COUNT; k++)
    if (buf[k] != sum) {
      fprintf(stderr, "rank %d: element %zu is %d, expected %d\n", index, k, buf[k], sum);
      return 1;
    }
  return 0;
}

/* The stopped rank, once resumed: its communicator fails, and it cannot shrink back in. */
static int resumed_rank(hoop_comm *comm, int index) {
  hoop_comm *newcomm = NULL;
  hoop_result result = hoop_comm_shrink(comm, &newcomm);
  const char *message = hoop_last_error(comm);
  int bad = result == HOOP_OK ||
            (!strstr(message, "left out") && !strstr(message, "no rendezvous connection"));
  if (bad || getenv("HOOP_TEST_VERBOSE"))
    fprintf(stderr, "rank %d (resumed): shrink %s: %s\n", index, hoop_strerror(result), message);
  hoop_finalize(newcomm);
  return bad;
}

static int shrink_rank(int index, const shrink_case *sc) {
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, sc->port, index, sc->n);
  config.timeout_s = sc->timeout_s;
  hoop_comm *comm = NULL;
  if (hoop_init(&comm, &config) != HOOP_OK) {
    fprintf(stderr, "rank %d: hoop_init: %s\n", index, hoop_last_error(comm));
    hoop_finalize(comm);
    return 10;
  }
  int32_t *buf = malloc(COUNT * sizeof *buf);
  if (!buf)
    return 11;
  hoop_result failed = run_until_failure(comm, index, sc->victim[index], sc->stopper == index, buf);
  if (sc->stopper == index) { /* resumed after the others went on */
    int bad = resumed_rank(comm, index);
    hoop_finalize(comm);
    free(buf);
    return bad ? 12 : 0;
  }
  double failed_at = procs_now();
  if (getenv("HOOP_TEST_VERBOSE"))
    fprintf(stderr, "rank %d: %s: %s\n", index, hoop_strerror(failed), hoop_last_error(comm));
  if (sc->slow == index) {
    struct timespec pause = {(time_t)sc->slow_s, (long)((sc->slow_s - (time_t)sc->slow_s) * 1e9)};
    nanosleep(&pause, NULL);
  }
  if (sc->dies_in_shrink == index)
    setenv("HOOP_FAULT", "shrink-connect", 1);
  hoop_comm *newcomm = NULL;
  hoop_result result = hoop_comm_shrink(comm, &newcomm);
  if (sc->expect_unsupported) {
    int bad = result == HOOP_OK || newcomm != NULL;
    if (bad || getenv("HOOP_TEST_VERBOSE"))
      fprintf(stderr, "rank %d: shrink without the server: %s: %s\n", index, hoop_strerror(result),
              hoop_last_error(comm));
    hoop_finalize(newcomm);
    hoop_finalize(comm);
    free(buf);
    return bad ? 13 : 0;
  }
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d: hoop_comm_shrink: %s: %s\n", index, hoop_strerror(result),
            hoop_last_error(comm));
    hoop_finalize(comm);
    return 14;
  }
  int alive[MAX_RANKS];
  for (int i = 0; i < sc->n; i++)
    alive[i] = !sc->victim[i] && sc->stopper != i && sc->dies_in_shrink != i;
  int bad = check_generation(newcomm, index, alive, sc->n, buf);
  double first_call = procs_now() - failed_at;
  /* Calls on the old communicator keep failing. */
  if (hoop_barrier(comm) == HOOP_OK) {
    fprintf(stderr, "rank %d: the old communicator still works after the shrink\n", index);
    bad = 1;
  }
  if (getenv("HOOP_TEST_VERBOSE"))
    fprintf(stderr, "rank %d: first allreduce of the new communicator %.3f s after the failure\n",
            index, first_call);
  if (!bad && sc->second_victim >= 0) {
    /* Again in the shrunken job: one more loss, one more shrink. */
    hoop_comm *third = NULL;
    run_until_failure(newcomm, index, sc->second_victim == index, 0, buf);
    if (hoop_comm_shrink(newcomm, &third) != HOOP_OK) {
      fprintf(stderr, "rank %d: second shrink: %s\n", index, hoop_last_error(newcomm));
      bad = 1;
    } else {
      alive[sc->second_victim] = 0;
      bad = check_generation(third, index, alive, sc->n, buf);
    }
    hoop_finalize(third);
  }
  hoop_finalize(newcomm);
  hoop_finalize(comm);
  free(buf);
  return bad ? 15 : 0;
}

/* Start the ranks, resume the stopped one once the others are done, and check every exit: the
 * killed ranks by SIGKILL, everyone else 0. */
static void run_case(shrink_case *sc) {
  sc->port = procs_free_port();
  pid_t pids[MAX_RANKS];
  fflush(NULL);
  for (int i = 0; i < sc->n; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0)
      _exit(shrink_rank(i, sc));
  }
  double limit = 4 * sc->timeout_s + 30;
  int bad = 0;
  for (int i = 0; i < sc->n; i++) {
    if (i == sc->stopper)
      continue;
    int code = procs_wait(pids[i], limit);
    int killed = sc->victim[i] || sc->dies_in_shrink == i || sc->second_victim == i;
    if (code != (killed ? 128 + SIGKILL : 0)) {
      fprintf(stderr, "rank %d ended with %d, expected %d\n", i, code, killed ? 137 : 0);
      bad++;
    }
  }
  if (sc->stopper >= 0) {
    kill(pids[sc->stopper], SIGCONT);
    int code = procs_wait(pids[sc->stopper], limit);
    if (code != 0) {
      fprintf(stderr, "stopped rank %d ended with %d after it was resumed\n", sc->stopper, code);
      bad++;
    }
  }
  ck_assert_int_eq(bad, 0);
}

static shrink_case new_case(int n, double timeout_s) {
  shrink_case sc;
  memset(&sc, 0, sizeof sc);
  sc.n = n;
  sc.timeout_s = timeout_s;
  sc.stopper = sc.dies_in_shrink = sc.slow = sc.second_victim = -1;
  return sc;
}

START_TEST(test_shrink_after_one_loss) {
  shrink_case sc = new_case(4, 10);
  sc.victim[2] = 1;
  run_case(&sc);
}
END_TEST

/* Eight ranks, one lost: HOOP_TEST_VERBOSE prints how soon after its failure each survivor's
 * first allreduce on the new communicator is done (a figure, not a check: machines are shared). */
START_TEST(test_shrink_eight_ranks) {
  shrink_case sc = new_case(8, 10);
  sc.victim[5] = 1;
  run_case(&sc);
}
END_TEST

START_TEST(test_shrink_after_two_losses_at_once) {
  shrink_case sc = new_case(5, 10);
  sc.victim[1] = sc.victim[3] = 1;
  run_case(&sc);
}
END_TEST

START_TEST(test_shrink_twice) {
  shrink_case sc = new_case(4, 10);
  sc.victim[1] = 1;
  sc.second_victim = 3;
  run_case(&sc);
}
END_TEST

START_TEST(test_loss_during_shrink) {
  shrink_case sc = new_case(4, 10);
  sc.victim[3] = 1;
  sc.dies_in_shrink = 1;
  run_case(&sc);
}
END_TEST

/* A survivor that notices late (3 s, past the 2 s grace) is still waited for: nobody names it. */
START_TEST(test_slow_survivor_not_cut_off) {
  shrink_case sc = new_case(4, 10);
  sc.victim[1] = 1;
  sc.slow = 3;
  sc.slow_s = 3.0;
  run_case(&sc);
}
END_TEST

/* A stopped rank: its neighbours time out on it and name it; the grace over, the others go on
 * without it; resumed, it finds itself left out. */
START_TEST(test_stopped_rank_left_out) {
  shrink_case sc = new_case(4, 2);
  sc.stopper = 2;
  run_case(&sc);
}
END_TEST

/* Rank 0 hosts the rendezvous here: with it gone, the survivors cannot agree, and say so. */
START_TEST(test_server_lost_with_its_host) {
  shrink_case sc = new_case(3, 5);
  sc.victim[0] = 1;
  sc.expect_unsupported = 1;
  run_case(&sc);
}
END_TEST

/* ---- growing back: a newcomer joins the survivors ---------------------------------------------
 */

typedef struct grow_case {
  int port;
  volatile int *shrunk; /* shared: survivors that have shrunk */
} grow_case;

/* The members' and the newcomer's check after the growth: 3 ranks, the newcomer last, and the sum
 * of (old index + 1) over ranks 0 and 2 plus the newcomer's 100. */
static int check_grown(hoop_comm *comm, int value, int expect_rank) {
  int32_t v[3] = {value, value, value};
  hoop_result result = hoop_allreduce(comm, v, v, 3, HOOP_INT32, HOOP_SUM);
  if (result != HOOP_OK || hoop_size(comm) != 3 || hoop_rank(comm) != expect_rank ||
      hoop_comm_generation(comm) != 2 || v[0] != 104 || v[2] != 104) {
    fprintf(stderr,
            "after the growth: %s, rank %d of %d (expected %d of 3), generation %u (expected 2), "
            "sum %d (expected 104): %s\n",
            hoop_strerror(result), hoop_rank(comm), hoop_size(comm), expect_rank,
            hoop_comm_generation(comm), v[0], hoop_last_error(comm));
    return 1;
  }
  return 0;
}

static hoop_comm *join_hoopd(const grow_case *gc, int index, int n, int newcomer) {
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, gc->port, index, n);
  config.serve_rendezvous = 0; /* hoopd serves it */
  config.timeout_s = 10;
  if (newcomer) {
    config.join_running = 1;
    config.rank = -1;
  }
  hoop_comm *comm = NULL;
  if (hoop_init(&comm, &config) != HOOP_OK) {
    fprintf(stderr, "%s %d: hoop_init: %s\n", newcomer ? "newcomer" : "rank", index,
            hoop_last_error(comm));
    hoop_finalize(comm);
    return NULL;
  }
  return comm;
}

/* Ranks 0-2 of a job at hoopd; rank 1 dies; 0 and 2 shrink, then poll for newcomers between
 * allreduces, agree with a MAX allreduce, and grow. */
static int grow_member(int index, const grow_case *gc) {
  hoop_comm *comm = join_hoopd(gc, index, 3, 0);
  if (!comm)
    return 20;
  int32_t *buf = malloc(COUNT * sizeof *buf);
  run_until_failure(comm, index, index == 1, 0, buf);
  hoop_comm *shrunk = NULL, *grown = NULL;
  if (hoop_comm_shrink(comm, &shrunk) != HOOP_OK) {
    fprintf(stderr, "rank %d: shrink: %s\n", index, hoop_last_error(comm));
    return 21;
  }
  hoop_finalize(comm);
  __atomic_add_fetch(gc->shrunk, 1, __ATOMIC_SEQ_CST);
  int bad = 1;
  double give_up = procs_now() + 20;
  while (procs_now() < give_up) {
    int32_t waiting = hoop_comm_newcomers(shrunk);
    if (hoop_allreduce(shrunk, &waiting, &waiting, 1, HOOP_INT32, HOOP_MAX) != HOOP_OK) {
      fprintf(stderr, "rank %d: allreduce before the growth: %s\n", index, hoop_last_error(shrunk));
      break;
    }
    if (waiting > 0) {
      if (hoop_comm_grow(shrunk, &grown) != HOOP_OK)
        fprintf(stderr, "rank %d: grow: %s\n", index, hoop_last_error(shrunk));
      else
        bad = check_grown(grown, index + 1, index == 0 ? 0 : 1);
      break;
    }
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  hoop_finalize(grown);
  hoop_finalize(shrunk);
  free(buf);
  return bad ? 22 : 0;
}

static int grow_newcomer(const grow_case *gc) {
  hoop_comm *comm = join_hoopd(gc, 0, 3, 1);
  if (!comm)
    return 30;
  int bad = check_grown(comm, 100, 2);
  hoop_finalize(comm);
  return bad ? 31 : 0;
}

START_TEST(test_newcomer_joins_survivors) {
  grow_case gc = {procs_free_port(), NULL};
  gc.shrunk = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert(gc.shrunk != MAP_FAILED);
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", gc.port);
  char hoopd[4096];
  snprintf(hoopd, sizeof hoopd, "%s", procs_build_path("tools/hoopd"));
  char *hoopd_argv[] = {hoopd, "--listen", listen, NULL};
  pid_t server = procs_start(hoopd_argv, NULL, NULL);
  ck_assert_int_gt(server, 0);
  pid_t pids[4];
  fflush(NULL);
  for (int i = 0; i < 3; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0)
      _exit(grow_member(i, &gc));
  }
  /* The newcomer comes once the survivors run as two. */
  double give_up = procs_now() + 30;
  while (*gc.shrunk < 2 && procs_now() < give_up) {
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
  }
  pids[3] = fork();
  ck_assert_int_ge(pids[3], 0);
  if (pids[3] == 0)
    _exit(grow_newcomer(&gc));
  int expected[4] = {0, 128 + SIGKILL, 0, 0}, bad = 0;
  for (int i = 0; i < 4; i++) {
    int code = procs_wait(pids[i], 60);
    if (code != expected[i]) {
      fprintf(stderr, "%s %d ended with %d, expected %d\n", i == 3 ? "newcomer" : "rank", i, code,
              expected[i]);
      bad++;
    }
  }
  kill(server, SIGTERM);
  procs_wait(server, 10);
  munmap((void *)gc.shrunk, sizeof(int));
  ck_assert_int_eq(bad, 0);
}
END_TEST

/* A newcomer for a job that does not run is refused at once, with a reason. */
START_TEST(test_newcomer_without_a_job) {
  grow_case gc = {procs_free_port(), NULL};
  char listen[64], hoopd[4096];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", gc.port);
  snprintf(hoopd, sizeof hoopd, "%s", procs_build_path("tools/hoopd"));
  char *hoopd_argv[] = {hoopd, "--listen", listen, NULL};
  pid_t server = procs_start(hoopd_argv, NULL, NULL);
  ck_assert_int_gt(server, 0);
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, gc.port, 0, 2);
  config.serve_rendezvous = 0;
  config.join_running = 1;
  config.timeout_s = 10;
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  const char *message = hoop_last_error(comm);
  int refused = result == HOOP_ERR_INVALID_ARG && strstr(message, "no job 'default' is running");
  if (!refused)
    fprintf(stderr, "newcomer without a job: %s: %s\n", hoop_strerror(result), message);
  hoop_finalize(comm);
  kill(server, SIGTERM);
  procs_wait(server, 10);
  ck_assert(refused);
}
END_TEST

/* ---- retiring on purpose: a growth of a communicator that has not failed ---------------------
 */

#define RETIRE_RANKS 3
#define RETIRE_ROOT 1
#define RETIRE_BYTES (8u << 20)
#define RETIRE_GENERATIONS 8

/* Grow comm into the next generation (no newcomers: the same ranks), finalizing the old one. */
static hoop_comm *regrow(hoop_comm *comm, int index) {
  hoop_comm *next = NULL;
  if (hoop_comm_grow(comm, &next) != HOOP_OK) {
    fprintf(stderr, "rank %d: hoop_comm_grow: %s\n", index, hoop_last_error(comm));
    hoop_finalize(comm);
    return NULL;
  }
  if (hoop_barrier(comm) == HOOP_OK) {
    fprintf(stderr, "rank %d: the retired communicator still works\n", index);
    hoop_finalize(next);
    next = NULL;
  }
  hoop_finalize(comm);
  if (next && (hoop_size(next) != RETIRE_RANKS || hoop_rank(next) != index)) {
    fprintf(stderr, "rank %d: grown into rank %d of %d\n", index, hoop_rank(next), hoop_size(next));
    hoop_finalize(next);
    next = NULL;
  }
  return next;
}

/* A pipelined broadcast from RETIRE_ROOT: the root is done once its neighbour has read the last
 * chunk, while the rank after that still waits for it. The root grows at once, which must not
 * fail the broadcast the others are still finishing; then they grow too. Generation after
 * generation. */
static int finish_after_retirement_rank(int port, int index, const char *transport) {
  hoop_comm *comm = procs_join(port, index, RETIRE_RANKS, 10, transport);
  unsigned char *buf = malloc(RETIRE_BYTES);
  int bad = !comm || !buf;
  for (int g = 0; g < RETIRE_GENERATIONS && !bad; g++) {
    for (size_t k = 0; k < RETIRE_BYTES; k++)
      buf[k] = index == RETIRE_ROOT ? (unsigned char)(k * 7 + (size_t)g) : 0;
    hoop_result result = hoop_broadcast(comm, buf, RETIRE_BYTES, HOOP_UINT8, RETIRE_ROOT);
    if (result != HOOP_OK) {
      fprintf(stderr, "rank %d, generation %d: the broadcast failed: %s\n", index, g,
              hoop_last_error(comm));
      bad = 1;
      break;
    }
    for (size_t k = 0; k < RETIRE_BYTES && !bad; k++)
      if (buf[k] != (unsigned char)(k * 7 + (size_t)g)) {
        fprintf(stderr, "rank %d, generation %d: byte %zu wrong\n", index, g, k);
        bad = 1;
      }
    if (!bad && !(comm = regrow(comm, index)))
      bad = 1;
  }
  hoop_finalize(comm);
  free(buf);
  return bad;
}

/* RETIRE_ROOT grows at once; the others call an allreduce on the old communicator first, which
 * must fail long before the timeout, naming the rank that left; then they grow as well. */
static int call_after_retirement_rank(int port, int index, const char *transport) {
  hoop_comm *comm = procs_join(port, index, RETIRE_RANKS, 10, transport);
  if (!comm || hoop_barrier(comm) != HOOP_OK)
    return 1;
  int bad = 0;
  if (index != RETIRE_ROOT) {
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    int32_t v = 1;
    double start = procs_now();
    hoop_result result = hoop_allreduce(comm, &v, &v, 1, HOOP_INT32, HOOP_SUM);
    double took = procs_now() - start;
    const char *message = hoop_last_error(comm);
    char named[32];
    snprintf(named, sizeof named, "rank %d", RETIRE_ROOT);
    bad = result == HOOP_OK || took > 3.0 || !strstr(message, named);
    if (bad || getenv("HOOP_TEST_VERBOSE"))
      fprintf(stderr, "rank %d: allreduce after rank %d retired: %s after %.2f s: %s\n", index,
              RETIRE_ROOT, hoop_strerror(result), took, message);
  }
  if (!(comm = regrow(comm, index)))
    return 1;
  int32_t v = index + 1;
  if (hoop_allreduce(comm, &v, &v, 1, HOOP_INT32, HOOP_SUM) != HOOP_OK || v != 6) {
    fprintf(stderr, "rank %d: allreduce after the growth: %d: %s\n", index, v,
            hoop_last_error(comm));
    bad = 1;
  }
  hoop_finalize(comm);
  return bad;
}

static void run_retire_case(int (*rank_main)(int, int, const char *), const char *transport) {
  int port = procs_free_port();
  pid_t pids[RETIRE_RANKS];
  fflush(NULL);
  for (int i = 0; i < RETIRE_RANKS; i++) {
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0)
      _exit(rank_main(port, i, transport));
  }
  int bad = 0;
  for (int i = 0; i < RETIRE_RANKS; i++) {
    int code = procs_wait(pids[i], 60);
    if (code != 0) {
      fprintf(stderr, "rank %d ended with %d\n", i, code);
      bad++;
    }
  }
  ck_assert_int_eq(bad, 0);
}

START_TEST(test_retirement_lets_others_finish) {
  run_retire_case(finish_after_retirement_rank, NULL);
}
END_TEST

START_TEST(test_retirement_lets_others_finish_tcp) {
  run_retire_case(finish_after_retirement_rank, "tcp");
}
END_TEST

START_TEST(test_call_after_retirement_fails_fast) {
  run_retire_case(call_after_retirement_rank, NULL);
}
END_TEST

START_TEST(test_call_after_retirement_fails_fast_tcp) {
  run_retire_case(call_after_retirement_rank, "tcp");
}
END_TEST

static Suite *shrink_suite(void) {
  Suite *s = suite_create("shrink");
  TCase *tc = tcase_create("shrink");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_shrink_after_one_loss);
  tcase_add_test(tc, test_shrink_eight_ranks);
  tcase_add_test(tc, test_shrink_after_two_losses_at_once);
  tcase_add_test(tc, test_shrink_twice);
  tcase_add_test(tc, test_loss_during_shrink);
  tcase_add_test(tc, test_slow_survivor_not_cut_off);
  tcase_add_test(tc, test_stopped_rank_left_out);
  tcase_add_test(tc, test_server_lost_with_its_host);
  tcase_add_test(tc, test_newcomer_joins_survivors);
  tcase_add_test(tc, test_newcomer_without_a_job);
  tcase_add_test(tc, test_retirement_lets_others_finish);
  tcase_add_test(tc, test_retirement_lets_others_finish_tcp);
  tcase_add_test(tc, test_call_after_retirement_fails_fast);
  tcase_add_test(tc, test_call_after_retirement_fails_fast_tcp);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *runner = srunner_create(shrink_suite());
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
