/* test_collectives.c - every collective on 1 to 9 real ranks of this host, over shared memory (its
 * segment path and its single-copy path) and over TCP loopback, checked against
 * reference.c: through hooprun (embedded rendezvous), and through ranks that call hoop_init
 * themselves with rank 0 hosting the rendezvous. */
#include <check.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hoop.h"
#include "support/procs.h"

/* The fewest checks a whole run of coll_worker makes (one rank, --quick: 6343 now). */
enum { MIN_CHECKS = 6000 };

/* How many ranks of an np-rank job the output shows passing: the summary line of each rank, from
 * hooprun's "[r] " prefix, naming that rank of np, MIN_CHECKS checks or more and 0 failed; each
 * rank counted once. */
static int workers_passed(const char *out, int np) {
  int passed = 0;
  unsigned char seen[64] = {0};
  for (const char *line = out; line && *line;
       line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    int prefix, r, n;
    unsigned long checks, failed;
    if (sscanf(line, "[%d] coll_worker rank %d of %d: %lu checks, %lu failed", &prefix, &r, &n,
               &checks, &failed) == 5 &&
        prefix == r && n == np && r >= 0 && r < np && r < 64 && !seen[r] && checks >= MIN_CHECKS &&
        failed == 0) {
      seen[r] = 1;
      passed++;
    }
  }
  return passed;
}

/* The large cases' size in the jobs of 5 to 9 ranks (quick = MIDDLE): past every cut-over by
 * size (a float32 allreduce of 1.6 MB, past halving-doubling's 1 MiB at 8 ranks; 0.8 MB a rank
 * gathered, 6.4 MB at 8 ranks, past recursive doubling's 4 MiB on one host), and a third of the
 * whole run's 1300021, whose reference costs each rank n times the buffer (90% of a 9-rank job's
 * time). */
#define MIDDLE 2
#define MIDDLE_COUNT "400009"

/* Run coll_worker on np ranks under hooprun, with env_add ("NAME=value", NULL-ended, or NULL)
 * added to the ranks' environment; quick: 0 the whole run, 1 --quick, MIDDLE. */
static void run_workers_fake_hosts(int np, int quick, char *const env_add[], char *per_host) {
  char dir[] = "/tmp/hoop-barrier-XXXXXX";
  ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp failed");
  char np_text[16];
  snprintf(np_text, sizeof np_text, "%d", np);
  char hooprun[4096], worker[4096];
  snprintf(hooprun, sizeof hooprun, "%s", procs_build_path("tools/hooprun"));
  snprintf(worker, sizeof worker, "%s", procs_build_path("tests/coll_worker"));
  char *argv[] = {hooprun,
                  "-np",
                  np_text,
                  "--timeout",
                  "60",
                  worker,
                  "--barrier-dir",
                  dir,
                  per_host          ? "--fake-hosts"
                  : quick == MIDDLE ? "--big"
                  : quick           ? "--quick"
                                    : NULL,
                  per_host          ? per_host
                  : quick == MIDDLE ? MIDDLE_COUNT
                                    : NULL,
                  per_host && quick ? "--quick" : NULL,
                  NULL};
  char out_path[64];
  snprintf(out_path, sizeof out_path, "%s/out", dir);
  int code = procs_run(argv, env_add, out_path, 480);
  char *out = procs_slurp(out_path);
  ck_assert_msg(out != NULL, "cannot read %s", out_path);
  fputs(out, stdout);
  ck_assert_msg(code == 0, "hooprun -np %d coll_worker%s%s: expected exit 0, got %d%s", np,
                env_add ? " with " : "", env_add ? env_add[0] : "", code,
                code == -1 ? " (killed after 480 s)" : "");
  /* An exit status of 0 is not enough: every rank of one np-rank job must say how many checks it
   * ran, all passed, and no fewer than a whole run makes (a worker that ran none exits 0 too). */
  ck_assert_msg(workers_passed(out, np) == np,
                "hooprun -np %d coll_worker%s%s: not %d ranks of one job each reporting %d or more "
                "checks and 0 failed (output above)",
                np, env_add ? " with " : "", env_add ? env_add[0] : "", np, MIN_CHECKS);
  free(out);
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void run_workers_with(int np, int quick, char *const env_add[]) {
  run_workers_fake_hosts(np, quick, env_add, NULL);
}

static void run_workers(int np, int quick) {
  run_workers_with(np, quick, NULL);
}

START_TEST(test_hooprun_1) {
  run_workers(1, 0);
}
END_TEST
START_TEST(test_hooprun_2) {
  run_workers(2, 0);
}
END_TEST
START_TEST(test_hooprun_3) {
  run_workers(3, 0);
}
END_TEST
START_TEST(test_hooprun_4) {
  run_workers(4, 0);
}
END_TEST
START_TEST(test_hooprun_7) {
  run_workers(7, 1);
}
END_TEST

/* The same over TCP loopback (ranks of one host share memory unless told otherwise). */
static char *const over_tcp[] = {"HOOP_TRANSPORT=tcp", NULL};
static const int tcp_ranks[] = {2, 3, 4, 7};
START_TEST(test_tcp) {
  run_workers_with(tcp_ranks[_i], tcp_ranks[_i] > 4, over_tcp);
}
END_TEST

/* Every rank count from 1 to 9 on each transport, every case of the worker (the counts above
 * are not repeated): the cut-overs that depend on the rank count (powers of two or not, two
 * ranks, folded ranks) all run on both. */
static const struct {
  int np;
  char *const *env;
} count_jobs[] = {{5, NULL},     {6, NULL},     {8, NULL},     {9, NULL},    {1, over_tcp},
                  {5, over_tcp}, {6, over_tcp}, {8, over_tcp}, {9, over_tcp}};
START_TEST(test_rank_counts) {
  run_workers_with(count_jobs[_i].np, MIDDLE, count_jobs[_i].env);
}
END_TEST

/* Shared memory with every message going through the segment (no single-copy reads), and with
 * every message of a byte or more read from the sender (the single-copy path for everything). */
static char *const shm_slots_only[] = {"HOOP_SHM_CMA_BYTES=0", NULL};
static char *const shm_cma_all[] = {"HOOP_SHM_CMA_BYTES=1", NULL};
START_TEST(test_shm_slots_only) {
  run_workers_with(3, 0, shm_slots_only);
}
END_TEST
START_TEST(test_shm_cma_all) {
  run_workers_with(3, 0, shm_cma_all);
}
END_TEST

/* Each algorithm forced for every size, on rank counts that are and are not powers of two
 * (recursive doubling folds the extra ranks in first). */
static char *const algo_ring[] = {"HOOP_ALGO=ring", NULL};
static char *const algo_rd[] = {"HOOP_ALGO=rd", NULL};
/* Halving-doubling with 64 KiB chunks, so that the big cases cross several chunks per round;
 * at 3 and 6 ranks one and two ranks fold into a partner. */
static char *const algo_hd[] = {"HOOP_ALGO=hd", "HOOP_CHUNK_BYTES=65536", NULL};
/* HOOP_ALGO per collective, with algorithms the single words never force: Bruck's allgather at a
 * power-of-two rank count, the chain at 3 ranks, reduce-scatter's recursive halving (at 3 ranks,
 * the ring it falls back to), the linear reduce, the tree gather and scatter and Bruck's all-to-all
 * at every size. */
static char *const algo_per_coll[] = {
    "HOOP_ALGO=allreduce:hd,broadcast:chain,allgather:bruck,barrier:dissemination,"
    "reduce_scatter:halving,alltoall:bruck,alltoallv:pairwise,reduce:linear,gather:tree,"
    "scatter:tree",
    "HOOP_CHUNK_BYTES=65536", NULL};
/* The board's algorithms forced at every size: the calls that do not fit a slot, and every call at
 * 9 ranks (no board past 8), run the small-call algorithms of messages instead. reduce_scatter is
 * named by the older name, flat, which is still taken. */
static char *const algo_board[] = {"HOOP_ALGO=allreduce:board,broadcast:board,allgather:board,"
                                   "barrier:board,reduce_scatter:flat,alltoall:board",
                                   NULL};
static const int board_ranks[] = {2, 3, 9};
/* Loop tests: _i picks the rank count. */
static const int ring_ranks[] = {2, 3};
static const int rd_ranks[] = {2, 3, 4, 6};
static const int hd_ranks[] = {2, 3, 4, 6};
static const int per_coll_ranks[] = {3, 4};
START_TEST(test_algo_ring) {
  run_workers_with(ring_ranks[_i], 1, algo_ring);
}
END_TEST
START_TEST(test_algo_rd) {
  run_workers_with(rd_ranks[_i], 1, algo_rd);
}
END_TEST
START_TEST(test_algo_hd) {
  run_workers_with(hd_ranks[_i], 1, algo_hd);
}
END_TEST
START_TEST(test_algo_board) {
  run_workers_with(board_ranks[_i], 1, algo_board);
}
END_TEST
START_TEST(test_algo_per_coll) {
  run_workers_with(per_coll_ranks[_i], 1, algo_per_coll);
}
END_TEST

/* The direct algorithms forced at every size: allreduce's (each rank reduces its segment from
 * every peer's part), in 64 KiB chunks so that the big cases cross several, allgather's (every
 * block straight from its owner) and reduce's (the same segments, gathered at the root), with the
 * linear gather and scatter; under auto the jobs of one host above take allreduce's for their
 * large cases. */
static char *const algo_direct[] = {
    "HOOP_ALGO=allreduce:direct,allgather:direct,reduce:direct,gather:linear,scatter:linear",
    "HOOP_CHUNK_BYTES=65536", NULL};
static const int direct_ranks[] = {2, 3, 5};
START_TEST(test_algo_direct) {
  run_workers_with(direct_ranks[_i], 1, algo_direct);
}
END_TEST

/* Host by host: 4 hosts of 2 ranks and 2 hosts of 3 (as the rank table sees them: the ranks name
 * their hosts), with the host-by-host allreduce forced at every size, and 3 of 2 under auto (which
 * takes it for the large cases). */
static char *const algo_hier[] = {"HOOP_ALGO=allreduce:hier", "HOOP_CHUNK_BYTES=65536", NULL};
static const struct {
  int np;
  char *per_host;
  char *const *env;
} hier_jobs[] = {{8, "2", algo_hier}, {6, "3", algo_hier}, {6, "2", NULL}};
START_TEST(test_hier) {
  run_workers_fake_hosts(hier_jobs[_i].np, 1, hier_jobs[_i].env, hier_jobs[_i].per_host);
}
END_TEST

/* A forked rank's config for a job met at 127.0.0.1:port, hosted by rank 0 (procs.c's), named
 * job, with a 30 s timeout. */
static void forked_config(hoop_config *config, char *rendezvous, size_t len, int port,
                          const char *job, int index, int n) {
  procs_local_config(config, rendezvous, len, port, index, n);
  config->job = job;
  config->timeout_s = 30;
}

/* An unknown HOOP_ALGO fails the call with a message instead of picking something: an unknown
 * word, an algorithm the collective lacks, a collective that does not exist, an empty entry. */
static const char *const bad_algos[] = {"fastest", "allreduce:chain", "bogus:ring", "ring,",
                                        "allgather:"};
typedef struct bad_algo_job {
  int port;
  const char *value;
} bad_algo_job;

static int bad_algo_rank(int index, int n, void *arg) {
  const bad_algo_job *job = arg;
  hoop_config config;
  char rendezvous[64];
  forked_config(&config, rendezvous, sizeof rendezvous, job->port, "bad-algo", index, n);
  setenv("HOOP_ALGO", job->value, 1);
  hoop_comm *comm;
  if (hoop_init(&comm, &config) != HOOP_OK)
    return 10;
  int32_t value = 1;
  hoop_result result = hoop_allreduce(comm, &value, &value, 1, HOOP_INT32, HOOP_SUM);
  int bad = result != HOOP_ERR_INVALID_ARG || !strstr(hoop_last_error(comm), "HOOP_ALGO");
  if (bad)
    fprintf(stderr,
            "rank %d: HOOP_ALGO=%s: expected HOOP_ERR_INVALID_ARG naming HOOP_ALGO, "
            "got %s: %s\n",
            index, job->value, hoop_strerror(result), hoop_last_error(comm));
  hoop_finalize(comm);
  return bad;
}

/* Whether hoop_init's result is HOOP_ERR_INVALID_ARG with a message naming variable (set to value);
 * 0 if so, else 1 with what came instead on stderr. Finalizes a communicator that was made. */
static int init_refused(int index, const char *variable, const char *value, hoop_comm *comm,
                        hoop_result result) {
  int bad = result != HOOP_ERR_INVALID_ARG || !strstr(hoop_last_error(comm), variable);
  if (bad)
    fprintf(stderr, "rank %d: %s=%s: expected HOOP_ERR_INVALID_ARG naming it, got %s: %s\n", index,
            variable, value, hoop_strerror(result), hoop_last_error(comm));
  if (result == HOOP_OK)
    hoop_finalize(comm);
  return bad;
}

/* HOOP_TCP_SPIN_US takes auto or microseconds; anything else fails hoop_init, naming it. */
static int bad_spin_rank(int index, int n, void *arg) {
  hoop_config config;
  char rendezvous[64];
  forked_config(&config, rendezvous, sizeof rendezvous, *(int *)arg, "bad-spin", index, n);
  setenv("HOOP_TRANSPORT", "tcp", 1);
  setenv("HOOP_TCP_SPIN_US", "forever", 1);
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  return init_refused(index, "HOOP_TCP_SPIN_US", "forever", comm, result);
}

START_TEST(test_spin_unknown) {
  int port = procs_free_port();
  ck_assert_int_gt(port, 0);
  int bad = procs_fork_ranks(2, bad_spin_rank, &port, 60);
  ck_assert_msg(bad == 0, "%d of 2 ranks did not reject HOOP_TCP_SPIN_US=forever (see stderr)",
                bad);
}
END_TEST

/* HOOP_TCP_CONGESTION: auto gives the connections to a peer of this host reno, unless the host's
 * ranks outnumber its CPUs; system leaves every one on the system's; a name gives every one that
 * name, and one the kernel refuses fails hoop_init, naming the variable. */
typedef struct congestion_job {
  int port, np;
  const char *value;
} congestion_job;

/* How many of this process's connected TCP sockets use congestion control name, and how many
 * use another. */
static void count_congestion(const char *name, int *same, int *other) {
  *same = *other = 0;
  for (int fd = 3; fd < 1024; fd++) {
    char got[32] = "";
    socklen_t len = sizeof got - 1;
    int listening = 0;
    socklen_t flag_len = sizeof listening;
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, got, &len) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &flag_len) != 0 || listening)
      continue;
    if (strcmp(got, name) == 0)
      (*same)++;
    else
      (*other)++;
  }
}

static int congestion_rank(int index, int n, void *arg) {
  const congestion_job *job = arg;
  hoop_config config;
  char rendezvous[64];
  forked_config(&config, rendezvous, sizeof rendezvous, job->port, "congestion", index, n);
  config.transport = "tcp";
  setenv("HOOP_TCP_STREAMS", "2", 1);
  setenv("HOOP_TCP_CONGESTION", job->value, 1);
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  if (strcmp(job->value, "no-such-cc") == 0)
    return init_refused(index, "HOOP_TCP_CONGESTION", job->value, comm, result);
  if (result != HOOP_OK)
    return 10;
  /* Large enough to go over the connections, not through the host's board. */
  enum { COUNT = 64 * 1024 };
  int32_t *value = calloc(COUNT, sizeof *value);
  if (!value)
    return 11;
  value[0] = index;
  value[COUNT - 1] = 2;
  result = hoop_allreduce(comm, value, value, COUNT, HOOP_INT32, HOOP_SUM);
  char *system_cc = procs_slurp("/proc/sys/net/ipv4/tcp_congestion_control");
  if (!system_cc)
    return 12;
  system_cc[strcspn(system_cc, "\n")] = '\0';
  int reno, not_reno, system_same, system_other;
  count_congestion("reno", &reno, &not_reno);
  count_congestion(system_cc, &system_same, &system_other);
  int bad = result != HOOP_OK || value[0] != n * (n - 1) / 2 || value[COUNT - 1] != 2 * n ||
            !system_cc[0];
  free(value);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int auto_reno = cpus <= 0 || n <= cpus;
  if (strcmp(job->value, "system") == 0 || (strcmp(job->value, "auto") == 0 && !auto_reno))
    bad |= system_other != 0; /* the rendezvous connection is on the system's too */
  else
    bad |= reno < 2; /* both streams to another rank, whatever the system's */
  if (bad)
    fprintf(stderr,
            "rank %d of %d: HOOP_TCP_CONGESTION=%s (system's: %s, %ld CPUs): allreduce %s, %d "
            "connections on reno, %d on other ones, %d on the system's, %d not\n",
            index, n, job->value, system_cc, cpus, hoop_strerror(result), reno, not_reno,
            system_same, system_other);
  free(system_cc);
  hoop_finalize(comm);
  return bad;
}

static const congestion_job congestion_jobs[] = {
    {0, 2, "auto"}, {0, 3, "auto"}, {0, 2, "system"}, {0, 2, "reno"}, {0, 2, "no-such-cc"}};
START_TEST(test_congestion) {
  congestion_job job = congestion_jobs[_i];
  job.port = procs_free_port();
  ck_assert_int_gt(job.port, 0);
  int bad = procs_fork_ranks(job.np, congestion_rank, &job, 60);
  ck_assert_msg(bad == 0, "%d of %d ranks failed with HOOP_TCP_CONGESTION=%s (see stderr)", bad,
                job.np, job.value);
}
END_TEST

START_TEST(test_algo_unknown) {
  bad_algo_job job = {procs_free_port(), bad_algos[_i]};
  ck_assert_int_gt(job.port, 0);
  int bad = procs_fork_ranks(2, bad_algo_rank, &job, 60);
  ck_assert_msg(bad == 0, "%d of 2 ranks did not reject HOOP_ALGO=%s (see stderr)", bad, job.value);
}
END_TEST

/* ---- ranks that join by themselves ----------------------------------------------------------- */

typedef struct forked_job {
  int port;
  int request_ranks;  /* 1: each child asks for its index as rank; 0: the server assigns */
  const char *host;   /* the rendezvous host: "127.0.0.1" or "[::1]" */
  const char *ifname; /* HOOP_IFNAME for the data connections, or NULL */
  int streams;        /* TCP streams per peer */
  const char *transport;
} forked_job;

static int forked_rank(int index, int n, void *arg) {
  const forked_job *job = arg;
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "%s:%d", job->host, job->port);
  hoop_config config;
  hoop_config_init(&config);
  config.rendezvous = rendezvous;
  config.ifname = job->ifname;
  config.tcp_streams = job->streams;
  config.transport = job->transport;
  config.job = "forked";
  config.size = n;
  config.rank = job->request_ranks ? index : -1;
  config.serve_rendezvous = index == 0;
  config.timeout_s = 30;
  hoop_comm *comm;
  hoop_result result = hoop_init(&comm, &config);
  if (result != HOOP_OK) {
    fprintf(stderr, "child %d: hoop_init: %s: %s\n", index, hoop_strerror(result),
            hoop_last_error(comm));
    return 10;
  }
  int rank = hoop_rank(comm), failures = 0;
  if (job->request_ranks && rank != index)
    failures++;
  /* Every rank gathers every rank number: they must be a permutation of 0..n-1. */
  int32_t ranks[64] = {0};
  int32_t mine = rank;
  if (hoop_allgather(comm, &mine, ranks, 1, HOOP_INT32) != HOOP_OK)
    failures++;
  for (int r = 0; r < n; r++)
    if (ranks[r] != r)
      failures++;
  /* A sum of 1..n, in place. */
  int64_t value = rank + 1;
  if (hoop_allreduce(comm, &value, &value, 1, HOOP_INT64, HOOP_SUM) != HOOP_OK ||
      value != (int64_t)n * (n + 1) / 2)
    failures++;
  /* A buffer big enough to be striped over every stream, broadcast from the last rank. */
  size_t count = 3 * 1000 * 1000 + 7;
  uint8_t *big = malloc(count);
  for (size_t i = 0; big && i < count; i++)
    big[i] = rank == n - 1 ? (uint8_t)(i * 31 + 7) : 0;
  if (!big || hoop_broadcast(comm, big, count, HOOP_UINT8, n - 1) != HOOP_OK)
    failures++;
  for (size_t i = 0; big && i < count; i++)
    if (big[i] != (uint8_t)(i * 31 + 7)) {
      failures++;
      break;
    }
  free(big);
  if (failures)
    fprintf(stderr, "child %d (rank %d): %d checks failed: %s\n", index, rank, failures,
            hoop_last_error(comm));
  hoop_finalize(comm);
  return failures;
}

static void run_forked(int n, int request_ranks, const char *host, const char *ifname, int streams,
                       const char *transport) {
  forked_job job = {procs_free_port(), request_ranks, host, ifname, streams, transport};
  ck_assert_int_gt(job.port, 0);
  int bad = procs_fork_ranks(n, forked_rank, &job, 60);
  ck_assert_msg(bad == 0, "%d of %d forked ranks failed (see stderr)", bad, n);
}

START_TEST(test_rank0_hosts_requested_ranks) {
  run_forked(3, 1, "127.0.0.1", NULL, 2, "auto");
}
END_TEST
START_TEST(test_rank0_hosts_assigned_ranks) {
  run_forked(4, 0, "127.0.0.1", NULL, 1, "auto");
}
END_TEST
/* Data connections over IPv6 and over HOOP_IFNAME's interface are TCP's. */
START_TEST(test_ipv6) {
  run_forked(3, 1, "[::1]", NULL, 3, "tcp");
}
END_TEST
START_TEST(test_ifname_exact) {
  run_forked(2, 1, "127.0.0.1", "=lo", 8, "tcp");
}
END_TEST

static Suite *collectives_suite(void) {
  Suite *s = suite_create("collectives");
  TCase *tc = tcase_create("hooprun");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_hooprun_1);
  tcase_add_test(tc, test_hooprun_2);
  tcase_add_test(tc, test_hooprun_3);
  tcase_add_test(tc, test_hooprun_4);
  tcase_add_test(tc, test_hooprun_7);
  tcase_add_loop_test(tc, test_tcp, 0, (int)(sizeof tcp_ranks / sizeof tcp_ranks[0]));
  tcase_add_loop_test(tc, test_rank_counts, 0, (int)(sizeof count_jobs / sizeof count_jobs[0]));
  tcase_add_test(tc, test_shm_slots_only);
  tcase_add_test(tc, test_shm_cma_all);
  suite_add_tcase(s, tc);
  tc = tcase_create("forced algorithms");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_algo_ring, 0, (int)(sizeof ring_ranks / sizeof ring_ranks[0]));
  tcase_add_loop_test(tc, test_algo_rd, 0, (int)(sizeof rd_ranks / sizeof rd_ranks[0]));
  tcase_add_loop_test(tc, test_algo_hd, 0, (int)(sizeof hd_ranks / sizeof hd_ranks[0]));
  tcase_add_loop_test(tc, test_algo_direct, 0, (int)(sizeof direct_ranks / sizeof direct_ranks[0]));
  tcase_add_loop_test(tc, test_algo_board, 0, (int)(sizeof board_ranks / sizeof board_ranks[0]));
  tcase_add_loop_test(tc, test_hier, 0, (int)(sizeof hier_jobs / sizeof hier_jobs[0]));
  tcase_add_loop_test(tc, test_algo_per_coll, 0,
                      (int)(sizeof per_coll_ranks / sizeof per_coll_ranks[0]));
  tcase_add_loop_test(tc, test_algo_unknown, 0, (int)(sizeof bad_algos / sizeof bad_algos[0]));
  tcase_add_test(tc, test_spin_unknown);
  tcase_add_loop_test(tc, test_congestion, 0,
                      (int)(sizeof congestion_jobs / sizeof congestion_jobs[0]));
  suite_add_tcase(s, tc);
  tc = tcase_create("self-hosted");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_rank0_hosts_requested_ranks);
  tcase_add_test(tc, test_rank0_hosts_assigned_ranks);
  tcase_add_test(tc, test_ipv6);
  tcase_add_test(tc, test_ifname_exact);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(collectives_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
